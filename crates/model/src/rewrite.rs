use std::collections::HashSet;

use bytes::Bytes;

use crate::builder::f32_tensor;
use crate::model::is_external;
use crate::onnx::{
    attribute_proto::AttributeType, tensor_proto::DataType, AttributeProto, GraphProto, ModelProto, NodeProto,
    TensorProto, ValueInfoProto,
};
use crate::rounding::{tf32_slots, Rounding};
use crate::weights::float_weight_values;
use crate::{GraphIndex, Model, ModelError};

/// Which intermediate tensors to expose as graph outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every tensor computed by a main-graph node.
    All,
    /// Only these tensors (plus the model's own outputs).
    Names(Vec<String>),
}

/// Returns a copy of the model whose graph outputs are its own outputs followed by the selected
/// intermediate tensors, and the list of exposed tensor names in topological order.
///
/// Added outputs carry a name only: ONNX Runtime and TensorRT's parser accept untyped outputs, so no
/// type inference is needed. Graph inputs and initializers are never exposed (nothing computes them);
/// tensors that live only inside If/Loop/Scan bodies cannot be, and asking for one is an error.
pub fn expose(
    proto: &ModelProto,
    index: &GraphIndex,
    selection: &Selection,
) -> Result<(ModelProto, Vec<String>), ModelError> {
    let wanted: Vec<String> = match selection {
        Selection::All => index.computed_tensors().map(str::to_string).collect(),
        Selection::Names(names) => {
            for name in names {
                if index.producer_index(name).is_some() {
                    continue;
                }
                if let Some(node) = index.subgraph_owner(name) {
                    return Err(ModelError::SubgraphTensor { tensor: name.clone(), node: node.to_string() });
                }
                if index.is_initializer(name) || index.is_graph_input(name) {
                    return Err(ModelError::NotComputed(name.clone()));
                }
                return Err(ModelError::UnknownTensor(name.clone()));
            }
            let set: HashSet<&String> = names.iter().collect();
            index.computed_tensors().filter(|t| set.contains(&t.to_string())).map(str::to_string).collect()
        }
    };
    let mut out = proto.clone();
    let graph = out.graph.as_mut().expect("model has a graph");
    let mut present: HashSet<String> = graph.output.iter().map(|v| v.name().to_string()).collect();
    for name in &wanted {
        if present.insert(name.clone()) {
            graph.output.push(ValueInfoProto { name: Some(name.clone()), ..Default::default() });
        }
    }
    // Report in topological order, the model's own outputs included.
    let exposed: Vec<String> = index.computed_tensors().filter(|t| present.contains(*t)).map(str::to_string).collect();
    Ok((out, exposed))
}

/// An emulation rewrite of a model (see docs/emulation.md).
#[derive(Debug, Clone)]
pub struct Emulation {
    pub proto: ModelProto,
    /// Node outputs and graph inputs rounded (through a Cast pair, or for TF32 the multiplied
    /// inputs of Conv/MatMul/Gemm through a Veltkamp split).
    pub rounded_tensors: usize,
    /// Float32 initializers and Constant tensors rounded in place.
    pub rounded_weights: usize,
}

/// Suffix of the unrounded value of a tensor in the emulated model.
pub const RAW_SUFFIX: &str = "__lw_fp32";
/// Suffix of the unrounded copy of a weight read by a node kept in FP32.
const KEEP_SUFFIX: &str = "__lw_keep32";

/// Emulates a reduced-precision model on an FP32 runtime. For FP16 and BF16 (a strongly typed
/// model of that type):
/// - every float32 initializer and Constant (also inside subgraphs) is rounded in place (values
///   beyond the FP16 range become ±inf, as they do in an FP16 model);
/// - every float32 tensor in `float_tensors` that a main-graph node produces is renamed
///   `<name>__lw_fp32`, and `Cast(to=FLOAT16|BFLOAT16) -> Cast(to=FLOAT)` recreates `<name>` rounded;
/// - every float32 graph input is rounded the same way before any node reads it.
///
/// Arithmetic inside each op therefore stays FP32 while every value stored between ops is
/// rounded. For TF32 see [`emulate_tf32`]. `proto` is normally the output of [`expose`], so the
/// rounded values are what gets compared.
///
/// `keep_fp32` lists nodes (by position in `proto`) kept in FP32, as a converted model with FP32
/// islands has them: their outputs are not rounded, and they read unrounded copies of the weights
/// and graph inputs (their other inputs come from rounded nodes). Where a kept node's output is
/// read by a node that is not kept, that reader gets the value rounded (the Cast at the island's
/// edge in the converted model), so a float32 value beyond FP16's range becomes inf there.
pub fn emulate(
    model: &Model,
    proto: &ModelProto,
    float_tensors: &HashSet<String>,
    keep_fp32: &HashSet<usize>,
    rounding: Rounding,
) -> Result<Emulation, ModelError> {
    emulate_reusing(model, proto, float_tensors, keep_fp32, rounding, &mut RoundedWeights::default())
}

/// The weights an emulation rounded, by the bytes they were rounded from, for the next emulation
/// of the same model (`fix` emulates it once per keep list; rounding every weight again was most
/// of a prune trial's program). A source's bytes are held beside its rounding, so the address
/// that names them cannot be reused by other values while the entry lives.
#[derive(Default)]
pub struct RoundedWeights {
    by_source: std::collections::HashMap<(usize, usize, Rounding), (Bytes, Bytes)>,
}

