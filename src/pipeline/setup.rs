//! Stage 1, the plan: everything a bisect (or a fix) decides before comparing anything. The
//! backends (on their GPU), the samples, control flow as the reference ran it, the candidate
//! model and how its tensors pair with the reference's, the precision the candidate computes in,
//! and the tolerances and walk rule for it.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use layerwise_analysis::{
    compare_all, walk_back, Candidate, Comparison, ControlFlow, Pattern, TensorMatching, Tolerance, ToleranceSet,
    Verdict, WalkRule,
};
use layerwise_model::matching::{match_tensors, MatchedBy};
use layerwise_model::perturb::Perturbation;
use layerwise_model::{Arithmetic, GraphIndex, Model, QuantFamily, Rounding, Selection, WeightRange};
use layerwise_runtime::inputs::{declared_inputs, prepare_inputs, InputDecl, InputOptions};
use layerwise_runtime::ortlib::fit_for_onnx_runtime;
use layerwise_runtime::typed::TypedBackend;
use layerwise_runtime::{create_backend, Backend, BackendSpec, Precision, RuntimeError, Tensor};

use super::control_flow::flatten_control_flow;
use super::options::{BisectOptions, Marking, ToleranceField};
use super::steps::Steps;

/// The model outputs a Concat computes, with the size of each of its inputs along its axis: what
/// [`layerwise_analysis::OutputJudge`] judges part by part where their scales differ by orders of
/// magnitude. Sizes come from ONNX Runtime's shape inference; an output whose parts it cannot size
/// (a dimension known only at run time) is judged whole.
fn output_parts(model: &Model, index: &GraphIndex) -> HashMap<String, layerwise_analysis::OutputParts> {
    let concats: Vec<(&String, &layerwise_model::NodeInfo)> = index
        .outputs
        .iter()
        .filter_map(|o| index.producer(o).filter(|p| p.op_type == "Concat" && p.inputs.len() >= 2).map(|p| (o, p)))
        .collect();
    if concats.is_empty() {
        return HashMap::new();
    }
    let Ok(types) = layerwise_runtime::tensor_types_for_any_shapes(model, index) else { return HashMap::new() };
    let mut parts = HashMap::new();
    for (output, concat) in concats {
        let node = &model.graph().node[concat.proto_index];
        let Some(axis) = node.attribute.iter().find(|a| a.name() == "axis").and_then(|a| a.i) else { continue };
        let Some(rank) = types.get(output).map(|t| t.dims.len()) else { continue };
        let Ok(axis) = usize::try_from(if axis < 0 { axis + rank as i64 } else { axis }) else { continue };
        // A graph input or a weight has its declared type; a computed tensor the inferred one.
        let sizes: Option<Vec<usize>> = concat
            .inputs
            .iter()
            .map(|i| {
                types.get(i).map(|t| t.dims.clone()).or_else(|| declared_dims(model, i))?.get(axis).copied().flatten()
            })
            .collect();
        if let Some(sizes) = sizes {
            parts.insert(output.clone(), layerwise_analysis::OutputParts { axis, sizes });
        }
    }
    parts
}

/// The dimensions a graph input or an initializer declares (`None` where one is not fixed).
fn declared_dims(model: &Model, tensor: &str) -> Option<Vec<Option<usize>>> {
    let graph = model.graph();
    if let Some(w) = graph.initializer.iter().find(|w| w.name() == tensor) {
        return Some(w.dims.iter().map(|&d| usize::try_from(d).ok()).collect());
    }
    let input = graph.input.iter().find(|v| v.name() == tensor)?;
    use layerwise_model::onnx::{tensor_shape_proto::dimension::Value as DimValue, type_proto::Value};
    let Value::TensorType(t) = input.r#type.as_ref()?.value.as_ref()? else { return None };
    Some(
        t.shape
            .as_ref()?
            .dim
            .iter()
            .map(|d| match d.value {
                Some(DimValue::DimValue(v)) => usize::try_from(v).ok(),
                _ => None,
            })
            .collect(),
    )
}

/// What the candidate is judged by: its arithmetic (whose name keys the default tolerances), the
/// tolerances, and the walk's thresholds.
#[derive(Debug, Clone)]
pub(crate) struct Judging {
    /// Every tensor's tolerance (`all`), with those given their own (`--atol logits:1e-3`).
    pub tolerances: ToleranceSet,
    pub rule: WalkRule,
    /// The candidate's arithmetic and absolute tolerance, as the walk reads them.
    pub candidate: Candidate,
    /// A Q/DQ candidate model's quantizers: it is judged by their formats' steps.
    pub quantization: Option<layerwise_model::quant::Quantization>,
}

