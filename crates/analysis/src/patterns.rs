//! Recognising the small patterns that a precision fix should keep together: a decomposed
//! LayerNorm, a (decomposed) Softmax, a Conv with its BatchNormalization.

use std::collections::{HashSet, VecDeque};

use layerwise_model::layernorm::DecomposedLayerNorm;
use layerwise_model::GraphIndex;
use serde::Serialize;

/// A group of nodes to keep in FP32 together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pattern {
    /// `decomposed_layernorm`, `decomposed_softmax`, `softmax`, `conv_batchnorm`, `periodic_argument`,
    /// `offset_and_back`, `storage_path`, `integer_from_float`, or `node`.
    pub kind: &'static str,
    /// Node names in topological order.
    pub nodes: Vec<String>,
}

/// Ops that can compute an integer from a float: a Cast to an integer type, the rounding ops
/// (whose output is float but integral), ArgMax/ArgMin, TopK's indices, and the comparisons
/// (truth values).
const INTEGER_FROM_FLOAT: &[&str] = &[
    "Cast",
    "Floor",
    "Ceil",
    "Round",
    "ArgMax",
    "ArgMin",
    "TopK",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "Equal",
];

/// A tensor type name of the reports (`int32`, `uint8`, ...) that holds integers.
pub fn is_integer_dtype(dtype: &str) -> bool {
    dtype.starts_with("int") || dtype.starts_with("uint")
}

/// Whether `op` can compute an integer from a float input (a Cast may, depending on its type).
pub fn may_compute_integer_from_float(op: &str) -> bool {
    INTEGER_FROM_FLOAT.contains(&op)
}

/// Whether `op`, whose output has type `dtype`, computes an integer from its input.
pub fn computes_integer_from_float(op: &str, dtype: &str) -> bool {
    may_compute_integer_from_float(op)
        && (is_integer_dtype(dtype) || dtype == "bool" || matches!(op, "Floor" | "Ceil" | "Round"))
}

/// Where `fd` breaks because a constant flushes to 0 in FP16 (an epsilon), every reader of that
/// constant: the cause names them (the Add that puts 1e-10 under a Log).
fn underflowed_readers(index: &GraphIndex, fd: &crate::FirstDivergent, fp16: bool) -> Vec<String> {
    let underflowed = Some(fd).filter(|fd| fp16 && fd.cause.best.kind == crate::CauseKind::Underflow);
    underflowed
        .and_then(|fd| fd.cause.best.weight.as_deref())
        .map(|w| index.consumers(w).iter().map(|&r| index.nodes[r].name.clone()).collect())
        .unwrap_or_default()
}

/// The nodes the first divergent layer's cause needs beside it: the storage path it shows
/// (`keep_with`) and the readers of a constant FP16 flushes to 0. A repro holds them, so that it
/// shows the cause it is written for.
pub fn cause_nodes(index: &GraphIndex, fd: &crate::FirstDivergent, fp16: bool) -> Vec<String> {
    let mut nodes = fd.keep_with.clone();
    for reader in underflowed_readers(index, fd, fp16) {
        if !nodes.contains(&reader) {
            nodes.push(reader);
        }
    }
    nodes
}

/// What a precision fix keeps at reference precision for the break at `node`, in bisect's
/// counterfactual and in `fix` alike: its recognised pattern; for an integer computed from a float,
/// also the node computing that float, so that the kept node reads it as float32 computes it (its
/// own precision cannot undo a rounding of its input); and, where the candidate stores FP16, every
/// reader of a value FP16 cannot hold (`close_over_fp16_range`); and where `verdict` names `node`
/// first divergent because a constant flushes to 0 in FP16 (an epsilon), every reader of that
/// constant, which is kept float32 only by keeping them. `comparison` gives the reference's types
/// and magnitudes.
pub fn keep_pattern(
    index: &GraphIndex,
    node: &str,
    comparison: &crate::Comparison,
    verdict: &crate::Verdict,
    fp16: bool,
) -> Pattern {
    let mut pattern = pattern_of(index, node);
    // A storage loss: the nodes whose storage the error needs too (the path to the node that
    // shows the loss, its pattern, a cancellation's other operands), kept together.
    if let Some(fd) = verdict.first_divergent.as_ref().filter(|fd| fd.node == node && !fd.keep_with.is_empty()) {
        let shown = fd.keep_with.iter().map(|n| pattern_of(index, n)).find(|p| p.kind != "node");
        let nodes: Vec<usize> =
            pattern.nodes.iter().chain(&fd.keep_with).filter_map(|n| Some(index.node(n)?.topo_index)).collect();
        pattern = make(index, shown.map_or("storage_path", |p| p.kind), nodes);
    }
    let first = verdict.first_divergent.as_ref().filter(|fd| fd.node == node);
    for reader in first.map(|fd| underflowed_readers(index, fd, fp16)).unwrap_or_default() {
        if !pattern.nodes.contains(&reader) {
            pattern.nodes.insert(0, reader);
            // Its name says more is kept than the node (a Log and the Add before it were "Log (node)").
            if pattern.kind == "node" {
                pattern.kind = "node+flushed_constant_readers";
            }
        }
    }
    if let Some(info) = index.node(node) {
        // Any output: TopK's indices are its second.
        let integer = info
            .outputs
            .iter()
            .filter_map(|o| comparison.get(o))
            .any(|r| computes_integer_from_float(&info.op_type, &r.ref_dtype));
        let producer = info.inputs.first().filter(|t| !index.is_constant_like(t)).and_then(|t| index.producer(t));
        if let Some(producer) = producer.filter(|_| integer) {
            if !pattern.nodes.contains(&producer.name) {
                pattern.nodes.insert(0, producer.name.clone());
                pattern.kind = "integer_from_float";
            }
        }
    }
    if fp16 {
        close_over_fp16_range(index, pattern, &|t| comparison.get(t).map(|r| r.metrics.ref_max_abs))
    } else {
        pattern
    }
}

