//! Inputs the fuzz targets (fuzz/) found crashing, kept as tests. Each file under
//! fuzz/regressions/ is replayed by `cargo fuzz run TARGET fuzz/regressions/FILE`; these tests
//! rebuild the same situation without the fuzzer.

use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
use layerwise_model::matching::match_tensors;
use layerwise_model::pair::paired_graph;
use layerwise_model::{DataType, GraphIndex};

fn small() -> layerwise_model::onnx::ModelProto {
    let mut b = ModelBuilder::new("small", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(f32_tensor("w", &[4], &[1.0; 4]));
    b.node("Mul", "mul", &["x", "w"], &["h"], vec![]);
    b.node("Relu", "relu", &["h"], &["y"], vec![]);
    b.output("y", DataType::Float);
    b.build()
}

#[test]
fn matching_survives_a_transparent_node_without_an_input() {
    // fuzz/regressions/matching-identity-without-input: an Identity whose input list is empty
    // (a malformed file) made the walk back through transparent nodes index an empty list.
    let reference = small();
    let mut candidate = small();
    let g = candidate.graph.as_mut().unwrap();
    g.node.push(layerwise_model::builder::node("Identity", "empty", &[], &["orphan"], vec![]));
    g.node.push(layerwise_model::builder::node("Relu", "reads_orphan", &["orphan"], &["z"], vec![]));
    let (rg, cg) = (reference.graph.as_ref().unwrap(), candidate.graph.as_ref().unwrap());
    let (ri, ci) = (GraphIndex::build(rg).unwrap(), GraphIndex::build(cg).unwrap());
    for structural in [false, true] {
        let m = match_tensors(rg, &ri, cg, &ci, structural, &Default::default());
        assert!(m.pairs.iter().all(|p| ri.computed_tensors().any(|t| t == p.reference)));
    }
}

#[test]
fn a_tensor_asked_twice_is_paired_once() {
    // fuzz/regressions/pair-tensor-asked-twice: two reduction nodes wrote `lw_pair/h`.
    let model = small();
    let paired =
        paired_graph(&model, &model, &["h".to_string(), "h".to_string(), "y".to_string()], &Default::default())
            .unwrap();
    GraphIndex::build(paired.proto.graph.as_ref().unwrap()).expect("the paired graph indexes");
    assert_eq!(paired.paired, ["h", "y"]);
}

#[test]
fn a_reference_tensor_whose_source_is_a_candidate_input_is_left_unmatched() {
    // fuzz/regressions/matching-reference-tensor-whose-source-is-a-candidate-input: the reference
    // computes y = Identity(x), the candidate reads x directly; y was paired with the candidate's
    // graph input x, which no candidate run can return (exit 2 asking for it).
    let mut b = ModelBuilder::new("ref", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.node("Identity", "copy", &["x"], &["y"], vec![]);
    b.node("Relu", "relu", &["y"], &["out"], vec![]);
    b.output("out", DataType::Float);
    let reference = b.build();
    let mut b = ModelBuilder::new("cand", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.node("Relu", "relu", &["x"], &["out"], vec![]);
    b.output("out", DataType::Float);
    let candidate = b.build();
    let (rg, cg) = (reference.graph.as_ref().unwrap(), candidate.graph.as_ref().unwrap());
    let (ri, ci) = (GraphIndex::build(rg).unwrap(), GraphIndex::build(cg).unwrap());
    let m = match_tensors(rg, &ri, cg, &ci, true, &Default::default());
    assert!(m.pairs.iter().all(|p| ci.producer_index(&p.candidate).is_some()), "{:?}", m.pairs);
    assert!(m.unmatched_reference.contains(&"y".to_string()), "{:?}", m);
}

#[test]
fn a_loop_with_more_outputs_than_its_body_makes_is_not_unrolled() {
    // fuzz/regressions/inline-loop-with-more-outputs-than-its-body: a Loop whose node lists more
    // outputs than its body's loop-carried values and scan outputs was unrolled without them,
    // leaving a graph output nothing produced.
    use layerwise_model::builder::{attr, i64_tensor, node};
    use layerwise_model::inline::{inline_control_flow, Taken};
    use layerwise_model::onnx::{GraphProto, TensorProto, ValueInfoProto};
    let value = |n: &str, t: DataType| ValueInfoProto {
        name: Some(n.into()),
        r#type: Some(layerwise_model::builder::tensor_type(t, None)),
        ..Default::default()
    };
    let mut b = ModelBuilder::new("loop", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(i64_tensor("trips", &[], &[2]));
    b.initializer(TensorProto {
        name: Some("go".into()),
        data_type: Some(DataType::Bool as i32),
        int32_data: vec![1],
        ..Default::default()
    });
    let body = GraphProto {
        name: Some("body".into()),
        node: vec![
            node("Identity", "keep_going", &["cond_in"], &["cond_out"], vec![]),
            node("Identity", "emit", &["x"], &["e"], vec![]),
        ],
        input: vec![value("i", DataType::Int64), value("cond_in", DataType::Bool)],
        output: vec![value("cond_out", DataType::Bool), value("e", DataType::Float)],
        ..Default::default()
    };
    b.node("Loop", "steps", &["trips", "go"], &["stacked", "extra"], vec![attr::graph("body", body)]);
    b.output("stacked", DataType::Float);
    b.output("extra", DataType::Float);
    let proto = b.build();
    let index = GraphIndex::build(proto.graph.as_ref().unwrap()).unwrap();
    let taken = [("steps".to_string(), Taken::Iterations(2))].into_iter().collect();
    match inline_control_flow(&proto, &index, &taken) {
        Ok((inlined, _)) => {
            GraphIndex::build(inlined.graph.as_ref().unwrap()).expect("what is inlined indexes");
        }
        Err(e) => assert!(e.to_string().contains("outputs"), "{e}"),
    }
}

#[test]
fn kept_nodes_with_absent_optional_inputs_copy_no_weight() {
    // fuzz/regressions/keep_convert-constants-with-empty-outputs: a kept node with an absent
    // optional input (name "") and two Constants whose output is "" (a malformed file): the
    // emulation copied both for the kept node, as two nodes writing '__lw_keep32'.
    use prost::Message;
    let mut b = ModelBuilder::new("clip", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.initializer(f32_tensor("hi", &[], &[6.0]));
    b.node("Clip", "clip", &["x", "", "hi"], &["y"], vec![]);
    b.output("y", DataType::Float);
    let mut proto = b.build();
    let g = proto.graph.as_mut().unwrap();
    for name in ["c1", "c2"] {
        let value = layerwise_model::onnx::AttributeProto {
            name: Some("value".into()),
            r#type: Some(layerwise_model::onnx::attribute_proto::AttributeType::Tensor as i32),
            t: Some(f32_tensor("", &[], &[0.0])),
            ..Default::default()
        };
        let mut c = layerwise_model::builder::node("Constant", name, &[], &[""], vec![]);
        c.attribute.push(value);
        g.node.insert(0, c);
    }
    let model =
        layerwise_model::Model::from_bytes(proto.encode_to_vec(), std::path::Path::new("/nonexistent/m.onnx")).unwrap();
    let index = GraphIndex::build(model.graph()).unwrap();
    let clip = index.node("clip").unwrap().proto_index;
    let float: std::collections::HashSet<String> = ["x", "y", "hi"].iter().map(|s| s.to_string()).collect();
    let keep: std::collections::HashSet<usize> = [clip].into_iter().collect();
    for rounding in [layerwise_model::Rounding::Fp16, layerwise_model::Rounding::Bf16] {
        let emulated = layerwise_model::emulate(&model, &model.proto, &float, &keep, rounding).unwrap();
        GraphIndex::build(emulated.proto.graph.as_ref().unwrap()).expect("the emulated graph indexes");
    }
}
