//! A Q/DQ candidate's activation quantizers, one at a time on the reference: which of
//! them makes the error. The noise floor moves every quantizer by up to half its step at once, so
//! a quantizer whose step is far too coarse (its range set by a mask value or a few outliers)
//! raises the floor as much as it raises the candidate's error, and the floor alone would call
//! the output ill-conditioned. Measured one at a time, such a quantizer gives most of the error by
//! itself.

use anyhow::Result;
use layerwise_analysis::ToleranceSet;
use layerwise_analysis::{QuantizerAlone, QuantizersAlone};
use layerwise_model::quant::{activation_quantizers, quantizers_on, switchable_quantizers, QUANTIZER_SWITCHES};
use layerwise_model::{GraphIndex, Model};
use layerwise_runtime::{ModelSession, Tensor};

use super::compare::Job;
use super::names::reference_of;

/// The most quantizers measured alone, one run each.
const MOST_ALONE: usize = 256;

/// Measures each activation quantizer of the candidate alone on the reference, and all of them at
/// once, on `output`; `None` where the candidate has none to measure.
pub(super) fn quantizers_alone(
    job: &Job,
    feeds: &[(String, Tensor)],
    output: &str,
    candidate_error: f64,
) -> Result<Option<QuantizersAlone>> {
    let Some(candidate) = &job.cand_model else { return Ok(None) };
    let names = job.reference_names();
    let of = reference_of(&job.index, &names);
    let pair = QuantizedPair {
        model: job.model,
        index: &job.index,
        candidate,
        reference_of: &of,
        tolerances: &job.judging.tolerances,
        fault_threshold: job.judging.rule.min_break,
    };
    measure(&pair, feeds, output, candidate_error)
}

/// Why quantizers are not measured one at a time where the inputs hold inf/NaN (the quantizer of a
/// NaN input "alone gave 0" where it alone turns the output's NaN into finite values).
pub(crate) const NONFINITE_INPUTS: &str = "the inputs hold inf/NaN, which a QuantizeLinear stores as finite codes while the measurement's switched quantizers (float32 arithmetic) keep them inf/NaN, so their numbers would not say what each quantizer does here";

/// Whether any input value is inf or NaN.
pub(crate) fn inputs_hold_nonfinite(feeds: &[(String, Tensor)]) -> bool {
    feeds.iter().any(|(_, t)| {
        let (nan, inf) = t.non_finite_counts();
        nan + inf > 0
    })
}

/// What measuring quantizers one at a time reads: the float model, the Q/DQ candidate, the
/// matching's pairs read backwards, the output's tolerance and the error from which one is at fault.
pub(crate) struct QuantizedPair<'a> {
    pub model: &'a Model,
    pub index: &'a GraphIndex,
    pub candidate: &'a (Model, GraphIndex),
    pub reference_of: &'a dyn Fn(&str) -> Option<String>,
    pub tolerances: &'a ToleranceSet,
    pub fault_threshold: f64,
}

