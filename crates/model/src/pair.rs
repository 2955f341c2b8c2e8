//! One graph that computes two programs of the same model side by side (the reference and a
//! candidate rewrite of it) and feeds each pair of same-named tensors to a reduction node.
//!
//! Why: comparing every tensor after two separate runs means holding every exposed tensor of both
//! runs at once. In one graph, a runtime computes each pair, reduces it to its statistics and frees
//! both tensors once nothing else reads them, so memory no longer grows with the number of tensors
//! compared. The reduction itself is the runtime's business (a custom operator).

use std::collections::{HashMap, HashSet};

use crate::onnx::{attribute_proto::AttributeType, AttributeProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto};
use crate::ModelError;

/// The operator domain and type of the reduction nodes.
pub const PAIR_DOMAIN: &str = "ai.layerwise";
pub const PAIR_OP: &str = "ReducePair";
/// The string attribute naming the tensor a reduction node compares.
pub const PAIR_TENSOR_ATTR: &str = "tensor";
/// Prefix of every candidate name (nodes, computed tensors, initializers) in the paired graph.
pub const CANDIDATE_PREFIX: &str = "lw_cand/";

/// The paired graph, and the tensors it compares.
#[derive(Debug)]
pub struct PairedGraph {
    pub proto: ModelProto,
    /// Tensors with a reduction node, in the order asked.
    pub paired: Vec<String>,
    /// Tensors asked for that one program does not compute, with the side that lacks them.
    pub missing: Vec<(String, Side)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Reference,
    Candidate,
}

