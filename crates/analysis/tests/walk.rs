use std::collections::HashMap;

use layerwise_analysis::{compare_all, walk_back, Candidate, CauseKind, Status, Tolerance, WalkRule};
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::Arithmetic;
use layerwise_model::Tensor;
use layerwise_model::{DataType, GraphIndex};

/// x -> MatMul(w) -> h -> Relu -> y, with the candidate's h off by ~1e-3 relative (TF32-like).
fn run(candidate: Candidate) -> layerwise_analysis::Verdict {
    let mut b = ModelBuilder::new("mm", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(f32_tensor("w", &[4, 4], &[1.0; 16]));
    b.node("MatMul", "mm", &["x", "w"], &["h"], vec![]);
    b.node("Relu", "relu", &["h"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let index = GraphIndex::build(b.build().graph.as_ref().unwrap()).unwrap();
    let r = Tensor::f32(vec![1, 4], vec![1.0, 2.0, 3.0, 4.0]);
    let c = Tensor::f32(vec![1, 4], vec![1.003, 2.0, 3.0, 4.004]);
    let reference: HashMap<String, Tensor> = [("h".to_string(), r.clone()), ("y".to_string(), r)].into();
    let cand: HashMap<String, Tensor> = [("h".to_string(), c.clone()), ("y".to_string(), c)].into();
    let order = vec!["h".to_string(), "y".to_string()];
    let comparison = compare_all(&index, &order, &reference, &cand, &Tolerance::FP32.into());
    walk_back(&index, &comparison, &[], WalkRule::FP32, candidate)
}

#[test]
fn a_tf32_candidate_names_tf32_as_the_cause() {
    let v = run(Candidate { arithmetic: Arithmetic::TF32, ..Default::default() });
    assert_eq!(v.status, Status::Diverged);
    let fd = v.first_divergent.unwrap();
    assert_eq!(fd.node, "mm");
    assert_eq!(fd.cause.best.kind, CauseKind::Tf32);
    assert!(fd.cause.best.detail.contains("tf32=off"));
    // Without the TF32 hint the same numbers are an unexplained loss of precision.
    let plain = run(Candidate::default()).first_divergent.unwrap();
    assert_eq!((plain.node.as_str(), plain.cause.best.kind), ("mm", CauseKind::PrecisionLoss));
}

/// x -> Sigmoid -> y, the reference's x deep in Sigmoid's flat region (about -20), the candidate's
/// x off by ~1e-3 absolute (relative 5e-5), as TF32 upstream leaves it: a float32 candidate.
fn saturated_sigmoid(candidate: Candidate) -> layerwise_analysis::Verdict {
    let mut b = ModelBuilder::new("sig", 17);
    b.input("a", DataType::Float, &[Dim::from(64)]);
    b.node("Relu", "pre", &["a"], &["x"], vec![]);
    b.node("Sigmoid", "sig", &["x"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let index = GraphIndex::build(b.build().graph.as_ref().unwrap()).unwrap();
    let xr: Vec<f32> = (0..64).map(|i| -18.0 - 0.05 * i as f32).collect();
    let xc: Vec<f32> = xr.iter().enumerate().map(|(i, v)| v + if i % 2 == 0 { 1e-3 } else { -1e-3 }).collect();
    let sig = |v: &[f32]| v.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect::<Vec<f32>>();
    let reference: HashMap<String, Tensor> =
        [("x".to_string(), Tensor::f32(vec![64], xr.clone())), ("y".to_string(), Tensor::f32(vec![64], sig(&xr)))]
            .into();
    let cand: HashMap<String, Tensor> =
        [("x".to_string(), Tensor::f32(vec![64], xc.clone())), ("y".to_string(), Tensor::f32(vec![64], sig(&xc)))]
            .into();
    let order = vec!["x".to_string(), "y".to_string()];
    let tol = Tolerance { atol: 1e-12, rtol: 1e-4, range_tol: 0.0 };
    let comparison = compare_all(&index, &order, &reference, &cand, &tol.into());
    walk_back(&index, &comparison, &[], WalkRule::FP32, candidate)
}

#[test]
fn a_float32_candidate_gets_no_fp16_cause_and_a_saturating_sigmoid_is_named_as_such() {
    let candidate = Candidate { arithmetic: Arithmetic::TF32, atol: 1e-5 };
    let v = saturated_sigmoid(candidate);
    let fd = v.first_divergent.expect("the Sigmoid breaks: its relative error jumps");
    assert_eq!(fd.node, "sig");
    assert_eq!(fd.cause.best.kind, CauseKind::Saturation, "{}", fd.cause.best.detail);
    for m in std::iter::once(fd.cause.best.kind).chain(fd.cause.alternatives.iter().map(|a| a.kind)) {
        assert!(
            !matches!(m, CauseKind::PrecisionLoss | CauseKind::ValueOverflow | CauseKind::WeightOverflow),
            "no FP16 cause for a float32 run: {m:?}"
        );
    }
    assert!(!fd.cause.best.detail.contains("FP16"), "{}", fd.cause.best.detail);
    assert!(
        fd.cause.best.detail.contains("flat region") && fd.cause.best.detail.contains("not material"),
        "{}",
        fd.cause.best.detail
    );
    assert!(
        fd.cause.best.explains.unwrap() > 0.9,
        "the input's absolute error accounts for the output's relative error"
    );
    let e = fd.evidence;
    assert!(e.input_max_abs.unwrap() > 18.0 && (e.input_max_abs_err.unwrap() - 1e-3).abs() < 1e-4);
    // An atol below the absolute error makes it material.
    let fd = saturated_sigmoid(Candidate { atol: 1e-12, ..candidate }).first_divergent.unwrap();
    assert!(fd.cause.best.detail.contains("is material"), "{}", fd.cause.best.detail);
}

/// A recognizer's head: logits up to 1.6e4 with a relative error of ~4e-3 (absolute up to ~60),
/// Softmax over them; a quarter of the probabilities are tiny (FP16 subnormal).
#[test]
fn softmax_on_large_logits_is_blamed_on_absolute_input_error_not_on_subnormals() {
    let mut b = ModelBuilder::new("head", 17);
    b.input("a", DataType::Float, &[Dim::from(1), Dim::from(16)]);
    b.node("Relu", "pre", &["a"], &["logits"], vec![]);
    b.node("Softmax", "softmax", &["logits"], &["probs"], vec![]);
    b.output("probs", DataType::Float);
    let index = GraphIndex::build(b.build().graph.as_ref().unwrap()).unwrap();
    let lr: Vec<f32> = (0..16).map(|i| if i < 4 { 16000.0 - 2.0 * i as f32 } else { 15980.0 - i as f32 }).collect();
    let lc: Vec<f32> = lr.iter().enumerate().map(|(i, v)| v * (1.0 + if i % 2 == 0 { 3e-3 } else { -3e-3 })).collect();
    let softmax = |v: &[f32]| {
        let m = v.iter().cloned().fold(f32::MIN, f32::max);
        let e: Vec<f32> = v.iter().map(|x| (x - m).exp()).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|x| x / s).collect::<Vec<f32>>()
    };
    let reference: HashMap<String, Tensor> = [
        ("logits".into(), Tensor::f32(vec![1, 16], lr.clone())),
        ("probs".into(), Tensor::f32(vec![1, 16], softmax(&lr))),
    ]
    .into();
    let cand: HashMap<String, Tensor> = [
        ("logits".into(), Tensor::f32(vec![1, 16], lc.clone())),
        ("probs".into(), Tensor::f32(vec![1, 16], softmax(&lc))),
    ]
    .into();
    let order = vec!["logits".to_string(), "probs".to_string()];
    let comparison = compare_all(&index, &order, &reference, &cand, &Tolerance::FP16.into());
    assert!(
        comparison.get("probs").unwrap().metrics.ref_fp16_subnormal_share > 0.1,
        "the probabilities hold FP16 subnormals"
    );
    let v = walk_back(&index, &comparison, &[], WalkRule::FP16, Candidate { arithmetic: Arithmetic::FP16, atol: 1e-4 });
    let fd = v.first_divergent.expect("the Softmax breaks");
    assert_eq!(fd.node, "softmax");
    assert_eq!(fd.cause.best.kind, CauseKind::LargeLogits, "{}", fd.cause.best.detail);
    assert!(
        fd.cause.best.detail.contains("1.600e4") && fd.cause.best.detail.contains("spacing there is 8"),
        "{}",
        fd.cause.best.detail
    );
    // The subnormal fact is listed, with the small share of the error it can explain.
    let sub = fd.cause.alternatives.iter().find(|a| a.kind == CauseKind::PrecisionLoss).expect("subnormals considered");
    assert!(sub.explains.unwrap() < 1e-3, "{sub:?}");
}

/// An input that was not compared is unknown, never exact: the node reading it is not the origin.
#[test]
fn an_input_that_was_not_compared_is_unknown_and_ends_the_walk() {
    let mut b = ModelBuilder::new("unseen", 17);
    b.input("x", DataType::Float, &[Dim::from(4)]);
    b.node("Relu", "hidden", &["x"], &["h"], vec![]);
    b.node("Exp", "exp", &["h"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let index = GraphIndex::build(b.build().graph.as_ref().unwrap()).unwrap();
    let reference: HashMap<String, Tensor> = [("y".into(), Tensor::f32(vec![4], vec![1.0, 2.0, 3.0, 4.0]))].into();
    let cand: HashMap<String, Tensor> = [("y".into(), Tensor::f32(vec![4], vec![1.5, 2.0, 3.0, 4.0]))].into();
    // 'h' is asked for but only the reference has it (another model's names on the candidate side).
    let mut reference_h = reference.clone();
    reference_h.insert("h".into(), Tensor::f32(vec![4], vec![0.0, 0.7, 1.1, 1.4]));
    let comparison =
        compare_all(&index, &["h".to_string(), "y".to_string()], &reference_h, &cand, &Tolerance::FP16.into());
    let v = walk_back(
        &index,
        &comparison,
        &[],
        WalkRule::FP16,
        Candidate { arithmetic: Arithmetic::FP16, ..Default::default() },
    );
    assert!(v.first_divergent.is_none(), "no origin can be named: {:?}", v.first_divergent);
    let end = v.sight_ends.expect("the walk says where it cannot see further");
    assert_eq!(end.node, "exp");
    assert_eq!(end.unseen_inputs[0].0, "h");
    assert!(end.unseen_inputs[0].1.contains("missing from the candidate"), "{:?}", end.unseen_inputs);
    assert!(v.summary.contains("not compared") && !v.summary.contains("exact"), "{}", v.summary);
}
