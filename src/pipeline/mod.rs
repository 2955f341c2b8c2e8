//! The bisect job: load, prepare inputs, run both backends, compare, walk back, report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use layerwise_analysis::search::Measured;
use layerwise_analysis::{
    aggregate_samples, chosen_sample, compare_all, pattern_of, search_first_divergent, Arithmetic, SampleData, Shard, verdict_from_chain, walk_back, Candidate, Comparison, Counterfactual, Extras, Histogram, HISTOGRAM_BINS,
    Isolation, KeepCheck, LocalError, MemoryPlan, SampleRun, Status, Tolerance, Verdict, WalkRule,
};
use layerwise_model::extract::{extract_groups, TensorType};
use layerwise_model::{scan_fp16_weight_range, GraphIndex, Model, Selection};
use layerwise_report::{build_report, render_terminal, InputInfo, Outputs, Report, ReportContext};
use layerwise_runtime::inputs::{declared_inputs, prepare_inputs, InputOptions, PreparedInput};
use layerwise_runtime::{create_backend, saved, tensor_types, Backend, Precision, RunOutput, RunRequest, Tensor, TensorData};

use crate::keep::KeepRunner;

mod conclusions;
pub(crate) mod control_flow;
pub mod repro;
mod counterfactual;
pub mod devices;
mod isolate;
pub mod noise_floor;
mod paired;
mod samples;
mod search;

use conclusions::conclude;
use counterfactual::counterfactual;
use noise_floor::{noise_floor, FloorTarget};
use isolate::isolate;
use samples::sample_data;
use search::search;

/// Set from another thread (the Python API on Ctrl-C) to stop a running job at its next step;
/// the step in progress finishes first, and temporary files go with their owners.
pub static CANCEL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Everything `layerwise bisect` takes.
#[derive(Debug, Clone)]
pub struct BisectOptions {
    pub model: PathBuf,
    pub reference: String,
    pub candidate: String,
    /// A different model file for the candidate side (a converted FP16 model); tensors are matched
    /// by name.
    pub cand_model: Option<PathBuf>,
    pub inputs: InputOptions,
    pub atol: Option<f64>,
    pub rtol: Option<f64>,
    pub range_tol: Option<f64>,
    /// Report files to write (JSON, HTML, Markdown, CSV, Model Explorer node data).
    pub outputs: Outputs,
    pub save_tensors: Option<PathBuf>,
    pub selection: Selection,
    /// How many worst tensors the terminal summary lists.
    pub top: usize,
    /// Show progress spinners on stderr.
    pub progress: bool,
    /// Show progress as one line per step instead (where stderr is no terminal: a notebook).
    pub progress_lines: bool,
    /// How candidate runs mark tensors: all at once, or a few per run (search).
    pub mark: Marking,
    /// Most bytes of exposed tensors held at once (both sides); `None`: half the available memory.
    pub max_memory: Option<u64>,
    /// Run each blame-chain node alone on reference inputs (introduced vs propagated error).
    pub isolate: bool,
    /// Re-run the candidate with each break kept at reference precision.
    pub counterfactual: bool,
    /// Measure the noise floor (the reference re-run with its weights perturbed).
    pub noise_floor: bool,
    /// Leave If/Loop nodes as they are instead of replacing them by what the reference ran (their
    /// bodies' tensors are then not compared).
    pub keep_control_flow: bool,
    /// Write the first divergent layer as a standalone model with its data into this folder.
    pub repro: Option<PathBuf>,
    /// `(I, N)`: process only samples `k` with `k % N == I` of `--inputs DIR` and write a partial
    /// report for `layerwise merge`.
    pub shard: Option<(usize, usize)>,
    /// Run the reference and the candidate as separate sessions and compare the tensors they return,
    /// even where both could run paired in one session (which holds only per-tensor statistics).
    pub separate_runs: bool,
    /// The GPU that the GPU backends of `reference` and `candidate` run on (overrides nothing:
    /// a spec that names its own `device=` is refused); set per shard by `--devices`.
    pub device: Option<u32>,
    /// Pair a `--cand-model`'s tensors with the reference's by structure where names differ
    /// (`--match auto`); false: by name only.
    pub match_structure: bool,
}

