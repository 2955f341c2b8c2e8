use layerwise_analysis::{compute, Tolerance};

const LOOSE: Tolerance = Tolerance { atol: 0.0, rtol: 0.0, range_tol: 0.0 };

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[test]
fn metrics_match_hand_computed_values() {
    // ref [1,2,3,4], cand [1,2,3,5]: one element off by 1.
    let m = compute(&[1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 3.0, 5.0], LOOSE);
    assert_eq!(m.numel, 4);
    assert_eq!(m.max_abs_err, 1.0);
    assert_eq!(m.mean_abs_err, 0.25);
    assert_eq!(m.max_rel_err, 0.25);
    assert!(close(m.rel_l2_err, 1.0 / 30f64.sqrt()));
    assert!(close(m.cosine, 34.0 / (30f64.sqrt() * 39f64.sqrt())));
    assert!(close(m.snr_db, 10.0 * 30f64.log10()));
    assert_eq!(m.ref_max_abs, 4.0);
    assert_eq!(m.worst_index, 3);
    assert_eq!(m.violations, 1);
    assert!(!m.passes());
}

#[test]
fn tolerance_terms_combine_as_documented() {
    // |c - r| <= atol + rtol*|r| + range_tol*max|r|: error 1 at r = 4, max|r| = 4.
    let r = [1.0, 2.0, 3.0, 4.0];
    let c = [1.0, 2.0, 3.0, 5.0];
    let t = |atol, rtol, range_tol| compute(&r, &c, Tolerance { atol, rtol, range_tol }).passes();
    assert!(t(1.0, 0.0, 0.0));
    assert!(!t(0.99, 0.0, 0.0));
    assert!(t(0.0, 0.25, 0.0));
    assert!(!t(0.0, 0.24, 0.0));
    assert!(t(0.0, 0.0, 0.25));
    assert!(t(0.5, 0.0625, 0.0625), "0.5 + 0.25 + 0.25 = 1");
    assert!(!t(0.49, 0.0625, 0.0625));
}

#[test]
fn identical_tensors_are_perfect() {
    let m = compute(&[0.5, -2.0, 7.0], &[0.5, -2.0, 7.0], LOOSE);
    assert_eq!((m.max_abs_err, m.rel_l2_err, m.cosine), (0.0, 0.0, 1.0));
    assert_eq!(m.snr_db, f64::INFINITY);
    assert!(m.passes());
    let zeros = compute(&[0.0, 0.0], &[0.0, 0.0], LOOSE);
    assert_eq!((zeros.rel_l2_err, zeros.cosine), (0.0, 1.0));
    let from_zero = compute(&[0.0, 0.0], &[0.0, 1e-3], LOOSE);
    assert_eq!(from_zero.rel_l2_err, f64::INFINITY, "any error on an all-zero reference is infinite relative error");
}

#[test]
fn non_finite_values_are_counted_and_fail() {
    let inf = f32::INFINITY;
    let m = compute(&[1.0, inf, f32::NAN, 2.0], &[inf, inf, f32::NAN, 2.0], LOOSE);
    assert_eq!((m.ref_inf, m.ref_nan, m.cand_inf, m.cand_nan), (1, 1, 2, 1));
    assert_eq!(m.nonfinite_mismatch, 1, "matching inf and NaN are not mismatches");
    assert_eq!(m.max_abs_err, f64::INFINITY);
    assert_eq!(m.rel_l2_err, f64::INFINITY);
    assert_eq!(m.snr_db, f64::NEG_INFINITY);
    assert!(m.cosine.is_nan());
    assert!(!m.passes());
    assert_eq!(m.error_level(), f64::INFINITY);
    let sign = compute(&[inf], &[-inf], LOOSE);
    assert_eq!(sign.nonfinite_mismatch, 1, "+inf against -inf is a mismatch");
}

