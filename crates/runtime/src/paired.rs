//! Running a reference and a candidate as one ONNX Runtime session that reduces each pair of
//! tensors where it is computed, so that only the reductions' results leave the session.
//!
//! Two separate runs that return every tensor hold all of them at once (both runs' copies, for the
//! comparison). Here ONNX Runtime computes both programs in one graph (`layerwise_model::pair`);
//! a custom operator receives each reference tensor with its candidate twin as soon as both
//! exist, hands them to a [`PairReducer`], and ONNX Runtime frees them once nothing else reads
//! them. Memory then follows the model's live tensors, not the number of tensors compared.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use layerwise_model::onnx::{ModelProto, TypeProto, ValueInfoProto};
use layerwise_model::pair::{
    paired_graph_of, split_paired, Side, CANDIDATE_PREFIX, PAIR_DOMAIN, PAIR_OP, PAIR_TENSOR_ATTR,
};
use ort::operator::{
    BoxedKernel, ComputeContext, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput,
};
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, TensorElementType, ValueType};

use crate::backend::OnnxProgram;
use crate::ort_backend::{build_session, feed, from_ort_value, ModelSource, SessionExtras};
use crate::spec::{OptLevel, OrtOptions};
use crate::{DType, RuntimeError, Tensor};

pub use layerwise_model::pair::{Operand, PairReducer};

/// The outcome of a paired run besides what the reducer kept.
#[derive(Debug, Default, Clone)]
pub struct PairedRun {
    /// Tensors the reducer received, in the order asked.
    pub paired: Vec<String>,
    /// Tensors asked for that one side does not have, with the reason.
    pub unavailable: Vec<(String, String)>,
    pub ref_notes: Vec<String>,
    pub cand_notes: Vec<String>,
    /// Nodes in the paired graph (both programs and the reductions).
    pub nodes: usize,
    /// ONNX Runtime sessions the paired graph ran in: 1, or the segments it was split into.
    pub segments: usize,
}

/// Nodes per segment where a paired graph is split ([`PairedSession::build`]): ONNX Runtime's
/// session build grows faster than the graph, and pieces of this size build at about the same
/// time per node as small graphs (docs/performance.md, "Graph size").
pub const SEGMENT_NODES: usize = 1000;

/// The segment size: [`SEGMENT_NODES`], or `LAYERWISE_PAIRED_SEGMENT_NODES` where set (for
/// benchmarks and checks of the split; 0 keeps every graph in one session).
fn segment_nodes() -> usize {
    match std::env::var("LAYERWISE_PAIRED_SEGMENT_NODES").ok().and_then(|v| v.trim().parse::<usize>().ok()) {
        Some(0) => usize::MAX,
        Some(n) => n,
        None => SEGMENT_NODES,
    }
}

/// Runs `reference` and `candidate` as one session on `inputs`, handing each tensor of `tensors`
/// that both compute to `reducer`: [`PairedSession::build`], then one [`PairedSession::run`].
pub fn run_paired(
    model: &layerwise_model::Model,
    reference: OnnxProgram,
    candidate: OnnxProgram,
    tensors: &[String],
    inputs: &[(String, Tensor)],
    reducer: Arc<dyn PairReducer>,
) -> Result<PairedRun, RuntimeError> {
    let shapes: Vec<(String, Vec<usize>)> = inputs.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
    let programs = Programs { model, candidate_model: model, reference, candidate, candidate_names: &HashMap::new() };
    PairedSession::build(programs, tensors, &shapes, false)?.run(inputs, reducer)
}

/// The two programs a paired session computes, and the models they come from.
pub struct Programs<'a> {
    /// The reference's model: its folder is where external weights are read.
    pub model: &'a layerwise_model::Model,
    /// The candidate's model: `model` itself, or `--cand-model`'s.
    pub candidate_model: &'a layerwise_model::Model,
    pub reference: OnnxProgram,
    pub candidate: OnnxProgram,
    /// Reference tensor -> the candidate's tensor holding its value, where the names differ.
    pub candidate_names: &'a HashMap<String, String>,
}

/// The reducer the next run hands its pairs to (a session outlives one run's reducer).
type ReducerSlot = Arc<Mutex<Option<Arc<dyn PairReducer>>>>;

