//! What bisect finds beyond the walk: how the candidate runs were marked, which chain nodes
//! introduce error and which only pass it on, what keeping each break at reference precision does
//! to the outputs, memory splitting, and many-sample aggregation. All optional parts of a report.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::num::FiniteOrString;
use crate::search::SearchResult;

/// The optional sections of a report, filled by the pipeline.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct Extras {
    /// `--mark search`: the candidate runs made and what each marked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counterfactual: Option<Counterfactual>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryPlan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<Samples>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_floor: Option<NoiseFloor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantizers_alone: Option<QuantizersAlone>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_flow: Option<ControlFlow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matching: Option<TensorMatching>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repro: Option<Repro>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// `--task` (or an output recognised as a classifier): did the answer change, per output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<AnswerRecord>,
    /// Model Explorer's node id for each node whose layerwise name differs from it (unnamed and
    /// duplicate names, nodes inside If branches); `--model-explorer` keys its data by these.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub explorer_ids: std::collections::BTreeMap<String, String>,
}

/// One output judged in the model's own terms (`crate::answers`) over the samples compared.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct AnswerRecord {
    pub output: String,
    /// classify, ctc, mask, embedding or detect.
    pub task: String,
    /// Why this task: given with `--task`, or what recognised it.
    pub because: String,
    /// Samples whose answers were compared.
    pub samples: usize,
    /// Cases judged over those samples (a batch's items, sequences, images).
    pub cases: usize,
    /// Cases whose answer changed.
    pub changed_cases: usize,
    /// The samples with a changed answer, by name.
    pub changed_samples: Vec<String>,
    /// What changed and by how much: the first sample with a change, else the first sample.
    pub detail: String,
    /// Why the answers could not be compared (then the counts are 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_judged: Option<String>,
}

impl AnswerRecord {
    /// One line for the verdict: what the answer did, in the model's own terms.
    pub fn line(&self) -> String {
        let head = format!("answer of '{}' ({}, {})", self.output, self.task, self.because);
        if let Some(why) = &self.not_judged {
            return format!("{head}: not judged: {why}");
        }
        if self.samples <= 1 {
            let held = if self.changed_cases == 0 { "held" } else { "CHANGED" };
            return format!("{head}: {held}: {}", self.detail);
        }
        if self.changed_cases == 0 {
            return format!("{head}: held on all {} samples ({} cases); {}", self.samples, self.cases, self.detail);
        }
        let named = match self.changed_samples.len() {
            0 => String::new(),
            n if n <= 5 => format!(" ({})", self.changed_samples.join(", ")),
            n => format!(" ({}, and {} more)", self.changed_samples[..5].join(", "), n - 5),
        };
        format!(
            "{head}: CHANGED on {} of {} samples{named}, {} of {} cases; {}",
            self.changed_samples.len(),
            self.samples,
            self.changed_cases,
            self.cases,
            self.detail
        )
    }
}

/// `--repro DIR`: the first divergent layer as a standalone model with its data.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Repro {
    /// Where it was written; `null` when none was (`note` says why).
    pub folder: Option<String>,
    /// The nodes in the repro model: the first divergent node, and upstream nodes when it alone
    /// did not show the error.
    pub nodes: Vec<String>,
    /// The candidate's output of the node is out of tolerance in the repro too.
    pub reproduces: bool,
    /// Relative L2 error of that output in the repro.
    #[serde(default, with = "crate::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub candidate_error: Option<f64>,
    pub note: String,
}

/// How the candidate model's tensors were paired with the reference's (`--cand-model`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct TensorMatching {
    /// `name` (names only) or `auto` (names first, structure for the rest).
    pub mode: String,
    pub by_name: usize,
    pub by_structure: usize,
    /// [reference tensor, candidate tensor] for every pair made by structure.
    pub structure_pairs: Vec<(String, String)>,
    /// Reference tensors with no candidate counterpart (not compared).
    pub unmatched_reference: Vec<String>,
    /// Candidate tensors paired with nothing (its own Casts and the like included).
    pub unmatched_candidate: Vec<String>,
}

