use std::path::PathBuf;

use layerwise_model::ModelError;

/// Errors of the runtime stage: finding and driving backends, and tensor I/O.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{path}: {why}")]
    TensorFile { path: PathBuf, why: String },
    #[error("cannot write {path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error("input error: {0}")]
    Input(String),
    /// A run refused up front: its estimated memory cannot fit.
    #[error("{0}")]
    Memory(String),
    #[error("unknown backend spec '{spec}': {why}")]
    BadSpec { spec: String, why: String },
    /// A valid spec that cannot be used where it was given.
    #[error("backend spec '{spec}': {why}")]
    SpecRefused { spec: String, why: String },
    /// An input file holds an array the model does not declare.
    #[error("input error: {file} holds array '{array}', but the model has no input of that name (its inputs: {})", inputs.join(", "))]
    UnknownArray { file: PathBuf, array: String, inputs: Vec<String> },
    #[error("ONNX Runtime library not found: {0}")]
    OrtNotFound(String),
    #[error("cannot load ONNX Runtime from {path}: {why}")]
    OrtLoad { path: PathBuf, why: String },
    #[error("ONNX Runtime ({backend}) failed: {why}")]
    Ort { backend: String, why: String },
    #[error("backend {backend}: {why}")]
    Backend { backend: String, why: String },
}
