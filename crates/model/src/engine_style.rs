//! How a weakly typed TensorRT FP16 engine stores values, as opposed to a strongly typed FP16
//! model: BatchNorm is folded into the Conv before it in float32 (a variance of 1e8 never exists
//! as an FP16 weight), and values are rounded to FP16 only where one fused layer hands them to
//! the next; inside a layer (a Conv or MatMul with the pointwise ops that follow it, a chain of
//! pointwise ops) they stay float32.
//!
//! The layers come from a documented rule set (docs/emulation.md), not from a build: what a
//! given TensorRT version fuses can differ.

use std::collections::{HashMap, HashSet};

use crate::builder::f32_tensor;
use crate::onnx::{tensor_proto::DataType, GraphProto, ModelProto, TensorProto};
use crate::weights::float_weight_values;
use crate::{GraphIndex, Model, ModelError};

/// Ops TensorRT runs as pointwise (elementwise) and fuses into the layer before them or with
/// each other.
pub const POINTWISE_OPS: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Relu",
    "LeakyRelu",
    "PRelu",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Tanh",
    "Clip",
    "Elu",
    "Selu",
    "Softplus",
    "Mish",
    "Gelu",
    "Erf",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Pow",
    "Neg",
    "Abs",
    "Max",
    "Min",
    "BatchNormalization",
];

/// Ops that start a fused layer and take pointwise ops after them.
pub const LAYER_HEADS: &[&str] = &["Conv", "ConvTranspose", "MatMul", "Gemm"];

/// A BatchNormalization folded into the Conv before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folded {
    pub batch_norm: String,
    pub conv: String,
}

/// The weights a folding engine never stores: the parameters of each folded BatchNorm (scale,
/// bias, mean, variance) and its Conv's original weight and bias, where nothing else reads them,
/// each with the reason. `index` is the model's, before folding.
pub fn folded_parameters(index: &GraphIndex, folded: &[Folded]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for f in folded {
        let (Some(bn), Some(conv)) = (index.node(&f.batch_norm), index.node(&f.conv)) else { continue };
        let readers = [bn.name.as_str(), conv.name.as_str()];
        for t in bn.inputs.iter().skip(1).chain(conv.inputs.iter().skip(1)).filter(|t| !t.is_empty()) {
            let only_here = index.consumers(t).iter().all(|&c| readers.contains(&index.nodes[c].name.as_str()));
            if only_here && index.is_constant_like(t) && !out.iter().any(|(n, _)| n == t) {
                out.push((t.clone(), format!("a parameter of BatchNorm '{}', folded in float32 into Conv '{}' as a TensorRT engine does (engine=trt): the engine never stores it", bn.name, conv.name)));
            }
        }
    }
    out
}