/// If/Loop nodes replaced by what the reference ran (the branch taken, the iterations made), so
/// their bodies' tensors are compared as `Node/then/tensor`, `Node/iter3/tensor`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct ControlFlow {
    pub inlined: Vec<InlinedNode>,
    /// Control-flow nodes left as they are, with why: their bodies' tensors are not compared.
    pub kept: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct InlinedNode {
    pub node: String,
    pub op_type: String,
    /// `then_branch`, `else_branch` or `N iterations`.
    pub taken: String,
    /// Nodes that replaced it.
    pub nodes: usize,
    /// What a `--cand-model` with this node took instead, flattened by its own run, where that
    /// differs: the two sides computed different branches (or iteration counts) here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_taken: Option<String>,
}

/// How sensitive the model's worst output is to the candidate's own rounding of the weights: the
/// float32 reference re-run with each weight the candidate's precision changes moved by up to its
/// own rounding error there (FP16, BF16: every stored weight; TF32: those the tensor cores read;
/// float32: every weight by one float32 unit roundoff), seeded. When the candidate's error is within
/// a small factor of it, no layer is at fault: the output is ill-conditioned for these inputs.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NoiseFloor {
    /// What was perturbed, in words.
    pub perturbation: String,
    /// The same, short, for sentences: "one FP16 rounding of every weight".
    pub rounds: String,
    /// Weight values moved, and values left as they were because the candidate's precision does
    /// not change them (exact in FP16 or BF16, or not read by a tensor core).
    pub moved_values: usize,
    pub exact_values: usize,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub relative: f64,
    pub seeds: Vec<u64>,
    pub output: String,
    /// The output's relative L2 error under the perturbation, the largest over the seeds.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_error: f64,
    /// The candidate's relative L2 error on the same output.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub candidate_error: f64,
    /// candidate_error / output_error.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub ratio: f64,
    /// The candidate's error is within a small factor of the noise floor (`ILL_CONDITIONED_FACTOR`,
    /// 3 times): the output is ill-conditioned for these inputs, no layer is at fault.
    pub ill_conditioned: bool,
    /// Weights left exact because only the first divergent layer's keep pattern reads them:
    /// keeping that layer at reference precision keeps them exact too, so their rounding is part
    /// of what its fix removes, not of the floor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_for_the_fix: Vec<String>,
}

/// A Q/DQ candidate's activation quantizers measured one at a time: the reference model
/// with one quantizer's rounding and clipping and nothing else (float32 between, weights float), all
/// in one ONNX Runtime CPU session switched by a fed input, against the same model with none on.
/// A quantizer that alone gives most of what they give together is at fault, whatever the noise
/// floor says of their joint resolution.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct QuantizersAlone {
    /// The output measured: the verdict's worst.
    pub output: String,
    /// Its relative L2 error with every measured quantizer on at once.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub together: f64,
    /// The candidate's relative L2 error on the same output, for scale.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub candidate_error: f64,
    /// The error alone from which a quantizer is at fault (with at least half of `together`):
    /// the walk's least break for the candidate's format (INT8: 5e-2), so that a quantizer whose
    /// rounding alone stays within what one node may add is never called a fault.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub fault_threshold: f64,
    /// The output's relative L2 error with every weight quantizer on and every activation
    /// quantizer off (the candidate with its activation pairs taken out, float32 arithmetic):
    /// what no activation quantizer left out removes. `None` where it could not run.
    #[serde(default, with = "crate::num::option_finite", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub weights_together: Option<f64>,
    /// Each measured quantizer alone, the largest error first.
    pub each: Vec<QuantizerAlone>,
    /// The output's relative L2 error with every quantizer at fault left out together and every
    /// other quantizer on: what leaving all of them out removes, measured (their shares, each
    /// measured with the others on, overlap). `None` with fewer than two at fault, or where not
    /// every quantizer was switched.
    #[serde(default, with = "crate::num::option_finite", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub at_fault_left_out: Option<f64>,
    /// Quantizers not measured, with the reason (float8, no reference tensor by that value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_measured: Vec<(String, String)>,
}

