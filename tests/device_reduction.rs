//! The GPU reduction (`layerwise_runtime::device_stats`) against the host's metrics
//! (`layerwise_analysis::compute`), an implementation it shares no code with but the last step:
//! the same tensors uploaded to the GPU and reduced there must give the host's counts, maxima and
//! worst element exactly, and its sums to float rounding. Needs a CUDA GPU and NVRTC: run on the
//! GPU machine (docs/gpu.md, "Samples compared on the GPU").

use half::{bf16, f16};
use layerwise_analysis::{compute, metrics_of_totals, Metrics, Tolerance};
use layerwise_runtime::device_stats::{DevicePair, DeviceReducer, ElementKind};
use rand::{Rng, SeedableRng};

/// Relative closeness of two float metrics (equal infinities and NaNs agree).
fn close(a: f64, b: f64, rel: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= rel * a.abs().max(b.abs())
}

fn assert_same(what: &str, host: &Metrics, device: &Metrics, rel: f64) {
    let exact = [
        ("numel", host.numel, device.numel),
        ("ref_nan", host.ref_nan, device.ref_nan),
        ("ref_inf", host.ref_inf, device.ref_inf),
        ("cand_nan", host.cand_nan, device.cand_nan),
        ("cand_inf", host.cand_inf, device.cand_inf),
        ("nonfinite_mismatch", host.nonfinite_mismatch, device.nonfinite_mismatch),
        ("ref_fp16_overflow", host.ref_fp16_overflow, device.ref_fp16_overflow),
        ("violations", host.violations, device.violations),
        ("worst_index", host.worst_index, device.worst_index),
    ];
    for (field, h, d) in exact {
        assert_eq!(h, d, "{what}: {field}");
    }
    assert_eq!(host.mask_sentinels, device.mask_sentinels, "{what}: sentinels");
    for (field, h, d) in [
        ("max_abs_err", host.max_abs_err, device.max_abs_err),
        ("ref_max_abs", host.ref_max_abs, device.ref_max_abs),
        ("ref_fp16_subnormal_share", host.ref_fp16_subnormal_share, device.ref_fp16_subnormal_share),
    ] {
        assert!(h == d || (h.is_nan() && d.is_nan()), "{what}: {field} {h} on the host, {d} on the GPU");
    }
    for (field, h, d) in [
        ("mean_abs_err", host.mean_abs_err, device.mean_abs_err),
        ("max_rel_err", host.max_rel_err, device.max_rel_err),
        ("rel_l2_err", host.rel_l2_err, device.rel_l2_err),
        ("cosine", host.cosine, device.cosine),
        ("snr_db", host.snr_db, device.snr_db),
    ] {
        assert!(close(h, d, rel), "{what}: {field} {h:e} on the host, {d:e} on the GPU");
    }
}

enum Side {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
}

