//! Temporary files and folders that must not outlive an interrupted run.
//!
//! `tempfile` removes its files and folders on drop, which a signal skips. Everything layerwise
//! creates temporarily (scratch folders for runtimes, `.layerwise-*.tmp` files renamed into place
//! as reports and models) is also listed here while it exists, so that the command-line's Ctrl-C
//! handler can remove it all before exiting ([`remove_all`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Lists a temporary path until dropped.
#[derive(Debug)]
pub struct Tracked(PathBuf);

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut list = live();
        if let Some(i) = list.iter().rposition(|p| *p == self.0) {
            list.swap_remove(i);
        }
    }
}

/// Lists `path` (a temporary file or folder) until the returned guard is dropped.
pub fn track(path: &Path) -> Tracked {
    live().push(path.to_path_buf());
    Tracked(path.to_path_buf())
}

/// A temporary folder (`<system temp>/<prefix>XXXXXX`), removed on drop or by [`remove_all`].
#[derive(Debug)]
pub struct ScratchDir {
    // Declared first so the folder is removed before it leaves the list.
    dir: tempfile::TempDir,
    _tracked: Tracked,
}

impl ScratchDir {
    pub fn new(prefix: &str) -> std::io::Result<ScratchDir> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let _tracked = track(dir.path());
        Ok(ScratchDir { dir, _tracked })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Removes every listed temporary file and folder. For signal handlers: it never panics.
pub fn remove_all() {
    for path in live().drain(..) {
        let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_paths_are_removed_and_dropped_ones_forgotten() {
        let kept = ScratchDir::new("layerwise-scratch-test-").unwrap();
        std::fs::write(kept.path().join("f"), b"x").unwrap();
        let gone = ScratchDir::new("layerwise-scratch-test-").unwrap();
        let gone_path = gone.path().to_path_buf();
        drop(gone);
        assert!(!gone_path.exists());
        assert!(!live().contains(&gone_path));
        let file = tempfile::NamedTempFile::new().unwrap();
        let _guard = track(file.path());
        remove_all();
        assert!(!kept.path().exists() && !file.path().exists());
        assert!(live().is_empty());
    }
}

/// Writes `bytes` straight into `path` when it names something other than a regular file (a
/// device such as /dev/null, a pipe) and returns `None` otherwise. Writing to a temporary name
/// and renaming it there would replace the device itself with a file, for every program on the
/// machine.
pub fn write_if_not_a_file(path: &Path, bytes: &[u8]) -> Option<std::io::Result<()>> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() || meta.is_dir() {
        return None;
    }
    Some(std::fs::OpenOptions::new().write(true).open(path).and_then(|mut f| std::io::Write::write_all(&mut f, bytes)))
}
