//! What a Q/DQ model quantizes, read from its QuantizeLinear and DequantizeLinear nodes: the
//! formats (int8, uint8, int4, uint4, int16, uint16, float8 e4m3fn/e5m2), the granularity (per
//! tensor, per channel, per block), and whether activations are quantized or only weights. A
//! candidate of this kind computes in float32 between its quantizers: it is judged by the
//! quantizers' step, not as FP16.

use std::collections::{BTreeMap, HashMap};

use crate::onnx::{GraphProto, NodeProto, TensorProto};
use crate::{DataType, GraphIndex, Tensor};

/// One quantizer's storage format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuantFormat {
    Int4,
    Uint4,
    Int8,
    Uint8,
    Int16,
    Uint16,
    Float8E4M3,
    Float8E5M2,
}

impl QuantFormat {
    fn of(data_type: i32) -> Option<QuantFormat> {
        Some(match DataType::try_from(data_type).ok()? {
            DataType::Int4 => QuantFormat::Int4,
            DataType::Uint4 => QuantFormat::Uint4,
            DataType::Int8 => QuantFormat::Int8,
            DataType::Uint8 => QuantFormat::Uint8,
            DataType::Int16 => QuantFormat::Int16,
            DataType::Uint16 => QuantFormat::Uint16,
            DataType::Float8e4m3fn | DataType::Float8e4m3fnuz => QuantFormat::Float8E4M3,
            DataType::Float8e5m2 | DataType::Float8e5m2fnuz => QuantFormat::Float8E5M2,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Int4 => "int4",
            QuantFormat::Uint4 => "uint4",
            QuantFormat::Int8 => "int8",
            QuantFormat::Uint8 => "uint8",
            QuantFormat::Int16 => "int16",
            QuantFormat::Uint16 => "uint16",
            QuantFormat::Float8E4M3 => "float8 e4m3fn",
            QuantFormat::Float8E5M2 => "float8 e5m2",
        }
    }

    /// The family whose default tolerances apply (`INT8` for int8 and uint8, ...).
    pub fn family(self) -> crate::QuantFamily {
        match self {
            QuantFormat::Int4 | QuantFormat::Uint4 => crate::QuantFamily::Int4,
            QuantFormat::Int8 | QuantFormat::Uint8 => crate::QuantFamily::Int8,
            QuantFormat::Int16 | QuantFormat::Uint16 => crate::QuantFamily::Int16,
            QuantFormat::Float8E4M3 => crate::QuantFamily::Fp8E4M3,
            QuantFormat::Float8E5M2 => crate::QuantFamily::Fp8E5M2,
        }
    }

    /// How coarse the format is (larger is coarser): the relative size of one step, for
    /// choosing the family a model is judged by when it mixes formats.
    fn coarseness(self) -> f64 {
        match self {
            QuantFormat::Int4 | QuantFormat::Uint4 => 1.0 / 15.0,
            QuantFormat::Float8E5M2 => 0.25,
            QuantFormat::Float8E4M3 => 0.125,
            QuantFormat::Int8 | QuantFormat::Uint8 => 1.0 / 255.0,
            QuantFormat::Int16 | QuantFormat::Uint16 => 1.0 / 65535.0,
        }
    }
}

/// How finely one quantizer's scale is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Granularity {
    PerTensor,
    PerChannel,
    PerBlock,
}

impl Granularity {
    pub fn name(self) -> &'static str {
        match self {
            Granularity::PerTensor => "per tensor",
            Granularity::PerChannel => "per channel",
            Granularity::PerBlock => "per block",
        }
    }
}

/// The quantizers of a model: how many of each (format, granularity), for weights and for
/// activations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quantization {
    /// DequantizeLinear nodes reading a stored quantized weight.
    pub weights: BTreeMap<(QuantFormat, Granularity), usize>,
    /// QuantizeLinear nodes quantizing a computed tensor (an activation).
    pub activations: BTreeMap<(QuantFormat, Granularity), usize>,
    /// Nodes that compute on quantized values themselves ([`integer_ops`]), as (op type, node),
    /// in graph order: nothing in float stands for them.
    pub integer_ops: Vec<(String, String)>,
    /// Activation quantizers whose scale and zero point each run computes from the tensor's range
    /// (a DynamicQuantizeLinear's, as quantize_dynamic writes them).
    pub dynamic: usize,
}

/// The nodes of `graph` that compute on quantized values themselves, as (op type, node), in
/// graph order. A DynamicQuantizeLinear whose codes nothing reads only computes a range (the
/// scale and zero point of the QuantizeLinear [`crate::qdq_form`] puts beside it): not one.
pub fn integer_ops(graph: &GraphProto, index: &GraphIndex) -> Vec<(String, String)> {
    index
        .nodes
        .iter()
        .filter(|info| is_integer_op(&info.op_type))
        .filter(|info| {
            info.op_type != "DynamicQuantizeLinear"
                || info.outputs.first().is_some_and(|c| !index.consumers(c).is_empty() || index.outputs.contains(c))
        })
        .map(|info| (graph.node[info.proto_index].op_type().to_string(), info.name.clone()))
        .collect()
}

/// Whether `op` computes on quantized values itself (the QOperator format: QLinearConv,
/// QLinearMatMul, ...; dynamic quantization: DynamicQuantizeLinear, MatMulInteger, ConvInteger)
/// rather than in float between QuantizeLinear/DequantizeLinear pairs.
pub fn is_integer_op(op: &str) -> bool {
    op.starts_with("QLinear")
        || matches!(
            op,
            "ConvInteger"
                | "MatMulInteger"
                | "DynamicQuantizeLinear"
                | "MatMulIntegerToFloat"
                | "DynamicQuantizeMatMul"
                | "QGemm"
                | "QAttention"
        )
}

/// Whether `op` makes, reads or computes on a quantizer's codes (QuantizeLinear/DequantizeLinear,
/// and the ops [`is_integer_op`] names): what such an op outputs stands for floats on a
/// quantizer's grid, or carries what its float input held.
pub fn works_on_codes(op: &str) -> bool {
    crate::convert::QUANTIZATION_OPS.contains(&op) || is_integer_op(op)
}

impl Quantization {
    /// The coarsest format the model quantizes with: the one its error is judged by.
    pub fn coarsest(&self) -> Option<QuantFormat> {
        self.weights
            .keys()
            .chain(self.activations.keys())
            .map(|(f, _)| *f)
            .max_by(|a, b| a.coarseness().total_cmp(&b.coarseness()))
    }

    /// One line for people: "int8 Q/DQ: 12 activation quantizers (int8 per tensor), 5 weights
    /// (int8 per channel)".
    pub fn describe(&self) -> String {
        let list = |m: &BTreeMap<(QuantFormat, Granularity), usize>| {
            m.iter().map(|((f, g), n)| format!("{n} {} {}", f.name(), g.name())).collect::<Vec<_>>().join(", ")
        };
        let count = |m: &BTreeMap<(QuantFormat, Granularity), usize>| m.values().sum::<usize>();
        let mut parts = Vec::new();
        if !self.activations.is_empty() {
            let dynamic = match self.dynamic {
                0 => String::new(),
                n if n == count(&self.activations) => ", each dynamic: its scale from each run's range".to_string(),
                n => format!(", {n} of them dynamic: their scale from each run's range"),
            };
            parts.push(format!(
                "{} activation quantizers ({}{dynamic})",
                count(&self.activations),
                list(&self.activations)
            ));
        } else {
            parts.push("activations not quantized (weights only)".to_string());
        }
        if !self.weights.is_empty() {
            parts.push(format!("{} quantized weights ({})", count(&self.weights), list(&self.weights)));
        }
        if let Some((op, node)) = self.integer_ops.first() {
            let more = if self.integer_ops.len() > 1 {
                format!(" and {} more", self.integer_ops.len() - 1)
            } else {
                String::new()
            };
            parts.push(format!(
                "{} integer ops ({op} '{node}'{more}: the QOperator format, or dynamic quantization), which compute on integer values: their inside and their own output scales are not read, so what they do shows only at the float tensors after them; quantized again in the QDQ format, each op is seen",
                self.integer_ops.len()
            ));
        }
        parts.join("; ")
    }
}

