//! Native TensorRT through `trtx` (cargo feature `tensorrt`): finding the libraries, building an
//! engine from the (rewritten) ONNX model with the requested tensors marked as outputs, caching
//! it, and mapping every engine layer back to the ONNX nodes it contains.
//!
//! The build path runs on any machine, GPU or not (TensorRT-RTX's builder needs no GPU). Running
//! an engine needs a GPU and is not part of this build yet.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use layerwise_model::{expose, GraphIndex, Model, Selection};
use sha2::{Digest, Sha256};
use trtx::logger::{LogHandler, Severity};

use crate::backend::{Backend, RunOutput, RunRequest};
use crate::spec::{BackendSpec, Precision};
use crate::RuntimeError;

/// The `trt` backend: builds (or reuses) the engine with the requested tensors marked, then runs
/// it on GPU 0: device buffers for every input and marked output, the input shapes set on the
/// context (one optimization profile), `enqueueV3`, and the outputs copied back. Running needs
/// the CUDA runtime and an NVIDIA GPU that the TensorRT flavour supports; without them the run
/// stops with an error that names what is missing, after building and caching the engine.
pub struct TrtBackend {
    spec: BackendSpec,
    label: String,
    options: TrtOptions,
}

impl TrtBackend {
    pub fn new(spec: &BackendSpec, options: TrtOptions) -> TrtBackend {
        TrtBackend { spec: spec.clone(), label: spec.to_string(), options }
    }
}

impl Backend for TrtBackend {
    fn spec(&self) -> &BackendSpec {
        &self.spec
    }

    fn precision(&self) -> Precision {
        Precision::Fp32
    }

    fn tf32(&self) -> bool {
        self.options.tf32
    }

    fn run(&mut self, request: &RunRequest) -> Result<RunOutput, RuntimeError> {
        let shapes: Vec<(String, Vec<usize>)> =
            request.inputs.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
        let built = build_engine(request.model, request.index, request.selection, &shapes, &self.options)?;
        let fail = |why: String| RuntimeError::Backend {
            backend: self.label.clone(),
            why: format!(
                "engine built ({} layers, {}), but it cannot run here: {why}",
                built.layers.len(),
                built.path.display()
            ),
        };
        let cuda = crate::cuda::Cuda::load()
            .map_err(|why| fail(format!("{why}; running TensorRT engines needs CUDA and an NVIDIA GPU")))?;
        let mut output = execute(&cuda, &built, request).map_err(fail)?;
        output.engine_layers = built.layers.iter().map(|l| (l.name.clone(), l.onnx_nodes.clone())).collect();
        output.notes.push(format!(
            "TensorRT engine {} ({} layers, {} tensors marked{})",
            built.path.display(),
            built.layers.len(),
            built.marked.len(),
            if built.from_cache { ", from the cache" } else { "" }
        ));
        for t in &built.not_exposable {
            output
                .unavailable
                .push((t.clone(), "TensorRT cannot expose it (a folded constant or shape tensor)".into()));
        }
        Ok(output)
    }
}

fn dtype_of(t: trtx::DataType) -> Option<crate::DType> {
    use crate::DType;
    Some(match t {
        trtx::DataType::kFLOAT => DType::F32,
        trtx::DataType::kHALF => DType::F16,
        trtx::DataType::kBF16 => DType::BF16,
        trtx::DataType::kINT8 => DType::I8,
        trtx::DataType::kINT32 => DType::I32,
        trtx::DataType::kINT64 => DType::I64,
        trtx::DataType::kUINT8 => DType::U8,
        trtx::DataType::kBOOL => DType::Bool,
        _ => return None,
    })
}

