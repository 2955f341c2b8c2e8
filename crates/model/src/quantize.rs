//! A quantizer of layerwise's own: a float32 model, a quantization config and calibration ranges
//! in, a Q/DQ model out, laid out like ONNX Runtime's `quantize_static` in the QDQ format writes
//! one. `sim:int8` / `sim:fp8` judge that model exactly as a Q/DQ candidate given with
//! `--cand-model` is judged, and `fix` re-quantizes with its keep set excluded.
//!
//! What it writes, for every node of the config's op types that is not excluded:
//! - each tensor it reads that the model computes (or the user feeds) and each tensor it computes,
//!   one QuantizeLinear/DequantizeLinear pair per tensor with one scale (per tensor) from the
//!   calibration's min/max; a graph output keeps its name on the DequantizeLinear, its producer's
//!   output renamed `NAME_QuantizeLinear_Input`, as `quantize_static` names it;
//! - its weight (input 1 of Conv, MatMul, Gemm, when an initializer) quantized symmetrically, per
//!   output channel (Conv: axis 0; MatMul: the last axis; Gemm: axis 0 with `transB`, else 1) or
//!   per tensor, stored quantized with a DequantizeLinear;
//! - in the integer formats, a Conv's or Gemm's bias as int32 with scale input scale x weight
//!   scale (what ONNX Runtime's fusion into QLinearConv needs).
//!
//! Every node reads the dequantized values of a quantized tensor (as `quantize_static` rewires
//! them) except an excluded node, which reads the float tensor: excluding a node leaves it float
//! whole, inputs, weights and output.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use serde::Deserialize;

use crate::builder::{attr, node};
use crate::onnx::{GraphProto, ModelProto, NodeProto, TensorProto};
use crate::{DataType, GraphIndex, Model, ModelError};

/// The storage format of a quantization config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SimFormat {
    /// int8, symmetric activations and weights (zero point 0), as TensorRT and ModelOpt quantize.
    Int8,
    /// uint8 asymmetric activations and int8 symmetric weights: `quantize_static`'s defaults
    /// (QUInt8 activations, QInt8 weights).
    Uint8,
    /// float8 e4m3fn, scale amax / 448, zero point 0.
    Fp8,
}

impl SimFormat {
    pub fn name(self) -> &'static str {
        match self {
            SimFormat::Int8 => "int8",
            SimFormat::Uint8 => "uint8",
            SimFormat::Fp8 => "fp8",
        }
    }

    /// Whether the weights and activations are stored in an integer type (a bias then goes int32).
    fn integer(self) -> bool {
        !matches!(self, SimFormat::Fp8)
    }

    /// The lowest opset that has this format's QuantizeLinear/DequantizeLinear.
    fn min_opset(self, per_channel: bool) -> i64 {
        match self {
            SimFormat::Fp8 => 19,
            _ if per_channel => 13,
            _ => 10,
        }
    }
}

/// How the activations' ranges are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Calibration {
    /// The smallest and largest value over every calibration sample.
    Minmax,
}

/// A quantization config (`--quant-config FILE`, JSON); every field has a default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuantConfig {
    pub format: SimFormat,
    /// The op types whose nodes are quantized.
    pub op_types: Vec<String>,
    /// Weights per output channel (else one scale per weight).
    pub per_channel: bool,
    /// Nodes left float (layerwise's node names, as `fix` writes them in `nodes_to_exclude`).
    pub nodes_to_exclude: Vec<String>,
    pub calibration: Calibration,
}

impl Default for QuantConfig {
    fn default() -> QuantConfig {
        QuantConfig {
            format: SimFormat::Int8,
            op_types: vec!["Conv".into(), "MatMul".into(), "Gemm".into()],
            per_channel: true,
            nodes_to_exclude: Vec::new(),
            calibration: Calibration::Minmax,
        }
    }
}

