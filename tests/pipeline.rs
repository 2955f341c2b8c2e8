//! End-to-end runs through ONNX Runtime. They need libonnxruntime: layerwise finds it (see
//! README) or fetches it with pip, and these tests fail with that error if it cannot.

use std::collections::HashMap;

use crate::common::{planted, rounding_probe, spec, Ending};
use layerwise::pipeline::{bisect_model, BisectOptions};
use layerwise_analysis::{CauseKind, Status};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_runtime::{create_backend, RunRequest, Tensor, TensorData};

fn options(json: Option<std::path::PathBuf>) -> BisectOptions {
    BisectOptions {
        outputs: layerwise_report::Outputs { json, ..Default::default() },
        ..BisectOptions::new("in-memory", spec("ort:cpu"), spec("sim:fp16"))
    }
}

fn run(backend: &str, model: &Model, inputs: &[(String, Tensor)]) -> HashMap<String, Tensor> {
    let index = GraphIndex::build(model.graph()).unwrap();
    let mut b = create_backend(&spec(backend)).unwrap();
    let out = b.run(&RunRequest { model, index: &index, inputs, selection: &Selection::All }).unwrap();
    out.tensors
}

fn f32s(t: &Tensor) -> Vec<f32> {
    match &t.data {
        TensorData::F32(v) => v.clone(),
        other => panic!("expected float32, got {:?}", other.dtype()),
    }
}

#[test]
fn fp16_emulation_really_rounds_at_run_time() {
    let model = Model::from_proto(rounding_probe(), "rounding").unwrap();
    let inputs = vec![
        ("x".to_string(), Tensor::f32(vec![3], vec![1e5, 1.0001, 3.0])),
        ("x2".to_string(), Tensor::f32(vec![1], vec![100.0])),
    ];
    let sim = run("sim:fp16", &model, &inputs);
    let y = f32s(&sim["y"]);
    assert!(y[0].is_infinite() && y[0] > 0.0, "1e5 must come out inf, got {}", y[0]);
    assert_eq!(y[1], 1.0, "1.0001 must come out 1.0");
    assert_eq!(y[2], 3.0);
    assert!(f32s(&sim["z"])[0].is_infinite(), "100 * 1000 computed in FP32 must overflow when stored as FP16");
    let reference = run("ort:cpu", &model, &inputs);
    assert_eq!(f32s(&reference["y"]), [1e5, 1.0001, 3.0], "the reference is untouched float32");
    assert_eq!(f32s(&reference["z"]), [1e5]);
}

#[test]
fn planted_overflow_behind_drift_is_found_and_drift_is_not_blamed() {
    let model = Model::from_proto(planted(Ending::ExpOverflow), "planted-exp").unwrap();
    let outcome = bisect_model(&model, &options(None)).unwrap();
    let v = &outcome.report.verdict;
    assert_eq!(v.status, Status::Diverged, "{}", outcome.text);
    let fd = v.first_divergent.as_ref().expect("a first divergent layer");
    assert_eq!(fd.node, "head/Exp", "{}", outcome.text);
    assert_eq!(fd.cause.best.kind, CauseKind::ValueOverflow);
    let input_error = fd.input_error.expect("its input was compared");
    assert!(input_error > 1e-4 && input_error < 5e-2, "its input carries drift, not zero error: {input_error}");
    assert_eq!(v.chain.first().unwrap().tensor, "out");
    assert_eq!(v.chain.last().unwrap().node, "head/Exp");
    assert!(v.chain.iter().all(|s| !s.node.starts_with("branch_")), "no drift node on the chain: {:?}", v.chain);
    assert!(v.non_finite.iter().any(|n| n.node == "head/Exp" && n.origin));
}

#[test]
fn sensitive_layer_after_drift_is_named() {
    let model = Model::from_proto(planted(Ending::SoftmaxAmplification), "planted-softmax").unwrap();
    let outcome = bisect_model(&model, &options(None)).unwrap();
    let fd = outcome
        .report
        .verdict
        .first_divergent
        .as_ref()
        .unwrap_or_else(|| panic!("no first divergent layer:\n{}", outcome.text));
    assert_eq!(fd.node, "head/Softmax", "{}", outcome.text);
    // Logits near 2000 keep ~1 absolute precision in FP16: the cause is their absolute error.
    assert_eq!(fd.cause.best.kind, CauseKind::LargeLogits, "{}", fd.cause.best.detail);
    assert!(fd.output_error >= 10.0 * fd.input_error.unwrap());
    // The error has drifted to a few tenths of a percent on the way to the Softmax, and the drift
    // nodes are not blamed for it.
    let scaled = outcome.report.tensors.iter().find(|t| t.name == "scaled").unwrap();
    assert!(scaled.metrics.rel_l2_err > 3e-3, "drift before the sensitive layer: {}", scaled.metrics.rel_l2_err);
    assert!(outcome.report.verdict.chain.iter().all(|s| !s.node.starts_with("branch_")));
}

