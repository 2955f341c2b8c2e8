use std::collections::HashMap;

use layerwise_analysis::{compare_all, walk_back, Candidate, CauseKind, Status, Tolerance, WalkRule};
use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::{DataType, GraphIndex};
use layerwise_runtime::Tensor;

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
    let comparison = compare_all(&index, &order, &reference, &cand, Tolerance::FP32);
    walk_back(&index, &comparison, &[], WalkRule::FP32, candidate)
}

#[test]
fn a_tf32_candidate_names_tf32_as_the_cause() {
    let v = run(Candidate { tf32: true });
    assert_eq!(v.status, Status::Diverged);
    let fd = v.first_divergent.unwrap();
    assert_eq!(fd.node, "mm");
    assert_eq!(fd.cause.kind, CauseKind::Tf32);
    assert!(fd.cause.detail.contains("tf32=off"));
    // Without the TF32 hint the same numbers are an unexplained loss of precision.
    let plain = run(Candidate::default()).first_divergent.unwrap();
    assert_eq!((plain.node.as_str(), plain.cause.kind), ("mm", CauseKind::PrecisionLoss));
}
