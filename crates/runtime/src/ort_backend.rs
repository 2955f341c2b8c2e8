//! ONNX Runtime backends: `ort:cpu` (the float32 reference) and `sim:fp16|bf16|tf32` (emulations).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use layerwise_model::{emulate_reusing, expose, RoundedWeights, Rounding};
use ort::logging::LogLevel;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{DynValue, TensorElementType, ValueType};

use crate::backend::{Backend, OnnxProgram, RunOutput, RunRequest};
use crate::run_guard::{guarded, RunError};
use crate::spec::{BackendSpec, ConvSearch, ExecutionProvider, OptLevel, OrtOptions, Precision};
use crate::{optimized_pieces, ortlib, DType, InferredType, RuntimeError, Tensor, TensorData};

/// What building a program said about it: the names asked for, notes and tensors it lacks.
struct ProgramFacts {
    names: Vec<String>,
    notes: Vec<String>,
    unavailable: Vec<(String, String)>,
}

pub struct OrtBackend {
    spec: BackendSpec,
    /// The spec's text, for errors and notes.
    label: String,
    options: OrtOptions,
    /// The precision emulated (`sim:...`), or none (ONNX Runtime as it is).
    emulate: Option<Rounding>,
    /// Emulate a weakly typed TensorRT engine's storage (BatchNorm folded, rounding at fused-layer
    /// boundaries only) instead of a strongly typed model's.
    pub trt_style: bool,
    /// Nodes the emulation keeps in FP32.
    keep_fp32: Vec<String>,
    /// The float32 tensors of each model emulated so far, by model hash: asking ONNX Runtime costs
    /// a session build, and `fix` and the counterfactual checks run the same model many times.
    float_cache: HashMap<String, HashSet<String>>,
    /// The last session of a GPU provider and what it runs (model, selection, keep list), kept
    /// for the next run of the same program, with what building that program said.
    gpu_session: Option<(String, Session, ProgramFacts)>,
    /// Sessions of the pieces `run_pieces` ran, by the hash of their program, the most recently
    /// used last: `fix`'s runs and the counterfactual's checks run the same pieces again.
    piece_sessions: Vec<(String, Session, usize, usize)>,
    /// Whether `piece_sessions` keeps sessions at all ([`Backend::keep_piece_sessions`]).
    keep_piece_sessions: bool,
    /// The weights `run_pieces` emulated rounded, by model hash, for its next run of the same
    /// model (a run otherwise rounds every weight again whatever its keep list changes); one
    /// model's at a time.
    rounded_weights: (String, RoundedWeights),
    /// The log id of this backend's sessions, so that what ONNX Runtime logs lands in this
    /// backend's run notes.
    log_id: String,
}

/// Builds (and drops) ONNX Runtime's session for `model` as the file declares it, at `options`'
/// optimization level: that it loads, where no inputs are at hand to run it. A session is where
/// ONNX Runtime's fusions run (LayerNormFusion refusing a mixed-type island among them), which
/// typing the model alone does not reach.
pub fn load_session(model: &layerwise_model::Model, options: &OrtOptions) -> Result<(), RuntimeError> {
    let spec = BackendSpec::Ort(options.clone());
    let backend = OrtBackend::new(&spec, options.clone(), None);
    drop(backend.session_for(model, &model.proto, options.opt_level)?);
    Ok(())
}

impl OrtBackend {
    pub fn new(spec: &BackendSpec, options: OrtOptions, emulate: Option<Rounding>) -> OrtBackend {
        static BACKENDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = BACKENDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let label = spec.to_string();
        let log_id = format!("{label}#{n}");
        OrtBackend {
            spec: spec.clone(),
            label,
            options,
            emulate,
            trt_style: false,
            keep_fp32: Vec::new(),
            float_cache: HashMap::new(),
            gpu_session: None,
            piece_sessions: Vec::new(),
            keep_piece_sessions: false,
            rounded_weights: Default::default(),
            log_id,
        }
    }

    fn err(&self, why: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::Ort { backend: self.label.clone(), why: why.to_string() }
    }

    /// A session for `proto`, a rewrite of `model`, with external data resolved against the
    /// original model's folder (see `Model::runtime_bytes`). The bytes go through a scratch file
    /// where they can (`scratch_source`): our copy of the weights is gone before ONNX Runtime
    /// makes its own (decoder of 11,201 nodes, `--cand-model`: 73 MB less at the peak).
    fn session_for(
        &self,
        model: &layerwise_model::Model,
        proto: &layerwise_model::onnx::ModelProto,
        level: OptLevel,
    ) -> Result<Session, RuntimeError> {
        let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-")
            .map_err(|e| RuntimeError::Io { path: std::env::temp_dir(), cause: e })?;
        let (bytes, folder) = model.runtime_bytes(proto, scratch.path())?;
        let source = scratch_source(bytes, folder.as_deref(), scratch.path())?;
        // On the CPU each tensor is allocated on its own: a run that returns every tensor holds
        // them in the arena's chunks while they are copied out, and the chunks stay (decoder of
        // 11,201 nodes: 63 MB of chunks beside the 50 MB of copies).
        let extras = SessionExtras { without_arena: self.options.ep == ExecutionProvider::Cpu, ..Default::default() };
        build_session(&self.label, &self.options, &self.log_id, source.as_source(), level, extras)
    }

    /// `proto` after ONNX Runtime's optimizations at this backend's level, as ONNX Runtime saves
    /// it: run with optimizations disabled, it computes what `proto` computes at that level, bit
    /// for bit (the optimizer's rewrites, fusions and layouts are in the graph). Graph outputs
    /// keep their names.
    fn optimized(
        &self,
        model: &layerwise_model::Model,
        proto: &layerwise_model::onnx::ModelProto,
    ) -> Result<layerwise_model::onnx::ModelProto, RuntimeError> {
        let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-")
            .map_err(|e| RuntimeError::Io { path: std::env::temp_dir(), cause: e })?;
        let (bytes, folder) = model.runtime_bytes(proto, scratch.path())?;
        let path = scratch.path().join("optimized.onnx");
        let extras = SessionExtras { optimized_path: Some(&path), without_spinning: true, ..Default::default() };
        let source = scratch_source(bytes, folder.as_deref(), scratch.path())?;
        drop(build_session(
            &self.label,
            &self.options,
            &self.log_id,
            source.as_source(),
            self.options.opt_level,
            extras,
        )?);
        drop(source);
        release_freed_memory();
        let mut optimized = layerwise_model::Model::read_proto(&path)?;
        layerwise_model::share_unchanged_weights(&mut optimized, proto);
        Ok(optimized)
    }
}

impl OrtBackend {
    /// [`OrtBackend::optimized`] of the reference's program for `request`, in pieces where the
    /// graph is large enough for one optimization of it to grow faster than the graph
    /// ([`crate::optimized_pieces`]); whole where it is small or cannot be cut. Says so in `notes`
    /// when cut.
    fn optimized_program(
        &self,
        request: &RunRequest,
        proto: &layerwise_model::onnx::ModelProto,
        notes: &mut Vec<String>,
    ) -> Result<layerwise_model::onnx::ModelProto, RuntimeError> {
        let piece_nodes = optimized_pieces::piece_nodes();
        let nodes = proto.graph.as_ref().map_or(0, |g| g.node.len());
        let started = std::time::Instant::now();
        let mut in_sessions = 0.0;
        // An emulation's program holds tensors (rounding pairs) that the model's typing does not;
        // the pieces' bit-for-bit check (tests/optimized_pieces.rs) runs on the CPU provider only.
        let cut = if self.emulate.is_some() {
            Err("an emulation's program".to_string())
        } else if self.options.ep != ExecutionProvider::Cpu {
            Err("a GPU provider's program".to_string())
        } else if !optimized_pieces::worth_cutting(nodes, piece_nodes) {
            Err("small enough for one session".to_string())
        } else {
            tensor_types(request.model, request.index, &input_shapes(request)).map_err(|e| e.to_string()).and_then(
                |types| {
                    optimized_pieces::optimized_in_pieces(proto, piece_nodes, &types, &mut |piece| {
                        let t = std::time::Instant::now();
                        let optimized = self.optimized(request.model, piece);
                        in_sessions += t.elapsed().as_secs_f64();
                        optimized
                    })
                },
            )
        };
        let program = match cut {
            Ok((program, pieces)) => {
                notes.push(format!(
                    "optimized by ONNX Runtime in {pieces} pieces of about {piece_nodes} nodes (one optimization of a graph this large takes time growing with its square): cut only where float32 graph outputs of known shape cross, each piece fed there, constants copied into every piece that reads them"
                ));
                Ok((program, format!("{pieces} pieces")))
            }
            Err(why) => self.optimized(request.model, proto).map(|program| (program, format!("whole ({why})"))),
        };
        program.map(|(program, how)| {
            if std::env::var_os("LAYERWISE_TIMING").is_some() {
                eprintln!(
                    "[timing] optimized program of {nodes} nodes: {how} ({:.2}s, pieces' sessions {in_sessions:.2}s)",
                    started.elapsed().as_secs_f64()
                );
            }
            program
        })
    }
}

