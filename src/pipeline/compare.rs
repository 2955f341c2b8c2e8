//! Stages 2 and 3: run both sides (paired in one session where they can be, else separately, in
//! groups that fit the memory budget) and compare every tensor.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use layerwise_analysis::{
    add_passed_through, compare_all, fed_value, passed_through, Comparison, Histogram, MemoryPlan, HISTOGRAM_BINS,
};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_runtime::{tensor_types, Backend, RunOutput, RunRequest, Tensor, TensorData};

use super::options::{default_memory_budget, BisectOptions};
use super::setup::{Judging, Setup};
use super::steps::Steps;

/// What runs both sides and compares them, sample after sample: the plan's model and backends,
/// and what comparing has learnt so far (memory plans, a paired session, why pairing failed).
pub(super) struct Job<'a> {
    pub options: &'a BisectOptions,
    pub model: &'a Model,
    pub index: GraphIndex,
    pub cand_model: Option<(Model, GraphIndex)>,
    /// The candidate file as it is where `cand_model` is its Q/DQ form: what runs as deployed.
    pub deployed_file: Option<(Model, GraphIndex)>,
    /// The file's integer ops read in the Q/DQ form, as that form names them.
    pub lifted: Vec<layerwise_model::qdq_form::Lifted>,
    /// Reference tensor -> the candidate model's tensor holding its value (`--cand-model`).
    pub cand_names: HashMap<String, String>,
    pub reference: Box<dyn Backend>,
    pub candidate: Box<dyn Backend>,
    pub judging: Judging,
    pub order: Vec<String>,
    pub(super) budget: u64,
    /// The group plan per set of input shapes: samples usually share their shapes, and planning
    /// builds an ONNX Runtime session.
    plans: HashMap<Vec<Vec<usize>>, GroupPlan>,
    /// (input shapes, group) the GPU candidate has run: its session is built, and later runs take
    /// about 0.1 s. Only a first run has a wait to share with the reference; beside a warm CUDA
    /// session the CPU reference slowed from 0.19 to 0.36 s a sample on the H100 (both sessions'
    /// thread pools on the same cores), so later runs go one after the other.
    candidate_ran: std::collections::HashSet<(Vec<Vec<usize>>, usize)>,
    /// Why the tensors were compared after separate runs; once set, later samples go straight to
    /// separate runs.
    pub(super) separate_because: Option<String>,
    /// Whether the paired session's segments stay built for later samples: with one sample, each
    /// is released once it ran, so that ONNX Runtime holds one segment at a time.
    pub(super) keep_paired_sessions: bool,
    /// The paired session of the samples so far, by input shapes (dropped after the samples).
    pub(super) paired_session: Option<(Vec<Vec<usize>>, layerwise_runtime::paired::PairedSession)>,
    /// The GPU reduction kernels, built for the first sample compared on the GPU (`device.rs`).
    pub(super) device_reducer: Option<layerwise_runtime::device_stats::DeviceReducer>,
    /// Why the GPU reduction could not be built, once tried.
    pub(super) device_refused: Option<String>,
    /// The reference's plain run (outputs only) on one sample's feeds, made before the comparison
    /// (bisect.rs): the run as deployed and the steps after the walk read it instead of running the
    /// same session again (on the H100 that second run cost 1.8 s of an 11,201-node bisect).
    pub(super) plain_reference: Option<(Vec<(String, Tensor)>, RunOutput)>,
    /// The outputs judged by their answers (`answers::judged_outputs`).
    pub(super) judged: Vec<super::answers::Judged>,
    /// `--batch`: where each tensor's samples lie in a batched run, once the first batch checked it.
    /// (and every tensor's shape in that batch, which later batches must have).
    pub(super) batch_layouts:
        Option<(HashMap<String, layerwise_runtime::device_stats::SampleLayout>, HashMap<String, Vec<usize>>)>,
    /// Why `--batch` is not used (the samples then run one at a time).
    pub(super) batch_refused: Option<String>,
}

/// The groups of tensors compared together, and the memory plan that made them.
type GroupPlan = (Vec<Vec<String>>, Option<MemoryPlan>);

