//! What the fuzz targets share: seed models (valid ONNX graphs a rewrite must handle, control
//! flow among them), structured edits that break them in the ways real files are broken, and a
//! data folder for external weights. Included by each target with `#[path]`.
#![allow(dead_code)]

use arbitrary::Arbitrary;
use layerwise_model::builder::{attr, f32_tensor, i64_tensor, node, Dim, ModelBuilder};
use layerwise_model::onnx::{tensor_proto::DataLocation, GraphProto, ModelProto, StringStringEntryProto, TensorProto};
use layerwise_model::DataType;

#[derive(Arbitrary, Debug)]
pub enum Edit {
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
pub struct Input {
    pub seed: u8,
    pub edits: Vec<Edit>,
    pub keep: Vec<u8>,
    pub select: Vec<u8>,
}

const OPS: &[&str] = &[
    "Add", "MatMul", "Conv", "Relu", "Cast", "If", "Loop", "Pow", "Softmax", "Constant", "Identity", "Shape",
    "Reshape", "Custom",
];
const ATTRS: &[&str] = &["axis", "to", "keepdims", "group", "axes"];

pub fn seeds() -> Vec<ModelProto> {
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
    vec![a.build(), b.build(), control_flow_seed()]
}

fn value(name: &str, elem: DataType) -> layerwise_model::onnx::ValueInfoProto {
    layerwise_model::onnx::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(layerwise_model::builder::tensor_type(elem, None)),
        ..Default::default()
    }
}

/// An If (two branches reading an outer tensor), a Loop with a scan output and a Scan: what the
/// control-flow inlining and unrolling handle.
fn control_flow_seed() -> ModelProto {
    let mut b = ModelBuilder::new("control-flow", 17);
    b.input("x", DataType::Float, &[Dim::from(1), Dim::from(4)]);
    b.input("c", DataType::Bool, &[]);
    b.initializer(f32_tensor("k", &[1], &[3.0]));
    b.initializer(i64_tensor("trips", &[], &[3]));
    b.initializer(TensorProto {
        name: Some("go".into()),
        data_type: Some(DataType::Bool as i32),
        int32_data: vec![1],
        ..Default::default()
    });
    let branch = |name: &str, op: &str| GraphProto {
        name: Some(name.into()),
        node: vec![node(op, &format!("{name}/op"), &["x", "k"], &[&format!("{name}_out")], vec![])],
        output: vec![value(&format!("{name}_out"), DataType::Float)],
        ..Default::default()
    };
    b.node(
        "If",
        "choose",
        &["c"],
        &["chosen"],
        vec![attr::graph("then_branch", branch("then", "Mul")), attr::graph("else_branch", branch("else", "Add"))],
    );
    let body = GraphProto {
        name: Some("body".into()),
        node: vec![
            node("Mul", "grow", &["v_in", "k"], &["v_out"], vec![]),
            node("Identity", "keep_going", &["cond_in"], &["cond_out"], vec![]),
            node("Identity", "record", &["v_out"], &["trace_v"], vec![]),
        ],
        input: vec![value("i", DataType::Int64), value("cond_in", DataType::Bool), value("v_in", DataType::Float)],
        output: vec![
            value("cond_out", DataType::Bool),
            value("v_out", DataType::Float),
            value("trace_v", DataType::Float),
        ],
        ..Default::default()
    };
    b.node("Loop", "steps", &["trips", "go", "chosen"], &["v_final", "trace"], vec![attr::graph("body", body)]);
    let scan_body = GraphProto {
        name: Some("scan_body".into()),
        node: vec![
            node("Add", "acc", &["s_in", "row"], &["s_out"], vec![]),
            node("Identity", "emit", &["s_out"], &["e"], vec![]),
        ],
        input: vec![value("s_in", DataType::Float), value("row", DataType::Float)],
        output: vec![value("s_out", DataType::Float), value("e", DataType::Float)],
        ..Default::default()
    };
    b.node("Squeeze", "flat", &["v_final"], &["v0"], vec![]);
    b.node(
        "Scan",
        "running",
        &["v0", "trace"],
        &["total", "sums"],
        vec![attr::int("num_scan_inputs", 1), attr::graph("body", scan_body)],
    );
    b.output("total", DataType::Float);
    b.output("sums", DataType::Float);
    b.build()
}

/// A seed with the input's edits applied (at most 16).
pub fn edited(seed: u8, edits: &[Edit]) -> ModelProto {
    let seeds = seeds();
    let mut proto = seeds[seed as usize % seeds.len()].clone();
    for edit in edits.iter().take(16) {
        apply(&mut proto, edit);
    }
    proto
}

pub fn apply(proto: &mut ModelProto, edit: &Edit) {
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
            if s == n.input.len() {
                n.input.push(t)
            } else {
                n.input[s] = t
            }
        }
        Edit::SetOutput { node, slot, tensor } if !graph.node.is_empty() => {
            let t = pick(*tensor);
            let n = &mut graph.node[*node as usize % nodes];
            let s = *slot as usize % (n.output.len() + 1);
            if s == n.output.len() {
                n.output.push(t)
            } else {
                n.output[s] = t
            }
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
            let (offset, length) =
                if location == DATA_FILE { (offset % DATA_LEN, length % (DATA_LEN + 8)) } else { (*offset, *length) };
            t.external_data = vec![
                entry("location", location),
                entry("offset", offset.to_string()),
                entry("length", length.to_string()),
            ];
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

pub const DATA_FILE: &str = "w.bin";
pub const DATA_LEN: u64 = 4096;

/// A folder (one per fuzzing process) holding `w.bin`, 4 KiB of float32 values for external
/// weights, and `scratch/` for the rewritten models' data.
pub fn data_folder() -> &'static std::path::PathBuf {
    static FOLDER: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    FOLDER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("layerwise-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("scratch")).unwrap();
        let values: Vec<u8> = (0..DATA_LEN / 4).flat_map(|i| ((i as f32 - 500.0) * 130.0).to_le_bytes()).collect();
        std::fs::write(dir.join(DATA_FILE), values).unwrap();
        dir
    })
}