/// The op types the quantizer knows how to quantize (weights in input 1 for the first three).
const QUANTIZABLE: &[&str] = &[
    "Conv",
    "MatMul",
    "Gemm",
    "Add",
    "Mul",
    "Relu",
    "Concat",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Sigmoid",
    "Softmax",
];

impl QuantConfig {
    /// The config `text` (JSON) from `path`; `format` overrides the file's (`sim:fp8` asks for
    /// fp8 whatever the file says, so a file's format must agree with the spec's).
    pub fn parse(text: &str, path: &str) -> Result<QuantConfig, ModelError> {
        let bad = |why: String| ModelError::QuantConfig { path: path.to_string(), why };
        let config: QuantConfig = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if config.op_types.is_empty() {
            return Err(bad("op_types is empty: nothing would be quantized".into()));
        }
        for op in &config.op_types {
            if !QUANTIZABLE.contains(&op.as_str()) {
                return Err(bad(format!(
                    "op type '{op}' is not one this quantizer handles ({})",
                    QUANTIZABLE.join(", ")
                )));
            }
        }
        Ok(config)
    }

    /// One line for the report: what the config quantizes and how.
    pub fn describe(&self) -> String {
        let activations = match self.format {
            SimFormat::Int8 => "int8 symmetric (zero point 0, scale amax/127)",
            SimFormat::Uint8 => "uint8 asymmetric (scale (max-min)/255 over a range holding 0)",
            SimFormat::Fp8 => "float8 e4m3fn (scale amax/448)",
        };
        let weights = match (self.format, self.per_channel) {
            (SimFormat::Fp8, true) => "float8 e4m3fn per output channel (scale amax/448)",
            (SimFormat::Fp8, false) => "float8 e4m3fn per tensor (scale amax/448)",
            (_, true) => "int8 symmetric per output channel (scale amax/127)",
            (_, false) => "int8 symmetric per tensor (scale amax/127)",
        };
        let bias = if self.format.integer() {
            "; Conv/Gemm biases int32 (scale input scale x weight scale)"
        } else {
            "; biases float32"
        };
        let excluded = if self.nodes_to_exclude.is_empty() {
            String::new()
        } else {
            format!("; {} node(s) excluded", self.nodes_to_exclude.len())
        };
        format!(
            "{} of {}: activations {activations} per tensor; weights {weights}{bias}{excluded}",
            self.format.name(),
            self.op_types.join(", ")
        )
    }
}

/// What the quantizer will quantize in a model: the nodes, and the activations to calibrate.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Nodes quantized (layerwise names).
    pub nodes: Vec<String>,
    /// Computed or fed tensors that get a QuantizeLinear/DequantizeLinear pair, in graph order.
    pub activations: Vec<String>,
    /// Weight inputs (a Conv's or MatMul's second) that a Constant node computes instead of an
    /// initializer holding them: calibrated and quantized per tensor as activations, as
    /// quantize_static does, not per channel.
    pub weights_as_activations: Vec<String>,
}

