//! Writing a run's reports: every requested format, each file atomically.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{render_csv, render_html, render_markdown, render_model_explorer, FixReport, Report};

/// Where to write the report formats of one run (each optional).
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    pub json: Option<PathBuf>,
    pub html: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    pub model_explorer: Option<PathBuf>,
}

impl Outputs {
    pub fn paths(&self) -> Vec<(&'static str, &PathBuf)> {
        [
            ("JSON report", &self.json),
            ("HTML report", &self.html),
            ("Markdown summary", &self.markdown),
            ("CSV", &self.csv),
            ("Model Explorer node data", &self.model_explorer),
        ]
        .into_iter()
        .filter_map(|(what, p)| p.as_ref().map(|p| (what, p)))
        .collect()
    }

    /// Writes every requested format of a report, each atomically, and all or none: every file
    /// is staged before any is moved into place, so a full disk on the last leaves none of them
    /// written. `fix` adds the fix to the Markdown summary.
    pub fn write(&self, report: &Report, fix: Option<&FixReport>) -> Result<(), ReportError> {
        let mut staged = Vec::new();
        if let Some(p) = &self.json {
            staged.push(stage_atomic(p, &to_json(report))?);
        }
        if let Some(p) = &self.html {
            staged.push(stage_atomic(p, render_html(report).as_bytes())?);
        }
        if let Some(p) = &self.markdown {
            staged.push(stage_atomic(p, render_markdown(report, fix).as_bytes())?);
        }
        if let Some(p) = &self.csv {
            staged.push(stage_atomic(p, &render_csv(report))?);
        }
        if let Some(p) = &self.model_explorer {
            let mut bytes = serde_json::to_vec_pretty(&render_model_explorer(report)).expect("json");
            bytes.push(b'\n');
            staged.push(stage_atomic(p, &bytes)?);
        }
        staged.into_iter().try_for_each(StagedFile::commit)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write report {path}: {why}")]
    Write { path: PathBuf, why: String },
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename, so readers
/// never see a half-written file and a failed write leaves nothing behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    stage_atomic(path, bytes)?.commit()
}

/// A file written in full beside its destination, not yet moved there ([`stage_atomic`]): a run
/// with several outputs stages them all, then commits them, so that a full disk stops it before
/// any output is replaced. Dropped uncommitted, it is removed.
#[derive(Debug)]
pub enum StagedFile {
    File {
        tmp: tempfile::NamedTempFile,
        _tracked: layerwise_model::scratch::Tracked,
        path: PathBuf,
    },
    /// A device (`/dev/null`, `/dev/stdout`): written at commit, nothing to stage.
    Device {
        path: PathBuf,
        bytes: Vec<u8>,
    },
}

/// `bytes` written and synced to a temporary file in `path`'s folder, to be moved to `path` by
/// [`StagedFile::commit`].
pub fn stage_atomic(path: &Path, bytes: &[u8]) -> Result<StagedFile, ReportError> {
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
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        return Ok(StagedFile::Device { path: path.to_path_buf(), bytes: bytes.to_vec() });
    }
    let (mut tmp, _tracked) = layerwise_model::scratch::create_tracked(
        || tempfile::Builder::new().prefix(".layerwise-").suffix(".tmp").tempfile_in(&dir),
        |t| t.path(),
    )
    .map_err(|e| err(e.to_string()))?;
    tmp.write_all(bytes).map_err(|e| err(e.to_string()))?;
    tmp.as_file().sync_all().map_err(|e| err(e.to_string()))?;
    // Temporary files are private (0600); a report gets the usual 0644.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644)).map_err(|e| err(e.to_string()))?;
    }
    Ok(StagedFile::File { tmp, _tracked, path: path.to_path_buf() })
}

impl StagedFile {
    /// Moves the file into place (a rename in its folder) and records it written.
    pub fn commit(self) -> Result<(), ReportError> {
        match self {
            StagedFile::File { tmp, _tracked, path } => {
                tmp.persist(&path).map_err(|e| ReportError::Write { path: path.clone(), why: e.error.to_string() })?;
                layerwise_model::scratch::note_written(&path);
                Ok(())
            }
            StagedFile::Device { path, bytes } => match layerwise_model::scratch::write_if_not_a_file(&path, &bytes) {
                Some(written) => written.map_err(|e| ReportError::Write { path, why: e.to_string() }),
                None => Err(ReportError::Write { path, why: "it is no longer a device".into() }),
            },
        }
    }
}

/// The JSON text of a report (pretty, with a final newline).
pub fn to_json(report: &Report) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(report).expect("reports serialize");
    bytes.push(b'\n');
    bytes
}
