//! Converting a float32 model to a strongly typed FP16 model with FP32 islands.
//!
//! TensorRT 11 takes precision from the model's types, so "keep this layer in FP32" is a model:
//! FP16 everywhere except the kept nodes, with a Cast wherever an FP16 and an FP32 region meet.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use bytes::Bytes;
use half::f16;

use crate::fp16;
use crate::layernorm::DecomposedLayerNorm;
use crate::onnx::{
    attribute_proto::AttributeType, tensor_proto::DataType, type_proto, AttributeProto, ModelProto, NodeProto,
    TensorProto,
};
use crate::weights::for_each_float_chunk;
use crate::{GraphIndex, Model, ModelError, Precision};

/// Ops that stay FP32 whatever the keep list says, and why (docs/fix.md lists them too).
pub const FP32_ONLY_OPS: &[(&str, &str)] = &[
    ("NonMaxSuppression", "its boxes and scores are float32 only in the ONNX spec"),
    ("RoiAlign", "box coordinates need float32 precision"),
    ("Range", "accumulates start + i*delta; FP16 loses integers above 2048"),
    ("CumSum", "a running sum loses precision in FP16"),
    ("RandomNormal", "its output type is set by an attribute"),
    ("RandomUniform", "its output type is set by an attribute"),
    ("RandomNormalLike", "its output type is set by an attribute"),
    ("RandomUniformLike", "its output type is set by an attribute"),
    ("Multinomial", "probabilities need float32"),
    ("Bernoulli", "probabilities need float32"),
    ("QuantizeLinear", "quantization scales are float32 by convention"),
    ("DequantizeLinear", "quantization scales are float32 by convention"),
    ("DynamicQuantizeLinear", "float32 only in the ONNX spec"),
    ("DynamicQuantizeLSTM", "quantized kernels take float32 scales"),
    ("MatMulInteger", "integer op with float32 scales around it"),
    ("ConvInteger", "integer op with float32 scales around it"),
];

/// The quantization ops among [`FP32_ONLY_OPS`]: float32 by every runtime's convention (TensorRT's
/// Q/DQ scales too), so the FP16/BF16 emulations keep them float32 as well: their scales are not
/// rounded, and a quantizer of a graph input reads it as fed.
pub const QUANTIZATION_OPS: &[&str] = &[
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "DynamicQuantizeLSTM",
    "MatMulInteger",
    "ConvInteger",
];

/// Ops that read a float input of any type without arithmetic on it: no Cast is needed in front.
const ANY_TYPE_READERS: &[&str] = &["Shape", "Size", "Cast"];

/// (op, input index) whose float input must stay float32 even in an FP16 node.
pub(crate) const FP32_INPUT_SLOTS: &[(&str, usize)] = &[("Resize", 2), ("Upsample", 1)];

/// How to convert.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Node names (as layerwise names them) to keep in FP32.
    pub keep_nodes: HashSet<String>,
    /// Op types to keep in FP32.
    pub keep_ops: HashSet<String>,
    /// Keep float graph inputs and outputs FP32 (Casts inside the model). Default true.
    pub keep_io_types: bool,
    /// Keep nodes that read a weight beyond the FP16 range in FP32. Default true (FP16 only:
    /// BF16 has float32's range).
    pub keep_overflowing_weight_consumers: bool,
    /// FP16 (the default) or BF16.
    pub target: Precision,
    /// Nodes to keep in FP32 because a runtime refused them in the target type, with why.
    pub refused: BTreeMap<String, String>,
    /// Weights beyond the FP16 range of the graphs around a body being converted, which the body
    /// may read from its outer scope: their readers there are kept FP32 as the outer graph's are.
    pub outer_overflowing: BTreeSet<String>,
    /// Weights already stored in the target type, by name (a converted file's): a weight that
    /// converts to the same bytes shares them instead of holding a second copy.
    pub stored: Option<std::sync::Arc<HashMap<String, TensorProto>>>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            keep_nodes: HashSet::new(),
            keep_ops: HashSet::new(),
            keep_io_types: true,
            keep_overflowing_weight_consumers: true,
            target: Precision::Fp16,
            refused: BTreeMap::new(),
            outer_overflowing: BTreeSet::new(),
            stored: None,
        }
    }
}

/// The result of a conversion.
#[derive(Debug, Clone)]
pub struct Conversion {
    pub proto: ModelProto,
    /// Nodes left in FP32 with the reason, in topological order.
    pub fp32_nodes: Vec<(String, String)>,
    pub fp16_nodes: usize,
    pub casts_inserted: usize,
    /// Float32 weights with values beyond the FP16 range, and their consumers kept FP32.
    pub overflowing_weights: Vec<(String, Vec<String>)>,
    /// The main graph's tensors stored in the target type (FP16 or BF16) in the converted model.
    pub reduced_tensors: HashSet<String>,
    /// Constant nodes the keep list named (with their readers), in every graph: refused by
    /// [`convert_fp16`], which returns them as its error.
    pub kept_constants: Vec<(String, Vec<String>)>,
}

/// The name part of a tensor or Cast a conversion makes (`x__to_fp16`).
fn suffix(precision: Precision) -> &'static str {
    match precision {
        Precision::Fp16 => "fp16",
        Precision::Bf16 => "bf16",
        Precision::Fp32 => "fp32",
    }
}

/// `values` stored in `target`, little-endian, appended to `raw`.
fn push_stored(target: Precision, values: &[f32], raw: &mut Vec<u8>) {
    match target {
        Precision::Fp16 => raw.extend(values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes())),
        Precision::Bf16 => raw.extend(values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())),
        Precision::Fp32 => raw.extend(values.iter().flat_map(|&v| v.to_le_bytes())),
    }
}

fn is_float_elem(v: &crate::onnx::ValueInfoProto) -> bool {
    matches!(&v.r#type.as_ref().and_then(|t| t.value.as_ref()), Some(type_proto::Value::TensorType(t)) if t.elem_type() == DataType::Float as i32)
}

fn set_elem_type(v: &mut crate::onnx::ValueInfoProto, dt: DataType) {
    if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) {
        t.elem_type = Some(dt as i32);
    }
}

