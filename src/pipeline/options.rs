//! What `layerwise bisect` takes and gives back, and the checks made before any work.

use std::path::{Path, PathBuf};

use crate::write_rule::{check_fresh_folder, Reads};
use anyhow::Result;
use layerwise_model::{Model, Selection};
use layerwise_report::{Outputs, Report};
use layerwise_runtime::inputs::InputOptions;
use layerwise_runtime::BackendSpec;

/// Set from another thread (the Python API on Ctrl-C) to stop a running job at its next step;
/// the step in progress finishes first, and temporary files go with their owners.
pub static CANCEL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The candidate where none is given, for the CLI and the Python API alike: the FP16 emulation,
/// except for a quantized `cand_model` (Q/DQ, QOperator or dynamic quantization), which no float
/// emulation stands for: ONNX Runtime's CPU provider runs it as deployed, with its integer
/// kernels. With the line that says so where it is not the emulation.
pub fn default_candidate(cand_model: Option<&Path>) -> Result<(BackendSpec, Option<String>)> {
    let emulation = BackendSpec::sim(layerwise_model::Rounding::Fp16);
    let Some(path) = cand_model else { return Ok((emulation, None)) };
    let model =
        Model::load(path).map_err(|e| anyhow::anyhow!("cannot read the candidate model {}: {e}", path.display()))?;
    let index = layerwise_model::GraphIndex::build(model.graph())?;
    Ok(match layerwise_model::quant::quantization_of(model.graph(), &index) {
        Some(q) => (BackendSpec::ort_cpu(), Some(format!("the candidate model is quantized ({}): the candidate is ort:cpu, which runs it as deployed (a candidate given chooses another)", q.describe()))),
        // A file that already holds FP16/BF16 (`convert`'s, or another converter's) is what the
        // emulation would make of the float model: it is evaluated in its own types instead.
        None if layerwise_runtime::typed::has_reduced_precision(&model) => (
            BackendSpec::ort_cpu(),
            Some("the candidate model holds FP16/BF16 tensors: the candidate is ort:cpu, which evaluates it node by node in its own types (a candidate given chooses another)".to_string()),
        ),
        None => (emulation, None),
    })
}

/// Everything `layerwise bisect` takes.
#[derive(Debug, Clone)]
pub struct BisectOptions {
    pub model: PathBuf,
    pub reference: BackendSpec,
    pub candidate: BackendSpec,
    /// A different model file for the candidate side (a converted FP16 model); tensors are matched
    /// by name.
    pub cand_model: Option<PathBuf>,
    /// The quantization config of `--cand sim:int8` / `sim:fp8` (JSON; defaults where `None`).
    pub quant_config: Option<PathBuf>,
    pub inputs: InputOptions,
    pub atol: Option<f64>,
    pub rtol: Option<f64>,
    pub range_tol: Option<f64>,
    /// Tolerances of single tensors (`--atol logits:1e-3`): each field given replaces that
    /// tensor's, the rest as for every tensor.
    pub tensor_tolerances: Vec<(String, ToleranceField, f64)>,
    /// Report files to write (JSON, HTML, Markdown, CSV, Model Explorer node data).
    pub outputs: Outputs,
    pub save_tensors: Option<PathBuf>,
    /// The `--data-loader-script` that made the samples: read, so never written over.
    pub data_loader_script: Option<PathBuf>,
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
    /// `--task OUTPUT:TASK`: outputs judged in the model's own terms beside the element-wise
    /// metrics (`layerwise_analysis::answers`); a classifier's Softmax output is recognised.
    pub tasks: Vec<(String, layerwise_analysis::answers::Task)>,
    /// Every tensor of the reference on every sample is held for the whole job (`fix`, whose
    /// trials compare against them): counted so by the memory check made before anything runs.
    pub holds_reference_tensors: bool,
    /// The GPU that the GPU backends of `reference` and `candidate` run on (overrides nothing:
    /// a spec that names its own `device=` is refused); set per shard by `--devices`.
    pub device: Option<u32>,
    /// Pair a `--cand-model`'s tensors with the reference's by structure where names differ
    /// (`--match auto`); false: by name only.
    pub match_structure: bool,
    /// `--batch N`: samples of `--inputs DIR` run N at once (their first dimension) where both
    /// sides run on one GPU; 1: one at a time.
    pub batch: usize,
}