/// Refuses a model the emulation is not sound on: one already quantized, one with FP16/BF16
/// tensors, an opset without the format's QuantizeLinear; and a config naming unknown nodes.
pub fn plan(model: &Model, index: &GraphIndex, config: &QuantConfig) -> Result<Plan, ModelError> {
    let refuse = |why: String| ModelError::Quantize(why);
    let graph = model.graph();
    let quantized: Vec<&str> = graph
        .node
        .iter()
        .map(|n| n.op_type())
        .filter(|op| {
            matches!(
                *op,
                "QuantizeLinear" | "DequantizeLinear" | "DynamicQuantizeLinear" | "MatMulInteger" | "ConvInteger"
            ) || op.starts_with("QLinear")
        })
        .collect();
    if let Some(op) = quantized.first() {
        return Err(refuse(format!("the model is already quantized (it has {op} nodes): judge it as it is with --cand ort:cpu --cand-model, or give the float32 model")));
    }
    let reduced = graph
        .initializer
        .iter()
        .map(|t| t.data_type())
        .chain(graph.value_info.iter().chain(&graph.input).chain(&graph.output).filter_map(elem_type))
        .any(|t| t == DataType::Float16 as i32 || t == DataType::Bfloat16 as i32);
    if reduced {
        return Err(refuse("the model declares FP16/BF16 tensors: quantizing it would emulate a quantized FP16 model, which this quantizer does not model; give the float32 model".into()));
    }
    let need = config.format.min_opset(config.per_channel);
    if model.opset() < need {
        return Err(refuse(
            format!(
                "the model is at opset {}, and {} Q/DQ{} needs opset {need}{}",
                model.opset(),
                config.format.name(),
                if config.per_channel { " with per-channel weights" } else { "" },
                if config.per_channel && config.format.integer() && model.opset() >= 10 {
                    " (per-tensor weights, \"per_channel\": false, need 10)"
                } else {
                    ""
                }
            ) + "; raise the model's opset first (onnx.version_converter.convert_version)",
        ));
    }
    for name in &config.nodes_to_exclude {
        if index.node(name).is_none() {
            return Err(ModelError::UnknownNode(name.clone()));
        }
    }
    let excluded: HashSet<&str> = config.nodes_to_exclude.iter().map(String::as_str).collect();
    let mut nodes = Vec::new();
    let mut activations: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    let mut weights_as_activations = Vec::new();
    for n in &index.nodes {
        if !config.op_types.contains(&n.op_type) || !n.domain.is_empty() || excluded.contains(n.name.as_str()) {
            continue;
        }
        nodes.push(n.name.clone());
        for &slot in weight_slots(&n.op_type).iter().take(1) {
            if let Some(t) =
                n.inputs.get(slot).filter(|t| !t.is_empty() && !index.is_initializer(t) && index.is_constant_like(t))
            {
                if !weights_as_activations.contains(t) {
                    weights_as_activations.push(t.clone());
                }
            }
        }
        // Initializers are weights, quantized by `quantize`, or constants that stay float (a
        // MatMul's constant first operand).
        for t in n.inputs.iter().filter(|t| !t.is_empty() && !index.is_initializer(t)) {
            if seen.insert(t.clone()) {
                activations.push(t.clone());
            }
        }
        for t in n.outputs.iter().filter(|t| !t.is_empty()) {
            if seen.insert(t.clone()) {
                activations.push(t.clone());
            }
        }
    }
    Ok(Plan { nodes, activations, weights_as_activations })
}

fn elem_type(v: &crate::onnx::ValueInfoProto) -> Option<i32> {
    match v.r#type.as_ref()?.value.as_ref()? {
        crate::onnx::type_proto::Value::TensorType(t) => t.elem_type,
        _ => None,
    }
}

/// The inputs of `op` that hold a weight (quantized when an initializer) and a bias.
fn weight_slots(op: &str) -> &'static [usize] {
    match op {
        "Conv" | "Gemm" => &[1, 2],
        "MatMul" => &[1],
        _ => &[],
    }
}

/// One activation quantizer: its scale and zero point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantizer {
    pub scale: f32,
    /// int8/uint8 zero point (0 for int8 and float8).
    pub zero_point: i32,
}

/// An activation's quantizer from its calibrated range.
pub fn activation_quantizer(format: SimFormat, min: f32, max: f32) -> Quantizer {
    match format {
        SimFormat::Int8 => Quantizer { scale: symmetric_int8_scale(min.abs().max(max.abs())), zero_point: 0 },
        SimFormat::Fp8 => Quantizer { scale: nonzero(min.abs().max(max.abs()) / FP8_MAX), zero_point: 0 },
        SimFormat::Uint8 => {
            // The range holds 0, so that 0 (padding, a Relu's floor) is exact. In float64 and
            // then float32, as `quantize_static`'s compute_scale_zp, to its last bit.
            let (lo, hi) = (min.min(0.0), max.max(0.0));
            let scale = (hi - lo) as f64 / 255.0;
            if (scale as f32) <= 0.0 {
                return Quantizer { scale: 1.0, zero_point: 0 };
            }
            Quantizer {
                scale: scale as f32,
                zero_point: (-(lo as f64) / scale).round_ties_even().clamp(0.0, 255.0) as i32,
            }
        }
    }
}

