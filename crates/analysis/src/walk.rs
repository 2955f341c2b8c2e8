//! The walk back from the worst output to the first divergent layer.
//!
//! Start at the model output with the largest error and follow the error backwards through the
//! producer graph, at each node into the (non-weight) input that carries the most error. A node
//! *breaks* when
//! - it produces inf/NaN from finite inputs, or
//! - its output error (relative L2) is at least `ratio` times its largest input error, and at least
//!   `min_break` in absolute terms (so rounding noise at the first layers is never a break), or
//! - it changes integers (an index, a count, a rounded value: judged exactly) that no input did;
//!
//! and no input holds changed integers: a length off by one frame is an error already, however
//! small relatively, and the walk follows it first.
//!
//! The walk stops at the first breaking node, seen from the output, whose inputs carry only
//! drift-level error (below `max_drift`): that node introduces the error. A breaking node whose
//! inputs are already broken is remembered and the walk goes on past it; if nothing further back
//! qualifies, the earliest breaking node seen is named. No breaking node at all means drift.
//!
//! Both thresholds are relative to the inputs' error, never one absolute tolerance, so a sensitive
//! layer is still named when the error has already drifted to a fraction of a percent before it,
//! and error that grows a little at every layer (drift) is never blamed on one node.

use layerwise_model::{GraphIndex, WeightRange};

use crate::compare::{Comparison, TensorRecord};
use crate::verdict::*;

fn step(record: &TensorRecord) -> ChainStep {
    ChainStep {
        tensor: record.name.clone(),
        node: record.node.clone(),
        op_type: record.op_type.clone(),
        error: record.error_level(),
        max_abs_err: record.metrics.max_abs_err,
        nonfinite: record.metrics.nonfinite_mismatch,
    }
}

/// Finds the first divergent layer. `weight_ranges` lists weights out of FP16 range (empty for
/// float32 candidates).
pub fn walk_back(
    index: &GraphIndex,
    comparison: &Comparison,
    weight_ranges: &[WeightRange],
    rule: WalkRule,
    candidate: Candidate,
) -> Verdict {
    let outputs: Vec<&TensorRecord> = index.outputs.iter().filter_map(|o| comparison.get(o)).collect();
    let status = if outputs.iter().all(|r| r.pass) { Status::Pass } else { Status::Diverged };
    // An output a node computes comes first: an input passed straight through has no node to
    // walk back from, and is the worst only where nothing computed fails.
    // A stored value (a Constant's output) is no more computed than an input.
    let computed = |r: &TensorRecord| index.producer_index(&r.name).is_some() && !index.is_stored_value(&r.name);
    let worst = outputs
        .iter()
        .filter(|r| !r.pass)
        .max_by(|a, b| {
            // Then as the walk ranks inputs (inf/NaN, then changed integers), then the largest error.
            (computed(a), a.walk_rank())
                .cmp(&(computed(b), b.walk_rank()))
                .then(a.error_level().total_cmp(&b.error_level()))
                .then(b.topo_index.cmp(&a.topo_index))
        })
        .copied();
    let mut verdict = Verdict {
        status,
        worst_output: worst.map(|r| r.name.clone()),
        first_divergent: None,
        chain: Vec::new(),
        summary: String::new(),
        non_finite: Vec::new(),
        breaks: Vec::new(),
        sight_ends: None,
        conclusions: Vec::new(),
    };

    if let Some(worst) = worst {
        let mut current = worst;
        // Breaking nodes whose inputs were already broken: (chain length at that node, finding).
        let mut earlier_breaks: Vec<(usize, FirstDivergent)> = Vec::new();
        loop {
            verdict.chain.push(step(current));
            let Some(node) = index.producer(&current.name).filter(|_| !index.is_stored_value(&current.name)) else {
                break;
            };
            let inputs = InputView::of(index, comparison, node);
            let output_error = current.error_level();
            // The error may come from an input nobody measured: the walk cannot go on, and no node
            // from here on can be called the origin.
            // A changed integer is an error to follow whatever its relative size, and so is any
            // tensor out of tolerance: the chain shows where its error grew, even below the break
            // threshold (an output at 3.1e-2 under BF16's 8e-2 showed a chain of one step).
            let significant = output_error >= rule.min_break || current.integers_changed() || !current.pass;
            if !inputs.unseen.is_empty() && (significant || current.metrics.nonfinite_mismatch > 0) {
                verdict.sight_ends = Some(SightEnd::at(node, current, inputs.unseen));
                break;
            }
            if let Some(finding) = judge_node(index, comparison, weight_ranges, rule, candidate, node, current) {
                verdict.breaks.push(finding.clone());
                if finding.input_error.is_some_and(|e| e < rule.max_drift) {
                    verdict.first_divergent = Some(finding);
                    break;
                }
                earlier_breaks.push((verdict.chain.len(), finding));
            }
            // Follow the input carrying the most error; stop if none carries any worth following.
            match inputs.worst() {
                Some(next) if next.error_level() > 0.0 && significant => current = next,
                _ => break,
            }
        }
        if verdict.first_divergent.is_none() && verdict.sight_ends.is_none() {
            if let Some((len, finding)) = earlier_breaks.pop() {
                verdict.chain.truncate(len);
                verdict.first_divergent = Some(finding);
            }
        }
        // A cancellation or a periodic function only shows what an earlier rounding lost: name the
        // node whose stored output lost it.
        if let Some((steps, origin)) =
            verdict.first_divergent.as_ref().and_then(|fd| crate::storage::origin(index, comparison, candidate, fd))
        {
            verdict.chain.extend(steps.into_iter().map(step));
            verdict.breaks.push(origin.clone());
            verdict.first_divergent = Some(origin);
        }
    }

    finish(&mut verdict, index, comparison, rule);
    verdict
}