impl Side {
    fn values(&self) -> Vec<f32> {
        match self {
            Side::F32(v) => v.clone(),
            Side::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            Side::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
            // As the host's `Tensor::to_f32`: each integer rounded to float32.
            Side::I64(v) => v.iter().map(|&x| x as f32).collect(),
            Side::I32(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }
    fn upload(&self, reducer: &mut DeviceReducer) -> (u64, ElementKind) {
        match self {
            Side::F32(v) => (reducer.upload(v).unwrap(), ElementKind::F32),
            Side::F16(v) => (reducer.upload(v).unwrap(), ElementKind::F16),
            Side::Bf16(v) => (reducer.upload(v).unwrap(), ElementKind::Bf16),
            Side::I64(v) => (reducer.upload(v).unwrap(), ElementKind::I64),
            Side::I32(v) => (reducer.upload(v).unwrap(), ElementKind::I32),
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU and NVRTC (run on the GPU machine, docs/gpu.md)"]
fn the_gpu_totals_give_the_hosts_metrics() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
    let n = 300_001; // five chunks and a partial one
    let reference: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() - 0.5) * 8.0).collect();
    // Non-finite values, mask sentinels, FP16 overflow and subnormals, zeros, mismatches: the
    // host takes its exact float64 path on these blocks, as the GPU does everywhere.
    let mut special_ref = reference.clone();
    let mut special_cand: Vec<f32> = reference.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    for i in (0..n).step_by(997) {
        match (i / 997) % 8 {
            0 => (special_ref[i], special_cand[i]) = (f32::NAN, f32::NAN),
            1 => (special_ref[i], special_cand[i]) = (f32::INFINITY, f32::INFINITY),
            2 => (special_ref[i], special_cand[i]) = (-3.4e38, -3.4e38),
            3 => (special_ref[i], special_cand[i]) = (-3.4e38, f32::NEG_INFINITY),
            4 => (special_ref[i], special_cand[i]) = (70_000.0, f32::INFINITY),
            5 => (special_ref[i], special_cand[i]) = (1e-6, 0.0),
            6 => (special_ref[i], special_cand[i]) = (0.0, 1e-3),
            _ => (special_ref[i], special_cand[i]) = (2.5, f32::NAN),
        }
    }
    // Integer tensors (shapes, indices): beyond 2^24 float32 rounds them, as the host does.
    let ints: Vec<i64> = (0..n as i64).map(|i| (i - 150_000) * 977 + (1 << 25) * (i % 3)).collect();
    let cases: Vec<(&str, Vec<f32>, Side, Tolerance)> = vec![
        (
            "int64 pair, a few values off",
            Side::I64(ints.clone()).values(),
            Side::I64(
                ints.iter().enumerate().map(|(i, &x)| if i % 40_000 == 3 { x + 1 + i as i64 } else { x }).collect(),
            ),
            Tolerance::FP32,
        ),
        (
            "int32 pair, a few values off",
            Side::I32(ints.iter().map(|&x| x as i32).collect()).values(),
            Side::I32(
                ints.iter().enumerate().map(|(i, &x)| if i % 40_000 == 5 { x as i32 - 7 } else { x as i32 }).collect(),
            ),
            Tolerance::FP16,
        ),
        (
            "FP16 candidate stored as FP16",
            reference.clone(),
            Side::F16(reference.iter().map(|&x| f16::from_f32(x * 1.001)).collect()),
            Tolerance::FP16,
        ),
        (
            "BF16 candidate stored as BF16",
            reference.clone(),
            Side::Bf16(reference.iter().map(|&x| bf16::from_f32(x)).collect()),
            Tolerance::BF16,
        ),
        (
            "float32 candidate, a few elements off",
            reference.clone(),
            Side::F32(
                reference
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| if i % 50_000 == 7 { x + 0.5 + (i / 50_000) as f32 * 0.25 } else { x })
                    .collect(),
            ),
            Tolerance::FP32,
        ),
        ("non-finite values and sentinels", special_ref.clone(), Side::F32(special_cand.clone()), Tolerance::FP16),
        (
            "sentinels only where both agree",
            special_ref.iter().map(|&x| if x.is_nan() || x.is_infinite() { 1.0 } else { x }).collect(),
            Side::F32(
                special_ref
                    .iter()
                    .map(|&x| {
                        if x.is_nan() || x.is_infinite() {
                            1.0
                        } else if x.abs() < 1e30 {
                            f16::from_f32(x).to_f32()
                        } else {
                            x
                        }
                    })
                    .collect(),
            ),
            Tolerance::FP16,
        ),
        ("one element", vec![3.0], Side::F32(vec![3.5]), Tolerance::FP16),
        ("empty", Vec::new(), Side::F32(Vec::new()), Tolerance::FP16),
    ];
    let mut reducer = DeviceReducer::new(0).unwrap_or_else(|e| panic!("{e}"));
    let mut buffers = Vec::new();
    let mut pairs = Vec::new();
    for (what, r, c, tol) in &cases {
        // An integer pair's reference is uploaded as integers too (its values here are their float32 roundings).
        let reference_side = match (what.starts_with("int64"), what.starts_with("int32")) {
            (true, _) => Side::I64(ints.clone()),
            (_, true) => Side::I32(ints.iter().map(|&x| x as i32).collect()),
            _ => Side::F32(r.clone()),
        };
        let (rp, rk) = reference_side.upload(&mut reducer);
        let (cp, ck) = c.upload(&mut reducer);
        buffers.extend([rp, cp]);
        pairs.push(DevicePair {
            reference: rp as *const _,
            candidate: cp as *const _,
            len: r.len(),
            blocks: 1,
            reference_stride: r.len(),
            candidate_stride: r.len(),
            reference_kind: rk,
            candidate_kind: ck,
            atol: tol.atol,
            rtol: tol.rtol,
            range_tol: tol.range_tol,
        });
    }
    // Blocks: every other row of 1,000 elements of the float32 case (a sample of a batch whose
    // samples are not the first dimension), against the same rows gathered on the host.
    let (rows, row) = (150, 1000);
    let float32_case = 4;
    let (_, r, c, tol) = &cases[float32_case];
    let gather =
        |v: &[f32]| -> Vec<f32> { (0..rows).flat_map(|b| v[2 * b * row..(2 * b + 1) * row].to_vec()).collect() };
    let (gathered_r, gathered_c) = (gather(r), gather(&c.values()));
    let strided = DevicePair {
        blocks: rows,
        reference_stride: 2 * row,
        candidate_stride: 2 * row,
        len: rows * row,
        ..pairs[float32_case]
    };
    let _ = tol;
    pairs.push(strided);
    let reduced = reducer.reduce(&pairs).unwrap_or_else(|e| panic!("{e}"));
    let again = reducer.reduce(&pairs).unwrap();
    assert_eq!(reduced, again, "the same totals every run");
    for ((what, r, c, tol), t) in cases.iter().zip(&reduced) {
        let host = compute(r, &c.values(), *tol);
        let device = metrics_of_totals(t);
        // The host sums all-finite blocks in float32 lanes: the sums agree to its rounding.
        assert_same(what, &host, &device, 1e-5);
        assert!(!host.passes() || device.passes(), "{what}: the verdict");
    }
    let host = compute(&gathered_r, &gathered_c, cases[float32_case].3);
    assert_same("strided blocks", &host, &metrics_of_totals(reduced.last().unwrap()), 1e-5);
    for b in buffers {
        reducer.release(b);
    }
}
