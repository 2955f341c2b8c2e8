//! `--mark search`: a few marked tensors per candidate run, bisecting the blame path.

use std::collections::HashMap;

use anyhow::{bail, Result};
use layerwise_analysis::search::Measured;
use layerwise_analysis::{
    compare_all, is_weight_output, search_first_divergent, verdict_from_chain, Comparison, SearchResult, Verdict,
    WEIGHT_OUTPUT,
};
use layerwise_model::{Selection, WeightRange};
use layerwise_runtime::Tensor;

use super::compare::{Compared, Job};
use super::steps::Steps;

/// `--mark search`: the reference marks everything once; the candidate marks a few tensors per run.
pub(super) fn search(
    job: &mut Job,
    feeds: &[(String, Tensor)],
    weights: &[WeightRange],
    steps: &mut Steps,
) -> Result<(Compared, Verdict, SearchResult)> {
    let reference = steps
        .run(&format!("running reference {}", job.options.reference), || job.run_reference(feeds, &Selection::All))?;
    let mut notes = Vec::new();
    let mut engine_layers = Vec::new();
    let rule = job.judging.rule;
    let tolerances = job.judging.tolerances.clone();
    let index = job.index.clone();
    let result = search_first_divergent(&index, rule, |marked: &[String]| -> Result<Measured> {
        let label =
            if marked.is_empty() { "outputs only".to_string() } else { format!("marking {}", marked.join(", ")) };
        let out = steps
            .run(&format!("candidate run, {label}"), || job.run_candidate(feeds, &Selection::Names(marked.to_vec())))?;
        if notes.is_empty() {
            notes = out.notes.clone();
        }
        if !out.engine_layers.is_empty() {
            engine_layers = out.engine_layers.clone();
        }
        let mut order: Vec<String> = marked.to_vec();
        order.extend(index.outputs.iter().cloned());
        let comparison = compare_all(&index, &order, &reference.tensors, &out.tensors, &tolerances);
        let unavailable = out.unavailable.into_iter().filter(|(t, _)| marked.contains(t)).collect();
        Ok((comparison.records, unavailable))
    })?;
    // A weight passed straight to an output is compared by no run (as after a full run).
    let weight_outputs = index
        .outputs
        .iter()
        .filter(|o| is_weight_output(&index, o))
        .map(|o| (o.clone(), WEIGHT_OUTPUT.to_string()))
        .collect();
    let mut comparison = Comparison::from_records(result.records.clone(), weight_outputs, &job.order);
    comparison.note_input_nonfinite(feeds);
    if index.outputs.iter().all(|o| comparison.get(o).is_none()) {
        bail!("no model output could be compared in the candidate's first run");
    }
    let verdict = verdict_from_chain(
        &index,
        &comparison,
        weights,
        rule,
        job.judging.candidate,
        &result.chain,
        result.node.as_deref(),
    );
    let unavailable = result.unavailable.clone();
    let compared = Compared {
        comparison,
        tensors: Some((reference.tensors, HashMap::new())),
        histograms: HashMap::new(),
        notes: (reference.notes, notes),
        unavailable,
        engine_layers,
        memory: None,
        deployed_differs: Vec::new(),
        output_values: HashMap::new(),
        answers: Vec::new(),
    };
    Ok((compared, verdict, result))
}
