//! Search marking, introduced vs propagated error, counterfactual checks, memory
//! budget splits and many samples. End to end through ONNX Runtime (found or pip-fetched).

use crate::common;
use crate::common::{breaking_models, planted, planted_layernorm, spec, Ending};
use layerwise::demo::demo_model;
use layerwise::pipeline::{bisect_model, BisectOptions, Marking};
use layerwise_analysis::{run_bound, Status};
use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::{DataType, Model};

fn model(proto: ModelProto, label: &str) -> Model {
    Model::from_proto(proto, label).unwrap()
}

fn options(mark: Marking) -> BisectOptions {
    BisectOptions { mark, ..BisectOptions::new("in-memory", spec("ort:cpu"), spec("sim:fp16")) }
}

#[test]
fn search_marking_finds_the_same_first_divergent_layer_in_few_runs() {
    for (label, proto) in breaking_models() {
        let m = model(proto, label);
        let all = bisect_model(&m, &options(Marking::All)).unwrap().report;
        let search = bisect_model(&m, &options(Marking::Search)).unwrap().report;
        let expected = all.verdict.first_divergent.as_ref().map(|f| f.node.clone());
        assert!(expected.is_some(), "{label}: mark all must find a first divergent layer");
        assert_eq!(search.verdict.first_divergent.as_ref().map(|f| f.node.clone()), expected, "{label}");
        assert_eq!(
            search.verdict.first_divergent.as_ref().map(|f| f.cause.best.kind),
            all.verdict.first_divergent.as_ref().map(|f| f.cause.best.kind),
            "{label}"
        );
        let s = search.extras.search.as_ref().expect("search section");
        let nodes = all.model.node_count;
        assert!(
            s.runs.len() <= run_bound(nodes),
            "{label}: {} candidate runs for {nodes} nodes (bound {})",
            s.runs.len(),
            run_bound(nodes)
        );
        let marked: usize = s.runs.iter().map(|r| r.marked.len()).sum();
        assert!(marked < nodes / 2 || nodes < 20, "{label}: {marked} tensors marked of {nodes}");
        assert!(all.extras.search.is_none());
    }
}

#[test]
fn search_marking_on_a_passing_model_makes_one_run() {
    let m = model(planted(Ending::Healthy), "healthy");
    let report = bisect_model(&m, &options(Marking::Search)).unwrap().report;
    assert_eq!(report.verdict.status, Status::Pass);
    assert_eq!(report.extras.search.as_ref().unwrap().runs.len(), 1);
}

#[test]
fn isolation_separates_the_introducing_node_from_those_that_propagate() {
    // The demo: Pow overflows; everything after it only carries the overflow on.
    let m = model(demo_model(), "demo");
    let report = bisect_model(&m, &options(Marking::All)).unwrap().report;
    let iso = report.extras.isolation.as_ref().expect("isolation section");
    assert_eq!(iso.introducing.as_deref(), Some("encoder/ln/Pow"));
    let role = |n: &str| iso.nodes.iter().find(|l| l.node == n).map(|l| l.role.as_str()).unwrap_or("missing");
    assert_eq!(role("encoder/ln/Pow"), "introduces");
    for n in ["head/MatMul", "head/Add", "encoder/ln/Div", "encoder/ln/Sqrt"] {
        assert_eq!(role(n), "propagates", "{n}");
        let l = iso.nodes.iter().find(|l| l.node == n).unwrap();
        assert!(
            l.local_error < 1e-2 && l.in_model_error > 0.5,
            "{n}: alone {} vs in the model {}",
            l.local_error,
            l.in_model_error
        );
    }
    // The ReduceMean after Pow sees inf alone too, but only because its input is out of range.
    let var = iso.nodes.iter().find(|l| l.node == "encoder/ln/ReduceMean_1").unwrap();
    assert_eq!(var.role, "propagates");
    assert!(var.note.as_deref().unwrap_or("").contains("exceeds the FP16 range"));
}