/// [`quantizers_alone`] on its parts (`fix` has no bisect job).
pub(crate) fn measure(
    pair: &QuantizedPair,
    feeds: &[(String, Tensor)],
    output: &str,
    candidate_error: f64,
) -> Result<Option<QuantizersAlone>> {
    if inputs_hold_nonfinite(feeds) {
        return Ok(None);
    }
    let (cm, ci) = pair.candidate;
    let mut measured: Vec<(String, layerwise_model::quant::QuantizerRange)> = Vec::new();
    let mut nodes = Vec::new();
    let mut not_measured = Vec::new();
    let fed: std::collections::HashSet<&str> = feeds.iter().map(|(n, _)| n.as_str()).collect();
    // The reference tensors already measured: a value quantized twice is measured once.
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    for q in activation_quantizers(cm.graph(), ci, pair.reference_of) {
        if q.range.format.family().is_float8() {
            not_measured.push((
                q.node,
                "a float8 quantizer (its step is relative; only integer formats are measured one at a time)"
                    .to_string(),
            ));
            continue;
        }
        // Where the reference has no tensor by the quantized value (quantize_static renames a graph
        // output's producer so that the DequantizeLinear can carry the output's name), the tensor
        // the DequantizeLinear holds is that value.
        let computed = |t: &String| pair.index.producer(t).is_some() || fed.contains(t.as_str());
        let Some(tensor) =
            q.quantizes.clone().filter(computed).or_else(|| q.holds.iter().find(|h| computed(h)).cloned())
        else {
            not_measured.push((q.node, "the reference computes no tensor of the value it quantizes".to_string()));
            continue;
        };
        if !seen.insert(tensor.clone()) {
            continue;
        }
        let holds = q.holds.into_iter().find(|h| *h != tensor);
        measured.push((tensor, q.range));
        nodes.push((q.node, holds));
    }
    if measured.is_empty() {
        return Ok(None);
    }
    // Beyond MOST_ALONE quantizers, each measured alone would be a run too many, and a switched
    // model carrying all of them makes every run cost the whole count: those whose own error on
    // the reference's values is largest are chosen first, from one plain reference run, and only
    // they are switched.
    let chosen: Vec<usize> = if measured.len() > MOST_ALONE {
        largest_own_errors(pair, feeds, &measured)?
    } else {
        (0..measured.len()).collect()
    };
    let switched: Vec<(String, layerwise_model::quant::QuantizerRange)> =
        chosen.iter().map(|&i| measured[i].clone()).collect();
    let proto = switchable_quantizers(&pair.model.proto, &switched)?;
    let mut session = ModelSession::cpu(pair.model, &proto, "quantizers alone")?;
    let mut run = |on: &dyn Fn(usize) -> bool| -> Result<Tensor> {
        let mut outputs = session.run(&with_switches(feeds, (0..switched.len()).map(on).collect()))?;
        outputs
            .remove(output)
            .ok_or_else(|| anyhow::anyhow!("the model with its quantizers switched gives no '{output}'"))
    };
    // Judged as bisect judges the output: slice by slice where its slices differ in scale.
    let reference = run(&|_| false)?;
    let judge = pair.tolerances.output(output, reference.dtype());
    let (shape, reference) = (reference.shape.clone(), reference.to_f32().into_owned());
    let error = |values: &[f32]| judge.metrics(&reference, values, &shape).error_level();
    let together = if chosen.len() == measured.len() {
        error(&run(&|_| true)?.to_f32())
    } else {
        // Every quantizer at once, the unmeasured too: one session without switches, one run.
        let all = ModelSession::cpu(pair.model, &quantizers_on(&pair.model.proto, &measured)?, "quantizers together")?
            .run(feeds)?;
        error(
            &all.get(output)
                .ok_or_else(|| anyhow::anyhow!("the model with every quantizer on gives no '{output}'"))?
                .to_f32(),
        )
    };
    // The weights' share: the candidate with its activation pairs taken out, one run. Where it
    // cannot run, it is said unknown (None), never guessed.
    // Against the float model run in the same kind of session: the switched model's float run
    // is another graph, whose float32 arithmetic ONNX Runtime fuses otherwise (an output near 0
    // read 0.0418 against an independent 0.0337).
    let weights_together = match weights_only(pair) {
        Some(proto) => (|| -> Result<Option<f64>> {
            let weights = ModelSession::cpu(cm, &proto, "weight quantizers together")?.run(feeds)?;
            let float = ModelSession::cpu(pair.model, &pair.model.proto, "the float model")?.run(feeds)?;
            Ok(match (float.get(output), weights.get(output)) {
                (Some(r), Some(w)) => {
                    let judge = pair.tolerances.output(output, r.dtype());
                    Some(judge.metrics(&r.to_f32(), &w.to_f32(), &r.shape).error_level())
                }
                _ => None,
            })
        })()
        .ok()
        .flatten(),
        None => None,
    };
    let mut each = Vec::with_capacity(chosen.len());
    let mut next = chosen.iter().copied().enumerate().peekable();
    for (i, ((tensor, _), (node, holds))) in measured.iter().zip(&nodes).enumerate() {
        let Some((k, _)) = next.next_if(|&(_, c)| c == i) else {
            not_measured.push((node.clone(), format!("not among the {MOST_ALONE} of the {} with the largest error of their own on the reference's values", measured.len())));
            continue;
        };
        // Left out: only where every quantizer is switched (else the unswitched would be off too).
        let without = if chosen.len() == measured.len() { Some(error(&run(&|s| s != k)?.to_f32())) } else { None };
        each.push(QuantizerAlone {
            node: node.clone(),
            tensor: tensor.clone(),
            holds: holds.clone(),
            error: error(&run(&|s| s == k)?.to_f32()),
            without,
        });
    }
    // Largest first, by what it gives alone or takes away left out; graph order on ties (a
    // stable sort keeps it).
    let weight = |q: &QuantizerAlone| q.error.max(q.removed_from(together));
    each.sort_by(|a, b| weight(b).total_cmp(&weight(a)));
    let mut found = QuantizersAlone {
        output: output.to_string(),
        together,
        candidate_error,
        fault_threshold: pair.fault_threshold,
        weights_together,
        each,
        not_measured,
        at_fault_left_out: None,
    };
    // Each share is measured with the others on, so they overlap: where several are at fault,
    // leaving all of them out at once is measured too (one run), never added up.
    if chosen.len() == measured.len() {
        let at_fault: std::collections::HashSet<&str> = found.at_fault().map(|q| q.node.as_str()).collect();
        if at_fault.len() > 1 {
            let off: Vec<bool> = chosen.iter().map(|&i| at_fault.contains(nodes[i].0.as_str())).collect();
            found.at_fault_left_out = Some(error(&run(&|s| !off[s])?.to_f32()));
        }
    }
    Ok(Some(found))
}