/// The quantizers of `graph`; `None` where it has no QuantizeLinear or DequantizeLinear node.
pub fn quantization_of(graph: &GraphProto, index: &GraphIndex) -> Option<Quantization> {
    let stored = Stored::of(graph, index);
    let mut found = Quantization { integer_ops: integer_ops(graph, index), ..Default::default() };
    let mut any = !found.integer_ops.is_empty();
    for info in &index.nodes {
        let node = &graph.node[info.proto_index];
        let weight = node.input.first().and_then(|t| stored.get(t));
        match node.op_type() {
            "DequantizeLinear" if weight.is_some() => {
                any = true;
                if let Some(format) = weight.and_then(|w| QuantFormat::of(w.data_type())) {
                    *found.weights.entry((format, stored.granularity(node))).or_default() += 1;
                }
            }
            "DequantizeLinear" => any = true,
            "QuantizeLinear" if !node.input.first().is_some_and(|t| index.is_constant_like(t)) => {
                any = true;
                if let Some(format) = stored.quantized_type(node).and_then(QuantFormat::of) {
                    *found.activations.entry((format, stored.granularity(node))).or_default() += 1;
                }
                if stored.dynamic(node) {
                    found.dynamic += 1;
                }
            }
            "QuantizeLinear" => any = true,
            _ => {}
        }
    }
    any.then_some(found)
}

/// A graph's initializers by name, found once per pass over its quantizers rather than searched
/// for at each node (a model holds thousands of both).
struct Stored<'g> {
    graph: &'g GraphProto,
    index: &'g GraphIndex,
    by_name: HashMap<&'g str, &'g TensorProto>,
}

impl<'g> Stored<'g> {
    fn of(graph: &'g GraphProto, index: &'g GraphIndex) -> Stored<'g> {
        Stored { graph, index, by_name: graph.initializer.iter().map(|w| (w.name(), w)).collect() }
    }

    /// An initializer, else a Constant node's value.
    fn get(&self, t: &str) -> Option<&'g TensorProto> {
        self.by_name.get(t).copied().or_else(|| self.index.stored_tensor(self.graph, t))
    }

    /// A float32 initializer's values (`None` for another type or values it does not hold).
    fn floats(&self, t: &str) -> Option<Vec<f32>> {
        let w = self.get(t).filter(|w| w.data_type() == DataType::Float as i32)?;
        Tensor::from_proto(w).ok().map(|v| v.to_f32().into_owned())
    }

    /// The type a QuantizeLinear stores in: its zero point's, else its `output_dtype` attribute
    /// (opset 21), else uint8 (the default).
    fn quantized_type(&self, node: &NodeProto) -> Option<i32> {
        if let Some(zp) = node.input.get(2).filter(|t| !t.is_empty()) {
            if let Some(w) = self.get(zp) {
                return Some(w.data_type());
            }
            // A zero point from a Constant node: its value's type; from a DynamicQuantizeLinear:
            // uint8, the only type it makes.
            if self.dynamic(node) {
                return Some(DataType::Uint8 as i32);
            }
            let producer = self
                .index
                .producer(zp)
                .map(|p| &self.graph.node[p.proto_index])
                .filter(|n| n.op_type() == "Constant")?;
            return producer.attribute.iter().find_map(|a| a.t.as_ref()).map(|t| t.data_type());
        }
        let attr = node.attribute.iter().find(|a| a.name() == "output_dtype").and_then(|a| a.i).filter(|&i| i != 0);
        Some(attr.map_or(DataType::Uint8 as i32, |i| i as i32))
    }

    /// Whether a QuantizeLinear's scale is a DynamicQuantizeLinear's, computed by each run.
    fn dynamic(&self, node: &NodeProto) -> bool {
        node.input.get(1).and_then(|s| self.index.producer(s)).is_some_and(|p| p.op_type == "DynamicQuantizeLinear")
    }

    /// Per block where a `block_size` is given, per channel where the scale has more than one
    /// value, per tensor otherwise.
    fn granularity(&self, node: &NodeProto) -> Granularity {
        if node.attribute.iter().any(|a| a.name() == "block_size" && a.i.is_some_and(|b| b > 0)) {
            return Granularity::PerBlock;
        }
        match node.input.get(1).and_then(|s| self.get(s)).map(|s| s.dims.iter().product::<i64>()) {
            Some(n) if n > 1 => Granularity::PerChannel,
            _ => Granularity::PerTensor,
        }
    }
}

/// Whether a zero point is the least value of its type (int8 -128, uint8 0, int16 -32768,
/// uint16 0) in every channel: a quantizer's range then starts at 0, so it clips negative values
/// as a Relu does.
pub fn clips_at_zero(zp: &TensorProto) -> bool {
    let least = match DataType::try_from(zp.data_type()) {
        Ok(DataType::Int8) => -128.0,
        Ok(DataType::Uint8 | DataType::Uint16) => 0.0,
        Ok(DataType::Int16) => -32768.0,
        _ => return false,
    };
    Tensor::from_proto(zp).is_ok_and(|v| !v.to_f32().is_empty() && v.to_f32().iter().all(|&z| z == least))
}

/// One step of each of a Q/DQ candidate's quantizers, on the reference's tensors: what the noise
/// floor of a quantized candidate moves (docs/quantization.md).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuantizerSteps {
    /// Reference tensors a candidate quantizer reads, with its step (the largest of a
    /// per-channel quantizer's).
    pub activations: Vec<(String, Step)>,
    /// Reference weights the candidate stores quantized, with the step of each channel.
    pub weights: Vec<WeightSteps>,
    /// Quantizers whose reference tensor or weight was not found (another structure).
    pub not_found: usize,
    /// Dynamic activation quantizers (a DynamicQuantizeLinear's scale, from each run's range):
    /// no step is stored, so none is taken.
    pub dynamic: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WeightSteps {
    pub weight: String,
    /// One step per channel along `axis` (one value: per tensor); a float8 format's is relative.
    pub steps: Vec<Step>,
    pub axis: usize,
}

/// One quantizer step: absolute for the integer formats (the scale), relative to the value for
/// float8, whose step grows with the magnitude (e4m3fn: 2^-3 of it, e5m2: 2^-2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    Absolute(f32),
    Relative(f32),
}

impl QuantFormat {
    /// A quantizer's step in this format with scale `scale`.
    pub fn step(self, scale: f32) -> Step {
        match self {
            QuantFormat::Float8E4M3 => Step::Relative(0.125),
            QuantFormat::Float8E5M2 => Step::Relative(0.25),
            _ => Step::Absolute(scale.abs()),
        }
    }
}

