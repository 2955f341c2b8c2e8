//! Extracting nodes of a model into a small model of their own, so that each can be run alone on
//! exact (reference) inputs: the local error of a node, free of the error its inputs carry.

use std::collections::{BTreeSet, HashSet};

use crate::builder::tensor_type;
use crate::onnx::{
    tensor_shape_proto, type_proto, GraphProto, ModelProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use crate::{DataType, GraphIndex, Model, ModelError};

/// The element type and shape of a tensor that becomes an input of the extracted model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorType {
    pub elem: DataType,
    pub dims: Vec<usize>,
}

/// One extracted group: its nodes and how its tensors are named in the extracted model.
#[derive(Debug, Clone)]
pub struct ExtractedGroup {
    /// The group's nodes (layerwise names), in topological order.
    pub nodes: Vec<String>,
    /// (input name in the extracted model, original tensor): the values to feed.
    pub inputs: Vec<(String, String)>,
    /// (output name in the extracted model, original tensor).
    pub outputs: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct Extraction {
    pub proto: ModelProto,
    pub groups: Vec<ExtractedGroup>,
}

/// Builds one model holding a private copy of each group of nodes, side by side. A group's inputs
/// that come from outside the group become graph inputs (typed by `types`), renamed per group so
/// that the groups stay independent; tensors computed from weights alone (Constant nodes, a
/// Reshape of an initializer) are extracted with the group instead, so a runtime still sees them
/// as constants. Initializers are shared. Every output of a group's nodes becomes a graph output.
/// Nodes with subgraphs (If, Loop, Scan) are refused: their bodies read outer tensors by name.
pub fn extract_groups(
    model: &Model,
    index: &GraphIndex,
    groups: &[Vec<String>],
    types: &dyn Fn(&str) -> Option<TensorType>,
) -> Result<Extraction, ModelError> {
    extract_groups_pulling(model, index, groups, types, &|t| index.is_constant_like(t))
}

/// [`extract_groups`], where `pull` says which computed inputs are computed inside the group (their
/// producers join it, and so on back) rather than fed as group inputs: a node run alone on a value
/// computed from weights (a rotary angle) reads that value as given where `pull` says no, and a
/// quantized model's node reads its input through its own QuantizeLinear/DequantizeLinear pair
/// where `pull` says yes.
pub fn extract_groups_pulling(
    model: &Model,
    index: &GraphIndex,
    groups: &[Vec<String>],
    types: &dyn Fn(&str) -> Option<TensorType>,
    pull: &dyn Fn(&str) -> bool,
) -> Result<Extraction, ModelError> {
    let graph = model.graph();
    let mut out_graph = GraphProto { name: Some(format!("{}-extracted", graph.name())), ..Default::default() };
    let mut used_initializers: BTreeSet<String> = BTreeSet::new();
    let mut extracted = Vec::new();
    for (g, names) in groups.iter().enumerate() {
        let mut members: BTreeSet<usize> = BTreeSet::new();
        for name in names {
            let node = index.node(name).ok_or_else(|| ModelError::UnknownNode(name.clone()))?;
            members.insert(node.topo_index);
        }
        // Pull in the weight-only computations the group reads.
        let mut stack: Vec<usize> = members.iter().copied().collect();
        while let Some(i) = stack.pop() {
            for input in index.nodes[i].inputs.iter().filter(|t| !t.is_empty()) {
                if let Some(p) = index.producer_index(input) {
                    if pull(input) && members.insert(p) {
                        stack.push(p);
                    }
                }
            }
        }
        let suffix = format!("__lw_g{g}");
        let produced: HashSet<&str> =
            members.iter().flat_map(|&i| index.nodes[i].outputs.iter().map(String::as_str)).collect();
        let rename = |t: &str| if t.is_empty() { String::new() } else { format!("{t}{suffix}") };
        let mut group = ExtractedGroup { nodes: Vec::new(), inputs: Vec::new(), outputs: Vec::new() };
        for &i in &members {
            let info = &index.nodes[i];
            if info.has_subgraphs {
                return Err(ModelError::InvalidGraph(format!(
                    "node '{}' ({}) has a subgraph and cannot be extracted on its own",
                    info.name, info.op_type
                )));
            }
            let mut node = graph.node[info.proto_index].clone();
            node.name = Some(format!("{}{suffix}", info.name));
            for input in node.input.iter_mut().filter(|t| !t.is_empty()) {
                if index.is_initializer(input) {
                    used_initializers.insert(input.clone());
                    continue;
                }
                let original = input.clone();
                *input = rename(&original);
                if !produced.contains(original.as_str()) && !group.inputs.iter().any(|(_, o)| *o == original) {
                    let ty = types(&original).ok_or_else(|| {
                        ModelError::InvalidGraph(format!(
                            "no type and shape known for '{original}', an input of node '{}'",
                            info.name
                        ))
                    })?;
                    out_graph.input.push(value_info(&rename(&original), &ty));
                    group.inputs.push((rename(&original), original));
                }
            }
            for output in node.output.iter_mut().filter(|t| !t.is_empty()) {
                let original = output.clone();
                *output = rename(&original);
                if !index.is_constant_like(&original) || names.contains(&info.name) {
                    out_graph.output.push(ValueInfoProto { name: Some(rename(&original)), ..Default::default() });
                    group.outputs.push((rename(&original), original));
                }
            }
            if names.contains(&info.name) {
                group.nodes.push(info.name.clone());
            }
            out_graph.node.push(node);
        }
        extracted.push(group);
    }
    out_graph.initializer =
        graph.initializer.iter().filter(|t| used_initializers.contains(t.name())).cloned().collect();
    let proto = ModelProto {
        ir_version: model.proto.ir_version,
        opset_import: model.proto.opset_import.clone(),
        producer_name: Some("layerwise-extract".into()),
        graph: Some(out_graph),
        ..Default::default()
    };
    Ok(Extraction { proto, groups: extracted })
}

fn value_info(name: &str, ty: &TensorType) -> ValueInfoProto {
    let mut t: TypeProto = tensor_type(ty.elem, None);
    if let Some(type_proto::Value::TensorType(tt)) = t.value.as_mut() {
        tt.shape = Some(TensorShapeProto {
            dim: ty
                .dims
                .iter()
                .map(|&d| tensor_shape_proto::Dimension {
                    value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
                    ..Default::default()
                })
                .collect(),
        });
    }
    ValueInfoProto { name: Some(name.to_string()), r#type: Some(t), ..Default::default() }
}
