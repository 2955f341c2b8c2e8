//! Control flow as it ran: before anything is compared, each main-graph `If` is replaced by the
//! branch the reference took on these inputs and each `Loop` is unrolled for the iterations it
//! made, so every tensor inside a body can be exposed, emulated, compared and walked like any
//! other. Nested bodies surface one level per round.

use std::collections::HashMap;

use anyhow::{Context, Result};
use layerwise_analysis::{ControlFlow, InlinedNode};
use layerwise_model::inline::{inline_control_flow, Taken};
use layerwise_model::onnx::GraphProto;
use layerwise_model::{GraphIndex, Model, NodeInfo, Selection};
use layerwise_runtime::{Backend, RunRequest, Tensor, TensorData};

/// Rounds of inlining: each surfaces one level of nesting.
const MOST_ROUNDS: usize = 16;

/// The model with its control flow replaced as the reference ran it on every sample, or `None`
/// when the main graph has no If or Loop. Nodes that cannot be replaced stay, with the reason.
pub fn flatten_control_flow(
    model: &Model,
    reference: &mut dyn Backend,
    samples: &[Vec<(String, Tensor)>],
    what: &str,
) -> Result<Option<(Model, ControlFlow)>> {
    let mut current = model.derived(model.proto.clone(), &file_name(model));
    let mut report = ControlFlow::default();
    for _ in 0..MOST_ROUNDS {
        let index = GraphIndex::build(current.graph())?;
        let pending: Vec<&NodeInfo> = index
            .nodes
            .iter()
            .filter(|n| {
                matches!(n.op_type.as_str(), "If" | "Loop" | "Scan") && !report.kept.iter().any(|(k, _)| k == &n.name)
            })
            .collect();
        if pending.is_empty() {
            break;
        }
        // The values that decide each node, per sample.
        let mut wanted: Vec<String> = Vec::new();
        for n in &pending {
            for t in deciding_tensors(n) {
                if index.producer_index(&t).is_some() && !wanted.contains(&t) {
                    wanted.push(t);
                }
            }
        }
        let mut per_sample: Vec<HashMap<String, Tensor>> = Vec::new();
        for feeds in samples {
            let mut values: HashMap<String, Tensor> = HashMap::new();
            if !wanted.is_empty() {
                let selection = Selection::Names(wanted.clone());
                let out = reference
                    .run(&RunRequest { model: &current, index: &index, inputs: feeds, selection: &selection })
                    .with_context(|| format!("running {what} to see which branches its control flow takes"))?;
                values = out.tensors;
            }
            for (name, t) in feeds {
                values.insert(name.clone(), t.clone());
            }
            per_sample.push(values);
        }
        let mut taken: HashMap<String, Taken> = HashMap::new();
        for n in &pending {
            let mut decisions = per_sample.iter().map(|values| decide(n, &current, values));
            let first = decisions.next().expect("one sample at least");
            let decision = match first {
                Ok(d) if decisions.all(|other| other.as_ref().ok() == Some(&d)) => Ok(d),
                Ok(_) => Err("the samples take different paths through it".to_string()),
                Err(why) => Err(why),
            };
            match decision {
                Ok(d) => {
                    taken.insert(n.name.clone(), d);
                }
                Err(why) => report.kept.push((n.name.clone(), why)),
            }
        }
        if taken.is_empty() {
            continue;
        }
        let (proto, inlined) = inline_control_flow(&current.proto, &index, &taken)?;
        for n in taken.keys().filter(|n| !inlined.iter().any(|i| &&i.node == n)) {
            report.kept.push((
                n.clone(),
                format!("unrolling it would add more than {} nodes", layerwise_model::inline::MOST_UNROLLED_NODES),
            ));
        }
        report.inlined.extend(inlined.into_iter().map(|i| InlinedNode {
            node: i.node,
            op_type: i.op_type,
            taken: i.taken,
            nodes: i.nodes,
            candidate_taken: None,
        }));
        current = current.derived(proto, &file_name(model));
    }
    if report.inlined.is_empty() && report.kept.is_empty() {
        return Ok(None);
    }
    report.kept.sort();
    Ok(Some((current, report)))
}

fn file_name(model: &Model) -> String {
    model.path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "model.onnx".into())
}

/// The tensors whose values choose what a control-flow node does: an If's condition, a Loop's trip
/// count and condition, and its scan outputs (their length is the number of iterations made).
fn deciding_tensors(n: &NodeInfo) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    match n.op_type.as_str() {
        "If" => out.extend(n.inputs.first().cloned()),
        "Loop" => {
            out.extend(n.inputs.iter().take(2).filter(|t| !t.is_empty()).cloned());
            let carried = n.inputs.len().saturating_sub(2);
            out.extend(n.outputs.iter().skip(carried).filter(|t| !t.is_empty()).cloned());
        }
        // A Scan runs once per slice of its scan inputs: their length is known from the run.
        "Scan" => out.extend(n.inputs.iter().filter(|t| !t.is_empty()).cloned()),
        _ => {}
    }
    out
}

