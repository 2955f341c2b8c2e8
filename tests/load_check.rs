//! A converted model that ONNX Runtime can load: `convert` and `fix` load and run the written
//! model with ONNX Runtime's defaults in a child process, and keep in FP32 the op types whose FP16
//! nodes crash it. The crash is played by the child's test hook (`LAYERWISE_TEST_CRASH_OP`: the
//! child aborts on an FP16 node of that op type), standing in for ONNX Runtime's segmentation
//! fault on a bidirectional-GRU text model, which no small model here reproduces.

use crate::common::{json, save, text};
use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::{DataType, Model};

/// x[T=6,1,4] -> GRU(hidden 8) -> y -> Tanh -> out.
fn gru_model() -> ModelProto {
    let mut b = ModelBuilder::new("gru", 14);
    b.input("x", DataType::Float, &[Dim::from(6), Dim::from(1), Dim::from(4)]);
    let det = |n: usize, k: f32| (0..n).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * k).collect::<Vec<f32>>();
    b.initializer(f32_tensor("W", &[1, 24, 4], &det(96, 0.8)));
    b.initializer(f32_tensor("R", &[1, 24, 8], &det(192, 0.6)));
    b.node("GRU", "gru", &["x", "W", "R"], &["y"], vec![attr::int("hidden_size", 8)]);
    b.node("Tanh", "act", &["y"], &["out"], vec![]);
    b.output("out", DataType::Float);
    b.build()
}

fn run(args: &[&str], dir: &std::path::Path, crash_op: Option<&str>) -> std::process::Output {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_layerwise"));
    c.args(args).current_dir(dir);
    match crash_op {
        Some(op) => c.env("LAYERWISE_TEST_CRASH_OP", op),
        None => c.env_remove("LAYERWISE_TEST_CRASH_OP"),
    };
    c.output().unwrap()
}

fn gru_is_fp32(path: &std::path::Path) -> bool {
    let m = Model::load(path).unwrap();
    let gru = m.graph().node.iter().find(|n| n.op_type() == "GRU").unwrap();
    let fp16: Vec<&str> =
        m.graph().initializer.iter().filter(|t| t.data_type() == DataType::Float16 as i32).map(|t| t.name()).collect();
    !gru.input.iter().any(|i| fp16.contains(&i.as_str()))
}

#[test]
fn convert_keeps_in_fp32_the_op_type_that_crashes_onnx_runtime_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    save(&gru_model(), &dir.path().join("m.onnx"));
    // No crash: the GRU is converted, and the output says the model loads.
    let out = run(&["convert", "m.onnx", "-o", "plain.onnx"], dir.path(), None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("loads and runs it with its default options on seeded random inputs"),
        "{}",
        text(&out)
    );
    assert!(!gru_is_fp32(&dir.path().join("plain.onnx")));
    // A crash on FP16 GRUs: the GRU is kept in FP32, and the output says why.
    let out = run(&["convert", "m.onnx", "-o", "c.onnx"], dir.path(), Some("GRU"));
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("crashed the process") && t.contains("with every GRU kept in FP32 it loads and runs"), "{t}");
    assert!(gru_is_fp32(&dir.path().join("c.onnx")), "{t}");
}

#[test]
fn fix_reports_the_load_check_of_the_model_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    save(&gru_model(), &dir.path().join("m.onnx"));
    let out = run(
        &["fix", "m.onnx", "--val-range", "x:-1,1", "-o", "fixed.onnx", "--json", "fix.json"],
        dir.path(),
        Some("GRU"),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let fix = json(&dir.path().join("fix.json"));
    assert_eq!(fix["fixed_model_load"]["status"], "loads", "{t}");
    assert_eq!(fix["fixed_model_load"]["kept_ops"], serde_json::json!(["GRU"]), "{t}");
    assert!(gru_is_fp32(&dir.path().join("fixed.onnx")), "{t}");
    assert!(t.contains("GRU kept in FP32 for that"), "{t}");
}

fn run_failing_at(args: &[&str], dir: &std::path::Path, levels: &str) -> std::process::Output {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_layerwise"));
    c.args(args).current_dir(dir).env_remove("LAYERWISE_TEST_CRASH_OP").env("LAYERWISE_TEST_FAIL_AT_LEVELS", levels);
    c.output().unwrap()
}

