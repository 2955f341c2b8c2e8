//! Error metrics of one candidate tensor against its reference.

use layerwise_model::fp16::{FP16_MAX, FP16_MIN_NORMAL};
use serde::Serialize;

/// Tolerances. An element passes when
/// `|cand - ref| <= atol + rtol * |ref| + range_tol * max|ref|`, where `max|ref|` is the largest
/// finite magnitude in the reference tensor. With `range_tol = 0` this is numpy's `allclose` rule.
/// A tensor passes when every element passes, its shape matches, and the candidate has no inf/NaN
/// where the reference differs.
///
/// Why the range term: reduced-precision error in a tensor follows the magnitudes that produced
/// it (a dot product of FP16 values errs in proportion to its inputs), not each element's own
/// value. A tensor mixing box coordinates up to 320 with scores near 0 has healthy absolute errors
/// of ~0.3 on its small elements; a probability map whose values are all ~1e-3 is broken by an
/// error of 1e-3, which an absolute tolerance would pass.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerance {
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub atol: f64,
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub rtol: f64,
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub range_tol: f64,
}

impl Tolerance {
    /// Defaults for reduced-precision candidates (FP16 storage). FP16 keeps about 3 significant
    /// decimal digits: healthy outputs of the real models tried (PP-OCRv4 rec, YOLOv8n, a CRNN)
    /// stay within 1% of their range, while real breaks (overflow, a lost normalisation) are at
    /// or beyond the range itself.
    pub const FP16: Tolerance = Tolerance { atol: 1e-4, rtol: 1e-2, range_tol: 1e-2 };
    /// Defaults for float32 candidates (another float32 runtime): TF32 in a large MatMul shows
    /// ~4e-4 relative error and fails; plain float32 reordering (~1e-7) passes.
    pub const FP32: Tolerance = Tolerance { atol: 1e-5, rtol: 1e-3, range_tol: 1e-4 };
}

/// Metrics of one tensor. Errors are computed in f64 over the values widened to f32.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Metrics {
    pub numel: usize,
    /// max |c - r|; inf when the candidate is non-finite where the reference is not.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub max_abs_err: f64,
    /// mean |c - r|; inf likewise.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub mean_abs_err: f64,
    /// max |c - r| / |r| over elements with r != 0 (elements with r = 0 show in the absolute error);
    /// inf on a non-finite mismatch.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub max_rel_err: f64,
    /// ||c - r||_2 / ||r||_2; 0 when both are zero, inf when only r is zero or on a non-finite mismatch.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub rel_l2_err: f64,
    /// c·r / (||c|| ||r||); 1 when both are all zeros, NaN (undefined) on a non-finite mismatch.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub cosine: f64,
    /// 10·log10(||r||² / ||c - r||²) in dB; +inf when equal, -inf on a non-finite mismatch.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub snr_db: f64,
    pub ref_nan: usize,
    pub ref_inf: usize,
    pub cand_nan: usize,
    pub cand_inf: usize,
    /// Elements where the candidate is non-finite and the reference is not, or both are non-finite
    /// but differ (inf vs NaN, +inf vs -inf), or the reference is non-finite and the candidate not.
    pub nonfinite_mismatch: usize,
    /// max |r| over finite reference values.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub ref_max_abs: f64,
    /// Reference values beyond the FP16 range (|r| > 65504): they overflow when stored as FP16.
    pub ref_fp16_overflow: usize,
    /// Share of non-zero reference values in the FP16 subnormal range (|r| < 6.1e-5), where FP16
    /// keeps fewer significant bits or flushes to zero.
    #[serde(serialize_with = "crate::num::finite_or_string")]
    pub ref_fp16_subnormal_share: f64,
    /// Elements outside `atol + rtol * |r| + range_tol * max|r|`, non-finite mismatches included.
    pub violations: usize,
    /// Flat index of the element with the largest absolute error.
    pub worst_index: usize,
}

impl Metrics {
    /// Whether the tensor is within `tol` (see [`Tolerance`]).
    pub fn passes(&self) -> bool {
        self.violations == 0 && self.nonfinite_mismatch == 0
    }

    /// The scalar used to rank tensors and to walk back: relative L2 error, inf for non-finite
    /// mismatches.
    pub fn error_level(&self) -> f64 {
        if self.nonfinite_mismatch > 0 {
            f64::INFINITY
        } else {
            self.rel_l2_err
        }
    }
}