/// Folds every BatchNormalization that reads a Conv's only use into that Conv, in float32 (f64
/// arithmetic, stored as float32): `W' = W * s`, `b' = (b - mean) * s + beta`, with
/// `s = gamma / sqrt(var + eps)` per output channel. The Conv then writes the BatchNorm's output
/// tensor; the Conv's own output no longer exists. Both must read their parameters from
/// initializers, and the Conv's output must not be one of the model's `outputs` (exposed tensors
/// do not count: an engine computes them folded all the same). The folded Conv outputs are
/// dropped from `proto`'s graph outputs.
pub fn fold_batch_norms(
    model: &Model,
    proto: &ModelProto,
    index: &GraphIndex,
    outputs: &HashSet<String>,
) -> Result<(ModelProto, Vec<Folded>), ModelError> {
    let mut out = proto.clone();
    let graph = out.graph.as_mut().expect("model has a graph");
    // A parameter: a float32 initializer, or a Constant node's value.
    let initializer = |g: &GraphProto, name: &str| -> Option<TensorProto> {
        if let Some(t) = g.initializer.iter().find(|t| t.name() == name) {
            return (t.data_type() == DataType::Float as i32).then(|| t.clone());
        }
        let p = index.producer(name).filter(|p| p.op_type == "Constant")?;
        g.node[p.proto_index]
            .attribute
            .iter()
            .find(|a| a.name() == "value")
            .and_then(|a| a.t.clone())
            .filter(|t| t.data_type() == DataType::Float as i32)
    };
    let mut folded = Vec::new();
    let mut remove: HashSet<usize> = HashSet::new();
    let mut new_weights: Vec<TensorProto> = Vec::new();
    let mut gone: HashSet<String> = HashSet::new();
    for bn in index.nodes.iter().filter(|n| n.op_type == "BatchNormalization" && n.outputs.len() == 1) {
        let Some(conv) = bn.inputs.first().and_then(|x| index.producer(x)) else { continue };
        if conv.op_type != "Conv" || index.consumers(&conv.outputs[0]).len() != 1 || outputs.contains(&conv.outputs[0])
        {
            continue;
        }
        let g = &*graph;
        let params: Option<Vec<TensorProto>> = bn.inputs[1..].iter().map(|p| initializer(g, p)).collect();
        let (Some(params), Some(w)) =
            (params.filter(|p| p.len() == 4), conv.inputs.get(1).and_then(|w| initializer(g, w)))
        else {
            continue;
        };
        let bias = conv.inputs.get(2).filter(|b| !b.is_empty()).map(|b| initializer(g, b));
        if matches!(bias, Some(None)) {
            continue;
        }
        let eps =
            g.node[bn.proto_index].attribute.iter().find(|a| a.name() == "epsilon").and_then(|a| a.f).unwrap_or(1e-5)
                as f64;
        let values = |t: &TensorProto| float_weight_values(model, t);
        let (gamma, beta, mean, var) =
            (values(&params[0])?, values(&params[1])?, values(&params[2])?, values(&params[3])?);
        let weights = values(&w)?;
        let channels = gamma.len();
        if channels == 0
            || w.dims.first().copied() != Some(channels as i64)
            || [&beta, &mean, &var].iter().any(|v| v.len() != channels)
            || weights.len() % channels != 0
        {
            continue;
        }
        let b0 = match &bias {
            Some(Some(b)) => values(b)?,
            _ => vec![0.0; channels],
        };
        let per = weights.len() / channels;
        let scale: Vec<f64> = (0..channels).map(|c| gamma[c] as f64 / (var[c] as f64 + eps).sqrt()).collect();
        let folded_w: Vec<f32> = weights.iter().enumerate().map(|(i, &v)| (v as f64 * scale[i / per]) as f32).collect();
        let folded_b: Vec<f32> =
            (0..channels).map(|c| ((b0[c] as f64 - mean[c] as f64) * scale[c] + beta[c] as f64) as f32).collect();
        let (w_name, b_name) = (format!("{}/lw_folded_W", bn.name), format!("{}/lw_folded_B", bn.name));
        new_weights.push(f32_tensor(&w_name, &w.dims, &folded_w));
        new_weights.push(f32_tensor(&b_name, &[channels as i64], &folded_b));
        let conv_node = &mut graph.node[conv.proto_index];
        conv_node.input.truncate(1);
        conv_node.input.push(w_name);
        conv_node.input.push(b_name);
        gone.insert(conv_node.output[0].clone());
        conv_node.output = vec![bn.outputs[0].clone()];
        remove.insert(bn.proto_index);
        folded.push(Folded { batch_norm: bn.name.clone(), conv: conv.name.clone() });
    }
    let nodes = std::mem::take(&mut graph.node);
    graph.node = nodes.into_iter().enumerate().filter(|(i, _)| !remove.contains(i)).map(|(_, n)| n).collect();
    graph.initializer.extend(new_weights);
    graph.output.retain(|o| !gone.contains(o.name()));
    Ok((out, folded))
}

/// The fused layers of a graph by the rule set: a node joins the layer of the node producing its
/// data input when it is pointwise, that input has no other reader and is no graph output, and
/// that layer is headed by a Conv/ConvTranspose/MatMul/Gemm or is itself pointwise. `outputs`
/// are the model's own outputs (not tensors exposed for comparison). Returns each node's layer
/// (the name of its first node), by node name.
pub fn fused_layers(index: &GraphIndex, outputs: &HashSet<String>) -> HashMap<String, String> {
    let mut layer: HashMap<String, String> = HashMap::new();
    let mut head_op: HashMap<String, String> = HashMap::new();
    for n in &index.nodes {
        let joined = POINTWISE_OPS.contains(&n.op_type.as_str()).then(|| {
            n.inputs.iter().filter(|t| !t.is_empty() && !index.is_constant_like(t)).find_map(|t| {
                let p = index.producer(t)?;
                let single = index.consumers(t).len() == 1 && !outputs.contains(t);
                let lead = layer.get(&p.name)?;
                let lead_op = head_op.get(lead)?;
                (single && (LAYER_HEADS.contains(&lead_op.as_str()) || POINTWISE_OPS.contains(&lead_op.as_str())))
                    .then(|| lead.clone())
            })
        });
        match joined.flatten() {
            Some(lead) => {
                layer.insert(n.name.clone(), lead);
            }
            None => {
                layer.insert(n.name.clone(), n.name.clone());
                head_op.insert(n.name.clone(), n.op_type.clone());
            }
        }
    }
    layer
}

/// The tensors that leave their fused layer: read by a node of another layer, or graph outputs.
/// These are the ones an FP16 engine stores in FP16.
pub fn layer_boundaries(
    index: &GraphIndex,
    outputs: &HashSet<String>,
    layers: &HashMap<String, String>,
) -> HashSet<String> {
    let mut boundaries = HashSet::new();
    for n in &index.nodes {
        for o in n.outputs.iter().filter(|o| !o.is_empty()) {
            let leaves = outputs.contains(o)
                || index.consumers(o).iter().any(|&c| layers.get(&index.nodes[c].name) != layers.get(&n.name));
            if leaves {
                boundaries.insert(o.clone());
            }
        }
    }
    boundaries
}

/// The node a keep-list name means once BatchNorms are folded: a folded BatchNorm is its Conv.
pub fn resolve_folded<'a>(name: &'a str, folded: &'a [Folded]) -> &'a str {
    folded.iter().find(|f| f.batch_norm == name).map_or(name, |f| f.conv.as_str())
}
