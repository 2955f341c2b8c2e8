//! The small Q/DQ models of tests/quantized.rs and the schema's quantized run.

use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::{ModelProto, TensorProto};
use layerwise_model::DataType;

pub fn int8_tensor(name: &str, dims: &[i64], values: &[i32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Int8 as i32),
        int32_data: values.to_vec(),
        ..Default::default()
    }
}

/// Seeded weights in [-1, 1).
pub fn weights(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// `w` stored int8 with one scale, as quantize_static stores a per-tensor weight: the codes and
/// the scale (max |w| / 127).
pub fn per_tensor_int8(w: &[f32]) -> (Vec<i32>, f32) {
    let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
    (w.iter().map(|v| (v / scale).round() as i32).collect(), scale)
}

/// `w` stored as quantize_static stores a per-tensor weight with `reduce_range=True`: codes within
/// +-63, scale max |w| / 63. ONNX Runtime's fused u8s8 kernels on an x86 CPU without VNNI (AVX2
/// only) sum each pair of products in 16 bits: an activation code up to 255 times a weight code of
/// 127, twice, saturates; times 63 it does not. With full-range weights, `qdq_model` computed y at
/// rel L2 6.59e-1 from the float model on such a CPU (an AMD EPYC with AVX2) and 9.77e-3 with the
/// Q/DQ fusions off: the tests that use it judge layerwise, not the CPU's kernels.
pub fn per_tensor_int8_reduced(w: &[f32]) -> (Vec<i32>, f32) {
    let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())) / 63.0;
    (w.iter().map(|v| (v / scale).round() as i32).collect(), scale)
}

