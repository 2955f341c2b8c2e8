//! The typed evaluation shares one ONNX Runtime session among nodes alike (`fix` in at
//! most 10x one plain run): each node still computes from its own inputs and weights. Nodes that
//! differ only in their large weights (fed to the shared session) or only in small constants
//! (which stay in the model, so their sessions differ) each give their own values.

use layerwise_model::builder::{Dim, ModelBuilder};
use layerwise_model::onnx::TensorProto;
use layerwise_model::{DataType, GraphIndex, Model, Selection};
use layerwise_runtime::typed::TypedBackend;
use layerwise_runtime::{Backend, BackendSpec, RunRequest, Tensor, TensorData};

fn f16_tensor(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    let raw: Vec<u8> = values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Float16 as i32),
        raw_data: Some(raw.into()),
        ..Default::default()
    }
}

/// Small integers: every product and sum below is exact in FP16 and float32.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + seed * 3) % 5) as f32 - 2.0).collect()
}

fn matmul(x: &[f32], w: &[f32], n: usize) -> Vec<f32> {
    (0..n).map(|j| (0..n).map(|k| x[k] * w[k * n + j]).sum()).collect()
}

#[test]
fn nodes_alike_in_a_shared_session_each_compute_from_their_own_weights_and_constants() {
    const N: usize = 16;
    let (w1, w2, k1, k2) = (values(N * N, 1), values(N * N, 2), values(N, 3), values(N, 4));
    let mut b = ModelBuilder::new("alike", 17);
    b.input("x", DataType::Float16, &[Dim::from(1), Dim::from(N as i64)]);
    // Two MatMuls alike but for their weights (256 elements each: fed to the shared session).
    b.initializer(f16_tensor("w1", &[N as i64, N as i64], &w1));
    b.initializer(f16_tensor("w2", &[N as i64, N as i64], &w2));
    // Two Adds alike but for their constants (16 elements each: they stay in the model).
    b.initializer(f16_tensor("k1", &[N as i64], &k1));
    b.initializer(f16_tensor("k2", &[N as i64], &k2));
    b.node("MatMul", "first", &["x", "w1"], &["a"], vec![]);
    b.node("MatMul", "second", &["a", "w2"], &["b"], vec![]);
    b.node("Add", "plus_k1", &["b", "k1"], &["c1"], vec![]);
    b.node("Add", "plus_k2", &["b", "k2"], &["c2"], vec![]);
    b.output("c1", DataType::Float16);
    b.output("c2", DataType::Float16);
    let model = Model::from_proto(b.build(), "alike").unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let x = values(N, 0);
    let feeds = vec![(
        "x".to_string(),
        Tensor::new(vec![1, N], TensorData::F16(x.iter().map(|&v| half::f16::from_f32(v)).collect())),
    )];
    let mut typed = TypedBackend::new(&BackendSpec::ort_cpu(), None);
    let got = |name: &str, out: &layerwise_runtime::RunOutput| out.tensors[name].to_f32().into_owned();
    let a = matmul(&x, &w1, N);
    let b = matmul(&a, &w2, N);
    let c1: Vec<f32> = b.iter().zip(&k1).map(|(b, k)| b + k).collect();
    let c2: Vec<f32> = b.iter().zip(&k2).map(|(b, k)| b + k).collect();
    assert_ne!(matmul(&a, &w1, N), b, "the two weights give different values");
    assert_ne!(c1, c2, "the two constants give different values");
    // Twice on one backend: the second run reuses the first run's sessions.
    for run in 0..2 {
        let out = typed
            .run(&RunRequest { model: &model, index: &index, inputs: &feeds, selection: &Selection::All })
            .unwrap();
        assert_eq!(got("a", &out), a, "run {run}: the first MatMul");
        assert_eq!(got("b", &out), b, "run {run}: the second MatMul, from its own weight");
        assert_eq!(got("c1", &out), c1, "run {run}: the first Add");
        assert_eq!(got("c2", &out), c2, "run {run}: the second Add, from its own constant");
    }
}
