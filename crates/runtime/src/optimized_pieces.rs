//! ONNX Runtime's optimized program of a large graph, built in pieces.
//!
//! Saving the optimized model of a graph whose every tensor is an output takes time that grows
//! with the square of the graph (a Relu chain: 45 us a node at 10,000 nodes, 141 us at 50,000).
//! Here the graph is cut into runs of consecutive nodes, each optimized on its own at the same
//! level, and the optimized runs are joined into one program. A piece sees what the whole graph
//! shows the optimizer around its nodes:
//! - it is cut only where every computed tensor crossing the border is already a graph output
//!   (no fusion may then remove it, whole or cut) of type float32 with every dimension known
//!   (fed as a graph input of that type, the piece infers what the whole infers). A shape value
//!   crossing would lose the value that inference and folding read; an FP16 one, the float32
//!   value that the CPU provider keeps between two nodes it computes in float32 through Casts
//!   it inserts (the graph's FP16 output is then a rounded copy the next node does not read);
//! - constant tensors (computed from weights only) are never fed at a border: a piece that reads
//!   one gets a copy of the nodes computing it, so folding and fusions with constants see what
//!   they see in the whole graph. The copies' outputs, and every name ONNX Runtime makes up in a
//!   piece (folded or reordered weights, layout reorders, fused nodes), are renamed per piece;
//!   what the piece computes for the whole graph keeps its name.
//!
//! Where no such cut exists, or anything else here does not hold (subgraphs, external weights,
//! a piece that fails), the caller optimizes the whole graph at once, as before.

use std::collections::{HashMap, HashSet};

use layerwise_model::builder::{tensor_type, Dim};
use layerwise_model::onnx::{GraphProto, ModelProto, TensorProto, ValueInfoProto};

use crate::InferredType;
use crate::{DType, RuntimeError, Tensor};

/// Nodes per piece of an optimized program: a piece of this size builds and saves in about the
/// time per node of a small graph.
pub(crate) const OPTIMIZE_PIECE_NODES: usize = 1000;

/// The piece size: [`OPTIMIZE_PIECE_NODES`], or `LAYERWISE_OPTIMIZE_PIECE_NODES` where set (for
/// the bit-for-bit checks of the cut and benchmarks; 0 optimizes every graph whole). Graphs of at
/// most twice the size are optimized whole.
pub(crate) fn piece_nodes() -> usize {
    match std::env::var("LAYERWISE_OPTIMIZE_PIECE_NODES").ok().and_then(|v| v.trim().parse::<usize>().ok()) {
        Some(0) => usize::MAX,
        Some(n) => n,
        None => OPTIMIZE_PIECE_NODES,
    }
}

/// What a piece's renamed names start with: `__lw_piece{k}/`.
const PIECE_PREFIX: &str = "__lw_piece";

/// Operators whose output differs from one run to the next: a copy would not compute the value
/// the original computes, so they are never constant.
const RANDOM_OPS: [&str; 6] =
    ["RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"];

/// Whether a graph of `nodes` nodes is worth cutting at `piece_nodes` nodes a piece.
pub(crate) fn worth_cutting(nodes: usize, piece_nodes: usize) -> bool {
    piece_nodes != usize::MAX && nodes > 2 * piece_nodes
}

