//! Control flow made visible: an `If` replaced by the branch a run took, a `Loop` unrolled for the
//! number of iterations a run made. The result is an ordinary graph whose every tensor can be
//! exposed, compared, rounded by the FP16 emulation and walked, named after where it came from:
//! `IfNode/then/tensor`, `LoopNode/iter3/tensor`.
//!
//! The rewrite is exact for the inputs of the run that chose the branches and trip counts, and only
//! for them: the caller takes those from a reference run on the same inputs.

use std::collections::{HashMap, HashSet};

use crate::builder::{attr, i64_tensor};
use crate::onnx::{GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto};
use crate::{DataType, GraphIndex, ModelError};

/// What a run did at one control-flow node (by layerwise's node name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// The If's condition: `true` runs `then_branch`.
    Branch(bool),
    /// The number of iterations the Loop ran.
    Iterations(usize),
}

/// One control-flow node replaced by its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inlined {
    pub node: String,
    pub op_type: String,
    /// `then_branch`, `else_branch`, or `N iterations`.
    pub taken: String,
    /// Nodes that replaced it.
    pub nodes: usize,
}

/// Most nodes one Loop may unroll into: beyond it the Loop stays as it is (and the caller says so).
pub const MOST_UNROLLED_NODES: usize = 200_000;

/// Replaces each main-graph If/Loop named in `taken` by its body, as run. Returns the new model
/// and what was replaced, in graph order. Nested control flow inside a body becomes main-graph
/// control flow: call again with what the next run says about it.
pub fn inline_control_flow(
    proto: &ModelProto,
    index: &GraphIndex,
    taken: &HashMap<String, Taken>,
) -> Result<(ModelProto, Vec<Inlined>), ModelError> {
    let mut out = proto.clone();
    let opset = crate::model::default_opset(proto);
    let graph = out.graph.as_mut().expect("model has a graph");
    let names: HashMap<usize, &str> = index.nodes.iter().map(|n| (n.proto_index, n.name.as_str())).collect();
    let mut taken_names: HashSet<String> = graph.node.iter().flat_map(|n| n.output.iter().cloned()).collect();
    taken_names.extend(graph.initializer.iter().map(|t| t.name().to_string()));
    taken_names.extend(graph.input.iter().map(|v| v.name().to_string()));

    let mut emitted = Emitted { nodes: Vec::with_capacity(graph.node.len()), ..Default::default() };
    let mut report = Vec::new();
    for (i, node) in std::mem::take(&mut graph.node).into_iter().enumerate() {
        let name = names.get(&i).copied().unwrap_or_default().to_string();
        let replaced = match (node.op_type(), taken.get(&name)) {
            ("If", Some(Taken::Branch(cond))) => {
                let branch = if *cond { "then_branch" } else { "else_branch" };
                let body = subgraph(&node, branch).ok_or_else(|| bad(&name, format!("has no {branch}")))?;
                let short = if *cond { "then" } else { "else" };
                let mut scope = Scope::new(format!("{name}/{short}"), &mut taken_names);
                let outputs = scope.inline(body, &HashMap::new(), &mut emitted);
                if outputs.len() != node.output.len() {
                    return Err(bad(
                        &name,
                        format!("{branch} has {} outputs for the If's {}", outputs.len(), node.output.len()),
                    ));
                }
                let mut added = scope.added;
                for (k, (inner, outer)) in outputs.iter().zip(&node.output).enumerate() {
                    if !outer.is_empty() {
                        emitted.nodes.push(identity(&format!("{name}/output{k}"), inner, outer));
                        added += 1;
                    }
                }
                report.push(Inlined { node: name, op_type: "If".into(), taken: branch.into(), nodes: added });
                true
            }
            ("Loop", Some(Taken::Iterations(n))) => {
                let body = subgraph(&node, "body").ok_or_else(|| bad(&name, "has no body".into()))?;
                if body.node.len().saturating_mul(*n) > MOST_UNROLLED_NODES {
                    false
                } else {
                    let added = unroll_loop(&node, &name, body, *n, opset, &mut taken_names, &mut emitted)?;
                    report.push(Inlined {
                        node: name,
                        op_type: "Loop".into(),
                        taken: format!("{n} iterations"),
                        nodes: added,
                    });
                    true
                }
            }
            ("Scan", Some(Taken::Iterations(n))) if opset >= 9 => {
                let body = subgraph(&node, "body").ok_or_else(|| bad(&name, "has no body".into()))?;
                if body.node.len().saturating_mul(*n) > MOST_UNROLLED_NODES || *n == 0 {
                    false
                } else {
                    let added = unroll_scan(&node, &name, body, *n, opset, &mut taken_names, &mut emitted)?;
                    report.push(Inlined {
                        node: name,
                        op_type: "Scan".into(),
                        taken: format!("{n} iterations"),
                        nodes: added,
                    });
                    true
                }
            }
            _ => false,
        };
        if !replaced {
            emitted.nodes.push(node);
        }
    }
    graph.node = emitted.nodes;
    graph.initializer.extend(emitted.initializers);
    graph.value_info.extend(emitted.value_info);
    Ok((out, report))
}

