//! Control-flow inlining and unrolling (`layerwise_model::inline`): edited models with If, Loop
//! and Scan nodes, each replaced by an arbitrary branch or iteration count. A graph that indexes
//! and inlines must index again, and typing copies of the bodies must not panic.
#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use layerwise_model::inline::{inline_control_flow, with_body_copies, Taken};
use layerwise_model::GraphIndex;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

#[derive(Arbitrary, Debug)]
struct InlineInput {
    model: common::Input,
    decisions: Vec<(bool, u8)>,
}

fuzz_target!(|input: InlineInput| {
    let proto = common::edited(input.model.seed, &input.model.edits);
    let Some(graph) = proto.graph.as_ref() else { return };
    let Ok(index) = GraphIndex::build(graph) else { return };
    let _ = with_body_copies(&proto);
    let mut taken = HashMap::new();
    for (n, (branch, iterations)) in index.nodes.iter().filter(|n| n.has_subgraphs).zip(input.decisions.iter().cycle())
    {
        taken.insert(
            n.name.clone(),
            if n.op_type == "If" { Taken::Branch(*branch) } else { Taken::Iterations(*iterations as usize % 9) },
        );
    }
    if let Ok((inlined, _)) = inline_control_flow(&proto, &index, &taken) {
        GraphIndex::build(inlined.graph.as_ref().expect("a graph")).expect("an inlined graph indexes");
    }
});