/// One activation quantizer alone on the reference.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct QuantizerAlone {
    /// The candidate's QuantizeLinear node.
    pub node: String,
    /// The reference tensor it quantizes.
    pub tensor: String,
    /// The reference tensor its DequantizeLinear's output holds, where that is another one (a
    /// Relu the quantizer took over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<String>,
    /// The output's relative L2 error with this quantizer alone.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub error: f64,
    /// The output's relative L2 error with every other measured quantizer on and this one off
    /// (left out): a quantizer whose error others amplify (a clipped input that later
    /// quantizers round further) gives little alone and much of `together`. `None` where not
    /// every quantizer was switched.
    #[serde(default, with = "crate::num::option_finite", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub without: Option<f64>,
}

impl QuantizerAlone {
    /// What leaving this quantizer out takes from `together` (0 where not measured).
    pub fn removed_from(&self, together: f64) -> f64 {
        self.without.filter(|w| w.is_finite()).map_or(0.0, |w| (together - w).max(0.0))
    }
}

impl QuantizersAlone {
    /// The quantizers at fault: each alone gives at least half of what all give together, or
    /// leaving it out removes at least half of that; and in either case at least
    /// `fault_threshold`.
    pub fn at_fault(&self) -> impl Iterator<Item = &QuantizerAlone> {
        self.each.iter().filter(|q| {
            self.together > 0.0
                && ((q.error >= 0.5 * self.together && q.error >= self.fault_threshold)
                    || (q.removed_from(self.together) >= 0.5 * self.together
                        && q.removed_from(self.together) >= self.fault_threshold))
        })
    }
}

/// A candidate error at most this many times the noise floor is the model's sensitivity, not a layer.
pub const ILL_CONDITIONED_FACTOR: f64 = 3.0;

/// Local error of the blame chain's nodes: each node run alone on the candidate with the
/// reference's values as its inputs.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Isolation {
    pub nodes: Vec<LocalError>,
    /// The chain node that introduces the most error by itself (largest local error, earliest on
    /// ties), if any introduces error at all.
    pub introducing: Option<String>,
    /// Chain nodes that could not be run alone, with the reason.
    pub skipped: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct LocalError {
    pub node: String,
    pub op_type: String,
    pub tensor: String,
    /// Relative L2 error of the node run alone on exact inputs.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub local_error: f64,
    /// Relative L2 error of the same tensor inside the full candidate run.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub in_model_error: f64,
    /// `introduces` (large local error), `propagates` (small local error: the error comes from
    /// its inputs), or `loses` (the first divergent node of a storage loss, whose relative error
    /// is tiny by nature: run alone it loses what it loses in the model, in absolute terms).
    pub role: String,
    /// Why the local error does not count, where it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Each break re-run with its node (or the recognised pattern around it) kept at reference
/// precision, and what that does to the worst output's error.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Counterfactual {
    /// The output whose error is measured.
    pub output: String,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_error: f64,
    pub checks: Vec<KeepCheck>,
    /// One paragraph for people: which break explains the output error, or that none does.
    pub conclusion: String,
    /// The output has another shape in the candidate (a length computed from values it computes
    /// differently): its error is not finite for that reason, not for inf/NaN.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shape_differs: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct KeepCheck {
    /// The break checked (a node name).
    pub node: String,
    /// Why it was checked: `first_divergent`, `break`, `non_finite_origin`, `introducing`.
    pub reason: String,
    /// The pattern kept at reference precision, and its nodes.
    pub pattern: String,
    pub kept: Vec<String>,
    /// The worst output's error with the pattern kept.
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub output_error_after: f64,
    /// Share of the output error that disappears (1 = all of it, 0 = none).
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub explained: f64,
    /// Every output within tolerance with this pattern kept.
    pub fixes: bool,
    /// The output error does not change: the break is contained (its error does not reach the output).
    pub contained: bool,
    /// Where only the part of the converted model that the keep list changes was re-run (fed the
    /// candidate's own values at its border): how many of its nodes ran. Absent where the whole
    /// model ran, or where an emulation kept the nodes itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_rerun: Option<usize>,
}