impl RoundedWeights {
    /// `t` rounded in place, from the entry of its bytes where one was made.
    fn round(&mut self, model: &Model, t: &mut TensorProto, rounding: Rounding) -> Result<(), ModelError> {
        let source = t.raw_data.clone().filter(|raw| !raw.is_empty() && t.external_data.is_empty());
        let Some(source) = source else { return round_tensor(model, t, rounding) };
        let key = (source.as_ptr() as usize, source.len(), rounding);
        if let Some((_, rounded)) = self.by_source.get(&key) {
            t.raw_data = Some(rounded.clone());
            t.float_data.clear();
            t.data_location = None;
            return Ok(());
        }
        round_tensor(model, t, rounding)?;
        self.by_source.insert(key, (source, t.raw_data.clone().expect("just rounded")));
        Ok(())
    }
}

/// [`emulate`], taking the weights `rounded` holds already as they are and adding those it rounds.
pub fn emulate_reusing(
    model: &Model,
    proto: &ModelProto,
    float_tensors: &HashSet<String>,
    keep_fp32: &HashSet<usize>,
    rounding: Rounding,
    rounded: &mut RoundedWeights,
) -> Result<Emulation, ModelError> {
    let Some(storage) = rounding.storage_type() else {
        return emulate_tf32(proto, float_tensors, keep_fp32);
    };
    let mut out = proto.clone();
    let graph = out.graph.as_mut().expect("model has a graph");
    // What the converted model keeps float32 in every node (Resize's scales: a parameter, and
    // ONNX Runtime must still see an empty Constant there as empty) is not rounded.
    let parameters = parameter_only_tensors(graph);
    let float_tensors: HashSet<String> =
        float_tensors.iter().filter(|t| !parameters.contains(t.as_str())).cloned().collect();
    let float_tensors = &float_tensors;
    // Quantizers stay float32, as the converted file has them (`convert::QUANTIZATION_OPS`).
    let mut keep_fp32 = keep_fp32.clone();
    keep_fp32.extend(
        graph
            .node
            .iter()
            .enumerate()
            .filter(|(_, n)| n.domain().is_empty() && crate::convert::QUANTIZATION_OPS.contains(&n.op_type()))
            .map(|(i, _)| i),
    );
    let keep_fp32 = &keep_fp32;
    let shift = keep_weights_fp32(graph, keep_fp32);
    let keep_fp32: HashSet<usize> = keep_fp32.iter().map(|i| i + shift).collect();
    // Cast reads and writes bfloat16 from opset 13 on; before it, a Veltkamp split rounds to
    // BF16's 8 significant bits in float32 arithmetic.
    let opset = crate::model::default_opset(proto);
    let split = storage == DataType::Bfloat16 && opset < 13;
    // An external table that only Gathers read (an embedding) is rounded in the gathered rows,
    // which the pass below rounds anyway: rounding commutes with selecting rows, and the run
    // never computes a rounded copy of the whole table.
    let gathered = gathered_only_weights(graph, &keep_fp32);
    let mut with_rows: HashSet<String>;
    let float_tensors = if gathered.is_empty() {
        float_tensors
    } else {
        with_rows = float_tensors.clone();
        for node in graph
            .node
            .iter()
            .filter(|n| n.op_type() == "Gather" && n.input.first().is_some_and(|w| gathered.contains(w)))
        {
            with_rows.extend(node.output.first().cloned());
        }
        &with_rows
    };
    let mut rounded_weights = gathered.len();
    let mut weight_rounding = WeightRounding { model, rounding, storage, split, rounded };
    let mut nodes = weight_rounding.round_graph(graph, &gathered, &keep_fp32, &mut rounded_weights)?;
    if split {
        graph.initializer.push(f32_tensor(BF16_SPLITTER_NAME, &[], &[crate::rounding::BF16_SPLITTER]));
    }

    let float_inputs: Vec<String> = graph
        .input
        .iter()
        .filter(|v| is_float_value(v) && !graph.initializer.iter().any(|t| t.name() == v.name()))
        .map(|v| v.name().to_string())
        .collect();

    nodes.reserve(graph.node.len() * 3 + float_inputs.len() * 2);
    let mut rounded_tensors = 0;
    for input in &float_inputs {
        let rounded = format!("{input}__lw_{}_input", rounding.name());
        for (i, node) in graph.node.iter_mut().enumerate() {
            if !keep_fp32.contains(&i) {
                rename_reads(node, input, &rounded);
            }
        }
        nodes.extend(rounding_nodes(input, &rounded, storage, split));
        rounded_tensors += 1;
    }
    // Island edges, as the converted model has them: a float32 value that a kept node computes
    // and a reduced-precision node reads is cast to the reduced type on the way (and overflows
    // there), so that reader gets a rounded copy. Shape, Size and Cast read it as it is (the
    // converter inserts no Cast in front of them).
    let edges = island_edges(graph, float_tensors, &keep_fp32);
    // Named once, not once per node and edge (a large model's keep list has hundreds of edges).
    let edge_copies: Vec<(&String, String)> = edges.iter().map(|t| (t, format!("{t}{EDGE_SUFFIX}"))).collect();
    for (i, node) in graph.node.iter_mut().enumerate() {
        if !keep_fp32.contains(&i) && !EDGE_FREE_READERS.contains(&node.op_type()) {
            for (t, copy) in &edge_copies {
                rename_reads(node, t, copy);
            }
        }
    }
    for (i, mut node) in std::mem::take(&mut graph.node).into_iter().enumerate() {
        let float_reduction = node.output.first().is_some_and(|o| float_tensors.contains(o.as_str()))
            && FP16_SUM_OPS.contains(&node.op_type());
        let mut pairs = Vec::new();
        for out_name in node.output.iter_mut() {
            if keep_fp32.contains(&i) && edges.contains(out_name.as_str()) {
                pairs.extend(rounding_nodes(out_name, &format!("{out_name}{EDGE_SUFFIX}"), storage, split));
                rounded_tensors += 1;
                continue;
            }
            if out_name.is_empty() || !float_tensors.contains(out_name.as_str()) || keep_fp32.contains(&i) {
                continue;
            }
            let raw = format!("{out_name}{RAW_SUFFIX}");
            pairs.extend(rounding_nodes(&raw, out_name, storage, split));
            *out_name = raw;
            rounded_tensors += 1;
        }
        let cumsum_axis =
            (storage == DataType::Float16 && !keep_fp32.contains(&i) && node.op_type() == "CumSum" && opset >= 11)
                .then(|| node.input.get(1).and_then(|a| constant_int(graph, a)))
                .flatten()
                .filter(|_| node.output.first().is_some_and(|o| o.ends_with(RAW_SUFFIX)));
        let stepwise = !keep_fp32.contains(&i)
            && rounds_inside(node.op_type(), storage)
            && node.output.first().is_some_and(|o| o.ends_with(RAW_SUFFIX));
        if let Some(axis) = cumsum_axis {
            nodes.extend(fp16_cumsum_emulation(&node, axis));
        } else if stepwise {
            let (emulated, constants) = stepwise_emulation(&node, storage, split);
            nodes.extend(emulated);
            for c in constants {
                if !graph.initializer.iter().any(|t| t.name() == c.name()) {
                    graph.initializer.push(c);
                }
            }
        } else if storage == DataType::Float16 && !keep_fp32.contains(&i) && float_reduction {
            let (emulated, axes) = fp16_sum_emulation(&node, opset);
            nodes.extend(emulated);
            graph.initializer.extend(axes);
        } else {
            nodes.push(node);
        }
        nodes.extend(pairs);
    }
    graph.node = nodes;
    Ok(Emulation { proto: out, rounded_tensors, rounded_weights })
}

