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

/// bisect's `chosen_sample` and `fix`'s sample choice share this order: diverged first, then
/// the larger error, NaN above inf.
#[test]
fn the_order_of_samples_puts_diverged_first_then_the_larger_error_nan_above_inf() {
    use layerwise_analysis::verdict_order;
    use std::cmp::Ordering::{Equal, Greater, Less};
    assert_eq!(verdict_order((true, 1e-3), (false, 10.0)), Greater);
    assert_eq!(verdict_order((false, 10.0), (true, 1e-3)), Less);
    assert_eq!(verdict_order((true, 2.0), (true, 1.0)), Greater);
    assert_eq!(verdict_order((true, f64::NAN), (true, f64::INFINITY)), Greater);
    assert_eq!(verdict_order((false, 0.5), (false, 0.5)), Equal);
}
