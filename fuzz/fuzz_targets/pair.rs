//! The paired graph (`layerwise_model::pair`): a reference and a candidate program (an edited
//! model and its FP16 emulation) joined into one graph with a reduction node per tensor. A graph
//! built must index.
#![no_main]

use std::collections::HashSet;

use layerwise_model::pair::paired_graph;
use layerwise_model::{emulate, expose, GraphIndex, Model, Rounding, Selection};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|input: common::Input| {
    let proto = common::edited(input.seed, &input.edits);
    let Ok(model) = Model::from_proto(proto, "fuzz.onnx") else { return };
    let Ok(index) = GraphIndex::build(model.graph()) else { return };
    let computed: Vec<String> = index.computed_tensors().map(str::to_string).collect();
    let (exposed, _) = expose(&model.proto, &index, &Selection::All).expect("Selection::All always exposes");
    let float: HashSet<String> = computed.iter().cloned().collect();
    let keep: HashSet<usize> = input.keep.iter().map(|&i| i as usize % index.nodes.len().max(1)).collect();
    let Ok(candidate) = emulate(&model, &exposed, &float, &keep, Rounding::Fp16) else { return };
    let tensors: Vec<String> = if computed.is_empty() {
        Vec::new()
    } else {
        input.select.iter().map(|&i| computed[i as usize % computed.len()].clone()).collect()
    };
    if let Ok(paired) = paired_graph(&exposed, &candidate.proto, &tensors, &Default::default()) {
        GraphIndex::build(paired.proto.graph.as_ref().expect("a graph")).expect("a paired graph indexes");
    }
});