/// What tells one piece's program from another without writing its weights out: the model, and
/// the piece's nodes, inputs (with their pinned shapes), outputs and the names, types and dimensions
/// of its weights. Within one model and emulation a weight's values follow from its name (rounded
/// in place, or an unrounded `__lw_keep32` copy for a kept node).
fn piece_key(model: &str, part: &layerwise_model::onnx::GraphProto) -> String {
    use prost::Message;
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    hash.update(model.as_bytes());
    for n in &part.node {
        hash.update(n.encode_to_vec());
    }
    for v in part.input.iter().chain(&part.output) {
        hash.update(v.encode_to_vec());
    }
    for w in &part.initializer {
        hash.update(format!("{}|{}|{:?};", w.name(), w.data_type(), w.dims));
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Most piece sessions an emulation keeps for later runs (`run_pieces`). Runs that re-run every
/// piece from some node to the end (`fix`'s trials) walk them in order, and a least recently used
/// set smaller than the model's pieces loses each one before it is asked for again (a decoder of
/// 11,201 nodes has 44 pieces of 256 nodes); the byte limit below bounds them.
const PIECE_SESSIONS: usize = 128;
/// Most bytes the kept piece sessions may hold together: their programs (weights mostly) and what
/// each piece computed, which its arena keeps (fix's trials on 3 samples of 4 text lines each kept
/// sessions that grew the process to 24 GB while their programs stayed within the bound).
const PIECE_SESSION_BYTES: usize = 1 << 30;

/// External weights up to this size are read into a paired program so that ONNX Runtime can
/// optimize it; above it the program runs unoptimized, its weights mapped from their file.
const OPTIMIZED_EXTERNAL_LIMIT: u64 = 512 << 20;

/// With `LAYERWISE_TIMING` set, prints `[timing] +SECONDS (cpu SECONDS) what` to stderr: wall
/// seconds since the first mark and the process's CPU seconds (steadier on a shared machine), so
/// that time outside any named step shows between two marks.
pub fn timing_mark(what: impl FnOnce() -> String) {
    static FIRST: std::sync::OnceLock<Option<std::time::Instant>> = std::sync::OnceLock::new();
    if let Some(first) = FIRST.get_or_init(|| std::env::var_os("LAYERWISE_TIMING").map(|_| std::time::Instant::now())) {
        let mut cpu = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes the one timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut cpu) };
        eprintln!(
            "[timing] +{:.3}s (cpu {:.3}s) {}",
            first.elapsed().as_secs_f64(),
            cpu.tv_sec as f64 + cpu.tv_nsec as f64 * 1e-9,
            what()
        );
    }
}

/// Hands the heap memory freed by a dropped session back to the operating system. A session's
/// build frees tens of MiB (the parsed model, graph rewrites) that the C allocator would otherwise
/// keep, and the next session's peak then comes on top of it.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the heap to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Where a session reads its model from.
pub(crate) enum ModelSource<'a> {
    /// Bytes in memory; external data resolves against `external_folder`.
    Memory { bytes: &'a [u8], external_folder: Option<&'a Path> },
    /// A file without external data.
    File(&'a Path),
}

/// A model's bytes, kept in a scratch file when they need no external-data folder (ONNX Runtime
/// then reads the file itself and our copy is gone before its own is made), in memory otherwise.
pub(crate) enum OwnedSource {
    Memory(Vec<u8>, Option<std::path::PathBuf>),
    File(std::path::PathBuf),
}

impl OwnedSource {
    pub(crate) fn as_source(&self) -> ModelSource<'_> {
        match self {
            OwnedSource::Memory(bytes, folder) => ModelSource::Memory { bytes, external_folder: folder.as_deref() },
            OwnedSource::File(path) => ModelSource::File(path),
        }
    }
}

pub(crate) fn scratch_source(
    bytes: Vec<u8>,
    external_folder: Option<&Path>,
    scratch: &Path,
) -> Result<OwnedSource, RuntimeError> {
    if let Some(folder) = external_folder {
        return Ok(OwnedSource::Memory(bytes, Some(folder.to_path_buf())));
    }
    let path = scratch.join("session.onnx");
    std::fs::write(&path, &bytes).map_err(|e| RuntimeError::Io { path: path.clone(), cause: e })?;
    Ok(OwnedSource::File(path))
}

/// What a session is built with beyond the backend's options.
#[derive(Default)]
pub(crate) struct SessionExtras<'a> {
    /// Where ONNX Runtime saves the model after its optimizations.
    pub optimized_path: Option<&'a Path>,
    /// Custom operators the model uses.
    pub operators: Option<ort::operator::OperatorDomain>,
    /// Allocate each tensor on its own, without the per-session arena (CPU) and the memory pattern,
    /// which keep a session's peak after its run: for the many sessions of a paired graph split
    /// into segments, run one at a time (on a ViT of 5,581 paired nodes in 6 segments, peak
    /// memory 488 MB with them, 434 MB without, 400 MB as one session).
    pub without_arena: bool,
    /// Threads that sleep between runs instead of spinning: for sessions kept alive side by side
    /// (the typed evaluation's shared one-node sessions, a paired graph's segments), whose
    /// spinning pools starve each other, and sessions built only to be saved. Segments spinning
    /// took 3x the CPU time of their builds (Relu chain 10,000: 2.9 s against 0.9 s).
    pub without_spinning: bool,
}

/// How many jobs build and run CPU sessions in this process at once (`--devices`' shards). Above
/// one, a session without its own thread count gets an equal share of the cores instead of all of
/// them each: measured with two shards on one host, every session taking every core made two GPUs
/// 1.24x one.
static CPU_SHARERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One more job sharing the CPU until the returned guard drops.
pub fn share_cpu() -> CpuShare {
    CPU_SHARERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    CpuShare(())
}

/// A job's part of the CPU (see [`share_cpu`]); dropping it gives the part back.
#[must_use = "the share ends when this guard drops"]
pub struct CpuShare(());