/// The result of comparing one sample, all tensors.
pub(super) struct Compared {
    pub comparison: Comparison,
    /// Reference and candidate tensors, when they were all held at once (no split).
    pub tensors: Option<(HashMap<String, Tensor>, HashMap<String, Tensor>)>,
    pub histograms: HashMap<String, Histogram>,
    pub notes: (Vec<String>, Vec<String>),
    pub unavailable: Vec<(String, String)>,
    pub engine_layers: Vec<(String, Vec<String>)>,
    pub memory: Option<MemoryPlan>,
    /// A Q/DQ candidate's outputs whose error as deployed differs from the exposed run's:
    /// (output, deployed rel L2, exposed rel L2).
    pub deployed_differs: Vec<(String, f64, f64)>,
    /// The judged outputs' values on both sides (`answers`): read once the sample is compared,
    /// then dropped.
    pub output_values: HashMap<String, layerwise_analysis::KeptValues>,
    /// This sample's answers, per judged output: the check, or why none could be made.
    pub answers: Vec<(String, Result<layerwise_analysis::answers::AnswerCheck, String>)>,
}

impl<'a> Job<'a> {
    /// Candidate model tensor -> the reference tensor whose value it holds (the matching's pairs
    /// read backwards).
    pub(super) fn reference_names(&self) -> HashMap<String, String> {
        super::names::reference_names(&self.cand_names)
    }

    /// For a quantized candidate model, the reference tensors its activation quantizers quantize
    /// (each QuantizeLinear's input read through `reference_of`, where the reference computes it):
    /// what a node run with its own quantizers is fed. Empty otherwise.
    pub(super) fn quantized_reference_tensors(&self, reference_of: &HashMap<String, String>) -> Vec<String> {
        let (Some(_), Some((_, ci))) = (&self.judging.quantization, &self.cand_model) else { return Vec::new() };
        ci.nodes
            .iter()
            .filter(|n| n.op_type == "QuantizeLinear")
            .filter_map(|q| q.inputs.first().filter(|x| !ci.is_constant_like(x)))
            .map(|x| reference_of.get(x.as_str()).map_or(x.as_str(), String::as_str))
            .filter(|r| self.index.producer_index(r).is_some())
            .map(str::to_string)
            .collect()
    }

