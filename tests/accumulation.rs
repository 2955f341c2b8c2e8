//! Emulation that accumulates as the GPU does (issue: accumulation measured per op on the H100):
//! the emulations reproduce what ONNX Runtime's CUDA kernels were measured to do, checked against
//! values recorded on the H100 (tests/data/h100_*.npz, from scripts/gpu/probes2.py).

use crate::common::{json, layerwise, save, saved_tensor, text};
use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::DataType;
use layerwise_runtime::npy::{read_npz, write_npy_file};
use layerwise_runtime::{Tensor, TensorData};

fn reduce_mean(n: usize) -> ModelProto {
    let mut b = ModelBuilder::new("reduce-mean", 17);
    b.input("x", DataType::Float, &[Dim::from(4), Dim::from(n as i64)]);
    b.node("ReduceMean", "mean", &["x"], &["y"], vec![attr::ints("axes", &[1]), attr::int("keepdims", 1)]);
    b.output("y", DataType::Float);
    b.build()
}

fn f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

#[test]
fn fp16_reduce_mean_is_the_h100s_bit_for_bit_on_recorded_inputs() {
    let data =
        read_npz(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/h100_reduce_mean_fp16.npz")))
            .unwrap();
    let get = |name: &str| {
        data.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} in the recorded data")).1.clone()
    };
    let mut differs_from_per_op_rounding = 0;
    for n in [1000usize, 3000] {
        let dir = tempfile::tempdir().unwrap();
        save(&reduce_mean(n), &dir.path().join("m.onnx"));
        let x = get(&format!("x_{n}"));
        write_npy_file(&dir.path().join("x.npy"), &x).unwrap();
        let out = layerwise(
            &["bisect", "m.onnx", "--input", "x=x.npy", "--cand", "sim:fp16", "--save-tensors", "saved"],
            dir.path(),
        );
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
        let emulated = saved_tensor(&dir.path().join("saved/cand"), "y").to_f32().into_owned();
        let h100 = get(&format!("h100_fp16_{n}")).to_f32().into_owned();
        assert_eq!(
            emulated.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            h100.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "n = {n}: emulated {emulated:?}, H100 {h100:?}"
        );
        // The typed evaluation of the converted file computes the kernel's value too.
        let c = layerwise(&["convert", "m.onnx", "--to", "fp16", "-o", "m16.onnx"], dir.path());
        assert_eq!(c.status.code(), Some(0), "{}", text(&c));
        let out = layerwise(
            &[
                "bisect",
                "m.onnx",
                "--input",
                "x=x.npy",
                "--cand",
                "ort:cpu",
                "--cand-model",
                "m16.onnx",
                "--save-tensors",
                "typed",
            ],
            dir.path(),
        );
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
        let typed = saved_tensor(&dir.path().join("typed/cand"), "y").to_f32().into_owned();
        assert_eq!(
            typed.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            h100.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "n = {n}: typed {typed:?}, H100 {h100:?}"
        );
        // What rounding only the mean (the previous emulation) gives, row by row.
        let xs = x.to_f32();
        for (row, want) in h100.iter().enumerate() {
            let sum: f64 = xs[row * n..(row + 1) * n].iter().map(|&v| f16(v) as f64).sum();
            if f16((sum / n as f64) as f32) != *want {
                differs_from_per_op_rounding += 1;
            }
        }
    }
    assert!(differs_from_per_op_rounding > 0, "the recorded values tell the sum's FP16 rounding from the mean's");
}

