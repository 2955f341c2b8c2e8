//! `layerwise._native`: the Rust side of the Python package. The Python side (python/layerwise)
//! turns keyword arguments and numpy arrays into what these functions take, and their JSON back
//! into typed objects; the work is the same code the command line runs.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use layerwise::fix::{fix as run_fix, FixOptions};
use layerwise::pipeline::{bisect as run_bisect, default_candidate, BisectOptions, Marking, ToleranceField, CANCEL};
use layerwise_model::Selection;
use layerwise_runtime::{BackendSpec, DType, Tensor};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyKeyboardInterrupt};
use pyo3::prelude::*;
use serde::Deserialize;

create_exception!(_native, LayerwiseError, PyException, "A layerwise run failed: what exits 2 on the command line.");

/// One array as Python hands it over: name, numpy dtype string (`<f4`), shape, raw bytes.
type RawArray = (String, String, Vec<usize>, Vec<u8>);

fn tensor(dtype: &str, shape: Vec<usize>, bytes: &[u8]) -> PyResult<Tensor> {
    let dtype = match dtype.trim_start_matches(['<', '=', '|']) {
        "f4" => DType::F32,
        "f2" => DType::F16,
        "f8" => DType::F64,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "b1" => DType::Bool,
        other => {
            return Err(LayerwiseError::new_err(format!(
            "input error: numpy dtype '{other}' is not one layerwise takes (float32, float16, float64, integers, bool)"
        )))
        }
    };
    Tensor::from_le_bytes(dtype, shape.clone(), bytes).ok_or_else(|| {
        LayerwiseError::new_err(format!("input error: {} bytes do not fill shape {shape:?}", bytes.len()))
    })
}

fn arrays(raw: Vec<RawArray>) -> PyResult<Vec<(String, Tensor)>> {
    raw.into_iter().map(|(name, dtype, shape, bytes)| Ok((name, tensor(&dtype, shape, &bytes)?))).collect()
}

/// A tolerance: one number for every tensor, or numbers by tensor name ({"logits": 1e-3}).
#[derive(Deserialize)]
#[serde(untagged)]
enum Tol {
    All(f64),
    ByTensor(std::collections::BTreeMap<String, f64>),
}

/// A memory size: bytes, or text as the command line takes it ("512M", "2G").
#[derive(Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

/// The options both `bisect` and `fix` take, by their command-line names.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Options {
    #[serde(rename = "ref")]
    reference: Option<String>,
    cand: Option<String>,
    cand_model: Option<PathBuf>,
    atol: Option<Tol>,
    rtol: Option<Tol>,
    range_tol: Option<Tol>,
    seed: Option<u64>,
    input_shapes: Vec<(String, Vec<usize>)>,
    val_ranges: Vec<(String, f64, f64)>,
    tensors: Option<Vec<String>>,
    mark: Option<String>,
    max_memory: Option<Size>,
    separate_runs: Option<bool>,
    isolate: Option<bool>,
    counterfactual: Option<bool>,
    noise_floor: Option<bool>,
    keep_control_flow: Option<bool>,
    #[serde(rename = "match")]
    match_mode: Option<String>,
    progress: Option<bool>,
    progress_lines: Option<bool>,
    json: Option<PathBuf>,
    html: Option<PathBuf>,
    markdown: Option<PathBuf>,
    repro: Option<PathBuf>,
    output: Option<PathBuf>,
    max_rounds: Option<usize>,
    /// (output, task) as `--task OUTPUT:TASK` gives them.
    task: Vec<(String, String)>,
    target: Option<String>,
}

/// The options of `options_json`, or an error naming the option at fault and what it takes (the
/// Python side checks each first; this is what a direct caller of `_native` gets), never a JSON
/// parser's line and column.
fn parse_options(options_json: &str) -> PyResult<Options> {
    let bad = |what: String| pyo3::exceptions::PyValueError::new_err(format!("bad option: {what}"));
    let value: serde_json::Value =
        serde_json::from_str(options_json).map_err(|e| bad(format!("the options are not JSON ({e})")))?;
    let serde_json::Value::Object(fields) = &value else { return Err(bad("the options must be a JSON object".into())) };
    for (key, v) in fields {
        let one = serde_json::Value::Object([(key.clone(), v.clone())].into_iter().collect());
        if let Err(e) = serde_json::from_value::<Options>(one) {
            // serde's own words, without a position: "invalid type: integer `5`, expected a string".
            let said = e.to_string();
            let said = said.split(" at line ").next().unwrap_or(&said).to_string();
            return Err(bad(format!("{key}: {said} (given {v})")));
        }
    }
    serde_json::from_value(value).map_err(|e| bad(e.to_string()))
}

