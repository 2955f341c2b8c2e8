//! Error metrics of one candidate tensor against its reference.

use layerwise_model::fp16::{FP16_MAX, FP16_MIN_NORMAL};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::integers::IntegerTensors;
use crate::num::FiniteOrString;
use layerwise_model::DType;

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
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Tolerance {
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub atol: f64,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub rtol: f64,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
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
    /// Defaults for BF16 candidates: FP16's, scaled by BF16's 8x coarser rounding.
    pub const BF16: Tolerance = Tolerance { atol: 8e-4, rtol: 8e-2, range_tol: 8e-2 };
    /// Defaults for Q/DQ candidates (a first calibration from the formats' steps, not
    /// yet checked on real models): one int8 step is 1/255 of a quantizer's range, so an error
    /// of a few steps is 1-5% of a tensor's largest value, whatever its own size.
    pub const INT8: Tolerance = Tolerance { atol: 1e-3, rtol: 5e-2, range_tol: 5e-2 };
    /// int4: 15 steps over the range, 17x coarser than int8.
    pub const INT4: Tolerance = Tolerance { atol: 1e-2, rtol: 0.25, range_tol: 0.25 };
    /// float8 e4m3fn: 3 mantissa bits, a relative step of 2^-3.
    pub const FP8_E4M3: Tolerance = Tolerance { atol: 1e-3, rtol: 0.125, range_tol: 0.125 };
    /// float8 e5m2: 2 mantissa bits, a relative step of 2^-2.
    pub const FP8_E5M2: Tolerance = Tolerance { atol: 1e-3, rtol: 0.25, range_tol: 0.25 };
    /// Tensors that hold integers (see [`IntegerTensors`]): any changed value is out.
    pub const EXACT: Tolerance = Tolerance { atol: 0.0, rtol: 0.0, range_tol: 0.0 };
}

/// The tolerance of every tensor: one for all, tensors (model outputs, usually) given their own
/// (`--atol logits:1e-3`), and exactness for tensors that hold integers (see [`IntegerTensors`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ToleranceSet {
    pub all: Tolerance,
    pub by_tensor: Vec<(String, Tolerance)>,
    /// Which tensors hold integers, read from the reference's graph; empty where none was read.
    pub integers: std::sync::Arc<IntegerTensors>,
    /// The model outputs a Concat joins, with their parts (see [`OutputJudge`]).
    pub output_parts: std::sync::Arc<std::collections::HashMap<String, OutputParts>>,
}

impl ToleranceSet {
    /// The tolerance given for `tensor` (its own, else the one for all), whatever it holds: for
    /// error levels and for the flags of a command line, which name one tolerance for all.
    pub fn of(&self, tensor: &str) -> Tolerance {
        self.by_tensor.iter().find(|(t, _)| t == tensor).map_or(self.all, |(_, tol)| *tol)
    }

    /// The tolerance `tensor`, of element type `dtype` in the reference, is judged by: its own
    /// where one was given, else [`Tolerance::EXACT`] where it holds integers, else the one for all.
    pub fn judging(&self, tensor: &str, dtype: DType) -> Tolerance {
        match self.by_tensor.iter().find(|(t, _)| t == tensor) {
            Some((_, tol)) => *tol,
            None if self.integers.holds(tensor, dtype) => Tolerance::EXACT,
            None => self.all,
        }
    }

    /// How model output `output`, of element type `dtype`, is judged.
    pub fn output(&self, output: &str, dtype: DType) -> OutputJudge {
        OutputJudge { tolerance: self.judging(output, dtype), parts: self.output_parts.get(output).cloned() }
    }

    /// These tolerances, with the integers of `index`'s graph judged exactly.
    pub fn with_integers_of(self, index: &layerwise_model::GraphIndex) -> ToleranceSet {
        ToleranceSet { integers: std::sync::Arc::new(IntegerTensors::of(index)), ..self }
    }
}

impl From<Tolerance> for ToleranceSet {
    fn from(all: Tolerance) -> ToleranceSet {
        ToleranceSet { all, by_tensor: Vec::new(), integers: Default::default(), output_parts: Default::default() }
    }
}

