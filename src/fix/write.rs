//! Writing and checking the fixed file: the model converted with the keep list, loaded by ONNX
//! Runtime in a child process, evaluated in its own types on every sample (which shares no code
//! with the emulation that chose the list), and moved to `-o` with its keep list only once it
//! holds. FIXED stands on that check.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use layerwise_analysis::{verdict_order, Comparison};
use layerwise_model::convert::{check_float_types, convert_fp16, Conversion, ConvertOptions};
use layerwise_model::scratch::{ScratchDir, StagedDir};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_report::{stage_atomic, KeptPattern, LoadCheck, ModelCheck, OutputChange};
use layerwise_runtime::{Backend, RunRequest, Tensor};

use super::options::keep_list_path;
use super::search::Search;
use super::summary::{num, output_changes};

/// Where and how `fix` writes its file: the model written (the original where control flow was
/// inlined), its float tensors, what ONNX Runtime refuses in the target type, and the path (in a
/// staging folder beside -o, or a scratch folder without it).
pub(super) struct Writing<'a> {
    pub source: &'a Model,
    pub source_index: &'a GraphIndex,
    pub float: HashSet<String>,
    pub refused: Option<BTreeMap<String, String>>,
    /// FP16 or BF16.
    pub target: layerwise_model::Precision,
    pub path: PathBuf,
    pub _staging: Option<StagedDir>,
    pub _scratch: ScratchDir,
}

impl Writing<'_> {
    /// The model converted with `keep` in FP32, written to the path, and loaded and run on `feeds`
    /// by ONNX Runtime in a child process (op types that crash it kept in FP32).
    pub(super) fn convert_and_check(
        &self,
        keep: &[String],
        feeds: &[(String, Tensor)],
    ) -> Result<(Conversion, LoadCheck)> {
        let options =
            ConvertOptions { keep_nodes: keep.iter().cloned().collect(), target: self.target, ..Default::default() };
        let mut convert = |o: &ConvertOptions| match &self.refused {
            Some(refused) => Ok(convert_fp16(
                self.source,
                self.source_index,
                &self.float,
                &ConvertOptions { refused: refused.clone(), ..o.clone() },
            )?),
            None => Ok(crate::keep::convert_checked(self.source, self.source_index, &self.float, o)?.0),
        };
        crate::load_check::convert_that_loads(self.source, &options, &self.path, Some(feeds), &mut convert)
    }
}

