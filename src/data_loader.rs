//! `--data-loader-script FILE.py[:FUNC]`: samples from a Python function, as Polygraphy's data
//! loader scripts give them. The function (`load_data` unless named) yields dicts of input name to
//! array; each becomes one sample, written as an `.npz` file into a scratch folder that the run
//! then reads as `--inputs DIR` does. Runs the Python that `LAYERWISE_PYTHON` names (`python3`),
//! which needs numpy.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use anyhow::{bail, Context, Result};
use layerwise_model::scratch::ScratchDir;

/// Imports the script, calls the function and saves what it yields. Its own refusals (no numpy,
/// no such function, a sample that is not a dict, no sample) go to `DRIVER_ERROR` in the output
/// folder, exit 3; once every sample is saved it writes `DRIVER_DONE`. Anything else that ends
/// Python (the script's exception, its `sys.exit`, at import or in the function) is the script's
/// failure, told by the exit status and the end of its stderr.
const DRIVER: &str = r#"
import importlib.util, os, sys
path, func, out = sys.argv[1:4]
max_count, max_bytes = int(sys.argv[4]), int(sys.argv[5])
def refuse(message):
    with open(os.path.join(out, ".layerwise-driver-error"), "w", encoding="utf-8") as f:
        f.write(message)
    sys.exit(3)
try:
    import numpy as np
except ImportError:
    refuse("numpy is not installed for this Python (" + sys.executable + "); install it with: " + sys.executable + " -m pip install numpy")
spec = importlib.util.spec_from_file_location("layerwise_data_loader", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
loader = getattr(module, func, None)
if not callable(loader):
    refuse(f"{path} defines no function '{func}' (name another with {path}:FUNC)")
count, written = 0, 0
for i, sample in enumerate(loader()):
    if not hasattr(sample, "items"):
        refuse(f"sample {i} from {func}() is a {type(sample).__name__}, not a dict of input names to arrays")
    arrays = {str(k): np.asarray(v) for k, v in sample.items()}
    need = sum(a.nbytes for a in arrays.values())
    if count >= max_count or written + need > max_bytes:
        refuse(f"{func}() did not end within {count} samples ({written} bytes): the limit is {max_count} samples and {max_bytes} bytes (half the free space of the temporary folder's file system); read no more. Raise the count with --max-loader-samples, or make {func}() stop")
    np.savez(os.path.join(out, f"sample_{i:06d}.npz"), **arrays)
    count += 1
    written += need
if count == 0:
    refuse(f"{func}() in {path} yielded no samples")
open(os.path.join(out, ".layerwise-driver-done"), "w").close()
"#;

/// The script file and function `spec` names: `FILE.py:FUNC`, where FILE.py may itself hold a
/// colon (a Windows drive, a folder name), or `FILE.py` (`load_data`).
pub fn script_and_function(spec: &str) -> (&str, &str) {
    match spec.rsplit_once(':') {
        Some((file, func)) if file.ends_with(".py") && !func.is_empty() && !func.contains(['/', '\\']) => (file, func),
        _ => (spec, "load_data"),
    }
}

/// The driver's own refusal, written into the output folder.
const DRIVER_ERROR: &str = ".layerwise-driver-error";
/// Written by the driver once every sample is saved.
const DRIVER_DONE: &str = ".layerwise-driver-done";
/// How much of the end of the script's stderr an error shows: its last lines, at most this many
/// characters.
const STDERR_TAIL_LINES: usize = 12;
const STDERR_TAIL_CHARS: usize = 2000;
/// Bytes of stderr kept while the script runs (the end of it): a script that writes without end
/// does not fill memory.
const STDERR_KEPT_BYTES: usize = 64 * 1024;

/// The samples `spec` (`FILE.py` or `FILE.py:FUNC`) yields, saved in a scratch folder that lives
/// as long as the returned guard; the folder's path is the second value.
pub fn samples_from_script(spec: &str, max_samples: usize) -> Result<(ScratchDir, PathBuf)> {
    let (file, func) = script_and_function(spec);
    let path = Path::new(file);
    if !path.exists() {
        bail!("--data-loader-script {file}: no such file");
    }
    // A FIFO would block Python's import, a device feed it without end: a regular file only.
    layerwise_model::open_regular(path).with_context(|| format!("--data-loader-script {file}"))?;
    let scratch = ScratchDir::new("layerwise-data-")?;
    let python = std::env::var("LAYERWISE_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let mut child = crate::child::ends_with_this_process(&mut Command::new(&python))
        .args(["-c", DRIVER])
        .arg(path)
        .arg(func)
        .arg(scratch.path())
        .arg(max_samples.to_string())
        .arg(half_the_free_space(scratch.path()).to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!("--data-loader-script needs Python: cannot run '{python}' (set LAYERWISE_PYTHON to another)")
        })?;
    let stderr = child.stderr.take().map(kept_tail).unwrap_or_default();
    let status = child.wait().with_context(|| format!("--data-loader-script {file}: waiting for '{python}'"))?;
    // The driver's own refusal says what is wrong in one line.
    if let Ok(message) = std::fs::read_to_string(scratch.path().join(DRIVER_ERROR)) {
        bail!("--data-loader-script {file}: {}", printable(message.trim()));
    }
    let done = scratch.path().join(DRIVER_DONE);
    if !status.success() || !done.is_file() {
        let how = if status.success() {
            format!("Python exited with {} before the function yielded every sample (the script ended Python itself, at import or in {func}())", exit_of(status))
        } else {
            format!("Python exited with {}", exit_of(status))
        };
        let tail = stderr_tail(&stderr);
        bail!(
            "--data-loader-script {file}: the script failed: {how}; {}",
            if tail.is_empty() {
                "it wrote nothing to stderr".to_string()
            } else {
                format!("the end of its stderr:\n{tail}")
            }
        );
    }
    let _ = std::fs::remove_file(done);
    let folder = scratch.path().to_path_buf();
    Ok((scratch, folder))
}

/// Half the space free for an unprivileged writer on `dir`'s file system: what a loader's samples
/// may take, so that one that never ends stops with room left (unknown: no bound by bytes).
fn half_the_free_space(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return u64::MAX };
    // SAFETY: `stats` is plain data that statvfs fills; `path` is NUL-terminated and lives across
    // the call.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return u64::MAX;
    }
    (stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64) / 2
}