// Defined beside the quantizers, whose bulk leaves mask values out too.
pub use layerwise_model::quant::MASK_SENTINEL_MIN_ABS;

/// The mask sentinels of a tensor (see [`MASK_SENTINEL_MIN_ABS`]): elements where the reference and
/// the candidate hold the same value of `|x| >= 1e30` (infinities included). Both sides agree there,
/// so they add no error; they are left out of the norms (relative L2, cosine, SNR), of the mean
/// absolute error and of the range `range_tol` scales, so that the tensor's other values are
/// judged on their own. A sentinel the candidate does not keep (-3.4e38 stored as -inf by FP16,
/// or lost to a quantizer) is no sentinel here: it counts as an error as any other value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MaskSentinels {
    /// How many elements hold a sentinel, the same on both sides.
    pub count: usize,
    /// max |r| over the finite reference values outside the sentinels: the tensor's range as the
    /// relative metrics, the tolerance's `range_tol` and the causes read it.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub ref_max_abs_outside: f64,
}

/// How a model output that a Concat joins from parts of very different scale was judged: part by
/// part, each by its own range (`range_tol * max|ref|` of the part). One range for the whole tensor
/// lets the largest part set the allowance of all: YOLOv8n's [1, 84, N] output joins box
/// coordinates up to 317 and class scores below 1, and 5% of 317 passes every score rounded to 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PartJudging {
    /// The Concat's axis, and each part's first index and size along it.
    pub axis: usize,
    pub parts: Vec<(usize, usize)>,
    /// max |r| of each part.
    pub ranges: Vec<f64>,
    /// The parts out of tolerance (by position among the parts).
    pub failing: Vec<usize>,
    /// The part out of tolerance whose relative L2 (cosine, SNR) the tensor's metrics give, where
    /// one errs more than the whole tensor.
    pub worst_part: Option<usize>,
    /// The whole tensor's relative L2, which the largest part dominates.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub whole_rel_l2: f64,
}

/// How many times the smallest part's range the largest part's must be for a model output joined
/// by a Concat to be judged part by part: two orders of magnitude (YOLOv8n: 317 against 0.9).
pub const PART_SCALE_RATIO: f64 = 100.0;

/// A model output computed by a Concat of `sizes` along `axis` (read from the reference's graph
/// and types): what it may be judged by, part by part.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputParts {
    pub axis: usize,
    pub sizes: Vec<usize>,
}

/// How one model output is judged: its tolerance, and the parts a Concat joins it from, where known.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputJudge {
    pub tolerance: Tolerance,
    pub parts: Option<OutputParts>,
}

impl OutputJudge {
    /// [`compute`], with the parts judged apart where their ranges differ by
    /// [`PART_SCALE_RATIO`] or more: each part's violations against its own range, and where a
    /// part out of tolerance errs more than the whole tensor, the relative L2, cosine and SNR of
    /// the worst such part. A part within its own tolerance is no error, however large relatively.
    pub fn metrics(&self, reference: &[f32], candidate: &[f32], shape: &[usize]) -> Metrics {
        let whole = compute(reference, candidate, self.tolerance);
        let Some(parts) = &self.parts else { return whole };
        let Some(cut) = layerwise_model::slices::parts_along(shape, parts.axis, &parts.sizes) else { return whole };
        let ranges: Vec<f64> = cut.iter().map(|p| p.max_abs(reference)).collect();
        let (smallest, largest) = ranges.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        if !(largest > 0.0 && largest >= PART_SCALE_RATIO * smallest) {
            return whole;
        }
        let mut m = Metrics { violations: 0, ..whole.clone() };
        let (mut worst, mut worst_level, mut failing) = (None, whole.error_level(), Vec::new());
        for (k, part) in cut.iter().enumerate() {
            let one = compute(&part.values(reference), &part.values(candidate), self.tolerance);
            m.violations += one.violations;
            if one.passes() {
                continue;
            }
            failing.push(k);
            if one.error_level() > worst_level {
                (worst, worst_level) = (Some(k), one.error_level());
                (m.rel_l2_err, m.cosine, m.snr_db) = (one.rel_l2_err, one.cosine, one.snr_db);
            }
        }
        m.parts = Some(PartJudging {
            axis: parts.axis,
            parts: cut.iter().map(|p| (p.first, p.size)).collect(),
            ranges,
            failing,
            worst_part: worst,
            whole_rel_l2: whole.rel_l2_err,
        });
        m
    }
}