/// What inlining adds to the main graph.
#[derive(Default)]
struct Emitted {
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    value_info: Vec<ValueInfoProto>,
}

fn bad(node: &str, why: String) -> ModelError {
    ModelError::InvalidGraph(format!("control-flow node '{node}' {why}"))
}

fn subgraph<'a>(node: &'a NodeProto, name: &str) -> Option<&'a GraphProto> {
    node.attribute.iter().find(|a| a.name() == name).and_then(|a| a.g.as_ref())
}

fn identity(name: &str, from: &str, to: &str) -> NodeProto {
    NodeProto {
        op_type: Some("Identity".into()),
        name: Some(name.into()),
        input: vec![from.into()],
        output: vec![to.into()],
        ..Default::default()
    }
}

/// Copies bodies into the main graph under one prefix, renaming what they define.
struct Scope<'a> {
    prefix: String,
    /// Every tensor name in use in the main graph, so that a copied name never collides.
    used: &'a mut HashSet<String>,
    added: usize,
}

impl<'a> Scope<'a> {
    fn new(prefix: String, used: &'a mut HashSet<String>) -> Scope<'a> {
        Scope { prefix, used, added: 0 }
    }

    fn fresh(&mut self, name: &str) -> String {
        let base = format!("{}/{name}", self.prefix);
        let mut candidate = base.clone();
        let mut k = 1;
        while !self.used.insert(candidate.clone()) {
            candidate = format!("{base}#{k}");
            k += 1;
        }
        candidate
    }

    /// Appends `body`'s nodes (renamed) to `nodes`, with its formal inputs bound to `bind` (outer
    /// tensors). Returns the tensors that hold the body's outputs.
    fn inline(&mut self, body: &GraphProto, bind: &HashMap<String, String>, out: &mut Emitted) -> Vec<String> {
        let mut rename: HashMap<String, String> = bind.clone();
        for t in &body.initializer {
            let new = self.fresh(t.name());
            out.initializers.push(TensorProto { name: Some(new.clone()), ..t.clone() });
            rename.insert(t.name().to_string(), new);
        }
        for n in &body.node {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                let new = self.fresh(o);
                rename.insert(o.clone(), new);
            }
        }
        for (i, n) in body.node.iter().enumerate() {
            let mut copy = n.clone();
            let local = if n.name().is_empty() { format!("{}#{i}", n.op_type()) } else { n.name().to_string() };
            copy.name = Some(format!("{}/{local}", self.prefix));
            for t in copy.input.iter_mut().chain(copy.output.iter_mut()) {
                if let Some(new) = rename.get(t.as_str()) {
                    *t = new.clone();
                }
            }
            // Nested bodies read the renamed tensors from their outer scope.
            for attr in copy.attribute.iter_mut() {
                for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()) {
                    for outer in crate::graph::outer_refs_of_graph(g) {
                        if let Some(new) = rename.get(&outer) {
                            crate::graph::rename_outer_ref(g, &outer, new);
                        }
                    }
                }
            }
            out.nodes.push(copy);
            self.added += 1;
        }
        for v in &body.value_info {
            if let Some(new) = rename.get(v.name()) {
                out.value_info.push(ValueInfoProto { name: Some(new.clone()), ..v.clone() });
            }
        }
        body.output.iter().map(|o| rename.get(o.name()).cloned().unwrap_or_else(|| o.name().to_string())).collect()
    }
}

