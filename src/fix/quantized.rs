//! `fix --cand-model QDQ.onnx` (and `sim:int8`/`sim:fp8`): the smallest set of nodes to leave
//! unquantized in the Q/DQ candidate (docs/fix.md, "Quantized candidates"). The quantizers measured
//! one at a time come first (those at fault, then by their error alone), the walk's first
//! divergent layers after, each kept as bisect keeps a break; then each group not needed is
//! dropped. The model with those nodes unquantized is written (with -o, else to a scratch copy),
//! read back and run on the candidate backend as deployed: FIXED needs that run to pass. Beside it
//! goes the exclusion list the quantizers take (`nodes_to_exclude`, the float model's node names).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{Context, Result};
use layerwise_analysis::{Comparison, QuantizerAlone, Status};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_report::{render_fix_terminal, FixReport, FixStage, FixStatus, KeptPattern, ModelCheck, FIX_SCHEMA};
use layerwise_runtime::{RunRequest, Tensor};

use super::options::{exclusion_list_path, FixOptions, FixOutcome};
use super::search::{diagnose, AnswerGoal, Keeping, Sample, Search};
use super::summary::{output_changes, stage_json};
use crate::keep::UnquantizedRunner;
use crate::pipeline::setup::Setup;
use crate::pipeline::Steps;

/// The most kept patterns of a quantized candidate's set that `fix` tries dropping one at a time.
const MOST_PRUNED: usize = 24;

