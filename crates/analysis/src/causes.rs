//! The cause catalogue: one small function per mechanism, each declaring the arithmetic it applies
//! to. `classify` asks every mechanism that applies to the candidate, and ranks what they find by
//! the share of the measured error each accounts for. A new cause is a new function and a row of
//! `CATALOGUE`, not a branch in a shared one.

use layerwise_model::fp16::{FP16_MAX, FP16_UNIT_ROUNDOFF};
use layerwise_model::quant::{QuantizerEffect, QuantizerRange};
use layerwise_model::{GraphIndex, NodeInfo, WeightRange};

use crate::compare::{Comparison, TensorRecord};
use crate::metrics::Metrics;
use layerwise_model::Precision;

use crate::verdict::{Candidate, Cause, CauseKind, Mechanism};

/// The arithmetic a mechanism can arise in. A candidate may compute in more than one: a float32
/// candidate with TF32 on computes its products in TF32 and everything else in float32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numerics {
    Fp16,
    Bf16,
    /// float32 products and convolutions on TF32 tensor cores (`Candidate::tf32`).
    Tf32,
    Fp32,
    /// Quantized by Q/DQ pairs (float32 between them, `Candidate::quantized`).
    Quantized,
}

impl Candidate {
    /// Whether the candidate computes any of its ops in `numerics`.
    pub fn computes_in(self, numerics: Numerics) -> bool {
        match numerics {
            Numerics::Fp16 => self.arithmetic.storage() == Precision::Fp16,
            Numerics::Bf16 => self.arithmetic.storage() == Precision::Bf16,
            Numerics::Fp32 => self.arithmetic.storage() == Precision::Fp32,
            Numerics::Tf32 => self.arithmetic.tf32(),
            Numerics::Quantized => self.arithmetic.quantized().is_some(),
        }
    }
}

/// Every storage format and float32: a mechanism of the op itself, whatever it computes in.
const ANY: &[Numerics] = &[Numerics::Fp16, Numerics::Bf16, Numerics::Fp32];
/// Every arithmetic: a mechanism of rounding itself, whatever rounds.
const EVERY: &[Numerics] = &[Numerics::Fp16, Numerics::Bf16, Numerics::Fp32, Numerics::Tf32, Numerics::Quantized];
/// The reduced-precision storage formats, where a value's step grows with its magnitude.
const STORAGE: &[Numerics] = &[Numerics::Fp16, Numerics::Bf16];

/// One mechanism of the catalogue: the arithmetic it applies to, and how it is recognised at a
/// breaking node, with the share of the error it explains.
pub struct CauseRule {
    pub applies_to: &'static [Numerics],
    pub detect: fn(&Site) -> Option<Mechanism>,
}

/// The catalogue, in the order ties are ranked.
pub const CATALOGUE: &[CauseRule] = &[
    CauseRule { applies_to: STORAGE, detect: weight_overflow },
    CauseRule { applies_to: &[Numerics::Fp16], detect: underflow },
    CauseRule { applies_to: &[Numerics::Fp16], detect: accumulator_overflow },
    CauseRule { applies_to: STORAGE, detect: value_overflow },
    CauseRule { applies_to: &[Numerics::Quantized], detect: quantizer_clipping },
    CauseRule { applies_to: &[Numerics::Quantized], detect: quantizer_outlier_step },
    CauseRule { applies_to: &[Numerics::Quantized], detect: quantizer_part_step },
    CauseRule { applies_to: &[Numerics::Quantized], detect: per_tensor_weight },
    CauseRule { applies_to: &[Numerics::Quantized], detect: integer_accumulator_overflow },
    CauseRule { applies_to: &[Numerics::Quantized], detect: quantized_denominator },
    CauseRule { applies_to: &[Numerics::Quantized], detect: quantizer_zero_point },
    CauseRule { applies_to: EVERY, detect: integer_boundary },
    CauseRule { applies_to: ANY, detect: non_finite_input },
    CauseRule { applies_to: ANY, detect: non_finite_produced },
    CauseRule { applies_to: ANY, detect: saturation },
    CauseRule { applies_to: ANY, detect: large_logits },
    CauseRule { applies_to: STORAGE, detect: kernel_rounding },
    CauseRule { applies_to: &[Numerics::Tf32], detect: tf32 },
    CauseRule { applies_to: &[Numerics::Fp16], detect: subnormal_storage },
    CauseRule { applies_to: STORAGE, detect: cancellation },
    CauseRule { applies_to: STORAGE, detect: periodic_argument },
    CauseRule { applies_to: ANY, detect: rounding_of_exact_inputs },
    CauseRule { applies_to: ANY, detect: amplification },
];

/// What a mechanism sees of a breaking node: its output, its largest-error data input, and the
/// candidate.
pub struct Site<'a> {
    pub index: &'a GraphIndex,
    pub comparison: &'a Comparison,
    pub weight_ranges: &'a [WeightRange],
    pub node: &'a NodeInfo,
    pub op: &'a str,
    pub output: &'a TensorRecord,
    pub input: Option<&'a TensorRecord>,
    /// The largest relative L2 error among the node's data inputs.
    pub input_error: f64,
    pub candidate: Candidate,
    /// The output's relative L2 error (inf on an inf/NaN mismatch).
    pub out_rel: f64,
}

impl<'a> Site<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: &'a GraphIndex,
        comparison: &'a Comparison,
        weight_ranges: &'a [WeightRange],
        node: &'a NodeInfo,
        output: &'a TensorRecord,
        input: Option<&'a TensorRecord>,
        input_error: f64,
        candidate: Candidate,
    ) -> Site<'a> {
        Site {
            index,
            comparison,
            weight_ranges,
            node,
            op: node.op_type.as_str(),
            output,
            input,
            input_error,
            candidate,
            out_rel: output.error_level(),
        }
    }

    fn m(&self) -> &Metrics {
        &self.output.metrics
    }

    /// Share of the observed relative error that a predicted one accounts for.
    fn share(&self, predicted: f64) -> f64 {
        if self.out_rel.is_finite() && self.out_rel > 0.0 {
            (predicted / self.out_rel).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// The output has inf/NaN where the reference does not.
    fn non_finite(&self) -> bool {
        self.m().nonfinite_mismatch > 0
    }

    /// The node's data inputs that hold inf/NaN on either side (see
    /// `Comparison::nonfinite_inputs_of`).
    fn nonfinite_inputs(&self) -> Vec<(String, usize, usize)> {
        self.comparison.nonfinite_inputs_of(self.index, self.node)
    }

    /// The node reads inf/NaN and its output holds fewer in the candidate than in the reference:
    /// the candidate carries the inputs' inf/NaN as finite values (an integer code has none).
    /// Where the candidate holds more, they arise here, whatever the inputs hold.
    fn carries_input_nonfinite(&self) -> bool {
        let (reference, candidate) = self.m().nonfinite_counts();
        candidate < reference && !self.nonfinite_inputs().is_empty()
    }

    /// A weight or weight-derived input holds inf/NaN in the candidate and not in the reference:
    /// the inputs are not finite, whatever the walk's view of data inputs says.
    fn reads_nonfinite_weight(&self) -> bool {
        self.node
            .inputs
            .iter()
            .filter(|i| !i.is_empty() && self.index.is_constant_like(i))
            .any(|w| self.comparison.get(w).is_some_and(|r| r.metrics.nonfinite_mismatch > 0))
    }

    /// The largest-error input, where it is free of inf/NaN mismatches: what mechanisms of the
    /// input's absolute error read.
    fn finite_input(&self) -> Option<&'a TensorRecord> {
        self.input.filter(|r| r.metrics.nonfinite_mismatch == 0)
    }

    fn is_tf32_op(&self) -> bool {
        self.candidate.arithmetic.tf32() && TF32_OPS.contains(&self.op)
    }

    /// Whether the absolute output error matters, said with the numbers.
    fn materiality(&self) -> String {
        let (err, atol) = (self.m().max_abs_err, self.candidate.atol);
        if err > atol {
            format!("the absolute output error {err:.2e} is material (above atol {atol:.0e})")
        } else {
            format!("the absolute output error is only {err:.2e} (below atol {atol:.0e}): large relative to near-zero outputs, not material")
        }
    }
}

