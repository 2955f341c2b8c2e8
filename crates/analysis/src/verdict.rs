//! The verdict's types: the walk's rule, the candidate's arithmetic, causes and their mechanisms,
//! the first divergent layer, the blame chain, and what a node's inputs show. Kept apart from the
//! walk (walk.rs), the cause catalogue (causes.rs) and the trace-back (storage.rs), which all use
//! them.

use layerwise_model::{Arithmetic, GraphIndex};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::compare::{Comparison, TensorRecord};
use crate::num::FiniteOrString;

/// Thresholds of the walk.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WalkRule {
    /// How many times its largest input error a node's output error must be to introduce error.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub ratio: f64,
    /// Smallest output error (relative L2) that counts as a break.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub min_break: f64,
    /// Largest input error (relative L2) that is still drift rather than an earlier break.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub max_drift: f64,
}

impl WalkRule {
    /// FP16 candidates: rounding to FP16 alone gives a relative error of about 3e-4 per tensor;
    /// a break is at least an order of magnitude above the inputs and above 1%.
    pub const FP16: WalkRule = WalkRule { ratio: 10.0, min_break: 1e-2, max_drift: 5e-2 };
    /// Float32 candidates (another runtime, TF32): breaks are much smaller in absolute terms.
    pub const FP32: WalkRule = WalkRule { ratio: 10.0, min_break: 1e-4, max_drift: 1e-3 };
    /// BF16 candidates: FP16's thresholds scaled by BF16's 8x coarser rounding.
    pub const BF16: WalkRule = WalkRule { ratio: 10.0, min_break: 8e-2, max_drift: 0.4 };
    /// Q/DQ candidates (a first calibration): one int8 quantizer adds a relative L2 of
    /// about 0.4-1% to the tensor it quantizes.
    pub const INT8: WalkRule = WalkRule { ratio: 10.0, min_break: 5e-2, max_drift: 0.25 };
    pub const INT4: WalkRule = WalkRule { ratio: 10.0, min_break: 0.25, max_drift: 0.6 };
    pub const FP8_E4M3: WalkRule = WalkRule { ratio: 10.0, min_break: 0.125, max_drift: 0.4 };
    pub const FP8_E5M2: WalkRule = WalkRule { ratio: 10.0, min_break: 0.25, max_drift: 0.6 };
}

