//! Sample sets beyond one machine: `bisect --inputs DIR --shard I/N` on each of N machines, then
//! `layerwise merge`, gives exactly the report of one run over every sample.

mod common;

use common::{assert_refused, json_without_run_info, layerwise, save, text, write_demo_samples};
use serde_json::Value;

#[test]
fn four_shards_merged_are_the_single_run_byte_for_byte_apart_from_run_info() {
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    write_demo_samples(&dir.path().join("samples"));
    let out = layerwise(&["bisect", "demo.onnx", "--inputs", "samples", "--json", "full.json"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    for i in 0..4 {
        let shard = format!("{i}/4");
        let json = format!("part{i}.json");
        let out = layerwise(&["bisect", "demo.onnx", "--inputs", "samples", "--shard", &shard, "--json", &json], dir.path());
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    }
    // Any order of the partials.
    let out = layerwise(&["merge", "part2.json", "part0.json", "part3.json", "part1.json", "--json", "merged.json", "--html", "merged.html"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "the merged verdict decides the exit code: {t}");
    let full = json_without_run_info(&dir.path().join("full.json"));
    let merged = json_without_run_info(&dir.path().join("merged.json"));
    assert_eq!(serde_json::to_string(&full).unwrap(), serde_json::to_string(&merged).unwrap(), "merged = single run");
    assert_eq!(full["samples"]["count"], 7);
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
        let out = layerwise(&["bisect", "demo.onnx", "--inputs", "samples", "--shard", &shard, "--json", &json], dir.path());
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    }
    let out = layerwise(&["bisect", "demo.onnx", "--inputs", "samples", "--json", "full.json"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["merge", "p0.json", "--json", "m.json"], "shard 1/2 is missing"),
        (vec!["merge", "p0.json", "p0.json", "--json", "m.json"], "given twice"),
        (vec!["merge", "p0.json", "full.json", "--json", "m.json"], "not a partial report"),
        (vec!["bisect", "demo.onnx", "--inputs", "samples", "--shard", "2/2"], "the index must be 0 to 1"),
        (vec!["bisect", "demo.onnx", "--inputs", "samples", "--shard", "0/9"], "use at most 7 shards"),
        (vec!["bisect", "demo.onnx", "--shard", "0/2"], "give a folder of .npz files"),
    ];
    for (args, message) in cases {
        let out = layerwise(&args, dir.path());
        assert_refused(&out, &args, message);
    }
    assert!(!dir.path().join("m.json").exists(), "nothing written on refusal");
}
