//! Comparing two runs tensor by tensor, and walking back from the worst output to the layer that
//! first diverges.

mod compare;
mod metrics;
pub mod num;
mod walk;

pub use compare::{compare_all, Comparison, TensorRecord};
pub use metrics::{compute, Metrics, Tolerance};
pub use walk::{walk_back, Cause, CauseKind, ChainStep, FirstDivergent, NonFiniteTensor, Status, Verdict, WalkRule};