/// The Q/DQ candidate with every activation quantizer taken out: each DequantizeLinear that reads
/// a QuantizeLinear of a computed or fed tensor becomes an Identity of that tensor (its output
/// name stays, a graph output's too), so that only the weights' DequantizeLinear nodes are left.
/// Stored weights are dequantized into float weights (a DequantizeLinear left before a MatMul is
/// fused with it into a kernel that quantizes the activation too). A quantizer that took over the
/// reference's Relu or Clip (the matching paired its output with that clamp) becomes that clamp
/// instead: the clamp is the model's, not the rounding's (without
/// it, a ResNet whose Relus live in its quantizers read 1.45 for "the weights alone", where they
/// give 7.0e-2). `None` where the candidate has no weight quantizer (nothing to measure).
fn weights_only(pair: &QuantizedPair) -> Option<layerwise_model::onnx::ModelProto> {
    let (cm, ci) = pair.candidate;
    let mut proto = cm.proto.clone();
    let opset = cm.opset();
    let graph = proto.graph.as_mut()?;
    let mut names = layerwise_model::FreshNames::of(graph);
    let mut bounds = Vec::new();
    let mut weights = 0;
    // Read from the candidate's own graph: no copy of its weights.
    let stored: std::collections::HashMap<&str, &layerwise_model::onnx::TensorProto> =
        cm.graph().initializer.iter().map(|w| (w.name(), w)).collect();
    for node in graph.node.iter_mut().filter(|n| n.op_type() == "DequantizeLinear") {
        let Some(q) = node.input.first().and_then(|t| ci.producer(t)).filter(|p| p.op_type == "QuantizeLinear") else {
            // A stored weight: dequantized here, exactly, and read as a float weight. Left as a
            // DequantizeLinear before a MatMul, ONNX Runtime fuses the pair into a kernel that
            // quantizes the float activation on the fly (7.0e-3 where the weights alone give
            // 6.5e-3).
            let is_stored = node.input.first().is_some_and(|t| stored.contains_key(t.as_str()));
            let dequantized = is_stored
                .then(|| layerwise_model::unquantize::dequantize_weight(node, &|t| stored.get(t).copied()).ok())
                .flatten();
            if let Some(float) = dequantized {
                let name = names.fresh(&format!("{}_float", node.output.first().map_or("weight", String::as_str)));
                bounds.push(layerwise_model::onnx::TensorProto { name: Some(name.clone()), ..float });
                *node = layerwise_model::onnx::NodeProto {
                    op_type: Some("Identity".into()),
                    name: node.name.clone(),
                    input: vec![name],
                    output: node.output.clone(),
                    ..Default::default()
                };
            }
            weights += usize::from(is_stored || node.input.first().is_some_and(|t| ci.is_constant_like(t)));
            continue;
        };
        let Some(x) = q.inputs.first().filter(|x| !ci.is_constant_like(x)).cloned() else { continue };
        let output = node.output.first().cloned().unwrap_or_default();
        let clamp = (pair.reference_of)(&output)
            .and_then(|r| pair.index.producer(&r))
            .and_then(|p| layerwise_model::matching::Clamp::of(pair.model.graph(), pair.index, p))
            .filter(|_| ci.producer(&x).is_none_or(|p| !matches!(p.op_type.as_str(), "Relu" | "Clip")));
        *node = match clamp {
            Some(clamp) => clamp.node(node.name().to_string(), &x, &output, opset, &mut names, &mut bounds),
            None => layerwise_model::onnx::NodeProto {
                op_type: Some("Identity".into()),
                name: node.name.clone(),
                input: vec![x],
                output: node.output.clone(),
                ..Default::default()
            },
        };
    }
    graph.initializer.extend(bounds);
    // The QuantizeLinear nodes left without a reader go too: ONNX Runtime's optimizer otherwise
    // still reads them as Q/DQ groups (the output moved by 1.9311905e-5 against 1.9222498e-5).
    let read: std::collections::HashSet<String> = graph
        .node
        .iter()
        .flat_map(|n| n.input.iter().cloned())
        .chain(graph.output.iter().map(|o| o.name().to_string()))
        .collect();
    graph.node.retain(|n| n.op_type() != "QuantizeLinear" || n.output.iter().any(|o| read.contains(o)));
    (weights > 0).then_some(proto)
}

