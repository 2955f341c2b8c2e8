//! Sample sets beyond one machine: `bisect --inputs DIR --shard I/N` on each of N machines, then
//! `layerwise merge`, gives exactly the report of one run over every sample.

use crate::common;
use crate::common::{assert_refused, json_without_run_info, layerwise, save, text, write_demo_samples};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

#[test]
fn four_shards_merged_are_the_single_run_byte_for_byte_apart_from_run_info() {
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    write_demo_samples(&dir.path().join("samples"));
    // The answers too (issue 56): each shard's, added up by merge as one run records them.
    let task = ["--task", "logits:classify"];
    let out = layerwise(
        &[&["bisect", "demo.onnx", "--inputs", "samples", "--json", "full.json"][..], &task].concat(),
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    for i in 0..4 {
        let shard = format!("{i}/4");
        let json = format!("part{i}.json");
        let out = layerwise(
            &[&["bisect", "demo.onnx", "--inputs", "samples", "--shard", &shard, "--json", &json][..], &task].concat(),
            dir.path(),
        );
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    }
    // Any order of the partials.
    let out = layerwise(
        &[
            "merge",
            "part2.json",
            "part0.json",
            "part3.json",
            "part1.json",
            "--json",
            "merged.json",
            "--html",
            "merged.html",
        ],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "the merged verdict decides the exit code: {t}");
    let full = json_without_run_info(&dir.path().join("full.json"));
    let merged = json_without_run_info(&dir.path().join("merged.json"));
    assert_eq!(serde_json::to_string(&full).unwrap(), serde_json::to_string(&merged).unwrap(), "merged = single run");
    assert_eq!(full["samples"]["count"], 7);
    let answers = &full["answers"][0];
    assert_eq!((answers["samples"].as_u64(), answers["cases"].as_u64()), (Some(7), Some(56)), "{answers}");
    assert!(answers["changed_cases"].as_u64() > Some(0), "the loud samples' classes change: {answers}");
    assert_eq!(full["samples"]["worst_sample"], "s1.npz", "the earliest of the equally loud samples");
    assert!(dir.path().join("merged.html").is_file());
    // A partial is not a full report: it says which share it holds.
    let part: Value = serde_json::from_slice(&std::fs::read(dir.path().join("part1.json")).unwrap()).unwrap();
    assert_eq!(part["shard"]["index"], 1);
    assert_eq!(part["shard"]["samples"].as_array().unwrap().len(), 2, "samples 1 and 5");
}

#[test]
fn merge_refuses_an_incomplete_or_mixed_set_of_shards() {
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    write_demo_samples(&dir.path().join("samples"));
    for i in 0..2 {
        let (shard, json) = (format!("{i}/2"), format!("p{i}.json"));
        let out =
            layerwise(&["bisect", "demo.onnx", "--inputs", "samples", "--shard", &shard, "--json", &json], dir.path());
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    }
    let out = layerwise(&["bisect", "demo.onnx", "--inputs", "samples", "--json", "full.json"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)));
    // Another folder of seven samples, named otherwise.
    std::fs::create_dir(dir.path().join("others")).unwrap();
    for entry in std::fs::read_dir(dir.path().join("samples")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(
            &path,
            dir.path().join("others").join(format!("o{}", path.file_name().unwrap().to_string_lossy())),
        )
        .unwrap();
    }
    let out =
        layerwise(&["bisect", "demo.onnx", "--inputs", "others", "--shard", "1/2", "--json", "o1.json"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["merge", "p0.json", "--json", "m.json"], "shard 1/2 is missing"),
        (vec!["merge", "p0.json", "p0.json", "--json", "m.json"], "given twice"),
        (vec!["merge", "p0.json", "full.json", "--json", "m.json"], "not a partial report"),
        (vec!["bisect", "demo.onnx", "--inputs", "samples", "--shard", "2/2"], "the index must be 0 to 1"),
        (vec!["bisect", "demo.onnx", "--inputs", "samples", "--shard", "0/0"], "there must be at least one shard"),
        // Shards of two folders of as many samples (the second tester, stop 49: merged without a word).
        (vec!["merge", "p0.json", "o1.json", "--json", "m.json"], "come from different sample folders"),
        (vec!["bisect", "demo.onnx", "--inputs", "samples", "--shard", "0/9"], "use at most 7 shards"),
        (vec!["bisect", "demo.onnx", "--shard", "0/2"], "give a folder of .npz files"),
    ];
    for (args, message) in cases {
        let out = layerwise(&args, dir.path());
        assert_refused(&out, &args, message);
    }
    assert!(!dir.path().join("m.json").exists(), "nothing written on refusal");
}

