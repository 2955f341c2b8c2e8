//! Structural matching (`layerwise_model::matching`): two independently edited models (a
//! reference and a candidate, as a renamed or converted export would differ) paired by name and by
//! structure. Every pair must name a tensor each graph computes.
#![no_main]

use arbitrary::Arbitrary;
use layerwise_model::matching::match_tensors;
use layerwise_model::GraphIndex;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

#[derive(Arbitrary, Debug)]
struct PairInput {
    reference: common::Input,
    candidate: common::Input,
    structural: bool,
}

fuzz_target!(|input: PairInput| {
    let r = common::edited(input.reference.seed, &input.reference.edits);
    let c = common::edited(input.candidate.seed, &input.candidate.edits);
    let (Some(rg), Some(cg)) = (r.graph.as_ref(), c.graph.as_ref()) else { return };
    let (Ok(ri), Ok(ci)) = (GraphIndex::build(rg), GraphIndex::build(cg)) else { return };
    let matching = match_tensors(rg, &ri, cg, &ci, input.structural, &Default::default());
    let computed = |i: &GraphIndex, t: &str| i.computed_tensors().any(|x| x == t);
    for p in &matching.pairs {
        assert!(computed(&ri, &p.reference), "pair names '{}', which the reference does not compute", p.reference);
        assert!(computed(&ci, &p.candidate), "pair names '{}', which the candidate does not compute", p.candidate);
    }
});