impl Drop for CpuShare {
    fn drop(&mut self) {
        CPU_SHARERS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The intra-op threads of a session without its own count while several jobs share the CPU.
fn shared_cpu_threads() -> Option<usize> {
    let sharers = CPU_SHARERS.load(std::sync::atomic::Ordering::SeqCst);
    (sharers > 1).then(|| (std::thread::available_parallelism().map_or(1, |n| n.get()) / sharers).max(1))
}

/// Whether this process's sessions may spin: `LAYERWISE_ORT_SPINNING=off` (or `0`) says other
/// processes share the cores (a test harness, a CI runner, several jobs on one machine), where
/// spinning threads only take the time the others need. Spinning changes no number.
fn spinning_allowed_here() -> bool {
    !matches!(std::env::var("LAYERWISE_ORT_SPINNING").as_deref().map(str::trim), Ok("off" | "0"))
}

/// A session for the model in `bytes`, with `options`' provider and threads at `level`. ONNX
/// Runtime's log lines go under `log_id`, so they land in that backend's run notes.
pub(crate) fn build_session(
    spec: &str,
    options: &OrtOptions,
    log_id: &str,
    source: ModelSource,
    level: OptLevel,
    extras: SessionExtras,
) -> Result<Session, RuntimeError> {
    let err = |why: String| RuntimeError::Ort { backend: spec.to_string(), why };
    let (env, _) = ortlib::environment()?;
    let level = match level {
        OptLevel::Disable => GraphOptimizationLevel::Disable,
        OptLevel::Basic => GraphOptimizationLevel::Level1,
        OptLevel::Extended => GraphOptimizationLevel::Level2,
        OptLevel::All => GraphOptimizationLevel::All,
    };
    let mut builder = Session::builder(env)
        .map_err(|e| err(e.to_string()))?
        .with_log_level(LogLevel::Warning)
        .map_err(|e| err(e.to_string()))?
        .with_log_id(log_id)
        .map_err(|e| err(e.to_string()))?
        .with_optimization_level(level)
        .map_err(|e| err(e.to_string()))?;
    if extras.without_arena {
        builder = builder.with_memory_pattern(false).map_err(|e| err(e.to_string()))?;
    }
    if let Some(n) = options.threads.or_else(shared_cpu_threads) {
        builder = builder.with_intra_threads(n).map_err(|e| err(e.to_string()))?;
    }
    // Threads that spin while waiting take the cores that other sessions running at once need
    // (other GPUs' jobs, or the typed check's many kept sessions, or other processes where
    // LAYERWISE_ORT_SPINNING=off says the machine is shared).
    if extras.without_spinning
        || (options.threads.is_none() && shared_cpu_threads().is_some())
        || !spinning_allowed_here()
    {
        builder = builder.with_config_entry("session.intra_op.allow_spinning", "0").map_err(|e| err(e.to_string()))?;
    }
    // A GPU provider that fails to register is an error, never a silent fall back to the CPU.
    let provider = match options.ep {
        ExecutionProvider::Cpu if extras.without_arena => {
            Some(ort::ep::CPU::default().with_arena_allocator(false).build())
        }
        ExecutionProvider::Cpu => None,
        ExecutionProvider::Cuda { device, tf32, conv_search } => {
            let search = match conv_search {
                ConvSearch::Exhaustive => ort::ep::cuda::ConvAlgorithmSearch::Exhaustive,
                ConvSearch::Heuristic => ort::ep::cuda::ConvAlgorithmSearch::Heuristic,
                ConvSearch::Default => ort::ep::cuda::ConvAlgorithmSearch::Default,
            };
            Some(
                ort::ep::CUDA::default()
                    .with_device_id(device.unwrap_or(0) as i32)
                    .with_tf32(tf32)
                    .with_conv_algorithm_search(search)
                    .build(),
            )
        }
        ExecutionProvider::TensorRt { device, fp16 } => {
            Some(ort::ep::TensorRT::default().with_device_id(device.unwrap_or(0) as i32).with_fp16(fp16).build())
        }
        ExecutionProvider::NvRtx { device } => {
            Some(ort::ep::NVRTX::default().with_device_id(device.unwrap_or(0)).build())
        }
    };
    if let Some(provider) = provider {
        builder = builder
            .with_execution_providers([provider.error_on_failure()])
            .map_err(|e| err(format!("cannot use the execution provider: {e}")))?;
    }
    if let ModelSource::Memory { external_folder: Some(folder), .. } = source {
        builder = builder
            .with_config_entry("session.model_external_initializers_file_folder_path", folder.to_string_lossy())
            .map_err(|e| err(e.to_string()))?;
    }
    if let Some(path) = extras.optimized_path {
        // A session built only to save its optimized model never runs: packing weights for the
        // kernels would only copy them.
        builder = builder
            .with_optimized_model_path(path)
            .and_then(|b| b.with_config_entry("session.disable_prepacking", "1"))
            .map_err(|e| err(e.to_string()))?;
    }
    if let Some(domain) = extras.operators {
        builder =
            builder.with_operators(domain).map_err(|e| err(format!("cannot register layerwise's operators: {e}")))?;
    }
    let commit = || match source {
        ModelSource::Memory { bytes, .. } => builder.commit_from_memory(bytes),
        ModelSource::File(path) => builder.commit_from_file(path),
    };
    match without_panicking(commit) {
        Ok(session) => session.map_err(|e| err(format!("cannot create a session: {e}"))),
        Err(why) => Err(err(format!(
            "cannot create a session: ONNX Runtime infers an impossible shape for these inputs (a negative dimension: a layer's output would be smaller than nothing, e.g. a convolution wider than its input): {why}"
        ))),
    }
}

thread_local! {
    static QUIET_PANICS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into its message. The `ort` crate panics while it reads the types of
/// a session whose inferred output shapes hold a negative dimension (ONNX Runtime infers them for
/// inputs a model cannot take); that is bad input, to be said as an error. The panic is not
/// printed: the process's hook is wrapped once to stay silent on this thread while `f` runs.
fn without_panicking<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static WRAP_HOOK: std::sync::Once = std::sync::Once::new();
    WRAP_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET_PANICS.with(|q| q.get()) {
                previous(info);
            }
        }));
    });
    QUIET_PANICS.with(|q| q.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET_PANICS.with(|q| q.set(false));
    result.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

impl Backend for OrtBackend {
    fn spec(&self) -> &BackendSpec {
        &self.spec
    }

    fn precision(&self) -> Precision {
        match (self.emulate, self.options.ep) {
            (Some(Rounding::Fp16), _) | (None, ExecutionProvider::TensorRt { fp16: true, .. }) => Precision::Fp16,
            (Some(Rounding::Bf16), _) => Precision::Bf16,
            _ => Precision::Fp32,
        }
    }

    fn keep_piece_sessions(&mut self, keep: bool) {
        self.keep_piece_sessions = keep;
        if !keep {
            self.piece_sessions.clear();
        }
    }

    fn tf32(&self) -> bool {
        self.emulate == Some(Rounding::Tf32) || matches!(self.options.ep, ExecutionProvider::Cuda { tf32: true, .. })
    }

    fn keep_fp32(&mut self, nodes: &[String]) -> bool {
        if self.emulate.is_some() {
            self.keep_fp32 = nodes.to_vec();
        }
        self.emulate.is_some()
    }

    fn ort_options(&self) -> Option<&OrtOptions> {
        Some(&self.options)
    }

    fn run_pieces<'k>(
        &mut self,
        request: &RunRequest,
        known: &dyn Fn(&str) -> Option<&'k Tensor>,
        pieces: &[Vec<String>],
    ) -> Option<Result<HashMap<String, Tensor>, RuntimeError>> {
        // An emulation runs unoptimized, node by node, so a part of its program computes what the
        // whole does; an optimized program may fuse across a piece's border. Bodies read outer
        // names the cut below does not follow; TensorRT-style storage folds nodes together.
        if self.emulate.is_none()
            || self.options.opt_level != OptLevel::Disable
            || self.trt_style
            || request.index.nodes.iter().any(|n| n.has_subgraphs)
        {
            return None;
        }
        let result = self.run_pieces_of_program(request, known, pieces);
        // What ONNX Runtime logs about parts is not a run's to report.
        crate::backend_log::take(&self.log_id);
        Some(result)
    }

    fn onnx_program(&mut self, request: &RunRequest) -> Option<Result<OnnxProgram, RuntimeError>> {
        let mut output = RunOutput::default();
        let result = self.program(request, &mut output, false).and_then(|(mut proto, _)| {
            // Optimized for the inputs' shapes, as a run of them is (run_session).
            if let Some(g) = proto.graph.as_mut() {
                layerwise_model::pair::pin_input_shapes(g, &input_shapes(request));
            }
            let external = proto.graph.as_ref().is_some_and(|g| g.initializer.iter().any(layerwise_model::is_external));
            if self.options.opt_level == OptLevel::Disable {
                Ok(proto)
            } else if external {
                // External weights up to a size are read in, and the program is optimized as an
                // inline model's is, so that the paired run computes what a plain run computes
                // (up to 619 of 1019 records differed without).
                // Above it, saving the optimized program would write every weight again
                // (gigabytes) and hold them in memory.
                match request.model.inlined_within(&proto, OPTIMIZED_EXTERNAL_LIMIT)? {
                    Some(inlined) => self.optimized_program(request, &inlined, &mut output.notes),
                    None => {
                        output.notes.push(format!(
                            "paired without ONNX Runtime's graph optimizations (opt={}): the model's external weights are over {} MiB, which an optimized copy would write again; --separate-runs runs it optimized",
                            self.options.opt_level.name(),
                            OPTIMIZED_EXTERNAL_LIMIT >> 20
                        ));
                        Ok(proto)
                    }
                }
            } else {
                self.optimized_program(request, &proto, &mut output.notes)
            }
        });
        // Lines about optimizing are this backend's, as they would be for a run, except the
        // warning that saving an optimized model (layerwise's doing, used on this machine only) gives.
        let logged: Vec<_> = crate::backend_log::take(&self.log_id)
            .into_iter()
            .filter(|l| !l.message.starts_with("Serializing optimized model"))
            .collect();
        Some(result.map(|proto| {
            output.notes.extend(logged.iter().map(|l| l.note()));
            OnnxProgram {
                spec: self.label.clone(),
                proto,
                options: self.options.clone(),
                notes: output.notes,
                unavailable: output.unavailable,
                log_id: self.log_id.clone(),
            }
        }))
    }

    fn run_on_device(&mut self, request: &RunRequest) -> Option<Result<crate::DeviceRun, RuntimeError>> {
        let ExecutionProvider::Cuda { device, .. } = self.options.ep else { return None };
        let result = self.run_session_on_device(request, device.unwrap_or(0));
        let logged = crate::backend_log::take(&self.log_id);
        Some(result.map(|mut run| {
            run.notes.extend(logged.iter().map(|l| l.note()));
            run
        }))
    }

    fn run(&mut self, request: &RunRequest) -> Result<RunOutput, RuntimeError> {
        let result = self.run_session(request);
        // What ONNX Runtime logged during this run: kept in the notes of a run that worked; on
        // failure the error carries ONNX Runtime's own message.
        let logged = crate::backend_log::take(&self.log_id);
        let mut output = result?;
        output.notes.extend(logged.iter().map(|l| l.note()));
        Ok(output)
    }
}

