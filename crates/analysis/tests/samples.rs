//! Which sample carries a many-sample verdict.

use layerwise_analysis::{chosen_sample, SampleData, SampleRun, Status};

fn sample(name: &str, status: Status, error: f64) -> SampleData {
    SampleData {
        run: SampleRun {
            sample: name.into(),
            status,
            worst_output_error: error,
            first_divergent: None,
            nonfinite_inputs: None,
        },
        selection_error: error,
        errors: vec![Some(error)],
        failing: vec![status == Status::Diverged],
    }
}

/// A sample can fail its per-element tolerance (a few clipped values) with a smaller relative L2
/// than one that passes: the diverged one carries the verdict, or the verdict would say pass over
/// a diverged sample (an independent tester saw it on a Q/DQ MLP).
#[test]
fn a_diverged_sample_carries_the_verdict_before_a_passing_one_with_a_larger_error() {
    let samples = [
        sample("s0", Status::Pass, 0.02),
        sample("s1", Status::Pass, 0.08),
        sample("s2", Status::Diverged, 0.05),
        sample("s3", Status::Diverged, 0.03),
    ];
    assert_eq!(chosen_sample(&samples), Some(2));
    // Among passing samples only, the largest error; on ties, the earliest.
    let passing =
        [sample("s0", Status::Pass, 0.02), sample("s1", Status::Pass, 0.08), sample("s2", Status::Pass, 0.08)];
    assert_eq!(chosen_sample(&passing), Some(1));
}
