//! The noise floor: how much the worst output moves when the float32 reference runs with its
//! weights rounded as the candidate rounds them, each moved by up to its own rounding error. A
//! candidate whose error is within a small factor of it has no culprit layer: the output is
//! ill-conditioned. Only what the candidate's precision changes is perturbed (docs/bisect.md).

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Result};
use layerwise_analysis::{Comparison, NoiseFloor, ToleranceSet, Verdict, ILL_CONDITIONED_FACTOR};
use layerwise_model::perturb::{perturb_weights, Perturbation, Perturbed};
use layerwise_model::{GraphIndex, Model, Rounding, Selection};
use layerwise_runtime::{Backend, RunRequest, Tensor};

use super::setup::Judging;

/// What a quantized candidate's floor moves, in sentences.
pub(crate) const QUANTIZER_ROUNDS: &str = "one step of each quantizer";
/// The same where dynamic activation quantizers, which store no step, are left out.
pub(crate) const STORED_QUANTIZER_ROUNDS: &str = "one step of each quantizer with a stored scale";

/// Perturbation runs, each with its own seed; the floor is the largest output error among them.
const SEEDS: usize = 2;
/// Seeds in all where the first ones leave the ratio near the ill-conditioned factor (within 2x
/// either side): the floor's spread between seeds decides the verdict there (an independent
/// tester's six draws on a diffusion UNet ranged 2.9e-3 to 9.3e-3 against a candidate of 2.4e-2).
const SEEDS_NEAR_THE_LINE: usize = 6;

/// What the noise floor is measured against: the worst output and its candidate error.
pub struct FloorTarget<'a> {
    pub output: &'a str,
    pub candidate_error: f64,
    /// What one rounding of the candidate's precision does to a weight.
    pub perturbation: Perturbation,
    /// Reference weights the candidate keeps in float32 (a converted `--cand-model`'s FP32
    /// weights): not perturbed.
    pub exact: &'a HashSet<String>,
    /// Weights only the first divergent layer's keep pattern reads: not perturbed either, and
    /// named (see `NoiseFloor::left_for_the_fix`).
    pub left_for_the_fix: &'a [String],
    pub seed: u64,
    /// A quantized candidate's quantizers: the floor is one step of each (not `perturbation`).
    pub quantizers: Option<&'a layerwise_model::quant::QuantizerSteps>,
}

/// Whether a candidate error and a floor so far are within 2x of the ill-conditioned line.
fn near_the_line(candidate_error: f64, floor: f64) -> bool {
    let ratio = candidate_error / floor;
    floor > 0.0 && ratio.is_finite() && ratio > ILL_CONDITIONED_FACTOR / 2.0 && ratio < ILL_CONDITIONED_FACTOR * 2.0
}

/// The words for `perturbation`: the long form for the report, the short one for sentences.
fn words(perturbation: Perturbation, count: Perturbed, seeds: usize) -> (String, String, f64) {
    let seeds = if seeds > SEEDS {
        format!("{seeds} seeds (more than {SEEDS}: the first {SEEDS} left the candidate within 2x of the {ILL_CONDITIONED_FACTOR}x line)")
    } else if seeds == 1 {
        "1 seed".to_string()
    } else {
        format!("{seeds} seeds")
    };
    let name = |r: Rounding| r.name().to_uppercase();
    match perturbation {
        Perturbation::Storage(r) => (
            format!(
                "every float32 weight that {} storage rounds (not read as a shape, index or exponent) moved by up to its own {} rounding error, w + r * |round(w) - w| with r uniform in [-1, 1), {seeds} ({} values moved; {} exact in {} left as they are); the largest output error counts",
                name(r), name(r), count.moved, count.exact, name(r)
            ),
            format!("one {} rounding of every weight", name(r)),
            r.unit_roundoff(),
        ),
        Perturbation::TensorCores => (
            format!(
                "every float32 weight a TF32 tensor core reads (the multiplied inputs of Conv, MatMul, Gemm, Einsum and cuDNN's recurrent ops) moved by up to its own TF32 rounding error, w + r * |tf32(w) - w| with r uniform in [-1, 1), {seeds} ({} values moved; {} exact in TF32 left as they are; biases, normalization parameters and other weights, which TF32 does not round, stay exact); the largest output error counts",
                count.moved, count.exact
            ),
            "one TF32 rounding of every weight the tensor cores read".to_string(),
            Rounding::Tf32.unit_roundoff(),
        ),
        Perturbation::Relative(relative) => (
            format!("every float32 weight not read as a shape or index multiplied by (1 + {relative:.2e} * r), r uniform in [-1, 1), {seeds} ({} values): float32 arithmetic rounds every operation by up to that much; the largest output error counts", count.moved),
            format!("one float32 rounding of every weight (relative {relative:.2e})"),
            relative,
        ),
    }
}