/// [`to_low_tensor`], sharing `stored`'s bytes where they are what the conversion would store
/// (compared chunk by chunk as it converts: nothing is allocated for a weight that matches).
fn to_low_tensor_or_stored(
    model: &Model,
    t: &TensorProto,
    target: Precision,
    stored: Option<&TensorProto>,
) -> Result<TensorProto, ModelError> {
    let theirs = stored
        .filter(|s| s.data_type() == target.data_type() as i32 && s.dims == t.dims)
        .and_then(|s| s.raw_data.as_ref());
    if let Some(theirs) = theirs {
        let (mut at, mut equal, mut chunk) = (0usize, true, Vec::new());
        for_each_float_chunk(model, t, &mut |values| {
            if equal {
                chunk.clear();
                push_stored(target, values, &mut chunk);
                equal = theirs.get(at..at + chunk.len()) == Some(&chunk[..]);
                at += chunk.len();
            }
        })?;
        if equal && at == theirs.len() {
            return Ok(TensorProto {
                name: t.name.clone(),
                dims: t.dims.clone(),
                data_type: Some(target.data_type() as i32),
                raw_data: Some(theirs.clone()),
                doc_string: t.doc_string.clone(),
                ..Default::default()
            });
        }
    }
    to_low_tensor(model, t, target)
}

fn to_low_tensor(model: &Model, t: &TensorProto, target: Precision) -> Result<TensorProto, ModelError> {
    let mut raw: Vec<u8> = Vec::new();
    for_each_float_chunk(model, t, &mut |values| push_stored(target, values, &mut raw))?;
    Ok(TensorProto {
        name: t.name.clone(),
        dims: t.dims.clone(),
        data_type: Some(target.data_type() as i32),
        raw_data: Some(Bytes::from(raw)),
        doc_string: t.doc_string.clone(),
        ..Default::default()
    })
}

fn overflows_fp16(model: &Model, t: &TensorProto) -> Result<bool, ModelError> {
    let mut any = false;
    for_each_float_chunk(model, t, &mut |values| any |= values.iter().any(|&v| fp16::overflows(v)))?;
    Ok(any)
}

/// The set of float32 tensors of the main graph: `computed_float` (node outputs, as ONNX Runtime
/// reports them) plus float32 initializers, Constant outputs and graph inputs.
pub fn float_tensor_set(model: &Model, computed_float: &HashSet<String>) -> HashSet<String> {
    let g = model.graph();
    let mut set = computed_float.clone();
    set.extend(g.initializer.iter().filter(|t| t.data_type() == DataType::Float as i32).map(|t| t.name().to_string()));
    set.extend(g.input.iter().filter(|v| is_float_elem(v)).map(|v| v.name().to_string()));
    set
}

/// The error for a keep-list name no node has, with the name layerwise would accept where the user
/// likely meant a body's node: ONNX's attribute names (`If/then_branch/x`) for layerwise's
/// (`If/then/x`), or a body node's own name (as `trtexec` flags print it) without its If's path.
fn unknown_node_with_hint(graph: &crate::onnx::GraphProto, name: &str) -> ModelError {
    let renamed = name.replace("/then_branch/", "/then/").replace("/else_branch/", "/else/");
    let hint = if renamed != name {
        Some(("layerwise names an If's branches 'then' and 'else'".to_string(), renamed))
    } else {
        path_in_bodies(graph, name, "").map(|path| ("a node of that name is inside a body, named after its If's branch (`If/then/node`) or its Loop's iteration (`Loop/iter0/node`)".to_string(), path))
    };
    match hint {
        Some((why, suggestion)) => ModelError::UnknownNodeHint { name: name.to_string(), why, suggestion },
        None => ModelError::UnknownNode(name.to_string()),
    }
}

/// Where a node named `name` lies in the bodies of `graph`'s If and Loop nodes, as layerwise names
/// it (`If/then/name`, `Loop/iter0/name`, nested alike); the first found.
fn path_in_bodies(graph: &crate::onnx::GraphProto, name: &str, prefix: &str) -> Option<String> {
    for node in &graph.node {
        for a in &node.attribute {
            let part = match (node.op_type(), a.name()) {
                ("If", "then_branch") => "then",
                ("If", "else_branch") => "else",
                ("Loop", "body") => "iter0",
                _ => continue,
            };
            let Some(body) = a.g.as_ref() else { continue };
            let here = format!("{prefix}{}/{part}/", node.name());
            if body.node.iter().any(|n| n.name() == name) {
                return Some(format!("{here}{name}"));
            }
            if let Some(found) = path_in_bodies(body, name, &here) {
                return Some(found);
            }
        }
    }
    None
}

/// Converts `model` to FP16 with FP32 islands. `float` is [`float_tensor_set`]. A keep list that
/// names Constant nodes is refused, every one of every graph at once.
pub fn convert_fp16(
    model: &Model,
    index: &GraphIndex,
    float: &HashSet<String>,
    options: &ConvertOptions,
) -> Result<Conversion, ModelError> {
    let conversion = convert_graph(model, index, float, options)?;
    if !conversion.kept_constants.is_empty() {
        let mut constants = conversion.kept_constants;
        constants.sort();
        return Err(ModelError::KeptConstants(constants));
    }
    Ok(conversion)
}

