//! What one part of layerwise said against another.
//!
//! - D14: a graph input passed straight through as a graph output was left out of the comparison
//!   (no run returns it), so `bisect` said PASS, `fix` said NOT FIXED ("'x' rel L2 nan") and wrote
//!   nothing, and beside a diverging output the verdict listed `'x' (rel L2 nan)` as out of
//!   tolerance while the JSON said `compared: false`. Such an output is now compared on the value
//!   each side was fed (exact, or rounded where a candidate model declares the input FP16), the
//!   same in every format and in `fix`. A weight passed straight to an output is compared by no
//!   run: every format says so, and no summary claims it.
//! - A data loader script that ended Python (an exit or an exception at import) was reported as
//!   "--inputs /tmp/layerwise-data-XXX: the folder holds no .npz files", an option and a folder the
//!   user never gave. It is now the script's failure, with its exit status and the end of its
//!   stderr.

use std::path::Path;
use std::process::Command;

use crate::common;
use crate::common::{json, layerwise, save, text};
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::DataType;

/// x[1,4] -> `op` -> y; outputs: x itself and y (x listed first, as the model).
fn passed_through(scale: Option<f32>) -> ModelProto {
    let mut b = ModelBuilder::new("pass-through", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    match scale {
        Some(k) => {
            b.initializer(f32_tensor("k", &[1], &[k]));
            b.node("Mul", "mul", &["x", "k"], &["y"], vec![]);
        }
        None => {
            b.node("Relu", "relu", &["x"], &["y"], vec![]);
        }
    }
    b.output("x", DataType::Float);
    b.output("y", DataType::Float);
    b.build()
}

/// The outputs section of a report, by name: (compared, pass, rel_l2_err).
fn outputs(report: &serde_json::Value) -> Vec<(String, bool, bool, serde_json::Value)> {
    report["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["name"].as_str().unwrap().to_string(),
                o["compared"].as_bool().unwrap(),
                o["pass"].as_bool().unwrap(),
                o["rel_l2_err"].clone(),
            )
        })
        .collect()
}

/// The CSV row of `tensor` as (column -> value) (its cells hold no comma or quote here).
fn csv_row(csv: &Path, tensor: &str) -> Option<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(csv).unwrap();
    let mut lines = text.lines();
    let headers: Vec<&str> = lines.next()?.split(',').collect();
    let row: Vec<&str> = lines.map(|l| l.split(',').collect::<Vec<_>>()).find(|r| r.get(1) == Some(&tensor))?;
    Some(headers.iter().map(|h| h.to_string()).zip(row.iter().map(|v| v.to_string())).collect())
}

/// D14: `bisect` compares an input passed straight to an output (exactly: both sides return what
/// they were fed), in the paired session and after separate runs, and every format says so: the
/// headline, JSON, Markdown, CSV and HTML.
#[test]
fn a_passed_through_input_is_compared_exactly_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&passed_through(None), &d.join("m.onnx"));
    for separate in [false, true] {
        let mut args =
            vec!["bisect", "m.onnx", "--json", "r.json", "--markdown", "r.md", "--csv", "r.csv", "--html", "r.html"];
        if separate {
            args.push("--separate-runs");
        }
        let out = layerwise(&args, d);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(0), "{said}");
        assert!(said.contains("VERDICT: PASS - all 2 model outputs are within tolerance"), "{said}");
        let r = json(&d.join("r.json"));
        let x = outputs(&r).into_iter().find(|o| o.0 == "x").unwrap();
        assert!(x.1 && x.2, "x is compared and passes (separate runs: {separate}): {x:?}");
        assert_eq!(x.3.as_f64(), Some(0.0), "both sides return the input as fed: {x:?}");
        assert!(r["not_compared"].as_array().unwrap().iter().all(|n| n["tensor"] != "x"), "{}", r["not_compared"]);
        let row = csv_row(&d.join("r.csv"), "x").expect("a CSV row for x");
        assert_eq!(
            (row["is_output"].as_str(), row["pass"].as_str(), row["rel_l2_err"].as_str()),
            ("true", "true", "0.0"),
            "{row:?}"
        );
        let md = std::fs::read_to_string(d.join("r.md")).unwrap();
        assert!(md.contains("✅ PASS") && md.contains("| `x` | input | 0 |"), "{md}");
        let html = std::fs::read_to_string(d.join("r.html")).unwrap();
        assert!(html.contains("all model outputs are within tolerance"), "the HTML verdict");
        // The report read back renders the same headline.
        let again = layerwise(&["report", "r.json", "--markdown", "again.md"], d);
        assert_eq!(again.status.code(), Some(0), "{}", text(&again));
        assert_eq!(std::fs::read_to_string(d.join("again.md")).unwrap(), md);
    }
}

