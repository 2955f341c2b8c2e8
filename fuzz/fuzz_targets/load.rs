//! Arbitrary bytes as an `.onnx` file: load (decode + checks), index, expose every tensor,
//! serialize, and load the result again. Nothing may panic, hang or allocate without bound.
#![no_main]

use std::path::Path;

use layerwise_model::{expose, GraphIndex, Model, Selection};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    // A folder that does not exist: external data references must fail cleanly.
    let Ok(model) = Model::from_bytes(data.to_vec(), Path::new("/nonexistent-layerwise-fuzz/model.onnx")) else {
        return;
    };
    let Ok(index) = GraphIndex::build(model.graph()) else { return };
    let (exposed, names) = expose(&model.proto, &index, &Selection::All).expect("Selection::All always exposes");
    assert!(names.len() >= index.computed_tensors().count().min(1) || names.is_empty());
    let bytes = exposed.encode_to_vec();
    let again = Model::from_bytes(bytes, Path::new("/nonexistent-layerwise-fuzz/exposed.onnx"))
        .expect("an exposed valid model loads");
    GraphIndex::build(again.graph()).expect("an exposed valid graph indexes");
});