/// Measures the noise floor of `target.output` on `reference`, whose unperturbed outputs are
/// `reference_outputs`.
pub fn noise_floor(
    reference: &mut dyn Backend,
    model: &Model,
    index: &GraphIndex,
    feeds: &[(String, Tensor)],
    reference_outputs: &HashMap<String, Tensor>,
    tolerances: &ToleranceSet,
    target: FloorTarget,
) -> Result<NoiseFloor> {
    if let Some(steps) = target.quantizers {
        return quantizer_floor(reference, model, index, feeds, reference_outputs, tolerances, &target, steps);
    }
    let exact: HashSet<String> = target.exact.iter().cloned().chain(target.left_for_the_fix.iter().cloned()).collect();
    let mut count = Perturbed::default();
    let (seeds, floor) = largest_over_seeds(
        reference,
        model,
        index,
        feeds,
        reference_outputs,
        tolerances,
        &target,
        0x6e6f_6973_6500,
        |seed| {
            let (proto, moved) = perturb_weights(model, target.perturbation, &exact, seed)?;
            count = moved;
            // Nothing the candidate rounds: the floor is zero without a run.
            Ok((moved.moved > 0).then_some((proto, false)))
        },
    )?;
    let ratio = if floor > 0.0 { target.candidate_error / floor } else { f64::INFINITY };
    let (mut perturbation, mut rounds, relative) = words(target.perturbation, count, seeds.len());
    if !target.left_for_the_fix.is_empty() {
        let names: Vec<&str> = target.left_for_the_fix.iter().take(3).map(String::as_str).collect();
        let more = if target.left_for_the_fix.len() > 3 {
            format!(" and {} more", target.left_for_the_fix.len() - 3)
        } else {
            String::new()
        };
        perturbation.push_str(&format!(
            "; {} weight{} that only the first divergent layer's keep pattern reads ({}{more}) left as they are: keeping that layer at reference precision keeps them exact too",
            target.left_for_the_fix.len(),
            if target.left_for_the_fix.len() == 1 { "" } else { "s" },
            names.join(", ")
        ));
        rounds.push_str(" outside the first divergent layer's keep pattern");
    }
    Ok(NoiseFloor {
        perturbation,
        rounds,
        moved_values: count.moved,
        exact_values: count.exact,
        relative,
        seeds,
        output: target.output.to_string(),
        output_error: floor,
        candidate_error: target.candidate_error,
        ratio,
        ill_conditioned: target.candidate_error.is_finite() && floor.is_finite() && ratio <= ILL_CONDITIONED_FACTOR,
        left_for_the_fix: target.left_for_the_fix.to_vec(),
    })
}

