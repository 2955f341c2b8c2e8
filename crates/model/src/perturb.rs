//! Seeded perturbation of a model's weights at a given relative size: the noise floor runs the
//! float32 reference on such a copy to measure how sensitive the outputs are to perturbations as
//! small as one rounding of the candidate's arithmetic.

use std::collections::HashSet;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::onnx::{tensor_proto::DataType, GraphProto, ModelProto, TensorProto};
use crate::weights::for_each_float_chunk;
use crate::{Model, ModelError};

/// Most bytes of external float32 weights that are perturbed in memory; a larger model's noise
/// floor is not measured.
pub const PERTURB_MAX_EXTERNAL_BYTES: u64 = 1 << 30;

/// Ops whose float inputs decide shapes or integer values, not arithmetic: a perturbed Resize scale
/// changes the output's size, a perturbed float cast to an index changes the index.
const SHAPE_READERS: &[&str] = &["Cast", "Floor", "Ceil", "Round", "Range", "ConstantOfShape", "Reshape", "Expand", "Tile", "Slice", "Pad"];

/// Inputs read as exponents: `x ^ 2.0009` is NaN for every negative x, while FP16 rounding leaves
/// 2.0 (any small integer) exactly as it is. (Silero VAD's STFT magnitude, `Pow(x, 2)`, turned into
/// NaN and read as a noise floor of 1.8.)
const EXPONENT_SLOTS: &[(&str, usize)] = &[("Pow", 1)];

/// Weights of `graph` that a node reads as a shape, an index or an exponent (see
/// [`SHAPE_READERS`], [`EXPONENT_SLOTS`] and the float32 slots of Resize/Upsample): they are left
/// as they are.
fn shape_weights(graph: &GraphProto) -> HashSet<String> {
    let mut skip = HashSet::new();
    for n in &graph.node {
        for (slot, input) in n.input.iter().enumerate() {
            if SHAPE_READERS.contains(&n.op_type())
                || crate::convert::FP32_INPUT_SLOTS.contains(&(n.op_type(), slot))
                || EXPONENT_SLOTS.contains(&(n.op_type(), slot))
            {
                skip.insert(input.clone());
            }
        }
    }
    skip
}

/// Multiplies `v` by `1 + relative * r` with `r` uniform in [-1, 1).
pub fn perturb_values(values: &mut [f32], relative: f64, rng: &mut ChaCha8Rng) {
    for v in values.iter_mut() {
        let r: f64 = rng.random_range(-1.0..1.0);
        *v = (*v as f64 * (1.0 + relative * r)) as f32;
    }
}

/// A copy of `model` whose float32 weights (initializers and Constant tensors of the main graph
/// and of every body, except those read as shapes or indices) are each multiplied by `1 + relative * r`, `r` uniform in [-1, 1), drawn
/// from a generator seeded with `seed`. External weights are read and stored inline.
pub fn perturb_weights(model: &Model, relative: f64, seed: u64) -> Result<ModelProto, ModelError> {
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
    perturb_graph(model, graph, relative, &mut rng)?;
    Ok(proto)
}

fn perturb_graph(model: &Model, graph: &mut GraphProto, relative: f64, rng: &mut ChaCha8Rng) -> Result<(), ModelError> {
    let skip = shape_weights(graph);
    for t in graph.initializer.iter_mut().filter(|t| !skip.contains(t.name())) {
        perturb_tensor(model, t, relative, rng)?;
    }
    for node in graph.node.iter_mut() {
        let constant = node.op_type.as_deref() == Some("Constant") && !node.output.iter().any(|o| skip.contains(o));
        for attr in node.attribute.iter_mut() {
            if constant {
                if let Some(t) = attr.t.as_mut() {
                    perturb_tensor(model, t, relative, rng)?;
                }
                if let Some(f) = attr.f.as_mut() {
                    let mut v = [*f];
                    perturb_values(&mut v, relative, rng);
                    *f = v[0];
                }
                perturb_values(&mut attr.floats, relative, rng);
            }
            for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()) {
                perturb_graph(model, g, relative, rng)?;
            }
        }
    }
    Ok(())
}

fn perturb_tensor(model: &Model, t: &mut TensorProto, relative: f64, rng: &mut ChaCha8Rng) -> Result<(), ModelError> {
    if t.data_type() != DataType::Float as i32 {
        return Ok(());
    }
    let mut values = Vec::new();
    for_each_float_chunk(model, t, &mut |chunk| values.extend_from_slice(chunk))?;
    perturb_values(&mut values, relative, rng);
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