/// Every mechanism that applies to the candidate's arithmetic and this node, each with the share
/// of the observed error it can account for; the best becomes the cause.
pub fn classify(site: &Site) -> Cause {
    let mut found: Vec<Mechanism> = CATALOGUE
        .iter()
        .filter(|rule| rule.applies_to.iter().any(|&n| site.candidate.computes_in(n)))
        .filter_map(|rule| (rule.detect)(site))
        .collect();
    // Best first: measured shares, highest first; mechanisms that cannot be estimated after those
    // that explain at least half, before those that explain less.
    let rank = |m: &Mechanism| m.explains.unwrap_or(0.5);
    found.sort_by(|a, b| rank(b).total_cmp(&rank(a)));
    let mut found = found.into_iter();
    let best = found.next().unwrap_or(Mechanism {
        kind: CauseKind::Amplification,
        weight: None,
        explains: None,
        detail: format!("{}: relative L2 {:.2e} -> {:.2e}", site.op, site.input_error, site.out_rel),
    });
    Cause { best, alternatives: found.collect() }
}

fn mechanism(kind: CauseKind, explains: Option<f64>, detail: String) -> Option<Mechanism> {
    Some(Mechanism { kind, weight: None, explains, detail })
}

/// The activation quantizers at a node: the one holding its output, then those on its data
/// inputs (the candidate's node reads their dequantized values), each with what it does to the
/// reference's values where that was measured, and whether it is the output's.
fn quantizers_at<'s>(s: &'s Site) -> Vec<(&'s str, &'s QuantizerRange, Option<&'s QuantizerEffect>, bool)> {
    let output = std::iter::once(s.output.name.as_str()).map(|t| (t, true));
    let inputs = s
        .node
        .inputs
        .iter()
        .filter(|i| !i.is_empty() && !s.index.is_constant_like(i) && **i != s.output.name)
        .map(|t| (t.as_str(), false));
    output
        .chain(inputs)
        .filter_map(|(t, is_output)| {
            s.comparison.quantizers.get(t).map(|q| (t, q, s.comparison.quantizer_effects.get(t), is_output))
        })
        .collect()
}

/// "quantizer of 'r'" for the node's output, "quantizer of its input 'x'" for an input.
fn quantizer_of(tensor: &str, is_output: bool) -> String {
    if is_output {
        format!("quantizer of '{tensor}'")
    } else {
        format!("quantizer of its input '{tensor}'")
    }
}

fn percent(part: usize, whole: usize) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

/// A quantizer whose range the reference's values leave: everything beyond it is clipped to its
/// end (a scale calibrated too small, or a few samples that never reached these values). How many
/// values and how far, measured on the reference's values where they were read.
fn quantizer_clipping(s: &Site) -> Option<Mechanism> {
    quantizers_at(s).into_iter().find_map(|(tensor, q, effect, is_output)| {
        let bound = q.hi.abs().max(q.lo.abs()) as f64;
        // A quantizer starting at 0 holds a Relu's output, which the reference never takes below 0.
        let end = if q.lo >= 0.0 { q.hi as f64 } else { bound };
        let err = s.output.metrics.max_abs_err;
        let (reach, beyond, counted) = match effect {
            Some(e) if e.clipped > 0 => {
                let counted = format!(
                    "{} of its {} values ({:.1}%) are beyond it and clipped to its end, by up to {:.4e} (mean {:.4e})",
                    e.clipped,
                    e.count,
                    percent(e.clipped, e.count),
                    e.max_overshoot,
                    e.mean_overshoot
                );
                (e.max_abs as f64, e.max_overshoot as f64, counted)
            }
            Some(_) => return None,
            // Not measured: the output's reach, from the comparison, is all that is known.
            None if is_output => {
                let reach = s.output.metrics.ref_max_abs;
                let beyond = reach - end;
                (reach, beyond, format!("values beyond it are clipped, by up to {beyond:.4e} (how many was not measured)"))
            }
            None => return None,
        };
        if !(beyond > 0.5 * q.scale as f64) {
            return None;
        }
        // Its own output: the clipped amount against the max abs error there; an input: the
        // quantized input's relative L2 error (measured on the reference) against the output's.
        let explains = match (is_output, effect.and_then(|e| e.rel_l2)) {
            (true, _) => Some(if err > 0.0 { (beyond / err).min(1.0) } else { 0.0 }),
            (false, Some(rel)) => Some(s.share(rel)),
            (false, None) => None,
        };
        // An integer MatMul/Gemm/Conv's output quantizer is the requantization of its int32 sums:
        // where the runtime fuses the pair, the kernel saturates them there.
        let producer = if is_output { Some(s.node) } else { s.index.producer(tensor) };
        let requantization = match producer.filter(|p| s.comparison.integer_accumulations.get(&p.name).is_some_and(|a| a.op == p.op_type)) {
            Some(p) => format!(" (the requantization of {} '{}''s int32 sums, which a fused integer kernel saturates)", p.op_type, p.name),
            None => String::new(),
        };
        mechanism(
            CauseKind::QuantizerClipping,
            explains,
            format!(
                "the candidate's {} {}{requantization} holds [{:.4e}, {:.4e}] (scale {:.4e}, zero point {}), while the reference reaches |x| = {reach:.4e}, {:.1}x its end: {counted}; the measured max abs error of '{}' is {err:.4e}",
                q.format.name(),
                quantizer_of(tensor, is_output),
                q.lo,
                q.hi,
                q.scale,
                q.zero_point,
                reach / end.max(f64::MIN_POSITIVE),
                s.output.name,
            ),
        )
    })
}

