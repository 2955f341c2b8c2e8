//! One graph that computes two programs of the same model side by side (the reference and a
//! candidate rewrite of it) and feeds each pair of same-named tensors to a reduction node.
//!
//! Why: comparing every tensor after two separate runs means holding every exposed tensor of both
//! runs at once. In one graph, a runtime computes each pair, reduces it to its statistics and frees
//! both tensors once nothing else reads them, so memory no longer grows with the number of tensors
//! compared. The reduction itself is the runtime's business (a custom operator).

use std::collections::{HashMap, HashSet};

use crate::onnx::{
    attribute_proto::AttributeType, AttributeProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto,
};
use crate::ModelError;

/// The operator domain and type of the reduction nodes.
pub const PAIR_DOMAIN: &str = "ai.layerwise";
pub const PAIR_OP: &str = "ReducePair";
/// The string attribute naming the tensor a reduction node compares.
pub const PAIR_TENSOR_ATTR: &str = "tensor";
/// Prefix of every candidate name (nodes, computed tensors, initializers) in the paired graph.
pub const CANDIDATE_PREFIX: &str = "lw_cand/";
/// How ONNX Runtime names the tensors of a function op it inlines, and where the paired graph
/// moves the reference's.
const INLINED_PREFIX: &str = "_inlfunc_";
const REFERENCE_INLINED_PREFIX: &str = "lw_ref/";

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

/// Pairs `reference` and `candidate` (two programs of one model: the graph inputs the candidate
/// reads are the reference's) into one graph whose only outputs are the reduction nodes of
/// `tensors`. Each tensor is the reference's name; the candidate's twin is `candidate_names[t]`,
/// or `t` itself where absent. Every candidate name, in subgraphs too, gets [`CANDIDATE_PREFIX`],
/// except the shared graph inputs; a candidate input of another element type (a converted model's
/// FP16 input) reads the shared one through a Cast, as a runtime converts what it is fed.
///
/// Refused: candidate inputs the reference lacks, disagreeing opset versions.
pub fn paired_graph(
    reference: &ModelProto,
    candidate: &ModelProto,
    tensors: &[String],
    candidate_names: &HashMap<String, String>,
) -> Result<PairedGraph, ModelError> {
    paired_graph_of(reference.clone(), candidate.clone(), tensors, candidate_names)
}