/// [`convert_fp16`] for one graph (the model's, or a body as a model of its own), the Constants
/// its keep list names returned in the conversion.
fn convert_graph(
    model: &Model,
    index: &GraphIndex,
    float: &HashSet<String>,
    options: &ConvertOptions,
) -> Result<Conversion, ModelError> {
    let graph = model.graph();
    let target = options.target;
    let low = target;
    if target == Precision::Fp32 {
        return Err(ModelError::InvalidGraph(
            "nothing to convert to: float32 is the model's own precision; the target is FP16 or BF16".into(),
        ));
    }
    if target == Precision::Bf16 && model.opset() < 13 {
        return Err(ModelError::InvalidGraph(format!(
            "a BF16 model needs opset 13 or later (Cast and most ops take bfloat16 from there); this model is opset {}: convert it with onnx's version converter first, or use --cand sim:bf16, which emulates BF16 at any opset",
            model.opset()
        )));
    }
    let mut keep_names: Vec<&String> = options.keep_nodes.iter().collect();
    keep_names.sort();
    for name in keep_names {
        if index.node(name).is_none() && body_of(index, name).is_none() && !fp32_as_inlined(index, name) {
            return Err(unknown_node_with_hint(graph, name));
        }
    }
    // A Constant computes nothing and its value follows its readers (the weights' storage, below):
    // naming one changes nothing, and is said rather than ignored (found by the independent
    // testers, in a branch and in the main graph), every one at once.
    let kept_constants: Vec<(String, Vec<String>)> = index
        .nodes
        .iter()
        .filter(|n| n.op_type == "Constant" && options.keep_nodes.contains(&n.name))
        .map(|n| {
            let mut readers: Vec<String> = n
                .outputs
                .iter()
                .flat_map(|o| index.consumers(o).iter().map(|&c| index.nodes[c].name.clone()))
                .collect();
            // An If or Loop whose bodies read it from the outer scope reads it too.
            for holder in index.nodes.iter().filter(|h| h.has_subgraphs) {
                let refs = crate::graph::outer_refs_of(&graph.node[holder.proto_index]);
                if n.outputs.iter().any(|o| refs.contains(o)) {
                    readers.push(holder.name.clone());
                }
            }
            readers.sort();
            readers.dedup();
            (n.name.clone(), readers)
        })
        .collect();
    let mut kept_constants = kept_constants;
    // An op type no node has is a typo or another model's list: said, not ignored.
    let present = op_types(graph);
    let mut keep_ops: Vec<&String> = options.keep_ops.iter().collect();
    keep_ops.sort();
    if let Some(op) = keep_ops.into_iter().find(|op| !present.contains(op.as_str())) {
        let mut present: Vec<&str> = present.into_iter().collect();
        present.sort_unstable();
        return Err(ModelError::UnknownOpType { op: op.clone(), present: present.join(", ") });
    }
    // Weights beyond the FP16 range.
    let mut overflowing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in graph.initializer.iter().filter(|t| t.data_type() == DataType::Float as i32) {
        if target == Precision::Fp16 && overflows_fp16(model, t)? {
            overflowing.insert(t.name().to_string(), Vec::new());
        }
    }
    // A ConstantOfShape's `value` too: a mask filled with -3.4e38 (a T5 decoder's) is such a weight.
    for n in graph.node.iter().filter(|n| matches!(n.op_type(), "Constant" | "ConstantOfShape")) {
        let over = target == Precision::Fp16
            && n.attribute.iter().any(|a| match (a.name(), &a.t) {
                ("value", Some(t)) if t.data_type() == DataType::Float as i32 => {
                    overflows_fp16(model, t).unwrap_or(false)
                }
                ("value_float", _) => a.f.is_some_and(fp16::overflows),
                ("value_floats", _) => a.floats.iter().any(|&x| fp16::overflows(x)),
                _ => false,
            });
        if over {
            overflowing.insert(n.output[0].clone(), Vec::new());
        }
    }

    // The enclosing graphs' weights beyond the range that this body reads from its outer scope
    // (graph inputs of the body as converted): read inside an If branch, a weight was cast to
    // FP16 there and became inf.
    for name in options.outer_overflowing.iter().filter(|n| graph.input.iter().any(|v| v.name() == n.as_str())) {
        overflowing.entry(name.clone()).or_default();
    }
    // Precision of every node that touches a float tensor.
    let fp32_only: HashMap<&str, &str> = FP32_ONLY_OPS.iter().copied().collect();
    let mut precision: Vec<Option<Precision>> = vec![None; graph.node.len()];
    let mut fp32_nodes = Vec::new();
    for info in &index.nodes {
        if !has_precision(info, float) {
            continue;
        }
        let reason = if options.keep_nodes.contains(&info.name) {
            Some("--keep-fp32".to_string())
        } else if let Some(why) = options.refused.get(&info.name) {
            Some(why.clone())
        } else if options.keep_ops.contains(&info.op_type) {
            Some(format!("--keep-fp32-op {}", info.op_type))
        } else if let Some(why) = fp32_only.get(info.op_type.as_str()) {
            Some(format!("{} stays FP32: {why}", info.op_type))
        } else if info.op_type == "Cast" && info.inputs.first().is_some_and(|t| integer_sums(index, t)) {
            // A dynamically quantized model casts each int32 accumulator to float before its
            // scale: sums of int8 products reach beyond 65504 (a text-diacritics model's three
            // did, on every input), and ONNX Runtime fuses the pair in float32.
            Some("Cast of an integer accumulator (MatMulInteger/ConvInteger sums) stays FP32: its int32 sums reach beyond FP16's range".to_string())
        } else if info.op_type == "Mul"
            && info.inputs.iter().any(|t| {
                index
                    .producer(t)
                    .is_some_and(|c| c.op_type == "Cast" && c.inputs.first().is_some_and(|i| integer_sums(index, i)))
            })
        {
            // Its scale Mul too: the Cast's output stored in FP16 before it overflowed one node
            // later (a T5 decoder's cross-attention sums reached 87,580: 50 became inf). The
            // product is the layer's value, in range.
            Some("Mul scaling an integer accumulator stays FP32: it reads the accumulator's sums, beyond FP16's range; its product is stored in FP16".to_string())
        } else if info.op_type == "ConstantOfShape" && info.outputs.first().is_some_and(|o| overflowing.contains_key(o))
        {
            Some("ConstantOfShape stays FP32: its value is beyond the FP16 range".to_string())
        } else if !info.domain.is_empty() && info.domain != "ai.onnx" {
            Some(format!("custom-domain op ({}) with no known FP16 definition", info.domain))
        } else if info.has_subgraphs && !matches!(info.op_type.as_str(), "If" | "Loop") {
            Some(format!("{} bodies are not converted", info.op_type))
        } else if target == Precision::Bf16
            && !info.has_subgraphs
            && !ANY_TYPE_READERS.contains(&info.op_type.as_str())
            && !crate::cuda_bf16::has_cuda_bf16_kernel(&info.op_type, model.opset())
        {
            Some(format!(
                "{} has no BF16 kernel in ONNX Runtime's CUDA provider at opset {} (measured, onnxruntime-gpu 1.31.1)",
                info.op_type,
                model.opset()
            ))
        } else {
            info.inputs
                .iter()
                .find(|i| options.keep_overflowing_weight_consumers && overflowing.contains_key(*i))
                .map(|w| format!("reads weight '{w}', which is beyond the FP16 range"))
        };
        for w in &info.inputs {
            if let Some(readers) = overflowing.get_mut(w) {
                readers.push(info.name.clone());
            }
        }
        // An If or Loop keeps a float32 interface; its bodies are converted inside (below).
        let interface_fp32 = info.has_subgraphs;
        precision[info.proto_index] = Some(if reason.is_some() || interface_fp32 { Precision::Fp32 } else { low });
        if let Some(r) = reason {
            fp32_nodes.push((info.name.clone(), r));
        }
    }

    if model.opset() >= 17 {
        fp32_nodes.extend(layernorms_of_one_type(index, &mut precision, low, options.keep_io_types));
    }

    // The precision each float input slot needs (None: any type).
    let needs = |node: &NodeProto, p: Precision, slot: usize| -> Option<Precision> {
        if ANY_TYPE_READERS.contains(&node.op_type()) {
            return None;
        }
        if FP32_INPUT_SLOTS.contains(&(node.op_type(), slot)) {
            return Some(Precision::Fp32);
        }
        Some(p)
    };

    // Storage precision of each float tensor.
    let mut storage: HashMap<String, Precision> = HashMap::new();
    let graph_outputs: HashSet<&str> = graph.output.iter().map(|o| o.name()).collect();
    for v in graph.input.iter().filter(|v| float.contains(v.name()) && !index.is_initializer(v.name())) {
        storage.insert(v.name().to_string(), if options.keep_io_types { Precision::Fp32 } else { low });
    }
    // Weights (initializers, Constant outputs): FP16 when every float reader wants FP16.
    let weight_names: Vec<String> = graph
        .initializer
        .iter()
        .filter(|t| t.data_type() == DataType::Float as i32)
        .map(|t| t.name().to_string())
        .chain(
            graph
                .node
                .iter()
                .filter(|n| n.op_type() == "Constant" && float.contains(&n.output[0]))
                .map(|n| n.output[0].clone()),
        )
        .collect();
    for w in &weight_names {
        let mut wanted = Vec::new();
        for &c in index.consumers(w) {
            let info = &index.nodes[c];
            let node = &graph.node[info.proto_index];
            if let Some(p) = precision[info.proto_index] {
                for (slot, _) in node.input.iter().enumerate().filter(|(_, i)| *i == w) {
                    wanted.extend(needs(node, p, slot));
                }
            }
        }
        let all_fp16 = !wanted.is_empty() && wanted.iter().all(|p| *p == low) && !graph_outputs.contains(w.as_str());
        storage.insert(w.clone(), if all_fp16 { low } else { Precision::Fp32 });
    }
    for (i, node) in graph.node.iter().enumerate() {
        let Some(p) = precision[i] else { continue };
        // A node's float outputs are stored in its precision (an FP16 Cast to FLOAT is retargeted
        // to FLOAT16 below).
        for o in node.output.iter().filter(|o| float.contains(*o)) {
            storage.insert(o.clone(), p);
        }
    }

    // Rewrite.
    let mut out = model.proto.clone();
    let g = out.graph.as_mut().expect("graph");
    let stored = options.stored.as_deref();
    for t in g.initializer.iter_mut() {
        if storage.get(t.name()) == Some(&low) {
            *t = to_low_tensor_or_stored(model, t, target, stored.and_then(|s| s.get(t.name())))?;
        }
    }
    let mut casts: HashMap<(String, Precision), String> = HashMap::new();
    let mut new_nodes: Vec<NodeProto> = Vec::with_capacity(g.node.len() * 2);
    let mut casts_inserted = 0;
    let mut fp16_nodes = 0;
    let mut overflowing_in_bodies: Vec<(String, Vec<String>)> = Vec::new();
    let original_nodes = std::mem::take(&mut g.node);
    // Node names by position in the graph, looked up for each node below.
    let mut names: Vec<&str> = vec![""; original_nodes.len()];
    for n in &index.nodes {
        names[n.proto_index] = &n.name;
    }
    for (i, mut node) in original_nodes.into_iter().enumerate() {
        let is_constant = node.op_type() == "Constant";
        if is_constant && storage.get(&node.output[0]) == Some(&low) {
            convert_constant_attributes(model, &mut node, target)?;
        }
        if let Some(p) = precision[i] {
            if p == low {
                fp16_nodes += 1;
                retarget_low_attributes(model, &mut node, target)?;
            }
            for slot in 0..node.input.len() {
                let name = node.input[slot].clone();
                let Some(have) = storage.get(&name).copied() else { continue };
                let Some(want) = needs(&node, p, slot) else { continue };
                if have == want {
                    continue;
                }
                node.input[slot] = cast_to(&mut casts, &mut new_nodes, &mut casts_inserted, &name, want);
            }
        }
        // If/Loop bodies are converted as graphs of their own whose inputs and outputs stay
        // float32, so an outer tensor they read must reach them in float32.
        // An If or Loop kept in FP32 keeps its bodies FP32 whole (as the emulation leaves their
        // weights unrounded): keeping it means everything it computes.
        let name = names[i].to_string();
        let kept_whole = options.keep_nodes.contains(&name) || options.keep_ops.contains(node.op_type());
        if matches!(node.op_type(), "If" | "Loop") && !kept_whole {
            for attr in node.attribute.iter_mut() {
                let Some(prefix) =
                    crate::inline::body_prefixes(&name, node.op_type.as_deref().unwrap_or_default(), attr.name())
                else {
                    continue;
                };
                let Some(body) = attr.g.as_mut() else { continue };
                let body_options =
                    ConvertOptions { outer_overflowing: overflowing.keys().cloned().collect(), ..options.clone() };
                let inner = convert_body(model, body, &prefix, float, &body_options)?;
                fp16_nodes += inner.fp16_nodes;
                casts_inserted += inner.casts_inserted;
                fp32_nodes.extend(inner.fp32_nodes.into_iter().map(|(n, why)| (format!("{prefix}/{n}"), why)));
                kept_constants.extend(inner.kept_constants);
                for (w, readers) in inner.overflowing_weights {
                    let readers = readers.into_iter().map(|r| format!("{prefix}/{r}"));
                    match overflowing.get_mut(&w) {
                        // A weight of this graph (or one around it) read inside the body.
                        Some(outer) => outer.extend(readers),
                        None => overflowing_in_bodies.push((format!("{prefix}/{w}"), readers.collect())),
                    }
                }
            }
        }
        for name in crate::graph::outer_refs_of(&node) {
            if storage.get(&name) != Some(&low) {
                continue;
            }
            let cast_out = cast_to(&mut casts, &mut new_nodes, &mut casts_inserted, &name, Precision::Fp32);
            for attr in node.attribute.iter_mut() {
                for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()) {
                    crate::graph::rename_outer_ref(g, &name, &cast_out);
                }
            }
        }
        new_nodes.push(node);
    }
    // Graph outputs keep their declared type: an FP16 value gets a Cast back under its own name.
    let mut renames: Vec<(String, String)> = Vec::new();
    for o in g.output.iter_mut() {
        if !float.contains(o.name()) {
            continue;
        }
        let have = storage.get(o.name()).copied().unwrap_or(Precision::Fp32);
        let want = if options.keep_io_types { Precision::Fp32 } else { have };
        if have != want {
            // An output listed twice gets one Cast.
            if renames.iter().any(|(n, _)| n == o.name()) {
                continue;
            }
            let inner = format!("{}__{}", o.name(), suffix(have));
            renames.push((o.name().to_string(), inner));
        } else if have == low {
            set_elem_type(o, target.data_type());
        }
    }
    for (name, inner) in &renames {
        for node in new_nodes.iter_mut() {
            for t in node.input.iter_mut().chain(node.output.iter_mut()).filter(|t| *t == name) {
                *t = inner.clone();
            }
        }
        // Not `{name}/lw_to_fp32`: that is the Cast an If or Loop body that reads the output gets.
        new_nodes.push(cast_node(inner, name, DataType::Float, format!("{name}/lw_output_to_fp32")));
        casts_inserted += 1;
    }
    g.node = new_nodes;
    if !options.keep_io_types {
        for v in g.input.iter_mut().filter(|v| storage.get(v.name()) == Some(&low)) {
            set_elem_type(v, target.data_type());
        }
    }
    for v in g.value_info.iter_mut() {
        if let Some(p) = storage.get(v.name()) {
            if is_float_elem(v) || p == &low {
                set_elem_type(v, p.data_type());
            }
        }
    }
    let mut overflowing_weights: Vec<(String, Vec<String>)> = overflowing.into_iter().collect();
    overflowing_weights.extend(overflowing_in_bodies);
    // A renamed output's reduced value is its inner tensor; the output itself is the Cast's float32.
    let mut reduced_tensors: HashSet<String> = storage.into_iter().filter(|(_, p)| *p == low).map(|(t, _)| t).collect();
    for (name, inner) in &renames {
        if reduced_tensors.remove(name) {
            reduced_tensors.insert(inner.clone());
        }
    }
    Ok(Conversion {
        proto: out,
        fp32_nodes,
        fp16_nodes,
        casts_inserted,
        overflowing_weights,
        reduced_tensors,
        kept_constants,
    })
}