fn bisect_options(
    model: &str,
    o: &Options,
    inputs: Vec<(String, Tensor)>,
    samples: Vec<(String, Vec<(String, Tensor)>)>,
) -> PyResult<BisectOptions> {
    let spec = |given: Option<&str>, default: &str, what: &str| {
        BackendSpec::parse(given.unwrap_or(default)).map_err(|e| LayerwiseError::new_err(format!("{what}: {e}")))
    };
    // No candidate given: the CLI's default, a quantized candidate model run as deployed.
    let candidate = match o.cand.as_deref() {
        Some(given) => spec(Some(given), "", "cand")?,
        None => {
            default_candidate(o.cand_model.as_deref())
                .map_err(|e| LayerwiseError::new_err(format!("cand_model: {e:#}")))?
                .0
        }
    };
    let mut b = BisectOptions::new(model, spec(o.reference.as_deref(), "ort:cpu", "ref")?, candidate);
    b.cand_model = o.cand_model.clone();
    for (given, field) in
        [(&o.atol, ToleranceField::Atol), (&o.rtol, ToleranceField::Rtol), (&o.range_tol, ToleranceField::RangeTol)]
    {
        match given {
            None => {}
            Some(Tol::All(v)) => match field {
                ToleranceField::Atol => b.atol = Some(*v),
                ToleranceField::Rtol => b.rtol = Some(*v),
                ToleranceField::RangeTol => b.range_tol = Some(*v),
            },
            Some(Tol::ByTensor(map)) => b.tensor_tolerances.extend(map.iter().map(|(t, v)| (t.clone(), field, *v))),
        }
    }
    b.inputs.seed = o.seed.unwrap_or(0);
    b.inputs.shapes = o.input_shapes.clone();
    b.inputs.ranges = o.val_ranges.clone();
    b.inputs.given = inputs;
    b.inputs.given_samples = samples;
    b.selection = o.tensors.clone().map(Selection::Names).unwrap_or(Selection::All);
    b.mark = match o.mark.as_deref() {
        None | Some("all") => Marking::All,
        Some("search") => Marking::Search,
        Some(other) => return Err(LayerwiseError::new_err(format!("mark must be 'all' or 'search', not '{other}'"))),
    };
    b.max_memory = match &o.max_memory {
        None => None,
        // As the command line's --max-memory: at least one byte.
        Some(Size::Bytes(0)) => {
            return Err(pyo3::exceptions::PyValueError::new_err("max_memory: size '0' must be at least one byte"))
        }
        Some(Size::Bytes(n)) => Some(*n),
        Some(Size::Text(t)) => {
            Some(layerwise::pipeline::parse_size(t).map_err(|e| LayerwiseError::new_err(format!("max_memory: {e}")))?)
        }
    };
    b.separate_runs = o.separate_runs.unwrap_or(false);
    b.isolate = o.isolate.unwrap_or(true);
    b.counterfactual = o.counterfactual.unwrap_or(true);
    b.noise_floor = o.noise_floor.unwrap_or(true);
    b.keep_control_flow = o.keep_control_flow.unwrap_or(false);
    b.match_structure = match o.match_mode.as_deref() {
        None | Some("auto") => true,
        Some("name") => false,
        Some(other) => return Err(LayerwiseError::new_err(format!("match must be 'auto' or 'name', not '{other}'"))),
    };
    b.progress = o.progress.unwrap_or(true);
    b.progress_lines = o.progress_lines.unwrap_or(false);
    b.outputs.json = o.json.clone();
    b.outputs.html = o.html.clone();
    b.outputs.markdown = o.markdown.clone();
    b.repro = o.repro.clone();
    for (output, task) in &o.task {
        b.tasks.push(
            layerwise::pipeline::parse_task(&format!("{output}:{task}"))
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("task[{output:?}]: {e}")))?,
        );
    }
    Ok(b)
}

/// Runs `job` with the GIL released, checking for Ctrl-C meanwhile: on one, the job is asked to
/// stop at its next step, and KeyboardInterrupt is raised once it has.
fn interruptible<T: Send>(py: Python<'_>, job: impl FnOnce() -> anyhow::Result<T> + Send) -> PyResult<T> {
    CANCEL.store(false, Ordering::Relaxed);
    let result = std::thread::scope(|scope| {
        let handle = scope.spawn(job);
        let mut interrupted = false;
        while !handle.is_finished() {
            py.detach(|| std::thread::sleep(std::time::Duration::from_millis(50)));
            if !interrupted && py.check_signals().is_err() {
                interrupted = true;
                CANCEL.store(true, Ordering::Relaxed);
            }
        }
        let out = handle.join();
        (out, interrupted)
    });
    CANCEL.store(false, Ordering::Relaxed);
    match result {
        (_, true) => Err(PyKeyboardInterrupt::new_err(
            "layerwise: interrupted; temporary files removed (each output is written whole or not at all)",
        )),
        (Ok(Ok(v)), false) => Ok(v),
        (Ok(Err(e)), false) => Err(LayerwiseError::new_err(format!("{e:#}"))),
        (Err(_), false) => Err(LayerwiseError::new_err("internal error: the run panicked")),
    }
}

