//! The reference's optimized program built in pieces (crates/runtime/src/optimized_pieces.rs)
//! computes every tensor bit for bit as the program ONNX Runtime optimizes whole computes it. Each
//! model is optimized both ways (`LAYERWISE_OPTIMIZE_PIECE_NODES`: 0 whole, 50 in pieces), and the
//! two programs run alone with optimizations disabled and paired in one session, every exposed
//! tensor compared bit for bit.

mod common;

use std::sync::{Arc, Mutex};

use common::{fp16_islands, spec};
use layerwise_model::builder::{attr, f32_tensor, i64_tensor, Dim, ModelBuilder};
use layerwise_model::onnx::ModelProto;
use layerwise_model::{DataType, GraphIndex, Model, Selection};
use layerwise_runtime::inputs::{declared_inputs, prepare_inputs, InputOptions};
use layerwise_runtime::paired::{run_paired, Operand, PairReducer};
use layerwise_runtime::{create_backend, ModelSession, OnnxProgram, OptLevel, RunRequest};

/// The piece size knob is the process's environment: one test at a time sets it.
static KNOB: Mutex<()> = Mutex::new(());

/// Deterministic weights in [-scale, scale).
fn weights(name: &str, dims: &[i64], seed: u64, scale: f32) -> layerwise_model::onnx::TensorProto {
    let n: i64 = dims.iter().product();
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let values: Vec<f32> = (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    f32_tensor(name, dims, &values)
}

/// 300 nodes: Relu, Add of a constant computed once at the start (read in every piece), Sigmoid.
fn relu_chain() -> ModelProto {
    let mut b = ModelBuilder::new("relu-chain", 17);
    b.input("x", DataType::Float, &[Dim::from(4), Dim::from(32)]);
    b.initializer(f32_tensor("half", &[1], &[0.5]));
    b.node(
        "Constant",
        "shift_c",
        &[],
        &["shift_raw"],
        vec![attr::tensor("value", f32_tensor("v", &[32], &[0.01; 32]))],
    );
    b.node("Mul", "shift", &["shift_raw", "half"], &["shift"], vec![]);
    let mut prev = "x".to_string();
    for i in 0..298 {
        let out = format!("t{i}");
        match i % 3 {
            0 => b.node("Relu", &format!("relu{i}"), &[&prev], &[&out], vec![]),
            1 => b.node("Add", &format!("add{i}"), &[&prev, "shift"], &[&out], vec![]),
            _ => b.node("Sigmoid", &format!("sigmoid{i}"), &[&prev], &[&out], vec![]),
        };
        prev = out;
    }
    b.output(&prev, DataType::Float);
    b.build()
}

/// `blocks` pre-LayerNorm decoder blocks on x[8,16] (decomposed LayerNorm, single-head
/// attention with Softmax, Erf GELU FFN, residuals; about 40 nodes a block), as
/// scripts/bench/make_decoder.py builds them. Each block's output projection is a constant
/// (Transpose of a weight) and the attention scale one constant computed at the start.
fn decoder(blocks: usize) -> ModelProto {
    const H: i64 = 16;
    let mut b = ModelBuilder::new("decoder", 17);
    b.input("x", DataType::Float, &[Dim::from(8), Dim::from(H)]);
    for (name, v) in [("eps", 1e-5), ("one", 1.0), ("half", 0.5), ("sqrt2", std::f32::consts::SQRT_2)] {
        b.initializer(f32_tensor(name, &[1], &[v]));
    }
    b.node(
        "Constant",
        "scale_c",
        &[],
        &["sqrt_h"],
        vec![attr::tensor("value", f32_tensor("v", &[1], &[(H as f32).sqrt()]))],
    );
    b.node("Div", "scale", &["one", "sqrt_h"], &["attn_scale"], vec![]);
    let layer_norm = |b: &mut ModelBuilder, p: &str, x: &str, seed: u64| -> String {
        b.initializer(weights(&format!("{p}_gamma"), &[H], seed, 1.0));
        b.initializer(weights(&format!("{p}_beta"), &[H], seed + 1, 0.1));
        let t = |s: &str| format!("{p}_{s}");
        b.node("ReduceMean", &t("mean"), &[x], &[&t("mean")], vec![attr::ints("axes", &[-1])]);
        b.node("Sub", &t("sub"), &[x, &t("mean")], &[&t("d")], vec![]);
        b.node("Mul", &t("sq"), &[&t("d"), &t("d")], &[&t("sq")], vec![]);
        b.node("ReduceMean", &t("var"), &[&t("sq")], &[&t("var")], vec![attr::ints("axes", &[-1])]);
        b.node("Add", &t("ve"), &[&t("var"), "eps"], &[&t("ve")], vec![]);
        b.node("Sqrt", &t("sd"), &[&t("ve")], &[&t("sd")], vec![]);
        b.node("Div", &t("n"), &[&t("d"), &t("sd")], &[&t("n")], vec![]);
        b.node("Mul", &t("g"), &[&t("n"), &t("gamma")], &[&t("g")], vec![]);
        b.node("Add", &t("out"), &[&t("g"), &t("beta")], &[&t("out")], vec![]);
        t("out")
    };
    let mut x = "x".to_string();
    for k in 0..blocks {
        let p = format!("b{k}");
        let t = |s: &str| format!("{p}_{s}");
        let seed = 100 * k as u64;
        let ln = layer_norm(&mut b, &t("ln1"), &x, seed);
        for (i, w) in ["wq", "wk", "wv", "wo_t"].iter().enumerate() {
            b.initializer(weights(&t(w), &[H, H], seed + 10 + i as u64, 0.3));
        }
        b.node("Transpose", &t("wo"), &[&t("wo_t")], &[&t("wo")], vec![attr::ints("perm", &[1, 0])]);
        b.node("MatMul", &t("q"), &[&ln, &t("wq")], &[&t("q")], vec![]);
        b.node("MatMul", &t("k"), &[&ln, &t("wk")], &[&t("k")], vec![]);
        b.node("MatMul", &t("v"), &[&ln, &t("wv")], &[&t("v")], vec![]);
        b.node("Transpose", &t("kt"), &[&t("k")], &[&t("kt")], vec![attr::ints("perm", &[1, 0])]);
        b.node("MatMul", &t("s"), &[&t("q"), &t("kt")], &[&t("s")], vec![]);
        b.node("Mul", &t("ss"), &[&t("s"), "attn_scale"], &[&t("ss")], vec![]);
        b.node("Softmax", &t("p"), &[&t("ss")], &[&t("p")], vec![attr::int("axis", -1)]);
        b.node("MatMul", &t("a"), &[&t("p"), &t("v")], &[&t("a")], vec![]);
        b.node("MatMul", &t("o"), &[&t("a"), &t("wo")], &[&t("o")], vec![]);
        b.node("Add", &t("r1"), &[&x, &t("o")], &[&t("r1")], vec![]);
        let ln2 = layer_norm(&mut b, &t("ln2"), &t("r1"), seed + 50);
        b.initializer(weights(&t("w1"), &[H, 2 * H], seed + 60, 0.3));
        b.initializer(weights(&t("b1"), &[2 * H], seed + 61, 0.1));
        b.initializer(weights(&t("w2"), &[2 * H, H], seed + 62, 0.3));
        b.node("MatMul", &t("h"), &[&ln2, &t("w1")], &[&t("h")], vec![]);
        b.node("Add", &t("hb"), &[&t("h"), &t("b1")], &[&t("hb")], vec![]);
        b.node("Div", &t("hd"), &[&t("hb"), "sqrt2"], &[&t("hd")], vec![]);
        b.node("Erf", &t("erf"), &[&t("hd")], &[&t("erf")], vec![]);
        b.node("Add", &t("e1"), &[&t("erf"), "one"], &[&t("e1")], vec![]);
        b.node("Mul", &t("gm"), &[&t("hb"), &t("e1")], &[&t("gm")], vec![]);
        b.node("Mul", &t("gelu"), &[&t("gm"), "half"], &[&t("gelu")], vec![]);
        b.node("MatMul", &t("f"), &[&t("gelu"), &t("w2")], &[&t("f")], vec![]);
        b.node("Add", &t("r2"), &[&t("r1"), &t("f")], &[&t("r2")], vec![]);
        x = t("r2");
    }
    b.output(&x, DataType::Float);
    b.build()
}

/// x[1,16,12,12] -> `blocks` x (Conv 3x3 -> BatchNormalization -> Relu -> Conv 3x3 with a weight
/// computed once at the start from constants (read in every piece) -> Add residual). ONNX
/// Runtime's CPU optimizer (x86 with AVX2) turns the convolutions into blocked-layout ones with
/// reordered weights and layout reorders, names it makes up in every piece; only a constant
/// weight is reordered, so a piece fed that weight at its border instead of computing it would
/// run the plain kernel, whose sums round differently.
fn conv_network(blocks: usize) -> ModelProto {
    const C: i64 = 16;
    let mut b = ModelBuilder::new("convnet", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(C), Dim::from(12), Dim::from(12)]);
    b.initializer(weights("mix_raw", &[C, C, 3, 3], 7, 0.5));
    b.initializer(f32_tensor("mix_scale", &[1], &[0.25]));
    b.node("Mul", "mix", &["mix_raw", "mix_scale"], &["mix_w"], vec![]);
    let mut x = "x".to_string();
    for k in 0..blocks {
        let t = |s: &str| format!("c{k}_{s}");
        let seed = 1000 + 10 * k as u64;
        b.initializer(weights(&t("w"), &[C, C, 3, 3], seed, 0.2));
        b.initializer(weights(&t("b"), &[C], seed + 1, 0.1));
        b.initializer(weights(&t("bn_scale"), &[C], seed + 2, 1.0));
        b.initializer(weights(&t("bn_bias"), &[C], seed + 3, 0.1));
        b.initializer(weights(&t("bn_mean"), &[C], seed + 4, 0.1));
        b.initializer(f32_tensor(&t("bn_var"), &[C], &[1.5; C as usize]));
        b.node("Conv", &t("conv"), &[&x, &t("w"), &t("b")], &[&t("conv")], vec![attr::ints("pads", &[1, 1, 1, 1])]);
        b.node(
            "BatchNormalization",
            &t("bn"),
            &[&t("conv"), &t("bn_scale"), &t("bn_bias"), &t("bn_mean"), &t("bn_var")],
            &[&t("bn")],
            vec![],
        );
        b.node("Relu", &t("relu"), &[&t("bn")], &[&t("relu")], vec![]);
        b.node("Conv", &t("mix"), &[&t("relu"), "mix_w"], &[&t("mix")], vec![attr::ints("pads", &[1, 1, 1, 1])]);
        b.node("Add", &t("res"), &[&x, &t("mix")], &[&t("res")], vec![]);
        x = t("res");
    }
    b.output(&x, DataType::Float);
    b.build()
}

