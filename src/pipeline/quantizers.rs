//! A Q/DQ candidate's activation quantizers, one at a time on the reference (issue 40): which of
//! them makes the error. The noise floor moves every quantizer by up to half its step at once, so
//! a quantizer whose step is far too coarse (its range set by a mask value or a few outliers)
//! raises the floor as much as it raises the candidate's error, and the floor alone would call
//! the output ill-conditioned. Measured one at a time, such a quantizer gives most of the error by
//! itself.

use anyhow::Result;
use layerwise_analysis::{QuantizerAlone, QuantizersAlone};
use layerwise_model::quant::{activation_quantizers, switchable_quantizers, QUANTIZER_SWITCHES};
use layerwise_analysis::Tolerance;
use layerwise_model::{GraphIndex, Model};
use layerwise_runtime::{ModelSession, Tensor};

use super::compare::Job;
use super::reference_of;

/// The most quantizers measured alone, one run each.
const MOST_ALONE: usize = 256;

/// Measures each activation quantizer of the candidate alone on the reference, and all of them at
/// once, on `output`; `None` where the candidate has none to measure.
pub(super) fn quantizers_alone(job: &Job, feeds: &[(String, Tensor)], output: &str, candidate_error: f64) -> Result<Option<QuantizersAlone>> {
    let Some(candidate) = &job.cand_model else { return Ok(None) };
    let names = job.reference_names();
    let of = reference_of(&job.index, &names);
    let pair = QuantizedPair { model: job.model, index: &job.index, candidate, reference_of: &of, tolerance: job.judging.tolerances.of(output), fault_threshold: job.judging.rule.min_break };
    measure(&pair, feeds, output, candidate_error)
}

/// What measuring quantizers one at a time reads: the float model, the Q/DQ candidate, the
/// matching's pairs read backwards, the output's tolerance and the error from which one is at fault.
pub(crate) struct QuantizedPair<'a> {
    pub model: &'a Model,
    pub index: &'a GraphIndex,
    pub candidate: &'a (Model, GraphIndex),
    pub reference_of: &'a dyn Fn(&str) -> Option<String>,
    pub tolerance: Tolerance,
    pub fault_threshold: f64,
}

/// [`quantizers_alone`] on its parts (`fix` has no bisect job).
pub(crate) fn measure(pair: &QuantizedPair, feeds: &[(String, Tensor)], output: &str, candidate_error: f64) -> Result<Option<QuantizersAlone>> {
    let (cm, ci) = pair.candidate;
    let mut measured: Vec<(String, layerwise_model::quant::QuantizerRange)> = Vec::new();
    let mut nodes = Vec::new();
    let mut not_measured = Vec::new();
    let fed: std::collections::HashSet<&str> = feeds.iter().map(|(n, _)| n.as_str()).collect();
    // The reference tensors already measured: a value quantized twice is measured once.
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    for q in activation_quantizers(cm.graph(), ci, pair.reference_of) {
        if q.range.format.family().starts_with("FP8") {
            not_measured.push((q.node, "a float8 quantizer (its step is relative; only integer formats are measured one at a time)".to_string()));
            continue;
        }
        // Where the reference has no tensor by the quantized value (quantize_static renames a graph
        // output's producer so that the DequantizeLinear can carry the output's name), the tensor
        // the DequantizeLinear holds is that value.
        let computed = |t: &String| pair.index.producer(t).is_some() || fed.contains(t.as_str());
        let Some(tensor) = q.quantizes.clone().filter(computed).or_else(|| q.holds.iter().find(|h| computed(h)).cloned()) else {
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
    let mut proto = switchable_quantizers(&pair.model.proto, &measured)?;
    // Beyond MOST_ALONE quantizers, each measured alone would be a run too many: those whose own
    // error on the reference's values is largest are, read from one run with every quantized
    // tensor an output.
    let over = measured.len() > MOST_ALONE;
    if over {
        let graph = proto.graph.as_mut().expect("a rewritten model has a graph");
        for (t, _) in measured.iter().filter(|(t, _)| !fed.contains(t.as_str())) {
            graph.output.push(layerwise_model::onnx::ValueInfoProto { name: Some(t.clone()), ..Default::default() });
        }
    }
    let mut session = ModelSession::cpu(pair.model, &proto, "quantizers alone")?;
    let tolerance = pair.tolerance;
    let chosen: Vec<bool> = if over {
        let mut inputs = feeds.to_vec();
        inputs.push((QUANTIZER_SWITCHES.to_string(), Tensor::new(vec![measured.len()], layerwise_runtime::TensorData::Bool(vec![false; measured.len()]))));
        let values = session.run(&inputs)?;
        let own: Vec<f64> = measured
            .iter()
            .map(|(t, range)| {
                let value = values.get(t).or_else(|| feeds.iter().find(|(n, _)| n == t).map(|(_, v)| v));
                value.and_then(|v| layerwise_model::quant::quantizer_effect(range, &v.to_f32(), &v.shape).rel_l2).unwrap_or(0.0)
            })
            .collect();
        let mut order: Vec<usize> = (0..measured.len()).collect();
        order.sort_by(|&a, &b| own[b].total_cmp(&own[a]));
        let mut chosen = vec![false; measured.len()];
        for &i in order.iter().take(MOST_ALONE) {
            chosen[i] = true;
        }
        chosen
    } else {
        vec![true; measured.len()]
    };
    let mut run = |on: &dyn Fn(usize) -> bool| -> Result<Vec<f32>> {
        let switches = Tensor::new(vec![measured.len()], layerwise_runtime::TensorData::Bool((0..measured.len()).map(on).collect()));
        let mut inputs = feeds.to_vec();
        inputs.push((QUANTIZER_SWITCHES.to_string(), switches));
        let mut outputs = session.run(&inputs)?;
        let value = outputs.remove(output).ok_or_else(|| anyhow::anyhow!("the model with its quantizers switched gives no '{output}'"))?;
        Ok(value.to_f32().into_owned())
    };
    let reference = run(&|_| false)?;
    let error = |values: &[f32]| layerwise_analysis::compute(&reference, values, tolerance).error_level();
    let together = error(&run(&|_| true)?);
    let mut each = Vec::with_capacity(measured.len());
    for (i, ((tensor, _), (node, holds))) in measured.iter().zip(&nodes).enumerate() {
        if !chosen[i] {
            not_measured.push((node.clone(), format!("not among the {MOST_ALONE} of the {} with the largest error of their own on the reference's values", measured.len())));
            continue;
        }
        each.push(QuantizerAlone { node: node.clone(), tensor: tensor.clone(), holds: holds.clone(), error: error(&run(&|k| k == i)?) });
    }
    // Largest first; graph order on ties (a stable sort keeps it).
    each.sort_by(|a, b| b.error.total_cmp(&a.error));
    Ok(Some(QuantizersAlone { output: output.to_string(), together, candidate_error, fault_threshold: pair.fault_threshold, each, not_measured }))
}