/// A paired session, built once and run for as many samples as share its programs: one ONNX
/// Runtime session, or several run one after the other, each fed at its border with the values
/// the earlier ones computed.
pub struct PairedSession {
    segments: Vec<SegmentSession>,
    reducer: ReducerSlot,
    label: String,
    log_id: String,
    /// What every run reports besides the log lines of that run.
    template: PairedRun,
    /// Whether segment sessions stay built for later samples (else each is released once run).
    keep_sessions: bool,
    /// The types ONNX Runtime gave the values crossing a border, declared where they are read.
    border_types: HashMap<String, TypeProto>,
    options: OrtOptions,
    /// Holds the weights file the session maps.
    _scratch: layerwise_model::scratch::ScratchDir,
}

/// One ONNX Runtime session of a paired graph, and what crosses its borders.
struct SegmentSession {
    /// Built up front where sessions are kept for later samples, else when its turn comes.
    session: Option<Session>,
    /// The segment's graph with its weights in `folder`, without the inputs it reads from earlier
    /// segments (their types are known once those are built): what its session is built from.
    bytes: Vec<u8>,
    folder: std::path::PathBuf,
    /// Values from earlier segments it reads.
    reads: Vec<String>,
    /// Its outputs that later segments read.
    passed_on: Vec<String>,
    /// Values from earlier segments that no later segment reads: freed once this one ran.
    last_read_here: Vec<String>,
}

impl PairedSession {
    /// Builds the session: both programs must use the same execution provider and threads (the
    /// session is one); it runs with optimizations disabled, since each program carries its own.
    /// It is built for inputs of `input_shapes` (name, dimensions) and runs inputs of those shapes.
    /// `keep_sessions`: every segment's session is built up front and kept for later samples;
    /// without, each is built when its turn comes and released once it ran, so that ONNX Runtime
    /// holds one segment at a time (for a single sample, which needs no session twice).
    pub fn build(
        programs: Programs<'_>,
        tensors: &[String],
        input_shapes: &[(String, Vec<usize>)],
        keep_sessions: bool,
    ) -> Result<PairedSession, RuntimeError> {
        Self::build_in_segments(programs, tensors, input_shapes, segment_nodes(), keep_sessions)
    }

