//! Comparing two runs tensor by tensor, and walking back from the worst output to the layer that
//! first diverges.

mod compare;
mod histogram;
mod metrics;
pub mod num;
mod patterns;
mod walk;

pub use compare::{compare_all, Comparison, TensorRecord};
pub use histogram::{histogram, Histogram};
pub use metrics::{compute, Metrics, Tolerance};
pub use patterns::{pattern_of, Pattern};
pub use walk::{walk_back, Candidate, Cause, CauseKind, ChainStep, FirstDivergent, NonFiniteTensor, Status, Verdict, WalkRule};
