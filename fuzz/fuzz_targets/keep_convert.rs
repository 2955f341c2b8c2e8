//! Keep-list conversion (`layerwise_model::convert`) to FP16 and BF16 with arbitrary kept nodes
//! and op types, and the emulation of the same keep list (island edges): a conversion must pass
//! its own type check whenever the graph's float tensors are typed, and serialize and load.
#![no_main]

use std::collections::HashSet;
use std::path::Path;

use arbitrary::Arbitrary;
use layerwise_model::convert::{check_float_types, convert_fp16, ConvertOptions};
use layerwise_model::Precision;
use layerwise_model::{emulate, GraphIndex, Model, Rounding};
use libfuzzer_sys::fuzz_target;
use prost::Message;

#[path = "common.rs"]
mod common;

#[derive(Arbitrary, Debug)]
struct KeepInput {
    model: common::Input,
    ops: Vec<u8>,
    bf16: bool,
    io_fp16: bool,
}

fuzz_target!(|input: KeepInput| {
    let proto = common::edited(input.model.seed, &input.model.edits);
    let Ok(model) = Model::from_proto(proto, "fuzz.onnx") else { return };
    let Ok(index) = GraphIndex::build(model.graph()) else { return };
    let mut float: HashSet<String> = index.computed_tensors().map(str::to_string).collect();
    float.extend(index.inputs.iter().cloned());
    let node_names: Vec<&str> = index.nodes.iter().map(|n| n.name.as_str()).collect();
    let op_types: Vec<&str> = index.nodes.iter().map(|n| n.op_type.as_str()).collect();
    let options = ConvertOptions {
        keep_nodes: input
            .model
            .keep
            .iter()
            .filter_map(|&i| node_names.get(i as usize).map(|n| n.to_string()))
            .collect(),
        keep_ops: input
            .ops
            .iter()
            .filter_map(|&i| op_types.get(i as usize % op_types.len().max(1)).map(|o| o.to_string()))
            .collect(),
        keep_io_types: !input.io_fp16,
        target: if input.bf16 { Precision::Bf16 } else { Precision::Fp16 },
        ..Default::default()
    };
    if let Ok(conversion) = convert_fp16(&model, &index, &float, &options) {
        let _ = check_float_types(&conversion.proto, &float);
        let _ = Model::from_bytes(conversion.proto.encode_to_vec(), Path::new("/nonexistent-layerwise-fuzz/c.onnx"));
        let keep: HashSet<usize> =
            conversion.fp32_nodes.iter().filter_map(|(n, _)| index.node(n)).map(|n| n.proto_index).collect();
        let rounding = if input.bf16 { Rounding::Bf16 } else { Rounding::Fp16 };
        if let Ok(emulated) = emulate(&model, &model.proto, &float, &keep, rounding) {
            GraphIndex::build(emulated.proto.graph.as_ref().expect("a graph")).expect("an emulated graph indexes");
        }
    }
});
