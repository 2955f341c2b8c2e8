//! Models for the end-to-end tests, built in Rust.
#![allow(dead_code)]

use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::DataType;

pub mod quantized;

/// Appends `steps` pairs of Mul/Add to `from`, each rounding to FP16 under emulation, so the error
/// grows a little at every layer (drift) and never jumps. Returns the last tensor.
pub fn drift_chain(b: &mut ModelBuilder, prefix: &str, from: &str, steps: usize) -> String {
    let mut current = from.to_string();
    for i in 0..steps {
        let (w, c) = (format!("{prefix}_w{i}"), format!("{prefix}_c{i}"));
        b.initializer(f32_tensor(&w, &[1], &[1.0037 + 0.0001 * i as f32]));
        b.initializer(f32_tensor(&c, &[1], &[0.000_713]));
        let (m, a) = (format!("{prefix}_mul{i}"), format!("{prefix}_add{i}"));
        b.node("Mul", &format!("{prefix}/Mul_{i}"), &[&current, &w], &[&m], vec![]);
        b.node("Add", &format!("{prefix}/Add_{i}"), &[&m, &c], &[&a], vec![]);
        current = a;
    }
    current
}

/// What follows the drifting chains.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ending {
    /// Nothing: the output is the drifted value (healthy under FP16).
    Healthy,
    /// `Exp(20 * d)` overflows FP16 (e^20 > 65504) from a drifted but finite input.
    ExpOverflow,
    /// `Softmax(5 * d + 2000)`: logits near 2000 keep only ~0.5 absolute precision in FP16, which
    /// Softmax over a spread of ~5 turns into a different distribution: amplification by a
    /// sensitive op, with no overflow anywhere.
    SoftmaxAmplification,
}

/// x[1,256] -> a drifting branch A (30 steps) -> ending, multiplied by a longer drifting branch B
/// (60 steps, more drift than A but no break).
pub fn planted(ending: Ending) -> ModelProto {
    let mut b = ModelBuilder::new("planted", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(256)]);
    let a = drift_chain(&mut b, "branch_a", "x", 30);
    let bb = drift_chain(&mut b, "branch_b", "x", 60);
    let head = match ending {
        Ending::Healthy => a,
        Ending::ExpOverflow => {
            b.initializer(f32_tensor("twenty", &[1], &[20.0]));
            b.node("Mul", "head/scale", &[&a, "twenty"], &["scaled"], vec![]);
            b.node("Exp", "head/Exp", &["scaled"], &["exp"], vec![]);
            "exp".to_string()
        }
        Ending::SoftmaxAmplification => {
            b.initializer(f32_tensor("five", &[1], &[5.0]));
            b.initializer(f32_tensor("offset", &[1], &[2000.0]));
            b.node("Mul", "head/scale", &[&a, "five"], &["scaled"], vec![]);
            b.node("Add", "head/offset", &["scaled", "offset"], &["logits"], vec![]);
            b.node("Softmax", "head/Softmax", &["logits"], &["probs"], vec![attr::int("axis", -1)]);
            "probs".to_string()
        }
    };
    b.node("Mul", "merge/Mul", &[&head, &bb], &["out"], vec![]);
    b.output("out", DataType::Float);
    b.build()
}

/// y = x * one, z = x2 * 1000: under FP16 emulation 1e5 must become inf and 1.0001 must become 1.
pub fn rounding_probe() -> ModelProto {
    let mut b = ModelBuilder::new("rounding", 17);
    b.input("x", DataType::Float, &[Dim::from(3)]);
    b.input("x2", DataType::Float, &[Dim::from(1)]);
    b.initializer(f32_tensor("one", &[1], &[1.0]));
    b.initializer(f32_tensor("thousand", &[1], &[1000.0]));
    b.node("Mul", "y/Mul", &["x", "one"], &["y"], vec![]);
    b.node("Mul", "z/Mul", &["x2", "thousand"], &["z"], vec![]);
    b.output("y", DataType::Float);
    b.output("z", DataType::Float);
    b.build()
}

/// A model with a dynamic batch dimension and an int64 input.
pub fn dynamic_model() -> ModelProto {
    let mut b = ModelBuilder::new("dynamic", 17);
    b.input("x", DataType::Float, &[Dim::from("batch"), Dim::from(4)]);
    b.input("ids", DataType::Int64, &[Dim::from("batch")]);
    b.node("Relu", "relu", &["x"], &["y"], vec![]);
    b.node("Cast", "cast", &["ids"], &["ids_f"], vec![attr::int("to", DataType::Float as i64)]);
    b.output("y", DataType::Float);
    b.output("ids_f", DataType::Float);
    b.build()
}

