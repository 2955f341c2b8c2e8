//! An emulating candidate (sim:fp16) with a keep list, computed by re-running only what the keep
//! list changes (in pieces, fed at their border with an earlier run's values), must give every
//! tensor bit for bit as the whole model run with that keep list does.

use std::collections::HashMap;

use layerwise::keep::{HeldRun, KeepRunner};
use layerwise_model::builder::{attr, f32_tensor, Dim, ModelBuilder};
use layerwise_model::{DataType, GraphIndex, Model, Selection};
use layerwise_runtime::{create_backend, BackendSpec, Tensor, TensorData};

/// Blocks in the model; those in `OVERFLOWING` exceed FP16's range in their FFN.
const BLOCKS: usize = 14;
const OVERFLOWING: [usize; 3] = [2, 6, 11];

/// x[1,16] -> BLOCKS residual blocks (a drifting Mul/Add chain, then MatMul -> Erf -> Mul ->
/// MatMul added back; one weight shared by every block), more than one piece of nodes. Beside the
/// chain: a Shape and a Cast reading an overflowing tensor (readers an island edge does not round),
/// and a second output taken early ('early'), which later keep lists do not reach.
fn blocks_model() -> Model {
    let mut b = ModelBuilder::new("blocks", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(16)]);
    b.initializer(f32_tensor("shared", &[16], &(0..16).map(|i| 1.0 + 0.001 * i as f32).collect::<Vec<_>>()));
    let mut x = "x".to_string();
    for k in 0..BLOCKS {
        let p = format!("b{k}");
        let mut h = x.clone();
        for s in 0..16 {
            let (w, c, m, a) = (format!("{p}/w{s}"), format!("{p}/c{s}"), format!("{p}/m{s}"), format!("{p}/a{s}"));
            b.initializer(f32_tensor(&w, &[1], &[1.0 + 0.0001 * s as f32]));
            b.initializer(f32_tensor(&c, &[1], &[0.0]));
            b.node("Mul", &format!("{p}/Mul_{s}"), &[&h, &w], &[&m], vec![]);
            b.node("Add", &format!("{p}/Add_{s}"), &[&m, &c], &[&a], vec![]);
            h = a;
        }
        let scale = if OVERFLOWING.contains(&k) { 130000.0 } else { 0.1 };
        let w1: Vec<f32> = (0..16 * 32).map(|i| scale * (((i * 37 + k * 11) % 17) as f32 / 17.0 - 0.45)).collect();
        let w2: Vec<f32> = (0..32 * 16)
            .map(|i| {
                (if OVERFLOWING.contains(&k) { 1e-6 } else { 0.05 }) * (((i * 29 + k * 7) % 13) as f32 / 13.0 - 0.5)
            })
            .collect();
        b.initializer(f32_tensor(&format!("{p}/W1"), &[16, 32], &w1));
        b.initializer(f32_tensor(&format!("{p}/W2"), &[32, 16], &w2));
        let names = |s: &str| format!("{p}/{s}");
        b.node("Mul", &names("scale_in"), &[&h, "shared"], &[&names("hs")], vec![]);
        b.node("MatMul", &names("ffn_in"), &[&names("hs"), &names("W1")], &[&names("u")], vec![]);
        b.node("Erf", &names("erf"), &[&names("u")], &[&names("e")], vec![]);
        b.node("Mul", &names("gelu"), &[&names("u"), &names("e")], &[&names("g")], vec![]);
        b.node("MatMul", &names("ffn_out"), &[&names("g"), &names("W2")], &[&names("f")], vec![]);
        b.node("Add", &names("residual"), &[&x, &names("f")], &[&names("out")], vec![]);
        if k == OVERFLOWING[0] {
            b.node("Shape", &names("shape"), &[&names("u")], &[&names("u_shape")], vec![]);
            b.node(
                "Cast",
                &names("cast"),
                &[&names("u")],
                &[&names("u_f64")],
                vec![attr::int("to", DataType::Double as i64)],
            );
            b.node(
                "Cast",
                &names("cast_back"),
                &[&names("u_f64")],
                &[&names("u_back")],
                vec![attr::int("to", DataType::Float as i64)],
            );
            b.node(
                "ReduceMax",
                &names("u_max"),
                &[&names("u_back")],
                &[&names("u_peak")],
                vec![attr::int("keepdims", 0)],
            );
        }
        if k == 1 {
            b.node("Identity", "early_out", &[&names("out")], &["early"], vec![]);
        }
        x = names("out");
    }
    b.node("Identity", "final", &[&x], &["y"], vec![]);
    b.node("Add", "peak_out", &[&format!("b{}/u_peak", OVERFLOWING[0]), "b0/c0"], &["peak"], vec![]);
    b.output("y", DataType::Float);
    b.output("early", DataType::Float);
    b.output("peak", DataType::Float);
    Model::from_proto(b.build(), "blocks").unwrap()
}