fn dims64(shape: &[usize]) -> Result<trtx_sys::Dims64, String> {
    if shape.len() > 8 {
        return Err(format!("rank {} is above TensorRT's 8", shape.len()));
    }
    // SAFETY: Dims64 is a plain C struct (a rank and 8 extents); all zeros is valid.
    let mut dims: trtx_sys::Dims64 = unsafe { std::mem::zeroed() };
    dims.nbDims = shape.len() as i32;
    for (d, &v) in dims.d.iter_mut().zip(shape) {
        *d = v as i64;
    }
    Ok(dims)
}

/// Runs a built engine on GPU 0 and copies every output back to the host.
fn execute(cuda: &crate::cuda::Cuda, built: &BuiltEngine, request: &RunRequest) -> Result<RunOutput, String> {
    cuda.set_device(0)?;
    let bytes = fs::read(&built.path).map_err(|e| format!("cannot read {}: {e}", built.path.display()))?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let logger = trtx::Logger::new(Capture(log.clone())).map_err(|e| e.to_string())?;
    let mut runtime = trtx::Runtime::new(&logger).map_err(|e| e.to_string())?;
    let mut engine =
        runtime.deserialize_cuda_engine(&bytes).map_err(|e| format!("cannot deserialize the engine: {e}"))?;
    let n = engine.nb_io_tensors().map_err(|e| e.to_string())?;
    let mut io = Vec::new();
    for i in 0..n {
        let name = engine.io_tensor_name(i).map_err(|e| e.to_string())?;
        let dtype = engine.tensor_data_type(&name).map_err(|e| e.to_string())?;
        let output = matches!(engine.tensor_io_mode(&name).map_err(|e| e.to_string())?, trtx::TensorIOMode::kOUTPUT);
        io.push((name, dtype, output));
    }
    let mut context = engine.create_execution_context().map_err(|e| e.to_string())?;
    let mut buffers = Vec::new();
    for (name, dtype, _) in io.iter().filter(|(_, _, output)| !output) {
        let given = request
            .inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or(format!("no value for engine input '{name}'"))?;
        let want = dtype_of(*dtype).ok_or(format!("engine input '{name}' has a type layerwise cannot feed"))?;
        // An FP16 (converted) engine takes the same values converted.
        let converted;
        let tensor = match (&given.data, want) {
            (crate::TensorData::F32(v), crate::DType::F16) => {
                converted = crate::Tensor::new(
                    given.shape.clone(),
                    crate::TensorData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect()),
                );
                &converted
            }
            (_, want) if want == given.dtype() => given,
            _ => {
                return Err(format!(
                    "engine input '{name}' is {} but the value is {}",
                    want.name(),
                    given.dtype().name()
                ))
            }
        };
        context.set_input_shape(name, &dims64(&tensor.shape)?).map_err(|e| format!("input '{name}': {e}"))?;
        let host = tensor.to_le_bytes();
        let buffer = cuda.alloc(host.len())?;
        cuda.upload(&buffer, &host)?;
        // SAFETY: the buffer outlives the enqueue below and holds the whole tensor.
        unsafe { context.set_tensor_address(name, buffer.ptr) }.map_err(|e| e.to_string())?;
        buffers.push(buffer);
    }
    let mut outputs = Vec::new();
    for (name, dtype, _) in io.iter().filter(|(_, _, o)| *o) {
        let Some(dtype) = dtype_of(*dtype) else { continue };
        let dims = context.tensor_shape(name).map_err(|e| e.to_string())?;
        let shape: Vec<usize> = dims.d[..dims.nbDims.max(0) as usize].iter().map(|&d| d.max(0) as usize).collect();
        let size = shape.iter().product::<usize>() * dtype.size();
        let buffer = cuda.alloc(size)?;
        // SAFETY: the buffer outlives the enqueue below and holds the whole output.
        unsafe { context.set_tensor_address(name, buffer.ptr) }.map_err(|e| e.to_string())?;
        outputs.push((name.clone(), dtype, shape, size, buffer));
    }
    let stream = cuda.create_stream()?;
    // SAFETY: every I/O tensor has a device address set above; the stream is valid.
    let enqueued = unsafe { context.enqueue_v3(stream) }.map_err(|e| e.to_string());
    let synced = cuda.synchronize(stream);
    cuda.destroy_stream(stream)?;
    enqueued?;
    synced?;
    let mut out = RunOutput::default();
    for (name, dtype, shape, size, buffer) in outputs {
        let mut host = vec![0u8; size];
        cuda.download(&buffer, &mut host)?;
        let tensor = crate::Tensor::from_le_bytes(dtype, shape, &host)
            .ok_or(format!("output '{name}' came back with the wrong size"))?;
        out.tensors.insert(name, tensor);
    }
    drop(buffers);
    Ok(out)
}

