//! A Q/DQ candidate is judged as deployed: run with only its declared outputs, ONNX
//! Runtime fuses its quantizers into integer kernels, which exposing a tensor between them
//! prevents. The output errors of `bisect` and of `fix`'s written-model check are the deployed
//! run's; the exposed run's intermediate tensors stay what the walk reads.

use crate::common::{json, layerwise, save, spec, text};
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::{ModelProto, TensorProto};
use layerwise_model::{DataType, GraphIndex, Model, Selection};
use layerwise_runtime::{create_backend, RunRequest, Tensor};

/// Four rows of logits, one dominant in each, on the int8 quantizer's grid (step 1/16).
const LOGITS: [[f32; 8]; 4] = [
    [6.5625, -0.9375, -1.8125, -1.9375, 1.25, 1.625, 0.4375, 0.9375],
    [5.1875, 1.75, 1.25, -2.0, 1.4375, -1.875, 0.9375, -1.3125],
    [5.4375, 0.1875, -0.8125, -0.3125, -1.875, -1.5, 0.6875, 0.5625],
    [7.4375, -0.4375, 2.0, 1.9375, 0.75, 0.625, 0.75, -0.4375],
];

fn int_tensor(name: &str, data_type: DataType, value: i32) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: vec![],
        data_type: Some(data_type as i32),
        int32_data: vec![value],
        ..Default::default()
    }
}