    /// The job that runs `setup`'s backends on its model (borrowed from the caller).
    pub(super) fn new(options: &'a BisectOptions, model: &'a Model, setup: Setup<'_>) -> Job<'a> {
        let budget = options.max_memory.unwrap_or_else(default_memory_budget);
        Job {
            options,
            model,
            index: setup.index,
            cand_model: setup.cand_model,
            deployed_file: setup.deployed_file,
            lifted: setup.lifted,
            cand_names: setup.cand_names,
            reference: setup.reference,
            candidate: setup.candidate,
            judging: setup.judging,
            order: setup.order,
            budget,
            plans: HashMap::new(),
            candidate_ran: std::collections::HashSet::new(),
            separate_because: None,
            keep_paired_sessions: setup.total_samples > 1,
            paired_session: None,
            device_reducer: None,
            device_refused: None,
            plain_reference: None,
            judged: Vec::new(),
            batch_layouts: None,
            batch_refused: None,
        }
    }

    pub(super) fn run_reference(&mut self, feeds: &[(String, Tensor)], selection: &Selection) -> Result<RunOutput> {
        let request = RunRequest { model: self.model, index: &self.index, inputs: feeds, selection };
        let mut out = self.reference.run(&request).with_context(|| format!("reference {}", self.options.reference))?;
        add_passed_through(self.model.graph(), &self.index, feeds, &mut out.tensors);
        Ok(out)
    }

    /// Both sides' values of the model outputs passed straight from an input (no node between),
    /// known without a run: each side returns the value it was fed. `None` where the candidate
    /// model computes such an output itself (only its run can say what it holds).
    pub(super) fn passed_through_values(
        &self,
        feeds: &[(String, Tensor)],
    ) -> Option<(HashMap<String, Tensor>, HashMap<String, Tensor>)> {
        let mut reference = HashMap::new();
        add_passed_through(self.model.graph(), &self.index, feeds, &mut reference);
        let mut candidate = HashMap::new();
        match &self.cand_model {
            None => add_passed_through(self.model.graph(), &self.index, feeds, &mut candidate),
            Some((cm, ci)) => {
                for name in passed_through(&self.index) {
                    if ci.producer_index(&name).is_some() {
                        return None;
                    }
                    if let Some(v) = candidate_passed_through(cm, ci, &name, feeds, None) {
                        candidate.insert(name, v);
                    }
                }
            }
        }
        Some((reference, candidate))
    }

    pub(super) fn run_candidate(&mut self, feeds: &[(String, Tensor)], selection: &Selection) -> Result<RunOutput> {
        let cand_selection = self.candidate_selection(selection);
        let Job { options, model, index, cand_model, cand_names, candidate, .. } = self;
        run_candidate_of(
            candidate.as_mut(),
            cand_model.as_ref(),
            cand_names,
            (model, index),
            feeds,
            selection,
            &cand_selection,
        )
        .with_context(|| format!("candidate {}", options.candidate))
    }

    /// Both sides of one group at once, where the candidate runs on a GPU and the reference on
    /// the CPU: the reference runs on its own thread while the candidate's session builds
    /// (seconds of CUDA and cuDNN setup), so the pair takes about the candidate's time. Each
    /// side's own time goes into the steps.
    fn run_both_beside(
        &mut self,
        feeds: &[(String, Tensor)],
        selection: &Selection,
        steps: &mut Steps,
        label: &str,
    ) -> Result<(RunOutput, RunOutput)> {
        let cand_selection = self.candidate_selection(selection);
        let Job { options, model, index, cand_model, cand_names, candidate, reference, .. } = self;
        let (model, index): (&Model, &GraphIndex) = (model, index);
        let ((ref_out, seconds), cand_out) = std::thread::scope(|scope| {
            let reference_run = scope.spawn(move || {
                let started = std::time::Instant::now();
                let out = reference.run(&RunRequest { model, index, inputs: feeds, selection });
                (out, started.elapsed().as_secs_f64())
            });
            let cand_out =
                steps.run(&format!("running candidate {}{label} (the reference beside)", options.candidate), || {
                    run_candidate_of(
                        candidate.as_mut(),
                        cand_model.as_ref(),
                        cand_names,
                        (model, index),
                        feeds,
                        selection,
                        &cand_selection,
                    )
                    .with_context(|| format!("candidate {}", options.candidate))
                });
            (reference_run.join().expect("the reference's thread does not panic"), cand_out)
        });
        steps.record(&format!("running reference {}{label} (beside the candidate)", options.reference), seconds);
        let mut ref_out = ref_out.with_context(|| format!("reference {}", options.reference))?;
        add_passed_through(model.graph(), index, feeds, &mut ref_out.tensors);
        Ok((ref_out, cand_out?))
    }

    /// Groups of exposed tensors whose two copies (reference and candidate) fit the budget, planned
    /// from each tensor's real size: ONNX Runtime's shape inference with the inputs' shapes, and
    /// where a dimension stays unknown (data-dependent), the shape measured by one reference run
    /// that returns only shapes.
    fn plan(&mut self, feeds: &[(String, Tensor)]) -> Result<(Vec<Vec<String>>, Option<MemoryPlan>)> {
        let shapes: Vec<(String, Vec<usize>)> = feeds.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
        let types = tensor_types(self.model, &self.index, &shapes)?;
        let unknown: Vec<String> = self
            .order
            .iter()
            .filter(|t| types.get(*t).is_some_and(|ty| ty.dims.iter().any(Option::is_none)))
            .cloned()
            .collect();
        let mut measured: HashMap<String, Vec<usize>> = HashMap::new();
        let mut source = "shape inference";
        if !unknown.is_empty() {
            match self.measure_shapes(feeds, &unknown) {
                Ok(m) => {
                    measured = m;
                    source = "shape inference and a shapes-only reference run";
                }
                // A reference that cannot run a rewritten model (a saved run): unknown dimensions
                // count as the largest input dimension, an upper guess.
                Err(_) => source = "shape inference; unknown dimensions guessed as the largest input dimension",
            }
        }
        let fallback_dim = feeds.iter().flat_map(|(_, t)| t.shape.iter().copied()).max().unwrap_or(1).max(1);
        let size = |t: &str| -> u64 {
            types.get(t).map_or(0, |ty| {
                let elem = ty.dtype.map_or(8, |d| d.size()) as u64;
                match measured.get(t) {
                    Some(dims) => dims.iter().map(|&d| d as u64).product::<u64>() * elem,
                    None => ty.dims.iter().map(|d| d.unwrap_or(fallback_dim) as u64).product::<u64>() * elem,
                }
            })
        };
        let outputs: u64 = self.index.outputs.iter().map(|o| size(o)).sum();
        let total: u64 = self.order.iter().map(|t| size(t)).sum();
        // What a split run holds (measured, layerwise_runtime::inputs::MemoryEstimate::separate):
        // the inputs 3.5 times, the largest tensor once, and three copies of each group's tensors
        // (both sides and the runtime's); the budget bounds that whole.
        let inputs: u64 = feeds.iter().map(|(_, t)| t.size_bytes() as u64).sum();
        let largest_tensor = self.order.iter().map(|t| size(t)).max().unwrap_or(0);
        let per_group =
            (self.budget.saturating_sub(7 * inputs / 2 + largest_tensor) / 3).saturating_sub(outputs).max(1);
        // Tensors that fit stay in one group: the loop splits only past `per_group`.
        let mut groups: Vec<Vec<String>> = vec![Vec::new()];
        let mut bytes = 0u64;
        let mut largest = 0u64;
        for t in &self.order {
            let s = size(t);
            if bytes + s > per_group && !groups.last().expect("one group").is_empty() {
                largest = largest.max(bytes);
                groups.push(Vec::new());
                bytes = 0;
            }
            bytes += s;
            groups.last_mut().expect("one group").push(t.clone());
        }
        largest = largest.max(bytes) + outputs;
        let budget_bytes = (groups.len() > 1 || self.options.max_memory.is_some()).then_some(self.budget);
        let plan = MemoryPlan {
            budget_bytes,
            estimated_bytes: total,
            groups: groups.len(),
            largest_group_bytes: largest,
            shapes_from: source.to_string(),
            comparison: layerwise_analysis::ComparisonMode::Separate,
            separate_because: self.separate_because.clone(),
        };
        Ok((groups, Some(plan)))
    }

    /// The shapes of `tensors`, from one reference run of the model with a `Shape` node on each:
    /// only the shapes come back, so it needs no more memory than a plain run.
    fn measure_shapes(
        &mut self,
        feeds: &[(String, Tensor)],
        tensors: &[String],
    ) -> Result<HashMap<String, Vec<usize>>> {
        if self.options.reference.is_saved() {
            bail!("a saved reference cannot run a rewritten model");
        }
        let mut proto = self.model.proto.clone();
        let graph = proto.graph.as_mut().expect("checked on load");
        let mut names = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            let shape_name = format!("{t}__lw_shape_{i}");
            graph.node.push(layerwise_model::onnx::NodeProto {
                op_type: Some("Shape".into()),
                name: Some(format!("lw_shape_probe_{i}")),
                input: vec![t.clone()],
                output: vec![shape_name.clone()],
                ..Default::default()
            });
            names.push(shape_name);
        }
        let probe = self.model.derived(proto, "shape-probe.onnx");
        let probe_index = GraphIndex::build(probe.graph())?;
        let out = self.reference.run(&RunRequest {
            model: &probe,
            index: &probe_index,
            inputs: feeds,
            selection: &Selection::Names(names.clone()),
        })?;
        let mut shapes = HashMap::new();
        for (t, n) in tensors.iter().zip(&names) {
            if let Some(TensorData::I64(dims)) = out.tensors.get(n).map(|v| &v.data) {
                shapes.insert(t.clone(), dims.iter().map(|&d| d.max(0) as usize).collect());
            }
        }
        Ok(shapes)
    }