/// The largest error of `target.output` over seeded perturbed runs of the reference: two seeds,
/// six where the first two leave the candidate near the ill-conditioned line. `perturb` makes the
/// model for a seed (and whether its graph changed, so that it is indexed anew), or `None` where
/// it moves nothing: the floor is then zero without a run. Returns the seeds used and the floor.
#[allow(clippy::too_many_arguments)]
fn largest_over_seeds(
    reference: &mut dyn Backend,
    model: &Model,
    index: &GraphIndex,
    feeds: &[(String, Tensor)],
    reference_outputs: &HashMap<String, Tensor>,
    tolerances: &ToleranceSet,
    target: &FloorTarget,
    salt: u64,
    mut perturb: impl FnMut(u64) -> Result<Option<(layerwise_model::onnx::ModelProto, bool)>>,
) -> Result<(Vec<u64>, f64)> {
    let (mut seeds, mut floor) = (Vec::new(), 0f64);
    for i in 0..SEEDS_NEAR_THE_LINE as u64 {
        if i as usize >= SEEDS && !near_the_line(target.candidate_error, floor) {
            break;
        }
        // Seeds of their own, apart from the input generator's.
        let seed = target.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(salt + i);
        seeds.push(seed);
        let started = std::time::Instant::now();
        let Some((proto, new_graph)) = perturb(seed)? else { break };
        let perturbed = model.derived(proto, "noise-floor.onnx");
        let own_index = if new_graph { Some(GraphIndex::build(perturbed.graph())?) } else { None };
        super::steps::timing("noise floor: perturbed model", started);
        let started = std::time::Instant::now();
        let selection = Selection::Names(Vec::new());
        let out = reference.run(&RunRequest {
            model: &perturbed,
            index: own_index.as_ref().unwrap_or(index),
            inputs: feeds,
            selection: &selection,
        })?;
        super::steps::timing("noise floor: perturbed run", started);
        let (Some(r), Some(p)) = (reference_outputs.get(target.output), out.tensors.get(target.output)) else {
            bail!("the perturbed run returned no '{}'", target.output);
        };
        // Judged as bisect judges the output (part by part where a Concat joins parts of very
        // different scale), so that the floor and the candidate's error are one measure.
        let judge = tolerances.output(target.output, r.dtype());
        floor = floor.max(judge.metrics(&r.to_f32(), &p.to_f32(), &r.shape).error_level());
    }
    Ok((seeds, floor))
}

/// The floor of a quantized candidate: the reference moved by one step of each of its quantizers
/// (`perturb_by_quantizer_steps`), the largest output error over the seeds.
#[allow(clippy::too_many_arguments)]
fn quantizer_floor(
    reference: &mut dyn Backend,
    model: &Model,
    index: &GraphIndex,
    feeds: &[(String, Tensor)],
    reference_outputs: &HashMap<String, Tensor>,
    tolerances: &ToleranceSet,
    target: &FloorTarget,
    steps: &layerwise_model::quant::QuantizerSteps,
) -> Result<NoiseFloor> {
    let mut moved = layerwise_model::perturb::QuantizerPerturbed::default();
    let (seeds, floor) = largest_over_seeds(
        reference,
        model,
        index,
        feeds,
        reference_outputs,
        tolerances,
        target,
        0x7175_616e_7400,
        |seed| {
            let (proto, m) = layerwise_model::perturb::perturb_by_quantizer_steps(model, steps, seed)?;
            moved = m;
            // The noise nodes are new: the perturbed model is indexed anew.
            Ok((m.weight_values > 0 || m.activations > 0).then_some((proto, true)))
        },
    )?;
    let ratio = if floor > 0.0 { target.candidate_error / floor } else { f64::INFINITY };
    let mut missing = if steps.not_found > 0 {
        format!("; {} quantizers whose reference tensor was not found are left out", steps.not_found)
    } else {
        String::new()
    };
    if steps.dynamic > 0 {
        missing.push_str(&format!(
            "; {} dynamic activation quantizers (their scale from each run's range, none stored) are left out",
            steps.dynamic
        ));
    }
    Ok(NoiseFloor {
        perturbation: format!(
            "one step of each of the candidate's quantizers, on the float32 reference: {} quantized activations given noise uniform within half their step where each is computed, {} values of {} quantized weights moved by up to half their channel's step, {} seed{}{missing}; the largest output error counts",
            moved.activations,
            moved.weight_values,
            steps.weights.len(),
            seeds.len(),
            if seeds.len() == 1 { "" } else { "s" }
        ),
        rounds: if steps.dynamic > 0 { STORED_QUANTIZER_ROUNDS } else { QUANTIZER_ROUNDS }.to_string(),
        moved_values: moved.weight_values,
        exact_values: 0,
        relative: 1.0 / 255.0,
        seeds,
        output: target.output.to_string(),
        output_error: floor,
        candidate_error: target.candidate_error,
        ratio,
        ill_conditioned: target.candidate_error.is_finite() && floor.is_finite() && ratio <= ILL_CONDITIONED_FACTOR,
        left_for_the_fix: Vec::new(),
    })
}