/// A tensor's value: from the run, or an initializer of the model.
fn value<'a>(name: &str, model: &Model, values: &'a HashMap<String, Tensor>) -> Option<std::borrow::Cow<'a, Tensor>> {
    if let Some(t) = values.get(name) {
        return Some(std::borrow::Cow::Borrowed(t));
    }
    model
        .graph()
        .initializer
        .iter()
        .find(|t| t.name() == name)
        .and_then(|t| Tensor::from_proto(t).ok())
        .map(std::borrow::Cow::Owned)
}

fn scalar_bool(t: &Tensor) -> Option<bool> {
    match &t.data {
        TensorData::Bool(v) if v.len() == 1 => Some(v[0]),
        _ => None,
    }
}

fn scalar_i64(t: &Tensor) -> Option<i64> {
    match &t.data {
        TensorData::I64(v) if v.len() == 1 => Some(v[0]),
        TensorData::I32(v) if v.len() == 1 => Some(v[0] as i64),
        _ => None,
    }
}

fn body<'a>(model: &'a Model, n: &NodeInfo, name: &str) -> Option<&'a GraphProto> {
    model.graph().node.get(n.proto_index)?.attribute.iter().find(|a| a.name() == name)?.g.as_ref()
}

/// What the run did at `n`, or why it cannot be replaced.
fn decide(n: &NodeInfo, model: &Model, values: &HashMap<String, Tensor>) -> Result<Taken, String> {
    match n.op_type.as_str() {
        "If" => {
            let cond = n.inputs.first().ok_or("it has no condition")?;
            let t = value(cond, model, values)
                .ok_or_else(|| format!("its condition '{cond}' has no value in the reference run"))?;
            scalar_bool(&t).map(Taken::Branch).ok_or_else(|| format!("its condition '{cond}' is not one boolean"))
        }
        "Loop" => {
            let carried = n.inputs.len().saturating_sub(2);
            let body = body(model, n, "body").ok_or("it has no body")?;
            // The length of any scan output is the number of iterations made.
            if let Some(scan) = n.outputs.iter().skip(carried).find(|t| !t.is_empty()) {
                let t = values
                    .get(scan)
                    .ok_or_else(|| format!("its scan output '{scan}' has no value in the reference run"))?;
                return match t.shape.first() {
                    // No iteration: its scan outputs have no shape to unroll into. Left as it is, the
                    // rest of the model is still compared.
                    Some(0) => Err("it ran no iteration, so its scan outputs have no shape to unroll into".into()),
                    Some(&k) => Ok(Taken::Iterations(k)),
                    None => Err(format!("its scan output '{scan}' is a scalar")),
                };
            }
            let initial = match n.inputs.get(1).filter(|c| !c.is_empty()) {
                Some(c) => {
                    let t = value(c, model, values).ok_or_else(|| format!("its condition '{c}' has no value"))?;
                    scalar_bool(&t).ok_or("its condition is not one boolean")?
                }
                None => true,
            };
            if !initial {
                return Ok(Taken::Iterations(0));
            }
            let passthrough = body.output.first().map(|o| o.name()) == body.input.get(1).map(|i| i.name());
            if !passthrough {
                return Err("its body computes its own stop condition and it has no scan output that would tell how many iterations ran".into());
            }
            let m =
                n.inputs.first().filter(|m| !m.is_empty()).ok_or("it has neither a trip count nor a stop condition")?;
            let t = value(m, model, values).ok_or_else(|| format!("its trip count '{m}' has no value"))?;
            let trips = scalar_i64(&t).ok_or("its trip count is not one integer")?;
            usize::try_from(trips).map(Taken::Iterations).map_err(|_| format!("its trip count is {trips}"))
        }
        "Scan" => {
            let graph_node = model.graph().node.get(n.proto_index).ok_or("it is not in the model")?;
            let int = |name: &str| graph_node.attribute.iter().find(|a| a.name() == name);
            let scan_inputs = int("num_scan_inputs").and_then(|a| a.i).unwrap_or(0) as usize;
            if model.opset() < 9 {
                return Err("a Scan before opset 9 (with a batch axis) is not unrolled".into());
            }
            let states = n.inputs.len().checked_sub(scan_inputs).ok_or("it has fewer inputs than num_scan_inputs")?;
            let axes = int("scan_input_axes").map(|a| a.ints.clone()).unwrap_or_default();
            let out_axes = int("scan_output_axes").map(|a| a.ints.clone()).unwrap_or_default();
            if axes.iter().chain(&out_axes).any(|&a| a < 0) {
                return Err("it uses negative scan axes, which the unrolling does not resolve".into());
            }
            let first = n.inputs.get(states).ok_or("it has no scan input")?;
            let t = value(first, model, values)
                .ok_or_else(|| format!("its scan input '{first}' has no value in the reference run"))?;
            let axis = axes.first().copied().unwrap_or(0);
            let axis = usize::try_from(if axis < 0 { axis + t.shape.len() as i64 } else { axis })
                .map_err(|_| "its scan axis is out of range".to_string())?;
            match t.shape.get(axis) {
                Some(0) => Err("its scan axis is empty (no step to unroll)".into()),
                Some(&k) => Ok(Taken::Iterations(k)),
                None => Err("its scan axis is out of range".to_string()),
            }
        }
        other => Err(format!("{other} bodies are not unrolled: their tensors are not compared")),
    }
}
