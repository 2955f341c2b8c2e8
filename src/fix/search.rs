//! The search: candidate runs with keep lists, one per sample, each compared and walked as bisect
//! compares and walks (the same [`Judging`]), the worst sample by bisect's order; and the rounds
//! that grow a keep list from the walk's breaks, or from a contiguous region where those are not
//! enough.

use std::collections::HashMap;

use anyhow::{bail, Result};
use layerwise_analysis::answers::AnswerCheck;
use layerwise_analysis::{is_weight_output, verdict_order, AnswerRecord, Comparison, Status, Verdict, WEIGHT_OUTPUT};
use layerwise_model::{GraphIndex, Selection, WeightRange};
use layerwise_report::{FixStage, KeptPattern, Round};
use layerwise_runtime::{Backend, Tensor};

use crate::keep::{HeldRun, KeepRunner, UnquantizedRunner};
use crate::pipeline::answers::{answers_hold, check_tensors, records, Judged as JudgedOutput};
use crate::pipeline::setup::Judging;
use crate::pipeline::with_deployed_outputs;
use crate::pipeline::Steps;

/// A candidate run's comparison and verdict.
pub(super) type Judged = (Comparison, Verdict);

/// One sample of the set the keep list must hold on: its inputs and the reference's tensors.
pub(super) struct Sample {
    pub name: String,
    pub feeds: Vec<(String, Tensor)>,
    pub reference: HashMap<String, Tensor>,
    /// The candidate's latest runs of this sample (an emulating candidate's): a run is computed
    /// from the one it changes least, re-running only what its keep list changes.
    pub runs: Vec<HeldRun<'static>>,
}

/// Candidate runs held per sample to compute the next from: two cover the search's steps (a
/// trial differs least from the last run, or from the one before it where that trial failed).
const HELD_RUNS: usize = 2;

/// How a keep list is run.
pub(super) enum Keeping<'a> {
    /// Kept in FP32: by the emulation itself, or on the model converted with the list in FP32.
    Float(KeepRunner<'a>),
    /// Left unquantized in a Q/DQ candidate's own model.
    Unquantized(UnquantizedRunner<'a>),
}

pub(super) struct Search<'a> {
    pub index: &'a GraphIndex,
    /// Every sample (one unless `--inputs DIR` or a list of samples is given); a keep list must
    /// bring every output within tolerance on each.
    pub samples: Vec<Sample>,
    /// The sample the last run judged by: the first with the largest output error.
    judged: usize,
    /// The tensors compared, in the order the walk reads them.
    order: Vec<String>,
    pub candidate: Box<dyn Backend>,
    pub keeping: Keeping<'a>,
    /// What bisect judges this candidate by: tolerances, walk rule and arithmetic.
    pub judging: Judging,
    /// FP16 weight ranges the walk names as causes (none for a quantized candidate).
    weights: Vec<WeightRange>,
    /// Candidate runs so far, one per keep list tried.
    pub runs: usize,
    /// Every keep list tried, with its verdict.
    pub rounds: Vec<Round>,
    /// Progress on stderr: one step per candidate run.
    pub steps: Steps,
    /// The candidate runs a model file on ONNX Runtime (a converted or Q/DQ file, not a typed
    /// evaluation): its outputs are judged as deployed, only they asked for, as bisect judges them
    /// ([`with_deployed_outputs`]).
    deployed: bool,
    /// Where the keep list is held to the answers (`--target answer`): a trial passes when they
    /// hold, whatever the element-wise errors of the outputs they judge.
    pub goal: Option<AnswerGoal>,
    /// The answers of the last trial over its samples (empty without judged outputs).
    pub answers: Vec<AnswerRecord>,
    /// Nodes kept because the reference leaves FP16's range there from inputs within it
    /// ([`range_exits`]): an FP16 run stores inf there, so the prune does not try without them.
    pub beyond_range: std::collections::HashSet<String>,
    /// Whether each sample's latest runs are kept to compute the next trial from
    /// ([`HELD_RUNS`] copies of every tensor per sample beside the reference's): only where they
    /// fit in half the memory left once the reference is held (three samples of 4, 4 and 3 text
    /// lines grew the process to 23.8 GB on a 24 GB machine, and the written model's check then
    /// failed for memory); otherwise each trial runs whole, one at a time.
    hold_runs: bool,
}

