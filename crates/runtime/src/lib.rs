//! Backends that run a model and return its tensors, and the tensor I/O around them.
//!
//! Every backend implements [`Backend`]: given a model, inputs and a selection of tensors, it returns
//! those tensors by their original names. Rewriting the model so the tensors become visible (or
//! marking them as engine outputs) is the backend's business, so the analysis never depends on
//! which backend produced a tensor.

mod backend;
mod factory;
mod spec;
pub mod backend_log;
pub mod device_stats;
mod error;
pub mod inputs;
pub mod npy;
mod optimized_pieces;
mod ort_backend;
pub use ort_backend::{check_types, float32_tensors, share_cpu, tensor_types, tensor_types_for_any_shapes, timing_mark, release_freed_memory, CpuShare, InferredType, ModelSession};
pub mod ortlib;
pub mod paired;
pub mod saved;
pub mod typed;
#[cfg(feature = "tensorrt")]
mod cuda;
#[cfg(feature = "tensorrt")]
pub mod trt;

pub use backend::{Backend, DeviceRun, DeviceTensor, OnnxProgram, RunOutput, RunRequest};
pub use factory::create_backend;
pub use spec::{BackendSpec, ConvSearch, ExecutionProvider, OptLevel, OrtOptions, Precision, KNOWN_SPECS};
pub use error::RuntimeError;
pub use layerwise_model::tensor::{shape_string, DType, Tensor, TensorData};