/// Computes every metric in one pass. `reference` and `candidate` must have the same length.
pub fn compute(reference: &[f32], candidate: &[f32], tol: Tolerance) -> Metrics {
    assert_eq!(reference.len(), candidate.len(), "compare tensors of equal length");
    let mut m = Metrics { numel: reference.len(), ..Default::default() };
    let (mut sum_abs, mut sum_d2, mut sum_r2, mut sum_c2, mut sum_rc) = (0f64, 0f64, 0f64, 0f64, 0f64);
    let (mut nonzero, mut subnormal) = (0usize, 0usize);
    let mut worst = -1f64;
    for (i, (&r32, &c32)) in reference.iter().zip(candidate).enumerate() {
        let (r, c) = (r32 as f64, c32 as f64);
        m.ref_nan += r.is_nan() as usize;
        m.ref_inf += r.is_infinite() as usize;
        m.cand_nan += c.is_nan() as usize;
        m.cand_inf += c.is_infinite() as usize;
        // Reference statistics cover every finite reference value, whatever the candidate holds.
        if r.is_finite() {
            let ra = r.abs();
            m.ref_max_abs = m.ref_max_abs.max(ra);
            if ra > FP16_MAX as f64 {
                m.ref_fp16_overflow += 1;
            }
            if ra != 0.0 {
                nonzero += 1;
                if ra < FP16_MIN_NORMAL as f64 {
                    subnormal += 1;
                }
            }
        }
        let d = if r.is_finite() && c.is_finite() {
            let d = (c - r).abs();
            sum_abs += d;
            sum_d2 += d * d;
            sum_r2 += r * r;
            sum_c2 += c * c;
            sum_rc += r * c;
            if r != 0.0 {
                m.max_rel_err = m.max_rel_err.max(d / r.abs());
            }
            d
        } else if (r.is_nan() && c.is_nan()) || (r.is_infinite() && r == c) {
            0.0
        } else {
            m.nonfinite_mismatch += 1;
            f64::INFINITY
        };
        if d > worst {
            worst = d;
            m.worst_index = i;
        }
    }
    // The allowed error depends on the reference's range, known only after the first pass.
    let allowance = tol.atol + tol.range_tol * m.ref_max_abs;
    m.violations = m.nonfinite_mismatch
        + reference
            .iter()
            .zip(candidate)
            .filter(|(&r, &c)| {
                let (r, c) = (r as f64, c as f64);
                r.is_finite() && c.is_finite() && (c - r).abs() > allowance + tol.rtol * r.abs()
            })
            .count();
    let n = m.numel.max(1) as f64;
    if m.nonfinite_mismatch > 0 {
        m.max_abs_err = f64::INFINITY;
        m.mean_abs_err = f64::INFINITY;
        m.max_rel_err = f64::INFINITY;
        m.rel_l2_err = f64::INFINITY;
        m.snr_db = f64::NEG_INFINITY;
    } else {
        m.max_abs_err = worst.max(0.0);
        m.mean_abs_err = sum_abs / n;
        m.rel_l2_err = ratio_or_inf(sum_d2.sqrt(), sum_r2.sqrt());
        m.snr_db = if sum_d2 == 0.0 { f64::INFINITY } else if sum_r2 == 0.0 { f64::NEG_INFINITY } else { 10.0 * (sum_r2 / sum_d2).log10() };
    }
    m.cosine = if m.nonfinite_mismatch > 0 {
        f64::NAN
    } else if sum_r2 == 0.0 && sum_c2 == 0.0 {
        1.0
    } else if sum_r2 == 0.0 || sum_c2 == 0.0 {
        0.0
    } else {
        (sum_rc / (sum_r2.sqrt() * sum_c2.sqrt())).clamp(-1.0, 1.0)
    };
    m.ref_fp16_subnormal_share = if nonzero == 0 { 0.0 } else { subnormal as f64 / nonzero as f64 };
    m
}

/// a / b, with 0/0 = 0 and x/0 = inf.
fn ratio_or_inf(a: f64, b: f64) -> f64 {
    if a == 0.0 {
        0.0
    } else if b == 0.0 {
        f64::INFINITY
    } else {
        a / b
    }
}
