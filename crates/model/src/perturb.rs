//! Seeded perturbation of a model's weights by what one rounding of the candidate's precision
//! does to them: the noise floor runs the float32 reference on such a copy to measure how
//! sensitive the outputs are to the candidate's own rounding of the weights (docs/bisect.md, "The
//! noise floor").

use std::collections::HashSet;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::onnx::{tensor_proto::DataType, GraphProto, ModelProto, TensorProto};
use crate::rounding::{tf32_slots, Rounding};
use crate::weights::for_each_float_chunk;
use crate::{Model, ModelError};

/// Most bytes of external float32 weights that are perturbed in memory; a larger model's noise
/// floor is not measured.
pub const PERTURB_MAX_EXTERNAL_BYTES: u64 = 1 << 30;

/// Ops whose float inputs decide shapes or integer values, not arithmetic: a perturbed float cast
/// to an index changes the index, a perturbed Range bound the length.
const SHAPE_READERS: &[&str] = &["Cast", "Floor", "Ceil", "Round", "Range", "ConstantOfShape"];

/// Ops whose data input (slot 0) is moved, not computed with: their other inputs are shapes,
/// indices or pads; the data is stored like any tensor, and a TF32 tensor core reading their
/// output reads the weight's own values.
const LAYOUT_OPS: &[&str] =
    &["Reshape", "Expand", "Tile", "Slice", "Pad", "Transpose", "Identity", "Squeeze", "Unsqueeze", "Flatten"];

/// Inputs read as exponents: `x ^ 2.0009` is NaN for every negative x, while FP16 rounding leaves
/// 2.0 (any small integer) exactly as it is. (Silero VAD's STFT magnitude, `Pow(x, 2)`, turned into
/// NaN and read as a noise floor of 1.8.)
const EXPONENT_SLOTS: &[(&str, usize)] = &[("Pow", 1)];

/// Weights of `graph` that a node reads as a shape, an index, an exponent or a quantizer's scale
/// (see [`SHAPE_READERS`], [`EXPONENT_SLOTS`], the float32 slots of Resize/Upsample and
/// [`crate::convert::QUANTIZATION_OPS`]): they are left as they are.
fn shape_weights(graph: &GraphProto) -> HashSet<String> {
    let mut skip = HashSet::new();
    for n in &graph.node {
        for (slot, input) in n.input.iter().enumerate() {
            // A quantizer's scale stays float32 in the converted file and in the emulation
            // (`convert::QUANTIZATION_OPS`): the candidate does not round it.
            if SHAPE_READERS.contains(&n.op_type())
                || (crate::convert::QUANTIZATION_OPS.contains(&n.op_type()) && slot > 0)
                || (LAYOUT_OPS.contains(&n.op_type()) && slot > 0)
                || crate::convert::FP32_INPUT_SLOTS.contains(&(n.op_type(), slot))
                || EXPONENT_SLOTS.contains(&(n.op_type(), slot))
            {
                skip.insert(input.clone());
            }
        }
    }
    skip
}

/// How the noise floor perturbs a float32 weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Perturbation {
    /// Every weight stored in this format (FP16, BF16) moved by a random amount up to its own
    /// rounding error there: `w + r * |round(w) - w|`, `r` uniform in [-1, 1). A value exact in
    /// the format stays as it is, and so does one beyond its range (FP16 above 65504): storing it
    /// overflows, which the walk names (`weight_overflow`); it is no rounding to perturb by.
    Storage(Rounding),
    /// Only the weights TF32 tensor cores read (the multiplied inputs of Conv, MatMul, Gemm, ...,
    /// directly or through layout ops such as Transpose), each by up to its own TF32 rounding
    /// error. BatchNorm parameters, biases and every other weight stay exact.
    TensorCores,
    /// Every weight multiplied by `1 + relative * r`: float32 arithmetic, whose weights are exact
    /// but whose every operation rounds by up to this much.
    Relative(f64),
}

/// How many float32 weight values a perturbation moved, and how many it left as they were
/// because the candidate's precision does not change them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Perturbed {
    pub moved: usize,
    pub exact: usize,
}

