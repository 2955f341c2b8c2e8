//! Which candidate tensor holds which reference tensor when the two models do not share names (an
//! FP16 model exported by another tool, an engine whose layers were renamed, two exporter
//! versions). Names first; for the rest, structure: nodes are paired forward from the shared graph
//! inputs by op type, domain and the pairing of their data inputs, looking through the nodes that
//! do not change a value's meaning (Identity, float Casts, Dropout, QuantizeLinear→DequantizeLinear)
//! and treating weights and folded constants as wildcards.

use std::collections::{HashMap, HashSet};

use crate::onnx::{tensor_proto::DataType, GraphProto, NodeProto};
use crate::GraphIndex;

/// How a pair was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MatchedBy {
    Name,
    Structure,
}

/// The candidate tensor that holds a reference tensor's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorPair {
    pub reference: String,
    pub candidate: String,
    pub by: MatchedBy,
}

#[derive(Debug, Clone, Default)]
pub struct Matching {
    /// One entry per matched reference tensor (computed by a main-graph node), in the reference's
    /// topological order.
    pub pairs: Vec<TensorPair>,
    /// Reference tensors with no candidate counterpart.
    pub unmatched_reference: Vec<String>,
    /// Candidate tensors no reference tensor was paired with (the candidate's own Casts and the
    /// like included).
    pub unmatched_candidate: Vec<String>,
}

/// Ops that pass a value on without changing what it means (a Cast between float types changes
/// its precision, which is what is being measured).
fn transparent(graph: &GraphProto, index: &GraphIndex, node: &NodeProto) -> bool {
    match node.op_type() {
        "Identity" | "Dropout" => true,
        "Cast" => node.attribute.iter().find(|a| a.name() == "to").and_then(|a| a.i).is_some_and(|to| {
            [DataType::Float, DataType::Float16, DataType::Bfloat16, DataType::Double].iter().any(|d| *d as i64 == to)
        }),
        // DequantizeLinear(QuantizeLinear(x)): x with quantization noise.
        "DequantizeLinear" => node
            .input
            .first()
            .and_then(|t| index.producer(t))
            .is_some_and(|p| graph.node[p.proto_index].op_type() == "QuantizeLinear"),
        _ => false,
    }
}

/// A graph seen through its transparent nodes.
struct View<'a> {
    graph: &'a GraphProto,
    index: &'a GraphIndex,
    /// Tensors seen as their own values although an Identity produces them (see `match_tensors`).
    cut: &'a HashSet<String>,
    /// Clamps (Relu, Clip with stored bounds) are seen through too: against a quantized
    /// candidate, whose quantizers may have taken them over (see `match_tensors`).
    through_clamps: bool,
}

/// Where a value is held clamped, and to what: `[lo, hi]`.
#[derive(Debug, Clone)]
struct Clamped {
    holder: String,
    lo: f32,
    hi: f32,
    /// Held by a quantizer (its DequantizeLinear's output), which clamps to the values it can
    /// represent, within `tolerance` (half its step).
    tolerance: Option<f32>,
}

/// An activation that clamps a value to `[lo, hi]` and does nothing else: a Relu, or a Clip
/// whose bounds the file stores (inputs from opset 11, from initializers or Constant nodes;
/// attributes before; an absent bound is none). A quantizer can take one over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clamp {
    pub lo: f32,
    pub hi: f32,
    /// A Relu (else a Clip).
    pub relu: bool,
}