impl SightEnd {
    fn at(node: &layerwise_model::NodeInfo, output: &TensorRecord, unseen_inputs: Vec<(String, String)>) -> SightEnd {
        SightEnd {
            node: node.name.clone(),
            op_type: node.op_type.clone(),
            tensor: output.name.clone(),
            output_error: output.error_level(),
            unseen_inputs,
        }
    }
}

/// Whether `node`, whose output record is `output`, breaks by the rule (see the module docs), and
/// if so the finding with its cause. A node with an input that was not compared never breaks: its
/// error may come from that input.
pub fn judge_node(
    index: &GraphIndex,
    comparison: &Comparison,
    weight_ranges: &[WeightRange],
    rule: WalkRule,
    candidate: Candidate,
    node: &layerwise_model::NodeInfo,
    output: &TensorRecord,
) -> Option<FirstDivergent> {
    let inputs = InputView::of(index, comparison, node);
    let input_error = inputs.error()?;
    let output_error = output.error_level();
    let nonfinite_in = inputs.nonfinite(index, comparison);
    // Integers that changed in an input are an earlier error, whatever their relative size: a
    // length off by one frame gives another shape here, an index another row.
    let breaks = !inputs.integers_changed()
        && if output.metrics.nonfinite_mismatch > 0 || output.integers_changed() {
            !nonfinite_in
        } else {
            output_error >= rule.min_break && output_error >= rule.ratio * input_error
        };
    if !breaks {
        return None;
    }
    let worst_input = inputs.worst();
    let evidence = Evidence {
        input_max_abs: worst_input.map(|r| r.metrics.compared_max_abs()),
        input_max_abs_err: worst_input.map(|r| r.metrics.max_abs_err),
        output_max_abs: output.metrics.compared_max_abs(),
        output_max_abs_err: output.metrics.max_abs_err,
    };
    let cause = crate::causes::classify(&crate::causes::Site::new(
        index,
        comparison,
        weight_ranges,
        node,
        output,
        worst_input,
        input_error,
        candidate,
    ));
    Some(FirstDivergent {
        keep_with: Vec::new(),
        node: node.name.clone(),
        op_type: node.op_type.clone(),
        tensor: output.name.clone(),
        input_error: Some(input_error),
        output_error,
        evidence,
        cause,
    })
}