pub fn save(proto: &ModelProto, path: &std::path::Path) {
    use prost::Message;
    std::fs::write(path, proto.encode_to_vec()).unwrap();
}

/// x[1,256] -> 20 drifting steps -> a decomposed LayerNorm over h = 400*d (its x² overflows FP16)
/// -> Mul(gamma) -> Add(beta) -> Tanh -> out: the planted break sits inside a larger model.
pub fn planted_layernorm() -> ModelProto {
    let mut b = ModelBuilder::new("planted-ln", 13);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(256)]);
    let d = drift_chain(&mut b, "pre", "x", 20);
    let ramp: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) * 3.0).collect();
    b.initializer(f32_tensor("ramp", &[256], &ramp));
    b.node("Add", "ln_in", &[&d, "ramp"], &["h"], vec![]);
    decomposed_layernorm(&mut b, "h", (&vec![1.0; 256], &vec![0.1; 256]));
    b.node("Tanh", "head", &["ln_out"], &["out"], vec![]);
    b.output("out", DataType::Float);
    b.build()
}

/// A decomposed LayerNorm over the last axis of `x`, as exporters before opset 17 write it: nodes
/// `ln/mean`, `ln/sub`, `ln/pow`, `ln/var`, `ln/add_eps`, `ln/sqrt`, `ln/div`, `ln/gamma` and
/// `ln/beta` (weights `two`, `eps`, `gamma`, `beta`), its output `ln_out`.
pub fn decomposed_layernorm(b: &mut ModelBuilder, x: &str, (gamma, beta): (&[f32], &[f32])) {
    b.initializer(f32_tensor("two", &[], &[2.0]));
    b.initializer(f32_tensor("eps", &[], &[1e-5]));
    b.initializer(f32_tensor("gamma", &[gamma.len() as i64], gamma));
    b.initializer(f32_tensor("beta", &[beta.len() as i64], beta));
    b.node("ReduceMean", "ln/mean", &[x], &["mean"], vec![attr::ints("axes", &[-1]), attr::int("keepdims", 1)]);
    b.node("Sub", "ln/sub", &[x, "mean"], &["centered"], vec![]);
    b.node("Pow", "ln/pow", &["centered", "two"], &["sq"], vec![]);
    b.node("ReduceMean", "ln/var", &["sq"], &["var"], vec![attr::ints("axes", &[-1]), attr::int("keepdims", 1)]);
    b.node("Add", "ln/add_eps", &["var", "eps"], &["var_eps"], vec![]);
    b.node("Sqrt", "ln/sqrt", &["var_eps"], &["std"], vec![]);
    b.node("Div", "ln/div", &["centered", "std"], &["normed"], vec![]);
    b.node("Mul", "ln/gamma", &["normed", "gamma"], &["scaled"], vec![]);
    b.node("Add", "ln/beta", &["scaled", "beta"], &["ln_out"], vec![]);
}

/// x[1,4,8,8] -> Conv -> BatchNormalization whose variance has a value beyond the FP16 range ->
/// Relu -> out.
pub fn batchnorm_overflow() -> ModelProto {
    let mut b = ModelBuilder::new("bn-overflow", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4), Dim::from(8), Dim::from(8)]);
    let w: Vec<f32> = (0..16).map(|i| 0.1 + 0.05 * i as f32).collect();
    b.initializer(f32_tensor("conv_w", &[4, 4, 1, 1], &w));
    b.initializer(f32_tensor("bn_scale", &[4], &[1.0, 1.0, 1.0, 300.0]));
    b.initializer(f32_tensor("bn_bias", &[4], &[0.0, 0.1, 0.2, 0.3]));
    b.initializer(f32_tensor("bn_mean", &[4], &[0.5, 0.5, 0.5, 0.5]));
    b.initializer(f32_tensor("bn_var", &[4], &[1.0, 1.0, 1.0, 1e5]));
    b.node("Conv", "conv", &["x", "conv_w"], &["conv_out"], vec![]);
    b.node("BatchNormalization", "bn", &["conv_out", "bn_scale", "bn_bias", "bn_mean", "bn_var"], &["bn_out"], vec![]);
    b.node("Relu", "relu", &["bn_out"], &["out"], vec![]);
    b.output("out", DataType::Float);
    b.build()
}