/// D14: beside an output that overflows FP16 (`y = x * 7e4`), the passed-through `x` is not
/// listed as out of tolerance ("'x' (rel L2 nan)" while the JSON said `compared: false`).
#[test]
fn a_passed_through_input_beside_a_diverging_output_is_within_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&passed_through(Some(7e4)), &d.join("m.onnx"));
    for mark in ["all", "search"] {
        let out = layerwise(&["bisect", "m.onnx", "--mark", mark, "--json", "r.json"], d);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(
            said.contains("VERDICT: DIVERGED - 1 of 2 outputs out of tolerance: 'y' (rel L2 inf)"),
            "--mark {mark}: {said}"
        );
        assert!(!said.contains("'x' (rel L2"), "{said}");
        let r = json(&d.join("r.json"));
        let x = outputs(&r).into_iter().find(|o| o.0 == "x").unwrap();
        assert!(x.1 && x.2, "--mark {mark}: {x:?}");
        assert_eq!(r["verdict"]["worst_output"], "y");
        assert_eq!(r["verdict"]["first_divergent"]["node"], "mul", "--mark {mark}");
    }
    // The counterfactual's "fixes every output" counts x as the fixed model would hold it.
    let out = layerwise(&["bisect", "m.onnx", "--json", "r.json"], d);
    let r = json(&d.join("r.json"));
    assert_eq!(r["counterfactual"]["checks"][0]["fixes"], true, "{}: {}", r["counterfactual"], text(&out));
}

/// D14: a model whose only output is its input passed through: compared (it was "no model output
/// could be compared", exit 2).
#[test]
fn a_model_that_only_passes_its_input_through_is_compared() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut b = ModelBuilder::new("identity-graph", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.output("x", DataType::Float);
    save(&b.build(), &d.join("m.onnx"));
    let out = layerwise(&["bisect", "m.onnx", "--json", "r.json"], d);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(outputs(&json(&d.join("r.json")))[0].1);
    let out = layerwise(&["fix", "m.onnx", "-o", "fixed.onnx"], d);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("FIX: FIXED"), "{}", text(&out));
}

/// D14: `fix` on a model with a passed-through output: FIXED (nothing to keep), its check passes on
/// that output too, and the model and its keep list are written (it said NOT FIXED, "'x' rel L2
/// nan", "check: FAIL", and wrote nothing).
#[test]
fn fix_checks_a_passed_through_output_and_writes_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&passed_through(None), &d.join("m.onnx"));
    let out = layerwise(&["fix", "m.onnx", "-o", "fixed.onnx", "--json", "fix.json"], d);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("FIX: FIXED") && !said.contains("FAIL") && !said.contains("nan"), "{said}");
    assert!(d.join("fixed.onnx").is_file() && d.join("fixed.onnx.keep-fp32.json").is_file(), "{said}");
    let f = json(&d.join("fix.json"));
    assert_eq!(f["status"], "fixed");
    let check = &f["fixed_model_check"];
    assert_eq!(check["pass"], true, "{check}");
    for table in [&f["outputs"], &check["outputs"]] {
        let x = table.as_array().unwrap().iter().find(|o| o["name"] == "x").unwrap_or_else(|| panic!("x in {table}"));
        assert_eq!((x["after_rel_l2"].as_f64(), x["after_pass"].as_bool()), (Some(0.0), Some(true)), "{x}");
    }
}

