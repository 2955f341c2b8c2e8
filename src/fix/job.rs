//! The fix job, step by step: bisect's plan ([`set_up`]), the reference run on every sample, the
//! search, the file written and checked, and the report. A Q/DQ candidate goes from the search on
//! to quantized.rs.

use std::path::Path;

use anyhow::{bail, Context, Result};
use layerwise_analysis::{add_passed_through, passed_through, Status};
use layerwise_model::convert::{float_tensor_set, Conversion};
use layerwise_model::scratch::{ScratchDir, StagedDir};
use layerwise_model::{scan_fp16_weight_range, GraphIndex, Model, Rounding, Selection};
use layerwise_report::{render_fix_terminal, FixReport, FixStage, FixStatus, KeptPattern, LoadCheck, FIX_SCHEMA};
use layerwise_runtime::inputs::prepare_inputs;
use layerwise_runtime::{float32_tensors, Precision, RunRequest};

use super::options::{check_fix_outputs, files_written_at, FixOptions, FixOutcome};
use super::quantized::fix_quantized;
use super::search::{
    diagnose, keep_the_breaks, region_search, AnswerGoal, BreaksKept, Judged, Keeping, Sample, Search,
};
use super::summary::{bf16_samples, bf16_whole, num, output_changes, stage_json, summary, Found, LARGE_KEEP_LIST};
use super::write::{made_by_inlining, trtexec_flags, write_and_check, Writing};
use crate::keep::KeepRunner;
use crate::pipeline::noise_floor::{noise_floor, FloorPlan};
use crate::pipeline::setup::{feeds_of, set_up, Judging, Setup};
use crate::pipeline::Steps;

/// The kind of pattern for an If or Loop left as it is, kept FP32 whole.
const OPAQUE_CONTROL_FLOW: &str = "control_flow_left_as_is";

pub fn fix(options: &FixOptions) -> Result<FixOutcome> {
    check_fix_outputs(options)?;
    let b = &options.bisect;
    // TF32 is switched per engine or session, never per layer: no keep list can hold in a file.
    if b.candidate.emulated_rounding() == Some(Rounding::Tf32) {
        bail!(
            "fix --cand {}: TF32 has no per-layer switch: TensorRT and ONNX Runtime turn it on or off for a whole engine or session (trtexec --noTF32; ONNX Runtime's CUDA provider option use_tf32=0), and a model file cannot keep some layers out of it, so fix has no keep list to write or check. bisect --cand {} names the layer TF32 breaks; deploy with TF32 off where that layer matters",
            b.candidate,
            b.candidate
        );
    }
    let mut steps = Steps::new(b.progress, b.progress_lines);
    let original = steps.run("loading model", || Model::load(&b.model).map_err(Into::into))?;
    let written = options.output.as_deref().map(files_written_at);
    let fixed_model: Vec<(&str, &Path)> =
        written.iter().flatten().map(|(what, path)| (*what, path.as_path())).collect();
    crate::pipeline::check_not_external_data(&original, "the input model's external data", b, &fixed_model)?;
    let original_index = GraphIndex::build(original.graph()).with_context(|| format!("{}", b.model.display()))?;
    // The plan bisect makes: backends, inputs, and the control flow as the reference ran it
    // (bodies inlined, so nodes inside can be kept); the fixed model is the original with the keep
    // list resolved into its bodies.
    let mut setup = set_up(&original, b, &mut steps)?;
    // The trials re-run the same pieces of the candidate's program, each in the session it built.
    setup.candidate.keep_piece_sessions(true);
    if let Some((cm, _)) = &setup.cand_model {
        refuse_unkeepable_candidate_model(cm, &setup.judging)?;
    }
    let goal = answer_goal(options, &setup.model, &setup.index)?;
    let samples = run_the_reference(&mut setup, &mut steps)?;
    if setup.cand_model.is_some() {
        return fix_quantized(options, setup, samples, steps, goal);
    }
    fix_float(options, &original, &original_index, setup, samples, steps, goal)
}

