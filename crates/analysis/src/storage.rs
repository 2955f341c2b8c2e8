//! Where a cancellation or a periodic function's argument lost its information.
//!
//! A Sub whose result is far below its operands, or a Cos of a large angle, breaks by the walk's
//! rule, but it computes nothing wrong: what it returns is the rounding error of an operand stored
//! earlier, at a magnitude where the format's step is coarse (`x + 65504` in FP16 has a step of
//! 32, so x is gone before the Sub). That rounding is small relative to the stored value (a
//! relative L2 of 2e-5) and no relative threshold sees it. The node that loses the information is
//! found from the consumer back: the producer of the operand whose error does not already come
//! from its own inputs, whose stored output's error one or two steps of the format account for.

use crate::causes::{step_text, CANCELLATION_RATIO};
use crate::compare::{Comparison, TensorRecord};
use crate::verdict::{Candidate, Cause, CauseKind, Evidence, FirstDivergent, InputView, Mechanism};
use layerwise_model::GraphIndex;

/// Ops that pass an operand's absolute error on unchanged (values moved, added or negated).
const ABSOLUTE: &[&str] = &[
    "Add",
    "Sub",
    "Sum",
    "Neg",
    "Reshape",
    "Transpose",
    "Identity",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Expand",
    "Concat",
    "Slice",
    "Gather",
    "Cast",
];
/// Ops that pass an operand's relative error on unchanged.
const RELATIVE: &[&str] = &["Mul", "Div"];

/// How many of the format's steps at a value's magnitude its stored error may span and still be
/// that storage's rounding (the value's own rounding and its inputs').
const STEPS: f64 = 4.0;

/// Whether `output`'s error is already in `input`, passed on by `op`.
fn carried(op: &str, input: &TensorRecord, output: &TensorRecord) -> bool {
    if ABSOLUTE.contains(&op) {
        input.metrics.max_abs_err >= 0.5 * output.metrics.max_abs_err
    } else if RELATIVE.contains(&op) {
        input.error_level() >= 0.5 * output.error_level()
    } else {
        false
    }
}