/// The outputs judged by their answers, and for `--target answer` the share of each one's cases
/// that must hold.
pub(super) struct AnswerGoal {
    pub judged: Vec<JudgedOutput>,
    /// `None`: the answers are reported, the keep list is held to the element-wise tolerance.
    pub share: Option<f64>,
}

/// One sample's answers, and whether its outputs not judged by answers are within tolerance.
pub(super) struct SampleAnswers {
    answers: Vec<(String, Result<AnswerCheck, String>)>,
    others_pass: bool,
}

impl AnswerGoal {
    /// Sample run `candidate` (whole tensors, outputs named as the model's) judged by its answers
    /// against `reference`; `comparison` gives the element-wise pass of the other outputs.
    pub(super) fn sample(
        &self,
        index: &GraphIndex,
        comparison: &Comparison,
        reference: &HashMap<String, Tensor>,
        candidate: &HashMap<String, Tensor>,
    ) -> SampleAnswers {
        let answers = check_tensors(&self.judged, reference, candidate);
        let judged: std::collections::HashSet<&str> = answers.iter().map(|(o, _)| o.as_str()).collect();
        let others_pass = index
            .outputs
            .iter()
            .filter(|o| !is_weight_output(index, o) && !judged.contains(o.as_str()))
            .all(|o| comparison.get(o).is_some_and(|r| r.pass));
        SampleAnswers { answers, others_pass }
    }

    /// Whether a sample fails the target on its own: an answer changed or not judged, or another
    /// output out of tolerance.
    fn fails(&self, sample: &SampleAnswers) -> bool {
        !sample.others_pass || sample.answers.iter().any(|(_, c)| !c.as_ref().is_ok_and(AnswerCheck::held))
    }

    /// Over the samples (name, answers): whether the target holds (always false where the keep
    /// list is held to the element-wise tolerance: the caller's status stands), and the record of
    /// each judged output.
    pub(super) fn over(&self, samples: &[(String, SampleAnswers)]) -> (bool, Vec<AnswerRecord>) {
        let views: Vec<(&str, &[(String, Result<AnswerCheck, String>)])> =
            samples.iter().map(|(n, s)| (n.as_str(), s.answers.as_slice())).collect();
        let records = records(&self.judged, &views, samples.len() > 1);
        let met =
            self.share.is_some_and(|share| answers_hold(&records, share)) && samples.iter().all(|(_, s)| s.others_pass);
        (met, records)
    }
}

