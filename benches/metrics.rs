//! Throughput of the per-tensor metric kernel (`layerwise_analysis::compute`) on 100 MB tensors,
//! one core. Run: `cargo bench --bench metrics`. Prints GB/s counting the bytes of both tensors.

use std::time::Instant;

use layerwise_analysis::{compute, Tolerance};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn main() {
    let n = 100 * 1024 * 1024 / 4; // 100 MiB of float32 per tensor
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let reference: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
    let candidate: Vec<f32> = reference.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
    let bytes = (reference.len() + candidate.len()) * 4;
    let mut best = f64::INFINITY;
    let mut checksum = 0.0;
    for _ in 0..5 {
        let t = Instant::now();
        let m = compute(&reference, &candidate, Tolerance::FP16);
        best = best.min(t.elapsed().as_secs_f64());
        checksum += m.rel_l2_err;
    }
    println!(
        "metrics: 2 x {} MiB float32, best of 5: {:.3} s = {:.2} GB/s on one core (rel L2 {:.3e})",
        n * 4 / (1024 * 1024),
        best,
        bytes as f64 / best / 1e9,
        checksum / 5.0
    );
}