/// x[4,8] -> Softmax -> y.
fn float_model() -> ModelProto {
    let mut b = ModelBuilder::new("softmax", 17);
    b.input("x", DataType::Float, &[Dim::from(4), Dim::from(8)]);
    b.node("Softmax", "softmax", &["x"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// The same quantized as `quantize_static` writes a Softmax: x int8 (step 1/16), the probabilities
/// uint8 with step 1/255 and zero point 0. Run with only `y`, ONNX Runtime's CPU provider computes
/// the Softmax as one integer kernel (QLinearSoftmax, a lookup table), whose probabilities land a
/// step below the float Softmax's rounded (249/255 against 250/255 in the first row).
fn qdq_model() -> ModelProto {
    let mut b = ModelBuilder::new("softmax_qdq", 17);
    b.input("x", DataType::Float, &[Dim::from(4), Dim::from(8)]);
    b.initializer(f32_tensor("sx", &[], &[1.0 / 16.0]));
    b.initializer(int_tensor("zx", DataType::Int8, 0));
    b.initializer(f32_tensor("sy", &[], &[1.0 / 255.0]));
    b.initializer(int_tensor("zy", DataType::Uint8, 0));
    b.node("QuantizeLinear", "x_q", &["x", "sx", "zx"], &["x_q8"], vec![]);
    b.node("DequantizeLinear", "x_dq", &["x_q8", "sx", "zx"], &["x_f"], vec![]);
    b.node("Softmax", "softmax", &["x_f"], &["p"], vec![]);
    b.node("QuantizeLinear", "p_q", &["p", "sy", "zy"], &["p_q8"], vec![]);
    b.node("DequantizeLinear", "p_dq", &["p_q8", "sy", "zy"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// The float softmax of the logits, in float64.
fn reference() -> Vec<f64> {
    LOGITS
        .iter()
        .flat_map(|row| {
            let max = row.iter().fold(f32::MIN, |m, v| m.max(*v)) as f64;
            let e: Vec<f64> = row.iter().map(|v| (*v as f64 - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / sum)
        })
        .collect()
}

/// `path`'s output 'y' on ONNX Runtime's CPU provider: with only its outputs (as deployed), or with
/// every tensor exposed.
fn candidate_output(path: &std::path::Path, feeds: &[(String, Tensor)], exposed: bool) -> Vec<f64> {
    let model = Model::load(path).unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let selection = if exposed { Selection::All } else { Selection::Names(Vec::new()) };
    let mut backend = create_backend(&spec("ort:cpu")).unwrap();
    let out = backend.run(&RunRequest { model: &model, index: &index, inputs: feeds, selection: &selection }).unwrap();
    out.tensors["y"].to_f32().iter().map(|v| f64::from(*v)).collect()
}

fn rel_l2(c: &[f64], r: &[f64]) -> f64 {
    let diff: f64 = c.iter().zip(r).map(|(c, r)| (c - r).powi(2)).sum();
    (diff / r.iter().map(|r| r * r).sum::<f64>()).sqrt()
}

/// The models and the sample in `dir`; the feeds of that sample.
fn write_case(dir: &std::path::Path) -> Vec<(String, Tensor)> {
    save(&float_model(), &dir.join("m.onnx"));
    save(&qdq_model(), &dir.join("q.onnx"));
    let x = Tensor::f32(vec![4, 8], LOGITS.concat());
    layerwise_runtime::npy::write_npz(&dir.join("x.npz"), &[("x", &x)]).unwrap();
    vec![("x".to_string(), x)]
}

/// The candidate's deployed and exposed output errors, measured here, and checked to differ (else
/// the case tests nothing).
fn deployed_and_exposed(dir: &std::path::Path, model: &str, feeds: &[(String, Tensor)]) -> (f64, f64) {
    let r = reference();
    let deployed = rel_l2(&candidate_output(&dir.join(model), feeds, false), &r);
    let exposed = rel_l2(&candidate_output(&dir.join(model), feeds, true), &r);
    assert!(
        deployed > 1.5 * exposed,
        "the fused kernel must differ measurably: deployed {deployed:.3e}, exposed {exposed:.3e}"
    );
    (deployed, exposed)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 * b.abs().max(1e-9)
}

/// bisect's output error is the deployed model's (an independent run of it with only its outputs),
/// not the exposed run's, and the note gives both numbers.
#[test]
fn bisect_reports_the_output_error_of_the_candidate_as_deployed() {
    let dir = tempfile::tempdir().unwrap();
    let feeds = write_case(dir.path());
    let (deployed, exposed) = deployed_and_exposed(dir.path(), "q.onnx", &feeds);
    let out = layerwise(
        &["bisect", "m.onnx", "--cand", "ort:cpu", "--cand-model", "q.onnx", "--inputs", "x.npz", "--json", "r.json"],
        dir.path(),
    );
    let t = text(&out);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{t}");
    let report = json(&dir.path().join("r.json"));
    let y = report["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "y")
        .unwrap_or_else(|| panic!("no record of y: {report}"));
    let reported = y["metrics"]["rel_l2_err"].as_f64().unwrap();
    assert!(close(reported, deployed), "reported {reported:.4e}, deployed {deployed:.4e}, exposed {exposed:.4e}");
    let notes = report["cand"]["notes"].to_string();
    let both = format!("'y' {deployed:.2e} as deployed, {exposed:.2e} exposed");
    assert!(
        notes.contains("Q/DQ fusions and integer kernels, as the user runs it") && notes.contains(&both),
        "{both} not in {notes}"
    );
}

/// fix's check of the written model is a deployed run, and its before/after numbers are the
/// deployed ones: the candidate passes as it is, so the written model is the candidate and both
/// equal the candidate's deployed error.
#[test]
fn fix_checks_the_written_model_as_deployed() {
    let dir = tempfile::tempdir().unwrap();
    let feeds = write_case(dir.path());
    let (deployed, exposed) = deployed_and_exposed(dir.path(), "q.onnx", &feeds);
    let out = layerwise(
        &[
            "fix",
            "m.onnx",
            "--cand",
            "ort:cpu",
            "--cand-model",
            "q.onnx",
            "--inputs",
            "x.npz",
            "-o",
            "fixed.onnx",
            "--json",
            "f.json",
        ],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let report = json(&dir.path().join("f.json"));
    let (written, _) = deployed_and_exposed(dir.path(), "fixed.onnx", &feeds);
    let check = &report["fixed_model_check"]["outputs"][0];
    assert_eq!(check["name"], "y", "{report}");
    let (before, after) = (check["before_rel_l2"].as_f64().unwrap(), check["after_rel_l2"].as_f64().unwrap());
    assert!(close(after, written), "after {after:.4e}, the written model deployed {written:.4e}");
    assert!(close(before, deployed), "before {before:.4e}, deployed {deployed:.4e}, exposed {exposed:.4e}");
}
