//! The one rule for every path layerwise writes: it never deletes, replaces or writes
//! into anything it did not create in this run, unless the user names that exact file as an
//! output and it is nothing the run reads (a model, its external data, samples, a data-loader
//! script, a saved run, a report being rendered). Folders it fills must be new or empty.
//!
//! Every command builds a [`Reads`] of what it reads and passes each output through
//! [`Reads::check_output_file`] (or [`check_fresh_folder`]) before any work.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use layerwise_model::Model;

/// What a run reads: files by what they are, and folders whose whole content is read (a saved
/// run), which no output may name or lie inside.
#[derive(Debug, Default, Clone)]
pub struct Reads {
    entries: Vec<Read>,
}

#[derive(Debug, Clone)]
struct Read {
    what: String,
    path: PathBuf,
    /// `path` resolved once, when it is listed (every output is checked against every entry).
    resolved: Option<PathBuf>,
    /// The file's identity (device and inode) where it exists: a second spelling of one file
    /// that no path comparison sees (a bind mount, a case-insensitive file system) has the same.
    identity: Option<(u64, u64)>,
    folder: bool,
}

impl Reads {
    pub fn new() -> Reads {
        Reads::default()
    }

    pub fn file(&mut self, what: impl Into<String>, path: impl AsRef<Path>) -> &mut Reads {
        self.entries.push(Read {
            what: what.into(),
            path: path.as_ref().to_path_buf(),
            resolved: resolved(path.as_ref()),
            identity: identity(path.as_ref()),
            folder: false,
        });
        self
    }

    pub fn folder(&mut self, what: impl Into<String>, path: impl AsRef<Path>) -> &mut Reads {
        self.entries.push(Read {
            what: what.into(),
            path: path.as_ref().to_path_buf(),
            resolved: resolved(path.as_ref()),
            identity: identity(path.as_ref()),
            folder: true,
        });
        self
    }

    /// A loaded model's external data files.
    pub fn external_data(&mut self, model: &Model, what: &str) -> &mut Reads {
        for f in model.external_files() {
            self.file(what, f);
        }
        self
    }

    /// Refuses `target` (an output; `what` it is) where it is, or lies inside, anything read.
    pub fn refuse_overlap(&self, target: &Path, what: &str) -> Result<()> {
        let Some(t) = resolved(target) else { return Ok(()) };
        let target_identity = identity(target);
        // The folders the target would lie in, by identity (a folder mounted at a second path).
        let within: Vec<(u64, u64)> = t.ancestors().skip(1).filter_map(identity).collect();
        for read in &self.entries {
            let same_file = read.identity.is_some() && read.identity == target_identity;
            let Some(r) = &read.resolved else { continue };
            if *r == t || same_file {
                bail!(
                    "{what} {} would overwrite {} {}; choose another path",
                    target.display(),
                    read.what,
                    read.path.display()
                );
            }
            if read.folder && (t.starts_with(r) || read.identity.is_some_and(|id| within.contains(&id))) {
                bail!(
                    "{what} {} would write into {} {}; choose a path outside it",
                    target.display(),
                    read.what,
                    read.path.display()
                );
            }
        }
        Ok(())
    }

    /// Checks an output file before any work: its folder exists, it is no folder, it is nothing
    /// read, and no other output of the run names it (it is then listed among them).
    pub fn check_output_file(&mut self, target: &Path, what: &str) -> Result<()> {
        check_writable_target(target, what)?;
        self.refuse_overlap(target, what)?;
        self.file(format!("{what} (also an output of this run)"), target);
        Ok(())
    }
}

/// Checks up front that a file can be written there, so a bad path fails before any work.
pub fn check_writable_target(path: &Path, what: &str) -> Result<()> {
    let dir = parent_of(path);
    if !dir.is_dir() {
        bail!("cannot write {what} {}: folder '{}' does not exist", path.display(), dir.display());
    }
    if path.is_dir() {
        bail!("cannot write {what} {}: it is a folder", path.display());
    }
    Ok(())
}

/// A folder layerwise fills (`--save-tensors`, `--repro`, the demo's): it must be new or empty,
/// so that nothing already there is replaced or mixed with what the run writes.
pub fn check_fresh_folder(dir: &Path, option: &str) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        bail!("{option} {}: it is a file, not a folder; give a new or empty folder", dir.display());
    }
    if dir.is_dir() && std::fs::read_dir(dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("{option} {}: the folder is not empty; give a new or empty folder (layerwise never replaces files it did not write)", dir.display());
    }
    let parent = parent_of(dir);
    if !parent.is_dir() {
        bail!("{option} {}: folder '{}' does not exist", dir.display(), parent.display());
    }
    Ok(())
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The identity (device, inode) of what `path` names, where it exists.
fn identity(path: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// The file a path names, resolved (its folder canonical, `..` and links followed), so that two
/// spellings of one file compare equal; `None` where the folder does not exist.
fn resolved(path: &Path) -> Option<PathBuf> {
    // A device (/dev/null) takes any number of writers, and no input can be replaced through it.
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        return None;
    }
    if let Ok(p) = path.canonicalize() {
        return Some(p);
    }
    Some(parent_of(path).canonicalize().ok()?.join(path.file_name()?))
}