impl KeepCheck {
    /// What keeping the pattern does to the output whose error was `before` (`output` names it;
    /// else "the output"), in words: a share of a finite error; where the error was inf/NaN and is
    /// finite after, no share (no part of an infinite error measures what is left) but what is left.
    pub fn effect(&self, before: f64, output: Option<&str>, shape_differs: bool) -> String {
        let (error, it) = match output {
            Some(o) => (format!("the error of '{o}'"), format!("'{o}'")),
            None => ("the output error".to_string(), "the output".to_string()),
        };
        if shape_differs && !self.output_error_after.is_finite() {
            format!("leaves {it} with another shape than the reference's")
        } else if shape_differs {
            format!("gives {it} the reference's shape, leaving rel L2 {:.2e}", self.output_error_after)
        } else if before.is_finite() && self.output_error_after > 1.01 * before {
            // Kept at reference precision yet worse: no share of the error is removed.
            format!("makes {error} larger: rel L2 {before:.2e} -> {:.2e}", self.output_error_after)
        } else if self.contained && (!before.is_finite() || (self.output_error_after - before).abs() <= 0.01 * before) {
            format!("contained: {error} does not change")
        } else if self.contained {
            format!(
                "contained: {error} changes by less than 10% (rel L2 {before:.2e} -> {:.2e})",
                self.output_error_after
            )
        } else if !before.is_finite() && self.output_error_after.is_finite() {
            format!("clears the inf/NaN of {it}, leaving rel L2 {:.2e}", self.output_error_after)
        } else {
            format!("removes {:.0}% of {error}", 100.0 * self.explained)
        }
    }

    /// Share of `before` that disappears when the error becomes `after` (inf counts as the whole).
    pub fn explained_share(before: f64, after: f64) -> f64 {
        match (before.is_finite(), after.is_finite()) {
            (false, true) => 1.0,
            (false, false) => 0.0,
            _ if before <= 0.0 => 0.0,
            _ => ((before - after) / before).clamp(0.0, 1.0),
        }
    }
}

/// The memory plan of the exposed tensors, and how they were split to stay within `--max-memory`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MemoryPlan {
    /// The budget, when it decided something: a split, or a `--max-memory` the user gave (the
    /// default depends on the machine's free memory, which a report does not depend on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_bytes: Option<u64>,
    /// Estimated bytes of every exposed tensor of one run.
    pub estimated_bytes: u64,
    /// Runs per side (1 = no split); each group's tensors are compared and dropped before the next.
    pub groups: usize,
    pub largest_group_bytes: u64,
    /// Where the tensor sizes came from: shape inference, and a shapes-only reference run for
    /// dimensions that depend on the data.
    pub shapes_from: String,
    pub comparison: ComparisonMode,
    /// Why the tensors were compared after separate runs (`separate`), e.g. a GPU candidate
    /// against a CPU reference, or `--save-tensors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub separate_because: Option<String>,
}

/// How a run compared its tensors (the report's `memory.comparison`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ComparisonMode {
    /// Both sides ran as one ONNX Runtime session that reduced each pair of tensors to its
    /// metrics where it was computed, so only the live tensors were ever held and
    /// `estimated_bytes` is the measured size of one side's tensors.
    Paired,
    /// Each side's run returned its tensors, compared afterwards.
    Separate,
    /// Both sides ran on one GPU and each pair was reduced there, only the totals returned
    /// (`estimated_bytes`: one side's tensors).
    Device,
}

/// `--inputs DIR`: one run per sample, metrics aggregated per tensor.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Samples {
    pub count: usize,
    /// Per sample: its file, its worst output error and the first divergent node it leads to.
    pub runs: Vec<SampleRun>,
    /// The sample whose worst output error is largest: the verdict and chain come from it.
    pub worst_sample: String,
    /// Per tensor: mean relative L2 error over samples, and the sample with the largest error.
    pub tensors: Vec<SampleStats>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, JsonSchema)]