/// Where stderr is not a terminal (here a pipe), every long
/// step shows as a plain line, a sample set says "sample k of N" with the time left, `fix` says
/// which candidate run it is on, and `--quiet` silences all of it.
#[test]
fn progress_shows_as_plain_lines_where_stderr_is_no_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&layerwise::demo::demo_model(), &d.join("demo.onnx"));
    write_demo_samples(&d.join("samples"));
    let out = layerwise(&["bisect", "demo.onnx", "--inputs", "samples"], d);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("layerwise: sample 1 of 7 (s0.npz)"), "{err}");
    assert!(err.contains("layerwise: sample 7 of 7 (s6.npz), about"), "an estimate once a sample is done: {err}");
    assert!(
        err.lines().any(|l| l.contains("sample 3 of 7 (s2.npz), about") && l.contains(" s left: ")),
        "steps carry the sample: {err}"
    );
    let quiet = layerwise(&["bisect", "demo.onnx", "--inputs", "samples", "--quiet"], d);
    assert!(
        !String::from_utf8_lossy(&quiet.stderr).contains("layerwise: "),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
    let fix = layerwise(&["fix", "demo.onnx"], d);
    let err = String::from_utf8_lossy(&fix.stderr).to_string();
    assert!(
        err.contains("layerwise: candidate run 1 (keeping 0 nodes in FP32)")
            && err.contains("layerwise: candidate run 2"),
        "{err}"
    );
}

/// The demo model in `d`, and three seeded samples of small values (all within tolerance) in
/// `d/folder/{prefix}{k}.npz`, each changed by `edit(k, values)` first.
fn quiet_demo_samples(d: &Path, folder: &str, prefix: &str, edit: impl Fn(u64, &mut [f32])) {
    use rand::{Rng, SeedableRng};
    save(&layerwise::demo::demo_model(), &d.join("demo.onnx"));
    std::fs::create_dir_all(d.join(folder)).unwrap();
    for k in 0..3u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(k);
        let mut values: Vec<f32> = (0..8 * 64).map(|_| rng.random::<f32>() * 0.01).collect();
        edit(k, &mut values);
        let x = layerwise_runtime::Tensor::f32(vec![1, 8, 64], values);
        layerwise_runtime::npy::write_npz(&d.join(format!("{folder}/{prefix}{k}.npz")), &[("x", &x)]).unwrap();
    }
}

/// On a sample set where every output passes, each sample's
/// worst output error is its largest output error (not 0 for "no failing output").
#[test]
fn a_passing_sample_set_reports_each_samples_real_output_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    quiet_demo_samples(d, "quiet", "q", |_, _| {});
    let out = layerwise(&["bisect", "demo.onnx", "--inputs", "quiet", "--json", "r.json"], d);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let r = json_without_run_info(&d.join("r.json"));
    let runs = r["samples"]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    for run in runs {
        let e = run["worst_output_error"].as_f64().unwrap();
        assert!(e > 0.0 && e < 1e-2, "a passing sample still has an output error: {run}");
    }
}

/// A sample whose inputs hold NaN, inside a set,
/// passed with "rel L2 0" and no word, where a run of that sample alone warns. Its run now says
/// how many input values are not finite, in the JSON and on the terminal; the others say nothing.
#[test]
fn a_sample_whose_inputs_are_not_finite_says_so_inside_a_set() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    quiet_demo_samples(d, "set", "s", |k, values| {
        if k == 1 {
            values.iter_mut().take(40).for_each(|v| *v = f32::NAN);
            values[100] = f32::INFINITY;
        }
    });
    let out = layerwise(&["bisect", "demo.onnx", "--inputs", "set", "--json", "r.json"], d);
    assert!(out.status.code().is_some_and(|c| c <= 1), "{}", text(&out));
    let r = json_without_run_info(&d.join("r.json"));
    let runs = r["samples"]["runs"].as_array().unwrap();
    let flagged: Vec<(&str, u64)> =
        runs.iter().filter_map(|run| Some((run["sample"].as_str()?, run.get("nonfinite_inputs")?.as_u64()?))).collect();
    assert_eq!(flagged, vec![("s1.npz", 41)], "only the sample with NaN/inf inputs, with their count: {runs:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("s1.npz"))
        .unwrap_or_else(|| panic!("a line for s1.npz: {stdout}"));
    assert!(line.contains("WARNING: 41 NaN/inf input values"), "{line}");
    assert!(!stdout.lines().any(|l| l.trim_start().starts_with("s0.npz") && l.contains("WARNING")), "{stdout}");
}