impl OrtBackend {
    /// The model this backend gives ONNX Runtime for `request` (the requested tensors exposed, the
    /// emulation's rounding added), and the names of the tensors asked for. What the rewrite did
    /// goes into `output`'s notes and unavailable tensors. With `keep_rounded_weights`, the weights
    /// rounded are kept for the next program (runs in pieces, which come many to a model).
    fn program(
        &mut self,
        request: &RunRequest,
        output: &mut RunOutput,
        keep_rounded_weights: bool,
    ) -> Result<(layerwise_model::onnx::ModelProto, Vec<String>), RuntimeError> {
        let (_, lib) = ortlib::environment()?;
        output.notes.push(format!("ONNX Runtime from {} (found by {})", lib.path.display(), lib.found_by));
        if let ExecutionProvider::Cuda { tf32, conv_search, .. } = self.options.ep {
            output.notes.push(format!(
                "CUDA: TF32 {}, cuDNN convolution algorithm search {}",
                if tf32 { "on" } else { "off" },
                conv_search.name()
            ));
        }
        let (exposed, names) = expose(&request.model.proto, request.index, request.selection)?;
        let proto = if let Some(rounding) = self.emulate {
            // Which tensors are float32 is ONNX Runtime's own answer about the exposed model.
            if !self.float_cache.contains_key(&request.model.sha256) {
                let float = float32_tensors(request.model, request.index)?;
                self.float_cache.insert(request.model.sha256.clone(), float);
            }
            let float = &self.float_cache[&request.model.sha256];
            let mut keep = HashSet::new();
            for name in &self.keep_fp32 {
                let node =
                    request.index.node(name).ok_or_else(|| self.err(format!("no node '{name}' to keep in FP32")))?;
                keep.insert(node.proto_index);
            }
            let (of, mut rounded) = std::mem::take(&mut self.rounded_weights);
            if of != request.model.sha256 {
                rounded = RoundedWeights::default();
            }
            let emulated = if self.trt_style {
                let (proto, keep, summary) = engine_style(request, &exposed, float, &keep)?;
                output.notes.push(summary.note);
                for t in summary.folded_away {
                    output.unavailable.push((
                        t,
                        "folded with the BatchNorm after it, as a TensorRT engine computes it (engine=trt)".into(),
                    ));
                }
                // A parameter computed by a Constant node is a tensor the engine never holds.
                for (t, why) in
                    summary.folded_parameters.into_iter().filter(|(t, _)| request.index.producer(t).is_some())
                {
                    output.unavailable.push((t, why));
                }
                emulate_reusing(request.model, &proto, &summary.rounded, &keep, rounding, &mut rounded)?
            } else {
                emulate_reusing(request.model, &exposed, float, &keep, rounding, &mut rounded)?
            };
            if keep_rounded_weights {
                self.rounded_weights = (request.model.sha256.clone(), rounded);
            }
            output.notes.push(match rounding {
                Rounding::Tf32 => format!(
                    "TF32 emulation: {} Conv/MatMul/Gemm inputs rounded to TF32 by a Veltkamp split, {} nodes kept in float32",
                    emulated.rounded_tensors,
                    keep.len()
                ),
                _ => format!(
                    "{} emulation: {} tensors rounded through Cast pairs, {} weights rounded, {} nodes kept in FP32",
                    rounding.name().to_uppercase(),
                    emulated.rounded_tensors,
                    emulated.rounded_weights,
                    keep.len()
                ),
            });
            emulated.proto
        } else {
            exposed
        };
        // What the candidate does not compute (folded away, never stored) is neither returned nor
        // paired: only the reason is.
        let mut proto = proto;
        let gone: HashSet<&str> = output.unavailable.iter().map(|(t, _)| t.as_str()).collect();
        let names: Vec<String> = names.into_iter().filter(|n| !gone.contains(n.as_str())).collect();
        if let Some(g) = proto.graph.as_mut() {
            let outputs: HashSet<&str> = request.index.outputs.iter().map(String::as_str).collect();
            g.output.retain(|o| outputs.contains(o.name()) || !gone.contains(o.name()));
        }
        Ok((proto, names))
    }