impl Clamp {
    /// The clamp `node` (of `graph`, indexed by `index`) computes, if it is one.
    pub fn of(graph: &GraphProto, index: &GraphIndex, node: &crate::NodeInfo) -> Option<Clamp> {
        if !node.domain.is_empty() {
            return None;
        }
        let proto = graph.node.get(node.proto_index)?;
        match node.op_type.as_str() {
            "Relu" => Some(Clamp { lo: 0.0, hi: f32::INFINITY, relu: true }),
            "Clip" => {
                let attr = |name: &str| proto.attribute.iter().find(|a| a.name() == name).and_then(|a| a.f);
                let bound = |slot: usize, unbounded: f32| -> Option<f32> {
                    match proto.input.get(slot).filter(|t| !t.is_empty()) {
                        None => Some(unbounded),
                        Some(t) => {
                            let stored = index.stored_tensor(graph, t)?;
                            let value = crate::Tensor::from_proto(stored).ok()?;
                            let first = value.to_f32().first().copied();
                            first.filter(|_| value.len() == 1)
                        }
                    }
                };
                let lo = attr("min").map_or_else(|| bound(1, f32::NEG_INFINITY), Some)?;
                let hi = attr("max").map_or_else(|| bound(2, f32::INFINITY), Some)?;
                Some(Clamp { lo, hi, relu: false })
            }
            _ => None,
        }
    }

    /// The clamp as a node of a graph at `opset`, computing `output` from `input`; a Clip's
    /// bounds become `weights` under names from `names` (inputs from opset 11, attributes before).
    pub fn node(
        &self,
        name: String,
        input: &str,
        output: &str,
        opset: i64,
        names: &mut crate::FreshNames,
        weights: &mut Vec<crate::onnx::TensorProto>,
    ) -> NodeProto {
        let mut node = NodeProto {
            name: Some(name),
            op_type: Some(if self.relu { "Relu" } else { "Clip" }.to_string()),
            input: vec![input.to_string()],
            output: vec![output.to_string()],
            ..Default::default()
        };
        if self.relu {
            return node;
        }
        if opset < 11 {
            for (attr, v) in [("min", self.lo), ("max", self.hi)].into_iter().filter(|(_, v)| v.is_finite()) {
                node.attribute.push(crate::builder::attr::float(attr, v));
            }
            return node;
        }
        for (base, v) in [("clip_min", self.lo), ("clip_max", self.hi)] {
            if v.is_finite() {
                let bound = names.fresh(&format!("{output}_{base}"));
                weights.push(crate::builder::f32_tensor(&bound, &[], &[v]));
                node.input.push(bound);
            } else {
                node.input.push(String::new());
            }
        }
        while node.input.last().is_some_and(|i| i.is_empty()) {
            node.input.pop();
        }
        node
    }
}