/// The quantizers of `candidate` on `reference`'s tensors. `reference_of` names the reference
/// tensor a candidate tensor holds (the matching's pairs; graph inputs are their own). A stored
/// weight is found through the node that reads its DequantizeLinear: the reference node of the
/// same name reads the float weight in the same slot.
pub fn quantizer_steps(
    ref_index: &GraphIndex,
    candidate: &GraphProto,
    cand_index: &GraphIndex,
    reference_of: &dyn Fn(&str) -> Option<String>,
) -> QuantizerSteps {
    let stored = Stored::of(candidate, cand_index);
    let mut steps = QuantizerSteps::default();
    for info in &cand_index.nodes {
        let node = &candidate.node[info.proto_index];
        if info.op_type == "QuantizeLinear" && stored.dynamic(node) {
            steps.dynamic += 1;
            continue;
        }
        let Some(scale) = node.input.get(1).and_then(|s| stored.floats(s)).filter(|s| !s.is_empty()) else { continue };
        let input = node.input.first().cloned().unwrap_or_default();
        match info.op_type.as_str() {
            "QuantizeLinear" if !cand_index.is_constant_like(&input) => match reference_of(&input)
                .filter(|r| ref_index.producer_index(r).is_some() || ref_index.is_graph_input(r))
            {
                Some(r) => {
                    let format = stored.quantized_type(node).and_then(QuantFormat::of).unwrap_or(QuantFormat::Uint8);
                    steps.activations.push((r, format.step(scale.iter().fold(0f32, |m, s| m.max(s.abs())))));
                }
                None => steps.not_found += 1,
            },
            "DequantizeLinear" if cand_index.is_initializer(&input) => {
                let Some(output) = node.output.first() else { continue };
                let rank = stored.get(&input).map_or(0, |w| w.dims.len() as i64);
                let axis = node.attribute.iter().find(|a| a.name() == "axis").and_then(|a| a.i).unwrap_or(1);
                let axis = if axis < 0 { axis + rank } else { axis }.max(0) as usize;
                let mut found = false;
                for c in cand_index.consumers(output) {
                    let reader = &cand_index.nodes[*c];
                    let Some(slot) = reader.inputs.iter().position(|t| t == output) else { continue };
                    let Some(twin) = ref_index.node(&reader.name).filter(|n| n.op_type == reader.op_type) else {
                        continue;
                    };
                    let Some(weight) = twin.inputs.get(slot).filter(|w| ref_index.is_initializer(w)) else { continue };
                    if !steps.weights.iter().any(|w| &w.weight == weight) {
                        let format = stored
                            .get(&input)
                            .and_then(|w| QuantFormat::of(w.data_type()))
                            .unwrap_or(QuantFormat::Int8);
                        steps.weights.push(WeightSteps {
                            weight: weight.clone(),
                            steps: scale.iter().map(|s| format.step(*s)).collect(),
                            axis,
                        });
                    }
                    found = true;
                }
                if !found {
                    steps.not_found += 1;
                }
            }
            _ => {}
        }
    }
    steps
}

// Defined with the slices, which leave mask values out of a slice's range too.
pub use crate::slices::MASK_SENTINEL_MIN_ABS;

/// The values one activation quantizer can represent: `[lo, hi]` = `(qmin - zero point) * scale`
/// to `(qmax - zero point) * scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantizerRange {
    pub format: QuantFormat,
    pub scale: f32,
    pub zero_point: i32,
    pub lo: f32,
    pub hi: f32,
}

impl QuantFormat {
    /// The least and largest stored values (float8: the largest finite magnitude).
    fn limits(self) -> (f32, f32) {
        match self {
            QuantFormat::Int4 => (-8.0, 7.0),
            QuantFormat::Uint4 => (0.0, 15.0),
            QuantFormat::Int8 => (-128.0, 127.0),
            QuantFormat::Uint8 => (0.0, 255.0),
            QuantFormat::Int16 => (-32768.0, 32767.0),
            QuantFormat::Uint16 => (0.0, 65535.0),
            QuantFormat::Float8E4M3 => (-448.0, 448.0),
            QuantFormat::Float8E5M2 => (-57344.0, 57344.0),
        }
    }
}

/// One per-tensor activation quantizer of a candidate: its QuantizeLinear node, its range, the
/// reference tensor it quantizes (`None` where the reference has none by that value) and the
/// reference tensors its DequantizeLinear outputs hold.
#[derive(Debug, Clone)]
pub struct ActivationQuantizer {
    pub node: String,
    pub range: QuantizerRange,
    pub quantizes: Option<String>,
    pub holds: Vec<String>,
}

impl Stored<'_> {
    /// The values a per-tensor QuantizeLinear can represent (`None`: per channel or block, or
    /// parameters not stored).
    fn range(&self, node: &NodeProto) -> Option<QuantizerRange> {
        let s = node
            .input
            .get(1)
            .filter(|s| self.get(s).is_some_and(|w| w.dims.iter().product::<i64>() == 1))
            .and_then(|s| self.floats(s))
            .and_then(|v| v.first().copied())?;
        // Through Tensor::from_proto; the int32_data entry as written for the types it does not carry.
        let zero_point = |t: &str| -> Option<i32> {
            let w = self.get(t)?;
            Tensor::from_proto(w)
                .ok()
                .and_then(|v| v.to_f32().first().map(|&z| z as i32))
                .or(w.int32_data.first().copied())
        };
        let format = self.quantized_type(node).and_then(QuantFormat::of)?;
        let zp = node.input.get(2).filter(|t| !t.is_empty()).map_or(Some(0), |z| zero_point(z)).unwrap_or(0);
        let (qmin, qmax) = format.limits();
        Some(if matches!(format, QuantFormat::Float8E4M3 | QuantFormat::Float8E5M2) {
            QuantizerRange { format, scale: s, zero_point: 0, lo: qmin * s, hi: qmax * s }
        } else {
            QuantizerRange { format, scale: s, zero_point: zp, lo: (qmin - zp as f32) * s, hi: (qmax - zp as f32) * s }
        })
    }
}

/// The values the per-tensor QuantizeLinear `node` of `graph` can represent (`None`: per channel
/// or block, or parameters not stored in the file).
pub fn quantizer_range(graph: &GraphProto, index: &GraphIndex, node: &NodeProto) -> Option<QuantizerRange> {
    Stored::of(graph, index).range(node)
}

/// Every per-tensor activation quantizer of `candidate`, in graph order, with the reference
/// tensors it stands for (`reference_of`, the matching's pairs read backwards).
pub fn activation_quantizers(
    candidate: &GraphProto,
    cand_index: &GraphIndex,
    reference_of: &dyn Fn(&str) -> Option<String>,
) -> Vec<ActivationQuantizer> {
    let stored = Stored::of(candidate, cand_index);
    let mut quantizers = Vec::new();
    for info in cand_index.nodes.iter().filter(|n| n.op_type == "QuantizeLinear") {
        let node = &candidate.node[info.proto_index];
        let Some(x) = node.input.first() else { continue };
        if cand_index.is_constant_like(x) {
            continue;
        }
        let Some(range) = stored.range(node) else { continue };
        let mut holds = Vec::new();
        for out in &node.output {
            for c in cand_index
                .consumers(out)
                .iter()
                .map(|&c| &cand_index.nodes[c])
                .filter(|c| c.op_type == "DequantizeLinear")
            {
                holds.extend(c.outputs.first().and_then(|d| reference_of(d)));
            }
        }
        quantizers.push(ActivationQuantizer { node: info.name.clone(), range, quantizes: reference_of(x), holds });
    }
    quantizers
}

/// The range of each per-tensor activation quantizer of `candidate`, under the reference tensors
/// it holds: the one it quantizes and the one its DequantizeLinear's output holds
/// (`reference_of`, the matching's pairs read backwards).
pub fn activation_ranges(
    candidate: &GraphProto,
    cand_index: &GraphIndex,
    reference_of: &dyn Fn(&str) -> Option<String>,
) -> std::collections::HashMap<String, QuantizerRange> {
    let mut ranges = std::collections::HashMap::new();
    for q in activation_quantizers(candidate, cand_index, reference_of) {
        for t in q.quantizes.into_iter().chain(q.holds) {
            ranges.entry(t).or_insert(q.range);
        }
    }
    ranges
}

impl QuantFormat {
    fn is_float8(self) -> bool {
        matches!(self, QuantFormat::Float8E4M3 | QuantFormat::Float8E5M2)
    }
}

impl QuantizerRange {
    /// `x` through this quantizer: rounded to the nearest step (ties to even, as ONNX defines
    /// QuantizeLinear) and clamped to the range. Integer formats only (float8's step is relative).
    fn round_trip(&self, x: f32, scale: f32) -> f32 {
        self.round_trip_at(x, scale, self.zero_point)
    }

    /// [`Self::round_trip`] with another zero point.
    fn round_trip_at(&self, x: f32, scale: f32, zero_point: i32) -> f32 {
        (self.code_at(x, scale, zero_point) - zero_point as f32) * scale
    }

    /// The stored code of `x`: rounded (ties to even) and clamped to the format's limits.
    fn code_at(&self, x: f32, scale: f32, zero_point: i32) -> f32 {
        let (qmin, qmax) = self.format.limits();
        ((x / scale).round_ties_even() + zero_point as f32).clamp(qmin, qmax)
    }
}