#[test]
fn fp16_range_flags_come_from_the_reference() {
    let m = compute(&[70000.0, -1e-6, 0.5, 0.0], &[70000.0, -1e-6, 0.5, 0.0], LOOSE);
    assert_eq!(m.ref_fp16_overflow, 1);
    assert!(close(m.ref_fp16_subnormal_share, 1.0 / 3.0), "one of three non-zero values is FP16-subnormal");
    // Reference statistics include elements where the candidate is non-finite.
    let broken = compute(&[1e5, 1.0], &[f32::INFINITY, 1.0], LOOSE);
    assert_eq!(broken.ref_max_abs, 1e5);
    assert_eq!(broken.ref_fp16_overflow, 1);
}

/// The metrics computed naively in float64, element by element: what the blocked kernel must match.
fn naive(r: &[f32], c: &[f32], tol: Tolerance) -> (f64, f64, f64, f64, usize, usize, usize, f64) {
    let (mut d2, mut r2, mut c2, mut rc, mut sum_abs, mut worst, mut worst_i, mut max_r) =
        (0f64, 0f64, 0f64, 0f64, 0f64, -1f64, 0, 0f64);
    let mut mismatch = 0;
    for (i, (&a, &b)) in r.iter().zip(c).enumerate() {
        let (a, b) = (a as f64, b as f64);
        if a.is_finite() {
            max_r = max_r.max(a.abs());
        }
        let d = if a.is_finite() && b.is_finite() {
            d2 += (b - a) * (b - a);
            r2 += a * a;
            c2 += b * b;
            rc += a * b;
            sum_abs += (b - a).abs();
            (b - a).abs()
        } else if (a.is_nan() && b.is_nan()) || (a.is_infinite() && a == b) {
            0.0
        } else {
            mismatch += 1;
            f64::INFINITY
        };
        if d > worst {
            worst = d;
            worst_i = i;
        }
    }
    let violations = mismatch
        + r.iter()
            .zip(c)
            .filter(|(&a, &b)| {
                let (a, b) = (a as f64, b as f64);
                a.is_finite() && b.is_finite() && (b - a).abs() > tol.atol + tol.range_tol * max_r + tol.rtol * a.abs()
            })
            .count();
    (
        d2.sqrt() / r2.sqrt(),
        rc / (r2.sqrt() * c2.sqrt()),
        sum_abs / r.len() as f64,
        worst,
        worst_i,
        violations,
        mismatch,
        max_r,
    )
}

#[test]
fn blocked_kernel_matches_naive_float64_on_large_mixed_tensors() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    // Several blocks: ordinary values, a block of huge values, one of tiny values, a non-finite
    // value, FP16-like rounding error, and a few elements well beyond tolerance.
    let n = 4096 * 7 + 123;
    let mut r: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 4.0 - 2.0).collect();
    for x in &mut r[4096..4200] {
        *x *= 1e20;
    }
    for x in &mut r[8192..8300] {
        *x *= 1e-20;
    }
    let mut c: Vec<f32> = r.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
    for x in &mut c[4096..4200] {
        *x = r[4096] * 1.001;
    }
    c[20000] += 0.5;
    c[25000] -= 0.75;
    for tol in [Tolerance::FP16, Tolerance { atol: 0.0, rtol: 0.0, range_tol: 0.0 }, Tolerance::FP32] {
        let m = compute(&r, &c, tol);
        let (rel_l2, cosine, mean_abs, worst, worst_i, violations, _, max_r) = naive(&r, &c, tol);
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1e-30);
        assert!(near(m.rel_l2_err, rel_l2), "rel L2 {} vs {}", m.rel_l2_err, rel_l2);
        assert!(near(m.cosine, cosine), "cosine {} vs {}", m.cosine, cosine);
        assert!(near(m.mean_abs_err, mean_abs), "mean abs {} vs {}", m.mean_abs_err, mean_abs);
        assert_eq!(m.max_abs_err, worst);
        assert_eq!(m.worst_index, worst_i);
        assert_eq!(m.violations, violations, "violations with {tol:?}");
        assert_eq!(m.ref_max_abs, max_r);
    }
    // A NaN in the candidate: every metric goes to its non-finite value, and the count is exact.
    c[30] = f32::NAN;
    let m = compute(&r, &c, Tolerance::FP16);
    let (.., violations, mismatch, _) = naive(&r, &c, Tolerance::FP16);
    assert_eq!((m.nonfinite_mismatch, m.violations), (mismatch, violations));
    assert_eq!(m.rel_l2_err, f64::INFINITY);
}