/// Whether the converter gives `info` a precision: it touches a float tensor and is no Constant
/// (whose value follows its readers).
fn has_precision(info: &crate::NodeInfo, float: &HashSet<String>) -> bool {
    info.op_type != "Constant" && info.inputs.iter().chain(&info.outputs).any(|t| float.contains(t))
}

/// From opset 17, ONNX Runtime's LayerNormFusion (1.31; every provider, every optimization level
/// but `disable`) fuses a decomposed LayerNorm with gamma and beta into one LayerNormalization
/// where its seven body nodes share one type and its Mul and Add share one type. It takes in a
/// Cast between the Div and the Mul, and the Cast that feeds the body where that Cast's only
/// readers are the ReduceMean and the Sub. The fused op's input, scale and output share one type,
/// so where the input it takes in and the Mul's type differ, ONNX Runtime refuses the model it has
/// just fused ("Type parameter (T) of Optype (LayerNormalization) bound to different types").
/// Such a LayerNorm, and the node producing its input where that is FP16, are made float32
/// together: the written model then loads with ONNX Runtime's defaults and computes the kept
/// nodes in float32. Other mixes (a Cast inside the body, or between the Mul and the Add) are
/// not fused, and load as they are. Repeated until no LayerNorm is left refused (making a
/// producer float32 can change the LayerNorm it belongs to). Where the input is a graph input
/// stored FP16 (`--fp16-io`) nothing can be widened: the load check says what ONNX Runtime does.
fn layernorms_of_one_type(
    index: &GraphIndex,
    precision: &mut [Option<Precision>],
    low: Precision,
    keep_io_types: bool,
) -> Vec<(String, String)> {
    let mut made_fp32 = Vec::new();
    let layernorms: Vec<(DecomposedLayerNorm, usize, usize)> = (0..index.nodes.len())
        .filter_map(|sub| DecomposedLayerNorm::at(index, sub))
        .filter_map(|ln| Some((ln, ln.scale?, ln.shift?)))
        .collect();
    let reason = "a LayerNorm whose fused LayerNormalization would mix FP16 and float32: ONNX Runtime (1.31, opset 17 on) fuses it across the island's Casts, then refuses the model";
    loop {
        let mut changed = false;
        for (ln, scale, shift) in &layernorms {
            let of = |n: usize| precision[index.nodes[n].proto_index];
            let body = [ln.mean, ln.sub, ln.square, ln.variance, ln.add_epsilon, ln.sqrt, ln.div];
            let (inside, affine) = (of(ln.mean), of(*scale));
            if inside.is_none() || affine.is_none() || body.iter().any(|&n| of(n) != inside) || of(*shift) != affine {
                continue;
            }
            let x = &index.nodes[ln.mean].inputs[0];
            let producer = index.producer_index(x);
            let stored = match producer {
                Some(q) => of(q),
                None if index.is_graph_input(x) && !index.is_initializer(x) => {
                    Some(if keep_io_types { Precision::Fp32 } else { low })
                }
                None => None,
            };
            let Some(stored) = stored else { continue };
            // The Cast to the body's type is shared by every reader of x at that type
            // (type-agnostic readers read x as stored); it is taken in when those are the
            // ReduceMean and the Subs alone.
            let taken_in = stored != inside.expect("checked")
                && index
                    .consumers(x)
                    .iter()
                    .copied()
                    .filter(|&c| of(c) == inside && !ANY_TYPE_READERS.contains(&index.nodes[c].op_type.as_str()))
                    .all(|c| {
                        c == ln.mean
                            || (index.nodes[c].op_type == "Sub"
                                && index.nodes[c].inputs.get(1) == index.nodes[ln.mean].outputs.first())
                    });
            let fused_input = if taken_in { Some(stored) } else { inside };
            if fused_input == affine {
                continue;
            }
            let widened = producer.filter(|&q| of(q) == Some(low));
            for n in body.into_iter().chain([*scale, *shift]).chain(widened) {
                let info = &index.nodes[n];
                if precision[info.proto_index] != Some(Precision::Fp32) {
                    precision[info.proto_index] = Some(Precision::Fp32);
                    made_fp32.push((info.name.clone(), reason.to_string()));
                    changed = true;
                }
            }
        }
        if !changed {
            return made_fp32;
        }
    }
}