pub(super) fn fix_quantized(
    options: &FixOptions,
    setup: Setup,
    samples: Vec<Sample>,
    steps: Steps,
    goal: Option<AnswerGoal>,
) -> Result<FixOutcome> {
    let b = &options.bisect;
    let Setup {
        model, index, cand_model, cand_names, candidate, judging, order, sim_quant, lifted, deployed_file, ..
    } = setup;
    let (model, index): (&Model, &GraphIndex) = (&model, &index);
    let (cm, ci) = cand_model.as_ref().expect("checked by the caller");
    let runner = UnquantizedRunner::new(model, index, cm, ci, &cand_names)
        .with_file(deployed_file.as_ref().map(|(f, _)| (f, &lifted[..])));
    let keeping = Keeping::Unquantized(runner);
    // A Q/DQ model's outputs are judged as deployed (ONNX Runtime's Q/DQ fusions), as bisect judges them.
    let mut search = Search::new(index, samples, order, candidate, keeping, judging, Vec::new(), steps, true);
    search.goal = goal;
    let first = diagnose(&mut search)?;
    let mut patterns: Vec<KeptPattern> = Vec::new();
    let mut last = first.clone();
    let mut stuck = None;
    // The quantizers measured one at a time on the worst sample: those at fault are left out
    // first, the largest error alone first, before the walk's first divergent layers.
    let by_error: Vec<(QuantizerAlone, bool)> = match (&first.1.worst_output, first.1.status) {
        (Some(output), Status::Diverged) => {
            let names = crate::pipeline::reference_names(&cand_names);
            let of = crate::pipeline::reference_of(index, &names);
            let pair = crate::pipeline::quantizers::QuantizedPair {
                model,
                index,
                candidate: cand_model.as_ref().expect("checked by the caller"),
                reference_of: &of,
                tolerances: &search.judging.tolerances,
                fault_threshold: search.judging.rule.min_break,
            };
            let error = first.0.get(output).map_or(f64::INFINITY, |r| r.error_level());
            let feeds = search.sample().feeds.clone();
            let found = search.steps.run("measuring each quantizer alone", || {
                crate::pipeline::quantizers::measure(&pair, &feeds, output, error)
            })?;
            // Those at fault first, then the others by their error alone: where leaving the faulty
            // ones out is not enough, the next largest follow.
            found
                .map(|f| {
                    let faulty: Vec<QuantizerAlone> = f.at_fault().cloned().collect();
                    let rest =
                        f.each.iter().filter(|q| q.error > 0.0 && !faulty.iter().any(|a| a.node == q.node)).cloned();
                    faulty.iter().cloned().map(|q| (q, true)).chain(rest.map(|q| (q, false))).collect()
                })
                .unwrap_or_default()
        }
        _ => Default::default(),
    };
    let mut groups = quantizer_groups(&runner, ci, by_error, first.1.worst_output.as_deref().unwrap_or_default());
    let mut cut_by_rounds: Option<usize> = None;
    // Each quantizer's readers left unquantized, in that order: the smallest leading part of the
    // list that brings the outputs within tolerance, found by bisection over its length (a few
    // candidate runs, not one a quantizer), where the whole list does. `--max-rounds 0` adds
    // nothing: not the quantizers' search either.
    if options.max_rounds > 0 && !groups.is_empty() && last.1.status == Status::Diverged {
        let keep_of = |k: usize| -> Vec<String> { groups[..k].iter().flat_map(|p| p.nodes.clone()).collect() };
        let whole = search.trial(&keep_of(groups.len()), FixStage::Pattern)?;
        let (mut failing, mut passing) = (0, groups.len());
        if whole.1.status != Status::Diverged {
            let mut best = whole;
            // Its runs count toward --max-rounds: cut there, it keeps the shortest passing part
            // found, which the summary says may not be the smallest.
            while passing - failing > 1 {
                if search.rounds.len() > options.max_rounds {
                    cut_by_rounds = Some(passing);
                    break;
                }
                let mid = (failing + passing) / 2;
                let trial = search.trial(&keep_of(mid), FixStage::Pattern)?;
                if trial.1.status == Status::Diverged {
                    failing = mid;
                } else {
                    passing = mid;
                    best = trial;
                }
            }
            last = best;
        } else {
            // Not enough alone: the walk goes on from there.
            last = whole;
        }
        groups.truncate(passing);
        patterns = groups;
    }
    // The walk's first divergent layer, kept as bisect's counterfactual keeps it.
    while last.1.status == Status::Diverged && search.rounds.len() <= options.max_rounds {
        let Some(fd) = last.1.first_divergent.clone() else {
            stuck = Some("the outputs diverge with no first divergent layer to leave unquantized".to_string());
            break;
        };
        let pattern = search.judging.keep_pattern(index, &fd.node, &last.0, &last.1);
        let kept: Vec<String> = patterns.iter().flat_map(|p| p.nodes.clone()).collect();
        let plan = runner.translate(&pattern.nodes);
        let new: Vec<String> = plan.kept.into_iter().filter(|n| !kept.contains(n)).collect();
        if new.is_empty() {
            stuck = Some(if plan.without_counterpart.is_empty() {
                format!("'{}' is already unquantized and the outputs still diverge", fd.node)
            } else {
                format!(
                    "'{}' has no counterpart in the candidate ({} fused away or renamed) and the outputs still diverge",
                    fd.node,
                    plan.without_counterpart.join(", ")
                )
            });
            break;
        }
        patterns.push(KeptPattern {
            kind: pattern.kind.to_string(),
            because: format!("'{}' is the first divergent layer with the earlier rounds' nodes unquantized", fd.node),
            nodes: new,
        });
        let keep: Vec<String> = patterns.iter().flat_map(|p| p.nodes.clone()).collect();
        last = search.trial(&keep, FixStage::Pattern)?;
    }
    // The smallest set: each pattern the others do without is dropped, latest first, one candidate
    // run a pattern; beyond MOST_PRUNED patterns that would be more runs than the search took, and
    // the set stays as the bisection left it (the summary says so).
    let unpruned = (patterns.len() > MOST_PRUNED).then_some(patterns.len());
    if last.1.status != Status::Diverged && unpruned.is_none() {
        for k in (0..patterns.len()).rev() {
            if patterns.len() == 1 {
                break;
            }
            let without: Vec<String> =
                patterns.iter().enumerate().filter(|(j, _)| *j != k).flat_map(|(_, p)| p.nodes.clone()).collect();
            let trial = search.trial(&without, FixStage::Prune)?;
            if trial.1.status != Status::Diverged {
                patterns.remove(k);
                last = trial;
            }
        }
    }
    let keep: Vec<String> = patterns.iter().flat_map(|p| p.nodes.clone()).collect();
    let searched_fixed = last.1.status != Status::Diverged;
    // The model as written, read back and run: every FIXED holds in that file.
    // Written beside -o and moved there with the run's other outputs once all are written (a
    // full disk leaves -o as it was); without -o, in a scratch folder.
    let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-fix-quantized-")?;
    let staging = match &options.output {
        Some(out) => Some(layerwise_model::scratch::StagedDir::beside(out, ".layerwise-fix-")?),
        None => None,
    };
    let path = match (&options.output, &staging) {
        (Some(out), Some(staging)) => {
            staging.path().join(out.file_name().unwrap_or(std::ffi::OsStr::new("unquantized.onnx")))
        }
        _ => scratch.path().join("unquantized.onnx"),
    };
    let mut staged = super::write::Staged::default();
    // `sim:int8`/`sim:fp8`: the float model quantized again with the config and the set excluded
    // (what a user's quantizer given the exclusion list writes), not the search's bypassed copy.
    let (written_proto, excluded) = match &sim_quant {
        Some(sq) => {
            let mut excluded = sq.config.nodes_to_exclude.clone();
            excluded.extend(keep.iter().filter(|k| !sq.config.nodes_to_exclude.contains(k)).cloned());
            let requantized = search
                .steps
                .run("quantizing the model with the set excluded", || sq.requantize(model, index, &keep))?;
            (requantized, excluded)
        }
        // A QOperator or dynamic file: the kept ops float, every other op as the file has it.
        None => match &deployed_file {
            Some((file, _)) => (runner.model_in_file_form(&file.proto, &lifted, &keep)?.model, keep.clone()),
            None => (runner.model(&keep)?.model, keep.clone()),
        },
    };
    cm.save_standalone(&written_proto, &path).with_context(|| format!("writing {}", path.display()))?;
    let written = Model::load(&path)?;
    let written_index = GraphIndex::build(written.graph())?;
    let (check_outputs, check_pass, written_answers) = check_as_deployed(
        &mut search,
        deployed_file.as_ref().map_or((cm, ci), |(f, fi)| (f, fi)),
        (&written, &written_index),
        &cand_names,
    )?;
    let fixed = searched_fixed && check_pass;
    let exclusion = if let Some(out) = &options.output {
        let dynamic = lifted.iter().any(|l| l.by == layerwise_model::qdq_form::QuantizedBy::Dynamic);
        let list = exclusion_list(&excluded, dynamic);
        let mut bytes = serde_json::to_vec_pretty(&list)?;
        bytes.push(b'\n');
        staged.files.push(layerwise_report::stage_atomic(&exclusion_list_path(out), &bytes)?);
        for (from, to) in
            [(path.clone(), out.clone()), (Model::oversized_data_path(&path), Model::oversized_data_path(out))]
        {
            if from.exists() {
                staged.moves.push((from, to));
            }
        }
        Some(exclusion_list_path(out))
    } else {
        None
    };
    // A QOperator or dynamic file is written in the Q/DQ form it was read in.
    let form = if lifted.is_empty() {
        String::new()
    } else {
        let by: std::collections::BTreeSet<&str> = lifted.iter().map(|l| l.by.name()).collect();
        format!(
            "; the written file keeps the candidate's {} format: the integer ops not kept as the file has them",
            by.into_iter().collect::<Vec<_>>().join(" and ")
        )
    };
    let family = search.judging.candidate.arithmetic.to_string();
    // Held to the answers: what the written model keeps, in the model's own terms.
    let held_to_answers = options
        .target
        .share()
        .map(|share| super::summary::answers_kept(index, &written_answers, share, &check_outputs));
    let summary = match (&stuck, fixed) {
        (_, true) if keep.is_empty() => match &held_to_answers {
            Some(kept) => format!("with nothing left unquantized, the model {kept}"),
            None => "every output is within tolerance with nothing left unquantized".to_string(),
        },
        (_, true) => format!(
            "leaving {} node{} unquantized {}, measured on the written model ({}){}{}{}{}",
            keep.len(),
            if keep.len() == 1 { "" } else { "s" },
            held_to_answers.clone().unwrap_or_else(|| "brings every output within tolerance".to_string()),
            keep.join(", "),
            exclusion.as_ref().map(|p| format!("; nodes_to_exclude in {}", p.display())).unwrap_or_default(),
            form,
            unpruned.map(|n| format!("; not pruned: {n} patterns, more than the {MOST_PRUNED} dropped one at a time, so a smaller set may exist")).unwrap_or_default(),
            cut_by_rounds.map(|n| format!("; the bisection over the quantizers stopped at --max-rounds {} with the first {n} of them left out, so a smaller set may exist", options.max_rounds)).unwrap_or_default()
        ),
        // The written model is quantized again with the set excluded, which is not the search's
        // copy (a graph input's quantizer, say): its check may pass where the search's runs did
        // not, and the summary must say both rather than a bare NOT FIXED above a passing check.
        (Some(why), false) if check_pass => format!("no set of nodes left unquantized was found by the search: {why}; the model written with its {} node{} excluded passes the check below, but it was quantized again and is not the copy the search judged, so it is not called FIXED", keep.len(), if keep.len() == 1 { "" } else { "s" }),
        (Some(why), false) => format!("no set of nodes left unquantized was found: {why}"),
        (None, false) if searched_fixed => "the search's set passes, but the written model does not: it is not FIXED".to_string(),
        (None, false) => format!("no set found within {} rounds", options.max_rounds),
    };
    let samples = &search.samples;
    let report = FixReport {
        schema: FIX_SCHEMA.to_string(),
        model: b.model.display().to_string(),
        reference: b.reference.to_string(),
        candidate: match (&sim_quant, &b.quant_config) {
            (Some(_), Some(config)) => format!("{} --quant-config {}", b.candidate, config.display()),
            (Some(_), None) => b.candidate.to_string(),
            (None, _) => format!("{} --cand-model {}", b.candidate, cm.path.display()),
        },
        status: if fixed { FixStatus::Fixed } else { FixStatus::NotFixed },
        summary,
        node_count: index.nodes.len(),
        trtexec_flags: String::new(),
        keep_fp32: keep,
        patterns,
        rounds: std::mem::take(&mut search.rounds),
        candidate_runs: search.runs,
        samples: if samples.len() > 1 { samples.iter().map(|s| s.name.clone()).collect() } else { Vec::new() },
        noise_floor: None,
        // As deployed (integer kernels), as the check runs them: the search's runs expose every
        // tensor, which keeps ONNX Runtime from fusing, and their numbers are another model's.
        outputs: if check_outputs.is_empty() {
            output_changes(index, &first.0, &last.0)
        } else {
            check_outputs.clone()
        },
        fixed_model: options.output.as_ref().map(|p| p.display().to_string()),
        fixed_model_fp32_nodes: Vec::new(),
        fixed_model_check: Some(ModelCheck {
            backend: b.candidate.to_string(),
            structural_problems: Vec::new(),
            outputs: check_outputs,
            pass: check_pass,
            not_run: None,
        }),
        fixed_model_load: None,
        other_precision: None,
        target: options.target.name(),
        answers: written_answers,
        run_info: layerwise_report::RunInfo::now(search.steps.finish()),
    };
    // Every output of the run, or none: the report staged too, then all moved into place.
    staged.files.extend(stage_json(b, &report)?);
    staged.commit()?;
    // The FP16 report's line about the written files names a keep list this fix does not write.
    let mut text = render_fix_terminal(&report, &family);
    if let Some(path) = &report.fixed_model {
        let fp16_line = format!("  fixed model: {path} (0 FP32 nodes), keep list: {path}.keep-fp32.json");
        text = text.replace(
            &fp16_line,
            &format!(
                "  fixed model: {path} (the {} model with the set unquantized), exclusion list: {}",
                if lifted.is_empty() { "Q/DQ" } else { "candidate's" },
                exclusion_list_path(Path::new(path)).display()
            ),
        );
    }
    Ok(FixOutcome { report, text })
}