/// x -> Mul(300) -> Pow(2) (overflows FP16: x² reaches 9e4) -> ReduceMean -> Sqrt (back in range)
/// reaches the output; on a side branch x -> Mul(1e5) overflows to inf, but Clip(max=10) turns
/// inf back into 10, as in the reference: a contained break.
fn contained_break() -> ModelProto {
    let mut b = ModelBuilder::new("contained", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(64)]);
    b.initializer(f32_tensor("k300", &[1], &[300.0]));
    b.initializer(f32_tensor("two", &[], &[2.0]));
    b.initializer(f32_tensor("big", &[1], &[1e5]));
    b.initializer(f32_tensor("lo", &[], &[-10.0]));
    b.initializer(f32_tensor("hi", &[], &[10.0]));
    b.node("Mul", "main/scale", &["x", "k300"], &["s"], vec![]);
    b.node("Pow", "main/Pow", &["s", "two"], &["sq"], vec![]);
    b.node("ReduceMean", "main/mean", &["sq"], &["ms"], vec![attr::ints("axes", &[-1]), attr::int("keepdims", 1)]);
    b.node("Sqrt", "main/rms", &["ms"], &["rms"], vec![]);
    b.node("Mul", "side/blowup", &["x", "big"], &["side"], vec![]);
    b.node("Clip", "side/Clip", &["side", "lo", "hi"], &["clipped"], vec![]);
    b.node("Add", "merge", &["rms", "clipped"], &["out"], vec![]);
    b.output("out", DataType::Float);
    b.build()
}

#[test]
fn counterfactual_tells_the_break_that_matters_from_a_contained_one() {
    let m = model(contained_break(), "contained");
    let report = bisect_model(&m, &options(Marking::All)).unwrap().report;
    assert_eq!(report.verdict.first_divergent.as_ref().unwrap().node, "main/Pow");
    let cf = report.extras.counterfactual.as_ref().expect("counterfactual section");
    let check = |n: &str| cf.checks.iter().find(|c| c.node == n).unwrap_or_else(|| panic!("no check for {n}: {cf:?}"));
    let exp = check("main/Pow");
    assert!(exp.explained > 0.99 && exp.fixes && !exp.contained, "{exp:?}");
    let side = check("side/blowup");
    assert_eq!(side.reason, "non_finite_origin");
    assert!(side.contained && side.explained < 0.1, "{side:?}");
    assert!(cf.conclusion.contains("main/Pow"), "{}", cf.conclusion);
}

#[test]
fn counterfactual_says_drift_when_no_break_explains_the_output() {
    // Softmax amplifies drift: keeping it alone does not remove the drift it amplifies.
    let m = model(planted(Ending::SoftmaxAmplification), "softmax");
    let report = bisect_model(&m, &options(Marking::All)).unwrap().report;
    let cf = report.extras.counterfactual.as_ref().expect("counterfactual section");
    assert!(!cf.checks.is_empty());
    // Keeping the Softmax leaves the drift it amplifies: the error stays.
    let softmax = cf.checks.iter().find(|c| c.node == "head/Softmax").expect("the first divergent node is checked");
    assert!(softmax.contained && softmax.explained < 0.1, "{softmax:?}");
    assert!(cf.checks.iter().all(|c| c.explained < 0.5), "{cf:?}");
    assert!(cf.conclusion.contains("drift plus a sensitive consumer"), "{}", cf.conclusion);
    assert!(cf.conclusion.contains("it grows most at head/Softmax"), "{}", cf.conclusion);
}