/// Tensors of `graph` that every reader reads at a slot the converter keeps float32
/// (`convert::FP32_INPUT_SLOTS`: Resize's scales, Upsample's scales).
fn parameter_only_tensors(graph: &GraphProto) -> HashSet<String> {
    let mut slots: std::collections::HashMap<&str, bool> = std::collections::HashMap::new();
    for n in &graph.node {
        for (slot, t) in n.input.iter().enumerate().filter(|(_, t)| !t.is_empty()) {
            let parameter = crate::convert::FP32_INPUT_SLOTS.contains(&(n.op_type(), slot));
            let entry = slots.entry(t.as_str()).or_insert(true);
            *entry &= parameter;
        }
    }
    slots.into_iter().filter(|(_, only)| *only).map(|(t, _)| t.to_string()).collect()
}

/// Emulates TF32 tensor cores on an FP32 runtime: each float32 input that Conv, ConvTranspose,
/// MatMul or Gemm multiplies (activations and weights, see [`crate::rounding::TF32_OPS`]) is rounded to TF32's
/// 11 significant bits by a Veltkamp split in float32 (`c = x * 8193; x' = c - (c - x)`, exactly
/// round-to-nearest-even, see [`crate::rounding::round_tf32`]); the op then accumulates in float32
/// and every stored tensor stays float32. Nodes in `keep_fp32` read their inputs unrounded.
pub fn emulate_tf32(
    proto: &ModelProto,
    float_tensors: &HashSet<String>,
    keep_fp32: &HashSet<usize>,
) -> Result<Emulation, ModelError> {
    let mut out = proto.clone();
    let graph = out.graph.as_mut().expect("model has a graph");
    let mut float_weights: HashSet<String> = graph
        .initializer
        .iter()
        .filter(|t| t.data_type() == DataType::Float as i32)
        .map(|t| t.name().to_string())
        .collect();
    float_weights.extend(graph.input.iter().filter(|v| is_float_value(v)).map(|v| v.name().to_string()));
    let is_float = |t: &str| float_tensors.contains(t) || float_weights.contains(t);
    // One split per tensor, shared by every reader.
    let mut split: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut nodes = Vec::with_capacity(graph.node.len() * 2);
    let mut rounded_tensors = 0;
    for (i, mut node) in std::mem::take(&mut graph.node).into_iter().enumerate() {
        let slots = tf32_slots(&node);
        if !keep_fp32.contains(&i) {
            for &slot in slots {
                let Some(input) = node.input.get(slot).cloned().filter(|t| !t.is_empty() && is_float(t)) else {
                    continue;
                };
                let rounded = split.entry(input.clone()).or_insert_with(|| {
                    rounded_tensors += 1;
                    let rounded = format!("{input}__lw_tf32");
                    nodes.extend(veltkamp_split(&input, &rounded, TF32_SPLITTER_NAME, &input, "tf32"));
                    rounded
                });
                node.input[slot] = rounded.clone();
            }
        }
        nodes.push(node);
    }
    graph.node = nodes;
    if rounded_tensors > 0 {
        graph.initializer.push(f32_tensor(TF32_SPLITTER_NAME, &[], &[crate::rounding::TF32_SPLITTER]));
    }
    Ok(Emulation { proto: out, rounded_tensors, rounded_weights: 0 })
}

/// Reductions whose FP16 kernel on ONNX Runtime's CUDA provider stores its sum in FP16, measured
/// on an H100 (docs/emulation.md, per-op table): ReduceMean rounds its float32 sum to FP16 and
/// then divides (bit for bit on the probes; it overflows when the sum passes 65504 though the mean
/// is small), ReduceLogSumExp likewise stores the sum of exp(x - max) in FP16. ReduceSum,
/// ReduceL2, ReduceSumSquare, the pools, Softmax and the normalizations accumulate in float32.
const FP16_SUM_OPS: &[&str] = &["ReduceMean", "ReduceLogSumExp"];