/// Loop(M, cond, v...) with body(iter_num, cond_in, v_in...) -> (cond_out, v_out..., scan...):
/// `n` copies of the body chained through the loop-carried values; the scan outputs stacked.
#[allow(clippy::too_many_arguments)]
fn unroll_loop(
    node: &NodeProto,
    name: &str,
    body: &GraphProto,
    n: usize,
    opset: i64,
    used: &mut HashSet<String>,
    out: &mut Emitted,
) -> Result<usize, ModelError> {
    let carried = node.input.len().saturating_sub(2);
    if body.input.len() != carried + 2 || body.output.len() < carried + 1 {
        return Err(bad(
            name,
            format!(
                "has a body with {} inputs and {} outputs for {carried} loop-carried values",
                body.input.len(),
                body.output.len()
            ),
        ));
    }
    let scans = body.output.len() - 1 - carried;
    if node.output.len() > carried + scans {
        return Err(bad(
            name,
            format!("has {} outputs for {carried} loop-carried values and {scans} scan outputs", node.output.len()),
        ));
    }
    if n == 0 && scans > 0 {
        return Err(bad(name, "ran no iteration, so its scan outputs have no shape to unroll into".into()));
    }
    let mut scope = Scope::new(name.to_string(), used);
    // The condition the first iteration sees: the Loop's own, or true when it has none.
    let mut cond = match node.input.get(1).filter(|c| !c.is_empty()) {
        Some(c) => c.clone(),
        None => {
            let t = scope.fresh("cond_init");
            out.initializers.push(bool_scalar(&t, true));
            t
        }
    };
    let mut values: Vec<String> = node.input[2..].to_vec();
    let mut scan_parts: Vec<Vec<String>> = vec![Vec::new(); scans];
    let mut added = 0;
    for i in 0..n {
        let mut iteration = Scope::new(format!("{name}/iter{i}"), scope.used);
        let iter_num = iteration.fresh("iter_num");
        out.initializers.push(i64_tensor(&iter_num, &[], &[i as i64]));
        let mut bind = HashMap::new();
        bind.insert(body.input[0].name().to_string(), iter_num);
        bind.insert(body.input[1].name().to_string(), cond.clone());
        for (formal, actual) in body.input[2..].iter().zip(&values) {
            bind.insert(formal.name().to_string(), actual.clone());
        }
        let outputs = iteration.inline(body, &bind, out);
        added += iteration.added;
        cond = outputs[0].clone();
        values = outputs[1..=carried].to_vec();
        for (part, out) in scan_parts.iter_mut().zip(&outputs[carried + 1..]) {
            part.push(out.clone());
        }
    }
    added += hand_over(name, &values, &node.output, &mut out.nodes);
    for (j, parts) in scan_parts.iter().enumerate() {
        if let Some(outer) = node.output.get(carried + j).filter(|o| !o.is_empty()) {
            added += stack(&mut scope, name, j, parts, 0, opset, outer, out);
        }
    }
    Ok(added)
}

/// The final loop-carried values (or scan states) handed to the node's outputs through Identity
/// nodes `Node/finalK`; returns the nodes added.
fn hand_over(name: &str, values: &[String], outputs: &[String], nodes: &mut Vec<NodeProto>) -> usize {
    let mut added = 0;
    for (k, (value, outer)) in values.iter().zip(outputs).enumerate() {
        if !outer.is_empty() {
            nodes.push(identity(&format!("{name}/final{k}"), value, outer));
            added += 1;
        }
    }
    added
}

/// Scan output `j`: each iteration's value given a new axis `axis` (Unsqueeze) and concatenated
/// along it into `outer`; returns the nodes added.
#[allow(clippy::too_many_arguments)]
fn stack(
    scope: &mut Scope,
    name: &str,
    j: usize,
    parts: &[String],
    axis: i64,
    opset: i64,
    outer: &str,
    out: &mut Emitted,
) -> usize {
    // Unsqueeze takes its axes as an input from opset 13, as an attribute before.
    let axes = scope.fresh(&format!("axes{j}"));
    if opset >= 13 {
        out.initializers.push(i64_tensor(&axes, &[1], &[axis]));
    }
    let mut stacked = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let t = scope.fresh(&format!("scan{j}_part{i}"));
        let mut u = NodeProto {
            op_type: Some("Unsqueeze".into()),
            name: Some(format!("{name}/scan{j}/unsqueeze{i}")),
            input: vec![part.clone()],
            output: vec![t.clone()],
            ..Default::default()
        };
        if opset >= 13 {
            u.input.push(axes.clone());
        } else {
            u.attribute.push(attr::ints("axes", &[axis]));
        }
        out.nodes.push(u);
        stacked.push(t);
    }
    out.nodes.push(NodeProto {
        op_type: Some("Concat".into()),
        name: Some(format!("{name}/scan{j}")),
        input: stacked,
        output: vec![outer.to_string()],
        attribute: vec![attr::int("axis", axis)],
        ..Default::default()
    });
    parts.len() + 1
}

fn ints_attr(node: &NodeProto, name: &str) -> Vec<i64> {
    node.attribute.iter().find(|a| a.name() == name).map(|a| a.ints.clone()).unwrap_or_default()
}

