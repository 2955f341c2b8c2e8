//! The built-in demo model: a decomposed LayerNorm whose x² overflows in FP16, and a healthy branch.
//!
//! ```text
//! x[1,8,64] -> MatMul(W1)+b1 -> h  (|h - mean| reaches ~500, so (h - mean)² > 65504)
//!   h -> ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(gamma) -> Add(beta)
//!     -> MatMul(W2)+b2 -> logits            (breaks in FP16 at Pow)
//! x -> MatMul(W3) -> Tanh -> features        (healthy)
//! ```

use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::DataType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The node the demo's FP16 break must be found at.
pub const PLANTED_NODE: &str = "encoder/ln/Pow";

fn uniform(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale).collect()
}

pub fn demo_model() -> ModelProto {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (d, hidden, classes, feat) = (64, 64, 16, 32);
    let mut b = ModelBuilder::new("layerwise-demo", 13);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8), Dim::from(d as i64)]);
    b.initializer(f32_tensor("W1", &[d as i64, hidden as i64], &uniform(&mut rng, d * hidden, 60.0)));
    b.initializer(f32_tensor("b1", &[hidden as i64], &uniform(&mut rng, hidden, 1.0)));
    b.initializer(f32_tensor("two", &[], &[2.0]));
    b.initializer(f32_tensor("eps", &[], &[1e-5]));
    b.initializer(f32_tensor("gamma", &[hidden as i64], &vec![1.0; hidden]));
    b.initializer(f32_tensor("beta", &[hidden as i64], &uniform(&mut rng, hidden, 0.1)));
    b.initializer(f32_tensor("W2", &[hidden as i64, classes as i64], &uniform(&mut rng, hidden * classes, 0.3)));
    b.initializer(f32_tensor("b2", &[classes as i64], &uniform(&mut rng, classes, 0.1)));
    b.initializer(f32_tensor("W3", &[d as i64, feat as i64], &uniform(&mut rng, d * feat, 0.2)));

    b.node("MatMul", "encoder/proj/MatMul", &["x", "W1"], &["proj"], vec![]);
    b.node("Add", "encoder/proj/Add", &["proj", "b1"], &["h"], vec![]);
    b.node(
        "ReduceMean",
        "encoder/ln/ReduceMean",
        &["h"],
        &["ln_mean"],
        vec![attr::ints("axes", &[-1]), attr::int("keepdims", 1)],
    );
    b.node("Sub", "encoder/ln/Sub", &["h", "ln_mean"], &["ln_centered"], vec![]);
    b.node("Pow", PLANTED_NODE, &["ln_centered", "two"], &["ln_squared"], vec![]);
    b.node(
        "ReduceMean",
        "encoder/ln/ReduceMean_1",
        &["ln_squared"],
        &["ln_var"],
        vec![attr::ints("axes", &[-1]), attr::int("keepdims", 1)],
    );
    b.node("Add", "encoder/ln/Add", &["ln_var", "eps"], &["ln_var_eps"], vec![]);
    b.node("Sqrt", "encoder/ln/Sqrt", &["ln_var_eps"], &["ln_std"], vec![]);
    b.node("Div", "encoder/ln/Div", &["ln_centered", "ln_std"], &["ln_norm"], vec![]);
    b.node("Mul", "encoder/ln/Mul", &["ln_norm", "gamma"], &["ln_scaled"], vec![]);
    b.node("Add", "encoder/ln/Add_1", &["ln_scaled", "beta"], &["ln_out"], vec![]);
    b.node("MatMul", "head/MatMul", &["ln_out", "W2"], &["head_mm"], vec![]);
    b.node("Add", "head/Add", &["head_mm", "b2"], &["logits"], vec![]);
    // The healthy branch; its Tanh is left unnamed on purpose (reported as `Tanh#14`).
    b.node("MatMul", "features/MatMul", &["x", "W3"], &["feat_mm"], vec![]);
    b.node("Tanh", "", &["feat_mm"], &["features"], vec![]);
    b.output("logits", DataType::Float);
    b.output("features", DataType::Float);
    b.build()
}
