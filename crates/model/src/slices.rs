//! Parts of a tensor along one axis: what a Concat joined (a detector's output holding box
//! coordinates up to 317 beside class scores below 1). One range for the whole tensor (a
//! tolerance's range term, a per-tensor quantizer's step) fits the largest part and says nothing
//! of the small ones, so they are judged, and their quantization measured, part by part.

/// Magnitude from which a value the reference and the candidate both hold, exactly the same, is a
/// mask sentinel rather than a computed value: an attention mask's `finfo(float32).min` =
/// -3.4028e38 (what Hugging Face models add to masked scores), a `-1e30`, or `±inf`. No healthy
/// activation comes near it (FP16 stops at 6.55e4; an overflowing float32 value is inf, counted
/// apart), yet one such value outweighs every real one in a norm: a score tensor whose real values
/// are all 100% off reads as a relative L2 of 1e-38. Smaller masks (-1e9, -1e4) are not told from
/// values and count as values.
/// A quantizer's bulk (`quant::quantizer_effect`) and a slice's range leave such values out too.
pub const MASK_SENTINEL_MIN_ABS: f64 = 1e30;

/// One part of a tensor of `shape` along `axis`: indices `first..first + size` there.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub first: usize,
    pub size: usize,
    /// Elements before `axis` (outer) and after it (inner), and the axis' length.
    outer: usize,
    inner: usize,
    len: usize,
}

/// The parts of sizes `sizes` along `axis` of a tensor of `shape`, where they tile that axis.
pub fn parts_along(shape: &[usize], axis: usize, sizes: &[usize]) -> Option<Vec<Part>> {
    let len = *shape.get(axis)?;
    if sizes.len() < 2 || sizes.iter().sum::<usize>() != len {
        return None;
    }
    let (outer, inner) = (shape[..axis].iter().product(), shape[axis + 1..].iter().product());
    let mut first = 0;
    Some(
        sizes
            .iter()
            .map(|&size| {
                let part = Part { first, size, outer, inner, len };
                first += size;
                part
            })
            .collect(),
    )
}

impl Part {
    /// The part's values of `values` (the whole tensor, row-major).
    pub fn values(&self, values: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.outer * self.size * self.inner);
        for o in 0..self.outer {
            let start = (o * self.len + self.first) * self.inner;
            out.extend_from_slice(&values[start..start + self.size * self.inner]);
        }
        out
    }

    /// max |x| of the part's finite values below the mask sentinels.
    pub fn max_abs(&self, values: &[f32]) -> f64 {
        self.values(values)
            .iter()
            .map(|v| v.abs() as f64)
            .filter(|a| a.is_finite() && *a < MASK_SENTINEL_MIN_ABS)
            .fold(0.0, f64::max)
    }
}