/// TensorRT-RTX's main library and ONNX parser (TensorRT 11's with `tensorrt-enterprise`).
#[cfg(not(feature = "tensorrt-enterprise"))]
const LIBS: (&str, &str) = ("libtensorrt_rtx.so.1", "libtensorrt_onnxparser_rtx.so.1");
#[cfg(feature = "tensorrt-enterprise")]
const LIBS: (&str, &str) = ("libnvinfer.so.11", "libnvonnxparser.so.11");
/// Python packages that ship the libraries (`pip install tensorrt-rtx-cu13-libs` / `tensorrt-cu13-libs`).
#[cfg(not(feature = "tensorrt-enterprise"))]
const PY_PACKAGE: &str = "tensorrt_rtx_libs";
#[cfg(feature = "tensorrt-enterprise")]
const PY_PACKAGE: &str = "tensorrt_libs";

fn err(why: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Backend { backend: "trt".into(), why: why.to_string() }
}

/// Finds the folder holding TensorRT's libraries: `LAYERWISE_TRT_LIB_DIR`, the folders of
/// `LD_LIBRARY_PATH`, then the Python package that ships them.
pub fn locate_libraries() -> Result<PathBuf, RuntimeError> {
    let holds = |dir: &Path| dir.join(LIBS.0).exists() && dir.join(LIBS.1).exists();
    if let Some(dir) = std::env::var_os("LAYERWISE_TRT_LIB_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if holds(&dir) {
            Ok(dir)
        } else {
            Err(err(format!("LAYERWISE_TRT_LIB_DIR={} does not hold {} and {}", dir.display(), LIBS.0, LIBS.1)))
        };
    }
    for dir in std::env::var("LD_LIBRARY_PATH").unwrap_or_default().split(':').filter(|d| !d.is_empty()) {
        if holds(Path::new(dir)) {
            return Ok(PathBuf::from(dir));
        }
    }
    let python = std::env::var("LAYERWISE_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!("import {PY_PACKAGE}, os; print(os.path.dirname({PY_PACKAGE}.__file__))");
    if let Ok(out) = Command::new(python).args(["-c", &script]).output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && holds(&dir) {
            return Ok(dir);
        }
    }
    Err(err(format!(
        "TensorRT libraries not found ({} and {}): set LAYERWISE_TRT_LIB_DIR to their folder, add it to LD_LIBRARY_PATH, or `pip install {}`",
        LIBS.0,
        LIBS.1,
        if cfg!(feature = "tensorrt-enterprise") { "tensorrt-cu13-libs" } else { "tensorrt-rtx-cu13-libs==1.7.1.116" }
    )))
}

static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Loads TensorRT once per process.
fn load() -> Result<&'static PathBuf, RuntimeError> {
    LOADED
        .get_or_init(|| {
            let dir = locate_libraries().map_err(|e| match e {
                RuntimeError::Backend { why, .. } => why,
                other => other.to_string(),
            })?;
            trtx::dynamically_load_tensorrt(Some(dir.join(LIBS.0)))
                .map_err(|e| format!("cannot load {}: {e}", dir.join(LIBS.0).display()))?;
            trtx::dynamically_load_tensorrt_onnxparser(Some(dir.join(LIBS.1)))
                .map_err(|e| format!("cannot load {}: {e}", dir.join(LIBS.1).display()))?;
            Ok(dir)
        })
        .as_ref()
        .map_err(err)
}