/// The recognised pattern `node` belongs to, or the node alone.
pub fn pattern_of(index: &GraphIndex, node: &str) -> Pattern {
    let Some(info) = index.node(node) else { return Pattern { kind: "node", nodes: vec![node.to_string()] } };
    let target = info.topo_index;
    // Look for a pattern anchor near the node (a few hops either way).
    for candidate in neighbourhood(index, target, 8) {
        let found = match index.nodes[candidate].op_type.as_str() {
            "Sub" => DecomposedLayerNorm::at(index, candidate).map(|ln| ("decomposed_layernorm", ln.nodes())),
            "Exp" => decomposed_softmax(index, candidate).map(|n| ("decomposed_softmax", n)),
            _ => None,
        };
        if let Some((kind, nodes)) = found {
            if nodes.contains(&target) {
                return make(index, kind, nodes);
            }
        }
    }
    if let Some(nodes) = periodic_argument(index, target) {
        return make(index, "periodic_argument", nodes);
    }
    if let Some(nodes) = offset_and_back(index, target) {
        return make(index, "offset_and_back", nodes);
    }
    match info.op_type.as_str() {
        "Softmax" | "LogSoftmax" => return make(index, "softmax", vec![target]),
        "BatchNormalization" => {
            if let Some(conv) = single_input_producer(index, target, "Conv") {
                return make(index, "conv_batchnorm", vec![conv, target]);
            }
        }
        "Conv" => {
            if let Some(bn) = index.sole_consumer_of_type(target, "BatchNormalization") {
                return make(index, "conv_batchnorm", vec![target, bn]);
            }
        }
        _ => {}
    }
    make(index, "node", vec![target])
}

fn make(index: &GraphIndex, kind: &'static str, mut nodes: Vec<usize>) -> Pattern {
    nodes.sort_unstable();
    nodes.dedup();
    Pattern { kind, nodes: nodes.into_iter().map(|i| index.nodes[i].name.clone()).collect() }
}

/// Nodes within `hops` producer/consumer steps over non-weight tensors, nearest first.
fn neighbourhood(index: &GraphIndex, start: usize, hops: usize) -> Vec<usize> {
    let mut seen = HashSet::from([start]);
    let mut order = vec![start];
    let mut queue = VecDeque::from([(start, 0)]);
    while let Some((n, d)) = queue.pop_front() {
        if d == hops {
            continue;
        }
        let info = &index.nodes[n];
        let producers = info
            .inputs
            .iter()
            .filter(|t| !t.is_empty() && !index.is_constant_like(t))
            .filter_map(|t| index.producer_index(t));
        let consumers = info.outputs.iter().flat_map(|t| index.consumers(t).iter().copied());
        for next in producers.chain(consumers).collect::<Vec<_>>() {
            if seen.insert(next) {
                order.push(next);
                queue.push_back((next, d + 1));
            }
        }
    }
    order
}

fn single_input_producer(index: &GraphIndex, node: usize, op: &str) -> Option<usize> {
    let input = index.nodes[node].inputs.first()?;
    let p = index.producer_index(input)?;
    (index.nodes[p].op_type == op && index.node_consumers(p).len() == 1).then_some(p)
}

const PERIODIC: &[&str] = &["Sin", "Cos"];