/// A model within tolerance in FP16 whose written file ONNX Runtime's CPU
/// provider fails to run at its default optimization level (as the ViT's FP16 Resize failed
/// ScalesValidation at `all`) and runs at `extended`: `fix` said "NOT FIXED ... does not load" and
/// `convert` "ONNX Runtime loads it". Both now say the same: it runs at `extended`, fails at
/// `all`, and the accuracy verdict stands apart (FIXED, nothing kept). The failure is injected in
/// the child check.
#[test]
fn a_model_that_runs_only_below_the_default_optimization_level_is_fixed_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    save(&gru_model(), &dir.path().join("m.onnx"));
    let out = run_failing_at(&["fix", "m.onnx", "-o", "fixed.onnx", "--json", "fix.json"], dir.path(), "all");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("FIX: FIXED") && t.contains("nothing to keep in FP32"), "{t}");
    assert!(t.contains("runs at optimization level extended; fails at all: [test] injected failure"), "{t}");
    assert!(dir.path().join("fixed.onnx").is_file(), "{t}");
    let f = json(&dir.path().join("fix.json"));
    assert_eq!(f["status"], "fixed");
    assert_eq!(f["fixed_model_load"]["status"], "runs_below_default", "{}", f["fixed_model_load"]);

    let out = run_failing_at(&["convert", "m.onnx", "-o", "c.onnx"], dir.path(), "all,extended");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("runs at optimization level basic; fails at all: [test] injected failure at optimization level all; at extended"), "{t}");

    // No level runs it: not usable, nothing written, and the message says every level was tried.
    let out = run_failing_at(&["fix", "m.onnx", "-o", "none.onnx"], dir.path(), "all,extended,basic,disable");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("NOT FIXED") && t.contains("and at every lower optimization level"), "{t}");
    assert!(!dir.path().join("none.onnx").exists());
    let out = run_failing_at(&["convert", "m.onnx", "-o", "none.onnx"], dir.path(), "all,extended,basic,disable");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(!dir.path().join("none.onnx").exists());
}

/// A renamed copy of the executable runs itself for the load check, not a file named `layerwise`
/// beside it (an independent tester's copy sat beside a 6-byte text file of that name: every
/// check exited 127 and `fix` said NOT FIXED on a healthy model).
#[test]
fn a_renamed_executable_checks_the_load_with_itself() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let copy = bin.join("layerwise-copy");
    std::fs::copy(env!("CARGO_BIN_EXE_layerwise"), &copy).unwrap();
    std::fs::write(bin.join("layerwise"), "freed").unwrap();
    save(&gru_model(), &dir.path().join("m.onnx"));
    let out = std::process::Command::new(&copy)
        .args(["convert", "m.onnx", "-o", "c.onnx"])
        .current_dir(dir.path())
        .env_remove("LAYERWISE_TEST_CRASH_OP")
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("loads and runs it with its default options on seeded random inputs"), "{t}");
}

/// The check without inputs to run (an FP16 input, `--fp16-io`) builds ONNX Runtime's session at
/// each level, which is where its fusions run. It used to only type the model and said "loads"
/// for a file whose LayerNorm, kept float32 behind the FP16 graph input it reads, ONNX Runtime's
/// LayerNormFusion turns into a LayerNormalization of mixed types and refuses at every level but
/// `disable` (nothing can be widened: the input is FP16 by request).
#[test]
fn a_file_with_fp16_inputs_is_checked_by_building_its_session_at_each_level() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("ln-on-input", 17);
    b.input("x", DataType::Float, &[Dim::from(2), Dim::from(16)]);
    crate::common::decomposed_layernorm(&mut b, "x", (&[1.5; 16], &[0.25; 16]));
    b.node("Tanh", "head", &["ln_out"], &["out"], vec![]);
    b.output("out", DataType::Float);
    save(&b.build(), &dir.path().join("m.onnx"));
    let keep = "ln/mean,ln/sub,ln/pow,ln/var,ln/add_eps,ln/sqrt,ln/div,ln/gamma,ln/beta";
    let out = run(
        &["convert", "m.onnx", "--to", "fp16", "--fp16-io", "--keep-fp32", keep, "-o", "m16.onnx"],
        dir.path(),
        None,
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(!t.contains("ONNX Runtime loads it"), "{t}");
    assert!(t.contains("fails at all") && t.contains("LayerNormFusion"), "{t}");
}
