use std::path::PathBuf;

use layerwise_model::ModelError;

/// Errors of the runtime stage: finding and driving backends, and tensor I/O.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{path}: {why}")]
    TensorFile { path: PathBuf, why: String },
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("input error: {0}")]
    Input(String),
    #[error("unknown backend spec '{spec}': {why}")]
    BadSpec { spec: String, why: String },
    #[error("ONNX Runtime library not found: {0}")]
    OrtNotFound(String),
    #[error("cannot load ONNX Runtime from {path}: {why}")]
    OrtLoad { path: PathBuf, why: String },
    #[error("ONNX Runtime ({backend}) failed: {why}")]
    Ort { backend: String, why: String },
    #[error("backend {backend}: {why}")]
    Backend { backend: String, why: String },
}
