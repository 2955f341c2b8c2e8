//! The one interface every backend implements, and the command-line specs that name them.

use std::collections::HashMap;
use std::path::PathBuf;

use layerwise_model::{GraphIndex, Model, Selection};

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

/// The numeric precision a backend computes in, used to choose default tolerances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    Fp16,
    Bf16,
}

/// A way to run a model. ONNX Runtime execution providers and native TensorRT implement this
/// same trait, so the analysis never depends on which backend produced a tensor.
pub trait Backend {
    /// The spec this backend was created from (`ort:cpu`, `sim:fp16`, ...).
    fn spec(&self) -> &str;
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
    fn onnx_program(&mut self, request: &RunRequest) -> Option<Result<crate::paired::OnnxProgram, RuntimeError>> {
        let _ = request;
        None
    }
}

/// ONNX Runtime graph optimization level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptLevel {
    Disable,
    Basic,
    Extended,
    All,
}

/// Which ONNX Runtime execution provider runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionProvider {
    Cpu,
    /// CUDA; `tf32` lets float32 Conv/MatMul use TF32 tensor cores (ONNX Runtime's default: on).
    Cuda { device: u32, tf32: bool, conv_search: ConvSearch },
    /// ONNX Runtime's TensorRT execution provider.
    TensorRt { device: u32, fp16: bool },
    /// ONNX Runtime's TensorRT-RTX (NV) execution provider.
    NvRtx { device: u32 },
}

impl ExecutionProvider {
    pub fn needs_gpu(self) -> bool {
        !matches!(self, ExecutionProvider::Cpu)
    }
}

/// How cuDNN picks each convolution's algorithm (ONNX Runtime's `cudnn_conv_algo_search`). The
/// choice can change the numbers (another algorithm sums in another order, or uses Winograd
/// transforms), so the report says which one ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvSearch {
    /// Benchmark every algorithm on the first run of each session (ONNX Runtime's default, what
    /// a deployment gets): seconds per session on a large model.
    Exhaustive,
    /// cuDNN's heuristics pick without benchmarking: sessions start at once.
    Heuristic,
    /// cuDNN's default algorithm.
    Default,
}

impl ConvSearch {
    pub fn name(self) -> &'static str {
        match self {
            ConvSearch::Exhaustive => "exhaustive",
            ConvSearch::Heuristic => "heuristic",
            ConvSearch::Default => "default",
        }
    }
}

/// Options shared by the ONNX Runtime based backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrtOptions {
    pub opt_level: OptLevel,
    /// Intra-op threads; `None` lets ONNX Runtime choose.
    pub threads: Option<usize>,
    pub ep: ExecutionProvider,
    /// `ort:cpu` only: run a model with FP16/BF16 tensors one node at a time in its own types
    /// (`crate::typed`), since ONNX Runtime's CPU provider computes such models in float32
    /// (default on; `typed=off` runs the model whole).
    pub typed: bool,
}

/// A parsed backend spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// `ort:cpu[,opt=disable|basic|extended|all][,threads=N][,typed=on|off]`: ONNX Runtime's CPU
    /// execution provider in float32, the reference (a model with FP16/BF16 tensors is evaluated
    /// one node at a time in its own types unless `typed=off`, see `crate::typed`). Also `ort:cuda[,tf32=on|off][,device=N]`, `ort:trt[,fp16][,device=N]`
    /// and `ort:nvrtx[,device=N]`: the GPU execution providers (ONNX Runtime's GPU build).
    OrtCpu(OrtOptions),
    /// `sim:fp16|bf16|tf32[,engine=trt][,threads=N]`: FP16 or BF16 storage, or TF32 tensor
    /// cores, emulated on ONNX Runtime's CPU provider; `engine=trt` (FP16, BF16): as a weakly typed
    /// TensorRT engine stores values (BatchNorm folded, rounding at fused-layer boundaries only).
    Sim { rounding: layerwise_model::Rounding, trt_style: bool, options: OrtOptions },
    /// `npz:PATH`: tensors saved earlier with `--save-tensors` (a folder or an `.npz` file).
    Saved(PathBuf),
    /// `trt[,tf32=on|off][,opt=N][,workspace=MiB]`: native TensorRT (cargo feature `tensorrt`).
    Trt { tf32: bool, opt_level: Option<i32>, workspace_mib: Option<usize> },
}

