//! Fixes that hold in the written model (issue: fixes that hold on the GPU): the emulation of a
//! keep list rounds at island edges as the converted model casts there, and the typed evaluation
//! of the written file, which shares no code with the emulation, is what `fix`'s FIXED stands on.

use std::collections::{HashMap, HashSet};

use crate::common;
use crate::common::{json, layerwise, save, spec};
use layerwise_model::builder::{attr, f32_tensor, i64_tensor, Dim, ModelBuilder};
use layerwise_model::convert::{convert_fp16, float_tensor_set, ConvertOptions};
use layerwise_model::onnx::ModelProto;
use layerwise_model::{emulate, expose, DataType, GraphIndex, Model, Rounding, Selection};
use layerwise_runtime::typed::TypedBackend;
use layerwise_runtime::{create_backend, float32_tensors, Backend, RunRequest, Tensor};

/// x[1,256] in [-30,30] -> a LayerNorm written as E[x^2] - E[x]^2, as JAX exports it: the
/// ReduceSum of squares reaches about 7.7e4 (beyond FP16's 65504) while its mean (the Mul by 1/N)
/// is about 300.
fn sum_of_squares_layernorm() -> ModelProto {
    let mut b = ModelBuilder::new("ex2-layernorm", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(256)]);
    b.initializer(i64_tensor("axes", &[1], &[-1]));
    b.initializer(f32_tensor("inv_n", &[], &[1.0 / 256.0]));
    b.initializer(f32_tensor("eps", &[], &[1e-6]));
    b.node("Mul", "square", &["x", "x"], &["sq"], vec![]);
    b.node("ReduceSum", "sum_sq", &["sq", "axes"], &["s"], vec![attr::int("keepdims", 1)]);
    b.node("Mul", "mean_sq", &["s", "inv_n"], &["ms"], vec![]);
    b.node("ReduceMean", "mean", &["x"], &["m"], vec![attr::ints("axes", &[-1]), attr::int("keepdims", 1)]);
    b.node("Mul", "mean_squared", &["m", "m"], &["m2"], vec![]);
    b.node("Sub", "var", &["ms", "m2"], &["v"], vec![]);
    b.node("Add", "var_eps", &["v", "eps"], &["ve"], vec![]);
    b.node("Sqrt", "std", &["ve"], &["sd"], vec![]);
    b.node("Sub", "center", &["x", "m"], &["c"], vec![]);
    b.node("Div", "normalize", &["c", "sd"], &["out"], vec![]);
    b.output("out", DataType::Float);
    b.build()
}

fn input() -> Vec<(String, Tensor)> {
    let values: Vec<f32> = (0..256).map(|i| -30.0 + 60.0 * ((i * 37) % 256) as f32 / 255.0).collect();
    vec![("x".into(), Tensor::new(vec![1, 256], layerwise_runtime::TensorData::F32(values)))]
}

fn as_f32(t: &Tensor) -> Vec<f32> {
    t.to_f32().into_owned()
}

fn keep_indices(index: &GraphIndex, names: &[&str]) -> HashSet<usize> {
    names.iter().map(|n| index.node(n).unwrap().proto_index).collect()
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        num += ((*x as f64) - (*y as f64)).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den).sqrt()
}

/// Every tensor of the emulated model (the reference's names) after one run.
fn run_emulation(proto: ModelProto) -> HashMap<String, Tensor> {
    let emulated = Model::from_proto(proto, "emulated").unwrap();
    let index = GraphIndex::build(emulated.graph()).unwrap();
    let mut cpu = create_backend(&spec("ort:cpu,opt=disable")).unwrap();
    cpu.run(&RunRequest { model: &emulated, index: &index, inputs: &input(), selection: &Selection::All })
        .unwrap()
        .tensors
}

fn emulated_with(model: &Model, keep: &[&str]) -> ModelProto {
    let index = GraphIndex::build(model.graph()).unwrap();
    let float = float32_tensors(model, &index).unwrap();
    let (exposed, _) = expose(&model.proto, &index, &Selection::All).unwrap();
    emulate(model, &exposed, &float, &keep_indices(&index, keep), Rounding::Fp16).unwrap().proto
}

