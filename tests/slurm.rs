//! Sample sets on a real scheduler: `scripts/slurm/submit.sh`, the script docs/bisect.md shows,
//! submits `bisect --inputs DIR --shard I/N` as a Slurm array job and `layerwise merge` after it,
//! here on a single-node cluster on localhost (`scripts/slurm/start-local-cluster.sh` starts one;
//! .ci/run does). The merged report must be the single run's, apart from `run_info`.

mod common;

use common::{json_without_run_info, layerwise, save, text, write_demo_samples};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SCRIPTS: [&str; 3] = ["scripts/slurm/submit.sh", "scripts/slurm/bisect-array.sh", "scripts/slurm/merge.sh"];
const SHARDS: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(600);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn docs_show_exactly_the_slurm_scripts_the_test_submits() {
    let docs = std::fs::read_to_string(repo().join("docs/bisect.md")).unwrap();
    for path in SCRIPTS {
        let script = std::fs::read_to_string(repo().join(path)).unwrap();
        let block = format!("`{path}`:\n\n```sh\n{script}```\n");
        assert!(
            docs.contains(&block),
            "docs/bisect.md must show {path} as it is: a line `{path}`: and a ```sh block with the file's text"
        );
    }
}

/// Runs a Slurm client command; a missing one fails the test with how to get it.
fn slurm(program: &str, args: &[&str]) -> std::process::Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| {
        panic!(
            "{program}: {e}. This test needs Slurm's client commands and a running cluster: on Debian, as root, \
             'apt-get install slurm-wlm munge' and then 'scripts/slurm/start-local-cluster.sh' (.ci/run does both)"
        )
    })
}

/// `scontrol show job -o ID`: one line per job (per task of an array job), with `JobState=` and
/// `ExitCode=`.
fn job_lines(id: &str) -> Vec<String> {
    let out = slurm("scontrol", &["show", "job", "-o", id]);
    assert!(out.status.success(), "scontrol show job {id}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {name} in: {line}"))
}

/// The jobs' output, for a failure's message.
fn logs(out: &Path) -> String {
    let mut all = String::new();
    if let Ok(entries) = std::fs::read_dir(out.join("logs")) {
        let mut paths: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        paths.sort();
        for p in paths {
            all += &format!("--- {}\n{}\n", p.display(), std::fs::read_to_string(&p).unwrap_or_default());
        }
    }
    all
}

#[test]
#[ignore = "needs a local Slurm cluster: run scripts/slurm/start-local-cluster.sh; .ci/run does"]
fn the_documented_array_job_and_merge_on_slurm_give_the_single_runs_report() {
    let version = slurm("sbatch", &["--version"]);
    assert!(version.status.success(), "sbatch --version: {}", text(&version));
    let ping = slurm("scontrol", &["ping"]);
    assert!(
        ping.status.success() && text(&ping).contains("is UP"),
        "no slurmctld answers ('scontrol ping': {}): start one with scripts/slurm/start-local-cluster.sh (as root)",
        text(&ping).trim()
    );
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    write_demo_samples(&dir.path().join("samples"));
    let single = layerwise(&["bisect", "demo.onnx", "--inputs", "samples", "--json", "single.json"], dir.path());
    assert_eq!(single.status.code(), Some(1), "{}", text(&single));

    // The documented submission, as a user types it, from the folder that holds model and samples.
    let shards = SHARDS.to_string();
    let submitted = Instant::now();
    let submit = Command::new(repo().join("scripts/slurm/submit.sh"))
        .args(["demo.onnx", "samples", &shards, "out"])
        .env("LAYERWISE", env!("CARGO_BIN_EXE_layerwise"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let said = text(&submit);
    assert!(submit.status.success(), "submit.sh: {said}");
    let ids: Vec<&str> = ["shards=", "merge="]
        .iter()
        .map(|k| said.split_whitespace().find_map(|w| w.strip_prefix(k)).unwrap_or_else(|| panic!("no {k} in: {said}")))
        .collect();
    let (shards_job, merge_job) = (ids[0], ids[1]);
    let out = dir.path().join("out");

    // Wait until neither job is pending or running (squeue lists only those).
    loop {
        let q = slurm("squeue", &["-h", "-o", "%i %T %r", "-j", &format!("{shards_job},{merge_job}")]);
        let listed = String::from_utf8_lossy(&q.stdout).trim().to_string();
        if q.status.success() && listed.is_empty() {
            break;
        }
        assert!(q.status.success(), "squeue: {}", text(&q));
        assert!(
            !listed.contains("DependencyNeverSatisfied"),
            "a shard failed, so the merge never runs:\n{listed}\n{}",
            logs(&out)
        );
        assert!(started.elapsed() < TIMEOUT, "still queued after {TIMEOUT:?}:\n{listed}\n{}", logs(&out));
        std::thread::sleep(Duration::from_millis(500));
    }

    let on_slurm = submitted.elapsed();

    // Every shard succeeded; the merge exits as one run does: 1, the report diverges.
    let tasks = job_lines(shards_job);
    assert_eq!(tasks.len(), SHARDS, "{tasks:?}");
    for t in &tasks {
        assert_eq!((field(t, "JobState"), field(t, "ExitCode")), ("COMPLETED", "0:0"), "{t}\n{}", logs(&out));
    }
    let merge = job_lines(merge_job);
    assert_eq!(merge.len(), 1, "{merge:?}");
    assert_eq!(
        (field(&merge[0], "JobState"), field(&merge[0], "ExitCode")),
        ("FAILED", "1:0"),
        "{}\n{}",
        merge[0],
        logs(&out)
    );

    let parts: Vec<_> = (0..SHARDS).map(|i| out.join(format!("parts/part-{i}.json"))).collect();
    assert!(parts.iter().all(|p| p.is_file()), "{parts:?}\n{}", logs(&out));
    let single = json_without_run_info(&dir.path().join("single.json"));
    let merged = json_without_run_info(&out.join("report.json"));
    assert_eq!(
        serde_json::to_string(&single).unwrap(),
        serde_json::to_string(&merged).unwrap(),
        "merged on Slurm = single run"
    );
    assert_eq!(merged["samples"]["count"], 7);
    assert!(out.join("report.html").is_file());
    let (all, slurm) = (started.elapsed().as_secs_f64(), on_slurm.as_secs_f64());
    eprintln!("{}: 7 samples, {SHARDS} shards and the merge: {slurm:.1} s from submission to the end of the merge; {all:.1} s in all", text(&version).trim());
}
