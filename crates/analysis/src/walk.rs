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

use layerwise_model::fp16::FP16_UNIT_ROUNDOFF;
use layerwise_model::{GraphIndex, WeightRange};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::compare::{Comparison, TensorRecord};
use crate::num::FiniteOrString;

/// Thresholds of the walk.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WalkRule {
    /// How many times its largest input error a node's output error must be to introduce error.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub ratio: f64,
    /// Smallest output error (relative L2) that counts as a break.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub min_break: f64,
    /// Largest input error (relative L2) that is still drift rather than an earlier break.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub max_drift: f64,
}

impl WalkRule {
    /// FP16 candidates: rounding to FP16 alone gives a relative error of about 3e-4 per tensor;
    /// a break is at least an order of magnitude above the inputs and above 1%.
    pub const FP16: WalkRule = WalkRule { ratio: 10.0, min_break: 1e-2, max_drift: 5e-2 };
    /// Float32 candidates (another runtime, TF32): breaks are much smaller in absolute terms.
    pub const FP32: WalkRule = WalkRule { ratio: 10.0, min_break: 1e-4, max_drift: 1e-3 };
    /// BF16 candidates: FP16's thresholds scaled by BF16's 8x coarser rounding.
    pub const BF16: WalkRule = WalkRule { ratio: 10.0, min_break: 8e-2, max_drift: 0.4 };
}

/// What kind of cause a break has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    /// The reference value exceeds the FP16 range at this node: the candidate overflows to inf.
    ValueOverflow,
    /// A weight the node reads is out of FP16 range (inf after conversion).
    WeightOverflow,
    /// A constant or weight below half FP16's smallest subnormal (2^-25) becomes exactly 0 and
    /// reaches an op that turns 0 into inf/NaN (Log, Reciprocal, a Div's denominator, a negative
    /// Pow), typically as the epsilon of `x^2 + eps`.
    Underflow,
    /// A reduction whose kernel stores its running sum in FP16 (ReduceMean, ReduceLogSumExp on
    /// ONNX Runtime's CUDA provider, measured): the sum leaves FP16's range though the result
    /// does not.
    AccumulatorOverflow,
    /// The node turns finite inputs into inf/NaN without its reference exceeding the FP16 range.
    NonFiniteProduced,
    /// The node amplifies small input error (Softmax, Div, Exp, Pow, normalisations, ...).
    Amplification,
    /// The node itself loses precision (values in the FP16 subnormal range, cancellation).
    PrecisionLoss,
    /// A float32 Conv/MatMul/Gemm that the candidate ran with TF32 tensor cores (10-bit mantissa).
    Tf32,
    /// A saturating activation (Sigmoid, Tanh, Exp, Softplus) in its flat region: its relative
    /// output error is the absolute error of its input, however small that is relatively.
    Saturation,
    /// Softmax/LogSoftmax on large logits: it depends on the absolute differences of its inputs,
    /// and a small relative error of a large logit is a large absolute one.
    LargeLogits,
    /// A kernel that rounds inside its formula (ONNX Runtime's CUDA BF16 Sigmoid, FP16/BF16
    /// Softplus, measured): small outputs keep only an absolute precision.
    KernelRounding,
    /// An Add (or Sub) stores its result where the format's step is not small against what it
    /// adds: the smaller operand is lost in one rounding (`x + 65504` in FP16, step 32), and a
    /// later subtraction of the large part returns only that rounding error.
    Absorption,
    /// A subtraction whose result is far below its operands: all that is left is the rounding
    /// error the operands were stored with (the step of the format at their magnitude).
    Cancellation,
    /// The argument of a periodic function (Sin, Cos) is stored where the format's step is a
    /// sizable share of the period 2*pi: what the function returns of it is noise.
    PeriodicArgument,
}

/// The arithmetic the candidate computes in: which causes can apply to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arithmetic {
    /// float32 (another runtime, other kernels, TF32 when `Candidate::tf32`).
    #[default]
    Fp32,
    /// FP16 storage or FP16 kernels (emulated, a converted model, a GPU provider in FP16).
    Fp16,
    /// BF16 storage or kernels: float32's range, 8 significant bits.
    Bf16,
}

impl Arithmetic {
    /// Relative error of one rounding in this arithmetic (half an ulp at 1.0).
    pub fn unit_roundoff(self, tf32: bool) -> f64 {
        match (self, tf32) {
            (Arithmetic::Fp16, _) | (Arithmetic::Fp32, true) => FP16_UNIT_ROUNDOFF,
            (Arithmetic::Bf16, _) => 1.0 / 256.0,
            (Arithmetic::Fp32, false) => f32::EPSILON as f64 / 2.0,
        }
    }

