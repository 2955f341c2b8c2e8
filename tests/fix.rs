//! FP16 conversion with a keep list, and the fix search (issue: from diagnosis to fix).

use std::collections::HashSet;

use crate::common;
use crate::common::{batchnorm_overflow, convertible, planted_layernorm, save, spec};
use layerwise::fix::{fix, FixOptions};
use layerwise::pipeline::{bisect, BisectOptions};
use layerwise_analysis::Status;
use layerwise_model::convert::{check_float_types, convert_fp16, float_tensor_set, ConvertOptions};
use layerwise_model::onnx::{type_proto, ModelProto};
use layerwise_model::{DataType, GraphIndex, Model};
use layerwise_report::{FixStage, FixStatus};
use layerwise_runtime::float32_tensors;

fn convert(
    proto: ModelProto,
    options: ConvertOptions,
) -> (Model, layerwise_model::convert::Conversion, HashSet<String>) {
    let model = Model::from_proto(proto, "test").unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let float = float_tensor_set(&model, &float32_tensors(&model, &index).unwrap());
    let conversion = convert_fp16(&model, &index, &float, &options).unwrap();
    (model, conversion, float)
}

fn casts(p: &ModelProto) -> Vec<(String, String, i64)> {
    p.graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .filter(|n| n.op_type() == "Cast")
        .map(|n| (n.input[0].clone(), n.output[0].clone(), n.attribute[0].i.unwrap()))
        .collect()
}

fn initializer_type(p: &ModelProto, name: &str) -> i32 {
    p.graph.as_ref().unwrap().initializer.iter().find(|t| t.name() == name).unwrap().data_type()
}

fn io_type(v: &layerwise_model::onnx::ValueInfoProto) -> i32 {
    match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => t.elem_type(),
        _ => 0,
    }
}

const F16: i64 = DataType::Float16 as i64;
const F32: i64 = DataType::Float as i64;

#[test]
fn conversion_types_and_casts_are_exactly_at_the_boundaries() {
    let (_, plain, float) = convert(convertible(), ConvertOptions::default());
    assert!(check_float_types(&plain.proto, &float).is_empty(), "{:?}", check_float_types(&plain.proto, &float));
    // All FP16: one Cast in after the FP32 input, one Cast back before the FP32 output.
    assert_eq!(casts(&plain.proto), [("x".into(), "x__to_fp16".into(), F16), ("out__fp16".into(), "out".into(), F32)]);
    assert_eq!(initializer_type(&plain.proto, "w"), DataType::Float16 as i32);
    let g = plain.proto.graph.as_ref().unwrap();
    assert_eq!(io_type(&g.input[0]), DataType::Float as i32, "graph inputs stay FP32 by default");
    assert_eq!(io_type(&g.output[0]), DataType::Float as i32);
    assert_eq!(plain.fp16_nodes, 4);
    let names: Vec<&str> = g.node.iter().map(|n| n.name()).collect();
    assert!(["mul", "relu", "softmax", "add"].iter().all(|n| names.contains(n)), "node names are preserved: {names:?}");

    // Keep the Softmax: Casts appear on both sides of it, and nowhere else new.
    let keep = ConvertOptions { keep_nodes: ["softmax".to_string()].into(), ..Default::default() };
    let (_, kept, float) = convert(convertible(), keep);
    assert!(check_float_types(&kept.proto, &float).is_empty());
    assert_eq!(
        casts(&kept.proto),
        [
            ("x".into(), "x__to_fp16".into(), F16),
            ("b".into(), "b__to_fp32".into(), F32),
            ("c".into(), "c__to_fp16".into(), F16),
            ("out__fp16".into(), "out".into(), F32)
        ]
    );
    assert_eq!(kept.fp32_nodes, [("softmax".to_string(), "--keep-fp32".to_string())]);
    let softmax = kept.proto.graph.as_ref().unwrap().node.iter().find(|n| n.name() == "softmax").unwrap();
    assert_eq!(softmax.input, ["b__to_fp32"]);

    // The same by op type.
    let by_op = ConvertOptions { keep_ops: ["Softmax".to_string()].into(), ..Default::default() };
    assert_eq!(casts(&convert(convertible(), by_op).1.proto).len(), 4);
    // FP16 inputs and outputs when asked.
    let io = ConvertOptions { keep_io_types: false, ..Default::default() };
    let (_, fp16_io, float) = convert(convertible(), io);
    assert!(casts(&fp16_io.proto).is_empty());
    assert_eq!(io_type(&fp16_io.proto.graph.as_ref().unwrap().input[0]), DataType::Float16 as i32);
    assert!(check_float_types(&fp16_io.proto, &float).is_empty());
}

#[test]
fn the_type_check_catches_a_missing_cast() {
    let (_, mut kept, float) =
        convert(convertible(), ConvertOptions { keep_nodes: ["softmax".to_string()].into(), ..Default::default() });
    assert!(check_float_types(&kept.proto, &float).is_empty());
    // Feed the FP16 Add the Softmax's FP32 output directly, skipping the Cast back to FP16.
    let add = kept.proto.graph.as_mut().unwrap().node.iter_mut().find(|n| n.name() == "add").unwrap();
    add.input[0] = "c".into();
    let problems = check_float_types(&kept.proto, &float);
    assert!(problems.iter().any(|p| p.contains("'add'") && p.contains("mixes")), "{problems:?}");
}

#[test]
fn overflowing_weight_keeps_its_consumer_fp32() {
    let (_, conversion, float) = convert(batchnorm_overflow(), ConvertOptions::default());
    assert!(
        conversion.fp32_nodes.iter().any(|(n, why)| n == "bn" && why.contains("bn_var")),
        "{:?}",
        conversion.fp32_nodes
    );
    assert_eq!(conversion.overflowing_weights, [("bn_var".to_string(), vec!["bn".to_string()])]);
    assert_eq!(initializer_type(&conversion.proto, "bn_var"), DataType::Float as i32);
    assert_eq!(initializer_type(&conversion.proto, "conv_w"), DataType::Float16 as i32);
    assert!(check_float_types(&conversion.proto, &float).is_empty());
}