/// An attention score tensor masked with `finfo(float32).min` (MiniLM quantized by
/// MinMax): the mask entries are the same on both sides, every real score is 100% off. The error
/// is that of the real scores, ~1, not 1e-38 (the mask's -3.4e38 dominating the norm).
#[test]
fn mask_sentinels_equal_on_both_sides_are_left_out_of_the_relative_error() {
    let mask = f32::MIN;
    // Half the 2 x 4096 elements masked, spread over both kinds of block (fast and exact).
    let reference: Vec<f32> = (0..8192).map(|i| if i % 2 == 0 { mask } else { 1.0 + (i % 7) as f32 }).collect();
    let candidate: Vec<f32> = reference.iter().map(|&r| if r == mask { mask } else { 2.0 * r }).collect();
    let m = compute(&reference, &candidate, Tolerance::INT8);
    assert!(close(m.rel_l2_err, 1.0), "real scores off by 100%: rel L2 {}", m.rel_l2_err);
    assert!(close(m.cosine, 1.0), "2x the real scores points the same way: cosine {}", m.cosine);
    assert!(close(m.snr_db, 0.0), "SNR {}", m.snr_db);
    let sentinels = m.mask_sentinels.expect("the mask entries are counted");
    assert_eq!(sentinels.count, 4096);
    assert_eq!(sentinels.ref_max_abs_outside, 7.0);
    assert_eq!(m.compared_max_abs(), 7.0, "a mask is no logit: the range the causes read");
    assert_eq!(m.ref_max_abs, f32::MAX as f64, "the reference's own reach is kept (FP16 storage would overflow on it)");
    let real_mean = reference.iter().filter(|&&r| r != mask).map(|&r| r as f64).sum::<f64>() / 4096.0;
    assert!(close(m.mean_abs_err, real_mean), "mean over the real scores: {} against {real_mean}", m.mean_abs_err);
    assert_eq!(m.violations, 4096, "range_tol scales the real scores' range, not 3.4e38");
    assert_eq!(m.nonfinite_mismatch, 0);
}

/// A mask the candidate does not keep is an error: -3.4e38 stored as -inf (FP16), or moved.
#[test]
fn a_mask_sentinel_the_candidate_loses_counts_as_an_error() {
    let reference = [f32::MIN, 1.0, f32::MIN, 2.0];
    let as_fp16 = compute(&reference, &[f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY, 2.0], LOOSE);
    assert_eq!(as_fp16.mask_sentinels, None);
    assert_eq!(as_fp16.nonfinite_mismatch, 2);
    assert_eq!(as_fp16.rel_l2_err, f64::INFINITY);
    let moved = compute(&reference, &[-1.0, 1.0, f32::MIN, 2.0], LOOSE);
    assert_eq!(moved.mask_sentinels.map(|s| s.count), Some(1), "only the kept entry is a sentinel");
    assert!(close(moved.rel_l2_err, 1.0), "the lost mask is all of the error: rel L2 {}", moved.rel_l2_err);
    // Matching infinities were already left out of the norms; they are now counted as sentinels.
    let inf = compute(&[f32::NEG_INFINITY, 1.0], &[f32::NEG_INFINITY, 1.0], LOOSE);
    assert_eq!((inf.mask_sentinels.map(|s| s.count), inf.rel_l2_err), (Some(1), 0.0));
}

/// Tensors without sentinels read as before: no `mask_sentinels`, and a huge value that differs
/// between the sides is a value.
#[test]
fn tensors_without_sentinels_have_none() {
    let m = compute(&[1e31, 1.0], &[1.1e31, 1.0], LOOSE);
    assert_eq!(m.mask_sentinels, None);
    assert_eq!(m.compared_max_abs(), m.ref_max_abs);
    let plain = compute(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.5], LOOSE);
    assert_eq!(plain.mask_sentinels, None);
}
