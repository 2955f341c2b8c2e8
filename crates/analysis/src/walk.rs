//! The walk back from the worst output to the first divergent layer.
//!
//! Start at the model output with the largest error and follow the error backwards through the
//! producer graph, at each node into the (non-weight) input that carries the most error. A node
//! *breaks* when
//! - it produces inf/NaN from finite inputs, or
//! - its output error (relative L2) is at least `ratio` times its largest input error, and at least
//!   `min_break` in absolute terms (so rounding noise at the first layers is never a break).
//!
//! The walk stops at the first breaking node, seen from the output, whose inputs carry only
//! drift-level error (below `max_drift`): that node introduces the error. A breaking node whose
//! inputs are already broken is remembered and the walk goes on past it; if nothing further back
//! qualifies, the earliest breaking node seen is named. No breaking node at all means drift.
//!
//! Both thresholds are relative to the inputs' error, never one absolute tolerance, so a sensitive
//! layer is still named when the error has already drifted to a fraction of a percent before it,
//! and error that grows a little at every layer (drift) is never blamed on one node.

use layerwise_model::fp16::FP16_MAX;
use layerwise_model::{GraphIndex, WeightRange};
use serde::Serialize;

use crate::compare::{Comparison, TensorRecord};

/// Thresholds of the walk.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WalkRule {
    /// How many times its largest input error a node's output error must be to introduce error.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub ratio: f64,
    /// Smallest output error (relative L2) that counts as a break.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub min_break: f64,
    /// Largest input error (relative L2) that is still drift rather than an earlier break.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub max_drift: f64,
}

impl WalkRule {
    /// FP16 candidates: rounding to FP16 alone gives a relative error of about 3e-4 per tensor;
    /// a break is at least an order of magnitude above the inputs and above 1%.
    pub const FP16: WalkRule = WalkRule { ratio: 10.0, min_break: 1e-2, max_drift: 5e-2 };
    /// Float32 candidates (another runtime, TF32): breaks are much smaller in absolute terms.
    pub const FP32: WalkRule = WalkRule { ratio: 10.0, min_break: 1e-4, max_drift: 1e-3 };
}

/// What kind of cause a break has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    /// The reference value exceeds the FP16 range at this node: the candidate overflows to inf.
    ValueOverflow,
    /// A weight the node reads is out of FP16 range (inf after conversion).
    WeightOverflow,
    /// The node turns finite inputs into inf/NaN without its reference exceeding the FP16 range.
    NonFiniteProduced,
    /// The node amplifies small input error (Softmax, Div, Exp, Pow, normalisations, ...).
    Amplification,
    /// The node itself loses precision (values in the FP16 subnormal range, cancellation).
    PrecisionLoss,
    /// A float32 Conv/MatMul/Gemm that the candidate ran with TF32 tensor cores (10-bit mantissa).
    Tf32,
}

/// What the walk knows about the candidate beyond its numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Candidate {
    /// The candidate runs float32 matrix products and convolutions with TF32 (ONNX Runtime CUDA's
    /// default, TensorRT's default).
    pub tf32: bool,
}