/// An integer quantizer of one-sided values (none below 0, or none above) whose zero point
/// leaves half of its codes or more to values that never come: the step is that much coarser
/// than the range needs (a Relu's output quantized symmetrically, uint8 with zero point 128 on
/// values that are never negative).
#[derive(Debug, Clone, PartialEq)]
pub struct ZeroPointShift {
    /// The lowest and highest code the values take, of the format's `levels` codes.
    pub codes: (i32, i32),
    pub levels: u32,
    /// A zero point at the format's end on the values' side, the end the range then has on that
    /// side (its present end, or the values' extreme where that lies beyond: the present end
    /// may clip them), and the step that gives.
    pub fit_zero_point: i32,
    pub fit_end: f32,
    pub fit_scale: f32,
    /// Relative L2 of the round trip with that zero point and step.
    pub fit_rel_l2: Option<f64>,
}

impl ZeroPointShift {
    /// The share of the codes that no value takes.
    pub fn unused(&self) -> f64 {
        1.0 - (self.codes.1 - self.codes.0 + 1) as f64 / self.levels as f64
    }
}

/// What one activation quantizer does to the reference's values of the tensor it holds, measured
/// by quantizing them with its scale and zero point: how many it clips and by how much, how many
/// it rounds to 0, and whether a few outliers set its step.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizerEffect {
    pub count: usize,
    /// Values beyond the range (clipped to its end), and by how much (largest, mean over those).
    pub clipped: usize,
    pub max_overshoot: f32,
    pub mean_overshoot: f32,
    /// Values that are not 0 in the reference and that the quantizer rounds to exactly 0 (integer
    /// formats: |x| below half a step around the zero point).
    pub to_zero: usize,
    /// Relative L2 error of the quantized values against the reference's, over the tensor;
    /// `None` for float8, whose rounding is not emulated here.
    pub rel_l2: Option<f64>,
    /// The largest |x|.
    pub max_abs: f32,
    /// Where one channel (axis 1) holds the largest value: that channel and the largest |x| of
    /// every other channel.
    pub outlier_channel: Option<(usize, f32)>,
    /// The bulk of the values: every channel but the outlier one where one channel holds values
    /// `OUTLIER_RATIO` times the others', else the 99% of smallest |x|. Its bound and count.
    pub bulk: f32,
    pub bulk_count: usize,
    /// Relative L2 of the quantization error on the bulk with this quantizer's step, and with a
    /// step fit to the bulk (`bulk_scale`: the same range shrunk to reach it): what outliers cost.
    pub bulk_rel_l2: Option<f64>,
    pub bulk_rel_l2_fit: Option<f64>,
    pub bulk_scale: f32,
    /// The least and largest finite value (mask sentinels left out).
    pub min: f32,
    pub max: f32,
    /// The least non-zero |x| (0 when none), and how many non-zero values the quantizer rounds
    /// to less than half their magnitude, 0 included: a denominator's quotient then grows more
    /// than 2x, or becomes inf.
    pub min_nonzero_abs: f32,
    pub below_half: usize,
    /// Where the values are one-sided and the zero point leaves half the codes or more unused.
    pub zero_point_shift: Option<ZeroPointShift>,
    /// Where the tensor is a model output that a Concat joins from parts ([`part_loss`]): the part
    /// this quantizer's one step loses most of. Set by the caller, which knows the parts.
    pub worst_part: Option<PartLoss>,
}

/// What a per-tensor quantizer loses of the part it loses most of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartLoss {
    pub axis: usize,
    /// The part (by position), and its first index and size along `axis`.
    pub part: usize,
    pub first: usize,
    pub size: usize,
    /// Relative L2 of the round trip over that part's values.
    pub rel_l2: f64,
    /// max |x| of that part, and of the largest part.
    pub range: f64,
    pub largest_range: f64,
}

/// The part of `values` (of `shape`, cut into `sizes` along `axis`) whose values `range`'s round
/// trip loses most of (relative L2), with the parts' ranges; `None` for float8 (not emulated here)
/// or where the sizes do not tile the axis.
pub fn part_loss(
    range: &QuantizerRange,
    values: &[f32],
    shape: &[usize],
    axis: usize,
    sizes: &[usize],
) -> Option<PartLoss> {
    if range.format.is_float8() || !(range.scale > 0.0) {
        return None;
    }
    let parts = crate::slices::parts_along(shape, axis, sizes)?;
    let largest_range = parts.iter().map(|p| p.max_abs(values)).fold(0.0, f64::max);
    parts
        .iter()
        .enumerate()
        .filter_map(|(k, p)| {
            let (mut err, mut norm) = (0f64, 0f64);
            for x in p.values(values).into_iter().filter(|x| x.is_finite()) {
                err += ((range.round_trip(x, range.scale) - x) as f64).powi(2);
                norm += (x as f64).powi(2);
            }
            (norm > 0.0).then(|| PartLoss {
                axis,
                part: k,
                first: p.first,
                size: p.size,
                rel_l2: (err / norm).sqrt(),
                range: p.max_abs(values),
                largest_range,
            })
        })
        .max_by(|a, b| a.rel_l2.total_cmp(&b.rel_l2))
}

/// How many times the bulk of a tensor must be below its largest value (or one channel above
/// every other) for that value to be called an outlier that sets a quantizer's step.
pub const OUTLIER_RATIO: f64 = 10.0;

impl QuantizerEffect {
    /// Whether a few outliers set this quantizer's step: the bulk is `OUTLIER_RATIO` times below
    /// the largest value, and with this step it loses materially (relative L2 at least 5%) and at
    /// least 4x what a step fit to it would lose.
    pub fn step_forced_by_outliers(&self) -> bool {
        let (Some(bulk), Some(fit)) = (self.bulk_rel_l2, self.bulk_rel_l2_fit) else { return false };
        self.bulk > 0.0 && self.max_abs as f64 >= OUTLIER_RATIO * self.bulk as f64 && bulk >= 0.05 && bulk >= 4.0 * fit
    }

    /// One channel `OUTLIER_RATIO` times above every other: it and the others' largest |x|.
    pub fn dominant_channel(&self) -> Option<(usize, f32)> {
        self.outlier_channel.filter(|&(_, rest)| self.max_abs as f64 >= OUTLIER_RATIO * rest as f64)
    }
}