/// Metrics of one tensor. Errors are computed in f64 over the values widened to f32.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Metrics {
    pub numel: usize,
    /// max |c - r|; inf when the candidate is non-finite where the reference is not.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub max_abs_err: f64,
    /// mean |c - r|; inf likewise.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub mean_abs_err: f64,
    /// max |c - r| / |r| over elements with r != 0 (elements with r = 0 show in the absolute error);
    /// inf on a non-finite mismatch.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub max_rel_err: f64,
    /// ||c - r||_2 / ||r||_2; 0 when both are zero, inf when only r is zero or on a non-finite mismatch.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub rel_l2_err: f64,
    /// c·r / (||c|| ||r||); 1 when both are all zeros, NaN (undefined) on a non-finite mismatch.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub cosine: f64,
    /// 10·log10(||r||² / ||c - r||²) in dB; +inf when equal, -inf on a non-finite mismatch.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub snr_db: f64,
    pub ref_nan: usize,
    pub ref_inf: usize,
    pub cand_nan: usize,
    pub cand_inf: usize,
    /// Elements where the candidate is non-finite and the reference is not, or both are non-finite
    /// but differ (inf vs NaN, +inf vs -inf), or the reference is non-finite and the candidate not.
    pub nonfinite_mismatch: usize,
    /// max |r| over finite reference values, mask sentinels included (a fact of the reference: what
    /// FP16 storage would overflow on); the range the errors are judged against is
    /// [`Metrics::compared_max_abs`].
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub ref_max_abs: f64,
    /// Mask sentinels left out of the relative metrics, where the tensor has any (see [`MaskSentinels`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_sentinels: Option<MaskSentinels>,
    /// Where the tensor (a model output a Concat joins) was judged part by part, how: its
    /// violations are every part's against its own range, and its relative L2, cosine and SNR the
    /// worst failing part's where that errs more than the whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<PartJudging>,
    /// Reference values beyond the FP16 range (|r| > 65504): they overflow when stored as FP16.
    pub ref_fp16_overflow: usize,
    /// Share of non-zero reference values in the FP16 subnormal range (|r| < 6.1e-5), where FP16
    /// keeps fewer significant bits or flushes to zero.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
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

    /// max |r| over the finite reference values compared: [`Metrics::ref_max_abs`] without the mask
    /// sentinels (a mask is no logit, no operand). The range `range_tol` scales and the causes read.
    pub fn compared_max_abs(&self) -> f64 {
        self.mask_sentinels.map_or(self.ref_max_abs, |s| s.ref_max_abs_outside)
    }

    /// The inf/NaN values counted in the reference and in the candidate.
    pub fn nonfinite_counts(&self) -> (usize, usize) {
        (self.ref_nan + self.ref_inf, self.cand_nan + self.cand_inf)
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

/// Computes every metric of `candidate` against `reference` (same length).
///
/// The work is done block by block in one pass over both tensors. A block whose values are all
/// finite and of moderate magnitude (the usual case) is summed in float32 lanes that the compiler
/// vectorizes and is folded into float64 totals per block; any other block (inf/NaN, huge or tiny
/// values) takes the exact float64 path. Violations need max|ref| over the whole tensor, so each
/// block remembers its largest `|c - r| - rtol*|r|` and only blocks that may hold a violation are
/// re-read once max|ref| is known. `cargo bench --bench metrics` measures the throughput.
pub fn compute(reference: &[f32], candidate: &[f32], tol: Tolerance) -> Metrics {
    assert_eq!(reference.len(), candidate.len(), "compare tensors of equal length");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA, checked just above.
            return unsafe { compute_avx2(reference, candidate, tol) };
        }
    }
    compute_blocks(reference, candidate, tol)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn compute_avx2(reference: &[f32], candidate: &[f32], tol: Tolerance) -> Metrics {
    compute_blocks(reference, candidate, tol)
}