    /// Runs both sides on one sample, all tensors, in as many groups as the budget needs.
    pub(super) fn compare_sample(
        &mut self,
        feeds: &[(String, Tensor)],
        steps: &mut Steps,
        keep_tensors: bool,
    ) -> Result<Compared> {
        if let Some(compared) = self.compare_on_device(feeds, steps, keep_tensors)? {
            return Ok(compared);
        }
        if let Some(compared) = self.compare_paired(feeds, steps)? {
            return Ok(compared);
        }
        let shapes: Vec<Vec<usize>> = feeds.iter().map(|(_, t)| t.shape.clone()).collect();
        if !self.plans.contains_key(&shapes) {
            let plan = steps.run("planning memory", || self.plan(feeds))?;
            self.plans.insert(shapes.clone(), plan);
        }
        let (groups, memory) = self.plans[&shapes].clone();
        let mut records = Vec::new();
        let mut not_compared = Vec::new();
        let mut histograms = HashMap::new();
        let mut result = Compared {
            comparison: Comparison::default(),
            tensors: None,
            histograms: HashMap::new(),
            notes: (Vec::new(), Vec::new()),
            unavailable: Vec::new(),
            engine_layers: Vec::new(),
            memory: memory.clone(),
            deployed_differs: Vec::new(),
            output_values: HashMap::new(),
            answers: Vec::new(),
        };
        let split = groups.len() > 1;
        if split && self.options.save_tensors.is_some() {
            bail!("--save-tensors keeps every tensor of both runs, but they do not fit --max-memory {} at once; raise --max-memory", self.budget);
        }
        // Names compared so far: model outputs come back in every group and count once.
        let mut attempted: std::collections::HashSet<String> = std::collections::HashSet::new();
        for (g, group) in groups.iter().enumerate() {
            let selection = if split || self.options.selection != Selection::All {
                Selection::Names(group.clone())
            } else {
                Selection::All
            };
            let label = if split { format!(" (group {} of {})", g + 1, groups.len()) } else { String::new() };
            let first_candidate_run = self.candidate_ran.insert((shapes.clone(), g));
            let (ref_out, cand_out) =
                if first_candidate_run && self.options.candidate.ort_gpu() && !self.options.reference.ort_gpu() {
                    self.run_both_beside(feeds, &selection, steps, &label)?
                } else {
                    let ref_out = steps.run(&format!("running reference {}{label}", self.options.reference), || {
                        self.run_reference(feeds, &selection)
                    })?;
                    let cand_out = steps
                        .run(&format!("running candidate {}{label}", self.options.candidate), || {
                            self.run_candidate(feeds, &selection)
                        })?;
                    (ref_out, cand_out)
                };
            super::answers::keep_judged_values(
                &self.judged,
                &ref_out.tensors,
                &cand_out.tensors,
                &mut result.output_values,
            );
            let order: Vec<String> =
                group.iter().chain(&self.index.outputs).filter(|t| attempted.insert(t.to_string())).cloned().collect();
            let mut comparison = steps.run("comparing tensors", || {
                Ok(compare_all(&self.index, &order, &ref_out.tensors, &cand_out.tensors, &self.judging.tolerances))
            })?;
            // A backend's own reason (fused away, folded, not a tensor type) says more than "missing".
            for (t, why) in ref_out.unavailable.iter().chain(&cand_out.unavailable) {
                if let Some(entry) = comparison.not_compared.iter_mut().find(|(n, _)| n == t) {
                    entry.1 = why.clone();
                }
            }
            if split {
                for record in comparison.records.iter().filter(|r| !r.pass && r.mismatch.is_none()) {
                    if let (Some(r), Some(c)) = (ref_out.tensors.get(&record.name), cand_out.tensors.get(&record.name))
                    {
                        histograms.insert(
                            record.name.clone(),
                            layerwise_analysis::histogram(&r.to_f32(), &c.to_f32(), HISTOGRAM_BINS),
                        );
                    }
                }
            }
            records.extend(comparison.records);
            not_compared.extend(comparison.not_compared);
            if g == 0 {
                result.notes = (ref_out.notes.clone(), cand_out.notes.clone());
                result
                    .notes
                    .0
                    .extend(self.separate_because.as_ref().map(|why| format!("compared after separate runs: {why}")));
                result.notes.1.extend(self.device_note());
                result.notes.1.extend(self.batch_note());
                result.engine_layers = cand_out.engine_layers.clone();
            }
            result.unavailable.extend(ref_out.unavailable.iter().cloned());
            result.unavailable.extend(cand_out.unavailable.iter().cloned());
            if !split && keep_tensors {
                result.tensors = Some((ref_out.tensors, cand_out.tensors));
            }
            // Both runs' tensors of this group are dropped here, before the next group runs.
        }
        result.comparison = Comparison::from_records(records, not_compared, &self.order);
        result.histograms = histograms;
        Ok(result)
    }
}