/// The nodes [`convert_fp16`] makes float32 beyond `fp32` (the keep list and the converter's
/// other FP32 nodes) so that no decomposed LayerNorm is left with parts of two types, with the
/// reason: for an emulation to compute what the written model computes. `float` is the model's
/// float tensors ([`float_tensor_set`]).
pub fn layernorm_fp32_beyond(
    model: &Model,
    index: &GraphIndex,
    float: &HashSet<String>,
    fp32: &HashSet<&str>,
    target: Precision,
) -> Vec<(String, String)> {
    if model.opset() < 17 {
        return Vec::new();
    }
    let mut precision: Vec<Option<Precision>> = vec![None; model.graph().node.len()];
    for info in index.nodes.iter().filter(|n| has_precision(n, float)) {
        precision[info.proto_index] = Some(if fp32.contains(info.name.as_str()) { Precision::Fp32 } else { target });
    }
    layernorms_of_one_type(index, &mut precision, target, ConvertOptions::default().keep_io_types)
}

/// For a keep-list name inside a body (`Node/then/inner`, `Node/iter3/inner`, nested alike): the
/// control-flow node and the body prefix (`Node/then`, `Node/body`) it falls under.
fn body_of<'a>(index: &'a GraphIndex, name: &str) -> Option<(&'a crate::NodeInfo, String)> {
    index.nodes.iter().filter(|n| matches!(n.op_type.as_str(), "If" | "Loop")).find_map(|n| {
        let rest = name.strip_prefix(&n.name)?.strip_prefix('/')?;
        let (part, inner) = rest.split_once('/')?;
        let ok = match n.op_type.as_str() {
            "If" => part == "then" || part == "else",
            _ => {
                part == "body"
                    || part.strip_prefix("iter").is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
            }
        };
        (ok && !inner.is_empty()).then(|| (n, format!("{}/{}", n.name, if n.op_type == "If" { part } else { "body" })))
    })
}