/// D14 on a candidate model that declares its input FP16 (`convert --fp16-io`): the candidate
/// returns the input as it stored it, rounded to FP16, and that is what is compared.
#[test]
fn a_candidate_model_with_an_fp16_input_returns_it_rounded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&passed_through(None), &d.join("m.onnx"));
    let out = layerwise(&["convert", "m.onnx", "--fp16-io", "-o", "m16.onnx"], d);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for separate in [false, true] {
        let mut args = vec!["bisect", "m.onnx", "--cand", "ort:cpu", "--cand-model", "m16.onnx", "--json", "r.json"];
        if separate {
            args.push("--separate-runs");
        }
        let out = layerwise(&args, d);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let r = json(&d.join("r.json"));
        let x = r["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "x")
            .unwrap_or_else(|| panic!("x compared: {}", r["outputs"]))
            .clone();
        assert_eq!(x["cand_dtype"], "float16", "{x}");
        let e = x["metrics"]["rel_l2_err"].as_f64().unwrap();
        assert!(e > 0.0 && e < 1e-3, "FP16 rounding of the input: {e}");
    }
}

/// A weight passed straight to an output is compared by no run: the headline, the summary (so
/// Markdown and HTML), the JSON and `fix` all say so, and none claims "all model outputs" (the
/// headline said "all 2 model outputs are within tolerance" beside `compared: false`; `fix` said
/// NOT FIXED, "'w' rel L2 nan").
#[test]
fn a_weight_output_is_said_not_compared_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut b = ModelBuilder::new("weight-output", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(f32_tensor("w", &[4], &[1.0, 2.0, 3.0, 4.0]));
    b.node("Relu", "relu", &["x"], &["y"], vec![]);
    b.output("w", DataType::Float);
    b.output("y", DataType::Float);
    save(&b.build(), &d.join("m.onnx"));
    for args in [&["--separate-runs"][..], &[][..], &["--mark", "search"][..]] {
        let mut all = vec!["bisect", "m.onnx", "--json", "r.json", "--markdown", "r.md", "--html", "r.html"];
        all.extend(args);
        let out = layerwise(&all, d);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(0), "{said}");
        assert!(
            said.contains("VERDICT: PASS - all 1 compared model outputs are within tolerance; not compared: 'w'"),
            "{args:?}: {said}"
        );
        assert!(!said.contains("all 2 model outputs"), "{said}");
        let r = json(&d.join("r.json"));
        let w = outputs(&r).into_iter().find(|o| o.0 == "w").unwrap();
        assert!(!w.1, "{w:?}");
        let reason = r["not_compared"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["tensor"] == "w")
            .unwrap_or_else(|| panic!("{args:?}: w in not_compared: {}", r["not_compared"]))["reason"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(reason.contains("a weight (initializer) passed straight to the output"), "{reason}");
        let summary = r["verdict"]["summary"].as_str().unwrap();
        assert!(
            summary
                .starts_with("all compared model outputs are within tolerance; output 'w' was not compared: a weight"),
            "{summary}"
        );
        for file in ["r.md", "r.html"] {
            assert!(std::fs::read_to_string(d.join(file)).unwrap().contains("output 'w' was not compared"), "{file}");
        }
    }
    let out = layerwise(&["fix", "m.onnx", "-o", "fixed.onnx", "--json", "fix.json"], d);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("FIX: FIXED - all compared outputs are within tolerance")
            && said.contains("output 'w' was not compared"),
        "{said}"
    );
    assert!(!said.contains("FAIL"), "{said}");
    assert!(d.join("fixed.onnx").is_file());
    let f = json(&d.join("fix.json"));
    assert_eq!(f["fixed_model_check"]["pass"], true);
    assert!(
        f["outputs"].as_array().unwrap().iter().all(|o| o["name"] != "w"),
        "w is in no table of errors: {}",
        f["outputs"]
    );
}