/// [`paired_graph`], taking the two programs by value: their nodes and weights move into the
/// paired graph instead of being copied (a large model's programs held twice were most of the
/// paired step's peak memory).
pub fn paired_graph_of(
    reference: ModelProto,
    mut candidate: ModelProto,
    tensors: &[String],
    candidate_names: &HashMap<String, String>,
) -> Result<PairedGraph, ModelError> {
    let rg = reference
        .graph
        .as_ref()
        .ok_or_else(|| ModelError::InvalidGraph("the reference program has no graph".into()))?;
    let cg = candidate
        .graph
        .as_ref()
        .ok_or_else(|| ModelError::InvalidGraph("the candidate program has no graph".into()))?;
    let ref_inputs: HashMap<&str, &ValueInfoProto> = rg.input.iter().map(|v| (v.name(), v)).collect();
    let cand_inits: HashSet<&str> = cg
        .initializer
        .iter()
        .map(|t| t.name())
        .chain(cg.sparse_initializer.iter().filter_map(|s| s.values.as_ref().map(|v| v.name())))
        .collect();
    let mut shared: HashSet<String> = HashSet::new();
    let mut converted_inputs = Vec::new();
    for v in cg.input.iter().filter(|v| !cand_inits.contains(v.name())) {
        let Some(theirs) = ref_inputs.get(v.name()) else {
            return Err(ModelError::InvalidGraph(format!(
                "the candidate program reads input '{}', which the reference does not have",
                v.name()
            )));
        };
        match (elem_type(v), elem_type(theirs)) {
            (Some(c), Some(r)) if c != r => converted_inputs.push((v.name().to_string(), c)),
            _ => {
                shared.insert(v.name().to_string());
            }
        }
    }
    let taken = rg
        .node
        .iter()
        .flat_map(|n| n.output.iter())
        .chain(rg.initializer.iter().map(|t| t.name.as_ref().expect("named")));
    if let Some(n) = taken.into_iter().find(|n| n.starts_with(CANDIDATE_PREFIX)) {
        return Err(ModelError::InvalidGraph(format!(
            "the reference already has a tensor named '{n}', in the candidate's namespace"
        )));
    }
    let rename =
        |n: &str| if n.is_empty() || shared.contains(n) { n.to_string() } else { format!("{CANDIDATE_PREFIX}{n}") };
    // A tensor is there when a node computes it, or as a constant the program's optimizer folded.
    let present = |g: &crate::onnx::GraphProto| -> HashSet<String> {
        g.node
            .iter()
            .flat_map(|n| n.output.iter().filter(|o| !o.is_empty()).cloned())
            .chain(g.initializer.iter().map(|t| t.name().to_string()))
            .collect()
    };
    let (in_ref, in_cand) = (present(rg), present(cg));
    let opset_import = merged_opsets(&reference, &candidate)?;
    let ir_version = reference.ir_version.max(candidate.ir_version);

    let mut out = reference;
    out.opset_import = opset_import;
    out.ir_version = ir_version;
    let graph = out.graph.as_mut().expect("checked above");
    // An optimized program holds the tensors ONNX Runtime named when it inlined a function op
    // (HardSwish-14: `_inlfunc_HardSwish_HS_X`); the session inlines the candidate's calls under
    // the same names, so the reference's move aside.
    let inlined =
        |n: &str| if n.starts_with(INLINED_PREFIX) { format!("{REFERENCE_INLINED_PREFIX}{n}") } else { n.to_string() };
    for n in graph.node.iter_mut() {
        n.input = n.input.iter().map(|i| inlined(i)).collect();
        n.output = n.output.iter().map(|o| inlined(o)).collect();
    }
    for v in graph.value_info.iter_mut() {
        v.name = Some(inlined(v.name()));
    }
    for t in graph.initializer.iter_mut() {
        t.name = Some(inlined(t.name()));
    }
    for (input, to) in &converted_inputs {
        graph.node.push(NodeProto {
            op_type: Some("Cast".into()),
            name: Some(format!("{CANDIDATE_PREFIX}input/{input}")),
            input: vec![input.clone()],
            output: vec![rename(input)],
            attribute: vec![AttributeProto {
                name: Some("to".into()),
                r#type: Some(AttributeType::Int as i32),
                i: Some(*to as i64),
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    let mut moved = candidate.graph.take().expect("checked above");
    moved.input.clear();
    moved.output.clear();
    rename_graph(&mut moved, &rename);
    graph.initializer.extend(moved.initializer);
    graph.sparse_initializer.extend(moved.sparse_initializer);
    graph.value_info.extend(moved.value_info);
    graph.node.extend(moved.node);

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
        let twin = candidate_names.get(t).unwrap_or(t);
        if !in_cand.contains(twin) {
            missing.push((t.clone(), Side::Candidate));
            continue;
        }
        let reduced = format!("lw_pair/{t}");
        graph.node.push(NodeProto {
            op_type: Some(PAIR_OP.into()),
            domain: Some(PAIR_DOMAIN.into()),
            name: Some(reduced.clone()),
            input: vec![t.clone(), rename(twin)],
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
    // One graph output is enough to run every reduction (ONNX Runtime runs nodes whose outputs
    // nothing reads); each more output costs ONNX Runtime's session build time in proportion to
    // the graph's size (10,000 outputs: 16.3 s against 12.6 s for a chain of 10,000 Relu nodes).
    outputs.truncate(1);
    graph.output = outputs;
    Ok(PairedGraph { proto: out, paired, missing })
}

/// Sets the dimensions of `graph`'s inputs to `shapes` (name, dimensions) where the rank agrees.
/// A session built for known shapes plans its memory quickly: with symbolic or unknown dimensions
/// ONNX Runtime's reuse planner can match few buffers, and its search grew to most of a paired
/// session's build (PP-OCRv4 rec's candidate program: 0.43 s against 0.07 s, measured).
/// A graph with control flow is left as it is: ONNX Runtime then infers the shapes of branches
/// the inputs never take, which need not type-check for them (Silero VAD's 8 kHz branch).
pub fn pin_input_shapes(graph: &mut crate::onnx::GraphProto, shapes: &[(String, Vec<usize>)]) {
    use crate::onnx::{tensor_shape_proto::dimension::Value as Dim, type_proto::Value};
    if graph.node.iter().any(|n| n.attribute.iter().any(|a| a.g.is_some() || !a.graphs.is_empty())) {
        return;
    }
    for v in graph.input.iter_mut() {
        let Some((_, dims)) = shapes.iter().find(|(n, _)| n == v.name()) else { continue };
        let Some(Value::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) else { continue };
        let Some(shape) = t.shape.as_mut().filter(|s| s.dim.len() == dims.len()) else { continue };
        for (d, &n) in shape.dim.iter_mut().zip(dims) {
            d.value = Some(Dim::DimValue(n as i64));
        }
    }
}

/// The element type a graph input declares.
fn elem_type(v: &ValueInfoProto) -> Option<i32> {
    match v.r#type.as_ref()?.value.as_ref()? {
        crate::onnx::type_proto::Value::TensorType(t) => t.elem_type,
        _ => None,
    }
}

/// Renames every name `graph` and its subgraphs define or read (`rename` leaves what must stay),
/// nodes included. ONNX names are unique across a graph and its subgraphs, so one renaming of
/// every name keeps each reference pointing where it did.
fn rename_graph(graph: &mut crate::onnx::GraphProto, rename: &dyn Fn(&str) -> String) {
    for t in graph.initializer.iter_mut() {
        t.name = Some(rename(t.name()));
    }
    for s in graph.sparse_initializer.iter_mut() {
        if let Some(v) = s.values.as_mut() {
            v.name = Some(rename(v.name()));
        }
        if let Some(i) = s.indices.as_mut() {
            i.name = i.name.as_deref().map(rename);
        }
    }
    for v in graph.input.iter_mut().chain(graph.output.iter_mut()).chain(graph.value_info.iter_mut()) {
        v.name = Some(rename(v.name()));
    }
    for n in graph.node.iter_mut() {
        // An unnamed node stays unnamed: ONNX Runtime refuses two nodes of one name, not two
        // without (a converted model's Casts around an FP16 Softmax have none).
        if !n.name().is_empty() {
            n.name = Some(format!("{CANDIDATE_PREFIX}{}", n.name()));
        }
        n.input = n.input.iter().map(|i| rename(i)).collect();
        n.output = n.output.iter().map(|o| rename(o)).collect();
        for a in n.attribute.iter_mut() {
            for g in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                rename_graph(g, rename);
            }
        }
    }
}

/// Both programs' opset imports plus the reduction's domain. One domain at two versions is
/// refused where both programs have nodes of it (the same node would mean two things); where at
/// most one has, that one's version (the higher where neither has) serves both (a quantized file
/// saved by ONNX Runtime imports 'ai.onnx.ml' 3 and uses none of it).
fn merged_opsets(reference: &ModelProto, candidate: &ModelProto) -> Result<Vec<OperatorSetIdProto>, ModelError> {
    let normal = |d: &str| if d == "ai.onnx" { String::new() } else { d.to_string() };
    let used = |m: &ModelProto| -> std::collections::HashSet<String> {
        let mut domains = std::collections::HashSet::new();
        let mut stack: Vec<&crate::onnx::GraphProto> = m.graph.iter().collect();
        while let Some(g) = stack.pop() {
            for n in &g.node {
                domains.insert(normal(n.domain()));
                for a in &n.attribute {
                    stack.extend(a.g.iter().chain(&a.graphs));
                }
            }
        }
        domains
    };
    let (used_by_reference, used_by_candidate) = (used(reference), used(candidate));
    let mut versions: HashMap<String, i64> = HashMap::new();
    let mut order = Vec::new();
    for (o, from_reference) in
        reference.opset_import.iter().map(|o| (o, true)).chain(candidate.opset_import.iter().map(|o| (o, false)))
    {
        let domain = normal(o.domain());
        match versions.get(&domain) {
            Some(&v) if v != o.version() => {
                let (mine, theirs) = if from_reference {
                    (used_by_reference.contains(&domain), used_by_candidate.contains(&domain))
                } else {
                    (used_by_candidate.contains(&domain), used_by_reference.contains(&domain))
                };
                if mine && theirs {
                    return Err(ModelError::InvalidGraph(format!(
                        "the model and the candidate model both use ops of domain '{}' but import it at versions {v} and {}: one session cannot run both (run them apart with --separate-runs)",
                        if domain.is_empty() { "ai.onnx" } else { &domain },
                        o.version()
                    )));
                }
                if mine || (!theirs && o.version() > v) {
                    versions.insert(domain, o.version());
                }
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

    /// Found by the independent tester: a quantized file saved by ONNX Runtime imports
    /// 'ai.onnx.ml' 3 and uses none of it, and the paired session was refused ("the programs
    /// import opset 'ai.onnx.ml' at versions 5 and 3"). A domain only one side uses, or neither,
    /// takes one version; one both use at two versions is refused, naming the way out.
    #[test]
    fn a_domain_imported_at_two_versions_is_refused_only_where_both_use_it() {
        let import = |m: &mut ModelProto, version: i64| {
            m.opset_import.push(OperatorSetIdProto { domain: Some("ai.onnx.ml".into()), version: Some(version) })
        };
        let (mut r, mut c) = (program(1.0), program(2.0));
        import(&mut r, 5);
        import(&mut c, 3);
        let merged = merged_opsets(&r, &c).unwrap();
        assert_eq!(merged.iter().find(|o| o.domain() == "ai.onnx.ml").map(|o| o.version()), Some(5));
        // The candidate uses it: its version serves both.
        c.graph.as_mut().unwrap().node[1].domain = Some("ai.onnx.ml".into());
        let merged = merged_opsets(&r, &c).unwrap();
        assert_eq!(merged.iter().find(|o| o.domain() == "ai.onnx.ml").map(|o| o.version()), Some(3));
        r.graph.as_mut().unwrap().node[1].domain = Some("ai.onnx.ml".into());
        let refused = merged_opsets(&r, &c).unwrap_err().to_string();
        assert!(refused.contains("both use ops of domain 'ai.onnx.ml' but import it at versions 5 and 3"), "{refused}");
    }

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
        let p = paired_graph(&reference, &candidate, &["y".into(), "z".into()], &HashMap::new()).unwrap();
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
    fn every_pair_has_a_reduction_and_the_graph_one_output() {
        let p = paired_graph(&program(1.0), &program(2.0), &["y".into(), "z".into()], &HashMap::new()).unwrap();
        let g = p.proto.graph.unwrap();
        let reductions: Vec<&str> = g.node.iter().filter(|n| n.op_type() == PAIR_OP).map(|n| n.name()).collect();
        assert_eq!(reductions, vec!["lw_pair/z", "lw_pair/y"]);
        assert_eq!(g.output.iter().map(|o| o.name()).collect::<Vec<_>>(), vec!["lw_pair/y"]);
    }

    #[test]
    fn the_references_inlined_function_tensors_move_out_of_the_way() {
        let mut reference = program(1.0);
        let g = reference.graph.as_mut().unwrap();
        g.node[0].output[0] = "_inlfunc_HardSwish_HS_X".into();
        g.node[1].input[0] = "_inlfunc_HardSwish_HS_X".into();
        let candidate = program(2.0);
        let p = paired_graph(&reference, &candidate, &["z".into()], &HashMap::new()).unwrap();
        let g = p.proto.graph.unwrap();
        let names: Vec<&str> = g.node.iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
        assert!(
            names.contains(&"lw_ref/_inlfunc_HardSwish_HS_X") && !names.contains(&"_inlfunc_HardSwish_HS_X"),
            "{names:?}"
        );
        assert_eq!(g.node[1].input[0], "lw_ref/_inlfunc_HardSwish_HS_X");
    }

    #[test]
    fn input_shapes_are_pinned_except_in_a_graph_with_control_flow() {
        use crate::onnx::{tensor_shape_proto::dimension::Value as Dim, type_proto::Value};
        let dims = |p: &ModelProto| match p.graph.as_ref().unwrap().input[0]
            .r#type
            .as_ref()
            .unwrap()
            .value
            .as_ref()
            .unwrap()
        {
            Value::TensorType(t) => t.shape.as_ref().unwrap().dim.iter().map(|d| d.value.clone()).collect::<Vec<_>>(),
            _ => unreachable!(),
        };
        let mut p = program(1.0);
        pin_input_shapes(p.graph.as_mut().unwrap(), &[("x".into(), vec![5])]);
        assert_eq!(dims(&p), vec![Some(Dim::DimValue(5))]);
        let mut p = program(1.0);
        let before = dims(&p);
        p.graph.as_mut().unwrap().node[1].attribute.push(AttributeProto {
            name: Some("then_branch".into()),
            g: Some(Default::default()),
            ..Default::default()
        });
        pin_input_shapes(p.graph.as_mut().unwrap(), &[("x".into(), vec![7])]);
        assert_eq!(dims(&p), before);
    }

    #[test]
    fn unnamed_candidate_nodes_stay_unnamed() {
        let reference = program(1.0);
        let mut candidate = program(2.0);
        for n in candidate.graph.as_mut().unwrap().node.iter_mut() {
            n.name = Some(String::new());
        }
        let p = paired_graph(&reference, &candidate, &["z".into()], &HashMap::new()).unwrap();
        let names: Vec<&str> = p.proto.graph.as_ref().unwrap().node.iter().map(|n| n.name()).collect();
        assert_eq!(names, vec!["mul", "relu", "", "", "lw_pair/z"]);
    }

    #[test]
    fn disagreeing_opsets_are_refused() {
        let reference = program(1.0);
        let mut candidate = program(1.0);
        candidate.opset_import[0].version = Some(17);
        let e = paired_graph(&reference, &candidate, &["z".into()], &HashMap::new()).unwrap_err().to_string();
        assert!(e.contains("versions 13 and 17"), "{e}");
    }

    #[test]
    fn subgraphs_read_their_own_side_and_the_shared_inputs() {
        let reference = program(1.0);
        let mut candidate = program(2.0);
        // A branch body that reads an outer candidate tensor (`y`) and the shared input (`x`).
        let body = crate::onnx::GraphProto {
            node: vec![NodeProto {
                op_type: Some("Add".into()),
                name: Some("inner".into()),
                input: vec!["y".into(), "x".into()],
                output: vec!["b".into()],
                ..Default::default()
            }],
            output: vec![ValueInfoProto { name: Some("b".into()), ..Default::default() }],
            ..Default::default()
        };
        candidate.graph.as_mut().unwrap().node[1].attribute.push(AttributeProto {
            name: Some("then_branch".into()),
            g: Some(body),
            ..Default::default()
        });
        let p = paired_graph(&reference, &candidate, &["z".into()], &HashMap::new()).unwrap();
        let g = p.proto.graph.unwrap();
        let relu = g.node.iter().find(|n| n.name() == "lw_cand/relu").unwrap();
        let inner = &relu.attribute[0].g.as_ref().unwrap().node[0];
        assert_eq!(inner.input, vec!["lw_cand/y".to_string(), "x".to_string()]);
        assert_eq!(inner.output, vec!["lw_cand/b".to_string()]);
        assert_eq!(relu.attribute[0].g.as_ref().unwrap().output[0].name(), "lw_cand/b");
    }

    #[test]
    fn twins_of_other_names_and_inputs_of_another_type_are_paired() {
        let reference = program(1.0);
        let mut candidate = program(2.0);
        let g = candidate.graph.as_mut().unwrap();
        g.node[1].output[0] = "z_converted".into();
        if let Some(crate::onnx::type_proto::Value::TensorType(t)) =
            g.input[0].r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            t.elem_type = Some(DataType::Float16 as i32);
        }
        let names = HashMap::from([("z".to_string(), "z_converted".to_string())]);
        let p = paired_graph(&reference, &candidate, &["z".into()], &names).unwrap();
        assert_eq!(p.paired, vec!["z".to_string()]);
        let g = p.proto.graph.unwrap();
        let pair = g.node.iter().find(|n| n.op_type() == PAIR_OP).unwrap();
        assert_eq!(pair.input, vec!["z".to_string(), "lw_cand/z_converted".to_string()]);
        let cast = g.node.iter().find(|n| n.op_type() == "Cast").unwrap();
        assert_eq!((cast.input[0].as_str(), cast.output[0].as_str()), ("x", "lw_cand/x"));
        assert_eq!(cast.attribute[0].i, Some(DataType::Float16 as i64));
        let cand_mul = g.node.iter().find(|n| n.name() == "lw_cand/mul").unwrap();
        assert_eq!(cand_mul.input[0], "lw_cand/x");
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

/// What `layerwise_analysis::compute` totals over a pair of tensors before their metrics: sums in
/// float64, maxima and counts. A reduction elsewhere that totals the same (on the GPU where both
/// runs left their tensors: `layerwise_runtime::device_stats`) gets the same metrics from
/// `layerwise_analysis::metrics_of_totals`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PairTotals {
    pub numel: usize,
    /// Over the finite pairs outside the mask sentinels: sum |c - r|, (c - r)², r², c², r·c.
    pub sum_abs: f64,
    pub sum_d2: f64,
    pub sum_r2: f64,
    pub sum_c2: f64,
    pub sum_rc: f64,
    /// The largest |c - r| (inf on a non-finite mismatch, -1 when nothing was compared) and the
    /// first element holding it.
    pub worst: f64,
    pub worst_index: usize,
    /// max |r| over the finite reference values outside the mask sentinels.
    pub compared_max: f64,
    /// max |r| over every finite reference value.
    pub ref_max_abs: f64,
    /// max |c - r| / |r| over the finite pairs with r != 0.
    pub max_rel: f64,
    pub ref_nan: usize,
    pub ref_inf: usize,
    pub cand_nan: usize,
    pub cand_inf: usize,
    pub nonfinite_mismatch: usize,
    pub ref_fp16_overflow: usize,
    /// Finite non-zero reference values, and those of them below FP16's smallest normal.
    pub nonzero: usize,
    pub subnormal: usize,
    /// Mask sentinels (`layerwise_analysis::MaskSentinels`).
    pub sentinels: usize,
    /// Finite pairs outside the tolerance, judged against `compared_max` (sentinels aside) or
    /// `ref_max_abs`; the non-finite mismatches are added to them.
    pub finite_violations: usize,
}

/// Receives every pair of tensors of a paired run, inside ONNX Runtime's executor (one at a time,
/// in the order the session computes them). Keeps what it needs; the tensors are freed after.
pub trait PairReducer: Send + Sync {
    fn reduce(&self, tensor: &str, reference: Operand<'_>, candidate: Operand<'_>);
}

/// One piece of a paired graph split in [`split_paired`]: its own graph, fed at its border.
#[derive(Debug)]
pub struct Segment {
    /// The piece as a model: the paired model's opsets and functions, its nodes, the
    /// initializers they read, and as graph inputs the paired graph's inputs it reads. The
    /// tensors in `border_inputs` are read but declared nowhere: the caller declares them with
    /// the types the segment computing them has.
    pub proto: ModelProto,
    /// Tensors earlier segments compute that this one reads.
    pub border_inputs: Vec<String>,
    /// Tensors this segment computes that later segments read: its graph outputs (with one
    /// reduction's where there are none, as a graph needs an output to run).
    pub border_outputs: Vec<String>,
}

/// Splits `paired` (a [`paired_graph`]'s model, reductions included) into segments of at most
/// `max_nodes` nodes, in an order that reduces each pair right after both sides computed it
/// (the reductions' order, each preceded by what it needs, reference side first), so that few
/// tensors cross a border: the tensors still to be read later, typically the two sides' current
/// activations. Why: ONNX Runtime's session build grows faster than the graph (its allocation
/// planner), so segments of a bounded size keep the paired step linear in the model's size.
///
/// Gives `paired` back where the graph fits one segment, or has control flow (a subgraph reads
/// outer tensors the split would have to follow; such graphs run in one session, as before).
/// Takes the graph by value: its nodes move into the segments (a copy of a 30,000-node graph
/// beside the segments was most of the paired step's peak memory).
pub fn split_paired(mut paired: ModelProto, max_nodes: usize) -> Result<Vec<Segment>, ModelProto> {
    let Some(graph) = paired.graph.as_ref() else { return Err(paired) };
    let max_nodes = max_nodes.max(1);
    if graph.node.len() <= max_nodes
        || graph.node.iter().any(|n| n.attribute.iter().any(|a| a.g.is_some() || !a.graphs.is_empty()))
    {
        return Err(paired);
    }
    let order = reduction_order(graph);
    let chunks: Vec<&[usize]> = order.chunks(max_nodes).collect();
    // What each segment reads and passes on, found while the graph is whole.
    struct Plan {
        border_inputs: Vec<String>,
        border_outputs: Vec<String>,
        initializers: Vec<usize>,
        sparse: Vec<usize>,
        inputs: Vec<usize>,
        value_info: Vec<usize>,
    }
    let mut plans = Vec::with_capacity(chunks.len());
    {
        // The segment computing each tensor, and the last segment reading it.
        let mut made_in: HashMap<&str, usize> = HashMap::new();
        let mut last_read: HashMap<&str, usize> = HashMap::new();
        for (k, chunk) in chunks.iter().enumerate() {
            for &i in *chunk {
                for input in graph.node[i].input.iter().filter(|n| !n.is_empty()) {
                    last_read.insert(input.as_str(), k);
                }
                for output in graph.node[i].output.iter().filter(|n| !n.is_empty()) {
                    made_in.insert(output.as_str(), k);
                }
            }
        }
        let initializers: HashMap<&str, usize> =
            graph.initializer.iter().enumerate().map(|(i, t)| (t.name(), i)).collect();
        let sparse: HashMap<&str, usize> = graph
            .sparse_initializer
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.values.as_ref().map(|v| (v.name(), i)))
            .collect();
        let inputs: HashMap<&str, usize> = graph.input.iter().enumerate().map(|(i, v)| (v.name(), i)).collect();
        let value_info: HashMap<&str, usize> =
            graph.value_info.iter().enumerate().map(|(i, v)| (v.name(), i)).collect();
        for (k, chunk) in chunks.iter().enumerate() {
            let mut plan = Plan {
                border_inputs: Vec::new(),
                border_outputs: Vec::new(),
                initializers: Vec::new(),
                sparse: Vec::new(),
                inputs: Vec::new(),
                value_info: Vec::new(),
            };
            let mut seen: HashSet<&str> = HashSet::new();
            for &i in *chunk {
                let node = &graph.node[i];
                for input in node.input.iter().filter(|n| !n.is_empty()) {
                    if !seen.insert(input.as_str()) {
                        continue;
                    }
                    match made_in.get(input.as_str()) {
                        Some(&at) if at == k => {}
                        Some(_) => plan.border_inputs.push(input.clone()),
                        None if initializers.contains_key(input.as_str()) => {
                            plan.initializers.push(initializers[input.as_str()])
                        }
                        None if sparse.contains_key(input.as_str()) => plan.sparse.push(sparse[input.as_str()]),
                        None => plan.inputs.extend(inputs.get(input.as_str()).copied()),
                    }
                }
                for output in node.output.iter().filter(|n| !n.is_empty()) {
                    if last_read.get(output.as_str()).is_some_and(|&r| r > k) {
                        plan.border_outputs.push(output.clone());
                    }
                    plan.value_info.extend(value_info.get(output.as_str()).copied());
                }
            }
            if plan.border_outputs.is_empty() {
                let last = chunk
                    .iter()
                    .rev()
                    .map(|&i| &graph.node[i])
                    .find(|n| n.op_type() == PAIR_OP)
                    .unwrap_or(&graph.node[*chunk.last().expect("chunks are never empty")]);
                plan.border_outputs.extend(last.output.iter().find(|o| !o.is_empty()).cloned());
            }
            plans.push(plan);
        }
    }
    let base = paired_without_graph(&paired);
    let mut graph = paired.graph.take().expect("checked above");
    let mut nodes: Vec<Option<NodeProto>> = std::mem::take(&mut graph.node).into_iter().map(Some).collect();
    let mut segments = Vec::with_capacity(chunks.len());
    for (k, (chunk, plan)) in chunks.iter().zip(plans).enumerate() {
        let mut g =
            crate::onnx::GraphProto { name: Some(format!("{}_segment_{k}", graph.name())), ..Default::default() };
        // Weights' bytes are shared, so a weight two segments read is not copied.
        g.initializer = plan.initializers.iter().map(|&i| graph.initializer[i].clone()).collect();
        g.sparse_initializer = plan.sparse.iter().map(|&i| graph.sparse_initializer[i].clone()).collect();
        g.input = plan.inputs.iter().map(|&i| graph.input[i].clone()).collect();
        g.value_info = plan.value_info.iter().map(|&i| graph.value_info[i].clone()).collect();
        // As in the whole graph, the segment's reductions go last, last-first: ONNX Runtime's
        // execution order walks from them, and so reduces each pair soon after it exists.
        let (mut reductions, mut moved): (Vec<NodeProto>, Vec<NodeProto>) = chunk
            .iter()
            .map(|&i| nodes[i].take().expect("each node is in one chunk"))
            .partition(|n| n.op_type() == PAIR_OP && n.domain() == PAIR_DOMAIN);
        reductions.reverse();
        moved.extend(reductions);
        g.node = moved;
        g.output = plan
            .border_outputs
            .iter()
            .map(|n| ValueInfoProto { name: Some(n.clone()), ..Default::default() })
            .collect();
        let proto = ModelProto { graph: Some(g), ..base.clone() };
        segments.push(Segment { proto, border_inputs: plan.border_inputs, border_outputs: plan.border_outputs });
    }
    Ok(segments)
}

/// What a segment keeps of the paired model besides its graph: what its nodes' meaning rests on.
fn paired_without_graph(model: &ModelProto) -> ModelProto {
    ModelProto {
        ir_version: model.ir_version,
        opset_import: model.opset_import.clone(),
        functions: model.functions.clone(),
        producer_name: model.producer_name.clone(),
        ..Default::default()
    }
}

/// The nodes of `graph` (indices) in topological order: for each reduction in the order of the
/// tensors it compares (the graph holds them last-first), what it needs that is not placed yet,
/// depth first with each node's inputs in order (the reference's before the candidate's), then the
/// reduction; then what feeds no reduction. Iterative: a chain of 200,000 nodes is as deep.
fn reduction_order(graph: &crate::onnx::GraphProto) -> Vec<usize> {
    let producer: HashMap<&str, usize> = graph
        .node
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().filter(|o| !o.is_empty()).map(move |o| (o.as_str(), i)))
        .collect();
    let reductions = graph
        .node
        .iter()
        .enumerate()
        .filter(|(_, n)| n.op_type() == PAIR_OP && n.domain() == PAIR_DOMAIN)
        .map(|(i, _)| i)
        .rev();
    let rest = graph
        .node
        .iter()
        .enumerate()
        .filter(|(_, n)| !(n.op_type() == PAIR_OP && n.domain() == PAIR_DOMAIN))
        .map(|(i, _)| i);
    let mut placed = vec![false; graph.node.len()];
    let mut order = Vec::with_capacity(graph.node.len());
    // (node, next input to look at)
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in reductions.chain(rest) {
        if placed[root] {
            continue;
        }
        placed[root] = true;
        stack.push((root, 0));
        while let Some(top) = stack.last_mut() {
            let (node, next) = *top;
            if let Some(input) = graph.node[node].input.get(next) {
                top.1 += 1;
                if let Some(&p) = producer.get(input.as_str()) {
                    if !placed[p] {
                        placed[p] = true;
                        stack.push((p, 0));
                    }
                }
            } else {
                order.push(node);
                stack.pop();
            }
        }
    }
    order
}

#[cfg(test)]
mod split_tests {
    use super::*;
    use crate::builder::ModelBuilder;
    use crate::DataType;

    /// A chain of `n` Relu nodes, paired with itself, every tensor compared.
    fn paired_chain(n: usize) -> PairedGraph {
        let mut b = ModelBuilder::new("chain", 13);
        b.input("x", DataType::Float, &[4i64.into()]);
        b.initializer(crate::builder::f32_tensor("w", &[4], &[1.0; 4]));
        let mut current = "x".to_string();
        let mut names = Vec::new();
        for i in 0..n {
            let next = format!("t{i}");
            // Every fifth node also reads the input and the weight: values read far from where
            // they are made cross many borders.
            if i % 5 == 0 {
                b.node("Sum", &format!("sum{i}"), &[&current, "x", "w"], &[&next], vec![]);
            } else {
                b.node("Relu", &format!("relu{i}"), &[&current], &[&next], vec![]);
            }
            names.push(next.clone());
            current = next;
        }
        b.output(&current, DataType::Float);
        let m = b.build();
        paired_graph(&m, &m, &names, &HashMap::new()).unwrap()
    }

    #[test]
    fn segments_hold_every_node_once_in_an_order_that_computes_what_each_reads_first() {
        let paired = paired_chain(100);
        let all = paired.proto.graph.as_ref().unwrap();
        assert!(
            split_paired(paired.proto.clone(), all.node.len()).is_err(),
            "a graph that fits one segment stays whole"
        );
        let segments = split_paired(paired.proto.clone(), 7).unwrap();
        assert_eq!(segments.len(), all.node.len().div_ceil(7));
        let mut computed: HashSet<String> = HashSet::new();
        let mut passed_on: HashSet<String> = HashSet::new();
        let mut nodes = Vec::new();
        for s in &segments {
            let g = s.proto.graph.as_ref().unwrap();
            assert!(g.node.len() <= 7);
            let declared: HashSet<&str> = g
                .input
                .iter()
                .map(|v| v.name())
                .chain(g.initializer.iter().map(|t| t.name()))
                .chain(s.border_inputs.iter().map(String::as_str))
                .collect();
            let mut here: HashSet<&str> = HashSet::new();
            for n in &g.node {
                for i in &n.input {
                    assert!(
                        here.contains(i.as_str()) || declared.contains(i.as_str()),
                        "'{i}' read before it is computed or declared"
                    );
                }
                here.extend(n.output.iter().map(String::as_str));
                nodes.push(n.name().to_string());
            }
            for b in &s.border_inputs {
                assert!(passed_on.contains(b), "'{b}' is read at a border that no earlier segment passes on");
            }
            // Both sides' current activation crosses a border, and the input read every fifth node.
            assert!(s.border_inputs.len() <= 3, "{:?}", s.border_inputs);
            assert!(g.input.iter().all(|v| v.name() == "x"));
            assert_eq!(
                g.output.iter().map(|o| o.name()).collect::<Vec<_>>(),
                s.border_outputs.iter().map(String::as_str).collect::<Vec<_>>()
            );
            passed_on.extend(s.border_outputs.iter().cloned());
            computed.extend(g.node.iter().flat_map(|n| n.output.iter().cloned()));
        }
        let mut expected: Vec<String> = all.node.iter().map(|n| n.name().to_string()).collect();
        expected.sort();
        nodes.sort();
        assert_eq!(nodes, expected, "every node in exactly one segment");
        // Each pair's reduction follows its two tensors (in the segment, the reductions go last
        // in reverse: ONNX Runtime's execution order walks from them, last first).
        let first: Vec<&str> = segments[0].proto.graph.as_ref().unwrap().node.iter().map(|n| n.name()).collect();
        assert_eq!(first, ["sum0", "lw_cand/sum0", "relu1", "lw_cand/relu1", "relu2", "lw_pair/t1", "lw_pair/t0"]);
    }

    #[test]
    fn a_graph_with_control_flow_is_not_split() {
        let mut paired = paired_chain(30);
        let g = paired.proto.graph.as_mut().unwrap();
        g.node[1].attribute.push(AttributeProto {
            name: Some("then_branch".into()),
            g: Some(Default::default()),
            ..Default::default()
        });
        assert!(split_paired(paired.proto.clone(), 7).is_err());
    }
}