/// Builder options of the `trt` backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrtOptions {
    /// Let float32 convolutions and matrix products use TF32 (TensorRT's default: on).
    pub tf32: bool,
    /// Builder optimization level (0-5); TensorRT's default when `None`.
    pub opt_level: Option<i32>,
    /// Workspace limit in MiB; TensorRT's default when `None`.
    pub workspace_mib: Option<usize>,
}

impl Default for TrtOptions {
    fn default() -> Self {
        TrtOptions { tf32: true, opt_level: None, workspace_mib: None }
    }
}

/// One layer of a built engine and the ONNX nodes (layerwise names) it computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineLayer {
    /// TensorRT's name: an ONNX node's name, `a + b` for a fusion, or `{ForeignNode[first...last]}`
    /// for a region compiled by TensorRT's Myelin backend.
    pub name: String,
    pub onnx_nodes: Vec<String>,
}

/// A built engine, from the cache or fresh.
#[derive(Debug, Clone)]
pub struct BuiltEngine {
    pub path: PathBuf,
    pub size: usize,
    pub layers: Vec<EngineLayer>,
    /// Tensors marked as engine outputs (the model's own outputs included).
    pub marked: Vec<String>,
    /// Requested tensors the parsed network does not have (folded constants, shape tensors, ...):
    /// TensorRT cannot expose them, which is not an error.
    pub not_exposable: Vec<String>,
    pub from_cache: bool,
    pub build_seconds: f64,
}

impl BuiltEngine {
    /// The engine layer that computes an ONNX node.
    pub fn layer_of(&self, node: &str) -> Option<&EngineLayer> {
        self.layers.iter().find(|l| l.onnx_nodes.iter().any(|n| n == node))
    }
}

struct Capture(Arc<Mutex<Vec<(Severity, String)>>>);

/// The error messages TensorRT logged, for error reports.
fn logged_errors(log: &Mutex<Vec<(Severity, String)>>) -> Vec<String> {
    log.lock().expect("log").iter().filter(|(s, _)| *s <= Severity::Error).map(|(_, m)| m.clone()).collect()
}

impl LogHandler for Capture {
    fn log(&self, severity: Severity, message: &str) {
        // The build log is read for the layer map; with `--verbose` its warnings and errors are
        // shown too.
        if severity <= Severity::Warning && crate::backend_log::echo() {
            let level = if severity == Severity::Warning { "warning" } else { "error" };
            eprintln!("[TensorRT {level}] {}", layerwise_model::terminal_text::terminal_lines(message.trim()));
        }
        self.0.lock().expect("log lock").push((severity, message.to_string()));
    }
}

/// Maps TensorRT's name for an ONNX node back to layerwise's: named nodes keep their name;
/// TensorRT's ONNX parser calls an unnamed node `node_of_<its first output>`.
fn onnx_node_name(index: &GraphIndex, trt_name: &str) -> String {
    if index.node(trt_name).is_some() {
        return trt_name.to_string();
    }
    trt_name
        .strip_prefix("node_of_")
        .and_then(|out| index.producer(out))
        .map(|n| n.name.clone())
        .unwrap_or_else(|| trt_name.to_string())
}