/// An output listed twice is one output in the verdict: a diverging one is named once.
#[test]
fn an_output_listed_twice_is_named_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut b = ModelBuilder::new("twice", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(f32_tensor("k", &[1], &[7e4]));
    b.node("Mul", "mul", &["x", "k"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.output("y", DataType::Float);
    save(&b.build(), &d.join("m.onnx"));
    let out = layerwise(&["bisect", "m.onnx"], d);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("VERDICT: DIVERGED - 1 of 1 outputs out of tolerance: 'y' (rel L2 inf)\n"), "{said}");
    // The JSON lists it once too.
    let out = layerwise(&["bisect", "m.onnx", "--json", "r.json"], d);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(json(&d.join("r.json"))["outputs"].as_array().unwrap().len(), 1);
    // convert and fix write one Cast back for it (they failed with "'y__fp16' is produced by two
    // nodes").
    let out = layerwise(&["convert", "m.onnx", "--to", "fp16", "--allow-weight-overflow", "-o", "m16.onnx"], d);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = layerwise(&["fix", "m.onnx", "-o", "fixed.onnx", "--json", "fix.json"], d);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(d.join("fixed.onnx").is_file());
    assert_eq!(json(&d.join("fix.json"))["outputs"].as_array().unwrap().len(), 1);
}

/// A data loader script that ends Python (an exit at import, an exception, an exit with status 0
/// before any sample, a kill mid-way) is the script's failure: `--data-loader-script PATH`, the
/// exit status, the end of its stderr (bounded), never the scratch folder as `--inputs`.
#[test]
fn a_data_loader_script_that_fails_is_named_with_its_exit_status_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&passed_through(None), &d.join("m.onnx"));
    let python_path = common::numpy_for_tests();
    let scripts: &[(&str, &str, &[&str])] = &[
        ("exit3.py", "import sys\nsys.stderr.write('cannot find the data set\\n')\nsys.exit(3)\n", &["exit status 3", "  cannot find the data set"]),
        ("raises.py", "raise RuntimeError('no GPU for the loader')\n", &["exit status 1", "RuntimeError: no GPU for the loader", "Traceback"]),
        ("exit0.py", "import sys\nsys.exit(0)\n", &["exit status 0 before the function yielded every sample", "it wrote nothing to stderr"]),
        ("midway.py", "import os\nimport numpy as np\ndef load_data():\n    yield {'x': np.zeros((1, 4), np.float32)}\n    os._exit(0)\n", &["exit status 0 before"]),
        // Killed: "signal 9", or "exit status 137" where python3 is a shell wrapper (pyenv).
        ("killed.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", &["Python exited with "]),
        ("loud.py", "import sys\nfor i in range(100000):\n    sys.stderr.write(f'line {i} ' + 'x' * 100 + '\\n')\nsys.exit(4)\n", &["exit status 4", "line 99999"]),
    ];
    for (name, source, expected) in scripts {
        std::fs::write(d.join(name), source).unwrap();
        for command in ["bisect", "fix"] {
            let out = Command::new(env!("CARGO_BIN_EXE_layerwise"))
                .args([command, "m.onnx", "--data-loader-script", name])
                .current_dir(d)
                .env("PYTHONPATH", &python_path)
                .env_remove("LAYERWISE_PYTHON")
                .output()
                .unwrap();
            let said = text(&out);
            assert_eq!(out.status.code(), Some(2), "{name}: {said}");
            assert!(
                said.contains(&format!("error: --data-loader-script {name}: the script failed: Python exited with ")),
                "{name}: {said}"
            );
            for e in *expected {
                assert!(said.contains(e), "{name}: expected '{e}' in: {said}");
            }
            assert!(
                !said.contains("--inputs") && !said.contains("layerwise-data-") && !said.contains(".npz"),
                "{name}: {said}"
            );
            assert!(said.len() < 4000, "{name}: the stderr shown is bounded ({} bytes)", said.len());
        }
    }
    // A script whose loader works still gives its samples.
    std::fs::write(
        d.join("good.py"),
        "import numpy as np\ndef load_data():\n    yield {'x': np.ones((1, 4), np.float32)}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_layerwise"))
        .args(["bisect", "m.onnx", "--data-loader-script", "good.py"])
        .current_dir(d)
        .env("PYTHONPATH", &python_path)
        .env_remove("LAYERWISE_PYTHON")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