impl Judging {
    /// Judging a candidate that stores values in `precision`, with TF32 tensor cores or not.
    pub(crate) fn new(
        precision: Precision,
        tf32: bool,
        options: &BisectOptions,
        reference: (&Model, &GraphIndex),
    ) -> Result<Judging> {
        Judging::of(Arithmetic::of(precision, tf32), options, reference)
    }

    /// Judging a Q/DQ candidate model that computes in float32 between its quantizers: by the
    /// defaults of its coarsest format (`INT8`, `FP8 E4M3`, ...).
    pub(crate) fn quantized(
        quantization: layerwise_model::quant::Quantization,
        options: &BisectOptions,
        reference: (&Model, &GraphIndex),
    ) -> Result<Judging> {
        let family = quantization.coarsest().map_or(QuantFamily::Int8, |f| f.family());
        let mut judging = Judging::of(Arithmetic::Quantized(family), options, reference)?;
        judging.quantization = Some(quantization);
        Ok(judging)
    }

    /// The defaults of `arithmetic` (tolerances and walk rule), with the user's tolerances over
    /// them, field by field and tensor by tensor, the integers of the reference's graph judged
    /// exactly where none was given, and its outputs a Concat joins judged part by part.
    fn of(arithmetic: Arithmetic, options: &BisectOptions, (model, index): (&Model, &GraphIndex)) -> Result<Judging> {
        let (defaults, rule) = layerwise_analysis::defaults_and_rule(arithmetic);
        let tolerance = given_or_default(defaults, options)?;
        let mut by_tensor: Vec<(String, Tolerance)> = Vec::new();
        for (tensor, field, value) in &options.tensor_tolerances {
            if !(*value >= 0.0 && value.is_finite()) {
                bail!("the tolerance given for '{tensor}' must be a non-negative number, not {value}");
            }
            let entry = match by_tensor.iter_mut().find(|(t, _)| t == tensor) {
                Some((_, tol)) => tol,
                None => {
                    by_tensor.push((tensor.clone(), tolerance));
                    &mut by_tensor.last_mut().expect("just pushed").1
                }
            };
            match field {
                ToleranceField::Atol => entry.atol = *value,
                ToleranceField::Rtol => entry.rtol = *value,
                ToleranceField::RangeTol => entry.range_tol = *value,
            }
        }
        let tolerances = ToleranceSet {
            by_tensor,
            output_parts: std::sync::Arc::new(output_parts(model, index)),
            ..ToleranceSet::from(tolerance)
        }
        .with_integers_of(index);
        Ok(Judging { tolerances, rule, candidate: Candidate { arithmetic, atol: tolerance.atol }, quantization: None })
    }

    /// What the candidate's quantizer `range` does to the reference's `values` of `tensor`; of a
    /// model output a Concat joins, part by part too, as that output is judged.
    pub(crate) fn quantizer_effect(
        &self,
        tensor: &str,
        range: &layerwise_model::quant::QuantizerRange,
        values: &Tensor,
    ) -> layerwise_model::quant::QuantizerEffect {
        let flat = values.to_f32();
        let mut effect = layerwise_model::quant::quantizer_effect(range, &flat, &values.shape);
        effect.worst_part = self
            .tolerances
            .output_parts
            .get(tensor)
            .and_then(|p| layerwise_model::quant::part_loss(range, &flat, &values.shape, p.axis, &p.sizes));
        effect
    }

    /// How the candidate stores values between ops.
    pub(crate) fn precision(&self) -> Precision {
        self.candidate.arithmetic.storage()
    }

    /// Every tensor of `order` the candidate computed, against the reference's, by these tolerances.
    pub(crate) fn compare(
        &self,
        index: &GraphIndex,
        order: &[String],
        reference: &HashMap<String, Tensor>,
        candidate: &HashMap<String, Tensor>,
    ) -> Comparison {
        compare_all(index, order, reference, candidate, &self.tolerances)
    }

    /// The walk back from the worst output of a comparison, with the inf/NaN the inputs held
    /// noted first: bisect's stage 4 and every candidate run of `fix`.
    pub(crate) fn walk(
        &self,
        index: &GraphIndex,
        comparison: &mut Comparison,
        feeds: &[(String, Tensor)],
        weights: &[WeightRange],
    ) -> Verdict {
        comparison.note_input_nonfinite(feeds);
        walk_back(index, comparison, weights, self.rule, self.candidate)
    }

