//! Interrupts and a full disk: Ctrl-C during a run leaves no temporary file or folder and no
//! partial report; a report that cannot be written completely (no space left) leaves nothing.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::save;
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::DataType;

/// x[64,512] -> 24 x (MatMul 512x512 -> Relu) -> y: 24 MiB of weights, so that session builds and
/// runs take long enough to be interrupted in the middle.
fn slow_model(dir: &Path) {
    let mut b = ModelBuilder::new("slow", 17);
    b.input("x", DataType::Float, &[Dim::from(64), Dim::from(512)]);
    let mut prev = "x".to_string();
    for i in 0..24 {
        let w: Vec<f32> = (0..512 * 512).map(|k| (((k * 7 + i * 13) % 97) as f32 - 48.0) / 1200.0).collect();
        b.initializer(f32_tensor(&format!("w{i}"), &[512, 512], &w));
        b.node("MatMul", &format!("mm{i}"), &[&prev, &format!("w{i}")], &[&format!("m{i}")], vec![]);
        b.node("Relu", &format!("relu{i}"), &[&format!("m{i}")], &[&format!("r{i}")], vec![]);
        prev = format!("r{i}");
    }
    b.node("Identity", "out", &[&prev], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.join("slow.onnx"));
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    v.sort();
    v
}

#[test]
fn ctrl_c_leaves_no_temporary_files_and_no_partial_report() {
    let root = tempfile::tempdir().unwrap();
    let work = root.path().join("work");
    let tmp = root.path().join("tmp");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();
    slow_model(&work);
    // A complete run first: what it leaves in the temporary folder is not ours to remove (ONNX
    // Runtime 1.31 keeps a `.ses` session file there, created by every run, complete or not).
    let complete = Command::new(env!("CARGO_BIN_EXE_layerwise"))
        .args(["bisect", "slow.onnx", "--cand", "sim:fp16"])
        .current_dir(&work)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert!(matches!(complete.status.code(), Some(0) | Some(1)), "{}", common::text(&complete));
    let baseline = entries(&tmp);
    assert!(
        baseline.iter().all(|e| !e.starts_with("layerwise") && !e.starts_with(".layerwise")),
        "a complete run left {baseline:?}"
    );
    // Interrupt the moment a scratch folder appears, and later into the run.
    for delay_ms in [0u64, 30, 150] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_layerwise"))
            .args(["bisect", "slow.onnx", "--cand", "sim:fp16", "--json", "report.json", "--html", "report.html"])
            .current_dir(&work)
            .env("TMPDIR", &tmp)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while entries(&tmp) == baseline {
            assert!(child.try_wait().unwrap().is_none(), "the run ended before any temporary folder appeared");
            assert!(started.elapsed() < Duration::from_secs(60), "no temporary folder after 60 s");
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        let seen = entries(&tmp);
        let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
        assert!(kill.success());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(130) => {
                assert!(stderr.contains("interrupted; temporary files removed"), "{stderr}");
                assert_eq!(
                    entries(&work),
                    ["slow.onnx"],
                    "an interrupted run left files beside the model (temporary folder seen: {seen:?})"
                );
            }
            // The run finished before the signal arrived: its reports are complete.
            Some(0) | Some(1) => {
                assert!(work.join("report.json").exists() && work.join("report.html").exists(), "{stderr}");
                for f in ["report.json", "report.html"] {
                    std::fs::remove_file(work.join(f)).unwrap();
                }
            }
            other => panic!("exit {other:?} after Ctrl-C:\n{stderr}"),
        }
        assert_eq!(entries(&tmp), baseline, "temporary files left after Ctrl-C at +{delay_ms} ms");
        if delay_ms == 0 {
            assert_eq!(
                out.status.code(),
                Some(130),
                "interrupted with a scratch folder present ({seen:?}), the run must stop"
            );
        }
    }
}

/// A report folder on a 4 KiB tmpfs (mounted in a private user and mount namespace with
/// util-linux's `unshare`, so no privileges are needed): writing the report fails with "No space
/// left on device", the run exits 2, and the folder holds nothing afterwards.
#[test]
fn full_disk_leaves_no_partial_report() {
    let work = tempfile::tempdir().unwrap();
    save(&common::planted_layernorm(), &work.path().join("m.onnx"));
    let full = work.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=4k tmpfs {full} || exit 99; {bin} bisect m.onnx --cand sim:fp16 --json {full}/report.json; echo \"exit=$?\"; echo \"left=[$(ls -A {full})]\"",
        full = full.display(),
        bin = env!("CARGO_BIN_EXE_layerwise"),
    );
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
        .current_dir(work.path())
        .output()
        .unwrap_or_else(|e| panic!("the disk-full test needs util-linux's unshare (apt-get install util-linux): {e}"));
    let text = common::text(&out);
    assert_ne!(
        out.status.code(),
        Some(99),
        "cannot mount a tmpfs in a user namespace (unprivileged user namespaces disabled?):\n{text}"
    );
    assert!(text.contains("No space left on device"), "{text}");
    assert!(text.contains("exit=2"), "{text}");
    assert!(text.contains("left=[]"), "a partial report or temporary file was left on the full disk:\n{text}");
}

/// The processes whose command line holds `needle`.
fn processes_with(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

/// SIGINT to an interrupted `fix` alone (not its process group)
/// left its `check-load` child running after the parent had exited, with its scratch folder.
/// The child now ends with its parent (Linux's parent-death signal), cleanly. The check is made to
/// take 30 s by a test hook so that the interrupt lands while it runs.
#[test]
fn an_interrupted_fix_takes_its_load_check_child_with_it() {
    let root = tempfile::tempdir().unwrap();
    let work = root.path().join("work");
    let tmp = root.path().join("tmp");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();
    save(&layerwise::demo::demo_model(), &work.join("orphan-check.onnx"));
    let mut parent = Command::new(env!("CARGO_BIN_EXE_layerwise"))
        .args(["fix", "orphan-check.onnx", "-o", "orphan-fixed.onnx"])
        .current_dir(&work)
        .env("TMPDIR", &tmp)
        .env("LAYERWISE_TEST_CHECK_LOAD_SLEEP_MS", "30000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The child's command line names the staged model in the parent's staging folder beside -o
    // (`.layerwise-fix-*/orphan-fixed.onnx`; the parent's own names it without a folder).
    let needle = "/orphan-fixed.onnx".to_string();
    let started = Instant::now();
    while processes_with(&needle).is_empty() {
        assert!(parent.try_wait().unwrap().is_none(), "fix ended before its load check started");
        assert!(started.elapsed() < Duration::from_secs(60), "no check-load child after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = Command::new("kill").args(["-INT", &parent.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let out = parent.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    let ended = Instant::now();
    while !processes_with(&needle).is_empty() {
        assert!(ended.elapsed() < Duration::from_secs(5), "the check-load child outlived its parent by 5 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its own scratch goes with it (it ends through its SIGTERM handler).
    let deadline = Instant::now();
    let left = || {
        entries(&tmp)
            .into_iter()
            .chain(entries(&work))
            .filter(|e| e.starts_with("layerwise") || e.starts_with(".layerwise"))
            .collect::<Vec<_>>()
    };
    while !left().is_empty() {
        assert!(deadline.elapsed() < Duration::from_secs(5), "temporary files left: {:?}", left());
        std::thread::sleep(Duration::from_millis(20));
    }
}
