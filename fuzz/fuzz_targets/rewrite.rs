//! Structured mutations of valid models, then the whole rewrite path: load checks, index, expose
//! (all and a selection), FP16 emulation with a keep list, FP16 conversion, the type check,
//! serialize and load again. Errors are fine; panics, hangs and unbounded allocations are not.
#![no_main]

use std::collections::HashSet;
use std::path::Path;

use arbitrary::Arbitrary;
use layerwise_model::builder::{attr, f32_tensor, i64_tensor, Dim, ModelBuilder};
use layerwise_model::convert::{check_float_types, convert_fp16, ConvertOptions};
use layerwise_model::onnx::{tensor_proto::DataLocation, ModelProto, StringStringEntryProto};
use layerwise_model::{emulate, expose, Rounding, DataType, GraphIndex, Model, Selection};
use libfuzzer_sys::fuzz_target;
use prost::Message;

#[derive(Arbitrary, Debug)]
enum Edit {
    RemoveNode(u8),
    DuplicateNode(u8),
    SetInput { node: u8, slot: u8, tensor: u8 },
    SetOutput { node: u8, slot: u8, tensor: u8 },
    SetGraphOutput { slot: u8, tensor: u8 },
    SetOpType { node: u8, op: u8 },
    ClearNodeName(u8),
    SetDims { init: u8, dims: Vec<i64> },
    TruncateRaw { init: u8, len: u16 },
    SetDataType { init: u8, data_type: i32 },
    MakeExternal { init: u8, location: String, offset: u64, length: u64 },
    SetIntAttr { node: u8, name: u8, value: i64 },
    SetInputDim { input: u8, dim: u8, value: i64 },
    ClearGraphOutputs,
    SetOpset(i64),
}

#[derive(Arbitrary, Debug)]
struct Input {
    seed: u8,
    edits: Vec<Edit>,
    keep: Vec<u8>,
    select: Vec<u8>,
}

const OPS: &[&str] = &["Add", "MatMul", "Conv", "Relu", "Cast", "If", "Loop", "Pow", "Softmax", "Constant", "Identity", "Shape", "Reshape", "Custom"];
const ATTRS: &[&str] = &["axis", "to", "keepdims", "group", "axes"];

fn seeds() -> Vec<ModelProto> {
    let mut a = ModelBuilder::new("mlp-layernorm", 13);
    a.input("x", DataType::Float, &[Dim::from("batch"), Dim::from(4)]);
    a.initializer(f32_tensor("W", &[4, 4], &[0.5; 16]));
    a.initializer(f32_tensor("b", &[4], &[70000.0, 1.0, 2.0, 3.0]));
    a.initializer(f32_tensor("two", &[], &[2.0]));
    a.node("MatMul", "mm", &["x", "W"], &["h0"], vec![]);
    a.node("Add", "bias", &["h0", "b"], &["h"], vec![]);
    a.node("ReduceMean", "mean", &["h"], &["m"], vec![attr::ints("axes", &[-1])]);
    a.node("Sub", "", &["h", "m"], &["d"], vec![]);
    a.node("Pow", "", &["d", "two"], &["d2"], vec![]);
    a.node("Softmax", "sm", &["d2"], &["y"], vec![attr::int("axis", -1)]);
    a.output("y", DataType::Float);

    let mut b = ModelBuilder::new("conv-bn-clip", 13);
    b.input("img", DataType::Float, &[Dim::from(1), Dim::from(2), Dim::from(4), Dim::from(4)]);
    b.initializer(f32_tensor("k", &[2, 2, 1, 1], &[1.0, 0.0, 0.0, 1.0]));
    for (name, v) in [("scale", 1.0), ("shift", 0.0), ("mu", 0.0), ("var", 1e6)] {
        b.initializer(f32_tensor(name, &[2], &[v, v]));
    }
    b.initializer(i64_tensor("shape", &[2], &[1, 32]));
    b.node("Conv", "conv", &["img", "k"], &["c"], vec![]);
    b.node("BatchNormalization", "bn", &["c", "scale", "shift", "mu", "var"], &["n"], vec![]);
    b.node("Constant", "six", &[], &["six_v"], vec![attr::tensor("value", f32_tensor("six_t", &[], &[6.0]))]);
    b.node("Clip", "clip", &["n", "", "six_v"], &["r"], vec![]);
    b.node("Reshape", "flat", &["r", "shape"], &["out"], vec![]);
    b.node("Cast", "as_half", &["out"], &["out16"], vec![attr::int("to", DataType::Float16 as i64)]);
    b.output("out", DataType::Float);
    b.output("out16", DataType::Float16);
    vec![a.build(), b.build()]
}

