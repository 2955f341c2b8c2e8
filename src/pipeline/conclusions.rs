//! The verdict's conclusions: what the runs after the walk found, one sentence each, written once
//! here so that every report format states the same verdict.

use layerwise_analysis::{Extras, ILL_CONDITIONED_FACTOR};

use layerwise_analysis::{Comparison, Status, Verdict};
use layerwise_model::{GraphIndex, Model};
use layerwise_runtime::BackendSpec;

fn n(v: f64) -> String {
    layerwise_report::format_number(v)
}

/// What an emulation does not reproduce of ONNX Runtime's CUDA kernels, for the ops of this model
/// (measured on the H100, docs/emulation.md's per-op table): one sentence each, with the numbers
/// of this run.
pub(super) fn emulation_limits(candidate: &BackendSpec, model: &Model, index: &GraphIndex, comparison: &Comparison) -> Vec<String> {
    let Some(rounding) = candidate.emulated_rounding() else { return Vec::new() };
    let mut out = Vec::new();
    let numel = |t: &str| comparison.get(t).map(|r| r.shape.iter().product::<usize>().max(1));
    for node in &index.nodes {
        let Some(output) = node.outputs.first().and_then(|o| comparison.get(o)).filter(|r| r.ref_dtype == "float32") else { continue };
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
            verdict.summary = if floor.ratio < 1.0 {
                format!(
                    "output '{}': the candidate's error (rel L2 {}) is well within what one rounding of every weight (relative {}) causes (noise floor rel L2 {}; the candidate is 1/{:.0} of it). No layer is at fault: the output is ill-conditioned for these inputs, and no small keep list can fix it",
                    floor.output, n(floor.candidate_error), n(floor.relative), n(floor.output_error), 1.0 / floor.ratio
                )
            } else {
                format!(
                    "output '{}' is as sensitive to perturbing every weight by one rounding (relative {}) as to this backend: noise floor rel L2 {}, candidate {} ({:.1}x, within {ILL_CONDITIONED_FACTOR}x). No layer is at fault: the output is ill-conditioned for these inputs, and no small keep list can fix it",
                    floor.output, n(floor.relative), n(floor.output_error), n(floor.candidate_error), floor.ratio
                )
            };
            out.push("chain nodes were not run alone and no break was kept at reference precision: with an ill-conditioned output no layer is at fault".to_string());
        } else {
            out.push(format!(
                "noise floor: perturbing every weight by one rounding (relative {}) moves '{}' by rel L2 {}; the candidate's {} is {} times that, so it is not the model's own sensitivity",
                n(floor.relative), floor.output, n(floor.output_error), n(floor.candidate_error), n(floor.ratio)
            ));
        }
    }
    if let Some(iso) = &extras.isolation {
        match &iso.introducing {
            Some(node) => {
                let local = iso.nodes.iter().find(|l| &l.node == node).map(|l| l.local_error).unwrap_or(f64::NAN);
                out.push(format!(
                    "run alone on the reference's inputs, {node} introduces the most error (rel L2 {} by itself); chain nodes marked 'propagates' only pass on error from upstream", n(local)
                ));
            }
            None if !iso.nodes.is_empty() => out.push(
                "run alone on the reference's inputs, no chain node introduces error above the break threshold: the error is accumulated, not introduced".to_string(),
            ),
            None => {
                if let Some((_, why)) = iso.skipped.iter().find(|(n, _)| n == "*") {
                    out.push(format!("chain nodes could not be run alone: {why}"));
                }
            }
        }
        // What was not run alone is not known to propagate or introduce.
        let not_run: Vec<String> = iso.skipped.iter().filter(|(n, _)| n != "*").map(|(n, why)| format!("{n} ({why})")).collect();
        if !iso.nodes.is_empty() && !not_run.is_empty() {
            out.push(format!("not run alone, so whether they introduce error is unknown: {}", not_run.join("; ")));
        }
    }
    if let Some(cf) = &extras.counterfactual {
        out.push(cf.conclusion.clone());
    }
    verdict.conclusions = out;
}