/// Elements per block: small enough that float32 lane sums stay accurate (512 terms per lane),
/// large enough that the per-block float64 fold costs nothing.
const BLOCK: usize = 4096;
const LANES: usize = 8;
/// Blocks whose magnitudes stay inside this range cannot overflow or underflow float32 squares.
const FAST_MIN: f32 = 1e-15;
const FAST_MAX: f32 = 1e15;

/// Running totals over blocks.
#[derive(Default)]
struct Totals {
    sum_abs: f64,
    sum_d2: f64,
    sum_r2: f64,
    sum_c2: f64,
    sum_rc: f64,
    nonzero: usize,
    subnormal: usize,
    worst: f64,
    /// Mask sentinels seen, and max |r| over the finite reference values outside them.
    sentinels: usize,
    compared_max: f64,
}

#[inline(always)]
fn compute_blocks(reference: &[f32], candidate: &[f32], tol: Tolerance) -> Metrics {
    let mut m = Metrics { numel: reference.len(), ..Default::default() };
    let mut t = Totals { worst: -1.0, ..Default::default() };
    // Per block: the largest `|c - r| - rtol*|r|` with a bound on its float32 rounding, or
    // `None` where violations must be counted exactly (blocks that took the exact path).
    let mut excess: Vec<Option<(f64, f64)>> = Vec::with_capacity(reference.len() / BLOCK + 1);
    let rtol = tol.rtol as f32;
    for (b, (r, c)) in reference.chunks(BLOCK).zip(candidate.chunks(BLOCK)).enumerate() {
        match fast_block(r, c, rtol) {
            Some(f) => {
                t.sum_abs += f.sum_abs;
                t.sum_d2 += f.sum_d2;
                t.sum_r2 += f.sum_r2;
                t.sum_c2 += f.sum_c2;
                t.sum_rc += f.sum_rc;
                t.nonzero += f.nonzero;
                t.subnormal += f.subnormal;
                m.ref_fp16_overflow += f.overflow;
                m.ref_max_abs = m.ref_max_abs.max(f.max_r);
                t.compared_max = t.compared_max.max(f.max_r);
                m.max_rel_err = m.max_rel_err.max(f.max_rel);
                if f.max_d > t.worst {
                    // The first element holding the block's largest error (rare: the maximum moves),
                    // found with the same float32 arithmetic, then measured exactly.
                    let i = r.iter().zip(c).position(|(&r, &c)| (c - r).abs() as f64 >= f.max_d).unwrap_or(0);
                    t.worst = (c[i] as f64 - r[i] as f64).abs();
                    m.worst_index = b * BLOCK + i;
                }
                excess.push(Some((f.max_excess, 1e-6 * (f.max_d + tol.rtol * f.max_r))));
            }
            None => {
                exact_block(r, c, b * BLOCK, &mut m, &mut t);
                excess.push(None);
            }
        }
    }
    if t.sentinels > 0 {
        m.mask_sentinels = Some(MaskSentinels { count: t.sentinels, ref_max_abs_outside: t.compared_max });
    }
    // The allowed error depends on the reference's range, known only now.
    let allowance = tol.atol + tol.range_tol * m.compared_max_abs();
    let mut finite_violations = 0;
    for (b, e) in excess.iter().enumerate() {
        if let Some((max_excess, slack)) = e {
            if max_excess + slack <= allowance {
                continue;
            }
        }
        let lo = b * BLOCK;
        let hi = (lo + BLOCK).min(reference.len());
        finite_violations += reference[lo..hi]
            .iter()
            .zip(&candidate[lo..hi])
            .filter(|(&r, &c)| {
                let (r, c) = (r as f64, c as f64);
                r.is_finite() && c.is_finite() && (c - r).abs() > allowance + tol.rtol * r.abs()
            })
            .count();
    }
    metrics_of_totals(&PairTotals {
        numel: m.numel,
        sum_abs: t.sum_abs,
        sum_d2: t.sum_d2,
        sum_r2: t.sum_r2,
        sum_c2: t.sum_c2,
        sum_rc: t.sum_rc,
        worst: t.worst,
        worst_index: m.worst_index,
        compared_max: t.compared_max,
        ref_max_abs: m.ref_max_abs,
        max_rel: m.max_rel_err,
        ref_nan: m.ref_nan,
        ref_inf: m.ref_inf,
        cand_nan: m.cand_nan,
        cand_inf: m.cand_inf,
        nonfinite_mismatch: m.nonfinite_mismatch,
        ref_fp16_overflow: m.ref_fp16_overflow,
        nonzero: t.nonzero,
        subnormal: t.subnormal,
        sentinels: t.sentinels,
        finite_violations,
    })
}