    /// What keeping the break at `node` at reference precision keeps, in bisect's counterfactual,
    /// its noise floor and `fix` alike ([`layerwise_analysis::keep_pattern`]).
    pub(crate) fn keep_pattern(
        &self,
        index: &GraphIndex,
        node: &str,
        comparison: &Comparison,
        verdict: &Verdict,
    ) -> Pattern {
        layerwise_analysis::keep_pattern(index, node, comparison, verdict, self.precision() == Precision::Fp16)
    }

    /// What one rounding of the candidate's precision does to the weights, for the noise floor:
    /// FP16 and BF16 round every stored weight, TF32 only what the tensor cores read, float32
    /// every operation by one unit roundoff.
    pub(crate) fn perturbation(&self) -> Perturbation {
        match self.candidate.arithmetic {
            Arithmetic::Fp16 { .. } => Perturbation::Storage(Rounding::Fp16),
            Arithmetic::Bf16 { .. } => Perturbation::Storage(Rounding::Bf16),
            Arithmetic::Float32 { tf32: true } => Perturbation::TensorCores,
            Arithmetic::Float32 { tf32: false } | Arithmetic::Quantized(_) => {
                Perturbation::Relative(Precision::Fp32.unit_roundoff())
            }
        }
    }
}

/// The reference weights a converted candidate model keeps in float32 (same name, float32 in the
/// candidate file): its precision does not change them. Also whether the file's weights could be
/// told apart by name at all: where most of the reference's weights are not found in it (another
/// exporter's names), which it keeps in float32 is unknown and every weight is perturbed.
pub(crate) fn weights_kept_float32(
    reference: &Model,
    cand_model: Option<&(Model, GraphIndex)>,
) -> (HashSet<String>, bool) {
    let Some((cm, _)) = cand_model else { return (HashSet::new(), true) };
    let theirs: HashSet<&str> = cm.graph().initializer.iter().map(|t| t.name()).collect();
    let ours = &reference.graph().initializer;
    let found = ours.iter().filter(|t| theirs.contains(t.name())).count();
    let kept = cm
        .graph()
        .initializer
        .iter()
        .filter(|t| t.data_type() == layerwise_model::DataType::Float as i32)
        .map(|t| t.name().to_string())
        .collect();
    (kept, ours.is_empty() || found * 2 >= ours.len())
}

/// The plan's outcome.
pub(crate) struct Setup<'m> {
    /// The model both sides run: the original, or its control flow as the reference ran it.
    pub model: Cow<'m, Model>,
    pub index: GraphIndex,
    /// A different model for the candidate (`--cand-model`), and reference tensor -> the
    /// candidate model's tensor holding its value.
    pub cand_model: Option<(Model, GraphIndex)>,
    pub cand_names: HashMap<String, String>,
    pub reference: Box<dyn Backend>,
    pub candidate: Box<dyn Backend>,
    /// The inputs to prepare: the reference's, and a candidate model's that the reference lacks.
    pub decls: Vec<InputDecl>,
    /// Which model declares which input, for errors about the inputs.
    pub owners: InputOwners,
    /// Inputs fed to one side only, for the report's notes.
    pub input_notes: Vec<String>,
    /// This run's samples (a shard's share), and how many the whole set holds.
    pub samples: Vec<(String, InputOptions)>,
    pub total_samples: usize,
    /// With `--shard`: the digest of the whole folder's samples (`Shard::samples_digest`).
    pub samples_digest: Option<String>,
    pub judging: Judging,
    /// The tensors compared, in topological order.
    pub order: Vec<String>,
    pub control_flow: Option<ControlFlow>,
    pub matching: Option<TensorMatching>,
    /// `sim:int8` / `sim:fp8`: the config and ranges the candidate model was quantized with.
    pub sim_quant: Option<super::sim_quant::SimQuantized>,
    /// The candidate file as it is, where `cand_model` is its Q/DQ form (a QOperator or
    /// dynamically quantized file): what runs as deployed.
    pub deployed_file: Option<(Model, GraphIndex)>,
    /// The integer ops read in the Q/DQ form.
    pub lifted: Vec<layerwise_model::qdq_form::Lifted>,
}