/// int8's symmetric scale of a largest magnitude: its range [-amax, amax] over the 254 steps
/// of [-127, 127], divided in float64 and then rounded to float32 as `quantize_static` does.
fn symmetric_int8_scale(amax: f32) -> f32 {
    nonzero(((amax + amax) as f64 / 254.0) as f32)
}

/// A scale of 0 (a tensor that is 0 throughout) would divide by 0: 1, as `quantize_static` takes.
fn nonzero(scale: f32) -> f32 {
    if scale > 0.0 {
        scale
    } else {
        1.0
    }
}

/// The largest finite float8 e4m3fn value.
pub const FP8_MAX: f32 = 448.0;

/// The symmetric weight scale of each channel along `axis` (one scale where `axis` is `None`).
pub fn weight_scales(format: SimFormat, values: &[f32], shape: &[usize], axis: Option<usize>) -> Vec<f32> {
    let scale = |amax: f32| if format == SimFormat::Fp8 { nonzero(amax / FP8_MAX) } else { symmetric_int8_scale(amax) };
    let Some(axis) = axis else {
        return vec![scale(values.iter().fold(0f32, |m, v| m.max(v.abs())))];
    };
    let channels = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut amax = vec![0f32; channels];
    for (i, v) in values.iter().enumerate() {
        let c = (i / inner) % channels;
        amax[c] = amax[c].max(v.abs());
    }
    amax.into_iter().map(scale).collect()
}