/// A per-tensor integer quantizer whose range a few outliers set: its step is so coarse against
/// the bulk of the values that they keep a few levels, or round to 0 (one channel far larger
/// than the others, as LLM activations have). Measured on the reference's values: the bulk's
/// rounding error with this step and with a step fit to the bulk.
fn quantizer_outlier_step(s: &Site) -> Option<Mechanism> {
    quantizers_at(s).into_iter().find_map(|(tensor, q, effect, is_output)| {
        let e = effect.filter(|e| e.step_forced_by_outliers())?;
        let (bulk, fit) = (e.bulk_rel_l2?, e.bulk_rel_l2_fit?);
        let (where_, rest_are) = match e.dominant_channel() {
            Some((c, rest)) => (format!(" in channel {c}"), format!("every other channel ({} values) stays within {rest:.4e}", e.bulk_count)),
            None => (String::new(), format!("{} values (99%) stay within {:.4e}", e.bulk_count, e.bulk)),
        };
        let whole = e.rel_l2.map_or(String::new(), |r| format!(", the whole tensor's {r:.2e}"));
        mechanism(
            CauseKind::QuantizerOutlierStep,
            Some(s.share(bulk)),
            format!(
                "the candidate's {} per-tensor {} has one step of {:.4e} for the whole tensor: its range [{:.4e}, {:.4e}] covers its largest value |x| = {:.4e}{where_}, while {rest_are}, {:.0}x less, and that step rounds {} of its {} values ({:.1}%) to 0; the bulk's quantization error is relative L2 {bulk:.2e}, against {fit:.2e} with a step fit to the bulk ({:.4e}){whole} (measured on the reference's values); measured relative L2 of '{}' {:.2e}",
                q.format.name(),
                quantizer_of(tensor, is_output),
                q.scale,
                q.lo,
                q.hi,
                e.max_abs,
                e.max_abs / e.bulk,
                e.to_zero,
                e.count,
                percent(e.to_zero, e.count),
                e.bulk_scale,
                s.output.name,
                s.out_rel,
            ),
        )
    })
}

/// A per-tensor quantizer of a model output judged part by part (a Concat joins parts of very
/// different scale): its one step, fit to the largest part, leaves a small one a few levels or none.
/// Measured on the reference's values, part by part.
fn quantizer_part_step(s: &Site) -> Option<Mechanism> {
    let judged = s.output.metrics.parts.as_ref()?;
    quantizers_at(s).into_iter().find_map(|(tensor, q, effect, is_output)| {
        let e = effect?;
        let loss = e.worst_part.filter(|l| l.axis == judged.axis)?;
        let levels = loss.range / q.scale as f64;
        // Coarse for that part: fewer than 16 steps over its range.
        if !(levels < 16.0) {
            return None;
        }
        let last = loss.first + loss.size - 1;
        mechanism(
            CauseKind::QuantizerPartStep,
            Some(s.share(loss.rel_l2)),
            format!(
                "the candidate's {} per-tensor {} has one step of {:.4e} for the whole tensor, fit to its largest part along axis {} (max |x| {:.4e}), while part {}..={last} (what the Concat's input {} gives) stays within {:.4e}, which that step covers with {levels:.1} steps: it rounds {} of the tensor's {} values ({:.1}%) to 0 and that part by relative L2 {:.2e} (measured on the reference's values, part by part as the output is judged); measured relative L2 of '{}' {:.2e}{}, the whole tensor's {:.2e}",
                q.format.name(),
                quantizer_of(tensor, is_output),
                q.scale,
                loss.axis,
                loss.largest_range,
                loss.first,
                loss.part,
                loss.range,
                e.to_zero,
                e.count,
                percent(e.to_zero, e.count),
                loss.rel_l2,
                s.output.name,
                s.out_rel,
                judged.worst_part.map_or(String::new(), |k| format!(" (its part {k}, the worst out of tolerance)")),
                judged.whole_rel_l2,
            ),
        )
    })
}

/// A weight stored with one scale whose output channels differ by orders of magnitude: the step
/// the largest channel needs leaves the small ones a few levels, or none. Measured on the
/// stored weight against the reference's.
fn per_tensor_weight(s: &Site) -> Option<Mechanism> {
    // The node's own weights, then those of the nodes computing its data inputs: a layer whose
    // channels a later Mul or normalization evens out breaks there, where the small channels'
    // loss stops hiding under the large one's range.
    let own = s.node.inputs.iter().filter_map(|i| s.comparison.per_tensor_weights.get(i).map(|w| (w, None)));
    let upstream =
        s.node.inputs.iter().filter(|i| !s.index.is_constant_like(i)).filter_map(|i| s.index.producer(i)).flat_map(
            |p| p.inputs.iter().filter_map(move |w| s.comparison.per_tensor_weights.get(w).map(|w| (w, Some(p)))),
        );
    own.chain(upstream).find(|(w, _)| w.unequal()).and_then(|(w, reader)| {
        let live: Vec<(usize, f32)> = w.channel_max.iter().copied().enumerate().filter(|(_, m)| *m > 0.0).collect();
        let (small, smallest) = live.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1))?;
        let (large, largest) = live.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1))?;
        let coarse: Vec<usize> = (0..w.channel_max.len()).filter(|&c| w.channel_max[c] < 2.0 * w.scale).collect();
        let zeroed = coarse.iter().filter(|&&c| w.channel_steps[c] == 0.0).count();
        let worst = w.channel_rel_l2.iter().copied().fold(0f64, f64::max);
        let mut sorted = w.channel_rel_l2.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let whose = match reader {
            Some(p) => format!("{} '{}', which computes this node's input, reads weight '{}'", p.op_type, p.name, w.weight),
            None => format!("weight '{}'", w.weight),
        };
        // Its own weight: the weight's relative error is what a product passes on; a weight
        // upstream: how the node weighs the channels is not measured.
        let explains = if reader.is_none() { Some(s.share(w.rel_l2)) } else { None };
        mechanism(
            CauseKind::PerTensorWeight,
            explains,
            format!(
                "{whose}, stored {} with one scale for the whole tensor (step {:.4e}), while its {} output channels (axis {}) reach max |w| from {smallest:.4e} (channel {small}) to {largest:.4e} (channel {large}), {:.0}x apart: {} of them stay below 2 steps (at most 5 distinct values), {zeroed} round entirely to 0; the stored channels err by relative L2 up to {worst:.2e} (median {median:.2e}), the whole weight by {:.2e} (measured on the stored weight); measured relative L2 of '{}' {:.2e}",
                w.format.name(),
                w.scale,
                w.channel_max.len(),
                w.axis,
                largest / smallest,
                coarse.len(),
                w.rel_l2,
                s.output.name,
                s.out_rel,
            ),
        )
    })
}