    /// See [`Backend::run_pieces`]: the program is built once for every piece's tensors, then each
    /// piece is cut out of it, walking back from its tensors to what is known.
    fn run_pieces_of_program<'k>(
        &mut self,
        request: &RunRequest,
        known: &dyn Fn(&str) -> Option<&'k Tensor>,
        pieces: &[Vec<String>],
    ) -> Result<HashMap<String, Tensor>, RuntimeError> {
        use layerwise_model::builder::{tensor_type, Dim};
        use layerwise_model::onnx::{GraphProto, ModelProto, ValueInfoProto};
        let timing = std::env::var_os("LAYERWISE_TIMING").is_some();
        let t0 = std::time::Instant::now();
        let (mut t_cut, mut t_build, mut t_run, mut builds, mut piece_nodes) = (0.0, 0.0, 0.0, 0usize, 0usize);
        let (mut t_bytes, mut t_evict) = (0.0, 0.0);
        let selection = layerwise_model::Selection::Names(pieces.concat());
        let whole =
            RunRequest { model: request.model, index: request.index, inputs: request.inputs, selection: &selection };
        let (mut program, _) = self.program(&whole, &mut RunOutput::default(), true)?;
        let t_program = t0.elapsed().as_secs_f64();
        let graph = program.graph.take().expect("a program has a graph");
        let shell = ModelProto { graph: None, ..program };
        let producer: HashMap<&str, usize> = graph
            .node
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.output.iter().filter(|o| !o.is_empty()).map(move |o| (o.as_str(), i)))
            .collect();
        // Looked up per piece by name: a walk over the whole program for each piece would make
        // a run of all nodes in pieces grow with the square of the graph.
        let weight_at: HashMap<&str, usize> =
            graph.initializer.iter().enumerate().map(|(i, w)| (w.name(), i)).collect();
        let info_at: HashMap<&str, usize> = graph.value_info.iter().enumerate().map(|(i, v)| (v.name(), i)).collect();
        let mut needed = vec![false; graph.node.len()];
        let mut computed: HashMap<String, Tensor> = HashMap::new();
        for piece in pieces {
            let tc = std::time::Instant::now();
            let value_of = |t: &str| known(t).or_else(|| computed.get(t));
            let mut members: Vec<usize> = Vec::new();
            let mut stack = Vec::new();
            for t in piece {
                stack.push(*producer.get(t.as_str()).ok_or_else(|| self.err(format!("no node computes '{t}'")))?);
            }
            let mut border: Vec<&str> = Vec::new();
            while let Some(i) = stack.pop() {
                if std::mem::replace(&mut needed[i], true) {
                    continue;
                }
                members.push(i);
                for t in graph.node[i].input.iter().filter(|t| !t.is_empty()) {
                    if value_of(t).is_some() {
                        if !border.contains(&t.as_str()) {
                            border.push(t);
                        }
                    } else if let Some(&p) = producer.get(t.as_str()) {
                        stack.push(p);
                    }
                }
            }
            members.sort_unstable();
            for &i in &members {
                needed[i] = false;
            }
            let nodes: Vec<_> = members.iter().map(|&i| graph.node[i].clone()).collect();
            let read: HashSet<&str> = nodes.iter().flat_map(|n| n.input.iter().map(String::as_str)).collect();
            let made: HashSet<&str> = nodes.iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
            let mut inputs: Vec<ValueInfoProto> = graph
                .input
                .iter()
                .filter(|v| read.contains(v.name()) && !border.contains(&v.name()))
                .cloned()
                .collect();
            let mut feeds: Vec<(String, Tensor)> =
                request.inputs.iter().filter(|(n, _)| inputs.iter().any(|v| v.name() == n)).cloned().collect();
            for t in &border {
                let v = value_of(t).expect("on the border because known");
                let elem = layerwise_model::DataType::try_from(v.dtype().onnx())
                    .map_err(|_| self.err(format!("'{t}' has no ONNX element type")))?;
                let dims: Vec<Dim> = v.shape.iter().map(|&d| Dim::Fixed(d as i64)).collect();
                inputs.push(ValueInfoProto {
                    name: Some(t.to_string()),
                    r#type: Some(tensor_type(elem, Some(&dims))),
                    ..Default::default()
                });
                feeds.push((t.to_string(), v.clone()));
            }
            let mut part = GraphProto {
                name: graph.name.clone(),
                initializer: in_graph_order(&read, &weight_at)
                    .filter(|&i| !border.contains(&graph.initializer[i].name()))
                    .map(|i| graph.initializer[i].clone())
                    .collect(),
                input: inputs,
                output: piece.iter().map(|t| ValueInfoProto { name: Some(t.clone()), ..Default::default() }).collect(),
                value_info: in_graph_order(&made, &info_at).map(|i| graph.value_info[i].clone()).collect(),
                node: nodes,
                ..Default::default()
            };
            layerwise_model::pair::pin_input_shapes(
                &mut part,
                &input_shapes(&RunRequest {
                    model: request.model,
                    index: request.index,
                    inputs: &feeds,
                    selection: &selection,
                }),
            );
            let key = piece_key(&request.model.sha256, &part);
            piece_nodes += part.node.len();
            t_cut += tc.elapsed().as_secs_f64();
            let tb = std::time::Instant::now();
            let (mut session, size, external) = match self.piece_sessions.iter().position(|(k, _, _, _)| *k == key) {
                Some(i) => {
                    let (_, session, size, _) = self.piece_sessions.remove(i);
                    (session, size, false)
                }
                None => {
                    let cut = ModelProto { graph: Some(part), ..shell.clone() };
                    let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-")
                        .map_err(|e| RuntimeError::Io { path: std::env::temp_dir(), cause: e })?;
                    let tbytes = std::time::Instant::now();
                    let (bytes, folder) = request.model.runtime_bytes(&cut, scratch.path())?;
                    drop(cut);
                    t_bytes += tbytes.elapsed().as_secs_f64();
                    builds += 1;
                    // Kept side by side (PIECE_SESSIONS), as the typed evaluation's sessions are.
                    let extras = SessionExtras { without_spinning: true, ..Default::default() };
                    let source = ModelSource::Memory { bytes: &bytes, external_folder: folder.as_deref() };
                    (
                        build_session(
                            &self.label,
                            &self.options,
                            &self.log_id,
                            source,
                            self.options.opt_level,
                            extras,
                        )?,
                        bytes.len(),
                        folder.is_some(),
                    )
                }
            };
            t_build += tb.elapsed().as_secs_f64();
            let tr = std::time::Instant::now();
            let session_inputs = session_feeds(&session, &feeds, &self.label)?;
            drop(feeds);
            let (mut results, _) =
                run_without_optionals(&mut session, session_inputs).map_err(|e| e.into_runtime(&self.label))?;
            // What the piece computed: a kept session holds about as much in its arena.
            let mut activations = 0usize;
            for t in piece {
                let value = results
                    .remove(t.as_str())
                    .ok_or_else(|| self.err(format!("ONNX Runtime returned no value for '{t}'")))?;
                let tensor = from_ort_value(&value).map_err(|why| self.err(format!("'{t}': {why}")))?;
                activations += tensor.size_bytes();
                computed.insert(t.clone(), tensor);
            }
            drop(results);
            t_run += tr.elapsed().as_secs_f64();
            // Weights mapped from their file cost no copy; inline ones are held by the session.
            let te = std::time::Instant::now();
            if !external && self.keep_piece_sessions {
                self.piece_sessions.push((key, session, size, activations));
                while self.piece_sessions.len() > PIECE_SESSIONS
                    || self.piece_sessions.iter().map(|(_, _, n, a)| n + a).sum::<usize>() > PIECE_SESSION_BYTES
                {
                    self.piece_sessions.remove(0);
                }
            }
            t_evict += te.elapsed().as_secs_f64();
        }
        if timing {
            eprintln!("[timing] run_pieces: {} pieces, {} program nodes, {} piece nodes, {builds} builds; program {t_program:.2}s cut {t_cut:.2}s build {t_build:.2}s (serializing {t_bytes:.2}s) run {t_run:.2}s sessions dropped {t_evict:.2}s total {:.2}s", pieces.len(), graph.node.len(), piece_nodes, t0.elapsed().as_secs_f64());
        }
        Ok(computed)
    }

    /// The session for `request`'s program (and the names asked for): the GPU session kept from
    /// the last run where it ran the same program, else a new one. On a GPU a session costs seconds
    /// (cuDNN's algorithm search among them): the same program asked again (the next sample of the
    /// same shapes, the same tensors) runs in the session it ran in. Give it back with
    /// [`OrtBackend::keep_session`].
    fn session_of(
        &mut self,
        request: &RunRequest,
        output: &mut RunOutput,
    ) -> Result<(Session, Vec<String>, Option<(String, ProgramFacts)>), RuntimeError> {
        let shapes = input_shapes(request);
        let key = self.options.ep.needs_gpu().then(|| {
            format!(
                "{}|{:?}|{:?}|{}|{:?}",
                request.model.sha256, request.selection, self.keep_fp32, self.trt_style, shapes
            )
        });
        // The program too is the one built for that session: rewriting the model again per sample
        // cost milliseconds a run beside a GPU run of a few.
        if let (Some((cached, _, _)), Some(k)) = (&self.gpu_session, &key) {
            if cached == k {
                let (key, session, facts) = self.gpu_session.take().expect("just seen");
                output.notes.extend(facts.notes.iter().cloned());
                output.unavailable.extend(facts.unavailable.iter().cloned());
                let names = facts.names.clone();
                return Ok((session, names, Some((key, facts))));
            }
        }
        self.gpu_session = None;
        let (mut proto, names) = self.program(request, output, false)?;
        // A session for the inputs' own shapes builds faster (layerwise_model::pair::pin_input_shapes).
        // A run of the model's outputs alone is the model as its user runs it: its inputs keep the
        // dimensions the file declares, since ONNX Runtime optimizes a graph of known shapes
        // otherwise (a transformer's FP16 output erred 2.40e-3 pinned, 2.31e-3 as declared).
        let outputs_only = matches!(request.selection, layerwise_model::Selection::Names(names) if names.is_empty());
        if let Some(g) = proto.graph.as_mut().filter(|_| !outputs_only) {
            layerwise_model::pair::pin_input_shapes(g, &shapes);
        }
        let session = self.session_for(request.model, &proto, self.options.opt_level)?;
        let facts =
            ProgramFacts { names: names.clone(), notes: output.notes.clone(), unavailable: output.unavailable.clone() };
        Ok((session, names, key.map(|k| (k, facts))))
    }

    fn keep_session(&mut self, kept: Option<(String, ProgramFacts)>, session: Session) {
        if let Some((key, facts)) = kept {
            self.gpu_session = Some((key, session, facts));
        }
    }

    /// See [`Backend::run_on_device`]: the session's outputs bound to the device's memory, so
    /// that ONNX Runtime leaves each where it computed it.
    fn run_session_on_device(&mut self, request: &RunRequest, device: u32) -> Result<crate::DeviceRun, RuntimeError> {
        use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
        let mut output = RunOutput::default();
        let (mut session, names, key) = self.session_of(request, &mut output)?;
        let fail =
            |what: &str, e: ort::Error| RuntimeError::Ort { backend: self.label.clone(), why: format!("{what}: {e}") };
        let feeds = session_feeds(&session, request.inputs, &self.label)?;
        let memory = MemoryInfo::new(AllocationDevice::CUDA, device as i32, AllocatorType::Device, MemoryType::Default)
            .map_err(|e| fail("CUDA memory", e))?;
        let mut binding = session.create_binding().map_err(|e| fail("binding", e))?;
        for (name, value) in &feeds {
            binding.bind_input(name.as_str(), value).map_err(|e| fail("binding an input", e))?;
        }
        let mut bound = Vec::new();
        for o in session.outputs() {
            if matches!(o.dtype(), ValueType::Optional(_)) {
                output.unavailable.push((
                    o.name().to_string(),
                    "an optional value, not a tensor (it may hold none): not compared".into(),
                ));
            } else {
                binding.bind_output_to_device(o.name(), &memory).map_err(|e| fail("binding an output", e))?;
                bound.push(o.name().to_string());
            }
        }
        let mut tensors = HashMap::new();
        {
            let mut results = guarded(ort::session::RunOptions::new().map_err(|e| self.err(e))?, |o| {
                session.run_binding_with_options(&binding, o)
            })
            .map_err(|e| e.into_runtime(&self.label))?;
            binding.synchronize_outputs().map_err(|e| fail("synchronizing the outputs", e))?;
            for name in names {
                let Some(value) = results.remove(name.as_str()) else {
                    if !output.unavailable.iter().any(|(n, _)| *n == name) {
                        output.unavailable.push((name, "ONNX Runtime returned no value".into()));
                    }
                    continue;
                };
                let ValueType::Tensor { ty, shape, .. } = value.dtype() else {
                    output.unavailable.push((name, "not a tensor: not compared".into()));
                    continue;
                };
                let Some(dtype) = element_dtype(*ty) else {
                    output.unavailable.push((name, format!("element type {ty:?} is not compared")));
                    continue;
                };
                let shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
                let ptr = value
                    .view()
                    .downcast::<ort::value::DynTensorValueType>()
                    .map_err(|e| fail("a tensor's data", e))?
                    .data_ptr();
                tensors.insert(name, crate::DeviceTensor { shape, dtype, ptr, _owner: value });
            }
        }
        drop(binding);
        self.keep_session(key, session);
        Ok(crate::DeviceRun { device, tensors, unavailable: output.unavailable, notes: output.notes })
    }

    fn run_session(&mut self, request: &RunRequest) -> Result<RunOutput, RuntimeError> {
        let mut output = RunOutput::default();
        let (mut session, names, key) = self.session_of(request, &mut output)?;
        let feeds = session_feeds(&session, request.inputs, &self.label)?;
        let (mut results, optional) =
            run_without_optionals(&mut session, feeds).map_err(|e| e.into_runtime(&self.label))?;
        for name in optional {
            output.unavailable.push((name, "an optional value, not a tensor (it may hold none): not compared".into()));
        }
        // Take each value out and drop it once copied, so ONNX Runtime's buffer and our copy of
        // every tensor are not all alive at once.
        for name in names {
            match results.remove(&name) {
                None if output.unavailable.iter().any(|(n, _)| *n == name) => {}
                None => output.unavailable.push((name, "ONNX Runtime returned no value".into())),
                Some(value) => match from_ort_value(&value) {
                    Ok(t) => {
                        output.tensors.insert(name, t);
                    }
                    Err(why) => output.unavailable.push((name, why)),
                },
            }
        }
        drop(results);
        self.keep_session(key, session);
        Ok(output)
    }
}

/// The positions (in `at`, by name) of the names of `names` found there, in increasing order.
fn in_graph_order(names: &HashSet<&str>, at: &HashMap<&str, usize>) -> impl Iterator<Item = usize> {
    let mut found: Vec<usize> = names.iter().filter_map(|n| at.get(n).copied()).collect();
    found.sort_unstable();
    found.into_iter()
}

/// The names and shapes of a request's inputs.
fn input_shapes(request: &RunRequest) -> Vec<(String, Vec<usize>)> {
    request.inputs.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect()
}

/// Runs `session` on `feeds` and returns its outputs by name, leaving out the outputs of optional
/// type (named in the second list): ONNX Runtime returns an optional that holds no value as a null
/// value, which the `ort` crate wraps as if it held one and crashes on (ONNX's `test_if_opt`).
pub(crate) fn run_without_optionals(
    session: &mut Session,
    feeds: Vec<(String, DynValue)>,
) -> Result<(HashMap<String, DynValue>, Vec<String>), RunError> {
    let optional: Vec<String> = session
        .outputs()
        .iter()
        .filter(|o| matches!(o.dtype(), ValueType::Optional(_)))
        .map(|o| o.name().to_string())
        .collect();
    let names: Vec<String> =
        session.outputs().iter().map(|o| o.name().to_string()).filter(|n| !optional.contains(n)).collect();
    // The values leave the run's outputs inside the guarded run: the outputs borrow its options.
    let taken = |mut results: ort::session::SessionOutputs<'_>| -> HashMap<String, DynValue> {
        names.iter().filter_map(|n| results.remove(n.as_str()).map(|v| (n.clone(), v))).collect()
    };
    let values = if names.is_empty() {
        // Nothing left to ask for: ONNX Runtime refuses a run that requests no output.
        HashMap::new()
    } else if optional.is_empty() {
        guarded(ort::session::RunOptions::new()?, |o| session.run_with_options(feeds, o).map(taken))?
    } else {
        let selector = optional.iter().fold(ort::session::OutputSelector::default(), |s, n| s.without(n.clone()));
        let options = ort::session::RunOptions::new()?.with_outputs(selector);
        guarded(options, |o| session.run_with_options(feeds, o).map(taken))?
    };
    Ok((values, optional))
}