/// A sample of NaN makes every output value NaN
/// on both sides, which matched as equal and read "PASS - all model outputs are within tolerance".
/// Nothing of such an output is judged, and the headline, the summary and the JSON say so.
#[test]
fn an_output_that_is_nan_on_both_sides_is_not_called_within_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&layerwise::demo::demo_model(), &d.join("demo.onnx"));
    let x = layerwise_runtime::Tensor::f32(vec![1, 8, 64], vec![f32::NAN; 8 * 64]);
    layerwise_runtime::npy::write_npz(&d.join("nan.npz"), &[("x", &x)]).unwrap();
    let out = layerwise(
        &["bisect", "demo.onnx", "--inputs", "nan.npz", "--json", "r.json", "--html", "r.html", "--markdown", "r.md"],
        d,
    );
    let t = text(&out);
    assert!(
        t.contains("VERDICT: PASS - nothing judged: every value of 'logits', 'features' is NaN or inf on both sides"),
        "{t}"
    );
    assert!(!t.contains("within tolerance"), "no output is called within tolerance: {t}");
    let r = json_without_run_info(&d.join("r.json"));
    assert_eq!(r["outputs"][0]["unjudged"], true, "{}", r["outputs"]);
    assert!(r["verdict"]["summary"].as_str().unwrap().starts_with("nothing was judged"), "{}", r["verdict"]["summary"]);
    // Every medium's heading says it, not a bare pass.
    let html = std::fs::read_to_string(d.join("r.html")).unwrap();
    assert!(html.contains("<h1>PASS - nothing judged</h1>"), "the HTML heading");
    let md = std::fs::read_to_string(d.join("r.md")).unwrap();
    assert!(md.starts_with("## layerwise: ⚠️ PASS - nothing judged"), "{md}");
}

/// A run that fails on one sample of a set (ONNX
/// Runtime refusing a Reshape for that sample's batch size) said nothing of which sample.
#[test]
fn a_run_that_fails_on_one_sample_of_a_set_names_it() {
    use layerwise_model::builder::{i64_tensor, Dim, ModelBuilder};
    use layerwise_model::onnx::tensor_proto::DataType;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut b = ModelBuilder::new("reshape-to-eight", 17);
    b.input("x", DataType::Float, &[Dim::from("n"), Dim::from(4)])
        .initializer(i64_tensor("eight", &[1], &[8]))
        .node("Relu", "relu", &["x"], &["r"], vec![])
        .node("Reshape", "reshape", &["r", "eight"], &["y"], vec![])
        .output("y", DataType::Float);
    save(&b.build(), &d.join("m.onnx"));
    std::fs::create_dir_all(d.join("set")).unwrap();
    for (k, n) in [(0, 2usize), (1, 2), (2, 1)] {
        let x = layerwise_runtime::Tensor::f32(vec![n, 4], (0..n * 4).map(|i| i as f32 * 0.1).collect());
        layerwise_runtime::npy::write_npz(&d.join(format!("set/s{k}.npz")), &[("x", &x)]).unwrap();
    }
    let out = layerwise(&["bisect", "m.onnx", "--inputs", "set", "--json", "r.json"], d);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("error: sample s2.npz: "), "{t}");
    assert!(!d.join("r.json").exists(), "no report");
    let out = layerwise(&["fix", "m.onnx", "--inputs", "set", "-o", "f.onnx"], d);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("error: sample s2.npz: "), "fix too: {t}");
    assert!(!d.join("f.onnx").exists(), "no model written");
}