/// The effect of the quantizer `range` on `values` (the reference tensor it holds, of `shape`).
pub fn quantizer_effect(range: &QuantizerRange, values: &[f32], shape: &[usize]) -> QuantizerEffect {
    let finite: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let (mut clipped, mut overshoot_sum, mut max_overshoot) = (0usize, 0f64, 0f32);
    // A value within half a step beyond an end rounds to that end anyway: only what lies further
    // out is clipped (a SiLU's -0.278 under a quantizer of step
    // 0.61 with zero point -128 was counted as clipped, though it rounds to 0 either way).
    let slack = if range.format.is_float8() { 0.0 } else { range.scale / 2.0 };
    for &x in &finite {
        let beyond = (x - range.hi).max(range.lo - x);
        if beyond > slack {
            clipped += 1;
            overshoot_sum += beyond as f64;
            max_overshoot = max_overshoot.max(beyond);
        }
    }
    let max_abs = finite.iter().fold(0f32, |m, v| m.max(v.abs()));
    let outlier_channel = outlier_channel(values, shape);
    // The bulk: the other channels where one dominates, else the 99% of smallest |x|.
    let bulk = match outlier_channel {
        Some((_, rest)) if max_abs as f64 >= OUTLIER_RATIO * rest as f64 => rest,
        _ => {
            // A mask value (-3.4e38 where attention must not look) sets the step as an outlier
            // does, and is no part of the bulk even where it fills more than 1% of the tensor.
            let mut magnitudes: Vec<f32> =
                finite.iter().map(|v| v.abs()).filter(|&m| (m as f64) < MASK_SENTINEL_MIN_ABS).collect();
            magnitudes.sort_unstable_by(f32::total_cmp);
            magnitudes.get(((magnitudes.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0.0)
        }
    };
    // Relative L2 of the round trip over the values with |x| <= `bound`, with step `scale`.
    let rel_l2 = |scale: f32, bound: f32| -> Option<f64> {
        if range.format.is_float8() || !(scale > 0.0) {
            return None;
        }
        let (mut err, mut norm) = (0f64, 0f64);
        for &x in finite.iter().filter(|x| x.abs() <= bound) {
            err += ((range.round_trip(x, scale) - x) as f64).powi(2);
            norm += (x as f64).powi(2);
        }
        (norm > 0.0).then(|| (err / norm).sqrt())
    };
    let reach = range.hi.abs().max(range.lo.abs());
    let bulk_scale = if reach > 0.0 { range.scale * bulk / reach } else { range.scale };
    let to_zero = if range.format.is_float8() {
        0
    } else {
        finite.iter().filter(|&&x| x != 0.0 && range.round_trip(x, range.scale) == 0.0).count()
    };
    let below_half = if range.format.is_float8() {
        0
    } else {
        finite.iter().filter(|&&x| x != 0.0 && range.round_trip(x, range.scale).abs() < x.abs() / 2.0).count()
    };
    let values_only = || finite.iter().copied().filter(|v| (v.abs() as f64) < MASK_SENTINEL_MIN_ABS);
    let (min, max) = values_only().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let min_nonzero_abs = values_only().map(f32::abs).filter(|&m| m > 0.0).fold(f32::INFINITY, f32::min);
    let values_rel_l2 = |scale: f32, zero_point: i32| {
        let (mut err, mut norm) = (0f64, 0f64);
        for x in values_only() {
            err += ((range.round_trip_at(x, scale, zero_point) - x) as f64).powi(2);
            norm += (x as f64).powi(2);
        }
        (norm > 0.0).then(|| (err / norm).sqrt())
    };
    // One-sided by nature, not by chance: enough values to tell (a scalar per sample is one-sided
    // whatever its zero point was calibrated for: the cause was once named on one), and a fitting zero point that at least halves the error (else it is no remedy).
    let zero_point_shift = (values_only().count() >= ZERO_POINT_MIN_VALUES)
        .then(|| zero_point_shift(range, min, max, &values_rel_l2))
        .flatten()
        .filter(|shift| match (shift.fit_rel_l2, values_rel_l2(range.scale, range.zero_point)) {
            (Some(fit), Some(now)) => fit <= 0.5 * now,
            _ => false,
        });
    QuantizerEffect {
        worst_part: None,
        count: values.len(),
        clipped,
        max_overshoot,
        mean_overshoot: if clipped > 0 { (overshoot_sum / clipped as f64) as f32 } else { 0.0 },
        to_zero,
        rel_l2: rel_l2(range.scale, f32::INFINITY),
        max_abs,
        outlier_channel,
        bulk,
        bulk_count: finite.iter().filter(|x| x.abs() <= bulk).count(),
        bulk_rel_l2: rel_l2(range.scale, bulk),
        bulk_rel_l2_fit: if bulk > 0.0 { rel_l2(bulk_scale, bulk) } else { None },
        bulk_scale,
        min: if min.is_finite() { min } else { 0.0 },
        max: if max.is_finite() { max } else { 0.0 },
        min_nonzero_abs: if min_nonzero_abs.is_finite() { min_nonzero_abs } else { 0.0 },
        below_half,
        zero_point_shift,
    }
}

/// Fewest values a quantizer's input must hold for its zero point to be judged against their side.
pub const ZERO_POINT_MIN_VALUES: usize = 16;

/// Values in `[min, max]` on one side of 0 (within half a step) whose codes under `range` span at
/// most half the format's: what a zero point at the format's end on their side would give
/// (`rel_l2` of a round trip with a scale and zero point); `None` otherwise.
fn zero_point_shift(
    range: &QuantizerRange,
    min: f32,
    max: f32,
    rel_l2: &dyn Fn(f32, i32) -> Option<f64>,
) -> Option<ZeroPointShift> {
    if range.format.is_float8() || !(range.scale > 0.0) || min > max {
        return None;
    }
    let (qmin, qmax) = range.format.limits();
    let half = range.scale / 2.0;
    // The end on the values' side stays where it is: what is left is the zero point's part.
    // The end on the values' side stays where it is, or moves out to the values' extreme where
    // the present end clips them (uint8 with zero point 128 on [0, 4.98] ends at 2.48: keeping it
    // would clip half the values, and the same step with zero point 0 errs 57x less).
    let (fit_zero_point, reach, fit_end) = if min >= -half && max > half {
        let end = range.hi.max(max);
        (qmin as i32, end, end)
    } else if max <= half && min < -half {
        let end = range.lo.min(min);
        (qmax as i32, -end, end)
    } else {
        return None;
    };
    // A zero point already at that end leaves codes unused by a scale too wide, not by itself.
    if fit_zero_point == range.zero_point {
        return None;
    }
    // A signed format's zero point 0 is symmetric quantization, a choice of the format (TensorRT
    // takes no other): on one-sided values it leaves half the codes unused by design, and no zero
    // point can be fitted where the deployment allows none.
    if qmin < 0.0 && range.zero_point == 0 {
        return None;
    }
    let codes = (
        range.code_at(min, range.scale, range.zero_point) as i32,
        range.code_at(max, range.scale, range.zero_point) as i32,
    );
    let levels = (qmax - qmin) as u32 + 1;
    if 2 * (codes.1 - codes.0 + 1) as u32 > levels {
        return None;
    }
    let fit_scale = reach / (qmax - qmin);
    Some(ZeroPointShift {
        codes,
        levels,
        fit_zero_point,
        fit_end,
        fit_scale,
        fit_rel_l2: rel_l2(fit_scale, fit_zero_point),
    })
}

/// The channel (axis 1 of a tensor of rank 2 or more) holding the largest |x|, and the largest
/// |x| of all the others; `None` for a tensor without channels.
fn outlier_channel(values: &[f32], shape: &[usize]) -> Option<(usize, f32)> {
    let channels = *shape.get(1).filter(|_| shape.len() >= 2)?;
    let inner: usize = shape[2..].iter().product();
    if channels < 2 || inner == 0 || values.len() != shape.iter().product::<usize>() {
        return None;
    }
    let mut per_channel = vec![0f32; channels];
    for (i, v) in values.iter().enumerate().filter(|(_, v)| v.is_finite()) {
        let c = (i / inner) % channels;
        per_channel[c] = per_channel[c].max(v.abs());
    }
    let top = (0..channels).max_by(|&a, &b| per_channel[a].total_cmp(&per_channel[b]))?;
    let rest = per_channel.iter().enumerate().filter(|(c, _)| *c != top).fold(0f32, |m, (_, v)| m.max(*v));
    Some((top, rest))
}

/// A weight the candidate stores quantized with one scale for the whole tensor, read channel by
/// channel along the output channels of the node that reads it: how unequal those channels are,
/// and what the one step does to the small ones.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightChannels {
    /// The reference's float weight.
    pub weight: String,
    pub format: QuantFormat,
    pub scale: f32,
    /// The output-channel axis of the node reading it (Conv 0, ConvTranspose 1, MatMul its last,
    /// Gemm 0 or 1 by transB).
    pub axis: usize,
    /// Per output channel: the reference's largest |w|, the largest stored |q - zero point| (in
    /// steps), and the relative L2 error of the stored channel against the reference's.
    pub channel_max: Vec<f32>,
    pub channel_steps: Vec<f32>,
    pub channel_rel_l2: Vec<f64>,
    /// The relative L2 error of the whole stored weight.
    pub rel_l2: f64,
}

/// How many times apart a per-tensor weight's output channels must be (largest max |w| over the
/// smallest non-zero one) to be called unequal.
pub const UNEQUAL_CHANNELS: f64 = 100.0;

impl WeightChannels {
    /// Channels `UNEQUAL_CHANNELS` times apart, some of them below 2 steps: the one scale the
    /// largest needs leaves the small ones a few levels, or none.
    pub fn unequal(&self) -> bool {
        let live = || self.channel_max.iter().copied().filter(|m| *m > 0.0);
        let (Some(small), Some(large)) = (live().min_by(f32::total_cmp), live().max_by(f32::total_cmp)) else {
            return false;
        };
        (large / small) as f64 >= UNEQUAL_CHANNELS && self.channel_max.iter().any(|&m| m < 2.0 * self.scale)
    }

    /// The step each channel would have with a scale of its own (its max |w| over the format's
    /// largest level): the floor's, where one scale is a fault the causes name.
    pub fn own_steps(&self) -> Vec<Step> {
        let (lo, hi) = self.format.limits();
        let top = (hi - lo) / 2.0;
        self.channel_max.iter().map(|m| Step::Absolute(m / top)).collect()
    }
}

/// Every weight `candidate` stores in an integer format with a single scale, under the name of
/// the reference's float weight it replaces (found as `quantizer_steps` finds it: the reference
/// node of the same name reads it in the same slot).
pub fn per_tensor_weights(
    reference: &GraphProto,
    ref_index: &GraphIndex,
    candidate: &GraphProto,
    cand_index: &GraphIndex,
) -> Vec<WeightChannels> {
    let stored = Stored::of(candidate, cand_index);
    let ref_stored = Stored::of(reference, ref_index);
    let mut found: Vec<WeightChannels> = Vec::new();
    for info in cand_index.nodes.iter().filter(|n| n.op_type == "DequantizeLinear") {
        let node = &candidate.node[info.proto_index];
        let (Some(input), Some(output)) = (node.input.first(), node.output.first()) else { continue };
        let Some(q) = stored.get(input) else { continue };
        let Some(format) = QuantFormat::of(q.data_type()).filter(|f| !f.is_float8()) else { continue };
        let Some(scale) = node.input.get(1).and_then(|s| stored.floats(s)).filter(|s| s.len() == 1).map(|s| s[0])
        else {
            continue;
        };
        let zero_point = node
            .input
            .get(2)
            .filter(|t| !t.is_empty())
            .and_then(|z| stored.get(z))
            .and_then(|z| Tensor::from_proto(z).ok())
            .and_then(|z| z.to_f32().first().copied())
            .unwrap_or(0.0);
        let Ok(levels) = Tensor::from_proto(q).map(|t| t.to_f32().into_owned()) else { continue };
        for c in cand_index.consumers(output) {
            let reader = &cand_index.nodes[*c];
            let Some(slot) = reader.inputs.iter().position(|t| t == output) else { continue };
            let Some(twin) = ref_index.node(&reader.name).filter(|n| n.op_type == reader.op_type) else { continue };
            let Some(weight) = twin.inputs.get(slot).filter(|w| ref_index.is_initializer(w)) else { continue };
            if found.iter().any(|w| &w.weight == weight) {
                continue;
            }
            let (Some(values), Some(proto)) = (ref_stored.floats(weight), ref_stored.get(weight)) else { continue };
            let dims: Vec<usize> = proto.dims.iter().map(|&d| d.max(0) as usize).collect();
            if values.len() != levels.len() || dims.iter().product::<usize>() != values.len() || dims.is_empty() {
                continue;
            }
            let rank = dims.len();
            let trans_b =
                || candidate.node[reader.proto_index].attribute.iter().any(|a| a.name() == "transB" && a.i == Some(1));
            let axis = match (reader.op_type.as_str(), slot) {
                ("Conv", 1) => 0,
                ("ConvTranspose", 1) if rank >= 2 => 1,
                ("MatMul", 1) if rank >= 2 => rank - 1,
                ("Gemm", 1) if rank == 2 => usize::from(!trans_b()),
                _ => continue,
            };
            let (channels, inner) = (dims[axis], dims[axis + 1..].iter().product::<usize>());
            let mut channel_max = vec![0f32; channels];
            let mut channel_steps = vec![0f32; channels];
            let (mut err, mut norm) = (vec![0f64; channels], vec![0f64; channels]);
            for (i, (&w, &l)) in values.iter().zip(&levels).enumerate() {
                let c = (i / inner.max(1)) % channels;
                channel_max[c] = channel_max[c].max(w.abs());
                channel_steps[c] = channel_steps[c].max((l - zero_point).abs());
                err[c] += (((l - zero_point) * scale - w) as f64).powi(2);
                norm[c] += (w as f64).powi(2);
            }
            let rel = |e: f64, n: f64| if n > 0.0 { (e / n).sqrt() } else { 0.0 };
            found.push(WeightChannels {
                weight: weight.clone(),
                format,
                scale,
                axis,
                channel_rel_l2: err.iter().zip(&norm).map(|(e, n)| rel(*e, *n)).collect(),
                rel_l2: rel(err.iter().sum(), norm.iter().sum()),
                channel_max,
                channel_steps,
            });
        }
    }
    found
}

/// What an int32 accumulator holds: sums beyond it wrap around (ONNX Runtime's CPU kernels for a
/// fused Q/DQ MatMul, measured: 140,000 products of 127 x 127 give -126,288.5 for 140,000).
pub const INT32_ACCUMULATOR: f64 = 2_147_483_648.0;

/// A MatMul, Gemm or Conv of a Q/DQ candidate that reads a quantized activation and a weight
/// stored in an integer format: an integer kernel computes it as sums of (a - zero point) x
/// (w - zero point) in an int32 accumulator.
#[derive(Debug, Clone, PartialEq)]
pub struct IntegerAccumulation {
    pub node: String,
    pub op: String,
    /// The stored weight and its format.
    pub weight: String,
    pub weight_format: QuantFormat,
    /// The activation's quantizer (per tensor).
    pub activation_format: QuantFormat,
    pub activation_zero_point: i32,
    /// Products per sum (a dot product's length).
    pub terms: usize,
    /// The output channel whose sum of |w - zero point| is largest, and that sum.
    pub channel: usize,
    pub weight_sum: f64,
}

impl IntegerAccumulation {
    /// The largest |a - zero point| the activation's format allows.
    pub fn widest_activation_code(&self) -> f64 {
        let (qmin, qmax) = self.activation_format.limits();
        (qmin as f64 - self.activation_zero_point as f64)
            .abs()
            .max((qmax as f64 - self.activation_zero_point as f64).abs())
    }
}

impl QuantizerRange {
    /// `x`'s distance from the zero point in codes, as this quantizer stores it (integer formats).
    pub fn code_offset(&self, x: f32) -> f32 {
        (self.code_at(x, self.scale, self.zero_point) - self.zero_point as f32).abs()
    }
}

/// Every MatMul, Gemm and Conv of `candidate` whose data input is a per-tensor integer activation
/// quantizer's DequantizeLinear and whose weight is a DequantizeLinear of a stored integer weight:
/// the largest sum of |w - zero point| over one output channel, which times the activation's
/// largest code bounds the int32 sums of an integer kernel.
pub fn integer_accumulations(candidate: &GraphProto, cand_index: &GraphIndex) -> Vec<IntegerAccumulation> {
    let stored = Stored::of(candidate, cand_index);
    let dequantized = |t: &str| {
        cand_index.producer(t).filter(|p| p.op_type == "DequantizeLinear").map(|p| &candidate.node[p.proto_index])
    };
    let zero_points = |node: &NodeProto| -> Vec<f32> {
        node.input
            .get(2)
            .filter(|t| !t.is_empty())
            .and_then(|z| stored.get(z))
            .and_then(|z| Tensor::from_proto(z).ok())
            .map(|z| z.to_f32().into_owned())
            .unwrap_or_else(|| vec![0.0])
    };
    let mut found = Vec::new();
    for info in cand_index.nodes.iter().filter(|n| matches!(n.op_type.as_str(), "MatMul" | "Gemm" | "Conv")) {
        let node = &candidate.node[info.proto_index];
        let (Some(a_dq), Some(w_dq)) =
            (node.input.first().and_then(|t| dequantized(t)), node.input.get(1).and_then(|t| dequantized(t)))
        else {
            continue;
        };
        // The activation: a DequantizeLinear of a QuantizeLinear of a computed tensor, per tensor.
        let Some(quantize) = a_dq
            .input
            .first()
            .and_then(|t| cand_index.producer(t))
            .filter(|p| p.op_type == "QuantizeLinear")
            .map(|p| &candidate.node[p.proto_index])
        else {
            continue;
        };
        let Some(activation_format) =
            stored.quantized_type(quantize).and_then(QuantFormat::of).filter(|f| !f.is_float8())
        else {
            continue;
        };
        let [activation_zero_point] = zero_points(quantize)[..] else { continue };
        let Some(w) = w_dq.input.first().and_then(|t| stored.get(t)) else { continue };
        let Some(weight_format) = QuantFormat::of(w.data_type()).filter(|f| !f.is_float8()) else { continue };
        let Ok(levels) = Tensor::from_proto(w).map(|t| t.to_f32().into_owned()) else { continue };
        let dims: Vec<usize> = w.dims.iter().map(|&d| d.max(0) as usize).collect();
        let rank = dims.len();
        let trans_b = node.attribute.iter().any(|a| a.name() == "transB" && a.i == Some(1));
        let axis = match info.op_type.as_str() {
            "Conv" if rank >= 2 => 0,
            "MatMul" if rank >= 2 => rank - 1,
            "Gemm" if rank == 2 => usize::from(!trans_b),
            _ => continue,
        };
        let (channels, inner) = (dims[axis], dims[axis + 1..].iter().product::<usize>());
        if channels == 0 || levels.len() != dims.iter().product::<usize>() {
            continue;
        }
        let zw = zero_points(w_dq);
        let mut sums = vec![0f64; channels];
        for (i, &l) in levels.iter().enumerate() {
            let c = (i / inner.max(1)) % channels;
            sums[c] += (l - zw.get(c).or(zw.first()).copied().unwrap_or(0.0)).abs() as f64;
        }
        let Some((channel, &weight_sum)) = sums.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)) else { continue };
        found.push(IntegerAccumulation {
            node: info.name.clone(),
            op: info.op_type.clone(),
            weight: w.name().to_string(),
            weight_format,
            activation_format,
            activation_zero_point: activation_zero_point as i32,
            terms: levels.len() / channels,
            channel,
            weight_sum,
        });
    }
    found
}