/// The values to feed `session`, from `inputs` by name. A converted model may declare FP16 inputs:
/// they get the same values, converted. `spec` names the backend in errors.
pub(crate) fn session_feeds(
    session: &Session,
    inputs: &[(String, Tensor)],
    spec: &str,
) -> Result<Vec<(String, DynValue)>, RuntimeError> {
    session.inputs().iter().map(|input| Ok((input.name().to_string(), feed(input, inputs, spec)?))).collect()
}

/// The value of `inputs` that the session input `input` takes, converted to the type it declares.
pub(crate) fn feed(
    input: &ort::value::Outlet,
    inputs: &[(String, Tensor)],
    spec: &str,
) -> Result<DynValue, RuntimeError> {
    let name = input.name();
    let tensor = inputs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .ok_or_else(|| RuntimeError::Input(format!("no value for model input '{name}'")))?;
    let wants_f16 = matches!(input.dtype(), ValueType::Tensor { ty: TensorElementType::Float16, .. });
    let converted;
    let tensor = match (&tensor.data, wants_f16) {
        (TensorData::F32(v), true) => {
            converted =
                Tensor::new(tensor.shape.clone(), TensorData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect()));
            &converted
        }
        _ => tensor,
    };
    to_ort_value(tensor)
        .map_err(|e| RuntimeError::Ort { backend: spec.to_string(), why: format!("input '{name}': {e}") })
}

/// What the TensorRT-style rewrite did.
struct EngineStyle {
    /// Float tensors that leave a fused layer: the only ones rounded.
    rounded: HashSet<String>,
    /// Conv outputs that no longer exist once their BatchNorm is folded in.
    folded_away: Vec<String>,
    /// Weights the engine never stores (folded BatchNorm parameters), with the reason.
    folded_parameters: Vec<(String, String)>,
    note: String,
}

/// The exposed model as a weakly typed TensorRT engine stores it: BatchNorms folded into their
/// Convs in float32, and only the float tensors at fused-layer boundaries left to round. Returns
/// the folded model, the keep list's positions in it, and what was done.
fn engine_style(
    request: &RunRequest,
    exposed: &layerwise_model::onnx::ModelProto,
    float: &HashSet<String>,
    keep: &HashSet<usize>,
) -> Result<(layerwise_model::onnx::ModelProto, HashSet<usize>, EngineStyle), RuntimeError> {
    use layerwise_model::engine_style::{
        fold_batch_norms, folded_parameters, fused_layers, layer_boundaries, resolve_folded,
    };
    let outputs: HashSet<String> = request.index.outputs.iter().cloned().collect();
    let exposed_index = layerwise_model::GraphIndex::build(exposed.graph.as_ref().expect("graph"))?;
    let (proto, folded) = fold_batch_norms(request.model, exposed, &exposed_index, &outputs)?;
    let folded_index = layerwise_model::GraphIndex::build(proto.graph.as_ref().expect("graph"))?;
    let layers = fused_layers(&folded_index, &outputs);
    let boundaries = layer_boundaries(&folded_index, &outputs, &layers);
    let folded_parameters = folded_parameters(request.index, &folded);
    let rounded: HashSet<String> = float
        .iter()
        .filter(|t| boundaries.contains(*t) && !folded_parameters.iter().any(|(p, _)| p == *t))
        .cloned()
        .collect();
    // Positions shift down past each removed BatchNorm; a kept BatchNorm means its Conv.
    let removed: Vec<usize> =
        folded.iter().filter_map(|f| request.index.node(&f.batch_norm)).map(|n| n.proto_index).collect();
    let mut shifted = HashSet::new();
    for &i in keep {
        let Some(info) = request.index.nodes.iter().find(|n| n.proto_index == i) else { continue };
        let Some(target) = request.index.node(resolve_folded(&info.name, &folded)) else { continue };
        shifted.insert(target.proto_index - removed.iter().filter(|&&r| r < target.proto_index).count());
    }
    let folded_away: Vec<String> =
        folded.iter().filter_map(|f| request.index.node(&f.conv)).map(|n| n.outputs[0].clone()).collect();
    let layer_count = folded_index
        .nodes
        .iter()
        .filter(|n| !n.outputs.iter().all(|o| folded_index.is_constant_like(o)))
        .map(|n| &layers[&n.name])
        .collect::<HashSet<_>>()
        .len();
    let note = format!(
        "TensorRT-style storage (engine=trt, rule set): {} BatchNorms folded into their Convs in float32, {} fused layers (constants aside), {} tensors rounded at layer boundaries (of {} float tensors)",
        folded.len(),
        layer_count,
        rounded.len(),
        float.len()
    );
    Ok((proto, shifted, EngineStyle { rounded, folded_away, folded_parameters, note }))
}

/// The float32 tensors a main-graph node computes, as ONNX Runtime types them: every tensor is
/// exposed and the session's output metadata read (no run).
///
/// Tensors inside If branches and Loop bodies are included under the names inlining gives them
/// (`Node/then/tensor`, `Node/else/tensor`, `Node/body/tensor`), typed through copies of the
/// bodies beside their nodes (see `layerwise_model::inline::with_body_copies`).
pub fn float32_tensors(
    model: &layerwise_model::Model,
    index: &layerwise_model::GraphIndex,
) -> Result<HashSet<String>, RuntimeError> {
    let float = |types: &HashMap<String, InferredType>| {
        types.iter().filter(|(_, t)| t.dtype == Some(DType::F32)).map(|(n, _)| n.clone()).collect()
    };
    if !index.nodes.iter().any(|n| n.op_type == "If" || n.op_type == "Loop") {
        return Ok(float(&tensor_types_for_any_shapes(model, index)?));
    }
    let (proto, _) = layerwise_model::inline::with_body_copies(&model.proto)?;
    let copies = model.derived(proto, "typing.onnx");
    let copies_index = layerwise_model::GraphIndex::build(copies.graph())?;
    Ok(float(&tensor_types(&copies, &copies_index, &[])?))
}

/// The inferred type of every tensor a main-graph node computes: every tensor is exposed and the
/// session's output metadata read (no run). `inputs` (name, shape) fix the shapes of dynamic
/// graph inputs first, so that shapes downstream come out concrete.
///
/// The answer is kept per model and input shapes (the last few asked): the session that gives it
/// exposes every tensor, and its build grows faster than the graph, so a bisect or a fix, which
/// ask it for one model from several places, build it once.
pub fn tensor_types(
    model: &layerwise_model::Model,
    index: &layerwise_model::GraphIndex,
    inputs: &[(String, Vec<usize>)],
) -> Result<HashMap<String, InferredType>, RuntimeError> {
    let key = format!("{}|{inputs:?}", model.sha256);
    if let Some((_, types)) = typings().lock().expect("not poisoned").iter().find(|(k, _)| *k == key) {
        return Ok(types.as_ref().clone());
    }
    let types = std::sync::Arc::new(infer_tensor_types(model, index, inputs)?);
    let mut cache = typings().lock().expect("not poisoned");
    cache.push((key, types.clone()));
    if cache.len() > TYPINGS_KEPT {
        cache.remove(0);
    }
    Ok(types.as_ref().clone())
}

/// [`tensor_types`] where only element types and the ranks of dimensions matter: a typing kept
/// for any input shapes answers (a bisect or a fix typed the model for its inputs' shapes
/// already, to estimate memory), else the model is typed for no shapes fixed.
pub fn tensor_types_for_any_shapes(
    model: &layerwise_model::Model,
    index: &layerwise_model::GraphIndex,
) -> Result<HashMap<String, InferredType>, RuntimeError> {
    match kept_typing(model) {
        Some(types) => Ok(types.as_ref().clone()),
        None => tensor_types(model, index, &[]),
    }
}

/// A typing of `model` that [`tensor_types`] kept, for whichever input shapes.
fn kept_typing(model: &layerwise_model::Model) -> Option<std::sync::Arc<HashMap<String, InferredType>>> {
    let prefix = format!("{}|", model.sha256);
    typings()
        .lock()
        .expect("not poisoned")
        .iter()
        .rev()
        .find(|(k, _)| k.starts_with(&prefix))
        .map(|(_, types)| types.clone())
}

/// Typings kept by [`tensor_types`] (models and shapes asked for in one process are few).
const TYPINGS_KEPT: usize = 4;

type Typings = Vec<(String, std::sync::Arc<HashMap<String, InferredType>>)>;

fn typings() -> &'static std::sync::Mutex<Typings> {
    static TYPINGS: std::sync::OnceLock<std::sync::Mutex<Typings>> = std::sync::OnceLock::new();
    TYPINGS.get_or_init(Default::default)
}