pub struct SampleRun {
    pub sample: String,
    pub status: crate::Status,
    #[serde(serialize_with = "crate::num::finite_or_string", deserialize_with = "crate::num::finite_or_string_de")]
    #[schemars(with = "FiniteOrString")]
    pub worst_output_error: f64,
    pub first_divergent: Option<String>,
    /// How many of the sample's input values are NaN or inf, where any are: they reach both sides,
    /// where matching inf/NaN are not counted as errors, so its results speak only of the finite
    /// values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonfinite_inputs: Option<u64>,
}

/// One sample's results, all that aggregating over samples needs: each tensor's error level
/// (`null` where it was not compared) and whether it failed, in the job's tensor order.
#[derive(Debug, Clone, Serialize, serde::Deserialize, JsonSchema)]
pub struct SampleData {
    pub run: SampleRun,
    /// The worst error level over the model's outputs: among the diverged samples (or, where none
    /// diverged, all), the one with the largest carries the verdict.
    #[serde(serialize_with = "crate::num::finite_or_string", deserialize_with = "crate::num::finite_or_string_de")]
    #[schemars(with = "FiniteOrString")]
    pub selection_error: f64,
    #[serde(
        serialize_with = "crate::num::vec_option_finite_or_string",
        deserialize_with = "crate::num::vec_option_finite_or_string_de"
    )]
    #[schemars(with = "Vec<Option<FiniteOrString>>")]
    pub errors: Vec<Option<f64>>,
    pub failing: Vec<bool>,
}

/// `bisect --inputs DIR --shard I/N`: this run's share of the samples, for `layerwise merge`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, JsonSchema)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
    /// Samples in the folder, all shards together.
    pub total_samples: usize,
    /// The tensors each sample's `errors` and `failing` follow, in this order.
    pub order: Vec<String>,
    pub samples: Vec<SampleData>,
    /// SHA-256 of every sample's file name and size in the folder, all shards together: `merge`
    /// refuses shards of different folders (absent in partial reports of builds before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_digest: Option<String>,
}

/// The sample that carries the verdict: a diverged one before any that passes (a sample can fail
/// its per-element tolerance with a smaller relative L2 than one that passes, and the verdict
/// then said pass over a diverged sample), then the largest selection error, the earliest on ties.
pub fn chosen_sample(samples: &[SampleData]) -> Option<usize> {
    let key = |k: usize| (samples[k].run.status == crate::Status::Diverged, samples[k].selection_error);
    (0..samples.len()).max_by(|&a, &b| verdict_order(key(a), key(b)).then(b.cmp(&a)))
}

/// The one order of samples for carrying a verdict, bisect's and `fix`'s: (diverged, error) of
/// one against another's, a diverged sample first, then the larger error (NaN above inf).
pub fn verdict_order(a: (bool, f64), b: (bool, f64)) -> std::cmp::Ordering {
    a.0.cmp(&b.0).then(a.1.total_cmp(&b.1))
}