/// The written file at `path`, read back and evaluated in its own types on every sample: it must
/// hold on each. The worst sample's outputs (the first failing one, else the largest error, by
/// bisect's order of samples), or why the evaluation could not run.
/// Where outputs are judged by their answers, their record over the samples too; held to the
/// answers (`--target answer`), the file passes where they hold.
fn typed_check(search: &Search, path: &Path) -> Result<Result<Option<TypedCheck>, String>> {
    let written = Model::load(path)?;
    let wi = GraphIndex::build(written.graph())?;
    let mut typed = layerwise_runtime::typed::TypedBackend::new(&layerwise_runtime::BackendSpec::ort_cpu(), None);
    let outputs = &search.index.outputs;
    let mut worst: Option<(bool, Comparison)> = None;
    let mut answers = Vec::new();
    for k in 0..search.samples.len() {
        let request = RunRequest {
            model: &written,
            index: &wi,
            inputs: &search.samples[k].feeds,
            selection: &Selection::Names(Vec::new()),
        };
        let out = match typed.run(&request) {
            Ok(out) => out,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let comparison = search.compare_outputs(k, &out.tensors);
        let pass = search.sample_passes(k, &comparison, &out.tensors, &mut answers);
        let key = |pass: bool, c: &Comparison| (!pass, c.largest_error(outputs));
        if worst.as_ref().is_none_or(|(p, c)| verdict_order(key(pass, &comparison), key(*p, c)).is_gt()) {
            worst = Some((pass, comparison));
        }
    }
    // The worst sample passes only where every sample does.
    Ok(Ok(worst.map(|(pass, comparison)| {
        let (pass, answers) = search.target_over(&answers, pass);
        TypedCheck { pass, comparison, answers }
    })))
}

/// The written file's evaluation in its own types: whether it holds on every sample, the worst
/// sample's outputs, and the answers' record where outputs are judged by them.
struct TypedCheck {
    pass: bool,
    comparison: Comparison,
    answers: Vec<layerwise_analysis::AnswerRecord>,
}

/// What the written file's checks found.
pub(super) struct Checked {
    /// Where the model goes (`-o`), where it holds: moved there with the run's other outputs.
    pub fixed_model: Option<String>,
    /// The model, its weights file and its keep list, staged; moved into place by the caller
    /// with the run's report.
    pub outputs: Staged,
    /// The nodes the written file holds in FP32, with why.
    pub fp32_nodes: Vec<(String, String)>,
    pub check: ModelCheck,
    pub load: LoadCheck,
    /// Why the written file is no fix, where it is not.
    pub failure: Option<String>,
    /// The written file's answers over the samples, where outputs are judged by them.
    pub answers: Vec<layerwise_analysis::AnswerRecord>,
}

/// The file for `keep` written (or the one `beside` wrote for that list already, with its time),
/// loaded in a child process, evaluated in its own types, and moved to `-o` with its keep list
/// where both hold. `first` is the run with nothing kept, the check's before.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_and_check(
    search: &mut Search,
    writing: &Writing,
    beside: Option<(Vec<String>, Result<(Conversion, LoadCheck)>, f64)>,
    keep: &[String],
    patterns: &[KeptPattern],
    trtexec: String,
    first: &Comparison,
    output: Option<&Path>,
) -> Result<Checked> {
    let index = search.index;
    let backend = format!(
        "typed evaluation of {}",
        output.map_or("the fixed model (not written: no -o)".to_string(), |out| out.display().to_string())
    );
    // The file is written once, where it is moved to, and checked in a child process with ONNX
    // Runtime's defaults first (an FP16 model can crash ONNX Runtime, and so this process in the
    // typed evaluation); op types that crash it are kept in FP32.
    let label = "writing the fixed model and loading it in a child process";
    let (conversion, load) = match beside {
        Some((early_keep, result, seconds)) if early_keep == keep => {
            search.steps.record(&format!("{label} (beside the prune rounds)"), seconds);
            result?
        }
        _ => {
            let started = std::time::Instant::now();
            let written = writing.convert_and_check(keep, &search.samples[0].feeds)?;
            search.steps.record(label, started.elapsed().as_secs_f64());
            written
        }
    };
    let started = std::time::Instant::now();
    let checked = typed_check(search, &writing.path)?;
    search.steps.record("evaluating the fixed model in its own types", started.elapsed().as_secs_f64());
    let structural_problems = check_float_types(&conversion.proto, &writing.float);
    let mut answers = Vec::new();
    let check = match checked {
        Ok(Some(TypedCheck { pass, comparison, answers: records })) => {
            answers = records;
            ModelCheck {
                backend,
                structural_problems,
                outputs: output_changes(index, first, &comparison),
                pass,
                not_run: None,
            }
        }
        Ok(None) => ModelCheck {
            backend,
            structural_problems,
            outputs: Vec::new(),
            pass: false,
            not_run: Some("no sample to run".into()),
        },
        Err(e) => ModelCheck { backend, structural_problems, outputs: Vec::new(), pass: false, not_run: Some(e) },
    };
    // A model that ONNX Runtime refuses (but for a CPU kernel it lacks) or crashes on is no fix,
    // whatever the typed evaluation says.
    let crashed = Some(&load)
        .filter(|l| crate::load_check::unusable(l))
        .map(|l| format!("{}: {}", l.status, l.detail.clone().unwrap_or_default()));
    let mut fixed_model = None;
    let mut outputs = Staged::default();
    let failure = if let Some(how) = crashed {
        Some(format!("the fixed model does not load: {how}"))
    } else if !check.pass {
        let worst: Vec<String> = check
            .outputs
            .iter()
            .filter(|o| !o.after_pass)
            .map(|o: &OutputChange| format!("'{}' rel L2 {}", o.name, num(o.after_rel_l2)))
            .collect();
        // A model that does not hold is not written (its staging folder goes with it).
        let changed: Vec<String> =
            answers.iter().filter(|a| a.changed_cases > 0 || a.not_judged.is_some()).map(|a| a.line()).collect();
        Some(match &check.not_run {
            Some(why) => format!("the candidate passes with this keep list, but the written model could not be checked in its own types: {why}"),
            None if search.held_to_answers() && !changed.is_empty() => format!(
                "the candidate's answers hold with this keep list, but the written model's, evaluated in its own types, do not: {}",
                changed.join("; ")
            ),
            None => format!(
                "the candidate passes with this keep list, but the written model, evaluated in its own types, fails: {}",
                if worst.is_empty() { "its outputs are out of tolerance".to_string() } else { worst.join(", ") }
            ),
        })
    } else {
        if let Some(out) = output {
            for (staged, destination) in [
                (writing.path.clone(), out.to_path_buf()),
                (Model::oversized_data_path(&writing.path), Model::oversized_data_path(out)),
            ] {
                if staged.exists() {
                    outputs.moves.push((staged, destination));
                }
            }
            let keep_json = serde_json::json!({ "keep_fp32": keep, "patterns": patterns, "trtexec_flags": trtexec });
            outputs.files.push(stage_atomic(&keep_list_path(out), &serde_json::to_vec_pretty(&keep_json)?)?);
            fixed_model = Some(out.display().to_string());
        }
        None
    };
    Ok(Checked { fixed_model, outputs, fp32_nodes: conversion.fp32_nodes, check, load, failure, answers })
}