#[test]
fn drift_alone_passes() {
    let model = Model::from_proto(planted(Ending::Healthy), "drift").unwrap();
    let outcome = bisect_model(&model, &options(None)).unwrap();
    assert_eq!(outcome.report.verdict.status, Status::Pass, "{}", outcome.text);
    assert!(outcome.report.verdict.first_divergent.is_none());
    let branch_b_end = outcome.report.tensors.iter().find(|t| t.name == "branch_b_add59").unwrap();
    assert!(branch_b_end.metrics.rel_l2_err > 1e-4, "the drift is real: {}", branch_b_end.metrics.rel_l2_err);
}

#[test]
fn saved_tensors_compare_like_a_live_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::from_proto(planted(Ending::ExpOverflow), "planted-exp").unwrap();
    let mut save = options(None);
    save.save_tensors = Some(dir.path().to_path_buf());
    let live = bisect_model(&model, &save).unwrap();
    let mut replay = options(None);
    replay.candidate = spec(&format!("npz:{}", dir.path().join("cand").display()));
    replay.inputs.npz = Some(dir.path().join("inputs.npz"));
    let saved = bisect_model(&model, &replay).unwrap();
    let node =
        |o: &layerwise::pipeline::BisectOutcome| o.report.verdict.first_divergent.as_ref().map(|f| f.node.clone());
    assert_eq!(node(&saved), node(&live));
    assert_eq!(saved.report.tensors.len(), live.report.tensors.len());
    // Other inputs than the saved run's are refused rather than compared.
    let mut wrong = options(None);
    wrong.candidate = replay.candidate.clone();
    wrong.inputs.seed = 99;
    let err = format!("{:#}", bisect_model(&model, &wrong).err().expect("different inputs must be refused"));
    assert!(err.contains("different value of input 'x'"), "{err}");
}

#[test]
fn same_seed_same_report() {
    let model = Model::from_proto(planted(Ending::SoftmaxAmplification), "planted-softmax").unwrap();
    let strip = |o: layerwise::pipeline::BisectOutcome| {
        let mut v = serde_json::to_value(&o.report).unwrap();
        v.as_object_mut().unwrap().remove("run_info");
        v
    };
    assert_eq!(
        strip(bisect_model(&model, &options(None)).unwrap()),
        strip(bisect_model(&model, &options(None)).unwrap())
    );
}

#[test]
fn reports_name_the_engine_layer_that_contains_the_first_divergent_node() {
    // A candidate run saved on a machine with TensorRT records its engine's layer map; replayed
    // anywhere, the report says which fused layer holds the first divergent node.
    let dir = tempfile::tempdir().unwrap();
    let model = Model::from_proto(planted(Ending::ExpOverflow), "planted-exp").unwrap();
    let mut save = options(None);
    save.save_tensors = Some(dir.path().to_path_buf());
    bisect_model(&model, &save).unwrap();
    let manifest_path = dir.path().join("cand/manifest.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    assert_eq!(manifest["engine_layers"], serde_json::json!([]), "an ONNX Runtime run has no engine layers");
    manifest["engine_layers"] = serde_json::json!([
        { "name": "{ForeignNode[branch_a/Mul_0...branch_a/Add_29]}", "onnx_nodes": ["branch_a/Mul_0", "branch_a/Add_29"] },
        { "name": "{ForeignNode[head/scale...merge/Mul]}", "onnx_nodes": ["head/scale", "head/Exp", "merge/Mul"] }
    ]);
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let mut replay = options(None);
    replay.candidate = spec(&format!("npz:{}", dir.path().join("cand").display()));
    replay.inputs.npz = Some(dir.path().join("inputs.npz"));
    let outcome = bisect_model(&model, &replay).unwrap();
    let layer =
        outcome.report.first_divergent_detail.as_ref().unwrap().engine_layer.as_ref().expect("the engine layer");
    assert_eq!(layer.name, "{ForeignNode[head/scale...merge/Mul]}");
    assert_eq!(layer.onnx_nodes, 3);
    assert!(
        outcome.text.contains("inside TensorRT layer {ForeignNode[head/scale...merge/Mul]} (3 ONNX nodes fused)"),
        "{}",
        outcome.text
    );
    let html = layerwise_report::render_html(&outcome.report);
    assert!(html
        .contains(r#"<p id="engine-layer">Inside TensorRT layer <code>{ForeignNode[head/scale...merge/Mul]}</code>"#));
}
