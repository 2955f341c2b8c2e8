//! Model-local ONNX functions inlined into the main graph. A function call is one node to the
//! walk and hides the tensors inside it; ONNX Runtime inlines the calls itself when it optimizes,
//! under names of its own (`_inlfunc_HardSwish_HS_X`) that two programs of one model share, so
//! the two could not be computed in one paired graph. Inlined here, each call's nodes and tensors
//! are named after the calling node (`act1/HS_X`), are compared like any other, and both sides of
//! a paired run see the same plain graph.

use std::collections::HashMap;

use crate::onnx::{AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto};
use crate::ModelError;

/// Calls nested deeper than this are left as they are (a recursive function).
const MAX_DEPTH: usize = 16;

/// `proto` with every call of a model-local function in the main graph replaced by the function's
/// nodes, and the number of calls inlined; `None` where there is nothing to inline (no copy made).
/// Functions whose opset imports disagree with the model's are left as calls (their bodies mean
/// other operators there).
pub fn inline_functions(proto: &ModelProto) -> Result<Option<(ModelProto, usize)>, ModelError> {
    if proto.functions.is_empty() {
        return Ok(None);
    }
    let model_opsets: HashMap<String, i64> =
        proto.opset_import.iter().map(|o| (o.domain().to_string(), o.version())).collect();
    let agrees = |f: &FunctionProto| {
        f.opset_import.iter().all(|o| model_opsets.get(o.domain()).is_none_or(|&v| v == o.version()))
    };
    let functions: HashMap<(String, String), &FunctionProto> = proto
        .functions
        .iter()
        .filter(|f| agrees(f))
        .map(|f| ((f.domain().to_string(), f.name().to_string()), f))
        .collect();
    let mut out = proto.clone();
    let mut extra_opsets: Vec<crate::onnx::OperatorSetIdProto> = Vec::new();
    for f in functions.values() {
        for o in &f.opset_import {
            if !model_opsets.contains_key(o.domain()) && !extra_opsets.iter().any(|e| e.domain() == o.domain()) {
                extra_opsets.push(o.clone());
            }
        }
    }
    let graph = out.graph.as_mut().ok_or_else(|| ModelError::InvalidGraph("no graph".into()))?;
    let mut count = 0;
    let mut nodes = std::mem::take(&mut graph.node);
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::with_capacity(nodes.len());
        let mut inlined = 0;
        for (i, node) in nodes.into_iter().enumerate() {
            match functions.get(&(node.domain().to_string(), node.op_type().to_string())) {
                Some(f) => {
                    let prefix = if node.name().is_empty() {
                        format!("{}#{i}", node.op_type())
                    } else {
                        node.name().to_string()
                    };
                    match expand(&node, f, &prefix) {
                        Some(body) => {
                            next.extend(body);
                            inlined += 1;
                        }
                        None => next.push(node),
                    }
                }
                None => next.push(node),
            }
        }
        nodes = next;
        count += inlined;
        if inlined == 0 {
            break;
        }
    }
    graph.node = nodes;
    out.opset_import.extend(extra_opsets);
    // Functions no call uses any more go; the rest stay.
    let used: std::collections::HashSet<(String, String)> = used_calls(out.graph.as_ref().expect("graph"));
    out.functions.retain(|f| used.contains(&(f.domain().to_string(), f.name().to_string())));
    Ok((count > 0).then_some((out, count)))
}

fn used_calls(g: &GraphProto) -> std::collections::HashSet<(String, String)> {
    let mut used = std::collections::HashSet::new();
    for n in &g.node {
        used.insert((n.domain().to_string(), n.op_type().to_string()));
        for a in &n.attribute {
            for sub in a.g.iter().chain(a.graphs.iter()) {
                used.extend(used_calls(sub));
            }
        }
    }
    used
}

/// The nodes of one call of `f` by `call`, its tensors named `prefix/NAME` and its formal inputs
/// and outputs bound to the call's; `None` for a body holding control flow (left as a call).
fn expand(call: &NodeProto, f: &FunctionProto, prefix: &str) -> Option<Vec<NodeProto>> {
    let mut names: HashMap<&str, String> = HashMap::new();
    for (k, formal) in f.input.iter().enumerate() {
        names.insert(formal.as_str(), call.input.get(k).cloned().unwrap_or_default());
    }
    for (k, formal) in f.output.iter().enumerate() {
        names.insert(formal.as_str(), call.output.get(k).cloned().unwrap_or_default());
    }
    // The call's attributes by name, then the function's defaults.
    let mut attrs: HashMap<&str, &AttributeProto> = f.attribute_proto.iter().map(|a| (a.name(), a)).collect();
    for a in &call.attribute {
        attrs.insert(a.name(), a);
    }
    let rename = |n: &String| -> String {
        if n.is_empty() {
            return String::new();
        }
        names.get(n.as_str()).cloned().unwrap_or_else(|| format!("{prefix}/{n}"))
    };
    let mut out = Vec::with_capacity(f.node.len());
    for (i, inner) in f.node.iter().enumerate() {
        let mut n = inner.clone();
        n.name = Some(format!(
            "{prefix}/{}",
            if inner.name().is_empty() { format!("{}#{i}", inner.op_type()) } else { inner.name().to_string() }
        ));
        n.input = inner.input.iter().map(rename).collect();
        n.output = inner.output.iter().map(rename).collect();
        let mut resolved = Vec::with_capacity(inner.attribute.len());
        for a in &inner.attribute {
            match a.ref_attr_name.as_deref().filter(|r| !r.is_empty()) {
                // A reference to the call's attribute: its value under the inner name, or dropped
                // (the operator's own default) when the call gives none.
                Some(r) => {
                    if let Some(v) = attrs.get(r) {
                        let mut v = (*v).clone();
                        v.name = a.name.clone();
                        resolved.push(v);
                    }
                }
                None => {
                    if a.g.is_some() || !a.graphs.is_empty() {
                        return None;
                    }
                    resolved.push(a.clone());
                }
            }
        }
        n.attribute = resolved;
        out.push(n);
    }
    Some(out)
}