fn apply(proto: &mut ModelProto, edit: &Edit) {
    let graph = proto.graph.as_mut().unwrap();
    let mut names: Vec<String> = graph.node.iter().flat_map(|n| n.output.iter().cloned()).collect();
    names.extend(graph.initializer.iter().map(|t| t.name().to_string()));
    names.extend(graph.input.iter().map(|v| v.name().to_string()));
    names.push(String::new());
    names.push("ghost".into());
    let pick = |i: u8| names[i as usize % names.len()].clone();
    let nodes = graph.node.len().max(1);
    let inits = graph.initializer.len().max(1);
    match edit {
        Edit::RemoveNode(i) if !graph.node.is_empty() => {
            graph.node.remove(*i as usize % nodes);
        }
        Edit::DuplicateNode(i) if !graph.node.is_empty() => {
            let n = graph.node[*i as usize % nodes].clone();
            graph.node.push(n);
        }
        Edit::SetInput { node, slot, tensor } if !graph.node.is_empty() => {
            let t = pick(*tensor);
            let n = &mut graph.node[*node as usize % nodes];
            let s = *slot as usize % (n.input.len() + 1);
            if s == n.input.len() { n.input.push(t) } else { n.input[s] = t }
        }
        Edit::SetOutput { node, slot, tensor } if !graph.node.is_empty() => {
            let t = pick(*tensor);
            let n = &mut graph.node[*node as usize % nodes];
            let s = *slot as usize % (n.output.len() + 1);
            if s == n.output.len() { n.output.push(t) } else { n.output[s] = t }
        }
        Edit::SetGraphOutput { slot, tensor } if !graph.output.is_empty() => {
            let len = graph.output.len();
            graph.output[*slot as usize % len].name = Some(pick(*tensor));
        }
        Edit::SetOpType { node, op } if !graph.node.is_empty() => {
            graph.node[*node as usize % nodes].op_type = Some(OPS[*op as usize % OPS.len()].into());
        }
        Edit::ClearNodeName(i) if !graph.node.is_empty() => graph.node[*i as usize % nodes].name = None,
        Edit::SetDims { init, dims } if !graph.initializer.is_empty() => {
            graph.initializer[*init as usize % inits].dims = dims.iter().take(8).copied().collect();
        }
        Edit::TruncateRaw { init, len } if !graph.initializer.is_empty() => {
            let t = &mut graph.initializer[*init as usize % inits];
            if let Some(raw) = &t.raw_data {
                let keep = (*len as usize).min(raw.len());
                t.raw_data = Some(raw.slice(..keep));
            }
        }
        Edit::SetDataType { init, data_type } if !graph.initializer.is_empty() => {
            graph.initializer[*init as usize % inits].data_type = Some(*data_type);
        }
        Edit::MakeExternal { init, location, offset, length } if !graph.initializer.is_empty() => {
            let t = &mut graph.initializer[*init as usize % inits];
            let entry = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
            // Mostly the real data file beside the model (so loading, streaming and FP16 rounding
            // of external weights run), sometimes an arbitrary location.
            let location = if location.len() % 4 == 0 { DATA_FILE.to_string() } else { location.clone() };
            let (offset, length) = if location == DATA_FILE { (offset % DATA_LEN, length % (DATA_LEN + 8)) } else { (*offset, *length) };
            t.external_data = vec![entry("location", location), entry("offset", offset.to_string()), entry("length", length.to_string())];
            t.data_location = Some(DataLocation::External as i32);
        }
        Edit::SetIntAttr { node, name, value } if !graph.node.is_empty() => {
            graph.node[*node as usize % nodes].attribute.push(attr::int(ATTRS[*name as usize % ATTRS.len()], *value));
        }
        Edit::SetInputDim { input, dim, value } if !graph.input.is_empty() => {
            use layerwise_model::onnx::{tensor_shape_proto::dimension::Value, type_proto};
            let len = graph.input.len();
            let v = &mut graph.input[*input as usize % len];
            if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) {
                if let Some(shape) = t.shape.as_mut() {
                    if !shape.dim.is_empty() {
                        let n = shape.dim.len();
                        shape.dim[*dim as usize % n].value = Some(Value::DimValue(*value));
                    }
                }
            }
        }
        Edit::ClearGraphOutputs => graph.output.clear(),
        Edit::SetOpset(v) => {
            if let Some(o) = proto.opset_import.first_mut() {
                o.version = Some(*v);
            }
        }
        _ => {}
    }
}

const DATA_FILE: &str = "w.bin";
const DATA_LEN: u64 = 4096;

/// A folder (one per fuzzing process) holding `w.bin`, 4 KiB of float32 values for external
/// weights, and `scratch/` for the rewritten models' data.
fn data_folder() -> &'static std::path::PathBuf {
    static FOLDER: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    FOLDER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("layerwise-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("scratch")).unwrap();
        let values: Vec<u8> = (0..DATA_LEN / 4).flat_map(|i| ((i as f32 - 500.0) * 130.0).to_le_bytes()).collect();
        std::fs::write(dir.join(DATA_FILE), values).unwrap();
        dir
    })
}

fuzz_target!(|input: Input| {
    let seeds = seeds();
    let mut proto = seeds[input.seed as usize % seeds.len()].clone();
    for edit in input.edits.iter().take(16) {
        apply(&mut proto, edit);
    }
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