/// x[1,8] -> MatMul(w1) -> h -> Relu -> r -> MatMul(w2) -> y.
pub fn float_model(w1: &[f32], w2: &[f32]) -> ModelProto {
    let mut b = ModelBuilder::new("mlp", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(f32_tensor("w1", &[8, 8], w1));
    b.initializer(f32_tensor("w2", &[8, 4], w2));
    b.node("MatMul", "mm1", &["x", "w1"], &["h"], vec![]);
    b.node("Relu", "relu", &["h"], &["r"], vec![]);
    b.node("MatMul", "mm2", &["r", "w2"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// The same model quantized as ONNX Runtime's quantize_static writes it (QDQ, int8): weights
/// stored in int8 with a per-tensor scale (7 bits, `per_tensor_int8_reduced`), activations quantized, and the Relu taken over by the
/// quantizer after mm1 (zero point -128: it clips at 0), which leaves the name 'r' on mm1's output.
pub fn qdq_model(w1: &[f32], w2: &[f32]) -> ModelProto {
    qdq_model_stored(w1, w2, per_tensor_int8_reduced)
}

/// `qdq_model` with its weights stored by `store` (codes, scale): `per_tensor_int8` gives the
/// full-range codes that saturate the fused u8s8 kernels of an x86 CPU without VNNI.
pub fn qdq_model_stored(w1: &[f32], w2: &[f32], store: fn(&[f32]) -> (Vec<i32>, f32)) -> ModelProto {
    let ((w1_q, s1), (w2_q, s2)) = (store(w1), store(w2));
    // |h| <= 8 * max|w1| for x in [-1, 1].
    let sr = 8.0 * w1.iter().fold(0f32, |m, v| m.max(v.abs())) / 255.0;
    let mut b = ModelBuilder::new("mlp_int8", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(int8_tensor("w1_q", &[8, 8], &w1_q));
    b.initializer(int8_tensor("w2_q", &[8, 4], &w2_q));
    b.initializer(f32_tensor("s1", &[], &[s1]));
    b.initializer(f32_tensor("s2", &[], &[s2]));
    b.initializer(f32_tensor("sx", &[], &[1.0 / 127.0]));
    b.initializer(f32_tensor("sr", &[], &[sr]));
    b.initializer(int8_tensor("z0", &[], &[0]));
    b.initializer(int8_tensor("zmin", &[], &[-128]));
    b.node("DequantizeLinear", "w1_dq", &["w1_q", "s1", "z0"], &["w1_f"], vec![]);
    b.node("DequantizeLinear", "w2_dq", &["w2_q", "s2", "z0"], &["w2_f"], vec![]);
    b.node("QuantizeLinear", "x_q", &["x", "sx", "z0"], &["x_q8"], vec![]);
    b.node("DequantizeLinear", "x_dq", &["x_q8", "sx", "z0"], &["x_f"], vec![]);
    b.node("MatMul", "mm1", &["x_f", "w1_f"], &["r"], vec![]);
    b.node("QuantizeLinear", "r_q", &["r", "sr", "zmin"], &["r_q8"], vec![]);
    b.node("DequantizeLinear", "r_dq", &["r_q8", "sr", "zmin"], &["r_f"], vec![]);
    b.node("MatMul", "mm2", &["r_f", "w2_f"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// The planted fault of the floor test (the scale of the quantizer after mm1 shrunk 16x).
pub fn clipped_model(w1: &[f32], w2: &[f32]) -> ModelProto {
    let mut clipped = qdq_model(w1, w2);
    for w in clipped.graph.as_mut().unwrap().initializer.iter_mut().filter(|w| w.name() == "sr") {
        let s = f32::from_le_bytes(
            w.raw_data.as_deref().map(|r| [r[0], r[1], r[2], r[3]]).unwrap_or_else(|| w.float_data[0].to_le_bytes()),
        );
        *w = f32_tensor("sr", &[], &[s / 16.0]);
    }
    clipped
}

/// The MLP of `float_model` in the QOperator format (quantize_static's QuantFormat.QOperator):
/// mm1 is one QLinearMatMul on int8 values, between a QuantizeLinear of x and a DequantizeLinear
/// of its int8 output h, so no float node stands for it. `shrink` divides h's scale (16: h clips).
pub fn qoperator_model(w1: &[f32], w2: &[f32], shrink: f32) -> ModelProto {
    let s1 = w1.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
    let mut b = ModelBuilder::new("mlp_qoperator", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(int8_tensor("w1_q", &[8, 8], &w1.iter().map(|v| (v / s1).round() as i32).collect::<Vec<_>>()));
    b.initializer(f32_tensor("w2", &[8, 4], w2));
    b.initializer(f32_tensor("s1", &[], &[s1]));
    b.initializer(f32_tensor("sx", &[], &[1.0 / 127.0]));
    // |h| <= 8 * max|w1| for x in [-1, 1].
    b.initializer(f32_tensor("sh", &[], &[8.0 * s1 / shrink]));
    b.initializer(int8_tensor("z0", &[], &[0]));
    b.node("QuantizeLinear", "x_q", &["x", "sx", "z0"], &["x_q8"], vec![]);
    b.node("QLinearMatMul", "mm1", &["x_q8", "sx", "z0", "w1_q", "s1", "z0", "sh", "z0"], &["h_q8"], vec![]);
    b.node("DequantizeLinear", "h_dq", &["h_q8", "sh", "z0"], &["h"], vec![]);
    b.node("Relu", "relu", &["h"], &["r"], vec![]);
    b.node("MatMul", "mm2", &["r", "w2"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// The MLP of `float_model` in the QOperator format with both MatMuls integer ops, as
/// quantize_static writes it: the Relu folded into mm1's output quantizer (zero point -128: it
/// clips at 0), whose codes are named after mm1's output ('h_quantized'), not the Relu's.
/// `shrink` divides that quantizer's scale (16: h clips above too).
pub fn qoperator_relu_folded_model(w1: &[f32], w2: &[f32], shrink: f32) -> ModelProto {
    let ((w1_q, s1), (w2_q, s2)) = (per_tensor_int8(w1), per_tensor_int8(w2));
    let mut b = ModelBuilder::new("mlp_qoperator_relu", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(int8_tensor("w1_quantized", &[8, 8], &w1_q));
    b.initializer(int8_tensor("w2_quantized", &[8, 4], &w2_q));
    b.initializer(f32_tensor("w1_scale", &[], &[s1]));
    b.initializer(f32_tensor("w2_scale", &[], &[s2]));
    b.initializer(f32_tensor("x_scale", &[], &[1.0 / 127.0]));
    // |h| <= 8 * max|w1| for x in [-1, 1]; [0, that] in 255 steps.
    b.initializer(f32_tensor("h_scale", &[], &[8.0 * s1 * 127.0 / 255.0 / shrink]));
    let y_max: f32 = 8.0 * 8.0 * s1 * 127.0 * w2.iter().fold(0f32, |m, v| m.max(v.abs()));
    b.initializer(f32_tensor("y_scale", &[], &[y_max / 127.0]));
    b.initializer(int8_tensor("zero", &[], &[0]));
    b.initializer(int8_tensor("least", &[], &[-128]));
    b.node("QuantizeLinear", "x_QuantizeLinear", &["x", "x_scale", "zero"], &["x_quantized"], vec![]);
    b.node(
        "QLinearMatMul",
        "mm1_quant",
        &["x_quantized", "x_scale", "zero", "w1_quantized", "w1_scale", "zero", "h_scale", "least"],
        &["h_quantized"],
        vec![],
    );
    b.node(
        "QLinearMatMul",
        "mm2_quant",
        &["h_quantized", "h_scale", "least", "w2_quantized", "w2_scale", "zero", "y_scale", "zero"],
        &["y_quantized"],
        vec![],
    );
    b.node("DequantizeLinear", "y_DequantizeLinear", &["y_quantized", "y_scale", "zero"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// The MLP of `float_model` quantized as ONNX Runtime's quantize_dynamic writes it: each MatMul
/// reads x's codes from a DynamicQuantizeLinear (uint8, scale from each run's range) and its
/// weight stored int8 per tensor; the int32 sums are cast to float and multiplied by the product
/// of the two scales. `shrink` divides w1's scale (4: most of w1 saturates at +-127).
pub fn dynamic_model(w1: &[f32], w2: &[f32], shrink: f32) -> ModelProto {
    use layerwise_model::builder::attr;
    let mut b = ModelBuilder::new("mlp_dynamic", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    let to_float = || attr::int("to", DataType::Float as i64);
    for (k, w, dims, input, output) in [(1, w1, [8i64, 8], "x", "h"), (2, w2, [8, 4], "r", "y")] {
        let (mut codes, mut scale) = per_tensor_int8(w);
        if k == 1 {
            scale /= shrink;
            codes = w.iter().map(|v| (v / scale).round().clamp(-127.0, 127.0) as i32).collect();
        }
        let wq = format!("w{k}_quantized");
        b.initializer(int8_tensor(&wq, &dims, &codes));
        b.initializer(f32_tensor(&format!("w{k}_scale"), &[], &[scale]));
        b.initializer(int8_tensor(&format!("w{k}_zero_point"), &[], &[0]));
        let (xq, xs, xz) = (format!("{input}_quantized"), format!("{input}_scale"), format!("{input}_zero_point"));
        b.node("DynamicQuantizeLinear", &format!("{input}_QuantizeLinear"), &[input], &[&xq, &xs, &xz], vec![]);
        let scales = format!("mm{k}_quant_scales_mul:0");
        b.node("Mul", &format!("mm{k}_quant_scales_mul"), &[&xs, &format!("w{k}_scale")], &[&scales], vec![]);
        let sums = format!("{output}_output_quantized");
        let zp = format!("w{k}_zero_point");
        b.node("MatMulInteger", &format!("mm{k}_quant"), &[&xq, &wq, &xz, &zp], &[&sums], vec![]);
        let cast = format!("{sums}_cast_output");
        b.node("Cast", &format!("{sums}_cast"), &[&sums], &[&cast], vec![to_float()]);
        b.node("Mul", &format!("mm{k}_quant_output_scale_mul"), &[&cast, &scales], &[output], vec![]);
        if k == 1 {
            b.node("Relu", "relu", &["h"], &["r"], vec![]);
        }
    }
    b.output("y", DataType::Float);
    b.build()
}

/// The 3 of `x + 3` and the Clip's bounds 0 and 6, as Constant nodes (PaddlePaddle's export at
/// opset 11).
fn hardswish_constants(b: &mut ModelBuilder) {
    use layerwise_model::builder::attr;
    for (name, v) in [("three", 3.0), ("clip_lo", 0.0), ("clip_hi", 6.0)] {
        b.node(
            "Constant",
            &format!("{name}_const"),
            &[],
            &[name],
            vec![attr::tensor("value", f32_tensor(name, &[], &[v]))],
        );
    }
}

/// x[1,8] -> MatMul(w1) -> h -> hardswish as PaddlePaddle exports it at opset 11:
/// `h * Clip(h + 3, 0, 6) / 6`, the 3 and the Clip's bounds from Constant nodes -> MatMul(w2) -> y.
pub fn hardswish_float_model(w1: &[f32], w2: &[f32]) -> ModelProto {
    let mut b = ModelBuilder::new("hardswish", 11);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(f32_tensor("w1", &[8, 8], w1));
    b.initializer(f32_tensor("w2", &[8, 4], w2));
    b.initializer(f32_tensor("six", &[1], &[6.0]));
    hardswish_constants(&mut b);
    b.node("MatMul", "mm1", &["x", "w1"], &["h"], vec![]);
    b.node("Add", "add3", &["h", "three"], &["a"], vec![]);
    b.node("Clip", "clip", &["a", "clip_lo", "clip_hi"], &["c"], vec![]);
    b.node("Mul", "gate", &["h", "c"], &["m"], vec![]);
    b.node("Div", "div6", &["m", "six"], &["hs"], vec![]);
    b.node("MatMul", "mm2", &["hs", "w2"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

/// `hardswish_float_model` quantized as ONNX Runtime's quantize_static writes it without
/// pre-processing (QDQ, int8): the Clip is removed and its output name moved onto the Add, whose
/// quantizer (zero point -128, scale 6/255: [0, 6]) does the clipping; the Constant nodes stay.
/// `shrink` divides the scale of h's quantizer (16: h clips).
pub fn hardswish_qdq_model(w1: &[f32], w2: &[f32], shrink: f32) -> ModelProto {
    let ((w1_q, s1), (w2_q, s2)) = (per_tensor_int8(w1), per_tensor_int8(w2));
    // |h| <= 8 * max|w1| = 127 * sh for x in [-1, 1]; the gate's product and the hardswish get
    // scales of their own, 3x and 0.5x h's.
    let sh = 8.0 * s1;
    let mut b = ModelBuilder::new("hardswish_int8", 11);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(int8_tensor("w1_q", &[8, 8], &w1_q));
    b.initializer(int8_tensor("w2_q", &[8, 4], &w2_q));
    b.initializer(f32_tensor("six", &[1], &[6.0]));
    for (name, v) in [
        ("s1", s1),
        ("s2", s2),
        ("sx", 1.0 / 127.0),
        ("sh", sh / shrink),
        ("sc", 6.0 / 255.0),
        ("sm", 3.0 * sh),
        ("shs", sh / 2.0),
    ] {
        b.initializer(f32_tensor(name, &[], &[v]));
    }
    b.initializer(int8_tensor("z0", &[], &[0]));
    b.initializer(int8_tensor("zmin", &[], &[-128]));
    hardswish_constants(&mut b);
    b.node("DequantizeLinear", "w1_dq", &["w1_q", "s1", "z0"], &["w1_f"], vec![]);
    b.node("DequantizeLinear", "w2_dq", &["w2_q", "s2", "z0"], &["w2_f"], vec![]);
    b.node("QuantizeLinear", "x_q", &["x", "sx", "z0"], &["x_q8"], vec![]);
    b.node("DequantizeLinear", "x_dq", &["x_q8", "sx", "z0"], &["x_f"], vec![]);
    b.node("MatMul", "mm1", &["x_f", "w1_f"], &["h"], vec![]);
    b.node("QuantizeLinear", "h_q", &["h", "sh", "z0"], &["h_q8"], vec![]);
    b.node("DequantizeLinear", "h_dq", &["h_q8", "sh", "z0"], &["h_f"], vec![]);
    b.node("Add", "add3", &["h_f", "three"], &["c"], vec![]);
    b.node("QuantizeLinear", "c_q", &["c", "sc", "zmin"], &["c_q8"], vec![]);
    b.node("DequantizeLinear", "c_dq", &["c_q8", "sc", "zmin"], &["c_f"], vec![]);
    b.node("Mul", "gate", &["h_f", "c_f"], &["m"], vec![]);
    b.node("QuantizeLinear", "m_q", &["m", "sm", "z0"], &["m_q8"], vec![]);
    b.node("DequantizeLinear", "m_dq", &["m_q8", "sm", "z0"], &["m_f"], vec![]);
    b.node("Div", "div6", &["m_f", "six"], &["hs"], vec![]);
    b.node("QuantizeLinear", "hs_q", &["hs", "shs", "z0"], &["hs_q8"], vec![]);
    b.node("DequantizeLinear", "hs_dq", &["hs_q8", "shs", "z0"], &["hs_f"], vec![]);
    b.node("MatMul", "mm2", &["hs_f", "w2_f"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}
