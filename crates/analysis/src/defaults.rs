//! The defaults a candidate is judged by, decided once from what it computes in: the tolerance
//! (metrics.rs) and the walk's thresholds (verdict.rs).

use layerwise_model::{Arithmetic, QuantFamily};

use crate::metrics::Tolerance;
use crate::verdict::WalkRule;

/// The default tolerance and walk thresholds for what the candidate computes in, decided once:
/// TF32 keeps FP16's 10-bit mantissa in its products, so it gets FP16's, as int16 does (finer
/// than FP16's steps).
pub fn defaults_and_rule(arithmetic: Arithmetic) -> (Tolerance, WalkRule) {
    match arithmetic {
        Arithmetic::Float32 { tf32: false } => (Tolerance::FP32, WalkRule::FP32),
        Arithmetic::Float32 { tf32: true } | Arithmetic::Fp16 { .. } | Arithmetic::Quantized(QuantFamily::Int16) => {
            (Tolerance::FP16, WalkRule::FP16)
        }
        Arithmetic::Bf16 { .. } => (Tolerance::BF16, WalkRule::BF16),
        Arithmetic::Quantized(QuantFamily::Int8) => (Tolerance::INT8, WalkRule::INT8),
        Arithmetic::Quantized(QuantFamily::Int4) => (Tolerance::INT4, WalkRule::INT4),
        Arithmetic::Quantized(QuantFamily::Fp8E4M3) => (Tolerance::FP8_E4M3, WalkRule::FP8_E4M3),
        Arithmetic::Quantized(QuantFamily::Fp8E5M2) => (Tolerance::FP8_E5M2, WalkRule::FP8_E5M2),
    }
}
