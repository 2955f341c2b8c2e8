//! Temporary files and folders that must not outlive an interrupted run.
//!
//! `tempfile` removes its files and folders on drop, which a signal skips. Everything layerwise
//! creates temporarily (scratch folders for runtimes, `.layerwise-*.tmp` files renamed into place
//! as reports and models) is also listed here while it exists, so that the command-line's Ctrl-C
//! handler can remove it all before exiting ([`remove_all`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Outputs moved into place complete during this run (reports, models, folders), for the
/// interruption message: a run that writes several outputs may be stopped between two.
static WRITTEN: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Records that `path` is now in place, complete.
pub fn note_written(path: &Path) {
    WRITTEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(path.to_path_buf());
}

/// The outputs recorded by [`note_written`] that still exist (a temporary file saved through the
/// same code and removed since is no output), each once.
pub fn written() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in WRITTEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).iter() {
        if p.exists() && !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

fn live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps a temporary path listed until dropped.
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

/// Creates a temporary file or folder with `create` and lists it (at `path_of` it) in one step:
/// an interruption between the two would leave it unlisted, and so in place. Once
/// [`remove_all_before_exit`] has begun, this waits for the process to end.
pub fn create_tracked<T, E>(
    create: impl FnOnce() -> Result<T, E>,
    path_of: impl FnOnce(&T) -> &Path,
) -> Result<(T, Tracked), E> {
    let mut list = live();
    let created = create()?;
    let path = path_of(&created).to_path_buf();
    list.push(path.clone());
    Ok((created, Tracked(path)))
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
        let (dir, _tracked) = create_tracked(|| tempfile::Builder::new().prefix(prefix).tempdir(), |d| d.path())?;
        Ok(ScratchDir { dir, _tracked })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A folder written beside its destination and moved there whole ([`StagedDir::move_to`]): an
/// interrupted run leaves the destination as it was, and the staging folder is listed meanwhile.
#[derive(Debug)]
pub struct StagedDir {
    dir: tempfile::TempDir,
    _tracked: Tracked,
}

impl StagedDir {
    /// A fresh folder `<prefix>XXXXXX` in `destination`'s parent folder (the same file system, so
    /// that moving it is a rename).
    pub fn beside(destination: &Path, prefix: &str) -> std::io::Result<StagedDir> {
        let parent = match destination.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let (dir, _tracked) =
            create_tracked(|| tempfile::Builder::new().prefix(prefix).tempdir_in(&parent), |d| d.path())?;
        Ok(StagedDir { dir, _tracked })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Moves what the folder holds to `destination`: renamed there when it does not exist, or
    /// moved entry by entry into an empty folder there (the user's folder stays, with its
    /// permissions); records it written ([`note_written`]). Nothing that appeared at the
    /// destination since it was checked is replaced (another run, a user): the move fails, and
    /// what it had moved goes back. On failure the staging folder is removed, leaving nothing behind.
    pub fn move_to(self, destination: &Path) -> std::io::Result<()> {
        if destination.is_dir() {
            if let Some(entry) = std::fs::read_dir(destination)?.next() {
                return Err(appeared(&entry?.path(), destination));
            }
            let mut moved: Vec<(PathBuf, PathBuf)> = Vec::new();
            for entry in std::fs::read_dir(self.dir.path())? {
                let entry = entry?;
                let target = destination.join(entry.file_name());
                if let Err(e) = rename_no_replace(&entry.path(), &target) {
                    for (from, to) in moved.iter().rev() {
                        let _ = std::fs::rename(to, from);
                    }
                    return Err(if e.kind() == std::io::ErrorKind::AlreadyExists {
                        appeared(&target, destination)
                    } else {
                        e
                    });
                }
                moved.push((entry.path(), target));
            }
        } else {
            rename_no_replace(self.dir.path(), destination).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    appeared(destination, destination)
                } else {
                    e
                }
            })?;
            // Moved away: nothing is left for the drop to remove.
            let _ = self.dir.keep();
        }
        note_written(destination);
        Ok(())
    }
}

fn appeared(what: &Path, destination: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!(
            "'{}' appeared at {} during the run (another run or program writes there); nothing was replaced and nothing of this run was moved in",
            what.display(),
            destination.display()
        ),
    )
}