/// `layerwise bisect`: returns the JSON report, exactly as `--json` writes it.
#[pyfunction]
#[pyo3(signature = (model, options_json, inputs, samples))]
fn bisect(
    py: Python<'_>,
    model: &str,
    options_json: &str,
    inputs: Vec<RawArray>,
    samples: Vec<(String, Vec<RawArray>)>,
) -> PyResult<String> {
    let o = parse_options(options_json)?;
    let samples = samples.into_iter().map(|(name, raw)| Ok((name, arrays(raw)?))).collect::<PyResult<Vec<_>>>()?;
    let options = bisect_options(model, &o, arrays(inputs)?, samples)?;
    interruptible(py, move || {
        let outcome = run_bisect(&options)?;
        // The bytes `--json` writes.
        Ok(serde_json::to_string_pretty(&serde_json::to_value(&outcome.report)?)?)
    })
}

/// `layerwise fix`: returns the fix report (schema layerwise.fix/1) as JSON. `samples`, when
/// given, are the set the keep list must hold on.
#[pyfunction]
#[pyo3(signature = (model, options_json, inputs, samples))]
fn fix(
    py: Python<'_>,
    model: &str,
    options_json: &str,
    inputs: Vec<RawArray>,
    samples: Vec<(String, Vec<RawArray>)>,
) -> PyResult<String> {
    let o = parse_options(options_json)?;
    let samples = samples.into_iter().map(|(name, raw)| Ok((name, arrays(raw)?))).collect::<PyResult<Vec<_>>>()?;
    let mut bisect = bisect_options(model, &o, arrays(inputs)?, samples)?;
    bisect.outputs = layerwise_report::Outputs { json: o.json.clone(), ..Default::default() };
    bisect.holds_reference_tensors = true;
    let target = layerwise::fix::FixTarget::parse(o.target.as_deref().unwrap_or("elementwise"))
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("target: {e}")))?;
    let options = FixOptions { bisect, output: o.output.clone(), max_rounds: o.max_rounds.unwrap_or(12), target };
    interruptible(py, move || {
        let outcome = run_fix(&options)?;
        Ok(serde_json::to_string(&outcome.report)?)
    })
}

/// Runs a command line (the program name first) as the `layerwise` command does; returns its
/// exit status.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| layerwise::cli::main_with_args(argv))
}

/// Runs a command line (the program name first) in this process, without a signal handler:
/// returns its exit status, or raises LayerwiseError with the message the command would print.
#[pyfunction]
fn run_command(py: Python<'_>, argv: Vec<String>) -> PyResult<u8> {
    interruptible(py, move || layerwise::cli::run_in_process(argv))
}

/// The HTML report of a JSON report.
#[pyfunction]
fn render_html(report_json: &str) -> PyResult<String> {
    let report = layerwise_report::parse_report(report_json, "the report")
        .map_err(|e| LayerwiseError::new_err(e.to_string()))?;
    Ok(layerwise_report::render_html(&report))
}

/// The HTML view of a fix report (for notebooks).
#[pyfunction]
fn render_fix_html(fix_json: &str) -> PyResult<String> {
    let report = layerwise_report::parse_fix_report(fix_json, "the fix report")
        .map_err(|e| LayerwiseError::new_err(e.to_string()))?;
    Ok(layerwise_report::render_fix_html(&report))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // `convert` and `fix` check a written model in a child process running layerwise's own
    // command line: from Python that is this interpreter with the package's `_cli` module.
    let executable: String = m.py().import("sys")?.getattr("executable")?.extract()?;
    layerwise::load_check::set_self_command(vec![executable.into(), "-m".into(), "layerwise._cli".into()]);
    m.add_function(wrap_pyfunction!(bisect, m)?)?;
    m.add_function(wrap_pyfunction!(fix, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(run_command, m)?)?;
    m.add_function(wrap_pyfunction!(render_html, m)?)?;
    m.add_function(wrap_pyfunction!(render_fix_html, m)?)?;
    m.add("LayerwiseError", m.py().get_type::<LayerwiseError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