/// The fed input of [`switchable_quantizers`]' model: one boolean a quantizer.
pub const QUANTIZER_SWITCHES: &str = "layerwise_quantizer_switches";

/// The reference model with a candidate's activation quantizers emulated on the tensors they hold
/// (`quantizers`: reference tensor and the quantizer's range), each switched on by one element of
/// the fed boolean vector [`QUANTIZER_SWITCHES`] (in `quantizers`' order): all off computes the
/// reference, one on the reference with only that quantizer's rounding and clipping, all on every
/// activation quantizer with float weights. A quantizer is `(round(x / scale) + zero point)`
/// clamped to its format's limits, less the zero point, times the scale, in float32, as a Q/DQ
/// pair computes where ONNX Runtime does not fuse it. Integer formats only: the caller leaves
/// float8 out (its step is relative).
pub fn switchable_quantizers(
    reference: &crate::onnx::ModelProto,
    quantizers: &[(String, QuantizerRange)],
) -> Result<crate::onnx::ModelProto, crate::ModelError> {
    emulated_quantizers(reference, quantizers, true)
}

/// [`switchable_quantizers`] with every quantizer on and no switch: the model with all of them at
/// once. The switches cost ONNX Runtime's session build more than linearly in their count
/// (measured: 1,000 switched quantizers 15 s, none switched 0.9 s), so all of a large model's
/// quantizers together are built this way.
pub fn quantizers_on(
    reference: &crate::onnx::ModelProto,
    quantizers: &[(String, QuantizerRange)],
) -> Result<crate::onnx::ModelProto, crate::ModelError> {
    emulated_quantizers(reference, quantizers, false)
}