/// One group a quantizer: the nodes that read its DequantizeLinear's output (which then has no
/// reader), and the node that computes what it quantizes (`quantize_static` quantizes a node's
/// output for its own sake unless that node is excluded too, so without it the exclusion list
/// would not give the model written). In the order of `by_error` (measured alone), then every
/// other activation quantizer in graph order; each node in the first group that needs it.
/// `worst_output` is the output the errors alone were measured on.
fn quantizer_groups(
    runner: &UnquantizedRunner,
    ci: &GraphIndex,
    by_error: Vec<(QuantizerAlone, bool)>,
    worst_output: &str,
) -> Vec<KeptPattern> {
    let measured: Vec<(String, Option<(QuantizerAlone, bool)>)> =
        by_error.into_iter().map(|(q, f)| (q.node.clone(), Some((q, f)))).collect();
    let measured_nodes: HashSet<String> = measured.iter().map(|(m, _)| m.clone()).collect();
    let rest = ci
        .nodes
        .iter()
        .filter(|n| {
            n.op_type == "QuantizeLinear"
                && !ci.is_constant_like(n.inputs.first().map_or("", String::as_str))
                && !measured_nodes.contains(&n.name)
        })
        .map(|n| (n.name.clone(), None));
    let mut taken: HashSet<String> = HashSet::new();
    let mut groups = Vec::new();
    for (q_node, alone) in measured.into_iter().chain(rest) {
        let Some(q) = ci.node(&q_node) else { continue };
        let dequantized: Vec<&String> = q
            .outputs
            .iter()
            .flat_map(|o| ci.consumers(o))
            .map(|&c| &ci.nodes[c])
            .filter(|c| c.op_type == "DequantizeLinear")
            .flat_map(|c| &c.outputs)
            .collect();
        let producer = q.inputs.first().and_then(|x| ci.producer(x)).map(|p| p.name.clone());
        // Candidate nodes keep the float model's names. One that reads no dequantized value has
        // nothing to leave unquantized (a LayerNorm before a dynamic quantizer): not listed.
        let unquantizable = |name: &String| {
            ci.node(name).is_none_or(|n| {
                n.inputs.iter().any(|i| ci.producer(i).is_some_and(|p| p.op_type == "DequantizeLinear"))
            })
        };
        let readers: Vec<String> = dequantized
            .iter()
            .flat_map(|d| ci.consumers(d))
            .map(|&c| ci.nodes[c].name.clone())
            .chain(producer)
            .filter(unquantizable)
            .collect();
        let new: Vec<String> =
            runner.translate(&readers).kept.into_iter().filter(|n| taken.insert(n.clone())).collect();
        if new.is_empty() {
            continue;
        }
        let because = match &alone {
            Some((a, faulty)) => format!(
                "the quantizer of '{}' (QuantizeLinear '{}') alone gives '{worst_output}' rel L2 {:.2e}{}: the nodes that read it and the one that computes what it quantizes are left unquantized",
                a.tensor,
                a.node,
                a.error,
                if *faulty { ", at fault" } else { ", not at fault (the quantizers not at fault come by the larger of what each gives alone and what leaving it out removes)" }
            ),
            None => format!("the quantizer QuantizeLinear '{q_node}' (not measured alone, or nothing alone): the nodes that read it and the one that computes what it quantizes are left unquantized"),
        };
        groups.push(KeptPattern { kind: "quantizer".to_string(), because, nodes: new });
    }
    // Nodes whose only quantized input is a stored weight (weights-only quantization: quantize_dynamic's
    // Gather of an int8 embedding table) come last: they read their float weight when kept.
    for dq in ci
        .nodes
        .iter()
        .filter(|n| n.op_type == "DequantizeLinear" && n.inputs.first().is_some_and(|w| ci.is_constant_like(w)))
    {
        let readers: Vec<String> =
            dq.outputs.iter().flat_map(|o| ci.consumers(o)).map(|&c| ci.nodes[c].name.clone()).collect();
        let new: Vec<String> =
            runner.translate(&readers).kept.into_iter().filter(|n| taken.insert(n.clone())).collect();
        if new.is_empty() {
            continue;
        }
        let because = format!(
            "the stored weight '{}' is quantized (DequantizeLinear '{}') and no activation quantizer above holds its reader: the node that reads it is left unquantized, reading its float weight",
            dq.inputs[0], dq.name
        );
        groups.push(KeptPattern { kind: "quantized weight".to_string(), because, nodes: new });
    }
    groups
}