/// What kind of cause a break has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    /// The reference value exceeds the candidate storage's range at this node (FP16's 65504,
    /// BF16's 3.3895e38): the candidate overflows to inf.
    ValueOverflow,
    /// A weight the node reads is out of FP16 range (inf after conversion).
    WeightOverflow,
    /// A constant or weight below half FP16's smallest subnormal (2^-25) becomes exactly 0 and
    /// reaches an op that turns 0 into inf/NaN (Log, Reciprocal, a Div's denominator, a negative
    /// Pow), typically as the epsilon of `x^2 + eps`.
    Underflow,
    /// A reduction whose kernel stores its running sum in FP16 (ReduceMean, ReduceLogSumExp on
    /// ONNX Runtime's CUDA provider, measured): the sum leaves FP16's range though the result
    /// does not.
    AccumulatorOverflow,
    /// The node turns finite inputs into inf/NaN without its reference exceeding the FP16 range.
    NonFiniteProduced,
    /// The node reads inf/NaN already (a model input's, or a tensor's before it on both sides),
    /// and the two sides carry them differently here: a quantizer stores them as finite codes.
    /// They do not arise here, and no rounding error explains them.
    NonFiniteInput,
    /// The node amplifies small input error (Softmax, Div, Exp, Pow, normalisations, ...).
    Amplification,
    /// The node itself loses precision (values in the FP16 subnormal range, cancellation).
    PrecisionLoss,
    /// An integer computed from a float (Cast to an integer type, Floor/Ceil/Round, ArgMax,
    /// ArgMin, TopK's indices): the input's rounding moves values across an integer boundary, and
    /// each lands on another integer (an index, a count), not on a nearby value.
    IntegerBoundary,
    /// A float32 Conv/MatMul/Gemm that the candidate ran with TF32 tensor cores (10-bit mantissa).
    Tf32,
    /// A saturating activation (Sigmoid, Tanh, Exp, Softplus) in its flat region: its relative
    /// output error is the absolute error of its input, however small that is relatively.
    Saturation,
    /// Softmax/LogSoftmax on large logits: it depends on the absolute differences of its inputs,
    /// and a small relative error of a large logit is a large absolute one.
    LargeLogits,
    /// A kernel that rounds inside its formula (ONNX Runtime's CUDA BF16 Sigmoid, FP16/BF16
    /// Softplus, measured): small outputs keep only an absolute precision.
    KernelRounding,
    /// An Add (or Sub) stores its result where the format's step is not small against what it
    /// adds: the smaller operand is lost in one rounding (`x + 65504` in FP16, step 32), and a
    /// later subtraction of the large part returns only that rounding error.
    Absorption,
    /// A subtraction whose result is far below its operands: all that is left is the rounding
    /// error the operands were stored with (the step of the format at their magnitude).
    Cancellation,
    /// The argument of a periodic function (Sin, Cos) is stored where the format's step is a
    /// sizable share of the period 2*pi: what the function returns of it is noise.
    PeriodicArgument,
    /// A quantizer of the candidate whose range the reference's values leave: they are clipped
    /// to its end (a scale calibrated too small).
    QuantizerClipping,
    /// A per-tensor quantizer whose step a few outliers set (one channel far larger than the
    /// rest): the bulk of the values keeps a few levels, or rounds to 0.
    QuantizerOutlierStep,
    /// A per-tensor quantizer of a model output that a Concat joins from parts of very different
    /// scale (boxes up to 317 beside scores below 1): its one step fits the largest part and
    /// rounds a small one to a few levels, or to 0.
    QuantizerPartStep,
    /// A weight stored with one scale whose output channels differ by orders of magnitude: the
    /// small channels keep a few levels, or round to 0.
    PerTensorWeight,
    /// An integer quantizer of one-sided values (a Relu's output, never negative) whose zero point
    /// leaves half of its codes or more unused: its step is that much coarser than needed.
    QuantizerZeroPoint,
    /// A denominator (of a Div, a Reciprocal, a Pow with a negative exponent, or the Sqrt under
    /// them, as LayerNorm's variance) that a quantizer rounds to 0 or near it: the quotient
    /// becomes inf or grows many times.
    QuantizedDenominator,
    /// An integer MatMul, Gemm or Conv (Q/DQ around it, fused by the runtime) whose sums of
    /// quantized products can pass the int32 accumulator's 2^31: they wrap around.
    IntegerAccumulatorOverflow,
}

impl CauseKind {
    /// Information lost in one storage rounding, which a later node exposes: the loss is absolute
    /// and its relative L2 tiny by nature.
    pub fn is_storage_loss(self) -> bool {
        matches!(self, CauseKind::Absorption | CauseKind::Cancellation | CauseKind::PeriodicArgument)
    }
}

/// What the walk knows about the candidate beyond its numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Candidate {
    /// What it computes in: storage, TF32 tensor cores, quantization (which causes can apply).
    pub arithmetic: Arithmetic,
    /// The absolute tolerance: an absolute error below it is not material.
    pub atol: f64,
}

/// One mechanism that may account for a node's output error, with how much of it it explains.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Mechanism {
    pub kind: CauseKind,
    /// The weight at fault, for `weight_overflow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
    /// Share of the observed error this mechanism can account for, from the measured numbers
    /// (1 = all of it); `null` where it cannot be estimated from them.
    #[serde(default, with = "crate::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub explains: Option<f64>,
    /// One sentence for people, with the numbers that show it.
    pub detail: String,
}

/// Why a node breaks: the mechanism that explains most of its error (its fields at the top level
/// of the JSON), and the others considered.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Cause {
    #[serde(flatten)]
    pub best: Mechanism,
    /// Other mechanisms that apply to the candidate's arithmetic, best first.
    pub alternatives: Vec<Mechanism>,
}

