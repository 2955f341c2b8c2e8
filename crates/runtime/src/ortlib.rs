//! Finding `libonnxruntime` and starting ONNX Runtime once per process.
//!
//! Search order: `LAYERWISE_ORT_LIB`, `ORT_DYLIB_PATH`, layerwise's cache folder, an installed
//! Python `onnxruntime` package; failing all, `pip download onnxruntime==ORT_VERSION` into the cache.
//!
//! A GPU execution provider (`ort:cuda`, `ort:trt`, `ort:nvrtx`) needs ONNX Runtime's GPU build,
//! which also runs the CPU provider: one process loads one library, so when any backend asks for
//! the GPU the search looks for `onnxruntime-gpu` instead (a folder that holds
//! `libonnxruntime_providers_cuda.so`), and fetches it with pip only where an NVIDIA driver is.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::RuntimeError;

/// The ONNX Runtime release layerwise fetches when none is found.
pub const ORT_VERSION: &str = "1.31.1";

/// Where layerwise keeps fetched libraries: `LAYERWISE_CACHE_DIR`, else the user's cache folder.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LAYERWISE_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("layerwise")
}

fn python() -> String {
    std::env::var("LAYERWISE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// The library found, and how.
#[derive(Debug, Clone)]
pub struct OrtLibrary {
    pub path: PathBuf,
    pub found_by: String,
}

fn is_ort_lib(name: &str) -> bool {
    (name.starts_with("libonnxruntime.so") || (name.starts_with("libonnxruntime") && name.ends_with(".dylib")))
        && !name.contains("providers")
}

static WANT_GPU: AtomicBool = AtomicBool::new(false);

/// Asks for ONNX Runtime's GPU build. Must come before the first run (the library is loaded once).
pub fn require_gpu_build() -> Result<(), RuntimeError> {
    WANT_GPU.store(true, Ordering::SeqCst);
    if let Some(Ok((_, lib))) = ENVIRONMENT.get() {
        if !is_gpu_build(lib.path.parent().unwrap_or(Path::new("."))) {
            return Err(RuntimeError::OrtLoad {
                path: lib.path.clone(),
                why: "a GPU backend was asked for after ONNX Runtime's CPU build was loaded".into(),
            });
        }
    }
    Ok(())
}

fn wants_gpu() -> bool {
    WANT_GPU.load(Ordering::SeqCst)
}

/// Whether a folder holds ONNX Runtime's GPU build (its CUDA provider library).
fn is_gpu_build(dir: &Path) -> bool {
    dir.join("libonnxruntime_providers_cuda.so").exists()
}

fn package() -> &'static str {
    if wants_gpu() {
        "onnxruntime-gpu"
    } else {
        "onnxruntime"
    }
}

fn find_lib_in(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| is_ort_lib(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    // Prefer the fully versioned file name (libonnxruntime.so.1.31.1) over a bare link.
    found.sort_by_key(|p| std::cmp::Reverse(p.to_string_lossy().len()));
    found.into_iter().next()
}

fn from_env(var: &str) -> Result<Option<OrtLibrary>, RuntimeError> {
    let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) else { return Ok(None) };
    let path = PathBuf::from(value);
    let path = if path.is_dir() { find_lib_in(&path).unwrap_or(path) } else { path };
    if !path.is_file() {
        return Err(RuntimeError::OrtNotFound(format!("{var} is set to '{}', which is not a file", path.display())));
    }
    Ok(Some(OrtLibrary { path, found_by: var.to_string() }))
}

fn from_python() -> Result<Option<OrtLibrary>, RuntimeError> {
    let Ok(out) = Command::new(python())
        // Where the package lies, without importing it (an import loads numpy and the library:
        // a tenth of a second before any work).
        .args(["-c", "import importlib.util as u; s = u.find_spec('onnxruntime'); print(s.submodule_search_locations[0] if s else '')"])
        .output()
    else {
        return Ok(None);
    };
    // A probe ended by a signal (Ctrl-C reaches the whole process group) says nothing of what is
    // installed: an interrupt is no reason to start a download.
    #[cfg(unix)]
    if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&out.status) {
        return Err(RuntimeError::OrtNotFound(format!(
            "the probe for the Python onnxruntime package was ended by signal {signal} (an interrupt?); nothing was fetched"
        )));
    }
    let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || found.is_empty() {
        return Ok(None);
    }
    let dir = PathBuf::from(found).join("capi");
    if wants_gpu() && !is_gpu_build(&dir) {
        return Ok(None);
    }
    Ok(find_lib_in(&dir).map(|path| OrtLibrary { path, found_by: "the installed Python onnxruntime package".into() }))
}