pub use layerwise_model::pair::PairTotals;

/// The metrics of a pair from its totals (see [`PairTotals`]).
pub fn metrics_of_totals(t: &PairTotals) -> Metrics {
    let mut m = Metrics {
        numel: t.numel,
        ref_nan: t.ref_nan,
        ref_inf: t.ref_inf,
        cand_nan: t.cand_nan,
        cand_inf: t.cand_inf,
        nonfinite_mismatch: t.nonfinite_mismatch,
        ref_max_abs: t.ref_max_abs,
        ref_fp16_overflow: t.ref_fp16_overflow,
        max_rel_err: t.max_rel,
        worst_index: t.worst_index,
        ..Default::default()
    };
    if t.sentinels > 0 {
        m.mask_sentinels = Some(MaskSentinels { count: t.sentinels, ref_max_abs_outside: t.compared_max });
    }
    m.violations = t.nonfinite_mismatch + t.finite_violations;
    // The mean is over the values compared: sentinels agree by definition.
    let n = (m.numel - t.sentinels).max(1) as f64;
    if m.nonfinite_mismatch > 0 {
        m.max_abs_err = f64::INFINITY;
        m.mean_abs_err = f64::INFINITY;
        m.max_rel_err = f64::INFINITY;
        m.rel_l2_err = f64::INFINITY;
        m.snr_db = f64::NEG_INFINITY;
    } else {
        m.max_abs_err = t.worst.max(0.0);
        m.mean_abs_err = t.sum_abs / n;
        m.rel_l2_err = ratio_or_inf(t.sum_d2.sqrt(), t.sum_r2.sqrt());
        m.snr_db = if t.sum_d2 == 0.0 {
            f64::INFINITY
        } else if t.sum_r2 == 0.0 {
            f64::NEG_INFINITY
        } else {
            10.0 * (t.sum_r2 / t.sum_d2).log10()
        };
    }
    m.cosine = if m.nonfinite_mismatch > 0 {
        f64::NAN
    } else if t.sum_r2 == 0.0 && t.sum_c2 == 0.0 {
        1.0
    } else if t.sum_r2 == 0.0 || t.sum_c2 == 0.0 {
        0.0
    } else {
        (t.sum_rc / (t.sum_r2.sqrt() * t.sum_c2.sqrt())).clamp(-1.0, 1.0)
    };
    m.ref_fp16_subnormal_share = if t.nonzero == 0 { 0.0 } else { t.subnormal as f64 / t.nonzero as f64 };
    m
}

/// Totals of one all-finite block, computed in float32 lanes.
struct FastBlock {
    sum_abs: f64,
    sum_d2: f64,
    sum_r2: f64,
    sum_c2: f64,
    sum_rc: f64,
    max_d: f64,
    max_r: f64,
    max_rel: f64,
    max_excess: f64,
    overflow: usize,
    nonzero: usize,
    subnormal: usize,
}