/// The measured numbers a cause is drawn from (the reference's magnitudes and the candidate's
/// errors), for the node's largest-error data input and its output.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct Evidence {
    /// max |x| of the input in the reference; `null` when no input was compared.
    #[serde(default, with = "crate::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub input_max_abs: Option<f64>,
    /// max |cand - ref| of that input.
    #[serde(default, with = "crate::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub input_max_abs_err: Option<f64>,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_max_abs: f64,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_max_abs_err: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FirstDivergent {
    pub node: String,
    pub op_type: String,
    pub tensor: String,
    /// Largest relative L2 error among the node's data inputs (graph inputs are exact); `null`
    /// when one of them was not compared.
    #[serde(default, with = "crate::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub input_error: Option<f64>,
    /// Relative L2 error of the node's output.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_error: f64,
    pub evidence: Evidence,
    pub cause: Cause,
    /// For information lost in a storage rounding (absorption, cancellation, a periodic argument):
    /// the nodes kept at reference precision with this one, because the error needs their storage
    /// too: the path to the node that shows the loss (the Sub that cancels, the Sin or Cos), that
    /// node's pattern, and the producers of a cancellation's other large operands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep_with: Vec<String>,
}

/// Where the walk cannot see further back: a node on the error's path whose data inputs were not
/// all compared (another model's names, a fused-away tensor), so the error may enter there or
/// anywhere before it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SightEnd {
    pub node: String,
    pub op_type: String,
    pub tensor: String,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_error: f64,
    /// The node's data inputs that were not compared, with the reason.
    pub unseen_inputs: Vec<(String, String)>,
}

/// One step of the blame chain, from the worst output back towards the first divergent node.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ChainStep {
    pub tensor: String,
    pub node: String,
    pub op_type: String,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub error: f64,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub max_abs_err: f64,
    pub nonfinite: usize,
}

/// A tensor where the candidate has inf/NaN that the reference does not.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NonFiniteTensor {
    pub tensor: String,
    pub node: String,
    pub op_type: String,
    pub cand_nan: usize,
    pub cand_inf: usize,
    pub mismatched: usize,
    /// True where the node's own inputs are free of such mismatches: the inf/NaN is born here.
    pub origin: bool,
    pub on_chain: bool,
    /// A weight or a value computed from weights alone (out of FP16 range), not a layer output.
    pub weight: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Diverged,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Verdict {
    pub status: Status,
    pub worst_output: Option<String>,
    pub first_divergent: Option<FirstDivergent>,
    pub chain: Vec<ChainStep>,
    /// One paragraph for people: what was found, or why no single node is to blame.
    pub summary: String,
    pub non_finite: Vec<NonFiniteTensor>,
    /// Every breaking node the walk passed, from the output back (the first divergent included):
    /// each is a candidate for the counterfactual check.
    pub breaks: Vec<FirstDivergent>,
    /// Set when the walk reached a node whose inputs were not compared: no node further back can
    /// be named, and none at or after it is called the origin.
    pub sight_ends: Option<SightEnd>,
    /// What the runs after the walk found (run alone, keeping breaks at reference precision, the
    /// noise floor), one sentence each, in the order every report shows them.
    pub conclusions: Vec<String>,
}

/// A node's data inputs (weights excluded, the tensors its bodies read from the outer scope
/// included), sorted by what is known of them.
pub(crate) struct InputView<'a> {
    /// Compared in both runs.
    pub(crate) seen: Vec<&'a TensorRecord>,
    /// Not compared, with the reason: their error is unknown.
    pub(crate) unseen: Vec<(String, String)>,
}