/// Per-tensor worst and mean error over samples (in their order); the verdict's sample is `chosen`.
pub fn aggregate_samples(samples: &[SampleData], chosen: usize, order: &[String]) -> Samples {
    let mut tensors = Vec::new();
    for (k, t) in order.iter().enumerate() {
        let mut sum = 0.0;
        let mut count = 0usize;
        let mut worst: Option<(f64, &str)> = None;
        let mut failing = 0;
        for s in samples {
            let Some(e) = s.errors.get(k).copied().flatten() else { continue };
            sum += e;
            count += 1;
            failing += s.failing.get(k).copied().unwrap_or(false) as usize;
            if worst.is_none_or(|(w, _)| e > w) {
                worst = Some((e, s.run.sample.as_str()));
            }
        }
        if let Some((worst_error, worst_sample)) = worst {
            tensors.push(SampleStats {
                tensor: t.clone(),
                mean_error: sum / count as f64,
                worst_error,
                worst_sample: worst_sample.to_string(),
                failing_samples: failing,
            });
        }
    }
    Samples {
        count: samples.len(),
        runs: samples.iter().map(|s| s.run.clone()).collect(),
        worst_sample: samples[chosen].run.sample.clone(),
        tensors,
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SampleStats {
    pub tensor: String,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub mean_error: f64,
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub worst_error: f64,
    pub worst_sample: String,
    /// Samples in which the tensor is out of tolerance.
    pub failing_samples: usize,
}

impl NoiseFloor {
    /// The candidate's error as a multiple of the floor: 0.86 reads as "0.86x" (1/1 would say
    /// they are equal), 0.1 as "1/10", 2.3 as "2.3x".
    pub fn ratio_words(&self) -> String {
        let ratio = self.ratio;
        if ratio >= 1.0 {
            format!("{ratio:.1}x")
        } else if ratio >= 0.5 {
            format!("{ratio:.2}x")
        } else {
            format!("1/{:.0}", 1.0 / ratio)
        }
    }
}

#[cfg(test)]
mod quantizers_at_fault {
    use super::*;

    fn quantizer(node: &str, error: f64, without: Option<f64>) -> QuantizerAlone {
        QuantizerAlone { node: node.into(), tensor: node.into(), holds: None, error, without }
    }

    /// PP-OCR's direction classifier with one scale shrunk 16x: 9.1e-2 alone (15% of the 6.1e-1
    /// together) and 5.0e-2 with it left out: at fault by what leaving it out removes.
    #[test]
    fn a_quantizer_whose_leaving_out_removes_half_is_at_fault_though_small_alone() {
        let found = QuantizersAlone {
            at_fault_left_out: None,
            output: "y".into(),
            together: 0.614,
            candidate_error: 0.367,
            fault_threshold: 0.05,
            weights_together: None,
            each: vec![
                quantizer("clipping", 0.0912, Some(0.0497)),
                quantizer("small", 0.0065, Some(0.60)),
                quantizer("unmeasured_left_out", 0.02, None),
            ],
            not_measured: Vec::new(),
        };
        let at_fault: Vec<&str> = found.at_fault().map(|q| q.node.as_str()).collect();
        assert_eq!(at_fault, ["clipping"]);
        assert!((found.each[0].removed_from(found.together) - 0.5643).abs() < 1e-9);
        assert_eq!(found.each[2].removed_from(found.together), 0.0);
    }
}

#[cfg(test)]
mod keep_check_words {
    use super::KeepCheck;

    fn check(after: f64, before: f64) -> KeepCheck {
        let explained = KeepCheck::explained_share(before, after);
        KeepCheck {
            node: "n".into(),
            reason: "break".into(),
            pattern: "node".into(),
            kept: vec!["n".into()],
            output_error_after: after,
            explained,
            fixes: false,
            contained: explained < 0.1,
            nodes_rerun: None,
        }
    }

    /// Found by the third independent tester (a DistilBERT tagger quantized with Q/DQ): "contained:
    /// the output error does not change" where keeping the node took it from 2.64e-1 to 2.91e-1.
    #[test]
    fn a_check_that_makes_the_error_larger_says_so() {
        assert_eq!(
            check(2.91e-1, 2.64e-1).effect(2.64e-1, Some("logits"), false),
            "makes the error of 'logits' larger: rel L2 2.64e-1 -> 2.91e-1"
        );
        assert_eq!(check(2.64e-1, 2.64e-1).effect(2.64e-1, None, false), "contained: the output error does not change");
        assert_eq!(
            check(2.5e-1, 2.64e-1).effect(2.64e-1, None, false),
            "contained: the output error changes by less than 10% (rel L2 2.64e-1 -> 2.50e-1)"
        );
        assert_eq!(
            check(f64::INFINITY, f64::INFINITY).effect(f64::INFINITY, None, false),
            "contained: the output error does not change"
        );
    }
}
