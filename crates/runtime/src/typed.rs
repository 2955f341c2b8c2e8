//! The typed evaluation: a model run one node at a time, each node a model of its own on ONNX
//! Runtime's CPU provider, so that every tensor between two nodes holds a value of the type the
//! file declares for it.
//!
//! Why: run whole, ONNX Runtime's CPU provider is no FP16 executor. For the many ops it has no FP16
//! kernel for, it inserts Casts to float32 around them and then removes the Cast pairs between such
//! ops, so a chain of FP16 ops computes and stores in float32, and a `Cast(to=FLOAT16)` of 1.9e5
//! followed by an FP16 Mul does not overflow. Run alone, a node's FP16 output is a graph output of
//! type FP16: it is rounded (and overflows) as the file says, whatever kernel computed it. Each op
//! still computes in float32 inside (ONNX Runtime's CPU kernels), which is the arithmetic of the
//! emulations and of most FP16 engines; docs/fix.md says so.
//!
//! This module shares no code with the emulation's rewrites (`layerwise_model::emulate`): it reads
//! the file as written and builds nothing but one-node models, so it can check what the emulation
//! claims about that file.

use std::collections::{HashMap, HashSet};

use layerwise_model::onnx::{
    tensor_shape_proto, type_proto, GraphProto, ModelProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use layerwise_model::{Model, Selection};

use crate::backend::{Backend, RunOutput, RunRequest};
use crate::ort_backend::{build_session, from_ort_value, session_feeds, ModelSource, SessionExtras};
use crate::spec::{BackendSpec, ExecutionProvider, OptLevel, OrtOptions, Precision};
use crate::{RuntimeError, Tensor};

/// `ort:cpu` on a model with FP16 or BF16 tensors, evaluated one node at a time in the model's
/// own types (see the module documentation).
pub struct TypedBackend {
    spec: BackendSpec,
    label: String,
    options: OrtOptions,
    log_id: String,
    sessions: Sessions,
}

/// Sessions of one-node models, by the model's bytes with its tensors renamed by position and its
/// large float weights fed as inputs ([`alike`]): the nodes a model repeats (the same op, attributes,
/// types and shapes in every block) share one session instead of building one each.
#[derive(Default)]
pub struct Sessions(HashMap<Vec<u8>, ort::session::Session>);

impl TypedBackend {
    pub fn new(spec: &BackendSpec, threads: Option<usize>) -> TypedBackend {
        let label = spec.to_string();
        TypedBackend {
            spec: spec.clone(),
            options: OrtOptions { opt_level: OptLevel::Disable, threads, ep: ExecutionProvider::Cpu, typed: true },
            log_id: format!("{label}#typed"),
            label,
            sessions: Sessions::default(),
        }
    }
}

/// The note every typed run carries, so that every report format says what ran.
pub const TYPED_NOTE: &str = "typed evaluation: ONNX Runtime's CPU provider does not compute FP16 or BF16 as a GPU does (it runs ops without such kernels in float32 and removes the Cast pairs between them), so this model was run one node at a time, every tensor between nodes stored in the type the file declares (docs/fix.md)";

impl Backend for TypedBackend {
    fn spec(&self) -> &BackendSpec {
        &self.spec
    }

    fn precision(&self) -> Precision {
        Precision::Fp32
    }

    fn run(&mut self, request: &RunRequest) -> Result<RunOutput, RuntimeError> {
        let result = evaluate_typed(&self.label, &self.options, &self.log_id, request, &mut self.sessions);
        let logged = crate::backend_log::take(&self.log_id);
        let mut output = result?;
        output.notes.extend(logged.iter().map(|l| l.note()));
        Ok(output)
    }
}

/// Whether a model stores any value in FP16 or BF16 (an initializer, a declared type, a Cast to
/// either), in its main graph or its bodies: the models the typed evaluation is for.
pub fn has_reduced_precision(model: &Model) -> bool {
    fn graph_has(g: &GraphProto) -> bool {
        let low = |t: i32| t == 10 || t == 16;
        let value_low = |v: &ValueInfoProto| matches!(v.r#type.as_ref().and_then(|t| t.value.as_ref()), Some(type_proto::Value::TensorType(t)) if low(t.elem_type()));
        g.initializer.iter().any(|t| low(t.data_type()))
            || g.input.iter().chain(&g.output).chain(&g.value_info).any(value_low)
            || g.node.iter().any(|n| {
                n.attribute.iter().any(|a| {
                    (n.op_type() == "Cast" && a.name() == "to" && a.i.is_some_and(|i| low(i as i32)))
                        || a.t.as_ref().is_some_and(|t| low(t.data_type()))
                        || a.g.iter().chain(&a.graphs).any(graph_has)
                })
            })
    }
    graph_has(model.graph())
}

/// Runs `request.model` one node at a time (see the module documentation) and returns the
/// selected tensors in the types the model gives them. `sessions` may hold sessions of an earlier
/// run's nodes.
pub fn evaluate_typed(
    spec: &str,
    options: &OrtOptions,
    log_id: &str,
    request: &RunRequest,
    sessions: &mut Sessions,
) -> Result<RunOutput, RuntimeError> {
    let err = |why: String| RuntimeError::Ort { backend: spec.to_string(), why };
    let model = request.model;
    let index = request.index;
    let graph = model.graph();
    let wanted: HashSet<&str> = match request.selection {
        Selection::All => index.computed_tensors().collect(),
        Selection::Names(names) => {
            names.iter().map(String::as_str).chain(index.outputs.iter().map(String::as_str)).collect()
        }
    };
    let mut output = RunOutput { notes: vec![TYPED_NOTE.to_string()], ..Default::default() };
    // How many nodes still read each tensor: a value is dropped after its last reader unless wanted.
    let mut readers_left: HashMap<&str, usize> = HashMap::new();
    for node in &index.nodes {
        for t in node.all_inputs() {
            *readers_left.entry(t.as_str()).or_default() += 1;
        }
    }
    let initializers: HashMap<&str, &layerwise_model::onnx::TensorProto> =
        graph.initializer.iter().map(|t| (t.name(), t)).collect();
    let declared: HashMap<&str, &ValueInfoProto> = graph.input.iter().map(|v| (v.name(), v)).collect();
    let mut values: HashMap<String, Tensor> = HashMap::new();
    for name in &index.inputs {
        let (_, t) = request
            .inputs
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| RuntimeError::Input(format!("no value for model input '{name}'")))?;
        values.insert(name.clone(), as_declared(t, declared.get(name.as_str()).copied()));
    }
    let constants: HashSet<&str> = graph
        .node
        .iter()
        .filter(|n| n.op_type() == "Constant")
        .flat_map(|n| n.output.iter().map(String::as_str))
        .collect();
    let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-typed-")
        .map_err(|e| RuntimeError::Io { path: std::env::temp_dir(), cause: e })?;
    let mut unavailable: HashMap<String, String> = HashMap::new();
    let mut widened_nodes: Vec<String> = Vec::new();
    for info in &index.nodes {
        let node = &graph.node[info.proto_index];
        let mut sub =
            GraphProto { name: Some(format!("typed-{}", info.name)), node: vec![node.clone()], ..Default::default() };
        let mut feeds: Vec<(String, Tensor)> = Vec::new();
        let mut missing = None;
        for t in info.all_inputs() {
            if sub.input.iter().any(|v| v.name() == t) || sub.initializer.iter().any(|i| i.name() == t) {
                continue;
            }
            if let Some(init) = initializers.get(t.as_str()) {
                sub.initializer.push((*init).clone());
            } else if let Some(value) = values.get(t).filter(|_| constants.contains(t.as_str())) {
                // A Constant's value stays a constant: ONNX Runtime's shape inference reads it
                // (a Resize's empty `scales` beside its `sizes`, a Reshape's shape).
                sub.initializer.push(value.to_proto(t));
            } else if let Some(value) = values.get(t) {
                sub.input.push(value_info(t, value));
                feeds.push((t.clone(), value.clone()));
            } else {
                missing = Some(unavailable.get(t).cloned().unwrap_or_else(|| format!("its input '{t}' has no value")));
                break;
            }
        }
        let outputs: Vec<&String> = node.output.iter().filter(|o| !o.is_empty()).collect();
        if let Some(why) = missing {
            for o in &outputs {
                unavailable.insert(o.to_string(), format!("not evaluated: node '{}' was not run ({why})", info.name));
            }
            continue;
        }
        sub.output =
            outputs.iter().map(|o| ValueInfoProto { name: Some(o.to_string()), ..Default::default() }).collect();
        let proto = ModelProto {
            ir_version: model.proto.ir_version,
            opset_import: model.proto.opset_import.clone(),
            functions: model.proto.functions.clone(),
            producer_name: Some("layerwise-typed".into()),
            graph: Some(sub),
            ..Default::default()
        };
        let node_err =
            |why: String| err(format!("node '{}' ({}) run alone in its own types: {why}", info.name, info.op_type));
        // The node as a model like its repeats, in a shared session; where that fails, run as it
        // is, so that what is said about a failure names the node's own tensors.
        let shared = run_alike(spec, options, log_id, model, &proto, &feeds, scratch.path(), sessions);
        let (mut results, widened) =
            match shared.or_else(|_| run_node(spec, options, log_id, model, &proto, &feeds, scratch.path())) {
                Ok(r) => (r, None),
                // ONNX Runtime's CPU provider has no kernel for many ops in BF16 (and some in FP16):
                // the op runs in float32 on its reduced-precision values, and its outputs are stored
                // back in that type, which is what the file's types ask of it.
                Err(first) => match widen(&proto, &feeds) {
                    Some((wide, wide_feeds, low)) => {
                        let r = run_node(spec, options, log_id, model, &wide, &wide_feeds, scratch.path())
                            .map_err(|e| node_err(format!("{first}; in float32 too: {e}")))?;
                        widened_nodes.push(info.name.clone());
                        (r, Some(low))
                    }
                    None => return Err(node_err(first.to_string())),
                },
            };
        // ONNX Runtime's CUDA kernel stores an FP16 ReduceMean's float32 sum in FP16 before it
        // divides (measured on an H100, docs/emulation.md): a sum beyond 65504 is inf there
        // though the mean is small. The file's own types say FP16; so does its value here.
        if info.op_type == "ReduceMean" && widened.is_none() {
            if let Some(Ok(mean)) =
                results.get(node.output[0].as_str()).filter(|r| matches!(r, Ok(t) if t.dtype() == crate::DType::F16))
            {
                let sum_model = reduce_sum_of(&proto, model.opset());
                let sums = run_node(spec, options, log_id, model, &sum_model, &feeds, scratch.path())
                    .map_err(|e| node_err(format!("its sum: {e}")))?;
                let data_len = feeds.iter().find(|(n, _)| *n == node.input[0]).map(|(_, t)| t.len()).or_else(|| {
                    initializers.get(node.input[0].as_str()).map(|t| t.dims.iter().product::<i64>().max(1) as usize)
                });
                if let (Some(Ok(sum)), Some(data_len)) = (sums.get(node.output[0].as_str()), data_len) {
                    let count = (data_len / mean.len().max(1)).max(1) as f32;
                    let stored: Vec<half::f16> = sum
                        .to_f32()
                        .iter()
                        .map(|&s| half::f16::from_f32(half::f16::from_f32(s).to_f32() / count))
                        .collect();
                    let value = Tensor::new(mean.shape.clone(), crate::TensorData::F16(stored));
                    results.insert(node.output[0].clone(), Ok(value));
                }
            }
        }
        // ONNX Runtime's CUDA kernels for BF16 Sigmoid and FP16/BF16 Softplus round after every
        // step of their formula (measured on an H100 over every finite input, docs/emulation.md);
        // the file's types ask for those kernels, so their values are computed that way here.
        if let Some(x) = feeds.iter().find(|(n, _)| *n == node.input[0]).map(|(_, t)| t) {
            if let Some(value) = stepwise_kernel(&info.op_type, x, x.dtype()) {
                results.insert(node.output[0].clone(), Ok(value));
            }
        }
        for o in &outputs {
            match results.remove(o.as_str()) {
                Some(Ok(t)) => {
                    let t = match widened {
                        Some(low) if t.dtype() == crate::DType::F32 => narrow(&t, low),
                        _ => t,
                    };
                    values.insert(o.to_string(), t);
                }
                Some(Err(why)) => {
                    unavailable.insert(o.to_string(), why);
                }
                None => {
                    unavailable.insert(o.to_string(), "ONNX Runtime returned no value".into());
                }
            }
        }
        for t in info.all_inputs() {
            let left = readers_left.get_mut(t.as_str()).expect("counted above");
            *left -= 1;
            if *left == 0 && !wanted.contains(t.as_str()) {
                values.remove(t);
            }
        }
    }
    if !widened_nodes.is_empty() {
        output.notes.push(format!(
            "{} nodes have no ONNX Runtime CPU kernel in their reduced-precision type; each computed in float32 on its stored values, its outputs stored back in that type: {}",
            widened_nodes.len(),
            widened_nodes.join(", ")
        ));
    }
    // A model output that is a graph input passed straight through holds the value fed, stored
    // as the file declares the input: what a run of the file returns for it.
    for name in index.outputs.iter().filter(|o| index.producer_index(o).is_none() && index.is_graph_input(o)) {
        if let Some((_, t)) = request.inputs.iter().find(|(n, _)| n == name) {
            output.tensors.insert(name.clone(), as_declared(t, declared.get(name.as_str()).copied()));
        }
    }
    for name in index.computed_tensors().filter(|t| wanted.contains(t)) {
        match values.remove(name) {
            Some(t) => {
                output.tensors.insert(name.to_string(), t);
            }
            None => output
                .unavailable
                .push((name.to_string(), unavailable.remove(name).unwrap_or_else(|| "not computed".into()))),
        }
    }
    Ok(output)
}

/// What ONNX Runtime's CUDA kernel computes for a BF16 Sigmoid or an FP16/BF16 Softplus on `x`
/// (stored in `low`): `x > 0 ? 1/(1 + exp(-x)) : 1 - 1/(1 + exp(x))` and
/// `x > 0 ? x + ln(1 + exp(-x)) : ln(1 + exp(x))` in float32, every step rounded to `low`
/// (measured bit for bit on the H100, scripts/gpu/elementwise_probe.py). `None` for other ops
/// and types, whose kernels round once.
fn stepwise_kernel(op: &str, x: &Tensor, low: crate::DType) -> Option<Tensor> {
    let round: fn(f32) -> f32 = match low {
        crate::DType::BF16 => |v| half::bf16::from_f32(v).to_f32(),
        crate::DType::F16 => |v| half::f16::from_f32(v).to_f32(),
        _ => return None,
    };
    let f: Box<dyn Fn(f32) -> f32> = match (op, low) {
        ("Sigmoid", crate::DType::BF16) => Box::new(move |v: f32| {
            if v > 0.0 {
                round(1.0 / round(1.0 + round((-v).exp())))
            } else {
                round(1.0 - round(1.0 / round(1.0 + round(v.exp()))))
            }
        }),
        ("Softplus", _) => Box::new(move |v: f32| {
            if v > 0.0 {
                round(v + round(round(1.0 + round((-v).exp())).ln()))
            } else {
                round(round(1.0 + round(v.exp())).ln())
            }
        }),
        _ => return None,
    };
    let values: Vec<f32> = x.to_f32().iter().map(|&v| f(v)).collect();
    let data = match low {
        crate::DType::BF16 => crate::TensorData::BF16(values.iter().map(|&v| half::bf16::from_f32(v)).collect()),
        _ => crate::TensorData::F16(values.iter().map(|&v| half::f16::from_f32(v)).collect()),
    };
    Some(Tensor::new(x.shape.clone(), data))
}

/// The one-node model `proto` (a ReduceMean) as a ReduceSum over the same axes, keeping the same
/// dimensions: axes move from the attribute to an input at opset 13 and later (ReduceMean keeps
/// them as an attribute until opset 18).
fn reduce_sum_of(proto: &ModelProto, opset: i64) -> ModelProto {
    let mut out = proto.clone();
    let graph = out.graph.as_mut().expect("graph");
    let node = &mut graph.node[0];
    node.op_type = Some("ReduceSum".into());
    if let Some(pos) = node.attribute.iter().position(|a| a.name() == "axes") {
        if opset >= 13 {
            let axes = node.attribute.remove(pos).ints;
            let name = format!("{}__typed_sum_axes", node.output[0]);
            graph.initializer.push(layerwise_model::builder::i64_tensor(&name, &[axes.len() as i64], &axes));
            let node = &mut graph.node[0];
            node.input.truncate(1);
            node.input.push(name);
        }
    }
    out
}

/// One one-node model run: its outputs by name, each a host tensor or why it is not one.
fn run_node(
    spec: &str,
    options: &OrtOptions,
    log_id: &str,
    model: &Model,
    proto: &ModelProto,
    feeds: &[(String, Tensor)],
    scratch: &std::path::Path,
) -> Result<HashMap<String, Result<Tensor, String>>, RuntimeError> {
    let (bytes, folder) = model.runtime_bytes(proto, scratch)?;
    let mut session = build_session(
        spec,
        options,
        log_id,
        ModelSource::Memory { bytes: &bytes, external_folder: folder.as_deref() },
        OptLevel::Disable,
        SessionExtras::default(),
    )?;
    run_session(&mut session, feeds, spec)
}

/// One run of a one-node model's session: its outputs by name, each a host tensor or why not.
fn run_session(
    session: &mut ort::session::Session,
    feeds: &[(String, Tensor)],
    spec: &str,
) -> Result<HashMap<String, Result<Tensor, String>>, RuntimeError> {
    let session_inputs = session_feeds(session, feeds, spec)?;
    let (results, optional) =
        crate::ort_backend::run_without_optionals(session, session_inputs).map_err(|e| e.into_runtime(spec))?;
    let mut out: HashMap<String, Result<Tensor, String>> =
        results.into_iter().map(|(n, v)| (n, from_ort_value(&v))).collect();
    out.extend(
        optional
            .into_iter()
            .map(|n| (n, Err("an optional value, not a tensor (it may hold none): not compared".to_string()))),
    );
    Ok(out)
}

/// Float weights with more elements than this are fed to a shared one-node session as inputs
/// (each block's own weight); smaller ones and other types (shapes, axes, scales that shape
/// inference reads) stay in the model, and so in what tells sessions apart.
const FED_WEIGHT_ELEMENTS: usize = 64;

/// The one-node model `proto` in the form its repeats share: tensors named by position, the node
/// and graph named alike, large float weights turned into inputs fed their values. Returns the
/// model, its feeds, and each output's name in it with the node's own name.
fn alike(
    proto: &ModelProto,
    feeds: &[(String, Tensor)],
) -> Option<(ModelProto, Vec<(String, Tensor)>, Vec<(String, String)>)> {
    let graph = proto.graph.as_ref()?;
    let mut node = graph.node.first()?.clone();
    let mut names: HashMap<String, String> = HashMap::new();
    for (k, t) in node.input.iter_mut().enumerate().filter(|(_, t)| !t.is_empty()) {
        let name = names.entry(t.clone()).or_insert_with(|| format!("i{k}")).clone();
        *t = name;
    }
    let mut outputs = Vec::new();
    for (k, t) in node.output.iter_mut().enumerate().filter(|(_, t)| !t.is_empty()) {
        let name = format!("o{k}");
        outputs.push((name.clone(), std::mem::replace(t, name)));
    }
    node.name = Some("typed".into());
    let renamed = |t: &str| names.get(t).cloned();
    let mut sub = GraphProto { name: Some("typed".into()), node: vec![node], ..Default::default() };
    let mut alike_feeds = Vec::new();
    for v in &graph.input {
        sub.input.push(ValueInfoProto { name: Some(renamed(v.name())?), ..v.clone() });
        let (_, value) = feeds.iter().find(|(n, _)| n == v.name())?;
        alike_feeds.push((renamed(v.name())?, value.clone()));
    }
    for t in &graph.initializer {
        let name = renamed(t.name())?;
        let fed = matches!(t.data_type(), 1 | 10 | 16)
            && !layerwise_model::is_external(t)
            && t.dims.iter().product::<i64>() > FED_WEIGHT_ELEMENTS as i64;
        match fed.then(|| Tensor::from_proto(t).ok()).flatten() {
            Some(value) => {
                sub.input.push(value_info(&name, &value));
                alike_feeds.push((name, value));
            }
            None => {
                let mut t = t.clone();
                t.name = Some(name);
                sub.initializer.push(t);
            }
        }
    }
    sub.output = outputs.iter().map(|(o, _)| ValueInfoProto { name: Some(o.clone()), ..Default::default() }).collect();
    Some((ModelProto { graph: Some(sub), ..proto.clone() }, alike_feeds, outputs))
}

/// [`run_node`] for the node's [`alike`] form, in the session its repeats share (built on the
/// first). Outputs by the node's own names.
#[allow(clippy::too_many_arguments)]
fn run_alike(
    spec: &str,
    options: &OrtOptions,
    log_id: &str,
    model: &Model,
    proto: &ModelProto,
    feeds: &[(String, Tensor)],
    scratch: &std::path::Path,
    sessions: &mut Sessions,
) -> Result<HashMap<String, Result<Tensor, String>>, RuntimeError> {
    let Some((shared, shared_feeds, outputs)) = alike(proto, feeds) else {
        return Err(RuntimeError::Ort { backend: spec.to_string(), why: "no shared form".into() });
    };
    let key = prost::Message::encode_to_vec(&shared);
    let session = match sessions.0.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let (bytes, folder) = model.runtime_bytes(&shared, scratch)?;
            let extras = SessionExtras { without_spinning: true, ..Default::default() };
            e.insert(build_session(
                spec,
                options,
                log_id,
                ModelSource::Memory { bytes: &bytes, external_folder: folder.as_deref() },
                OptLevel::Disable,
                extras,
            )?)
        }
    };
    let mut out = run_session(session, &shared_feeds, spec)?;
    Ok(outputs.into_iter().filter_map(|(shared, own)| Some((own, out.remove(&shared)?))).collect())
}

