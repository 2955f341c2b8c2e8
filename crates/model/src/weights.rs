use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use crate::fp16;
use crate::model::{is_external, ExternalRef};
use crate::onnx::{attribute_proto::AttributeType, tensor_proto::DataType, GraphProto, TensorProto};
use crate::{Model, ModelError};

/// The values of a float32 weight (initializer or Constant tensor), wherever they are stored:
/// `float_data`, little-endian `raw_data`, or an external file.
pub fn float_weight_values(model: &Model, t: &TensorProto) -> Result<Vec<f32>, ModelError> {
    let err = |why: String| ModelError::ExternalData { tensor: t.name().to_string(), why };
    if t.data_type() != DataType::Float as i32 {
        return Err(ModelError::InvalidGraph(format!("tensor '{}' is not float32", t.name())));
    }
    let numel: usize = t.dims.iter().map(|&d| d.max(0) as usize).product();
    let bytes_to_f32 = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    if is_external(t) {
        let ext = ExternalRef::parse(t).map_err(err)?;
        let path = model.external_file(&ext.location).ok_or_else(|| err("in-memory model".into()))?;
        let len = ext.length.unwrap_or(numel as u64 * 4) as usize;
        let mut buf = vec![0u8; len];
        let mut f = File::open(&path).map_err(|e| err(format!("cannot open '{}': {e}", path.display())))?;
        f.seek(SeekFrom::Start(ext.offset))
            .and_then(|_| f.read_exact(&mut buf))
            .map_err(|e| err(format!("cannot read {len} bytes at offset {} of '{}': {e}", ext.offset, path.display())))?;
        return Ok(bytes_to_f32(&buf));
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
