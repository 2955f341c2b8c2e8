//! The noise floor: how much the worst output moves when the float32 reference runs with its
//! weights perturbed by one rounding of the candidate's arithmetic. A candidate whose error is
//! within a small factor of it has no culprit layer: the output is ill-conditioned.

use layerwise_analysis::{NoiseFloor, ILL_CONDITIONED_FACTOR};
use layerwise_model::perturb::perturb_weights;

use std::collections::HashMap;

use anyhow::{bail, Result};
use layerwise_analysis::Tolerance;
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_runtime::{Backend, RunRequest, Tensor};

/// Perturbation runs, each with its own seed; the floor is the largest output error among them.
const SEEDS: usize = 2;

/// What the noise floor is measured against: the worst output and its candidate error.
pub struct FloorTarget<'a> {
    pub output: &'a str,
    pub candidate_error: f64,
    /// Relative size of the perturbation: the candidate's unit roundoff.
    pub relative: f64,
    pub seed: u64,
}

/// Measures the noise floor of `target.output` on `reference`, whose unperturbed outputs are
/// `reference_outputs`.
pub fn noise_floor(
    reference: &mut dyn Backend,
    model: &Model,
    index: &GraphIndex,
    feeds: &[(String, Tensor)],
    reference_outputs: &HashMap<String, Tensor>,
    tolerance: Tolerance,
    target: FloorTarget,
) -> Result<NoiseFloor> {
    let mut seeds = Vec::new();
    let mut floor: f64 = 0.0;
    for i in 0..SEEDS as u64 {
        // Seeds of their own, apart from the input generator's.
        let seed = target.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(0x6e6f_6973_6500 + i);
        seeds.push(seed);
        let proto = perturb_weights(model, target.relative, seed)?;
        let perturbed = model.derived(proto, "noise-floor.onnx");
        let outputs = Selection::Names(Vec::new());
        let out = reference.run(&RunRequest { model: &perturbed, index, inputs: feeds, selection: &outputs })?;
        let (Some(r), Some(p)) = (reference_outputs.get(target.output), out.tensors.get(target.output)) else {
            bail!("the perturbed run returned no '{}'", target.output);
        };
        let error = layerwise_analysis::compute(&r.to_f32(), &p.to_f32(), tolerance).error_level();
        floor = floor.max(error);
    }
    let ratio = if floor > 0.0 { target.candidate_error / floor } else { f64::INFINITY };
    Ok(NoiseFloor {
        perturbation: format!("every float32 weight not read as a shape or index multiplied by (1 + {:.2e} * r), r uniform in [-1, 1), {SEEDS} seeds; the largest output error counts", target.relative),
        relative: target.relative,
        seeds,
        output: target.output.to_string(),
        output_error: floor,
        candidate_error: target.candidate_error,
        ratio,
        ill_conditioned: target.candidate_error.is_finite() && ratio <= ILL_CONDITIONED_FACTOR,
    })
}
