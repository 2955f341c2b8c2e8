//! The verdict's conclusions: what the runs after the walk found, one sentence each, written once
//! here so that every report format states the same verdict.

use layerwise_analysis::{Extras, ILL_CONDITIONED_FACTOR};

use layerwise_analysis::{Candidate, CauseKind, Comparison, FirstDivergent, Status, Verdict};
use layerwise_model::{GraphIndex, Model};
use layerwise_runtime::BackendSpec;

pub(super) fn n(v: f64) -> String {
    layerwise_report::format_number(v)
}

/// What an emulation does not reproduce of ONNX Runtime's CUDA kernels, for the ops of this model
/// (measured on the H100, docs/emulation.md's per-op table): one sentence each, with the numbers
/// of this run.
pub(super) fn emulation_limits(
    candidate: &BackendSpec,
    model: &Model,
    index: &GraphIndex,
    comparison: &Comparison,
) -> Vec<String> {
    let Some(rounding) = candidate.emulated_rounding() else { return Vec::new() };
    let mut out = Vec::new();
    let numel = |t: &str| comparison.get(t).map(|r| r.shape.iter().product::<usize>().max(1));
    for node in &index.nodes {
        let Some(output) = node.outputs.first().and_then(|o| comparison.get(o)).filter(|r| r.ref_dtype == "float32")
        else {
            continue;
        };
        match (rounding, node.op_type.as_str()) {
            // A GRU without linear_before_reset has no cuDNN form: the CUDA provider runs it on the CPU.
            (layerwise_model::Rounding::Fp16, "GRU")
                if !model.graph().node[node.proto_index].attribute.iter().any(|a| a.name() == "linear_before_reset" && a.i == Some(1)) => {}
            (layerwise_model::Rounding::Fp16, "LSTM" | "RNN" | "GRU") => out.push(format!(
                "{} '{}': cuDNN's FP16 recurrent kernels erred 2.3-3x more than this emulation on the H100 (docs/emulation.md); its emulated output error here is rel L2 {}, so expect up to about {} on a GPU",
                node.op_type,
                node.name,
                n(output.error_level()),
                n(3.0 * output.error_level())
            )),
            (layerwise_model::Rounding::Bf16, "ReduceSum" | "ReduceMean") => {
                let reduced = node.inputs.first().and_then(|i| numel(i)).zip(numel(&output.name)).map(|(a, b)| a / b);
                if reduced.is_some_and(|r| r > 4096) {
                    out.push(format!(
                        "{} '{}' reduces {} elements: beyond 4,096, ONNX Runtime's CUDA kernel kept partial sums in BF16 on the H100 (errors 2.5e-2 to 5e-2 where one rounding gives 1e-3), which this emulation does not reproduce",
                        node.op_type,
                        node.name,
                        reduced.unwrap_or(0)
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

/// Relative L2 error at which a TF32 tensor core's rounding shows: a hundred float32 unit roundoffs
/// and more, far below one TF32 rounding (4.9e-4).
const TF32_ENTRY: f64 = 1e-5;

/// For a candidate whose float32 products run on TF32 tensor cores: where TF32-sized error first
/// enters (the earliest Conv, MatMul, ... whose output errs at least `TF32_ENTRY` while its inputs
/// err less than a tenth of that), how large the outputs' difference is, and how to confirm it.
/// Said on a pass too, unless the verdict already names a TF32 cause. `None` where no such node
/// exists: then nothing measured points at TF32.
pub(super) fn tf32_entry(
    candidate: Candidate,
    model: &Model,
    index: &GraphIndex,
    comparison: &Comparison,
    verdict: &Verdict,
) -> Option<String> {
    if !candidate.arithmetic.tf32()
        || verdict.first_divergent.as_ref().is_some_and(|f| f.cause.best.kind == CauseKind::Tf32)
    {
        return None;
    }
    let error_of = |t: &str| {
        if index.is_graph_input(t) || index.is_constant_like(t) {
            Some(0.0)
        } else {
            comparison.get(t).map(|r| r.error_level())
        }
    };
    let entry = index.nodes.iter().find_map(|node| {
        let proto = &model.graph().node[node.proto_index];
        let slots = layerwise_model::rounding::tf32_slots(proto);
        if slots.is_empty() {
            return None;
        }
        let output = error_of(node.outputs.first()?)?;
        let input = slots
            .iter()
            .filter_map(|&s| node.inputs.get(s))
            .filter(|t| !t.is_empty())
            .map(|t| error_of(t))
            .collect::<Option<Vec<f64>>>()?
            .into_iter()
            .fold(0.0, f64::max);
        (output.is_finite() && output >= TF32_ENTRY && input < output / 10.0).then_some((node, input, output))
    })?;
    let (node, input, output) = entry;
    let worst = index
        .outputs
        .iter()
        .filter_map(|o| comparison.get(o).map(|r| (o, r.error_level())))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let largest =
        worst.map(|(o, e)| format!("the largest output difference is rel L2 {} ('{o}')", n(e))).unwrap_or_default();
    let what = if verdict.status == Status::Pass {
        "the differences are consistent with TF32 rounding"
    } else {
        "TF32 rounding enters the candidate"
    };
    Some(format!(
        "TF32: {what}: float32 {} ran on TF32 tensor cores (10-bit mantissa inputs), and TF32-sized error first enters at '{}' ({}: inputs rel L2 {} -> output {}); {largest}; run the candidate with tf32=off to confirm",
        node.op_type, node.name, node.op_type, n(input), n(output)
    ))
}

/// The mechanism the walk measured at the node it would have named, kept in the verdict when the
/// output turns out ill-conditioned and no single layer is at fault.
pub(super) fn mechanism_without_fault(finding: &FirstDivergent) -> String {
    format!(
        "measured mechanism: {} at '{}' ({}: inputs rel L2 {} -> output {}): {}. The output is ill-conditioned for these inputs, so no single layer is at fault: this is where the candidate's rounding shows first, not a layer to keep",
        layerwise_report::cause_name(finding.cause.best.kind),
        finding.node,
        finding.op_type,
        finding.input_error.map(n).unwrap_or_else(|| "not compared".into()),
        n(finding.output_error),
        finding.cause.best.detail
    )
}

/// Where the first divergent node lost information in one rounding of its stored output, which
/// a later cancellation or periodic function shows (absorption, cancellation, periodic argument):
/// why no node run alone crosses the break threshold, with the measured numbers.
/// The first divergent node that lost information to storage, and the consumer that shows the
/// loss: the break found before the node was traced back to.
fn storage_consumer(verdict: &Verdict) -> Option<(&String, &FirstDivergent)> {
    let fd = verdict.first_divergent.as_ref().filter(|fd| fd.cause.best.kind.is_storage_loss())?;
    verdict.breaks.iter().rev().find(|b| b.node != fd.node).map(|c| (&c.node, fd))
}

fn lost_in_storage(verdict: &Verdict) -> Option<String> {
    let fd = verdict.first_divergent.as_ref().filter(|fd| fd.cause.best.kind.is_storage_loss())?;
    let consumer = verdict.breaks.iter().rev().find(|b| b.node != fd.node)?;
    Some(format!(
        "run alone on the reference's inputs, no chain node introduces error above the break threshold, yet the error is not accumulated: it is one rounding at '{}' ({}), which costs its own output only rel L2 {} and is all that '{}' ({}) leaves (rel L2 {})",
        fd.node,
        fd.op_type,
        n(fd.output_error),
        consumer.node,
        consumer.op_type,
        n(consumer.output_error)
    ))
}

/// Fills `verdict.conclusions` (after `first`, notes gathered while running) and, when the output
/// is ill-conditioned, restates the summary.
pub(super) fn conclude(verdict: &mut Verdict, extras: &Extras, comparison: &Comparison, first: Vec<String>) {
    let mut out = first;
    if verdict.status == Status::Pass {
        let failing = comparison.records.iter().filter(|r| !r.pass && !r.constant_like).count();
        if failing > 0 {
            out.push(format!("{failing} intermediate tensors are out of tolerance, but their error does not reach the outputs with these inputs"));
        }
    }
    // A body left as it is was neither compared nor, under an emulation, rounded: what the verdict
    // says does not cover it.
    if let Some(cf) = &extras.control_flow {
        for i in &cf.inlined {
            if let Some(other) = &i.candidate_taken {
                out.push(format!(
                    "the candidate model takes {other} at '{}' where the reference takes {} (its own run decided): what follows compares different computations (its outputs as each side computed them; inside, only values both sides compute are paired), the chain follows the reference's, and no keep list was checked (the counterfactual would re-run the reference's {} converted, not the candidate's)",
                    i.node, i.taken, i.taken
                ));
            }
        }
        for (node, why) in &cf.kept {
            out.push(format!(
                "'{node}' was left as it is ({why}): the tensors inside its body were not compared (and an emulation, sim:..., does not round them), so this verdict does not cover what happens inside it"
            ));
        }
    }
    if let Some(floor) = &extras.noise_floor {
        if floor.ill_conditioned {
            // Below the floor the candidate errs less than one rounding of the weights moves the
            // output: say so, not "as sensitive", and never print the ratio as 0.0x.
            let no_fault = if floor.rounds == super::noise_floor::QUANTIZER_ROUNDS {
                "No quantizer is at fault: the error is the quantizers' resolution, spread over the model; whether leaving a few layers unquantized helps is not measured"
            } else if floor.rounds == super::noise_floor::STORED_QUANTIZER_ROUNDS {
                // Dynamic quantizers were neither in the floor nor measured one at a time.
                "No quantizer with a stored scale is at fault; the dynamic activation quantizers (their scale from each run's range) are neither in this floor nor measured one at a time, so whether one of them is at fault is unknown, and whether leaving a few layers unquantized helps is not measured"
            } else {
                "No layer is at fault: the output is ill-conditioned for these inputs; whether a small keep list still brings it within tolerance is not measured"
            };
            verdict.summary = if floor.ratio < 1.0 {
                format!(
                    "output '{}': the candidate's error (rel L2 {}) is within what {} causes (noise floor rel L2 {}, the largest of {} seeded draws; the candidate is {} of it). {no_fault}",
                    floor.output,
                    n(floor.candidate_error),
                    floor.rounds,
                    n(floor.output_error),
                    floor.seeds.len(),
                    floor.ratio_words()
                )
            } else {
                format!(
                    "output '{}' is as sensitive to {} as to this backend: noise floor rel L2 {} (the largest of {} seeded draws), candidate {} ({:.1}x, within {ILL_CONDITIONED_FACTOR}x). {}",
                    floor.output,
                    floor.rounds,
                    n(floor.output_error),
                    floor.seeds.len(),
                    n(floor.candidate_error),
                    floor.ratio,
                    no_fault
                )
            };
            out.push("chain nodes were not run alone and no break was kept at reference precision: with an ill-conditioned output no layer is at fault".to_string());
        } else if !floor.output_error.is_finite() {
            out.push(format!(
                "noise floor: {} itself leaves inf/NaN in '{}' (the perturbed reference overflows), so it decides nothing: whether the output is this sensitive anyway is unknown",
                floor.rounds, floor.output
            ));
        } else if floor.ratio <= ILL_CONDITIONED_FACTOR && floor.moved_values > 0 {
            // Within the floor yet not ill-conditioned: a quantizer measured alone overruled it,
            // and the line saying so stands in for this one.
        } else {
            out.push(if floor.moved_values == 0 && !floor.left_for_the_fix.is_empty() {
                format!(
                    "noise floor: the candidate's precision rounds no weight outside the first divergent layer's keep pattern (the weights only that pattern reads, {}, are left exact with it), so the floor is 0",
                    floor.left_for_the_fix.join(", ")
                )
            } else if floor.moved_values == 0 {
                format!("noise floor: the candidate's precision changes no weight ({} rounds none), so the floor is 0 and the candidate's error is not the weights' rounding", floor.rounds)
            } else if floor.output_error == 0.0 {
                format!(
                    "noise floor: {} moves {} values of the weights but leaves '{}' exactly as it was (rel L2 0); the candidate's {} is not the model's own sensitivity",
                    floor.rounds, floor.moved_values, floor.output, n(floor.candidate_error)
                )
            } else {
                format!(
                    "noise floor: {} moves '{}' by rel L2 {}; the candidate's {} is {} times that, so it is not the model's own sensitivity",
                    floor.rounds, floor.output, n(floor.output_error), n(floor.candidate_error), n(floor.ratio)
                )
            });
        }
    }
    if let Some(iso) = &extras.isolation {
        match &iso.introducing {
            Some(node) if storage_consumer(verdict).is_some_and(|(consumer, _)| consumer == node) => {
                let (_, fd) = storage_consumer(verdict).expect("just checked");
                let local = iso.nodes.iter().find(|l| &l.node == node).map(|l| l.local_error).unwrap_or(f64::NAN);
                out.push(format!(
                    "run alone on the reference's inputs, {node} errs by rel L2 {} by itself: fed the exact value, it still reads it stored in the candidate's format, the rounding '{}' ({}) stores it with; that rounding is where the information is lost",
                    n(local),
                    fd.node,
                    fd.op_type
                ));
            }
            Some(node) => {
                let local = iso.nodes.iter().find(|l| &l.node == node).map(|l| l.local_error).unwrap_or(f64::NAN);
                out.push(format!(
                    "run alone on the reference's inputs, {node} introduces the most error (rel L2 {} by itself); chain nodes marked 'propagates' only pass on error from upstream", n(local)
                ));
            }
            None if !iso.nodes.is_empty() => out.push(match (lost_in_storage(verdict), &verdict.first_divergent) {
                (Some(said), _) => said,
                // An integer computed from a float gives the reference's integers from the
                // reference's inputs: what moves them is its input's error, which it turns into a
                // whole step (the headline's node, by the walk's rule).
                (None, Some(fd)) if fd.cause.best.kind == layerwise_analysis::CauseKind::IntegerBoundary => format!(
                    "run alone on the reference's inputs, {} gives the reference's integers: its input's error, accumulated before it, is what moves values across an integer boundary there",
                    fd.node
                ),
                // Only where every chain node ran alone is "accumulated" measured.
                (None, _) if iso.skipped.iter().any(|(n, _)| n != "*") => format!(
                    "run alone on the reference's inputs, none of the {} chain nodes run introduces error above the break threshold; {} were not run (below), so whether the error is introduced there or accumulated is unknown",
                    iso.nodes.len(),
                    iso.skipped.iter().filter(|(n, _)| n != "*").count()
                ),
                (None, _) => "run alone on the reference's inputs, no chain node introduces error above the break threshold: the error is accumulated, not introduced".to_string(),
            }),
            None => {
                if let Some((_, why)) = iso.skipped.iter().find(|(n, _)| n == "*") {
                    out.push(format!("chain nodes could not be run alone: {why}"));
                }
            }
        }
        // What was not run alone is not known to propagate or introduce.
        let not_run: Vec<String> =
            iso.skipped.iter().filter(|(n, _)| n != "*").map(|(n, why)| format!("{n} ({why})")).collect();
        if !iso.nodes.is_empty() && !not_run.is_empty() {
            out.push(format!("not run alone, so whether they introduce error is unknown: {}", not_run.join("; ")));
        }
    }
    if let Some(cf) = &extras.counterfactual {
        out.push(cf.conclusion.clone());
    }
    verdict.conclusions = out;
}

/// What measuring a Q/DQ candidate's quantizers one at a time found, in words: the largest alone
/// against all together, the ones at fault with what their values show (`effects`, measured on the
/// reference's values), and how much of the candidate's error the activation quantizers explain.
pub(super) fn quantizers_alone_lines(
    found: &layerwise_analysis::QuantizersAlone,
    effects: &std::collections::HashMap<String, layerwise_model::quant::QuantizerEffect>,
    index: &layerwise_model::GraphIndex,
) -> Vec<String> {
    let mut out = Vec::new();
    let share =
        |e: f64| if found.together > 0.0 { format!("{:.0}%", 100.0 * e / found.together) } else { "-".to_string() };
    let largest: Vec<String> = found
        .each
        .iter()
        .take(3)
        .map(|q| {
            format!(
                "'{}' (QuantizeLinear '{}') {} ({} of together{})",
                q.tensor,
                q.node,
                n(q.error),
                share(q.error),
                q.without.map_or(String::new(), |w| format!("; left out, the others give {}", n(w)))
            )
        })
        .collect();
    out.push(format!(
        "quantizers one at a time on the reference (each alone, and each left out of all, float32 between, weights float; {} measured in one session): all of them together give '{}' rel L2 {} (the candidate: {}); alone, {}",
        found.each.len(),
        found.output,
        n(found.together),
        n(found.candidate_error),
        largest.join(", ")
    ));
    // The weights' share, measured: where it is half the candidate's error or more, leaving an
    // activation quantizer out removes only its own part.
    let weights_carry = found.weights_together.filter(|w| *w >= 0.5 * found.candidate_error);
    if let Some(w) = found.weights_together {
        out.push(format!(
            "the weight quantizers together (every activation quantizer off, float32 arithmetic) give '{}' rel L2 {} ({} of the candidate's){}",
            found.output,
            n(w),
            if found.candidate_error > 0.0 { format!("{:.0}%", 100.0 * w / found.candidate_error) } else { "-".to_string() },
            if weights_carry.is_some() { ": the weights' rounding carries much of the error, and no activation quantizer left out removes that part" } else { "" }
        ));
    }
    let at_fault: Vec<&layerwise_analysis::QuantizerAlone> = found.at_fault().collect();
    if at_fault.is_empty() {
        if let Some(top) = found.each.first() {
            out.push(format!(
                "no activation quantizer is at fault: none alone gives both half of what they give together and {} (the walk's least break){}; the largest, '{}', gives {} ({})",
                n(found.fault_threshold),
                if top.without.is_some() { ", and leaving none out removes that much" } else { "" },
                top.tensor,
                n(top.error),
                share(top.error)
            ));
        }
    }
    for q in &at_fault {
        let why = effects.get(q.holds.as_ref().unwrap_or(&q.tensor)).map(|e| {
            let mut why = Vec::new();
            if e.step_forced_by_outliers() {
                why.push(format!("its step is set by outliers: |x| reaches {:.4e} while {} values stay within {:.4e}, and {} of {} values round to 0", e.max_abs, e.bulk_count, e.bulk, e.to_zero, e.count));
            }
            if e.clipped > 0 {
                why.push(format!("it clips {} of {} values, by up to {:.4e}", e.clipped, e.count, e.max_overshoot));
            }
            if why.is_empty() {
                why.push(format!("on the reference's values it rounds {} of {} values to 0{}", e.to_zero, e.count, e.rel_l2.map_or(String::new(), |r| format!(" and errs by rel L2 {r:.2e} over the whole tensor"))));
            }
            if let Some(l) = e.worst_part {
                why.push(format!("its one step leaves part {}..={} along axis {} (max |x| {:.4e}, where the largest part reaches {:.4e}) a relative L2 of {:.2e}", l.first, l.first + l.size - 1, l.axis, l.range, l.largest_range, l.rel_l2));
            }
            format!(" ({})", why.join("; "))
        });
        let alone_enough = q.error >= 0.5 * found.together && q.error >= found.fault_threshold;
        let measured = if alone_enough {
            format!(
                "alone it gives rel L2 {}, {} of what every activation quantizer gives together",
                n(q.error),
                share(q.error)
            )
        } else {
            format!(
                "alone it gives rel L2 {} ({}), but left out of all of them it takes their error from {} to {}: {} of it comes through this quantizer, amplified by the quantizers after it",
                n(q.error),
                share(q.error),
                n(found.together),
                n(q.without.unwrap_or(f64::NAN)),
                share(q.removed_from(found.together))
            )
        };
        out.push(format!(
            "the quantizer of '{}' (QuantizeLinear '{}') is at fault: {measured}{}; {}",
            q.tensor,
            q.node,
            why.unwrap_or_default(),
            match weights_carry {
                Some(w) =>
                    format!("leaving the nodes that read it unquantized removes its part, not the weights' {}", n(w)),
                // quantize_static quantizes model outputs too: no node reads that quantizer.
                None if index.outputs.contains(&q.tensor) && index.consumers(&q.tensor).is_empty() => {
                    "no node reads it (it quantizes a model output): leaving the node that computes the output unquantized removes it with that node".to_string()
                }
                None => "leaving the nodes that read it unquantized is what removes it".to_string(),
            }
        ));
    }
    if let Some(left) = found.at_fault_left_out {
        let removed = (found.together - left).max(0.0);
        out.push(format!(
            "the {} quantizers at fault left out together (every other quantizer on, measured) take '{}' from rel L2 {} to {}: {} of it; each share above is measured with the others on, so the shares overlap and do not add up{}",
            at_fault.len(),
            found.output,
            n(found.together),
            n(left),
            share(removed),
            if removed < 0.5 * found.together {
                "; the rest comes through the quantizers not at fault and the weights"
            } else {
                ""
            }
        ));
    }
    if found.together < 0.5 * found.candidate_error && found.weights_together.is_none() {
        out.push(format!(
            "the activation quantizers together give {}, less than half the candidate's {}: the rest is the quantized weights' rounding or the integer kernels' arithmetic, not measured one at a time",
            n(found.together),
            n(found.candidate_error)
        ));
    }
    if !found.not_measured.is_empty() {
        let mut reasons: Vec<(String, usize)> = Vec::new();
        for (_, why) in &found.not_measured {
            match reasons.iter_mut().find(|(r, _)| r == why) {
                Some((_, k)) => *k += 1,
                None => reasons.push((why.clone(), 1)),
            }
        }
        out.push(format!(
            "quantizers not measured one at a time: {}",
            reasons.iter().map(|(r, k)| format!("{k}: {r}")).collect::<Vec<_>>().join("; ")
        ));
    }
    out
}