/// The verdict of a search-marked run (see `search`): the first divergent node the search
/// settled on, judged by the same rule as the walk, and the measured chain from the worst output
/// back to it (tensor names, output first).
pub fn verdict_from_chain(
    index: &GraphIndex,
    comparison: &Comparison,
    weight_ranges: &[WeightRange],
    rule: WalkRule,
    candidate: Candidate,
    chain: &[String],
    node: Option<&str>,
) -> Verdict {
    let outputs: Vec<&TensorRecord> = index.outputs.iter().filter_map(|o| comparison.get(o)).collect();
    let status = if outputs.iter().all(|r| r.pass) { Status::Pass } else { Status::Diverged };
    let mut verdict = Verdict {
        status,
        worst_output: chain.first().cloned().filter(|_| status == Status::Diverged),
        first_divergent: None,
        chain: chain.iter().filter_map(|t| comparison.get(t)).map(step).collect(),
        summary: String::new(),
        non_finite: Vec::new(),
        breaks: Vec::new(),
        sight_ends: None,
        conclusions: Vec::new(),
    };
    if status == Status::Diverged {
        if let Some(info) = node.and_then(|n| index.node(n)) {
            let output = info
                .outputs
                .iter()
                .filter_map(|o| comparison.get(o))
                .max_by(|a, b| a.error_level().total_cmp(&b.error_level()));
            if let Some(output) = output {
                let inputs = InputView::of(index, comparison, info);
                if !inputs.unseen.is_empty() {
                    verdict.sight_ends = Some(SightEnd::at(info, output, inputs.unseen));
                } else if let Some(finding) =
                    judge_node(index, comparison, weight_ranges, rule, candidate, info, output)
                {
                    verdict.breaks.push(finding.clone());
                    verdict.first_divergent = Some(finding);
                }
            }
        }
    }
    finish(&mut verdict, index, comparison, rule);
    verdict
}

/// Lists the tensors with inf/NaN mismatches (and where each is born) and writes the summary.
fn finish(verdict: &mut Verdict, index: &GraphIndex, comparison: &Comparison, rule: WalkRule) {
    let chain_tensors: std::collections::HashSet<&str> = verdict.chain.iter().map(|s| s.tensor.as_str()).collect();
    for record in comparison.records.iter().filter(|r| r.metrics.nonfinite_mismatch > 0) {
        // Born here when every input is known to be free of such mismatches (an input that was
        // not compared leaves the origin unknown), and where the inputs hold inf/NaN already (a
        // model input's NaN, on both sides), only where the candidate has more of them than the
        // reference: a quantizer that turns the reference's NaN into finite codes makes none.
        // A graph input passed straight to an output is born at no node.
        let (reference, candidate) = record.metrics.nonfinite_counts();
        // A stored value (a Constant's output) is born at no node: it enters with the weights.
        let origin = index
            .producer(&record.name)
            .filter(|_| !index.is_stored_value(&record.name))
            .map(|n| {
                let inputs = InputView::of(index, comparison, n);
                inputs.unseen.is_empty()
                    && !inputs.nonfinite(index, comparison)
                    && (candidate > reference || comparison.nonfinite_inputs_of(index, n).is_empty())
            })
            .unwrap_or(!index.is_graph_input(&record.name) && !index.is_stored_value(&record.name));
        verdict.non_finite.push(NonFiniteTensor {
            tensor: record.name.clone(),
            node: record.node.clone(),
            op_type: record.op_type.clone(),
            cand_nan: record.metrics.cand_nan,
            cand_inf: record.metrics.cand_inf,
            mismatched: record.metrics.nonfinite_mismatch,
            origin,
            on_chain: chain_tensors.contains(record.name.as_str()),
            weight: record.constant_like,
        });
    }
    verdict.summary = summarize(verdict, index, rule);
    // An output whose every value is NaN or inf on both sides alike (NaN inputs make NaN outputs)
    // passes on matching inf/NaN alone: nothing of it was judged, and a pass must not read as one.
    if verdict.status == Status::Pass {
        let unjudged: Vec<&str> = index
            .outputs
            .iter()
            .filter(|o| comparison.get(o).is_some_and(TensorRecord::unjudged))
            .map(String::as_str)
            .collect();
        if !unjudged.is_empty() {
            let names = unjudged.iter().map(|o| format!("'{o}'")).collect::<Vec<_>>().join(", ");
            verdict.summary = if unjudged.len() == index.outputs.len() {
                format!("nothing was judged: every value of {names} is NaN or inf in the reference, and the candidate matches it")
            } else {
                format!("{}; nothing of {names} was judged: its every value is NaN or inf in the reference, and the candidate matches it", verdict.summary)
            };
        }
    }
    // A model output neither run compared (a weight passed straight to the output) is named, so
    // that no summary claims every output.
    let mut unseen: Vec<&str> = Vec::new();
    for o in index.outputs.iter().filter(|o| comparison.get(o).is_none()) {
        if !unseen.contains(&o.as_str()) {
            unseen.push(o);
        }
    }
    if !unseen.is_empty() {
        if verdict.status == Status::Pass {
            verdict.summary = "all compared model outputs are within tolerance".to_string();
        }
        for o in unseen {
            let why = match comparison.not_compared.iter().find(|(t, _)| t == o) {
                Some((_, why)) => format!(": {why}"),
                None if crate::compare::is_weight_output(index, o) => format!(": {}", crate::compare::WEIGHT_OUTPUT),
                None => String::new(),
            };
            verdict.summary.push_str(&format!("; output '{o}' was not compared{why}"));
        }
    }
}