#[test]
fn a_memory_budget_splits_runs_and_gives_the_same_results() {
    let m = model(planted_layernorm(), "ln");
    let whole = bisect_model(&m, &options(Marking::All)).unwrap().report;
    assert_eq!(whole.extras.memory.as_ref().map(|m| m.groups), Some(1), "the default budget holds this model at once");
    // Each of the ~55 tensors is 1 KiB; 16 KiB for both sides makes several groups (separate runs:
    // a paired comparison holds no tensors to split).
    let split =
        bisect_model(&m, &BisectOptions { max_memory: Some(16 << 10), separate_runs: true, ..options(Marking::All) })
            .unwrap()
            .report;
    let plan = split.extras.memory.as_ref().expect("memory section");
    assert!(plan.groups >= 4, "{plan:?}");
    assert!(plan.largest_group_bytes <= 8 << 10, "{plan:?}");
    assert_eq!(split.tensors.len(), whole.tensors.len());
    for (a, b) in whole.tensors.iter().zip(&split.tensors) {
        assert_eq!(a.name, b.name);
        // ONNX Runtime fuses differently when fewer tensors are exposed, so the reference itself
        // moves by float32 rounding (~1e-7); counts must be equal and errors equal to that noise.
        let (ma, mb) = (serde_json::to_value(&a.metrics).unwrap(), serde_json::to_value(&b.metrics).unwrap());
        for (key, va) in ma.as_object().unwrap() {
            let vb = &mb[key];
            match (va.as_f64(), vb.as_f64()) {
                (Some(x), Some(y)) if va.is_f64() || vb.is_f64() => {
                    assert!((x - y).abs() <= 1e-3 * x.abs().max(1e-9), "{} {key}: {x} vs {y}", a.name)
                }
                _ => assert_eq!(va, vb, "{} {key}", a.name),
            }
        }
        assert_eq!(a.pass, b.pass, "{}", a.name);
    }
    let shape = |v: &layerwise_analysis::Verdict| {
        (
            v.status,
            v.first_divergent.as_ref().map(|f| (f.node.clone(), f.cause.best.kind)),
            v.chain.iter().map(|c| c.tensor.clone()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(shape(&whole.verdict), shape(&split.verdict), "same verdict split or not");
    assert_eq!(split.verdict.first_divergent.as_ref().unwrap().node, "ln/pow");
    assert!(
        split.first_divergent_detail.as_ref().unwrap().histogram.is_some(),
        "histogram kept from the group that held it"
    );
}

#[test]
fn many_samples_are_aggregated_and_the_triggering_sample_named() {
    let dir = tempfile::tempdir().unwrap();
    // The demo overflows for inputs in [0,1]; scaled down by 100 it does not.
    let write = |name: &str, scale: f32| {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(name.len() as u64);
        let values: Vec<f32> = (0..8 * 64).map(|_| rng.random::<f32>() * scale).collect();
        let x = layerwise_runtime::Tensor::f32(vec![1, 8, 64], values);
        layerwise_runtime::npy::write_npz(&dir.path().join(name), &[("x", &x)]).unwrap();
    };
    write("a_quiet.npz", 0.01);
    write("b_loud.npz", 1.0);
    write("c_quiet.npz", 0.02);
    let m = model(demo_model(), "demo");
    let mut o = options(Marking::All);
    o.inputs.npz = Some(dir.path().to_path_buf());
    let report = bisect_model(&m, &o).unwrap().report;
    let samples = report.extras.samples.as_ref().expect("samples section");
    assert_eq!(samples.count, 3);
    assert_eq!(samples.worst_sample, "b_loud.npz");
    let status: Vec<Status> = samples.runs.iter().map(|r| r.status).collect();
    assert_eq!(status, vec![Status::Pass, Status::Diverged, Status::Pass]);
    assert_eq!(samples.runs[1].first_divergent.as_deref(), Some("encoder/ln/Pow"));
    let pow = samples.tensors.iter().find(|t| t.tensor == "ln_squared").unwrap();
    assert_eq!((pow.worst_sample.as_str(), pow.failing_samples), ("b_loud.npz", 1));
    assert!(pow.worst_error.is_infinite() && pow.mean_error.is_infinite());
    let features = samples.tensors.iter().find(|t| t.tensor == "features").unwrap();
    assert!(features.mean_error <= features.worst_error && features.mean_error > 0.0);
    assert_eq!(
        report.verdict.first_divergent.as_ref().unwrap().node,
        "encoder/ln/Pow",
        "the verdict comes from the loud sample"
    );
    // A folder without samples is an error.
    let empty = tempfile::tempdir().unwrap();
    o.inputs.npz = Some(empty.path().to_path_buf());
    let err = bisect_model(&m, &o).err().expect("no samples").to_string();
    assert!(err.contains("no .npz files"), "{err}");
}

/// x -> Mul(1e6) (overflows FP16) -> 300 Neg nodes -> y: a blame chain of 301 nodes, of which
/// the 128 nearest the first divergent layer are run alone.
fn long_tail_after_an_overflow() -> ModelProto {
    let mut b = ModelBuilder::new("long_tail", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(8)]);
    b.initializer(f32_tensor("k", &[1], &[1e6]));
    b.node("Mul", "scale", &["x", "k"], &["t0"], vec![]);
    for i in 0..300 {
        let out = if i == 299 { "y".to_string() } else { format!("t{}", i + 1) };
        b.node("Neg", &format!("neg{i}"), &[&format!("t{i}")], &[&out], vec![]);
    }
    b.output("y", DataType::Float);
    b.build()
}

#[test]
fn isolation_runs_the_reference_only_up_to_the_chain_nodes_it_runs_alone() {
    let dir = tempfile::tempdir().unwrap();
    common::save(&long_tail_after_an_overflow(), &dir.path().join("m.onnx"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_layerwise"))
        .args(["bisect", "m.onnx", "--json", "r.json", "--quiet"])
        .env("LAYERWISE_TIMING", "1")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // The nodes after the 128 run alone are not run on the reference for them.
    assert!(text.contains("isolation: reference part of 128 of 301 nodes"), "{text}");
    let report = common::json(&dir.path().join("r.json"));
    let iso = &report["isolation"];
    assert_eq!(iso["introducing"], "scale", "{iso}");
    let nodes = iso["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 128);
    // Each Neg alone is fed the reference's values, which it negates exactly.
    for n in nodes.iter().filter(|n| n["node"] != "scale") {
        assert_eq!(n["role"], "propagates", "{n}");
    }
}