fn emulated_quantizers(
    reference: &crate::onnx::ModelProto,
    quantizers: &[(String, QuantizerRange)],
    switched: bool,
) -> Result<crate::onnx::ModelProto, crate::ModelError> {
    use crate::builder::{node, tensor_type, Dim};
    let mut proto = reference.clone();
    let graph = proto.graph.as_mut().ok_or_else(|| crate::ModelError::InvalidGraph("no graph".into()))?;
    let at: HashMap<&str, usize> = quantizers.iter().enumerate().map(|(i, (t, _))| (t.as_str(), i)).collect();
    let raw = |t: &str| format!("{t}__lw_unquantized");
    let mut initializers = Vec::new();
    // One scalar initializer a value, shared by every quantizer that uses it: ONNX Runtime's
    // session build is quadratic in the count of initializers (measured: 10,000 quantizers with
    // their own 114 s, sharing 12 s).
    let mut scalars: HashMap<u32, String> = HashMap::new();
    let mut scalar = |v: f32| -> String {
        scalars
            .entry(v.to_bits())
            .or_insert_with(|| {
                let name = format!("lw_quantizer_{:08x}", v.to_bits());
                initializers.push(Tensor::f32(vec![], vec![v]).to_proto(&name));
                name
            })
            .clone()
    };
    let mut indices = Vec::new();
    // The nodes that give `out` = switch i ? quantizer(input) : input.
    let mut chain = |i: usize, input: &str, out: &str| -> Vec<NodeProto> {
        let range = &quantizers[i].1;
        let (qmin, qmax) = range.format.limits();
        let (scale, zero_point, qmin, qmax) =
            (scalar(range.scale), scalar(range.zero_point as f32), scalar(qmin), scalar(qmax));
        let step = |what: &str| format!("{out}__lw_q{i}_{what}");
        let quantized = if switched { step("quantized") } else { out.to_string() };
        let mut nodes = vec![
            node("Div", &step("div_node"), &[input, &scale], &[&step("div")], vec![]),
            node("Round", &step("round_node"), &[&step("div")], &[&step("round")], vec![]),
            node("Add", &step("shift_node"), &[&step("round"), &zero_point], &[&step("shift")], vec![]),
            node("Max", &step("low_node"), &[&step("shift"), &qmin], &[&step("low")], vec![]),
            node("Min", &step("high_node"), &[&step("low"), &qmax], &[&step("high")], vec![]),
            node("Sub", &step("unshift_node"), &[&step("high"), &zero_point], &[&step("unshift")], vec![]),
            node("Mul", &step("scale_node"), &[&step("unshift"), &scale], &[&quantized], vec![]),
        ];
        if switched {
            indices.push(Tensor::new(vec![], crate::tensor::TensorData::I64(vec![i as i64])).to_proto(&step("index")));
            nodes.push(node(
                "Gather",
                &step("switch_node"),
                &[QUANTIZER_SWITCHES, &step("index")],
                &[&step("switch")],
                vec![],
            ));
            nodes.push(node("Where", &step("where_node"), &[&step("switch"), &quantized, input], &[out], vec![]));
        }
        nodes
    };
    let mut nodes = Vec::with_capacity(graph.node.len() + 9 * quantizers.len());
    // A graph input keeps its name (it is fed): its readers read the switched copy.
    let fed: Vec<String> =
        graph.input.iter().map(|v| v.name().to_string()).filter(|n| at.contains_key(n.as_str())).collect();
    let switched_input = |t: &str| format!("{t}__lw_switched");
    for t in &fed {
        nodes.extend(chain(at[t.as_str()], t, &switched_input(t)));
    }
    // A computed tensor keeps its name on the switch's output: its producer writes the raw value.
    for mut n in std::mem::take(&mut graph.node) {
        for input in n.input.iter_mut().filter(|t| fed.iter().any(|f| f == *t)) {
            *input = switched_input(input);
        }
        let mut after = Vec::new();
        for o in n.output.iter_mut() {
            if let Some(&i) = at.get(o.as_str()) {
                let t = o.clone();
                *o = raw(&t);
                after.extend(chain(i, &raw(&t), &t));
            }
        }
        nodes.push(n);
        nodes.extend(after);
    }
    graph.node = nodes;
    graph.initializer.extend(initializers);
    graph.initializer.extend(indices);
    if switched {
        graph.input.push(crate::onnx::ValueInfoProto {
            name: Some(QUANTIZER_SWITCHES.to_string()),
            r#type: Some(tensor_type(DataType::Bool, Some(&[Dim::Fixed(quantizers.len() as i64)]))),
            ..Default::default()
        });
    }
    Ok(proto)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{f32_tensor, Dim, ModelBuilder};

    fn int8(name: &str, dims: &[i64], values: &[i32]) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            dims: dims.to_vec(),
            data_type: Some(DataType::Int8 as i32),
            int32_data: values.to_vec(),
            ..Default::default()
        }
    }

    fn int8_range(scale: f32, zero_point: i32) -> QuantizerRange {
        QuantizerRange {
            format: QuantFormat::Int8,
            scale,
            zero_point,
            lo: (-128 - zero_point) as f32 * scale,
            hi: (127 - zero_point) as f32 * scale,
        }
    }

    /// A Relu's output quantized int8 with zero point 0 uses codes 0..127, half of 256: the zero
    /// point at -128 keeping the end at 127 steps halves the step. With zero point -128 already,
    /// or values on both sides, nothing is said.
    #[test]
    fn a_zero_point_that_leaves_half_the_codes_unused_is_found_with_the_step_that_fits() {
        let values: Vec<f32> = (0..=1000).map(|i| i as f32 / 1000.0).collect();
        // uint8 with its zero point in the middle: codes 128 to 255 hold [0, 1].
        let mid = QuantizerRange {
            format: QuantFormat::Uint8,
            scale: 1.0 / 127.0,
            zero_point: 128,
            lo: -128.0 / 127.0,
            hi: 1.0,
        };
        let shift =
            quantizer_effect(&mid, &values, &[1001]).zero_point_shift.expect("one-sided values, zero point 128");
        assert_eq!((shift.codes, shift.levels, shift.fit_zero_point), ((128, 255), 256, 0));
        assert!((shift.unused() - 0.5).abs() < 1e-12, "{shift:?}");
        assert!((shift.fit_scale - 1.0 / 255.0).abs() < 1e-9, "{shift:?}");
        assert!(shift.fit_rel_l2.unwrap() < 0.6 * quantizer_effect(&mid, &values, &[1001]).rel_l2.unwrap());
        assert_eq!(quantizer_effect(&int8_range(1.0 / 255.0, -128), &values, &[1001]).zero_point_shift, None);
        // Symmetric int8 (zero point 0, all TensorRT takes) leaves half its codes unused on
        // one-sided values by design: no zero point fault.
        assert_eq!(quantizer_effect(&int8_range(1.0 / 127.0, 0), &values, &[1001]).zero_point_shift, None);
        let both_sides: Vec<f32> = values.iter().map(|v| v - 0.5).collect();
        assert_eq!(quantizer_effect(&mid, &both_sides, &[1001]).zero_point_shift, None);
    }

    /// A zero point whose present end clips the values: the fitting range ends at the values'
    /// extreme, not at the clipping end (uint8 zero point 128 on [0, 2] with its end at 1: keeping
    /// that end kept the clipping, and the cause was dropped as no remedy; a tester measured the
    /// same step with zero point 0 erring 57x less).
    #[test]
    fn a_zero_point_whose_end_clips_is_fitted_to_the_values_extreme() {
        let mid = QuantizerRange {
            format: QuantFormat::Uint8,
            scale: 1.0 / 127.0,
            zero_point: 128,
            lo: -128.0 / 127.0,
            hi: 1.0,
        };
        let values: Vec<f32> = (0..=200).map(|i| i as f32 / 100.0).collect();
        let e = quantizer_effect(&mid, &values, &[201]);
        let shift = e.zero_point_shift.expect("one-sided values, clipped by the present end");
        assert_eq!((shift.fit_zero_point, shift.fit_end), (0, 2.0));
        assert!((shift.fit_scale - 2.0 / 255.0).abs() < 1e-9, "{shift:?}");
        assert!(shift.fit_rel_l2.unwrap() < 0.1 * e.rel_l2.unwrap(), "{shift:?} {:?}", e.rel_l2);
    }

    /// One value, or too few to tell a side, is no one-sided range (a scalar logit per sample was
    /// named with "100% of the codes never used"); nor is a zero point whose fitting one does not
    /// halve the error.
    #[test]
    fn a_zero_point_is_not_judged_on_a_scalar_or_where_fitting_it_gains_nothing() {
        let mid = QuantizerRange {
            format: QuantFormat::Uint8,
            scale: 1.0 / 127.0,
            zero_point: 128,
            lo: -128.0 / 127.0,
            hi: 1.0,
        };
        assert_eq!(quantizer_effect(&mid, &[0.5], &[1]).zero_point_shift, None);
        let few: Vec<f32> = (0..ZERO_POINT_MIN_VALUES - 1).map(|i| i as f32 / 16.0).collect();
        assert_eq!(quantizer_effect(&mid, &few, &[few.len()]).zero_point_shift, None);
        // Values that are multiples of the step: exact with either zero point, nothing to gain.
        let exact: Vec<f32> = (0..64).map(|i| i as f32 / 127.0).collect();
        assert_eq!(quantizer_effect(&mid, &exact, &[64]).zero_point_shift, None);
    }

    /// Values below half a step round to 0, those below 3/4 of a step to one step (more than half
    /// themselves), and the least non-zero |x| is kept: what a denominator's cause reads.
    #[test]
    fn values_rounded_to_0_or_below_half_themselves_are_counted() {
        let e = quantizer_effect(&int8_range(1.0, 0), &[0.0, 0.3, -0.4, 0.7, 1.6, 10.0], &[6]);
        assert_eq!((e.to_zero, e.below_half, e.min_nonzero_abs), (2, 2, 0.3));
        let e = quantizer_effect(&int8_range(1.0, 0), &[0.2, 1.4, 0.74], &[3]);
        // 1.4 -> 1 and 0.74 -> 1 keep more than half; 0.2 -> 0 does not.
        assert_eq!((e.to_zero, e.below_half), (1, 1));
    }

    /// x -> Q/DQ int8 -> MatMul with a weight [4, 2] stored int8: each sum runs over 4 products, and
    /// output channel 1's |w - zero point| add up to the most.
    #[test]
    fn an_integer_matmul_s_largest_weight_sum_is_read_per_output_channel() {
        let mut b = ModelBuilder::new("q", 17);
        b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
        b.initializer(int8("w_q", &[4, 2], &[1, -100, 2, 100, -3, 50, 4, -7]));
        b.initializer(f32_tensor("s", &[], &[0.1]));
        b.initializer(int8("z", &[], &[0]));
        b.node("QuantizeLinear", "x_q", &["x", "s", "z"], &["x_q8"], vec![]);
        b.node("DequantizeLinear", "x_dq", &["x_q8", "s", "z"], &["x_f"], vec![]);
        b.node("DequantizeLinear", "w_dq", &["w_q", "s", "z"], &["w_f"], vec![]);
        b.node("MatMul", "mm", &["x_f", "w_f"], &["y"], vec![]);
        b.output("y", DataType::Float);
        let proto = b.build();
        let graph = proto.graph.as_ref().unwrap();
        let found = integer_accumulations(graph, &GraphIndex::build(graph).unwrap());
        assert_eq!(found.len(), 1, "{found:?}");
        let acc = &found[0];
        assert_eq!((acc.node.as_str(), acc.terms, acc.channel, acc.weight_sum), ("mm", 4, 1, 257.0), "{acc:?}");
        assert_eq!(acc.widest_activation_code(), 128.0);
    }
}
