//! A Q/DQ model with chosen nodes kept unquantized: the counterfactual and `fix` of a
//! quantized candidate.
//!
//! What "kept unquantized" means (docs/quantization.md): a node's **input quantizers are its
//! own**. A node kept unquantized
//! - reads the float tensor each of its activation quantizers (QuantizeLinear -> DequantizeLinear)
//!   quantizes, instead of that pair's output; the pair stays for its other readers and goes
//!   where nothing else reads it;
//! - reads a float weight where it read a DequantizeLinear of a stored quantized weight: the
//!   reference model's weight in the same slot of the node of the same name and op (the float
//!   model the candidate was made from) where it has one of the same dimensions, else the stored
//!   weight dequantized exactly (`(q - zero point) * scale`, per tensor, channel or block);
//! - its output is quantized as before where its readers quantize it (their own quantizers),
//!   except a quantizer that only a graph output reads (`quantize_static` quantizes model outputs
//!   too): no node owns it, and it goes with the node (YOLOv8n's output quantizer, whose step the
//!   box coordinates set, rounds every class score to 0).
//!
//! A quantizer that took over an activation (`quantize_static` drops a Relu into the quantizer
//! after a Conv, its zero point clipping at 0) is kept unquantized **as that activation**: its
//! DequantizeLinear is replaced by the activation computed on the float tensor (or an Identity),
//! under the same output name, for every reader.

use std::collections::{HashMap, HashSet};

use crate::matching::Clamp;
use crate::onnx::{ModelProto, NodeProto, TensorProto};
use crate::{DataType, GraphIndex, ModelError, Tensor};

/// A quantizer bypassed for every reader: its DequantizeLinear's output, and the clamp computed
/// in its place on the quantized float tensor (where the quantizer took the reference's Relu or
/// Clip over; `None`: the float tensor as it is).
#[derive(Debug, Clone, PartialEq)]
pub struct BypassedQuantizer {
    pub dequantized: String,
    pub activation: Option<Clamp>,
}

/// Where a kept node's float weight came from.
#[derive(Debug, Clone, PartialEq)]
pub enum FloatWeight {
    /// The reference's initializer of that name.
    Reference(String),
    /// The candidate's stored weight dequantized exactly.
    Dequantized,
}

/// The rewritten model and what was done, for the report.
#[derive(Debug, Clone)]
pub struct Unquantized {
    pub model: ModelProto,
    /// (kept node, input slot) that now read the float tensor instead of a quantizer's output.
    pub bypassed_inputs: Vec<(String, usize)>,
    /// (kept node, input slot, source) that now read a float weight.
    pub float_weights: Vec<(String, usize, FloatWeight)>,
    /// QuantizeLinear/DequantizeLinear (and DynamicQuantizeLinear) nodes removed (nothing reads
    /// them any more).
    pub removed: Vec<String>,
}

