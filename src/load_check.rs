//! Does a converted model load and run with ONNX Runtime's defaults? Checked in a child process,
//! because an FP16 model can crash ONNX Runtime outright (a segmentation fault creating the
//! session was seen on a bidirectional-GRU text model), which no error handling in this process
//! could survive. Where the child crashes, the op types responsible are found by converting again
//! with each kept in FP32, and kept.

use std::ffi::OsString;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, Result};
use layerwise_model::convert::{Conversion, ConvertOptions};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_report::{LoadCheck, LoadStatus};
use layerwise_runtime::{create_backend, BackendSpec, OptLevel, OrtOptions, RunRequest, Tensor};

/// The command line that runs this program's own commands: the Python extension sets its
/// interpreter with `-m layerwise._cli`; otherwise the running executable.
static SELF_COMMAND: OnceLock<Vec<OsString>> = OnceLock::new();

/// Sets the command that runs `layerwise`'s command line (the Python extension calls this).
pub fn set_self_command(command: Vec<OsString>) {
    let _ = SELF_COMMAND.set(command);
}

/// The command that runs layerwise's command line: the one set by the command line itself (its
/// own executable) or by the Python extension; else this executable when it is layerwise; else a `layerwise` beside it or one folder up (a test binary
/// under `target/*/deps`), or on the PATH.
fn self_command() -> Option<Vec<OsString>> {
    if let Some(c) = SELF_COMMAND.get() {
        return Some(c.clone());
    }
    let exe = std::env::current_exe().ok()?;
    let is_layerwise = |p: &Path| p.file_stem().is_some_and(|s| s == "layerwise") && p.is_file();
    if is_layerwise(&exe) {
        return Some(vec![exe.into_os_string()]);
    }
    let near = exe.parent().into_iter().flat_map(|d| [d.join("layerwise"), d.join("../layerwise")]);
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).map(|d| d.join("layerwise")).collect::<Vec<_>>());
    near.chain(on_path).find(|p| is_layerwise(p)).map(|p| vec![p.into_os_string()])
}

/// Runs `layerwise check-load MODEL [--inputs NPZ]` in a child process.
pub fn check_in_child(model: &Path, inputs: Option<&[(String, Tensor)]>) -> Result<LoadCheck> {
    let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-load-")?;
    let Some(mut command) = self_command() else {
        return Ok(LoadCheck {
            status: LoadStatus::NotChecked,
            detail: Some("no layerwise executable was found to load the model in a child process".into()),
            kept_ops: Vec::new(),
        });
    };
    let program = command.remove(0);
    let mut child = std::process::Command::new(program);
    crate::child::ends_with_this_process(&mut child);
    child.args(command).arg("check-load").arg(model);
    if let Some(inputs) = inputs {
        let path = scratch.path().join("inputs.npz");
        let refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        layerwise_runtime::npy::write_npz(&path, &refs)?;
        child.arg("--inputs").arg(path);
    }
    let out = child.output().context("cannot start a child process to check the model")?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(match out.status.code() {
        Some(0) => match stdout.lines().find_map(|l| l.strip_prefix("runs-at ")) {
            Some(level) => {
                let failed: Vec<&str> = stdout.lines().filter_map(|l| l.strip_prefix("fails-at ")).collect();
                LoadCheck {
                    status: LoadStatus::RunsBelowDefault,
                    detail: Some(format!(
                        "runs at optimization level {level}; fails at {}: ONNX Runtime's graph optimizations break it, not the model itself (run it with a lower graph optimization level, e.g. ort:cpu,opt={level})",
                        failed.join("; at ")
                    )),
                    kept_ops: Vec::new(),
                }
            }
            None => LoadCheck { status: LoadStatus::Loads, detail: None, kept_ops: Vec::new() },
        },
        Some(2) => LoadCheck {
            status: LoadStatus::Error,
            detail: Some(stderr.trim_start_matches("error: ").to_string()),
            kept_ops: Vec::new(),
        },
        _ => {
            #[cfg(unix)]
            let how = {
                use std::os::unix::process::ExitStatusExt;
                match out.status.signal() {
                    Some(s) => format!("ONNX Runtime crashed the process (signal {s}) loading or running the model with its default options"),
                    None => format!("the checking process ended with {}", out.status),
                }
            };
            #[cfg(not(unix))]
            let how = format!("the checking process ended with {}", out.status);
            LoadCheck { status: LoadStatus::Crashed, detail: Some(how), kept_ops: Vec::new() }
        }
    })
}

