//! The noise floor: how much the worst output moves when the float32 reference runs with its
//! weights and inputs perturbed by one rounding of the candidate's arithmetic. A candidate whose
//! error is within a small factor of it has no culprit layer: the output is ill-conditioned.

use layerwise_analysis::{NoiseFloor, ILL_CONDITIONED_FACTOR};
use layerwise_model::perturb::{perturb_values, perturb_weights};
use layerwise_runtime::TensorData;
use rand::SeedableRng;

use super::*;

/// Perturbation runs, each with its own seed; the floor is the largest output error among them.
const SEEDS: usize = 2;

/// Measures the noise floor of `output`, whose candidate error is `candidate_error`, against the
/// reference's own outputs `reference`.
pub(super) fn noise_floor(
    job: &mut Job,
    feeds: &[(String, Tensor)],
    reference: &HashMap<String, Tensor>,
    output: &str,
    candidate_error: f64,
    relative: f64,
) -> Result<NoiseFloor> {
    let base_seed = job.options.inputs.seed;
    let mut seeds = Vec::new();
    let mut floor: f64 = 0.0;
    for i in 0..SEEDS as u64 {
        // Seeds of their own, apart from the input generator's.
        let seed = base_seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(0x6e6f_6973_6500 + i);
        seeds.push(seed);
        let proto = perturb_weights(job.model, relative, seed)?;
        let perturbed = job.model.derived(proto, "noise-floor.onnx");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 1);
        let inputs: Vec<(String, Tensor)> = feeds
            .iter()
            .map(|(n, t)| match &t.data {
                TensorData::F32(v) => {
                    let mut v = v.clone();
                    perturb_values(&mut v, relative, &mut rng);
                    (n.clone(), Tensor::f32(t.shape.clone(), v))
                }
                _ => (n.clone(), t.clone()),
            })
            .collect();
        let outputs = Selection::Names(Vec::new());
        let out = job.reference.run(&RunRequest { model: &perturbed, index: &job.index, inputs: &inputs, selection: &outputs })?;
        let (Some(r), Some(p)) = (reference.get(output), out.tensors.get(output)) else {
            bail!("the perturbed run returned no '{output}'");
        };
        let error = layerwise_analysis::compute(&r.to_f32(), &p.to_f32(), job.tolerance).error_level();
        floor = floor.max(error);
    }
    let ratio = if floor > 0.0 { candidate_error / floor } else { f64::INFINITY };
    Ok(NoiseFloor {
        perturbation: format!("every float32 weight and input multiplied by (1 + {relative:.2e} * r), r uniform in [-1, 1), {SEEDS} seeds; the largest output error counts"),
        relative,
        seeds,
        output: output.to_string(),
        output_error: floor,
        candidate_error,
        ratio,
        ill_conditioned: candidate_error.is_finite() && ratio <= ILL_CONDITIONED_FACTOR,
    })
}