/// The node computing the argument of Sin/Cos, with every Sin/Cos that reads it, from the producer
/// or from one of them: the argument must stay at reference precision up to the periodic function
/// (a large angle stored in FP16 between them loses what it keeps).
fn periodic_argument(index: &GraphIndex, node: usize) -> Option<Vec<usize>> {
    let producer = if PERIODIC.contains(&index.nodes[node].op_type.as_str()) {
        index.nodes[node].inputs.first().and_then(|t| index.producer_index(t))?
    } else {
        node
    };
    let periodic: Vec<usize> = index
        .node_consumers(producer)
        .into_iter()
        .filter(|&c| PERIODIC.contains(&index.nodes[c].op_type.as_str()))
        .collect();
    (!periodic.is_empty()).then(|| std::iter::once(producer).chain(periodic).collect())
}

/// `Add(x, c) -> Sub(., c)` with the same `c`, from either node: an offset added and taken off
/// again, which the sum's storage must not round in between (absorption, then cancellation).
fn offset_and_back(index: &GraphIndex, node: usize) -> Option<Vec<usize>> {
    let add = match index.nodes[node].op_type.as_str() {
        "Add" => node,
        "Sub" => index.nodes[node]
            .inputs
            .first()
            .and_then(|t| index.producer_index(t))
            .filter(|&p| index.nodes[p].op_type == "Add")?,
        _ => return None,
    };
    let offsets = &index.nodes[add].inputs;
    let sub = index.node_consumers(add).into_iter().find(|&c| {
        let n = &index.nodes[c];
        n.op_type == "Sub"
            && n.inputs.first() == index.nodes[add].outputs.first()
            && n.inputs.get(1).is_some_and(|o| offsets.contains(o))
    })?;
    (node == add || node == sub).then_some(vec![add, sub])
}

/// `[ReduceMax -> Sub ->] Exp -> ReduceSum -> Div(exp, sum)`, anchored at the Exp.
fn decomposed_softmax(index: &GraphIndex, exp: usize) -> Option<Vec<usize>> {
    let sum = index.consumer_of_type(exp, "ReduceSum")?;
    let div = index.consumer_of_type(sum, "Div")?;
    if !index.nodes[div].inputs.contains(&index.nodes[exp].outputs[0]) {
        return None;
    }
    let mut nodes = vec![exp, sum, div];
    if let Some(sub) = index.nodes[exp]
        .inputs
        .first()
        .and_then(|t| index.producer_index(t))
        .filter(|&p| index.nodes[p].op_type == "Sub")
    {
        nodes.push(sub);
        if let Some(max) = index.nodes[sub]
            .inputs
            .get(1)
            .and_then(|t| index.producer_index(t))
            .filter(|&p| index.nodes[p].op_type == "ReduceMax")
        {
            nodes.push(max);
        }
    }
    Some(nodes)
}

/// Ops that read a float tensor of any type as it is: a converted model casts nothing in front
/// of them, so they need not join an island to read an FP32 value.
const TYPE_AGNOSTIC_READERS: &[&str] = &["Shape", "Size", "Cast"];

/// `pattern` grown so that every value FP16 cannot hold stays inside the island: while a kept
/// node's float output reaches beyond FP16's range in the reference (`ref_max_abs`, by tensor),
/// its readers join (a converted model would cast that value to FP16 on the way out, where it
/// becomes inf). The pattern's kind gains `+range` when it grew.
pub fn close_over_fp16_range(
    index: &GraphIndex,
    pattern: Pattern,
    ref_max_abs: &dyn Fn(&str) -> Option<f64>,
) -> Pattern {
    let limit = layerwise_model::fp16::FP16_MAX as f64;
    let mut members: HashSet<usize> =
        pattern.nodes.iter().filter_map(|n| index.node(n)).map(|n| n.topo_index).collect();
    let mut queue: VecDeque<usize> = members.iter().copied().collect();
    let before = members.len();
    while let Some(i) = queue.pop_front() {
        for out in &index.nodes[i].outputs {
            if !ref_max_abs(out).is_some_and(|m| m > limit) {
                continue;
            }
            for &c in index.consumers(out) {
                if !TYPE_AGNOSTIC_READERS.contains(&index.nodes[c].op_type.as_str()) && members.insert(c) {
                    queue.push_back(c);
                }
            }
        }
    }
    if members.len() == before {
        return pattern;
    }
    let mut nodes: Vec<usize> = members.into_iter().collect();
    nodes.sort_unstable();
    Pattern {
        kind: if pattern.kind == "node" { "node+range" } else { pattern.kind },
        nodes: nodes.into_iter().map(|i| index.nodes[i].name.clone()).collect(),
    }
}