/// A fix's outputs, written in full beside their destinations and moved there together once every
/// one is (issue 54: on a full disk the fix exited 2 after `-o` was replaced, beside an older keep
/// list). A rename in a folder needs no new space.
#[derive(Debug, Default)]
pub(crate) struct Staged {
    /// Files written in a staging folder: (staged, destination).
    pub moves: Vec<(std::path::PathBuf, std::path::PathBuf)>,
    pub files: Vec<layerwise_report::StagedFile>,
}

impl Staged {
    /// Moves every output into place, the model first.
    pub(crate) fn commit(self) -> Result<()> {
        for (staged, destination) in self.moves {
            std::fs::rename(&staged, &destination)
                .with_context(|| format!("-o: moving the fixed model into place at {}", destination.display()))?;
            layerwise_model::scratch::note_written(&destination);
        }
        for file in self.files {
            file.commit()?;
        }
        Ok(())
    }
}

/// Whether keep-list name `name` is a node the inlining of `inlined` made (`If/output0`,
/// `Loop/final0`): no node of the written file, whose If or Loop interface is float32 already.
pub(super) fn made_by_inlining(name: &str, inlined: &[String]) -> bool {
    inlined.iter().any(|n| {
        name.strip_prefix(n.as_str())
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|rest| ["If", "Loop"].iter().any(|op| layerwise_model::inline::made_by_inlining(op, rest)))
    })
}

/// `trtexec` flags that keep the same layers in FP32 in a weakly typed TensorRT 10 build, as they
/// are pasted into a shell (the `--layerPrecisions` value one quoted word). A node inside an If or
/// Loop body (`Node/then/inner`, as layerwise names it once inlined) is named by its own name in
/// the file, the name TensorRT's ONNX parser gives its layer. A name that cannot be given there
/// ([`layerwise_report::escape::trtexec_layer_refusal`]) is left out; the reports name it. So is a
/// node the inlining made (`If/output0`, `Loop/final0`): the file has no such layer, and the float32
/// interface of its If or Loop already is what keeping it asks.
pub fn trtexec_flags(keep: &[String], inlined: &[String], low: &str) -> String {
    let keep: Vec<&String> = keep
        .iter()
        .filter(|n| layerwise_report::escape::trtexec_layer_refusal(n).is_none() && !made_by_inlining(n, inlined))
        .collect();
    if keep.is_empty() {
        return String::new();
    }
    // The innermost body holding the node: the longest inlined node name that prefixes it.
    let own_name = |name: &str| -> String {
        inlined
            .iter()
            .filter_map(|n| name.strip_prefix(n.as_str())?.strip_prefix('/')?.split_once('/').map(|(_, rest)| rest))
            .min_by_key(|rest| rest.len())
            .unwrap_or(name)
            .to_string()
    };
    // A Loop's iterations share one body, so one layer: named once.
    let mut named = std::collections::HashSet::new();
    let spec: Vec<String> =
        keep.iter().map(|n| format!("{}:fp32", own_name(n))).filter(|layer| named.insert(layer.clone())).collect();
    let value = layerwise_report::escape::shell_quoted(&spec.join(",")).expect("names a shell word can hold");
    format!("--{low} --precisionConstraints=obey --layerPrecisions={value}")
}
