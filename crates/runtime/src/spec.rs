//! Backend specs: the text a user gives (`ort:cuda,tf32=off`, `sim:fp16`, `npz:DIR`) parsed once, at
//! the edge, into a [`BackendSpec`] that the rest of the code asks questions of. Its `Display` is
//! the canonical text (options in one order, defaults left out), which reports show and which
//! parses back to the same spec.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use layerwise_model::Rounding;

use crate::RuntimeError;

/// The numeric precision a backend computes in (the model crate's, the one type of it).
pub use layerwise_model::Precision;

/// ONNX Runtime graph optimization level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptLevel {
    Disable,
    Basic,
    Extended,
    All,
}

impl OptLevel {
    pub fn name(self) -> &'static str {
        match self {
            OptLevel::Disable => "disable",
            OptLevel::Basic => "basic",
            OptLevel::Extended => "extended",
            OptLevel::All => "all",
        }
    }
}

/// Which ONNX Runtime execution provider runs the model. `device` is the GPU index the spec
/// names (`None`: not named, GPU 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionProvider {
    Cpu,
    /// CUDA; `tf32` lets float32 Conv/MatMul use TF32 tensor cores (ONNX Runtime's default: on).
    Cuda {
        device: Option<u32>,
        tf32: bool,
        conv_search: ConvSearch,
    },
    /// ONNX Runtime's TensorRT execution provider.
    TensorRt {
        device: Option<u32>,
        fp16: bool,
    },
    /// ONNX Runtime's TensorRT-RTX (NV) execution provider.
    NvRtx {
        device: Option<u32>,
    },
}

impl ExecutionProvider {
    pub fn needs_gpu(self) -> bool {
        !matches!(self, ExecutionProvider::Cpu)
    }

    /// The GPU this provider runs on (0 unless the spec names one); `None` on the CPU.
    pub fn device_id(self) -> Option<u32> {
        match self {
            ExecutionProvider::Cpu => None,
            ExecutionProvider::Cuda { device, .. }
            | ExecutionProvider::TensorRt { device, .. }
            | ExecutionProvider::NvRtx { device } => Some(device.unwrap_or(0)),
        }
    }

    fn head(self) -> &'static str {
        match self {
            ExecutionProvider::Cpu => "ort:cpu",
            ExecutionProvider::Cuda { .. } => "ort:cuda",
            ExecutionProvider::TensorRt { .. } => "ort:trt",
            ExecutionProvider::NvRtx { .. } => "ort:nvrtx",
        }
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

impl OrtOptions {
    /// ONNX Runtime's CPU provider with its defaults (every optimization, its own threads, typed
    /// evaluation of FP16/BF16 models).
    pub fn cpu() -> OrtOptions {
        OrtOptions { opt_level: OptLevel::All, threads: None, ep: ExecutionProvider::Cpu, typed: true }
    }
}

/// A parsed backend spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// `ort:cpu[,opt=disable|basic|extended|all][,threads=N][,typed=on|off]`: ONNX Runtime's CPU
    /// execution provider in float32, the reference (a model with FP16/BF16 tensors is evaluated
    /// one node at a time in its own types unless `typed=off`, see `crate::typed`). Also
    /// `ort:cuda[,tf32=on|off][,device=N]`, `ort:trt[,fp16][,device=N]` and `ort:nvrtx[,device=N]`:
    /// the GPU execution providers (ONNX Runtime's GPU build).
    Ort(OrtOptions),
    /// `sim:fp16|bf16|tf32[,engine=trt][,threads=N]`: FP16 or BF16 storage, or TF32 tensor
    /// cores, emulated on ONNX Runtime's CPU provider; `engine=trt` (FP16, BF16): as a weakly typed
    /// TensorRT engine stores values (BatchNorm folded, rounding at fused-layer boundaries only).
    Sim { rounding: Rounding, trt_style: bool, options: OrtOptions },
    /// `sim:int8|fp8[,threads=N]`: the float32 model quantized by layerwise's own quantizer
    /// (`layerwise_model::quantize`, a config from `--quant-config`, ranges calibrated on the
    /// samples) and the Q/DQ model run on ONNX Runtime's CPU provider at `opt=basic`, below its
    /// Q/DQ fusions, exactly as `--cand ort:cpu,opt=basic --cand-model` runs a Q/DQ model: the
    /// arithmetic the file describes, the same on every CPU (see `parse`).
    Quantized { fp8: bool, options: OrtOptions },
    /// `npz:PATH`: tensors saved earlier with `--save-tensors` (a folder or an `.npz` file).
    Saved(PathBuf),
    /// `trt[,tf32=on|off][,opt=N][,workspace=MiB]`: native TensorRT (cargo feature `tensorrt`).
    Trt { tf32: bool, opt_level: Option<i32>, workspace_mib: Option<usize> },
}