/// The child's side: an ONNX Runtime session for `model` at its default optimization level
/// (`all`), run once on `inputs` (or, without them, created only); where that fails, the lower
/// levels in turn (`extended`, `basic`, `disable`), since a graph optimization can break a valid
/// model (a cubic Resize whose sizes are computed at run time fails ScalesValidation at `all` and
/// runs at `extended`). Exit 0 when the default level works; exit 0 with a `runs-at LEVEL` line
/// and one `fails-at LEVEL: MESSAGE` line per level that failed on stdout when a lower one works;
/// an error (exit 2) when none does.
pub fn run_check_load(model_path: &Path, inputs: Option<&Path>) -> Result<u8> {
    let model = Model::load(model_path)?;
    let index = GraphIndex::build(model.graph())?;
    // Test hook, for tests/load_check.rs only: behave as ONNX Runtime did on the GRU text model, a
    // crash, for a node of this op type that reads an FP16 weight.
    if let Ok(op) = std::env::var("LAYERWISE_TEST_CRASH_OP") {
        let fp16_weights: std::collections::HashSet<&str> =
            model.graph().initializer.iter().filter(|t| t.data_type() == 10).map(|t| t.name()).collect();
        if model
            .graph()
            .node
            .iter()
            .any(|n| n.op_type() == op && n.input.iter().any(|i| fp16_weights.contains(i.as_str())))
        {
            std::process::abort();
        }
    }
    // Test hook, for tests/interrupt.rs only: a check that takes this long, to interrupt the
    // parent meanwhile.
    if let Some(ms) = std::env::var("LAYERWISE_TEST_CHECK_LOAD_SLEEP_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    // Test hook, for tests only: fail at these optimization levels as ONNX Runtime failed on the
    // ViT's FP16 Resize at `all`.
    let injected: Vec<String> = std::env::var("LAYERWISE_TEST_FAIL_AT_LEVELS")
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let feeds = inputs.map(layerwise_runtime::npy::read_npz).transpose()?;
    let mut failures: Vec<(OptLevel, String)> = Vec::new();
    for level in [OptLevel::All, OptLevel::Extended, OptLevel::Basic, OptLevel::Disable] {
        let attempt = || -> Result<()> {
            if injected.iter().any(|l| l == level.name()) {
                anyhow::bail!("[test] injected failure at optimization level {}", level.name());
            }
            let options = OrtOptions { typed: false, opt_level: level, ..OrtOptions::cpu() };
            match &feeds {
                Some(feeds) => {
                    let mut cpu = create_backend(&BackendSpec::Ort(options))?;
                    cpu.run(&RunRequest {
                        model: &model,
                        index: &index,
                        inputs: feeds,
                        selection: &Selection::Names(Vec::new()),
                    })?;
                }
                None => layerwise_runtime::load_session(&model, &options)?,
            }
            Ok(())
        };
        match attempt() {
            Ok(()) => {
                if !failures.is_empty() {
                    println!("runs-at {}", level.name());
                    for (l, why) in &failures {
                        println!("fails-at {}: {}", l.name(), why.replace('\n', " "));
                    }
                }
                return Ok(0);
            }
            Err(e) => failures.push((level, format!("{e:#}"))),
        }
    }
    let (_, first) = failures.swap_remove(0);
    anyhow::bail!("{first} (and at every lower optimization level)")
}

/// Converts with `options`, writes the result to `path`, and checks it in a child process; where
/// the child crashes, finds the op types whose FP16 nodes crash ONNX Runtime (each tried kept in
/// FP32 alone, then together), keeps them, and writes that conversion instead. `convert` is the
/// conversion to use for a set of options.
pub fn convert_that_loads(
    model: &Model,
    options: &ConvertOptions,
    path: &Path,
    inputs: Option<&[(String, Tensor)]>,
    convert: &mut dyn FnMut(&ConvertOptions) -> Result<Conversion>,
) -> Result<(Conversion, LoadCheck)> {
    let conversion = convert(options)?;
    model.save_standalone(&conversion.proto, path)?;
    let check = check_in_child(path, inputs)?;
    if check.status != LoadStatus::Crashed {
        return Ok((conversion, check));
    }
    // Op types computed in the target type, recurrent ops first (the crash seen was a GRU).
    let kept_fp32: std::collections::HashSet<&str> = conversion.fp32_nodes.iter().map(|(n, _)| n.as_str()).collect();
    let index = GraphIndex::build(model.graph())?;
    let mut ops: Vec<String> = Vec::new();
    for n in index.nodes.iter().filter(|n| {
        !kept_fp32.contains(n.name.as_str()) && !matches!(n.op_type.as_str(), "Constant" | "Cast" | "Shape" | "Size")
    }) {
        if !ops.contains(&n.op_type) && !options.keep_ops.contains(&n.op_type) {
            ops.push(n.op_type.clone());
        }
    }
    ops.sort_by_key(|op| !matches!(op.as_str(), "LSTM" | "GRU" | "RNN"));
    let attempt = |keep: &[String],
                   convert: &mut dyn FnMut(&ConvertOptions) -> Result<Conversion>|
     -> Result<(Conversion, LoadCheck)> {
        let mut o = options.clone();
        o.keep_ops.extend(keep.iter().cloned());
        let mut c = convert(&o)?;
        // Kept by this search, not by the user: the reason says so (it read "--keep-fp32-op
        // Transpose", a flag nobody gave).
        for (_, why) in c.fp32_nodes.iter_mut() {
            if let Some(op) = why.strip_prefix("--keep-fp32-op ").filter(|op| keep.iter().any(|k| k == op)) {
                if !options.keep_ops.contains(op) {
                    *why = format!("{op} kept FP32: ONNX Runtime crashed running the file with its FP16 {op} nodes");
                }
            }
        }
        model.save_standalone(&c.proto, path)?;
        Ok((c, check_in_child(path, inputs)?))
    };
    let crash_note = check.detail.clone().unwrap_or_default();
    for op in &ops {
        let (c, result) = attempt(std::slice::from_ref(op), convert)?;
        if result.status != LoadStatus::Crashed {
            return Ok((
                c,
                LoadCheck {
                    detail: Some(format!("{crash_note}; with every {op} kept in FP32 it {}", outcome(&result))),
                    kept_ops: vec![op.clone()],
                    ..result
                },
            ));
        }
    }
    // No single op type: keep them cumulatively until it loads, then drop those not needed.
    let mut keep: Vec<String> = Vec::new();
    for op in &ops {
        keep.push(op.clone());
        let (_, result) = attempt(&keep, convert)?;
        if result.status != LoadStatus::Crashed {
            let mut i = 0;
            while i + 1 < keep.len() {
                let without: Vec<String> =
                    keep.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, o)| o.clone()).collect();
                if attempt(&without, convert)?.1.status != LoadStatus::Crashed {
                    keep = without;
                } else {
                    i += 1;
                }
            }
            let (c, result) = attempt(&keep, convert)?;
            return Ok((
                c,
                LoadCheck {
                    detail: Some(format!(
                        "{crash_note}; with {} kept in FP32 it {}",
                        keep.join(", "),
                        outcome(&result)
                    )),
                    kept_ops: keep,
                    ..result
                },
            ));
        }
    }
    // Even all-FP32 ops crash: leave the first conversion and say so.
    let (c, _) = attempt(&[], convert)?;
    Ok((c, LoadCheck { detail: Some(format!("{crash_note}, whichever op types are kept in FP32")), ..check }))
}

/// Whether ONNX Runtime cannot use the model at all: it crashed, or refused it for any reason but
/// a missing CPU kernel ("Could not find an implementation": the model is valid, and the GPU
/// providers it is meant for have the kernel).
pub fn unusable(check: &LoadCheck) -> bool {
    match check.status {
        LoadStatus::Crashed => true,
        LoadStatus::Error => !check.detail.as_deref().is_some_and(|d| d.contains("Could not find an implementation")),
        LoadStatus::Loads | LoadStatus::RunsBelowDefault | LoadStatus::NotChecked => false,
    }
}

fn outcome(check: &LoadCheck) -> &'static str {
    if matches!(check.status, LoadStatus::Loads | LoadStatus::RunsBelowDefault) {
        "loads and runs"
    } else {
        "loads but ONNX Runtime refuses it"
    }
}