/// Ops whose float32 arithmetic TF32 replaces.
const TF32_OPS: &[&str] = &["MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "FusedMatMul", "Attention"];

#[derive(Debug, Clone, Serialize)]
pub struct Cause {
    pub kind: CauseKind,
    /// The weight at fault, for `weight_overflow`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
    /// One sentence for people.
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct FirstDivergent {
    pub node: String,
    pub op_type: String,
    pub tensor: String,
    /// Largest relative L2 error among the node's non-weight inputs.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub input_error: f64,
    /// Relative L2 error of the node's output.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub output_error: f64,
    pub cause: Cause,
}

/// One step of the blame chain, from the worst output back towards the first divergent node.
#[derive(Debug, Clone, Serialize)]
pub struct ChainStep {
    pub tensor: String,
    pub node: String,
    pub op_type: String,
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub error: f64,
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub max_abs_err: f64,
    pub nonfinite: usize,
}

/// A tensor where the candidate has inf/NaN that the reference does not.
#[derive(Debug, Clone, Serialize)]
pub struct NonFiniteTensor {
    pub tensor: String,
    pub node: String,
    pub op_type: String,
    pub cand_nan: usize,
    pub cand_inf: usize,
    pub mismatched: usize,
    /// True where the node's own inputs are free of such mismatches: the inf/NaN is born here.
    pub origin: bool,
    pub on_chain: bool,
    /// A weight or a value computed from weights alone (out of FP16 range), not a layer output.
    pub weight: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Diverged,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub status: Status,
    pub worst_output: Option<String>,
    pub first_divergent: Option<FirstDivergent>,
    pub chain: Vec<ChainStep>,
    /// One paragraph for people: what was found, or why no single node is to blame.
    pub summary: String,
    pub non_finite: Vec<NonFiniteTensor>,
    /// Every breaking node the walk passed, from the output back (the first divergent included):
    /// each is a candidate for the counterfactual check.
    pub breaks: Vec<FirstDivergent>,
}

/// Ops known to amplify relative input error.
const SENSITIVE_OPS: &[&str] = &[
    "Softmax", "LogSoftmax", "Div", "Reciprocal", "Exp", "Pow", "Log", "Sqrt", "Sub",
    "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "LayerNormalization", "InstanceNormalization",
    "GroupNormalization", "BatchNormalization", "Erf", "Tan", "Atan",
];

fn step(record: &TensorRecord) -> ChainStep {
    ChainStep {
        tensor: record.name.clone(),
        node: record.node.clone(),
        op_type: record.op_type.clone(),
        error: record.error_level(),
        max_abs_err: record.metrics.max_abs_err,
        nonfinite: record.metrics.nonfinite_mismatch,
    }
}

/// Finds the first divergent layer. `weight_ranges` lists weights out of FP16 range (empty for
/// float32 candidates).
pub fn walk_back(index: &GraphIndex, comparison: &Comparison, weight_ranges: &[WeightRange], rule: WalkRule, candidate: Candidate) -> Verdict {
    let outputs: Vec<&TensorRecord> = index.outputs.iter().filter_map(|o| comparison.get(o)).collect();
    let status = if outputs.iter().all(|r| r.pass) { Status::Pass } else { Status::Diverged };
    let worst = outputs
        .iter()
        .filter(|r| !r.pass)
        .max_by(|a, b| a.error_level().total_cmp(&b.error_level()).then(b.topo_index.cmp(&a.topo_index)))
        .copied();
    let mut verdict = Verdict {
        status,
        worst_output: worst.map(|r| r.name.clone()),
        first_divergent: None,
        chain: Vec::new(),
        summary: String::new(),
        non_finite: Vec::new(),
        breaks: Vec::new(),
    };

    if let Some(worst) = worst {
        let mut current = worst;
        // Breaking nodes whose inputs were already broken: (chain length at that node, finding).
        let mut earlier_breaks: Vec<(usize, FirstDivergent)> = Vec::new();
        loop {
            verdict.chain.push(step(current));
            let Some(node) = index.producer(&current.name) else { break };
            let data_inputs = data_inputs(index, comparison, node);
            let output_error = current.error_level();
            if let Some(finding) = judge_node(index, comparison, weight_ranges, rule, candidate, node, current) {
                verdict.breaks.push(finding.clone());
                if finding.input_error < rule.max_drift {
                    verdict.first_divergent = Some(finding);
                    break;
                }
                earlier_breaks.push((verdict.chain.len(), finding));
            }
            // Follow the input carrying the most error; stop if none carries any worth following.
            let next = data_inputs.iter().max_by(|a, b| a.error_level().total_cmp(&b.error_level())).copied();
            match next {
                Some(next) if next.error_level() > 0.0 && output_error >= rule.min_break => current = next,
                _ => break,
            }
        }
        if verdict.first_divergent.is_none() {
            if let Some((len, finding)) = earlier_breaks.pop() {
                verdict.chain.truncate(len);
                verdict.first_divergent = Some(finding);
            }
        }
    }

    finish(&mut verdict, index, comparison, rule);
    verdict
}

/// The non-blank, non-weight inputs of `node` that were compared.
fn data_inputs<'a>(index: &GraphIndex, comparison: &'a Comparison, node: &layerwise_model::NodeInfo) -> Vec<&'a TensorRecord> {
    node.inputs.iter().filter(|i| !i.is_empty() && !index.is_constant_like(i)).filter_map(|i| comparison.get(i)).collect()
}