/// `candidate` (a Q/DQ model) with `nodes` (names as [`GraphIndex`] gives them) kept unquantized
/// and `quantizers` bypassed for every reader; `reference` is the float model, for the weights.
/// A name that is no node of `candidate`, or a tensor that is no DequantizeLinear output, is an
/// error (nothing is silently left quantized).
pub fn keep_unquantized(
    candidate: &ModelProto,
    nodes: &[String],
    quantizers: &[BypassedQuantizer],
    reference: Option<&ModelProto>,
) -> Result<Unquantized, ModelError> {
    let mut model = candidate.clone();
    let graph = model.graph.get_or_insert_with(Default::default);
    let index = GraphIndex::build(graph)?;
    let reference = match reference.and_then(|r| r.graph.as_ref()) {
        Some(g) => Some((g, GraphIndex::build(g)?)),
        None => None,
    };
    let producer_op = |t: &str| index.producer(t).map(|p| p.op_type.as_str());
    // The candidate's default-domain opset: a Clip's bounds are inputs from 11, attributes before.
    let opset = crate::model::default_opset(candidate);
    let mut names = crate::FreshNames::of(graph);
    let initializers: HashMap<String, TensorProto> =
        graph.initializer.iter().map(|w| (w.name().to_string(), w.clone())).collect();
    let mut done = Unquantized {
        model: ModelProto::default(),
        bypassed_inputs: Vec::new(),
        float_weights: Vec::new(),
        removed: Vec::new(),
    };
    let mut new_weights: Vec<TensorProto> = Vec::new();
    // A dequantized weight is made once per DequantizeLinear, whatever number of kept readers.
    let mut float_of_dq: HashMap<String, String> = HashMap::new();
    // The reference's activations a bypassed quantizer held, for kept readers, placed right after
    // that quantizer (by its position), one per float tensor.
    let mut activations: Vec<(usize, NodeProto)> = Vec::new();
    let mut held_of: HashMap<String, String> = HashMap::new();
    for name in nodes {
        let info = index.node(name).ok_or_else(|| ModelError::UnknownNode(name.clone()))?;
        for (slot, input) in info.inputs.iter().enumerate() {
            let Some(dq) = index.producer(input).filter(|p| p.op_type == "DequantizeLinear") else { continue };
            let quantized = dq.inputs.first().cloned().unwrap_or_default();
            let new_input = if index.is_initializer(&quantized) {
                // A stored quantized weight: the reference's float weight of that role, else exact.
                let from_reference = reference.as_ref().and_then(|(g, ri)| {
                    let twin = ri.node(name).filter(|n| n.op_type == info.op_type)?;
                    let w = twin.inputs.get(slot).filter(|w| ri.is_initializer(w))?;
                    let proto = g.initializer.iter().find(|i| i.name() == w.as_str())?;
                    let stored = initializers.get(&quantized)?;
                    (proto.dims == stored.dims && proto.data_type() == DataType::Float as i32)
                        .then(|| (w.clone(), proto.clone()))
                });
                if let Some(existing) = float_of_dq.get(input) {
                    existing.clone()
                } else {
                    let (source, mut proto) = match from_reference {
                        Some((w, proto)) => (FloatWeight::Reference(w), proto),
                        None => (
                            FloatWeight::Dequantized,
                            dequantize_weight(&graph.node[dq.proto_index], &|t| initializers.get(t))?,
                        ),
                    };
                    let float_name = names.fresh(&format!("{quantized}_float"));
                    proto.name = Some(float_name.clone());
                    new_weights.push(proto);
                    float_of_dq.insert(input.clone(), float_name.clone());
                    done.float_weights.push((name.clone(), slot, source));
                    float_name
                }
            } else if producer_op(&quantized) == Some("QuantizeLinear") {
                let q = index.producer(&quantized).expect("just checked");
                done.bypassed_inputs.push((name.clone(), slot));
                let float = q.inputs.first().cloned().unwrap_or_default();
                // Where the reference computes the float tensor's name with an activation the
                // candidate does not (quantize_static folds a Relu, or a Clip to the quantizer's
                // range, into the quantizer after a Conv and leaves its output name on the Conv),
                // that activation is part of the value, not of the rounding: the kept node reads it
                // computed on the float tensor, as the reference computes it.
                let held = match reference.as_ref() {
                    None => None,
                    Some((g, ri)) => {
                        // The reference's producer of the float tensor's name, else of what the
                        // kept node's twin reads in that slot (a QOperator file names a Conv's
                        // output after the Conv, the Relu folded into its quantizer).
                        let clamp_of =
                            |t: &str| ri.producer(t).filter(|p| matches!(p.op_type.as_str(), "Relu" | "Clip"));
                        let twin_reads = ri
                            .node(name)
                            .filter(|twin| twin.op_type == info.op_type)
                            .and_then(|twin| twin.inputs.get(slot))
                            .and_then(|t| clamp_of(t));
                        match clamp_of(&float).or(twin_reads) {
                            Some(theirs) if index.producer(&float).is_none_or(|o| o.op_type != theirs.op_type) => {
                                let clamp = Clamp::of(g, ri, theirs).ok_or_else(|| {
                                ModelError::InvalidGraph(format!(
                                    "the reference's {} '{}' clamps to bounds the file does not store (computed by other nodes): they cannot be copied",
                                    theirs.op_type, theirs.name
                                ))
                            })?;
                                Some((clamp, theirs.name.clone()))
                            }
                            _ => None,
                        }
                    }
                };
                match held {
                    None => float,
                    Some((clamp, theirs)) => match held_of.get(&float) {
                        Some(out) => out.clone(),
                        None => {
                            let out = names.fresh(&format!("{float}_{}", if clamp.relu { "relu" } else { "clip" }));
                            let name = names.fresh(&format!("{theirs}_as_reference"));
                            let node = clamp.node(name, &float, &out, opset, &mut names, &mut new_weights);
                            activations.push((q.proto_index, node));
                            held_of.insert(float, out.clone());
                            out
                        }
                    },
                }
            } else {
                continue;
            };
            graph.node[info.proto_index].input[slot] = new_input;
        }
    }
    // A kept node's output quantizers that only graph outputs read: bypassed with the node.
    let graph_outputs: HashSet<&str> = graph.output.iter().map(|o| o.name()).collect();
    let mut quantizers = quantizers.to_vec();
    for name in nodes {
        let info = index.node(name).expect("checked above");
        for q in info.outputs.iter().flat_map(|o| index.consumers(o)).map(|&c| &index.nodes[c]) {
            if q.op_type != "QuantizeLinear" {
                continue;
            }
            for dq in q.outputs.iter().flat_map(|o| index.consumers(o)).map(|&c| &index.nodes[c]) {
                let Some(out) = dq.outputs.first() else { continue };
                let only_the_output = graph_outputs.contains(out.as_str()) && index.consumers(out).is_empty();
                if dq.op_type == "DequantizeLinear"
                    && only_the_output
                    && !quantizers.iter().any(|b| &b.dequantized == out)
                {
                    quantizers.push(BypassedQuantizer { dequantized: out.clone(), activation: None });
                }
            }
        }
    }
    for bypass in &quantizers {
        let dq = index.producer(&bypass.dequantized).filter(|p| p.op_type == "DequantizeLinear").ok_or_else(|| {
            ModelError::InvalidGraph(format!(
                "'{}' is not the output of a DequantizeLinear: no quantizer to bypass",
                bypass.dequantized
            ))
        })?;
        let q =
            dq.inputs.first().and_then(|t| index.producer(t)).filter(|p| p.op_type == "QuantizeLinear").ok_or_else(
                || {
                    ModelError::InvalidGraph(format!(
                        "'{}' dequantizes no QuantizeLinear output: no activation quantizer to bypass",
                        bypass.dequantized
                    ))
                },
            )?;
        let float = q.inputs.first().cloned().unwrap_or_default();
        let dq_name = dq.name.clone();
        graph.node[dq.proto_index] = match &bypass.activation {
            Some(clamp) => clamp.node(
                format!("{dq_name}_as_{}", if clamp.relu { "relu" } else { "clip" }),
                &float,
                &bypass.dequantized,
                opset,
                &mut names,
                &mut new_weights,
            ),
            None => NodeProto {
                name: Some(format!("{dq_name}_as_identity")),
                op_type: Some("Identity".to_string()),
                input: vec![float],
                output: vec![bypass.dequantized.clone()],
                ..Default::default()
            },
        };
        done.removed.push(dq_name);
    }
    if !activations.is_empty() {
        let mut after: HashMap<usize, Vec<NodeProto>> = HashMap::new();
        for (position, node) in activations {
            after.entry(position).or_default().push(node);
        }
        let nodes = std::mem::take(&mut graph.node);
        for (i, n) in nodes.into_iter().enumerate() {
            graph.node.push(n);
            graph.node.extend(after.remove(&i).unwrap_or_default());
        }
    }
    graph.initializer.extend(new_weights);
    // Quantizer nodes nothing reads any more go, then the initializers only they read.
    let outputs: HashSet<String> = graph.output.iter().map(|o| o.name().to_string()).collect();
    loop {
        let read: HashSet<&str> = graph.node.iter().flat_map(|n| n.input.iter().map(String::as_str)).collect();
        let unread = graph.node.iter().position(|n| {
            // A DynamicQuantizeLinear of the Q/DQ form computes a range for its quantizer only.
            matches!(n.op_type(), "QuantizeLinear" | "DequantizeLinear" | "DynamicQuantizeLinear")
                && n.output.iter().all(|o| !read.contains(o.as_str()) && !outputs.contains(o))
        });
        let Some(i) = unread else { break };
        let node = graph.node.remove(i);
        done.removed.push(node.name().to_string());
    }
    let read: HashSet<String> = graph.node.iter().flat_map(|n| n.input.iter().cloned()).chain(outputs).collect();
    let dropped: HashSet<String> = initializers.keys().filter(|w| !read.contains(*w)).cloned().collect();
    graph.initializer.retain(|w| !dropped.contains(w.name()));
    graph.input.retain(|v| !dropped.contains(v.name()));
    GraphIndex::build(graph)?;
    done.model = model;
    Ok(done)
}