/// Issue "a newcomer's day", beyond the anchor: a data loader script, as Polygraphy's
/// `--data-loader-script`: its function yields input dicts, each one sample, for bisect and fix,
/// without writing npz files; a missing function is a clear error.
#[test]
fn a_data_loader_script_gives_the_samples() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&layerwise::demo::demo_model(), &d.join("demo.onnx"));
    std::fs::write(
        d.join("loader.py"),
        "import numpy as np\n\ndef load_data():\n    rng = np.random.default_rng(0)\n    for scale in (0.01, 1.0, 0.5):\n        yield {\"x\": (rng.random((1, 8, 64)) * scale).astype(np.float32)}\n\ndef quiet():\n    yield {\"x\": np.full((1, 8, 64), 0.01, np.float32)}\n",
    )
    .unwrap();
    let python_path = common::numpy_for_tests();
    let layerwise = |args: &[&str], cwd: &Path| {
        Command::new(env!("CARGO_BIN_EXE_layerwise"))
            .args(args)
            .current_dir(cwd)
            .env("PYTHONPATH", &python_path)
            .output()
            .unwrap()
    };
    let out = layerwise(&["bisect", "demo.onnx", "--data-loader-script", "loader.py", "--json", "r.json"], d);
    assert_eq!(out.status.code(), Some(1), "the loud samples diverge: {}", text(&out));
    let r = json_without_run_info(&d.join("r.json"));
    assert_eq!(r["samples"]["count"], 3, "{}", r["samples"]);
    // The samples' scratch folder has a new name each run; the report names the script (found by
    // the independent tester, stop 49: two identical runs differed there).
    assert!(
        r["inputs"][0]["source"].as_str().is_some_and(|s| s.starts_with("data loader loader.py: ")),
        "{}",
        r["inputs"]
    );
    layerwise(&["bisect", "demo.onnx", "--data-loader-script", "loader.py", "--json", "again.json"], d);
    assert_eq!(json_without_run_info(&d.join("again.json")), r, "the same run, the same report");
    let out = layerwise(&["fix", "demo.onnx", "--data-loader-script", "loader.py:quiet", "--json", "f.json"], d);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let missing = layerwise(&["bisect", "demo.onnx", "--data-loader-script", "loader.py:nope"], d);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(text(&missing).contains("loader.py defines no function 'nope'"), "{}", text(&missing));
    let both = layerwise(&["bisect", "demo.onnx", "--data-loader-script", "loader.py", "--inputs", "x.npz"], d);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both));
}

/// `--devices` on the CPU: the same spreading over jobs run at once (there one per GPU), so that
/// the shared queue, the one follow-up run and the merged report are checked without a GPU.
fn spread_options(dir: &Path) -> layerwise::pipeline::BisectOptions {
    let mut options = layerwise::pipeline::BisectOptions::new(
        dir.join("demo.onnx"),
        common::spec("ort:cpu"),
        common::spec("sim:fp16"),
    );
    options.inputs.npz = Some(dir.join("samples"));
    options
}

#[test]
fn samples_spread_over_jobs_at_once_report_what_one_run_reports() {
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    write_demo_samples(&dir.path().join("samples"));
    let options = spread_options(dir.path());
    let single = layerwise::pipeline::bisect(&options).unwrap().report;
    let jobs = (0..3).map(|j| (format!("job {j}"), options.clone())).collect();
    let mut spread = layerwise::pipeline::devices::spread_over_jobs(&options, jobs).unwrap();
    let note = spread.cand.notes.pop().unwrap();
    assert!(
        note.starts_with("7 samples spread over 3 jobs at once with --devices, taken from one queue (job 0 ran "),
        "{note}"
    );
    let counts = note.split_once('(').and_then(|(_, rest)| rest.split_once(')')).unwrap().0;
    let ran: usize = counts
        .split(" ran ")
        .skip(1)
        .map(|s| s.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse::<usize>().unwrap())
        .sum();
    assert_eq!(ran, 7, "every sample once: {note}");
    assert!(note.contains("the steps after the walk ran once, on job "), "{note}");
    let without_run_info = |r: &layerwise_report::Report| {
        let mut v = serde_json::to_value(r).unwrap();
        v.as_object_mut().unwrap().remove("run_info");
        v
    };
    let (a, b) = (without_run_info(&single), without_run_info(&spread));
    assert_eq!(a["samples"]["worst_sample"], "s1.npz", "the earliest of the equally loud samples");
    assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap(), "spread over jobs = one run");
}

#[test]
fn a_job_that_fails_stops_the_others_and_its_error_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    write_demo_samples(&dir.path().join("samples"));
    let options = spread_options(dir.path());
    let broken =
        layerwise::pipeline::BisectOptions { cand_model: Some(dir.path().join("absent.onnx")), ..options.clone() };
    let jobs = vec![
        ("job 0".to_string(), options.clone()),
        ("job 1".to_string(), broken),
        ("job 2".to_string(), options.clone()),
    ];
    let error = layerwise::pipeline::devices::spread_over_jobs(&options, jobs).unwrap_err();
    let text = format!("{error:#}");
    assert!(text.starts_with("the job on job 1: ") && text.contains("absent.onnx"), "{text}");
}
