//! The bisect job: its stages, each a file (docs/architecture.md). `bisect.rs` runs them in order;
//! this file only names the modules and what the rest of the crate uses.

pub(crate) mod answers;
mod bisect;
mod compare;
mod conclusions;
pub(crate) mod control_flow;
mod counterfactual;
mod device;
pub mod devices;
mod isolate;
mod names;
pub mod noise_floor;
mod options;
mod paired;
mod plain_reference;
pub(crate) mod quantizers;
pub mod repro;
mod samples;
mod search;
pub(crate) mod setup;
pub mod sim_quant;
mod steps;

pub use answers::parse_task;
pub use bisect::{bisect, bisect_model, refuse_empty_outputs};
pub(crate) use compare::with_deployed_outputs;
pub use names::{reference_names, reference_of};
pub use options::{
    bisect_reads, check_not_external_data, check_outputs, default_candidate, default_memory_budget, parse_size,
    BisectOptions, BisectOutcome, Marking, ToleranceField, CANCEL,
};
pub(crate) use steps::Steps;