/// The vectorizable path, or `None` when the block holds inf/NaN or magnitudes whose float32
/// squares could overflow or underflow.
#[inline(always)]
fn fast_block(r: &[f32], c: &[f32], rtol: f32) -> Option<FastBlock> {
    // Magnitude bounds first: inf and NaN fail `< FAST_MAX` and send the block to the exact path.
    let outside = |r: f32, c: f32| -> u32 {
        let (a, b, d) = (r.abs(), c.abs(), (c - r).abs());
        (!(a < FAST_MAX) as u32)
            | (!(b < FAST_MAX) as u32)
            | ((a != 0.0 && a < FAST_MIN) as u32)
            | ((d != 0.0 && d < FAST_MIN) as u32)
    };
    let mut bad = [0u32; LANES];
    let (rc, cc) = (r.chunks_exact(LANES), c.chunks_exact(LANES));
    let (rt, ct) = (rc.remainder(), cc.remainder());
    for (r8, c8) in rc.zip(cc) {
        for l in 0..LANES {
            bad[l] |= outside(r8[l], c8[l]);
        }
    }
    for (&a, &b) in rt.iter().zip(ct) {
        bad[0] |= outside(a, b);
    }
    if bad.iter().any(|&x| x != 0) {
        return None;
    }

    let mut s_abs = [0f32; LANES];
    let mut s_d2 = [0f32; LANES];
    let mut s_r2 = [0f32; LANES];
    let mut s_c2 = [0f32; LANES];
    let mut s_rc = [0f32; LANES];
    let mut max_d = [0f32; LANES];
    let mut max_r = [0f32; LANES];
    let mut max_rel = [0f32; LANES];
    let mut max_excess = [f32::NEG_INFINITY; LANES];
    let mut overflow = [0u32; LANES];
    let mut nonzero = [0u32; LANES];
    let mut subnormal = [0u32; LANES];
    let mut lane = |l: usize, rv: f32, cv: f32| {
        let d = cv - rv;
        let ad = d.abs();
        let ar = rv.abs();
        s_abs[l] += ad;
        s_d2[l] += d * d;
        s_r2[l] += rv * rv;
        s_c2[l] += cv * cv;
        s_rc[l] += rv * cv;
        max_d[l] = max_d[l].max(ad);
        max_r[l] = max_r[l].max(ar);
        let rel = if ar != 0.0 { ad / ar } else { 0.0 };
        max_rel[l] = max_rel[l].max(rel);
        max_excess[l] = max_excess[l].max(ad - rtol * ar);
        overflow[l] += (ar > FP16_MAX) as u32;
        nonzero[l] += (ar != 0.0) as u32;
        subnormal[l] += (ar != 0.0 && ar < FP16_MIN_NORMAL) as u32;
    };
    for (r8, c8) in r.chunks_exact(LANES).zip(c.chunks_exact(LANES)) {
        for l in 0..LANES {
            lane(l, r8[l], c8[l]);
        }
    }
    for (&rv, &cv) in rt.iter().zip(ct) {
        lane(0, rv, cv);
    }
    let sum = |a: &[f32; LANES]| a.iter().map(|&x| x as f64).sum::<f64>();
    let max = |a: &[f32; LANES]| a.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let count = |a: &[u32; LANES]| a.iter().map(|&x| x as usize).sum::<usize>();
    Some(FastBlock {
        sum_abs: sum(&s_abs),
        sum_d2: sum(&s_d2),
        sum_r2: sum(&s_r2),
        sum_c2: sum(&s_c2),
        sum_rc: sum(&s_rc),
        max_d: max(&max_d),
        max_r: max(&max_r),
        max_rel: max(&max_rel),
        max_excess: max(&max_excess),
        overflow: count(&overflow),
        nonzero: count(&nonzero),
        subnormal: count(&subnormal),
    })
}

/// The exact float64 path, element by element, for blocks with inf/NaN or extreme magnitudes.
fn exact_block(reference: &[f32], candidate: &[f32], offset: usize, m: &mut Metrics, t: &mut Totals) {
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
                t.nonzero += 1;
                if ra < FP16_MIN_NORMAL as f64 {
                    t.subnormal += 1;
                }
            }
        }
        // A sentinel both sides hold: no error, and no part of the norms (see `MaskSentinels`).
        if r == c && r.abs() >= MASK_SENTINEL_MIN_ABS {
            t.sentinels += 1;
            continue;
        }
        if r.is_finite() {
            t.compared_max = t.compared_max.max(r.abs());
        }
        let d = if r.is_finite() && c.is_finite() {
            let d = (c - r).abs();
            t.sum_abs += d;
            t.sum_d2 += d * d;
            t.sum_r2 += r * r;
            t.sum_c2 += c * c;
            t.sum_rc += r * c;
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
        if d > t.worst {
            t.worst = d;
            m.worst_index = offset + i;
        }
    }
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