/// Whether `node`, whose output record is `output`, breaks by the rule (see the module docs), and
/// if so the finding with its cause. Its data inputs must have been compared.
pub fn judge_node(
    index: &GraphIndex,
    comparison: &Comparison,
    weight_ranges: &[WeightRange],
    rule: WalkRule,
    candidate: Candidate,
    node: &layerwise_model::NodeInfo,
    output: &TensorRecord,
) -> Option<FirstDivergent> {
    let inputs = data_inputs(index, comparison, node);
    let input_error = inputs.iter().map(|r| r.error_level()).fold(0.0, f64::max);
    let output_error = output.error_level();
    let nonfinite_in = inputs.iter().any(|r| r.metrics.nonfinite_mismatch > 0);
    let breaks = if output.metrics.nonfinite_mismatch > 0 {
        !nonfinite_in
    } else {
        output_error >= rule.min_break && output_error >= rule.ratio * input_error
    };
    breaks.then(|| FirstDivergent {
        node: node.name.clone(),
        op_type: node.op_type.clone(),
        tensor: output.name.clone(),
        input_error,
        output_error,
        cause: classify(index, comparison, weight_ranges, node, output, input_error, candidate),
    })
}

/// The verdict of a search-marked run (see `search`): the first divergent node the search
/// settled on, judged by the same rule as the walk, and the measured chain from the worst output
/// back to it (tensor names, output first).
pub fn verdict_from_chain(
    index: &GraphIndex,
    comparison: &Comparison,
    weight_ranges: &[WeightRange],
    rule: WalkRule,
    candidate: Candidate,
    chain: &[String],
    node: Option<&str>,
) -> Verdict {
    let outputs: Vec<&TensorRecord> = index.outputs.iter().filter_map(|o| comparison.get(o)).collect();
    let status = if outputs.iter().all(|r| r.pass) { Status::Pass } else { Status::Diverged };
    let mut verdict = Verdict {
        status,
        worst_output: chain.first().cloned().filter(|_| status == Status::Diverged),
        first_divergent: None,
        chain: chain.iter().filter_map(|t| comparison.get(t)).map(step).collect(),
        summary: String::new(),
        non_finite: Vec::new(),
        breaks: Vec::new(),
    };
    if status == Status::Diverged {
        if let Some(info) = node.and_then(|n| index.node(n)) {
            let output = info.outputs.iter().filter_map(|o| comparison.get(o)).max_by(|a, b| a.error_level().total_cmp(&b.error_level()));
            if let Some(finding) = output.and_then(|o| judge_node(index, comparison, weight_ranges, rule, candidate, info, o)) {
                verdict.breaks.push(finding.clone());
                verdict.first_divergent = Some(finding);
            }
        }
    }
    finish(&mut verdict, index, comparison, rule);
    verdict
}

/// Lists the tensors with inf/NaN mismatches (and where each is born) and writes the summary.
fn finish(verdict: &mut Verdict, index: &GraphIndex, comparison: &Comparison, rule: WalkRule) {
    let chain_tensors: std::collections::HashSet<&str> = verdict.chain.iter().map(|s| s.tensor.as_str()).collect();
    for record in comparison.records.iter().filter(|r| r.metrics.nonfinite_mismatch > 0) {
        let origin = index
            .producer(&record.name)
            .map(|n| {
                !n.inputs
                    .iter()
                    .filter(|i| !i.is_empty())
                    .filter_map(|i| comparison.get(i))
                    .any(|r| r.metrics.nonfinite_mismatch > 0)
            })
            .unwrap_or(true);
        verdict.non_finite.push(NonFiniteTensor {
            tensor: record.name.clone(),
            node: record.node.clone(),
            op_type: record.op_type.clone(),
            cand_nan: record.metrics.cand_nan,
            cand_inf: record.metrics.cand_inf,
            mismatched: record.metrics.nonfinite_mismatch,
            origin,
            on_chain: chain_tensors.contains(record.name.as_str()),
            weight: record.constant_like,
        });
    }
    verdict.summary = summarize(verdict, rule);
}