/// x -> Mul(w) -> Relu -> Softmax -> Add(w2) -> out, for conversion tests.
pub fn convertible() -> ModelProto {
    let mut b = ModelBuilder::new("convertible", 17);
    b.input("x", DataType::Float, &[Dim::from(2), Dim::from(8)]);
    b.initializer(f32_tensor("w", &[8], &[0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]));
    b.initializer(f32_tensor("w2", &[8], &[0.1; 8]));
    b.node("Mul", "mul", &["x", "w"], &["a"], vec![]);
    b.node("Relu", "relu", &["a"], &["b"], vec![]);
    b.node("Softmax", "softmax", &["b"], &["c"], vec![attr::int("axis", -1)]);
    b.node("Add", "add", &["c", "w2"], &["out"], vec![]);
    b.output("out", DataType::Float);
    b.build()
}

/// Runs the layerwise binary in `cwd`.
pub fn layerwise(args: &[&str], cwd: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_layerwise")).args(args).current_dir(cwd).output().unwrap()
}

/// Checks a refused run: exit status 2, `message` in its output, no panic.
pub fn assert_refused(out: &std::process::Output, args: &[&str], message: &str) {
    let t = text(out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {t}");
    assert!(t.contains(message), "{args:?}: expected '{message}' in: {t}");
    assert!(!t.contains("panicked"), "{t}");
}

/// Stdout and stderr of a run, together.
pub fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A JSON file written by layerwise (a report, node data).
pub fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// The models every layer of the walk is tested on that break under `sim:fp16`, with labels:
/// the demo, the planted Exp overflow, Softmax amplification and LayerNorm overflow, and a
/// Conv+BatchNorm whose variance overflows (a pattern ONNX Runtime fuses at its default level).
pub fn breaking_models() -> Vec<(&'static str, ModelProto)> {
    vec![
        ("demo", layerwise::demo::demo_model()),
        ("planted exp", planted(Ending::ExpOverflow)),
        ("planted softmax", planted(Ending::SoftmaxAmplification)),
        ("planted layernorm", planted_layernorm()),
        ("bn overflow", batchnorm_overflow()),
    ]
}

/// The tensor `--save-tensors` wrote for `tensor` in `folder` (a `ref` or `cand` folder; files are
/// named `NNNNN_<tensor>.npy`, and exactly one must match).
pub fn saved_tensor(folder: &std::path::Path, tensor: &str) -> layerwise_runtime::Tensor {
    let suffix = format!("_{tensor}.npy");
    let matches: Vec<std::path::PathBuf> = std::fs::read_dir(folder)
        .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().ends_with(&suffix)))
        .collect();
    assert_eq!(matches.len(), 1, "one saved '{tensor}' in {}: {matches:?}", folder.display());
    layerwise_runtime::npy::read_npy_file(&matches[0]).unwrap()
}

