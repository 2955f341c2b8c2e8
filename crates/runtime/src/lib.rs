//! Backends that run a model and return its tensors, and the tensor I/O around them.
//!
//! Every backend implements [`Backend`]: given a model, inputs and a selection of tensors, it returns
//! those tensors by their original names. Rewriting the model so the tensors become visible (or
//! marking them as engine outputs) is the backend's business, so the analysis never depends on
//! which backend produced a tensor.

mod backend;
pub mod backend_log;
pub mod cpu;
pub mod device_stats;
mod error;
mod factory;
pub mod inputs;
pub mod npy;
mod optimized_pieces;
mod ort_backend;
pub mod run_guard;
mod spec;
pub use ort_backend::{
    check_types, float32_tensors, load_session, release_freed_memory, share_cpu, tensor_types,
    tensor_types_for_any_shapes, timing_mark, CpuShare, ModelSession,
};
#[cfg(feature = "tensorrt")]
mod cuda;
pub mod ortlib;
pub mod paired;
pub mod saved;
#[cfg(feature = "tensorrt")]
pub mod trt;
pub mod typed;

pub use backend::{Backend, DeviceRun, DeviceTensor, InferredType, OnnxProgram, RunOutput, RunRequest};
pub use error::RuntimeError;
pub use factory::create_backend;
pub use layerwise_model::tensor::{shape_string, DType, Tensor, TensorData};
pub use spec::{BackendSpec, ConvSearch, ExecutionProvider, OptLevel, OrtOptions, Precision, KNOWN_SPECS};