/// The model converted with `keep` in FP32, evaluated in its own types: every tensor.
fn typed_run_of_written(model: &Model, keep: &[&str]) -> HashMap<String, Tensor> {
    let index = GraphIndex::build(model.graph()).unwrap();
    let float = float_tensor_set(model, &float32_tensors(model, &index).unwrap());
    let options = ConvertOptions { keep_nodes: keep.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    let conversion = convert_fp16(model, &index, &float, &options).unwrap();
    let written = Model::from_proto(conversion.proto, "written").unwrap();
    let wi = GraphIndex::build(written.graph()).unwrap();
    let mut typed = TypedBackend::new(&spec("ort:cpu"), None);
    typed
        .run(&RunRequest { model: &written, index: &wi, inputs: &input(), selection: &Selection::All })
        .unwrap()
        .tensors
}

fn reference(model: &Model) -> Vec<f32> {
    let index = GraphIndex::build(model.graph()).unwrap();
    let mut cpu = create_backend(&spec("ort:cpu")).unwrap();
    as_f32(
        &cpu.run(&RunRequest { model, index: &index, inputs: &input(), selection: &Selection::All }).unwrap().tensors
            ["out"],
    )
}

#[test]
fn a_kept_reduce_sum_whose_fp32_output_overflows_at_the_island_edge_is_no_fix() {
    let model = Model::from_proto(sum_of_squares_layernorm(), "test").unwrap();
    let want = reference(&model);
    let err = |tensors: &HashMap<String, Tensor>| {
        let out = as_f32(&tensors["out"]);
        if out.iter().any(|v| !v.is_finite()) {
            f64::INFINITY
        } else {
            rel_l2(&out, &want)
        }
    };
    // Nothing kept: the sum overflows FP16.
    assert!(err(&run_emulation(emulated_with(&model, &[]))) > 0.5);
    // Keeping the ReduceSum alone: its float32 sum (7.7e4) is cast to FP16 for the Mul by 1/N,
    // in the written model and now in the emulation.
    let only_sum = run_emulation(emulated_with(&model, &["sum_sq"]));
    assert!(only_sum["s"].to_f32().iter().all(|v| v.is_finite() && *v > 65504.0), "the kept sum itself stays float32");
    assert!(err(&only_sum) > 0.5, "keep {{ReduceSum}} must fail in the emulation: rel L2 {}", err(&only_sum));
    assert!(err(&typed_run_of_written(&model, &["sum_sq"])) > 0.5, "and in the written model's own types");
    // Keeping the ReduceSum and its consumer: the edge carries about 300.
    let with_mul = run_emulation(emulated_with(&model, &["sum_sq", "mean_sq"]));
    assert!(err(&with_mul) < 1e-2, "keep {{ReduceSum, Mul}} passes: rel L2 {}", err(&with_mul));

    // Every tensor of the emulation equals the written model's, as the typed evaluation gives it.
    for keep in [&["sum_sq"][..], &["sum_sq", "mean_sq"][..], &[][..]] {
        let emulated = run_emulation(emulated_with(&model, keep));
        let typed = typed_run_of_written(&model, keep);
        let index = GraphIndex::build(model.graph()).unwrap();
        for name in index.computed_tensors() {
            let (e, t) = (as_f32(&emulated[name]), as_f32(&typed[name]));
            let same = e.iter().zip(&t).all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
            assert!(
                same,
                "keep {keep:?}: tensor '{name}' differs: emulated {:?} typed {:?}",
                &e[..4.min(e.len())],
                &t[..4.min(t.len())]
            );
        }
    }
}

#[test]
fn without_the_edge_rule_the_emulation_passes_a_keep_list_the_typed_check_rejects() {
    let model = Model::from_proto(sum_of_squares_layernorm(), "test").unwrap();
    let want = reference(&model);
    // The edge rule reverted by hand: readers of the rounded edge copy read the float32 value.
    let mut reverted = emulated_with(&model, &["sum_sq"]);
    let graph = reverted.graph.as_mut().unwrap();
    let mut reverted_reads = 0;
    for node in graph.node.iter_mut() {
        for input in node.input.iter_mut() {
            if let Some(original) = input.strip_suffix("__lw_edge") {
                *input = original.to_string();
                reverted_reads += 1;
            }
        }
    }
    assert_eq!(reverted_reads, 1, "one edge (the ReduceSum's output read by the Mul)");
    let old = as_f32(&run_emulation(reverted)["out"]);
    assert!(rel_l2(&old, &want) < 1e-2, "the old emulation passed {{ReduceSum}}: rel L2 {}", rel_l2(&old, &want));
    let written = as_f32(&typed_run_of_written(&model, &["sum_sq"])["out"]);
    assert!(
        written.iter().any(|v| !v.is_finite()) || rel_l2(&written, &want) > 0.5,
        "the typed check of the written model fails it"
    );
}

#[test]
fn fix_keeps_the_sum_and_its_consumer_and_its_check_is_the_typed_evaluation() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("ln.onnx");
    save(&sum_of_squares_layernorm(), &model);
    let out =
        layerwise(&["fix", "ln.onnx", "--val-range", "x:-30,30", "-o", "fixed.onnx", "--json", "fix.json"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", common::text(&out));
    let fix = json(&dir.path().join("fix.json"));
    let keep: Vec<&str> = fix["keep_fp32"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(keep.contains(&"sum_sq") && keep.contains(&"mean_sq"), "keep list {keep:?}");
    assert_eq!(fix["fixed_model_check"]["pass"], true);
    assert!(
        fix["fixed_model_check"]["backend"].as_str().unwrap().starts_with("typed evaluation"),
        "{}",
        fix["fixed_model_check"]
    );
}

#[test]
fn a_converted_fp16_model_on_ort_cpu_is_evaluated_in_its_own_types() {
    // The README's workflow: convert, then compare the converted file on ort:cpu. The LayerNorm's
    // sum overflows FP16; ONNX Runtime's CPU provider alone would compute it in float32 and pass.
    let dir = tempfile::tempdir().unwrap();
    save(&sum_of_squares_layernorm(), &dir.path().join("ln.onnx"));
    let c = layerwise(&["convert", "ln.onnx", "--to", "fp16", "-o", "c.onnx"], dir.path());
    assert_eq!(c.status.code(), Some(0), "{}", common::text(&c));
    let args = [
        "bisect",
        "ln.onnx",
        "--val-range",
        "x:-30,30",
        "--cand",
        "ort:cpu",
        "--cand-model",
        "c.onnx",
        "--json",
        "r.json",
    ];
    let out = layerwise(&args, dir.path());
    assert_eq!(out.status.code(), Some(1), "diverges in its own types: {}", common::text(&out));
    let report = json(&dir.path().join("r.json"));
    let notes = report["candidate_run"]["notes"].to_string() + &report.to_string();
    assert!(notes.contains("typed evaluation"), "the report says how the candidate ran");
    // typed=off is ONNX Runtime's whole-model run, which computes the FP16 model in float32.
    let old = layerwise(
        &["bisect", "ln.onnx", "--val-range", "x:-30,30", "--cand", "ort:cpu,typed=off", "--cand-model", "c.onnx"],
        dir.path(),
    );
    assert_eq!(old.status.code(), Some(0), "ONNX Runtime's CPU provider hides the overflow: {}", common::text(&old));
}
