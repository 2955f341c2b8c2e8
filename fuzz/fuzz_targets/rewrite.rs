//! Structured mutations of valid models, then the whole rewrite path: load checks, index, expose
//! (all and a selection), FP16 emulation with a keep list, FP16 conversion, the type check,
//! serialize and load again. Errors are fine; panics, hangs and unbounded allocations are not.
#![no_main]

use std::collections::HashSet;
use std::path::Path;

use layerwise_model::convert::{check_float_types, convert_fp16, ConvertOptions};
use layerwise_model::{emulate, expose, GraphIndex, Model, Rounding, Selection};
use libfuzzer_sys::fuzz_target;
use prost::Message;

#[path = "common.rs"]
mod common;
use common::*;

fuzz_target!(|input: Input| {
    let proto = edited(input.seed, &input.edits);
    let Ok(model) = Model::from_proto(proto, "fuzz.onnx") else { return };
    // Serialize and load back through the file path's decoder too.
    let folder = data_folder();
    let Ok(model) = Model::from_bytes(model.proto.encode_to_vec(), &folder.join("m.onnx")) else { return };
    let Ok(index) = GraphIndex::build(model.graph()) else { return };
    let computed: Vec<String> = index.computed_tensors().map(str::to_string).collect();
    let (exposed, _) = expose(&model.proto, &index, &Selection::All).expect("Selection::All always exposes");
    if !computed.is_empty() {
        let chosen: Vec<String> = input.select.iter().map(|&i| computed[i as usize % computed.len()].clone()).collect();
        let _ = expose(&model.proto, &index, &Selection::Names(chosen));
    }
    let mut float: HashSet<String> = computed.iter().cloned().collect();
    float.extend(index.inputs.iter().cloned());
    let keep: HashSet<usize> = input.keep.iter().map(|&i| i as usize % index.nodes.len().max(1)).collect();
    if let Ok(emulated) = emulate(&model, &exposed, &float, &keep, Rounding::Fp16) {
        let _ = Model::from_bytes(emulated.proto.encode_to_vec(), Path::new("/nonexistent-layerwise-fuzz/e.onnx"));
        // What a runtime is handed: external weights streamed (rounded where marked) into scratch.
        if let Ok((bytes, Some(scratch))) = model.runtime_bytes(&emulated.proto, &folder.join("scratch")) {
            if scratch.ends_with("scratch") {
                let _ = Model::from_bytes(bytes, &scratch.join("r.onnx"));
            }
        }
    }
    let options = ConvertOptions {
        keep_nodes: input.keep.iter().filter_map(|&i| index.nodes.get(i as usize).map(|n| n.name.clone())).collect(),
        ..Default::default()
    };
    if let Ok(conversion) = convert_fp16(&model, &index, &float, &options) {
        let _ = check_float_types(&conversion.proto, &float);
        let _ = Model::from_bytes(conversion.proto.encode_to_vec(), Path::new("/nonexistent-layerwise-fuzz/c.onnx"));
    }
});
