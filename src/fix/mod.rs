//! `layerwise fix`: from the first divergent layer to the smallest set of nodes to keep in FP32
//! (or to leave unquantized), verified by re-running the candidate and by checking the file
//! written. Each step is a file (docs/architecture.md); `job.rs` runs them in order, from bisect's
//! own parts (its setup, judging, keep pattern, sample order and noise-floor plan). docs/fix.md
//! describes the search and the outputs.

mod job;
mod options;
mod quantized;
mod search;
mod summary;
mod write;

pub use job::fix;
pub(crate) use options::keep_list_path;
pub use options::{check_fix_outputs, FixOptions, FixOutcome, FixTarget};
pub use write::trtexec_flags;