pub const KNOWN_SPECS: &str =
    "ort:cpu[,opt=LEVEL][,threads=N][,typed=on|off], ort:cuda[,tf32=on|off][,conv_search=exhaustive|heuristic|default][,device=N], ort:trt[,fp16][,device=N], ort:nvrtx[,device=N], sim:fp16|bf16|tf32[,engine=trt][,threads=N], sim:int8|fp8[,threads=N], trt[,tf32=on|off][,opt=N][,workspace=MiB], npz:PATH";

impl BackendSpec {
    pub fn parse(spec: &str) -> Result<BackendSpec, RuntimeError> {
        let bad = |why: String| RuntimeError::BadSpec {
            spec: spec.to_string(),
            why: format!("{why}; known specs: {KNOWN_SPECS}"),
        };
        if let Some(path) = spec.strip_prefix("npz:") {
            if path.is_empty() {
                return Err(bad("npz: needs a path".into()));
            }
            return Ok(BackendSpec::Saved(PathBuf::from(path)));
        }
        let mut parts = spec.split(',');
        let head = parts.next().unwrap_or_default();
        // One value per option: a second one would silently win.
        let mut seen = std::collections::HashSet::new();
        for part in parts.clone() {
            let key = part.split_once('=').map_or(part, |(k, _)| k);
            if !seen.insert(key) {
                return Err(bad(format!("option '{key}' is given twice")));
            }
        }
        // ONNX Runtime's optimizations would be free to fold an emulation's rounding Cast pairs
        // (and splits) away: emulations run unoptimized.
        let (rounding, ep) = match head {
            "ort:cpu" => (None, ExecutionProvider::Cpu),
            "ort:cuda" => {
                (None, ExecutionProvider::Cuda { device: None, tf32: true, conv_search: ConvSearch::Exhaustive })
            }
            "ort:trt" => (None, ExecutionProvider::TensorRt { device: None, fp16: false }),
            "ort:nvrtx" => (None, ExecutionProvider::NvRtx { device: None }),
            "sim:fp16" => (Some(Rounding::Fp16), ExecutionProvider::Cpu),
            "sim:bf16" => (Some(Rounding::Bf16), ExecutionProvider::Cpu),
            "sim:tf32" => (Some(Rounding::Tf32), ExecutionProvider::Cpu),
            "sim:int8" | "sim:fp8" => {
                // The Q/DQ model runs at Basic, below ONNX Runtime's Q/DQ fusions: the emulation
                // computes the arithmetic the file describes (int32 sums of the codes, exact in
                // float32 at these sizes), the same on every CPU. At the default level the fused
                // u8s8 kernels of an x86 CPU without VNNI (AVX2 only) sum pairs of products in 16
                // bits and saturate: `fix --cand sim:int8` kept every node on an AMD EPYC where a
                // VNNI CPU kept one. (For float8, 1.31.1's Extended fusions also turn Q/DQ around
                // a Conv into a QLinearConv that refuses float8 inputs.)
                let mut options = OrtOptions::cpu();
                options.opt_level = OptLevel::Basic;
                for part in parts {
                    match part.split_once('=') {
                        Some(("threads", v)) => options.threads = Some(v.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(|| bad(format!("threads must be a positive number, not '{v}'")))?),
                        _ => return Err(bad(format!("unknown option '{part}' for {head} (threads=N; the quantization itself is set with --quant-config FILE)"))),
                    }
                }
                return Ok(BackendSpec::Quantized { fp8: head == "sim:fp8", options });
            }
            "trt" => {
                let (mut tf32, mut opt_level, mut workspace_mib) = (true, None, None);
                for part in parts {
                    match part.split_once('=') {
                        Some(("tf32", "on")) => tf32 = true,
                        Some(("tf32", "off")) => tf32 = false,
                        Some(("tf32", v)) => return Err(bad(format!("tf32 must be on or off, not '{v}'"))),
                        Some(("opt", v)) => {
                            opt_level = Some(
                                v.parse()
                                    .ok()
                                    .filter(|l| (0..=5).contains(l))
                                    .ok_or_else(|| bad(format!("opt must be 0 to 5, not '{v}'")))?,
                            )
                        }
                        Some(("workspace", v)) => {
                            workspace_mib =
                                Some(v.parse().map_err(|_| bad(format!("workspace must be MiB, not '{v}'")))?)
                        }
                        _ => {
                            return Err(bad(format!(
                                "unknown option '{part}' for trt (tf32=on|off, opt=N, workspace=MiB)"
                            )))
                        }
                    }
                }
                return Ok(BackendSpec::Trt { tf32, opt_level, workspace_mib });
            }
            _ => return Err(bad(format!("'{head}' is not a backend"))),
        };
        let default_level = if rounding.is_some() { OptLevel::Disable } else { OptLevel::All };
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
                            _ => {
                                return Err(bad(format!(
                                    "conv_search must be exhaustive, heuristic or default, not '{value}'"
                                )))
                            }
                        }
                    }
                    _ => return Err(bad(format!("option 'conv_search' is for ort:cuda, not {head}"))),
                },
                "engine" if matches!(rounding, Some(Rounding::Fp16 | Rounding::Bf16)) => {
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
                    let n: u32 =
                        value.parse().map_err(|_| bad(format!("device must be a GPU index, not '{value}'")))?;
                    match &mut options.ep {
                        ExecutionProvider::Cuda { device, .. }
                        | ExecutionProvider::TensorRt { device, .. }
                        | ExecutionProvider::NvRtx { device } => *device = Some(n),
                        ExecutionProvider::Cpu => {
                            return Err(bad(format!("option 'device' is for GPU backends, not {head}")))
                        }
                    }
                }
                "opt" if rounding.is_none() => {
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
                        value
                            .parse()
                            .ok()
                            .filter(|&n: &usize| n > 0)
                            .ok_or_else(|| bad(format!("threads must be a positive number, not '{value}'")))?,
                    )
                }
                _ => return Err(bad(format!("unknown option '{key}' for {head}"))),
            }
        }
        Ok(match rounding {
            Some(rounding) => BackendSpec::Sim { rounding, trt_style, options },
            None => BackendSpec::Ort(options),
        })
    }

    /// Tensors saved by an earlier run (`npz:PATH`): nothing to run again.
    pub fn saved_path(&self) -> Option<&PathBuf> {
        match self {
            BackendSpec::Saved(path) => Some(path),
            _ => None,
        }
    }

    pub fn is_saved(&self) -> bool {
        self.saved_path().is_some()
    }

    /// The rounding an emulation (`sim:*`) applies; `None` for every other backend.
    pub fn emulated_rounding(&self) -> Option<Rounding> {
        match self {
            BackendSpec::Sim { rounding, .. } => Some(*rounding),
            _ => None,
        }
    }

    pub fn is_emulation(&self) -> bool {
        self.emulated_rounding().is_some()
    }

    /// `sim:int8` (`Some(false)`) or `sim:fp8` (`Some(true)`): the float32 model quantized by
    /// layerwise's quantizer; `None` for every other backend.
    pub fn quantized_emulation(&self) -> Option<bool> {
        match self {
            BackendSpec::Quantized { fp8, .. } => Some(*fp8),
            _ => None,
        }
    }

    /// Emulates a weakly typed TensorRT engine (`engine=trt`): BatchNorms folded into their Convs
    /// in float32, so their parameters are never stored in reduced precision.
    pub fn folds_batch_norms(&self) -> bool {
        matches!(self, BackendSpec::Sim { trt_style: true, .. })
    }

    /// The ONNX Runtime execution provider, for backends that run on ONNX Runtime.
    pub fn ort_options(&self) -> Option<&OrtOptions> {
        match self {
            BackendSpec::Ort(options) | BackendSpec::Sim { options, .. } | BackendSpec::Quantized { options, .. } => {
                Some(options)
            }
            _ => None,
        }
    }

    /// Whether it runs on a GPU through ONNX Runtime's GPU build (`ort:cuda`, `ort:trt`,
    /// `ort:nvrtx`).
    pub fn ort_gpu(&self) -> bool {
        matches!(self, BackendSpec::Ort(o) if o.ep.needs_gpu())
    }

    /// Whether it is `ort:cpu` (ONNX Runtime's CPU provider, whatever its options).
    pub fn runs_on_ort_cpu(&self) -> bool {
        matches!(self, BackendSpec::Ort(o) if o.ep == ExecutionProvider::Cpu)
    }

    /// For `ort:cpu` with typed evaluation on (the default): the threads to evaluate a model with
    /// FP16/BF16 tensors with, one node at a time in its own types. `None` for other backends.
    pub fn typed_cpu_threads(&self) -> Option<Option<usize>> {
        match self {
            BackendSpec::Ort(o) if o.ep == ExecutionProvider::Cpu && o.typed => Some(o.threads),
            _ => None,
        }
    }

    /// The same spec on GPU `device`: ONNX Runtime's GPU backends move there; CPU backends,
    /// emulations and saved tensors stay as they are. A GPU spec that names its own device is
    /// refused rather than silently moved, and so is native TensorRT (one process per GPU).
    pub fn on_device(&self, device: u32) -> Result<BackendSpec, RuntimeError> {
        let refuse = |why: &str| RuntimeError::SpecRefused { spec: self.to_string(), why: why.to_string() };
        match self {
            BackendSpec::Ort(o) if o.ep.needs_gpu() => {
                let mut moved = o.clone();
                match &mut moved.ep {
                    ExecutionProvider::Cuda { device: d, .. }
                    | ExecutionProvider::TensorRt { device: d, .. }
                    | ExecutionProvider::NvRtx { device: d } => {
                        if d.is_some() {
                            return Err(refuse(
                                "it names its own device; with --devices, leave device= out of the specs",
                            ));
                        }
                        *d = Some(device);
                    }
                    ExecutionProvider::Cpu => {}
                }
                Ok(BackendSpec::Ort(moved))
            }
            BackendSpec::Trt { .. } => Err(refuse(
                "native TensorRT takes no device; run one process per GPU with CUDA_VISIBLE_DEVICES and --shard",
            )),
            other => Ok(other.clone()),
        }
    }
}