/// How far apart (in relative L2) an output's error as deployed and with every tensor exposed may
/// be and still be one result: float32 reordering moves a relative L2 by about 1e-7 a value, well
/// below this; one int8 step of a softmax output (1/255) moves it by about 4e-3.
const DEPLOYED_NOISE: f64 = 1e-5;

impl Job<'_> {
    /// A candidate model file as the user runs it: only its declared outputs, so that ONNX Runtime
    /// fuses what exposing a tensor prevents: a Q/DQ model's quantizers into integer kernels (a
    /// CNN's probability was 254/255 fused and 1.0 with one more tensor exposed), an FP16 file's
    /// decomposed LayerNorm into one kernel that sums in float32 (a decoder's FP16 LayerNorm
    /// overflowed only when its Pow was exposed, on an H100).
    /// Both sides run once more with only their outputs; the outputs' records become the deployed
    /// run's, the intermediate tensors stay the exposed run's (what the walk reads), and a note
    /// gives both numbers where they differ. Nothing for a candidate without a model file, nor
    /// for one evaluated node by node in its own types.
    pub(super) fn compare_deployed(
        &mut self,
        feeds: &[(String, Tensor)],
        compared: &mut Compared,
        steps: &mut Steps,
    ) -> Result<()> {
        let Some((cm, _)) = &self.cand_model else { return Ok(()) };
        let reduced_precision = layerwise_runtime::typed::has_reduced_precision(cm);
        if !super::setup::judged_as_deployed(&self.options.candidate, reduced_precision) {
            return Ok(());
        }
        let (fusions, blocked) = self.deployed_fusions();
        let outputs_only = Selection::Names(Vec::new());
        let ref_out = match &self.plain_reference {
            Some((fed, plain)) if fed.as_slice() == feeds => plain.tensors.clone(),
            _ => {
                steps
                    .run(&format!("running reference {} (outputs only)", self.options.reference), || {
                        self.run_reference(feeds, &outputs_only)
                    })?
                    .tensors
            }
        };
        let cand_out =
            steps.run(&format!("running candidate {} as deployed (outputs only)", self.options.candidate), || {
                // The file as it is, where the comparison reads it in Q/DQ form.
                let cand_selection = self.candidate_selection(&outputs_only);
                run_candidate_of(
                    self.candidate.as_mut(),
                    self.deployed_file.as_ref().or(self.cand_model.as_ref()),
                    &self.cand_names,
                    (self.model, &self.index),
                    feeds,
                    &outputs_only,
                    &cand_selection,
                )
                .with_context(|| format!("candidate {}", self.options.candidate))
            })?;
        let comparison = std::mem::take(&mut compared.comparison);
        let (comparison, differs) =
            with_deployed_outputs(&self.index, &self.order, &self.judging, comparison, &ref_out, &cand_out.tensors);
        compared.comparison = comparison;
        let differ: Vec<String> =
            differs.iter().map(|(name, a, b)| format!("'{name}' {a:.2e} as deployed, {b:.2e} exposed")).collect();
        compared.deployed_differs.extend(differs);
        // The answers are the deployed run's too.
        super::answers::keep_judged_values(&self.judged, &ref_out, &cand_out.tensors, &mut compared.output_values);
        let outputs = model_outputs(&self.index);
        // What the report shows of an output (its tensors, its histogram) is the deployed run's too.
        if let Some((r, c)) = &mut compared.tensors {
            for o in &outputs {
                if let (Some(rv), Some(cv)) = (ref_out.get(o), cand_out.tensors.get(o)) {
                    r.insert(o.clone(), rv.clone());
                    c.insert(o.clone(), cv.clone());
                }
            }
        }
        for o in &outputs {
            if let (Some(h), Some(rv), Some(cv)) =
                (compared.histograms.get_mut(o), ref_out.get(o), cand_out.tensors.get(o))
            {
                *h = layerwise_analysis::histogram(&rv.to_f32(), &cv.to_f32(), HISTOGRAM_BINS);
            }
        }
        compared.notes.1.push(if differ.is_empty() {
            format!("output errors are the candidate's as deployed (only its outputs: {fusions}, as the user runs it), measured in a run of its own; the run with every tensor exposed gives the same within float32 noise")
        } else {
            format!(
                "the candidate as deployed (only its outputs: {fusions}, as the user runs it) and with every tensor exposed ({blocked}) give different output errors (rel L2): {}; the output errors reported are the deployed run's, the intermediate tensors those of the unfused model",
                differ.join(", ")
            )
        });
        Ok(())
    }

    /// What ONNX Runtime fuses in the candidate's file when only its outputs are asked for, and
    /// what exposing every tensor does instead.
    fn deployed_fusions(&self) -> (&'static str, &'static str) {
        if self.judging.quantization.is_some() {
            (
                "ONNX Runtime's Q/DQ fusions and integer kernels",
                "fusions blocked, the quantizers computed in float32 between them",
            )
        } else {
            (
                "ONNX Runtime's graph fusions, such as a decomposed LayerNorm fused into one kernel that sums in float32",
                "fusions blocked",
            )
        }
    }
}

