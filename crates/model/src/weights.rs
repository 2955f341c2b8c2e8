use crate::fp16;
use crate::model::is_external;
use crate::onnx::{attribute_proto::AttributeType, tensor_proto::DataType, GraphProto, TensorProto};
use crate::{Model, ModelError};

/// The values of a float32 weight (initializer or Constant tensor), wherever they are stored:
/// `float_data`, little-endian `raw_data`, or an external file.
pub fn float_weight_values(model: &Model, t: &TensorProto) -> Result<Vec<f32>, ModelError> {
    if t.data_type() != DataType::Float as i32 {
        return Err(ModelError::InvalidGraph(format!("tensor '{}' is not float32", t.name())));
    }
    let numel: usize = t.dims.iter().map(|&d| d.max(0) as usize).product();
    let bytes_to_f32 = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    if is_external(t) {
        return Ok(bytes_to_f32(&model.external_bytes(t)?));
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
        return Ok(bytes_to_f32(raw));
    }
    Ok(t.float_data.clone())
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
        let values = float_weight_values(model, t)?;
        let mut w = WeightRange { name, kind, numel: values.len(), max_abs: 0.0, overflow_count: 0, subnormal_count: 0 };
        for &v in &values {
            w.max_abs = w.max_abs.max(v.abs());
            if fp16::overflows(v) {
                w.overflow_count += 1;
            } else if v != 0.0 && v.abs() < fp16::FP16_MIN_NORMAL {
                w.subnormal_count += 1;
            }
        }
        if w.overflow_count > 0 || w.subnormal_count > 0 {
            found.push(w);
        }
    }
    found.sort_by(|a, b| b.overflow_count.cmp(&a.overflow_count).then(b.max_abs.total_cmp(&a.max_abs)));
    Ok(found)
}