/// An integer quantizer whose zero point leaves the codes on one side of 0 to values that never
/// come: one-sided values (a Relu's output) quantized symmetrically, or uint8 with zero point 128
/// on values never negative. Measured on the reference's values: the codes they use, and the
/// step and error with a zero point at the format's end.
fn quantizer_zero_point(s: &Site) -> Option<Mechanism> {
    quantizers_at(s).into_iter().find_map(|(tensor, q, effect, is_output)| {
        let e = effect?;
        let shift = e.zero_point_shift.as_ref()?;
        let sign = if shift.fit_zero_point < q.zero_point { "never negative" } else { "never positive" };
        let errs = match (e.rel_l2, shift.fit_rel_l2) {
            (Some(now), Some(fit)) => format!(", and its quantization error would be relative L2 {fit:.2e} instead of {now:.2e}"),
            _ => String::new(),
        };
        mechanism(
            CauseKind::QuantizerZeroPoint,
            e.rel_l2.map(|r| s.share(r)),
            format!(
                "the candidate's {} {} has zero point {} (scale {:.4e}, range [{:.4e}, {:.4e}]), while the reference's values are {sign} ({:.4e} to {:.4e}): they take codes {} to {}, {} of its {} codes, and {:.0}% of the codes are never used; a zero point of {} {} {:.4e} would give a step of {:.4e}, {}{errs} (measured on the reference's values); measured relative L2 of '{}' {:.2e}",
                q.format.name(),
                quantizer_of(tensor, is_output),
                q.zero_point,
                q.scale,
                q.lo,
                q.hi,
                e.min,
                e.max,
                shift.codes.0,
                shift.codes.1,
                shift.codes.1 - shift.codes.0 + 1,
                shift.levels,
                100.0 * shift.unused(),
                shift.fit_zero_point,
                if shift.fit_end == if shift.fit_zero_point < q.zero_point { q.hi } else { q.lo } { "keeping its end at" } else { "with its end at the values' extreme" },
                shift.fit_end,
                shift.fit_scale,
                match q.scale / shift.fit_scale {
                    r if r > 1.05 => format!("{r:.1}x finer"),
                    r if r < 0.95 => format!("{:.1}x coarser, clipping none of them", 1.0 / r),
                    _ => "the same step, clipping none of them".to_string(),
                },
                s.output.name,
                s.out_rel,
            ),
        )
    })
}

/// A denominator that a quantizer rounds to 0 or near it: a Div's divisor, a Reciprocal's or a
/// Pow's base (a negative exponent: the output blows up), or the tensor under the Sqrt that
/// gives one of those (LayerNorm's variance). Measured on the reference's values: how many round
/// to 0, and to less than half themselves; and the blow-up of the result.
fn quantized_denominator(s: &Site) -> Option<Mechanism> {
    let denominator = match s.op {
        "Div" => s.node.inputs.get(1),
        "Reciprocal" | "Pow" => s.node.inputs.first(),
        _ => None,
    }?;
    let m = s.m();
    // A Pow's exponent is not read here: a base rounded to 0 matters where the result blows up.
    let blows_up = s.non_finite() || m.max_abs_err > m.ref_max_abs;
    if s.op == "Pow" && !blows_up {
        return None;
    }
    let under_sqrt = s.index.producer(denominator).filter(|p| p.op_type == "Sqrt").and_then(|p| p.inputs.first());
    std::iter::once((denominator, false)).chain(under_sqrt.map(|t| (t, true))).find_map(|(tensor, via_sqrt)| {
        let q = s.comparison.quantizers.get(tensor.as_str())?;
        let e = s.comparison.quantizer_effects.get(tensor.as_str()).filter(|e| e.below_half > 0)?;
        let what = if via_sqrt { format!("the {}'s denominator is the Sqrt of '{tensor}', which", s.op) } else { format!("the {}'s denominator '{tensor}'", s.op) };
        let result = if s.non_finite() {
            format!("'{}' has {} inf/NaN values where the reference has none (reference max |y| = {:.4e})", s.output.name, m.nonfinite_mismatch, m.ref_max_abs)
        } else {
            format!("'{}' is off by up to {:.4e} where the reference's largest |y| is {:.4e} ({:.1}x)", s.output.name, m.max_abs_err, m.ref_max_abs, m.max_abs_err / m.ref_max_abs.max(f64::MIN_POSITIVE))
        };
        mechanism(
            CauseKind::QuantizedDenominator,
            Some(if s.non_finite() { 1.0 } else { s.share(m.max_abs_err / m.ref_max_abs.max(f64::MIN_POSITIVE)) }),
            format!(
                "{what} the candidate's {} quantizer (step {:.4e}, zero point {}) rounds: {} of its {} values round to 0 and {} more to less than half themselves (its smallest non-zero |x| is {:.4e}, half a step {:.4e}) (measured on the reference's values); a quotient by 0 is inf, and by a value rounded to half or less at least 2x too large: {result}",
                q.format.name(),
                q.scale,
                q.zero_point,
                e.to_zero,
                e.count,
                e.below_half - e.to_zero,
                e.min_nonzero_abs,
                q.scale / 2.0,
            ),
        )
    })
}

/// An integer kernel's int32 sums that can pass 2^31: the largest sum of |w - zero point| over
/// one output channel of the stored weight, times the activation's largest |code - zero point|
/// on the reference's values (where measured; else the format's widest). Beyond 2^31 the sum
/// wraps around: the runtime's fused kernel returns a value of the wrong size, even sign.
fn integer_accumulator_overflow(s: &Site) -> Option<Mechanism> {
    let acc = s.comparison.integer_accumulations.get(&s.node.name).filter(|a| a.op == s.op)?;
    let activation = quantizers_at(s).into_iter().find(|(_, _, _, is_output)| !is_output);
    let (code, whose) = match activation
        .and_then(|(t, q, e, _)| e.map(|e| (t, q.code_offset(e.min).max(q.code_offset(e.max)) as f64)))
    {
        Some((t, code)) => {
            (code, format!("its input '{t}' reaches |code - zero point| = {code:.0} on the reference's values"))
        }
        None => {
            let code = acc.widest_activation_code();
            (
                code,
                format!(
                    "its {} input can reach |code - zero point| = {code:.0} (its values were not measured)",
                    acc.activation_format.name()
                ),
            )
        }
    };
    let worst = acc.weight_sum * code;
    if worst < layerwise_model::quant::INT32_ACCUMULATOR {
        return None;
    }
    mechanism(
        CauseKind::IntegerAccumulatorOverflow,
        Some(1.0),
        format!(
            "{} '{}' multiplies {} codes by weight '{}' stored {}, as an integer kernel sums them in an int32 accumulator: each sum runs over {} products, the stored weight's output channel {} sums |w - zero point| to {:.0}, and {whose}, so a sum can reach {worst:.4e}, {:.2}x the int32 limit 2^31 = 2.1475e9: it wraps around (measured relative L2 of '{}' {:.2e})",
            s.op,
            s.node.name,
            acc.activation_format.name(),
            acc.weight,
            acc.weight_format.name(),
            acc.terms,
            acc.channel,
            acc.weight_sum,
            worst / layerwise_model::quant::INT32_ACCUMULATOR,
            s.output.name,
            s.out_rel,
        ),
    )
}