impl View<'_> {
    fn is_transparent(&self, topo: usize) -> bool {
        (self.through_clamps && self.clamp_of(topo).is_some())
            || transparent(self.graph, self.index, &self.graph.node[self.index.nodes[topo].proto_index])
    }

    /// The range a Relu or a Clip with stored bounds clamps to.
    fn clamp_of(&self, topo: usize) -> Option<(f32, f32)> {
        Clamp::of(self.graph, self.index, &self.index.nodes[topo]).map(|c| (c.lo, c.hi))
    }

    /// The range `t` is clamped to, where a clamp seen through computes it.
    fn clamp(&self, t: &str) -> Option<(f32, f32)> {
        if !self.through_clamps {
            return None;
        }
        self.clamp_of(self.index.producer_index(t)?)
    }

    /// Where the candidate holds a value clamped: source tensor -> the tensors holding a clamp of
    /// it: an explicit Relu's or Clip's output, else the output of a DequantizeLinear of a
    /// per-tensor QuantizeLinear, which clamps to the values it can represent (ONNX Runtime's
    /// quantize_static removes a Relu or Clip after a Conv or Add and lets its quantizer clip).
    /// Explicit clamps come first.
    fn clamps(&self) -> HashMap<String, Vec<Clamped>> {
        let mut found: HashMap<String, Vec<Clamped>> = HashMap::new();
        for info in &self.index.nodes {
            let node = &self.graph.node[info.proto_index];
            let Some(input) = node.input.first().filter(|t| !t.is_empty()) else { continue };
            let Some(output) = node.output.first().filter(|t| !t.is_empty()) else { continue };
            if let Some((lo, hi)) = self.clamp_of(info.topo_index) {
                found
                    .entry(self.source(input))
                    .or_default()
                    .insert(0, Clamped { holder: output.clone(), lo, hi, tolerance: None });
            } else if info.op_type == "DequantizeLinear" {
                let Some(q) = self
                    .index
                    .producer(input)
                    .map(|q| &self.graph.node[q.proto_index])
                    .filter(|q| q.op_type() == "QuantizeLinear")
                else {
                    continue;
                };
                let Some(x) = q.input.first() else { continue };
                let Some(range) = crate::quant::quantizer_range(self.graph, self.index, q) else { continue };
                found.entry(self.source(x)).or_default().push(Clamped {
                    holder: output.clone(),
                    lo: range.lo,
                    hi: range.hi,
                    tolerance: Some(0.5 * range.scale.abs()),
                });
            }
        }
        found
    }

    /// The tensor whose value `t` carries: followed back through transparent nodes.
    fn source(&self, t: &str) -> String {
        let mut t = t.to_string();
        for _ in 0..64 {
            if self.cut.contains(&t) {
                break;
            }
            let Some(p) = self.index.producer_index(&t) else { break };
            if !self.is_transparent(p) {
                break;
            }
            let node = &self.index.nodes[p];
            let input = if node.op_type == "DequantizeLinear" {
                // Through the QuantizeLinear to its float input.
                node.inputs.first().and_then(|q| self.index.producer(q)).and_then(|q| q.inputs.first())
            } else {
                node.inputs.first()
            };
            // A transparent node without a data input (a malformed file) ends the walk.
            let Some(input) = input.filter(|i| !i.is_empty()) else { break };
            t = input.clone();
        }
        t
    }

    fn is_weight(&self, t: &str) -> bool {
        self.index.is_constant_like(t)
    }

    /// The node's inputs that carry data (not weights), by source.
    fn data_inputs(&self, topo: usize) -> Vec<String> {
        self.index.nodes[topo]
            .inputs
            .iter()
            .filter(|t| !t.is_empty() && !self.is_weight(t))
            .map(|t| self.source(t))
            .collect()
    }

    /// Shapes of the node's weight inputs (initializers only; other weights count as unknown).
    fn weight_shapes(&self, topo: usize) -> Vec<Option<Vec<i64>>> {
        self.index.nodes[topo]
            .inputs
            .iter()
            .filter(|t| !t.is_empty() && self.is_weight(t))
            .map(|t| self.graph.initializer.iter().find(|w| w.name() == t).map(|w| w.dims.clone()))
            .collect()
    }

    fn attributes(&self, topo: usize) -> Vec<(String, Vec<u8>)> {
        use prost::Message;
        let node = &self.graph.node[self.index.nodes[topo].proto_index];
        let mut attrs: Vec<(String, Vec<u8>)> = node
            .attribute
            .iter()
            .filter(|a| a.g.is_none() && a.graphs.is_empty())
            .map(|a| (a.name().to_string(), a.encode_to_vec()))
            .collect();
        attrs.sort();
        attrs
    }
}

/// Ops whose data inputs may come in either order.
const COMMUTATIVE: &[&str] = &["Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal"];