/// The model outputs, each once, in the order the model declares them.
fn model_outputs(index: &GraphIndex) -> Vec<String> {
    let mut outputs: Vec<String> = Vec::new();
    for o in &index.outputs {
        if !outputs.contains(o) {
            outputs.push(o.clone());
        }
    }
    outputs
}

/// `comparison` (a run with every tensor exposed) with its model outputs' records taken from a
/// run of the candidate as deployed (`deployed`: only its outputs asked for, so that ONNX Runtime
/// fuses what exposing a tensor blocks) against `reference`; the intermediate tensors stay the
/// exposed run's, which the walk reads. Also the outputs whose error differs between the two
/// runs: (output, deployed, exposed). Bisect and `fix` judge a candidate file's outputs by this
/// alone.
pub(crate) fn with_deployed_outputs(
    index: &GraphIndex,
    order: &[String],
    judging: &Judging,
    comparison: layerwise_analysis::Comparison,
    reference: &HashMap<String, Tensor>,
    deployed: &HashMap<String, Tensor>,
) -> (layerwise_analysis::Comparison, Vec<(String, f64, f64)>) {
    let outputs = model_outputs(index);
    let as_deployed = compare_all(index, &outputs, reference, deployed, &judging.tolerances);
    let mut differs = Vec::new();
    for d in &as_deployed.records {
        if let Some(exposed) = comparison.get(&d.name) {
            let (a, b) = (d.error_level(), exposed.error_level());
            if !((a - b).abs() <= DEPLOYED_NOISE || a == b) {
                differs.push((d.name.clone(), a, b));
            }
        }
    }
    let mut records: Vec<_> = comparison.records.into_iter().filter(|r| !outputs.contains(&r.name)).collect();
    records.extend(as_deployed.records);
    let mut not_compared: Vec<_> = comparison.not_compared.into_iter().filter(|(t, _)| !outputs.contains(t)).collect();
    not_compared.extend(
        as_deployed
            .not_compared
            .into_iter()
            .map(|(t, why)| (t, format!("{why} (in the candidate's run as deployed, only its outputs)"))),
    );
    (layerwise_analysis::Comparison::from_records(records, not_compared, order), differs)
}