    /// [`PairedSession::build`], with a paired graph of more than `max_nodes` nodes split into
    /// segments of at most that many ([`split_paired`]), each its own session.
    pub fn build_in_segments(
        programs: Programs<'_>,
        tensors: &[String],
        input_shapes: &[(String, Vec<usize>)],
        max_nodes: usize,
        keep_sessions: bool,
    ) -> Result<PairedSession, RuntimeError> {
        let Programs { model, candidate_model, reference, candidate, candidate_names } = programs;
        let label = format!("{} with {}", reference.spec, candidate.spec);
        let err = |why: String| RuntimeError::Ort { backend: label.clone(), why };
        if reference.options.ep != candidate.options.ep || reference.options.threads != candidate.options.threads {
            return Err(err("the two sides run on different execution providers or thread counts".into()));
        }
        // External weights stay where they are, read by both sides from the reference model's
        // folder (one session has one): a candidate model's own must lie there too.
        let external =
            |p: &ModelProto| p.graph.as_ref().is_some_and(|g| g.initializer.iter().any(layerwise_model::is_external));
        let weights_in_place = external(&reference.proto) || external(&candidate.proto);
        if external(&candidate.proto) && !model.same_folder(candidate_model) {
            return Err(err("the candidate model keeps external data in another folder than the reference model's, and one session reads external data from one folder".into()));
        }
        // What a side says it does not compute (a folding engine's BatchNorm parameters) is not
        // paired, even where the tensor still exists in its graph.
        let reason = |t: &str| {
            reference.unavailable.iter().chain(&candidate.unavailable).find(|(n, _)| n == t).map(|(_, why)| why.clone())
        };
        let (mut declined, mut kept) = (Vec::new(), Vec::new());
        for t in tensors {
            match reason(t) {
                Some(why) => declined.push((t.clone(), why)),
                None => kept.push(t.clone()),
            }
        }
        // The programs' nodes and weights move into the paired graph: with the programs gone,
        // each weight's memory goes as it is written out, and ONNX Runtime maps the file instead
        // of parsing copies.
        crate::ort_backend::timing_mark(|| "paired build: start".into());
        let mut graph = paired_graph_of(reference.proto, candidate.proto, &kept, candidate_names)?;
        crate::ort_backend::timing_mark(|| "paired build: paired graph".into());
        if let Some(g) = graph.proto.graph.as_mut() {
            layerwise_model::pair::pin_input_shapes(g, input_shapes);
        }
        let mut template = PairedRun {
            paired: graph.paired,
            ref_notes: reference.notes,
            cand_notes: candidate.notes,
            unavailable: declined,
            ..Default::default()
        };
        for (t, side) in graph.missing {
            let why = match side {
                Side::Reference => reference
                    .unavailable
                    .iter()
                    .find(|(n, _)| *n == t)
                    .map_or("missing from the reference run".into(), |(_, w)| w.clone()),
                Side::Candidate => candidate
                    .unavailable
                    .iter()
                    .find(|(n, _)| *n == t)
                    .map_or("missing from the candidate run".into(), |(_, w)| w.clone()),
            };
            template.unavailable.push((t, why));
        }
        template.nodes = graph.proto.graph.as_ref().map_or(0, |g| g.node.len());
        let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-")
            .map_err(|e| RuntimeError::Io { path: std::env::temp_dir(), cause: e })?;
        let reducer: ReducerSlot = Arc::new(Mutex::new(None));
        let options = OrtOptions { opt_level: OptLevel::Disable, ..reference.options.clone() };
        // The segments share the weights' bytes: each weight goes once its last is written.
        let pieces = match split_paired(graph.proto, max_nodes) {
            Ok(segments) => segments.into_iter().map(|s| (s.proto, s.border_inputs, s.border_outputs)).collect(),
            Err(whole) => vec![(whole, Vec::new(), Vec::new())],
        };
        crate::ort_backend::timing_mark(|| "paired build: split".into());
        template.segments = pieces.len();
        // The last segment reading each border value.
        let mut last_reader: HashMap<&str, usize> = HashMap::new();
        for (k, (_, reads, _)) in pieces.iter().enumerate() {
            for name in reads {
                last_reader.insert(name, k);
            }
        }
        let mut last_read_here: Vec<Vec<String>> = vec![Vec::new(); pieces.len()];
        for (name, k) in last_reader {
            last_read_here[k].push(name.to_string());
        }
        crate::ort_backend::release_freed_memory();
        let mut segments = Vec::with_capacity(pieces.len());
        for (k, ((proto, reads, passed_on), last_read_here)) in pieces.into_iter().zip(last_read_here).enumerate() {
            // Each segment writes its weights in its own folder.
            let folder = scratch.path().join(format!("segment-{k}"));
            std::fs::create_dir_all(&folder).map_err(|e| RuntimeError::Io { path: folder.clone(), cause: e })?;
            let (bytes, folder) = if weights_in_place {
                // Both sides map the model's own weight file; nothing is copied.
                let (bytes, external) = model.runtime_bytes(&proto, &folder)?;
                (bytes, external.unwrap_or(folder))
            } else {
                model.runtime_bytes_weights_apart(proto, &folder)?
            };
            segments.push(SegmentSession { session: None, bytes, folder, reads, passed_on, last_read_here });
        }
        let mut paired = PairedSession {
            segments,
            reducer,
            label,
            log_id: reference.log_id,
            template,
            keep_sessions,
            border_types: HashMap::new(),
            options,
            _scratch: scratch,
        };
        // Kept sessions are all built before the first runs: a segment ONNX Runtime refuses then
        // fails the build, before anything ran. Building each when its turn comes and releasing it
        // once run holds ONNX Runtime to one segment (decoder 400: 340 MB against 595 MB), but
        // every build costs more than the one before it in the allocator (Relu chain of 50,000:
        // 17-20 s against 9 s; docs/performance.md): worth it for one sample only.
        if keep_sessions {
            for k in 0..paired.segments.len() {
                paired.build_segment(k)?;
            }
        }
        Ok(paired)
    }