/// A weight (or weight-derived input) beyond the storage format's range: FP16's scan of the
/// file's weights, else (BF16, or a value the scan does not see) the compared stored value itself.
fn weight_overflow(s: &Site) -> Option<Mechanism> {
    let (format, max) = match s.candidate.arithmetic.storage() {
        Precision::Bf16 => ("BF16", half::bf16::MAX.to_f64()),
        Precision::Fp16 | Precision::Fp32 => ("FP16", FP16_MAX as f64),
    };
    s.node.inputs.iter().filter(|i| !i.is_empty() && s.index.is_constant_like(i)).find_map(|w| {
        let range = s.weight_ranges.iter().find(|r| r.name == *w && r.overflow_count > 0);
        let computed = s.comparison.get(w).filter(|r| r.metrics.nonfinite_mismatch > 0);
        let detail = match (range, computed) {
            (Some(r), _) => format!(
                "weight '{}' has {} of {} values beyond the FP16 range (max |w| = {:.4e} > {FP16_MAX}); they become inf in FP16",
                r.name, r.overflow_count, r.numel, r.max_abs
            ),
            (None, Some(c)) if s.index.is_stored_value(w) && c.metrics.ref_max_abs > max => format!(
                "stored value '{w}' holds magnitudes up to {:.4e}, beyond the {format} maximum {max:.4e}: {} of its values become +-inf in {format}",
                c.metrics.ref_max_abs, c.metrics.nonfinite_mismatch
            ),
            (None, Some(_)) => format!("weight-derived input '{w}' becomes inf/NaN in {format}"),
            (None, None) => return None,
        };
        Some(Mechanism { kind: CauseKind::WeightOverflow, weight: Some(w.clone()), explains: Some(1.0), detail })
    })
}

/// An integer computed from a float input whose error moved values across an integer boundary.
fn integer_boundary(s: &Site) -> Option<Mechanism> {
    if !crate::patterns::computes_integer_from_float(s.op, &s.output.ref_dtype) || s.non_finite() {
        return None;
    }
    let m = s.m();
    if m.max_abs_err <= 0.0 {
        return None;
    }
    // The input's error as compared; where it is exact as fed (a model input), the candidate's
    // own rounding of it before this node is what moved the values.
    let moved_by = match s.input {
        Some(input) if input.metrics.nonfinite_mismatch > 0 || crate::patterns::is_integer_dtype(&input.ref_dtype) => {
            return None
        }
        Some(input) => format!(
            "the input's error (max abs {:.2e}, relative L2 {:.2e})",
            input.metrics.max_abs_err,
            input.error_level()
        ),
        None => format!(
            "the candidate's rounding of its input '{}' (exact as fed)",
            s.node.inputs.first().map_or("", String::as_str)
        ),
    };
    // Judged exactly, each changed value is a violation; else every changed value moved by a whole
    // number, so the mean change bounds how many moved (one value off by 14 read as 14).
    let exact = s.output.holds_integers && s.output.mismatch.is_none();
    let moved = if exact { m.violations } else { (m.mean_abs_err * m.numel as f64).round() as usize };
    let detail = if s.output.ref_dtype == "bool" {
        format!(
            "{moved} of {} truth values flip: {moved_by} moves the compared values across the other side of the comparison; a truth value is exact or flipped, so what reads it (a mask, a length, a branch) changes by a whole step, not by the rounding",
            m.numel
        )
    } else {
        let count = match (m.max_abs_err == 1.0, exact) {
            (true, _) => format!("{moved} of {} values", m.numel),
            (false, true) => format!("{moved} of {} values (by up to {})", m.numel, m.max_abs_err),
            (false, false) => format!("up to {moved} of {} values (by up to {})", m.numel, m.max_abs_err),
        };
        format!(
            "{count} land on another integer: {moved_by} moves them across an integer boundary; an integer computed from a rounded float is exact or off by a whole step, so the output's error is the size of that step, not of the rounding"
        )
    };
    mechanism(CauseKind::IntegerBoundary, Some(1.0), detail)
}

/// A constant FP16 flushes to 0 reaching an op that turns 0 into inf/NaN.
fn underflow(s: &Site) -> Option<Mechanism> {
    if !s.non_finite() {
        return None;
    }
    let (weight, value, via) = underflowing_constant(s.index, s.weight_ranges, s.node)?;
    Some(Mechanism {
        kind: CauseKind::Underflow,
        weight: Some(weight.clone()),
        explains: Some(1.0),
        detail: format!(
            "constant '{weight}' ({value:.3e}) is below half FP16's smallest subnormal (2^-25 = 2.98e-8) and becomes exactly 0 in FP16; it reaches this {} through {via}, so where the rest is 0 the {} sees 0 and gives {} inf/NaN values",
            s.op,
            s.op,
            s.m().nonfinite_mismatch
        ),
    })
}

/// A reduction whose kernel keeps its sum in FP16, overflowing though the result does not.
fn accumulator_overflow(s: &Site) -> Option<Mechanism> {
    let (m, op) = (s.m(), s.op);
    let input_finite = s.input.is_none_or(|i| i.metrics.cand_inf + i.metrics.cand_nan == 0);
    if !(s.non_finite()
        && (op == "ReduceMean" || op == "ReduceLogSumExp")
        && m.ref_max_abs <= FP16_MAX as f64
        && input_finite)
    {
        return None;
    }
    // The emulation stores the sum in FP16 as the kernel does: a result of inf from finite
    // inputs and an in-range reference is that sum overflowing. Its size, where the input's
    // shape is known: about N times the mean.
    let numel = |shape: &[usize]| shape.iter().product::<usize>().max(1);
    let reduced = s.input.map(|i| numel(&i.shape) / numel(&s.output.shape)).filter(|&n| n > 1);
    let what = if op == "ReduceMean" { "sum" } else { "sum of exp(x - max)" };
    let size = match reduced {
        Some(n) if op == "ReduceMean" => {
            format!(" over {n} elements: its sum reaches up to about {:.2e}", m.ref_max_abs * n as f64)
        }
        Some(n) => format!(" over {n} elements: its {what} passes 65504"),
        None => format!(": its {what} passes 65504"),
    };
    mechanism(
        CauseKind::AccumulatorOverflow,
        Some(1.0),
        format!(
            "{op}{size} while the result stays at most {:.3e}; ONNX Runtime's CUDA kernel stores that sum in FP16 (measured on an H100, docs/emulation.md), so it overflows to inf here; keep this node in FP32",
            m.ref_max_abs
        ),
    )
}