/// `proto` (every tensor it returns a graph output, input shapes pinned) optimized in pieces of
/// about `piece_nodes` nodes by `optimize` (which optimizes a whole model and returns what ONNX
/// Runtime saves), joined into one program whose graph inputs and outputs are `proto`'s. `types`
/// are the computed tensors' types as ONNX Runtime infers them for the whole graph. Returns the
/// program and the number of pieces, or why the graph is not cut (the caller then optimizes it
/// whole).
pub(crate) fn optimized_in_pieces(
    proto: &ModelProto,
    piece_nodes: usize,
    types: &HashMap<String, InferredType>,
    optimize: &mut dyn FnMut(&ModelProto) -> Result<ModelProto, RuntimeError>,
) -> Result<(ModelProto, usize), String> {
    let graph = proto.graph.as_ref().ok_or("no graph")?;
    let n = graph.node.len();
    if !worth_cutting(n, piece_nodes) {
        return Err("small enough for one session".into());
    }
    if graph.node.iter().any(|node| node.attribute.iter().any(|a| a.g.is_some() || !a.graphs.is_empty())) {
        return Err("a node carries a subgraph".into());
    }
    if graph.initializer.iter().any(layerwise_model::is_external) || !graph.sparse_initializer.is_empty() {
        return Err("external or sparse weights".into());
    }
    let graph_inputs: HashSet<&str> = graph.input.iter().map(|v| v.name()).collect();
    let graph_outputs: HashMap<&str, &ValueInfoProto> = graph.output.iter().map(|v| (v.name(), v)).collect();
    let weights: HashMap<&str, &TensorProto> = graph.initializer.iter().map(|w| (w.name(), w)).collect();
    // An initializer that is also a graph input may be fed another value: not a constant.
    let mut constant: HashSet<&str> = weights.keys().copied().filter(|w| !graph_inputs.contains(w)).collect();
    let mut producer: HashMap<&str, usize> = HashMap::new();
    let mut constant_node = vec![false; n];
    for (i, node) in graph.node.iter().enumerate() {
        let read = || node.input.iter().map(String::as_str).filter(|t| !t.is_empty());
        if let Some(t) =
            read().find(|t| !graph_inputs.contains(t) && !weights.contains_key(t) && !producer.contains_key(t))
        {
            return Err(format!("'{t}' is read before it is computed"));
        }
        constant_node[i] = !RANDOM_OPS.contains(&node.op_type()) && read().all(|t| constant.contains(t));
        for t in node.output.iter().map(String::as_str).filter(|t| !t.is_empty()) {
            if producer.insert(t, i).is_some() {
                return Err(format!("two nodes compute '{t}'"));
            }
            if constant_node[i] {
                constant.insert(t);
            }
        }
    }
    if let Some(o) = graph.output.iter().find(|o| !producer.contains_key(o.name())) {
        return Err(format!("output '{}' is computed by no node", o.name()));
    }

    // A cut before node c is crossed by every computed, non-constant tensor made before c and
    // read at or after c; it may be cut there only if each of those can be fed at a border.
    let fed_at_border = |t: &str| {
        graph_outputs.contains_key(t)
            && types.get(t).is_some_and(|ty| ty.dtype == Some(DType::F32) && ty.dims.iter().all(Option::is_some))
    };
    let mut last_read: HashMap<&str, usize> = HashMap::new();
    for (i, node) in graph.node.iter().enumerate() {
        for t in node.input.iter().map(String::as_str).filter(|t| producer.contains_key(t) && !constant.contains(t)) {
            last_read.insert(t, i);
        }
    }
    let mut blocked = vec![0i64; n + 2];
    for (t, &last) in &last_read {
        if !fed_at_border(t) {
            blocked[producer[t] + 1] += 1;
            blocked[last + 1] -= 1;
        }
    }
    let mut starts = vec![0];
    let mut crossing_blocked = 0;
    for (c, b) in blocked.iter().enumerate().take(n) {
        crossing_blocked += b;
        if c > 0 && crossing_blocked == 0 && c - starts.last().unwrap() >= piece_nodes {
            starts.push(c);
        }
    }
    if starts.len() == 1 {
        return Err("no border that only float32 graph outputs of known shape cross".into());
    }
    starts.push(n);

    let shell = ModelProto { graph: None, ..proto.clone() };
    let mut joined = GraphProto {
        name: graph.name.clone(),
        input: graph.input.clone(),
        doc_string: graph.doc_string.clone(),
        ..Default::default()
    };
    let mut joined_shell: Option<ModelProto> = None;
    let mut outputs: HashMap<String, ValueInfoProto> = HashMap::new();
    let mut weights_kept: HashSet<String> = HashSet::new();
    let mut value_info_kept: HashSet<String> = HashSet::new();
    for (k, range) in starts.windows(2).enumerate() {
        let (start, end) = (range[0], range[1]);
        // The constant nodes outside the piece that what it reads is computed from.
        let mut copied = HashSet::new();
        let mut stack: Vec<usize> = Vec::new();
        let reads_constant = |i: usize, stack: &mut Vec<usize>| {
            for t in graph.node[i].input.iter().map(String::as_str) {
                if let Some(&p) = producer.get(t).filter(|&&p| p < start && constant_node[p]) {
                    stack.push(p);
                }
            }
        };
        for i in start..end {
            reads_constant(i, &mut stack);
        }
        while let Some(p) = stack.pop() {
            if copied.insert(p) {
                reads_constant(p, &mut stack);
            }
        }
        let mut members: Vec<usize> = copied.into_iter().collect();
        members.sort_unstable();
        members.extend(start..end);
        let made: HashSet<&str> =
            members.iter().flat_map(|&i| graph.node[i].output.iter().map(String::as_str)).collect();
        let mut read: Vec<&str> = Vec::new();
        let mut seen = HashSet::new();
        for t in members.iter().flat_map(|&i| graph.node[i].input.iter().map(String::as_str)) {
            if !t.is_empty() && !made.contains(t) && seen.insert(t) {
                read.push(t);
            }
        }
        let mut input: Vec<ValueInfoProto> = graph.input.iter().filter(|v| seen.contains(v.name())).cloned().collect();
        let mut border: HashSet<&str> = HashSet::new();
        for &t in read.iter().filter(|t| producer.contains_key(*t)) {
            let ty = types.get(t).ok_or_else(|| format!("'{t}' crosses a border untyped"))?;
            let elem = ty
                .dtype
                .and_then(|d| layerwise_model::DataType::try_from(d.onnx()).ok())
                .ok_or_else(|| format!("'{t}' has no ONNX type"))?;
            let dims: Vec<Dim> = ty
                .dims
                .iter()
                .map(|d| d.map(|d| Dim::Fixed(d as i64)))
                .collect::<Option<_>>()
                .ok_or_else(|| format!("'{t}' crosses a border with an unknown dimension"))?;
            input.push(ValueInfoProto {
                name: Some(t.to_string()),
                r#type: Some(tensor_type(elem, Some(&dims))),
                ..Default::default()
            });
            border.insert(t);
        }
        let piece_outputs: Vec<ValueInfoProto> = members
            .iter()
            .flat_map(|&i| graph.node[i].output.iter())
            .filter_map(|t| graph_outputs.get(t.as_str()).map(|v| (*v).clone()))
            .collect();
        if piece_outputs.is_empty() {
            return Err(format!("piece {k} computes no graph output"));
        }
        let piece = GraphProto {
            name: graph.name.clone(),
            input,
            initializer: read.iter().filter_map(|t| weights.get(t).map(|w| (*w).clone())).collect(),
            output: piece_outputs,
            value_info: graph.value_info.iter().filter(|v| made.contains(v.name())).cloned().collect(),
            node: members.iter().map(|&i| graph.node[i].clone()).collect(),
            ..Default::default()
        };
        let optimized =
            optimize(&ModelProto { graph: Some(piece), ..shell.clone() }).map_err(|e| format!("piece {k}: {e}"))?;

        // Names that are the whole graph's keep them; every other name is this piece's own.
        let owned: HashSet<&str> =
            graph.node[start..end].iter().flat_map(|node| node.output.iter().map(String::as_str)).collect();
        let owned_nodes: HashSet<&str> = graph.node[start..end].iter().map(|node| node.name()).collect();
        let (opt_shell, opt_graph) = {
            let mut o = optimized;
            let g = o.graph.take().ok_or_else(|| format!("piece {k}: ONNX Runtime saved no graph"))?;
            (o, g)
        };
        let mut unchanged_weights: HashSet<String> = HashSet::new();
        for w in &opt_graph.initializer {
            if weights.get(w.name()).is_some_and(|original| same_tensor(original, w)) {
                unchanged_weights.insert(w.name().to_string());
            }
        }
        let keeps = |t: &str| {
            t.is_empty()
                || graph_inputs.contains(t)
                || border.contains(t)
                || owned.contains(t)
                || unchanged_weights.contains(t)
        };
        let rename = |t: &str| if keeps(t) { t.to_string() } else { format!("{PIECE_PREFIX}{k}/{t}") };
        for mut w in opt_graph.initializer {
            let name = rename(w.name());
            if unchanged_weights.contains(w.name()) && !weights_kept.insert(name.clone()) {
                continue;
            }
            w.name = Some(name);
            joined.initializer.push(w);
        }
        let mut names_here = HashSet::new();
        for mut node in opt_graph.node {
            if node.attribute.iter().any(|a| a.g.is_some() || !a.graphs.is_empty()) {
                return Err(format!("piece {k}: ONNX Runtime's program holds a subgraph"));
            }
            for t in node.input.iter_mut().chain(node.output.iter_mut()) {
                *t = rename(t);
            }
            let keeps_name = node.name().is_empty()
                || (owned_nodes.contains(node.name()) && names_here.insert(node.name().to_string()));
            if !keeps_name {
                node.name = Some(format!("{PIECE_PREFIX}{k}/{}", node.name()));
            }
            joined.node.push(node);
        }
        for v in opt_graph.output {
            if owned.contains(v.name()) {
                outputs.insert(v.name().to_string(), v);
            }
        }
        for mut v in opt_graph.value_info {
            let name = rename(v.name());
            if !graph_outputs.contains_key(name.as_str())
                && !graph_inputs.contains(name.as_str())
                && value_info_kept.insert(name.clone())
            {
                v.name = Some(name);
                joined.value_info.push(v);
            }
        }
        match &mut joined_shell {
            None => joined_shell = Some(opt_shell),
            Some(s) => {
                for set in opt_shell.opset_import {
                    match s.opset_import.iter().find(|o| o.domain() == set.domain()) {
                        Some(o) if o.version != set.version => {
                            return Err(format!(
                                "pieces import opset '{}' in versions {:?} and {:?}",
                                set.domain(),
                                o.version,
                                set.version
                            ))
                        }
                        Some(_) => {}
                        None => s.opset_import.push(set),
                    }
                }
            }
        }
    }
    for o in &graph.output {
        joined
            .output
            .push(outputs.remove(o.name()).ok_or_else(|| format!("no piece's program returns '{}'", o.name()))?);
    }
    let mut program = joined_shell.expect("at least two pieces");
    program.graph = Some(joined);
    Ok((program, starts.len() - 1))
}

/// Whether two weights hold the same type, dimensions and values, bit for bit, however they are
/// stored (ONNX Runtime saves as raw bytes what a model may hold as typed values).
fn same_tensor(a: &TensorProto, b: &TensorProto) -> bool {
    if a == b {
        return true;
    }
    if a.data_type != b.data_type || a.dims != b.dims {
        return false;
    }
    match (Tensor::from_proto(a), Tensor::from_proto(b)) {
        (Ok(x), Ok(y)) => x.to_le_bytes() == y.to_le_bytes(),
        _ => false,
    }
}
