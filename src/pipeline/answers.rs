//! Did the answer change: the outputs judged in the model's own terms (`--task`, or a classifier
//! recognised by its Softmax), sample by sample, and their record over the samples compared.

use std::collections::HashMap;

use anyhow::{bail, Result};
use layerwise_analysis::answers::{check, AnswerCheck, Task};
use layerwise_analysis::AnswerRecord;
use layerwise_model::{GraphIndex, Model};
use layerwise_runtime::Tensor;

use super::options::BisectOptions;

/// `OUTPUT:TASK[,KEY=VALUE]...` (the output's name may hold ':'; the task is after the last
/// ':' that is followed by a task name).
pub fn parse_task(s: &str) -> Result<(String, layerwise_analysis::answers::Task), String> {
    let split = ["classify", "ctc", "mask", "embedding", "detect"]
        .iter()
        .filter_map(|t| s.rfind(&format!(":{t}")).filter(|&i| s[i + 1..].split(',').next() == Some(*t)))
        .max()
        .ok_or_else(|| format!("'{s}' is not OUTPUT:TASK (TASK one of classify, ctc, mask, embedding, detect)"))?;
    let (output, task) = (&s[..split], &s[split + 1..]);
    if output.is_empty() {
        return Err(format!("'{s}': the output's name is missing before ':'"));
    }
    Ok((output.to_string(), layerwise_analysis::answers::Task::parse(task)?))
}

/// An output judged by its answers.
#[derive(Debug, Clone)]
pub(crate) struct Judged {
    pub output: String,
    pub task: Task,
    pub because: String,
    /// Recognised, not given: judged only where its values bear the recognition out (a [N, C]
    /// output), and left out of the report otherwise.
    pub recognised: bool,
}

/// The outputs `options` asks to judge by their answers, and the classifiers recognised: a model
/// output computed by a Softmax over its last axis (checked to be [N, C] when its values come).
pub(crate) fn judged_outputs(options: &BisectOptions, model: &Model, index: &GraphIndex) -> Result<Vec<Judged>> {
    let mut judged = Vec::new();
    for (output, task) in &options.tasks {
        if !index.outputs.contains(output) {
            bail!(
                "--task {output}:{}: '{output}' is not an output of the model (its outputs: {})",
                task.name(),
                index.outputs.iter().map(|o| format!("'{o}'")).collect::<Vec<_>>().join(", ")
            );
        }
        if judged.iter().any(|j: &Judged| j.output == *output) {
            bail!("--task names '{output}' twice: give one task per output");
        }
        judged.push(Judged { output: output.clone(), task: task.clone(), because: "given".into(), recognised: false });
    }
    for output in &index.outputs {
        if judged.iter().any(|j| j.output == *output) {
            continue;
        }
        // The Softmax itself, or one passed on by Identity nodes (PaddlePaddle's exports end so).
        let mut producer = index.producer(output);
        while let Some(p) = producer.filter(|p| p.op_type == "Identity" && p.domain.is_empty()) {
            producer = p.inputs.first().and_then(|i| index.producer(i));
        }
        let Some(producer) = producer else { continue };
        if producer.op_type != "Softmax" || !producer.domain.is_empty() {
            continue;
        }
        let axis = model
            .graph()
            .node
            .get(producer.proto_index)
            .and_then(|n| n.attribute.iter().find(|a| a.name() == "axis").map(|a| a.i()));
        // Before opset 13 the default axis is 1, the last of a [N, C] output; from 13, -1.
        if matches!(axis, None | Some(-1) | Some(1)) {
            judged.push(Judged {
                output: output.clone(),
                task: Task::Classify { topk: 5 },
                because: format!("recognised: Softmax '{}' over the classes of a [N, C] output", producer.name),
                recognised: true,
            });
        }
    }
    Ok(judged)
}