#[test]
fn a_reduce_mean_whose_sum_leaves_fp16s_range_is_never_a_silent_pass() {
    // 4096 values of about 30: the mean (30) is in range, the sum (1.2e5) is not. The H100's FP16
    // ReduceMean returns inf here (docs/emulation.md, per-op table).
    let dir = tempfile::tempdir().unwrap();
    let n = 4096;
    let mut b = ModelBuilder::new("mean-of-30", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(n as i64)]);
    b.initializer(f32_tensor("half", &[], &[0.5]));
    b.node("ReduceMean", "pool", &["x"], &["m"], vec![attr::ints("axes", &[1]), attr::int("keepdims", 1)]);
    b.node("Mul", "scale", &["m", "half"], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("m.onnx"));
    let out = layerwise(&["bisect", "m.onnx", "--val-range", "x:29,31", "--json", "r.json"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = json(&dir.path().join("r.json"));
    let fd = &r["verdict"]["first_divergent"];
    assert_eq!(fd["node"], "pool", "{fd}");
    assert_eq!(fd["cause"]["kind"], "accumulator_overflow", "{fd}");
    assert!(fd["cause"]["detail"].as_str().unwrap().contains("stores that sum in FP16"), "{fd}");
    // fix keeps the reduction in FP32, and the written model holds in its own types.
    let out =
        layerwise(&["fix", "m.onnx", "--val-range", "x:29,31", "-o", "fixed.onnx", "--json", "fix.json"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let fix = json(&dir.path().join("fix.json"));
    assert_eq!(fix["keep_fp32"], serde_json::json!(["pool"]), "{}", text(&out));
    assert_eq!(fix["fixed_model_check"]["pass"], true);
    // sim:bf16 has float32's range: no overflow there.
    let out = layerwise(&["bisect", "m.onnx", "--val-range", "x:29,31", "--cand", "sim:bf16"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// x[T,1,8] -> LSTM(hidden 16) -> y, and x2[4,64] -> Einsum with w[64,4] -> e, and a ConvTranspose.
fn tf32_ops() -> ModelProto {
    let mut b = ModelBuilder::new("tf32-ops", 17);
    b.input("x", DataType::Float, &[Dim::from(16), Dim::from(1), Dim::from(8)]);
    b.input("a", DataType::Float, &[Dim::from(4), Dim::from(64)]);
    b.input("c", DataType::Float, &[Dim::from(1), Dim::from(8), Dim::from(4), Dim::from(4)]);
    let det = |n: usize, k: f32| (0..n).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * k).collect::<Vec<f32>>();
    b.initializer(f32_tensor("W", &[1, 64, 8], &det(512, 0.7)));
    b.initializer(f32_tensor("R", &[1, 64, 16], &det(1024, 0.5)));
    b.initializer(f32_tensor("w", &[64, 4], &det(256, 0.3)));
    b.initializer(f32_tensor("k", &[8, 2, 3, 3], &det(144, 0.9)));
    b.node("LSTM", "lstm", &["x", "W", "R"], &["y"], vec![attr::int("hidden_size", 16)]);
    b.node(
        "Einsum",
        "einsum",
        &["a", "w"],
        &["e"],
        vec![layerwise_model::onnx::AttributeProto {
            name: Some("equation".into()),
            r#type: Some(layerwise_model::onnx::attribute_proto::AttributeType::String as i32),
            s: Some(b"ij,jk->ik".to_vec().into()),
            ..Default::default()
        }],
    );
    b.node("ConvTranspose", "deconv", &["c", "k"], &["d"], vec![]);
    b.output("y", DataType::Float);
    b.output("e", DataType::Float);
    b.output("d", DataType::Float);
    b.build()
}

#[test]
fn sim_tf32_rounds_recurrent_ops_and_einsum_but_not_conv_transpose() {
    // Measured on the H100 (docs/emulation.md): cuDNN's LSTM and a two-operand Einsum run on TF32
    // tensor cores (an LSTM over 1000 steps: 3.6e-4 with TF32 against 2.0e-7 without, where the
    // emulation gave exactly 0 before); ConvTranspose showed none.
    let dir = tempfile::tempdir().unwrap();
    save(&tf32_ops(), &dir.path().join("m.onnx"));
    let out = layerwise(
        &[
            "bisect",
            "m.onnx",
            "--cand",
            "sim:tf32",
            "--val-range",
            "x:-1,1",
            "--val-range",
            "a:-1,1",
            "--val-range",
            "c:-1,1",
            "--json",
            "r.json",
        ],
        dir.path(),
    );
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    let r = json(&dir.path().join("r.json"));
    let error = |name: &str| {
        r["outputs"].as_array().unwrap().iter().find(|o| o["name"] == name).unwrap()["rel_l2_err"].as_f64().unwrap()
    };
    assert!(error("y") > 1e-5, "the LSTM reads TF32: {}", error("y"));
    assert!(error("e") > 1e-5, "the Einsum reads TF32: {}", error("e"));
    assert!(error("d") < 1e-6, "the ConvTranspose stays float32: {}", error("d"));
}

#[test]
fn fp16_cumsum_keeps_its_running_sum_in_fp16_as_the_h100_does() {
    // On the H100 an FP16 CumSum equalled a sequential FP16 running sum bit for bit (probes.py:
    // 4,096 values near 1, error 9.3e-2, where rounding only the output gives 1.8e-4).
    let n = 4096;
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("cumsum", 17);
    b.input("x", DataType::Float, &[Dim::from(2), Dim::from(n as i64)]);
    b.initializer(layerwise_model::builder::i64_tensor("axis", &[], &[1]));
    b.node("CumSum", "running", &["x", "axis"], &["y"], vec![]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("m.onnx"));
    let x: Vec<f32> = (0..2 * n).map(|i| 1.0 + ((i * 7919) % 1000) as f32 * 1e-6).collect();
    write_npy_file(&dir.path().join("x.npy"), &Tensor::new(vec![2, n], TensorData::F32(x.clone()))).unwrap();
    let out = layerwise(
        &["bisect", "m.onnx", "--input", "x=x.npy", "--save-tensors", "saved", "--json", "r.json"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "the running sum stalls at 2048 in FP16: {}", text(&out));
    let emulated = saved_tensor(&dir.path().join("saved/cand"), "y").to_f32().into_owned();
    for row in 0..2 {
        let mut acc = 0f32;
        for k in 0..n {
            acc = f16(acc + f16(x[row * n + k]));
            assert_eq!(emulated[row * n + k].to_bits(), acc.to_bits(), "row {row}, element {k}");
        }
    }
    // Reverse and exclusive too.
    let mut b = ModelBuilder::new("cumsum-rev", 17);
    b.input("x", DataType::Float, &[Dim::from(2), Dim::from(n as i64)]);
    b.initializer(layerwise_model::builder::i64_tensor("axis", &[], &[-1]));
    b.node("CumSum", "running", &["x", "axis"], &["y"], vec![attr::int("reverse", 1), attr::int("exclusive", 1)]);
    b.output("y", DataType::Float);
    save(&b.build(), &dir.path().join("rev.onnx"));
    let out = layerwise(&["bisect", "rev.onnx", "--input", "x=x.npy", "--save-tensors", "rev"], dir.path());
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
    let emulated = saved_tensor(&dir.path().join("rev/cand"), "y").to_f32().into_owned();
    for row in 0..2 {
        let mut acc = 0f32;
        for k in (0..n).rev() {
            assert_eq!(emulated[row * n + k].to_bits(), acc.to_bits(), "reverse exclusive: row {row}, element {k}");
            acc = f16(acc + f16(x[row * n + k]));
        }
    }
}

/// BF16 Sigmoid and FP16/BF16 Softplus round after every step of their formula on the H100
/// (docs/emulation.md). Every finite input with |x| <= 40 was recorded there
/// (tests/data/h100_unary_stepwise.npz, from scripts/gpu/elementwise_probe.py): both the
/// emulation and the typed evaluation of the converted file give the H100's value bit for bit,
/// where the float32 op rounded once differs on hundreds of them.
#[test]
fn stepwise_unary_kernels_are_the_h100s_bit_for_bit() {
    let data =
        read_npz(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/h100_unary_stepwise.npz")))
            .unwrap();
    let get = |name: &str| {
        data.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} in the recorded data")).1.clone()
    };
    for (op, tag) in [("Sigmoid", "bf16"), ("Softplus", "bf16"), ("Softplus", "fp16")] {
        let x = get(&format!("{op}_{tag}_x"));
        let h100: Vec<u32> = get(&format!("{op}_{tag}_h100")).to_f32().iter().map(|v| v.to_bits()).collect();
        let n = x.len();
        // BF16 Softplus exists in ONNX (and has a CUDA kernel) from opset 22.
        let mut b = ModelBuilder::new("unary", if op == "Softplus" && tag == "bf16" { 22 } else { 17 });
        b.input("x", DataType::Float, &[Dim::from(n as i64)]);
        b.node(op, "op", &["x"], &["y"], vec![]);
        b.output("y", DataType::Float);
        let dir = tempfile::tempdir().unwrap();
        save(&b.build(), &dir.path().join("m.onnx"));
        write_npy_file(&dir.path().join("x.npy"), &x).unwrap();
        let out = layerwise(
            &[
                "bisect",
                "m.onnx",
                "--input",
                "x=x.npy",
                "--cand",
                &format!("sim:{tag}"),
                "--save-tensors",
                "emulated",
                "--no-noise-floor",
            ],
            dir.path(),
        );
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
        let emulated: Vec<u32> =
            saved_tensor(&dir.path().join("emulated/cand"), "y").to_f32().iter().map(|v| v.to_bits()).collect();
        let c = layerwise(&["convert", "m.onnx", "--to", tag, "-o", "low.onnx"], dir.path());
        assert_eq!(c.status.code(), Some(0), "{}", text(&c));
        assert!(!text(&c).contains("FP32 op:"), "{op} is converted: {}", text(&c));
        let out = layerwise(
            &[
                "bisect",
                "m.onnx",
                "--input",
                "x=x.npy",
                "--cand",
                "ort:cpu",
                "--cand-model",
                "low.onnx",
                "--save-tensors",
                "typed",
                "--no-noise-floor",
            ],
            dir.path(),
        );
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
        let typed: Vec<u32> =
            saved_tensor(&dir.path().join("typed/cand"), "y").to_f32().iter().map(|v| v.to_bits()).collect();
        let xs = x.to_f32();
        let round = |v: f32| if tag == "bf16" { half::bf16::from_f32(v).to_f32() } else { f16(v) };
        let once = |v: f32| round(if op == "Sigmoid" { 1.0 / (1.0 + (-v).exp()) } else { (1.0 + v.exp()).ln() });
        let mut differs_once = 0;
        for i in 0..n {
            assert_eq!(
                emulated[i],
                h100[i],
                "{op} {tag}, x = {}: emulated {}, H100 {}",
                xs[i],
                f32::from_bits(emulated[i]),
                f32::from_bits(h100[i])
            );
            assert_eq!(
                typed[i],
                h100[i],
                "{op} {tag}, x = {}: typed {}, H100 {}",
                xs[i],
                f32::from_bits(typed[i]),
                f32::from_bits(h100[i])
            );
            differs_once += usize::from(once(xs[i]).to_bits() != h100[i]);
        }
        assert!(
            differs_once > 100,
            "{op} {tag}: the recorded values tell stepwise rounding from rounding once ({differs_once} differ)"
        );
    }
}