impl<'a> Search<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        index: &'a GraphIndex,
        samples: Vec<Sample>,
        order: Vec<String>,
        candidate: Box<dyn Backend>,
        keeping: Keeping<'a>,
        judging: Judging,
        weights: Vec<WeightRange>,
        steps: Steps,
        deployed: bool,
    ) -> Search<'a> {
        let largest_sample = samples
            .iter()
            .map(|s| s.reference.values().map(|t| t.size_bytes() as u64).fold(0u64, u64::saturating_add))
            .max()
            .unwrap_or(0);
        // The held runs, and the trial's own run beside them.
        let held = largest_sample.saturating_mul((samples.len() * (HELD_RUNS + 1)) as u64);
        let hold_runs = layerwise_model::tensor::available_memory().is_none_or(|free| held <= free / 2);
        Search {
            index,
            samples,
            judged: 0,
            order,
            candidate,
            keeping,
            judging,
            weights,
            runs: 0,
            rounds: Vec::new(),
            steps,
            deployed,
            goal: None,
            answers: Vec::new(),
            beyond_range: Default::default(),
            hold_runs,
        }
    }

    /// Whether the keep list is held to the answers rather than the element-wise tolerance.
    pub(super) fn held_to_answers(&self) -> bool {
        self.goal.as_ref().is_some_and(|g| g.share.is_some())
    }

    /// Candidate runs with `keep` at reference precision, one per sample, recorded as a round of
    /// `stage`: the verdict of the sample whose outputs err most by bisect's order of samples
    /// ([`verdict_order`]; the earliest on ties), which passes only when every sample does.
    pub(super) fn trial(&mut self, keep: &[String], stage: FixStage) -> Result<Judged> {
        self.runs += 1;
        let how = match self.keeping {
            Keeping::Float(_) => format!("keeping {} in FP32", nodes(keep.len())),
            Keeping::Unquantized(_) => format!("leaving {} unquantized", nodes(keep.len())),
        };
        let mut worst: Option<(usize, bool, Judged)> = None;
        let mut per_sample = Vec::new();
        for k in 0..self.samples.len() {
            let label = match self.samples.len() {
                1 => format!("candidate run {} ({how})", self.runs),
                n => format!("candidate run {} ({how}), sample {} of {n} ({})", self.runs, k + 1, self.samples[k].name),
            };
            let Search { steps, keeping, candidate, samples, deployed, .. } = self;
            let (feeds, held) = (&samples[k].feeds, &samples[k].runs);
            let outputs_only = Selection::Names(Vec::new());
            let (run, as_deployed) = steps.run(&label, || match keeping {
                Keeping::Float(keeper) => {
                    if let Some(run) = keeper.run_all_from(candidate.as_mut(), keep, feeds, held)? {
                        return Ok((Ok(run), None));
                    }
                    let out = keeper.run(candidate.as_mut(), keep, feeds, &Selection::All)?;
                    let as_deployed = if *deployed {
                        Some(keeper.run(candidate.as_mut(), keep, feeds, &outputs_only)?.tensors)
                    } else {
                        None
                    };
                    Ok((Ok(HeldRun::whole(keeper, keep, out.tensors)), as_deployed))
                }
                Keeping::Unquantized(runner) => {
                    let out = runner.run(candidate.as_mut(), keep, feeds, &Selection::All)?.tensors;
                    let as_deployed = if *deployed {
                        Some(runner.run(candidate.as_mut(), keep, feeds, &outputs_only)?.tensors)
                    } else {
                        None
                    };
                    Ok((Err(out), as_deployed))
                }
            })?;
            // A run to compute the next from (kept FP32), or the tensors alone (left unquantized).
            let (judged, passes) = match run {
                Ok(run) => {
                    let judged = self.judge(k, run.tensor_map(), as_deployed.as_ref());
                    let outputs = as_deployed.as_ref().unwrap_or(run.tensor_map());
                    let passes = self.sample_passes(k, &judged.0, outputs, &mut per_sample);
                    if self.hold_runs && matches!(&self.keeping, Keeping::Float(keeper) if keeper.emulated()) {
                        let runs = &mut self.samples[k].runs;
                        runs.push(run);
                        if runs.len() > HELD_RUNS {
                            runs.remove(0);
                        }
                    }
                    (judged, passes)
                }
                Err(tensors) => {
                    let judged = self.judge(k, &tensors, as_deployed.as_ref());
                    let passes =
                        self.sample_passes(k, &judged.0, as_deployed.as_ref().unwrap_or(&tensors), &mut per_sample);
                    (judged, passes)
                }
            };
            // Held to the answers, a sample whose answer changed is worse than any that held (the
            // walk then reads a run where the target fails).
            let fails = self.held_to_answers() && !passes;
            let replaces = match &worst {
                None => true,
                Some((_, f, _)) if fails != *f => fails,
                Some((_, _, so_far)) => worse(&judged, so_far, self.index),
            };
            if replaces {
                worst = Some((k, fails, judged));
            }
        }
        let (k, _, mut judged) = worst.expect("at least one sample");
        // Element-wise, the worst sample's verdict stands (it passes only where every sample does).
        let (met, records) = self.target_over(&per_sample, judged.1.status == Status::Pass);
        self.answers = records;
        judged.1.status = if met { Status::Pass } else { Status::Diverged };
        self.judged = k;
        self.rounds.push(Round {
            stage,
            keep_fp32: keep.len(),
            status: judged.1.status,
            worst_output: judged.1.worst_output.clone(),
            first_divergent: judged.1.first_divergent.as_ref().map(|f| f.node.clone()),
        });
        Ok(judged)
    }

    /// Sample `k`'s run judged by the target, alone: its outputs `outputs` (named as the model's),
    /// compared element-wise as `comparison`. Held to the answers, whether they hold (and every
    /// other output passes); else whether every output passes. Where outputs are judged by their
    /// answers, the sample's answers go to `answers`, for [`Search::target_over`]. The trials, the
    /// typed check of the written file and a quantized file's check as deployed all judge by it.
    pub(super) fn sample_passes(
        &self,
        k: usize,
        comparison: &Comparison,
        outputs: &HashMap<String, Tensor>,
        answers: &mut Vec<(String, SampleAnswers)>,
    ) -> bool {
        let Some(goal) = &self.goal else { return comparison.outputs_pass(self.index) };
        let sample = goal.sample(self.index, comparison, &self.samples[k].reference, outputs);
        let passes = if goal.share.is_some() { !goal.fails(&sample) } else { comparison.outputs_pass(self.index) };
        answers.push((self.samples[k].name.clone(), sample));
        passes
    }

    /// The target over the samples whose answers [`Search::sample_passes`] gathered: held to the
    /// answers, whether they hold on the share asked; else `elementwise` (every sample within
    /// tolerance). With the answers' record of each judged output.
    pub(super) fn target_over(
        &self,
        answers: &[(String, SampleAnswers)],
        elementwise: bool,
    ) -> (bool, Vec<AnswerRecord>) {
        match &self.goal {
            Some(goal) => {
                let (met, records) = goal.over(answers);
                (if goal.share.is_some() { met } else { elementwise }, records)
            }
            None => (elementwise, Vec::new()),
        }
    }

    /// Drops the latest run of each sample from those held to compute the next from (a trial whose
    /// keep list was not taken), so that the run of the keep list that stands stays held however
    /// many trials fail after it.
    pub(super) fn forget_last_run(&mut self) {
        for sample in &mut self.samples {
            sample.runs.pop();
        }
    }

    /// The sample the last run judged by.
    pub(super) fn sample(&self) -> &Sample {
        &self.samples[self.judged]
    }

    /// The model outputs of `tensors` (a run of a written file, whose intermediate tensors have
    /// other names) against sample `k`'s reference.
    pub(super) fn compare_outputs(&self, k: usize, tensors: &HashMap<String, Tensor>) -> Comparison {
        self.judging.compare(self.index, &self.index.outputs, &self.samples[k].reference, tensors)
    }

    /// Sample `k`'s run `tensors` compared and walked; where the candidate runs a file on ONNX
    /// Runtime, its outputs judged by `deployed`, the run asking for them alone.
    fn judge(&self, k: usize, tensors: &HashMap<String, Tensor>, deployed: Option<&HashMap<String, Tensor>>) -> Judged {
        let mut comparison = self.judging.compare(self.index, &self.order, &self.samples[k].reference, tensors);
        if let Some(deployed) = deployed {
            let reference = &self.samples[k].reference;
            comparison =
                with_deployed_outputs(self.index, &self.order, &self.judging, comparison, reference, deployed).0;
        }
        let verdict = self.judging.walk(self.index, &mut comparison, &self.samples[k].feeds, &self.weights);
        (comparison, verdict)
    }
}