fn summarize(v: &Verdict, index: &GraphIndex, rule: WalkRule) -> String {
    let worst = v.worst_output.as_deref().unwrap_or("?");
    match (&v.status, &v.first_divergent, &v.sight_ends) {
        (Status::Pass, _, _) => "all model outputs are within tolerance".to_string(),
        (Status::Diverged, None, None) if v.chain.len() == 1 && v.chain[0].node.is_empty() => format!(
            "output '{worst}' diverges: it is the model's input passed straight through, and the candidate returns it otherwise than it was fed (stored in the type the candidate model declares for that input)"
        ),
        (Status::Diverged, None, None) if v.chain.len() == 1 && index.is_stored_value(&v.chain[0].tensor) => format!(
            "output '{worst}' diverges: it is a value stored in the model ({} '{}'), which the candidate holds otherwise (relative L2 {:.2e}{}): no layer computes it",
            v.chain[0].op_type,
            v.chain[0].node,
            v.chain[0].error,
            if v.chain[0].nonfinite > 0 { format!(", {} values inf/NaN on one side only", v.chain[0].nonfinite) } else { String::new() }
        ),
        (Status::Diverged, _, Some(end)) => format!(
            "output '{worst}' diverges; its error can be followed back to node '{}' ({}), whose input{} {} {} not compared, so the error enters there or before it: layerwise cannot see further",
            end.node,
            end.op_type,
            if end.unseen_inputs.len() == 1 { "" } else { "s" },
            end.unseen_inputs.iter().map(|(t, _)| format!("'{t}'")).collect::<Vec<_>>().join(", "),
            if end.unseen_inputs.len() == 1 { "was" } else { "were" }
        ),
        (Status::Diverged, Some(fd), None) => format!("output '{worst}' diverges; the error starts at node '{}' ({}): {}", fd.node, fd.op_type, fd.cause.best.detail),
        (Status::Diverged, None, None) => format!(
            "output '{worst}' diverges, but no single node introduces the error: it is drift that grows along the {}-step chain shown (no node raises its input error {}x or more)",
            v.chain.len(),
            rule.ratio
        ),
    }
}
