//! The CPU emulations give the answer the hardware would: TF32 tensor cores (`sim:tf32`), BF16
//! storage (`sim:bf16`) and a weakly typed TensorRT FP16 engine (`sim:fp16,engine=trt`), each on
//! a model planted to need it.

mod common;

use common::{json, layerwise, save, saved_tensor, text};
use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::{DataType, Rounding};
use layerwise_runtime::{Tensor, TensorData};

fn write_input(dir: &std::path::Path, file: &str, shape: Vec<usize>, values: Vec<f32>) {
    layerwise_runtime::npy::write_npy_file(&dir.join(file), &Tensor::new(shape, TensorData::F32(values))).unwrap();
}

/// x[1,4096] @ w[4096,1], w alternating +1/-1: the output is a sum of differences of neighbours,
/// each about 2^-11 when x lies in [1, 1 + 2^-10). TF32 keeps 10 mantissa bits, so it rounds
/// every x to 1 or 1 + 2^-10 and the differences (the whole result) change: a long K and values
/// that lose precision at 10 bits.
fn tf32_sensitive_matmul() -> ModelProto {
    let k = 4096;
    let mut b = ModelBuilder::new("tf32", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(k)]);
    let w: Vec<f32> = (0..k).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
    b.initializer(f32_tensor("w", &[k, 1], &w));
    b.node("MatMul", "sum/MatMul", &["x", "w"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

#[test]
fn sim_tf32_rounds_what_a_tf32_tensor_core_reads_and_names_the_matmul() {
    let dir = tempfile::tempdir().unwrap();
    save(&tf32_sensitive_matmul(), &dir.path().join("m.onnx"));
    let range = "x:1,1.0009765625";
    let out = layerwise(&["bisect", "m.onnx", "--cand", "sim:tf32", "--val-range", range, "--json", "tf32.json", "--save-tensors", "saved"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let r = json(&dir.path().join("tf32.json"));
    assert!(r["cand"]["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().starts_with("TF32 emulation: 2 Conv/MatMul/Gemm inputs")), "{}", r["cand"]["notes"]);
    // The product is the float32 product of the TF32-rounded inputs (w = ±1 is exact in TF32).
    let x = layerwise_runtime::npy::read_npz(&dir.path().join("saved/inputs.npz")).unwrap().into_iter().find(|(n, _)| n == "x").unwrap().1;
    let y = saved_tensor(&dir.path().join("saved/cand"), "y").to_f32()[0] as f64;
    let expected: f64 = x.to_f32().iter().enumerate().map(|(i, &v)| if i % 2 == 0 { 1.0 } else { -1.0 } * layerwise_model::rounding::round_tf32(v) as f64).sum();
    assert!((y - expected).abs() <= 1e-6 * 4096.0, "TF32 product {y} against {expected}");
    // This output is the small difference of long sums: perturbing the weights by one rounding
    // moves it as much, and the verdict says so rather than blaming the MatMul.
    assert_eq!(r["noise_floor"]["ill_conditioned"], true, "{t}");
    // Without the noise floor the walk names the MatMul, with the cause of the candidate's
    // arithmetic.
    let out = layerwise(&["bisect", "m.onnx", "--cand", "sim:tf32", "--val-range", range, "--no-noise-floor", "--json", "walk.json"], dir.path());
    let t = text(&out);
    let w = json(&dir.path().join("walk.json"));
    assert_eq!(w["verdict"]["first_divergent"]["node"], "sum/MatMul", "{t}");
    assert_eq!(w["verdict"]["first_divergent"]["cause"]["kind"], "tf32", "{t}");
    // The same product in float32 (another float32 runtime) passes: TF32 is the difference.
    let out = layerwise(&["bisect", "m.onnx", "--cand", "ort:cpu", "--val-range", range], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// x -> Add(64) -> Sub(64) -> y, x multiples of 1/16 in [0.5, 1]: near 64 FP16's spacing is
/// 1/16, so x + 64 is exact in FP16 and y = x; BF16's spacing there is 1/2, so y comes back as
/// 0.5 or 1 (or 0): errors up to 50%.
fn cancellation() -> ModelProto {
    let mut b = ModelBuilder::new("cancel", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(9)]);
    b.initializer(f32_tensor("c", &[1], &[64.0]));
    b.node("Add", "shift/Add", &["x", "c"], &["up"], vec![]);
    b.node("Sub", "shift/Sub", &["up", "c"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

#[test]
fn a_precision_failure_only_bf16_has_is_found_by_sim_bf16_and_not_by_sim_fp16() {
    let dir = tempfile::tempdir().unwrap();
    save(&cancellation(), &dir.path().join("m.onnx"));
    write_input(dir.path(), "x.npy", vec![1, 9], (8..=16).map(|k| k as f32 / 16.0).collect());
    let run = |cand: &str, json_name: &str| {
        let out = layerwise(&["bisect", "m.onnx", "--cand", cand, "--input", "x=x.npy", "--no-noise-floor", "--json", json_name], dir.path());
        (out.status.code(), text(&out), json(&dir.path().join(json_name)))
    };
    let (code, t, r) = run("sim:fp16", "fp16.json");
    assert_eq!(code, Some(0), "exact in FP16: {t}");
    assert_eq!(r["outputs"][0]["rel_l2_err"].as_f64(), Some(0.0), "{t}");
    let (code, t, r) = run("sim:bf16", "bf16.json");
    assert_eq!(code, Some(1), "{t}");
    let fd = &r["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "shift/Sub", "the cancellation turns BF16's rounding of 64 + x into the error: {t}");
    // Causes follow BF16's arithmetic: no FP16 range, no FP16 subnormals.
    let all = fd["cause"].to_string();
    assert!(!all.contains("FP16"), "{all}");
}

#[test]
fn sim_bf16_claims_no_fp16_overflow_where_fp16_overflows() {
    let dir = tempfile::tempdir().unwrap();
    save(&layerwise::demo::demo_model(), &dir.path().join("demo.onnx"));
    let out = layerwise(&["bisect", "demo.onnx", "--cand", "sim:fp16"], dir.path());
    assert_eq!(out.status.code(), Some(1), "the demo overflows FP16: {}", text(&out));
    let out = layerwise(&["bisect", "demo.onnx", "--cand", "sim:bf16", "--json", "r.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "BF16 has float32's range: {t}");
    assert!(!t.contains("overflow"), "{t}");
}

/// Values that sit exactly halfway between two BF16 neighbours, and others, through an Identity:
/// the emulation must round them as round-to-nearest-even does, at opset 17 (Cast to bfloat16)
/// and at opset 11 (a Veltkamp split, since Cast has no bfloat16 there).
#[test]
fn bf16_rounding_in_the_emulated_model_is_round_to_nearest_even() {
    for opset in [17, 11] {
        let dir = tempfile::tempdir().unwrap();
        let mut b = ModelBuilder::new("id", opset);
        b.input("x", DataType::Float, &[Dim::from(8)]);
        b.node("Relu", "relu", &["x"], &["y"], vec![]);
        b.output("y", DataType::Float);
        save(&b.build(), &dir.path().join("m.onnx"));
        let ulp = 2f32.powi(-7);
        let values = vec![1.0 + ulp / 2.0, 1.0 + 1.5 * ulp, 3.0 + ulp, 0.1, 7.77, 12345.678, 1.0 + 3.0 * ulp / 4.0, 2.5e-3];
        write_input(dir.path(), "x.npy", vec![8], values.clone());
        let out = layerwise(&["bisect", "m.onnx", "--cand", "sim:bf16", "--input", "x=x.npy", "--save-tensors", "s"], dir.path());
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
        let got = saved_tensor(&dir.path().join("s/cand"), "y");
        let expected: Vec<f32> = values.iter().map(|&v| Rounding::Bf16.round(v)).collect();
        assert_eq!(got.to_f32().to_vec(), expected, "opset {opset}");
    }
}

/// x[1,4,8,8] -> Conv(W small) -> BatchNormalization(var = 1e8, gamma = 1e4) -> Relu -> y. As a
/// stored FP16 weight the variance is inf; folded into the Conv in float32 (scale
/// 1e4 / sqrt(1e8) = 1) nothing is out of range.
fn conv_batchnorm_with_a_huge_variance() -> ModelProto {
    let mut b = ModelBuilder::new("conv-bn", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4), Dim::from(8), Dim::from(8)]);
    let w: Vec<f32> = (0..4 * 4 * 9).map(|i| ((i * 7 % 11) as f32 - 5.0) / 20.0).collect();
    b.initializer(f32_tensor("W", &[4, 4, 3, 3], &w));
    b.initializer(f32_tensor("B", &[4], &[0.1, -0.1, 0.2, 0.0]));
    b.initializer(f32_tensor("gamma", &[4], &[1e4; 4]));
    b.initializer(f32_tensor("beta", &[4], &[0.5, 0.0, -0.5, 0.25]));
    b.initializer(f32_tensor("mean", &[4], &[0.01, -0.02, 0.0, 0.03]));
    b.initializer(f32_tensor("var", &[4], &[1e8; 4]));
    b.node("Conv", "block/Conv", &["x", "W", "B"], &["c"], vec![attr::ints("pads", &[1, 1, 1, 1])]);
    b.node("BatchNormalization", "block/BN", &["c", "gamma", "beta", "mean", "var"], &["n"], vec![]);
    b.node("Relu", "block/Relu", &["n"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

#[test]
fn a_batchnorm_variance_beyond_fp16_breaks_a_typed_fp16_model_but_not_a_tensorrt_engine() {
    let dir = tempfile::tempdir().unwrap();
    save(&conv_batchnorm_with_a_huge_variance(), &dir.path().join("m.onnx"));
    // A strongly typed FP16 model stores the variance as an FP16 weight: inf.
    let out = layerwise(&["bisect", "m.onnx", "--cand", "sim:fp16", "--json", "typed.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let typed = json(&dir.path().join("typed.json"));
    assert_eq!(typed["verdict"]["first_divergent"]["cause"]["kind"], "weight_overflow", "{t}");
    // A weakly typed TensorRT engine folds it into the Conv first.
    let out = layerwise(&["bisect", "m.onnx", "--cand", "sim:fp16,engine=trt", "--json", "trt.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let trt = json(&dir.path().join("trt.json"));
    let notes: Vec<&str> = trt["cand"]["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    assert!(notes.iter().any(|n| n.contains("1 BatchNorms folded into their Convs")), "the semantics used are reported: {notes:?}");
    // The Conv's own output does not exist in the engine: not compared, with the reason.
    let not_compared = trt["not_compared"].as_array().unwrap();
    assert!(not_compared.iter().any(|n| n["tensor"] == "c" && n["reason"].as_str().unwrap().contains("folded")), "{not_compared:?}");
}

#[test]
fn fix_with_sim_bf16_writes_a_bf16_model_with_the_keep_list() {
    let dir = tempfile::tempdir().unwrap();
    save(&cancellation(), &dir.path().join("m.onnx"));
    write_input(dir.path(), "x.npy", vec![1, 9], (8..=16).map(|k| k as f32 / 16.0).collect());
    let out = layerwise(&["fix", "m.onnx", "--cand", "sim:bf16", "--input", "x=x.npy", "-o", "fixed.onnx", "--json", "fix.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let fix = json(&dir.path().join("fix.json"));
    // Keeping the Add alone is no fix in the written model: its float32 sum is cast to BF16 at
    // the island's edge before the Sub cancels it, so the Sub joins the island.
    assert_eq!(fix["keep_fp32"], serde_json::json!(["shift/Sub", "shift/Add"]), "{t}");
    assert!(fix["trtexec_flags"].as_str().unwrap().starts_with("--bf16 "), "{t}");
    let fixed = layerwise_model::Model::load(&dir.path().join("fixed.onnx")).unwrap();
    let sub = fixed.graph().node.iter().find(|n| n.name() == "shift/Sub").unwrap();
    assert!(!sub.input.iter().any(|i| i.ends_with("__to_bf16")), "the kept Sub reads float32: {sub:?}");
    // ONNX Runtime's CPU provider has no BF16 Sub: the report says the file was not run, rather
    // than claiming a pass.
    let check = &fix["fixed_model_check"];
    assert!(check["pass"] == true || check["not_run"].as_str().is_some_and(|w| w.contains("Sub")), "{check}");
}

/// TF32 keeps FP16's 10-bit mantissa: a candidate that multiplies on TF32 tensor cores is judged
/// by FP16's default tolerances, and the header says whose defaults apply. A small healthy MatMul
/// (K = 256, N(0,1)-like weights) errs about 3e-4 under TF32: beyond float32's rtol (1e-3 with
/// range 1e-4 fails on small elements), within FP16's.
#[test]
fn tf32_candidates_get_fp16_tolerances_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let k = 256;
    let mut b = ModelBuilder::new("healthy-matmul", 17);
    b.input("x", DataType::Float, &[Dim::from(8), Dim::from(k)]);
    let w: Vec<f32> = (0..k * 16).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.1).collect();
    b.initializer(f32_tensor("w", &[k, 16], &w));
    b.node("MatMul", "mm", &["x", "w"], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("m.onnx"));
    let tf32 = layerwise(&["bisect", "m.onnx", "--cand", "sim:tf32", "--val-range", "x:-1,1", "--json", "tf32.json"], dir.path());
    assert_eq!(tf32.status.code(), Some(0), "{}", text(&tf32));
    assert!(text(&tf32).contains("(TF32 defaults)"), "{}", text(&tf32));
    let r = json(&dir.path().join("tf32.json"));
    assert_eq!(r["tolerances"]["defaults_for"], "TF32");
    assert_eq!(r["tolerances"]["rtol"], 1e-2);
    // The same errors under float32's tolerances (given by hand) fail: the default matters.
    let strict = layerwise(&["bisect", "m.onnx", "--cand", "sim:tf32", "--val-range", "x:-1,1", "--atol", "1e-5", "--rtol", "1e-3", "--range-tol", "1e-4", "--no-noise-floor"], dir.path());
    assert_eq!(strict.status.code(), Some(1), "{}", text(&strict));
    assert!(text(&strict).contains("as given; TF32 defaults are 0.0001 + 0.01"), "{}", text(&strict));
    // A float32 candidate without tensor cores keeps float32's.
    let cpu = layerwise(&["bisect", "m.onnx", "--cand", "ort:cpu", "--json", "cpu.json"], dir.path());
    assert_eq!(cpu.status.code(), Some(0), "{}", text(&cpu));
    assert_eq!(json(&dir.path().join("cpu.json"))["tolerances"]["defaults_for"], "float32");
}

/// A BF16 file whose weights all stay float32 (here it has none) computes in BF16 all the same:
/// its declared types decide its precision, so BF16's tolerances apply.
#[test]
fn a_bf16_cand_model_without_bf16_weights_is_judged_as_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("sigmoid", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(64)]);
    b.node("Sigmoid", "act", &["x"], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("m.onnx"));
    let c = layerwise(&["convert", "m.onnx", "--to", "bf16", "-o", "low.onnx"], dir.path());
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    let out = layerwise(&["bisect", "m.onnx", "--cand", "ort:cpu", "--cand-model", "low.onnx", "--json", "r.json"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    assert_eq!(json(&dir.path().join("r.json"))["tolerances"]["defaults_for"], "BF16", "{}", text(&out));
}