/// `feeds` and the switches of a [`switchable_quantizers`] model.
fn with_switches(feeds: &[(String, Tensor)], on: Vec<bool>) -> Vec<(String, Tensor)> {
    let mut inputs = feeds.to_vec();
    inputs.push((QUANTIZER_SWITCHES.to_string(), Tensor::new(vec![on.len()], layerwise_runtime::TensorData::Bool(on))));
    inputs
}

/// The `MOST_ALONE` of `quantizers` whose own round trip errs most on the reference's values of
/// the tensors they quantize (relative L2, `quantizer_effect`), read from one run of the plain
/// reference with those tensors exposed; their indices in `quantizers`' order.
fn largest_own_errors(
    pair: &QuantizedPair,
    feeds: &[(String, Tensor)],
    quantizers: &[(String, layerwise_model::quant::QuantizerRange)],
) -> Result<Vec<usize>> {
    let fed = |t: &str| feeds.iter().find(|(n, _)| n == t).map(|(_, v)| v);
    let mut proto = pair.model.proto.clone();
    let graph = proto.graph.as_mut().expect("a loaded model has a graph");
    let declared: std::collections::HashSet<String> = graph.output.iter().map(|o| o.name().to_string()).collect();
    for (t, _) in quantizers.iter().filter(|(t, _)| fed(t).is_none() && !declared.contains(t)) {
        graph.output.push(layerwise_model::onnx::ValueInfoProto { name: Some(t.clone()), ..Default::default() });
    }
    let values = ModelSession::cpu(pair.model, &proto, "quantizers' values")?.run(feeds)?;
    let own: Vec<f64> = quantizers
        .iter()
        .map(|(t, range)| {
            values
                .get(t)
                .or_else(|| fed(t))
                .and_then(|v| layerwise_model::quant::quantizer_effect(range, &v.to_f32(), &v.shape).rel_l2)
                .unwrap_or(0.0)
        })
        .collect();
    let mut order: Vec<usize> = (0..quantizers.len()).collect();
    // Largest first; graph order on ties (a stable sort keeps it).
    order.sort_by(|&a, &b| own[b].total_cmp(&own[a]));
    order.truncate(MOST_ALONE);
    order.sort_unstable();
    Ok(order)
}
