//! The bisect job: load, prepare inputs, run both backends, compare, walk back, report.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use layerwise_analysis::{compare_all, walk_back, Candidate, Tolerance, WalkRule};
use layerwise_model::{scan_fp16_weight_range, GraphIndex, Model, Selection};
use layerwise_report::{build_report, render_terminal, Outputs, Report, ReportContext};
use layerwise_runtime::inputs::{declared_inputs, prepare_inputs, InputOptions};
use layerwise_runtime::{create_backend, saved, Precision, RunRequest};

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
    started: Instant,
    durations: Vec<(String, f64)>,
}

impl Steps {
    fn new(show: bool) -> Steps {
        let bar = ProgressBar::new_spinner();
        bar.set_draw_target(if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() });
        bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("template"));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        Steps { bar, started: Instant::now(), durations: Vec::new() }
    }

    fn run<T>(&mut self, label: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.bar.set_message(label.to_string());
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

/// Tolerances and walk thresholds for a candidate precision, with the user's overrides.
pub fn tolerance_and_rule(precision: Precision, options: &BisectOptions) -> Result<(Tolerance, WalkRule)> {
    let (defaults, rule) = match precision {
        Precision::Fp16 => (Tolerance::FP16, WalkRule::FP16),
        Precision::Fp32 => (Tolerance::FP32, WalkRule::FP32),
    };
    let tolerance = Tolerance {
        atol: options.atol.unwrap_or(defaults.atol),
        rtol: options.rtol.unwrap_or(defaults.rtol),
        range_tol: options.range_tol.unwrap_or(defaults.range_tol),
    };
    if !(tolerance.atol >= 0.0 && tolerance.rtol >= 0.0 && tolerance.range_tol >= 0.0) {
        bail!("--atol, --rtol and --range-tol must be non-negative numbers");
    }
    Ok((tolerance, rule))
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

fn check_outputs(outputs: &Outputs) -> Result<()> {
    for (what, path) in outputs.paths() {
        check_writable_target(path, &format!("the {what}"))?;
    }
    Ok(())
}

pub fn bisect(options: &BisectOptions) -> Result<BisectOutcome> {
    let mut steps = Steps::new(options.progress);
    check_outputs(&options.outputs)?;
    let model = steps.run("loading model", || Model::load(&options.model).map_err(Into::into))?;
    run_bisect(&model, options, steps)
}

/// The bisect job on an already loaded model (the demo builds its model in memory).
pub fn bisect_model(model: &Model, options: &BisectOptions) -> Result<BisectOutcome> {
    check_outputs(&options.outputs)?;
    run_bisect(model, options, Steps::new(options.progress))
}

fn run_bisect(model: &Model, options: &BisectOptions, mut steps: Steps) -> Result<BisectOutcome> {
    let index = GraphIndex::build(model.graph()).with_context(|| format!("{}", model.path.display()))?;
    let mut reference = create_backend(&options.reference).context("--ref")?;
    let mut candidate = create_backend(&options.candidate).context("--cand")?;
    let decls = declared_inputs(model, &index);
    let inputs = prepare_inputs(&decls, &options.inputs)?;
    let feeds: Vec<(String, layerwise_runtime::Tensor)> = inputs.iter().map(|i| (i.name.clone(), i.tensor.clone())).collect();

    // A converted candidate model computes in FP16 whatever its backend's own precision is.
    let cand_model = match &options.cand_model {
        Some(path) => Some(steps.run("loading candidate model", || Model::load(path).map_err(Into::into))?),
        None => None,
    };
    let precision = if cand_model.is_some() { Precision::Fp16 } else { candidate.precision() };
    let (tolerance, rule) = tolerance_and_rule(precision, options)?;

    let request = RunRequest { model, index: &index, inputs: &feeds, selection: &options.selection };
    let ref_out = steps.run(&format!("running reference {}", options.reference), || Ok(reference.run(&request)?))?;
    let cand_out = match &cand_model {
        Some(cm) => {
            let cand_index = GraphIndex::build(cm.graph()).with_context(|| format!("{}", cm.path.display()))?;
            let cand_request = RunRequest { model: cm, index: &cand_index, inputs: &feeds, selection: &Selection::All };
            steps.run(&format!("running candidate {} on {}", options.candidate, cm.path.display()), || Ok(candidate.run(&cand_request)?))?
        }
        None => steps.run(&format!("running candidate {}", options.candidate), || Ok(candidate.run(&request)?))?,
    };

    let order: Vec<String> = index.computed_tensors().map(str::to_string).collect();
    if let Some(dir) = &options.save_tensors {
        steps.run("saving tensors", || {
            saved::save_run(dir, "ref", &options.reference, &order, &ref_out.tensors, &ref_out.engine_layers, &feeds)?;
            saved::save_run(dir, "cand", &options.candidate, &order, &cand_out.tensors, &cand_out.engine_layers, &feeds)?;
            Ok(())
        })?;
    }
    let comparison = steps.run("comparing tensors", || Ok(compare_all(&index, &order, &ref_out.tensors, &cand_out.tensors, tolerance)))?;
    if index.outputs.iter().all(|o| comparison.get(o).is_none()) {
        bail!("no model output could be compared: {}", comparison.not_compared.iter().map(|(t, r)| format!("{t}: {r}")).collect::<Vec<_>>().join("; "));
    }
    let weights = if precision == Precision::Fp16 { scan_fp16_weight_range(model)? } else { Vec::new() };
    let verdict = walk_back(&index, &comparison, &weights, rule, Candidate { tf32: candidate.tf32() });
    let histogram = verdict.first_divergent.as_ref().and_then(|fd| {
        let (r, c) = (ref_out.tensors.get(&fd.tensor)?, cand_out.tensors.get(&fd.tensor)?);
        Some(layerwise_analysis::histogram(&r.to_f32(), &c.to_f32(), 40))
    });
    let mut unavailable = ref_out.unavailable.clone();
    unavailable.extend(cand_out.unavailable.iter().cloned());

    let durations = steps.finish();
    let report = build_report(ReportContext {
        model,
        index: &index,
        ref_spec: &options.reference,
        cand_spec: &options.candidate,
        ref_notes: ref_out.notes,
        cand_notes: cand_out.notes,
        tolerance,
        rule,
        inputs: &inputs,
        comparison: &comparison,
        verdict: &verdict,
        weights: &weights,
        unavailable,
        histogram,
        engine_layers: cand_out.engine_layers.clone(),
        run_info: layerwise_report::RunInfo {
            generated_at_unix_s: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            durations_s: durations,
        },
    });
    options.outputs.write(&serde_json::to_value(&report)?, None)?;
    let text = render_terminal(&report, options.top);
    Ok(BisectOutcome { report, text })
}