    /// Builds segment `k`'s session (the segments before it built already, for the types of the
    /// values it reads from them).
    fn build_segment(&mut self, k: usize) -> Result<(), RuntimeError> {
        use prost::Message;
        let label = &self.label;
        let err = |why: String| RuntimeError::Ort { backend: label.clone(), why };
        let count = self.segments.len();
        let segment = &mut self.segments[k];
        let mut proto = ModelProto::decode(segment.bytes.as_slice())
            .map_err(|e| err(format!("segment {k}'s graph cannot be read back: {e}")))?;
        if let Some(g) = proto.graph.as_mut() {
            for name in &segment.reads {
                let ty = self.border_types.get(name).cloned().ok_or_else(|| {
                    err(format!("segment {k} reads '{name}', which no earlier segment passes on as a tensor"))
                })?;
                g.input.push(ValueInfoProto { name: Some(name.clone()), r#type: Some(ty), ..Default::default() });
            }
        }
        let bytes = proto.encode_to_vec();
        drop(proto);
        let domain = OperatorDomain::new(PAIR_DOMAIN)
            .and_then(|d| d.add(ReducePair { reducer: self.reducer.clone() }))
            .map_err(|e| err(format!("cannot register layerwise's operators: {e}")))?;
        // The segments' threads sleep between runs: each session has its own pool, and spinning
        // pools of a large model's segments cost 3x the build CPU (measured, docs/performance.md).
        let split = count > 1;
        let extras = SessionExtras {
            optimized_path: None,
            operators: Some(domain),
            without_arena: split,
            without_spinning: split,
        };
        let source = ModelSource::Memory { bytes: &bytes, external_folder: Some(&segment.folder) };
        let session = build_session(label, &self.options, &self.log_id, source, OptLevel::Disable, extras)?;
        crate::ort_backend::timing_mark(|| format!("paired build: segment {k} of {count}"));
        for output in session.outputs().iter().filter(|o| segment.passed_on.iter().any(|n| n == o.name())) {
            if let Some(ty) = tensor_type(output.dtype()) {
                self.border_types.insert(output.name().to_string(), ty);
            }
        }
        segment.session = Some(session);
        Ok(())
    }

    /// Runs the session on `inputs`, handing each pair to `reducer`.
    pub fn run(
        &mut self,
        inputs: &[(String, Tensor)],
        reducer: Arc<dyn PairReducer>,
    ) -> Result<PairedRun, RuntimeError> {
        *self.reducer.lock().unwrap_or_else(|p| p.into_inner()) = Some(reducer);
        let result = self.run_segments(inputs);
        *self.reducer.lock().unwrap_or_else(|p| p.into_inner()) = None;
        result?;
        let mut run = self.template.clone();
        // The session's lines go to the side they are about: candidate names carry the prefix.
        for mut line in crate::backend_log::take(&self.log_id) {
            let notes = if line.message.contains(CANDIDATE_PREFIX) {
                line.message = line.message.replace(CANDIDATE_PREFIX, "");
                &mut run.cand_notes
            } else {
                &mut run.ref_notes
            };
            let note = line.note();
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
        // Lines of the build come with the first run only; later runs keep them too.
        self.template.ref_notes.clone_from(&run.ref_notes);
        self.template.cand_notes.clone_from(&run.cand_notes);
        Ok(run)
    }
}

impl PairedSession {
    /// Runs the segments in order, each fed with the graph inputs it reads and the values earlier
    /// segments passed on; a value is freed after the last segment that reads it.
    fn run_segments(&mut self, inputs: &[(String, Tensor)]) -> Result<(), RuntimeError> {
        let label = &self.label.clone();
        let err = |why: String| RuntimeError::Ort { backend: label.clone(), why };
        let mut border: HashMap<String, DynValue> = HashMap::new();
        // Graph inputs, converted once however many segments read them.
        let mut fed: HashMap<String, DynValue> = HashMap::new();
        let split = self.segments.len() > 1;
        for k in 0..self.segments.len() {
            if self.segments[k].session.is_none() {
                self.build_segment(k)?;
            }
            let segment = &mut self.segments[k];
            let session = segment.session.as_mut().expect("built just above");
            for input in session.inputs() {
                if !border.contains_key(input.name()) && !fed.contains_key(input.name()) {
                    fed.insert(input.name().to_string(), feed(input, inputs, label)?);
                }
            }
            let feeds: Vec<(String, SessionInputValue<'_>)> = session
                .inputs()
                .iter()
                .map(|i| {
                    let value =
                        border.get(i.name()).or_else(|| fed.get(i.name())).expect("every input has a value above");
                    (i.name().to_string(), SessionInputValue::from(value))
                })
                .collect();
            let passed_on = &segment.passed_on;
            // The values passed on leave the outputs inside the guarded run (the outputs borrow its
            // options); the rest are dropped with them.
            let passed: Vec<(String, DynValue)> = crate::run_guard::guarded(
                ort::session::RunOptions::new().map_err(|e| err(format!("run failed: {e}")))?,
                |o| {
                    session.run_with_options(feeds, o).map(|mut outputs| {
                        passed_on.iter().filter_map(|n| outputs.remove(n).map(|v| (n.clone(), v))).collect()
                    })
                },
            )
            .map_err(|e| match e {
                crate::run_guard::RunError::Memory(why) => RuntimeError::Memory(format!("the paired run: {why}")),
                e => err(format!("run failed: {e}")),
            })?;
            for name in &segment.last_read_here {
                border.remove(name);
            }
            border.extend(passed);
            if !self.keep_sessions {
                segment.session = None;
            }
            if split {
                // What the segment's kernels freed goes back to the system before the next one runs.
                crate::ort_backend::release_freed_memory();
            }
        }
        Ok(())
    }
}

/// The ONNX type of a value that crosses a segment border, as ONNX Runtime inferred it (`None` for
/// what is not a tensor: the segment reading it then says so).
fn tensor_type(value: &ValueType) -> Option<TypeProto> {
    use layerwise_model::onnx::{
        tensor_shape_proto::dimension::Value as Dim, tensor_shape_proto::Dimension, type_proto, TensorShapeProto,
    };
    let ValueType::Tensor { ty, shape, dimension_symbols } = value else { return None };
    let dim = shape
        .iter()
        .zip(dimension_symbols.iter())
        .map(|(&d, symbol)| Dimension {
            value: match (d, symbol.is_empty()) {
                (d, _) if d >= 0 => Some(Dim::DimValue(d)),
                (_, false) => Some(Dim::DimParam(symbol.clone())),
                _ => None,
            },
            ..Default::default()
        })
        .collect();
    let elem_type = ort::sys::ONNXTensorElementDataType::from(*ty) as i32;
    Some(TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(elem_type),
            shape: Some(TensorShapeProto { dim }),
        })),
        ..Default::default()
    })
}