    /// The distance between neighbouring values of this arithmetic's storage at magnitude `x`
    /// (`None` for float32).
    pub fn spacing(self, x: f64) -> Option<f64> {
        if !(x > 0.0 && x.is_finite()) {
            return None;
        }
        let e = x.log2().floor();
        match self {
            // Below the smallest normal the spacing stays that of 2^-14; above 65504 is inf.
            Arithmetic::Fp16 => Some(2f64.powf(e.clamp(-14.0, 15.0) - 10.0)),
            Arithmetic::Bf16 => Some(2f64.powf(e.max(-126.0) - 7.0)),
            Arithmetic::Fp32 => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arithmetic::Fp16 => "FP16",
            Arithmetic::Bf16 => "BF16",
            Arithmetic::Fp32 => "float32",
        }
    }
}

/// What the walk knows about the candidate beyond its numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Candidate {
    pub arithmetic: Arithmetic,
    /// The candidate runs float32 matrix products and convolutions with TF32 (ONNX Runtime CUDA's
    /// default, TensorRT's default).
    pub tf32: bool,
    /// The absolute tolerance: an absolute error below it is not material.
    pub atol: f64,
}

/// One mechanism that may account for a node's output error, with how much of it it explains.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Mechanism {
    pub kind: CauseKind,
    /// The weight at fault, for `weight_overflow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
    /// Share of the observed error this mechanism can account for, from the measured numbers
    /// (1 = all of it); `null` where it cannot be estimated from them.
    #[serde(default, with = "crate::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub explains: Option<f64>,
    /// One sentence for people, with the numbers that show it.
    pub detail: String,
}

/// Why a node breaks: the mechanism that explains most of its error (its fields at the top level
/// of the JSON), and the others considered.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Cause {
    #[serde(flatten)]
    pub best: Mechanism,
    /// Other mechanisms that apply to the candidate's arithmetic, best first.
    pub alternatives: Vec<Mechanism>,
}

/// The measured numbers a cause is drawn from (the reference's magnitudes and the candidate's
/// errors), for the node's largest-error data input and its output.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct Evidence {
    /// max |x| of the input in the reference; `null` when no input was compared.
    #[serde(default, with = "crate::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub input_max_abs: Option<f64>,
    /// max |cand - ref| of that input.
    #[serde(default, with = "crate::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub input_max_abs_err: Option<f64>,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_max_abs: f64,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_max_abs_err: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FirstDivergent {
    pub node: String,
    pub op_type: String,
    pub tensor: String,
    /// Largest relative L2 error among the node's data inputs (graph inputs are exact); `null`
    /// when one of them was not compared.
    #[serde(default, with = "crate::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub input_error: Option<f64>,
    /// Relative L2 error of the node's output.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_error: f64,
    pub evidence: Evidence,
    pub cause: Cause,
}

/// Where the walk cannot see further back: a node on the error's path whose data inputs were not
/// all compared (another model's names, a fused-away tensor), so the error may enter there or
/// anywhere before it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SightEnd {
    pub node: String,
    pub op_type: String,
    pub tensor: String,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_error: f64,
    /// The node's data inputs that were not compared, with the reason.
    pub unseen_inputs: Vec<(String, String)>,
}

/// One step of the blame chain, from the worst output back towards the first divergent node.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ChainStep {
    pub tensor: String,
    pub node: String,
    pub op_type: String,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub error: f64,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub max_abs_err: f64,
    pub nonfinite: usize,
}