/// Reads the engine's layers from TensorRT's verbose build log: every `Layer: NAME Host
/// Persistent...` line is an engine layer; a Myelin region's ONNX nodes come from its
/// `ForeignNode ... metadata: [ONNX Layer: a][ONNX Layer: b]` line, a fused layer's from the
/// `a + b` parts of its name.
pub fn layer_map(log: &[String], index: &GraphIndex) -> Vec<EngineLayer> {
    let mut metadata: HashMap<String, Vec<String>> = HashMap::new();
    for line in log {
        if let Some(rest) = line.strip_prefix("ForeignNode ") {
            if let Some((name, meta)) = rest.split_once(" metadata: ") {
                let nodes = meta
                    .split("[ONNX Layer: ")
                    .skip(1)
                    .filter_map(|part| part.split_once(']').map(|(n, _)| onnx_node_name(index, n)))
                    .collect();
                metadata.insert(name.to_string(), nodes);
            }
        }
    }
    let mut layers: Vec<EngineLayer> = Vec::new();
    for line in log {
        let Some(rest) = line.strip_prefix("Layer: ") else { continue };
        let Some((name, _)) = rest.split_once(" Host Persistent:") else { continue };
        if layers.iter().any(|l| l.name == name) {
            continue;
        }
        let onnx_nodes = match metadata.get(name) {
            Some(nodes) => nodes.clone(),
            None => {
                name.split(" + ").map(|n| onnx_node_name(index, n.trim())).filter(|n| index.node(n).is_some()).collect()
            }
        };
        layers.push(EngineLayer { name: name.to_string(), onnx_nodes });
    }
    layers
}