/// Stage 1: the plan of a bisect of `original` with `options`.
pub(crate) fn set_up<'m>(original: &'m Model, options: &BisectOptions, steps: &mut Steps) -> Result<Setup<'m>> {
    // Every run from here on is stopped where it grows the process past --max-memory (or most of
    // the memory available): the plan below knows only the reference's shapes.
    layerwise_runtime::run_guard::set_limit(options.max_memory);
    // A model saved by a newer onnx package: given to ONNX Runtime at the IR version it reads.
    let (original, ir_note) = fit_for_onnx_runtime(original)?;
    let mut input_notes: Vec<String> = ir_note.into_iter().collect();
    // Model-local functions inlined: the tensors inside each call are compared, and both sides
    // of a paired run see one plain graph.
    let original = match layerwise_model::functions::inline_functions(&original.proto)? {
        None => original,
        Some((proto, calls)) => {
            input_notes.push(format!("{calls} calls of the model's own ONNX functions inlined: their nodes and tensors are named after the calling node (CALL/NAME) and compared"));
            // The same model, opened: its file, folder and digest stay (no copy of the old proto).
            Cow::Owned(Model {
                proto,
                path: original.path.clone(),
                base_dir: original.base_dir.clone(),
                sha256: original.sha256.clone(),
                attribute_files: original.attribute_files.clone(),
            })
        }
    };
    let index = GraphIndex::build(original.graph()).with_context(|| format!("{}", original.path.display()))?;
    let on_device = |spec: &BackendSpec| match options.device {
        Some(device) => spec.on_device(device),
        None => Ok(spec.clone()),
    };
    let mut reference = create_backend(&on_device(&options.reference).context("--ref")?).context("--ref")?;
    let mut candidate = create_backend(&on_device(&options.candidate).context("--cand")?).context("--cand")?;
    // A candidate model may declare other inputs than the reference (a twin exported without an
    // input that its sibling takes): each side gets the inputs it declares, the samples hold the
    // union, and an input fed to one side only is noted.
    // `sim:int8` / `sim:fp8` make their own Q/DQ model of the float32 one.
    let quantized_emulation = options.candidate.quantized_emulation();
    if quantized_emulation.is_some() {
        if let Some(path) = &options.cand_model {
            bail!(
                "--cand {} quantizes the float32 model itself, so it takes no --cand-model ({}): judge a Q/DQ model you made with --cand ort:cpu --cand-model {}",
                options.candidate,
                path.display(),
                path.display()
            );
        }
    } else if let Some(path) = &options.quant_config {
        bail!("--quant-config {} is for --cand sim:int8 or sim:fp8, not --cand {}", path.display(), options.candidate);
    }
    let quant_config = match quantized_emulation {
        Some(fp8) => Some(super::sim_quant::load_config(options.quant_config.as_deref(), fp8)?),
        None => None,
    };
    // The candidate file as it is, where it is read in another form (`qdq_form`), and what was read so.
    let mut deployed_file = None;
    let mut lifted = Vec::new();
    let mut loaded_cand = match &options.cand_model {
        Some(path) => {
            let loaded = steps.run("loading candidate model", || Model::load(path).map_err(Into::into))?;
            super::options::check_not_external_data(&loaded, "the candidate model's external data", options, &[])?;
            // An emulation rounds a float32 model; a file already converted runs as it is.
            if options.candidate.is_emulation() && layerwise_runtime::typed::has_reduced_precision(&loaded) {
                bail!(
                    "--cand {} emulates reduced precision on a float32 model, but {} is already converted (it declares FP16/BF16 tensors): run the file as it is with --cand ort:cpu --cand-model {} (evaluated in its own types), or give {} the float32 model",
                    options.candidate,
                    path.display(),
                    path.display(),
                    options.candidate
                );
            }
            let (cm, note) = fit_for_onnx_runtime(&loaded)?;
            input_notes.extend(note);
            let mut cm = cm.into_owned();
            let mut ci = GraphIndex::build(cm.graph()).with_context(|| format!("{}", cm.path.display()))?;
            // A QOperator or dynamically quantized file on ONNX Runtime is read in its Q/DQ form
            // (the same values), so its float tensors pair with the reference's; the file itself
            // is what runs as deployed.
            if matches!(options.candidate, BackendSpec::Ort(_)) && !layerwise_runtime::typed::has_reduced_precision(&cm)
            {
                if let Some(form) = layerwise_model::qdq_form::to_qdq_form(&cm.proto)? {
                    if !form.lifted.is_empty() {
                        input_notes.push(form.describe());
                        let as_read = GraphIndex::build(form.model.graph.as_ref().expect("a graph"))
                            .context("the candidate model in Q/DQ form")?;
                        let file = std::mem::replace(&mut cm.proto, form.model);
                        let mut deployed = cm.clone();
                        deployed.proto = file;
                        deployed_file = Some((deployed, std::mem::replace(&mut ci, as_read)));
                        lifted = form.lifted;
                    }
                }
            }
            Some((cm, ci))
        }
        None => None,
    };
    let reference_decls = declared_inputs(&original, &index);
    let mut decls = reference_decls.clone();
    let mut owners =
        InputOwners { reference: reference_decls.iter().map(|d| d.name.clone()).collect(), candidate: None };
    if let Some((cm, ci)) = &loaded_cand {
        let theirs = declared_inputs(cm, ci);
        for d in &reference_decls {
            if !theirs.iter().any(|c| c.name == d.name) {
                input_notes.push(format!(
                    "input '{}' is fed to the reference only: the candidate model does not declare it",
                    d.name
                ));
            }
        }
        for c in &theirs {
            if !reference_decls.iter().any(|d| d.name == c.name) {
                input_notes.push(format!(
                    "input '{}' is fed to the candidate model only: the reference does not declare it",
                    c.name
                ));
                decls.push(c.clone());
            }
        }
        owners.candidate = Some(theirs.iter().map(|d| d.name.clone()).collect());
    }
    let all_samples = samples(&options.inputs)?;
    // Calibration reads every sample, whichever shard this run takes.
    let calibration_samples = if quant_config.is_some() { all_samples.clone() } else { Vec::new() };
    // Decisions that depend on how many samples there are follow the whole set, so that a shard
    // reports exactly what a single run over every sample does.
    let total_samples = all_samples.len();
    let samples_digest = options.shard.map(|_| samples_digest(&all_samples));
    let samples: Vec<(String, InputOptions)> = match options.shard {
        None => all_samples,
        Some((i, n)) => {
            if options.inputs.npz.as_ref().is_none_or(|d| !d.is_dir()) {
                bail!("--shard splits the samples of --inputs DIR; give a folder of .npz files");
            }
            if n > total_samples {
                bail!("--shard {i}/{n}: the folder holds {total_samples} samples, so some shards would be empty; use at most {total_samples} shards");
            }
            all_samples.into_iter().enumerate().filter(|(k, _)| k % n == i).map(|(_, s)| s).collect()
        }
    };
    if total_samples > 1 && options.mark == Marking::Search {
        bail!("--mark search runs one sample; with --inputs DIR use --mark all (or pass one .npz file)");
    }
    // What the run will hold, estimated and refused here, before anything runs, where it cannot
    // fit --max-memory or the memory available.
    let held_samples =
        if options.holds_reference_tensors { samples.len() } else { usize::from(options.save_tensors.is_some()) };
    let whole = held_samples > 0;
    let sample_options = samples.iter().map(|(_, o)| o);
    layerwise_runtime::inputs::check_memory(
        &original,
        &index,
        &decls,
        sample_options,
        loaded_cand.as_ref().map(|(m, _)| m),
        options.max_memory,
        !options.separate_runs && !whole,
        held_samples,
    )?;
    // Control flow as the reference ran it: bodies become ordinary, comparable graph.
    let has_control_flow = |i: &GraphIndex| i.nodes.iter().any(|n| n.has_subgraphs);
    let mut control_flow = None;
    let mut flattened = None;
    if has_control_flow(&index) && !options.keep_control_flow {
        let all_feeds = sample_feeds(&decls, &samples, &owners)?;
        let result = steps.run("following control flow", || {
            flatten_control_flow(&original, reference.as_mut(), &all_feeds, "the reference")
        })?;
        if let Some((model, report)) = result {
            control_flow = Some(report);
            flattened = Some((GraphIndex::build(model.graph())?, model));
        }
    }
    let (index, model) = match flattened {
        Some((i, m)) => (i, Cow::Owned(m)),
        None => (index, original),
    };
    let mut sim_quant = None;
    if let Some(config) = quant_config {
        if layerwise_runtime::typed::has_reduced_precision(&model) {
            bail!(
                "--cand {} quantizes a float32 model, and {} declares FP16/BF16 tensors: give the float32 model",
                options.candidate,
                options.model.display()
            );
        }
        let feeds = sample_feeds(&decls, &calibration_samples, &owners)?;
        // Calibrated as quantize_static calibrates (ONNX Runtime's CPU provider, optimizations
        // off), whatever the reference: an optimized session moves ranges by a float32 bit, and
        // bisect and fix then quantize alike (they differed: 1.117e-1 against 1.13e-1).
        let mut calibrator = layerwise_runtime::create_backend(&layerwise_runtime::BackendSpec::parse(
            super::sim_quant::CALIBRATION_SPEC,
        )?)?;
        let (cm, quantized) = steps.run("calibrating and quantizing the model", || {
            super::sim_quant::quantized_candidate(&model, &index, calibrator.as_mut(), &feeds, config)
        })?;
        input_notes.push(quantized.note(&options.candidate.to_string()));
        let ci = GraphIndex::build(cm.graph()).context("the quantized model")?;
        loaded_cand = Some((cm, ci));
        sim_quant = Some(quantized);
    }
    // ONNX Runtime's CPU provider computes an FP16 model in float32: such a candidate runs one
    // node at a time in its own types instead (layerwise_runtime::typed), unless `typed=off`.
    if let Some((cm, _)) = &loaded_cand {
        if let Some(threads) = typed_candidate(&options.candidate, cm) {
            candidate = Box::new(TypedBackend::new(&options.candidate, threads));
        }
    }
    let cand_model = match loaded_cand {
        Some((mut cm, mut ci)) => {
            if has_control_flow(&ci) && !options.keep_control_flow {
                // The candidate model's own branches, as the candidate computes its conditions
                // (in its own types: ONNX Runtime's CPU provider would compute an FP16 file's in
                // float32); where the candidate cannot run that (TensorRT, saved tensors), as
                // ONNX Runtime's reference kernels run the file.
                let all_feeds = sample_feeds(&decls, &samples, &owners)?;
                let by_candidate = match options.candidate {
                    BackendSpec::Ort(_) => {
                        match flatten_control_flow(&cm, candidate.as_mut(), &all_feeds, "the candidate model") {
                            Ok(found) => Some(found),
                            Err(e) if super::options::stopped_for_memory(&e) => return Err(e),
                            Err(e) => {
                                input_notes.push(format!("the candidate model's branches were decided by ONNX Runtime's reference kernels on the file: the candidate ({}) could not run it for that ({e:#})", options.candidate));
                                None
                            }
                        }
                    }
                    _ => None,
                };
                let flattened = match by_candidate {
                    Some(found) => found,
                    None => flatten_control_flow(
                        &cm,
                        reference.as_mut(),
                        &all_feeds,
                        "the candidate model on the reference's kernels",
                    )?,
                };
                if let Some((flat, taken)) = flattened {
                    ci = GraphIndex::build(flat.graph())?;
                    cm = flat;
                    // Where its run took another branch than the reference's, say so: the
                    // tensors inside the two branches are different computations.
                    for node in control_flow.iter_mut().flat_map(|cf: &mut ControlFlow| cf.inlined.iter_mut()) {
                        if let Some(other) = taken.inlined.iter().find(|c| c.node == node.node && c.taken != node.taken)
                        {
                            node.candidate_taken = Some(other.taken.clone());
                        }
                    }
                }
            }
            Some((cm, ci))
        }
        None => None,
    };
    // The candidate model's tensors paired with the reference's: names first, then structure.
    let mut cand_names = HashMap::new();
    let mut matching = None;
    if let Some((cm, ci)) = &cand_model {
        // The outputs of control flow the candidate ran otherwise (flattened: Identities named
        // `Node/outputK`, `Node/finalK`) are compared as each side computed them.
        let differing: Vec<String> = control_flow
            .iter()
            .flat_map(|cf| cf.inlined.iter())
            .filter(|i| i.candidate_taken.is_some())
            .map(|i| i.node.clone())
            .collect();
        let cut: std::collections::HashSet<String> = index
            .nodes
            .iter()
            .filter(|n| {
                n.op_type == "Identity"
                    && differing.iter().any(|d| {
                        n.name
                            .strip_prefix(d.as_str())
                            .is_some_and(|rest| rest.starts_with("/output") || rest.starts_with("/final"))
                    })
            })
            .flat_map(|n| n.outputs.iter().cloned())
            .collect();
        let found = match_tensors(model.graph(), &index, cm.graph(), ci, options.match_structure, &cut);
        let mut summary = TensorMatching {
            mode: if options.match_structure { "auto" } else { "name" }.to_string(),
            unmatched_reference: found.unmatched_reference,
            unmatched_candidate: found.unmatched_candidate,
            ..Default::default()
        };
        for p in found.pairs {
            match p.by {
                MatchedBy::Name => summary.by_name += 1,
                MatchedBy::Structure => {
                    summary.by_structure += 1;
                    summary.structure_pairs.push((p.reference.clone(), p.candidate.clone()));
                }
            }
            cand_names.insert(p.reference, p.candidate);
        }
        matching = Some(summary);
    }
    // A converted candidate model computes in FP16 whatever its backend's own precision is.
    let precision = match &cand_model {
        Some((cm, _)) => converted_precision(cm),
        None => candidate.precision(),
    };
    // A Q/DQ model that declares no FP16/BF16 computes in float32 between its quantizers: it is
    // judged by them, never as FP16.
    let quantization = cand_model
        .as_ref()
        .filter(|(cm, _)| !layerwise_runtime::typed::has_reduced_precision(cm))
        .and_then(|(cm, ci)| layerwise_model::quant::quantization_of(cm.graph(), ci));
    let judging = match quantization {
        Some(q) => {
            let between = if q.integer_ops.is_empty() { ", computed in float32 between its quantizers" } else { "" };
            let form = if lifted.is_empty() { "Q/DQ" } else { "read in its Q/DQ form" };
            input_notes.push(format!(
                "the candidate model is quantized ({form}): {}; judged by {} defaults{between}",
                q.describe(),
                q.coarsest().map_or(QuantFamily::Int8, |f| f.family())
            ));
            Judging::quantized(q, options, (&model, &index))?
        }
        None => Judging::new(precision, candidate.tf32(), options, (&model, &index))?,
    };
    let order: Vec<String> = match &options.selection {
        Selection::All => index.computed_tensors().map(str::to_string).collect(),
        Selection::Names(names) => {
            // Checked here so an unknown name is an error before any run.
            layerwise_model::expose(&model.proto, &index, &options.selection)?;
            index
                .computed_tensors()
                .filter(|t| names.iter().any(|n| n == t) || index.outputs.iter().any(|o| o == t))
                .map(str::to_string)
                .collect()
        }
    };
    // A reference tensor the matching found no twin for is not compared, even where the
    // candidate has a tensor of its name: that tensor holds another value (a Conv's output whose
    // Relu a quantizer took over). The matching line of the report lists them.
    let order: Vec<String> = match &matching {
        Some(m) if !m.unmatched_reference.is_empty() => {
            let unmatched: HashSet<&str> = m.unmatched_reference.iter().map(String::as_str).collect();
            order.into_iter().filter(|t| !unmatched.contains(t.as_str()) || index.outputs.contains(t)).collect()
        }
        _ => order,
    };
    // A tensor given its own tolerance must be one the model computes.
    for (tensor, _, _) in &options.tensor_tolerances {
        if !index.computed_tensors().any(|t| t == tensor) {
            bail!(
                "a tolerance is given for '{tensor}', which is not a tensor the model computes (its outputs: {})",
                index.outputs.join(", ")
            );
        }
    }
    Ok(Setup {
        model,
        index,
        cand_model,
        cand_names,
        reference,
        candidate,
        decls,
        owners,
        input_notes,
        samples,
        total_samples,
        samples_digest,
        judging,
        order,
        control_flow,
        matching,
        sim_quant,
        deployed_file,
        lifted,
    })
}

