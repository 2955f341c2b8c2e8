//! Many samples: what each sample contributes to the per-tensor aggregation over `--inputs DIR`
//! (done by `layerwise_analysis::aggregate_samples`, here and when `layerwise merge` combines
//! shards).

use layerwise_analysis::{Comparison, SampleData, SampleRun, Verdict};
use layerwise_runtime::inputs::PreparedInput;

/// One sample's results as aggregation needs them, in the job's tensor order.
pub(super) fn sample_data(
    name: &str,
    inputs: &[PreparedInput],
    comparison: &Comparison,
    verdict: &Verdict,
    selection_error: f64,
    order: &[String],
) -> SampleData {
    let nonfinite: u64 = inputs.iter().map(|i| i.tensor.non_finite_counts()).map(|(nan, inf)| (nan + inf) as u64).sum();
    let records: Vec<Option<&layerwise_analysis::TensorRecord>> = order.iter().map(|t| comparison.get(t)).collect();
    SampleData {
        run: SampleRun {
            sample: name.to_string(),
            status: verdict.status,
            // The largest output error, passing or not (a verdict names a worst output only when
            // one fails).
            worst_output_error: selection_error,
            first_divergent: verdict.first_divergent.as_ref().map(|f| f.node.clone()),
            nonfinite_inputs: (nonfinite > 0).then_some(nonfinite),
        },
        selection_error,
        errors: records.iter().map(|r| r.map(|r| r.error_level())).collect(),
        failing: records.iter().map(|r| r.is_some_and(|r| !r.pass)).collect(),
    }
}