/// Nodes that compute what `node` (a ReduceMean or ReduceLogSumExp, output `node.output[0]`)
/// computes on ONNX Runtime's CUDA provider in FP16: the float32 sum is stored in FP16 (rounded,
/// ±inf beyond 65504) before the division by the element count (ReduceMean) or the Log (plus the
/// maximum, ReduceLogSumExp). Also the axes initializers they need; `opset` decides whether
/// axes are an attribute or an input.
fn fp16_sum_emulation(node: &NodeProto, opset: i64) -> (Vec<NodeProto>, Vec<TensorProto>) {
    let out = node.output[0].clone();
    let op = |t: &str, suffix: &str, inputs: Vec<String>, output: &str, attribute: Vec<AttributeProto>| NodeProto {
        op_type: Some(t.into()),
        name: Some(format!("{out}/lw_sum_{suffix}")),
        input: inputs,
        output: vec![output.to_string()],
        attribute,
        ..Default::default()
    };
    let int = |name: &str, v: i64| AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    };
    let attr_axes: Option<Vec<i64>> = node.attribute.iter().find(|a| a.name() == "axes").map(|a| a.ints.clone());
    let keepdims = node.attribute.iter().find(|a| a.name() == "keepdims").and_then(|a| a.i).unwrap_or(1);
    let noop = node.attribute.iter().find(|a| a.name() == "noop_with_empty_axes").and_then(|a| a.i);
    let data = node.input[0].clone();
    let mut inits = Vec::new();
    // A reduction over the node's axes: ReduceSum takes axes as an input from opset 13
    // (ReduceMax from 18), an attribute before.
    let mut reduce = |kind: &str, suffix: &str, input: &str, output: &str, keep: i64| {
        let input_axes_from = if kind == "ReduceSum" { 13 } else { 18 };
        let mut inputs = vec![input.to_string()];
        let mut attrs = vec![int("keepdims", keep)];
        if let Some(v) = noop {
            attrs.push(int("noop_with_empty_axes", v));
        }
        if opset >= input_axes_from {
            if let Some(axes_input) = node.input.get(1).filter(|a| !a.is_empty()) {
                inputs.push(axes_input.clone());
            } else if let Some(axes) = &attr_axes {
                let name = format!("{out}__lw_{suffix}_axes");
                inits.push(crate::builder::i64_tensor(&name, &[axes.len() as i64], axes));
                inputs.push(name);
            }
        } else if let Some(axes) = &attr_axes {
            attrs.push(AttributeProto {
                name: Some("axes".into()),
                r#type: Some(AttributeType::Ints as i32),
                ints: axes.clone(),
                ..Default::default()
            });
        }
        op(kind, suffix, inputs, output, attrs)
    };
    let (sum, stored) = (format!("{out}__lw_sum"), format!("{out}__lw_sum_fp16"));
    let mut nodes = Vec::new();
    if node.op_type() == "ReduceLogSumExp" {
        let (max, shifted, exp, top, log) = (
            format!("{out}__lw_max"),
            format!("{out}__lw_shifted"),
            format!("{out}__lw_exp"),
            format!("{out}__lw_top"),
            format!("{out}__lw_log"),
        );
        nodes.push(reduce("ReduceMax", "max", &data, &max, 1));
        nodes.push(op("Sub", "shift", vec![data.clone(), max], &shifted, vec![]));
        nodes.push(op("Exp", "exp", vec![shifted], &exp, vec![]));
        nodes.push(reduce("ReduceSum", "sum", &exp, &sum, keepdims));
        nodes.extend(cast_pair(&sum, &stored, DataType::Float16));
        nodes.push(reduce("ReduceMax", "top", &data, &top, keepdims));
        nodes.push(op("Log", "log", vec![stored], &log, vec![]));
        nodes.push(op("Add", "add", vec![top, log], &out, vec![]));
    } else {
        // The element count: the input's size over the output's.
        let (n_in, n_out, count, count_f, value) = (
            format!("{out}__lw_n_in"),
            format!("{out}__lw_n_out"),
            format!("{out}__lw_count"),
            format!("{out}__lw_count_f"),
            format!("{out}__lw_value"),
        );
        let mut mean = node.clone();
        mean.output[0] = value.clone();
        mean.name = Some(format!("{out}/lw_sum_shape"));
        nodes.push(mean);
        nodes.push(reduce("ReduceSum", "sum", &data, &sum, keepdims));
        nodes.extend(cast_pair(&sum, &stored, DataType::Float16));
        nodes.push(op("Size", "n_in", vec![data], &n_in, vec![]));
        nodes.push(op("Size", "n_out", vec![value], &n_out, vec![]));
        nodes.push(op("Div", "count", vec![n_in, n_out], &count, vec![]));
        nodes.push(op("Cast", "count_f", vec![count], &count_f, vec![int("to", DataType::Float as i64)]));
        nodes.push(op("Div", "mean", vec![stored, count_f], &out, vec![]));
    }
    (nodes, inits)
}

/// Unary ops whose kernel on ONNX Runtime's CUDA provider computes a formula in the storage type,
/// rounding after every step, measured on the H100 over every finite input of the type
/// (scripts/gpu/elementwise_probe.py, docs/emulation.md): BF16 Sigmoid is
/// `x > 0 ? 1/(1 + exp(-x)) : 1 - 1/(1 + exp(x))` and Softplus (FP16 and BF16)
/// `x > 0 ? x + log(1 + exp(-x)) : log(1 + exp(x))`, each step rounded: bit for bit on all 65,280
/// finite BF16 and 63,488 finite FP16 inputs, where computing in float32 and rounding once
/// differs on 1,730 (BF16 Sigmoid: 2^-7 at x = -5 where the value is 0.0067, 0 below x = -9)
/// and 17,823 (FP16 Softplus, up to 33% where the value is at least 1e-3).
pub fn rounds_inside(op: &str, storage: DataType) -> bool {
    match op {
        "Sigmoid" => storage == DataType::Bfloat16,
        "Softplus" => true,
        _ => false,
    }
}

