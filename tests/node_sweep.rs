//! No crash on any model (opt-in, `.ci/run` runs it): every ONNX 1.20.1 backend node test through
//! four commands as a user runs them, as separate processes so that a crash is seen as one,
//! with layerwise's own seeded random inputs (not the test's):
//! `convert --to fp16`; `bisect --cand ort:cpu --cand-model` on that conversion with every
//! intermediate tensor renamed (structural matching); `bisect --repro DIR`; `fix -o`.
//! Every exit must be 0, 1 or 2 with no panic text. The summary (runs, exits by code, reasons for
//! exit 2 grouped) is printed and written to target/test-output/node-sweep.md.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use layerwise_model::onnx::{GraphProto, ModelProto};
use layerwise_model::Model;
use prost::Message;
use rayon::prelude::*;

fn node_tests() -> PathBuf {
    if let Some(dir) = std::env::var_os("LAYERWISE_ONNX_NODE_TESTS") {
        return PathBuf::from(dir);
    }
    let dir = layerwise_runtime::ortlib::cache_dir().join("onnx-1.20.1-node-tests");
    assert!(dir.is_dir(), "{} is missing: run `cargo test --test tests onnx_node_suite::` first (it fetches ONNX 1.20.1's node tests with pip), or set LAYERWISE_ONNX_NODE_TESTS", dir.display());
    dir
}

/// Every intermediate tensor of the main graph and its bodies renamed `lw_r{i}` (graph inputs and
/// outputs keep their names, so the model is fed and judged as before).
fn renamed(proto: &ModelProto) -> ModelProto {
    let mut out = proto.clone();
    let g = out.graph.as_mut().unwrap();
    let keep: std::collections::HashSet<String> = g
        .input
        .iter()
        .chain(&g.output)
        .map(|v| v.name().to_string())
        .chain(g.initializer.iter().map(|t| t.name().to_string()))
        .collect();
    let mut map: HashMap<String, String> = HashMap::new();
    for n in &g.node {
        for o in n.output.iter().filter(|o| !o.is_empty() && !keep.contains(*o)) {
            let next = format!("lw_r{}", map.len());
            map.entry(o.clone()).or_insert(next);
        }
    }
    fn apply(g: &mut GraphProto, map: &HashMap<String, String>) {
        for n in g.node.iter_mut() {
            for t in n.input.iter_mut().chain(n.output.iter_mut()) {
                if let Some(new) = map.get(t) {
                    *t = new.clone();
                }
            }
            for a in n.attribute.iter_mut() {
                for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                    apply(sub, map);
                }
            }
        }
        for v in g.value_info.iter_mut() {
            if let Some(new) = map.get(v.name()) {
                v.name = Some(new.clone());
            }
        }
    }
    apply(g, &map);
    out
}

struct Run {
    command: &'static str,
    test: String,
    code: Option<i32>,
    panicked: bool,
    first_error: String,
}

fn layerwise(args: &[&str], dir: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_layerwise")).args(args).current_dir(dir).output().unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// An exit-2 message grouped: its first line after "error: ", names in quotes and numbers removed.
fn reason(text: &str) -> String {
    let line = text.lines().find(|l| l.starts_with("error:")).unwrap_or("").trim_start_matches("error:").trim();
    let mut out = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push_str(if quoted { "'…" } else { "'" });
            }
            _ if quoted => {}
            '0'..='9' => {
                if !out.ends_with('N') {
                    out.push('N');
                }
            }
            _ => out.push(c),
        }
    }
    out.chars().take(150).collect()
}

fn sweep_one(test_dir: &Path) -> Vec<Run> {
    let name = test_dir.file_name().unwrap().to_string_lossy().to_string();
    let work = tempfile::tempdir().unwrap();
    let model = test_dir.join("model.onnx");
    std::fs::copy(&model, work.path().join("m.onnx")).unwrap();
    let mut runs = Vec::new();
    let mut record = |command: &'static str, (code, text): (Option<i32>, String)| {
        runs.push(Run {
            command,
            test: name.clone(),
            code,
            panicked: text.contains("panicked"),
            first_error: if code == Some(2) { reason(&text) } else { String::new() },
        });
    };
    let converted = layerwise(&["convert", "m.onnx", "--to", "fp16", "-o", "c.onnx"], work.path());
    let converted_ok = converted.0 == Some(0);
    record("convert", converted);
    if converted_ok {
        let proto = Model::load(&work.path().join("c.onnx")).unwrap().proto;
        std::fs::write(work.path().join("r.onnx"), renamed(&proto).encode_to_vec()).unwrap();
        record(
            "bisect --cand-model (renamed)",
            layerwise(&["bisect", "m.onnx", "--cand", "ort:cpu", "--cand-model", "r.onnx"], work.path()),
        );
    }
    record("bisect --repro", layerwise(&["bisect", "m.onnx", "--repro", "repro"], work.path()));
    record("fix -o", layerwise(&["fix", "m.onnx", "-o", "f.onnx"], work.path()));
    runs
}

#[test]
#[ignore = "opt-in: about 6,600 layerwise processes over ONNX's node tests; .ci/run runs it (release build) with --include-ignored"]
fn every_node_test_through_every_command_exits_0_1_or_2() {
    let root = node_tests();
    let filter = std::env::var("LAYERWISE_SWEEP_FILTER").unwrap_or_default();
    let mut tests: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    tests.retain(|p| p.file_name().unwrap().to_string_lossy().contains(&filter));
    tests.sort();
    let started = std::time::Instant::now();
    let runs: Vec<Run> = tests.par_iter().flat_map(|t| sweep_one(t)).collect();
    let mut by_code: BTreeMap<String, usize> = BTreeMap::new();
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut bad: Vec<String> = Vec::new();
    for r in &runs {
        *by_code
            .entry(match r.code {
                Some(c) => format!("exit {c}"),
                None => "killed by a signal".into(),
            })
            .or_default() += 1;
        if r.code == Some(2) {
            *reasons.entry(r.first_error.clone()).or_default() += 1;
        }
        if !matches!(r.code, Some(0..=2)) || r.panicked {
            bad.push(format!(
                "{} ({}): exit {:?}{}",
                r.test,
                r.command,
                r.code,
                if r.panicked { ", panic text" } else { "" }
            ));
        }
    }
    let mut summary = format!(
        "# Node-test sweep\n\n{} node tests, {} runs in {:.0} s: {}\n\n| reason for exit 2 | runs |\n| --- | --- |\n",
        tests.len(),
        runs.len(),
        started.elapsed().as_secs_f64(),
        by_code.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
    );
    let mut sorted: Vec<(&String, &usize)> = reasons.iter().collect();
    sorted.sort_by(|a, b| b.1.cmp(a.1));
    for (why, n) in sorted {
        summary.push_str(&format!("| {} | {n} |\n", why.replace('|', "\\|")));
    }
    println!("{summary}");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../test-output");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("node-sweep.md"), &summary).unwrap();
    assert!(bad.is_empty(), "{} runs crashed or panicked:\n{}", bad.len(), bad.join("\n"));
}