/// Pairs `reference` and `candidate` (two programs of one model: same graph inputs, the compared
/// tensors under the same names) into one graph whose only outputs are the reduction nodes of
/// `tensors`. Candidate names get [`CANDIDATE_PREFIX`]; graph inputs are shared.
///
/// Refused: graphs with subgraphs (If, Loop, Scan: their bodies read outer names that would need
/// the same renaming), candidate inputs the reference lacks, disagreeing opset versions.
pub fn paired_graph(reference: &ModelProto, candidate: &ModelProto, tensors: &[String]) -> Result<PairedGraph, ModelError> {
    let rg = reference.graph.as_ref().ok_or_else(|| ModelError::InvalidGraph("the reference program has no graph".into()))?;
    let cg = candidate.graph.as_ref().ok_or_else(|| ModelError::InvalidGraph("the candidate program has no graph".into()))?;
    for (side, g) in [("reference", rg), ("candidate", cg)] {
        if let Some(n) = g.node.iter().find(|n| n.attribute.iter().any(|a| a.g.is_some() || !a.graphs.is_empty())) {
            return Err(ModelError::InvalidGraph(format!("the {side} program has a subgraph (node '{}', {}): control flow is not paired", n.name(), n.op_type())));
        }
    }
    let ref_inputs: HashSet<&str> = rg.input.iter().map(|v| v.name()).collect();
    let cand_inits: HashSet<&str> = cg.initializer.iter().map(|t| t.name()).chain(cg.sparse_initializer.iter().filter_map(|s| s.values.as_ref().map(|v| v.name()))).collect();
    let shared: HashSet<String> = cg.input.iter().map(|v| v.name()).filter(|n| !cand_inits.contains(n)).map(str::to_string).collect();
    if let Some(i) = shared.iter().find(|i| !ref_inputs.contains(i.as_str())) {
        return Err(ModelError::InvalidGraph(format!("the candidate program reads input '{i}', which the reference does not have")));
    }
    let taken = rg.node.iter().flat_map(|n| n.output.iter()).chain(rg.initializer.iter().map(|t| t.name.as_ref().expect("named")));
    if let Some(n) = taken.into_iter().find(|n| n.starts_with(CANDIDATE_PREFIX)) {
        return Err(ModelError::InvalidGraph(format!("the reference already has a tensor named '{n}', in the candidate's namespace")));
    }
    let rename = |n: &str| if n.is_empty() || shared.contains(n) { n.to_string() } else { format!("{CANDIDATE_PREFIX}{n}") };

    let mut out = reference.clone();
    out.opset_import = merged_opsets(reference, candidate)?;
    out.ir_version = reference.ir_version.max(candidate.ir_version);
    let graph = out.graph.as_mut().expect("checked above");
    for t in &cg.initializer {
        let mut t = t.clone();
        t.name = Some(rename(t.name()));
        graph.initializer.push(t);
    }
    for s in &cg.sparse_initializer {
        let mut s = s.clone();
        if let Some(v) = s.values.as_mut() {
            v.name = Some(rename(v.name()));
        }
        graph.sparse_initializer.push(s);
    }
    for v in &cg.value_info {
        let mut v = v.clone();
        v.name = Some(rename(v.name()));
        graph.value_info.push(v);
    }
    for n in &cg.node {
        let mut n = n.clone();
        n.name = Some(format!("{CANDIDATE_PREFIX}{}", n.name()));
        n.input = n.input.iter().map(|i| rename(i)).collect();
        n.output = n.output.iter().map(|o| rename(o)).collect();
        graph.node.push(n);
    }

    // A tensor is there when a node computes it, or as a constant the program's optimizer folded.
    let present = |g: &crate::onnx::GraphProto| -> HashSet<String> {
        g.node.iter().flat_map(|n| n.output.iter().filter(|o| !o.is_empty()).cloned()).chain(g.initializer.iter().map(|t| t.name().to_string())).collect()
    };
    let (in_ref, in_cand) = (present(rg), present(cg));
    let mut paired = Vec::new();
    let mut missing = Vec::new();
    let mut outputs = Vec::new();
    let mut asked: HashSet<&str> = HashSet::new();
    for t in tensors {
        // A tensor asked twice is reduced once.
        if !asked.insert(t.as_str()) {
            continue;
        }
        if !in_ref.contains(t) {
            missing.push((t.clone(), Side::Reference));
            continue;
        }
        if !in_cand.contains(t) {
            missing.push((t.clone(), Side::Candidate));
            continue;
        }
        let reduced = format!("lw_pair/{t}");
        graph.node.push(NodeProto {
            op_type: Some(PAIR_OP.into()),
            domain: Some(PAIR_DOMAIN.into()),
            name: Some(reduced.clone()),
            input: vec![t.clone(), rename(t)],
            output: vec![reduced.clone()],
            attribute: vec![AttributeProto {
                name: Some(PAIR_TENSOR_ATTR.into()),
                r#type: Some(AttributeType::String as i32),
                s: Some(t.as_bytes().to_vec().into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        outputs.push(ValueInfoProto { name: Some(reduced), ..Default::default() });
        paired.push(t.clone());
    }
    // ONNX Runtime's default execution order is a depth-first walk from the graph's leaves (here
    // the reduction nodes), last leaf first. With the reductions last-tensor-first, the walk
    // computes both sides up to the first tensor, reduces it, moves on to the next, and so on:
    // each pair is freed soon after it exists instead of every tensor living until the end.
    let first_pair = graph.node.len() - paired.len();
    graph.node[first_pair..].reverse();
    graph.output = outputs;
    Ok(PairedGraph { proto: out, paired, missing })
}

/// Both programs' opset imports plus the reduction's domain; one domain at two versions is refused
/// (the same node would mean two things).
fn merged_opsets(reference: &ModelProto, candidate: &ModelProto) -> Result<Vec<OperatorSetIdProto>, ModelError> {
    let mut versions: HashMap<String, i64> = HashMap::new();
    let mut order = Vec::new();
    for o in reference.opset_import.iter().chain(&candidate.opset_import) {
        let domain = o.domain().to_string();
        let domain = if domain == "ai.onnx" { String::new() } else { domain };
        match versions.get(&domain) {
            Some(&v) if v != o.version() => {
                return Err(ModelError::InvalidGraph(format!("the programs import opset '{domain}' at versions {v} and {}", o.version())));
            }
            Some(_) => {}
            None => {
                versions.insert(domain.clone(), o.version());
                order.push(domain);
            }
        }
    }
    order.push(PAIR_DOMAIN.to_string());
    versions.insert(PAIR_DOMAIN.to_string(), 1);
    Ok(order.into_iter().map(|d| OperatorSetIdProto { version: Some(versions[&d]), domain: Some(d) }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::ModelBuilder;
    use crate::DataType;

    fn program(scale: f32) -> ModelProto {
        let mut b = ModelBuilder::new("program", 13);
        b.input("x", DataType::Float, &[2i64.into()]);
        b.initializer(crate::builder::f32_tensor("w", &[2], &[scale, scale]));
        b.node("Mul", "mul", &["x", "w"], &["y"], vec![]);
        b.node("Relu", "relu", &["y"], &["z"], vec![]);
        b.output("z", DataType::Float);
        b.build()
    }

    #[test]
    fn candidate_names_move_aside_and_inputs_are_shared() {
        let reference = program(1.0);
        let mut candidate = program(2.0);
        // The candidate lacks `y` under that name (a rewrite renamed it).
        let g = candidate.graph.as_mut().unwrap();
        g.node[0].output[0] = "y2".into();
        g.node[1].input[0] = "y2".into();
        let p = paired_graph(&reference, &candidate, &["y".into(), "z".into()]).unwrap();
        assert_eq!(p.paired, vec!["z".to_string()]);
        assert_eq!(p.missing, vec![("y".to_string(), Side::Candidate)]);
        let g = p.proto.graph.unwrap();
        assert_eq!(g.initializer.iter().map(|t| t.name()).collect::<Vec<_>>(), vec!["w", "lw_cand/w"]);
        let cand_mul = g.node.iter().find(|n| n.name().starts_with(CANDIDATE_PREFIX) && n.op_type() == "Mul").unwrap();
        assert_eq!(cand_mul.input, vec!["x".to_string(), "lw_cand/w".to_string()]);
        let pair = g.node.iter().find(|n| n.op_type() == PAIR_OP).unwrap();
        assert_eq!((pair.op_type(), pair.domain()), (PAIR_OP, PAIR_DOMAIN));
        assert_eq!(pair.input, vec!["z".to_string(), "lw_cand/z".to_string()]);
        assert_eq!(g.output.iter().map(|o| o.name()).collect::<Vec<_>>(), vec!["lw_pair/z"]);
        assert!(p.proto.opset_import.iter().any(|o| o.domain() == PAIR_DOMAIN));
    }

    #[test]
    fn disagreeing_opsets_and_subgraphs_are_refused() {
        let reference = program(1.0);
        let mut candidate = program(1.0);
        candidate.opset_import[0].version = Some(17);
        let e = paired_graph(&reference, &candidate, &["z".into()]).unwrap_err().to_string();
        assert!(e.contains("versions 13 and 17"), "{e}");
        let mut candidate = program(1.0);
        candidate.graph.as_mut().unwrap().node[1].attribute.push(AttributeProto { name: Some("then_branch".into()), g: Some(Default::default()), ..Default::default() });
        let e = paired_graph(&reference, &candidate, &["z".into()]).unwrap_err().to_string();
        assert!(e.contains("subgraph"), "{e}");
    }
}

/// One side of a pair, as the reducer sees it.
pub struct Operand<'a> {
    pub shape: Vec<usize>,
    /// The element type, or why the value is not a tensor of numbers (then `values` is empty).
    pub dtype: Result<crate::DType, String>,
    /// The values widened to float32 (borrowed from ONNX Runtime when they are float32 already).
    pub values: std::borrow::Cow<'a, [f32]>,
}

/// Receives every pair of tensors of a paired run, inside ONNX Runtime's executor (one at a time,
/// in the order the session computes them). Keeps what it needs; the tensors are freed after.
pub trait PairReducer: Send + Sync {
    fn reduce(&self, tensor: &str, reference: Operand<'_>, candidate: Operand<'_>);
}
