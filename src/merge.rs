//! `layerwise merge`: the partial reports of `bisect --inputs DIR --shard I/N` combined into the
//! report one run over every sample writes.
//!
//! Each sample's analysis depends on that sample alone, and a shard makes every decision that
//! depends on the number of samples from the whole set. So the shard holding the sample with the
//! worst output error already wrote the verdict's part of the report; what needs all shards is the
//! per-tensor aggregation over samples, recomputed here from each sample's numbers in the single
//! run's order (the same summation, so the same bits).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use layerwise_analysis::{aggregate_samples, chosen_sample, AnswerRecord, SampleData, Shard};
use layerwise_report::{read_report, Report};

/// The merged report (what `bisect --json` would have written, `run_info` aside).
pub fn merge(partials: &[PathBuf]) -> Result<Report> {
    if partials.is_empty() {
        bail!("give the partial reports of every shard");
    }
    let mut reports = Vec::new();
    for path in partials {
        reports.push((path.clone(), read_report(path)?));
    }
    merge_reports(reports)
}

/// [`merge`] on reports in memory, each with the name errors call it by.
pub fn merge_reports(partials: Vec<(PathBuf, Report)>) -> Result<Report> {
    let mut reports: Vec<(PathBuf, Report, Shard)> = Vec::new();
    for (path, mut report) in partials {
        let shard = report.extras.shard.take().with_context(|| {
            format!("{} is not a partial report: it was not written with bisect --shard", path.display())
        })?;
        reports.push((path, report, shard));
    }
    // All shards of one job: the same split, model, backends, tolerances and tensors.
    let (first_path, first, first_shard) = (&reports[0].0, &reports[0].1, &reports[0].2);
    for (path, report, shard) in &reports[1..] {
        if report.model != first.model {
            bail!("{} and {} come from different jobs: their 'model' differ", first_path.display(), path.display());
        }
        if report.tolerances != first.tolerances {
            bail!(
                "{} and {} come from different jobs: their 'tolerances' differ",
                first_path.display(),
                path.display()
            );
        }
        if report.reference.spec != first.reference.spec || report.cand.spec != first.cand.spec {
            bail!("{} and {} come from different jobs: their backends differ", first_path.display(), path.display());
        }
        if let (Some(a), Some(b)) = (&first_shard.samples_digest, &shard.samples_digest) {
            if a != b {
                bail!(
                    "{} and {} come from different sample folders: their samples' names or sizes differ",
                    first_path.display(),
                    path.display()
                );
            }
        }
        if shard.count != first_shard.count
            || shard.total_samples != first_shard.total_samples
            || shard.order != first_shard.order
        {
            bail!(
                "{} and {} come from different splits or models (shard count, sample count or tensors differ)",
                first_path.display(),
                path.display()
            );
        }
    }
    let count = first_shard.count;
    let mut seen = vec![false; count];
    for (path, _, shard) in &reports {
        if shard.index >= count || std::mem::replace(&mut seen[shard.index], true) {
            bail!("{}: shard {}/{count} is given twice or does not exist", path.display(), shard.index);
        }
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        bail!("shard {missing}/{count} is missing: merge needs the partial report of every shard");
    }
    // Every sample once, in the order one run takes them (file names, sorted).
    let mut samples: Vec<(SampleData, usize)> =
        reports.iter().enumerate().flat_map(|(r, (_, _, s))| s.samples.iter().cloned().map(move |d| (d, r))).collect();
    samples.sort_by(|a, b| a.0.run.sample.cmp(&b.0.run.sample));
    if samples.len() != first_shard.total_samples || samples.windows(2).any(|w| w[0].0.run.sample == w[1].0.run.sample)
    {
        bail!(
            "the shards hold {} samples, not the {} of the folder, once each",
            samples.len(),
            first_shard.total_samples
        );
    }
    let answers = merged_answers(&reports);
    let data: Vec<SampleData> = samples.iter().map(|(d, _)| d.clone()).collect();
    let chosen = chosen_sample(&data).expect("at least one sample");
    let order = first_shard.order.clone();
    let mut merged = reports.swap_remove(samples[chosen].1).1;
    merged.extras.samples = if data.len() > 1 { Some(aggregate_samples(&data, chosen, &order)) } else { None };
    merged.extras.answers = answers;
    Ok(merged)
}

/// Each judged output's answers over every shard's samples, as one run over the set records them:
/// the counts added, the changed samples in the set's order, and the detail of the first sample
/// with a change (else of the set's first sample). Each shard's detail is of its own first such
/// sample, named.
fn merged_answers(reports: &[(PathBuf, Report, Shard)]) -> Vec<AnswerRecord> {
    let first_sample = |shard: &Shard| shard.samples.iter().map(|s| s.run.sample.clone()).min();
    let Some((_, first, _)) = reports.first() else { return Vec::new() };
    first
        .extras
        .answers
        .iter()
        .map(|head| {
            let parts: Vec<(&AnswerRecord, Option<String>)> = reports
                .iter()
                .filter_map(|(_, r, s)| {
                    r.extras.answers.iter().find(|a| a.output == head.output).map(|a| (a, first_sample(s)))
                })
                .collect();
            let mut merged = AnswerRecord { samples: 0, cases: 0, changed_cases: 0, ..head.clone() };
            merged.changed_samples.clear();
            for (a, _) in &parts {
                merged.samples += a.samples;
                merged.cases += a.cases;
                merged.changed_cases += a.changed_cases;
                merged.changed_samples.extend(a.changed_samples.iter().cloned());
            }
            merged.changed_samples.sort();
            let judged = parts.iter().filter(|(a, _)| a.not_judged.is_none() && a.samples > 0);
            let shown = match judged
                .clone()
                .filter(|(a, _)| a.changed_cases > 0)
                .min_by_key(|(a, _)| a.changed_samples.first().cloned())
            {
                Some(changed) => Some(changed),
                None => judged.min_by_key(|(_, first)| first.clone()),
            };
            match shown {
                Some((a, _)) => {
                    merged.detail = a.detail.clone();
                    merged.not_judged = None;
                }
                None => merged.not_judged = parts.iter().find_map(|(a, _)| a.not_judged.clone()),
            }
            merged
        })
        .collect()
}
