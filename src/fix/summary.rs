//! What `fix` says: every output before and after, the keep list in one line, the model measured
//! whole in BF16 where FP16 needs a large keep list, and the summary sentence of an FP16 or BF16
//! fix (a quantized fix words its own, in quantized.rs).

use std::collections::HashMap;

use anyhow::Result;
use layerwise_analysis::{add_passed_through, is_weight_output, Comparison, WEIGHT_OUTPUT};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_report::{FixReport, KeptPattern, OtherPrecision, OutputChange};
use layerwise_runtime::{Precision, RunRequest, Tensor};

use super::search::Sample;
use crate::pipeline::setup::Judging;
use crate::pipeline::BisectOptions;

pub(super) fn num(v: f64) -> String {
    layerwise_report::format_number(v)
}

/// Every model output before and after, but for the weights passed straight to an output, which
/// no run is compared on (the summary names them).
pub(super) fn output_changes(index: &GraphIndex, before: &Comparison, after: &Comparison) -> Vec<OutputChange> {
    let mut seen = std::collections::HashSet::new();
    index
        .outputs
        .iter()
        .filter(|o| !is_weight_output(index, o) && seen.insert(o.as_str()))
        .map(|o| {
            let b = before.get(o);
            let a = after.get(o);
            OutputChange {
                name: o.clone(),
                before_rel_l2: b.map(|r| r.error_level()).unwrap_or(f64::NAN),
                before_pass: b.is_some_and(|r| r.pass),
                after_rel_l2: a.map(|r| r.error_level()).unwrap_or(f64::NAN),
                after_pass: a.is_some_and(|r| r.pass),
            }
        })
        .collect()
}

/// The keep list in the one-line summary: each group with its nodes where there are few; else a
/// count of groups by kind (the full list is in the JSON and the keep-list file).
fn keep_list_summary(patterns: &[KeptPattern]) -> String {
    if patterns.len() <= 3 {
        return patterns
            .iter()
            .map(|p| format!("{} [{}]", p.kind, layerwise_report::kept_nodes(&p.nodes)))
            .collect::<Vec<_>>()
            .join("; ");
    }
    // Groups can share nodes: each kind counts its distinct nodes (the keep list is their union).
    let mut kinds: Vec<(&str, usize, std::collections::BTreeSet<&str>)> = Vec::new();
    for p in patterns {
        let i = match kinds.iter().position(|(k, _, _)| *k == p.kind) {
            Some(i) => i,
            None => {
                kinds.push((p.kind.as_str(), 0, Default::default()));
                kinds.len() - 1
            }
        };
        kinds[i].1 += 1;
        kinds[i].2.extend(p.nodes.iter().map(String::as_str));
    }
    let kinds: Vec<String> = kinds
        .iter()
        .map(|(k, groups, nodes)| {
            format!("{groups} {k} group{} ({} distinct nodes)", if *groups == 1 { "" } else { "s" }, nodes.len())
        })
        .collect();
    format!("{} groups: {}; every node in the fix report and the keep list", patterns.len(), kinds.join(", "))
}

/// A keep list this long is large: `fix` then measures the model whole in BF16 as well.
pub(super) const LARGE_KEEP_LIST: usize = 16;

/// Each sample's inputs and the reference's values of the model outputs: what [`bf16_whole`] reads.
pub(super) type OutputSamples = Vec<(Vec<(String, Tensor)>, HashMap<String, Tensor>)>;

pub(super) fn bf16_samples(samples: &[Sample], index: &GraphIndex) -> OutputSamples {
    samples
        .iter()
        .map(|s| {
            (
                s.feeds.clone(),
                index.outputs.iter().filter_map(|o| s.reference.get(o).map(|t| (o.clone(), t.clone()))).collect(),
            )
        })
        .collect()
}