/// How the candidate's tensors are marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marking {
    /// Every tensor in one run (free for ONNX Runtime and the emulation).
    All,
    /// The model's outputs plus a few tensors per run, bisecting the blame path (for compilers
    /// whose fusions marking would change).
    Search,
}

impl BisectOptions {
    /// Options with every default: all tensors, random inputs with seed 0, default tolerances,
    /// no files written, no progress display.
    pub fn new(model: impl Into<PathBuf>, reference: &str, candidate: &str) -> BisectOptions {
        BisectOptions {
            model: model.into(),
            reference: reference.to_string(),
            candidate: candidate.to_string(),
            cand_model: None,
            inputs: InputOptions::default(),
            atol: None,
            rtol: None,
            range_tol: None,
            outputs: Outputs::default(),
            save_tensors: None,
            selection: Selection::All,
            top: 10,
            progress: false,
            progress_lines: false,
            mark: Marking::All,
            max_memory: None,
            isolate: true,
            counterfactual: true,
            noise_floor: true,
            keep_control_flow: false,
            match_structure: true,
            repro: None,
            shard: None,
            separate_runs: false,
            device: None,
        }
    }
}

/// The outcome: the report (also written as JSON if asked) and its terminal rendering.
pub struct BisectOutcome {
    pub report: Report,
    pub text: String,
}

struct Steps {
    bar: ProgressBar,
    /// One line per step on stderr (no spinner).
    lines: bool,
    started: Instant,
    durations: Vec<(String, f64)>,
}

impl Steps {
    fn new(show: bool, lines: bool) -> Steps {
        let bar = ProgressBar::new_spinner();
        bar.set_draw_target(if show && !lines { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() });
        bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("template"));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        Steps { bar, lines: show && lines, started: Instant::now(), durations: Vec::new() }
    }

    fn run<T>(&mut self, label: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if CANCEL.load(std::sync::atomic::Ordering::Relaxed) {
            bail!("interrupted before '{label}'");
        }
        self.bar.set_message(label.to_string());
        if self.lines {
            eprintln!("layerwise: {label} ({:.1} s)", self.started.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        let r = f();
        self.durations.push((label.to_string(), t.elapsed().as_secs_f64()));
        r
    }

    fn finish(self) -> Vec<(String, f64)> {
        self.bar.finish_and_clear();
        let mut d = self.durations;
        d.push(("total".into(), self.started.elapsed().as_secs_f64()));
        d
    }
}

/// Tolerances and walk thresholds for a candidate precision, with the user's overrides, and the
/// precision the defaults are for. A float32 candidate that multiplies on TF32 tensor cores
/// (`sim:tf32`, `ort:cuda` with TF32 on) keeps FP16's 10-bit mantissa there, so it gets FP16's
/// defaults; `tf32=off` keeps float32's.
pub fn tolerance_and_rule(precision: Precision, tf32: bool, options: &BisectOptions) -> Result<(Tolerance, WalkRule, &'static str)> {
    let (rule, defaults_for) = match precision {
        Precision::Fp16 => (WalkRule::FP16, "FP16"),
        Precision::Bf16 => (WalkRule::BF16, "BF16"),
        Precision::Fp32 if tf32 => (WalkRule::FP16, "TF32"),
        Precision::Fp32 => (WalkRule::FP32, "float32"),
    };
    let defaults = Tolerance::defaults_for(defaults_for);
    let tolerance = Tolerance {
        atol: options.atol.unwrap_or(defaults.atol),
        rtol: options.rtol.unwrap_or(defaults.rtol),
        range_tol: options.range_tol.unwrap_or(defaults.range_tol),
    };
    if !(tolerance.atol >= 0.0 && tolerance.rtol >= 0.0 && tolerance.range_tol >= 0.0) {
        bail!("--atol, --rtol and --range-tol must be non-negative numbers");
    }
    Ok((tolerance, rule, defaults_for))
}

/// Checks up front that a report can be written there, so a bad path fails before any work.
pub fn check_writable_target(path: &Path, what: &str) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!("cannot write {what} {}: folder '{}' does not exist", path.display(), dir.display());
    }
    if path.is_dir() {
        bail!("cannot write {what} {}: it is a folder", path.display());
    }
    Ok(())
}