impl<'a> InputView<'a> {
    pub(crate) fn of(
        index: &GraphIndex,
        comparison: &'a Comparison,
        node: &layerwise_model::NodeInfo,
    ) -> InputView<'a> {
        let mut view = InputView { seen: Vec::new(), unseen: Vec::new() };
        // A weight is exact in the reference and rounded as stored in the candidate, which the
        // tolerances allow for; what is computed from weights only (positions times inverse
        // frequencies) carries error like any tensor where it was compared. A stored value (an
        // initializer or a Constant node's output) is no step: its reader is the layer.
        let weight_derived =
            |t: &str| index.is_constant_like(t) && !index.is_stored_value(t) && comparison.get(t).is_some();
        // A DequantizeLinear's input from a QuantizeLinear is integer codes, whose relative error
        // is taken against codes offset by the zero point (a uint8 tensor near 135 "erred" by
        // 1.3e-2 where the value it codes erred by 1.7e-1): the value read is what the
        // QuantizeLinear quantizes, and that is the input compared.
        let quantized_value = |t: &'_ String| -> String {
            match index.producer(t) {
                Some(q) if node.op_type == "DequantizeLinear" && q.op_type == "QuantizeLinear" => {
                    q.inputs.first().filter(|x| !x.is_empty()).cloned().unwrap_or_else(|| t.clone())
                }
                _ => t.clone(),
            }
        };
        for t in node.all_inputs().filter(|t| !index.is_constant_like(t) || weight_derived(t)).map(quantized_value) {
            let t = &t;
            match comparison.get(t) {
                // Both runs are fed the same graph inputs: they are exact (also where one is an
                // output too, and compared as the candidate returns it).
                _ if index.is_graph_input(t) => {}
                Some(r) => view.seen.push(r),
                None => {
                    let why = comparison
                        .not_compared
                        .iter()
                        .find(|(n, _)| n == t)
                        .map_or("not compared".to_string(), |(_, r)| r.clone());
                    view.unseen.push((t.clone(), why));
                }
            }
        }
        view
    }

    /// The largest input error, or `None` when an input was not compared.
    pub(crate) fn error(&self) -> Option<f64> {
        self.unseen.is_empty().then(|| self.seen.iter().map(|r| r.error_level()).fold(0.0, f64::max))
    }

    /// The compared input the error comes from: inf/NaN first, then changed integers (an index
    /// off by one changes what is read, whatever its relative size), then the largest error.
    pub(crate) fn worst(&self) -> Option<&'a TensorRecord> {
        self.seen
            .iter()
            .max_by(|a, b| a.walk_rank().cmp(&b.walk_rank()).then(a.error_level().total_cmp(&b.error_level())))
            .copied()
    }

    /// Whether an input holds inf/NaN the reference does not, seen or carried: a quantizer's
    /// codes, and the integer sums and dequantized values computed from them, are finite whatever
    /// they were computed from (a NaN activation's codes are garbage, not NaN), so inf/NaN where
    /// such a tensor is read again comes from the float the quantizer read.
    pub(crate) fn nonfinite(&self, index: &GraphIndex, comparison: &Comparison) -> bool {
        self.seen.iter().any(|r| r.metrics.nonfinite_mismatch > 0 || carries_nonfinite(index, comparison, &r.name))
    }

    /// Whether an input holds integers that changed: an error already there, however small.
    pub(crate) fn integers_changed(&self) -> bool {
        self.seen.iter().any(|r| r.integers_changed())
    }
}