fn classify(
    index: &GraphIndex,
    comparison: &Comparison,
    weight_ranges: &[WeightRange],
    node: &layerwise_model::NodeInfo,
    output: &TensorRecord,
    input_error: f64,
    candidate: Candidate,
) -> Cause {
    // A weight input (or a weight-derived input) that is out of FP16 range.
    for input in node.inputs.iter().filter(|i| !i.is_empty() && index.is_constant_like(i)) {
        let range = weight_ranges.iter().find(|w| w.name == *input && w.overflow_count > 0);
        let computed = comparison.get(input).filter(|r| r.metrics.nonfinite_mismatch > 0);
        if range.is_some() || computed.is_some() {
            let detail = match range {
                Some(w) => format!(
                    "weight '{}' has {} of {} values beyond the FP16 range (max |w| = {:.4e} > {FP16_MAX}); they become inf in FP16",
                    w.name, w.overflow_count, w.numel, w.max_abs
                ),
                None => format!("weight-derived input '{input}' becomes inf/NaN in FP16"),
            };
            return Cause { kind: CauseKind::WeightOverflow, weight: Some(input.clone()), detail };
        }
    }
    let m = &output.metrics;
    if candidate.tf32 && m.nonfinite_mismatch == 0 && TF32_OPS.contains(&node.op_type.as_str()) {
        return Cause {
            kind: CauseKind::Tf32,
            weight: None,
            detail: format!(
                "float32 {} ran with TF32 tensor cores (10-bit mantissa inputs): relative L2 {:.2e} -> {:.2e}; run the candidate with tf32=off to confirm",
                node.op_type,
                input_error,
                output.error_level()
            ),
        };
    }
    if m.nonfinite_mismatch > 0 {
        if m.ref_fp16_overflow > 0 || m.ref_max_abs > FP16_MAX as f64 {
            return Cause {
                kind: CauseKind::ValueOverflow,
                weight: None,
                detail: format!(
                    "{} output reaches {:.4e} in the reference, beyond the FP16 maximum {FP16_MAX}: {} values become inf/NaN",
                    node.op_type, m.ref_max_abs, m.nonfinite_mismatch
                ),
            };
        }
        return Cause {
            kind: CauseKind::NonFiniteProduced,
            weight: None,
            detail: format!("{} turns finite inputs into {} inf/NaN values", node.op_type, m.nonfinite_mismatch),
        };
    }
    if m.ref_fp16_subnormal_share > 0.1 {
        return Cause {
            kind: CauseKind::PrecisionLoss,
            weight: None,
            detail: format!(
                "{:.0}% of the reference values of {} are in the FP16 subnormal range and lose precision",
                100.0 * m.ref_fp16_subnormal_share,
                node.op_type
            ),
        };
    }
    let factor = if input_error > 0.0 { output.error_level() / input_error } else { f64::INFINITY };
    let sensitive = SENSITIVE_OPS.contains(&node.op_type.as_str());
    Cause {
        kind: if sensitive || input_error > 0.0 { CauseKind::Amplification } else { CauseKind::PrecisionLoss },
        weight: None,
        detail: if factor.is_finite() {
            format!(
                "{} amplifies its input error {:.1}x (relative L2 {:.2e} -> {:.2e}){}",
                node.op_type,
                factor,
                input_error,
                output.error_level(),
                if sensitive { "; it is a precision-sensitive op" } else { "" }
            )
        } else {
            format!("{} introduces a relative L2 error of {:.2e} from exact inputs", node.op_type, output.error_level())
        },
    }
}

fn summarize(v: &Verdict, rule: WalkRule) -> String {
    match (&v.status, &v.first_divergent) {
        (Status::Pass, _) => "all model outputs are within tolerance".to_string(),
        (Status::Diverged, Some(fd)) => format!(
            "output '{}' diverges; the error starts at node '{}' ({}): {}",
            v.worst_output.as_deref().unwrap_or("?"),
            fd.node,
            fd.op_type,
            fd.cause.detail
        ),
        (Status::Diverged, None) => format!(
            "output '{}' diverges, but no single node introduces the error: it is drift that grows along the {}-step chain shown (no node raises its input error {}x or more)",
            v.worst_output.as_deref().unwrap_or("?"),
            v.chain.len(),
            rule.ratio
        ),
    }
}
