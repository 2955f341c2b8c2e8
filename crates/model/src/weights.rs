use crate::fp16;
use crate::model::is_external;
use crate::onnx::{attribute_proto::AttributeType, tensor_proto::DataType, GraphProto, TensorProto};
use crate::{Model, ModelError};

/// The values of a float32 weight (initializer or Constant tensor), wherever they are stored:
/// `float_data`, little-endian `raw_data`, or an external file. Holds the whole weight: scans
/// over weights that may be large use [`for_each_float_chunk`].
pub fn float_weight_values(model: &Model, t: &TensorProto) -> Result<Vec<f32>, ModelError> {
    let mut values = Vec::new();
    for_each_float_chunk(model, t, &mut |chunk| values.extend_from_slice(chunk))?;
    Ok(values)
}

/// Calls `f` on successive chunks of a float32 weight's values; an external weight is streamed
/// through a bounded buffer, so a 2 GB weight is never held whole.
pub fn for_each_float_chunk(model: &Model, t: &TensorProto, f: &mut dyn FnMut(&[f32])) -> Result<(), ModelError> {
    if t.data_type() != DataType::Float as i32 {
        return Err(ModelError::InvalidGraph(format!("tensor '{}' is not float32", t.name())));
    }
    let numel: usize = t.dims.iter().map(|&d| d.max(0) as usize).product();
    let mut floats = Vec::new();
    let mut emit = |b: &[u8]| {
        floats.clear();
        floats.extend(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        f(&floats);
    };
    if is_external(t) {
        model.for_each_external_chunk(t, &mut |b| {
            emit(b);
            Ok(())
        })?;
        return Ok(());
    }
    if let Some(raw) = &t.raw_data {
        if raw.len() != numel * 4 {
            return Err(ModelError::InvalidGraph(format!(
                "tensor '{}' has {} bytes of raw data but its shape needs {}",
                t.name(),
                raw.len(),
                numel * 4
            )));
        }
        for part in raw.chunks(8 << 20) {
            emit(part);
        }
        return Ok(());
    }
    f(&t.float_data);
    Ok(())
}

/// A float32 weight whose values do not survive FP16 storage.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightRange {
    /// Initializer name, or the output name of the Constant node.
    pub name: String,
    /// `initializer` or `constant`.
    pub kind: &'static str,
    pub numel: usize,
    pub max_abs: f32,
    /// How many values become ±inf in FP16.
    pub overflow_count: usize,
    /// How many non-zero values fall in FP16's subnormal range (lose precision) or flush to zero.
    pub subnormal_count: usize,
    /// How many non-zero values are below half FP16's smallest subnormal (2^-25, about 3e-8):
    /// they become exactly 0 in FP16.
    pub underflow_count: usize,
    /// The largest magnitude among those (0 when none).
    pub underflow_max: f32,
}

/// Scans every float32 initializer and Constant of the main graph and returns those with values
/// out of FP16 range (overflow to inf) or in its subnormal range, worst first.
pub fn scan_fp16_weight_range(model: &Model) -> Result<Vec<WeightRange>, ModelError> {
    let mut found = Vec::new();
    let graph: &GraphProto = model.graph();
    let mut tensors: Vec<(&TensorProto, String, &'static str)> = Vec::new();
    for t in &graph.initializer {
        tensors.push((t, t.name().to_string(), "initializer"));
    }
    for n in graph.node.iter().filter(|n| n.op_type() == "Constant") {
        for a in &n.attribute {
            if a.name() == "value" && a.r#type() == AttributeType::Tensor {
                if let (Some(t), Some(out)) = (&a.t, n.output.first()) {
                    tensors.push((t, out.clone(), "constant"));
                }
            }
        }
    }
    for (t, name, kind) in tensors {
        if t.data_type() != DataType::Float as i32 {
            continue;
        }
        let mut w = WeightRange {
            name,
            kind,
            numel: 0,
            max_abs: 0.0,
            overflow_count: 0,
            subnormal_count: 0,
            underflow_count: 0,
            underflow_max: 0.0,
        };
        for_each_float_chunk(model, t, &mut |values| {
            w.numel += values.len();
            for &v in values {
                w.max_abs = w.max_abs.max(v.abs());
                if fp16::overflows(v) {
                    w.overflow_count += 1;
                } else if v != 0.0 && v.abs() < fp16::FP16_MIN_NORMAL {
                    w.subnormal_count += 1;
                    if fp16::round_f32(v) == 0.0 {
                        w.underflow_count += 1;
                        w.underflow_max = w.underflow_max.max(v.abs());
                    }
                }
            }
        })?;
        if w.overflow_count > 0 || w.subnormal_count > 0 {
            found.push(w);
        }
    }
    found.sort_by(|a, b| b.overflow_count.cmp(&a.overflow_count).then(b.max_abs.total_cmp(&a.max_abs)));
    Ok(found)
}

/// Gives `target` (a runtime's rewrite of `source`, read back from one file buffer) the bytes of
/// `source`'s weights wherever a weight kept its name and values, and its own copy of every
/// other weight, so that the file buffer goes when nothing else of `target` holds it: an
/// optimized program of a large model would otherwise hold a second copy of every weight.
pub fn share_unchanged_weights(target: &mut crate::onnx::ModelProto, source: &crate::onnx::ModelProto) {
    let Some(theirs) = source.graph.as_ref() else { return };
    let by_name: std::collections::HashMap<&str, &bytes::Bytes> =
        theirs.initializer.iter().filter_map(|t| t.raw_data.as_ref().map(|raw| (t.name(), raw))).collect();
    let Some(graph) = target.graph.as_mut() else { return };
    for t in graph.initializer.iter_mut() {
        let same = by_name.get(t.name()).copied();
        let Some(raw) = t.raw_data.as_mut() else { continue };
        *raw = match same {
            Some(same) if same == raw => same.clone(),
            _ => bytes::Bytes::copy_from_slice(raw),
        };
    }
}
