//! Value histograms of a reference and a candidate tensor on shared bins, for reports.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Histogram {
    /// Bin edges (`bins + 1` values) spanning the finite values of both tensors.
    pub edges: Vec<f64>,
    pub ref_counts: Vec<u64>,
    pub cand_counts: Vec<u64>,
    /// Values outside the bins: inf/NaN.
    pub ref_nonfinite: u64,
    pub cand_nonfinite: u64,
}

/// Counts both tensors' values on `bins` equal-width bins over their common finite range.
pub fn histogram(reference: &[f32], candidate: &[f32], bins: usize) -> Histogram {
    let bins = bins.max(1);
    let finite = reference.iter().chain(candidate).filter(|v| v.is_finite()).map(|&v| v as f64);
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi {
        (0.0, 1.0)
    } else if lo == hi {
        (lo - 0.5, hi + 0.5)
    } else {
        (lo, hi)
    };
    let width = (hi - lo) / bins as f64;
    let edges = (0..=bins).map(|i| lo + width * i as f64).collect();
    let count = |values: &[f32]| {
        let mut counts = vec![0u64; bins];
        let mut nonfinite = 0;
        for &v in values {
            if v.is_finite() {
                let i = (((v as f64 - lo) / width) as usize).min(bins - 1);
                counts[i] += 1;
            } else {
                nonfinite += 1;
            }
        }
        (counts, nonfinite)
    };
    let (ref_counts, ref_nonfinite) = count(reference);
    let (cand_counts, cand_nonfinite) = count(candidate);
    Histogram { edges, ref_counts, cand_counts, ref_nonfinite, cand_nonfinite }
}