/// Nodes that compute `node` (a Sigmoid or Softplus, see [`rounds_inside`]) step by step in
/// float32, each step rounded to `storage`, and the scalar constants they read.
fn stepwise_emulation(node: &NodeProto, storage: DataType, split: bool) -> (Vec<NodeProto>, Vec<TensorProto>) {
    struct Steps {
        out: String,
        storage: DataType,
        split: bool,
        nodes: Vec<NodeProto>,
    }
    impl Steps {
        /// `op(inputs)` rounded to the storage type; returns the rounded tensor's name.
        fn rounded(&mut self, op: &str, inputs: Vec<String>) -> String {
            let step = self.nodes.len();
            let (raw, value) = (format!("{}__lw_k{step}_raw", self.out), format!("{}__lw_k{step}", self.out));
            self.nodes.push(NodeProto {
                op_type: Some(op.into()),
                name: Some(format!("{}/lw_k{step}_{op}", self.out)),
                input: inputs,
                output: vec![raw.clone()],
                ..Default::default()
            });
            self.nodes.extend(rounding_nodes(&raw, &value, self.storage, self.split));
            value
        }
        /// 1 + exp(x) or 1 + exp(-x), each step rounded.
        fn one_plus_exp(&mut self, x: &str, negate: bool) -> String {
            let arg = if negate { self.rounded("Neg", vec![x.to_string()]) } else { x.to_string() };
            let e = self.rounded("Exp", vec![arg]);
            self.rounded("Add", vec![ONE.to_string(), e])
        }
    }
    const ONE: &str = "__lw_one";
    const ZERO: &str = "__lw_zero";
    let out = node.output[0].clone();
    let x = node.input[0].clone();
    let constants = vec![f32_tensor(ONE, &[], &[1.0]), f32_tensor(ZERO, &[], &[0.0])];
    let mut k = Steps { out: out.clone(), storage, split, nodes: Vec::new() };
    let (positive, negative) = if node.op_type() == "Sigmoid" {
        let s = k.one_plus_exp(&x, true);
        let positive = k.rounded("Div", vec![ONE.into(), s]);
        let s = k.one_plus_exp(&x, false);
        let r = k.rounded("Div", vec![ONE.into(), s]);
        (positive, k.rounded("Sub", vec![ONE.into(), r]))
    } else {
        let s = k.one_plus_exp(&x, true);
        let l = k.rounded("Log", vec![s]);
        let positive = k.rounded("Add", vec![x.clone(), l]);
        let s = k.one_plus_exp(&x, false);
        (positive, k.rounded("Log", vec![s]))
    };
    let above = format!("{out}__lw_k_above");
    let mut nodes = k.nodes;
    nodes.push(NodeProto {
        op_type: Some("Greater".into()),
        name: Some(format!("{out}/lw_k_above")),
        input: vec![x, ZERO.into()],
        output: vec![above.clone()],
        ..Default::default()
    });
    nodes.push(NodeProto {
        op_type: Some("Where".into()),
        name: Some(format!("{out}/lw_k_where")),
        input: vec![above, positive, negative],
        output: vec![out],
        ..Default::default()
    });
    (nodes, constants)
}

/// The value of a scalar (or one-element) integer initializer or Constant of `graph`.
fn constant_int(graph: &GraphProto, name: &str) -> Option<i64> {
    let from_tensor = |t: &TensorProto| -> Option<i64> {
        match t.data_type() {
            x if x == DataType::Int64 as i32 => t.int64_data.first().copied().or_else(|| {
                t.raw_data.as_ref().filter(|r| r.len() == 8).map(|r| i64::from_le_bytes(r[..8].try_into().unwrap()))
            }),
            x if x == DataType::Int32 as i32 => t.int32_data.first().map(|&v| v as i64).or_else(|| {
                t.raw_data
                    .as_ref()
                    .filter(|r| r.len() == 4)
                    .map(|r| i32::from_le_bytes(r[..4].try_into().unwrap()) as i64)
            }),
            _ => None,
        }
    };
    graph.initializer.iter().find(|t| t.name() == name).and_then(from_tensor).or_else(|| {
        graph
            .node
            .iter()
            .find(|n| n.op_type() == "Constant" && n.output.first().is_some_and(|o| o == name))?
            .attribute
            .iter()
            .find(|a| a.name() == "value")?
            .t
            .as_ref()
            .and_then(from_tensor)
    })
}