/// The given and the written model run as deployed on every sample: only their outputs, so that
/// ONNX Runtime fuses the Q/DQ pairs into integer kernels, as exposing the tensors between them
/// (the search's runs) prevents. The outputs before and after of the sample the check shows (a
/// failing one before any passing one, then one the given model failed, then the largest output
/// error), and whether the written model passes on every sample.
fn check_as_deployed(
    search: &mut Search,
    given: (&Model, &GraphIndex),
    written: (&Model, &GraphIndex),
    cand_names: &HashMap<String, String>,
) -> Result<(Vec<layerwise_report::OutputChange>, bool, Vec<layerwise_analysis::AnswerRecord>)> {
    let index = search.index;
    let reference_of: HashMap<&str, &str> =
        cand_names.iter().filter(|(r, _)| index.outputs.contains(r)).map(|(r, c)| (c.as_str(), r.as_str())).collect();
    let deployed = |search: &mut Search, (m, mi): (&Model, &GraphIndex), k: usize, label: String| {
        let feeds: &[(String, Tensor)] = &search.samples[k].feeds;
        let Search { steps, candidate, .. } = search;
        let out = steps.run(&label, || {
            Ok(candidate.run(&RunRequest {
                model: m,
                index: mi,
                inputs: feeds,
                selection: &Selection::Names(Vec::new()),
            })?)
        })?;
        let tensors: HashMap<String, Tensor> = out
            .tensors
            .into_iter()
            .filter_map(|(c, v)| reference_of.get(c.as_str()).map(|r| (r.to_string(), v)))
            .collect();
        anyhow::Ok((search.compare_outputs(k, &tensors), tensors))
    };
    let mut shown = Vec::new();
    let mut pass = true;
    let mut answers = Vec::new();
    // ((fails, failed before), largest output error) of the sample shown.
    let mut worst: Option<((bool, bool), f64)> = None;
    for k in 0..search.samples.len() {
        let name = search.samples[k].name.clone();
        let (before, _): (Comparison, _) =
            deployed(search, given, k, format!("running the candidate model as deployed{}", of_sample(&name)))?;
        let (after, tensors) = deployed(search, written, k, format!("running the written model{}", of_sample(&name)))?;
        let passes = search.sample_passes(k, &after, &tensors, &mut answers);
        let key = (!passes, !before.outputs_pass(index));
        let error = after.largest_error(&index.outputs);
        if worst.is_none_or(|(k, e)| key > k || (key == k && error > e)) {
            shown = output_changes(index, &before, &after);
            worst = Some((key, error));
        }
        pass &= passes;
    }
    let (pass, records) = search.target_over(&answers, pass);
    Ok((shown, pass, records))
}