/// A DequantizeLinear's stored weight as float32: `(q - zero point) * scale`, the scale per
/// tensor (one value), per channel along `axis` (one value per slice) or per block (`block_size`
/// along `axis`).
pub fn dequantize_weight<'w>(
    dq: &NodeProto,
    stored: &dyn Fn(&str) -> Option<&'w TensorProto>,
) -> Result<TensorProto, ModelError> {
    let name = dq.name().to_string();
    let fail = |why: String| ModelError::InvalidGraph(format!("cannot dequantize the weight of '{name}': {why}"));
    let read = |slot: usize| -> Result<Option<Tensor>, ModelError> {
        match dq.input.get(slot).filter(|t| !t.is_empty()) {
            None => Ok(None),
            Some(t) => {
                let w = stored(t).ok_or_else(|| fail(format!("'{t}' is not stored in the model")))?;
                Tensor::from_proto(w).map(Some).map_err(|e| fail(format!("'{t}': {e}")))
            }
        }
    };
    let q = read(0)?.ok_or_else(|| fail("no input".into()))?;
    let scale = read(1)?.ok_or_else(|| fail("no scale".into()))?;
    let zero = read(2)?;
    let rank = q.shape.len() as i64;
    let attr = |n: &str| dq.attribute.iter().find(|a| a.name() == n).and_then(|a| a.i);
    let axis = attr("axis").unwrap_or(1);
    let axis = if axis < 0 { axis + rank } else { axis };
    let block = attr("block_size").filter(|&b| b > 0).map(|b| b as usize);
    let (values, scales) = (q.to_f32(), scale.to_f32());
    let zeros = zero.as_ref().map(|z| z.to_f32().into_owned());
    let strides: Vec<usize> = (0..q.shape.len()).map(|d| q.shape[d + 1..].iter().product()).collect();
    let per_value = scales.len() > 1 || block.is_some();
    if per_value && !(0..rank).contains(&axis) {
        return Err(fail(format!("axis {axis} is outside its rank {rank}")));
    }
    let axis = axis.max(0) as usize;
    // The scale's index of the value at flat position i.
    let scale_index = |i: usize| -> usize {
        if !per_value {
            return 0;
        }
        match block {
            None => (i / strides[axis]) % q.shape[axis],
            Some(b) => {
                let mut k = 0;
                for d in 0..q.shape.len() {
                    let c = (i / strides[d]) % q.shape[d];
                    let (c, n) = if d == axis { (c / b, q.shape[d].div_ceil(b)) } else { (c, q.shape[d]) };
                    k = k * n + c;
                }
                k
            }
        }
    };
    let mut out = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let k = scale_index(i);
        let s = *scales.get(k).ok_or_else(|| {
            fail(format!("its scale has {} values, fewer than the weight's channels or blocks", scales.len()))
        })?;
        let z = zeros.as_ref().map_or(0.0, |z| z.get(k).copied().unwrap_or(0.0));
        out.push((v - z) * s);
    }
    Ok(Tensor::f32(q.shape.clone(), out).to_proto(""))
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

    /// x -> Q/DQ -> mm1(w1 int8 per channel) -> Q/DQ (clips at 0: a Relu taken over) -> mm2 and add.
    fn qdq() -> ModelProto {
        let mut b = ModelBuilder::new("q", 17);
        b.input("x", DataType::Float, &[Dim::from(1), Dim::from(2)]);
        b.initializer(int8("w1_q", &[2, 2], &[1, -2, 3, 4]));
        b.initializer(f32_tensor("s1", &[2], &[0.5, 0.25]));
        b.initializer(int8("z1", &[2], &[0, 1]));
        b.initializer(f32_tensor("sx", &[], &[0.1]));
        b.initializer(int8("z0", &[], &[0]));
        b.initializer(int8("zmin", &[], &[-128]));
        b.node(
            "DequantizeLinear",
            "w1_dq",
            &["w1_q", "s1", "z1"],
            &["w1_f"],
            vec![crate::builder::attr::int("axis", 1)],
        );
        b.node("QuantizeLinear", "x_q", &["x", "sx", "z0"], &["x8"], vec![]);
        b.node("DequantizeLinear", "x_dq", &["x8", "sx", "z0"], &["x_f"], vec![]);
        b.node("MatMul", "mm1", &["x_f", "w1_f"], &["r"], vec![]);
        b.node("QuantizeLinear", "r_q", &["r", "sx", "zmin"], &["r8"], vec![]);
        b.node("DequantizeLinear", "r_dq", &["r8", "sx", "zmin"], &["r_f"], vec![]);
        b.node("Add", "add", &["r_f", "x_f"], &["y"], vec![]);
        b.output("y", DataType::Float);
        b.build()
    }

    fn node<'m>(m: &'m ModelProto, name: &str) -> Option<&'m NodeProto> {
        m.graph.as_ref().unwrap().node.iter().find(|n| n.name() == name)
    }

    #[test]
    fn a_kept_node_reads_float_inputs_and_a_pair_others_read_stays_for_them() {
        let q = qdq();
        let done = keep_unquantized(&q, &["mm1".to_string()], &[], None).unwrap();
        let mm1 = node(&done.model, "mm1").unwrap();
        assert_eq!(mm1.input[0], "x");
        // The weight dequantized exactly, per channel along axis 1: (q - z[c]) * s[c].
        let w = done.model.graph.as_ref().unwrap().initializer.iter().find(|w| w.name() == mm1.input[1]).unwrap();
        assert_eq!(Tensor::from_proto(w).unwrap().to_f32().as_ref(), &[0.5, -0.75, 1.5, 0.75]);
        assert_eq!(done.float_weights, vec![("mm1".to_string(), 1, FloatWeight::Dequantized)]);
        // 'add' still reads x's pair; the weight's DequantizeLinear and stored weight are gone.
        assert!(node(&done.model, "x_q").is_some() && node(&done.model, "x_dq").is_some());
        assert!(node(&done.model, "w1_dq").is_none());
        assert!(!done.model.graph.as_ref().unwrap().initializer.iter().any(|w| w.name() == "w1_q" || w.name() == "s1"));
        assert_eq!(node(&done.model, "add").unwrap().input, vec!["r_f", "x_f"]);
    }

    /// The float model of `qdq()` with `activation` ("Relu", or "Clip" to [0, 6], or "" for
    /// none) between mm1 and the add, under the name the candidate leaves on mm1's output.
    fn reference_with(activation: &str) -> ModelProto {
        let mut r = ModelBuilder::new("r", 17);
        r.input("x", DataType::Float, &[Dim::from(1), Dim::from(2)]);
        r.initializer(f32_tensor("w1", &[2, 2], &[0.5, -0.75, 1.5, 0.75]));
        r.initializer(f32_tensor("lo", &[], &[0.0]));
        r.initializer(f32_tensor("hi", &[], &[6.0]));
        match activation {
            "" => r.node("MatMul", "mm1", &["x", "w1"], &["r"], vec![]),
            "Clip" => r.node("MatMul", "mm1", &["x", "w1"], &["h"], vec![]).node(
                "Clip",
                "clip",
                &["h", "lo", "hi"],
                &["r"],
                vec![],
            ),
            op => r.node("MatMul", "mm1", &["x", "w1"], &["h"], vec![]).node(op, "act", &["h"], &["r"], vec![]),
        };
        r.node("Add", "add", &["r", "x"], &["y"], vec![]);
        r.output("y", DataType::Float);
        r.build()
    }

    /// A kept reader of a quantizer that took over the reference's activation (quantize_static
    /// folds a Relu, or a Clip to the quantizer's range, into it and leaves the activation's output
    /// name on the MatMul) reads that activation computed on the float tensor; where the reference
    /// has none there, it reads the float tensor, whatever the zero point (taking every zero point
    /// of -128 for a Relu put 71 Relus into a YOLOv8 whose SiLU outputs have that zero point, and a
    /// Relu in place of a hardswish's Clip to [0, 6]). Before, the Relu was lost (a real VAD
    /// model's `cn` went from 0.35 to 12.8 relative L2).
    #[test]
    fn a_kept_reader_reads_the_activation_the_reference_computes_where_the_quantizer_held_it() {
        let graph = |m: &ModelProto| m.graph.clone().unwrap();
        for (activation, op) in [("Relu", Some("Relu")), ("Clip", Some("Clip")), ("", None)] {
            let done = keep_unquantized(&qdq(), &["add".to_string()], &[], Some(&reference_with(activation))).unwrap();
            let g = graph(&done.model);
            let add = node(&done.model, "add").unwrap();
            // The other input's quantizer holds nothing of the kind: read as it is.
            assert_eq!(add.input[1], "x");
            match op {
                None => assert_eq!(
                    add.input[0], "r",
                    "{activation}: no activation in the reference, the float tensor itself"
                ),
                Some(op) => {
                    let held = g.node.iter().find(|n| n.output.first() == Some(&add.input[0])).unwrap();
                    assert_eq!((held.op_type(), held.input[0].as_str()), (op, "r"), "{activation}");
                    if op == "Clip" {
                        // Its bounds are the reference's, copied.
                        let bound = |i: usize| {
                            Tensor::from_proto(g.initializer.iter().find(|w| w.name() == held.input[i]).unwrap())
                                .unwrap()
                                .to_f32()
                                .to_vec()
                        };
                        assert_eq!((bound(1), bound(2)), (vec![0.0], vec![6.0]));
                    }
                    // In graph order: after mm1, before the add.
                    let order: Vec<&str> = g.node.iter().map(|n| n.name()).collect();
                    let at = |n: &str| order.iter().position(|o| *o == n).unwrap();
                    assert!(at("mm1") < at(held.name()) && at(held.name()) < at("add"), "{order:?}");
                }
            }
        }
        // Without the reference nothing is known of it: the float tensor.
        let done = keep_unquantized(&qdq(), &["add".to_string()], &[], None).unwrap();
        assert_eq!(node(&done.model, "add").unwrap().input[0], "r");
    }

    #[test]
    fn a_pair_only_kept_nodes_read_goes_and_the_reference_weight_is_used() {
        let q = qdq();
        let mut r = ModelBuilder::new("r", 17);
        r.input("x", DataType::Float, &[Dim::from(1), Dim::from(2)]);
        r.initializer(f32_tensor("w1", &[2, 2], &[0.51, -0.74, 1.49, 0.76]));
        r.node("MatMul", "mm1", &["x", "w1"], &["h"], vec![]);
        r.node("Relu", "relu", &["h"], &["r"], vec![]);
        r.node("Add", "add", &["r", "x"], &["y"], vec![]);
        r.output("y", DataType::Float);
        let done = keep_unquantized(&q, &["mm1".to_string(), "add".to_string()], &[], Some(&r.build())).unwrap();
        assert!(node(&done.model, "x_q").is_none() && node(&done.model, "x_dq").is_none(), "{:?}", done.removed);
        // 'r' is the MatMul's output, which the clipping quantizer held as the reference's Relu.
        let add = node(&done.model, "add").unwrap();
        assert_eq!(add.input[1], "x");
        assert!(
            done.model
                .graph
                .as_ref()
                .unwrap()
                .node
                .iter()
                .any(|n| n.op_type() == "Relu" && n.input == ["r"] && n.output == [add.input[0].clone()]),
            "{add:?}"
        );
        let mm1 = node(&done.model, "mm1").unwrap();
        let w = done.model.graph.as_ref().unwrap().initializer.iter().find(|w| w.name() == mm1.input[1]).unwrap();
        assert_eq!(Tensor::from_proto(w).unwrap().to_f32().as_ref(), &[0.51, -0.74, 1.49, 0.76]);
        assert_eq!(done.float_weights, vec![("mm1".to_string(), 1, FloatWeight::Reference("w1".into()))]);
    }

    #[test]
    fn a_quantizer_that_took_a_relu_over_is_kept_as_that_relu() {
        let q = qdq();
        let bypass = BypassedQuantizer {
            dequantized: "r_f".into(),
            activation: Some(Clamp { lo: 0.0, hi: f32::INFINITY, relu: true }),
        };
        let done = keep_unquantized(&q, &[], &[bypass], None).unwrap();
        let relu =
            done.model.graph.as_ref().unwrap().node.iter().find(|n| n.output == vec!["r_f".to_string()]).unwrap();
        assert_eq!((relu.op_type(), relu.input.as_slice()), ("Relu", &["r".to_string()][..]));
        assert!(node(&done.model, "r_q").is_none(), "{:?}", done.removed);
    }

    #[test]
    fn what_is_not_there_is_an_error() {
        let q = qdq();
        assert!(matches!(keep_unquantized(&q, &["nope".to_string()], &[], None), Err(ModelError::UnknownNode(_))));
        let bypass = BypassedQuantizer { dequantized: "r".into(), activation: None };
        assert!(keep_unquantized(&q, &[], &[bypass], None)
            .unwrap_err()
            .to_string()
            .contains("not the output of a DequantizeLinear"));
    }

    #[test]
    fn a_blocked_weight_is_dequantized_block_by_block() {
        let mut inits = HashMap::new();
        inits.insert("q".to_string(), int8("q", &[2, 4], &[1, 2, 3, 4, 5, 6, 7, 8]));
        inits.insert("s".to_string(), f32_tensor("s", &[2, 2], &[1.0, 2.0, 3.0, 4.0]));
        let dq = NodeProto {
            name: Some("dq".into()),
            op_type: Some("DequantizeLinear".into()),
            input: vec!["q".into(), "s".into()],
            attribute: vec![crate::builder::attr::int("axis", 1), crate::builder::attr::int("block_size", 2)],
            ..Default::default()
        };
        let w = dequantize_weight(&dq, &|t| inits.get(t)).unwrap();
        assert_eq!(Tensor::from_proto(&w).unwrap().to_f32().as_ref(), &[1.0, 2.0, 6.0, 8.0, 15.0, 18.0, 28.0, 32.0]);
    }
}