/// A tensor where the candidate has inf/NaN that the reference does not.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Diverged,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
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
    /// Set when the walk reached a node whose inputs were not compared: no node further back can
    /// be named, and none at or after it is called the origin.
    pub sight_ends: Option<SightEnd>,
    /// What the runs after the walk found (run alone, keeping breaks at reference precision, the
    /// noise floor), one sentence each, in the order every report shows them.
    pub conclusions: Vec<String>,
}

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
    // An output a node computes comes first: an input passed straight through has no node to
    // walk back from, and is the worst only where nothing computed fails.
    let computed = |r: &TensorRecord| index.producer_index(&r.name).is_some();
    let worst = outputs
        .iter()
        .filter(|r| !r.pass)
        .max_by(|a, b| computed(a).cmp(&computed(b)).then(a.error_level().total_cmp(&b.error_level())).then(b.topo_index.cmp(&a.topo_index)))
        .copied();
    let mut verdict = Verdict {
        status,
        worst_output: worst.map(|r| r.name.clone()),
        first_divergent: None,
        chain: Vec::new(),
        summary: String::new(),
        non_finite: Vec::new(),
        breaks: Vec::new(),
        sight_ends: None,
        conclusions: Vec::new(),
    };

    if let Some(worst) = worst {
        let mut current = worst;
        // Breaking nodes whose inputs were already broken: (chain length at that node, finding).
        let mut earlier_breaks: Vec<(usize, FirstDivergent)> = Vec::new();
        loop {
            verdict.chain.push(step(current));
            let Some(node) = index.producer(&current.name) else { break };
            let inputs = InputView::of(index, comparison, node);
            let output_error = current.error_level();
            // The error may come from an input nobody measured: the walk cannot go on, and no node
            // from here on can be called the origin.
            if !inputs.unseen.is_empty() && (output_error >= rule.min_break || current.metrics.nonfinite_mismatch > 0) {
                verdict.sight_ends = Some(SightEnd::at(node, current, inputs.unseen));
                break;
            }
            if let Some(finding) = judge_node(index, comparison, weight_ranges, rule, candidate, node, current) {
                verdict.breaks.push(finding.clone());
                if finding.input_error.is_some_and(|e| e < rule.max_drift) {
                    verdict.first_divergent = Some(finding);
                    break;
                }
                earlier_breaks.push((verdict.chain.len(), finding));
            }
            // Follow the input carrying the most error; stop if none carries any worth following.
            let next = inputs.seen.iter().max_by(|a, b| a.error_level().total_cmp(&b.error_level())).copied();
            match next {
                Some(next) if next.error_level() > 0.0 && output_error >= rule.min_break => current = next,
                _ => break,
            }
        }
        if verdict.first_divergent.is_none() && verdict.sight_ends.is_none() {
            if let Some((len, finding)) = earlier_breaks.pop() {
                verdict.chain.truncate(len);
                verdict.first_divergent = Some(finding);
            }
        }
        // A cancellation or a periodic function only shows what an earlier rounding lost: name the
        // node whose stored output lost it.
        if let Some((steps, origin)) = verdict.first_divergent.as_ref().and_then(|fd| crate::storage::origin(index, comparison, candidate, fd)) {
            verdict.chain.extend(steps.into_iter().map(step));
            verdict.breaks.push(origin.clone());
            verdict.first_divergent = Some(origin);
        }
    }

    finish(&mut verdict, index, comparison, rule);
    verdict
}

/// A node's data inputs (weights excluded, the tensors its bodies read from the outer scope
/// included), sorted by what is known of them.
pub(crate) struct InputView<'a> {
    /// Compared in both runs.
    pub(crate) seen: Vec<&'a TensorRecord>,
    /// Not compared, with the reason: their error is unknown.
    pub(crate) unseen: Vec<(String, String)>,
}

impl<'a> InputView<'a> {
    pub(crate) fn of(index: &GraphIndex, comparison: &'a Comparison, node: &layerwise_model::NodeInfo) -> InputView<'a> {
        let mut view = InputView { seen: Vec::new(), unseen: Vec::new() };
        for t in node.all_inputs().filter(|t| !index.is_constant_like(t)) {
            match comparison.get(t) {
                // Both runs are fed the same graph inputs: they are exact (also where one is an
                // output too, and compared as the candidate returns it).
                _ if index.is_graph_input(t) => {}
                Some(r) => view.seen.push(r),
                None => {
                    let why = comparison.not_compared.iter().find(|(n, _)| n == t).map_or("not compared".to_string(), |(_, r)| r.clone());
                    view.unseen.push((t.clone(), why));
                }
            }
        }
        view
    }

    /// The largest input error, or `None` when an input was not compared.
    pub(crate) fn error(&self) -> Option<f64> {
        self.unseen.is_empty().then(|| self.seen.iter().map(|r| r.error_level()).fold(0.0, f64::max))
    }

    /// The compared input with the largest error.
    pub(crate) fn worst(&self) -> Option<&'a TensorRecord> {
        self.seen.iter().max_by(|a, b| a.error_level().total_cmp(&b.error_level())).copied()
    }
}

impl SightEnd {
    fn at(node: &layerwise_model::NodeInfo, output: &TensorRecord, unseen_inputs: Vec<(String, String)>) -> SightEnd {
        SightEnd { node: node.name.clone(), op_type: node.op_type.clone(), tensor: output.name.clone(), output_error: output.error_level(), unseen_inputs }
    }
}