fn check_outputs(options: &BisectOptions) -> Result<()> {
    if let Some(dir) = &options.repro {
        repro::check_repro_target(dir)?;
    }
    let outputs = &options.outputs;
    for (what, path) in outputs.paths() {
        check_writable_target(path, &format!("the {what}"))?;
    }
    Ok(())
}

pub fn bisect(options: &BisectOptions) -> Result<BisectOutcome> {
    let mut steps = Steps::new(options.progress, options.progress_lines);
    check_outputs(options)?;
    let model = steps.run("loading model", || Model::load(&options.model).map_err(Into::into))?;
    run_bisect(&model, options, steps)
}

/// The bisect job on an already loaded model (the demo builds its model in memory).
pub fn bisect_model(model: &Model, options: &BisectOptions) -> Result<BisectOutcome> {
    check_outputs(options)?;
    run_bisect(model, options, Steps::new(options.progress, options.progress_lines))
}

/// Half the memory the system reports available, or 4 GiB where it cannot tell.
pub fn default_memory_budget() -> u64 {
    layerwise_runtime::inputs::available_memory().map(|b| b / 2).unwrap_or(4 << 30)
}

/// Parses `512M`, `2G`, `1.5GiB`, `100000` (bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("'{s}' is not a size (e.g. 512M, 2G)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit '{other}' in '{s}' (K, M, G, T)")),
    };
    let bytes = value * scale as f64;
    if !(bytes >= 1.0 && bytes.is_finite()) {
        return Err(format!("size '{s}' must be at least one byte"));
    }
    Ok(bytes as u64)
}

/// A candidate model's tensors under the reference names they were paired with (copied when
/// several reference tensors carry one value, as through a reference Identity). A tensor paired
/// with nothing is dropped, even if the reference has a tensor of that name: a name alone, on a
/// node of another op type, is no evidence of the same value.
fn under_reference_names(mut tensors: HashMap<String, Tensor>, cand_names: &HashMap<String, String>) -> HashMap<String, Tensor> {
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

/// The precision a converted candidate model computes in: BF16 when its weights are bfloat16 and
/// none is float16, FP16 otherwise (whatever its backend's own precision).
/// For a candidate model with FP16/BF16 tensors on `ort:cpu` (typed, the default): the threads to
/// evaluate it with, one node at a time in its own types.
pub(crate) fn typed_candidate(spec: &str, cand_model: &Model) -> Option<Option<usize>> {
    match layerwise_runtime::BackendSpec::parse(spec).ok()? {
        layerwise_runtime::BackendSpec::OrtCpu(o) if o.ep == layerwise_runtime::ExecutionProvider::Cpu && o.typed && layerwise_runtime::typed::has_reduced_precision(cand_model) => Some(o.threads),
        _ => None,
    }
}

fn converted_precision(model: &Model) -> Precision {
    // Every type the file declares: weights, tensors, and the targets of its Casts (a BF16 model
    // whose weights all stay FP32, e.g. with its Convs kept, still computes in BF16).
    let g = model.graph();
    let value_types = g.input.iter().chain(&g.output).chain(&g.value_info).filter_map(|v| match v.r#type.as_ref()?.value.as_ref()? {
        layerwise_model::onnx::type_proto::Value::TensorType(t) => t.elem_type,
        _ => None,
    });
    let cast_targets = g.node.iter().filter(|n| n.op_type() == "Cast").flat_map(|n| n.attribute.iter().filter(|a| a.name() == "to").filter_map(|a| a.i.map(|i| i as i32)));
    let types: Vec<i32> = g.initializer.iter().map(|t| t.data_type()).chain(value_types).chain(cast_targets).collect();
    let has = |d: layerwise_model::DataType| types.contains(&(d as i32));
    if has(layerwise_model::DataType::Bfloat16) && !has(layerwise_model::DataType::Float16) {
        Precision::Bf16
    } else {
        Precision::Fp16
    }
}