#[test]
fn converted_model_runs_in_onnx_runtime_and_compares_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (model, conversion, _) = convert(convertible(), ConvertOptions::default());
    let original = dir.path().join("model.onnx");
    let converted = dir.path().join("model_fp16.onnx");
    save(&model.proto, &original);
    model.save_standalone(&conversion.proto, &converted).unwrap();
    let options = BisectOptions {
        cand_model: Some(converted),
        ..BisectOptions::new(&original, spec("ort:cpu"), spec("ort:cpu"))
    };
    let outcome = bisect(&options).unwrap();
    assert_eq!(outcome.report.verdict.status, Status::Pass, "{}", outcome.text);
    let a = outcome.report.tensors.iter().find(|t| t.name == "a").unwrap();
    assert_eq!(a.cand_dtype, "float16", "the candidate's tensor is FP16, compared as float32");
    assert!(a.metrics.rel_l2_err > 0.0 && a.metrics.rel_l2_err < 1e-3);
    assert_eq!(outcome.report.tensors.len(), 4, "Casts the conversion added are not compared");
}

fn fix_options(model: &std::path::Path, cand: &str, output: std::path::PathBuf) -> FixOptions {
    FixOptions {
        bisect: BisectOptions::new(model, spec("ort:cpu"), spec(cand)),
        output: Some(output),
        max_rounds: 12,
        target: layerwise::fix::FixTarget::Elementwise,
    }
}

#[test]
fn fix_keeps_the_layernorm_pattern_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ln.onnx");
    save(&planted_layernorm(), &path);
    let outcome = fix(&fix_options(&path, "sim:fp16", dir.path().join("fixed.onnx"))).unwrap();
    let r = &outcome.report;
    assert_eq!(r.status, FixStatus::Fixed, "{}", outcome.text);
    assert_eq!(r.patterns.len(), 1, "{}", outcome.text);
    assert_eq!(r.patterns[0].kind, "decomposed_layernorm");
    let expected = ["ln/mean", "ln/sub", "ln/pow", "ln/var", "ln/add_eps", "ln/sqrt", "ln/div", "ln/gamma", "ln/beta"];
    assert_eq!(r.keep_fp32, expected, "the LayerNorm pattern, not the whole model");
    assert!(r.keep_fp32.len() * 5 < r.node_count, "{} of {}", r.keep_fp32.len(), r.node_count);
    assert_eq!(r.candidate_runs, 2, "one run to diagnose, one to verify");
    assert!(r.outputs.iter().all(|o| !o.before_pass && o.after_pass));
    assert!(
        r.trtexec_flags.contains("--layerPrecisions='ln/mean:fp32,ln/sub:fp32,")
            && r.trtexec_flags.contains("--precisionConstraints=obey")
    );
    // The written model: FP32 islands where the keep list says, and it runs for real in FP16.
    let check = r.fixed_model_check.as_ref().unwrap();
    assert!(check.structural_problems.is_empty(), "{:?}", check.structural_problems);
    assert!(check.pass, "{:?}", check.outputs);
    let keep_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("fixed.onnx.keep-fp32.json")).unwrap()).unwrap();
    assert_eq!(keep_json["keep_fp32"].as_array().unwrap().len(), 9);
}