/// A Relu chain whose input's shape, taken at the start, reshapes its end: an int64 value crosses
/// every border, so the graph is optimized whole.
fn shape_across() -> ModelProto {
    let mut b = ModelBuilder::new("shape-across", 17);
    b.input("x", DataType::Float, &[Dim::from(4), Dim::from(32)]);
    b.initializer(i64_tensor("flat", &[1], &[-1]));
    b.node("Shape", "shape", &["x"], &["shape"], vec![]);
    b.node("Reshape", "flatten", &["x", "flat"], &["t0"], vec![]);
    let mut prev = "t0".to_string();
    for i in 1..200 {
        b.node("Relu", &format!("relu{i}"), &[&prev], &[&format!("t{i}")], vec![]);
        prev = format!("t{i}");
    }
    b.node("Reshape", "unflatten", &[&prev, "shape"], &["out"], vec![]);
    b.output("out", DataType::Float);
    b.build()
}

/// Every pair whose two sides are not the same bits.
#[derive(Default)]
struct BitForBit {
    differing: Mutex<Vec<String>>,
}

impl PairReducer for BitForBit {
    fn reduce(&self, tensor: &str, reference: Operand<'_>, candidate: Operand<'_>) {
        let same = reference.shape == candidate.shape
            && reference.dtype == candidate.dtype
            && reference.values.len() == candidate.values.len()
            && reference.values.iter().zip(candidate.values.iter()).all(|(a, b)| a.to_bits() == b.to_bits());
        if !same {
            self.differing.lock().unwrap().push(tensor.to_string());
        }
    }
}