/// Whether `tensor`, computed by quantizers or integer ops, was computed from a float that holds
/// inf/NaN in the candidate where the reference does not (see [`InputView::nonfinite`]).
pub(crate) fn carries_nonfinite(index: &GraphIndex, comparison: &Comparison, tensor: &str) -> bool {
    let through = layerwise_model::quant::works_on_codes;
    let mut stack = vec![(tensor.to_string(), 0usize)];
    while let Some((t, depth)) = stack.pop() {
        let Some(p) = index.producer(&t).filter(|p| through(&p.op_type) && depth < 8) else { continue };
        for i in p.inputs.iter().filter(|i| !i.is_empty() && !index.is_constant_like(i)) {
            if comparison.get(i).is_some_and(|r| r.metrics.nonfinite_mismatch > 0) {
                return true;
            }
            stack.push((i.clone(), depth + 1));
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    use layerwise_model::{DataType, GraphIndex, Tensor, TensorData};

    use super::InputView;
    use crate::{compare_all, Tolerance};

    /// Found by the independent tester (pipecat's smart-turn encoder): a DequantizeLinear's input
    /// was its QuantizeLinear's uint8 codes, whose relative error is taken against codes near the
    /// zero point (1.3e-2), while the value they code erred by 1.7e-1, and the verdict said the
    /// DequantizeLinear "amplifies its input error 13.1x". Its input is the quantized value.
    #[test]
    fn a_dequantizelinear_reads_the_value_its_quantizelinear_quantizes_not_the_codes() {
        let mut b = ModelBuilder::new("qdq", 17);
        b.input("x", DataType::Float, &[Dim::from(4)]);
        b.initializer(f32_tensor("s", &[], &[0.01]));
        b.initializer(layerwise_model::onnx::TensorProto {
            name: Some("z".into()),
            data_type: Some(DataType::Uint8 as i32),
            int32_data: vec![135],
            ..Default::default()
        });
        b.node("Relu", "act", &["x"], &["a"], vec![]);
        b.node("QuantizeLinear", "q", &["a", "s", "z"], &["codes"], vec![]);
        b.node("DequantizeLinear", "dq", &["codes", "s", "z"], &["y"], vec![]);
        b.output("y", DataType::Float);
        let index = GraphIndex::build(b.graph()).unwrap();
        let float = |v: &[f32]| Tensor::f32(vec![4], v.to_vec());
        let codes = |v: &[u8]| Tensor::new(vec![4], TensorData::U8(v.to_vec()));
        let reference: HashMap<String, Tensor> = [
            ("a".to_string(), float(&[0.1, 0.2, 0.3, 0.4])),
            ("codes".to_string(), codes(&[145, 155, 165, 175])),
            ("y".to_string(), float(&[0.1, 0.2, 0.3, 0.4])),
        ]
        .into();
        let candidate: HashMap<String, Tensor> = [
            ("a".to_string(), float(&[0.12, 0.16, 0.35, 0.45])),
            ("codes".to_string(), codes(&[147, 151, 170, 180])),
            ("y".to_string(), float(&[0.12, 0.16, 0.35, 0.45])),
        ]
        .into();
        let order: Vec<String> = ["a", "codes", "y"].iter().map(|t| t.to_string()).collect();
        let comparison = compare_all(&index, &order, &reference, &candidate, &Tolerance::FP16.into());
        let dq = index.node("dq").unwrap();
        let view = InputView::of(&index, &comparison, dq);
        let a = comparison.get("a").unwrap().error_level();
        assert!(a > 0.1, "{a}");
        assert_eq!(view.error(), Some(a), "the input error is the quantized value's, not the codes'");
        assert_eq!(view.worst().map(|r| r.name.as_str()), Some("a"));
    }

    /// Found by the third independent tester (a T5 decoder quantized dynamically, under FP16): a
    /// NaN activation's codes are finite garbage, and the Casts of the integer sums computed from
    /// them were called places where inf/NaN are born ("89 independent places", 70 of them fed by
    /// that NaN). Codes and sums carry the inf/NaN of the float their quantizer read.
    #[test]
    fn integer_sums_computed_from_a_nan_activation_carry_its_nan() {
        let mut b = ModelBuilder::new("dynamic", 17);
        b.input("x", DataType::Float, &[Dim::from(1), Dim::from(2)]);
        b.node("DynamicQuantizeLinear", "dql", &["x"], &["xq", "xs", "xz"], vec![]);
        b.node("MatMulInteger", "mmi", &["xq", "xq"], &["sums"], vec![]);
        b.node("Cast", "cast", &["sums"], &["y"], vec![layerwise_model::builder::attr::int("to", 1)]);
        b.node("Relu", "plain", &["x"], &["r"], vec![]);
        b.output("y", DataType::Float);
        let model = b.build();
        let index = GraphIndex::build(model.graph.as_ref().unwrap()).unwrap();
        let t = |data: TensorData| Tensor::new(vec![1, 2], data);
        let reference: HashMap<String, Tensor> = [
            ("x", t(TensorData::F32(vec![1.0, 2.0]))),
            ("xq", t(TensorData::U8(vec![127, 255]))),
            ("sums", t(TensorData::I32(vec![5, 7]))),
            ("y", t(TensorData::F32(vec![5.0, 7.0]))),
            ("r", t(TensorData::F32(vec![1.0, 2.0]))),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .collect();
        let mut candidate = reference.clone();
        candidate.insert("x".into(), t(TensorData::F32(vec![f32::NAN, 2.0])));
        candidate.insert("y".into(), t(TensorData::F32(vec![f32::INFINITY, 7.0])));
        let order: Vec<String> = ["x", "xq", "sums", "y", "r"].iter().map(|s| s.to_string()).collect();
        let comparison = compare_all(&index, &order, &reference, &candidate, &Tolerance::FP16.into());
        assert!(super::carries_nonfinite(&index, &comparison, "sums"));
        assert!(super::carries_nonfinite(&index, &comparison, "xq"));
        assert!(!super::carries_nonfinite(&index, &comparison, "r"));
        let cast = index.node("cast").unwrap();
        assert!(InputView::of(&index, &comparison, cast).nonfinite(&index, &comparison));
    }
}
