//! Does fixing it help: the candidate re-run with each break kept at reference precision.

use std::cell::RefCell;
use std::collections::HashMap;

use anyhow::Result;
use layerwise_analysis::{compare_all, Comparison, Counterfactual, Isolation, KeepCheck, ToleranceSet, Verdict};
use layerwise_model::{GraphIndex, Selection};
use layerwise_runtime::{Backend, Precision, RunOutput, Tensor};

use super::compare::Job;
use crate::keep::{HeldRun, KeepRunner, UnquantizedRunner};

/// Most breaks checked by re-running the candidate.
const COUNTERFACTUAL_MAX: usize = 6;

/// Re-runs the candidate with each break's pattern kept at reference precision.
pub(super) fn counterfactual(
    job: &mut Job,
    feeds: &[(String, Tensor)],
    reference: &RunOutput,
    comparison: &Comparison,
    verdict: &Verdict,
    isolation: Option<&Isolation>,
    candidate_tensors: Option<&HashMap<String, Tensor>>,
) -> Result<Option<Counterfactual>> {
    let Some(worst) = verdict.worst_output.clone() else { return Ok(None) };
    let before = comparison.get(&worst).map(|r| r.error_level()).unwrap_or(f64::NAN);
    // Not finite because the candidate's output has another shape, not because of inf/NaN.
    let shape_differs = comparison.get(&worst).is_some_and(|r| r.mismatch.is_some());
    // A Q/DQ candidate keeps a break unquantized: its quantizers removed from the candidate's own
    // model, which runs again on the candidate backend (docs/quantization.md).
    let unquantized = match (&job.judging.quantization, &job.cand_model) {
        (Some(_), Some((cm, ci))) => Some(
            UnquantizedRunner::new(job.model, &job.index, cm, ci, &job.cand_names)
                .with_file(job.deployed_file.as_ref().map(|(f, _)| (f, &job.lifted[..]))),
        ),
        _ => None,
    };
    let mut keeper = KeepRunner::new(job.model, &job.index, job.candidate.as_mut());
    if let Some((cm, _)) = &job.cand_model {
        keeper = keeper.sharing_weights_of(cm);
    }
    // The candidate can keep nodes only where it emulates FP16 or runs a converted model.
    if !keeper.emulated() && job.cand_model.is_none() {
        return Ok(None);
    }
    let started = std::time::Instant::now();
    // What the file `convert` writes keeps FP32 with nothing asked (its own rules: Range, CumSum,
    // quantizers, readers of weights beyond range): every check keeps them too, so an emulation
    // measures that file with nothing kept first, or a check would be credited with what those
    // nodes do (a voice model's length came back with any node kept, because Range was).
    let converter_own: Vec<(String, String)> =
        if keeper.emulated() { keeper.converter_fp32_with(&[]) } else { Vec::new() };
    super::steps::timing("counterfactual: the converter's own FP32 nodes", started);
    let mut candidates: Vec<(String, &'static str)> = Vec::new();
    if let Some(fd) = &verdict.first_divergent {
        candidates.push((fd.node.clone(), "first_divergent"));
    }
    for b in &verdict.breaks {
        candidates.push((b.node.clone(), "break"));
    }
    for n in verdict.non_finite.iter().filter(|n| n.origin && !n.weight) {
        candidates.push((n.node.clone(), "non_finite_origin"));
    }
    if let Some(n) = isolation.and_then(|i| i.introducing.clone()) {
        candidates.push((n, "introducing"));
    }
    // The run the checks change: the comparison's candidate tensors where held, else filled in
    // as the checks need them (an emulation computes them once for every check).
    let baseline = match candidate_tensors {
        _ if !keeper.emulated() => None,
        Some(tensors) => Some(HeldRun::of_comparison(tensors)),
        None => Some(HeldRun::nothing_yet(&mut keeper, &[])),
    };
    let trial = Trial {
        feeds,
        reference,
        candidate_tensors,
        baseline: baseline.map(RefCell::new),
        worst: &worst,
        before,
        unquantized: unquantized.as_ref(),
    };
    let mut checks = Vec::new();
    // Kept apart while the breaks are weighed, and listed first at the end.
    let mut as_converted = None;
    if !converter_own.is_empty() {
        as_converted = Some(trial.keep(
            job.candidate.as_mut(),
            &mut keeper,
            &job.index,
            &job.judging.tolerances,
            "as converted".to_string(),
            AS_CONVERTED,
            "converter_fp32",
            Vec::new(),
        )?);
    }
    let mut tried: Vec<Vec<String>> = Vec::new();
    for (node, reason) in candidates {
        let pattern = job.judging.keep_pattern(&job.index, &node, comparison, verdict);
        if tried.contains(&pattern.nodes) || checks.len() >= COUNTERFACTUAL_MAX {
            continue;
        }
        tried.push(pattern.nodes.clone());
        checks.push(trial.keep(
            job.candidate.as_mut(),
            &mut keeper,
            &job.index,
            &job.judging.tolerances,
            node,
            reason,
            pattern.kind,
            pattern.nodes,
        )?);
    }
    // No break to keep: nothing was measured, so nothing is concluded.
    if checks.is_empty() {
        return Ok(None);
    }
    // inf/NaN born at several independent places, none of which alone clears the output: keeping
    // every origin together is measured, not inferred (a UNet's early Mul and late Gemm).
    let origins = independent_origins(job, verdict);
    if origins.len() > 1 && checks.iter().all(|c| !c.output_error_after.is_finite()) {
        let kept = union_in_order(
            origins.iter().map(|origin| job.judging.keep_pattern(&job.index, origin, comparison, verdict).nodes),
        );
        checks.push(trial.keep(
            job.candidate.as_mut(),
            &mut keeper,
            &job.index,
            &job.judging.tolerances,
            origins.join(", "),
            ORIGINS_TOGETHER,
            "origins_together",
            kept,
        )?);
    }
    // Several breaks that each remove part of a finite error, none of which alone brings the
    // outputs within tolerance (two int32 sums cast to FP16, each overflowing): keeping them
    // together is measured, so the conclusion names each with its share instead of calling the
    // rest drift.
    let partial: Vec<&KeepCheck> = partial_breaks(&checks).collect();
    if !checks.iter().any(|c| c.fixes || c.reason == ORIGINS_TOGETHER) && partial.len() > 1 {
        let kept = union_in_order(partial.iter().map(|check| check.kept.clone()));
        let names = partial.iter().map(|c| c.node.clone()).collect::<Vec<_>>().join(", ");
        checks.push(trial.keep(
            job.candidate.as_mut(),
            &mut keeper,
            &job.index,
            &job.judging.tolerances,
            names,
            BREAKS_TOGETHER,
            "breaks_together",
            kept,
        )?);
    }
    let best = checks
        .iter()
        .filter(|c| c.reason != BREAKS_TOGETHER && c.reason != AS_CONVERTED)
        .max_by(|a, b| a.explained.total_cmp(&b.explained));
    let together = checks.iter().find(|c| c.reason == ORIGINS_TOGETHER);
    let breaks_together = breaks_together_used(&checks);
    let conclusion = if let Some(t) = together {
        let alone = checks.len() - 1;
        format!(
            "inf/NaN are born at {} independent places ({}); keeping {} of the checked breaks alone at reference precision leaves inf/NaN in '{worst}', and keeping the origins together {} (measured){}",
            origins.len(),
            t.node,
            if alone == 1 { "the one".to_string() } else { format!("any one of the {alone}") },
            together_outcome(t),
            if t.output_error_after.is_finite() { String::new() } else { beyond_the_kept(&job.index, comparison, &t.kept, job.judging.precision()) }
        )
    } else if let Some(t) = breaks_together {
        let shares = partial_breaks(&checks)
            .map(|c| format!("{} ({:.0}% alone)", c.node, 100.0 * c.explained))
            .collect::<Vec<_>>();
        let measured = if t.fixes {
            "brings every output within tolerance".to_string()
        } else {
            format!("{}; the rest is drift or breaks not checked", t.effect(before, Some(&worst), shape_differs))
        };
        format!(
            "the error of '{worst}' needs {} breaks together, none enough alone: {}; keeping them together {} {measured} (measured)",
            shares.len(),
            shares.join(", "),
            if unquantized.is_some() { "unquantized (their quantizers removed)" } else { "at reference precision" },
        )
    } else {
        match best {
        Some(b) if b.explained >= 0.5 => format!(
            "keeping {} ({}) {} {}{}",
            b.node,
            b.pattern,
            if unquantized.is_some() { "unquantized (its quantizers removed)" } else { "at reference precision" },
            b.effect(before, Some(&worst), shape_differs),
            if b.fixes { " and brings every output within tolerance" } else if !before.is_finite() { "; the outputs are still not all within tolerance" } else { "" }
        ),
        // inf/NaN the inputs hold, carried differently by the two sides: no precision kept at one
        // node changes how the rest of the candidate carries them.
        Some(_) if checks.iter().all(|c| !c.output_error_after.is_finite()) && verdict.first_divergent.as_ref().is_some_and(|f| f.cause.best.kind == layerwise_analysis::CauseKind::NonFiniteInput) => format!(
            "keeping {} at reference precision still leaves inf/NaN mismatches in '{worst}': they are the inputs' inf/NaN (the cause above), which the candidate still does not carry as the reference does further on: they arise at no node",
            if checks.len() == 1 { format!("the checked break ({})", checks[0].node) } else { format!("any one of the {} checked breaks", checks.len()) }
        ),
        // Every keep still leaves the output with another shape: no inf/NaN to speak of.
        Some(_) if shape_differs && checks.iter().all(|c| !c.output_error_after.is_finite()) => format!(
            "keeping {} at reference precision still leaves '{worst}' with another shape than the reference's: its length depends on values that more than the checked nodes compute differently",
            if checks.len() == 1 { format!("the checked break ({})", checks[0].node) } else { format!("any one of the {} checked breaks", checks.len()) }
        ),
        // Every keep still leaves inf/NaN: they have more than one source, which is no drift.
        Some(_) if checks.iter().all(|c| !c.output_error_after.is_finite()) => {
            let kept = if checks.len() == 1 { format!("keeping the checked break ({}) at reference precision", checks[0].node) } else { format!("keeping any one of the {} checked breaks at reference precision", checks.len()) };
            // Origins the checks kept are no other source.
            let origins: Vec<&str> = verdict.non_finite.iter().filter(|n| n.origin && !checks.iter().any(|c| c.kept.contains(&n.node))).map(|n| n.node.as_str()).collect();
            let sources = match origins.len() {
                0 => "with it kept, inf/NaN arise further on (no other node produced them in the candidate's run)".to_string(),
                1 => format!("inf/NaN are also born elsewhere than the checked break (first at {})", origins[0]),
                n => format!("inf/NaN are born at {n} nodes on their own ({})", origins.join(", ")),
            };
            format!("{kept} still leaves inf/NaN in '{worst}': {sources}, so they must be kept together (`fix` does that)")
        }
        _ => {
            // Growth at each chain step, the chain's last node (its input is off the chain) included.
            let steps = verdict.chain.windows(2).map(|w| (&w[0].node, &w[0].op_type, w[0].error, w[1].error));
            let last = verdict.first_divergent.iter().filter_map(|f| Some((&f.node, &f.op_type, f.output_error, f.input_error?)));
            let amplifier = steps
                .chain(last)
                .filter(|(_, _, out, input)| *input > 0.0 && out.is_finite())
                .max_by(|a, b| (a.2 / a.3).total_cmp(&(b.2 / b.3)))
                .map(|(node, op, out, input)| format!("; it grows most at {node} ({op}, {:.1}x)", out / input))
                .unwrap_or_default();
            format!("no single break explains the error of '{worst}': it is drift plus a sensitive consumer{amplifier}")
        }
        }
    };
    // Where the converter's own FP32 nodes already remove most of the error, that comes first:
    // the checks after it are measured on top of them.
    // Where no check does better than that file, no node checked is shown to matter beyond the
    // converter's own nodes (an ArgMax credited with 100% the converter's FP32 nodes gave).
    let best_check =
        checks.iter().map(|c| (c.fixes, c.explained)).fold((false, 0f64), |a, b| (a.0 || b.0, a.1.max(b.1)));
    let conclusion = match as_converted.as_ref().filter(|c| c.fixes || c.explained >= 0.5) {
        Some(c) => {
            let named = verdict.first_divergent.as_ref().map(|f| f.node.as_str());
            let beyond = if (c.fixes || !best_check.0) && best_check.1 <= c.explained + 0.01 {
                match named.filter(|n| converter_own.iter().any(|(own, _)| own == n)) {
                    Some(n) => format!("that set holds {n}, the first divergent layer, already; every check here keeps them too and does no better"),
                    None => "every check here keeps them too and does no better, so no node checked is shown to matter beyond them".to_string(),
                }
            } else {
                format!("every check here keeps them too, so on top of them {conclusion}")
            };
            format!(
                "the file `convert` writes with nothing kept ({} node{} FP32 by its own rules, first {}: {}) {}{}; {beyond}",
                converter_own.len(),
                if converter_own.len() == 1 { "" } else { "s" },
                converter_own[0].0,
                converter_own[0].1,
                c.effect(before, Some(&worst), shape_differs),
                if c.fixes { " and brings every output within tolerance" } else { "" },
            )
        }
        None => conclusion,
    };
    checks.splice(0..0, as_converted);
    Ok(Some(Counterfactual { output: worst, output_error: before, checks, conclusion, shape_differs }))
}

/// The nodes of several keep lists, each once, in the order first met: what keeping them together
/// keeps.
fn union_in_order(lists: impl Iterator<Item = Vec<String>>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    lists.flatten().filter(|n| seen.insert(n.clone())).collect()
}

/// The reason of the check that keeps every inf/NaN origin together.
pub(crate) const ORIGINS_TOGETHER: &str = "non_finite_origins_together";

/// The reason of the check that keeps nothing beyond the converter's own FP32 nodes: the file
/// `convert` writes with nothing kept, which every other check of an emulation builds on.
pub(crate) const AS_CONVERTED: &str = "as_converted";

/// The reason of the check that keeps together every break that alone removed part of the error.
pub(crate) const BREAKS_TOGETHER: &str = "breaks_together";

/// The share of the output's error a kept break must remove alone to be one of several a
/// finite error needs.
const PARTIAL_SHARE: f64 = 0.1;

/// The checks that each removed part of a finite error alone, and the places inf/NaN are born
/// (each a break, whatever it removes alone: a diacritizer's second overflowing accumulator Cast
/// was "contained" alone, and `fix` needed it), in the order they were checked.
pub(crate) fn partial_breaks(checks: &[KeepCheck]) -> impl Iterator<Item = &KeepCheck> {
    checks.iter().filter(|c| {
        c.reason != BREAKS_TOGETHER
            && c.reason != AS_CONVERTED
            && c.output_error_after.is_finite()
            && (c.explained >= PARTIAL_SHARE || c.reason == "non_finite_origin")
    })
}

/// The check that kept the partial breaks together, where it did better than the best of them
/// alone: then it is the conclusion.
pub(crate) fn breaks_together_used(checks: &[KeepCheck]) -> Option<&KeepCheck> {
    let best =
        checks.iter().filter(|c| c.reason != BREAKS_TOGETHER).max_by(|a, b| a.explained.total_cmp(&b.explained))?;
    checks
        .iter()
        .find(|c| c.reason == BREAKS_TOGETHER)
        .filter(|t| (t.fixes && !best.fixes) || t.explained >= best.explained + PARTIAL_SHARE)
}

/// The nodes where the candidate's inf/NaN are born from finite inputs (weights aside), each
/// once, in graph order.
pub(crate) fn independent_origins(job: &Job, verdict: &Verdict) -> Vec<String> {
    let mut origins: Vec<(usize, String)> = verdict
        .non_finite
        .iter()
        .filter(|n| n.origin && !n.weight)
        .map(|n| (job.index.node(&n.node).map_or(usize::MAX, |i| i.topo_index), n.node.clone()))
        .collect();
    origins.sort();
    origins.dedup();
    origins.into_iter().map(|(_, n)| n).collect()
}

/// What keeping every origin together did to the worst output, in words.
pub(crate) fn together_outcome(check: &KeepCheck) -> String {
    if check.fixes {
        "brings every output within tolerance".to_string()
    } else if check.output_error_after.is_finite() {
        format!(
            "clears the inf/NaN and leaves a relative L2 error of {} (out of tolerance)",
            layerwise_report::format_number(check.output_error_after)
        )
    } else {
        "still leaves inf/NaN: they arise elsewhere too (where is not known from this check, which reads the outputs only; fix keeps them round by round)".to_string()
    }
}

/// Where the reference itself leaves FP16's range outside `kept`, from the comparison: the places
/// inf can still arise once `kept` is kept (measured of the reference, not of that run).
fn beyond_the_kept(index: &GraphIndex, comparison: &Comparison, kept: &[String], precision: Precision) -> String {
    if precision != Precision::Fp16 {
        return String::new();
    }
    let kept: std::collections::HashSet<&str> = kept.iter().map(String::as_str).collect();
    let beyond: Vec<&layerwise_analysis::TensorRecord> = comparison
        .records
        .iter()
        .filter(|r| {
            r.metrics.ref_fp16_overflow > 0
                && !r.constant_like
                && !kept.contains(r.node.as_str())
                && index.node(&r.node).is_some()
        })
        .collect();
    match beyond.first() {
        None => String::new(),
        Some(first) => format!(
            "; the reference itself leaves FP16's range at {} tensor{} outside the kept nodes, the first in graph order '{}' ({}, max |value| {})",
            beyond.len(),
            if beyond.len() == 1 { "" } else { "s" },
            first.name,
            first.op_type,
            layerwise_report::format_number(first.metrics.ref_max_abs)
        ),
    }
}

/// What every check shares: the sample, the reference's outputs, the candidate's own tensors
/// (for re-running only the part a keep list changes), and the worst output's error before.
struct Trial<'a> {
    feeds: &'a [(String, Tensor)],
    reference: &'a RunOutput,
    candidate_tensors: Option<&'a HashMap<String, Tensor>>,
    /// For an emulating candidate, the run every check is computed from.
    baseline: Option<RefCell<HeldRun<'a>>>,
    worst: &'a str,
    before: f64,
    /// A Q/DQ candidate: checks run its own model with the kept nodes unquantized.
    unquantized: Option<&'a UnquantizedRunner<'a>>,
}

