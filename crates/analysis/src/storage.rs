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

/// Ops that pass an operand's absolute error on unchanged by computing with it (added or
/// negated); [`MOVES`] pass it on too.
const ADDS: &[&str] = &["Add", "Sub", "Sum", "Neg"];
/// Ops that pass an operand's relative error on (a matrix product of positions by frequencies
/// carries the positions' rounding into the angle).
const RELATIVE: &[&str] = &["Mul", "Div", "MatMul", "Gemm"];
/// Ops that move or retype values without computing: they pass an operand's absolute error on
/// unchanged, and storing their output again rounds nothing new once the value is rounded, so
/// they are not named as roundings.
const MOVES: &[&str] = &[
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

/// How many of the format's steps at a value's magnitude its stored error may span and still be
/// that storage's rounding (the value's own rounding and its inputs').
const STEPS: f64 = 4.0;

/// Whether `output`'s error is already in `input`, passed on by `op`.
fn carried(op: &str, input: &TensorRecord, output: &TensorRecord) -> bool {
    if ADDS.contains(&op) || MOVES.contains(&op) {
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
    let consumer_node = index.node(&consumer.node)?;
    let mut lossy = InputView::of(index, comparison, consumer_node).worst()?;
    let mut steps = vec![lossy];
    loop {
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
            _ => break,
        }
    }
    let arithmetic = candidate.arithmetic.storage();
    // The storage step of each tensor on the path (consumer's input first): the last one's
    // producer introduced the error; a later node that stores the value with a step as coarse
    // rounds it again, and one with a much coarser step is where the information is lost (a
    // product stored at 1,000 after a value stored at 1).
    let spacing = |t: &TensorRecord| arithmetic.spacing(t.metrics.compared_max_abs());
    let computes = |t: &TensorRecord| index.producer(&t.name).is_some_and(|p| !MOVES.contains(&p.op_type.as_str()));
    let last = steps.len() - 1;
    let coarsest = steps
        .iter()
        .enumerate()
        .filter(|(i, t)| *i == last || computes(t))
        .filter_map(|(_, t)| spacing(t))
        .fold(0.0, f64::max);
    let needed = |t: &TensorRecord| spacing(t).is_some_and(|s| s >= 0.25 * coarsest);
    // The earliest storage on the path that the error needs: the information's origin.
    let at = (0..steps.len()).rev().find(|&i| (i == last || computes(steps[i])) && needed(steps[i]))?;
    steps.truncate(at + 1);
    let lossy = steps[at];
    let node = index.producer(&lossy.name)?;
    let inputs = InputView::of(index, comparison, node);
    let (magnitude, lost) = (lossy.metrics.compared_max_abs(), lossy.metrics.max_abs_err);
    let step = arithmetic.spacing(magnitude)?;
    if lossy.metrics.nonfinite_mismatch > 0 || lost > STEPS * step {
        return None;
    }
    // Every other storage the error needs, each kept with the origin: the path's later ones, and
    // the other operands of a cancelling Add or Sub stored at a step as coarse (both sides of a
    // difference of large values round).
    let again: Vec<&TensorRecord> = steps[..at].iter().copied().filter(|t| computes(t) && needed(t)).collect();
    let operands: Vec<&TensorRecord> = if consumer.cause.best.kind == CauseKind::PeriodicArgument {
        Vec::new()
    } else {
        consumer_node
            .inputs
            .iter()
            .filter(|t| **t != steps[0].name && !index.is_constant_like(t))
            .filter_map(|t| comparison.get(t))
            .filter(|t| computes(t) && needed(t))
            .collect()
    };
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
    let mut then = consumer_outcome(consumer);
    let named = |t: &&TensorRecord| {
        let producer = index.producer(&t.name).map_or("?", |p| p.name.as_str());
        let op = index.producer(&t.name).map_or("?", |p| p.op_type.as_str());
        format!("'{}' ({producer}, {op}, step {})", t.name, spacing(t).map_or("?".into(), step_text))
    };
    if !again.is_empty() {
        then.push_str(&format!(
            "; on the way there it is stored again at {}, a rounding as coarse",
            again.iter().map(named).collect::<Vec<_>>().join(", ")
        ));
    }
    if !operands.is_empty() {
        then.push_str(&format!(
            "; its other operand {} is stored as coarsely, and rounds too",
            operands.iter().map(named).collect::<Vec<_>>().join(", ")
        ));
    }
    // What the fix keeps with the origin: the path to the consumer, the consumer's own pattern,
    // and the producers of the other operands the error needs.
    let mut keep_with: Vec<String> =
        steps[..at].iter().filter_map(|t| Some(index.producer(&t.name)?.name.clone())).collect();
    keep_with.extend(crate::patterns::pattern_of(index, &consumer.node).nodes);
    keep_with.push(consumer.node.clone());
    keep_with.extend(operands.iter().filter_map(|t| Some(index.producer(&t.name)?.name.clone())));
    if !again.is_empty() || !operands.is_empty() {
        then.push_str(&format!(
            ": each storage alone leaves the others', so '{}' is kept with {}",
            node.name,
            keep_with
                .iter()
                .filter(|n| **n != node.name)
                .map(|n| format!("'{n}'"))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
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
        keep_with,
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