/// Whether ONNX Runtime accepts the types of `model` (every node has a kernel signature for its
/// inputs' types): a session built with optimizations disabled, its large weights as typed inputs,
/// and nothing run. Cheaper than [`tensor_types`], whose session exposes every tensor.
pub fn check_types(model: &layerwise_model::Model) -> Result<(), RuntimeError> {
    let mut proto = model.proto.clone();
    if let Some(graph) = proto.graph.as_mut() {
        weights_as_inputs(graph);
    }
    let options = OrtOptions { opt_level: OptLevel::Disable, threads: None, ep: ExecutionProvider::Cpu, typed: true };
    let backend = OrtBackend::new(&BackendSpec::Ort(options.clone()), options, None);
    let session = backend.session_for(model, &proto, OptLevel::Disable);
    crate::backend_log::take(&backend.log_id);
    session.map(drop)
}

fn infer_tensor_types(
    model: &layerwise_model::Model,
    index: &layerwise_model::GraphIndex,
    inputs: &[(String, Vec<usize>)],
) -> Result<HashMap<String, InferredType>, RuntimeError> {
    use layerwise_model::onnx::{tensor_shape_proto::dimension::Value, type_proto};
    let (mut exposed, _) = expose(&model.proto, index, &layerwise_model::Selection::All)?;
    if let Some(graph) = exposed.graph.as_mut() {
        weights_as_inputs(graph);
        for v in graph.input.iter_mut() {
            let Some((_, shape)) = inputs.iter().find(|(n, _)| n == v.name()) else { continue };
            if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) {
                if let Some(s) = t.shape.as_mut().filter(|s| s.dim.len() == shape.len()) {
                    for (d, &n) in s.dim.iter_mut().zip(shape) {
                        d.value = Some(Value::DimValue(n as i64));
                    }
                }
            }
        }
    }
    let started = std::time::Instant::now();
    let pieces = types_in_pieces(model, &exposed);
    if std::env::var_os("LAYERWISE_TIMING").is_some() {
        let nodes = exposed.graph.as_ref().map_or(0, |g| g.node.len());
        eprintln!(
            "[timing] typing {nodes} nodes in pieces: {} ({:.2}s)",
            pieces.as_ref().map_or_else(|why| why.clone(), |_| "done".into()),
            started.elapsed().as_secs_f64()
        );
    }
    // The pieces' sessions are gone: their memory goes back to the system before the runs
    // (decoder of 11,201 nodes: the typing took about 100 MB that the heap otherwise kept).
    release_freed_memory();
    if let Ok(types) = pieces {
        return Ok(types);
    }
    exposed_types(model, &exposed)
}

/// The types of the outputs of `exposed` (a rewrite of `model`) as ONNX Runtime infers them.
fn exposed_types(
    model: &layerwise_model::Model,
    exposed: &layerwise_model::onnx::ModelProto,
) -> Result<HashMap<String, InferredType>, RuntimeError> {
    // Nothing runs: one thread, no pool to start and stop for each of a typing's pieces.
    let options =
        OrtOptions { opt_level: OptLevel::Disable, threads: Some(1), ep: ExecutionProvider::Cpu, typed: true };
    let backend = OrtBackend::new(&BackendSpec::Ort(options.clone()), options, None);
    let session = backend.session_for(model, exposed, OptLevel::Disable);
    // Typing an every-tensor-exposed copy is layerwise's business; what it logs is not the user's.
    crate::backend_log::take(&backend.log_id);
    Ok(session?
        .outputs()
        .iter()
        .map(|o| {
            let ty = match o.dtype() {
                ValueType::Tensor { ty, shape, .. } => InferredType {
                    dtype: element_dtype(*ty),
                    dims: shape.iter().map(|&d| usize::try_from(d).ok()).collect(),
                },
                _ => InferredType { dtype: None, dims: Vec::new() },
            };
            (o.name().to_string(), ty)
        })
        .collect())
}

/// Nodes per piece of a typing ([`types_in_pieces`]). A session that exposes every tensor builds
/// in time that grows with the square of the graph (a Relu chain: 40 us a node at 10,000 nodes,
/// 185 us at 50,000), one of 1,000 nodes in about 25 us a node.
const TYPING_PIECE_NODES: usize = 1000;

/// The typing of `exposed` (every tensor a graph output, weights as typed inputs) in pieces of
/// [`TYPING_PIECE_NODES`] consecutive nodes, each fed at its border with the types the pieces
/// before it inferred (unknown dimensions as dimensions of their own). What a node's inference
/// reads is its inputs' types and shapes, which the border carries, and the values of shape
/// tensors (ONNX Runtime propagates Shape, Gather, Concat ... values), which it does not: a
/// piece whose border holds a computed tensor of any but a floating type is not cut, and the
/// whole model is typed at once (the `Err` says why), as it is where a piece fails or an output
/// is not computed by a node.
fn types_in_pieces(
    model: &layerwise_model::Model,
    exposed: &layerwise_model::onnx::ModelProto,
) -> Result<HashMap<String, InferredType>, String> {
    use layerwise_model::builder::{tensor_type, Dim};
    use layerwise_model::onnx::{GraphProto, ModelProto, ValueInfoProto};
    let graph = exposed.graph.as_ref().ok_or("no graph")?;
    if graph.node.len() <= 2 * TYPING_PIECE_NODES {
        return Err("small enough for one session".into());
    }
    let declared: HashMap<&str, &ValueInfoProto> = graph.input.iter().map(|v| (v.name(), v)).collect();
    let weights: HashMap<&str, &layerwise_model::onnx::TensorProto> =
        graph.initializer.iter().map(|w| (w.name(), w)).collect();
    let value_info: HashMap<&str, &ValueInfoProto> = graph.value_info.iter().map(|v| (v.name(), v)).collect();
    let made_anywhere: HashSet<&str> = graph.node.iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
    if let Some(o) = graph.output.iter().find(|o| !made_anywhere.contains(o.name())) {
        return Err(format!("output '{}' is computed by no node", o.name()));
    }
    let shell = ModelProto { graph: None, ..exposed.clone() };
    let mut types: HashMap<String, InferredType> = HashMap::new();
    for nodes in graph.node.chunks(TYPING_PIECE_NODES) {
        let made: Vec<&str> =
            nodes.iter().flat_map(|n| n.output.iter().map(String::as_str)).filter(|t| !t.is_empty()).collect();
        let made_here: HashSet<&str> = made.iter().copied().collect();
        let mut read: HashSet<&str> = HashSet::new();
        let (mut inputs, mut initializer) = (Vec::new(), Vec::new());
        for t in nodes.iter().flat_map(|n| n.input.iter()).map(String::as_str).filter(|t| !t.is_empty()) {
            if made_here.contains(t) || !read.insert(t) {
                continue;
            }
            if let Some(w) = weights.get(t) {
                initializer.push((*w).clone());
                // A graph input of the same name is what the whole model declares for it.
                if let Some(v) = declared.get(t) {
                    inputs.push((*v).clone());
                }
            } else if let Some(v) = declared.get(t) {
                inputs.push((*v).clone());
            } else {
                // Computed before: a floating tensor whose type an earlier piece inferred.
                let ty = types.get(t).ok_or_else(|| format!("'{t}' is read before it is computed"))?;
                let elem = match ty.dtype {
                    Some(d @ (DType::F32 | DType::F16 | DType::BF16 | DType::F64)) => {
                        layerwise_model::DataType::try_from(d.onnx()).map_err(|_| "no ONNX type")?
                    }
                    _ => return Err(format!("'{t}', not a floating tensor, crosses a piece's border")),
                };
                let dims: Vec<Dim> = ty
                    .dims
                    .iter()
                    .enumerate()
                    .map(|(i, d)| d.map_or_else(|| Dim::Symbolic(format!("{t}__lw_d{i}")), |d| Dim::Fixed(d as i64)))
                    .collect();
                inputs.push(ValueInfoProto {
                    name: Some(t.to_string()),
                    r#type: Some(tensor_type(elem, Some(&dims))),
                    ..Default::default()
                });
            }
        }
        let part = GraphProto {
            name: graph.name.clone(),
            node: nodes.to_vec(),
            input: inputs,
            initializer,
            output: made.iter().map(|t| ValueInfoProto { name: Some(t.to_string()), ..Default::default() }).collect(),
            value_info: made.iter().filter_map(|t| value_info.get(t).map(|v| (*v).clone())).collect(),
            ..Default::default()
        };
        let piece = ModelProto { graph: Some(part), ..shell.clone() };
        types.extend(exposed_types(model, &piece).map_err(|e| e.to_string())?);
    }
    // Only what the whole model's typing returns: its outputs.
    let wanted: HashSet<&str> = graph.output.iter().map(|o| o.name()).collect();
    types.retain(|t, _| wanted.contains(t.as_str()));
    Ok(types)
}

/// Turns the large weights (external, or 64 KiB and more inline) of the main graph into typed
/// graph inputs: type inference needs their types and shapes, not their values, and a session
/// built this way does not read gigabytes of weights just to answer. Small initializers stay,
/// since shape inference may need their values (Reshape's shape, Slice's starts, ...).
fn weights_as_inputs(graph: &mut layerwise_model::onnx::GraphProto) {
    use layerwise_model::builder::{tensor_type, Dim};
    let large = |t: &layerwise_model::onnx::TensorProto| {
        layerwise_model::is_external(t) || t.raw_data.as_ref().is_some_and(|r| r.len() >= 64 << 10)
    };
    let declared: HashSet<String> = graph.input.iter().map(|v| v.name().to_string()).collect();
    let mut kept = Vec::with_capacity(graph.initializer.len());
    for t in std::mem::take(&mut graph.initializer) {
        if !large(&t) {
            kept.push(t);
            continue;
        }
        if !declared.contains(t.name()) {
            let dims: Vec<Dim> = t.dims.iter().map(|&d| Dim::Fixed(d)).collect();
            let elem = layerwise_model::DataType::try_from(t.data_type()).unwrap_or(layerwise_model::DataType::Float);
            graph.input.push(layerwise_model::onnx::ValueInfoProto {
                name: t.name.clone(),
                r#type: Some(tensor_type(elem, Some(&dims))),
                ..Default::default()
            });
        }
    }
    graph.initializer = kept;
}

