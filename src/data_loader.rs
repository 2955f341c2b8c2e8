//! `--data-loader-script FILE.py[:FUNC]`: samples from a Python function, as Polygraphy's data
//! loader scripts give them. The function (`load_data` unless named) yields dicts of input name to
//! array; each becomes one sample, written as an `.npz` file into a scratch folder that the run
//! then reads as `--inputs DIR` does. Runs the Python that `LAYERWISE_PYTHON` names (`python3`),
//! which needs numpy.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use layerwise_model::scratch::ScratchDir;

/// Imports the script, calls the function and saves what it yields: exit 3 with a message on
/// anything that is not a sample.
const DRIVER: &str = r#"
import importlib.util, os, sys
try:
    import numpy as np
except ImportError:
    sys.stderr.write("numpy is not installed for this Python (" + sys.executable + "); install it with: " + sys.executable + " -m pip install numpy\n")
    sys.exit(3)
path, func, out = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("layerwise_data_loader", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
loader = getattr(module, func, None)
if not callable(loader):
    sys.stderr.write(f"{path} defines no function '{func}' (name another with {path}:FUNC)\n")
    sys.exit(3)
count = 0
for i, sample in enumerate(loader()):
    if not hasattr(sample, "items"):
        sys.stderr.write(f"sample {i} from {func}() is a {type(sample).__name__}, not a dict of input names to arrays\n")
        sys.exit(3)
    np.savez(os.path.join(out, f"sample_{i:06d}.npz"), **{str(k): np.asarray(v) for k, v in sample.items()})
    count += 1
if count == 0:
    sys.stderr.write(f"{func}() in {path} yielded no samples\n")
    sys.exit(3)
"#;

/// The samples `spec` (`FILE.py` or `FILE.py:FUNC`) yields, saved in a scratch folder that lives
/// as long as the returned guard; the folder's path is the second value.
pub fn samples_from_script(spec: &str) -> Result<(ScratchDir, PathBuf)> {
    // FILE.py:FUNC, where FILE.py may itself hold a colon (a Windows drive, a folder name).
    let (file, func) = match spec.rsplit_once(':') {
        Some((file, func)) if file.ends_with(".py") && !func.is_empty() && !func.contains(['/', '\\']) => (file, func),
        _ => (spec, "load_data"),
    };
    let path = Path::new(file);
    if !path.exists() {
        bail!("--data-loader-script {file}: no such file");
    }
    // A FIFO would block Python's import, a device feed it without end: a regular file only.
    layerwise_model::open_regular(path).with_context(|| format!("--data-loader-script {file}"))?;
    let scratch = ScratchDir::new("layerwise-data-")?;
    let python = std::env::var("LAYERWISE_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let out = Command::new(&python)
        .args(["-c", DRIVER])
        .arg(path)
        .arg(func)
        .arg(scratch.path())
        .output()
        .with_context(|| format!("--data-loader-script needs Python: cannot run '{python}' (set LAYERWISE_PYTHON to another)"))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let last = said.trim().lines().last().unwrap_or("").to_string();
        bail!("--data-loader-script {spec}: {}", if last.is_empty() { format!("Python exited with {}", out.status) } else { last });
    }
    let folder = scratch.path().to_path_buf();
    Ok((scratch, folder))
}