impl Job<'_> {
    /// Where the walk's first divergent tensor is an output that the deployed run computes
    /// otherwise than the exposed one, its finding would weigh the exposed run's inputs against
    /// the deployed run's output: no layer of the unfused model is named, and the summary says
    /// where the error arises instead.
    pub(super) fn unmix_deployed_finding(&self, compared: &Compared, verdict: &mut layerwise_analysis::Verdict) {
        let Some(fd) = &verdict.first_divergent else { return };
        let Some((output, deployed, exposed)) = compared.deployed_differs.iter().find(|(o, _, _)| *o == fd.tensor)
        else {
            return;
        };
        // Sums that pass the int32 accumulator wrap in the fused integer kernel only, and the
        // stored weights and the reference's values place them: the node stays named.
        if fd.cause.best.kind == layerwise_analysis::CauseKind::IntegerAccumulatorOverflow {
            return;
        }
        let (fusions, _) = self.deployed_fusions();
        // Integer kernels on an x86 CPU without VNNI saturate pairs of products: a known way for a
        // Q/DQ file to compute otherwise as deployed, said as what it is, not measured here.
        let saturating = if self.judging.quantization.is_some()
            && self.options.candidate.runs_on_ort_cpu()
            && layerwise_runtime::cpu::x86_without_vnni()
        {
            "; this CPU has no VNNI (neither avx_vnni nor avx512_vnni in its flags), where ONNX Runtime's fused u8s8 integer kernels add each pair of 8-bit products in 16 bits, which saturates where a pair passes 32767 (weights quantized with reduce_range, 7 bits, cannot reach it); whether that is the difference here is not measured: the file with ONNX Runtime's Q/DQ fusions off (--cand ort:cpu,opt=basic) computes what it describes on every CPU"
        } else {
            ""
        };
        verdict.summary = format!(
            "output '{output}' diverges as deployed (rel L2 {deployed:.2e}, only its outputs: {fusions}) but errs {exposed:.2e} with every tensor exposed (fusions blocked): the difference arises in what ONNX Runtime fuses or rewrites when nothing between its ops is exposed, which the walk over the unfused model's tensors cannot place, so no layer is named; which fusion is not measured{saturating}"
        );
        verdict.first_divergent = None;
    }
}