/// Whether `name` is a node that the inlining of an If or the unrolling of a Loop or Scan made
/// (names a keep list found on the inlined model holds) and that is FP32 in the converted model
/// anyway: anything of a Scan, whose body is not converted (the Scan stays FP32), and the nodes
/// that hand a body's values over ([`crate::inline::made_by_inlining`]: `If/output0`,
/// `Loop/final0`, `Loop/scan1/unsqueeze2`), which the float32 interface of an If or Loop already
/// is (`fix` failed on them, on a Loop and on silero-vad's If).
fn fp32_as_inlined(index: &GraphIndex, name: &str) -> bool {
    let numbered = |part: &str, word: &str| {
        part.strip_prefix(word).is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
    };
    index.nodes.iter().filter(|n| matches!(n.op_type.as_str(), "If" | "Loop" | "Scan")).any(|n| {
        let Some(rest) = name.strip_prefix(&n.name).and_then(|r| r.strip_prefix('/')) else { return false };
        let part = rest.split('/').next().unwrap_or(rest);
        // A node hands over only outputs it has: `If/output7` of a one-output If is a typo.
        let has_output = part
            .trim_start_matches(|c: char| c.is_ascii_alphabetic())
            .parse::<usize>()
            .is_ok_and(|k| k < n.outputs.len());
        (crate::inline::made_by_inlining(&n.op_type, rest) && has_output)
            || (n.op_type == "Scan" && numbered(part, "iter"))
    })
}

