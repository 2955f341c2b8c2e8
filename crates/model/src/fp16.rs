//! FP16 facts shared by the rewriter and the analysis.

use half::f16;

/// Largest finite FP16 value. Anything that rounds beyond it becomes ±inf.
pub const FP16_MAX: f32 = 65504.0;
/// Smallest positive normal FP16 value; below it FP16 keeps fewer significant bits (subnormals).
pub const FP16_MIN_NORMAL: f32 = 6.103_515_6e-5;
/// Unit roundoff of FP16 (half an ulp at 1.0): the relative error of a single rounding.
pub const FP16_UNIT_ROUNDOFF: f64 = 1.0 / 2048.0;

/// Rounds an FP32 value to the nearest FP16 value (IEEE round-to-nearest-even) and back, exactly as
/// a `Cast(to=FLOAT16)` followed by `Cast(to=FLOAT)` does. Values of magnitude 65520 and above
/// become ±inf.
pub fn round_f32(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Magnitude from which FP32 values round to ±inf in FP16: halfway between 65504 and the next
/// step (65536), where round-to-nearest-even goes up.
pub const FP16_OVERFLOW_FROM: f32 = 65520.0;

/// Whether a finite FP32 value overflows when stored as FP16 (a comparison, not a conversion:
/// weight scans call it on billions of values).
pub fn overflows(x: f32) -> bool {
    x.is_finite() && x.abs() >= FP16_OVERFLOW_FROM
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_threshold_matches_the_conversion() {
        let below = f32::from_bits(FP16_OVERFLOW_FROM.to_bits() - 1);
        for x in [FP16_MAX, below, FP16_OVERFLOW_FROM, 1e6, f32::MAX, 0.0, 1.0, f32::INFINITY, f32::NAN] {
            for v in [x, -x] {
                assert_eq!(overflows(v), v.is_finite() && round_f32(v).is_infinite(), "{v}");
            }
        }
    }
}