impl Trial<'_> {
    /// The candidate re-run with `kept` at reference precision, judged on every output.
    #[allow(clippy::too_many_arguments)]
    fn keep(
        &self,
        candidate: &mut dyn Backend,
        keeper: &mut KeepRunner,
        index: &GraphIndex,
        tolerances: &ToleranceSet,
        node: String,
        reason: &str,
        pattern: &str,
        kept: Vec<String>,
    ) -> Result<KeepCheck> {
        // Only the part of the model the keep list changes runs again, on the candidate's own
        // values at its border, where they are held; else (or where the part cannot run) the
        // whole converted model, as before, and `nodes_rerun` stays empty.
        // An emulation computes the same outputs by parts, bit for bit; the report does not tell
        // the two apart (`nodes_rerun` is for converted models).
        let started = std::time::Instant::now();
        let part = if let Some(unquantized) = self.unquantized {
            // As deployed (only its outputs), as the output error it is weighed against.
            Some((unquantized.run(candidate, &kept, self.feeds, &Selection::Names(Vec::new()))?, None))
        } else if let Some(baseline) = &self.baseline {
            keeper
                .outputs_from(candidate, &kept, self.feeds, &mut baseline.borrow_mut())
                .ok()
                .flatten()
                .map(|(out, _)| (out, None))
        } else {
            self.candidate_tensors
                .and_then(|before| keeper.run_changed_part(candidate, &kept, self.feeds, before).ok().flatten())
                .map(|(out, rerun)| (out, Some(rerun)))
        };
        let (out, nodes_rerun) = match part {
            Some(done) => done,
            None => (keeper.run(candidate, &kept, self.feeds, &Selection::Names(Vec::new()))?, None),
        };
        if std::env::var_os("LAYERWISE_TIMING").is_some() {
            eprintln!(
                "[timing] counterfactual check {node} ({} kept): {:.2}s",
                kept.len(),
                started.elapsed().as_secs_f64()
            );
        }
        let after = compare_all(index, &index.outputs, &self.reference.tensors, &out.tensors, tolerances);
        let after_error = after.get(self.worst).map(|r| r.error_level()).unwrap_or(f64::NAN);
        let explained = KeepCheck::explained_share(self.before, after_error);
        Ok(KeepCheck {
            node,
            reason: reason.to_string(),
            pattern: pattern.to_string(),
            kept,
            output_error_after: after_error,
            explained,
            fixes: after.outputs_pass(index),
            contained: explained < 0.1,
            nodes_rerun,
        })
    }
}