/// The reference's program for `model` (`ort:cpu`, every tensor exposed), optimized with the
/// piece size `piece_nodes` (0: whole).
fn reference_program(
    model: &Model,
    index: &GraphIndex,
    feeds: &[(String, layerwise_runtime::Tensor)],
    piece_nodes: usize,
) -> OnnxProgram {
    std::env::set_var("LAYERWISE_OPTIMIZE_PIECE_NODES", piece_nodes.to_string());
    let request = RunRequest { model, index, inputs: feeds, selection: &Selection::All };
    let program = create_backend(&spec("ort:cpu")).unwrap().onnx_program(&request).unwrap().unwrap();
    std::env::remove_var("LAYERWISE_OPTIMIZE_PIECE_NODES");
    program
}

fn in_pieces(program: &OnnxProgram) -> Option<&String> {
    program.notes.iter().find(|n| n.starts_with("optimized by ONNX Runtime in "))
}

/// The tensors of `program` that differ from `other`'s bit for bit, each run alone with
/// optimizations disabled, as a paired session runs them.
fn differing_alone(
    model: &Model,
    program: &OnnxProgram,
    other: &OnnxProgram,
    feeds: &[(String, layerwise_runtime::Tensor)],
) -> Vec<String> {
    let run = |p: &OnnxProgram| {
        ModelSession::cpu_at(model, &p.proto, "ort:cpu", OptLevel::Disable).unwrap().run(feeds).unwrap()
    };
    let (a, b) = (run(program), run(other));
    assert_eq!(a.len(), b.len());
    let mut differing: Vec<String> = a
        .iter()
        .filter(|(name, t)| {
            b.get(*name)
                .is_none_or(|u| u.dtype() != t.dtype() || u.shape != t.shape || u.to_le_bytes() != t.to_le_bytes())
        })
        .map(|(name, _)| name.clone())
        .collect();
    differing.sort();
    differing
}