fn feeds() -> Vec<(String, Tensor)> {
    let x: Vec<f32> = (0..16).map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.4).collect();
    vec![("x".to_string(), Tensor::new(vec![1, 16], TensorData::F32(x)))]
}

/// The nodes of block `k`'s FFN.
fn ffn(k: usize) -> Vec<String> {
    ["scale_in", "ffn_in", "erf", "gelu", "ffn_out"].iter().map(|n| format!("b{k}/{n}")).collect()
}

/// Equal as bits: same names, types, shapes and values (NaN payloads included).
fn assert_same(what: &str, whole: &HashMap<String, Tensor>, part: &HashMap<String, Tensor>) {
    let mut names: Vec<&String> = whole.keys().collect();
    names.sort();
    let mut other: Vec<&String> = part.keys().collect();
    other.sort();
    assert_eq!(names, other, "{what}: the tensors returned differ");
    for n in names {
        let (w, p) = (&whole[n], &part[n]);
        assert_eq!((w.dtype(), &w.shape), (p.dtype(), &p.shape), "{what}: {n}");
        let bits = |t: &Tensor| t.to_f32().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(w), bits(p), "{what}: tensor '{n}' differs");
    }
}

fn candidate() -> Box<dyn layerwise_runtime::Backend> {
    create_backend(&BackendSpec::parse("sim:fp16").unwrap()).unwrap()
}

#[test]
fn every_tensor_computed_from_an_earlier_run_equals_the_whole_model_run() {
    let model = blocks_model();
    let index = GraphIndex::build(model.graph()).unwrap();
    assert!(index.nodes.len() > 2 * 256, "the model spans several pieces: {} nodes", index.nodes.len());
    let feeds = feeds();
    let mut cand = candidate();
    let mut keeper = KeepRunner::new(&model, &index, cand.as_mut());
    let whole = |keeper: &mut KeepRunner, cand: &mut Box<dyn layerwise_runtime::Backend>, keep: &[String]| {
        keeper.run(cand.as_mut(), keep, &feeds, &Selection::All).unwrap().tensors
    };
    let nothing = whole(&mut keeper, &mut cand, &[]);
    // The overflow propagates: the run with nothing kept is not the one with keep lists below.
    assert!(nothing["y"].to_f32().iter().any(|v| !v.is_finite()));
    let first = ffn(OVERFLOWING[0]);
    let two: Vec<String> = ffn(OVERFLOWING[0]).into_iter().chain(ffn(OVERFLOWING[1])).collect();
    let all: Vec<String> = OVERFLOWING.iter().flat_map(|&k| ffn(k)).collect();
    let late_and_shape: Vec<String> = ffn(OVERFLOWING[2])
        .into_iter()
        .chain([format!("b{}/shape", OVERFLOWING[0]), format!("b{}/cast", OVERFLOWING[0]), "b0/Mul_0".to_string()])
        .collect();
    // With no run held every node runs, in pieces.
    let pieced = keeper.run_all_from(cand.as_mut(), &[], &feeds, &[]).unwrap().expect("an emulation runs by pieces");
    assert_same("nothing kept, every piece", &nothing, &pieced.into_tensors());
    let held_nothing = HeldRun::whole(&mut keeper, &[], nothing.clone());
    let mut held_all = None;
    for keep in [&first, &two, &all, &late_and_shape] {
        let expected = whole(&mut keeper, &mut cand, keep);
        let from_nothing = keeper
            .run_all_from(cand.as_mut(), keep, &feeds, std::slice::from_ref(&held_nothing))
            .unwrap()
            .expect("computed by parts");
        assert_same(&format!("{keep:?} from nothing kept"), &expected, &from_nothing.into_tensors());
        // From a run with another keep list: what either keeps runs again.
        if let Some(held) = &held_all {
            let from_other = keeper
                .run_all_from(cand.as_mut(), keep, &feeds, std::slice::from_ref(held))
                .unwrap()
                .expect("computed by parts");
            assert_same(&format!("{keep:?} from every overflow kept"), &expected, &from_other.into_tensors());
        }
        if keep == &all {
            held_all = Some(HeldRun::whole(&mut keeper, keep, expected));
        }
    }
    // Keeping something removed again: from every overflow kept back to the first only.
    let expected = whole(&mut keeper, &mut cand, &first);
    let back = keeper
        .run_all_from(cand.as_mut(), &first, &feeds, std::slice::from_ref(held_all.as_ref().unwrap()))
        .unwrap()
        .unwrap();
    assert_same("first only, from all kept", &expected, &back.into_tensors());
}

