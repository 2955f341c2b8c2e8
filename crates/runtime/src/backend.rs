//! The one interface every backend implements. Specs are parsed in `spec.rs`; `factory.rs`
//! creates the backend a spec names.

use layerwise_model::{GraphIndex, Model, Selection};
use std::collections::HashMap;

use layerwise_model::onnx::ModelProto;

use crate::spec::{BackendSpec, OrtOptions, Precision};
use crate::{RuntimeError, Tensor};

/// What a backend is asked to do: run `model` on `inputs` and return the selected tensors.
pub struct RunRequest<'a> {
    pub model: &'a Model,
    pub index: &'a GraphIndex,
    pub inputs: &'a [(String, Tensor)],
    pub selection: &'a Selection,
}

/// What a backend returns.
#[derive(Debug, Default)]
pub struct RunOutput {
    /// Tensors by name (names of the original model).
    pub tensors: HashMap<String, Tensor>,
    /// Tensors that were asked for but that this backend cannot provide, with the reason
    /// (not a tensor type, fused away, ...). Not errors: the report lists them.
    pub unavailable: Vec<(String, String)>,
    /// Facts about the run worth showing the user (library used, rewrite sizes, ...).
    pub notes: Vec<String>,
    /// For compiled engines (TensorRT): each engine layer and the ONNX nodes it computes.
    pub engine_layers: Vec<(String, Vec<String>)>,
}

/// A way to run a model. ONNX Runtime execution providers and native TensorRT implement this
/// same trait, so the analysis never depends on which backend produced a tensor.
pub trait Backend: Send {
    /// The spec this backend was created from (`ort:cpu`, `sim:fp16`, ...).
    fn spec(&self) -> &BackendSpec;
    /// The precision its results carry.
    fn precision(&self) -> Precision;
    fn run(&mut self, request: &RunRequest) -> Result<RunOutput, RuntimeError>;
    /// Keep these nodes (layerwise names) at reference precision in later runs, if the backend can
    /// do so on the original model (FP16 emulation can). Backends that run a converted model
    /// return false: keep the nodes by converting the model with them in FP32 instead.
    fn keep_fp32(&mut self, nodes: &[String]) -> bool {
        let _ = nodes;
        false
    }
    /// Computes tensors of `request.model` as this backend's run of it computes them (its keep
    /// list included), in `pieces`, one after the other: each piece is a list of tensors, and
    /// only the nodes of this backend's program that they need run, a tensor held in `known` or
    /// computed by an earlier piece being fed rather than computed again. Every value `known`
    /// gives must be the one this run computes. A piece asked again with the same program (the same
    /// nodes, keep list and border) runs in the session it ran in. `request.selection` is not
    /// read. `None` where this backend cannot run parts of its program bit for bit as a whole
    /// run computes them.
    fn run_pieces<'k>(
        &mut self,
        request: &RunRequest,
        known: &dyn Fn(&str) -> Option<&'k Tensor>,
        pieces: &[Vec<String>],
    ) -> Option<Result<HashMap<String, Tensor>, RuntimeError>> {
        let _ = (request, known, pieces);
        None
    }
    /// Whether sessions built for pieces ([`Backend::run_pieces`]) are kept for later runs of the
    /// same pieces. `fix`'s trials re-run them; a bisect's follow-up steps run most pieces once,
    /// and the kept sessions were most of its peak (decoder of 11,201 nodes: 623 MiB kept, 326
    /// MiB not). Off by default.
    fn keep_piece_sessions(&mut self, keep: bool) {
        let _ = keep;
    }
    /// Whether float32 matrix products and convolutions run with TF32 on this backend.
    fn tf32(&self) -> bool {
        false
    }
    /// The ONNX Runtime options this backend runs with, if it runs on ONNX Runtime.
    fn ort_options(&self) -> Option<&OrtOptions> {
        None
    }
    /// What this backend would give ONNX Runtime for `request`, so that it can run paired with
    /// another in one session (see [`crate::paired`]); `None` for backends that do not run ONNX
    /// models on ONNX Runtime.
    fn onnx_program(&mut self, request: &RunRequest) -> Option<Result<OnnxProgram, RuntimeError>> {
        let _ = request;
        None
    }
    /// Runs `request` leaving every tensor on the GPU where it was computed, for the reductions
    /// there ([`crate::device_stats`]); `None` for backends that do not run on a CUDA device.
    fn run_on_device(&mut self, request: &RunRequest) -> Option<Result<DeviceRun, RuntimeError>> {
        let _ = request;
        None
    }
}

/// A run whose tensors stay in GPU memory ([`Backend::run_on_device`]); they are freed with it.
pub struct DeviceRun {
    /// The CUDA device (as CUDA numbers it) holding the tensors.
    pub device: u32,
    pub tensors: HashMap<String, DeviceTensor>,
    /// As [`RunOutput::unavailable`].
    pub unavailable: Vec<(String, String)>,
    pub notes: Vec<String>,
}

/// One tensor in GPU memory, owned by ONNX Runtime's value.
pub struct DeviceTensor {
    pub shape: Vec<usize>,
    pub dtype: crate::DType,
    /// The device address of its first element.
    pub ptr: *const std::ffi::c_void,
    pub(crate) _owner: ort::value::DynValue,
}

// SAFETY: the pointer is a device address, owned by `_owner` (an ONNX Runtime value, which may
// move between threads); nothing reads through it on the host.
unsafe impl Send for DeviceTensor {}

/// What an ONNX Runtime backend runs for one request, ready to be paired with another.
#[derive(Debug, Clone)]
pub struct OnnxProgram {
    /// The backend's spec (`ort:cpu`, `sim:fp16`).
    pub spec: String,
    /// The model as ONNX Runtime runs it, with its graph optimizations already applied (as ONNX
    /// Runtime saves them): run with optimizations disabled, it computes bit for bit what the
    /// backend computes. The requested tensors are graph outputs under their own names.
    pub proto: ModelProto,
    pub options: OrtOptions,
    /// What the backend would note about the run (library, emulation).
    pub notes: Vec<String>,
    /// Tensors asked for that this program does not compute, with the reason.
    pub unavailable: Vec<(String, String)>,
    /// The backend's log id: ONNX Runtime's lines about this program land in its notes.
    pub log_id: String,
}

/// The type of a computed tensor as ONNX Runtime infers it before any run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InferredType {
    /// `None` for element types layerwise does not hold (strings) and for non-tensors.
    pub dtype: Option<crate::DType>,
    /// Dimensions; `None` where ONNX Runtime could not infer one.
    pub dims: Vec<Option<usize>>,
}
