//! Causes from synthetic comparisons (no ONNX Runtime): the values both sides hold are written
//! out, and the walk must name the node and the cause of its mechanism. These four causes were
//! named by no test before; the others are named here (walk.rs) or by whole runs (tests/).

use std::collections::HashMap;

use layerwise_analysis::{compare_all, walk_back, Candidate, CauseKind, Tolerance, Verdict, WalkRule};
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::Arithmetic;
use layerwise_model::{scan_fp16_weight_range, DataType, GraphIndex, Model, Tensor};

const FP16: Candidate = Candidate { arithmetic: Arithmetic::FP16, atol: 1e-3 };
const FP32: Candidate = Candidate { arithmetic: Arithmetic::FLOAT32, atol: 1e-5 };

/// The walk over `proto` with each named tensor's values on both sides (every tensor listed is
/// compared, in the order given).
fn walk(
    proto: ModelProto,
    tensors: &[(&str, Vec<f32>, Vec<f32>)],
    candidate: Candidate,
    rule: WalkRule,
    tolerance: Tolerance,
) -> Verdict {
    let model = Model::from_proto(proto, "synthetic").unwrap();
    let weights = scan_fp16_weight_range(&model).unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let side = |cand: bool| -> HashMap<String, Tensor> {
        tensors
            .iter()
            .map(|(name, r, c)| {
                let values = if cand { c } else { r };
                (name.to_string(), Tensor::f32(vec![values.len()], values.clone()))
            })
            .collect()
    };
    let (reference, cand) = (side(false), side(true));
    let order: Vec<String> = tensors.iter().map(|t| t.0.to_string()).collect();
    let comparison = compare_all(&index, &order, &reference, &cand, &tolerance.into());
    walk_back(&index, &comparison, &weights, rule, candidate)
}

fn first(v: &Verdict) -> (&str, CauseKind, &str) {
    let fd = v.first_divergent.as_ref().expect("a first divergent layer");
    (fd.node.as_str(), fd.cause.best.kind, fd.cause.best.detail.as_str())
}

fn chain(ops: &[(&str, &str, &[&str], &str)], initializers: &[(&str, f32)]) -> ModelProto {
    let mut b = ModelBuilder::new("synthetic", 17);
    b.input("x", DataType::Float, &[Dim::from(4)]);
    for (name, value) in initializers {
        b.initializer(f32_tensor(name, &[1], &[*value]));
    }
    for (op, node, inputs, output) in ops {
        b.node(op, node, inputs, &[output], vec![]);
    }
    b.output(ops.last().unwrap().3, DataType::Float);
    b.build()
}

/// log(x + eps) with eps = 1e-9: FP16 stores eps as 0, so log(0) = -inf where x is 0.
#[test]
fn an_epsilon_flushed_to_zero_before_a_log_is_underflow() {
    let proto = chain(&[("Add", "add_eps", &["x", "eps"], "h"), ("Log", "log", &["h"], "y")], &[("eps", 1e-9)]);
    let x = vec![0.0, 0.0, 1.0, 2.0];
    let h_ref: Vec<f32> = x.iter().map(|v| v + 1e-9).collect();
    let y_ref: Vec<f32> = h_ref.iter().map(|v| v.ln()).collect();
    let y_cand: Vec<f32> = x.iter().map(|v: &f32| v.ln()).collect();
    let v = walk(proto, &[("h", h_ref, x.clone()), ("y", y_ref, y_cand)], FP16, WalkRule::FP16, Tolerance::FP16);
    let (node, kind, detail) = first(&v);
    assert_eq!((node, kind), ("log", CauseKind::Underflow), "{detail}");
    assert!(detail.contains("'eps'") && detail.contains("becomes exactly 0 in FP16"), "{detail}");
}

/// log(relu(x)) where the candidate's relu output is 0 and the reference's a tiny positive
/// number: finite inputs on both sides, inf in the candidate's output, and no stored value and
/// no range to blame.
#[test]
fn inf_from_finite_inputs_with_no_range_or_constant_to_blame_is_non_finite_produced() {
    let proto = chain(&[("Relu", "relu", &["x"], "h"), ("Log", "log", &["h"], "y")], &[]);
    let h_ref = vec![1e-9, 1.0, 2.0, 3.0];
    let h_cand = vec![0.0, 1.0, 2.0, 3.0];
    let y = |h: &[f32]| h.iter().map(|v| v.ln()).collect::<Vec<f32>>();
    let v = walk(
        proto,
        &[("h", h_ref.clone(), h_cand.clone()), ("y", y(&h_ref), y(&h_cand))],
        FP16,
        WalkRule::FP16,
        Tolerance::FP16,
    );
    let (node, kind, detail) = first(&v);
    assert_eq!((node, kind), ("log", CauseKind::NonFiniteProduced), "{detail}");
    assert!(detail.contains("turns finite inputs into 1 inf/NaN values"), "{detail}");
}

