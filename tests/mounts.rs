//! Outputs that name an input through a second path of its folder, as a bind mount (a Docker
//! volume) makes one: refused by file identity (issue 54 item 1; tests/cli.rs checks a hard link,
//! which needs no privileges). Mounting needs root: ignored by default, and `.ci/run`, which runs
//! as root, turns it on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use layerwise_model::builder::{Dim, ModelBuilder};
use layerwise_model::DataType;

/// The mount, undone however the test ends.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn layerwise(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_layerwise")).args(args).current_dir(cwd).output().unwrap()
}

fn said(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
#[ignore = "needs root to bind-mount a folder; .ci/run (as root) runs it with --include-ignored"]
fn outputs_through_a_bind_mount_of_an_inputs_folder_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let mut m = ModelBuilder::new("relu", 13);
    m.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    m.node("Relu", "relu", &["x"], &["y"], vec![]);
    m.output("y", DataType::Float);
    std::fs::write(a.join("m.onnx"), prost::Message::encode_to_vec(&m.build())).unwrap();
    // A saved run in the folder too: a folder read whole, which no output may lie in.
    let out = layerwise(&["bisect", "a/m.onnx", "--separate-runs", "--save-tensors", "a/st"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let status = Command::new("mount").args(["--bind"]).arg(&a).arg(&b).status().unwrap();
    assert!(status.success(), "mount --bind needs root (CI runs as root)");
    let _mounted = Mounted(b.clone());
    let model = std::fs::read(a.join("m.onnx")).unwrap();
    for (args, message) in [
        (&["convert", "a/m.onnx", "-o", "b/m.onnx"][..], "would overwrite the input model"),
        (&["bisect", "a/m.onnx", "--json", "b/m.onnx"][..], "would overwrite the input model"),
        (&["bisect", "a/m.onnx", "--cand", "npz:a/st/cand", "--json", "b/st/cand/r.json"][..], "would write into"),
    ] {
        let out = layerwise(args, dir.path());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", said(&out));
        assert!(said(&out).contains(message), "{args:?}: {}", said(&out));
    }
    assert_eq!(std::fs::read(a.join("m.onnx")).unwrap(), model);
    assert!(!a.join("st/cand/r.json").exists());
}

/// A full tmpfs, unmounted however the test ends.
fn full_tmpfs(at: &Path) -> Mounted {
    std::fs::create_dir(at).unwrap();
    let status = Command::new("mount").args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"]).arg(at).status().unwrap();
    assert!(status.success(), "mounting a tmpfs needs root (CI runs as root)");
    let mounted = Mounted(at.to_path_buf());
    // Filled to the last byte.
    let _ = std::fs::write(at.join("filler"), vec![0u8; 64 * 1024]);
    mounted
}

/// Found by the red team (issue 54 item 3): on a full disk `fix` exited 2 having written the model
/// and its keep list (with `--json` on the full disk), or after `-o` was replaced beside an older
/// keep list; bisect's reports likewise stopped halfway. Every output of a run, or none.
#[test]
#[ignore = "needs root to mount a tmpfs; .ci/run (as root) runs it with --include-ignored"]
fn a_full_disk_leaves_none_of_a_runs_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = ModelBuilder::new("relu", 13);
    m.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    m.node("Relu", "relu", &["x"], &["y"], vec![]);
    m.output("y", DataType::Float);
    std::fs::write(dir.path().join("m.onnx"), prost::Message::encode_to_vec(&m.build())).unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let _full = full_tmpfs(&dir.path().join("full"));
    for (args, absent) in [
        (
            &["fix", "m.onnx", "-o", "out/fixed.onnx", "--json", "full/fix.json"][..],
            &["out/fixed.onnx", "out/fixed.onnx.keep-fp32.json", "full/fix.json"][..],
        ),
        (
            &["bisect", "m.onnx", "--json", "out/r.json", "--html", "full/r.html"][..],
            &["out/r.json", "full/r.html"][..],
        ),
    ] {
        let out = layerwise(args, dir.path());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", said(&out));
        for path in absent {
            assert!(!dir.path().join(path).exists(), "{args:?} wrote {path}: {}", said(&out));
        }
        let left: Vec<_> = std::fs::read_dir(dir.path().join("out")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}