/// Nodes that compute what `node` (a CumSum over the constant `axis`, output `node.output[0]`)
/// computes on ONNX Runtime's CUDA provider in FP16, bit for bit on the H100's probes: a running
/// sum kept in FP16, one element after another along the axis. A Scan carries the sum (rounded
/// through a Cast pair each step) from zeros shaped like one slice; `exclusive` emits the sum
/// before each element, `reverse` runs the other way.
fn fp16_cumsum_emulation(node: &NodeProto, axis: i64) -> Vec<NodeProto> {
    let out = node.output[0].clone();
    let data = node.input[0].clone();
    let attr_int = |name: &str| node.attribute.iter().find(|a| a.name() == name).and_then(|a| a.i).unwrap_or(0);
    let (exclusive, reverse) = (attr_int("exclusive") != 0, attr_int("reverse") != 0);
    let int = |name: &str, v: i64| AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    };
    let ints = |name: &str, v: Vec<i64>| AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v,
        ..Default::default()
    };
    let plain = |t: &str, name: String, inputs: Vec<String>, output: &str, attribute: Vec<AttributeProto>| NodeProto {
        op_type: Some(t.into()),
        name: Some(name),
        input: inputs,
        output: vec![output.to_string()],
        attribute,
        ..Default::default()
    };
    // Zeros shaped like one slice along the axis: the Scan's first state.
    let (index, slice, shape, zeros) = (
        format!("{out}__lw_cs_index"),
        format!("{out}__lw_cs_slice"),
        format!("{out}__lw_cs_shape"),
        format!("{out}__lw_cs_zeros"),
    );
    let mut nodes = vec![
        plain(
            "Constant",
            format!("{out}/lw_cs_index"),
            vec![],
            &index,
            vec![AttributeProto {
                name: Some("value".into()),
                r#type: Some(AttributeType::Tensor as i32),
                t: Some(crate::builder::i64_tensor("", &[], &[0])),
                ..Default::default()
            }],
        ),
        plain("Gather", format!("{out}/lw_cs_slice"), vec![data.clone(), index], &slice, vec![int("axis", axis)]),
        plain("Shape", format!("{out}/lw_cs_shape"), vec![slice], &shape, vec![]),
        plain("ConstantOfShape", format!("{out}/lw_cs_zeros"), vec![shape], &zeros, vec![]),
    ];
    // The body: (sum_in, x_i) -> (sum_out, emitted), sum_out = FP16(sum_in + x_i).
    let (sum_in, x_i, added, sum_out, emitted) =
        ("lw_cs_sum_in", "lw_cs_x", "lw_cs_added", "lw_cs_sum_out", "lw_cs_emitted");
    let mut body_nodes = vec![plain("Add", "lw_cs_add".into(), vec![sum_in.into(), x_i.into()], added, vec![])];
    body_nodes.extend(cast_pair(added, sum_out, DataType::Float16));
    body_nodes.push(plain(
        "Identity",
        "lw_cs_emit".into(),
        vec![if exclusive { sum_in } else { sum_out }.into()],
        emitted,
        vec![],
    ));
    let value = |n: &str| ValueInfoProto {
        name: Some(n.into()),
        r#type: Some(crate::builder::tensor_type(DataType::Float, None)),
        ..Default::default()
    };
    let body = GraphProto {
        name: Some("lw_cumsum_fp16".into()),
        node: body_nodes,
        input: vec![value(sum_in), value(x_i)],
        output: vec![value(sum_out), value(emitted)],
        ..Default::default()
    };
    let direction = if reverse { 1 } else { 0 };
    nodes.push(NodeProto {
        op_type: Some("Scan".into()),
        name: Some(format!("{out}/lw_cs_scan")),
        input: vec![zeros, data],
        output: vec![format!("{out}__lw_cs_final"), out.clone()],
        attribute: vec![
            int("num_scan_inputs", 1),
            ints("scan_input_axes", vec![axis]),
            ints("scan_output_axes", vec![axis]),
            ints("scan_input_directions", vec![direction]),
            ints("scan_output_directions", vec![direction]),
            AttributeProto {
                name: Some("body".into()),
                r#type: Some(AttributeType::Graph as i32),
                g: Some(body),
                ..Default::default()
            },
        ],
        ..Default::default()
    });
    nodes
}

/// Suffix of the reduced-precision copy of a kept node's output that non-kept nodes read.
const EDGE_SUFFIX: &str = "__lw_edge";
/// Ops that read a float tensor of any type without arithmetic: no Cast at an island edge.
const EDGE_FREE_READERS: &[&str] = &["Shape", "Size", "Cast"];

/// The float outputs of kept nodes that a node outside the keep list reads (directly or from a
/// body it owns): the island edges where the converted model casts down.
fn island_edges(graph: &GraphProto, float_tensors: &HashSet<String>, keep_fp32: &HashSet<usize>) -> HashSet<String> {
    if keep_fp32.is_empty() {
        return HashSet::new();
    }
    let kept_outputs: HashSet<&str> = keep_fp32
        .iter()
        .filter_map(|&i| graph.node.get(i))
        .flat_map(|n| n.output.iter())
        .filter(|o| !o.is_empty() && float_tensors.contains(o.as_str()))
        .map(String::as_str)
        .collect();
    let mut edges = HashSet::new();
    for (i, node) in graph.node.iter().enumerate() {
        if keep_fp32.contains(&i) || EDGE_FREE_READERS.contains(&node.op_type()) {
            continue;
        }
        if node.attribute.iter().all(|a| a.g.is_none() && a.graphs.is_empty()) {
            // A node without bodies reads its inputs only: no set of every read to build.
            edges.extend(node.input.iter().filter(|r| kept_outputs.contains(r.as_str())).cloned());
            continue;
        }
        let mut reads = HashSet::new();
        collect_reads(node, &mut reads);
        edges.extend(reads.into_iter().filter(|r| kept_outputs.contains(r.as_str())));
    }
    edges
}

/// Every tensor name a node reads, its bodies' reads included.
fn collect_reads(node: &NodeProto, reads: &mut HashSet<String>) {
    reads.extend(node.input.iter().filter(|i| !i.is_empty()).cloned());
    for attr in &node.attribute {
        for g in attr.g.iter().chain(attr.graphs.iter()) {
            for n in &g.node {
                collect_reads(n, reads);
            }
        }
    }
}

