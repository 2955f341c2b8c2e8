//! Node extraction for isolation and `--repro` (`layerwise_model::extract`): arbitrary groups of
//! nodes of an edited model, each extracted into a model of its own. A model extracted must index,
//! and every group's inputs and outputs must be graph inputs and outputs of it.
#![no_main]

use arbitrary::Arbitrary;
use layerwise_model::extract::{extract_groups, TensorType};
use layerwise_model::{DataType, GraphIndex, Model};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

#[derive(Arbitrary, Debug)]
struct ExtractInput {
    model: common::Input,
    groups: Vec<Vec<u8>>,
    untyped: u8,
}

fuzz_target!(|input: ExtractInput| {
    let proto = common::edited(input.model.seed, &input.model.edits);
    let Ok(model) = Model::from_proto(proto, "fuzz.onnx") else { return };
    let Ok(index) = GraphIndex::build(model.graph()) else { return };
    if index.nodes.is_empty() {
        return;
    }
    let groups: Vec<Vec<String>> = input
        .groups
        .iter()
        .take(4)
        .map(|g| g.iter().take(6).map(|&i| index.nodes[i as usize % index.nodes.len()].name.clone()).collect())
        .collect();
    let untyped = input.untyped;
    let types =
        |t: &str| (t.len() % 7 != untyped as usize % 7).then(|| TensorType { elem: DataType::Float, dims: vec![1, 4] });
    if let Ok(extraction) = extract_groups(&model, &index, &groups, &types) {
        let graph = extraction.proto.graph.as_ref().expect("a graph");
        GraphIndex::build(graph).expect("an extracted graph indexes");
        for g in &extraction.groups {
            for (name, _) in &g.inputs {
                assert!(graph.input.iter().any(|v| v.name() == name), "group input '{name}' is a graph input");
            }
            for (name, _) in &g.outputs {
                assert!(graph.output.iter().any(|v| v.name() == name), "group output '{name}' is a graph output");
            }
        }
    }
});