/// Every sample's input values, prepared as the runs will see them.
fn sample_feeds(decls: &[layerwise_runtime::inputs::InputDecl], samples: &[(String, InputOptions)]) -> Result<Vec<Vec<(String, Tensor)>>> {
    samples
        .iter()
        .map(|(name, options)| {
            let inputs = prepare_inputs(decls, options).with_context(|| if name.is_empty() { String::new() } else { format!("sample {name}") })?;
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
            .map(|(name, values)| (name.clone(), InputOptions { given: values.clone(), given_samples: Vec::new(), ..options.clone() }))
            .collect());
    }
    match &options.npz {
        Some(dir) if dir.is_dir() => {
            let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
                .with_context(|| format!("--inputs {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "npz") && p.is_file())
                .collect();
            files.sort();
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

/// Everything one bisect job holds while it runs.
struct Job<'a> {
    options: &'a BisectOptions,
    model: &'a Model,
    index: GraphIndex,
    cand_model: Option<(Model, GraphIndex)>,
    /// Reference tensor -> the candidate model's tensor holding its value (`--cand-model`).
    cand_names: HashMap<String, String>,
    reference: Box<dyn Backend>,
    candidate: Box<dyn Backend>,
    precision: Precision,
    tolerance: Tolerance,
    /// The precision the default tolerances are for (`TF32`, `FP16`, ...).
    tolerance_defaults: &'static str,
    rule: WalkRule,
    order: Vec<String>,
    budget: u64,
    /// The group plan per set of input shapes: samples usually share their shapes, and planning
    /// builds an ONNX Runtime session.
    plans: HashMap<Vec<Vec<usize>>, Plan>,
    /// Why the tensors were compared after separate runs although pairing was tried; once set,
    /// later samples go straight to separate runs.
    pairing_note: Option<String>,
    /// The paired session of the samples so far, by input shapes (dropped after the samples).
    paired_session: Option<(Vec<Vec<usize>>, layerwise_runtime::paired::PairedSession)>,
}

/// The groups of tensors compared together, and the memory plan that made them.
type Plan = (Vec<Vec<String>>, Option<MemoryPlan>);

/// The result of comparing one sample, all tensors.
struct Compared {
    comparison: Comparison,
    /// Reference and candidate tensors, when they were all held at once (no split).
    tensors: Option<(HashMap<String, Tensor>, HashMap<String, Tensor>)>,
    histograms: HashMap<String, Histogram>,
    notes: (Vec<String>, Vec<String>),
    unavailable: Vec<(String, String)>,
    engine_layers: Vec<(String, Vec<String>)>,
    memory: Option<MemoryPlan>,
}

impl Job<'_> {
    fn run_reference(&mut self, feeds: &[(String, Tensor)], selection: &Selection) -> Result<RunOutput> {
        let request = RunRequest { model: self.model, index: &self.index, inputs: feeds, selection };
        self.reference.run(&request).with_context(|| format!("reference {}", self.options.reference))
    }

    fn run_candidate(&mut self, feeds: &[(String, Tensor)], selection: &Selection) -> Result<RunOutput> {
        let out = match &self.cand_model {
            Some((cm, ci)) => {
                // Ask for the candidate model's own names, and give the tensors back under the
                // reference's.
                let theirs = |n: &String| self.cand_names.get(n).unwrap_or(n).clone();
                let selection = match selection {
                    Selection::All => Selection::All,
                    Selection::Names(names) => {
                        Selection::Names(names.iter().map(theirs).filter(|n| ci.producer_index(n).is_some()).collect::<std::collections::BTreeSet<_>>().into_iter().collect())
                    }
                };
                let out = self.candidate.run(&RunRequest { model: cm, index: ci, inputs: feeds, selection: &selection });
                out.map(|mut out| {
                    out.tensors = under_reference_names(std::mem::take(&mut out.tensors), &self.cand_names);
                    out
                })
            }
            None => self.candidate.run(&RunRequest { model: self.model, index: &self.index, inputs: feeds, selection }),
        };
        out.with_context(|| format!("candidate {}", self.options.candidate))
    }

    /// Groups of exposed tensors whose two copies (reference and candidate) fit the budget, planned
    /// from each tensor's real size: ONNX Runtime's shape inference with the inputs' shapes, and
    /// where a dimension stays unknown (data-dependent), the shape measured by one reference run
    /// that returns only shapes.
    fn plan(&mut self, feeds: &[(String, Tensor)]) -> Result<(Vec<Vec<String>>, Option<MemoryPlan>)> {
        let shapes: Vec<(String, Vec<usize>)> = feeds.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
        let types = tensor_types(self.model, &self.index, &shapes)?;
        let unknown: Vec<String> = self.order.iter().filter(|t| types.get(*t).is_some_and(|ty| ty.dims.iter().any(Option::is_none))).cloned().collect();
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
        let per_group = (self.budget / 2).saturating_sub(outputs).max(1);
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
        let plan = MemoryPlan { budget_bytes, estimated_bytes: total, groups: groups.len(), largest_group_bytes: largest, shapes_from: source.to_string(), comparison: paired::SEPARATE.to_string() };
        Ok((groups, Some(plan)))
    }

    /// The shapes of `tensors`, from one reference run of the model with a `Shape` node on each:
    /// only the shapes come back, so it needs no more memory than a plain run.
    fn measure_shapes(&mut self, feeds: &[(String, Tensor)], tensors: &[String]) -> Result<HashMap<String, Vec<usize>>> {
        if self.options.reference.starts_with("npz:") {
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
        let out = self.reference.run(&RunRequest { model: &probe, index: &probe_index, inputs: feeds, selection: &Selection::Names(names.clone()) })?;
        let mut shapes = HashMap::new();
        for (t, n) in tensors.iter().zip(&names) {
            if let Some(TensorData::I64(dims)) = out.tensors.get(n).map(|v| &v.data) {
                shapes.insert(t.clone(), dims.iter().map(|&d| d.max(0) as usize).collect());
            }
        }
        Ok(shapes)
    }

    /// Runs both sides on one sample, all tensors, in as many groups as the budget needs.
    fn compare_sample(&mut self, feeds: &[(String, Tensor)], steps: &mut Steps, keep_tensors: bool) -> Result<Compared> {
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
        };
        let split = groups.len() > 1;
        if split && self.options.save_tensors.is_some() {
            bail!("--save-tensors keeps every tensor of both runs, but they do not fit --max-memory {} at once; raise --max-memory", self.budget);
        }
        // Names compared so far: model outputs come back in every group and count once.
        let mut attempted: std::collections::HashSet<String> = std::collections::HashSet::new();
        for (g, group) in groups.iter().enumerate() {
            let selection = if split || self.options.selection != Selection::All { Selection::Names(group.clone()) } else { Selection::All };
            let label = if split { format!(" (group {} of {})", g + 1, groups.len()) } else { String::new() };
            let ref_out = steps.run(&format!("running reference {}{label}", self.options.reference), || self.run_reference(feeds, &selection))?;
            let cand_out = steps.run(&format!("running candidate {}{label}", self.options.candidate), || self.run_candidate(feeds, &selection))?;
            let order: Vec<String> = group.iter().chain(&self.index.outputs).filter(|t| attempted.insert(t.to_string())).cloned().collect();
            let mut comparison = steps.run("comparing tensors", || Ok(compare_all(&self.index, &order, &ref_out.tensors, &cand_out.tensors, self.tolerance)))?;
            // A backend's own reason (fused away, folded, not a tensor type) says more than "missing".
            for (t, why) in ref_out.unavailable.iter().chain(&cand_out.unavailable) {
                if let Some(entry) = comparison.not_compared.iter_mut().find(|(n, _)| n == t) {
                    entry.1 = why.clone();
                }
            }
            if split {
                for record in comparison.records.iter().filter(|r| !r.pass && r.mismatch.is_none()) {
                    if let (Some(r), Some(c)) = (ref_out.tensors.get(&record.name), cand_out.tensors.get(&record.name)) {
                        histograms.insert(record.name.clone(), layerwise_analysis::histogram(&r.to_f32(), &c.to_f32(), HISTOGRAM_BINS));
                    }
                }
            }
            records.extend(comparison.records);
            not_compared.extend(comparison.not_compared);
            if g == 0 {
                result.notes = (ref_out.notes.clone(), cand_out.notes.clone());
                result.notes.0.extend(self.pairing_note.clone());
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

fn run_bisect(original: &Model, options: &BisectOptions, mut steps: Steps) -> Result<BisectOutcome> {
    let index = GraphIndex::build(original.graph()).with_context(|| format!("{}", original.path.display()))?;
    let mut reference = create_backend(&devices::spec_on_device(&options.reference, options.device)?).context("--ref")?;
    let mut candidate = create_backend(&devices::spec_on_device(&options.candidate, options.device)?).context("--cand")?;
    let decls = declared_inputs(original, &index);
    let all_samples = samples(&options.inputs)?;
    // Decisions that depend on how many samples there are follow the whole set, so that a shard
    // reports exactly what a single run over every sample does.
    let total_samples = all_samples.len();
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
    let mut extras = Extras { explorer_ids: layerwise_model::explorer_ids::explorer_ids(&original.proto), ..Default::default() };
    // Control flow as the reference ran it: bodies become ordinary, comparable graph.
    let has_control_flow = |i: &GraphIndex| i.nodes.iter().any(|n| n.has_subgraphs);
    let mut flattened = None;
    if has_control_flow(&index) && !options.keep_control_flow {
        let all_feeds = sample_feeds(&decls, &samples)?;
        let result = steps.run("following control flow", || control_flow::flatten_control_flow(original, reference.as_mut(), &all_feeds))?;
        if let Some((model, report)) = result {
            extras.control_flow = Some(report);
            flattened = Some((GraphIndex::build(model.graph())?, model));
        }
    }
    let (index, model) = match flattened {
        Some((i, m)) => (i, std::borrow::Cow::Owned(m)),
        None => (index, std::borrow::Cow::Borrowed(original)),
    };
    let model: &Model = &model;
    // A converted candidate model computes in FP16 whatever its backend's own precision is.
    let cand_model = match &options.cand_model {
        Some(path) => {
            let mut cm = steps.run("loading candidate model", || Model::load(path).map_err(Into::into))?;
            let mut ci = GraphIndex::build(cm.graph()).with_context(|| format!("{}", cm.path.display()))?;
            if has_control_flow(&ci) && !options.keep_control_flow {
                // The candidate model's own branches, as ONNX Runtime's reference kernels run it.
                let all_feeds = sample_feeds(&declared_inputs(&cm, &ci), &samples)?;
                if let Some((flat, _)) = control_flow::flatten_control_flow(&cm, reference.as_mut(), &all_feeds)? {
                    ci = GraphIndex::build(flat.graph())?;
                    cm = flat;
                }
            }
            Some((cm, ci))
        }
        None => None,
    };
    // The candidate model's tensors paired with the reference's: names first, then structure.
    let mut cand_names = HashMap::new();
    if let Some((cm, ci)) = &cand_model {
        let matching = layerwise_model::matching::match_tensors(model.graph(), &index, cm.graph(), ci, options.match_structure);
        let mut summary = layerwise_analysis::TensorMatching {
            mode: if options.match_structure { "auto" } else { "name" }.to_string(),
            unmatched_reference: matching.unmatched_reference,
            unmatched_candidate: matching.unmatched_candidate,
            ..Default::default()
        };
        for p in matching.pairs {
            match p.by {
                layerwise_model::matching::MatchedBy::Name => summary.by_name += 1,
                layerwise_model::matching::MatchedBy::Structure => {
                    summary.by_structure += 1;
                    summary.structure_pairs.push((p.reference.clone(), p.candidate.clone()));
                }
            }
            cand_names.insert(p.reference, p.candidate);
        }
        extras.matching = Some(summary);
    }
    // ONNX Runtime's CPU provider computes an FP16 model in float32: such a candidate runs one
    // node at a time in its own types instead (layerwise_runtime::typed), unless `typed=off`.
    if let Some((cm, _)) = &cand_model {
        if let Some(threads) = typed_candidate(&options.candidate, cm) {
            candidate = Box::new(layerwise_runtime::typed::TypedBackend::new(&options.candidate, threads));
        }
    }
    let precision = match &cand_model {
        Some((cm, _)) => converted_precision(cm),
        None => candidate.precision(),
    };
    let tf32 = candidate.tf32();
    let (tolerance, rule, tolerance_defaults) = tolerance_and_rule(precision, tf32, options)?;
    let order: Vec<String> = match &options.selection {
        Selection::All => index.computed_tensors().map(str::to_string).collect(),
        Selection::Names(names) => {
            // Checked here so an unknown name is an error before any run.
            layerwise_model::expose(&model.proto, &index, &options.selection)?;
            index.computed_tensors().filter(|t| names.iter().any(|n| n == t) || index.outputs.iter().any(|o| o == t)).map(str::to_string).collect()
        }
    };
    let budget = options.max_memory.unwrap_or_else(default_memory_budget);
    let mut job = Job { options, model, index, cand_model, cand_names, reference, candidate, precision, tolerance, tolerance_defaults, rule, order, budget, plans: HashMap::new(), pairing_note: None, paired_session: None };
    let weights = if precision == Precision::Fp16 {
        steps.run("scanning weights for the FP16 range", || scan_fp16_weight_range(model).map_err(Into::into))?
    } else {
        Vec::new()
    };
    let arithmetic = match precision {
        Precision::Fp16 => Arithmetic::Fp16,
        Precision::Bf16 => Arithmetic::Bf16,
        Precision::Fp32 => Arithmetic::Fp32,
    };
    let cand_info = Candidate { arithmetic, tf32: job.candidate.tf32(), atol: tolerance.atol };

    // One sample per run; with several, the worst sample's comparison carries the verdict.
    let mut per_sample: Vec<(String, Vec<PreparedInput>, Compared, Verdict)> = Vec::new();
    for (name, sample_options) in &samples {
        let inputs = prepare_inputs(&decls, sample_options).with_context(|| if name.is_empty() { String::new() } else { format!("sample {name}") })?;
        let feeds: Vec<(String, Tensor)> = inputs.iter().map(|i| (i.name.clone(), i.tensor.clone())).collect();
        let (compared, verdict) = match options.mark {
            Marking::All => {
                let compared = job.compare_sample(&feeds, &mut steps, total_samples == 1)?;
                if job.index.outputs.iter().all(|o| compared.comparison.get(o).is_none()) {
                    bail!(
                        "no model output could be compared: {}",
                        compared.comparison.not_compared.iter().map(|(t, r)| format!("{t}: {r}")).collect::<Vec<_>>().join("; ")
                    );
                }
                let verdict = walk_back(&job.index, &compared.comparison, &weights, rule, cand_info);
                (compared, verdict)
            }
            Marking::Search => search(&mut job, &feeds, &weights, cand_info, &mut steps, &mut extras)?,
        };
        if let (Some(dir), Some((r, c))) = (&options.save_tensors, &compared.tensors) {
            steps.run("saving tensors", || {
                saved::save_run(dir, "ref", &options.reference, &job.order, r, &[], &feeds)?;
                saved::save_run(dir, "cand", &options.candidate, &job.order, c, &compared.engine_layers, &feeds)?;
                Ok(())
            })?;
        }
        per_sample.push((name.clone(), inputs, compared, verdict));
    }
    // What follows runs other programs: the paired session's memory goes now.
    job.paired_session = None;

    let worst_of = |c: &Compared| -> f64 {
        job.index.outputs.iter().filter_map(|o| c.comparison.get(o)).map(|r| r.error_level()).fold(0.0, f64::max)
    };
    let data: Vec<SampleData> = per_sample.iter().map(|(name, _, c, v)| sample_data(name, &c.comparison, v, worst_of(c), &job.order)).collect();
    let chosen = chosen_sample(&data).expect("one sample");
    match options.shard {
        Some((index, count)) => extras.shard = Some(Shard { index, count, total_samples, order: job.order.clone(), samples: data }),
        None if total_samples > 1 => extras.samples = Some(aggregate_samples(&data, chosen, &job.order)),
        None => {}
    }
    let (sample_name, inputs, compared, verdict) = per_sample.swap_remove(chosen);
    drop(per_sample);
    extras.memory = compared.memory.clone();
    let feeds: Vec<(String, Tensor)> = inputs.iter().map(|i| (i.name.clone(), i.tensor.clone())).collect();

    // Saved tensors cannot run anything new.
    let can_run = !options.candidate.starts_with("npz:");
    let mut verdict = verdict;
    let mut conclusions = Vec::new();
    if verdict.status == Status::Diverged {
        // The reference's outputs, once, for the noise floor and every counterfactual check, and
        // only when one of them runs.
        // Keeping a node at reference precision: an emulation does it itself, an FP16 candidate
        // runs the model converted with the node kept.
        let counterfactual_runs = options.counterfactual && (job.precision == Precision::Fp16 || options.candidate.starts_with("sim:"));
        let reference_outputs = if options.reference.starts_with("npz:") || !(options.noise_floor || counterfactual_runs) {
            None
        } else {
            Some(steps.run("running the reference (outputs)", || job.run_reference(&feeds, &Selection::Names(Vec::new())))?)
        };
        if options.noise_floor {
            let worst = verdict.worst_output.clone();
            let cand_error = worst.as_deref().and_then(|w| compared.comparison.get(w)).map(|r| r.error_level());
            match (&reference_outputs, worst, cand_error) {
                (Some(reference), Some(worst), Some(cand_error)) => {
                    let relative = cand_info.arithmetic.unit_roundoff(cand_info.tf32);
                    let target = FloorTarget { output: &worst, candidate_error: cand_error, relative, seed: options.inputs.seed };
                    let floor = steps.run("measuring the noise floor", || {
                        noise_floor(job.reference.as_mut(), job.model, &job.index, &feeds, &reference.tensors, job.tolerance, target)
                    });
                    match floor {
                        Ok(floor) => extras.noise_floor = Some(floor),
                        Err(e) => conclusions.push(format!("noise floor not measured: {e:#}")),
                    }
                }
                _ => conclusions.push("noise floor not measured: the reference is a saved run, which cannot run a perturbed model".to_string()),
            }
        }
        let ill_conditioned = extras.noise_floor.as_ref().is_some_and(|f| f.ill_conditioned);
        if ill_conditioned {
            // No layer is at fault: the walk's finding stays among the breaks, not as the culprit.
            verdict.first_divergent = None;
        }
        if options.isolate && can_run && !ill_conditioned {
            extras.isolation = steps.run("running chain nodes alone", || isolate(&mut job, &feeds, &compared, &verdict)).map(Some).unwrap_or_else(|e| {
                Some(Isolation { nodes: Vec::new(), introducing: None, skipped: vec![("*".into(), format!("{e:#}"))] })
            });
        }
        if counterfactual_runs && !ill_conditioned {
            if let Some(reference) = &reference_outputs {
                extras.counterfactual = steps.run("counterfactual runs", || counterfactual(&mut job, &feeds, reference, &compared.comparison, &verdict, extras.isolation.as_ref()))?;
            }
        }
    }
    if let Some(dir) = &options.repro {
        extras.repro = Some(steps.run("writing the repro", || repro::write_repro(&mut job, &feeds, &verdict, dir))?);
    }
    conclusions.extend(conclusions::emulation_limits(&options.candidate, job.model, &job.index, &compared.comparison));
    conclude(&mut verdict, &extras, &compared.comparison, conclusions);

    let histogram = verdict.first_divergent.as_ref().and_then(|fd| {
        if let Some(h) = compared.histograms.get(&fd.tensor) {
            return Some(h.clone());
        }
        let (r, c) = compared.tensors.as_ref().map(|(r, c)| (r.get(&fd.tensor), c.get(&fd.tensor)))?;
        Some(layerwise_analysis::histogram(&r?.to_f32(), &c?.to_f32(), HISTOGRAM_BINS))
    });
    let mut cand_notes = compared.notes.1.clone();
    if !sample_name.is_empty() {
        cand_notes.push(format!("verdict from sample {sample_name}, the one with the largest output error"));
    }
    let durations = steps.finish();
    let report = build_report(ReportContext {
        model: original,
        index: &job.index,
        ref_spec: &options.reference,
        cand_spec: &options.candidate,
        ref_notes: compared.notes.0.clone(),
        cand_notes,
        tolerance: job.tolerance,
        tolerance_defaults: job.tolerance_defaults,
        rule: job.rule,
        inputs: inputs.iter().map(|i| InputInfo::of(&i.name, &i.tensor, &i.source)).collect(),
        comparison: &compared.comparison,
        verdict: &verdict,
        weights: &weights,
        unavailable: compared.unavailable.clone(),
        histogram,
        engine_layers: compared.engine_layers.clone(),
        extras,
        run_info: layerwise_report::RunInfo::now(durations),
    });
    options.outputs.write(&report, None)?;
    let text = render_terminal(&report, options.top);
    Ok(BisectOutcome { report, text })
}