/// h - 1 where h is 1 + 1e-6 k: a relative input error of 1e-6 becomes one of order 1 in float32,
/// and no mechanism of the catalogue explains why.
#[test]
fn an_unexplained_jump_in_float32_is_amplification_with_its_factor() {
    let proto = chain(&[("Relu", "relu", &["x"], "h"), ("Sub", "sub", &["h", "one"], "y")], &[("one", 1.0)]);
    let h_ref: Vec<f32> = (1..=4).map(|k| 1.0 + 1e-4 * k as f32).collect();
    let h_cand: Vec<f32> = h_ref.iter().map(|v| v * (1.0 + 2e-5)).collect();
    let y = |h: &[f32]| h.iter().map(|v| v - 1.0).collect::<Vec<f32>>();
    let v = walk(
        proto,
        &[("h", h_ref.clone(), h_cand.clone()), ("y", y(&h_ref), y(&h_cand))],
        FP32,
        WalkRule::FP32,
        Tolerance::FP32,
    );
    let (node, kind, detail) = first(&v);
    assert_eq!((node, kind), ("sub", CauseKind::Amplification), "{detail}");
    assert!(detail.starts_with("Sub amplifies its input error"), "{detail}");
}

/// Softplus of x near -10 in FP16: ONNX Runtime's kernel computes ln(1 + e^x) with 1 + e^x
/// rounded near 1, an absolute error up to 2.4e-4 on outputs of 4.5e-5.
#[test]
fn an_fp16_softplus_of_small_outputs_is_the_kernels_rounding() {
    let proto = chain(&[("Softplus", "softplus", &["x"], "y")], &[]);
    let x = [-10.0f32, -10.5, -11.0, -9.5];
    let y_ref: Vec<f32> = x.iter().map(|v| v.exp().ln_1p()).collect();
    // What the kernel gives: 1 + e^x rounded to FP16 (spacing 2^-10 above 1), then its log.
    let y_cand: Vec<f32> = x
        .iter()
        .map(|v| half::f16::from_f32(1.0 + v.exp()).to_f32().ln())
        .map(|y| half::f16::from_f32(y).to_f32())
        .collect();
    // Outputs of about 4.5e-5 sit below FP16's default atol: judged relative to their own size.
    let tolerance = Tolerance { atol: 1e-7, ..Tolerance::FP16 };
    let v = walk(proto, &[("y", y_ref, y_cand)], FP16, WalkRule::FP16, tolerance);
    let (node, kind, detail) = first(&v);
    assert_eq!((node, kind), ("softplus", CauseKind::KernelRounding), "{detail}");
    assert!(detail.contains("ln(1 + exp(x))"), "{detail}");
}

/// An additive mask filled with float32's lowest value (finfo.min, as T5's decoder makes it):
/// BF16 has float32's exponents but rounds -3.4028e38 to -inf, beyond its largest finite
/// -3.3895e38. The ConstantOfShape is a value overflow of BF16's range, not a node that "turns
/// finite inputs into inf/NaN" (its input is a shape).
#[test]
fn finfo_min_stored_in_bf16_is_a_value_overflow() {
    let mut b = ModelBuilder::new("synthetic", 17);
    b.input("shape", DataType::Int64, &[Dim::from(1)]);
    b.node("ConstantOfShape", "mask_fill", &["shape"], &["mask"], vec![]);
    b.output("mask", DataType::Float);
    let lowest = f32::MIN;
    let v = walk(
        b.build(),
        &[("mask", vec![lowest; 4], vec![f32::NEG_INFINITY; 4])],
        Candidate { arithmetic: Arithmetic::BF16, atol: 8e-4 },
        WalkRule::BF16,
        Tolerance::BF16,
    );
    let (node, kind, detail) = first(&v);
    assert_eq!((node, kind), ("mask_fill", CauseKind::ValueOverflow), "{detail}");
    assert!(detail.contains("beyond the BF16 maximum 3.3895e38"), "{detail}");
}