/// What a diverged verdict's noise floor is measured against, decided once for bisect and `fix`:
/// the worst output, the candidate's error on it, and the weights the first divergent layer's
/// keep pattern alone reads (left exact).
pub(crate) struct FloorPlan {
    pub output: String,
    pub candidate_error: f64,
    pub left_for_the_fix: Vec<String>,
}

impl FloorPlan {
    /// The plan for `verdict`: `None` where it names no worst output with an error; `Err` with the
    /// reason where the floor could not change the verdict and is not measured: an output the
    /// candidate takes to inf/NaN is never ill-conditioned (a finite floor is no match for it), so
    /// two whole reference runs would decide nothing.
    pub(crate) fn of(
        judging: &Judging,
        index: &GraphIndex,
        verdict: &Verdict,
        comparison: &Comparison,
    ) -> Option<Result<FloorPlan, String>> {
        let output = verdict.worst_output.clone()?;
        let candidate_error = comparison.get(&output)?.error_level();
        if !candidate_error.is_finite() {
            return Some(Err(format!(
                "noise floor not measured: the candidate's error on '{output}' is not finite ({}), and the floor calls an output ill-conditioned only against a finite error, so it could not change this verdict",
                layerwise_report::format_number(candidate_error)
            )));
        }
        let left_for_the_fix = weights_only_the_fix_reads(index, judging, verdict, comparison);
        Some(Ok(FloorPlan { output, candidate_error, left_for_the_fix }))
    }

    /// The target of [`noise_floor`]: reference weights in `exact` stay as they are (a converted
    /// candidate's float32 weights), and a quantized candidate's floor moves its `quantizers`.
    pub(crate) fn target<'a>(
        &'a self,
        judging: &Judging,
        exact: &'a HashSet<String>,
        seed: u64,
        quantizers: Option<&'a layerwise_model::quant::QuantizerSteps>,
    ) -> FloorTarget<'a> {
        FloorTarget {
            output: &self.output,
            candidate_error: self.candidate_error,
            perturbation: judging.perturbation(),
            exact,
            left_for_the_fix: &self.left_for_the_fix,
            seed,
            quantizers,
        }
    }
}

/// The stored weights (initializers and Constants' values) that keeping the first divergent node's
/// pattern at reference precision keeps exact: those only its nodes read. Their rounding is part of
/// what that fix removes, so the noise floor (bisect's and `fix`'s), which measures what no keep
/// list of the break can remove, leaves them exact (a rotary embedding's inverse frequencies,
/// rounded to FP16, moved angles of 4,000 by more than the whole error, and the output was called
/// ill-conditioned, though keeping the angle's Mul with its Sin and Cos in FP32 fixes it).
fn weights_only_the_fix_reads(
    index: &GraphIndex,
    judging: &Judging,
    verdict: &Verdict,
    comparison: &Comparison,
) -> Vec<String> {
    let Some(fd) = &verdict.first_divergent else { return Vec::new() };
    let pattern = judging.keep_pattern(index, &fd.node, comparison, verdict);
    // In graph order, so that the report is the same run to run.
    let mut order: Vec<usize> = pattern.nodes.iter().filter_map(|n| index.node(n).map(|i| i.topo_index)).collect();
    order.sort_unstable();
    order.dedup();
    let kept: std::collections::HashSet<usize> = order.iter().copied().collect();
    let mut weights = Vec::new();
    for &k in &order {
        for input in index.nodes[k].inputs.iter().filter(|i| index.is_stored_value(i)) {
            if index.consumers(input).iter().all(|c| kept.contains(c)) && !weights.contains(input) {
                weights.push(input.clone());
            }
        }
    }
    weights
}
