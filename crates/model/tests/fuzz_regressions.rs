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
        let m = match_tensors(rg, &ri, cg, &ci, structural);
        assert!(m.pairs.iter().all(|p| ri.computed_tensors().any(|t| t == p.reference)));
    }
}

#[test]
fn a_tensor_asked_twice_is_paired_once() {
    // fuzz/regressions/pair-tensor-asked-twice: two reduction nodes wrote `lw_pair/h`.
    let model = small();
    let paired = paired_graph(&model, &model, &["h".to_string(), "h".to_string(), "y".to_string()]).unwrap();
    GraphIndex::build(paired.proto.graph.as_ref().unwrap()).expect("the paired graph indexes");
    assert_eq!(paired.paired, ["h", "y"]);
}