/// Scan (opset 9 and later) with N state values and M scan inputs: `n` copies of the body, iteration
/// i reading slice i of each scan input along its axis (from the end when its direction is 1)
/// with a Gather, the state chained through; each scan output's slices stacked along its axis
/// (in reverse order when its direction is 1).
#[allow(clippy::too_many_arguments)]
fn unroll_scan(
    node: &NodeProto,
    name: &str,
    body: &GraphProto,
    n: usize,
    opset: i64,
    used: &mut HashSet<String>,
    out: &mut Emitted,
) -> Result<usize, ModelError> {
    let scan_inputs =
        node.attribute.iter().find(|a| a.name() == "num_scan_inputs").and_then(|a| a.i).unwrap_or(0) as usize;
    let states = node
        .input
        .len()
        .checked_sub(scan_inputs)
        .ok_or_else(|| bad(name, "has fewer inputs than num_scan_inputs".into()))?;
    let scan_outputs = node.output.len().saturating_sub(states);
    if body.input.len() != states + scan_inputs || body.output.len() != states + scan_outputs {
        return Err(bad(
            name,
            format!(
                "has a body with {} inputs and {} outputs for {states} states, {scan_inputs} scan inputs",
                body.input.len(),
                body.output.len()
            ),
        ));
    }
    let (in_axes, in_dirs) = (ints_attr(node, "scan_input_axes"), ints_attr(node, "scan_input_directions"));
    let (out_axes, out_dirs) = (ints_attr(node, "scan_output_axes"), ints_attr(node, "scan_output_directions"));
    if in_axes.iter().chain(&out_axes).any(|&a| a < 0) {
        return Err(bad(name, "uses negative scan axes, which the unrolling does not resolve".into()));
    }
    if n == 0 && scan_outputs > 0 {
        return Err(bad(name, "ran no step, so its scan outputs have no shape to unroll into".into()));
    }
    let mut scope = Scope::new(name.to_string(), used);
    let mut state: Vec<String> = node.input[..states].to_vec();
    let mut parts: Vec<Vec<String>> = vec![Vec::new(); scan_outputs];
    let mut added = 0;
    for i in 0..n {
        let mut iteration = Scope::new(format!("{name}/iter{i}"), scope.used);
        let mut bind = HashMap::new();
        for (formal, actual) in body.input[..states].iter().zip(&state) {
            bind.insert(formal.name().to_string(), actual.clone());
        }
        for j in 0..scan_inputs {
            let reverse = in_dirs.get(j).copied().unwrap_or(0) == 1;
            let index = iteration.fresh(&format!("index{j}"));
            out.initializers.push(i64_tensor(&index, &[], &[if reverse { (n - 1 - i) as i64 } else { i as i64 }]));
            let slice = iteration.fresh(&format!("slice{j}"));
            out.nodes.push(NodeProto {
                op_type: Some("Gather".into()),
                name: Some(format!("{name}/iter{i}/slice{j}")),
                input: vec![node.input[states + j].clone(), index],
                output: vec![slice.clone()],
                attribute: vec![attr::int("axis", in_axes.get(j).copied().unwrap_or(0))],
                ..Default::default()
            });
            added += 1;
            bind.insert(body.input[states + j].name().to_string(), slice);
        }
        let outputs = iteration.inline(body, &bind, out);
        added += iteration.added;
        state = outputs[..states].to_vec();
        for (part, out) in parts.iter_mut().zip(&outputs[states..]) {
            part.push(out.clone());
        }
    }
    added += hand_over(name, &state, &node.output, &mut out.nodes);
    for (j, slices) in parts.iter().enumerate() {
        let Some(outer) = node.output.get(states + j).filter(|o| !o.is_empty()) else { continue };
        let mut ordered = slices.clone();
        if out_dirs.get(j).copied().unwrap_or(0) == 1 {
            ordered.reverse();
        }
        added += stack(&mut scope, name, j, &ordered, out_axes.get(j).copied().unwrap_or(0), opset, outer, out);
    }
    Ok(added)
}

fn bool_scalar(name: &str, value: bool) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: vec![],
        data_type: Some(DataType::Bool as i32),
        raw_data: Some(vec![value as u8].into()),
        ..Default::default()
    }
}