/// The first run, with nothing kept: a verdict on no output at all would say nothing, as in bisect.
pub(super) fn diagnose(search: &mut Search) -> Result<Judged> {
    let first = search.trial(&[], FixStage::Diagnose)?;
    // Held to answers that cannot be judged (a blank beyond the classes), no keep list could
    // ever meet the target: that is the task's fault, said as such, not a search that fails.
    if search.held_to_answers() {
        if let Some(a) = search.answers.iter().find(|a| a.not_judged.is_some()) {
            bail!(
                "fix --target answer: the answers of '{}' ({}) cannot be judged: {}",
                a.output,
                a.task,
                a.not_judged.as_deref().unwrap_or_default()
            );
        }
    }
    let index = search.index;
    if index.outputs.iter().all(|o| first.0.get(o).is_none()) {
        bail!(
            "no model output could be compared: {}",
            index
                .outputs
                .iter()
                .map(|o| format!(
                    "{o}: {}",
                    first.0.not_compared.iter().find(|(t, _)| t == o).map_or(
                        if is_weight_output(index, o) { WEIGHT_OUTPUT } else { "missing from a run" },
                        |(_, why)| why.as_str()
                    )
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(first)
}

/// "1 node", "3 nodes".
fn nodes(n: usize) -> String {
    format!("{n} node{}", if n == 1 { "" } else { "s" })
}

/// Whether a judged sample is worse than the worst so far, by bisect's order of samples
/// ([`verdict_order`]: a diverged one first, then the larger output error).
pub(super) fn worse(judged: &Judged, so_far: &Judged, index: &GraphIndex) -> bool {
    let key = |(c, v): &Judged| (v.status == Status::Diverged, c.largest_error(&index.outputs));
    verdict_order(key(judged), key(so_far)) == std::cmp::Ordering::Greater
}

/// The node (not yet kept, with a float output) on a blame chain with no first divergent layer
/// whose output error is the largest multiple, at least 2x, of its input's: where the drift meets
/// the most sensitive consumer. Keeping an integer op in FP32 would change nothing.
fn strongest_amplifier(comparison: &Comparison, verdict: &Verdict, keep: &[String]) -> Option<(String, String)> {
    let float_output = |tensor: &str| comparison.get(tensor).is_some_and(|r| r.ref_dtype.starts_with("float"));
    verdict
        .chain
        .windows(2)
        .filter(|w| {
            !keep.contains(&w[0].node) && float_output(&w[0].tensor) && w[1].error > 0.0 && w[0].error.is_finite()
        })
        .map(|w| (w[0].error / w[1].error, &w[0]))
        .filter(|(ratio, _)| *ratio >= 2.0)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(ratio, step)| {
            (
                step.node.clone(),
                format!(
                    "{} ({}): drift, and it is the chain's strongest amplifier ({ratio:.1}x)",
                    step.node, step.op_type
                ),
            )
        })
}

/// The nodes (not kept yet) where the reference leaves FP16's range from inputs within it: an FP16
/// candidate stores inf there whatever comes before, so each is an overflow of its own, which
/// this run may not show as one (inf from an earlier overflow already reaches it). Found from the
/// reference's values alone, all in one round: a model with many independent overflows needs one
/// round for them, not a round each (and more than `--max-rounds`). One kept without need is
/// dropped by the pruning.
fn range_exits(index: &GraphIndex, comparison: &Comparison, keep: &[String]) -> Vec<(String, String)> {
    // Float32 tensors are what an FP16 model stores in FP16 (a float64 one stays as it is).
    let beyond = |t: &str| comparison.get(t).filter(|r| r.metrics.ref_fp16_overflow > 0 && r.ref_dtype == "float32");
    index
        .nodes
        .iter()
        // A Constant's value beyond the range is a weight: its readers are kept (it follows them).
        .filter(|n| !keep.contains(&n.name) && n.op_type != "Constant")
        .filter(|n| n.inputs.iter().all(|t| t.is_empty() || index.is_constant_like(t) || beyond(t).is_none()))
        .filter_map(|n| {
            let (t, r) = n.outputs.iter().find_map(|t| Some((t, beyond(t)?)))?;
            // Computed inputs are within the range (the filter above); a weight may not be.
            let from = match n.inputs.iter().find(|w| !w.is_empty() && beyond(w).is_some()) {
                Some(w) => format!("from the weight '{w}', itself beyond FP16's range"),
                None => "from inputs within FP16's range".to_string(),
            };
            let why = format!("{} ({}): the reference reaches {} in '{t}' (beyond the FP16 maximum 65504) {from}: an FP16 run stores inf there", n.name, n.op_type, layerwise_report::format_number(r.metrics.ref_max_abs));
            Some((n.name.clone(), why))
        })
        .collect()
}

/// How the rounds that keep the walk's breaks ended, where they did not pass.
pub(super) enum BreaksKept {
    /// The last run passes, or the round limit was reached.
    Ran,
    /// Nothing more to keep: why.
    Stuck(String),
}

/// Rounds that each keep the breaks of the last run ([`Judging::keep_pattern`], as bisect's
/// counterfactual keeps them): the first divergent layer, every other node where inf/NaN are born
/// in that run (each a break of its own: fixing them one run at a time would cost a run each),
/// and for FP16 every node where the reference leaves FP16's range; with no first divergent layer
/// (drift), the chain's strongest amplifier. Until the outputs pass or `max_rounds` rounds ran.
pub(super) fn keep_the_breaks(
    search: &mut Search,
    keep: &mut Vec<String>,
    patterns: &mut Vec<KeptPattern>,
    last: &mut Judged,
    max_rounds: usize,
) -> Result<BreaksKept> {
    let index = search.index;
    let fp16 = search.judging.precision() == layerwise_runtime::Precision::Fp16;
    while last.1.status == Status::Diverged && search.rounds.len() <= max_rounds {
        let mut culprits = match (&last.1.first_divergent, strongest_amplifier(&last.0, &last.1, keep)) {
            (Some(fd), _) => vec![(fd.node.clone(), format!("{} ({}): {}", fd.node, fd.op_type, fd.cause.best.detail))],
            (None, Some((node, why))) => vec![(node, why)],
            (None, None) => {
                return Ok(BreaksKept::Stuck(format!(
                    "{}; no layer is left to keep in FP32",
                    last.1.summary.trim_end_matches('.')
                )))
            }
        };
        let first = culprits[0].0.clone();
        for n in last.1.non_finite.iter().filter(|n| n.origin && !n.weight && n.node != first) {
            culprits.push((n.node.clone(), format!("{} ({}) produces {} inf/NaN", n.node, n.op_type, n.mismatched)));
        }
        if fp16 {
            for exit in range_exits(index, &last.0, keep) {
                search.beyond_range.insert(exit.0.clone());
                if !culprits.iter().any(|(n, _)| *n == exit.0) {
                    culprits.push(exit);
                }
            }
        }
        let mut added = false;
        for (node, because) in culprits {
            let mut pattern = search.judging.keep_pattern(index, &node, &last.0, &last.1);
            // A Constant computes nothing and `convert` refuses it in a keep list: its value is
            // stored as the nodes reading it take it.
            pattern.nodes.retain(|n| index.node(n).is_none_or(|info| info.op_type != "Constant"));
            let new: Vec<String> = pattern.nodes.iter().filter(|n| !keep.contains(n)).cloned().collect();
            if new.is_empty() {
                continue;
            }
            keep.extend(new);
            patterns.push(KeptPattern { kind: pattern.kind.to_string(), nodes: pattern.nodes, because });
            added = true;
        }
        if !added {
            return Ok(BreaksKept::Stuck(format!("node '{first}' is already kept in FP32 and still diverges")));
        }
        *last = search.trial(keep, FixStage::Pattern)?;
    }
    Ok(BreaksKept::Ran)
}

/// Nodes that may be kept in FP32 (they compute a float tensor, from the inputs or from weights
/// alone, or an integer from a float; not Constants), in topological order, `keep` excluded.
fn keepable(index: &GraphIndex, sample: &Sample, keep: &[String]) -> Vec<String> {
    // The reference's tensors, and the model's inputs as fed (a Cast may read one directly).
    let float = |t: &String| {
        sample
            .reference
            .get(t)
            .or_else(|| sample.feeds.iter().find(|(n, _)| n == t).map(|(_, v)| v))
            .is_some_and(|t| t.dtype().is_float())
    };
    index
        .nodes
        .iter()
        .filter(|n| !keep.contains(&n.name))
        // Nodes computing from weights alone (a Slice or Concat of an LSTM's weights) count too:
        // left out, they round the weights their kept readers take (Silero VAD's every weight is a
        // Constant reshaped in its branch). A Constant's own precision follows its readers. A node
        // that computes an integer from a float (a Cast to int32, ArgMax) counts: kept, it reads
        // its input as float32 holds it.
        .filter(|n| {
            n.op_type != "Constant"
                && (n.outputs.iter().any(float)
                    || layerwise_analysis::may_compute_integer_from_float(&n.op_type)
                        && n.inputs.first().is_some_and(float))
        })
        .map(|n| n.name.clone())
        .collect()
}

/// The smallest contiguous region (topological order) whose nodes, kept in FP32 beside `keep`,
/// bring every output within tolerance: the start found by bisection, then the end, then chunks of
/// the region dropped where the outputs still pass. `None` when keeping every node does not pass.
pub(super) fn region_search(search: &mut Search, keep: &[String]) -> Result<Option<(Vec<String>, Judged)>> {
    let nodes = keepable(search.index, search.sample(), keep);
    let trial = |search: &mut Search, region: &[String], stage: FixStage| -> Result<(bool, Judged)> {
        let all: Vec<String> = keep.iter().chain(region).cloned().collect();
        let outcome = search.trial(&all, stage)?;
        Ok((outcome.1.status == Status::Pass, outcome))
    };
    let (pass, mut best) = trial(search, &nodes, FixStage::Region)?;
    if !pass {
        return Ok(None);
    }
    // Start: the latest `lo` for which nodes[lo..] still fixes it (nodes[n..] = keep alone fails).
    let (mut ok, mut bad) = (0, nodes.len());
    while bad - ok > 1 {
        let mid = (ok + bad) / 2;
        let (pass, outcome) = trial(search, &nodes[mid..], FixStage::Region)?;
        if pass {
            ok = mid;
            best = outcome;
        } else {
            bad = mid;
        }
    }
    let lo = ok;
    // End: the earliest `hi` for which nodes[lo..hi] still fixes it.
    let (mut ok, mut bad) = (nodes.len(), lo);
    while ok - bad > 1 {
        let mid = (ok + bad) / 2;
        let (pass, outcome) = trial(search, &nodes[lo..mid], FixStage::Region)?;
        if pass {
            ok = mid;
            best = outcome;
        } else {
            bad = mid;
        }
    }
    let mut region: Vec<String> = nodes[lo..ok].to_vec();
    // Prune: drop eighths of the region that are not needed.
    let chunk = region.len().div_ceil(8).max(1);
    let mut start = 0;
    while start < region.len() && region.len() > 1 {
        let end = (start + chunk).min(region.len());
        let without: Vec<String> = region[..start].iter().chain(&region[end..]).cloned().collect();
        let (pass, outcome) = trial(search, &without, FixStage::Prune)?;
        if pass {
            region = without;
            best = outcome;
        } else {
            start = end;
        }
    }
    Ok(Some((region, best)))
}
