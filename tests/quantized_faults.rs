//! Planted quantization faults: each small Q/DQ model carries one fault, and the walk
//! must name the node it breaks with the cause that explains it and the numbers that size it:
//! a scale shrunk 16x (clipping, counted), one activation channel 1000x larger before a per-tensor
//! quantizer (the step the outlier forces), a per-tensor weight with one channel 1000x larger
//! (unequal channels), and a float8 e4m3fn quantizer too small for its values.

use crate::common::quantized::{int8_tensor, weights};
use crate::common::{json, layerwise, save, text};
use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::{ModelProto, TensorProto};
use layerwise_model::DataType;

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// x[4,8] -> MatMul(w1) -> h -> Mul(c) -> hs -> MatMul(w2) -> y: `c` scales each of h's 8
/// channels, so a channel can be planted far larger than the others.
fn float_model(w1: &[f32], c: &[f32], w2: &[f32]) -> ModelProto {
    let mut b = ModelBuilder::new("mlp", 17);
    b.input("x", DataType::Float, &[Dim::from(4), Dim::from(8)]);
    b.initializer(f32_tensor("w1", &[8, 8], w1));
    b.initializer(f32_tensor("c", &[8], c));
    b.initializer(f32_tensor("w2", &[8, 4], w2));
    b.node("MatMul", "mm1", &["x", "w1"], &["h"], vec![]);
    b.node("Mul", "scale", &["h", "c"], &["hs"], vec![]);
    b.node("MatMul", "mm2", &["hs", "w2"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// The same quantized as a static QDQ tool writes it: w1 stored in int8 with one scale (per
/// tensor, max|w1| / 63: quantize_static's `reduce_range`, without which ONNX Runtime's fused
/// u8s8 kernel saturates on an x86 CPU without VNNI, `common::quantized::per_tensor_int8_reduced`),
/// x and hs quantized per tensor in int8 (zero point 0) with scales that
/// cover their range (x in [-1, 1]; hs's bound below), `hs_scale` times that of hs.
fn qdq_model(w1: &[f32], c: &[f32], w2: &[f32], hs_scale: f32) -> ModelProto {
    let s1 = max_abs(w1) / 63.0;
    // |hs_j| <= 8 max_k |w1_kj| |c_j| for x in [-1, 1].
    let shs = (0..8)
        .map(|j| 8.0 * max_abs(&(0..8).map(|k| w1[k * 8 + j]).collect::<Vec<_>>()) * c[j].abs())
        .fold(0f32, f32::max)
        / 127.0
        * hs_scale;
    let mut b = ModelBuilder::new("mlp_int8", 17);
    b.input("x", DataType::Float, &[Dim::from(4), Dim::from(8)]);
    b.initializer(int8_tensor("w1_q", &[8, 8], &w1.iter().map(|v| (v / s1).round() as i32).collect::<Vec<_>>()));
    b.initializer(f32_tensor("c", &[8], c));
    b.initializer(f32_tensor("w2", &[8, 4], w2));
    b.initializer(f32_tensor("s1", &[], &[s1]));
    b.initializer(f32_tensor("sx", &[], &[1.0 / 127.0]));
    b.initializer(f32_tensor("shs", &[], &[shs]));
    b.initializer(int8_tensor("z0", &[], &[0]));
    b.node("DequantizeLinear", "w1_dq", &["w1_q", "s1", "z0"], &["w1_f"], vec![]);
    b.node("QuantizeLinear", "x_q", &["x", "sx", "z0"], &["x_q8"], vec![]);
    b.node("DequantizeLinear", "x_dq", &["x_q8", "sx", "z0"], &["x_f"], vec![]);
    b.node("MatMul", "mm1", &["x_f", "w1_f"], &["h"], vec![]);
    b.node("Mul", "scale", &["h", "c"], &["hs"], vec![]);
    b.node("QuantizeLinear", "hs_q", &["hs", "shs", "z0"], &["hs_q8"], vec![]);
    b.node("DequantizeLinear", "hs_dq", &["hs_q8", "shs", "z0"], &["hs_f"], vec![]);
    b.node("MatMul", "mm2", &["hs_f", "w2"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// Runs bisect of `float` against `quantized` (x in [-1, 1], default tolerances) and returns the
/// report and the terminal text.
fn bisect(float: &ModelProto, quantized: &ModelProto) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    save(float, &dir.path().join("m.onnx"));
    save(quantized, &dir.path().join("q.onnx"));
    let out = layerwise(
        &[
            "bisect",
            "m.onnx",
            "--cand",
            "ort:cpu",
            "--cand-model",
            "q.onnx",
            "--val-range",
            "x:-1,1",
            "--json",
            "r.json",
        ],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "diverged: {t}");
    let report = json(&dir.path().join("r.json"));
    // The fault is far above the floor: a step the fault forces is not counted in it.
    assert!(report["noise_floor"]["ratio"].as_f64().unwrap() > 10.0, "{}", report["noise_floor"]);
    (report, t)
}

/// Nothing in the verdict says FP16: the models hold no FP16 tensor.
fn no_fp16(report: &serde_json::Value, t: &str) {
    assert!(!t.contains("FP16"), "{t}");
    for said in [&report["verdict"], &report["cand"]["notes"], &report["tolerances"]] {
        assert!(!said.to_string().contains("FP16"), "{said}");
    }
}

/// hs's quantizer with its scale shrunk 16x: most of hs is clipped. Named at mm2, which reads the
/// clipped hs, with how many values are clipped and how far.
#[test]
fn a_scale_shrunk_16x_is_clipping_with_the_values_counted() {
    let (w1, w2) = (weights(64, 1), weights(32, 2));
    let c = [1.0; 8];
    let (report, t) = bisect(&float_model(&w1, &c, &w2), &qdq_model(&w1, &c, &w2, 1.0 / 16.0));
    let fd = &report["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "mm2", "{t}");
    assert_eq!(fd["cause"]["kind"], "quantizer_clipping", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    eprintln!("{detail}");
    assert!(
        detail.contains("int8 quantizer of its input 'hs' holds [")
            && detail.contains("of its 32 values (")
            && detail.contains("are beyond it and clipped to its end, by up to"),
        "{detail}"
    );
    assert!(!detail.contains("not measured") && !detail.contains("not counted"), "{detail}");
    no_fp16(&report, &t);
}

/// Channel 0 of hs is 1000x larger (and w2's row for it 1000x smaller, so y depends on every
/// channel alike): the per-tensor quantizer of hs covers it, and its step rounds the other
/// channels to 0.
#[test]
fn one_channel_1000x_larger_before_a_per_tensor_quantizer_is_an_outlier_step() {
    let (w1, mut w2) = (weights(64, 1), weights(32, 2));
    let mut c = [1.0; 8];
    c[0] = 1000.0;
    for v in &mut w2[..4] {
        *v /= 1000.0;
    }
    let (report, t) = bisect(&float_model(&w1, &c, &w2), &qdq_model(&w1, &c, &w2, 1.0));
    let fd = &report["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "mm2", "{t}");
    assert_eq!(fd["cause"]["kind"], "quantizer_outlier_step", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    eprintln!("{detail}");
    assert!(
        detail.contains("int8 per-tensor quantizer of its input 'hs' has one step of")
            && detail.contains("in channel 0, while every other channel (28 values) stays within"),
        "{detail}"
    );
    assert!(
        detail.contains("and that step rounds 28 of its 32 values (87.5%) to 0")
            && detail.contains("with a step fit to the bulk"),
        "{detail}"
    );
    assert!(
        report["verdict"]["conclusions"]
            .to_string()
            .contains("'hs' (step 6.09e1 forced by outliers, taken as 1.21e-2)"),
        "{t}"
    );
    no_fp16(&report, &t);
}

/// Column 0 of w1 (mm1's output channel 0) is 1000x larger and the Mul after it scales that
/// channel back (as a folded normalization does), and w1 is stored with one scale: the other
/// channels keep at most a step or two. h passes (its error is within 5% of its largest value,
/// channel 0's); the Mul that evens the channels out breaks, and the cause names w1.
#[test]
fn a_per_tensor_weight_with_one_channel_1000x_larger_is_named_with_its_channels() {
    let (mut w1, w2) = (weights(64, 1), weights(32, 2));
    for row in 0..8 {
        w1[row * 8] *= 1000.0;
    }
    let mut c = [1.0; 8];
    c[0] = 1.0 / 1000.0;
    let (report, t) = bisect(&float_model(&w1, &c, &w2), &qdq_model(&w1, &c, &w2, 1.0));
    let fd = &report["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "scale", "{t}");
    assert_eq!(fd["cause"]["kind"], "per_tensor_weight", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    eprintln!("{detail}");
    assert!(detail.contains("MatMul 'mm1', which computes this node's input, reads weight 'w1', stored int8 with one scale for the whole tensor") && detail.contains("8 output channels (axis 1)"), "{detail}");
    assert!(detail.contains("7 of them stay below 2 steps"), "{detail}");
    assert!(
        report["verdict"]["conclusions"]
            .to_string()
            .contains("'w1' (one scale 1.53e1 for channels 1401x apart, taken per channel)"),
        "{t}"
    );
    // The weights' share is measured: every weight quantizer on and the activations float gives
    // most of the candidate's error, and the verdict says no activation quantizer removes it.
    let alone = &report["quantizers_alone"];
    let (weights, candidate) = (
        alone["weights_together"].as_f64().unwrap_or_else(|| panic!("{alone}")),
        alone["candidate_error"].as_f64().unwrap(),
    );
    assert!(weights >= 0.5 * candidate, "{alone}");
    assert!(t.contains("the weights' rounding carries much of the error"), "{t}");
    no_fp16(&report, &t);
}

/// x[1,8] -> MatMul(w1) -> h -> MatMul(w2) -> y with h quantized to float8 e4m3fn at scale
/// `scale` (its largest finite value is 448 * scale).
fn fp8_models(w1: &[f32], w2: &[f32], scale: f32) -> (ModelProto, ModelProto) {
    let build = |quantized: bool| {
        let mut b = ModelBuilder::new("mlp_fp8", 19);
        b.input("x", DataType::Float, &[Dim::from(4), Dim::from(8)]);
        b.initializer(f32_tensor("w1", &[8, 8], w1));
        b.initializer(f32_tensor("w2", &[8, 4], w2));
        b.node("MatMul", "mm1", &["x", "w1"], &["h"], vec![]);
        let read = if quantized {
            b.initializer(f32_tensor("s", &[], &[scale]));
            b.initializer(TensorProto {
                name: Some("z8".into()),
                dims: vec![],
                data_type: Some(DataType::Float8e4m3fn as i32),
                int32_data: vec![0],
                ..Default::default()
            });
            b.node("QuantizeLinear", "h_q", &["h", "s", "z8"], &["h_q8"], vec![]);
            b.node("DequantizeLinear", "h_dq", &["h_q8", "s", "z8"], &["h_f"], vec![]);
            "h_f"
        } else {
            "h"
        };
        b.node("MatMul", "mm2", &[read, "w2"], &["y"], vec![]);
        b.output("y", DataType::Float);
        b.build()
    };
    (build(false), build(true))
}

/// A float8 e4m3fn quantizer whose scale leaves it a largest value of 448/1024 = 0.44, below
/// most of h: judged by FP8's defaults and floor (never FP16), and the clipping counted.
#[test]
fn an_fp8_quantizer_too_small_is_judged_as_fp8_and_its_clipping_counted() {
    let (w1, w2) = (weights(64, 1), weights(32, 2));
    let (float, quantized) = fp8_models(&w1, &w2, 1.0 / 1024.0);
    let (report, t) = bisect(&float, &quantized);
    assert_eq!(report["tolerances"]["defaults_for"], "FP8 E4M3", "{t}");
    assert_eq!(report["noise_floor"]["rounds"], "one step of each quantizer", "{}", report["noise_floor"]);
    let fd = &report["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "mm2", "{t}");
    assert_eq!(fd["cause"]["kind"], "quantizer_clipping", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    eprintln!("{detail}");
    assert!(
        detail.contains("float8 e4m3fn quantizer of its input 'h' holds [-4.3750e-1, 4.3750e-1]")
            && detail.contains("are beyond it and clipped"),
        "{detail}"
    );
    no_fp16(&report, &t);
}

/// x[4,8] -> MatMul(w1) -> h -> Relu -> r -> MatMul(w2) -> y; quantized, x in int8 (zero point 0)
/// and r in int8 with zero point `zero_point` and a scale whose range ends at r's bound
/// (|r| <= 8 max|w1|): r is never negative, so the codes below the zero point are never used.
fn relu_models(w1: &[f32], w2: &[f32], zero_point: i32) -> (ModelProto, ModelProto) {
    let build = |quantized: bool| {
        let mut b = ModelBuilder::new("relu_mlp", 17);
        b.input("x", DataType::Float, &[Dim::from(4), Dim::from(8)]);
        b.initializer(f32_tensor("w1", &[8, 8], w1));
        b.initializer(f32_tensor("w2", &[8, 4], w2));
        let x = if quantized {
            b.initializer(f32_tensor("sx", &[], &[1.0 / 127.0]));
            b.initializer(int8_tensor("z0", &[], &[0]));
            b.node("QuantizeLinear", "x_q", &["x", "sx", "z0"], &["x_q8"], vec![]);
            b.node("DequantizeLinear", "x_dq", &["x_q8", "sx", "z0"], &["x_f"], vec![]);
            "x_f"
        } else {
            "x"
        };
        b.node("MatMul", "mm1", &[x, "w1"], &["h"], vec![]);
        b.node("Relu", "relu", &["h"], &["r"], vec![]);
        let r = if quantized {
            b.initializer(f32_tensor("sr", &[], &[8.0 * max_abs(w1) / (127 - zero_point) as f32]));
            b.initializer(int8_tensor("zr", &[], &[zero_point]));
            b.node("QuantizeLinear", "r_q", &["r", "sr", "zr"], &["r_q8"], vec![]);
            b.node("DequantizeLinear", "r_dq", &["r_q8", "sr", "zr"], &["r_f"], vec![]);
            "r_f"
        } else {
            "r"
        };
        b.node("MatMul", "mm2", &[r, "w2"], &["y"], vec![]);
        b.output("y", DataType::Float);
        b.build()
    };
    (build(false), build(true))
}

/// r = Relu(h) is quantized in int8 with zero point 120: its values, never negative, take codes
/// from 120 up, at most 8 of 256, and the step is 36x coarser than a zero point of -128 keeping
/// the range's upper end would give. Named at mm2 with the unused share and the step that fits.
#[test]
fn a_zero_point_that_shifts_a_one_sided_range_is_named_with_the_codes_unused() {
    let (w1, w2) = (weights(64, 1), weights(32, 2));
    let (float, quantized) = relu_models(&w1, &w2, 120);
    let (report, t) = bisect(&float, &quantized);
    let fd = &report["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "mm2", "{t}");
    assert_eq!(fd["cause"]["kind"], "quantizer_zero_point", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    eprintln!("{detail}");
    assert!(
        detail.contains("int8 quantizer of its input 'r' has zero point 120")
            && detail.contains("while the reference's values are never negative (0.0000e0 to"),
        "{detail}"
    );
    assert!(detail.contains("they take codes 120 to ") && detail.contains("of its 256 codes, and 9") && detail.contains("% of the codes are never used; a zero point of -128 keeping its end at 7.9094e0 would give a step of 3.1017e-2, 36.4x finer"), "{detail}");
    no_fp16(&report, &t);
}

/// The same with zero point -128, r's faithful quantizer: it passes, and no cause is named.
#[test]
fn a_zero_point_at_the_end_of_a_one_sided_range_passes() {
    let (w1, w2) = (weights(64, 1), weights(32, 2));
    let (float, quantized) = relu_models(&w1, &w2, -128);
    let dir = tempfile::tempdir().unwrap();
    save(&float, &dir.path().join("m.onnx"));
    save(&quantized, &dir.path().join("q.onnx"));
    let out = layerwise(
        &[
            "bisect",
            "m.onnx",
            "--cand",
            "ort:cpu",
            "--cand-model",
            "q.onnx",
            "--val-range",
            "x:-1,1",
            "--json",
            "r.json",
        ],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(!t.contains("zero point"), "{t}");
}

/// A LayerNorm without its mean: y = xs / Sqrt(ReduceMean(xs * xs) + 1e-12), xs = x * c with row
/// 0 scaled by 1e-2. Quantized, the variance (ve) is uint8 with step 1/255 (the other rows' range):
/// row 0's variance, about 3e-5, is below half a step and rounds to 0, so its quotient is inf.
fn layernorm_models() -> (ModelProto, ModelProto) {
    let build = |quantized: bool| {
        let mut b = ModelBuilder::new("rms_norm", 17);
        b.input("x", DataType::Float, &[Dim::from(4), Dim::from(8)]);
        b.initializer(f32_tensor("c", &[4, 1], &[1e-2, 1.0, 1.0, 1.0]));
        b.initializer(f32_tensor("eps", &[], &[1e-12]));
        b.node("Mul", "scale", &["x", "c"], &["xs"], vec![]);
        b.node("Mul", "square", &["xs", "xs"], &["sq"], vec![]);
        b.node("ReduceMean", "mean", &["sq"], &["var"], vec![attr::ints("axes", &[1]), attr::int("keepdims", 1)]);
        b.node("Add", "add_eps", &["var", "eps"], &["ve"], vec![]);
        let ve = if quantized {
            b.initializer(f32_tensor("sv", &[], &[1.0 / 255.0]));
            b.initializer(TensorProto {
                name: Some("zv".into()),
                dims: vec![],
                data_type: Some(DataType::Uint8 as i32),
                int32_data: vec![0],
                ..Default::default()
            });
            b.node("QuantizeLinear", "ve_q", &["ve", "sv", "zv"], &["ve_q8"], vec![]);
            b.node("DequantizeLinear", "ve_dq", &["ve_q8", "sv", "zv"], &["ve_f"], vec![]);
            "ve_f"
        } else {
            "ve"
        };
        b.node("Sqrt", "sqrt", &[ve], &["sd"], vec![]);
        b.node("Div", "div", &["xs", "sd"], &["y"], vec![]);
        b.output("y", DataType::Float);
        b.build()
    };
    (build(false), build(true))
}

/// The variance under a Sqrt and a Div rounds to 0 in one row: named at the Div, with the count
/// of values rounded to 0 and the inf values it gives.
#[test]
fn a_denominator_quantized_to_0_is_named_with_the_values_it_rounds_away() {
    let (float, quantized) = layernorm_models();
    let dir = tempfile::tempdir().unwrap();
    save(&float, &dir.path().join("m.onnx"));
    save(&quantized, &dir.path().join("q.onnx"));
    let out = layerwise(
        &[
            "bisect",
            "m.onnx",
            "--cand",
            "ort:cpu",
            "--cand-model",
            "q.onnx",
            "--val-range",
            "x:-1,1",
            "--json",
            "r.json",
        ],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let report = json(&dir.path().join("r.json"));
    let fd = &report["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "div", "{t}");
    assert_eq!(fd["cause"]["kind"], "quantized_denominator", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    eprintln!("{detail}");
    assert!(detail.contains("the Div's denominator is the Sqrt of 've', which the candidate's uint8 quantizer (step 3.9216e-3, zero point 0) rounds: 1 of its 4 values round to 0"), "{detail}");
    assert!(detail.contains("'y' has 8 inf/NaN values where the reference has none"), "{detail}");
    no_fp16(&report, &t);
}

/// x[1,140000] -> MatMul(w, all 1.0) -> y, and the same with x and w quantized in int8 (step
/// 1/127, zero point 0): run with only y, ONNX Runtime fuses the pair into an integer kernel whose
/// int32 sum of 140,000 products of about 126 x 127 passes 2^31 and wraps around.
fn long_dot_models() -> (ModelProto, ModelProto) {
    const K: usize = 140_000;
    let build = |quantized: bool| {
        let mut b = ModelBuilder::new("long_dot", 17);
        b.input("x", DataType::Float, &[Dim::from(1), Dim::from(K as i64)]);
        let (x, w) = if quantized {
            b.initializer(int8_tensor("w_q", &[K as i64, 1], &vec![127; K]));
            b.initializer(f32_tensor("s", &[], &[1.0 / 127.0]));
            b.initializer(int8_tensor("z0", &[], &[0]));
            b.node("DequantizeLinear", "w_dq", &["w_q", "s", "z0"], &["w_f"], vec![]);
            b.node("QuantizeLinear", "x_q", &["x", "s", "z0"], &["x_q8"], vec![]);
            b.node("DequantizeLinear", "x_dq", &["x_q8", "s", "z0"], &["x_f"], vec![]);
            ("x_f", "w_f")
        } else {
            b.initializer(f32_tensor("w", &[K as i64, 1], &vec![1.0; K]));
            ("x", "w")
        };
        b.node("MatMul", "mm", &[x, w], &["y"], vec![]);
        b.output("y", DataType::Float);
        b.build()
    };
    (build(false), build(true))
}

/// The int32 sums of the fused MatMul wrap around: named at mm with the products per sum, the
/// weight's largest channel sum and the activation's largest code on the reference's values.
#[test]
fn an_integer_accumulator_that_passes_2_to_the_31_is_named_with_its_sums() {
    let (float, quantized) = long_dot_models();
    let dir = tempfile::tempdir().unwrap();
    save(&float, &dir.path().join("m.onnx"));
    save(&quantized, &dir.path().join("q.onnx"));
    let out = layerwise(
        &[
            "bisect",
            "m.onnx",
            "--cand",
            "ort:cpu",
            "--cand-model",
            "q.onnx",
            "--val-range",
            "x:0.99,1",
            "--json",
            "r.json",
        ],
        dir.path(),
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let report = json(&dir.path().join("r.json"));
    let fd = &report["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "mm", "{t}");
    assert_eq!(fd["cause"]["kind"], "integer_accumulator_overflow", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    eprintln!("{detail}");
    assert!(detail.contains("MatMul 'mm' multiplies int8 codes by weight 'w_q' stored int8, as an integer kernel sums them in an int32 accumulator: each sum runs over 140000 products, the stored weight's output channel 0 sums |w - zero point| to 17780000, and its input 'x' reaches |code - zero point| = 127 on the reference's values"), "{detail}");
    assert!(detail.contains("the int32 limit 2^31 = 2.1475e9: it wraps around"), "{detail}");
    no_fp16(&report, &t);
}

/// x -> MatMul(w1, stored int8) -> h -> MatMul(w2) -> y with x and h quantized int8, h's scale
/// 16x too small: the integer MatMul's requantization saturates. Named clipping at mm2, which
/// reads h, as the requantization of mm1's sums.
#[test]
fn a_requantization_that_saturates_is_clipping_named_as_the_requantization() {
    let (w1, w2) = (weights(64, 1), weights(32, 2));
    // Seven-bit weight codes, as `qdq_model`'s (no saturation of the u8s8 kernel without VNNI).
    let s1 = max_abs(&w1) / 63.0;
    let build = |quantized: bool| {
        let mut b = ModelBuilder::new("mlp", 17);
        b.input("x", DataType::Float, &[Dim::from(4), Dim::from(8)]);
        b.initializer(f32_tensor("w2", &[8, 4], &w2));
        let (x, w) = if quantized {
            b.initializer(int8_tensor(
                "w1_q",
                &[8, 8],
                &w1.iter().map(|v| (v / s1).round() as i32).collect::<Vec<_>>(),
            ));
            b.initializer(f32_tensor("s1", &[], &[s1]));
            b.initializer(f32_tensor("sx", &[], &[1.0 / 127.0]));
            b.initializer(int8_tensor("z0", &[], &[0]));
            b.node("DequantizeLinear", "w1_dq", &["w1_q", "s1", "z0"], &["w1_f"], vec![]);
            b.node("QuantizeLinear", "x_q", &["x", "sx", "z0"], &["x_q8"], vec![]);
            b.node("DequantizeLinear", "x_dq", &["x_q8", "sx", "z0"], &["x_f"], vec![]);
            ("x_f", "w1_f")
        } else {
            b.initializer(f32_tensor("w1", &[8, 8], &w1));
            ("x", "w1")
        };
        b.node("MatMul", "mm1", &[x, w], &["h"], vec![]);
        let h = if quantized {
            // |h| <= 8 max|w1| for x in [-1, 1]; 16x too small.
            b.initializer(f32_tensor("sh", &[], &[8.0 * max_abs(&w1) / 127.0 / 16.0]));
            b.node("QuantizeLinear", "h_q", &["h", "sh", "z0"], &["h_q8"], vec![]);
            b.node("DequantizeLinear", "h_dq", &["h_q8", "sh", "z0"], &["h_f"], vec![]);
            "h_f"
        } else {
            "h"
        };
        b.node("MatMul", "mm2", &[h, "w2"], &["y"], vec![]);
        b.output("y", DataType::Float);
        b.build()
    };
    let (report, t) = bisect(&build(false), &build(true));
    let fd = &report["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "mm2", "{t}");
    assert_eq!(fd["cause"]["kind"], "quantizer_clipping", "{t}");
    let detail = fd["cause"]["detail"].as_str().unwrap();
    eprintln!("{detail}");
    assert!(detail.contains("int8 quantizer of its input 'h' (the requantization of MatMul 'mm1''s int32 sums, which a fused integer kernel saturates) holds ["), "{detail}");
    no_fp16(&report, &t);
}
