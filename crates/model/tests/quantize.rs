//! layerwise's own quantizer (`layerwise_model::quantize`, behind `--cand sim:int8` / `sim:fp8`):
//! scales and zero points of known tensors, the per-channel axis of each op's weight, float8
//! e4m3fn rounding, excluded nodes left float, and the config and models it refuses.

use std::collections::HashMap;

use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::{ModelProto, TensorProto};
use layerwise_model::quantize::{
    activation_quantizer, plan, quantize, to_float8e4m3fn, weight_scales, QuantConfig, Quantizer, SimFormat,
};
use layerwise_model::{DataType, GraphIndex, Model, ModelError};

fn model(proto: ModelProto) -> (Model, GraphIndex) {
    let m = Model::from_proto(proto, "m.onnx").unwrap();
    let i = GraphIndex::build(m.graph()).unwrap();
    (m, i)
}

/// x[1,2] -> MatMul(w1[2,3]) -> h -> Relu -> r -> Gemm(w2[2,3], transB, bias b2[2]) -> y; and a
/// Conv of its own on c[1,2,1,1] with weight wc[2,2,1,1].
fn mlp(opset: i64) -> ModelProto {
    let mut b = ModelBuilder::new("mlp", opset);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(2)]);
    b.input("c", DataType::Float, &[Dim::from(1), Dim::from(2), Dim::from(1), Dim::from(1)]);
    // Column 2 of w1 (its third output channel) is 100x the others.
    b.initializer(f32_tensor("w1", &[2, 3], &[0.5, -1.0, 100.0, 0.2, 0.4, -40.0]));
    b.initializer(f32_tensor("w2", &[2, 3], &[1.0, 2.0, -4.0, 0.1, 0.2, 0.3]));
    b.initializer(f32_tensor("b2", &[2], &[0.5, -0.25]));
    b.initializer(f32_tensor("wc", &[2, 2, 1, 1], &[1.0, -2.0, 0.01, 0.02]));
    b.node("MatMul", "mm1", &["x", "w1"], &["h"], vec![]);
    b.node("Relu", "relu", &["h"], &["r"], vec![]);
    b.node("Gemm", "fc", &["r", "w2", "b2"], &["y"], vec![attr::int("transB", 1)]);
    b.node("Conv", "conv", &["c", "wc"], &["z"], vec![]);
    b.output("y", DataType::Float);
    b.output("z", DataType::Float);
    b.build()
}

