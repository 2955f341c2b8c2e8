//! Comparing every tensor in one ONNX Runtime session: both sides computed side by side, each pair
//! reduced to its metrics where it is computed (layerwise_runtime::paired), nothing else returned.

use std::sync::Arc;

use anyhow::Result;
use layerwise_analysis::{compare_all, MemoryPlan, PairedComparison};
use layerwise_model::Selection;
use layerwise_runtime::paired::{PairedSession, Programs};
use layerwise_runtime::{RunRequest, Tensor};

use super::compare::{Compared, Job};
use super::steps::Steps;

impl Job<'_> {
    /// Compares one sample with both sides in one session, when both run on ONNX Runtime with the
    /// same provider and nothing needs the tensors themselves (`--save-tensors`, a separate
    /// candidate model whose names differ). `None` where that does not apply or pairing failed
    /// (the reason goes to `self.pairing_note`); the caller then runs the sides separately.
    pub(super) fn compare_paired(&mut self, feeds: &[(String, Tensor)], steps: &mut Steps) -> Result<Option<Compared>> {
        if self.separate_because.is_some() {
            return Ok(None);
        }
        if let Some(why) = self.pairing_refusal() {
            self.separate_because = Some(why);
            return Ok(None);
        }
        let request =
            RunRequest { model: self.model, index: &self.index, inputs: feeds, selection: &self.options.selection };
        // The candidate model's program exposes its own names for the reference's tensors.
        let cand_selection = self.candidate_selection(&self.options.selection);
        let cand_request = match &self.cand_model {
            Some((cm, ci)) => RunRequest { model: cm, index: ci, inputs: feeds, selection: &cand_selection },
            None => {
                RunRequest { model: self.model, index: &self.index, inputs: feeds, selection: &self.options.selection }
            }
        };
        let comparison = Arc::new(
            PairedComparison::new(self.judging.tolerances.clone(), &self.index.outputs)
                .keeping_values_of(self.judged.iter().map(|j| j.output.clone())),
        );
        let reducer = comparison.clone();
        let label = format!("running {} and {} paired", self.options.reference, self.options.candidate);
        // Samples of the same shapes run in the session the first one built.
        let shapes: Vec<Vec<usize>> = feeds.iter().map(|(_, t)| t.shape.clone()).collect();
        if self.paired_session.as_ref().is_some_and(|(s, _)| *s != shapes) {
            self.paired_session = None;
        }
        let (reference, candidate, order, cache) =
            (&mut self.reference, &mut self.candidate, &self.order, &mut self.paired_session);
        let keep_sessions = self.keep_paired_sessions;
        let candidate_names = &self.cand_names;
        let run = steps.run(&label, || {
            if cache.is_none() {
                layerwise_runtime::timing_mark(|| "paired: programs".into());
                let (Some(r), Some(c)) = (reference.onnx_program(&request), candidate.onnx_program(&cand_request))
                else {
                    return Ok(None);
                };
                layerwise_runtime::timing_mark(|| "paired: programs done".into());
                let programs = Programs {
                    model: request.model,
                    candidate_model: cand_request.model,
                    reference: r?,
                    candidate: c?,
                    candidate_names,
                };
                let named: Vec<(String, Vec<usize>)> =
                    feeds.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
                *cache = Some((shapes, PairedSession::build(programs, order, &named, keep_sessions)?));
            }
            layerwise_runtime::timing_mark(|| "paired: session built".into());
            let (_, session) = cache.as_mut().expect("built just above");
            let run = session.run(feeds, reducer)?;
            layerwise_runtime::timing_mark(|| "paired: session ran".into());
            Ok(Some(run))
        });
        let run = match run {
            Ok(Some(run)) => run,
            Ok(None) => {
                self.separate_because = Some("a side gives ONNX Runtime no program to pair".into());
                return Ok(None);
            }
            Err(e) if super::options::stopped_for_memory(&e) => return Err(e),
            Err(e) => {
                self.paired_session = None;
                // A graph the pairing cannot take (disagreeing opsets) is compared the usual way,
                // and the report says why.
                self.separate_because = Some(format!("the paired session could not run: {e:#}"));
                return Ok(None);
            }
        };
        layerwise_runtime::timing_mark(|| "paired: step done".into());
        let bytes = comparison.reference_bytes();
        let comparison_values = comparison.take_kept();
        let (mut comparison, histograms) = steps
            .run("collecting the comparison", || Ok(comparison.finish(&self.index, &self.order, &run.unavailable)))?;
        // The model outputs no node computes are not in the session's order: an input passed
        // straight through is compared on the values both sides were fed, a weight is said not
        // compared, as after separate runs.
        let mut rest: Vec<String> = Vec::new();
        for o in self.index.outputs.iter().filter(|o| !self.order.contains(o)) {
            if !rest.contains(o) {
                rest.push(o.clone());
            }
        }
        if !rest.is_empty() {
            let (reference, candidate) = self.passed_through_values(feeds).unwrap_or_default();
            let extra = compare_all(&self.index, &rest, &reference, &candidate, &self.judging.tolerances);
            let records = comparison.records.into_iter().chain(extra.records).collect();
            let not_compared = comparison.not_compared.into_iter().chain(extra.not_compared).collect();
            comparison = layerwise_analysis::Comparison::from_records(records, not_compared, &self.order);
        }
        let memory = MemoryPlan {
            budget_bytes: self.options.max_memory,
            estimated_bytes: bytes,
            groups: 1,
            largest_group_bytes: 0,
            shapes_from: "the paired run".to_string(),
            comparison: layerwise_analysis::ComparisonMode::Paired,
            separate_because: None,
        };
        let mut ref_notes = run.ref_notes;
        ref_notes.push(match run.segments {
            0 | 1 => format!(
                "compared in one ONNX Runtime session with the candidate ({} nodes): each of {} tensor pairs reduced to its metrics where computed, no tensor returned",
                run.nodes,
                run.paired.len()
            ),
            n => format!(
                "compared in {n} ONNX Runtime sessions with the candidate ({} nodes split into {n} segments, each fed at its border with the values the segments before it computed): each of {} tensor pairs reduced to its metrics where computed, no tensor returned",
                run.nodes,
                run.paired.len()
            ),
        });
        layerwise_runtime::timing_mark(|| "paired: collected".into());
        Ok(Some(Compared {
            comparison,
            tensors: None,
            histograms,
            notes: (ref_notes, run.cand_notes),
            unavailable: run.unavailable,
            engine_layers: Vec::new(),
            memory: Some(memory),
            deployed_differs: Vec::new(),
            output_values: comparison_values,
            answers: Vec::new(),
        }))
    }

    /// Why this job cannot pair its sides, where that is known before trying: what needs the
    /// tensors themselves, and sides that are not one ONNX Runtime session's.
    fn pairing_refusal(&self) -> Option<String> {
        let (reference, candidate) = (&self.options.reference, &self.options.candidate);
        if self.options.separate_runs {
            return Some("--separate-runs asks for it".into());
        }
        if self.options.save_tensors.is_some() {
            return Some("--save-tensors writes every tensor, so both runs return them".into());
        }
        if self.passed_through_values(&[]).is_none() {
            return Some("the candidate model computes an output that the reference passes straight from its input, so the candidate's run must return it".into());
        }
        let (r, c) = (self.reference.ort_options(), self.candidate.ort_options());
        match (r, c) {
            (None, _) => Some(format!("the reference {reference} does not run on ONNX Runtime")),
            (_, None) if self.cand_model.as_ref().is_some_and(|(m, _)| super::setup::typed_candidate(candidate, m).is_some()) => Some(format!(
                "the candidate model is evaluated in its own types by layerwise ({candidate}), not by ONNX Runtime, whose CPU provider computes FP16 and BF16 in float32"
            )),
            (_, None) => Some(format!("the candidate {candidate} does not run on ONNX Runtime")),
            (Some(r), Some(c)) if r.ep != c.ep => Some(format!("{reference} and {candidate} run on different execution providers, and one session has one")),
            (Some(r), Some(c)) if r.threads != c.threads => Some(format!("{reference} and {candidate} ask for different thread counts, and one session has one")),
            _ => {
                // ONNX Runtime's CPU provider computes most FP16/BF16 ops in float32 through Casts it
                // inserts around them; in the paired graph it computed such tensors differently from a
                // plain run of the same program (an FP16-island model: 145 of 320 tensors), so the
                // reference would not be what a plain run computes.
                let reduced = |m: &layerwise_model::Model| layerwise_runtime::typed::has_reduced_precision(m);
                if reduced(self.model) || self.cand_model.as_ref().is_some_and(|(m, _)| reduced(m)) {
                    return Some("the model holds FP16/BF16 tensors, which ONNX Runtime computes through Casts it inserts, and a paired session computed them differently from a plain run".into());
                }
                None
            }
        }
    }

    /// `selection` in the candidate model's names.
    pub(super) fn candidate_selection(&self, selection: &Selection) -> Selection {
        match (selection, &self.cand_model) {
            (Selection::Names(names), Some((_, ci))) => {
                let theirs = |n: &String| self.cand_names.get(n).unwrap_or(n).clone();
                Selection::Names(
                    names
                        .iter()
                        .map(theirs)
                        .filter(|n| ci.producer_index(n).is_some())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect(),
                )
            }
            _ => selection.clone(),
        }
    }
}