/// SHA-256 over each sample's name and file size, in the folder's order: shards of one folder
/// agree on it, shards of two folders of as many samples do not.
fn samples_digest(samples: &[(String, InputOptions)]) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for (name, options) in samples {
        let size = options.npz.as_ref().and_then(|p| std::fs::metadata(p).ok()).map_or(0, |m| m.len());
        hash.update(format!("{name}\t{size}\n").as_bytes());
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Every sample's prepared inputs as the runs see them.
pub(crate) fn feeds_of(inputs: &[layerwise_runtime::inputs::PreparedInput]) -> Vec<(String, Tensor)> {
    inputs.iter().map(|i| (i.name.clone(), i.tensor.clone())).collect()
}

/// The tolerance the user gave, field by field, else `defaults`'.
fn given_or_default(defaults: Tolerance, options: &BisectOptions) -> Result<Tolerance> {
    let tolerance = Tolerance {
        atol: options.atol.unwrap_or(defaults.atol),
        rtol: options.rtol.unwrap_or(defaults.rtol),
        range_tol: options.range_tol.unwrap_or(defaults.range_tol),
    };
    if !(tolerance.atol >= 0.0 && tolerance.rtol >= 0.0 && tolerance.range_tol >= 0.0) {
        bail!("--atol, --rtol and --range-tol must be non-negative numbers");
    }
    Ok(tolerance)
}

/// For a candidate model with FP16/BF16 tensors on `ort:cpu` (typed, the default): the threads to
/// evaluate it with, one node at a time in its own types.
pub(crate) fn typed_candidate(spec: &BackendSpec, cand_model: &Model) -> Option<Option<usize>> {
    spec.typed_cpu_threads().filter(|_| layerwise_runtime::typed::has_reduced_precision(cand_model))
}

/// Whether a candidate file runs in an ONNX Runtime session of its own, whose fusions the run
/// with every tensor exposed blocks: then its outputs are judged as deployed (bisect and `fix`).
/// A file with FP16/BF16 tensors on `ort:cpu` (typed) is evaluated node by node, exposed or not:
/// no fused session to measure. `reduced_precision`: the file holds FP16/BF16 tensors (a file
/// `fix` converts always does).
pub(crate) fn judged_as_deployed(spec: &BackendSpec, reduced_precision: bool) -> bool {
    !(reduced_precision && spec.typed_cpu_threads().is_some())
}

/// The precision a converted candidate model computes in: BF16 when it declares bfloat16 and no
/// float16, FP16 otherwise (whatever its backend's own precision).
fn converted_precision(model: &Model) -> Precision {
    // Every type the file declares: weights, tensors, and the targets of its Casts (a BF16 model
    // whose weights all stay FP32, e.g. with its Convs kept, still computes in BF16).
    let g = model.graph();
    let value_types = g.input.iter().chain(&g.output).chain(&g.value_info).filter_map(|v| {
        match v.r#type.as_ref()?.value.as_ref()? {
            layerwise_model::onnx::type_proto::Value::TensorType(t) => t.elem_type,
            _ => None,
        }
    });
    let cast_targets = g
        .node
        .iter()
        .filter(|n| n.op_type() == "Cast")
        .flat_map(|n| n.attribute.iter().filter(|a| a.name() == "to").filter_map(|a| a.i.map(|i| i as i32)));
    let types: Vec<i32> = g.initializer.iter().map(|t| t.data_type()).chain(value_types).chain(cast_targets).collect();
    let has = |d: layerwise_model::DataType| types.contains(&(d as i32));
    if has(layerwise_model::DataType::Bfloat16) && !has(layerwise_model::DataType::Float16) {
        Precision::Bf16
    } else {
        Precision::Fp16
    }
}