fn fetch_with_pip(dest: &Path) -> Result<PathBuf, String> {
    // A spinner on a terminal; where stderr is a file or a pipe, a line before and after.
    let message =
        format!("ONNX Runtime not found: fetching {}=={ORT_VERSION} with pip into {}", package(), dest.display());
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_draw_target(if terminal {
        indicatif::ProgressDrawTarget::stderr()
    } else {
        indicatif::ProgressDrawTarget::hidden()
    });
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner.set_message(message.clone());
    let started = std::time::Instant::now();
    if !terminal {
        eprintln!("layerwise: {message}");
    }
    let result = (|| {
        let download = layerwise_model::scratch::ScratchDir::new("layerwise-pip-")
            .map_err(|e| format!("cannot create a temporary folder: {e}"))?;
        let out = Command::new(python())
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d"])
            .arg(download.path())
            .arg(format!("{}=={ORT_VERSION}", package()))
            .output()
            .map_err(|e| format!("cannot run '{} -m pip': {e}", python()))?;
        if !out.status.success() {
            return Err(format!("pip download failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let wheel = fs::read_dir(download.path())
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or("pip download produced no wheel")?;
        extract_libs(&wheel, dest)
    })();
    spinner.finish_and_clear();
    if !terminal {
        match &result {
            Ok(path) => eprintln!(
                "layerwise: ONNX Runtime ready in {:.1} s: {}",
                started.elapsed().as_secs_f64(),
                path.display()
            ),
            Err(why) => eprintln!("layerwise: fetching ONNX Runtime failed: {why}"),
        }
    }
    result
}

/// Copies the ONNX Runtime shared libraries out of a wheel into `dest`, atomically per file.
fn extract_libs(wheel: &Path, dest: &Path) -> Result<PathBuf, String> {
    let file = fs::File::open(wheel).map_err(|e| e.to_string())?;
    let mut zip = npyz::zip::ZipArchive::new(file).map_err(|e| format!("{}: {e}", wheel.display()))?;
    fs::create_dir_all(dest).map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    let mut main_lib = None;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| e.to_string())?;
        let name = entry.name().to_string();
        let Some(file_name) = name.strip_prefix("onnxruntime/capi/") else { continue };
        if !file_name.starts_with("libonnxruntime") || file_name.contains('/') {
            continue;
        }
        let (tmp, _tracked) =
            layerwise_model::scratch::create_tracked(|| tempfile::NamedTempFile::new_in(dest), |t| t.path())
                .map_err(|e| e.to_string())?;
        std::io::copy(&mut entry, &mut tmp.as_file()).map_err(|e| e.to_string())?;
        let target = dest.join(file_name);
        // Temporary files are private (0600); a library in a cache is readable by all, like pip's.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o644)).map_err(|e| e.to_string())?;
        }
        tmp.persist(&target).map_err(|e| e.to_string())?;
        if is_ort_lib(file_name) {
            main_lib = Some(target);
        }
    }
    main_lib.ok_or_else(|| format!("{} holds no libonnxruntime", wheel.display()))
}

/// Finds the ONNX Runtime shared library, fetching it with pip as a last resort.
pub fn locate() -> Result<OrtLibrary, RuntimeError> {
    for var in ["LAYERWISE_ORT_LIB", "ORT_DYLIB_PATH"] {
        if let Some(lib) = from_env(var)? {
            return Ok(lib);
        }
    }
    let cached = cache_dir().join(format!("{}-{ORT_VERSION}", package()));
    if let Some(path) = find_lib_in(&cached) {
        return Ok(OrtLibrary { path, found_by: "layerwise's cache".into() });
    }
    if let Some(lib) = from_python()? {
        return Ok(lib);
    }
    let how = format!(
        "Provide it with one of: `pip install {pkg}=={ORT_VERSION}`; LAYERWISE_ORT_LIB=/path/to/libonnxruntime.so; \
         or unpack the {pkg} wheel's onnxruntime/capi/ libraries into {}",
        cached.display(),
        pkg = package()
    );
    if wants_gpu() && !Path::new("/proc/driver/nvidia/version").exists() {
        return Err(RuntimeError::OrtNotFound(format!(
            "a GPU backend needs ONNX Runtime's GPU build, and this machine has no NVIDIA driver to fetch it for. {how}"
        )));
    }
    match fetch_with_pip(&cached) {
        Ok(path) => Ok(OrtLibrary { path, found_by: format!("pip download {}=={ORT_VERSION}", package()) }),
        Err(why) => Err(RuntimeError::OrtNotFound(format!("{why}. {how}"))),
    }
}