impl FromStr for BackendSpec {
    type Err = RuntimeError;

    fn from_str(s: &str) -> Result<BackendSpec, RuntimeError> {
        BackendSpec::parse(s)
    }
}

impl fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let threads = |f: &mut fmt::Formatter<'_>, o: &OrtOptions| match o.threads {
            Some(n) => write!(f, ",threads={n}"),
            None => Ok(()),
        };
        match self {
            BackendSpec::Ort(o) => {
                f.write_str(o.ep.head())?;
                if o.opt_level != OptLevel::All {
                    write!(f, ",opt={}", o.opt_level.name())?;
                }
                threads(f, o)?;
                if !o.typed && o.ep == ExecutionProvider::Cpu {
                    f.write_str(",typed=off")?;
                }
                let device = match o.ep {
                    ExecutionProvider::Cpu => None,
                    ExecutionProvider::Cuda { device, tf32, conv_search } => {
                        if !tf32 {
                            f.write_str(",tf32=off")?;
                        }
                        if conv_search != ConvSearch::Exhaustive {
                            write!(f, ",conv_search={}", conv_search.name())?;
                        }
                        device
                    }
                    ExecutionProvider::TensorRt { device, fp16 } => {
                        if fp16 {
                            f.write_str(",fp16")?;
                        }
                        device
                    }
                    ExecutionProvider::NvRtx { device } => device,
                };
                match device {
                    Some(d) => write!(f, ",device={d}"),
                    None => Ok(()),
                }
            }
            BackendSpec::Sim { rounding, trt_style, options } => {
                f.write_str(match rounding {
                    Rounding::Fp16 => "sim:fp16",
                    Rounding::Bf16 => "sim:bf16",
                    Rounding::Tf32 => "sim:tf32",
                })?;
                if *trt_style {
                    f.write_str(",engine=trt")?;
                }
                threads(f, options)
            }
            BackendSpec::Quantized { fp8, options } => {
                f.write_str(if *fp8 { "sim:fp8" } else { "sim:int8" })?;
                threads(f, options)
            }
            BackendSpec::Saved(path) => write!(f, "npz:{}", path.display()),
            BackendSpec::Trt { tf32, opt_level, workspace_mib } => {
                f.write_str("trt")?;
                if !tf32 {
                    f.write_str(",tf32=off")?;
                }
                if let Some(level) = opt_level {
                    write!(f, ",opt={level}")?;
                }
                match workspace_mib {
                    Some(mib) => write!(f, ",workspace={mib}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl BackendSpec {
    /// `ort:cpu`: ONNX Runtime's CPU provider in float32 with its defaults, the usual reference.
    pub fn ort_cpu() -> BackendSpec {
        BackendSpec::Ort(OrtOptions::cpu())
    }

    /// `sim:fp16`, `sim:bf16` or `sim:tf32` with their defaults.
    pub fn sim(rounding: Rounding) -> BackendSpec {
        BackendSpec::Sim {
            rounding,
            trt_style: false,
            options: OrtOptions {
                opt_level: OptLevel::Disable,
                threads: None,
                ep: ExecutionProvider::Cpu,
                typed: true,
            },
        }
    }
}