fn ranges() -> HashMap<String, (f32, f32)> {
    [
        ("x", (-1.0, 2.0)),
        ("h", (-3.0, 127.0)),
        ("r", (0.0, 127.0)),
        ("y", (-5.0, 5.0)),
        ("c", (-1.0, 1.0)),
        ("z", (-2.0, 2.0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn init<'a>(p: &'a ModelProto, name: &str) -> &'a TensorProto {
    p.graph
        .as_ref()
        .unwrap()
        .initializer
        .iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no initializer '{name}'"))
}

fn f32s(t: &TensorProto) -> Vec<f32> {
    t.raw_data.as_ref().unwrap().chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn axis_of(p: &ModelProto, node: &str) -> Option<i64> {
    let n =
        p.graph.as_ref().unwrap().node.iter().find(|n| n.name() == node).unwrap_or_else(|| panic!("no node '{node}'"));
    n.attribute.iter().find(|a| a.name() == "axis").map(|a| a.i())
}

#[test]
fn scales_and_zero_points_of_a_known_range() {
    // int8 symmetric: amax / 127, zero point 0.
    assert_eq!(activation_quantizer(SimFormat::Int8, -2.0, 1.0), Quantizer { scale: 2.0 / 127.0, zero_point: 0 });
    // uint8 asymmetric over a range widened to hold 0: (3 - -1) / 255, zero point round(1 / scale) = 64.
    let q = activation_quantizer(SimFormat::Uint8, -1.0, 3.0);
    assert_eq!((q.scale, q.zero_point), (4.0 / 255.0, 64));
    assert_eq!(activation_quantizer(SimFormat::Uint8, 0.5, 3.0).zero_point, 0, "a positive range starts at 0");
    // float8 e4m3fn: amax / 448.
    assert_eq!(activation_quantizer(SimFormat::Fp8, -0.5, 896.0).scale, 2.0);
    // A tensor of zeros gets scale 1, not 0.
    assert_eq!(activation_quantizer(SimFormat::Int8, 0.0, 0.0).scale, 1.0);
    // Weights per channel: one scale per slice along the axis.
    assert_eq!(weight_scales(SimFormat::Int8, &[1.0, -254.0, 0.5, 127.0], &[2, 2], Some(1)), vec![1.0 / 127.0, 2.0]);
    assert_eq!(weight_scales(SimFormat::Int8, &[1.0, -254.0, 0.5, 127.0], &[2, 2], Some(0)), vec![2.0, 1.0]);
    assert_eq!(weight_scales(SimFormat::Fp8, &[1.0, -254.0, 0.5, 127.0], &[2, 2], None), vec![254.0 / 448.0]);
}

#[test]
fn float8_e4m3fn_rounds_to_nearest_even_and_saturates() {
    assert_eq!(to_float8e4m3fn(1.0), 0x38);
    assert_eq!(to_float8e4m3fn(-1.0), 0xB8);
    assert_eq!(to_float8e4m3fn(448.0), 0x7E);
    assert_eq!(to_float8e4m3fn(1.0e6), 0x7E, "saturates at 448");
    assert_eq!(to_float8e4m3fn(-1.0e6), 0xFE);
    // 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39): the even code.
    assert_eq!(to_float8e4m3fn(1.0625), 0x38);
    assert_eq!(to_float8e4m3fn(1.1875), 0x3A, "halfway between 0x39 and 0x3A: the even one");
    assert_eq!(to_float8e4m3fn(1.07), 0x39);
    // Subnormals: the least is 2^-9; half of it ties to 0.
    assert_eq!(to_float8e4m3fn(2f32.powi(-9)), 0x01);
    assert_eq!(to_float8e4m3fn(2f32.powi(-10)), 0x00);
    assert_eq!(to_float8e4m3fn(f32::NAN) & 0x7F, 0x7F);
}

#[test]
fn weights_are_quantized_per_output_channel_of_each_op() {
    let (m, i) = model(mlp(13));
    let q = quantize(&m, &i, &QuantConfig::default(), &ranges()).unwrap();
    // MatMul: the last axis of w1 (3 output channels), the third 100x the first.
    assert_eq!(axis_of(&q, "w1_DequantizeLinear"), Some(1));
    let s1 = f32s(init(&q, "w1_scale"));
    assert_eq!(s1, vec![0.5 / 127.0, 1.0 / 127.0, 100.0 / 127.0]);
    let w1q: Vec<i8> = init(&q, "w1_quantized").raw_data.as_ref().unwrap().iter().map(|&b| b as i8).collect();
    assert_eq!(w1q, vec![127, -127, 127, 51, 51, -51]);
    // Gemm with transB: w2 is [N, K], its output channels on axis 0.
    assert_eq!(axis_of(&q, "w2_DequantizeLinear"), Some(0));
    assert_eq!(f32s(init(&q, "w2_scale")), vec![4.0 / 127.0, 0.3 / 127.0]);
    // Conv: axis 0.
    assert_eq!(axis_of(&q, "wc_DequantizeLinear"), Some(0));
    assert_eq!(f32s(init(&q, "wc_scale")), vec![2.0 / 127.0, 0.02 / 127.0]);
    // The Gemm's bias: int32 at scale (r's scale) x (w2's channel scale).
    let b2 = init(&q, "b2_quantized");
    assert_eq!(b2.data_type(), DataType::Int32 as i32);
    let r_scale = 127.0f32 / 127.0;
    assert_eq!(f32s(init(&q, "b2_scale")), vec![r_scale * (4.0 / 127.0), r_scale * (0.3 / 127.0)]);
    // Per tensor: one scale, no axis.
    let per_tensor = QuantConfig { per_channel: false, ..QuantConfig::default() };
    let q = quantize(&m, &i, &per_tensor, &ranges()).unwrap();
    assert_eq!(axis_of(&q, "w1_DequantizeLinear"), None);
    assert_eq!(f32s(init(&q, "w1_scale")), vec![100.0 / 127.0]);
}

#[test]
fn activations_get_one_pair_each_and_outputs_keep_their_names() {
    let (m, i) = model(mlp(13));
    let planned = plan(&m, &i, &QuantConfig::default()).unwrap();
    let mut nodes = planned.nodes.clone();
    nodes.sort();
    assert_eq!(nodes, vec!["conv", "fc", "mm1"]);
    for t in ["x", "h", "r", "y", "c", "z"] {
        assert!(planned.activations.iter().any(|a| a == t), "{t} in {:?}", planned.activations);
    }
    let q = quantize(&m, &i, &QuantConfig::default(), &ranges()).unwrap();
    let g = q.graph.as_ref().unwrap();
    // The Relu reads h's dequantized value, as quantize_static rewires it.
    let relu = g.node.iter().find(|n| n.name() == "relu").unwrap();
    assert_eq!(relu.input, vec!["h_DequantizeLinear_Output"]);
    // The output 'y' is the DequantizeLinear's; the Gemm computes 'y_QuantizeLinear_Input'.
    let fc = g.node.iter().find(|n| n.name() == "fc").unwrap();
    assert_eq!(fc.output, vec!["y_QuantizeLinear_Input"]);
    assert!(g.node.iter().any(|n| n.op_type() == "DequantizeLinear" && n.output == vec!["y"]));
    let index = GraphIndex::build(g).expect("a valid graph");
    assert_eq!(index.outputs, vec!["y", "z"]);
    // A tensor without a range holds no float32 values (calibration records none): left as it is.
    let mut without_z = ranges();
    without_z.remove("z");
    let q2 = quantize(&m, &i, &QuantConfig::default(), &without_z).unwrap();
    let g2 = q2.graph.as_ref().unwrap();
    assert!(
        g2.node.iter().all(|n| n.name() != "z_QuantizeLinear")
            && g2.node.iter().any(|n| n.output == vec!["z"] && n.name() == "conv")
    );
    // x's quantizer: int8, scale 2/127.
    assert_eq!(f32s(init(&q, "x_scale")), vec![2.0 / 127.0]);
    assert_eq!(init(&q, "x_zero_point").data_type(), DataType::Int8 as i32);
}

#[test]
fn excluded_nodes_stay_float() {
    let (m, i) = model(mlp(13));
    let config = QuantConfig { nodes_to_exclude: vec!["fc".into()], ..QuantConfig::default() };
    let q = quantize(&m, &i, &config, &ranges()).unwrap();
    let g = q.graph.as_ref().unwrap();
    let fc = g.node.iter().find(|n| n.name() == "fc").unwrap();
    // Float input, float weight and bias, float output under its own name.
    assert_eq!(fc.input, vec!["r", "w2", "b2"]);
    assert_eq!(fc.output, vec!["y"]);
    assert_eq!(init(&q, "w2").data_type(), DataType::Float as i32);
    assert!(g.initializer.iter().all(|t| !t.name().starts_with("w2_")
        && !t.name().starts_with("b2_")
        && !t.name().starts_with("r_")
        && !t.name().starts_with("y_")));
    // The rest is still quantized.
    assert!(g.node.iter().any(|n| n.name() == "w1_DequantizeLinear"));
    let relu = g.node.iter().find(|n| n.name() == "relu").unwrap();
    assert_eq!(relu.input, vec!["h_DequantizeLinear_Output"]);
    // An excluded reader of a tensor quantized for another node (h, mm1's output) reads it float.
    let config = QuantConfig { nodes_to_exclude: vec!["relu".into()], ..QuantConfig::default() };
    let q = quantize(&m, &i, &config, &ranges()).unwrap();
    let relu = q.graph.as_ref().unwrap().node.iter().find(|n| n.name() == "relu").unwrap();
    assert_eq!(relu.input, vec!["h"]);
    // Excluding a node the model lacks is an error naming it.
    let unknown = QuantConfig { nodes_to_exclude: vec!["nope".into()], ..QuantConfig::default() };
    assert!(matches!(quantize(&m, &i, &unknown, &ranges()), Err(ModelError::UnknownNode(n)) if n == "nope"));
}

#[test]
fn float8_stores_float8_weights_and_keeps_biases_float() {
    let (m, i) = model(mlp(19));
    let config = QuantConfig { format: SimFormat::Fp8, ..QuantConfig::default() };
    let q = quantize(&m, &i, &config, &ranges()).unwrap();
    assert_eq!(init(&q, "w1_quantized").data_type(), DataType::Float8e4m3fn as i32);
    assert_eq!(f32s(init(&q, "w1_scale")), vec![0.5 / 448.0, 1.0 / 448.0, 100.0 / 448.0]);
    // Each channel's largest value is 448 in float8 (0x7E), signed.
    let w1q = init(&q, "w1_quantized").raw_data.as_ref().unwrap().to_vec();
    assert_eq!((w1q[0], w1q[1], w1q[2]), (0x7E, 0xFE, 0x7E));
    assert_eq!(init(&q, "x_zero_point").data_type(), DataType::Float8e4m3fn as i32);
    assert_eq!(f32s(init(&q, "x_scale")), vec![2.0 / 448.0]);
    assert_eq!(init(&q, "b2").data_type(), DataType::Float as i32);
    // Below opset 19 float8 has no QuantizeLinear: refused, with the way out.
    let (m, i) = model(mlp(17));
    let e = quantize(&m, &i, &config, &ranges()).unwrap_err().to_string();
    assert!(e.contains("opset 17") && e.contains("needs opset 19"), "{e}");
}

#[test]
fn configs_and_models_it_refuses() {
    let bad = |text: &str, says: &str| {
        let e = QuantConfig::parse(text, "cfg.json").unwrap_err().to_string();
        assert!(e.contains("cfg.json") && e.contains(says), "{text}: {e}");
    };
    bad(r#"{"format": "int4"}"#, "unknown variant `int4`");
    bad(r#"{"formats": "int8"}"#, "unknown field `formats`");
    bad(r#"{"op_types": ["LSTM"]}"#, "op type 'LSTM'");
    bad(r#"{"op_types": []}"#, "op_types is empty");
    bad(r#"{"calibration": "percentile"}"#, "unknown variant `percentile`");
    bad(r#"{"per_channel": "yes"}"#, "invalid type");
    let ok = QuantConfig::parse(r#"{"format": "uint8", "per_channel": false, "nodes_to_exclude": ["fc"]}"#, "cfg.json")
        .unwrap();
    assert_eq!((ok.format, ok.per_channel, ok.op_types.len()), (SimFormat::Uint8, false, 3));
    // A model already quantized, and one with FP16 tensors.
    let mut b = ModelBuilder::new("q", 13);
    b.input("x", DataType::Float, &[Dim::from(2)]);
    b.initializer(f32_tensor("s", &[], &[0.1]));
    b.node("QuantizeLinear", "q", &["x", "s"], &["xq"], vec![]);
    b.node("DequantizeLinear", "dq", &["xq", "s"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let (m, i) = model(b.build());
    let e = plan(&m, &i, &QuantConfig::default()).unwrap_err().to_string();
    assert!(e.contains("already quantized") && e.contains("--cand-model"), "{e}");
    let mut b = ModelBuilder::new("h", 13);
    b.input("x", DataType::Float16, &[Dim::from(2)]);
    b.node("Relu", "r", &["x"], &["y"], vec![]);
    b.output("y", DataType::Float16);
    let (m, i) = model(b.build());
    let e = plan(&m, &i, &QuantConfig::default()).unwrap_err().to_string();
    assert!(e.contains("FP16/BF16"), "{e}");
}

/// A weight a Constant node computes (an exporter's habit) is no initializer: it is calibrated and
/// quantized per tensor as an activation, as quantize_static does, and the plan says so (the note
/// said "weights per output channel" for every weight; an independent tester found 54 such).
#[test]
fn a_weight_from_a_constant_node_is_planned_as_an_activation() {
    let mut b = ModelBuilder::new("const_weight", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(2)]);
    b.node(
        "Constant",
        "w_const",
        &[],
        &["w"],
        vec![attr::tensor("value", f32_tensor("w_value", &[2, 2], &[1.0, 2.0, 3.0, 4.0]))],
    );
    b.initializer(f32_tensor("w2", &[2, 2], &[1.0, 0.5, 0.25, 0.125]));
    b.node("MatMul", "mm", &["x", "w"], &["h"], vec![]);
    b.node("MatMul", "mm2", &["h", "w2"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let (m, i) = model(b.build());
    let p = plan(&m, &i, &QuantConfig::default()).unwrap();
    assert_eq!(p.weights_as_activations, vec!["w".to_string()]);
    assert!(p.activations.contains(&"w".to_string()), "{:?}", p.activations);
    assert!(!p.activations.contains(&"w2".to_string()), "{:?}", p.activations);
}

/// A model that already holds a tensor named like a quantizer's parameter (`h_scale`, as an
/// exporter's `val_251_scale` beside an activation `val_251`): the quantizer's own scale takes
/// another name, and the model's tensor stays as it was. They shared the name, and ONNX Runtime
/// refused the model ("Shape of initializer val_251_scale does not match").
#[test]
fn quantizer_names_never_shadow_the_models_own_tensors() {
    let mut b = ModelBuilder::new("named", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(2)]);
    b.initializer(f32_tensor("w1", &[2, 3], &[0.5, -1.0, 1.0, 0.2, 0.4, -0.4]));
    b.initializer(f32_tensor("h_scale", &[1, 3], &[2.0, 3.0, 4.0]));
    b.node("MatMul", "mm1", &["x", "w1"], &["h"], vec![]);
    b.node("Mul", "scale_h", &["h", "h_scale"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let (m, i) = model(b.build());
    let ranges: HashMap<String, (f32, f32)> =
        [("x", (-1.0, 1.0)), ("h", (-2.0, 2.0)), ("y", (-8.0, 8.0))].into_iter().map(|(k, v)| (k.into(), v)).collect();
    let q = quantize(&m, &i, &QuantConfig::default(), &ranges).unwrap();
    let g = q.graph.as_ref().unwrap();
    let mut names: Vec<&str> = g.initializer.iter().map(|t| t.name()).collect();
    names.sort();
    let unique = names.len();
    names.dedup();
    assert_eq!(names.len(), unique, "initializer names repeat: {names:?}");
    assert_eq!(f32s(init(&q, "h_scale")), vec![2.0, 3.0, 4.0], "the model's own tensor is unchanged");
    // h's quantizer reads a scale of its own, a scalar.
    let quantizer = g.node.iter().find(|n| n.op_type() == "QuantizeLinear" && n.input[0] == "h").unwrap();
    assert_ne!(quantizer.input[1], "h_scale");
    assert!(init(&q, &quantizer.input[1]).dims.is_empty());
}