/// Pairs the computed tensors of the reference graph with those of the candidate graph. With
/// `structural` false, only by name. Tensors in `cut` are their own values on both sides, not
/// the value an Identity passes on: the outputs of an If or Loop that the two sides ran
/// differently (another branch, other iteration counts), flattened into Identities of different
/// tensors, must be compared as each side computed them.
pub fn match_tensors(
    reference: &GraphProto,
    ref_index: &GraphIndex,
    candidate: &GraphProto,
    cand_index: &GraphIndex,
    structural: bool,
    cut: &HashSet<String>,
) -> Matching {
    // Against a quantized candidate, clamps (Relu, Clip with stored bounds) are seen through on
    // both sides: its quantizers may have taken them over, and a reference clamp's output is then
    // paired with the tensor holding the candidate's clamp of the same value (`View::clamps`).
    let quantized = candidate.node.iter().any(|n| n.op_type() == "QuantizeLinear");
    let r = View { graph: reference, index: ref_index, cut, through_clamps: quantized };
    let c = View { graph: candidate, index: cand_index, cut, through_clamps: quantized };
    // Candidate source tensor -> reference source tensor.
    let mut c2r: HashMap<String, (String, MatchedBy)> = HashMap::new();
    let mut matched_ref: HashSet<String> = HashSet::new();
    let pair = |c2r: &mut HashMap<String, (String, MatchedBy)>,
                matched_ref: &mut HashSet<String>,
                cs: String,
                rs: String,
                by: MatchedBy| {
        if !c2r.contains_key(&cs) && matched_ref.insert(rs.clone()) {
            c2r.insert(cs, (rs, by));
        }
    };
    // Graph inputs are fed the same values on both sides.
    for t in ref_index.inputs.iter().filter(|t| cand_index.is_graph_input(t)) {
        pair(&mut c2r, &mut matched_ref, t.clone(), t.clone(), MatchedBy::Name);
    }
    // Names first: a tensor both sides compute under one name, by nodes of one op type.
    for info in ref_index.nodes.iter().filter(|n| !r.is_transparent(n.topo_index)) {
        for o in info.outputs.iter().filter(|o| !o.is_empty()) {
            if let Some(cp) = cand_index.producer(o) {
                if cp.op_type == info.op_type && !c.is_transparent(cp.topo_index) {
                    pair(&mut c2r, &mut matched_ref, o.clone(), o.clone(), MatchedBy::Name);
                }
            }
        }
    }
    if structural {
        // R nodes by (op, domain) not yet paired, in topological order.
        let mut open: HashMap<(String, String), Vec<usize>> = HashMap::new();
        let mut taken: HashSet<usize> = HashSet::new();
        for info in ref_index.nodes.iter().filter(|n| {
            !r.is_transparent(n.topo_index) && !r.is_weight(n.outputs.first().map(String::as_str).unwrap_or(""))
        }) {
            if info.outputs.iter().all(|o| o.is_empty() || matched_ref.contains(o)) {
                taken.insert(info.topo_index);
            }
            open.entry((info.op_type.clone(), info.domain.clone())).or_default().push(info.topo_index);
        }
        for info in cand_index.nodes.iter() {
            let topo = info.topo_index;
            if c.is_transparent(topo) || info.outputs.iter().all(|o| o.is_empty() || c2r.contains_key(o)) {
                continue;
            }
            let inputs = c.data_inputs(topo);
            if inputs.is_empty() {
                continue;
            }
            let Some(mapped): Option<Vec<String>> = inputs.iter().map(|t| c2r.get(t).map(|(r, _)| r.clone())).collect()
            else {
                continue;
            };
            let same_inputs = |rt: usize| -> bool {
                let mut theirs = r.data_inputs(rt);
                if theirs.len() != mapped.len() {
                    return false;
                }
                if COMMUTATIVE.contains(&info.op_type.as_str()) {
                    let mut mine = mapped.clone();
                    mine.sort();
                    theirs.sort();
                    return mine == theirs;
                }
                theirs == mapped
            };
            let Some(options) = open.get(&(info.op_type.clone(), info.domain.clone())) else { continue };
            let fits: Vec<usize> = options
                .iter()
                .copied()
                .filter(|rt| {
                    !taken.contains(rt) && ref_index.nodes[*rt].outputs.len() == info.outputs.len() && same_inputs(*rt)
                })
                .collect();
            // Among several, the one whose attributes, then weight shapes, agree.
            let attrs = c.attributes(topo);
            let shapes = c.weight_shapes(topo);
            let best = fits
                .iter()
                .copied()
                .max_by_key(|&rt| (r.attributes(rt) == attrs, r.weight_shapes(rt) == shapes, std::cmp::Reverse(rt)));
            let Some(rt) = best else { continue };
            taken.insert(rt);
            for (co, ro) in info.outputs.iter().zip(&ref_index.nodes[rt].outputs) {
                if !co.is_empty() && !ro.is_empty() {
                    let by = if co == ro { MatchedBy::Name } else { MatchedBy::Structure };
                    pair(&mut c2r, &mut matched_ref, co.clone(), ro.clone(), by);
                }
            }
            // The weights the two nodes read in the same slots are the same weights (Constant
            // outputs are computed tensors and compared too).
            for (ci, ri) in info.inputs.iter().zip(&ref_index.nodes[rt].inputs) {
                if !ci.is_empty() && !ri.is_empty() && c.is_weight(ci) && r.is_weight(ri) {
                    let (cs, rs) = (c.source(ci), r.source(ri));
                    let by = if cs == rs { MatchedBy::Name } else { MatchedBy::Structure };
                    pair(&mut c2r, &mut matched_ref, cs, rs, by);
                }
            }
        }
    }
    // Reference source -> candidate tensor, then every reference tensor through its source.
    let r2c: HashMap<&str, (&str, MatchedBy)> =
        c2r.iter().map(|(cs, (rs, by))| (rs.as_str(), (cs.as_str(), *by))).collect();
    let cand_clamps = if quantized { c.clamps() } else { HashMap::new() };
    let mut matching = Matching::default();
    let mut used: HashSet<String> = HashSet::new();
    for t in ref_index.computed_tensors() {
        if let Some((lo, hi)) = r.clamp(t) {
            // The same clamp of the value the candidate's twin holds, where the candidate computes
            // it: an explicit one with the same bounds, or a quantizer whose range lies within
            // them (half a step either way), so that quantizing the clamped value or the value
            // itself gives the same codes: the quantizer took the clamp over.
            let same = |c: &Clamped| match c.tolerance {
                None => c.lo == lo && c.hi == hi,
                Some(tol) => c.lo >= lo - tol && c.hi <= hi + tol,
            };
            let twin = r2c
                .get(r.source(t).as_str())
                .and_then(|(cs, by)| cand_clamps.get(*cs)?.iter().find(|c| same(c)).map(|c| (c.holder.clone(), *by)));
            match twin.filter(|(h, _)| cand_index.producer_index(h).is_some()) {
                Some((h, by)) => {
                    let by = if h == t { MatchedBy::Name } else { by.max(MatchedBy::Structure) };
                    matching.pairs.push(TensorPair { reference: t.to_string(), candidate: h.clone(), by });
                    used.insert(h);
                }
                None => matching.unmatched_reference.push(t.to_string()),
            }
            continue;
        }
        // A tensor both sides compute under its own name is its own pair, even through a Cast. A
        // model output always is: it is what the user gets, even where the two graphs reach it
        // differently (a candidate that took the other branch of an If, flattened).
        let output = ref_index.outputs.iter().any(|o| o == t) && cand_index.outputs.iter().any(|o| o == t);
        // One name is one value only where the ops computing it agree: a quantizer that took
        // over a Relu leaves the name on the Conv before it (ONNX Runtime's quantize_static).
        let (rs, cs) = (r.source(t), c.source(t));
        let same_op = |name: &str| match (ref_index.producer(name), cand_index.producer(name)) {
            (Some(a), Some(b)) => a.op_type == b.op_type && a.domain == b.domain,
            (a, b) => a.is_none() && b.is_none(),
        };
        if cand_index.producer_index(t).is_some()
            && (output || (rs == cs && same_op(&rs)) || r2c.get(rs.as_str()).is_some_and(|(cs2, _)| *cs2 == cs))
        {
            matching.pairs.push(TensorPair { reference: t.to_string(), candidate: t.to_string(), by: MatchedBy::Name });
            used.insert(t.to_string());
            continue;
        }
        // Only a tensor the candidate computes can be asked of its run (a graph input cannot).
        match r2c.get(r.source(t).as_str()).filter(|(cs, _)| cand_index.producer_index(cs).is_some()) {
            Some((cs, by)) => {
                matching.pairs.push(TensorPair { reference: t.to_string(), candidate: cs.to_string(), by: *by });
                used.insert(cs.to_string());
            }
            None => matching.unmatched_reference.push(t.to_string()),
        }
    }
    matching.unmatched_candidate =
        cand_index.computed_tensors().filter(|t| !used.contains(*t)).map(str::to_string).collect();
    matching
}