/// One candidate run: of its own model where it has one (asking for that model's names and
/// giving the tensors back under the reference's), else of the reference's model.
fn run_candidate_of(
    candidate: &mut dyn Backend,
    cand_model: Option<&(Model, GraphIndex)>,
    cand_names: &HashMap<String, String>,
    (model, index): (&Model, &GraphIndex),
    feeds: &[(String, Tensor)],
    selection: &Selection,
    cand_selection: &Selection,
) -> Result<RunOutput, layerwise_runtime::RuntimeError> {
    match cand_model {
        Some((cm, ci)) => candidate
            .run(&RunRequest { model: cm, index: ci, inputs: feeds, selection: cand_selection })
            .map(|mut out| {
                // The reference's outputs passed straight from its inputs pair with the candidate's
                // outputs of those names: a model output is what the user gets, however computed.
                let passed: Vec<(String, Tensor)> = passed_through(index)
                    .into_iter()
                    .filter_map(|name| {
                        let computed = out.tensors.get(&name).cloned();
                        candidate_passed_through(cm, ci, &name, feeds, computed).map(|v| (name, v))
                    })
                    .collect();
                out.tensors = under_reference_names(std::mem::take(&mut out.tensors), cand_names);
                out.tensors.extend(passed);
                out
            }),
        None => candidate.run(&RunRequest { model, index, inputs: feeds, selection }).map(|mut out| {
            add_passed_through(model.graph(), index, feeds, &mut out.tensors);
            out
        }),
    }
}

/// The candidate model's value of `name`, a reference output passed straight from its input:
/// its own output of that name, as its run returned it (`computed`) or, where it too passes its
/// input straight through, the value it was fed. `None` when it has no such output.
fn candidate_passed_through(
    cm: &Model,
    ci: &GraphIndex,
    name: &str,
    feeds: &[(String, Tensor)],
    computed: Option<Tensor>,
) -> Option<Tensor> {
    if !ci.outputs.iter().any(|o| o == name) {
        return None;
    }
    if ci.producer_index(name).is_some() {
        return computed;
    }
    if ci.is_graph_input(name) {
        return fed_value(cm.graph(), name, feeds);
    }
    None
}

/// A candidate model's tensors under the reference names they were paired with (copied when
/// several reference tensors carry one value, as through a reference Identity). A tensor paired
/// with nothing is dropped, even if the reference has a tensor of that name: a name alone, on a
/// node of another op type, is no evidence of the same value.
fn under_reference_names(
    mut tensors: HashMap<String, Tensor>,
    cand_names: &HashMap<String, String>,
) -> HashMap<String, Tensor> {
    let mut renamed: HashMap<String, Tensor> = HashMap::with_capacity(tensors.len());
    let mut uses: HashMap<&str, usize> = HashMap::new();
    for c in cand_names.values() {
        *uses.entry(c.as_str()).or_default() += 1;
    }
    let mut pairs: Vec<(&String, &String)> = cand_names.iter().collect();
    pairs.sort();
    for (r, c) in pairs {
        let left = uses.get_mut(c.as_str()).expect("counted");
        *left -= 1;
        let value = if *left == 0 { tensors.remove(c) } else { tensors.get(c).cloned() };
        if let Some(v) = value {
            renamed.insert(r.clone(), v);
        }
    }
    renamed
}