/// Every sample's input values, prepared as the runs will see them.
pub(super) fn sample_feeds(
    decls: &[InputDecl],
    samples: &[(String, InputOptions)],
    owners: &InputOwners,
) -> Result<Vec<Vec<(String, Tensor)>>> {
    samples
        .iter()
        .map(|(name, options)| {
            let inputs = prepare_inputs(decls, options).map_err(|e| owners.explain(name, e))?;
            Ok(inputs.into_iter().map(|i| (i.name, i.tensor)).collect())
        })
        .collect()
}

/// The samples to run: one (the usual inputs), or every `.npz` file of an `--inputs DIR`.
pub(crate) fn samples(options: &InputOptions) -> Result<Vec<(String, InputOptions)>> {
    if !options.given_samples.is_empty() {
        return Ok(options
            .given_samples
            .iter()
            .map(|(name, values)| {
                (name.clone(), InputOptions { given: values.clone(), given_samples: Vec::new(), ..options.clone() })
            })
            .collect());
    }
    match &options.npz {
        Some(dir) if dir.is_dir() => {
            let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
                .with_context(|| format!("--inputs {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "npz"))
                .collect();
            files.sort();
            // A sample that is not a regular file (a FIFO, a link to a device, a folder named
            // x.npz) is refused before any is read, not skipped without a word.
            for f in &files {
                let name = f.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
                layerwise_model::open_regular(f)
                    .with_context(|| format!("--inputs {}: sample {name}", dir.display()))?;
            }
            if files.is_empty() {
                bail!("--inputs {}: the folder holds no .npz files (one sample per file)", dir.display());
            }
            Ok(files
                .into_iter()
                .map(|f| {
                    let name = f.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
                    (name, InputOptions { npz: Some(f), ..options.clone() })
                })
                .collect())
        }
        _ => Ok(vec![(String::new(), options.clone())]),
    }
}

/// Which model declares which input: the reference's, and a `--cand-model`'s where there is one.
#[derive(Debug, Clone, Default)]
pub(crate) struct InputOwners {
    pub reference: Vec<String>,
    pub candidate: Option<Vec<String>>,
}

impl InputOwners {
    /// An input error of sample `name`, said with the sample's name (a single sample has none,
    /// and gets no empty prefix); an array no model declares is said with both models' inputs.
    pub(crate) fn explain(&self, name: &str, e: RuntimeError) -> anyhow::Error {
        let e = match (&e, &self.candidate) {
            (RuntimeError::UnknownArray { file, array, .. }, Some(theirs)) => anyhow::anyhow!(
                "input error: {} holds array '{array}', which neither model declares (reference inputs: {}; candidate model inputs: {})",
                file.display(),
                self.reference.join(", "),
                theirs.join(", ")
            ),
            _ => anyhow::Error::from(e),
        };
        if name.is_empty() {
            e
        } else {
            e.context(format!("sample {name}"))
        }
    }
}