/// One sample's answers: the check of each judged output whose values `values` holds (shape,
/// reference, candidate), or why none could be made. A recognised output whose values are not
/// [N, C] is left out.
pub(super) fn check_sample(
    judged: &[Judged],
    values: &HashMap<String, (Vec<usize>, Vec<f32>, Vec<f32>)>,
    path: &str,
) -> Vec<(String, Result<AnswerCheck, String>)> {
    judged
        .iter()
        .filter_map(|j| {
            let checked = match values.get(&j.output) {
                Some((shape, _, _)) if j.recognised && shape.len() != 2 => return None,
                Some((shape, r, c)) => check(&j.task, shape, r, c),
                None if j.recognised => return None,
                None => Err(format!("its values are not held {path}")),
            };
            Some((j.output.clone(), checked))
        })
        .collect()
}

/// The record of each judged output over the samples compared: `samples` is (name, that sample's
/// answers) in the order compared.
///
/// `several`: whether the whole set holds more than one sample (a shard's partial report may
/// hold one of many): then each line and each changed sample is named.
pub(crate) fn records(
    judged: &[Judged],
    samples: &[(&str, &[(String, Result<AnswerCheck, String>)])],
    several: bool,
) -> Vec<AnswerRecord> {
    judged
        .iter()
        .filter_map(|j| {
            let mut record = AnswerRecord {
                output: j.output.clone(),
                task: j.task.name().to_string(),
                because: j.because.clone(),
                ..AnswerRecord::default()
            };
            let mut first_changed: Option<String> = None;
            let mut first: Option<String> = None;
            for (name, answers) in samples {
                let Some((_, checked)) = answers.iter().find(|(o, _)| *o == j.output) else { continue };
                match checked {
                    Ok(c) => {
                        record.samples += 1;
                        record.cases += c.cases;
                        record.changed_cases += c.changed.len();
                        let detail = if several { format!("sample {name}: {}", c.detail) } else { c.detail.clone() };
                        first.get_or_insert_with(|| detail.clone());
                        if !c.held() {
                            // One sample has no name to give (its inputs came from one file or
                            // from the seed).
                            if several {
                                record.changed_samples.push(name.to_string());
                            }
                            first_changed.get_or_insert(detail);
                        }
                    }
                    Err(why) => {
                        let why = if several { format!("sample {name}: {why}") } else { why.clone() };
                        record.not_judged.get_or_insert(why);
                    }
                }
            }
            if record.samples > 0 {
                record.not_judged = None;
            } else if record.not_judged.is_none() {
                if j.recognised {
                    return None;
                }
                record.not_judged = Some("its values were not held on this comparison path (--mark search)".into());
            }
            record.detail = first_changed.or(first).unwrap_or_default();
            Some(record)
        })
        .collect()
}

/// The values of each judged output that both runs returned in one shape (`Compared::output_values`).
pub(super) fn keep_judged_values(
    judged: &[Judged],
    reference: &HashMap<String, Tensor>,
    candidate: &HashMap<String, Tensor>,
    into: &mut HashMap<String, layerwise_analysis::KeptValues>,
) {
    for j in judged {
        if let (Some(r), Some(c)) = (reference.get(&j.output), candidate.get(&j.output)) {
            if r.shape == c.shape {
                into.insert(j.output.clone(), (r.shape.clone(), r.to_f32().to_vec(), c.to_f32().to_vec()));
            }
        }
    }
}

/// One sample's answers from both sides' whole tensors (a run of the model, or of a written file
/// whose outputs keep the model's names).
pub(crate) fn check_tensors(
    judged: &[Judged],
    reference: &HashMap<String, Tensor>,
    candidate: &HashMap<String, Tensor>,
) -> Vec<(String, Result<AnswerCheck, String>)> {
    let mut values = HashMap::new();
    keep_judged_values(judged, reference, candidate, &mut values);
    check_sample(judged, &values, "(a side did not return it, or the two sides' shapes differ)")
}

/// Whether the answers over the samples hold on at least `share` of each judged output's cases
/// (1: every case); an output whose answers could not be judged does not hold.
pub(crate) fn answers_hold(records: &[AnswerRecord], share: f64) -> bool {
    records.iter().all(|r| {
        r.not_judged.is_none() && r.cases > 0 && (r.changed_cases as f64) <= (1.0 - share) * r.cases as f64 + 1e-9
    })
}