/// Why the environment could not be started: the library is missing, or it failed to load.
type StartError = (bool, String);
static ENVIRONMENT: OnceLock<Result<(ort::environment::Environment, OrtLibrary), StartError>> = OnceLock::new();

/// The process-wide ONNX Runtime environment, loading the library on first use.
pub fn environment() -> Result<(&'static ort::environment::Environment, &'static OrtLibrary), RuntimeError> {
    let result = ENVIRONMENT.get_or_init(|| {
        let lib = locate().map_err(|e| match e {
            RuntimeError::OrtNotFound(why) => (true, why),
            other => (false, other.to_string()),
        })?;
        let loaded = ort::init_from(&lib.path)
            .map_err(|e| (false, format!("{e} (found by {})", lib.found_by)))?
            .with_name("layerwise")
            // No usage events leave the machine. (ONNX Runtime still writes its `.ses` session file
            // in the temporary folder; see docs/reliability.md.)
            .with_telemetry(false)
            // ONNX Runtime's lines go to layerwise's log (report notes, `--verbose`), never
            // straight to the terminal.
            .with_logger(std::sync::Arc::new(
                |level: ort::logging::LogLevel, _category: &str, id: &str, _location: &str, message: &str| {
                    use crate::backend_log::{record, LogLevel};
                    let level = match level {
                        ort::logging::LogLevel::Verbose | ort::logging::LogLevel::Info => LogLevel::Info,
                        ort::logging::LogLevel::Warning => LogLevel::Warning,
                        ort::logging::LogLevel::Error => LogLevel::Error,
                        ort::logging::LogLevel::Fatal => LogLevel::Fatal,
                    };
                    record("ONNX Runtime", id, level, message);
                },
            ))
            .build()
            .map_err(|e| (false, format!("cannot start the environment: {e}")))?;
        // A custom logger starts at verbose: every line would cross into Rust for nothing.
        loaded.set_log_level(ort::logging::LogLevel::Warning);
        Ok((loaded, lib))
    });
    match result {
        Ok((env, lib)) => Ok((env, lib)),
        Err((true, why)) => Err(RuntimeError::OrtNotFound(why.clone())),
        Err((false, why)) => Err(RuntimeError::OrtLoad { path: PathBuf::from("libonnxruntime"), why: why.clone() }),
    }
}

/// The newest ONNX IR version ONNX Runtime `ORT_VERSION` reads.
pub const ORT_MAX_IR_VERSION: i64 = 13;
/// The newest `ai.onnx` opset ONNX Runtime `ORT_VERSION` supports (measured: 27 is refused as
/// "under development").
pub const ORT_MAX_OPSET: i64 = 26;

/// `model` as ONNX Runtime can read it. A model saved by a newer `onnx` package declares an IR
/// version ONNX Runtime refuses although every opset it imports is supported: it gets the newest
/// IR version ONNX Runtime reads (lossless: the IR version only says which features the file may
/// use), and a note says so; the file is unchanged. An opset ONNX Runtime does not support is an
/// error that says which, and what it supports.
pub fn fit_for_onnx_runtime(
    model: &layerwise_model::Model,
) -> Result<(std::borrow::Cow<'_, layerwise_model::Model>, Option<String>), RuntimeError> {
    let ir = model.proto.ir_version.unwrap_or(0);
    let too_new: Vec<String> = model
        .proto
        .opset_import
        .iter()
        .filter(|o| {
            matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")) && o.version.unwrap_or(0) > ORT_MAX_OPSET
        })
        .map(|o| format!("ai.onnx opset {}", o.version.unwrap_or(0)))
        .collect();
    if !too_new.is_empty() {
        return Err(RuntimeError::Input(format!(
            "{} imports {} (IR version {ir}); ONNX Runtime {ORT_VERSION}, which layerwise runs, supports ai.onnx opsets up to {ORT_MAX_OPSET} and IR versions up to {ORT_MAX_IR_VERSION}: convert the model to opset {ORT_MAX_OPSET} or lower (onnx.version_converter.convert_version)",
            model.path.display(),
            too_new.join(", ")
        )));
    }
    if ir <= ORT_MAX_IR_VERSION {
        return Ok((std::borrow::Cow::Borrowed(model), None));
    }
    let mut lowered = model.clone();
    lowered.proto.ir_version = Some(ORT_MAX_IR_VERSION);
    let note = format!(
        "{} declares IR version {ir}; ONNX Runtime {ORT_VERSION} reads up to {ORT_MAX_IR_VERSION} and supports every opset it imports, so it was given the model as IR version {ORT_MAX_IR_VERSION} (the file is unchanged)",
        model.path.display()
    );
    Ok((std::borrow::Cow::Owned(lowered), Some(note)))
}