/// The reference output itself is beyond FP16's range.
/// Whether the reference's output reaches beyond what the candidate's storage holds: stored, it
/// becomes inf (FP16 beyond 65504; BF16 from float32's largest values, e.g. finfo.min as a mask).
fn exceeds_storage_range(s: &Site) -> bool {
    match s.candidate.arithmetic.storage() {
        Precision::Fp16 => s.m().ref_fp16_overflow > 0 || s.m().ref_max_abs > FP16_MAX as f64,
        Precision::Bf16 => half::bf16::from_f64(s.m().ref_max_abs).is_infinite(),
        Precision::Fp32 => false,
    }
}

fn value_overflow(s: &Site) -> Option<Mechanism> {
    if !(s.non_finite() && exceeds_storage_range(s)) {
        return None;
    }
    let storage = s.candidate.arithmetic.storage();
    let max = match storage {
        Precision::Bf16 => format!("{:.4e}", half::bf16::MAX.to_f64()),
        Precision::Fp16 | Precision::Fp32 => FP16_MAX.to_string(),
    };
    mechanism(
        CauseKind::ValueOverflow,
        Some(1.0),
        // Two counts, each of its own run: the reference's values beyond the maximum, and the
        // candidate's inf/NaN (one more where the candidate's own value rounded past it: 240 and
        // 241 read as one count before).
        format!(
            "{} output reaches {:.4e} in the reference, beyond the {} maximum {max}{}: {} values are inf/NaN in the candidate",
            s.op,
            s.m().ref_max_abs,
            storage.name(),
            match (storage, s.m().ref_fp16_overflow) {
                (Precision::Fp16, n) if n > 0 => format!(" ({n} of its values)"),
                _ => String::new(),
            },
            s.m().nonfinite_mismatch
        ),
    )
}

/// inf/NaN from finite inputs that no overflow of the stored value explains (0/0, log 0).
fn non_finite_produced(s: &Site) -> Option<Mechanism> {
    if !s.non_finite() || exceeds_storage_range(s) || s.carries_input_nonfinite() || s.reads_nonfinite_weight() {
        return None;
    }
    let (reference, candidate) = s.m().nonfinite_counts();
    let inputs = s.nonfinite_inputs();
    // Either side may be the one that makes them: the reference's float32 log 0 where the
    // candidate's rounding moved the argument off 0, say.
    let detail = if !inputs.is_empty() {
        // Inputs that hold inf/NaN alike on both sides (the walk stops at no node whose inputs
        // mismatch), and more in the candidate's output: those beyond arise here.
        format!(
            "{} gives {candidate} inf/NaN values in the candidate against the reference's {reference}; its inputs hold inf/NaN alike on both sides ({}), so at least {} arise here (reference max |y| = {:.4e})",
            s.op,
            inputs.iter().take(3).map(|(t, r, _)| format!("'{t}' {r}")).collect::<Vec<_>>().join(", "),
            candidate - reference,
            s.m().ref_max_abs
        )
    } else if candidate >= reference {
        format!(
            "{} turns finite inputs into {} inf/NaN values (reference max |y| = {:.4e})",
            s.op,
            s.m().nonfinite_mismatch,
            s.m().ref_max_abs
        )
    } else {
        format!(
            "{} turns finite inputs into {reference} inf/NaN values in the reference, where the candidate has {candidate}: finite values in at least {} places (reference max |y| = {:.4e})",
            s.op,
            reference - candidate,
            s.m().ref_max_abs
        )
    };
    mechanism(CauseKind::NonFiniteProduced, Some(1.0), detail)
}

/// inf/NaN the node reads already (a model input's NaN) that the two sides carry differently
/// from here on: an integer quantizer has no code for them, so the candidate holds finite values
/// where the reference holds inf/NaN. Neither side's arithmetic makes them.
fn non_finite_input(s: &Site) -> Option<Mechanism> {
    if !s.non_finite() || exceeds_storage_range(s) || !s.carries_input_nonfinite() {
        return None;
    }
    let inputs = s.nonfinite_inputs();
    let listed: Vec<String> = inputs
        .iter()
        .take(3)
        .map(|(t, reference, candidate)| {
            if s.index.is_graph_input(t) {
                format!(
                    "model input '{t}' holds {reference} inf/NaN value{}, fed to both sides",
                    if *reference == 1 { "" } else { "s" }
                )
            } else {
                format!("'{t}' holds {reference} in the reference, {candidate} in the candidate")
            }
        })
        .collect();
    let more = if inputs.len() > 3 { format!(" and {} more inputs", inputs.len() - 3) } else { String::new() };
    let (reference, candidate) = s.m().nonfinite_counts();
    let how = format!("the candidate has finite values in at least {} of those places", reference - candidate);
    mechanism(
        CauseKind::NonFiniteInput,
        Some(1.0),
        format!(
            "{} reads inf/NaN already ({}{more}): they do not arise here. Its output holds {reference} inf/NaN values in the reference and {candidate} in the candidate; {how}. This is how each side carries the inputs' inf/NaN, not a rounding error",
            s.op,
            listed.join("; ")
        ),
    )
}

/// Ops whose relative output error is (at most) the absolute error of their input where their
/// output is small: exp(x + d) = exp(x) * e^d.
const SATURATING_OPS: &[&str] = &["Sigmoid", "Exp", "Softplus", "Tanh", "HardSigmoid", "Elu", "Selu"];

fn saturation(s: &Site) -> Option<Mechanism> {
    if s.non_finite() || !SATURATING_OPS.contains(&s.op) {
        return None;
    }
    let inp = s.finite_input()?;
    let (x_max, dx) = (inp.metrics.compared_max_abs(), inp.metrics.max_abs_err);
    // Beyond |x| = 4 a Sigmoid's slope is below 2% of its peak: the flat region.
    let region = if x_max > 4.0 { " in its flat region" } else { "" };
    mechanism(
        CauseKind::Saturation,
        Some(s.share(dx)),
        format!(
            "{}{region} (inputs reach |x| = {x_max:.3e}{}, outputs at most {:.3e}) turns the input's absolute error {dx:.2e} (relative only {:.2e}) into a relative output error of up to {dx:.2e}; measured {:.2e}; {}",
            s.op,
            masked_note(&inp.metrics),
            s.m().compared_max_abs(),
            inp.error_level(),
            s.out_rel,
            s.materiality()
        ),
    )
}