/// The one-node model with its FP16/BF16 inputs and initializers made float32 (values converted
/// exactly), its feeds likewise, and the reduced type they had; `None` when it has none.
fn widen(proto: &ModelProto, feeds: &[(String, Tensor)]) -> Option<(ModelProto, Vec<(String, Tensor)>, crate::DType)> {
    let mut low = None;
    let wide_feeds: Vec<(String, Tensor)> = feeds
        .iter()
        .map(|(n, t)| {
            if matches!(t.dtype(), crate::DType::F16 | crate::DType::BF16) {
                low = Some(t.dtype());
                (n.clone(), Tensor::new(t.shape.clone(), crate::TensorData::F32(t.to_f32().into_owned())))
            } else {
                (n.clone(), t.clone())
            }
        })
        .collect();
    let mut wide = proto.clone();
    let graph = wide.graph.as_mut()?;
    for v in graph.input.iter_mut() {
        if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) {
            if matches!(t.elem_type(), 10 | 16) {
                t.elem_type = Some(1);
            }
        }
    }
    for t in graph.initializer.iter_mut().filter(|t| matches!(t.data_type(), 10 | 16)) {
        let raw = t.raw_data.as_deref()?;
        let values: Vec<f32> = raw
            .chunks_exact(2)
            .map(|b| {
                let bits = u16::from_le_bytes([b[0], b[1]]);
                if t.data_type() == 10 {
                    half::f16::from_bits(bits).to_f32()
                } else {
                    half::bf16::from_bits(bits).to_f32()
                }
            })
            .collect();
        low = Some(if t.data_type() == 10 { crate::DType::F16 } else { crate::DType::BF16 });
        t.raw_data = Some(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into());
        t.data_type = Some(1);
    }
    low.map(|l| (wide, wide_feeds, l))
}

