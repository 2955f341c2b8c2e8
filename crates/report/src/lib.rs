//! Reports: the versioned JSON document (`layerwise.report/1`, see docs/report-format.md) and the
//! terminal summary. Files are written atomically: a report is either complete or absent.

mod json;
mod terminal;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use json::{build_report, Report, ReportContext, RunInfo, SCHEMA};
pub use terminal::render_terminal;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write report {path}: {why}")]
    Write { path: PathBuf, why: String },
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename, so readers
/// never see a half-written file and a failed write leaves nothing behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let err = |why: String| ReportError::Write { path: path.to_path_buf(), why };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(err(format!("folder '{}' does not exist", dir.display())));
    }
    if path.is_dir() {
        return Err(err("it is a folder".into()));
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".layerwise-")
        .suffix(".tmp")
        .tempfile_in(&dir)
        .map_err(|e| err(e.to_string()))?;
    tmp.write_all(bytes).map_err(|e| err(e.to_string()))?;
    tmp.as_file().sync_all().map_err(|e| err(e.to_string()))?;
    // Temporary files are private (0600); a report gets the usual 0644.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644)).map_err(|e| err(e.to_string()))?;
    }
    tmp.persist(path).map_err(|e| err(e.error.to_string()))?;
    Ok(())
}

/// The JSON text of a report (pretty, with a final newline).
pub fn to_json(report: &Report) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(report).expect("reports serialize");
    bytes.push(b'\n');
    bytes
}
