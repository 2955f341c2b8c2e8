//! Which tensors hold integers, and are judged exactly.
//!
//! An integer computed from a float (an index, a count, a class, a length) is exact or off by a
//! whole step: 355 frames against 354 is a different length, however small 1/355 is relatively.
//! Float tolerances pass it (rel L2 2.8e-3 is within FP16's 1%), so these tensors are judged
//! exactly: any changed value is out of tolerance, and the walk treats a changed integer as an
//! error that starts where it first appears (see `walk`).
//!
//! Not every integer tensor is such a value: a quantizer's codes and an integer op's accumulators
//! stand for floats on a quantizer's grid, one step of which is the quantizer's rounding. They
//! keep the float tolerances.

use std::collections::HashSet;

use layerwise_model::{DType, GraphIndex};

/// Ops that move or select values without computing new ones: what they output holds integers
/// when what they read does.
const DATA_MOVEMENT: &[&str] = &[
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Concat",
    "Slice",
    "Gather",
    "GatherElements",
    "GatherND",
    "Split",
    "Identity",
    "Expand",
    "Tile",
    "Pad",
    "DepthToSpace",
    "SpaceToDepth",
    "MaxPool",
];

/// Ops that compute integers from integers: what they output holds integers when every input
/// they compute from does (a sum of frame counts is a count).
const INTEGER_ARITHMETIC: &[&str] = &["Add", "Sub", "Mul", "Sum", "Neg", "Abs", "Relu", "CumSum", "ReduceSum"];

/// Ops that select one of their inputs' values: integers stay integers, constant bounds included
/// (a count clipped below at 1).
const SELECTING: &[&str] = &["Clip", "Max", "Min", "ReduceMax", "ReduceMin"];

/// The graph's answer, per tensor, to "does it hold integers" where its type alone cannot say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IntegerTensors {
    /// Float tensors that hold integers: outputs of Floor, Ceil and Round, and what data movement,
    /// a Cast, integer arithmetic or a selection makes of them.
    rounded: HashSet<String>,
    /// Integer tensors that stand for floats: a quantizer's codes, an integer op's accumulators,
    /// and what data movement makes of them.
    codes: HashSet<String>,
}

impl IntegerTensors {
    /// Reads the graph once, in topological order.
    pub fn of(index: &GraphIndex) -> IntegerTensors {
        let mut found = IntegerTensors::default();
        for node in &index.nodes {
            let op = node.op_type.as_str();
            let reads = |set: &HashSet<String>| node.inputs.iter().any(|i| set.contains(i));
            let data = node.inputs.iter().filter(|i| !i.is_empty());
            // Reductions and CumSum take their axes as a second input.
            let computes_from = if matches!(op, "ReduceSum" | "ReduceMax" | "ReduceMin" | "CumSum") {
                data.take(1).collect::<Vec<_>>()
            } else {
                data.collect()
            };
            let all_rounded = |constants_too: bool| {
                computes_from.iter().any(|i| found.rounded.contains(*i))
                    && computes_from
                        .iter()
                        .all(|i| found.rounded.contains(*i) || (constants_too && index.is_constant_like(i)))
            };
            let outputs = node.outputs.iter().filter(|o| !o.is_empty()).cloned();
            if matches!(op, "Floor" | "Ceil" | "Round")
                || ((DATA_MOVEMENT.contains(&op) || op == "Cast") && reads(&found.rounded))
                || (INTEGER_ARITHMETIC.contains(&op) && all_rounded(false))
                || (SELECTING.contains(&op) && all_rounded(true))
            {
                found.rounded.extend(outputs);
            } else if layerwise_model::quant::works_on_codes(op) || (DATA_MOVEMENT.contains(&op) && reads(&found.codes))
            {
                found.codes.extend(outputs);
            }
        }
        found
    }

    /// Whether `tensor`, of element type `dtype` in the reference, holds integers judged exactly:
    /// integer and truth-value tensors other than codes, and float tensors rounded to integers.
    pub fn holds(&self, tensor: &str, dtype: DType) -> bool {
        if dtype.is_float() {
            self.rounded.contains(tensor)
        } else {
            !self.codes.contains(tensor)
        }
    }
}