#[test]
fn outputs_computed_from_a_shared_prefix_equal_the_whole_model_run() {
    let model = blocks_model();
    let index = GraphIndex::build(model.graph()).unwrap();
    let feeds = feeds();
    let mut cand = candidate();
    let mut keeper = KeepRunner::new(&model, &index, cand.as_mut());
    let checks: Vec<Vec<String>> = vec![
        ffn(OVERFLOWING[1]),
        ffn(OVERFLOWING[0]),
        OVERFLOWING.iter().flat_map(|&k| ffn(k)).collect(),
        ffn(OVERFLOWING[2]),
    ];
    // No tensor held (a paired comparison): the baseline fills in as the checks need it.
    let mut baseline = HeldRun::nothing_yet(&mut keeper, &[]);
    // The comparison's candidate tensors (separate runs) held.
    let comparison = keeper.run(cand.as_mut(), &[], &feeds, &Selection::All).unwrap().tensors;
    let mut of_comparison = HeldRun::of_comparison(&comparison);
    for keep in &checks {
        let expected = keeper.run(cand.as_mut(), keep, &feeds, &Selection::Names(Vec::new())).unwrap().tensors;
        assert_eq!(expected.len(), 3, "the model's outputs");
        let (part, rerun) =
            keeper.outputs_from(cand.as_mut(), keep, &feeds, &mut baseline).unwrap().expect("computed by parts");
        assert_same(&format!("{keep:?}, baseline filled in"), &expected, &part.tensors);
        assert!(rerun > 0 && rerun < index.nodes.len(), "{keep:?}: {rerun} of {} nodes ran again", index.nodes.len());
        let (part, _) =
            keeper.outputs_from(cand.as_mut(), keep, &feeds, &mut of_comparison).unwrap().expect("computed by parts");
        assert_same(&format!("{keep:?}, from the comparison's tensors"), &expected, &part.tensors);
    }
}

/// `fix` keeps every independent overflow in one round: where the reference leaves FP16's range
/// from inputs within it, an FP16 run stores inf whatever comes before, though the diagnosing run
/// shows only the first (inf from it reaches the others). One round is allowed here; a round per
/// overflow would end in the region search.
#[test]
fn fix_keeps_every_independent_overflow_in_one_round() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blocks.onnx");
    std::fs::write(&path, prost::Message::encode_to_vec(&blocks_model().proto)).unwrap();
    let options = layerwise::fix::FixOptions {
        bisect: layerwise::pipeline::BisectOptions::new(
            &path,
            BackendSpec::parse("ort:cpu").unwrap(),
            BackendSpec::parse("sim:fp16").unwrap(),
        ),
        output: None,
        max_rounds: 2,
        target: layerwise::fix::FixTarget::Elementwise,
    };
    let outcome = layerwise::fix::fix(&options).unwrap();
    let r = &outcome.report;
    let stages: Vec<layerwise_report::FixStage> = r.rounds.iter().map(|x| x.stage).collect();
    assert_eq!(r.status, layerwise_report::FixStatus::Fixed, "{}", outcome.text);
    assert_eq!(
        stages.iter().filter(|s| **s == layerwise_report::FixStage::Pattern).count(),
        1,
        "{stages:?}\n{}",
        outcome.text
    );
    assert!(!stages.contains(&layerwise_report::FixStage::Region), "{stages:?}");
    for k in OVERFLOWING {
        assert!(r.keep_fp32.contains(&format!("b{k}/ffn_in")), "block {k} kept: {:?}", r.keep_fp32);
    }
}