fn element_dtype(ty: TensorElementType) -> Option<DType> {
    use TensorElementType as E;
    Some(match ty {
        E::Float32 => DType::F32,
        E::Float16 => DType::F16,
        E::Bfloat16 => DType::BF16,
        E::Float64 => DType::F64,
        E::Int8 => DType::I8,
        E::Int16 => DType::I16,
        E::Int32 => DType::I32,
        E::Int64 => DType::I64,
        E::Uint8 => DType::U8,
        E::Uint16 => DType::U16,
        E::Uint32 => DType::U32,
        E::Uint64 => DType::U64,
        E::Bool => DType::Bool,
        _ => return None,
    })
}

fn to_ort_value(t: &Tensor) -> ort::Result<DynValue> {
    let shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
    macro_rules! make {
        ($v:expr) => {
            ort::value::Tensor::from_array((shape, $v.clone()))?.into_dyn()
        };
    }
    Ok(match &t.data {
        TensorData::F32(v) => make!(v),
        TensorData::F16(v) => make!(v),
        TensorData::BF16(v) => make!(v),
        TensorData::F64(v) => make!(v),
        TensorData::I8(v) => make!(v),
        TensorData::I16(v) => make!(v),
        TensorData::I32(v) => make!(v),
        TensorData::I64(v) => make!(v),
        TensorData::U8(v) => make!(v),
        TensorData::U16(v) => make!(v),
        TensorData::U32(v) => make!(v),
        TensorData::U64(v) => make!(v),
        TensorData::Bool(v) => make!(v),
    })
}

/// Copies an ONNX Runtime output to a host tensor; non-tensor values are reported, not failed.
pub(crate) fn from_ort_value(value: &DynValue) -> Result<Tensor, String> {
    let ty = match value.dtype() {
        ValueType::Tensor { ty, .. } => *ty,
        ValueType::Sequence(_) => return Err("a sequence, not a tensor".into()),
        ValueType::Map { .. } => return Err("a map, not a tensor".into()),
        ValueType::Optional(_) => return Err("an optional value, not a tensor".into()),
    };
    macro_rules! take {
        ($t:ty, $variant:ident) => {{
            let (shape, data) = value.try_extract_tensor::<$t>().map_err(|e| e.to_string())?;
            let shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
            Ok(Tensor::new(shape, TensorData::$variant(data.to_vec())))
        }};
    }
    match ty {
        TensorElementType::Float32 => take!(f32, F32),
        TensorElementType::Float16 => take!(half::f16, F16),
        TensorElementType::Bfloat16 => take!(half::bf16, BF16),
        TensorElementType::Float64 => take!(f64, F64),
        TensorElementType::Int8 => take!(i8, I8),
        TensorElementType::Int16 => take!(i16, I16),
        TensorElementType::Int32 => take!(i32, I32),
        TensorElementType::Int64 => take!(i64, I64),
        TensorElementType::Uint8 => take!(u8, U8),
        TensorElementType::Uint16 => take!(u16, U16),
        TensorElementType::Uint32 => take!(u32, U32),
        TensorElementType::Uint64 => take!(u64, U64),
        TensorElementType::Bool => take!(bool, Bool),
        other => Err(format!("element type {other:?} is not compared")),
    }
}

/// One ONNX Runtime CPU session of a rewritten model, run many times with different feeds: a
/// model whose behaviour a fed switch selects (a Q/DQ candidate's quantizers applied one at a time) pays
/// one session build, not one per setting.
pub struct ModelSession {
    session: Session,
    label: String,
}

impl ModelSession {
    /// A CPU session (every optimization, ONNX Runtime's own threads) of `proto`, a rewrite of
    /// `model` (whose external data it may read).
    pub fn cpu(
        model: &layerwise_model::Model,
        proto: &layerwise_model::onnx::ModelProto,
        label: &str,
    ) -> Result<ModelSession, RuntimeError> {
        Self::cpu_at(model, proto, label, OptLevel::All)
    }

    /// [`ModelSession::cpu`] at optimization `level`: `OptLevel::Disable` runs an
    /// [`crate::OnnxProgram`] as a paired session does, its optimizations already applied.
    pub fn cpu_at(
        model: &layerwise_model::Model,
        proto: &layerwise_model::onnx::ModelProto,
        label: &str,
        level: OptLevel,
    ) -> Result<ModelSession, RuntimeError> {
        let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-")
            .map_err(|e| RuntimeError::Io { path: std::env::temp_dir(), cause: e })?;
        let (bytes, folder) = model.runtime_bytes(proto, scratch.path())?;
        let session = build_session(
            label,
            &OrtOptions::cpu(),
            label,
            ModelSource::Memory { bytes: &bytes, external_folder: folder.as_deref() },
            level,
            SessionExtras::default(),
        )?;
        crate::backend_log::take(label);
        Ok(ModelSession { session, label: label.to_string() })
    }

    /// The model's outputs for `feeds`, by name.
    pub fn run(&mut self, feeds: &[(String, Tensor)]) -> Result<HashMap<String, Tensor>, RuntimeError> {
        let inputs = session_feeds(&self.session, feeds, &self.label)?;
        let (results, _) = run_without_optionals(&mut self.session, inputs).map_err(|e| e.into_runtime(&self.label))?;
        crate::backend_log::take(&self.label);
        results
            .iter()
            .map(|(name, value)| {
                from_ort_value(value)
                    .map(|t| (name.clone(), t))
                    .map_err(|why| RuntimeError::Ort { backend: self.label.clone(), why: format!("'{name}': {why}") })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerwise_model::builder::{attr, Dim, ModelBuilder};
    use layerwise_model::DataType;

    /// A chain of `n` nodes on a [batch, 8] input (batch symbolic): Relu, a round trip through
    /// FP16 (Casts), Sigmoid; with `shape_at`, a Shape whose int64 value a Reshape reads from the
    /// next piece (a value the piece's border would not carry).
    fn chain(n: usize, shape_at: Option<usize>) -> (layerwise_model::Model, layerwise_model::onnx::ModelProto) {
        let mut b = ModelBuilder::new("chain", 17);
        b.input("x", DataType::Float, &[Dim::Symbolic("batch".into()), Dim::Fixed(8)]);
        let mut prev = "x".to_string();
        let mut i = 0;
        while i < n {
            let out = format!("t{i}");
            if Some(i) == shape_at {
                b.node("Shape", &format!("n{i}"), &[&prev], &[&format!("s{i}")], vec![]);
                i += 1;
                // Far enough on that the Reshape lies in a later piece.
                for j in 0..TYPING_PIECE_NODES {
                    b.node("Relu", &format!("n{i}"), &[&prev], &[&format!("t{i}")], vec![]);
                    prev = format!("t{i}");
                    i += 1;
                    let _ = j;
                }
                b.node(
                    "Reshape",
                    &format!("n{i}"),
                    &[&prev, &format!("s{}", shape_at.unwrap())],
                    &[&format!("t{i}")],
                    vec![],
                );
            } else {
                match i % 4 {
                    0 => b.node("Relu", &format!("n{i}"), &[&prev], &[&out], vec![]),
                    1 => b.node(
                        "Cast",
                        &format!("n{i}"),
                        &[&prev],
                        &[&out],
                        vec![attr::int("to", DataType::Float16 as i64)],
                    ),
                    2 => b.node(
                        "Cast",
                        &format!("n{i}"),
                        &[&prev],
                        &[&out],
                        vec![attr::int("to", DataType::Float as i64)],
                    ),
                    _ => b.node("Sigmoid", &format!("n{i}"), &[&prev], &[&out], vec![]),
                };
            }
            prev = format!("t{i}");
            i += 1;
        }
        b.output(&prev, DataType::Float);
        let model = layerwise_model::Model::from_proto(b.build(), "chain.onnx").unwrap();
        let index = layerwise_model::GraphIndex::build(model.graph()).unwrap();
        let (exposed, _) = expose(&model.proto, &index, &layerwise_model::Selection::All).unwrap();
        (model, exposed)
    }

    #[test]
    fn typing_in_pieces_gives_the_whole_models_types() {
        let (model, exposed) = chain(3 * TYPING_PIECE_NODES + 17, None);
        let whole = exposed_types(&model, &exposed).unwrap();
        let pieces = types_in_pieces(&model, &exposed).unwrap();
        assert_eq!(pieces.len(), whole.len());
        assert_eq!(pieces, whole);
        // The FP16 tensors and the unknown batch dimension are what a border must carry.
        assert_eq!(pieces["t2001"], InferredType { dtype: Some(DType::F16), dims: vec![None, Some(8)] });
    }

    #[test]
    fn typing_is_not_cut_where_a_shape_value_crosses_a_border() {
        let (model, exposed) = chain(3 * TYPING_PIECE_NODES, Some(900));
        let why = types_in_pieces(&model, &exposed).unwrap_err();
        assert!(why.contains("'s900', not a floating tensor"), "{why}");
    }
}