#[test]
fn fix_on_converted_models_uses_the_converter() {
    // A backend that cannot keep nodes itself (ort:cpu) gets the model converted with the keep
    // list each round and runs it with ONNX Runtime's FP16 kernels: x @ (300 I) overflows FP16
    // for x > 218. ONNX Runtime's CPU provider computes element-wise FP16 ops in FP32 (it inserts
    // and then merges Casts, docs/fix.md), but a MatMul's result does reach FP16 storage.
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    let eye = |s: f32| -> Vec<f32> { (0..64).map(|i| if i % 9 == 0 { s } else { 0.0 }).collect() };
    let mut b = ModelBuilder::new("matmul", 17);
    b.input("x", DataType::Float, &[Dim::from(4), Dim::from(8)]);
    b.initializer(f32_tensor("big", &[8, 8], &eye(300.0)));
    b.initializer(f32_tensor("small", &[8, 8], &eye(1e-3)));
    b.node("MatMul", "scale", &["x", "big"], &["s"], vec![]);
    b.node("Identity", "pass", &["s"], &["t"], vec![]);
    b.node("MatMul", "shrink", &["t", "small"], &["out"], vec![]);
    b.output("out", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mul.onnx");
    save(&b.build(), &path);
    let mut options = fix_options(&path, "ort:cpu", dir.path().join("fixed.onnx"));
    options.bisect.inputs.ranges = vec![("x".into(), 0.0, 255.0)];
    let outcome = fix(&options).unwrap();
    let r = &outcome.report;
    assert_eq!(r.status, FixStatus::Fixed, "{}", outcome.text);
    assert_eq!(r.rounds[0].first_divergent.as_deref(), Some("scale"), "{}", outcome.text);
    assert_eq!(r.keep_fp32.first().map(String::as_str), Some("scale"), "{}", outcome.text);
    assert!(r.outputs.iter().all(|o| !o.before_pass && o.after_pass), "{}", outcome.text);
}

#[test]
fn fix_keeps_conv_batchnorm_whose_weight_overflows() {
    // The converter keeps a BatchNorm whose variance is beyond FP16's range in FP32 by itself, and
    // the keep list is emulated as the written file computes it: nothing more needs keeping, and
    // the summary says what the converter keeps.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bn.onnx");
    save(&batchnorm_overflow(), &path);
    let mut options = fix_options(&path, "sim:fp16", dir.path().join("fixed.onnx"));
    options.bisect.inputs.ranges = vec![("x".into(), -1.0, 1.0)];
    let outcome = fix(&options).unwrap();
    assert_eq!(outcome.report.status, FixStatus::Fixed, "{}", outcome.text);
    assert!(outcome.report.keep_fp32.is_empty(), "{}", outcome.text);
    assert!(outcome.report.summary.contains("bn: reads weight 'bn_var'"), "{}", outcome.text);
    assert!(
        outcome.report.fixed_model_fp32_nodes.iter().any(|(n, _)| n == "bn"),
        "{:?}",
        outcome.report.fixed_model_fp32_nodes
    );
    assert!(outcome.report.fixed_model_check.as_ref().unwrap().pass);
}

#[test]
fn conversion_retargets_casts_constant_of_shape_and_value_info() {
    use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
    use layerwise_model::onnx::ValueInfoProto;
    let mut b = ModelBuilder::new("attrs", 17);
    b.input("x", DataType::Float, &[Dim::from(2), Dim::from(3)]);
    b.input("ids", DataType::Int64, &[Dim::from(2), Dim::from(3)]);
    b.node("Cast", "ids_to_float", &["ids"], &["idsf"], vec![attr::int("to", DataType::Float as i64)]);
    b.node("Shape", "shape", &["x"], &["sh"], vec![]);
    b.node("ConstantOfShape", "ones", &["sh"], &["one"], vec![attr::tensor("value", f32_tensor("", &[1], &[1.5]))]);
    b.node("Add", "add", &["x", "idsf"], &["s"], vec![]);
    b.node("Mul", "mul", &["s", "one"], &["out"], vec![]);
    b.output("out", DataType::Float);
    let mut proto = b.build();
    proto.graph.as_mut().unwrap().value_info.push(ValueInfoProto {
        name: Some("s".into()),
        r#type: Some(layerwise_model::builder::tensor_type(DataType::Float, None)),
        ..Default::default()
    });
    let (model, conversion, float) = convert(proto, ConvertOptions::default());
    assert!(
        check_float_types(&conversion.proto, &float).is_empty(),
        "{:?}",
        check_float_types(&conversion.proto, &float)
    );
    let g = conversion.proto.graph.as_ref().unwrap();
    let node = |name: &str| g.node.iter().find(|n| n.name() == name).unwrap();
    assert_eq!(node("ids_to_float").attribute[0].i, Some(F16), "Cast to FLOAT becomes Cast to FLOAT16");
    let value = node("ones").attribute[0].t.as_ref().unwrap();
    assert_eq!(value.data_type(), DataType::Float16 as i32);
    assert_eq!(value.raw_data.as_deref(), Some(&half::f16::from_f32(1.5).to_le_bytes()[..]));
    assert_eq!(io_type(&g.value_info[0]), DataType::Float16 as i32, "value_info follows the tensor");
    // And it runs: compare against the original on ONNX Runtime.
    let dir = tempfile::tempdir().unwrap();
    let (orig, conv) = (dir.path().join("m.onnx"), dir.path().join("m16.onnx"));
    save(&model.proto, &orig);
    model.save_standalone(&conversion.proto, &conv).unwrap();
    let outcome = bisect(&BisectOptions {
        cand_model: Some(conv),
        ..BisectOptions::new(&orig, spec("ort:cpu"), spec("ort:cpu"))
    })
    .unwrap();
    assert_eq!(outcome.report.verdict.status, Status::Pass, "{}", outcome.text);
}

/// Drift over 60 FP16 roundings with a tolerance tighter than that drift: no node breaks and no
/// pattern is at fault, so the search keeps a contiguous region in topological order, shrinks it
/// from both ends and prunes it, and the keep list it reports is verified.
/// `fix` of a drifting chain built in `b`, saved in `dir`, under `sim:fp16` and a tolerance of
/// rel 2e-3 alone, which drift crosses and no single node breaks.
fn drift_options(b: layerwise_model::builder::ModelBuilder, dir: &std::path::Path, noise_floor: bool) -> FixOptions {
    let path = dir.join("drift.onnx");
    save(&b.build(), &path);
    let mut options = fix_options(&path, "sim:fp16", dir.join("fixed.onnx"));
    options.bisect.atol = Some(0.0);
    options.bisect.rtol = Some(2e-3);
    options.bisect.range_tol = Some(0.0);
    options.bisect.noise_floor = noise_floor;
    options
}

/// x[1,256] -> a 30-step drifting chain -> y.
fn drift_model() -> layerwise_model::builder::ModelBuilder {
    let mut b = layerwise_model::builder::ModelBuilder::new("drift", 17);
    b.input("x", DataType::Float, &[layerwise_model::builder::Dim::from(1), layerwise_model::builder::Dim::from(256)]);
    let out = common::drift_chain(&mut b, "c", "x", 30);
    b.node("Identity", "out", &[&out], &["y"], vec![]);
    b.output("y", DataType::Float);
    b
}

#[test]
fn fix_falls_back_to_a_topological_region_when_pattern_keeps_fail() {
    let b = drift_model();
    let dir = tempfile::tempdir().unwrap();
    let outcome = fix(&drift_options(b, dir.path(), true)).unwrap();
    let r = &outcome.report;
    assert_eq!(r.status, FixStatus::Fixed, "{}", outcome.text);
    let region = r.patterns.iter().find(|p| p.kind == "region").unwrap_or_else(|| panic!("a region: {}", outcome.text));
    assert!(!region.nodes.is_empty() && region.nodes.len() < r.node_count, "{}", outcome.text);
    assert!(
        r.rounds.iter().any(|x| x.stage == FixStage::Region) && r.rounds.iter().any(|x| x.stage == FixStage::Prune),
        "{:?}",
        r.rounds
    );
    // Bisection from both ends and an eighths prune: far fewer runs than one per node.
    assert!(r.candidate_runs <= 2 + 2 * 7 + 8 + 4, "{} runs", r.candidate_runs);
    assert!(outcome.text.contains("rounds: diagnose 1"), "{}", outcome.text);
    assert!(r.fixed_model_check.as_ref().unwrap().pass, "the written model passes for real: {:?}", r.fixed_model_check);
}

/// Two independent overflows, each needed: no prune round drops a pattern, so the file written and
/// loaded in a child process beside the prune rounds is the file `fix` writes. It holds, and is the
/// same file as one written after them (a third, unneeded keep list would have been written again).
#[test]
fn the_file_written_beside_the_prune_rounds_is_the_fixed_file() {
    let mut b = layerwise_model::builder::ModelBuilder::new("two_overflows", 17);
    b.input("x", DataType::Float, &[layerwise_model::builder::Dim::from(1), layerwise_model::builder::Dim::from(8)]);
    // x * s * s passes FP16's 65504 (the weights themselves are within it), and is divided back.
    for (k, scale) in [(1, 300.0f32), (2, 400.0)] {
        let (s_, a, u, v, d) = (format!("s{k}"), format!("a{k}"), format!("u{k}"), format!("v{k}"), format!("d{k}"));
        b.initializer(layerwise_model::builder::f32_tensor(&s_, &[1], &[scale]));
        b.node("Mul", &format!("up{k}"), &["x", &s_], &[&a], vec![]);
        b.node("Mul", &format!("up{k}_again"), &[&a, &s_], &[&u], vec![]);
        b.node("Div", &format!("down{k}"), &[&u, &s_], &[&v], vec![]);
        b.node("Div", &format!("down{k}_again"), &[&v, &s_], &[&d], vec![]);
    }
    b.node("Add", "sum", &["d1", "d2"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    save(&b.build(), &path);
    let options = fix_options(&path, "sim:fp16", dir.path().join("fixed.onnx"));
    let outcome = fix(&options).unwrap();
    let r = &outcome.report;
    assert_eq!(r.status, FixStatus::Fixed, "{}", outcome.text);
    assert_eq!(r.patterns.len(), 2, "{}", outcome.text);
    // Each overflow's node is beyond FP16's range from inputs within it: no prune round tries
    // without it (issue 55: 16 such rounds were 59 of a GPU fix's 74.5 s), and the summary says so.
    assert!(!r.rounds.iter().any(|x| x.stage == FixStage::Prune), "{:?}", r.rounds);
    assert!(
        r.summary.contains("2 of the 2 patterns were kept without a trial of dropping them: each holds a node where the reference leaves FP16's range"),
        "{}",
        r.summary
    );
    let steps: Vec<&str> = r.run_info.durations_s.iter().map(|(s, _)| s.as_str()).collect();
    assert!(
        steps.contains(&"writing the fixed model and loading it in a child process (beside the prune rounds)"),
        "{steps:?}"
    );
    assert!(r.fixed_model_check.as_ref().unwrap().pass, "{:?}", r.fixed_model_check);
    assert_eq!(r.fixed_model_load.as_ref().unwrap().status, layerwise_report::LoadStatus::Loads);
    // The same keep list converted afterwards gives the same bytes.
    let model = Model::load(&path).unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let float = float_tensor_set(&model, &float32_tensors(&model, &index).unwrap());
    let again = convert_fp16(
        &model,
        &index,
        &float,
        &ConvertOptions { keep_nodes: r.keep_fp32.iter().cloned().collect(), ..Default::default() },
    )
    .unwrap();
    let written = Model::load(&dir.path().join("fixed.onnx")).unwrap();
    assert_eq!(
        written.graph().node,
        again.proto.graph.as_ref().unwrap().node,
        "the written file is the keep list's conversion"
    );
}

/// `--max-rounds 0` is no search: the diagnosing run only, no region or prune rounds (an
/// independent tester saw 22 of them run).
#[test]
fn max_rounds_zero_runs_no_search() {
    let b = drift_model();
    let dir = tempfile::tempdir().unwrap();
    let mut options = drift_options(b, dir.path(), true);
    options.max_rounds = 0;
    let outcome = fix(&options).unwrap();
    let r = &outcome.report;
    assert_eq!(r.status, FixStatus::NotFixed, "{}", outcome.text);
    assert_eq!(r.candidate_runs, 1, "{}", outcome.text);
    assert!(r.rounds.iter().all(|x| x.stage == FixStage::Diagnose), "{:?}", r.rounds);
}

/// The region search keeps nodes that compute from weights alone too: Silero VAD's LSTM reads its
/// weights through Slices and Concats of Constants, and with only the nodes fed by the input kept,
/// those rounded the weights in FP16 and `fix` said that keeping every node did not help (found by
/// the independent tester). Here each step's multiplier passes through an Identity.
#[test]
fn the_region_search_keeps_nodes_that_compute_from_weights_alone() {
    let mut b = layerwise_model::builder::ModelBuilder::new("drift_via_identity", 17);
    b.input("x", DataType::Float, &[layerwise_model::builder::Dim::from(1), layerwise_model::builder::Dim::from(256)]);
    let mut current = "x".to_string();
    for i in 0..30 {
        let (w, wi, m) = (format!("w{i}"), format!("w{i}_read"), format!("m{i}"));
        b.initializer(layerwise_model::builder::f32_tensor(&w, &[1], &[1.0037 + 0.0001 * i as f32]));
        b.node("Identity", &format!("weights/Identity_{i}"), &[&w], &[&wi], vec![]);
        b.node("Mul", &format!("chain/Mul_{i}"), &[&current, &wi], &[&m], vec![]);
        current = m;
    }
    b.node("Identity", "out", &[&current], &["y"], vec![]);
    b.output("y", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    // The error is the weights' own rounding, which the noise floor measures: it would stop the
    // search before the region is tried.
    let outcome = fix(&drift_options(b, dir.path(), false)).unwrap();
    let r = &outcome.report;
    assert_eq!(r.status, FixStatus::Fixed, "{}", outcome.text);
    assert!(!outcome.text.contains("even keeping every node"), "{}", outcome.text);
    assert!(
        r.keep_fp32.iter().any(|n| n.starts_with("weights/")),
        "the weights' Identities are kept: {:?}",
        r.keep_fp32
    );
    assert!(r.fixed_model_check.as_ref().unwrap().pass, "the written model passes for real: {:?}", r.fixed_model_check);
}

/// `fix --inputs DIR` searches and checks the keep list on every
/// sample, as bisect compares every sample: a quiet sample alone needs nothing kept, the set
/// with loud samples needs the LayerNorm.
#[test]
fn fix_holds_on_every_sample_of_a_folder() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(&layerwise::demo::demo_model(), &d.join("demo.onnx"));
    for (folder, scales) in [("quiet", vec![0.01]), ("mixed", vec![0.01, 1.0, 0.5])] {
        std::fs::create_dir_all(d.join(folder)).unwrap();
        for (k, scale) in scales.iter().enumerate() {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(k as u64);
            let x = layerwise_runtime::Tensor::f32(
                vec![1, 8, 64],
                (0..8 * 64).map(|_| rng.random::<f32>() * scale).collect(),
            );
            layerwise_runtime::npy::write_npz(&d.join(format!("{folder}/s{k}.npz")), &[("x", &x)]).unwrap();
        }
    }
    let run = |folder: &str| {
        let out = common::layerwise(&["fix", "demo.onnx", "--inputs", folder, "--json", &format!("{folder}.json")], d);
        assert_eq!(out.status.code(), Some(0), "{}", common::text(&out));
        common::json(&d.join(format!("{folder}.json")))
    };
    let quiet = run("quiet");
    assert_eq!(quiet["keep_fp32"].as_array().unwrap().len(), 0, "{}", quiet["summary"]);
    let mixed = run("mixed");
    assert!(!mixed["keep_fp32"].as_array().unwrap().is_empty(), "{}", mixed["summary"]);
    assert!(mixed["summary"].as_str().unwrap().contains("on every one of the 3 samples"), "{}", mixed["summary"]);
    assert_eq!(mixed["samples"].as_array().unwrap().len(), 3);
    assert!(mixed["fixed_model_check"]["pass"].as_bool().unwrap());
}

/// The counterfactual check on a converted candidate re-runs only the part of the model its keep
/// list changes, fed the candidate's own values at the border. The independent oracle: the whole
/// model converted with that keep list, written, and bisected as a candidate model of its own
/// must give the same output error.
#[test]
fn a_counterfactual_rerun_of_the_changed_part_equals_the_whole_model_with_the_keep_list() {
    let dir = tempfile::tempdir().unwrap();
    let (model, conversion, _) = convert(planted_layernorm(), ConvertOptions::default());
    let original = dir.path().join("ln.onnx");
    let converted = dir.path().join("ln_fp16.onnx");
    save(&model.proto, &original);
    model.save_standalone(&conversion.proto, &converted).unwrap();
    let nodes = conversion.proto.graph.as_ref().unwrap().node.len();
    // Separate runs hold the candidate's tensors, which the border is fed from.
    let options = BisectOptions {
        cand_model: Some(converted),
        separate_runs: true,
        ..BisectOptions::new(&original, spec("ort:cpu"), spec("ort:cpu"))
    };
    let report = bisect(&options).unwrap().report;
    assert_eq!(report.verdict.status, Status::Diverged);
    let cf = report.extras.counterfactual.as_ref().expect("a counterfactual section");
    assert!(!cf.checks.is_empty());
    for check in &cf.checks {
        let rerun =
            check.nodes_rerun.unwrap_or_else(|| panic!("{}: the whole model ran, not the changed part", check.node));
        assert!(rerun > 0 && rerun < nodes / 2, "{}: {rerun} of {nodes} nodes re-run", check.node);
        let keep = ConvertOptions { keep_nodes: check.kept.iter().cloned().collect(), ..ConvertOptions::default() };
        let (_, kept, _) = convert(planted_layernorm(), keep);
        let kept_path = dir.path().join(format!("kept_{}.onnx", check.node.replace('/', "_")));
        model.save_standalone(&kept.proto, &kept_path).unwrap();
        // Only the outputs marked, as the counterfactual's reference run marks them (marking every
        // tensor changes how ONNX Runtime fuses the float32 reference, in the last bits).
        let only_outputs = layerwise_model::Selection::Names(Vec::new());
        let whole = BisectOptions {
            cand_model: Some(kept_path),
            counterfactual: false,
            selection: only_outputs,
            ..BisectOptions::new(&original, spec("ort:cpu"), spec("ort:cpu"))
        };
        let whole = bisect(&whole).unwrap().report;
        let level = whole
            .tensors
            .iter()
            .find(|t| t.name == cf.output)
            .expect("the worst output compared")
            .metrics
            .error_level();
        assert!(level.is_finite() && level > 0.0, "{}: {level}", check.node);
        let diff = (check.output_error_after - level).abs() / level;
        assert!(diff < 1e-9, "{}: part {} against whole {level}", check.node, check.output_error_after);
    }
    assert!(cf.checks.iter().any(|c| c.explained > 0.9), "keeping the LayerNorm removes the error: {cf:?}");
}

/// 17 independent FP16 overflows (a Mul by 7e4 in each branch, scaled back down, summed): FP16
/// needs a keep list of many groups, which the summary counts by group instead of listing every
/// node, and BF16 run whole (nothing kept) is measured, said to pass its own tolerances, and set
/// beside the FP16 fix's smaller error.
#[test]
fn a_large_keep_list_is_summarized_by_group_and_bf16_measured_whole() {
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    use layerwise_model::DataType;
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("many", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(f32_tensor("big", &[1], &[7e4]));
    b.initializer(f32_tensor("small", &[1], &[1e-4]));
    let mut sum = String::new();
    for i in 0..17 {
        b.node("Mul", &format!("grow_{i}"), &["x", "big"], &[&format!("g{i}")], vec![]);
        b.node("Mul", &format!("shrink_{i}"), &[&format!("g{i}"), "small"], &[&format!("s{i}")], vec![]);
        if i == 0 {
            sum = "s0".into();
        } else {
            let next = format!("sum{i}");
            b.node("Add", &format!("add_{i}"), &[&sum, &format!("s{i}")], &[&next], vec![]);
            sum = next;
        }
    }
    b.node("Relu", "out", &[&sum], &["y"], vec![]);
    b.output("y", DataType::Float);
    common::save(&b.build(), &dir.path().join("m.onnx"));
    let out = common::layerwise(
        &["fix", "m.onnx", "--val-range", "x:1,2", "-o", "fixed.onnx", "--json", "fix.json", "--max-rounds", "40"],
        dir.path(),
    );
    let t = common::text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let f = common::json(&dir.path().join("fix.json"));
    let keep = f["keep_fp32"].as_array().unwrap();
    assert!(keep.len() >= 17, "{t}");
    let summary = f["summary"].as_str().unwrap();
    assert!(
        summary.contains(" groups: ") && summary.contains("every node in the fix report and the keep list"),
        "{summary}"
    );
    assert!(summary.len() < 1000 && !summary.contains("shrink_9"), "the summary lists every node: {summary}");
    assert_eq!(f["other_precision"]["candidate"], "sim:bf16");
    assert_eq!(f["other_precision"]["pass"], true);
    let bf16 = f["other_precision"]["worst_output_rel_l2"].as_f64().unwrap();
    assert!(bf16 < 1e-2, "{}", f["other_precision"]);
    // BF16 passes its own tolerances but errs more than the FP16 fix checked in the written file:
    // the summary says both numbers and never "needs no keep list".
    let fixed: f64 = f["fixed_model_check"]["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["after_rel_l2"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(bf16 > fixed, "BF16 {bf16} against the FP16 fix's {fixed}");
    assert!(
        summary.contains(
            "BF16 is an option with nothing kept, not an equal one: sim:bf16 has every output within BF16's tolerance"
        ) && !summary.contains("needs no keep list"),
        "{summary}"
    );
    let ratio = format!("{:.0}x this FP16 fix's", bf16 / fixed);
    assert!(summary.contains(&ratio), "{ratio}: {summary}");
    // The keep list is the union of the patterns, every node of each (pruning a pattern used to
    // drop the nodes it shared with another, which then named nodes the list did not keep).
    assert_keep_list_is_its_patterns(&f, &t);
    // The full list is in the keep-list file.
    let written = common::json(&dir.path().join("fixed.onnx.keep-fp32.json"));
    assert_eq!(written["keep_fp32"].as_array().unwrap().len(), keep.len());
    assert!(t.lines().all(|l| l.len() < 1200), "a terminal line lists every node: {t}");
}

/// The noise floor is measured
/// only where it can stop the search. An output the candidate takes to inf is never ill-conditioned
/// (the floor's perturbation keeps it finite), so two whole reference runs would decide nothing:
/// none is measured there, and the fix is found as before.
#[test]
fn fix_measures_no_noise_floor_where_the_candidate_output_is_not_finite() {
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("overflow", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(f32_tensor("big", &[1], &[7e4]));
    b.initializer(f32_tensor("small", &[1], &[1e-4]));
    b.node("Mul", "grow", &["x", "big"], &["g"], vec![]);
    b.node("Mul", "shrink", &["g", "small"], &["s"], vec![]);
    b.node("Relu", "out", &["s"], &["y"], vec![]);
    b.output("y", DataType::Float);
    common::save(&b.build(), &dir.path().join("m.onnx"));
    let out = common::layerwise(&["fix", "m.onnx", "--val-range", "x:1,2", "--json", "fix.json"], dir.path());
    let t = common::text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let f = common::json(&dir.path().join("fix.json"));
    assert_eq!(f["status"], "fixed", "{t}");
    assert_eq!(f["outputs"][0]["before_rel_l2"], "inf", "the candidate's output is inf before the fix: {t}");
    assert!(f["noise_floor"].is_null(), "a noise floor measured against an infinite error: {}", f["noise_floor"]);
    assert!(f["keep_fp32"].as_array().unwrap().iter().any(|n| n == "grow"), "{t}");
}

/// The written file is converted with what ONNX Runtime refuses in the target type as
/// found once before the search (Celu takes float32 only), not type-checked a second time beside
/// the child's load: the refused Celu stays FP32 in the file, which loads and holds.
#[test]
fn fix_writes_a_node_onnx_runtime_refuses_in_fp16_as_fp32() {
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("celu", 17);
    b.input("x", DataType::Float, &[Dim::from(2), Dim::from(8)]);
    b.initializer(f32_tensor("w", &[8], &[0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]));
    b.node("Mul", "mul", &["x", "w"], &["a"], vec![]);
    b.node("Celu", "celu", &["a"], &["c"], vec![]);
    b.node("Relu", "relu", &["c"], &["y"], vec![]);
    b.output("y", DataType::Float);
    common::save(&b.build(), &dir.path().join("m.onnx"));
    let out = common::layerwise(
        &["fix", "m.onnx", "--val-range", "x:-1,1", "-o", "fixed.onnx", "--json", "fix.json"],
        dir.path(),
    );
    let t = common::text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let f = common::json(&dir.path().join("fix.json"));
    assert_eq!(f["status"], "fixed", "{t}");
    let fp32 = f["fixed_model_fp32_nodes"].as_array().unwrap();
    assert!(
        fp32.iter().any(|n| n[0] == "celu"
            && n[1].as_str().unwrap().contains("ONNX Runtime refuses Celu with FP16 inputs at opset 17")),
        "{}",
        f["fixed_model_fp32_nodes"]
    );
    assert_eq!(f["fixed_model_load"]["status"], "loads", "{}", f["fixed_model_load"]);
    assert_eq!(f["fixed_model_check"]["pass"], true, "{}", f["fixed_model_check"]);
    let written = Model::load(&dir.path().join("fixed.onnx")).unwrap();
    let celu = written.graph().node.iter().find(|n| n.name() == "celu").unwrap();
    let cast = written.graph().node.iter().find(|n| n.output.first() == celu.input.first()).unwrap();
    assert_eq!(cast.op_type(), "Cast", "an FP16 Mul feeds the FP32 Celu through a Cast");
}

/// A converted model over 2,000 nodes is type-checked in pieces, and of nodes alike (op,
/// attributes, input and output types) only the first: every node ONNX Runtime refuses in FP16
/// is still found (three Celu among 2,400 Mul/Relu, at the start, the middle and the end).
#[test]
fn the_type_check_of_a_large_converted_model_finds_every_refused_node() {
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    let mut b = ModelBuilder::new("chain", 17);
    b.input("x", DataType::Float, &[Dim::from(2), Dim::from(8)]);
    b.initializer(f32_tensor("w", &[8], &[0.5; 8]));
    let mut last = "x".to_string();
    for i in 0..1200 {
        let (m, r) = (format!("m{i}"), format!("r{i}"));
        b.node("Mul", &format!("mul{i}"), &[&last, "w"], &[&m], vec![]);
        let op = if [3, 700, 1190].contains(&i) { "Celu" } else { "Relu" };
        b.node(op, &format!("act{i}"), &[&m], &[&r], vec![]);
        last = r;
    }
    b.output(&last, DataType::Float);
    let model = Model::from_proto(b.build(), "chain.onnx").unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let float = float_tensor_set(&model, &float32_tensors(&model, &index).unwrap());
    let (conversion, refused) =
        layerwise::keep::convert_checked(&model, &index, &float, &ConvertOptions::default()).unwrap();
    assert_eq!(refused.keys().cloned().collect::<Vec<_>>(), ["act1190", "act3", "act700"], "{refused:?}");
    assert!(
        refused.values().all(|why| why.contains("ONNX Runtime refuses Celu with FP16 inputs at opset 17")),
        "{refused:?}"
    );
    let converted = Model::from_proto(conversion.proto, "converted.onnx").unwrap();
    layerwise_runtime::check_types(&converted).unwrap();
}

/// Bisect's counterfactual and `fix` keep the same pattern for an underflow, from one function:
/// the Log the walk names, and the Add that reads the epsilon FP16 flushes to 0 (a constant is
/// kept float32 only by keeping its readers). The counterfactual used to keep the Log alone,
/// which changes nothing, while `fix` added the readers in a copy of its own.
#[test]
fn bisect_and_fix_keep_the_readers_of_an_epsilon_fp16_flushes_to_zero() {
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    let mut b = ModelBuilder::new("eps_log", 17);
    b.input("x", DataType::Float, &[Dim::from(64)]);
    b.initializer(f32_tensor("eps", &[1], &[1e-9]));
    b.node("Relu", "relu", &["x"], &["r"], vec![]);
    b.node("Add", "add_eps", &["r", "eps"], &["h"], vec![]);
    b.node("Log", "log", &["h"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    save(&b.build(), &dir.path().join("m.onnx"));
    let common_args = ["--cand", "sim:fp16", "--val-range", "x:-1,1"];
    let run = |command: &str, json: &str| {
        let mut args = vec![command, "m.onnx", "--json", json];
        args.extend(common_args);
        let out = common::layerwise(&args, dir.path());
        (common::text(&out), common::json(&dir.path().join(json)))
    };
    let (t, bisected) = run("bisect", "b.json");
    let fd = &bisected["verdict"]["first_divergent"];
    assert_eq!((fd["node"].as_str(), fd["cause"]["kind"].as_str()), (Some("log"), Some("underflow")), "{t}");
    let check = &bisected["counterfactual"]["checks"][0];
    assert_eq!(check["kept"], serde_json::json!(["add_eps", "log"]), "{t}");
    assert_eq!(check["fixes"], true, "{t}");
    let (t, fixed) = run("fix", "f.json");
    assert_eq!(fixed["status"], "fixed", "{t}");
    assert_eq!(fixed["keep_fp32"], check["kept"], "{t}");
}

/// A fix report's keep list is the union of its patterns, every node of each: its nodes.
fn assert_keep_list_is_its_patterns<'a>(f: &'a serde_json::Value, t: &str) -> HashSet<&'a str> {
    let kept: HashSet<&str> = f["keep_fp32"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    let named: HashSet<&str> = f["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["nodes"].as_array().unwrap())
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(kept, named, "{t}");
    kept
}

/// A node two kept patterns share stays kept while either stands. `a` overflows FP16 and matters
/// (its shrunk value reaches the output); `b` overflows too but only into `min`, whose `Clip`
/// bounds it; `min` and `clip` read both overflowing values, so both patterns hold them. Pruning
/// `b`'s pattern used to drop `min` and `clip` with it, and the summary's remaining pattern named
/// nodes the keep list no longer held ("every node in the fix report and the
/// keep list" over a pattern of 14 nodes missing from `keep_fp32`).
#[test]
fn pruning_a_pattern_keeps_the_nodes_another_pattern_shares() {
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    let mut b = ModelBuilder::new("shared_readers", 17);
    b.input("x", DataType::Float, &[Dim::from(8)]);
    for (name, value) in [("big_a", 7e4f32), ("big_b", 9e4), ("small", 1e-4), ("lo", -100.0), ("hi", 100.0)] {
        b.initializer(f32_tensor(name, &[], &[value]));
    }
    b.node("Mul", "a", &["x", "big_a"], &["a_out"], vec![]);
    b.node("Mul", "shrink_a", &["a_out", "small"], &["a_small"], vec![]);
    b.node("Mul", "b", &["x", "big_b"], &["b_out"], vec![]);
    b.node("Min", "min", &["a_out", "b_out"], &["m"], vec![]);
    b.node("Clip", "clip", &["m", "lo", "hi"], &["c"], vec![]);
    b.node("Add", "out", &["a_small", "c"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    save(&b.build(), &dir.path().join("m.onnx"));
    let out = common::layerwise(&["fix", "m.onnx", "--val-range", "x:1,2", "--json", "f.json"], dir.path());
    let t = common::text(&out);
    let f = common::json(&dir.path().join("f.json"));
    assert_eq!(f["status"], "fixed", "{t}");
    let kept = assert_keep_list_is_its_patterns(&f, &t);
    assert!(kept.contains("a") && kept.contains("shrink_a"), "{t}");
}

/// A mask filled by a Constant of -1e9 (an attention decoder's, with every position masked): the
/// Constant is beyond FP16's range, and `fix` keeps the Where that reads it, never the Constant
/// (`convert` refuses a Constant in a keep list, and `fix` exited 2 on the arabic-name-romanizer
/// decoder). Its reason names the weight beyond the range, not "inputs within FP16's range".
#[test]
fn fix_keeps_the_reader_of_a_constant_beyond_fp16_not_the_constant() {
    use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
    let mut b = ModelBuilder::new("masked", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(10)]);
    b.initializer(f32_tensor("two", &[], &[2.0]));
    b.node("Constant", "fill", &[], &["minus_big"], vec![attr::tensor("value", f32_tensor("v", &[], &[-1e9]))]);
    b.node("Less", "masked", &["x", "two"], &["mask"], vec![]);
    b.node("Where", "apply_mask", &["mask", "minus_big", "x"], &["scores"], vec![]);
    b.node("Softmax", "softmax", &["scores"], &["p"], vec![attr::int("axis", -1)]);
    b.output("p", DataType::Float);
    let dir = tempfile::tempdir().unwrap();
    save(&b.build(), &dir.path().join("m.onnx"));
    let out = common::layerwise(&["fix", "m.onnx", "--val-range", "x:0,1", "--json", "f.json"], dir.path());
    let t = common::text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let f = common::json(&dir.path().join("f.json"));
    assert_eq!(f["status"], "fixed", "{t}");
    let keep: Vec<&str> = f["keep_fp32"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(keep.contains(&"apply_mask") && !keep.contains(&"fill"), "{t}");
    assert!(!t.contains("from inputs within FP16's range"), "{t}");
}

/// The planted LayerNorm at opset 17, where ONNX Runtime's LayerNormFusion runs at every
/// optimization level but `disable`.
fn planted_layernorm_at_opset_17() -> ModelProto {
    let mut proto = planted_layernorm();
    proto.opset_import[0].version = Some(17);
    proto
}

/// From opset 17 ONNX Runtime fuses a decomposed LayerNorm into one LayerNormalization, taking in
/// the Cast that enters a float32 island; with an FP16 input and a float32 scale it then refused
/// the written model at every optimization level but `disable` ("Type parameter (T) of Optype
/// (LayerNormalization) bound to different types"), on the CPU as on CUDA.
#[test]
fn a_kept_layernorm_at_opset_17_loads_in_onnx_runtime_with_its_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ln17.onnx");
    save(&planted_layernorm_at_opset_17(), &path);
    let outcome = fix(&fix_options(&path, "sim:fp16", dir.path().join("fixed.onnx"))).unwrap();
    let r = &outcome.report;
    assert_eq!(r.status, FixStatus::Fixed, "{}", outcome.text);
    let load = r.fixed_model_load.as_ref().unwrap();
    assert_eq!(load.status, layerwise_report::LoadStatus::Loads, "{:?}: {}", load.detail, outcome.text);
    // The LayerNorm's input is computed in float32 too, said with why.
    let by_converter: Vec<&str> = r
        .fixed_model_fp32_nodes
        .iter()
        .filter(|(_, why)| why.contains("would mix FP16 and float32"))
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(by_converter, ["ln_in"], "{}", outcome.text);
    assert!(outcome.text.contains("ln_in: a LayerNorm whose fused LayerNormalization would mix"), "{}", outcome.text);
    // The emulation kept what the file keeps: the summary's error is the written model's.
    let check = r.fixed_model_check.as_ref().unwrap();
    let emulated = r.outputs.iter().map(|o| o.after_rel_l2).fold(0.0f64, f64::max);
    let written = check.outputs.iter().map(|o| o.after_rel_l2).fold(0.0f64, f64::max);
    assert!((emulated - written).abs() <= 1e-3 * written, "emulated {emulated} written {written}");

    // `convert` with gamma's Mul and beta's Add kept, the body FP16: ONNX Runtime would fuse them
    // (taking in the Cast between the Div and the Mul) into a LayerNormalization of FP16 input
    // and float32 scale. The whole LayerNorm and its input's producer become float32. With
    // gamma's Mul alone kept, the Cast between the Mul and the Add stops the fusion: nothing more
    // is kept. Both files load with ONNX Runtime's defaults.
    for (keep, widened) in [("ln/gamma,ln/beta", true), ("ln/gamma", false)] {
        let out = common::layerwise(
            &["convert", "ln17.onnx", "--to", "fp16", "--keep-fp32", keep, "-o", "part.onnx"],
            dir.path(),
        );
        let t = common::text(&out);
        assert!(out.status.success(), "{t}");
        assert!(t.contains("ONNX Runtime loads and runs it with its default options"), "{keep}: {t}");
        for node in ["ln_in", "ln/mean", "ln/div"] {
            let said = t.contains(&format!("FP32 {node}: a LayerNorm whose fused LayerNormalization would mix"));
            assert_eq!(said, widened, "{keep}, {node}: {t}");
        }
    }
}

/// An FP16 file run by ONNX Runtime itself (here `ort:cpu,typed=off`; `ort:cuda` on a GPU) is
/// judged on its outputs as deployed, only its outputs asked for, so that ONNX Runtime's fusions
/// (LayerNormFusion sums in float32) are what the verdict measures: exposing every tensor blocks
/// them. On an H100 the decoder's FP16 LayerNorms overflowed only with their Pow exposed. The
/// note says which run the output errors are from; a typed evaluation (the default on the CPU)
/// has no fused session, and no such run.
#[test]
fn an_fp16_file_on_onnx_runtime_is_judged_on_its_outputs_as_deployed() {
    let dir = tempfile::tempdir().unwrap();
    save(&planted_layernorm_at_opset_17(), &dir.path().join("ln17.onnx"));
    let converted = common::layerwise(&["convert", "ln17.onnx", "--to", "fp16", "-o", "ln17_16.onnx"], dir.path());
    assert!(converted.status.success(), "{}", common::text(&converted));
    for (cand, deployed_run) in [("ort:cpu,typed=off", true), ("ort:cpu", false)] {
        let out = common::layerwise(
            &["bisect", "ln17.onnx", "--cand", cand, "--cand-model", "ln17_16.onnx", "--json", "r.json"],
            dir.path(),
        );
        let t = common::text(&out);
        assert!(matches!(out.status.code(), Some(0 | 1)), "{t}");
        let notes = common::json(&dir.path().join("r.json"))["cand"]["notes"].to_string();
        assert_eq!(t.contains("as deployed (outputs only)"), deployed_run, "{cand}: {t}");
        assert_eq!(notes.contains("only its outputs: ONNX Runtime's graph fusions"), deployed_run, "{cand}: {notes}");
    }
}

/// `fix` judges a converted file run by ONNX Runtime on its outputs as deployed, as bisect does:
/// its "before" error of each output is bisect's for the same file, not the exposed run's (which
/// differs where exposing blocks a fusion).
#[test]
fn fix_and_bisect_give_one_output_error_for_a_file_onnx_runtime_runs() {
    let dir = tempfile::tempdir().unwrap();
    save(&planted_layernorm_at_opset_17(), &dir.path().join("ln17.onnx"));
    let cand = "ort:cpu,typed=off";
    let converted = common::layerwise(&["convert", "ln17.onnx", "--to", "fp16", "-o", "ln17_16.onnx"], dir.path());
    assert!(converted.status.success(), "{}", common::text(&converted));
    let bisected = common::layerwise(
        &["bisect", "ln17.onnx", "--cand", cand, "--cand-model", "ln17_16.onnx", "--json", "b.json"],
        dir.path(),
    );
    assert!(matches!(bisected.status.code(), Some(0 | 1)), "{}", common::text(&bisected));
    let fixed = common::layerwise(&["fix", "ln17.onnx", "--cand", cand, "--json", "f.json"], dir.path());
    assert!(matches!(fixed.status.code(), Some(0 | 1)), "{}", common::text(&fixed));
    let b = common::json(&dir.path().join("b.json"));
    let f = common::json(&dir.path().join("f.json"));
    let by_bisect = b["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "out").unwrap()["metrics"]
        ["rel_l2_err"]
        .as_f64()
        .unwrap();
    let by_fix = f["outputs"][0]["before_rel_l2"].as_f64().unwrap();
    assert!((by_bisect - by_fix).abs() <= 1e-2 * by_bisect, "bisect {by_bisect:e}, fix {by_fix:e}");
}