/// Whether `node`, whose output record is `output`, breaks by the rule (see the module docs), and
/// if so the finding with its cause. A node with an input that was not compared never breaks: its
/// error may come from that input.
pub fn judge_node(
    index: &GraphIndex,
    comparison: &Comparison,
    weight_ranges: &[WeightRange],
    rule: WalkRule,
    candidate: Candidate,
    node: &layerwise_model::NodeInfo,
    output: &TensorRecord,
) -> Option<FirstDivergent> {
    let inputs = InputView::of(index, comparison, node);
    let input_error = inputs.error()?;
    let output_error = output.error_level();
    let nonfinite_in = inputs.seen.iter().any(|r| r.metrics.nonfinite_mismatch > 0);
    let breaks = if output.metrics.nonfinite_mismatch > 0 {
        !nonfinite_in
    } else {
        output_error >= rule.min_break && output_error >= rule.ratio * input_error
    };
    if !breaks {
        return None;
    }
    let worst_input = inputs.worst();
    let evidence = Evidence {
        input_max_abs: worst_input.map(|r| r.metrics.ref_max_abs),
        input_max_abs_err: worst_input.map(|r| r.metrics.max_abs_err),
        output_max_abs: output.metrics.ref_max_abs,
        output_max_abs_err: output.metrics.max_abs_err,
    };
    let cause = crate::causes::classify(&crate::causes::Site::new(index, comparison, weight_ranges, node, output, worst_input, input_error, candidate));
    Some(FirstDivergent { node: node.name.clone(), op_type: node.op_type.clone(), tensor: output.name.clone(), input_error: Some(input_error), output_error, evidence, cause })
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
        sight_ends: None,
        conclusions: Vec::new(),
    };
    if status == Status::Diverged {
        if let Some(info) = node.and_then(|n| index.node(n)) {
            let output = info.outputs.iter().filter_map(|o| comparison.get(o)).max_by(|a, b| a.error_level().total_cmp(&b.error_level()));
            if let Some(output) = output {
                let inputs = InputView::of(index, comparison, info);
                if !inputs.unseen.is_empty() {
                    verdict.sight_ends = Some(SightEnd::at(info, output, inputs.unseen));
                } else if let Some(finding) = judge_node(index, comparison, weight_ranges, rule, candidate, info, output) {
                    verdict.breaks.push(finding.clone());
                    verdict.first_divergent = Some(finding);
                }
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
        // Born here when every input is known to be free of such mismatches (an input that was
        // not compared leaves the origin unknown).
        // A graph input passed straight to an output is born at no node.
        let origin = index
            .producer(&record.name)
            .map(|n| {
                let inputs = InputView::of(index, comparison, n);
                inputs.unseen.is_empty() && !inputs.seen.iter().any(|r| r.metrics.nonfinite_mismatch > 0)
            })
            .unwrap_or(!index.is_graph_input(&record.name));
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
    // A model output neither run compared (a weight passed straight to the output) is named, so
    // that no summary claims every output.
    let mut unseen: Vec<&str> = Vec::new();
    for o in index.outputs.iter().filter(|o| comparison.get(o).is_none()) {
        if !unseen.contains(&o.as_str()) {
            unseen.push(o);
        }
    }
    if !unseen.is_empty() {
        if verdict.status == Status::Pass {
            verdict.summary = "all compared model outputs are within tolerance".to_string();
        }
        for o in unseen {
            let why = match comparison.not_compared.iter().find(|(t, _)| t == o) {
                Some((_, why)) => format!(": {why}"),
                None if crate::compare::is_weight_output(index, o) => format!(": {}", crate::compare::WEIGHT_OUTPUT),
                None => String::new(),
            };
            verdict.summary.push_str(&format!("; output '{o}' was not compared{why}"));
        }
    }
}

fn summarize(v: &Verdict, rule: WalkRule) -> String {
    let worst = v.worst_output.as_deref().unwrap_or("?");
    match (&v.status, &v.first_divergent, &v.sight_ends) {
        (Status::Pass, _, _) => "all model outputs are within tolerance".to_string(),
        (Status::Diverged, None, None) if v.chain.len() == 1 && v.chain[0].node.is_empty() => format!(
            "output '{worst}' diverges: it is the model's input passed straight through, and the candidate returns it otherwise than it was fed (stored in the type the candidate model declares for that input)"
        ),
        (Status::Diverged, _, Some(end)) => format!(
            "output '{worst}' diverges; its error can be followed back to node '{}' ({}), whose input{} {} {} not compared, so the error enters there or before it: layerwise cannot see further",
            end.node,
            end.op_type,
            if end.unseen_inputs.len() == 1 { "" } else { "s" },
            end.unseen_inputs.iter().map(|(t, _)| format!("'{t}'")).collect::<Vec<_>>().join(", "),
            if end.unseen_inputs.len() == 1 { "was" } else { "were" }
        ),
        (Status::Diverged, Some(fd), None) => format!("output '{worst}' diverges; the error starts at node '{}' ({}): {}", fd.node, fd.op_type, fd.cause.best.detail),
        (Status::Diverged, None, None) => format!(
            "output '{worst}' diverges, but no single node introduces the error: it is drift that grows along the {}-step chain shown (no node raises its input error {}x or more)",
            v.chain.len(),
            rule.ratio
        ),
    }
}
