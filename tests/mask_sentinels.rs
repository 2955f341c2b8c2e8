//! Attention masks: a score tensor masked with `finfo(float32).min` holds -3.4e38 on
//! both sides, which no norm of its real values can be told from. Quantized by MinMax, the
//! scores' quantizer spans the mask (scale 1.33e36): every real score rounds to one value and
//! attention becomes uniform. The walk must see that the scores of the next layer are already off,
//! and no cause may take the mask for a logit.

use crate::common::{json, layerwise, save, text};
use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::{ModelProto, TensorProto};
use layerwise_model::DataType;

const TOKENS: i64 = 4;
const WIDTH: i64 = 8;

/// Seeded weights in [-2, 2): peaked attention.
fn weights(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * 2.0
        })
        .collect()
}

/// x[1,4,8] through two self-attention layers (h + Softmax(q k^T + mask) h), the last token
/// masked with -3.4e38 as Hugging Face models mask it. With `quantize_scores`, each layer's masked
/// scores pass a QuantizeLinear/DequantizeLinear pair calibrated by MinMax, as quantize_static
/// writes it: the range [-3.4e38, max score] over 255 steps, zero point 127 (int8).
fn attention_model(quantize_scores: bool) -> ModelProto {
    let mut b = ModelBuilder::new("masked_attention", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(TOKENS), Dim::from(WIDTH)]);
    b.initializer(f32_tensor("mask", &[1, 1, TOKENS], &[0.0, 0.0, 0.0, f32::MIN]));
    if quantize_scores {
        b.initializer(f32_tensor("score_scale", &[], &[(f32::MAX as f64 / 255.0) as f32]));
        b.initializer(TensorProto {
            name: Some("score_zero".into()),
            dims: vec![],
            data_type: Some(DataType::Int8 as i32),
            int32_data: vec![127],
            ..Default::default()
        });
    }
    let mut h = "x".to_string();
    for l in 0..2u32 {
        let n = |what: &str| format!("{what}{l}");
        b.initializer(f32_tensor(&n("wq"), &[WIDTH, WIDTH], &weights(64, 2 * l + 1)));
        b.initializer(f32_tensor(&n("wk"), &[WIDTH, WIDTH], &weights(64, 2 * l + 2)));
        b.node("MatMul", &n("query"), &[&h, &n("wq")], &[&n("q")], vec![]);
        b.node("MatMul", &n("key"), &[&h, &n("wk")], &[&n("k")], vec![]);
        b.node("Transpose", &n("key_t"), &[&n("k")], &[&n("kt")], vec![attr::ints("perm", &[0, 2, 1])]);
        b.node("MatMul", &n("scores"), &[&n("q"), &n("kt")], &[&n("s")], vec![]);
        b.node("Add", &n("masked"), &[&n("s"), "mask"], &[&n("a")], vec![]);
        let softmax_in = if quantize_scores {
            b.node("QuantizeLinear", &n("a_q"), &[&n("a"), "score_scale", "score_zero"], &[&n("a_q8")], vec![]);
            b.node("DequantizeLinear", &n("a_dq"), &[&n("a_q8"), "score_scale", "score_zero"], &[&n("a_f")], vec![]);
            n("a_f")
        } else {
            n("a")
        };
        b.node("Softmax", &n("softmax"), &[&softmax_in], &[&n("p")], vec![attr::int("axis", -1)]);
        b.node("MatMul", &n("context"), &[&n("p"), &h], &[&n("c")], vec![]);
        b.node("Add", &n("residual"), &[&h, &n("c")], &[&n("h")], vec![]);
        h = n("h");
    }
    b.output(&h, DataType::Float);
    b.build()
}

#[test]
fn a_score_quantizer_spanning_the_mask_is_found_in_the_first_layer_not_blamed_on_large_logits() {
    let dir = tempfile::tempdir().unwrap();
    save(&attention_model(false), &dir.path().join("m.onnx"));
    save(&attention_model(true), &dir.path().join("q.onnx"));
    // The floor (one step of each quantizer) would take the scores' step of 1.33e36 too: not measured here.
    let args = [
        "bisect",
        "m.onnx",
        "--cand",
        "ort:cpu",
        "--cand-model",
        "q.onnx",
        "--val-range",
        "x:-1,1",
        "--no-noise-floor",
        "--json",
        "r.json",
    ];
    let out = layerwise(&args, dir.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "the uniform attention fails the output: {t}");
    let report = json(&dir.path().join("r.json"));
    let record = |name: &str| {
        report["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("'{name}' not compared: {t}"))
    };
    let first = &report["verdict"]["first_divergent"];
    assert_eq!(first["node"], "softmax0", "the first layer's attention is where the quantized scores break it: {t}");
    assert_ne!(first["cause"]["best"]["kind"], "large_logits", "{t}");
    assert!(!t.contains("e38"), "no statement reads the mask as a value: {t}");
    // Layer 1's scores: the mask is the same on both sides and left out; the real scores carry
    // layer 0's error (read as ~1e-38 while the mask dominated the norm).
    let scores = record("a1");
    assert_eq!(scores["metrics"]["mask_sentinels"]["count"], TOKENS, "{scores}");
    let error = scores["metrics"]["rel_l2_err"].as_f64().unwrap();
    assert!(error > 1e-2, "layer 1's scores carry layer 0's error: rel L2 {error}: {t}");
}
