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

/// Whether a finite FP32 value overflows when stored as FP16.
pub fn overflows(x: f32) -> bool {
    x.is_finite() && round_f32(x).is_infinite()
}