/// Kept nodes read unrounded copies (`<name>__lw_keep32`) of the float weights they use; the
/// originals are rounded for everyone else. Copies are made before any rounding. Returns how many
/// nodes were inserted at the front (node positions shift by that much).
fn keep_weights_fp32(graph: &mut GraphProto, keep_fp32: &HashSet<usize>) -> usize {
    if keep_fp32.is_empty() {
        return 0;
    }
    let copy_name = |n: &str| format!("{n}{KEEP_SUFFIX}");
    // An empty name is an absent optional input, not a tensor: no copy of it.
    // What a kept node reads, its bodies' outer-scope reads included (a kept If or Loop is FP32
    // whole, and its bodies read the outer weights unrounded).
    let kept_reads: HashSet<String> = keep_fp32
        .iter()
        .filter_map(|&i| graph.node.get(i))
        .flat_map(|n| n.input.iter().filter(|t| !t.is_empty()).cloned().chain(crate::graph::outer_refs_of(n)))
        .collect();
    let mut copies: HashSet<String> = HashSet::new();
    let mut new_inits = Vec::new();
    for t in
        graph.initializer.iter().filter(|t| t.data_type() == DataType::Float as i32 && kept_reads.contains(t.name()))
    {
        let mut c = t.clone();
        c.name = Some(copy_name(t.name()));
        copies.insert(t.name().to_string());
        new_inits.push(c);
    }
    graph.initializer.extend(new_inits);
    let mut new_constants = Vec::new();
    for n in graph.node.iter().filter(|n| {
        n.op_type() == "Constant" && n.input.is_empty() && n.output.first().is_some_and(|o| kept_reads.contains(o))
    }) {
        let mut c = n.clone();
        c.output = vec![copy_name(&n.output[0])];
        c.name = Some(format!("{}/lw_keep32", n.name()));
        copies.insert(n.output[0].clone());
        new_constants.push(c);
    }
    for &i in keep_fp32 {
        if let Some(node) = graph.node.get_mut(i) {
            for input in node.input.iter_mut().filter(|x| copies.contains(x.as_str())) {
                *input = copy_name(input);
            }
            for name in crate::graph::outer_refs_of(node).into_iter().filter(|t| copies.contains(t)) {
                for attr in node.attribute.iter_mut() {
                    for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()) {
                        crate::graph::rename_outer_ref(g, &name, &copy_name(&name));
                    }
                }
            }
        }
    }
    // Unrounded Constant copies go first (they have no inputs), keeping the order topological.
    let shift = new_constants.len();
    let rest = std::mem::take(&mut graph.node);
    graph.node = new_constants;
    graph.node.extend(rest);
    shift
}

fn is_float_value(v: &ValueInfoProto) -> bool {
    use crate::onnx::type_proto::Value;
    matches!(&v.r#type.as_ref().and_then(|t| t.value.as_ref()), Some(Value::TensorType(t)) if t.elem_type() == DataType::Float as i32)
}

/// Replaces reads of `from` by `to` in a node and in the subgraphs it owns.
fn rename_reads(node: &mut NodeProto, from: &str, to: &str) {
    for i in node.input.iter_mut().filter(|i| i.as_str() == from) {
        *i = to.to_string();
    }
    for attr in node.attribute.iter_mut() {
        for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()) {
            for n in g.node.iter_mut() {
                rename_reads(n, from, to);
            }
            for o in g.output.iter_mut().filter(|o| o.name() == from) {
                o.name = Some(to.to_string());
            }
        }
    }
}

const BF16_SPLITTER_NAME: &str = "__lw_bf16_splitter";
const TF32_SPLITTER_NAME: &str = "__lw_tf32_splitter";

/// The nodes that round `from` into `to`: a Cast pair, or with `split` (BF16 before opset 13) a
/// Veltkamp split.
fn rounding_nodes(from: &str, to: &str, storage: DataType, split: bool) -> Vec<NodeProto> {
    if split {
        veltkamp_split(from, to, BF16_SPLITTER_NAME, to, "bf16").to_vec()
    } else {
        cast_pair(from, to, storage).to_vec()
    }
}

/// `c = from * splitter; to = c - (c - from)`: `from` rounded to the leading bits the splitter
/// (`2^s + 1`) keeps, in float32 arithmetic alone. Helper tensors and nodes are named after
/// `base` and `tag` (`{base}__lw_{tag}_c`, `{base}/lw_{tag}_scale`).
fn veltkamp_split(from: &str, to: &str, splitter: &str, base: &str, tag: &str) -> [NodeProto; 3] {
    let op = |t: &str, name: String, ins: [&str; 2], out: &str| NodeProto {
        op_type: Some(t.into()),
        name: Some(name),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: vec![out.to_string()],
        ..Default::default()
    };
    let (c, d) = (format!("{base}__lw_{tag}_c"), format!("{base}__lw_{tag}_d"));
    [
        op("Mul", format!("{base}/lw_{tag}_scale"), [from, splitter], &c),
        op("Sub", format!("{base}/lw_{tag}_low"), [&c, from], &d),
        op("Sub", format!("{base}/lw_{tag}_high"), [&c, &d], to),
    ]
}

/// `from -> Cast(FLOAT16|BFLOAT16) -> Cast(FLOAT) -> to`, with names that say what they are.
fn cast_pair(from: &str, to: &str, storage: DataType) -> [NodeProto; 2] {
    let short = if storage == DataType::Bfloat16 { "bf16" } else { "fp16" };
    let half = format!("{to}__lw_{short}");
    let cast = |input: &str, output: &str, target: DataType, name: String| NodeProto {
        input: vec![input.to_string()],
        output: vec![output.to_string()],
        name: Some(name),
        op_type: Some("Cast".into()),
        attribute: vec![AttributeProto {
            name: Some("to".into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(target as i64),
            ..Default::default()
        }],
        ..Default::default()
    };
    [
        cast(from, &half, storage, format!("{to}/lw_to_{short}")),
        cast(&half, to, DataType::Float, format!("{to}/lw_to_fp32")),
    ]
}

/// How an emulation rounds the weights of a graph and its subgraphs.
struct WeightRounding<'a> {
    model: &'a Model,
    rounding: Rounding,
    storage: DataType,
    split: bool,
    rounded: &'a mut RoundedWeights,
}