/// The outputs judged by their answers (`--task`, or a classifier recognised by its Softmax), and
/// with `--target answer` the share of their cases that must hold; refused before any run where
/// the target asks for answers and no output is judged by them.
fn answer_goal(options: &FixOptions, model: &Model, index: &GraphIndex) -> Result<Option<AnswerGoal>> {
    let judged = crate::pipeline::answers::judged_outputs(&options.bisect, model, index)?;
    let share = options.target.share();
    if judged.is_empty() {
        if share.is_some() {
            bail!(
                "fix --target answer: no output of {} is judged by its answers: give --task OUTPUT:TASK (classify, ctc, mask, embedding or detect) for an output ({}); only a Softmax over the last axis of an [N, C] output is recognised as a classifier unasked",
                options.bisect.model.display(),
                index.outputs.iter().map(|o| format!("'{o}'")).collect::<Vec<_>>().join(", ")
            );
        }
        return Ok(None);
    }
    Ok(Some(AnswerGoal { judged, share }))
}

/// A candidate model `fix` can keep nodes of: a Q/DQ model, whose nodes are left unquantized.
fn refuse_unkeepable_candidate_model(cm: &Model, judging: &Judging) -> Result<()> {
    if judging.quantization.is_none() {
        bail!(
            "fix --cand-model takes a Q/DQ version of the model (QuantizeLinear/DequantizeLinear nodes), and {} has none: fix converts a float model to FP16 itself (leave --cand-model out), and bisect compares any other candidate model",
            cm.path.display()
        );
    }
    // Integer ops left in the file's own form (no Q/DQ form is read for them, `qdq_form`) have no
    // float counterpart to keep.
    let index = GraphIndex::build(cm.graph())?;
    let left: std::collections::BTreeSet<String> =
        layerwise_model::quant::integer_ops(cm.graph(), &index).into_iter().map(|(op, _)| op).collect();
    if !left.is_empty() {
        bail!(
            "fix --cand-model reads a quantized model in its Q/DQ form (float ops between QuantizeLinear/DequantizeLinear pairs; QLinearConv, QLinearMatMul, QGemm, QLinearAdd/Mul/Concat/Sigmoid/LeakyRelu/Softmax/(Global)AveragePool and quantize_dynamic's MatMulInteger and ConvInteger are read so), and {} computes with {}, which have no Q/DQ form that layerwise reads: their nodes have no float counterpart to leave unquantized; quantize it again in the QDQ format",
            cm.path.display(),
            left.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}

/// Every sample's inputs, and the reference's tensors on it (an input passed straight to an
/// output as it was fed); a reference run that fails on one sample of a set says which, as
/// bisect's does.
fn run_the_reference(setup: &mut Setup, steps: &mut Steps) -> Result<Vec<Sample>> {
    let mut sets = Vec::new();
    for (name, sample) in &setup.samples {
        sets.push((
            name.clone(),
            feeds_of(&prepare_inputs(&setup.decls, sample).map_err(|e| setup.owners.explain(name, e))?),
        ));
    }
    if sets.is_empty() {
        bail!("no inputs to run");
    }
    let (model, index): (&Model, &GraphIndex) = (&setup.model, &setup.index);
    let total = sets.len();
    let mut samples = Vec::new();
    for (k, (name, feeds)) in sets.into_iter().enumerate() {
        let label = if total == 1 {
            "running the reference".to_string()
        } else {
            format!("running the reference, sample {} of {total} ({name})", k + 1)
        };
        let ran = steps.run(&label, || {
            Ok(setup.reference.run(&RunRequest { model, index, inputs: &feeds, selection: &Selection::All })?)
        });
        let mut out = if total > 1 { ran.with_context(|| format!("sample {name}"))? } else { ran? };
        add_passed_through(model.graph(), index, &feeds, &mut out.tensors);
        crate::pipeline::refuse_empty_outputs(
            &index.outputs,
            |o| out.tensors.get(o).map(|t| t.shape.as_slice()),
            &feeds,
        )
        .with_context(|| format!("sample '{name}'"))?;
        samples.push(Sample { name, feeds, reference: out.tensors, runs: Vec::new() });
    }
    Ok(samples)
}

/// Nodes in `node`'s bodies (If branches, Loop and Scan bodies), nested bodies included.
fn nodes_in_bodies(node: &layerwise_model::onnx::NodeProto) -> usize {
    node.attribute
        .iter()
        .flat_map(|a| a.g.iter().chain(&a.graphs))
        .map(|g| g.node.len() + g.node.iter().map(nodes_in_bodies).sum::<usize>())
        .sum()
}

/// An FP16 (or, for a BF16 emulation, BF16) fix: the search keeps nodes in FP32 by the emulation or
/// on the converted model, and the model written is converted with the list.
fn fix_float(
    options: &FixOptions,
    original: &Model,
    original_index: &GraphIndex,
    setup: Setup,
    samples: Vec<Sample>,
    steps: Steps,
    goal: Option<AnswerGoal>,
) -> Result<FixOutcome> {
    let b = &options.bisect;
    let inlined: Vec<String> =
        setup.control_flow.as_ref().map(|cf| cf.inlined.iter().map(|i| i.node.clone()).collect()).unwrap_or_default();
    // If and Loop nodes left as they are (samples that take different branches, a Loop whose trip
    // count the run decides): the emulation does not round inside their bodies and the typed check
    // runs each as one ONNX Runtime call, so neither can vouch for an FP16 body. They stay FP32
    // whole.
    let opaque: Vec<(String, String)> = setup
        .control_flow
        .as_ref()
        .map(|cf| {
            cf.kept
                .iter()
                .filter(|(n, _)| setup.index.node(n).is_some_and(|info| matches!(info.op_type.as_str(), "If" | "Loop")))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    // Each If replaced by the branch these inputs took: the other branch is written converted with
    // nothing kept, and no run saw it (the summary says so).
    let branches_taken: Vec<(String, String)> = setup
        .control_flow
        .as_ref()
        .map(|cf| cf.inlined.iter().filter(|i| i.op_type == "If").map(|i| (i.node.clone(), i.taken.clone())).collect())
        .unwrap_or_default();
    let flattened = setup.control_flow.is_some();
    let Setup { model, index, mut reference, mut candidate, .. } = setup;
    let (model, index): (&Model, &GraphIndex) = (&model, &index);
    let keeper = KeepRunner::new(model, index, candidate.as_mut());
    // A BF16 emulation is fixed into a BF16 model; anything else into FP16, and judged as what it
    // runs: the list kept FP32 in that model (the same judging bisect gives an FP16 candidate).
    let low = if candidate.precision() == Precision::Bf16 { Precision::Bf16 } else { Precision::Fp16 };
    // Said before any run: a BF16 file needs opset 13 (the search would end in the same refusal).
    if low == Precision::Bf16 && model.opset() < 13 {
        bail!(
            "fix --cand {} writes a BF16 model, which needs opset 13 or later (Cast and most ops take bfloat16 from there); this model is opset {}: convert it with onnx's version converter first (onnx.version_converter.convert_version(model, 17)); bisect --cand {} needs no conversion",
            b.candidate,
            model.opset(),
            b.candidate
        );
    }
    let judging = Judging::new(low, false, b, (model, index))?;
    let low_flag = if low == Precision::Bf16 { "bf16" } else { "fp16" };
    // Every computed tensor, and the outputs passed straight from an input (compared as bisect
    // compares them: each side returns the value it was fed).
    let order: Vec<String> = index.computed_tensors().map(str::to_string).chain(passed_through(index)).collect();
    let weights = scan_fp16_weight_range(model)?;
    // Converted files run by ONNX Runtime itself (not the emulation, not a typed evaluation) are
    // judged on their outputs as deployed, by bisect's rule; the file fix writes holds FP16/BF16.
    let deployed = !keeper.emulated() && crate::pipeline::setup::judged_as_deployed(&b.candidate, true);
    let mut search =
        Search::new(index, samples, order, candidate, Keeping::Float(keeper), judging, weights, steps, deployed);
    search.goal = goal;

    let first = diagnose(&mut search)?;
    let mut keep: Vec<String> = Vec::new();
    let mut patterns: Vec<KeptPattern> = Vec::new();
    let mut last = first.clone();
    // The nodes inside each If or Loop kept whole: the keep list's count of one node would
    // understate it (one node may be the whole model).
    let mut inside_kept_whole = 0;
    if !opaque.is_empty() {
        for (node, why) in &opaque {
            let inside = model.graph().node.iter().find(|n| n.name() == node.as_str()).map_or(0, nodes_in_bodies);
            inside_kept_whole += inside;
            keep.push(node.clone());
            patterns.push(KeptPattern {
                kind: OPAQUE_CONTROL_FLOW.into(),
                nodes: vec![node.clone()],
                because: format!("'{node}' is left as it is ({why}): neither the emulation nor the typed check sees inside it, so it stays FP32 whole, with the {inside} nodes of its bodies"),
            });
        }
        last = search.trial(&keep, FixStage::Pattern)?;
    }
    let mut stuck = None;
    // An output as sensitive to one rounding of every weight as to the candidate has no small fix:
    // measured where bisect measures it, on the plan bisect makes ([`FloorPlan`]).
    // Held to the answers, an element-wise floor is no reason to stop: a keep list may still keep
    // every answer.
    let mut floor = None;
    if last.1.status == Status::Diverged && b.noise_floor && !search.held_to_answers() {
        if let Some(Ok(plan)) = FloorPlan::of(&search.judging, index, &last.1, &last.0) {
            // Timed in run_info, shown as no step of its own (the progress lines stay as they were).
            let started = std::time::Instant::now();
            let no_exact_weights = Default::default();
            // The perturbed model runs with only its outputs asked for, so it is compared with the
            // model run the same way, not with the run that exposes every tensor (ONNX Runtime
            // fuses the two differently: a smart-turn encoder's output read 0.952 exposed and
            // 0.942 plain, and the floor was 1.8e-3 against one and 1.1e-1 against the other).
            let plain = reference.run(&RunRequest {
                model,
                index,
                inputs: &search.sample().feeds,
                selection: &Selection::Names(Vec::new()),
            })?;
            let measured = noise_floor(
                reference.as_mut(),
                model,
                index,
                &search.sample().feeds,
                &plain.tensors,
                &search.judging.tolerances,
                plan.target(&search.judging, &no_exact_weights, b.inputs.seed, None),
            )?;
            search.steps.record("measuring the noise floor", started.elapsed().as_secs_f64());
            if measured.ill_conditioned {
                stuck = Some(format!(
                    "stopped before searching: output '{}' is ill-conditioned for these inputs ({} moves it by rel L2 {}, the candidate by {}, {} of it); a keep list holds activations at reference precision, not the weights, so whether a small one still brings it within tolerance was not measured",
                    plan.output,
                    measured.rounds,
                    num(measured.output_error),
                    num(measured.candidate_error),
                    measured.ratio_words()
                ));
            }
            floor = Some(measured);
        }
    }
    let ill_conditioned = floor.as_ref().is_some_and(|f: &layerwise_analysis::NoiseFloor| f.ill_conditioned);
    if !ill_conditioned {
        if let BreaksKept::Stuck(why) =
            keep_the_breaks(&mut search, &mut keep, &mut patterns, &mut last, options.max_rounds)?
        {
            stuck = Some(why);
        }
    }
    // The targeted keeps did not do it: a contiguous region in topological order, shrunk from both
    // ends, then pruned. `--max-rounds 0` asks for no search at all.
    if last.1.status == Status::Diverged && !ill_conditioned && options.max_rounds > 0 {
        match region_search(&mut search, &keep)? {
            Some((region, outcome)) => {
                stuck = None;
                patterns.push(KeptPattern { kind: "region".into(), nodes: region.clone(), because: "keeping the recognised patterns did not fix the outputs; the smallest contiguous region that does, pruned".into() });
                keep.extend(region);
                last = outcome;
            }
            None => {
                let why = "even keeping every node that computes a float, or an integer from a float, in FP32 (measured) does not bring the outputs within tolerance";
                stuck = Some(match stuck {
                    Some(s) => format!("{s}; {why}"),
                    None => why.to_string(),
                });
            }
        }
    }
    // Where the file goes, planned once the search passes (prune rounds only keep passing lists).
    let writing = if last.1.status == Status::Pass {
        let (source, source_index): (&Model, &GraphIndex) =
            if flattened { (original, original_index) } else { (model, index) };
        let Keeping::Float(keeper) = &mut search.keeping else { unreachable!("an FP16 search keeps in FP32") };
        let float = if flattened {
            float_tensor_set(original, &float32_tensors(original, original_index)?)
        } else {
            keeper.float()?.clone()
        };
        // Written beside -o and moved there only once it holds: a fix that fails leaves the
        // user's file at -o as it was.
        let staging = match &options.output {
            Some(out) => Some(StagedDir::beside(out, ".layerwise-fix-")?),
            None => None,
        };
        let scratch = ScratchDir::new("layerwise-fix-")?;
        let path = match (&options.output, &staging) {
            (Some(out), Some(staging)) => {
                staging.path().join(out.file_name().unwrap_or(std::ffi::OsStr::new("fixed.onnx")))
            }
            _ => scratch.path().join("fixed.onnx"),
        };
        // What ONNX Runtime refuses in the target type was found once, on the model the search ran
        // converted with nothing kept, and does not depend on the keep list: the file is converted
        // with it, and the child's session is its own type check (no second one here). A model
        // whose control flow was inlined is written from the original, whose nodes the search's
        // model names otherwise: checked by `convert_checked` as before.
        let refused = if flattened { None } else { Some(keeper.refused()?.clone()) };
        Some(Writing { source, source_index, float, refused, target: low, path, _staging: staging, _scratch: scratch })
    } else {
        None
    };
    let mut untried = 0;
    let written_beside =
        prune_patterns(&mut search, &mut keep, &mut patterns, &mut last, writing.as_ref(), &mut untried)?;
    let mut fixed = last.1.status == Status::Pass;
    let outputs = output_changes(index, &first.0, &last.0);
    let Keeping::Float(keeper) = &mut search.keeping else { unreachable!("an FP16 search keeps in FP32") };
    let converter_fp32 = keeper.converter_fp32_with(&keep);

    // FP16 that needs a large keep list, or none found: would BF16 need any? The model run whole
    // in BF16 (`sim:bf16`, nothing kept) on every sample, judged by BF16's own tolerances, measured
    // (a diffusion UNet kept 280 of 2,103 nodes for FP16 where BF16 passed at 2.46e-2).
    let bf16_wanted =
        |fixed: bool, keep: &[String]| low == Precision::Fp16 && (!fixed || keep.len() >= LARGE_KEEP_LIST);
    // Where it is wanted whatever the written file's checks find, it runs beside them (on its own
    // copies: they read nothing it computes).
    let bf16_beside = (fixed && bf16_wanted(fixed, &keep)).then(|| {
        let (model, index, options) = (model.clone(), index.clone(), b.clone());
        let samples = bf16_samples(&search.samples, &index);
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            (bf16_whole(&samples, &model, &index, &options), started.elapsed().as_secs_f64())
        })
    });
    let trtexec = trtexec_flags(&keep, &inlined, low_flag);
    let mut checked = None;
    let mut written_failed = false;
    if fixed {
        // The file written: the original with the keep list resolved into its control-flow
        // bodies; otherwise the model the search ran (its own functions inlined, the IR version
        // ONNX Runtime reads), whose node names the keep list uses.
        let writing = writing.as_ref().expect("planned where the search passed, as fixed says");
        let check = write_and_check(
            &mut search,
            writing,
            written_beside,
            &keep,
            &patterns,
            trtexec.clone(),
            &first.0,
            options.output.as_deref(),
        )?;
        if let Some(why) = &check.failure {
            fixed = false;
            written_failed = true;
            stuck = Some(why.clone());
        }
        checked = Some(check);
    }

    let bf16_label = "running the model whole in BF16 (sim:bf16, nothing kept)";
    let other_precision = match bf16_beside {
        Some(beside) => {
            let (result, seconds) = beside.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            search.steps.ran_beside(bf16_label, seconds);
            Some(result?)
        }
        None if bf16_wanted(fixed, &keep) => {
            let samples = bf16_samples(&search.samples, index);
            Some(search.steps.run(bf16_label, || bf16_whole(&samples, model, index, b))?)
        }
        None => None,
    };
    // The written file's answers where it was checked, else the last candidate run's.
    let answers = match &checked {
        Some(c) if c.check.not_run.is_none() => c.answers.clone(),
        _ => std::mem::take(&mut search.answers),
    };
    let summary = summary(&Found {
        index,
        fixed,
        keep: &keep,
        patterns: &patterns,
        stuck,
        low,
        runs: search.runs,
        samples: search.samples.len(),
        inside_kept_whole,
        untried,
        written_failed,
        hand_overs: keep.iter().filter(|n| made_by_inlining(n, &inlined)).count(),
        branches_taken: &branches_taken,
        converter_fp32: &converter_fp32,
        other_precision: other_precision.as_ref(),
        fixed_error: checked
            .as_ref()
            .filter(|_| fixed)
            .map(|c| c.check.outputs.iter().map(|o| o.after_rel_l2).fold(0.0, f64::max)),
        non_finite_inside: &last.1.non_finite,
        target: options.target.share(),
        answers: &answers,
        outputs: checked.as_ref().filter(|c| c.check.not_run.is_none()).map_or(&outputs[..], |c| &c.check.outputs[..]),
    });
    let (fixed_model, fixed_model_fp32_nodes, fixed_model_check, fixed_model_load, mut staged) = match checked {
        Some(c) => (c.fixed_model, c.fp32_nodes, Some(c.check), Some(c.load), c.outputs),
        None => (None, Vec::new(), None, None, super::write::Staged::default()),
    };
    let report = FixReport {
        schema: FIX_SCHEMA.to_string(),
        model: b.model.display().to_string(),
        reference: b.reference.to_string(),
        candidate: b.candidate.to_string(),
        status: if fixed { FixStatus::Fixed } else { FixStatus::NotFixed },
        summary,
        node_count: index.nodes.len(),
        trtexec_flags: trtexec,
        keep_fp32: keep,
        patterns,
        rounds: std::mem::take(&mut search.rounds),
        candidate_runs: search.runs,
        samples: if search.samples.len() > 1 {
            search.samples.iter().map(|s| s.name.clone()).collect()
        } else {
            Vec::new()
        },
        noise_floor: floor,
        outputs,
        fixed_model,
        fixed_model_fp32_nodes,
        fixed_model_check,
        fixed_model_load,
        other_precision,
        target: options.target.name(),
        answers,
        run_info: layerwise_report::RunInfo::now(search.steps.finish()),
    };
    // Every output of the run, or none: the report staged too, then all moved into place.
    staged.files.extend(stage_json(b, &report)?);
    staged.commit()?;
    let text = render_fix_terminal(&report, if low == Precision::Bf16 { "BF16" } else { "FP16" });
    Ok(FixOutcome { report, text })
}

/// The written file's conversion and load check for a keep list, made beside the prune rounds.
type WrittenBeside = Option<(Vec<String>, Result<(Conversion, LoadCheck)>, f64)>;

/// Drops the patterns that turn out unnecessary once the others are kept (earliest first), where
/// the search passed with more than one. The file for the keep list as it stands before is
/// written and loaded in a child process beside these rounds: where no round drops a pattern
/// (independent overflows, each needed), it is the file written, and the child's wait is hidden;
/// otherwise it is written again for the pruned list.
fn prune_patterns(
    search: &mut Search,
    keep: &mut Vec<String>,
    patterns: &mut Vec<KeptPattern>,
    last: &mut Judged,
    writing: Option<&Writing>,
    untried: &mut usize,
) -> Result<WrittenBeside> {
    if last.1.status != Status::Pass || patterns.len() <= 1 {
        return Ok(None);
    }
    let early_keep = keep.clone();
    let feeds = search.samples[0].feeds.clone();
    std::thread::scope(|scope| -> Result<_> {
        let beside = writing.map(|w| {
            let (early_keep, feeds) = (&early_keep, &feeds);
            scope.spawn(move || {
                let started = std::time::Instant::now();
                (w.convert_and_check(early_keep, feeds), started.elapsed().as_secs_f64())
            })
        });
        let mut i = 0;
        while i < patterns.len() && patterns.len() > 1 {
            // What the emulation cannot see inside is not its to drop.
            if patterns[i].kind == OPAQUE_CONTROL_FLOW {
                i += 1;
                continue;
            }
            // The keep list is the union of the patterns: without this one, it keeps every node
            // another pattern holds (a node two patterns share stays, so that no pattern left
            // names a node the list dropped).
            let others: std::collections::HashSet<&str> = patterns
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .flat_map(|(_, p)| p.nodes.iter().map(String::as_str))
                .collect();
            let without: Vec<String> = keep.iter().filter(|n| others.contains(n.as_str())).cloned().collect();
            if without.len() == keep.len() {
                // Every node of it is another pattern's too: dropping it changes no run.
                patterns.remove(i);
                continue;
            }
            // A node whose reference output is beyond FP16's range from inputs within it is stored
            // as inf by any FP16 run: no trial without it (16 independent overflows of a decoder
            // cost 16 prune rounds of a new CUDA session each, 59 of the fix's 74.5 s on an H100).
            if patterns[i].nodes.iter().any(|n| search.beyond_range.contains(n)) {
                *untried += 1;
                i += 1;
                continue;
            }
            let trial = search.trial(&without, FixStage::Prune)?;
            if trial.1.status == Status::Pass {
                *keep = without;
                patterns.remove(i);
                *last = trial;
            } else {
                // The next trial differs least from the keep list that stands, not from this one.
                search.forget_last_run();
                i += 1;
            }
        }
        Ok(beside.map(|handle| {
            let (result, seconds) = handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (early_keep.clone(), result, seconds)
        }))
    })
}