/// The reduction node: two tensors of any type in, a scalar out (the graph needs an output to
/// run the node); the work is the reducer's.
struct ReducePair {
    reducer: ReducerSlot,
}

impl Operator for ReducePair {
    type Kernel<'attr> = BoxedKernel<'attr>;

    fn name(&self) -> &str {
        PAIR_OP
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        // Variadic without a type: the two sides may be any element type, and differ.
        [OperatorInput::variadic(2)]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, kctx: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        let tensor: String = kctx
            .get(PAIR_TENSOR_ATTR)
            .ok_or_else(|| ort::Error::new(format!("{PAIR_OP} needs its '{PAIR_TENSOR_ATTR}' attribute")))?;
        let slot = self.reducer.clone();
        Ok(Box::new(move |ctx: &ComputeContext| {
            let reference = ctx.input(0)?.ok_or_else(|| ort::Error::new("no reference input"))?;
            let candidate = ctx.input(1)?.ok_or_else(|| ort::Error::new("no candidate input"))?;
            let reducer = slot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .ok_or_else(|| ort::Error::new("no reducer for this run"))?;
            reducer.reduce(&tensor, operand(&reference), operand(&candidate));
            let mut out = ctx.output(0, Vec::<i64>::new())?.ok_or_else(|| ort::Error::new("no output"))?;
            let (_, data) = out.try_extract_tensor_mut::<f32>()?;
            data.fill(0.0);
            Ok(())
        }))
    }
}

fn operand<'a>(value: &'a ort::value::DynValue) -> Operand<'a> {
    let shape_of = |s: &[i64]| s.iter().map(|&d| d.max(0) as usize).collect::<Vec<_>>();
    if let ValueType::Tensor { ty: TensorElementType::Float32, .. } = value.dtype() {
        if let Ok((shape, data)) = value.try_extract_tensor::<f32>() {
            return Operand { shape: shape_of(shape), dtype: Ok(DType::F32), values: Cow::Borrowed(data) };
        }
    }
    match from_ort_value(value) {
        Ok(t) => Operand { shape: t.shape.clone(), dtype: Ok(t.dtype()), values: Cow::Owned(t.to_f32().into_owned()) },
        Err(why) => Operand { shape: Vec::new(), dtype: Err(why), values: Cow::Borrowed(&[]) },
    }
}