#[test]
fn the_reference_optimized_in_pieces_computes_every_tensor_as_the_whole_optimized_does() {
    let _knob = KNOB.lock().unwrap_or_else(|e| e.into_inner());
    let models = [
        ("relu chain", relu_chain()),
        ("decoder", decoder(10)),
        ("conv network", conv_network(40)),
        ("FP16 islands", fp16_islands(40)),
    ];
    for (label, proto) in models {
        let model = Model::from_proto(proto, label).unwrap();
        let index = GraphIndex::build(model.graph()).unwrap();
        let inputs = prepare_inputs(&declared_inputs(&model, &index), &InputOptions::default()).unwrap();
        let feeds: Vec<_> = inputs.iter().map(|i| (i.name.clone(), i.tensor.clone())).collect();
        let whole = reference_program(&model, &index, &feeds, 0);
        let pieces = reference_program(&model, &index, &feeds, 50);
        assert!(in_pieces(&whole).is_none(), "{label}: {:?}", whole.notes);
        let note = in_pieces(&pieces).unwrap_or_else(|| panic!("{label}: not optimized in pieces: {:?}", pieces.notes));
        let count: usize = note["optimized by ONNX Runtime in ".len()..].split(' ').next().unwrap().parse().unwrap();
        assert!(count >= 3, "{label}: {note}");
        let order: Vec<String> = index.computed_tensors().map(str::to_string).collect();
        assert_eq!(pieces.proto.graph.as_ref().unwrap().output.len(), order.len(), "{label}");
        let differing = differing_alone(&model, &whole, &pieces, &feeds);
        assert!(
            differing.is_empty(),
            "{label}: {} of {} tensors differ: {:?}",
            differing.len(),
            order.len(),
            &differing[..differing.len().min(10)]
        );
        // And paired with the whole program in one session, as a bisect runs it. Not the FP16
        // model: its whole program names the Casts ONNX Runtime inserted, and a paired session
        // of it does not compute what it computes alone (whole against whole differs too).
        if label == "FP16 islands" {
            continue;
        }
        let same = Arc::new(BitForBit::default());
        let run = run_paired(&model, whole, pieces, &order, &feeds, same.clone()).unwrap();
        assert!(run.unavailable.is_empty(), "{label}: {:?}", run.unavailable);
        assert_eq!(run.paired.len(), order.len(), "{label}");
        let differing = same.differing.lock().unwrap();
        assert!(
            differing.is_empty(),
            "{label}: paired, {} of {} tensors differ: {:?}",
            differing.len(),
            order.len(),
            &differing[..differing.len().min(10)]
        );
    }
}

#[test]
fn a_graph_with_a_shape_value_across_every_border_is_optimized_whole() {
    let _knob = KNOB.lock().unwrap_or_else(|e| e.into_inner());
    let model = Model::from_proto(shape_across(), "shape across").unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let inputs = prepare_inputs(&declared_inputs(&model, &index), &InputOptions::default()).unwrap();
    let feeds: Vec<_> = inputs.iter().map(|i| (i.name.clone(), i.tensor.clone())).collect();
    let program = reference_program(&model, &index, &feeds, 50);
    assert!(in_pieces(&program).is_none(), "{:?}", program.notes);
    assert_eq!(program.proto.graph.as_ref().unwrap().output.len(), index.computed_tensors().count());
}