/// float8 e4m3fn's bits of `x`: round to nearest, ties to even, saturating at ±448 (QuantizeLinear's
/// `saturate=1`, its default); NaN stays NaN.
pub fn to_float8e4m3fn(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    // The 127 non-negative finite values, ascending with their codes (0x00..=0x7E).
    let value = |code: u8| -> f32 {
        let (e, m) = ((code >> 3) as i32, (code & 7) as f32);
        if e == 0 {
            m / 8.0 * 2f32.powi(-6)
        } else {
            (1.0 + m / 8.0) * 2f32.powi(e - 7)
        }
    };
    if a >= FP8_MAX {
        return sign | 0x7E;
    }
    // The largest code at or below a, then the nearer of it and the next (ties to the even code).
    let (mut lo, mut hi) = (0u8, 0x7Eu8);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if value(mid) <= a {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let below = lo;
    let code = if below == 0x7E {
        below
    } else {
        let (d0, d1) = (a - value(below), value(below + 1) - a);
        if d1 < d0 || (d1 == d0 && below % 2 == 1) {
            below + 1
        } else {
            below
        }
    };
    sign | code
}

/// The Q/DQ model of `model` under `config`, with `ranges` (tensor -> calibrated min, max) for
/// every float32 activation of [`plan`]: an activation without one holds no float32 values (a
/// Concat of shapes) and is left as it is.
pub fn quantize(
    model: &Model,
    index: &GraphIndex,
    config: &QuantConfig,
    ranges: &HashMap<String, (f32, f32)>,
) -> Result<ModelProto, ModelError> {
    let plan = plan(model, index, config)?;
    let graph = model.graph();
    let mut names = crate::graph::FreshNames::of(graph);
    let quantized_nodes: HashSet<&str> = plan.nodes.iter().map(String::as_str).collect();
    let excluded: HashSet<&str> = config.nodes_to_exclude.iter().map(String::as_str).collect();
    let format = config.format;
    let q_type = match format {
        SimFormat::Int8 => DataType::Int8,
        SimFormat::Uint8 => DataType::Uint8,
        SimFormat::Fp8 => DataType::Float8e4m3fn,
    };
    let w_type = if format == SimFormat::Fp8 { DataType::Float8e4m3fn } else { DataType::Int8 };
    let mut new_inits: Vec<TensorProto> = Vec::new();
    // Activation -> (its quantizer, the DequantizeLinear output the quantized nodes read).
    let mut act: HashMap<String, (Quantizer, String)> = HashMap::new();
    let mut pairs: HashMap<String, Vec<NodeProto>> = HashMap::new();
    // A quantized graph output's float value, renamed -> the output's name.
    let mut renamed: HashMap<String, String> = HashMap::new();
    for t in &plan.activations {
        let Some(&(min, max)) = ranges.get(t) else { continue };
        if !(min.is_finite() && max.is_finite()) {
            return Err(ModelError::Quantize(format!(
                "tensor '{t}' reaches non-finite values in calibration ({min}, {max}): no scale holds it"
            )));
        }
        let q = activation_quantizer(format, min, max);
        let (scale, zp) = (names.fresh(&format!("{t}_scale")), names.fresh(&format!("{t}_zero_point")));
        new_inits.push(crate::builder::f32_tensor(&scale, &[], &[q.scale]));
        new_inits.push(quantized_tensor(&zp, &[], q_type, &[quantized_bits(format, q.zero_point as f32)]));
        let (qo, mut dqo) =
            (names.fresh(&format!("{t}_QuantizeLinear_Output")), names.fresh(&format!("{t}_DequantizeLinear_Output")));
        let mut quantized = t.clone();
        if index.outputs.contains(t) {
            quantized = names.fresh(&format!("{t}_QuantizeLinear_Input"));
            renamed.insert(quantized.clone(), t.clone());
            dqo = t.clone();
        }
        pairs.insert(
            t.clone(),
            vec![
                node(
                    "QuantizeLinear",
                    &names.fresh(&format!("{t}_QuantizeLinear")),
                    &[&quantized, &scale, &zp],
                    &[&qo],
                    vec![],
                ),
                node(
                    "DequantizeLinear",
                    &names.fresh(&format!("{t}_DequantizeLinear")),
                    &[&qo, &scale, &zp],
                    &[&dqo],
                    vec![],
                ),
            ],
        );
        act.insert(t.clone(), (q, dqo));
    }
    let scale_of_dequantized: HashMap<&str, f32> = act.values().map(|(q, dqo)| (dqo.as_str(), q.scale)).collect();
    let initializers: HashMap<&str, &TensorProto> = graph.initializer.iter().map(|t| (t.name(), t)).collect();
    // Weight -> the DequantizeLinear output its quantized readers take.
    let mut weights: HashMap<String, (String, Vec<f32>)> = HashMap::new();
    let mut weight_nodes: Vec<NodeProto> = Vec::new();
    let mut rewired: Vec<NodeProto> = Vec::new();
    let info_of: HashMap<usize, &crate::NodeInfo> = index.nodes.iter().map(|x| (x.proto_index, x)).collect();
    for (i, n) in graph.node.iter().enumerate() {
        let info = info_of[&i];
        let mut n = n.clone();
        // Every node but an excluded one reads the dequantized activations, as `quantize_static`
        // rewires them: a quantized node's output then has its QuantizeLinear as only reader,
        // which ONNX Runtime's fusion into an integer kernel asks for.
        if !excluded.contains(info.name.as_str()) {
            for t in n.input.iter_mut() {
                if let Some((_, dqo)) = act.get(t.as_str()) {
                    *t = dqo.clone();
                }
            }
        } else {
            for t in n.input.iter_mut() {
                if let Some((float, _)) = renamed.iter().find(|(_, out)| *out == t) {
                    *t = float.clone();
                }
            }
        }
        for o in n.output.iter_mut() {
            if let Some((float, _)) = renamed.iter().find(|(_, out)| *out == o) {
                *o = float.clone();
            }
        }
        if quantized_nodes.contains(info.name.as_str()) {
            let mut input_scale = None;
            let mut node_weight_scales: Option<Vec<f32>> = None;
            for slot in 0..n.input.len() {
                let t = n.input[slot].clone();
                if t.is_empty() {
                    continue;
                }
                if let Some(&scale) = scale_of_dequantized.get(t.as_str()) {
                    if slot == 0 {
                        input_scale = Some(scale);
                    }
                    continue;
                }
                let Some(&w) = initializers.get(t.as_str()).filter(|_| weight_slots(&info.op_type).contains(&slot))
                else {
                    continue;
                };
                if slot == 1 {
                    let axis = config.per_channel.then(|| weight_axis(&n, w)).flatten();
                    let key = t.clone();
                    if !weights.contains_key(&key) {
                        let values = crate::float_weight_values(model, w)?;
                        let shape: Vec<usize> = w.dims.iter().map(|&d| d as usize).collect();
                        let scales = weight_scales(format, &values, &shape, axis);
                        let inner: usize = axis.map_or(1, |a| shape[a + 1..].iter().product());
                        let bits: Vec<u8> = values
                            .iter()
                            .enumerate()
                            .map(|(k, v)| {
                                let s = scales[axis.map_or(0, |a| (k / inner) % shape[a])];
                                match format {
                                    SimFormat::Fp8 => to_float8e4m3fn(v / s),
                                    _ => ((v / s).round_ties_even().clamp(-127.0, 127.0) as i8) as u8,
                                }
                            })
                            .collect();
                        let (qn, sn, zn, dqo) = (
                            names.fresh(&format!("{t}_quantized")),
                            names.fresh(&format!("{t}_scale")),
                            names.fresh(&format!("{t}_zero_point")),
                            names.fresh(&format!("{t}_DequantizeLinear_Output")),
                        );
                        let sdims: Vec<i64> = if axis.is_some() { vec![scales.len() as i64] } else { vec![] };
                        new_inits.push(quantized_tensor(&qn, &w.dims, w_type, &bits));
                        new_inits.push(crate::builder::f32_tensor(&sn, &sdims, &scales));
                        new_inits.push(quantized_tensor(&zn, &sdims, w_type, &vec![0u8; scales.len()]));
                        let attrs = axis.map(|a| vec![attr::int("axis", a as i64)]).unwrap_or_default();
                        weight_nodes.push(node(
                            "DequantizeLinear",
                            &names.fresh(&format!("{t}_DequantizeLinear")),
                            &[&qn, &sn, &zn],
                            &[&dqo],
                            attrs,
                        ));
                        weights.insert(key.clone(), (dqo, scales));
                    }
                    n.input[slot] = weights[&key].0.clone();
                    node_weight_scales = Some(weights[&key].1.clone());
                } else if slot == 2 && format.integer() {
                    // A 1-D bias of the output channels: int32 with scale input scale x weight scale.
                    let (Some(in_scale), Some(w_scales)) = (input_scale, &node_weight_scales) else { continue };
                    let channels = w.dims.first().copied().unwrap_or(0) as usize;
                    // A bias two nodes share would need two scales: it stays float.
                    if w.dims.len() != 1
                        || (w_scales.len() != 1 && w_scales.len() != channels)
                        || index.consumers(&t).len() > 1
                    {
                        continue;
                    }
                    let values = crate::float_weight_values(model, w)?;
                    let scales: Vec<f32> = (0..channels)
                        .map(|c| nonzero(in_scale * w_scales[if w_scales.len() == 1 { 0 } else { c }]))
                        .collect();
                    let q: Vec<i32> = values
                        .iter()
                        .zip(&scales)
                        .map(|(v, s)| (v / s).round_ties_even().clamp(i32::MIN as f32, i32::MAX as f32) as i32)
                        .collect();
                    let (qn, sn, zn, dqo) = (
                        names.fresh(&format!("{t}_quantized")),
                        names.fresh(&format!("{t}_scale")),
                        names.fresh(&format!("{t}_zero_point")),
                        names.fresh(&format!("{t}_DequantizeLinear_Output")),
                    );
                    new_inits.push(TensorProto {
                        name: Some(qn.clone()),
                        dims: w.dims.clone(),
                        data_type: Some(DataType::Int32 as i32),
                        raw_data: Some(Bytes::from(q.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())),
                        ..Default::default()
                    });
                    new_inits.push(crate::builder::f32_tensor(&sn, &[channels as i64], &scales));
                    new_inits.push(TensorProto {
                        name: Some(zn.clone()),
                        dims: vec![channels as i64],
                        data_type: Some(DataType::Int32 as i32),
                        raw_data: Some(Bytes::from(vec![0u8; 4 * channels])),
                        ..Default::default()
                    });
                    weight_nodes.push(node(
                        "DequantizeLinear",
                        &names.fresh(&format!("{t}_DequantizeLinear")),
                        &[&qn, &sn, &zn],
                        &[&dqo],
                        vec![attr::int("axis", 0)],
                    ));
                    n.input[slot] = dqo;
                }
            }
        }
        rewired.push(n);
    }
    // Nodes in an order every reader follows its producer: the pairs of graph inputs first, each
    // other pair right after the node computing its tensor.
    let mut nodes: Vec<NodeProto> = weight_nodes;
    for t in &plan.activations {
        if index.producer(t).is_none() {
            nodes.extend(pairs.remove(t).into_iter().flatten());
        }
    }
    for n in rewired {
        let after: Vec<NodeProto> =
            n.output.iter().filter_map(|o| pairs.remove(renamed.get(o).unwrap_or(o))).flatten().collect();
        nodes.push(n);
        nodes.extend(after);
    }
    let used: HashSet<&str> = nodes
        .iter()
        .flat_map(|n| n.input.iter().map(String::as_str))
        .chain(graph.output.iter().map(|o| o.name()))
        .collect();
    let mut initializer: Vec<TensorProto> =
        graph.initializer.iter().filter(|t| used.contains(t.name())).cloned().collect();
    initializer.extend(new_inits);
    let mut proto = model.proto.clone();
    let g: &mut GraphProto = proto.graph.as_mut().expect("checked on load");
    g.node = nodes;
    // Weights no node reads any more leave the inputs too (old exporters list them there).
    let kept: HashSet<String> = initializer.iter().map(|t| t.name().to_string()).collect();
    let originals: HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    g.input.retain(|v| !originals.contains(v.name()) || kept.contains(v.name()));
    g.initializer = initializer;
    Ok(proto)
}

/// The output-channel axis of a node's weight: Conv 0, Gemm 0 with `transB` (else 1), MatMul its
/// last axis; `None` for a weight of rank 0.
fn weight_axis(n: &NodeProto, w: &TensorProto) -> Option<usize> {
    let rank = w.dims.len();
    if rank == 0 {
        return None;
    }
    Some(match n.op_type() {
        "Conv" => 0,
        "Gemm" => {
            let trans_b = n.attribute.iter().any(|a| a.name() == "transB" && a.i() != 0);
            if trans_b {
                0
            } else {
                rank - 1
            }
        }
        _ => rank - 1,
    })
}

/// A zero point's bits in `format`: the int8/uint8 byte, float8 0 as 0x00.
fn quantized_bits(format: SimFormat, zero_point: f32) -> u8 {
    match format {
        SimFormat::Int8 => (zero_point as i8) as u8,
        SimFormat::Uint8 => zero_point as u8,
        SimFormat::Fp8 => to_float8e4m3fn(zero_point),
    }
}

fn quantized_tensor(name: &str, dims: &[i64], data_type: DataType, bytes: &[u8]) -> TensorProto {
    TensorProto {
        name: Some(name.to_string()),
        dims: dims.to_vec(),
        data_type: Some(data_type as i32),
        raw_data: Some(Bytes::from(bytes.to_vec())),
        ..Default::default()
    }
}
