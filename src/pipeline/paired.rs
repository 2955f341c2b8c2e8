//! Comparing every tensor in one ONNX Runtime session: both sides computed side by side, each pair
//! reduced to its metrics where it is computed (layerwise_runtime::paired), nothing else returned.

use std::sync::Arc;

use anyhow::Result;
use layerwise_analysis::{MemoryPlan, PairedComparison};
use layerwise_runtime::paired::PairedSession;
use layerwise_runtime::{RunRequest, Tensor};

use super::compare::{Compared, Job, PAIRED};
use super::steps::Steps;

impl Job<'_> {
    /// Compares one sample with both sides in one session, when both run on ONNX Runtime with the
    /// same provider and nothing needs the tensors themselves (`--save-tensors`, a separate
    /// candidate model whose names differ). `None` where that does not apply or pairing failed
    /// (the reason goes to `self.pairing_note`); the caller then runs the sides separately.
    pub(super) fn compare_paired(&mut self, feeds: &[(String, Tensor)], steps: &mut Steps) -> Result<Option<Compared>> {
        if self.options.separate_runs || self.options.save_tensors.is_some() || self.cand_model.is_some() || self.pairing_note.is_some() {
            return Ok(None);
        }
        // One session has one provider and one thread count.
        match (self.reference.ort_options(), self.candidate.ort_options()) {
            (Some(r), Some(c)) if r.ep == c.ep && r.threads == c.threads => {}
            _ => return Ok(None),
        }
        if self.model.graph().initializer.iter().any(layerwise_model::is_external) {
            self.pairing_note = Some("compared after separate runs: the model keeps its weights as external data, which the paired session does not carry".into());
            return Ok(None);
        }
        let request = RunRequest { model: self.model, index: &self.index, inputs: feeds, selection: &self.options.selection };
        let comparison = Arc::new(PairedComparison::new(self.judging.tolerances.clone()));
        let reducer = comparison.clone();
        let label = format!("running {} and {} paired", self.options.reference, self.options.candidate);
        // Samples of the same shapes run in the session the first one built.
        let shapes: Vec<Vec<usize>> = feeds.iter().map(|(_, t)| t.shape.clone()).collect();
        if self.paired_session.as_ref().is_some_and(|(s, _)| *s != shapes) {
            self.paired_session = None;
        }
        let (reference, candidate, order, cache) = (&mut self.reference, &mut self.candidate, &self.order, &mut self.paired_session);
        let run = steps.run(&label, || {
            if cache.is_none() {
                let (Some(r), Some(c)) = (reference.onnx_program(&request), candidate.onnx_program(&request)) else { return Ok(None) };
                *cache = Some((shapes, PairedSession::build(request.model, r?, c?, order)?));
            }
            let (_, session) = cache.as_mut().expect("built just above");
            Ok(Some(session.run(feeds, reducer)?))
        });
        let run = match run {
            Ok(Some(run)) => run,
            Ok(None) => return Ok(None),
            Err(e) => {
                self.paired_session = None;
                // A graph the pairing cannot take (disagreeing opsets, subgraphs) is compared the
                // usual way, and the report says why.
                self.pairing_note = Some(format!("compared after separate runs, since the paired session could not run: {e:#}"));
                return Ok(None);
            }
        };
        let bytes = comparison.reference_bytes();
        let (comparison, histograms) = steps.run("collecting the comparison", || Ok(comparison.finish(&self.index, &self.order, &run.unavailable)))?;
        let memory = MemoryPlan {
            budget_bytes: self.options.max_memory,
            estimated_bytes: bytes,
            groups: 1,
            largest_group_bytes: 0,
            shapes_from: "the paired run".to_string(),
            comparison: PAIRED.to_string(),
        };
        let mut ref_notes = run.ref_notes;
        ref_notes.push(format!(
            "compared in one ONNX Runtime session with the candidate ({} nodes): each of {} tensor pairs reduced to its metrics where computed, no tensor returned",
            run.nodes,
            run.paired.len()
        ));
        Ok(Some(Compared {
            comparison,
            tensors: None,
            histograms,
            notes: (ref_notes, run.cand_notes),
            unavailable: run.unavailable,
            engine_layers: Vec::new(),
            memory: Some(memory),
        }))
    }
}