/// For type inference only: the model with a copy of every If branch and Loop body beside its
/// node (nested ones too), computing `Node/then/tensor`, `Node/else/tensor`, `Node/body/tensor`.
/// The control-flow nodes stay, so the model still computes what it did; the copies only give
/// every body tensor a main-graph name whose type ONNX Runtime can report. A Loop body's copy reads
/// the Loop's initial values (types do not change between iterations). Returns the new model and
/// the copied tensors.
pub fn with_body_copies(proto: &ModelProto) -> Result<(ModelProto, Vec<String>), ModelError> {
    let mut out = proto.clone();
    let mut copied_nodes: HashSet<String> = HashSet::new();
    let mut tensors = Vec::new();
    // Each round copies the bodies of control-flow nodes not yet copied; copies of nested nodes
    // are main-graph nodes of the next round.
    for _ in 0..16 {
        let graph = out.graph.as_mut().expect("model has a graph");
        let index = GraphIndex::build(graph)?;
        let mut used: HashSet<String> = graph.node.iter().flat_map(|n| n.output.iter().cloned()).collect();
        used.extend(graph.initializer.iter().map(|t| t.name().to_string()));
        used.extend(graph.input.iter().map(|v| v.name().to_string()));
        let mut emitted = Emitted::default();
        let mut any = false;
        for info in index.nodes.iter().filter(|n| matches!(n.op_type.as_str(), "If" | "Loop")) {
            if !copied_nodes.insert(info.name.clone()) {
                continue;
            }
            any = true;
            let node = &graph.node[info.proto_index];
            let before = emitted.nodes.len();
            if info.op_type == "If" {
                for (attr, short) in [("then_branch", "then"), ("else_branch", "else")] {
                    if let Some(body) = subgraph(node, attr) {
                        Scope::new(format!("{}/{short}", info.name), &mut used).inline(
                            body,
                            &HashMap::new(),
                            &mut emitted,
                        );
                    }
                }
            } else if let Some(body) = subgraph(node, "body") {
                let mut scope = Scope::new(format!("{}/body", info.name), &mut used);
                let mut bind = HashMap::new();
                if let Some(i) = body.input.first() {
                    let t = scope.fresh("iter_num");
                    emitted.initializers.push(i64_tensor(&t, &[], &[0]));
                    bind.insert(i.name().to_string(), t);
                }
                if let Some(c) = body.input.get(1) {
                    let t = match node.input.get(1).filter(|c| !c.is_empty()) {
                        Some(cond) => cond.clone(),
                        None => {
                            let t = scope.fresh("cond_init");
                            emitted.initializers.push(bool_scalar(&t, true));
                            t
                        }
                    };
                    bind.insert(c.name().to_string(), t);
                }
                for (formal, actual) in body.input.iter().skip(2).zip(node.input.iter().skip(2)) {
                    bind.insert(formal.name().to_string(), actual.clone());
                }
                scope.inline(body, &bind, &mut emitted);
            }
            tensors.extend(
                emitted.nodes[before..].iter().flat_map(|n| n.output.iter().filter(|o| !o.is_empty()).cloned()),
            );
        }
        if !any {
            break;
        }
        graph.node.extend(emitted.nodes);
        graph.initializer.extend(emitted.initializers);
        graph.value_info.extend(emitted.value_info);
    }
    Ok((out, tensors))
}

/// Whether `rest`, a name past `Node/` of an inlined `op_type` node `Node`, names a node that the
/// inlining made to hand the body's values over, which the model does not hold: an If's `outputK`
/// (branch output K to the If's output K), a Loop's or Scan's `finalK` and `scanJ`
/// (`scanJ/unsqueezeI`), its final values and stacked scan outputs. Body nodes never take these
/// names: theirs start with `then/`, `else/` or `iterK/`.
pub fn made_by_inlining(op_type: &str, rest: &str) -> bool {
    let numbered = |part: &str, word: &str| {
        part.strip_prefix(word).is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
    };
    let (part, inner) = rest.split_once('/').unwrap_or((rest, ""));
    match (op_type, inner) {
        ("If", "") => numbered(part, "output"),
        ("Loop" | "Scan", "") => numbered(part, "final") || numbered(part, "scan"),
        ("Loop" | "Scan", _) => numbered(part, "scan") && numbered(inner, "unsqueeze"),
        _ => false,
    }
}

/// How a body's nodes and tensors are named once inlined or copied: `Node/then`, `Node/else`, and
/// for a Loop `Node/body` (typing copies) or `Node/iterK` (one iteration, unrolled).
pub fn body_prefixes(node_name: &str, op_type: &str, attribute: &str) -> Option<String> {
    let short = match (op_type, attribute) {
        ("If", "then_branch") => "then",
        ("If", "else_branch") => "else",
        ("Loop", "body") => "body",
        _ => return None,
    };
    Some(format!("{node_name}/{short}"))
}