/// A float32 output of a widened node stored back in the reduced type.
fn narrow(t: &Tensor, low: crate::DType) -> Tensor {
    let v = t.to_f32();
    let data = match low {
        crate::DType::BF16 => crate::TensorData::BF16(v.iter().map(|&x| half::bf16::from_f32(x)).collect()),
        _ => crate::TensorData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect()),
    };
    Tensor::new(t.shape.clone(), data)
}

/// A graph input's value in its declared element type (a float32 sample fed to an FP16 input is
/// rounded, as a caller converting it would).
fn as_declared(t: &Tensor, declared: Option<&ValueInfoProto>) -> Tensor {
    let elem = declared.and_then(|v| match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(tt)) => Some(tt.elem_type()),
        _ => None,
    });
    match (&t.data, elem) {
        (crate::TensorData::F32(v), Some(10)) => {
            Tensor::new(t.shape.clone(), crate::TensorData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect()))
        }
        (crate::TensorData::F32(v), Some(16)) => {
            Tensor::new(t.shape.clone(), crate::TensorData::BF16(v.iter().map(|&x| half::bf16::from_f32(x)).collect()))
        }
        _ => t.clone(),
    }
}

/// The exact type and shape of a value, as a graph input of a one-node model.
fn value_info(name: &str, t: &Tensor) -> ValueInfoProto {
    let shape = TensorShapeProto {
        dim: t
            .shape
            .iter()
            .map(|&d| tensor_shape_proto::Dimension {
                value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
                ..Default::default()
            })
            .collect(),
    };
    let ty = TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(t.dtype().onnx()),
            shape: Some(shape),
        })),
        ..Default::default()
    };
    ValueInfoProto { name: Some(name.to_string()), r#type: Some(ty), ..Default::default() }
}