/// For a first divergent node whose cause is a cancellation or a periodic argument: the chain
/// steps from its lossy input back to the node that lost the information (output first), and
/// that node's finding. `None` where the loss is not one storage rounding.
pub(crate) fn origin<'a>(
    index: &GraphIndex,
    comparison: &'a Comparison,
    candidate: Candidate,
    consumer: &FirstDivergent,
) -> Option<(Vec<&'a TensorRecord>, FirstDivergent)> {
    if !matches!(consumer.cause.best.kind, CauseKind::Cancellation | CauseKind::PeriodicArgument) {
        return None;
    }
    let mut lossy = InputView::of(index, comparison, index.node(&consumer.node)?).worst()?;
    let mut steps = vec![lossy];
    let (node, inputs) = loop {
        let producer = index.producer(&lossy.name)?;
        let inputs = InputView::of(index, comparison, producer);
        if !inputs.unseen.is_empty() {
            return None;
        }
        match inputs.worst() {
            Some(input) if carried(&producer.op_type, input, lossy) => {
                lossy = input;
                steps.push(input);
            }
            _ => break (producer, inputs),
        }
    };
    let arithmetic = candidate.arithmetic.storage();
    let (magnitude, lost) = (lossy.metrics.compared_max_abs(), lossy.metrics.max_abs_err);
    let step = arithmetic.spacing(magnitude)?;
    if lossy.metrics.nonfinite_mismatch > 0 || lost > STEPS * step {
        return None;
    }
    let format = arithmetic.name();
    let mut stored =
        format!("it is off by up to {lost:.3e} (measured), a relative L2 of only {:.2e}", lossy.error_level());
    // More than its own rounding (half a step): the rest is its inputs' rounding, weights
    // included (a rotary embedding's inverse frequencies, stored in the candidate's format).
    if lost > 0.5 * step {
        let weights: Vec<String> =
            node.inputs.iter().filter(|t| index.is_initializer(t)).map(|t| format!("'{t}'")).collect();
        let named = if weights.is_empty() {
            String::new()
        } else {
            format!(
                ", among them its weight{} {} as the candidate stores {}",
                if weights.len() == 1 { "" } else { "s" },
                weights.join(", "),
                if weights.len() == 1 { "it" } else { "them" }
            )
        };
        stored.push_str(&format!(
            ", more than its own rounding (half a step, {}): the rest comes from the rounding of its inputs{named}",
            step_text(step / 2.0)
        ));
    }
    let then = consumer_outcome(consumer);
    // What an Add or Sub adds, where it is much smaller than the result: the operand it absorbs.
    let added = ["Add", "Sub"]
        .contains(&node.op_type.as_str())
        .then(|| {
            node.inputs
                .iter()
                .filter_map(|t| comparison.get(t))
                .min_by(|a, b| a.metrics.compared_max_abs().total_cmp(&b.metrics.compared_max_abs()))
        })
        .flatten()
        .filter(|small| small.metrics.compared_max_abs() * CANCELLATION_RATIO <= magnitude);
    let (kind, detail) = match added {
        Some(small) => {
            let size = small.metrics.compared_max_abs();
            let fate = if size < step / 2.0 { "under half a step: it is absorbed, rounded away entirely" } else { "so its low bits are rounded away" };
            (
                CauseKind::Absorption,
                format!(
                    "{}: its result reaches {magnitude:.4e} in the reference, where {format}'s step is {}, while what it adds, '{}', is at most {size:.3e} ({:.2} of a step), {fate}; stored in {format}, {stored}; then {then}",
                    node.op_type,
                    step_text(step),
                    small.name,
                    size / step
                ),
            )
        }
        None if consumer.cause.best.kind == CauseKind::PeriodicArgument => (
            CauseKind::PeriodicArgument,
            format!(
                "'{}' ({}) reaches {magnitude:.4e} in the reference, where {format}'s step is {} ({:.2} of the period 2*pi = 6.28 of '{}'); stored in {format}, {stored}; then {then}",
                lossy.name,
                node.op_type,
                step_text(step),
                step / std::f64::consts::TAU,
                consumer.node
            ),
        ),
        None => (
            CauseKind::Cancellation,
            format!("'{}' ({}) reaches {magnitude:.4e} in the reference, where {format}'s step is {}; stored in {format}, {stored}; then {then}", lossy.name, node.op_type, step_text(step)),
        ),
    };
    let worst_input = inputs.worst();
    let finding = FirstDivergent {
        node: node.name.clone(),
        op_type: node.op_type.clone(),
        tensor: lossy.name.clone(),
        input_error: inputs.error(),
        output_error: lossy.error_level(),
        evidence: Evidence {
            input_max_abs: worst_input.map(|r| r.metrics.compared_max_abs()),
            input_max_abs_err: worst_input.map(|r| r.metrics.max_abs_err),
            output_max_abs: magnitude,
            output_max_abs_err: lost,
        },
        cause: Cause {
            best: Mechanism { kind, weight: None, explains: consumer.cause.best.explains, detail },
            alternatives: Vec::new(),
        },
    };
    Some((steps, finding))
}

/// What the consumer does with the lost information, from its measured numbers.
fn consumer_outcome(consumer: &FirstDivergent) -> String {
    let (result, error) = (consumer.evidence.output_max_abs, consumer.output_error);
    match consumer.cause.best.kind {
        CauseKind::PeriodicArgument => {
            let outcome = if consumer.evidence.input_max_abs_err.is_some_and(|dx| dx >= 1.0) {
                "what it returns is noise"
            } else {
                "it errs by that much absolute"
            };
            format!(
                "'{}' ({}) depends on its argument's absolute error only: {outcome} (relative L2 {error:.2e})",
                consumer.node, consumer.op_type
            )
        }
        _ => {
            let operand = consumer.evidence.input_max_abs.unwrap_or(f64::NAN);
            format!(
                "'{}' ({}) cancels the large part: its result is at most {result:.3e}, {:.0}x below its operand, so all it returns is that rounding error (relative L2 {error:.2e})",
                consumer.node,
                consumer.op_type,
                operand / result.max(f64::MIN_POSITIVE)
            )
        }
    }
}