/// The model run whole in BF16 emulation with nothing kept, on every sample, judged by BF16's
/// tolerances (the user's, where given).
pub(super) fn bf16_whole(
    samples: &OutputSamples,
    model: &Model,
    index: &GraphIndex,
    options: &BisectOptions,
) -> Result<OtherPrecision> {
    let spec = layerwise_runtime::BackendSpec::sim(layerwise_model::Rounding::Bf16);
    let mut bf16 = layerwise_runtime::create_backend(&spec)?;
    let judging = Judging::new(Precision::Bf16, false, options, (model, index))?;
    let (mut pass, mut worst) = (true, 0f64);
    for (feeds, reference) in samples {
        let mut out =
            bf16.run(&RunRequest { model, index, inputs: feeds, selection: &Selection::Names(index.outputs.clone()) })?;
        add_passed_through(model.graph(), index, feeds, &mut out.tensors);
        let comparison = judging.compare(index, &index.outputs, reference, &out.tensors);
        pass &= comparison.outputs_pass(index);
        worst = worst.max(comparison.largest_error(&index.outputs));
    }
    Ok(OtherPrecision {
        candidate: spec.to_string(),
        pass,
        worst_output_rel_l2: worst,
        rtol: judging.tolerances.all.rtol,
    })
}

/// What an FP16 or BF16 fix found, for its summary sentence.
pub(super) struct Found<'a> {
    pub index: &'a GraphIndex,
    pub fixed: bool,
    pub keep: &'a [String],
    pub patterns: &'a [KeptPattern],
    /// Why no fix was found, where none was.
    pub stuck: Option<String>,
    pub low: Precision,
    pub runs: usize,
    pub samples: usize,
    /// Nodes inside the If and Loop bodies kept whole.
    pub inside_kept_whole: usize,
    /// Kept names that hand a body's value to its If's or Loop's output.
    pub hand_overs: usize,
    /// Each If inlined, with the branch these inputs took.
    pub branches_taken: &'a [(String, String)],
    /// The nodes the converter keeps in FP32 by itself, with why.
    pub converter_fp32: &'a [(String, String)],
    pub other_precision: Option<&'a OtherPrecision>,
    /// The worst output error of the FP16 fix, where one holds (the written model's check).
    pub fixed_error: Option<f64>,
    /// The inf/NaN the last candidate run (with the keep list) held, by tensor.
    pub non_finite_inside: &'a [layerwise_analysis::NonFiniteTensor],
    /// Held to the answers (`--target answer`): the share of cases that must hold.
    pub target: Option<f64>,
    /// The answers of the outputs judged by them (the written model's where it was checked).
    pub answers: &'a [layerwise_analysis::AnswerRecord],
    /// Every output before and after (the written model's check where made).
    pub outputs: &'a [OutputChange],
    /// Patterns the prune kept without a trial: each holds a node the reference takes beyond
    /// FP16's range.
    pub untried: usize,
    /// The search passed, and the file written for its keep list failed its checks (`stuck` says
    /// why).
    pub written_failed: bool,
}

/// "12x", or "more than" where the ratio is not a finite number.
fn times(larger: f64, smaller: f64) -> String {
    let ratio = larger / smaller;
    if ratio.is_finite() {
        format!("{ratio:.0}x")
    } else {
        "more than".to_string()
    }
}

/// What a keep list held to the answers brings about (`--target answer`): "keeps the answers of
/// 'logits' (ctc) unchanged on every case (12 cases)", with the other outputs' tolerance where
/// there are others, and the judged outputs still outside their element-wise tolerance named.
pub(super) fn answers_kept(
    index: &GraphIndex,
    answers: &[layerwise_analysis::AnswerRecord],
    share: f64,
    outputs: &[OutputChange],
) -> String {
    // Outputs compared element-wise beside the judged ones (weights passed straight out are not).
    let others = index.outputs.iter().any(|o| !is_weight_output(index, o) && !answers.iter().any(|a| a.output == *o));
    let each: Vec<String> = answers
        .iter()
        .map(|a| {
            let how = if a.changed_cases == 0 {
                format!("on every case ({} case{})", a.cases, if a.cases == 1 { "" } else { "s" })
            } else {
                format!(
                    "on {} of {} cases (the target: at least {}%)",
                    a.cases - a.changed_cases,
                    a.cases,
                    share * 100.0
                )
            };
            format!("'{}' ({}) unchanged {how}", a.output, a.task)
        })
        .collect();
    let outside: Vec<String> = outputs
        .iter()
        .filter(|o| !o.after_pass && answers.iter().any(|a| a.output == o.name))
        .map(|o| format!("'{}' (relative L2 {})", o.name, num(o.after_rel_l2)))
        .collect();
    format!(
        "keeps the answer{} of {}{}{}",
        if answers.len() == 1 { "" } else { "s" },
        each.join(", "),
        if others { ", and every other output within tolerance" } else { "" },
        if outside.is_empty() {
            String::new()
        } else {
            format!(" (element-wise, {} stays outside tolerance: the answers were the target)", outside.join(", "))
        }
    )
}