fn large_logits(s: &Site) -> Option<Mechanism> {
    if s.non_finite() || !(s.op == "Softmax" || s.op == "LogSoftmax") {
        return None;
    }
    let inp = s.finite_input()?;
    let (x_max, dx) = (inp.metrics.compared_max_abs(), inp.metrics.max_abs_err);
    let predicted = ((2.0 * dx).min(700.0)).exp_m1();
    let spacing = match s.candidate.arithmetic.storage().spacing(x_max) {
        Some(ulp) => format!(" ({}'s spacing there is {})", s.candidate.arithmetic.storage().name(), step_text(ulp)),
        None => String::new(),
    };
    mechanism(
        CauseKind::LargeLogits,
        Some(s.share(predicted)),
        format!(
            "{} depends on the absolute differences of its inputs: its logits reach {x_max:.3e}{}{spacing}, so a relative input error of {:.2e} is an absolute error of up to {dx:.3e}, which changes probabilities by a factor up to e^{:.2e}; measured output relative L2 {:.2e}",
            s.op,
            masked_note(&inp.metrics),
            inp.error_level(),
            2.0 * dx,
            s.out_rel
        ),
    )
}

/// What a tensor's largest |x| leaves out, where it has mask sentinels: " (not counting N mask
/// values ...)", else nothing.
fn masked_note(m: &Metrics) -> String {
    m.mask_sentinels.map_or_else(String::new, |ms| {
        format!(
            " (not counting {} mask values of |x| >= {:.0e}, the same on both sides)",
            ms.count,
            crate::metrics::MASK_SENTINEL_MIN_ABS
        )
    })
}

/// A storage step as people read it: whole numbers from 1 up, else two digits.
pub(crate) fn step_text(ulp: f64) -> String {
    if ulp >= 1.0 {
        format!("{ulp:.0}")
    } else {
        format!("{ulp:.1e}")
    }
}

/// ONNX Runtime's CUDA kernels that round inside their formula (measured).
fn kernel_rounding(s: &Site) -> Option<Mechanism> {
    let (m, op) = (s.m(), s.op);
    let stepwise = match s.candidate.arithmetic.storage() {
        Precision::Bf16 => op == "Sigmoid" || op == "Softplus",
        Precision::Fp16 => op == "Softplus",
        Precision::Fp32 => false,
    };
    let reach = m.compared_max_abs();
    if s.non_finite() || !stepwise || reach <= 0.0 {
        return None;
    }
    // The small branch (x <= 0) ends in 1 - 1/(1 + e^x) or ln(1 + e^x) with 1 + e^x
    // rounded near 1: an absolute error of up to half the spacing there.
    let absolute = s.candidate.arithmetic.storage().spacing(1.0).unwrap_or(0.0) / 2.0;
    let formula = if op == "Sigmoid" { "1 - 1/(1 + exp(x))" } else { "ln(1 + exp(x))" };
    let arithmetic = s.candidate.arithmetic.storage().name();
    mechanism(
        CauseKind::KernelRounding,
        Some(s.share((absolute / reach).min(1.0))),
        format!(
            "ONNX Runtime's CUDA kernel computes a {arithmetic} {op} as {formula} for x <= 0, rounding every step to {arithmetic} (measured bit for bit on an H100, docs/emulation.md): each output can be off by up to {absolute:.1e} absolute, and this tensor's outputs are at most {:.3e}, so up to {:.1e} relative; measured relative L2 {:.2e}; keep this node in FP32",
            reach,
            (absolute / reach).min(1.0),
            s.out_rel
        ),
    )
}