/// A backend spec written in a test (panics on a typo, which is the test's bug).
#[allow(dead_code)]
pub fn spec(text: &str) -> layerwise_runtime::BackendSpec {
    layerwise_runtime::BackendSpec::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

/// A report's JSON without `run_info` (times, host, command line): what a merge of shards must
/// reproduce of one run's report.
pub fn json_without_run_info(path: &std::path::Path) -> serde_json::Value {
    let mut v = json(path);
    v.as_object_mut().unwrap().remove("run_info");
    v
}

/// Seven samples of the demo's input (`s0.npz`..`s6.npz`): some quiet (no FP16 overflow), some
/// loud, two equally loud (s1 and s4: the earliest must carry the verdict, as in one run).
pub fn write_demo_samples(dir: &std::path::Path) {
    use rand::{Rng, SeedableRng};
    let scales = [
        ("s0.npz", 0.01),
        ("s1.npz", 1.0),
        ("s2.npz", 0.02),
        ("s3.npz", 0.5),
        ("s4.npz", 1.0),
        ("s5.npz", 0.03),
        ("s6.npz", 0.7),
    ];
    std::fs::create_dir_all(dir).unwrap();
    for (name, scale) in scales {
        let seed = if name == "s4.npz" { 1 } else { name.as_bytes()[1] as u64 };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let values: Vec<f32> = (0..8 * 64).map(|_| rng.random::<f32>() * scale).collect();
        let x = layerwise_runtime::Tensor::f32(vec![1, 8, 64], values);
        layerwise_runtime::npy::write_npz(&dir.join(name), &[("x", &x)]).unwrap();
    }
}

#[allow(dead_code)]
/// A folder holding numpy for `python3` (the data loader's Python), for PYTHONPATH: a loader script
/// imports numpy, which a fresh machine's Python may lack. Fetched once with pip into the tests'
/// temporary folder under target/, as layerwise fetches ONNX Runtime.
pub fn numpy_for_tests() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-numpy");
    let has_numpy = |extra: Option<&std::path::Path>| {
        let mut c = std::process::Command::new("python3");
        c.args(["-c", "import numpy"]);
        if let Some(p) = extra {
            c.env("PYTHONPATH", p);
        }
        c.output().is_ok_and(|o| o.status.success())
    };
    if !has_numpy(Some(&dir)) {
        let out = std::process::Command::new("python3")
            .args(["-m", "pip", "install", "-q", "--target"])
            .arg(&dir)
            .arg("numpy")
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success() && has_numpy(Some(&dir)),
            "the data loader test needs numpy for python3: `python3 -m pip install --target {} numpy` failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

/// x[4,32] -> `blocks` x (Cast to FP16 -> square -> Sqrt -> Erf -> Sqrt -> Erf -> Cast to float32
/// -> Relu). ONNX Runtime's CPU provider computes Sqrt and Erf in float32 through Casts it
/// inserts, and between two of them keeps the float32 value where the graph holds an FP16 one.
pub fn fp16_islands(blocks: usize) -> ModelProto {
    let mut b = ModelBuilder::new("fp16-islands", 17);
    b.input("x", DataType::Float, &[Dim::from(4), Dim::from(32)]);
    let mut prev = "x".to_string();
    for k in 0..blocks {
        let t = |s: &str| format!("i{k}_{s}");
        b.node("Cast", &t("to16"), &[&prev], &[&t("h")], vec![attr::int("to", DataType::Float16 as i64)]);
        b.node("Mul", &t("sq"), &[&t("h"), &t("h")], &[&t("sq")], vec![]);
        b.node("Sqrt", &t("sqrt1"), &[&t("sq")], &[&t("sqrt1")], vec![]);
        b.node("Erf", &t("erf1"), &[&t("sqrt1")], &[&t("erf1")], vec![]);
        b.node("Sqrt", &t("sqrt2"), &[&t("erf1")], &[&t("sqrt2")], vec![]);
        b.node("Erf", &t("erf2"), &[&t("sqrt2")], &[&t("erf2")], vec![]);
        b.node("Cast", &t("to32"), &[&t("erf2")], &[&t("f")], vec![attr::int("to", DataType::Float as i64)]);
        b.node("Relu", &t("relu"), &[&t("f")], &[&t("out")], vec![]);
        prev = t("out");
    }
    b.output(&prev, DataType::Float);
    b.build()
}

/// y = A(x) - B(x), where A and B are chains of six 16x16 MatMuls whose weights differ by about
/// 0.2%: y is a hundredth of what each chain computes, and it moves with every weight of both, so
/// one FP16 rounding of the weights moves it about as much as the FP16 candidate does. An output
/// ill-conditioned in its weights: no small keep list can fix it (keeping both chains whole is no
/// small list). Gaussian weights (std 1/4) from a fixed xorshift seed: the same model every run.
pub fn ill_conditioned_branches() -> ModelProto {
    let n = 16;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut gaussian = move || (-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
    let weights: Vec<Vec<f64>> = (0..6).map(|_| (0..n * n).map(|_| gaussian() * 0.25).collect()).collect();
    let mut b = ModelBuilder::new("ill-conditioned", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(n as i64)]);
    let mut ends = Vec::new();
    for (branch, delta) in [("a", 0.0), ("b", 2e-3)] {
        let mut current = "x".to_string();
        for (k, base) in weights.iter().enumerate() {
            let w: Vec<f32> = base.iter().map(|v| (v + delta * gaussian() * 0.25) as f32).collect();
            let (weight, out) = (format!("{branch}_w{k}"), format!("{branch}_h{k}"));
            b.initializer(f32_tensor(&weight, &[n as i64, n as i64], &w));
            b.node("MatMul", &format!("{branch}/mm{k}"), &[&current, &weight], &[&out], vec![]);
            current = out;
        }
        ends.push(current);
    }
    b.node("Sub", "difference", &[&ends[0], &ends[1]], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}