pub const KNOWN_SPECS: &str =
    "ort:cpu[,opt=LEVEL][,threads=N][,typed=on|off], ort:cuda[,tf32=on|off][,conv_search=exhaustive|heuristic|default][,device=N], ort:trt[,fp16][,device=N], ort:nvrtx[,device=N], sim:fp16|bf16|tf32[,engine=trt][,threads=N], trt[,tf32=on|off][,opt=N][,workspace=MiB], npz:PATH";

impl BackendSpec {
    pub fn parse(spec: &str) -> Result<BackendSpec, RuntimeError> {
        let bad = |why: String| RuntimeError::BadSpec { spec: spec.to_string(), why: format!("{why}; known specs: {KNOWN_SPECS}") };
        if let Some(path) = spec.strip_prefix("npz:") {
            if path.is_empty() {
                return Err(bad("npz: needs a path".into()));
            }
            return Ok(BackendSpec::Saved(PathBuf::from(path)));
        }
        let mut parts = spec.split(',');
        let head = parts.next().unwrap_or_default();
        let sim = |rounding: layerwise_model::Rounding| move |options: OrtOptions| BackendSpec::Sim { rounding, trt_style: false, options };
        let (default_level, make, ep): (OptLevel, Box<dyn Fn(OrtOptions) -> BackendSpec>, ExecutionProvider) = match head {
            "ort:cpu" => (OptLevel::All, Box::new(BackendSpec::OrtCpu), ExecutionProvider::Cpu),
            "ort:cuda" => (OptLevel::All, Box::new(BackendSpec::OrtCpu), ExecutionProvider::Cuda { device: 0, tf32: true, conv_search: ConvSearch::Exhaustive }),
            "ort:trt" => (OptLevel::All, Box::new(BackendSpec::OrtCpu), ExecutionProvider::TensorRt { device: 0, fp16: false }),
            "ort:nvrtx" => (OptLevel::All, Box::new(BackendSpec::OrtCpu), ExecutionProvider::NvRtx { device: 0 }),
            // Optimizations would be free to fold the rounding Cast pairs (and splits) away.
            "sim:fp16" => (OptLevel::Disable, Box::new(sim(layerwise_model::Rounding::Fp16)), ExecutionProvider::Cpu),
            "sim:bf16" => (OptLevel::Disable, Box::new(sim(layerwise_model::Rounding::Bf16)), ExecutionProvider::Cpu),
            "sim:tf32" => (OptLevel::Disable, Box::new(sim(layerwise_model::Rounding::Tf32)), ExecutionProvider::Cpu),
            "trt" => {
                let (mut tf32, mut opt_level, mut workspace_mib) = (true, None, None);
                for part in parts {
                    match part.split_once('=') {
                        Some(("tf32", "on")) => tf32 = true,
                        Some(("tf32", "off")) => tf32 = false,
                        Some(("tf32", v)) => return Err(bad(format!("tf32 must be on or off, not '{v}'"))),
                        Some(("opt", v)) => opt_level = Some(v.parse().ok().filter(|l| (0..=5).contains(l)).ok_or_else(|| bad(format!("opt must be 0 to 5, not '{v}'")))?),
                        Some(("workspace", v)) => workspace_mib = Some(v.parse().map_err(|_| bad(format!("workspace must be MiB, not '{v}'")))?),
                        _ => return Err(bad(format!("unknown option '{part}' for trt (tf32=on|off, opt=N, workspace=MiB)"))),
                    }
                }
                return Ok(BackendSpec::Trt { tf32, opt_level, workspace_mib });
            }
            _ => return Err(bad(format!("'{head}' is not a backend"))),
        };
        let mut options = OrtOptions { opt_level: default_level, threads: None, ep, typed: true };
        let mut trt_style = false;
        for part in parts {
            if part == "fp16" {
                match &mut options.ep {
                    ExecutionProvider::TensorRt { fp16, .. } => *fp16 = true,
                    _ => return Err(bad(format!("option 'fp16' is for ort:trt, not {head}"))),
                }
                continue;
            }
            let (key, value) = part.split_once('=').ok_or_else(|| bad(format!("option '{part}' is not KEY=VALUE")))?;
            match key {
                "conv_search" => match &mut options.ep {
                    ExecutionProvider::Cuda { conv_search, .. } => {
                        *conv_search = match value {
                            "exhaustive" => ConvSearch::Exhaustive,
                            "heuristic" => ConvSearch::Heuristic,
                            "default" => ConvSearch::Default,
                            _ => return Err(bad(format!("conv_search must be exhaustive, heuristic or default, not '{value}'"))),
                        }
                    }
                    _ => return Err(bad(format!("option 'conv_search' is for ort:cuda, not {head}"))),
                },
                "engine" if head == "sim:fp16" || head == "sim:bf16" => {
                    trt_style = match value {
                        "trt" => true,
                        "typed" => false,
                        _ => return Err(bad(format!("engine must be trt or typed, not '{value}'"))),
                    }
                }
                "tf32" => match &mut options.ep {
                    ExecutionProvider::Cuda { tf32, .. } => {
                        *tf32 = match value {
                            "on" => true,
                            "off" => false,
                            _ => return Err(bad(format!("tf32 must be on or off, not '{value}'"))),
                        }
                    }
                    _ => return Err(bad(format!("option 'tf32' is for ort:cuda, not {head}"))),
                },
                "device" => {
                    let n: u32 = value.parse().map_err(|_| bad(format!("device must be a GPU index, not '{value}'")))?;
                    match &mut options.ep {
                        ExecutionProvider::Cuda { device, .. } | ExecutionProvider::TensorRt { device, .. } | ExecutionProvider::NvRtx { device } => *device = n,
                        ExecutionProvider::Cpu => return Err(bad(format!("option 'device' is for GPU backends, not {head}"))),
                    }
                }
                "opt" if !head.starts_with("sim:") => {
                    options.opt_level = match value {
                        "disable" => OptLevel::Disable,
                        "basic" => OptLevel::Basic,
                        "extended" => OptLevel::Extended,
                        "all" => OptLevel::All,
                        _ => return Err(bad(format!("opt must be disable, basic, extended or all, not '{value}'"))),
                    }
                }
                "typed" if head == "ort:cpu" => {
                    options.typed = match value {
                        "on" => true,
                        "off" => false,
                        _ => return Err(bad(format!("typed must be on or off, not '{value}'"))),
                    }
                }
                "threads" => {
                    options.threads = Some(
                        value.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(|| bad(format!("threads must be a positive number, not '{value}'")))?,
                    )
                }
                _ => return Err(bad(format!("unknown option '{key}' for {head}"))),
            }
        }
        Ok(match make(options) {
            BackendSpec::Sim { rounding, options, .. } => BackendSpec::Sim { rounding, trt_style, options },
            other => other,
        })
    }
}