/// The last `STDERR_KEPT_BYTES` of what `from` gives, read to its end (the child's stderr: read
/// before the child is waited for, so a script that writes much never blocks on a full pipe).
fn kept_tail(mut from: impl Read) -> Vec<u8> {
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * STDERR_KEPT_BYTES {
                    kept.drain(..kept.len() - STDERR_KEPT_BYTES);
                }
            }
        }
    }
    if kept.len() > STDERR_KEPT_BYTES {
        kept.drain(..kept.len() - STDERR_KEPT_BYTES);
    }
    kept
}

/// The last lines of a script's stderr, indented, at most `STDERR_TAIL_CHARS` characters (cut
/// at the front, marked with `...`), control characters shown escaped.
fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let last = &lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..];
    let mut tail = printable(&last.join("\n"));
    let count = tail.chars().count();
    if count > STDERR_TAIL_CHARS {
        tail = format!("...{}", tail.chars().skip(count - STDERR_TAIL_CHARS).collect::<String>());
    }
    if tail.trim().is_empty() {
        return String::new();
    }
    tail.lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

/// `text` with control characters (but newlines and tabs) written as `\u{..}` escapes: a script's
/// output does not drive the terminal the error is shown on.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() && c != '\n' && c != '\t' { c.escape_unicode().to_string() } else { c.to_string() })
        .collect()
}

/// "exit status 3", or the signal that ended the process.
fn exit_of(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("signal {signal}");
        }
    }
    match status.code() {
        Some(code) => format!("exit status {code}"),
        None => status.to_string(),
    }
}