/// Ops whose float32 arithmetic TF32 replaces.
const TF32_OPS: &[&str] =
    &["MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "FusedMatMul", "Attention", "LSTM", "GRU", "RNN"];

fn tf32(s: &Site) -> Option<Mechanism> {
    if s.non_finite() || !s.is_tf32_op() {
        return None;
    }
    // From exact inputs the op's own TF32 rounding is the only rounding there is (float32
    // reordering is ~1e-7): it is the whole error, however the op's conditioning amplifies
    // it. From inexact inputs, a few roundings account for about 4u.
    let (explains, how) = if s.input_error == 0.0 {
        (1.0, format!("its inputs are exact, so rounding them to TF32 (one rounding {FP16_UNIT_ROUNDOFF:.1e}) is the whole error, amplified to {:.2e} by the op's conditioning", s.out_rel))
    } else {
        (s.share(4.0 * FP16_UNIT_ROUNDOFF), format!("relative L2 {:.2e} -> {:.2e}", s.input_error, s.out_rel))
    };
    mechanism(CauseKind::Tf32, Some(explains), format!("float32 {} ran with TF32 tensor cores (10-bit mantissa inputs): {how}; run the candidate with tf32=off to confirm", s.op))
}

fn subnormal_storage(s: &Site) -> Option<Mechanism> {
    let m = s.m();
    if s.non_finite() || m.ref_fp16_subnormal_share <= 0.1 {
        return None;
    }
    // Storing a value below FP16's smallest normal loses at most half its spacing, 2^-25.
    let max_loss = 2f64.powi(-25);
    let explains = if m.max_abs_err > 0.0 { (max_loss / m.max_abs_err).clamp(0.0, 1.0) } else { 0.0 };
    mechanism(
        CauseKind::PrecisionLoss,
        Some(explains),
        format!(
            "{:.0}% of the reference values of {} are in the FP16 subnormal range, where storing loses at most {max_loss:.1e} absolute; the measured max abs error is {:.2e}",
            100.0 * m.ref_fp16_subnormal_share,
            s.op,
            m.max_abs_err
        ),
    )
}

/// Error from exact inputs: the node's own rounding (TF32 ops have their own mechanism).
fn rounding_of_exact_inputs(s: &Site) -> Option<Mechanism> {
    if s.non_finite() || s.input_error != 0.0 || s.is_tf32_op() {
        return None;
    }
    if s.candidate.arithmetic.quantized().is_some() {
        // Between its quantizers a Q/DQ candidate computes in float32: what a node adds to exact
        // inputs is the quantizers' rounding of what it reads, not a float32 rounding.
        let steps: Vec<String> = s
            .node
            .inputs
            .iter()
            .filter_map(|t| {
                s.comparison
                    .quantizers
                    .get(t)
                    .map(|q| format!("'{t}' by a {} quantizer of step {:.3e}", q.format.name(), q.scale))
            })
            .collect();
        let read = match (steps.is_empty(), s.comparison.quantizers.get(&s.output.name)) {
            (false, _) => steps.join(", "),
            // quantize_static quantizes model outputs too: the node's output, not what it reads.
            (true, Some(q)) => {
                return mechanism(
                    CauseKind::PrecisionLoss,
                    None,
                    format!(
                        "{} introduces a relative L2 error of {:.2e} from exact inputs: the candidate quantizes its output ('{}' by a {} quantizer of step {:.3e}); how much of the output's error that is, the quantizers measured one at a time say",
                        s.op,
                        s.out_rel,
                        s.output.name,
                        q.format.name(),
                        q.scale
                    ),
                )
            }
            (true, None) => "its inputs' quantizers (not found among the candidate's per-tensor ones)".to_string(),
        };
        return mechanism(
            CauseKind::PrecisionLoss,
            None,
            format!("{} introduces a relative L2 error of {:.2e} from exact inputs: the candidate quantizes what it reads ({read}); how much of the output's error that is, the quantizers measured one at a time say", s.op, s.out_rel),
        );
    }
    let u = s.candidate.arithmetic.storage().unit_roundoff();
    mechanism(
        CauseKind::PrecisionLoss,
        Some(s.share(u * 4.0)),
        format!(
            "{} introduces a relative L2 error of {:.2e} from exact inputs (one rounding is {u:.1e})",
            s.op, s.out_rel
        ),
    )
}

/// How many times smaller than its operand a difference must be to be called a cancellation:
/// at least three of the operand's leading bits cancel.
pub const CANCELLATION_RATIO: f64 = 8.0;

/// A Sub (or an Add of opposite signs) whose result is far below its operand: the operand's
/// absolute error, which its storage step bounds, is all the result keeps.
fn cancellation(s: &Site) -> Option<Mechanism> {
    if s.non_finite() || !(s.op == "Sub" || s.op == "Add") || !s.out_rel.is_finite() {
        return None;
    }
    let inp = s.finite_input()?;
    let (operand, result) = (inp.metrics.compared_max_abs(), s.m().compared_max_abs());
    let (dx, dy) = (inp.metrics.max_abs_err, s.m().max_abs_err);
    let step = s.candidate.arithmetic.storage().spacing(operand)?;
    // The output's absolute error must be the operand's, passed on: else the Sub adds its own.
    if !(operand >= CANCELLATION_RATIO * result && dy > 0.0 && dx >= 0.5 * dy) {
        return None;
    }
    mechanism(
        CauseKind::Cancellation,
        Some((dx / dy).min(1.0)),
        format!(
            "{} cancels: its result is at most {result:.3e} while its operand '{}' reaches {operand:.4e} ({:.0}x larger), where {}'s step is {}; the operand's absolute error {dx:.3e} (measured) is all that is left of the difference: relative L2 {:.2e}",
            s.op,
            inp.name,
            operand / result.max(f64::MIN_POSITIVE),
            s.candidate.arithmetic.storage().name(),
            step_text(step),
            s.out_rel
        ),
    )
}

/// Sin and Cos depend on the absolute error of their argument, and a large argument stored in
/// a storage format has a large one.
fn periodic_argument(s: &Site) -> Option<Mechanism> {
    if s.non_finite() || !(s.op == "Sin" || s.op == "Cos") {
        return None;
    }
    let inp = s.finite_input()?;
    let (x_max, dx) = (inp.metrics.compared_max_abs(), inp.metrics.max_abs_err);
    let step = s.candidate.arithmetic.storage().spacing(x_max)?;
    if dx <= 0.0 {
        return None;
    }
    let period = std::f64::consts::TAU;
    // |sin'| <= 1: an argument off by dx moves the result by up to dx, against results of at most 1.
    let outcome = if dx >= 1.0 {
        format!("what {} returns of it is noise", s.op)
    } else {
        format!("{} errs by up to {dx:.2e} absolute", s.op)
    };
    mechanism(
        CauseKind::PeriodicArgument,
        Some(s.share(dx.min(1.0))),
        format!(
            "{} is periodic (period 2*pi = 6.28), so only its argument's absolute error counts: '{}' reaches |x| = {x_max:.4e}, where {}'s step is {} ({:.2} of a period), and it is off by up to {dx:.3e} (measured), so {outcome}: measured relative L2 {:.2e}",
            s.op,
            inp.name,
            s.candidate.arithmetic.storage().name(),
            step_text(step),
            step / period,
            s.out_rel
        ),
    )
}

/// Ops known to amplify relative input error.
const SENSITIVE_OPS: &[&str] = &[
    "Softmax",
    "LogSoftmax",
    "Div",
    "Reciprocal",
    "Exp",
    "Pow",
    "Log",
    "Sqrt",
    "Sub",
    "ReduceSumSquare",
    "ReduceL2",
    "ReduceLogSumExp",
    "LayerNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "BatchNormalization",
    "Erf",
    "Tan",
    "Atan",
];

/// The fallback: the node multiplies its input's relative error, by how much is measured, why is not.
fn amplification(s: &Site) -> Option<Mechanism> {
    // A node whose output errs less than its input amplifies nothing (an ArgMax whose one changed
    // class is a changed integer, not an amplified error).
    if s.non_finite() || !(s.out_rel.is_finite() && s.input_error > 0.0 && s.out_rel > s.input_error) {
        return None;
    }
    let sensitive = if SENSITIVE_OPS.contains(&s.op) { "; it is a precision-sensitive op" } else { "" };
    mechanism(
        CauseKind::Amplification,
        None,
        format!(
            "{} amplifies its input error {:.1}x (relative L2 {:.2e} -> {:.2e}){sensitive}",
            s.op,
            s.out_rel / s.input_error,
            s.input_error,
            s.out_rel
        ),
    )
}

/// For an op that turns 0 into inf/NaN (Log, Reciprocal, a Div's denominator, a Pow with a
/// negative exponent): a constant that FP16 flushes to 0 and that reaches the input at risk
/// through at most three Add/Sub/Max/Clip/Abs/Identity/Cast/Mul steps (as the epsilon of
/// `x^2 + eps`). Returns the constant, its value and the node it reaches through.
fn underflowing_constant<'a>(
    index: &GraphIndex,
    weight_ranges: &'a [WeightRange],
    node: &NodeInfo,
) -> Option<(&'a String, f32, String)> {
    let at_risk = match node.op_type.as_str() {
        "Log" | "Reciprocal" => node.inputs.first(),
        "Div" => node.inputs.get(1),
        "Pow" => node.inputs.first(),
        _ => None,
    }?;
    const PASSING: &[&str] = &["Add", "Sub", "Max", "Clip", "Abs", "Identity", "Cast", "Mul", "Sqrt"];
    let mut frontier = vec![(at_risk.clone(), 0usize)];
    while let Some((tensor, depth)) = frontier.pop() {
        if let Some(w) = weight_ranges.iter().find(|w| w.name == tensor && w.underflow_count > 0) {
            let via = index
                .consumers(&tensor)
                .iter()
                .map(|&c| &index.nodes[c])
                .find(|c| PASSING.contains(&c.op_type.as_str()) || c.name == node.name)
                .map(|c| format!("{} '{}'", c.op_type, c.name))
                .unwrap_or_default();
            return Some((&w.name, w.underflow_max, via));
        }
        if depth >= 3 {
            continue;
        }
        if let Some(p) = index.producer(&tensor).filter(|p| PASSING.contains(&p.op_type.as_str())) {
            frontier.extend(p.inputs.iter().filter(|i| !i.is_empty()).map(|i| (i.clone(), depth + 1)));
        }
    }
    None
}