/// `rename(from, to)` that fails with `AlreadyExists` where `to` exists (an empty folder
/// included, which a plain rename replaces): Linux's `RENAME_NOREPLACE`, atomically; elsewhere,
/// and on file systems without it, checked just before.
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
        let (f, t) = (c(from)?, c(to)?);
        // SAFETY: both paths are NUL-terminated strings that live across the call.
        let done =
            unsafe { libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), libc::RENAME_NOREPLACE) };
        if done == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
            return Err(e);
        }
    }
    if std::fs::symlink_metadata(to).is_ok() {
        return Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists));
    }
    std::fs::rename(from, to)
}

/// Removes every listed temporary file and folder. It never panics.
pub fn remove_all() {
    remove_listed(&mut live());
}

/// [`remove_all`] for a signal handler that ends the process next: the list stays locked until
/// then, so that no thread creates a temporary path ([`create_tracked`] waits) after it.
pub fn remove_all_before_exit() {
    let mut list = live();
    remove_listed(&mut list);
    // A `Tracked` dropped meanwhile waits too: the process ends first.
    std::mem::forget(list);
}

/// Other threads may still be creating files in a folder as it is removed, and a removal then
/// fails (the folder is not empty): a folder is first renamed aside, which makes new files in it
/// fail to open, then removed, retried for up to 0.5 s for files opened before the rename.
fn remove_listed(list: &mut Vec<PathBuf>) {
    for path in list.drain(..) {
        let aside = path
            .with_file_name(format!("{}.removing", path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()));
        let path = if path.is_dir() && std::fs::rename(&path, &aside).is_ok() { aside } else { path };
        for _ in 0..100 {
            let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            if std::fs::symlink_metadata(&path).is_err() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
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
        let (file, _guard) = create_tracked(tempfile::NamedTempFile::new, |f| f.path()).unwrap();
        remove_all();
        assert!(!kept.path().exists() && !file.path().exists());
        assert!(live().is_empty());
    }

    /// An interrupted run's threads go on writing into their scratch folders while the handler
    /// removes them: a single `remove_dir_all` then fails (the folder is not empty) and leaves it.
    #[test]
    fn a_folder_written_into_while_it_is_removed_is_removed() {
        for _ in 0..20 {
            // Not listed: `remove_all` here would remove other tests' temporary files too.
            let path = tempfile::Builder::new().prefix("layerwise-scratch-busy-").tempdir().unwrap().keep();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let writer = {
                let (path, stop) = (path.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut k = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = std::fs::write(path.join(format!("f{k}")), b"x");
                        k += 1;
                    }
                })
            };
            while std::fs::read_dir(&path).unwrap().count() < 200 {
                std::thread::yield_now();
            }
            remove_listed(&mut vec![path.clone()]);
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let left: Vec<String> = std::fs::read_dir(path.parent().unwrap())
                .unwrap()
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with(&name))
                .collect();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            writer.join().unwrap();
            assert!(left.is_empty(), "{left:?} left while a thread wrote into it");
        }
    }

    /// Found by the red team (issue 54 item 2): a file that appeared in the checked-empty
    /// `--repro` or `--save-tensors` folder during the run was replaced when the staged entries
    /// were renamed in, and of two runs into one new folder the second mixed its files into the
    /// first's. Nothing that appeared is replaced, and nothing of the run is moved in.
    #[test]
    fn a_staged_folder_replaces_nothing_that_appeared_at_its_destination() {
        let root = tempfile::tempdir().unwrap();
        // An empty folder, checked at the start; a file appears in it during the run.
        let dest = root.path().join("repro");
        std::fs::create_dir(&dest).unwrap();
        let staged = StagedDir::beside(&dest, ".stage-").unwrap();
        std::fs::write(staged.path().join("model.onnx"), b"ours").unwrap();
        std::fs::write(staged.path().join("README.md"), b"ours").unwrap();
        std::fs::write(dest.join("model.onnx"), b"theirs").unwrap();
        let e = staged.move_to(&dest).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read(dest.join("model.onnx")).unwrap(), b"theirs");
        assert!(!dest.join("README.md").exists());
        // A new folder that another run created, and filled, meanwhile.
        let dest = root.path().join("new");
        let first = StagedDir::beside(&dest, ".stage-").unwrap();
        let second = StagedDir::beside(&dest, ".stage-").unwrap();
        std::fs::write(first.path().join("inputs.npz"), b"first").unwrap();
        std::fs::write(second.path().join("inputs.npz"), b"second").unwrap();
        first.move_to(&dest).unwrap();
        assert!(second.move_to(&dest).is_err());
        assert_eq!(std::fs::read(dest.join("inputs.npz")).unwrap(), b"first");
        // Nothing else is left beside it.
        let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "{left:?}");
    }
}