/// Which part of a tolerance a `--atol NAME:VALUE`-style option sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToleranceField {
    Atol,
    Rtol,
    RangeTol,
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
    pub fn new(model: impl Into<PathBuf>, reference: BackendSpec, candidate: BackendSpec) -> BisectOptions {
        BisectOptions {
            model: model.into(),
            reference,
            candidate,
            cand_model: None,
            quant_config: None,
            inputs: InputOptions::default(),
            atol: None,
            rtol: None,
            range_tol: None,
            tensor_tolerances: Vec::new(),
            outputs: Outputs::default(),
            save_tensors: None,
            data_loader_script: None,
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
            batch: 1,
            repro: None,
            shard: None,
            separate_runs: false,
            holds_reference_tensors: false,
            tasks: Vec::new(),
            device: None,
        }
    }
}

/// The outcome: the report (also written as JSON if asked) and its terminal rendering.
pub struct BisectOutcome {
    pub report: Report,
    pub text: String,
}

/// What a bisect (or fix) reads before any model is loaded: the model files, the inputs (every
/// sample of `--inputs DIR`), the data-loader script, and saved runs (`npz:PATH`).
pub fn bisect_reads(options: &BisectOptions) -> Reads {
    let mut reads = Reads::new();
    reads.file("the input model", &options.model);
    if let Some(m) = &options.cand_model {
        reads.file("the candidate model", m);
    }
    if let Some(c) = &options.quant_config {
        reads.file("the quantization config", c);
    }
    if let Some(npz) = &options.inputs.npz {
        if npz.is_dir() {
            // The folder's listing is the samples: nothing is written into it (a report named
            // `c.npz` there would be the next run's broken sample), and no sample is replaced.
            for entry in std::fs::read_dir(npz).into_iter().flatten().flatten() {
                reads.file(format!("a sample of --inputs {}", npz.display()), entry.path());
            }
            reads.folder("the samples folder --inputs", npz);
        } else {
            reads.file("the inputs", npz);
        }
    }
    for (_, f) in &options.inputs.npy {
        reads.file("an input", f);
    }
    if let Some(script) = &options.data_loader_script {
        reads.file("the data-loader script", script);
    }
    for (side, spec) in [("reference", &options.reference), ("candidate", &options.candidate)] {
        if let BackendSpec::Saved(path) = spec {
            if path.is_dir() {
                reads.folder(format!("the saved {side} run"), path);
                // A saved run reads the inputs file beside its folder.
                if let Some(parent) = path.parent() {
                    reads.file(
                        format!("the inputs of the saved {side} run"),
                        parent.join(layerwise_runtime::saved::INPUTS_FILE),
                    );
                }
            } else {
                reads.file(format!("the saved {side} run"), path);
            }
        }
    }
    reads
}

/// Checks every output of a bisect before any work ([`crate::write_rule`]): reports, and the
/// folders `--repro` and `--save-tensors` fill, against what the run reads and each other.
pub fn check_outputs(options: &BisectOptions) -> Result<()> {
    let mut reads = bisect_reads(options);
    let mut filled = Reads::new();
    for (option, dir) in [("--repro", &options.repro), ("--save-tensors", &options.save_tensors)] {
        if let Some(dir) = dir {
            check_fresh_folder(dir, option)?;
            reads.refuse_overlap(dir, option)?;
            // Two folders layerwise fills are apart: one would replace the other's files (the
            // repro's inputs.npz over the saved run's).
            filled.refuse_overlap(dir, option)?;
            filled.folder(format!("the folder {option} fills"), dir);
        }
    }
    for (what, path) in options.outputs.paths() {
        let what = format!("the {what}");
        reads.check_output_file(path, &what)?;
        filled.refuse_overlap(path, &what)?;
    }
    Ok(())
}

/// Checks that no output of `options` (reports, `-o` given as `extra`) replaces a file of `model`'s
/// external data, which only a loaded model knows.
pub fn check_not_external_data(
    model: &Model,
    what_model: &str,
    options: &BisectOptions,
    extra: &[(&str, &Path)],
) -> Result<()> {
    let mut reads = Reads::new();
    reads.external_data(model, what_model);
    for (what, path) in options
        .outputs
        .paths()
        .into_iter()
        .map(|(w, p)| (format!("the {w}"), p.as_path()))
        .chain(extra.iter().map(|(w, p)| (w.to_string(), *p)))
    {
        reads.refuse_overlap(path, &what)?;
    }
    Ok(())
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

/// Whether `e` is a run refused or stopped for its memory (`RuntimeError::Memory`): such a run is
/// never tried again another way (separate runs, the reference's kernels), where it would only
/// grow again.
pub(crate) fn stopped_for_memory(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref(), Some(layerwise_runtime::RuntimeError::Memory(_)))
}