/// Converts one If branch or Loop body in place, as a model of its own: its inputs and the outer
/// tensors it reads are float32 graph inputs, its outputs stay float32 (Casts inside), and inside
/// it the same rules and keep list apply. `prefix` is how its tensors and nodes are named once
/// inlined (`Node/then`), the names `float` and the keep list use.
fn convert_body(
    model: &Model,
    body: &mut crate::onnx::GraphProto,
    prefix: &str,
    float: &HashSet<String>,
    options: &ConvertOptions,
) -> Result<Conversion, ModelError> {
    use crate::onnx::ValueInfoProto;
    let outer = crate::graph::outer_refs_of_graph(body);
    let loop_owner = prefix.strip_suffix("/body");
    let local = |name: &str| -> Option<String> {
        if let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) {
            return Some(rest.to_string());
        }
        // A Loop's iterations share one body: keeping a node in one iteration keeps it in all.
        let owner = loop_owner?;
        let rest = name.strip_prefix(owner)?.strip_prefix("/iter")?;
        let (k, inner) = rest.split_once('/')?;
        (!k.is_empty() && k.bytes().all(|b| b.is_ascii_digit())).then(|| inner.to_string())
    };
    // Types: the body's own float tensors by their inlined names, its declared float inputs, and
    // the outer tensors that are float32 (they reach the body in float32).
    let mut local_float: HashSet<String> = float
        .iter()
        .filter_map(|t| t.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')).map(str::to_string))
        .collect();
    local_float.extend(body.input.iter().filter(|v| is_float_elem(v)).map(|v| v.name().to_string()));
    local_float.extend(
        body.initializer.iter().filter(|t| t.data_type() == DataType::Float as i32).map(|t| t.name().to_string()),
    );
    // (Names are relative at every level: a nested body's `float` is its enclosing body's.)
    local_float.extend(outer.iter().filter(|name| float.contains(*name)).cloned());
    let mut graph = body.clone();
    for name in &outer {
        let elem =
            if local_float.contains(name) { Some(crate::builder::tensor_type(DataType::Float, None)) } else { None };
        graph.input.push(ValueInfoProto { name: Some(name.clone()), r#type: elem, ..Default::default() });
    }
    let standalone = ModelProto { graph: Some(graph), ..model.proto.clone() };
    let standalone = model.derived(standalone, "body.onnx");
    let index = GraphIndex::build(standalone.graph())?;
    // Each body name with the keep-list name it came from (the first in order, where iterations
    // share one), so that a name the body lacks is refused as the user gave it.
    let mut keep_names: Vec<&String> = options.keep_nodes.iter().collect();
    keep_names.sort();
    let mut given_as: HashMap<String, String> = HashMap::new();
    for name in keep_names {
        if let Some(inner) = local(name) {
            given_as.entry(inner).or_insert_with(|| name.clone());
        }
    }
    let inner_options =
        ConvertOptions { keep_nodes: given_as.keys().cloned().collect(), keep_io_types: true, ..options.clone() };
    let given = |inner: String| given_as.get(&inner).cloned().unwrap_or(inner);
    let mut conversion = convert_graph(&standalone, &index, &local_float, &inner_options).map_err(|e| match e {
        ModelError::UnknownNode(inner) => {
            ModelError::UnknownBodyNode { name: given(inner.clone()), body: prefix.to_string(), inner }
        }
        ModelError::UnknownBodyNode { name, body, inner } => {
            ModelError::UnknownBodyNode { name: given(name), body: format!("{prefix}/{body}"), inner }
        }
        // A hint found inside the body names the body's nodes from there: the path to the body
        // goes in front (a Loop's body is named by its iteration).
        ModelError::UnknownNodeHint { name, why, suggestion } => {
            let path = loop_owner.map_or_else(|| prefix.to_string(), |owner| format!("{owner}/iter0"));
            ModelError::UnknownNodeHint { name: given(name), why, suggestion: format!("{path}/{suggestion}") }
        }
        other => other,
    })?;
    // The Constants named here, as the user named them; their readers in the same spelling
    // (`Loop/body/x` or `Loop/iterK/x`).
    conversion.kept_constants = std::mem::take(&mut conversion.kept_constants)
        .into_iter()
        .map(|(name, readers)| {
            let name = given(name);
            let path = match loop_owner {
                Some(owner) if !name.starts_with(&format!("{prefix}/")) => format!("{owner}/iter0"),
                _ => prefix.to_string(),
            };
            (name, readers.into_iter().map(|r| format!("{path}/{r}")).collect())
        })
        .collect();
    let mut converted = conversion.proto.graph.take().expect("graph");
    // The Casts the conversion added are named after what they cast (`x__to_fp16`), as the outer
    // graph's are: an outer tensor cast on both sides would be defined twice, which ONNX Runtime
    // refuses (openwakeword's hey_jarvis has such a tensor). They take the body's prefix.
    let mut existing: HashSet<String> = outer.iter().cloned().collect();
    existing.extend(body.input.iter().map(|v| v.name().to_string()));
    existing.extend(body.initializer.iter().map(|t| t.name().to_string()));
    crate::graph::collect_produced(body, &mut |o| {
        existing.insert(o.to_string());
    });
    let added: Vec<String> = converted
        .node
        .iter()
        .flat_map(|n| n.output.iter())
        .filter(|o| !o.is_empty() && !existing.contains(*o))
        .cloned()
        .collect();
    for name in added {
        let scoped = format!("{prefix}/{name}");
        for n in converted.node.iter_mut() {
            for t in n.input.iter_mut().chain(n.output.iter_mut()).filter(|t| **t == name) {
                *t = scoped.clone();
            }
            for attr in n.attribute.iter_mut() {
                for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()) {
                    crate::graph::rename_outer_ref(g, &name, &scoped);
                }
            }
        }
        for v in converted.value_info.iter_mut().filter(|v| v.name() == name) {
            v.name = Some(scoped.clone());
        }
    }
    body.node = converted.node;
    body.initializer = converted.initializer;
    body.value_info = converted.value_info;
    Ok(conversion)
}

/// The name of `name` cast to `want`: the Cast is added to `new_nodes` the first time, and shared
/// by every later reader.
fn cast_to(
    casts: &mut HashMap<(String, Precision), String>,
    new_nodes: &mut Vec<NodeProto>,
    inserted: &mut usize,
    name: &str,
    want: Precision,
) -> String {
    casts
        .entry((name.to_string(), want))
        .or_insert_with(|| {
            *inserted += 1;
            let out_name = format!("{name}__to_{}", suffix(want));
            new_nodes.push(cast_node(name, &out_name, want.data_type(), format!("{name}/lw_to_{}", suffix(want))));
            out_name
        })
        .clone()
}

fn cast_node(input: &str, output: &str, to: DataType, name: String) -> NodeProto {
    NodeProto {
        input: vec![input.to_string()],
        output: vec![output.to_string()],
        name: Some(name),
        op_type: Some("Cast".into()),
        attribute: vec![AttributeProto {
            name: Some("to".into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(to as i64),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn convert_constant_attributes(model: &Model, node: &mut NodeProto, target: Precision) -> Result<(), ModelError> {
    for a in node.attribute.iter_mut() {
        match a.name() {
            "value" => {
                if let Some(t) = a.t.as_mut().filter(|t| t.data_type() == DataType::Float as i32) {
                    *t = to_low_tensor(model, t, target)?;
                }
            }
            "value_float" => {
                let v = a.f.unwrap_or(0.0);
                *a = crate::builder::attr::tensor("value", low_scalar_tensor(&[v], &[], target));
            }
            "value_floats" => {
                let v = a.floats.clone();
                *a = crate::builder::attr::tensor("value", low_scalar_tensor(&v, &[v.len() as i64], target));
            }
            _ => {}
        }
    }
    Ok(())
}

fn low_scalar_tensor(values: &[f32], dims: &[i64], target: Precision) -> TensorProto {
    TensorProto {
        dims: dims.to_vec(),
        data_type: Some(target.data_type() as i32),
        raw_data: Some(Bytes::from({
            let mut raw = Vec::with_capacity(values.len() * 2);
            push_stored(target, values, &mut raw);
            raw
        })),
        ..Default::default()
    }
}

/// In an FP16 (BF16) node, attributes that name float32 as a type become float16 (bfloat16): a
/// Cast to FLOAT, a ConstantOfShape's value.
fn retarget_low_attributes(model: &Model, node: &mut NodeProto, target: Precision) -> Result<(), ModelError> {
    match node.op_type() {
        "Cast" => {
            for a in node.attribute.iter_mut().filter(|a| a.name() == "to") {
                if a.i == Some(DataType::Float as i64) {
                    a.i = Some(target.data_type() as i64);
                }
            }
        }
        "ConstantOfShape" => {
            match node.attribute.iter_mut().find(|a| a.name() == "value") {
                Some(a) => {
                    if let Some(t) = a.t.as_mut().filter(|t| t.data_type() == DataType::Float as i32) {
                        *t = to_low_tensor(model, t, target)?;
                    }
                }
                // The default value is a float32 zero.
                None => {
                    node.attribute.push(crate::builder::attr::tensor("value", low_scalar_tensor(&[0.0], &[1], target)))
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Structural check of a converted model, independent of how it was converted: types are
/// propagated from the graph inputs, initializers and Constants through the nodes (`float` lists
/// the tensors that are floating point in the original model), and every node whose floating
/// inputs mix FP16 and FP32 is reported, as is a graph output whose type differs from its
/// declaration. Returns the problems found (empty when the model is consistent).
pub fn check_float_types(proto: &ModelProto, float: &HashSet<String>) -> Vec<String> {
    let Some(g) = &proto.graph else { return vec!["no graph".into()] };
    let mut types: HashMap<String, i32> = HashMap::new();
    for t in &g.initializer {
        types.insert(t.name().to_string(), t.data_type());
    }
    for v in &g.input {
        if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            types.insert(v.name().to_string(), t.elem_type());
        }
    }
    let floaty =
        |dt: i32| dt == DataType::Float as i32 || dt == DataType::Float16 as i32 || dt == DataType::Bfloat16 as i32;
    let mut problems = Vec::new();
    let Ok(index) = GraphIndex::build(g) else { return vec!["the converted graph is not a valid DAG".into()] };
    for info in &index.nodes {
        let node = &g.node[info.proto_index];
        let op = node.op_type();
        let input_types: Vec<(usize, i32)> = node
            .input
            .iter()
            .enumerate()
            .filter_map(|(slot, i)| types.get(i).map(|&dt| (slot, dt)))
            .filter(|(slot, dt)| floaty(*dt) && !FP32_INPUT_SLOTS.contains(&(op, *slot)))
            .collect();
        let mixed = !ANY_TYPE_READERS.contains(&op)
            && input_types.iter().any(|(_, dt)| *dt == DataType::Float as i32)
            && input_types.iter().any(|(_, dt)| *dt == DataType::Float16 as i32 || *dt == DataType::Bfloat16 as i32);
        if mixed {
            problems.push(format!("node '{}' ({op}) mixes float16 and float32 inputs without a Cast", info.name));
        }
        let out_type = match op {
            "Cast" => node.attribute.iter().find(|a| a.name() == "to").and_then(|a| a.i).map(|v| v as i32),
            "Constant" => node.attribute.iter().find_map(|a| match a.name() {
                "value" => a.t.as_ref().map(|t| t.data_type()),
                "value_float" | "value_floats" => Some(DataType::Float as i32),
                _ => None,
            }),
            "ConstantOfShape" => Some(
                node.attribute
                    .iter()
                    .find(|a| a.name() == "value")
                    .and_then(|a| a.t.as_ref())
                    .map(|t| t.data_type())
                    .unwrap_or(DataType::Float as i32),
            ),
            _ => input_types.first().map(|(_, dt)| *dt),
        };
        for o in node.output.iter().filter(|o| !o.is_empty()) {
            let is_float = float.contains(o) || op == "Cast" || (op == "Constant" && out_type.is_some_and(floaty));
            if let (true, Some(dt)) = (is_float, out_type) {
                types.insert(o.clone(), dt);
            }
        }
    }
    for v in &g.output {
        if let (Some(type_proto::Value::TensorType(t)), Some(&dt)) =
            (v.r#type.as_ref().and_then(|t| t.value.as_ref()), types.get(v.name()))
        {
            if floaty(t.elem_type()) && t.elem_type() != dt {
                problems.push(format!(
                    "graph output '{}' is declared {} but computed as {}",
                    v.name(),
                    crate::data_type_name(t.elem_type()),
                    crate::data_type_name(dt)
                ));
            }
        }
    }
    problems
}

/// The op types of a graph's nodes and of every body inside them.
fn op_types(graph: &crate::onnx::GraphProto) -> HashSet<&str> {
    let mut out = HashSet::new();
    for n in &graph.node {
        out.insert(n.op_type());
        for a in &n.attribute {
            for g in a.g.iter().chain(&a.graphs) {
                out.extend(op_types(g));
            }
        }
    }
    out
}

/// Whether `tensor` holds the int32 sums of a MatMulInteger or ConvInteger (default domain).
fn integer_sums(index: &GraphIndex, tensor: &str) -> bool {
    index.producer(tensor).is_some_and(|p| {
        matches!(p.op_type.as_str(), "MatMulInteger" | "ConvInteger") && (p.domain.is_empty() || p.domain == "ai.onnx")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{f32_tensor, Dim, ModelBuilder};

    /// A weight that converts to the bytes a converted file stores shares that file's bytes (the
    /// same buffer, nothing allocated); one that converts to other bytes gets its own.
    #[test]
    fn a_weight_stored_alike_in_a_converted_file_shares_its_bytes() {
        let mut b = ModelBuilder::new("w", 17);
        b.input("x", DataType::Float, &[Dim::from(4)]);
        b.initializer(f32_tensor("w", &[4], &[1.0, 2.5, -3.0, 0.1]));
        b.node("Mul", "mul", &["x", "w"], &["y"], vec![]);
        b.output("y", DataType::Float);
        let model = Model::from_proto(b.build(), "w").unwrap();
        let w = &model.graph().initializer[0];
        let stored = to_low_tensor(&model, w, Precision::Fp16).unwrap();
        let shared = to_low_tensor_or_stored(&model, w, Precision::Fp16, Some(&stored)).unwrap();
        let (theirs, ours) = (stored.raw_data.as_ref().unwrap(), shared.raw_data.as_ref().unwrap());
        assert_eq!(theirs.as_ptr(), ours.as_ptr());
        let mut other = stored.clone();
        other.raw_data = Some(bytes::Bytes::from(vec![0u8; 8]));
        let own = to_low_tensor_or_stored(&model, w, Precision::Fp16, Some(&other)).unwrap();
        assert_eq!(own.raw_data, stored.raw_data);
        assert_ne!(own.raw_data.as_ref().unwrap().as_ptr(), other.raw_data.as_ref().unwrap().as_ptr());
    }
}