/// Builds (or takes from the cache) an engine for `model` with the selected tensors marked as
/// outputs. `input_shapes` gives every input's shape: one optimization profile fixes them
/// (min = opt = max), so models with dynamic dimensions build too. The cache key covers the
/// model's hash, the marked tensors, the shapes, the options and the TensorRT library, so a
/// repeated run does not rebuild.
pub fn build_engine(
    model: &Model,
    index: &GraphIndex,
    selection: &Selection,
    input_shapes: &[(String, Vec<usize>)],
    options: &TrtOptions,
) -> Result<BuiltEngine, RuntimeError> {
    let dir = load()?;
    // Validates the selection the same way every backend does.
    let (_, wanted) = expose(&model.proto, index, selection)?;
    let library = fs::metadata(dir.join(LIBS.0)).map(|m| m.len()).unwrap_or(0);
    let mut key = Sha256::new();
    key.update(model.sha256.as_bytes());
    key.update(wanted.join("\n").as_bytes());
    key.update(format!("{input_shapes:?}|{options:?}|{}|{library}", LIBS.0).as_bytes());
    let key: String = key.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    let cache = crate::ortlib::cache_dir().join("trt-engines");
    let (engine_path, layers_path) = (cache.join(format!("{key}.engine")), cache.join(format!("{key}.layers")));
    if let (Ok(bytes), Ok(text)) = (fs::metadata(&engine_path), fs::read_to_string(&layers_path)) {
        let mut layers = Vec::new();
        let mut not_exposable = Vec::new();
        for line in text.lines() {
            match line.split_once('\t') {
                Some(("-", name)) => not_exposable.push(name.to_string()),
                Some((name, nodes)) => layers.push(EngineLayer {
                    name: name.to_string(),
                    onnx_nodes: nodes.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect(),
                }),
                None => {}
            }
        }
        let marked = wanted.iter().filter(|t| !not_exposable.contains(t)).cloned().collect();
        return Ok(BuiltEngine {
            path: engine_path,
            size: bytes.len() as usize,
            layers,
            marked,
            not_exposable,
            from_cache: true,
            build_seconds: 0.0,
        });
    }

    let started = std::time::Instant::now();
    let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-trt-")
        .map_err(|e| RuntimeError::Io { path: std::env::temp_dir(), cause: e })?;
    let (bytes, folder) = model.runtime_bytes(&model.proto, scratch.path())?;
    if folder.is_some() {
        return Err(err("models with external data are not supported by the TensorRT backend yet"));
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let logger = trtx::Logger::new(Capture(log.clone())).map_err(err)?;
    let mut builder = trtx::Builder::new(&logger).map_err(err)?;
    let network = builder.create_network(0).map_err(err)?;
    let mut parser = trtx::OnnxParser::new(network, &logger).map_err(err)?;
    if let Err(e) = parser.parse(&bytes) {
        let errors = logged_errors(&log);
        return Err(err(format!("TensorRT's ONNX parser refused the model: {e}; {}", errors.join("; "))));
    }
    // Mark the requested tensors on the parsed network (TensorRT's parser refuses untyped graph
    // outputs, so the model is not rewritten as for ONNX Runtime).
    let network = parser.network_mut();
    let mut found = Vec::new();
    let mut to_mark = Vec::new();
    for i in 0..network.nb_layers() {
        let layer = network.layer(i).map_err(err)?;
        for o in 0..layer.num_outputs(network) {
            let tensor = layer.output(network, o).map_err(err)?;
            let name = tensor.name(network).map_err(err)?;
            if wanted.contains(&name) {
                found.push(name);
                if !tensor.is_network_output(network) {
                    to_mark.push(tensor);
                }
            }
        }
    }
    for tensor in &to_mark {
        network.mark_output(tensor);
    }
    let not_exposable: Vec<String> = wanted.iter().filter(|t| !found.contains(t)).cloned().collect();
    let marked: Vec<String> = wanted.iter().filter(|t| found.contains(t)).cloned().collect();
    let mut config = builder.create_config().map_err(err)?;
    config.set_profiling_verbosity(trtx::ProfilingVerbosity::kDETAILED);
    if options.tf32 {
        config.set_flag(trtx::BuilderFlag::kTF32);
    } else {
        config.clear_flag(trtx::BuilderFlag::kTF32);
    }
    if let Some(level) = options.opt_level {
        config.set_builder_optimization_level(level);
    }
    if let Some(mib) = options.workspace_mib {
        config.set_memory_pool_limit(trtx::builder::MemoryPoolType::kWORKSPACE, mib << 20);
    }
    if !input_shapes.is_empty() {
        let mut profile = builder.creata_optimization_profile().map_err(err)?;
        for (name, shape) in input_shapes {
            let dims = dims64(shape).map_err(|why| err(format!("input '{name}': {why}")))?;
            for select in
                [trtx::OptProfileSelector::kMIN, trtx::OptProfileSelector::kOPT, trtx::OptProfileSelector::kMAX]
            {
                profile.set_dimensions(name, select, &dims).map_err(|e| err(format!("input '{name}': {e}")))?;
            }
        }
        config.add_optimization_profile(&mut profile).map_err(err)?;
    }
    let engine = builder.build_serialized_network(network, &mut config).map_err(|e| {
        let errors = logged_errors(&log);
        err(format!("engine build failed: {e}; {}", errors.join("; ")))
    })?;
    let lines: Vec<String> = log.lock().expect("log").iter().map(|(_, m)| m.clone()).collect();
    let layers = layer_map(&lines, index);
    fs::create_dir_all(&cache).map_err(|e| RuntimeError::Io { path: cache.clone(), cause: e })?;
    let write = |path: &Path, data: &[u8]| -> Result<(), RuntimeError> {
        let io = |e| RuntimeError::Io { path: path.to_path_buf(), cause: e };
        let (mut tmp, _tracked) =
            layerwise_model::scratch::create_tracked(|| tempfile::NamedTempFile::new_in(&cache), |t| t.path())
                .map_err(io)?;
        std::io::Write::write_all(&mut tmp, data).map_err(io)?;
        tmp.persist(path).map_err(|e| io(e.error))?;
        Ok(())
    };
    write(&engine_path, &engine)?;
    let mut text: String = layers.iter().map(|l| format!("{}\t{}\n", l.name, l.onnx_nodes.join(","))).collect();
    text.extend(not_exposable.iter().map(|t| format!("-\t{t}\n")));
    write(&layers_path, text.as_bytes())?;
    Ok(BuiltEngine {
        path: engine_path,
        size: engine.len(),
        layers,
        marked,
        not_exposable,
        from_cache: false,
        build_seconds: started.elapsed().as_secs_f64(),
    })
}
