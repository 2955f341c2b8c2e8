//! Many samples: per-tensor aggregation over the samples of `--inputs DIR`.

use super::*;

/// Per-tensor worst and mean error over samples; the verdict's sample is `chosen`.
pub(super) fn aggregate(samples: &[(&str, &Comparison, &Verdict)], chosen: usize, order: &[String]) -> Samples {
    let mut tensors = Vec::new();
    for t in order {
        let mut sum = 0.0;
        let mut count = 0usize;
        let mut worst: Option<(f64, &str)> = None;
        let mut failing = 0;
        for (name, c, _) in samples {
            let Some(r) = c.get(t) else { continue };
            let e = r.error_level();
            sum += e;
            count += 1;
            failing += (!r.pass) as usize;
            if worst.is_none_or(|(w, _)| e > w) {
                worst = Some((e, name));
            }
        }
        if let Some((worst_error, worst_sample)) = worst {
            tensors.push(SampleStats { tensor: t.clone(), mean_error: sum / count as f64, worst_error, worst_sample: worst_sample.to_string(), failing_samples: failing });
        }
    }
    let runs = samples
        .iter()
        .map(|(name, c, v)| SampleRun {
            sample: name.to_string(),
            status: v.status,
            worst_output_error: v.worst_output.as_ref().and_then(|o| c.get(o)).map(|r| r.error_level()).unwrap_or(0.0),
            first_divergent: v.first_divergent.as_ref().map(|f| f.node.clone()),
        })
        .collect();
    Samples { count: samples.len(), runs, worst_sample: samples[chosen].0.to_string(), tensors }
}
