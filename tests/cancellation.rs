//! Absorption and cancellation: one rounding that destroys a value, named at the node whose
//! low-precision output loses it, with the step of the format there against what it had to keep.
//! Polygraphy's own precision example (`needs_constraints.onnx`: flip, + 65504, - 65504, flip
//! back) and a rotary position embedding (angles up to 4,063 into Sin and Cos) under `sim:fp16`.

use crate::common::{json, layerwise, save, text};
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::DataType;

/// x[1,4] -> MatMul(flip) -> Add(65504) -> Sub(65504) -> MatMul(flip) -> y, as Polygraphy's
/// `needs_constraints.onnx`.
fn needs_constraints() -> ModelProto {
    let mut b = ModelBuilder::new("needs_constraints", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    // The anti-diagonal permutation: reverses the 4 values.
    let flip: Vec<f32> = (0..16).map(|i| if i / 4 + i % 4 == 3 { 1.0 } else { 0.0 }).collect();
    b.initializer(f32_tensor("flip", &[4, 4], &flip));
    b.initializer(f32_tensor("big", &[1], &[65504.0]));
    b.node("MatMul", "flip_in", &["x", "flip"], &["flipped"], vec![]);
    b.node("Add", "add_big", &["flipped", "big"], &["shifted"], vec![]);
    b.node("Sub", "sub_big", &["shifted", "big"], &["unshifted"], vec![]);
    b.node("MatMul", "flip_out", &["unshifted", "flip"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// pos[64,1] -> Mul(inv_freq[1,16]) -> angle -> Sin, Cos: a rotary position embedding.
fn rotary() -> ModelProto {
    let mut b = ModelBuilder::new("rotary", 17);
    b.input("pos", DataType::Float, &[Dim::from(64), Dim::from(1)]);
    let inv_freq: Vec<f32> = (0..16).map(|i| 10000f32.powf(-(i as f32) / 16.0)).collect();
    b.initializer(f32_tensor("inv_freq", &[1, 16], &inv_freq));
    b.node("Mul", "angle_mul", &["pos", "inv_freq"], &["angle"], vec![]);
    b.node("Sin", "sin", &["angle"], &["sin_out"], vec![]);
    b.node("Cos", "cos", &["angle"], &["cos_out"], vec![]);
    b.output("sin_out", DataType::Float);
    b.output("cos_out", DataType::Float);
    b.build()
}

/// The same angle computed from weights only: positions 4000-4063 stored as a weight, times
/// inv_freq, then x * cos(angle) + x * sin(angle). The angle is weight-derived ("constant-like"),
/// and the walk used to skip such inputs: it called the output ill-conditioned.
fn rotary_of_stored_positions() -> ModelProto {
    let mut b = ModelBuilder::new("rotary_stored", 17);
    b.input("x", DataType::Float, &[Dim::from(64), Dim::from(16)]);
    let inv_freq: Vec<f32> = (0..16).map(|i| 10000f32.powf(-(i as f32) / 16.0)).collect();
    b.initializer(f32_tensor("pos", &[64, 1], &(4000..4064).map(|p| p as f32).collect::<Vec<_>>()));
    b.initializer(f32_tensor("inv_freq", &[1, 16], &inv_freq));
    b.node("Mul", "angle_mul", &["pos", "inv_freq"], &["angle"], vec![]);
    b.node("Cos", "cos", &["angle"], &["cos_out"], vec![]);
    b.node("Sin", "sin", &["angle"], &["sin_out"], vec![]);
    b.node("Mul", "x_cos", &["x", "cos_out"], &["xc"], vec![]);
    b.node("Mul", "x_sin", &["x", "sin_out"], &["xs"], vec![]);
    b.node("Add", "rotate", &["xc", "xs"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

fn write_positions(dir: &std::path::Path) {
    let pos = layerwise_runtime::Tensor::f32(vec![64, 1], (4000..4064).map(|p| p as f32).collect());
    layerwise_runtime::npy::write_npz(&dir.join("pos.npz"), &[("pos", &pos)]).unwrap();
}

#[test]
fn x_plus_65504_minus_65504_is_absorbed_at_the_add_and_cancelled_at_the_sub() {
    let dir = tempfile::tempdir().unwrap();
    save(&needs_constraints(), &dir.path().join("m.onnx"));
    let out =
        layerwise(&["bisect", "m.onnx", "--cand", "sim:fp16", "--val-range", "x:1,2", "--json", "r.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "diverged: {t}");
    let v = &json(&dir.path().join("r.json"))["verdict"];
    let fd = &v["first_divergent"];
    // The Add loses x; the Sub only shows it.
    assert_eq!(fd["node"], "add_big", "{t}");
    assert_eq!(fd["cause"]["kind"], "absorption", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    // The step of FP16 at the sum (65505.7: 2^(15 - 10) = 32) against what it adds (x, at most 2).
    assert!(detail.contains("its result reaches 6.55") && detail.contains("FP16's step is 32"), "{detail}");
    assert!(detail.contains("what it adds, 'flipped', is at most 1.") && detail.contains("absorbed"), "{detail}");
    // And the cancellation at the Sub, with its numbers.
    assert!(
        detail.contains("'sub_big' (Sub) cancels the large part: its result is at most 1.")
            && detail.contains("(relative L2 1.00e0)"),
        "{detail}"
    );
    assert_eq!(v["chain"].as_array().unwrap().last().unwrap()["node"], "add_big", "the chain reaches the Add");
    assert!(
        v["breaks"].as_array().unwrap().iter().any(|b| b["node"] == "sub_big" && b["cause"]["kind"] == "cancellation"),
        "{}",
        v["breaks"]
    );
    for wrong in ["accumulated, not introduced", "drift plus a sensitive consumer", "amplifies its input error"] {
        assert!(!t.contains(wrong), "'{wrong}' in: {t}");
    }
    assert!(t.contains("yet the error is not accumulated: it is one rounding at 'add_big' (Add)"), "{t}");
    // Run alone, the Add's relative L2 is tiny by nature; what it loses is absolute.
    let report = json(&dir.path().join("r.json"));
    let add =
        report["isolation"]["nodes"].as_array().unwrap().iter().find(|n| n["node"] == "add_big").cloned().unwrap();
    assert_eq!(add["role"], "loses", "{add}");
    assert!(add["note"].as_str().unwrap().contains("run alone it is off by up to 1.71"), "{add}");
    assert!(t.contains("keeping add_big (offset_and_back) at reference precision removes 100% of the error"), "{t}");

    // `fix` keeps the Add and the Sub, and its verdict says why.
    let out =
        layerwise(&["fix", "m.onnx", "--val-range", "x:1,2", "-o", "fixed.onnx", "--json", "fix.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "fixed: {t}");
    let fix = json(&dir.path().join("fix.json"));
    let kept = serde_json::to_string(&fix).unwrap();
    assert!(kept.contains("add_big") && kept.contains("sub_big"), "{kept}");
    assert!(t.contains("keep offset_and_back [add_big, sub_big]"), "{t}");
    assert!(
        t.contains("because add_big (Add)") && t.contains("it is absorbed") && t.contains("'sub_big' (Sub) cancels"),
        "the fix's verdict says why: {t}"
    );
}

#[test]
fn a_rotary_angle_stored_in_fp16_leaves_cos_nothing() {
    let dir = tempfile::tempdir().unwrap();
    save(&rotary(), &dir.path().join("m.onnx"));
    write_positions(dir.path());
    // Without the noise floor: FP16's rounding of inv_freq alone moves the angles too (see the
    // report); here the walk's verdict and the keep check are what is tested.
    let out =
        layerwise(&["bisect", "m.onnx", "--cand", "sim:fp16", "--inputs", "pos.npz", "--json", "r.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "diverged: {t}");
    let v = &json(&dir.path().join("r.json"))["verdict"];
    let fd = &v["first_divergent"];
    assert_eq!(fd["node"], "angle_mul", "{t}");
    assert_eq!(fd["cause"]["kind"], "periodic_argument", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    // Angles up to 4,063: FP16's step in [2048, 4096) is 2^(11 - 10) = 2, against a period of 6.28.
    assert!(
        detail.contains("reaches 4.0630e3") && detail.contains("FP16's step is 2 (0.32 of the period 2*pi = 6.28"),
        "{detail}"
    );
    assert!(detail.contains("what it returns is noise"), "{detail}");
    for wrong in ["drift plus a sensitive consumer", "amplifies its input error"] {
        assert!(!t.contains(wrong), "'{wrong}' in: {t}");
    }
    assert!(
        t.contains("keeping angle_mul (periodic_argument) at reference precision removes 100% of the error"),
        "{t}"
    );
}

#[test]
fn an_angle_computed_from_stored_positions_is_named_not_called_ill_conditioned() {
    let dir = tempfile::tempdir().unwrap();
    save(&rotary_of_stored_positions(), &dir.path().join("m.onnx"));
    let out = layerwise(&["bisect", "m.onnx", "--cand", "sim:fp16", "--json", "r.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "diverged: {t}");
    let report = json(&dir.path().join("r.json"));
    let v = &report["verdict"];
    assert!(!t.contains("ill-conditioned"), "keeping the angle fixes it, so the output is not ill-conditioned: {t}");
    let fd = &v["first_divergent"];
    assert_eq!(fd["node"], "angle_mul", "{t}");
    assert_eq!(fd["cause"]["kind"], "periodic_argument", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    assert!(detail.contains("reaches 4.0630e3") && detail.contains("FP16's step is 2"), "{detail}");
    // Off by more than half a step: the weights' own rounding is named.
    assert!(
        detail.contains("more than its own rounding (half a step, 1)")
            && detail.contains("its weights 'pos', 'inv_freq'"),
        "{detail}"
    );
    // The chain goes through the weight-derived Cos to the Mul that stores the angle.
    let chain: Vec<&str> = v["chain"].as_array().unwrap().iter().map(|s| s["node"].as_str().unwrap()).collect();
    assert_eq!(chain, ["rotate", "x_cos", "cos", "angle_mul"], "{t}");
    // Each chain node is run alone on the reference's values, the weight-derived cos_out too.
    let role = |n: &str| {
        report["isolation"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["node"] == n)
            .map(|l| l["role"].as_str().unwrap().to_string())
    };
    assert_eq!(role("x_cos").as_deref(), Some("propagates"), "{}", report["isolation"]);
    assert_eq!(role("angle_mul").as_deref(), Some("loses"), "{}", report["isolation"]);
    assert!(
        t.contains("cos errs by rel L2")
            && t.contains("fed the exact value, it still reads it stored in the candidate's format"),
        "{t}"
    );
    assert!(
        t.contains("keeping angle_mul (periodic_argument) at reference precision removes 100% of the error"),
        "{t}"
    );
}

/// Integer positions 4000-4063 cast to float, then times the frequencies (a MatMul) into Sin and
/// Cos, as rotary embeddings take them: FP16 rounds the positions in the Cast (step 2 at 4000)
/// and the angles again in the MatMul. The Cast is the first divergent layer (the MatMul only
/// carries its error), the MatMul's storage is named as the second rounding, and the path from
/// the Cast to the Sin and Cos is kept whole: that removes the error, where keeping the angle's
/// own pattern alone leaves it (the angle's MatMul was named, keeping it removed
/// 32%, and the verdict ended in "drift plus a sensitive consumer").
#[test]
fn cast_positions_and_the_angle_are_two_roundings_kept_as_one_path() {
    use layerwise_model::builder::attr;
    let mut b = ModelBuilder::new("rotary_cast", 17);
    b.input("pos", DataType::Int64, &[Dim::from(64)]);
    let inv_freq: Vec<f32> = (0..16).map(|i| 10000f32.powf(-(i as f32) / 16.0)).collect();
    b.initializer(f32_tensor("inv_freq", &[1, 16], &inv_freq));
    b.initializer(layerwise_model::builder::i64_tensor("axes", &[1], &[1]));
    b.node("Cast", "pos_cast", &["pos"], &["pos_f"], vec![attr::int("to", DataType::Float as i64)]);
    b.node("Unsqueeze", "unsq", &["pos_f", "axes"], &["pos_col"], vec![]);
    b.node("MatMul", "angle_mm", &["pos_col", "inv_freq"], &["angle"], vec![]);
    b.node("Sin", "sin", &["angle"], &["sin_out"], vec![]);
    b.node("Cos", "cos", &["angle"], &["cos_out"], vec![]);
    b.output("sin_out", DataType::Float);
    b.output("cos_out", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    save(&b.build(), &dir.path().join("m.onnx"));
    let pos = layerwise_runtime::Tensor::new(vec![64], layerwise_model::TensorData::I64((4000..4064).collect()));
    layerwise_runtime::npy::write_npz(&dir.path().join("pos.npz"), &[("pos", &pos)]).unwrap();
    let out = layerwise(&["bisect", "m.onnx", "--inputs", "pos.npz", "--json", "r.json"], dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "diverged: {t}");
    let report = json(&dir.path().join("r.json"));
    let fd = &report["verdict"]["first_divergent"];
    assert_eq!(
        (fd["node"].as_str(), fd["cause"]["kind"].as_str()),
        (Some("pos_cast"), Some("periodic_argument")),
        "{t}"
    );
    let detail = fd["cause"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("FP16's step is 2") && detail.contains("stored again at 'angle' (angle_mm, MatMul, step 2)"),
        "{detail}"
    );
    let checks = report["counterfactual"]["checks"].as_array().unwrap();
    let path = checks.iter().find(|c| c["node"] == "pos_cast").unwrap();
    assert_eq!(path["kept"], serde_json::json!(["pos_cast", "unsq", "angle_mm", "sin", "cos"]), "{t}");
    assert_eq!(path["fixes"], true, "{t}");
    // The angle's own pattern (the MatMul with its Sin and Cos) kept alone leaves the Cast's rounding.
    let angle_alone = checks.iter().find(|c| c["kept"].as_array().is_some_and(|k| !k.contains(&"pos_cast".into())));
    assert!(angle_alone.is_some_and(|c| c["fixes"] == false), "{t}");
    assert!(!t.contains("drift plus a sensitive consumer"), "{t}");
    let out = layerwise(&["fix", "m.onnx", "--inputs", "pos.npz", "--json", "f.json"], dir.path());
    let f = json(&dir.path().join("f.json"));
    assert_eq!(f["status"], "fixed", "{}", text(&out));
    assert_eq!(f["keep_fp32"], path["kept"], "{}", text(&out));
}