/// The summary sentence of an FP16 or BF16 fix.
pub(super) fn summary(found: &Found) -> String {
    let Found { index, fixed, keep, patterns, low, runs, samples, inside_kept_whole, .. } = *found;
    // BF16 with nothing kept is offered only as what it measured: within BF16's own (looser)
    // tolerances, and beside the FP16 fix's error where one holds, so that "no keep list" is never
    // read as "as accurate".
    let bf16_note = match (found.other_precision, found.fixed_error) {
        (Some(o), Some(fixed)) if o.pass && o.worst_output_rel_l2 > fixed => format!(
            "; BF16 is an option with nothing kept, not an equal one: {} has every output within BF16's tolerance (rtol {}), but its worst output errs by relative L2 {}, {} this FP16 fix's {}",
            o.candidate,
            num(o.rtol),
            num(o.worst_output_rel_l2),
            times(o.worst_output_rel_l2, fixed),
            num(fixed)
        ),
        (Some(o), fixed) if o.pass => format!(
            "; BF16 needs no keep list: {} with nothing kept has every output within BF16's tolerance, each element judged by its absolute, relative (rtol {}) and range terms (worst output relative L2 {}{})",
            o.candidate,
            num(o.rtol),
            num(o.worst_output_rel_l2),
            match fixed {
                Some(fixed) => format!(", no more than this FP16 fix's {}", num(fixed)),
                None => ", which the tolerance does not bound".to_string(),
            }
        ),
        _ => String::new(),
    };
    let converter_fp32 = found.converter_fp32;
    let by_converter = if converter_fp32.is_empty() {
        String::new()
    } else {
        let shown: Vec<String> = converter_fp32.iter().take(3).map(|(n, why)| format!("{n}: {why}")).collect();
        let more = if converter_fp32.len() > 3 {
            format!("; and {} more, listed in the fix report (fixed_model_fp32_nodes)", converter_fp32.len() - 3)
        } else {
            String::new()
        };
        format!(
            " ({} more FP32 in the written model by the converter's own rules: {}{more})",
            converter_fp32.len(),
            shown.join("; ")
        )
    };
    // The outputs no run is compared on (weights passed straight to an output) are named, and
    // no summary claims them.
    let mut weight_outputs: Vec<&String> = Vec::new();
    for o in index.outputs.iter().filter(|o| is_weight_output(index, o)) {
        if !weight_outputs.contains(&o) {
            weight_outputs.push(o);
        }
    }
    let compared = if weight_outputs.is_empty() { "" } else { " compared" };
    let low_name = if low == Precision::Bf16 { "BF16" } else { "FP16" };
    let held_to_answers = found.target.map(|share| answers_kept(index, found.answers, share, found.outputs));
    let mut summary = if fixed && keep.is_empty() {
        match &held_to_answers {
            Some(kept) => format!("{low_name} with nothing kept {kept}; nothing to keep in FP32{by_converter}"),
            None => format!(
                "all{compared} outputs are within tolerance in {low_name}; nothing to keep in FP32{by_converter}"
            ),
        }
    } else if fixed {
        format!(
            "keeping {} of {} nodes in FP32 ({}{}) {}{}, in the emulation and in the written model's own types; found in {runs} candidate runs{by_converter}{bf16_note}",
            keep.len(),
            index.nodes.len(),
            keep_list_summary(patterns),
            if inside_kept_whole > 0 { format!("; the control flow kept whole holds {inside_kept_whole} more nodes in its bodies, all FP32 too") } else { String::new() },
            held_to_answers.clone().unwrap_or_else(|| format!("brings every{compared} output within tolerance")),
            // Held to the answers, the answer words say on how many cases (a share may leave some
            // samples changed).
            if samples > 1 && held_to_answers.is_none() { format!(" on every one of the {samples} samples") } else { String::new() },
        )
    } else if found.written_failed {
        // The search passed; the file written from its list did not hold (or could not be
        // checked): not "no fix found".
        format!(
            "the search's keep list of {} nodes passes in {runs} candidate runs, but it is no fix: {}{bf16_note}",
            keep.len(),
            found.stuck.clone().unwrap_or_default()
        )
    } else {
        format!(
            "no fix found after {runs} candidate runs: {}{bf16_note}",
            found.stuck.clone().unwrap_or_else(|| "the round limit was reached".into())
        )
    };
    if fixed && found.untried > 0 {
        summary.push_str(&format!(
            "; {} of the {} patterns {} kept without a trial of dropping {}: {} a node where the reference leaves FP16's range from inputs within it, which any FP16 run stores as inf",
            found.untried,
            patterns.len(),
            if found.untried == 1 { "was" } else { "were" },
            if found.untried == 1 { "it" } else { "them" },
            if found.untried == 1 { "it holds" } else { "each holds" }
        ));
    }
    if fixed && found.hand_overs > 0 {
        summary.push_str(&format!(
            "; {} of the kept names hand a body's value to its If's or Loop's output, which the written file holds as that node's float32 output, not as a node of its own (so its FP32 node list is shorter)",
            found.hand_overs
        ));
    }
    let branches_taken = found.branches_taken;
    if !branches_taken.is_empty() {
        let shown: Vec<String> =
            branches_taken.iter().take(3).map(|(n, taken)| format!("'{n}' took its {taken}")).collect();
        let more =
            if branches_taken.len() > 3 { format!(" and {} more", branches_taken.len() - 3) } else { String::new() };
        summary.push_str(&format!(
            "; searched and checked on the If branches these inputs took ({}{more}): the branches not taken are written converted with nothing kept in FP32, and no run here computed them",
            shown.join(", ")
        ));
    }
    // Outputs within tolerance say nothing of what is inside: inf/NaN that does not reach them
    // with these inputs (a Log of a power that is 0 in FP16) may with others.
    if fixed && !found.non_finite_inside.is_empty() {
        let mut born: Vec<String> = Vec::new();
        for n in found.non_finite_inside.iter().filter(|n| n.origin) {
            let at = format!("{} ({})", n.node, n.op_type);
            if !born.contains(&at) {
                born.push(at);
            }
        }
        let more = if born.len() > 3 { format!(" and {} more", born.len() - 3) } else { String::new() };
        born.truncate(3);
        summary.push_str(&format!(
            "; the {low_name} run with {} still holds inf/NaN inside, in {} tensor{}{}, which do not reach the outputs with these inputs (other inputs may carry them there)",
            if keep.is_empty() { "nothing kept" } else { "this keep list" },
            found.non_finite_inside.len(),
            if found.non_finite_inside.len() == 1 { "" } else { "s" },
            if born.is_empty() { String::new() } else { format!(" born at {}{more}", born.join(", ")) }
        ));
    }
    for o in weight_outputs {
        let said = format!("; output '{o}' was not compared: {WEIGHT_OUTPUT}");
        if !summary.contains(&said) {
            summary.push_str(&said);
        }
    }
    summary
}

/// The fix report at `--json`, staged beside it ([`layerwise_report::stage_atomic`]), to be moved
/// there with the run's other outputs.
pub(super) fn stage_json(b: &BisectOptions, report: &FixReport) -> Result<Option<layerwise_report::StagedFile>> {
    let Some(json) = &b.outputs.json else { return Ok(None) };
    let mut bytes = serde_json::to_vec_pretty(report)?;
    bytes.push(b'\n');
    Ok(Some(layerwise_report::stage_atomic(json, &bytes)?))
}