/// Creates the backend a spec names.
pub fn create_backend(spec: &str) -> Result<Box<dyn Backend>, RuntimeError> {
    let parsed = BackendSpec::parse(spec)?;
    if let BackendSpec::OrtCpu(o) = &parsed {
        if o.ep.needs_gpu() {
            crate::ortlib::require_gpu_build()?;
        }
    }
    Ok(match parsed {
        BackendSpec::OrtCpu(options) => Box::new(crate::ort_backend::OrtBackend::new(spec, options, None)),
        BackendSpec::Sim { rounding, trt_style, options } => {
            let mut backend = crate::ort_backend::OrtBackend::new(spec, options, Some(rounding));
            backend.trt_style = trt_style;
            Box::new(backend)
        }
        BackendSpec::Saved(path) => Box::new(crate::saved::SavedBackend::open(spec, &path)?),
        #[cfg(feature = "tensorrt")]
        BackendSpec::Trt { tf32, opt_level, workspace_mib } => {
            Box::new(crate::trt::TrtBackend::new(spec, crate::trt::TrtOptions { tf32, opt_level, workspace_mib }))
        }
        #[cfg(not(feature = "tensorrt"))]
        BackendSpec::Trt { .. } => {
            return Err(RuntimeError::BadSpec {
                spec: spec.to_string(),
                why: "this layerwise was built without native TensorRT; rebuild with `--features tensorrt` (docs/tensorrt.md)".into(),
            })
        }
    })
}