/// " (NAME)" for a named sample; nothing for the one sample of a run without a set.
fn of_sample(name: &str) -> String {
    if name.is_empty() {
        String::new()
    } else {
        format!(" ({name})")
    }
}

/// The nodes to leave unquantized as the quantizers take them: ONNX Runtime's `quantize_static`
/// (`nodes_to_exclude`, node names of the float model) and ModelOpt's
/// `modelopt.onnx.quantization.quantize` (`nodes_to_exclude`, read as regular expressions: each
/// name escaped and anchored).
fn exclusion_list(keep: &[String], dynamic: bool) -> serde_json::Value {
    let mut list = serde_json::json!({
        "nodes_to_exclude": keep,
        "onnxruntime.quantization.quantize_static": { "nodes_to_exclude": keep },
        "modelopt.onnx.quantization.quantize": { "nodes_to_exclude": keep.iter().map(|n| python_regex_exact(n)).collect::<Vec<_>>() },
    });
    // A dynamically quantized candidate is made again by quantize_dynamic, which takes the same
    // names (the float model's, as the Q/DQ form names its float nodes).
    if dynamic {
        list["onnxruntime.quantization.quantize_dynamic"] = serde_json::json!({ "nodes_to_exclude": keep });
    }
    list
}

/// A Python regular expression matching exactly `name`: every ASCII character other than a letter,
/// digit or '_' escaped (Python's `re` takes an escaped punctuation character as itself).
fn python_regex_exact(name: &str) -> String {
    let mut out = String::from("^");
    for c in name.chars() {
        if c.is_ascii() && !c.is_ascii_alphanumeric() && c != '_' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('$');
    out
}