/// Multiplies `v` by `1 + relative * r` with `r` uniform in [-1, 1) (a value that would leave
/// float32's range stays as it is).
pub fn perturb_values(values: &mut [f32], relative: f64, rng: &mut ChaCha8Rng) {
    for v in values.iter_mut() {
        let r: f64 = rng.random_range(-1.0..1.0);
        let moved = (*v as f64 * (1.0 + relative * r)) as f32;
        if moved.is_finite() {
            *v = moved;
        }
    }
}

/// Moves each value by up to its own rounding error in `rounding` (see [`Perturbation::Storage`]).
fn perturb_by_rounding(values: &mut [f32], rounding: Rounding, rng: &mut ChaCha8Rng, count: &mut Perturbed) {
    for v in values.iter_mut() {
        let rounded = rounding.round(*v);
        // Exact in the format, or beyond its range (storing it overflows: the walk names that
        // weight; as a perturbation it would move a -3.4e38 attention mask to -inf).
        if rounded == *v || !v.is_finite() || !rounded.is_finite() {
            count.exact += 1;
            continue;
        }
        let error = (rounded as f64 - *v as f64).abs();
        let r: f64 = rng.random_range(-1.0..1.0);
        let moved = (*v as f64 + r * error) as f32;
        if moved.is_finite() {
            *v = moved;
            count.moved += 1;
        } else {
            count.exact += 1;
        }
    }
}