impl WeightRounding<'_> {
    /// Rounds every float32 weight of `graph` (and of its subgraphs) except the keep list's
    /// float32 copies. Inline weights are rounded in place. A weight kept as external data (a
    /// model of gigabytes) is rounded where it is read instead: the stored values stay in their
    /// file, renamed `NAME__lw_stored`, and nodes at the head of the graph compute `NAME` from
    /// them (returned for the top graph, inserted in subgraphs), so no run copies the weights.
    /// `rounded_after_reads` are weights of `graph` itself that are rounded after their readers.
    /// The bodies of `kept` nodes (positions in `graph`: an If or Loop kept in FP32, which the
    /// converted model keeps FP32 whole) keep their weights.
    fn round_graph(
        &mut self,
        graph: &mut GraphProto,
        rounded_after_reads: &HashSet<String>,
        kept: &HashSet<usize>,
        count: &mut usize,
    ) -> Result<Vec<NodeProto>, ModelError> {
        let is_keep_copy = |name: &str| name.ends_with(KEEP_SUFFIX);
        let mut at_head = Vec::new();
        for t in graph.initializer.iter_mut() {
            if t.data_type() == DataType::Float as i32
                && !is_keep_copy(t.name())
                && !rounded_after_reads.contains(t.name())
            {
                if is_external(t) {
                    let name = t.name().to_string();
                    let stored = format!("{name}{STORED_SUFFIX}");
                    at_head.extend(rounding_nodes(&stored, &name, self.storage, self.split));
                    t.name = Some(stored);
                } else {
                    self.rounded.round(self.model, t, self.rounding)?;
                }
                *count += 1;
            }
        }
        for (i, node) in graph.node.iter_mut().enumerate() {
            let is_constant = node.op_type() == "Constant" && !node.output.first().is_some_and(|o| is_keep_copy(o));
            let body_kept = kept.contains(&i);
            for attr in node.attribute.iter_mut() {
                if is_constant {
                    match attr.name() {
                        "value" => {
                            if let Some(t) = attr.t.as_mut().filter(|t| t.data_type() == DataType::Float as i32) {
                                self.rounded.round(self.model, t, self.rounding)?;
                                *count += 1;
                            }
                        }
                        "value_float" => {
                            attr.f = attr.f.map(|v| self.rounding.round(v));
                            *count += 1;
                        }
                        "value_floats" => {
                            attr.floats.iter_mut().for_each(|v| *v = self.rounding.round(*v));
                            *count += 1;
                        }
                        _ => {}
                    }
                }
                for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()).filter(|_| !body_kept) {
                    let head = self.round_graph(g, &HashSet::new(), &HashSet::new(), count)?;
                    g.node.splice(0..0, head);
                }
            }
        }
        Ok(at_head)
    }
}

/// External float32 weights of `graph` that only Gathers of nodes not kept in FP32 read, as
/// their data (input 0): no subgraph, graph output or other node reads them.
fn gathered_only_weights(graph: &GraphProto, keep_fp32: &HashSet<usize>) -> HashSet<String> {
    let mut candidates: HashSet<String> = graph
        .initializer
        .iter()
        .filter(|t| t.data_type() == DataType::Float as i32 && is_external(t) && !t.name().ends_with(KEEP_SUFFIX))
        .map(|t| t.name().to_string())
        .collect();
    let mut read_by_gather = HashSet::new();
    for (i, node) in graph.node.iter().enumerate() {
        for (slot, input) in node.input.iter().enumerate() {
            if !candidates.contains(input) {
                continue;
            }
            if node.op_type() == "Gather" && slot == 0 && !keep_fp32.contains(&i) {
                read_by_gather.insert(input.clone());
            } else {
                candidates.remove(input);
            }
        }
        for attr in &node.attribute {
            for g in attr.g.iter().chain(attr.graphs.iter()) {
                candidates.retain(|t| !reads_anywhere(g, t));
            }
        }
    }
    candidates.retain(|t| read_by_gather.contains(t) && !graph.output.iter().any(|o| o.name() == t));
    candidates
}

/// Whether any node of `graph` or of its subgraphs reads `tensor`.
fn reads_anywhere(graph: &GraphProto, tensor: &str) -> bool {
    graph.node.iter().any(|n| {
        n.input.iter().any(|i| i == tensor)
            || n.attribute.iter().any(|a| a.g.iter().chain(a.graphs.iter()).any(|g| reads_anywhere(g, tensor)))
    })
}

/// Suffix of an external weight's stored (unrounded) values in an emulation, which rounds them
/// where they are read.
const STORED_SUFFIX: &str = "__lw_stored";

/// Rounds a float32 tensor's values and stores them inline as raw data.
fn round_tensor(model: &Model, t: &mut TensorProto, rounding: Rounding) -> Result<(), ModelError> {
    let values = float_weight_values(model, t)?;
    let mut raw = Vec::with_capacity(values.len() * 4);
    for v in values {
        raw.extend_from_slice(&rounding.round(v).to_le_bytes());
    }
    t.raw_data = Some(Bytes::from(raw));
    t.float_data.clear();
    t.external_data.clear();
    t.data_location = None;
    Ok(())
}