/// A copy of `model` whose float32 weights (initializers and Constant tensors of the main graph
/// and of every body, except those read as shapes, indices or exponents, and those in `exact`)
/// are perturbed as `perturbation` says, with a generator seeded with `seed`. External weights
/// are read and stored inline. Also returns how many values moved.
pub fn perturb_weights(
    model: &Model,
    perturbation: Perturbation,
    exact: &HashSet<String>,
    seed: u64,
) -> Result<(ModelProto, Perturbed), ModelError> {
    let external: u64 = model
        .graph()
        .initializer
        .iter()
        .filter(|t| crate::is_external(t))
        .map(|t| t.dims.iter().map(|&d| d.max(0) as u64).product::<u64>() * 4)
        .sum();
    if external > PERTURB_MAX_EXTERNAL_BYTES {
        return Err(ModelError::InvalidGraph(format!(
            "{external} bytes of external weights are more than the {} that are perturbed in memory",
            PERTURB_MAX_EXTERNAL_BYTES
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut proto = model.proto.clone();
    let graph = proto.graph.as_mut().ok_or_else(|| ModelError::InvalidGraph("no graph".into()))?;
    let mut count = Perturbed::default();
    perturb_graph(model, graph, perturbation, exact, &mut rng, &mut count)?;
    Ok((proto, count))
}

/// Weights of `graph` that a TF32 tensor core reads: at a TF32 slot of a node, directly or through
/// layout ops (Transpose, Reshape, ...) that move the values without computing with them.
fn tensor_core_weights(graph: &GraphProto) -> HashSet<String> {
    let mut read: HashSet<String> =
        graph.node.iter().flat_map(|n| tf32_slots(n).iter().filter_map(|&s| n.input.get(s).cloned())).collect();
    // Back through layout ops until nothing changes.
    loop {
        let before = read.len();
        for n in graph.node.iter().filter(|n| LAYOUT_OPS.contains(&n.op_type())) {
            if n.output.iter().any(|o| read.contains(o)) {
                if let Some(data) = n.input.first() {
                    read.insert(data.clone());
                }
            }
        }
        if read.len() == before {
            return read;
        }
    }
}

fn perturb_one(
    model: &Model,
    t: &mut TensorProto,
    perturbation: Perturbation,
    rng: &mut ChaCha8Rng,
    count: &mut Perturbed,
) -> Result<(), ModelError> {
    match perturbation {
        Perturbation::Storage(rounding) => {
            perturb_tensor(model, t, rng, |v, rng| perturb_by_rounding(v, rounding, rng, count))
        }
        Perturbation::TensorCores => {
            perturb_tensor(model, t, rng, |v, rng| perturb_by_rounding(v, Rounding::Tf32, rng, count))
        }
        Perturbation::Relative(relative) => perturb_tensor(model, t, rng, |v, rng| {
            count.moved += v.len();
            perturb_values(v, relative, rng)
        }),
    }
}

fn perturb_graph(
    model: &Model,
    graph: &mut GraphProto,
    perturbation: Perturbation,
    exact: &HashSet<String>,
    rng: &mut ChaCha8Rng,
    count: &mut Perturbed,
) -> Result<(), ModelError> {
    let skip = shape_weights(graph);
    let only = (perturbation == Perturbation::TensorCores).then(|| tensor_core_weights(graph));
    let wanted =
        |name: &str| !skip.contains(name) && !exact.contains(name) && only.as_ref().is_none_or(|o| o.contains(name));
    for t in graph.initializer.iter_mut().filter(|t| wanted(t.name())) {
        perturb_one(model, t, perturbation, rng, count)?;
    }
    for node in graph.node.iter_mut() {
        let constant = node.op_type.as_deref() == Some("Constant") && node.output.iter().all(|o| wanted(o));
        for attr in node.attribute.iter_mut() {
            if constant {
                if let Some(t) = attr.t.as_mut() {
                    perturb_one(model, t, perturbation, rng, count)?;
                }
                let mut floats: Vec<f32> = attr.f.iter().copied().chain(attr.floats.iter().copied()).collect();
                if !floats.is_empty() {
                    match perturbation {
                        Perturbation::Storage(rounding) => perturb_by_rounding(&mut floats, rounding, rng, count),
                        Perturbation::TensorCores => perturb_by_rounding(&mut floats, Rounding::Tf32, rng, count),
                        Perturbation::Relative(relative) => {
                            count.moved += floats.len();
                            perturb_values(&mut floats, relative, rng)
                        }
                    }
                    let mut rest = floats.into_iter();
                    if let Some(f) = attr.f.as_mut() {
                        *f = rest.next().expect("counted");
                    }
                    attr.floats = rest.collect();
                }
            }
            for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()) {
                perturb_graph(model, g, perturbation, exact, rng, count)?;
            }
        }
    }
    Ok(())
}

fn perturb_tensor(
    model: &Model,
    t: &mut TensorProto,
    rng: &mut ChaCha8Rng,
    mut perturb: impl FnMut(&mut [f32], &mut ChaCha8Rng),
) -> Result<(), ModelError> {
    if t.data_type() != DataType::Float as i32 {
        return Ok(());
    }
    let mut values = Vec::new();
    for_each_float_chunk(model, t, &mut |chunk| values.extend_from_slice(chunk))?;
    perturb(&mut values, rng);
    *t = TensorProto {
        name: t.name.clone(),
        dims: t.dims.clone(),
        data_type: t.data_type,
        raw_data: Some(Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())),
        doc_string: t.doc_string.clone(),
        ..Default::default()
    };
    Ok(())
}

use crate::quant::Step;

/// What [`perturb_by_quantizer_steps`] moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuantizerPerturbed {
    /// Weight values moved.
    pub weight_values: usize,
    /// Activation tensors given noise.
    pub activations: usize,
}

/// A copy of the float32 `model` moved by one step of each of a quantized candidate's
/// quantizers, seeded with `seed`: each quantized weight by up to half its channel's step
/// (`w + r * step / 2`, r uniform in [-1, 1)), and each quantized activation by noise uniform in
/// [-step/2, step/2), added where it is computed (a RandomUniformLike and an Add read by every
/// consumer of the tensor). What the quantizers' resolution alone does to the outputs: a
/// candidate within a small factor of it has no quantizer at fault beyond its step.
pub fn perturb_by_quantizer_steps(
    model: &Model,
    steps: &crate::quant::QuantizerSteps,
    seed: u64,
) -> Result<(ModelProto, QuantizerPerturbed), ModelError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut proto = model.proto.clone();
    let graph = proto.graph.as_mut().ok_or_else(|| ModelError::InvalidGraph("no graph".into()))?;
    let mut moved = QuantizerPerturbed::default();
    for w in &steps.weights {
        let Some(t) = graph.initializer.iter_mut().find(|t| t.name() == w.weight) else { continue };
        let dims: Vec<usize> = t.dims.iter().map(|&d| d.max(0) as usize).collect();
        let inner: usize = dims.iter().skip(w.axis + 1).product();
        let channels = dims.get(w.axis).copied().unwrap_or(1).max(1);
        perturb_tensor(model, t, &mut rng, |values, rng| {
            for (i, v) in values.iter_mut().enumerate() {
                let step = if w.steps.len() == 1 {
                    w.steps[0]
                } else {
                    w.steps.get((i / inner.max(1)) % channels).copied().unwrap_or(Step::Absolute(0.0))
                };
                let r: f32 = rng.random_range(-1.0..1.0);
                let next = match step {
                    Step::Absolute(step) => *v + r * step / 2.0,
                    Step::Relative(step) => *v * (1.0 + r * step / 2.0),
                };
                if next.is_finite() {
                    *v = next;
                    moved.weight_values += 1;
                }
            }
        })?;
    }
    // Noise after each quantized activation, in graph order: right after its producer (or first,
    // for a graph input), read by every node that read the tensor.
    let mut nodes = Vec::with_capacity(graph.node.len() + 2 * steps.activations.len());
    let noisy: std::collections::HashMap<&str, (usize, Step)> =
        steps.activations.iter().enumerate().map(|(i, (t, s))| (t.as_str(), (i, *s))).collect();
    let renamed = |t: &str| format!("{t}__lw_quantizer_noise");
    // Absolute: t + u with u uniform within half the step; relative (float8): t + t * u.
    let noise_nodes = |t: &str, i: usize, step: Step| -> Vec<crate::onnx::NodeProto> {
        let noise = format!("{t}__lw_noise");
        let half = match step {
            Step::Absolute(s) | Step::Relative(s) => s / 2.0,
        };
        let mut nodes = vec![crate::builder::node(
            "RandomUniformLike",
            &format!("{t}__lw_noise_node"),
            &[t],
            &[&noise],
            vec![
                crate::builder::attr::float("low", -half),
                crate::builder::attr::float("high", half),
                crate::builder::attr::float(
                    "seed",
                    ((seed as u32).wrapping_mul(2_654_435_761).wrapping_add(i as u32) % 1_000_000) as f32,
                ),
                crate::builder::attr::int("dtype", DataType::Float as i64),
            ],
        )];
        let added = match step {
            Step::Absolute(_) => noise,
            Step::Relative(_) => {
                let scaled = format!("{t}__lw_relative_noise");
                nodes.push(crate::builder::node(
                    "Mul",
                    &format!("{t}__lw_scale_noise"),
                    &[t, &noise],
                    &[&scaled],
                    vec![],
                ));
                scaled
            }
        };
        nodes.push(crate::builder::node("Add", &format!("{t}__lw_add_noise"), &[t, &added], &[&renamed(t)], vec![]));
        nodes
    };
    for input in graph.input.iter().map(|v| v.name().to_string()).collect::<Vec<_>>() {
        if let Some(&(i, step)) = noisy.get(input.as_str()) {
            nodes.extend(noise_nodes(&input, i, step));
            moved.activations += 1;
        }
    }
    for mut node in std::mem::take(&mut graph.node) {
        for input in node.input.iter_mut().filter(|t| noisy.contains_key(t.as_str())) {
            *input = renamed(input);
        }
        let outputs: Vec<String> = node.output.clone();
        nodes.push(node);
        for o in outputs {
            if let Some(&(i, step)) = noisy.get(o.as_str()) {
                nodes.extend(noise_nodes(&o, i, step));
                moved.activations += 1;
            }
        }
    }
    graph.node = nodes;
    Ok((proto, moved))
}
