//! The bisect job as a list of stages (docs/architecture.md): plan, run or pair, compare, walk,
//! noise floor, isolate, counterfactual, report. Each stage is a function of its own file.

use anyhow::{bail, Context, Result};
use layerwise_analysis::{
    aggregate_samples, chosen_sample, Extras, Isolation, SampleData, Shard, Status, Verdict, HISTOGRAM_BINS,
};
use layerwise_model::{scan_fp16_weight_range, Model, Selection, WeightRange};
use layerwise_report::{build_report, render_terminal, InputInfo, ReportContext};
use layerwise_runtime::inputs::{prepare_inputs, PreparedInput};
use layerwise_runtime::{saved, Precision, Tensor};

use super::compare::{Compared, Job};
use super::names::reference_of;
use super::noise_floor::{noise_floor, FloorPlan};
use super::options::{self, check_outputs, BisectOptions, BisectOutcome, Marking, CANCEL};
use super::plain_reference;
use super::steps::Steps;
use super::{conclusions, counterfactual, isolate, quantizers, repro, samples, search, setup};

pub fn bisect(options: &BisectOptions) -> Result<BisectOutcome> {
    layerwise_runtime::timing_mark(|| "bisect".into());
    let mut steps = Steps::new(options.progress, options.progress_lines);
    check_outputs(options)?;
    let model = steps.run("loading model", || Model::load(&options.model).map_err(Into::into))?;
    layerwise_runtime::timing_mark(|| "loaded".into());
    let outcome = run_bisect(&model, options, steps, None)?
        .ok_or_else(|| anyhow::anyhow!("a run without a shared queue always reports"));
    layerwise_runtime::timing_mark(|| "bisect done".into());
    outcome
}

/// The bisect job on an already loaded model (the demo builds its model in memory).
pub fn bisect_model(model: &Model, options: &BisectOptions) -> Result<BisectOutcome> {
    check_outputs(options)?;
    run_bisect(model, options, Steps::new(options.progress, options.progress_lines), None)?
        .ok_or_else(|| anyhow::anyhow!("a run without a shared queue always reports"))
}

/// One of several jobs over the same sample folder at once (`--devices`, one per GPU): it takes
/// its samples from a queue they share, so a faster GPU takes more, and hands their numbers over
/// when the queue is empty. Only the job holding the whole set's verdict sample goes on to the
/// steps after the walk (noise floor, run alone, counterfactual) and the report; the others stop,
/// so those steps run once, not once per GPU.
pub(crate) trait SampleQueue {
    /// The next sample to run (its index in the folder's order), or `None` when none is left.
    fn next(&mut self) -> Option<usize>;
    /// The next `n` samples (`--batch`): consecutive, starting at a multiple of `n`, so that every
    /// job's batches are the ones a single run makes.
    fn next_batch(&mut self, n: usize) -> Vec<usize>;
    /// This job's samples' numbers; back come every job's (in the folder's order) where this job
    /// carries the verdict, `None` where it stops here.
    fn hand_over(&mut self, data: Vec<SampleData>) -> Result<Option<Vec<SampleData>>>;
}

/// [`bisect`] as one job of a shared queue: `None` where another job carries the verdict.
pub(crate) fn bisect_from_queue(options: &BisectOptions, queue: &mut dyn SampleQueue) -> Result<Option<BisectOutcome>> {
    let mut steps = Steps::new(options.progress, options.progress_lines);
    check_outputs(options)?;
    let model = steps.run("loading model", || Model::load(&options.model).map_err(Into::into))?;
    run_bisect(&model, options, steps, Some(queue))
}

/// One sample's comparison and walk.
struct SampleOutcome {
    name: String,
    inputs: Vec<PreparedInput>,
    compared: Compared,
    verdict: Verdict,
    /// Its place in the folder's samples.
    index: usize,
    /// `--batch`: the samples of the run it was compared in, in their order there.
    batch: Option<Vec<usize>>,
}

fn run_bisect(
    original: &Model,
    options: &BisectOptions,
    mut steps: Steps,
    mut queue: Option<&mut dyn SampleQueue>,
) -> Result<Option<BisectOutcome>> {
    options::check_not_external_data(original, "the input model's external data", options, &[])?;
    // 1. Plan: backends, samples, control flow, the candidate model, precision and tolerances.
    let mut setup = setup::set_up(original, options, &mut steps)?;
    layerwise_runtime::timing_mark(|| "set up".into());
    let plan_extras = Extras {
        explorer_ids: layerwise_model::explorer_ids::explorer_ids(&original.proto),
        control_flow: setup.control_flow.take(),
        matching: setup.matching.take(),
        ..Default::default()
    };
    let samples = std::mem::take(&mut setup.samples);
    let (decls, total_samples) = (std::mem::take(&mut setup.decls), setup.total_samples);
    let samples_digest = setup.samples_digest.take();
    let input_notes = std::mem::take(&mut setup.input_notes);
    let owners = std::mem::take(&mut setup.owners);
    let flattened = std::mem::replace(&mut setup.model, std::borrow::Cow::Borrowed(original));
    let mut job = Job::new(options, &flattened, setup);
    job.judged = super::answers::judged_outputs(options, job.model, &job.index)?;
    let weights = if job.judging.precision() == Precision::Fp16 {
        let mut weights = steps
            .run("scanning weights for the FP16 range", || scan_fp16_weight_range(job.model).map_err(Into::into))?;
        if options.candidate.folds_batch_norms() {
            // A folding engine never stores a folded BatchNorm's parameters: no claim about them.
            let outputs = job.index.outputs.iter().cloned().collect();
            let (_, folded) =
                layerwise_model::engine_style::fold_batch_norms(job.model, &job.model.proto, &job.index, &outputs)?;
            let unstored = layerwise_model::engine_style::folded_parameters(&job.index, &folded);
            weights.retain(|w| !unstored.iter().any(|(t, _)| *t == w.name));
        }
        weights
    } else {
        Vec::new()
    };

    layerwise_runtime::timing_mark(|| "weights scanned".into());
    // 2-4. Run or pair, compare, walk: every sample; the worst one carries the verdict.
    let mut extras = plan_extras;
    let mut per_sample = Vec::new();
    let mut saver = match &options.save_tensors {
        Some(dir) => Some(TensorSaver::new(dir, total_samples > 1)?),
        None => None,
    };
    // `--batch N`: the samples go N at a time where both sides run on one GPU. Elsewhere it is
    // refused, whatever the samples; where there is nothing to batch, its note says why.
    if options.batch > 1 && job.device_of_both(false).is_none() {
        bail!(
            "--batch {} runs samples together on the GPU where both sides run there: --ref and --cand on ONNX Runtime's CUDA provider of one GPU (e.g. --ref ort:cuda,tf32=off --cand ort:cuda), every tensor compared, no quantized candidate; here --ref {} and --cand {}",
            options.batch,
            options.reference,
            options.candidate
        );
    }
    let unbatched_because = if total_samples < 2 {
        Some("one sample, nothing to run together")
    } else if saver.is_some() {
        Some("--save-tensors writes each sample's tensors from a run of its own")
    } else if options.mark != Marking::All {
        Some("--mark search runs one sample")
    } else {
        None
    };
    let width = if options.batch > 1 && samples.len() > 1 && unbatched_because.is_none() { options.batch } else { 1 };
    if options.batch > 1 {
        job.batch_refused = unbatched_because.map(String::from);
    }
    let mut taken = 0;
    let mut handed = 0;
    let prepare = |batch: &[usize]| -> Result<Vec<(usize, Vec<PreparedInput>)>> {
        batch
            .iter()
            .map(|&k| {
                prepare_inputs(&decls, &samples[k].1)
                    .map(|inputs| (k, inputs))
                    .map_err(|e| owners.explain(&samples[k].0, e))
            })
            .collect()
    };
    let mut batch = next_batch(queue.as_deref_mut(), width, &mut handed, samples.len());
    let mut prepared = prepare(&batch);
    // With one sample, the model's plain run (outputs only) that the steps after the walk need
    // comes first, on the inputs just prepared: its session is gone before the comparison holds
    // every tensor of both sides, so the two are never in memory together (decoder-overflow
    // 2,000, `--cand-model`: the peak was that session beside the held tensors, 2,034 MiB).
    job.plain_reference = if total_samples == 1 && samples.len() == 1 && !options.reference.is_saved() {
        // A sample that cannot be read, or a run that fails here, is told below as the comparison
        // tells it.
        let feeds = prepared.as_ref().ok().and_then(|p| p.first()).map(|(_, inputs)| setup::feeds_of(inputs));
        let outputs = feeds.and_then(|feeds| {
            let outputs = steps
                .run("running the reference (outputs)", || job.run_reference(&feeds, &Selection::Names(Vec::new())));
            outputs.ok().map(|outputs| (feeds, outputs))
        });
        layerwise_runtime::release_freed_memory();
        outputs
    } else {
        None
    };
    while !batch.is_empty() {
        let this_batch = std::mem::take(&mut batch);
        let inputs_read = std::mem::replace(&mut prepared, Ok(Vec::new()))?;
        layerwise_runtime::timing_mark(|| format!("{} samples' inputs prepared", inputs_read.len()));
        // With --batch, the next batch's inputs are read while this one runs on the GPU (about 2 ms
        // a sample: a quarter of a batched sample's time); an error there is told when its turn
        // comes. One sample at a time, the next is taken and read once this one has run.
        let early = (width > 1).then(|| next_batch(queue.as_deref_mut(), width, &mut handed, samples.len()));
        let (ran, read_early) = std::thread::scope(|scope| {
            let reader = early.as_ref().map(|following| scope.spawn(|| prepare(following)));
            let ran = (|| -> Result<()> {
                let together = if width > 1 {
                    let feeds: Vec<Vec<(String, Tensor)>> =
                        inputs_read.iter().map(|(_, inputs)| setup::feeds_of(inputs)).collect();
                    job.compare_batch_on_device(&feeds, &mut steps)?
                } else {
                    None
                };
                let batched = together.is_some().then(|| this_batch.clone());
                let mut together = together.map(|v| v.into_iter());
                for (k, inputs) in inputs_read {
                    taken += 1;
                    let (name, _) = &samples[k];
                    if samples.len() > 1 {
                        steps.count("sample", taken, samples.len(), name);
                    }
                    let feeds = setup::feeds_of(&inputs);
                    let done = match together.as_mut().and_then(Iterator::next) {
                        Some(compared) => walk_compared(&mut job, &feeds, compared, &weights, &mut steps),
                        None => compare_and_walk(
                            &mut job,
                            &feeds,
                            &weights,
                            total_samples,
                            saver.is_some(),
                            &mut steps,
                            &mut extras,
                        ),
                    };
                    // In a set, a run that fails on one sample says which.
                    let (mut compared, verdict) =
                        if total_samples > 1 { done.with_context(|| format!("sample {name}"))? } else { done? };
                    layerwise_runtime::timing_mark(|| "compared and walked".into());
                    if let (Some(saver), Some((r, c))) = (&mut saver, &compared.tensors) {
                        steps.run("saving tensors", || {
                            saver.save(name, |dir| {
                                saved::save_run(dir, "ref", &options.reference, &job.order, r, &[], &feeds)?;
                                saved::save_run(
                                    dir,
                                    "cand",
                                    &options.candidate,
                                    &job.order,
                                    c,
                                    &compared.engine_layers,
                                    &feeds,
                                )?;
                                Ok(())
                            })
                        })?;
                        if total_samples > 1 {
                            // Only a single sample's tensors are kept for the later stages.
                            compared.tensors = None;
                        }
                    }
                    per_sample.push(SampleOutcome {
                        name: name.clone(),
                        inputs,
                        compared,
                        verdict,
                        index: k,
                        batch: batched.clone(),
                    });
                }
                Ok(())
            })();
            let read_early = reader.map(|reader| {
                reader.join().unwrap_or_else(|_| Err(anyhow::anyhow!("reading the next samples' inputs panicked")))
            });
            (ran, read_early)
        });
        ran?;
        (batch, prepared) = match (early, read_early) {
            (Some(following), Some(read)) => (following, read),
            _ => {
                let following = next_batch(queue.as_deref_mut(), width, &mut handed, samples.len());
                let read = prepare(&following);
                (following, read)
            }
        };
    }
    steps.end_count();
    if let Some(saver) = saver {
        saver.finish()?;
    }
    // What follows runs other programs: the paired session's memory goes now.
    job.paired_session = None;
    layerwise_runtime::release_freed_memory();
    layerwise_runtime::timing_mark(|| "paired session dropped".into());
    // Did the answer change: over the samples this run compared (a shard's own, which `merge`
    // adds up over the shards).
    if queue.is_none() {
        let answered: Vec<(&str, &[_])> =
            per_sample.iter().map(|s| (s.name.as_str(), s.compared.answers.as_slice())).collect();
        extras.answers = super::answers::records(&job.judged, &answered, total_samples > 1);
    }
    let chosen = match queue {
        None => choose_sample(
            &job,
            per_sample,
            total_samples,
            options.shard.map(|s| (s, samples_digest.clone())),
            &mut extras,
        ),
        Some(queue) => match choose_shared_sample(&job, per_sample, total_samples, queue, &mut extras)? {
            Some(chosen) => chosen,
            None => return Ok(None),
        },
    };
    let mut chosen = chosen;
    extras.memory = chosen.compared.memory.clone();
    let feeds = setup::feeds_of(&chosen.inputs);
    // Compared on the GPU, the verdict's sample left no tensor on the host: its run again (the
    // same batch, the sessions warm) copies them out, so that the steps after the walk take the
    // reference's values from it and re-run only the part a keep list changes, as for one sample.
    let follow_up = chosen.verdict.status == Status::Diverged && (options.isolate || options.counterfactual);
    if follow_up
        && chosen.compared.tensors.is_none()
        && chosen.compared.memory.as_ref().is_some_and(|m| m.comparison == layerwise_analysis::ComparisonMode::Device)
    {
        let run: Vec<Vec<(String, Tensor)>> = match &chosen.batch {
            Some(batch) => prepare(batch)?.iter().map(|(_, inputs)| setup::feeds_of(inputs)).collect(),
            None => vec![feeds.clone()],
        };
        let position = chosen.batch.as_ref().and_then(|b| b.iter().position(|&k| k == chosen.index)).unwrap_or(0);
        if let Some(held) = job.held_from_device(&run, position, &mut steps)? {
            chosen.compared.tensors = Some(held);
            chosen.compared.notes.1.push(format!(
                "the verdict's sample ran again on the GPU{} with its tensors copied to the host, for the steps after the walk",
                if run.len() > 1 { format!(", in the same batch of {}", options.batch) } else { String::new() }
            ));
        }
    }

    layerwise_runtime::timing_mark(|| "sample chosen".into());
    // 5-7. After the walk: noise floor, isolation, counterfactual.
    let mut verdict = chosen.verdict.clone();
    // The model run as deployed (outputs only), once: the check that the reference is the model,
    // and the reference's outputs for the noise floor and every counterfactual check.
    let reference_outputs = match job.plain_reference.take() {
        _ if options.reference.is_saved() => None,
        Some((early, outputs)) if early == feeds => Some(outputs),
        _ => Some(
            steps
                .run("running the reference (outputs)", || job.run_reference(&feeds, &Selection::Names(Vec::new())))?,
        ),
    };
    let not_the_model = match &reference_outputs {
        Some(plain) => {
            let differences = plain_reference::differences(&job.index, &chosen.compared.comparison, plain);
            // Why, where it can be measured: the same plain run with ONNX Runtime's graph
            // optimizations off (the CPU provider's reference only).
            let why = if differences.is_empty() || !options.reference.runs_on_ort_cpu() {
                plain_reference::Why::NotMeasured
            } else {
                steps
                    .run("running the reference without graph optimizations (outputs)", || {
                        let spec = layerwise_runtime::BackendSpec::parse("ort:cpu,opt=disable")?;
                        let mut unoptimized = layerwise_runtime::create_backend(&spec)?;
                        let out = unoptimized.run(&layerwise_runtime::RunRequest {
                            model: job.model,
                            index: &job.index,
                            inputs: &feeds,
                            selection: &Selection::Names(Vec::new()),
                        })?;
                        Ok(if plain_reference::differences(&job.index, &chosen.compared.comparison, &out).is_empty() {
                            plain_reference::Why::Fusions
                        } else {
                            plain_reference::Why::NotFusions
                        })
                    })
                    .unwrap_or(plain_reference::Why::NotMeasured)
            };
            plain_reference::conclusion(&differences, why)
        }
        None => None,
    };
    let mut conclusions = after_walk(
        &mut job,
        &feeds,
        &chosen.compared,
        &mut verdict,
        reference_outputs.as_ref(),
        &mut steps,
        &mut extras,
    )?;
    conclusions.splice(0..0, not_the_model);
    let random = plain_reference::unseeded_random_nodes(job.model.graph(), &job.index);
    conclusions.splice(0..0, plain_reference::random_conclusion(&random));
    if let Some(dir) = &options.repro {
        extras.repro = Some(steps.run("writing the repro", || repro::write_repro(&mut job, &feeds, &verdict, dir))?);
    }

    layerwise_runtime::timing_mark(|| "after the walk".into());
    // 8. Report.
    report(original, &job, chosen, verdict, conclusions, input_notes, &weights, extras, steps).map(Some)
}

/// The next samples to run, `width` at a time: from the shared queue, else the folder's next ones
/// after the `handed` already taken.
fn next_batch(
    queue: Option<&mut (dyn SampleQueue + '_)>,
    width: usize,
    handed: &mut usize,
    total: usize,
) -> Vec<usize> {
    let batch: Vec<usize> = match queue {
        Some(queue) if width > 1 => queue.next_batch(width).into_iter().filter(|&k| k < total).collect(),
        Some(queue) => queue.next().filter(|&k| k < total).into_iter().collect(),
        None => (*handed..(*handed + width).min(total)).collect(),
    };
    *handed += batch.len();
    batch
}

/// Stages 2 to 4 on one sample: both sides run (paired or separately, or a few tensors per
/// candidate run with `--mark search`), every tensor compared, and the walk back from the worst
/// output.
fn compare_and_walk(
    job: &mut Job,
    feeds: &[(String, Tensor)],
    weights: &[WeightRange],
    total_samples: usize,
    keep_tensors: bool,
    steps: &mut Steps,
    extras: &mut Extras,
) -> Result<(Compared, Verdict)> {
    let options = job.options;
    let (compared, verdict) = match options.mark {
        Marking::All => {
            let compared = job.compare_sample(feeds, steps, total_samples == 1 || keep_tensors)?;
            walk_compared(job, feeds, compared, weights, steps)?
        }
        Marking::Search => {
            let (compared, verdict, found) = search::search(job, feeds, weights, steps)?;
            refuse_empty_outputs(
                &job.index.outputs,
                |o| compared.comparison.get(o).map(|r| r.shape.as_slice()),
                feeds,
            )?;
            extras.search = Some(found);
            (compared, verdict)
        }
    };
    Ok((compared, verdict))
}

/// Stage 4 on one sample whose every tensor was compared: what the walk needs besides the
/// comparison (a Q/DQ candidate's deployed run and quantizers), and the walk back from the worst
/// output.
fn walk_compared(
    job: &mut Job,
    feeds: &[(String, Tensor)],
    compared: Compared,
    weights: &[WeightRange],
    steps: &mut Steps,
) -> Result<(Compared, Verdict)> {
    if job.index.outputs.iter().all(|o| compared.comparison.get(o).is_none()) {
        bail!(
            "no model output could be compared: {}",
            compared.comparison.not_compared.iter().map(|(t, r)| format!("{t}: {r}")).collect::<Vec<_>>().join("; ")
        );
    }
    refuse_empty_outputs(&job.index.outputs, |o| compared.comparison.get(o).map(|r| r.shape.as_slice()), feeds)?;
    let mut compared = compared;
    job.compare_deployed(feeds, &mut compared, steps)?;
    let values = std::mem::take(&mut compared.output_values);
    compared.answers = super::answers::check_sample(
        &job.judged,
        &values,
        "on this comparison path (the report's memory.comparison says which) or the two sides' shapes differ",
    );
    compared.comparison.quantizers = quantizer_ranges(job);
    measure_quantizers(job, feeds, &mut compared, steps)?;
    let mut verdict = job.judging.walk(&job.index, &mut compared.comparison, feeds, weights);
    job.unmix_deployed_finding(&compared, &mut verdict);
    Ok((compared, verdict))
}

/// The tensors computed from `tensor` in the main graph (the nodes that read it, and so on).
fn downstream_of<'a>(index: &'a layerwise_model::GraphIndex, tensor: &str) -> std::collections::HashSet<&'a str> {
    let mut seen: std::collections::HashSet<&'a str> = std::collections::HashSet::new();
    let mut visited = vec![false; index.nodes.len()];
    let mut queue: Vec<usize> = index.consumers(tensor).to_vec();
    while let Some(n) = queue.pop() {
        if std::mem::replace(&mut visited[n], true) {
            continue;
        }
        for out in index.nodes[n].outputs.iter().filter(|o| !o.is_empty()) {
            if seen.insert(out.as_str()) {
                queue.extend_from_slice(index.consumers(out));
            }
        }
    }
    seen
}

/// `--save-tensors DIR` (new or empty, checked up front), written into a staging folder beside
/// it (removed by Ctrl-C) and moved into place whole once every sample is written: an interrupted
/// run leaves no folder, not one run without the other. One
/// sample: `DIR/ref`, `DIR/cand`, `DIR/inputs.npz`; several: the same in `DIR/<sample>/`.
struct TensorSaver {
    staging: layerwise_model::scratch::StagedDir,
    destination: std::path::PathBuf,
    per_sample: bool,
    folders: std::collections::HashSet<String>,
}

impl TensorSaver {
    fn new(dir: &std::path::Path, per_sample: bool) -> Result<TensorSaver> {
        use anyhow::Context;
        let staging = layerwise_model::scratch::StagedDir::beside(dir, ".layerwise-tensors-")
            .with_context(|| format!("--save-tensors {}", dir.display()))?;
        Ok(TensorSaver { staging, destination: dir.to_path_buf(), per_sample, folders: Default::default() })
    }

    /// Writes one sample's runs through `write` into its folder.
    fn save(&mut self, sample: &str, write: impl FnOnce(&std::path::Path) -> Result<()>) -> Result<()> {
        if !self.per_sample {
            return write(self.staging.path());
        }
        let folder = sample_folder_name(sample, &self.folders);
        let dir = self.staging.path().join(&folder);
        std::fs::create_dir(&dir)?;
        self.folders.insert(folder);
        write(&dir)
    }

    fn finish(self) -> Result<()> {
        use anyhow::Context;
        let destination = self.destination;
        self.staging.move_to(&destination).with_context(|| format!("--save-tensors {}", destination.display()))
    }
}

/// A sample's folder under `--save-tensors`: its name without `.npz`, in letters, digits, `.`,
/// `_` and `-` alone (a sample name is text from a file or a data loader), unique.
fn sample_folder_name(sample: &str, taken: &std::collections::HashSet<String>) -> String {
    let stem = sample.strip_suffix(".npz").unwrap_or(sample);
    let mut base: String =
        stem.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    if base.is_empty() || base.starts_with('.') {
        base = format!("sample{base}");
    }
    let mut name = base.clone();
    let mut k = 1;
    while taken.contains(&name) {
        k += 1;
        name = format!("{base}-{k}");
    }
    name
}

/// Refuses a sample whose every model output is empty: a PASS over them would say nothing (an
/// input shape with a zero dimension makes them). `shape` gives an output's
/// shape where it was computed.
pub fn refuse_empty_outputs<'a>(
    outputs: &[String],
    shape: impl Fn(&str) -> Option<&'a [usize]>,
    feeds: &[(String, Tensor)],
) -> Result<()> {
    if outputs.is_empty() || !outputs.iter().all(|o| shape(o).is_some_and(|s| s.contains(&0))) {
        return Ok(());
    }
    let zero: Vec<String> = feeds
        .iter()
        .filter(|(_, t)| t.shape.contains(&0))
        .map(|(n, t)| format!("'{n}' {}", t.shape.iter().map(usize::to_string).collect::<Vec<_>>().join("x")))
        .collect();
    bail!(
        "every model output is empty, so nothing can be compared{}",
        if zero.is_empty() { String::new() } else { format!(": inputs with no element: {}", zero.join(", ")) }
    );
}

/// Each sample's results as the aggregation over samples (and a shard's partial report) take them.
fn samples_data(job: &Job, per_sample: &[SampleOutcome]) -> Vec<SampleData> {
    let worst_of = |c: &Compared| -> f64 { c.comparison.largest_error(&job.index.outputs) };
    per_sample
        .iter()
        .map(|s| {
            samples::sample_data(
                &s.name,
                &s.inputs,
                &s.compared.comparison,
                &s.verdict,
                worst_of(&s.compared),
                &job.order,
            )
        })
        .collect()
}

/// The sample whose worst output error is largest (the earliest on ties) carries the verdict; the
/// others go into the per-tensor aggregation (`samples`), or into a shard's partial report.
fn choose_sample(
    job: &Job,
    mut per_sample: Vec<SampleOutcome>,
    total_samples: usize,
    shard: Option<((usize, usize), Option<String>)>,
    extras: &mut Extras,
) -> SampleOutcome {
    let data = samples_data(job, &per_sample);
    let chosen = chosen_sample(&data).expect("one sample");
    match shard {
        Some(((index, count), samples_digest)) => {
            extras.shard =
                Some(Shard { index, count, total_samples, order: job.order.clone(), samples: data, samples_digest })
        }
        None if total_samples > 1 => extras.samples = Some(aggregate_samples(&data, chosen, &job.order)),
        None => {}
    }
    per_sample.swap_remove(chosen)
}

/// [`choose_sample`] over every job of a shared queue: this job's samples' numbers are handed
/// over, and where the whole set's verdict sample is among them, it carries the verdict with the
/// aggregation over every sample (what one run over the folder computes, in its order).
fn choose_shared_sample(
    job: &Job,
    mut per_sample: Vec<SampleOutcome>,
    total_samples: usize,
    queue: &mut dyn SampleQueue,
    extras: &mut Extras,
) -> Result<Option<SampleOutcome>> {
    let data = samples_data(job, &per_sample);
    let Some(every) = queue.hand_over(data)? else { return Ok(None) };
    let chosen = chosen_sample(&every).ok_or_else(|| anyhow::anyhow!("no sample was run"))?;
    let name = &every[chosen].run.sample;
    let local = per_sample
        .iter()
        .position(|s| &s.name == name)
        .ok_or_else(|| anyhow::anyhow!("the verdict's sample {name} was given to a job that did not run it"))?;
    if total_samples > 1 {
        extras.samples = Some(aggregate_samples(&every, chosen, &job.order));
    }
    Ok(Some(per_sample.swap_remove(local)))
}

/// Stages 5 to 7 on a diverged verdict: the noise floor (is the output this sensitive to one
/// rounding anyway?), each chain node run alone (introduced or propagated?), and the candidate
/// re-run with each break kept (does keeping it help?). Returns the conclusions to add to the
/// verdict; an ill-conditioned output loses its first divergent layer.
fn after_walk(
    job: &mut Job,
    feeds: &[(String, Tensor)],
    compared: &Compared,
    verdict: &mut Verdict,
    reference_outputs: Option<&layerwise_runtime::RunOutput>,
    steps: &mut Steps,
    extras: &mut Extras,
) -> Result<Vec<String>> {
    let options = job.options;
    let mut conclusions = Vec::new();
    if verdict.status != Status::Diverged {
        return Ok(conclusions);
    }
    // Saved tensors cannot run anything new.
    let can_run = !options.candidate.is_saved();
    // Keeping a node at reference precision: an emulation does it itself, an FP16 candidate runs
    // the model converted with the node kept.
    // A keep list is checked on the reference's model converted: where the candidate model took
    // other branches, that is not the candidate's computation (the conclusions say so).
    let other_branches =
        extras.control_flow.as_ref().is_some_and(|cf| cf.inlined.iter().any(|i| i.candidate_taken.is_some()));
    // A Q/DQ candidate's checks keep nodes unquantized in its own model.
    let quantized = job.judging.quantization.is_some() && job.cand_model.is_some();
    let counterfactual_runs = options.counterfactual
        && !other_branches
        && (job.judging.precision() == Precision::Fp16 || options.candidate.is_emulation() || quantized);
    // The floor's inputs, worked out before anything runs.
    // A quantized candidate's floor is one step of each of its quantizers, on the reference's
    // tensors (the matching's pairs, read backwards).
    let quantizer_steps = match (&job.judging.quantization, &job.cand_model) {
        (Some(_), Some((cm, ci))) if options.noise_floor => {
            let names = job.reference_names();
            let of = reference_of(&job.index, &names);
            let mut steps = layerwise_model::quant::quantizer_steps(&job.index, cm.graph(), ci, &of);
            let refit = refit_faulty_steps(&mut steps, &compared.comparison);
            if !refit.is_empty() {
                conclusions.push(format!(
                    "noise floor: {} at the step their own values need, not the one a fault forces (the causes name that fault): {}",
                    if refit.len() == 1 { "one quantizer is taken" } else { "these quantizers are taken" },
                    refit.join("; ")
                ));
            }
            Some(steps)
        }
        _ => None,
    };
    let floor_input = match FloorPlan::of(&job.judging, &job.index, verdict, &compared.comparison) {
        _ if !options.noise_floor => None,
        None => None,
        Some(Err(why)) => {
            conclusions.push(why);
            None
        }
        Some(Ok(plan)) => match reference_outputs {
            Some(reference) => {
                let (exact, told_apart) = setup::weights_kept_float32(job.model, job.cand_model.as_ref());
                // A quantized candidate's floor moves its quantizers, not float weights by name.
                if !told_apart && quantizer_steps.is_none() {
                    conclusions.push("noise floor: the candidate file names its weights differently, so which of them it keeps in float32 is unknown here; every float32 weight was perturbed as if stored in reduced precision, which can only raise the floor".to_string());
                }
                Some((reference, plan, exact))
            }
            None => {
                conclusions.push(
                    "noise floor not measured: the reference is a saved run, which cannot run a perturbed model"
                        .to_string(),
                );
                None
            }
        },
    };
    // What the floor reads, its own copies: the GPU steps beside it borrow the job mutably.
    let (model, floor_index, judging) = (job.model, job.index.clone(), job.judging.clone());
    let measure_floor = |reference_backend: &mut dyn layerwise_runtime::Backend,
                         (reference, plan, exact): &(
        &layerwise_runtime::RunOutput,
        FloorPlan,
        std::collections::HashSet<String>,
    )| {
        noise_floor(
            reference_backend,
            model,
            &floor_index,
            feeds,
            &reference.tensors,
            &judging.tolerances,
            plan.target(&judging, exact, options.inputs.seed, quantizer_steps.as_ref()),
        )
    };
    let run_isolation = options.isolate && can_run;
    // A GPU candidate's steps (nodes run alone, the counterfactual) mostly wait on CUDA session
    // builds: the CPU reference measures the floor beside them, on a backend of its own. They are
    // dropped if the floor finds the output ill-conditioned, as they would not have run.
    let beside = floor_input.is_some()
        && options.candidate.ort_gpu()
        && !options.reference.ort_gpu()
        && (run_isolation || counterfactual_runs);
    let mut speculative: Option<(Option<Isolation>, Option<layerwise_analysis::Counterfactual>)> = None;
    let floor = if beside {
        let floor_input = floor_input.as_ref().expect("checked");
        let reference_spec = job.reference.spec().clone();
        let ((floor, seconds), gpu_steps) = std::thread::scope(|scope| -> Result<_> {
            let floor = scope.spawn(|| {
                let started = std::time::Instant::now();
                let floor = layerwise_runtime::create_backend(&reference_spec)
                    .map_err(anyhow::Error::from)
                    .and_then(|mut r| measure_floor(r.as_mut(), floor_input));
                (floor, started.elapsed().as_secs_f64())
            });
            let isolation = if run_isolation {
                Some(steps.run("running chain nodes alone (the noise floor beside)", || {
                    Ok(isolate_or_skipped(job, feeds, compared, verdict))
                })?)
            } else {
                None
            };
            let counterfactual = match (counterfactual_runs, reference_outputs) {
                (true, Some(reference)) => steps.run("counterfactual runs (the noise floor beside)", || {
                    counterfactual::counterfactual(
                        job,
                        feeds,
                        reference,
                        &compared.comparison,
                        verdict,
                        isolation.as_ref(),
                        compared.tensors.as_ref().map(|(_, c)| c),
                    )
                }),
                _ => Ok(None),
            };
            Ok((floor.join().expect("the noise floor's thread does not panic"), (isolation, counterfactual)))
        })?;
        steps.record("measuring the noise floor (beside the GPU steps)", seconds);
        let (isolation, counterfactual) = gpu_steps;
        speculative = Some((isolation, noted(counterfactual, "counterfactual", &mut conclusions)?));
        Some(floor)
    } else {
        floor_input
            .as_ref()
            .map(|input| steps.run("measuring the noise floor", || measure_floor(job.reference.as_mut(), input)))
    };
    match floor {
        Some(Ok(floor)) => extras.noise_floor = Some(floor),
        Some(Err(e)) => conclusions.push(format!("noise floor not measured: {e:#}")),
        None => {}
    }
    // A Q/DQ candidate's quantizers, one at a time: which of them makes the error.
    if quantized {
        let worst = verdict.worst_output.clone();
        let cand_error = worst.as_deref().and_then(|w| compared.comparison.get(w)).map(|r| r.error_level());
        if let (Some(worst), Some(cand_error)) = (worst, cand_error) {
            if quantizers::inputs_hold_nonfinite(feeds) {
                conclusions
                    .push(format!("quantizers were not measured one at a time: {}", quantizers::NONFINITE_INPUTS));
            } else {
                match steps.run("measuring each quantizer alone", || {
                    Ok(quantizers::quantizers_alone(job, feeds, &worst, cand_error))
                })? {
                    Ok(Some(found)) => {
                        let effects = effects_of_the_faulty(job, feeds, compared, &found);
                        conclusions.extend(conclusions::quantizers_alone_lines(&found, &effects, &job.index));
                        if found.at_fault().next().is_some() {
                            if let Some(floor) = extras.noise_floor.as_mut().filter(|f| f.ill_conditioned) {
                                // The floor moved the faulty quantizers' coarse steps too.
                                floor.ill_conditioned = false;
                                conclusions.push(format!(
                                    "noise floor: one step of each quantizer at once moves '{}' by rel L2 {}, the candidate's {} being {} of it (within the factor that calls an output ill-conditioned), but it moves the faulty quantizers by their coarse steps too: it does not tell resolution from a fault, and the quantizers measured one at a time name the fault",
                                    floor.output,
                                    conclusions::n(floor.output_error),
                                    conclusions::n(floor.candidate_error),
                                    floor.ratio_words()
                                ));
                            }
                        }
                        extras.quantizers_alone = Some(found);
                    }
                    Ok(None) => {}
                    Err(e) => conclusions.push(format!("quantizers were not measured one at a time: {e:#}")),
                }
            }
        }
    }
    let ill_conditioned = extras.noise_floor.as_ref().is_some_and(|f| f.ill_conditioned);
    if ill_conditioned {
        // No layer is at fault: the walk's finding stays among the breaks, not as the culprit,
        // and its measured mechanism stays in the verdict.
        if let Some(finding) = verdict.first_divergent.take() {
            conclusions.push(conclusions::mechanism_without_fault(&finding));
        }
        return Ok(conclusions);
    }
    if let Some((isolation, counterfactual)) = speculative {
        extras.isolation = isolation;
        extras.counterfactual = counterfactual;
        return Ok(conclusions);
    }
    if run_isolation {
        extras.isolation =
            Some(steps.run("running chain nodes alone", || Ok(isolate_or_skipped(job, feeds, compared, verdict)))?);
    }
    if counterfactual_runs {
        if let Some(reference) = reference_outputs {
            let measured = steps.run("counterfactual runs", || {
                counterfactual::counterfactual(
                    job,
                    feeds,
                    reference,
                    &compared.comparison,
                    verdict,
                    extras.isolation.as_ref(),
                    compared.tensors.as_ref().map(|(_, c)| c),
                )
            });
            extras.counterfactual = noted(measured, "counterfactual", &mut conclusions)?;
        }
    }
    Ok(conclusions)
}

/// A step after the verdict that fails (a session ONNX Runtime cannot build for a kept island,
/// say) becomes a note and the report stays whole; an interrupt still stops the run.
fn noted<T>(result: Result<Option<T>>, step: &str, conclusions: &mut Vec<String>) -> Result<Option<T>> {
    match result {
        Err(e) if !CANCEL.load(std::sync::atomic::Ordering::Relaxed) => {
            conclusions.push(format!("{step} not measured: {e:#}"));
            Ok(None)
        }
        other => other,
    }
}

/// What the quantizers at fault do to the reference's values: from the comparison's
/// measurements where made, else measured here on one reference run of those tensors.
fn effects_of_the_faulty(
    job: &mut Job,
    feeds: &[(String, Tensor)],
    compared: &Compared,
    found: &layerwise_analysis::QuantizersAlone,
) -> std::collections::HashMap<String, layerwise_model::quant::QuantizerEffect> {
    let mut effects = std::collections::HashMap::new();
    let mut missing = Vec::new();
    // What its DequantizeLinear holds where that is another tensor: a quantizer that took a Relu
    // over is read on the Relu's output, whose negatives it does not clip.
    for t in found.at_fault().map(|q| q.holds.as_ref().unwrap_or(&q.tensor)) {
        match compared.comparison.quantizer_effects.get(t) {
            Some(e) => {
                effects.insert(t.clone(), e.clone());
            }
            None => missing.push(t.clone()),
        }
    }
    if missing.is_empty() {
        return effects;
    }
    let kept = compared.tensors.as_ref().map(|(r, _)| r);
    let ran = if missing.iter().all(|t| kept.is_some_and(|k| k.contains_key(t))) {
        None
    } else {
        job.run_reference(feeds, &Selection::Names(missing.clone())).ok().map(|r| r.tensors)
    };
    for t in missing {
        let (Some(value), Some(range)) = (
            ran.as_ref().and_then(|r| r.get(&t)).or_else(|| kept.and_then(|k| k.get(&t))),
            compared.comparison.quantizers.get(&t),
        ) else {
            continue;
        };
        effects.insert(t.clone(), job.judging.quantizer_effect(&t, range, value));
    }
    effects
}

/// Each chain node run alone; a failure is reported as nodes skipped, not as the job's error.
fn isolate_or_skipped(job: &mut Job, feeds: &[(String, Tensor)], compared: &Compared, verdict: &Verdict) -> Isolation {
    isolate::isolate(job, feeds, compared, verdict).unwrap_or_else(|e| Isolation {
        nodes: Vec::new(),
        introducing: None,
        skipped: vec![("*".into(), format!("{e:#}"))],
    })
}

/// Stage 8: the verdict's conclusions, the typed report, every format written, and the terminal
/// text.
#[allow(clippy::too_many_arguments)]
fn report(
    original: &Model,
    job: &Job,
    chosen: SampleOutcome,
    mut verdict: Verdict,
    mut conclusions: Vec<String>,
    input_notes: Vec<String>,
    weights: &[WeightRange],
    extras: Extras,
    steps: Steps,
) -> Result<BisectOutcome> {
    let options = job.options;
    let SampleOutcome { name: sample_name, mut inputs, compared, .. } = chosen;
    // A data loader's samples sit in a scratch folder of a new name each run: the report names
    // the script instead, so that the same run gives the same report.
    if let (Some(script), Some(folder)) = (&options.data_loader_script, &options.inputs.npz) {
        let scratch = format!("npz:{}/", folder.display());
        for i in &mut inputs {
            if let Some(file) = i.source.strip_prefix(&scratch) {
                i.source = format!("data loader {}: {file}", script.display());
            }
        }
    }
    // Inputs that are not all finite: NaN compares as NaN on both sides, so the verdict only
    // speaks of what is finite; but where the candidate holds fewer inf/NaN than the reference (a
    // quantizer has no code for NaN), they are mismatches, and the note must not say otherwise.
    // Each input's note counts only the tensors computed from it (two inputs with NaN reach
    // different tensors).
    let dropped = |input: &str| -> Vec<&layerwise_analysis::TensorRecord> {
        let downstream = downstream_of(&job.index, input);
        compared
            .comparison
            .records
            .iter()
            .filter(|r| {
                downstream.contains(r.name.as_str()) && {
                    let (reference, candidate) = r.metrics.nonfinite_counts();
                    candidate < reference
                }
            })
            .collect()
    };
    for i in &inputs {
        let (nan, inf) = i.tensor.non_finite_counts();
        if nan + inf == 0 {
            continue;
        }
        let dropped = dropped(&i.name);
        let carried = match dropped.first() {
            None => "they reach the tensors computed from them on both sides, where matching inf/NaN are not counted as errors, so this verdict speaks only of the finite values".to_string(),
            Some(first) => format!(
                "they reach the tensors computed from it in the reference, and matching inf/NaN are not counted as errors; but in {} of those tensors, first '{}' ({}), the candidate has finite values where the reference has inf/NaN, and those count as inf/NaN mismatches",
                dropped.len(),
                first.name,
                if first.node.is_empty() { first.op_type.clone() } else { format!("node {}", first.node) }
            ),
        };
        conclusions.insert(
            0,
            format!(
                "input '{}' ({}) holds {nan} NaN and {inf} inf values of {}: {carried}",
                i.name,
                i.source,
                i.tensor.len()
            ),
        );
    }
    conclusions.extend(conclusions::tf32_entry(
        job.judging.candidate,
        job.model,
        &job.index,
        &compared.comparison,
        &verdict,
    ));
    conclusions.extend(conclusions::emulation_limits(&options.candidate, job.model, &job.index, &compared.comparison));
    conclusions::conclude(&mut verdict, &extras, &compared.comparison, conclusions);
    if let Some(headline) = several_places_headline(job, &verdict, &extras, &compared.comparison, weights) {
        verdict.summary = headline;
    }
    if let Some(top) =
        extras.quantizers_alone.as_ref().and_then(|found| found.at_fault().next().map(|top| (top, found)))
    {
        let (top, found) = top;
        let more = found.at_fault().count() - 1;
        verdict.summary = format!(
            "{}; the quantizer of '{}' is at fault: alone it gives rel L2 {} of the {} every activation quantizer gives together{}",
            verdict.summary,
            top.tensor,
            conclusions::n(top.error),
            conclusions::n(found.together),
            if more > 0 { format!(" ({more} more at fault, below)") } else { String::new() }
        );
    }
    let histogram = verdict.first_divergent.as_ref().and_then(|fd| {
        if let Some(h) = compared.histograms.get(&fd.tensor) {
            return Some(h.clone());
        }
        let (r, c) = compared.tensors.as_ref().map(|(r, c)| (r.get(&fd.tensor), c.get(&fd.tensor)))?;
        Some(layerwise_analysis::histogram(&r?.to_f32(), &c?.to_f32(), HISTOGRAM_BINS))
    });
    let mut cand_notes = compared.notes.1.clone();
    cand_notes.extend(input_notes);
    if !sample_name.is_empty() {
        cand_notes
            .push(format!("verdict from sample {sample_name}: diverged samples first, then the largest output error"));
    }
    layerwise_runtime::timing_mark(|| "report: conclusions".into());
    let report = build_report(ReportContext {
        model: original,
        index: &job.index,
        ref_spec: options.reference.to_string(),
        cand_spec: options.candidate.to_string(),
        cand_model: options.cand_model.as_ref().map(|p| p.display().to_string()),
        ref_notes: compared.notes.0.clone(),
        cand_notes,
        tolerance: job.judging.tolerances.all,
        tensor_tolerances: job.judging.tolerances.by_tensor.clone(),
        tolerance_defaults: job.judging.candidate.arithmetic,
        rule: job.judging.rule,
        inputs: inputs.iter().map(|i| InputInfo::of(&i.name, &i.tensor, &i.source)).collect(),
        comparison: &compared.comparison,
        verdict: &verdict,
        weights,
        unavailable: compared.unavailable.clone(),
        histogram,
        engine_layers: compared.engine_layers.clone(),
        extras,
        run_info: layerwise_report::RunInfo::now(steps.finish()),
    });
    layerwise_runtime::timing_mark(|| "report built".into());
    options.outputs.write(&report, None)?;
    layerwise_runtime::timing_mark(|| "report written".into());
    let text = render_terminal(&report, options.top);
    layerwise_runtime::timing_mark(|| "terminal rendered".into());
    Ok(BisectOutcome { report, text })
}

/// Where the error needs several places kept (inf/NaN born at several independent places, or
/// breaks that each remove only part of a finite error) and the counterfactual measured keeping
/// them together: the verdict's headline says so, with each place and its cause (a UNet's
/// headline named a late Gemm, and its early Mul was "off the blame chain").
fn several_places_headline(
    job: &Job,
    verdict: &Verdict,
    extras: &Extras,
    comparison: &layerwise_analysis::Comparison,
    weights: &[WeightRange],
) -> Option<String> {
    let checks = &extras.counterfactual.as_ref()?.checks;
    let before = extras.counterfactual.as_ref()?.output_error;
    let worst = verdict.worst_output.as_deref()?;
    let non_finite: std::collections::HashMap<&str, &layerwise_analysis::NonFiniteTensor> =
        verdict.non_finite.iter().rev().map(|n| (n.node.as_str(), n)).collect();
    let cause = |node: &str| -> String {
        if let Some(fd) = verdict.first_divergent.iter().chain(&verdict.breaks).find(|f| f.node == node) {
            return format!("{} ({}): {}", fd.node, fd.op_type, fd.cause.best.detail);
        }
        let Some(n) = non_finite.get(node) else { return node.to_string() };
        let record = comparison.get(&n.tensor);
        let reach = record.map(|r| r.metrics.ref_max_abs).unwrap_or(f64::NAN);
        let fp16_max = f64::from(layerwise_model::fp16::FP16_MAX);
        // A weight beyond FP16's range is inf before the node computes anything (17 branches
        // multiplied by 70,000 were said to overflow by their outputs' magnitude, which only 4 of
        // 64 values reached).
        let overflowing_weight = job.index.node(node).and_then(|info| {
            info.inputs.iter().find_map(|i| weights.iter().find(|w| w.name == *i && w.overflow_count > 0))
        });
        if let (Precision::Fp16, Some(w)) = (job.judging.precision(), overflowing_weight) {
            format!(
                "{} ({}): weight '{}' has {} of {} values beyond the FP16 range (max |w| = {:.4e} > {fp16_max}), which become inf in FP16: {} values of its output are inf/NaN",
                n.node, n.op_type, w.name, w.overflow_count, w.numel, w.max_abs, n.mismatched
            )
        } else if job.judging.precision() == Precision::Fp16 && reach > fp16_max {
            let beyond = record.map(|r| r.metrics.ref_fp16_overflow).unwrap_or(0);
            format!("{} ({}): its output reaches {reach:.4e} in the reference, {beyond} values beyond the FP16 maximum {fp16_max}; {} values are inf/NaN in the candidate", n.node, n.op_type, n.mismatched)
        } else {
            format!(
                "{} ({}): {} inf/NaN values from finite inputs (cause not classified)",
                n.node, n.op_type, n.mismatched
            )
        }
    };
    if let Some(together) = counterfactual::breaks_together_used(checks) {
        let partial: Vec<&layerwise_analysis::KeepCheck> = counterfactual::partial_breaks(checks).collect();
        return Some(format!(
            "output '{worst}' diverges; its error needs {} breaks, none enough alone: {}; keeping them together at reference precision {} (measured by the counterfactual)",
            partial.len(),
            partial
                .iter()
                .map(|c| format!("{} (removes {:.0}% alone)", cause(&c.node), 100.0 * c.explained))
                .collect::<Vec<_>>()
                .join("; "),
            if together.fixes { "brings every output within tolerance".to_string() } else { together.effect(before, Some(worst), extras.counterfactual.as_ref().is_some_and(|c| c.shape_differs)) }
        ));
    }
    let together = checks.iter().find(|c| c.reason == counterfactual::ORIGINS_TOGETHER)?;
    let origins = counterfactual::independent_origins(job, verdict);
    let alone = checks.iter().filter(|c| c.reason != counterfactual::AS_CONVERTED).count() - 1;
    Some(format!(
        "output '{worst}' diverges; inf/NaN are born at {} independent places, each needing a fix: {}; keeping them together at reference precision {}, and keeping {} alone leaves '{worst}' with inf/NaN (measured by the counterfactual)",
        origins.len(),
        origins.iter().map(|o| cause(o)).collect::<Vec<_>>().join("; "),
        counterfactual::together_outcome(together),
        match alone {
            1 => "the one break checked".to_string(),
            n => format!("any one of the {n} breaks checked"),
        }
    ))
}

/// A quantized candidate's activation quantizers under the reference tensors they hold (empty
/// for any other candidate).
fn quantizer_ranges(job: &Job) -> std::collections::HashMap<String, layerwise_model::quant::QuantizerRange> {
    let (Some(_), Some((cm, ci))) = (&job.judging.quantization, &job.cand_model) else { return Default::default() };
    let names = job.reference_names();
    let of = reference_of(&job.index, &names);
    layerwise_model::quant::activation_ranges(cm.graph(), ci, &of)
}

/// What a quantized candidate's quantizers do to the reference's values, for the causes: each
/// activation quantizer that holds a failing tensor or one a failing node reads, measured on the
/// reference's values (kept from the comparison, else from one reference run of those tensors
/// alone), and every weight stored with one scale.
fn measure_quantizers(
    job: &mut Job,
    feeds: &[(String, Tensor)],
    compared: &mut Compared,
    steps: &mut Steps,
) -> Result<()> {
    let (Some(_), Some((cm, ci))) = (&job.judging.quantization, &job.cand_model) else { return Ok(()) };
    let comparison = &mut compared.comparison;
    comparison.per_tensor_weights =
        layerwise_model::quant::per_tensor_weights(job.model.graph(), &job.index, cm.graph(), ci)
            .into_iter()
            .map(|w| (w.weight.clone(), w))
            .collect();
    comparison.integer_accumulations = layerwise_model::quant::integer_accumulations(cm.graph(), ci)
        .into_iter()
        .map(|a| (a.node.clone(), a))
        .collect();
    let failing: std::collections::HashSet<&str> =
        comparison.records.iter().filter(|r| !r.pass).map(|r| r.name.as_str()).collect();
    let feeds_a_failure = |t: &str| {
        job.index.consumers(t).iter().any(|&c| job.index.nodes[c].outputs.iter().any(|o| failing.contains(o.as_str())))
    };
    // A Sqrt's input under a failing quotient (LayerNorm's variance) rounds the denominator too.
    let under_a_failing_sqrt = |t: &str| {
        job.index
            .consumers(t)
            .iter()
            .map(|&c| &job.index.nodes[c])
            .filter(|n| n.op_type == "Sqrt")
            .any(|n| n.outputs.iter().any(|o| feeds_a_failure(o)))
    };
    let mut wanted: Vec<String> = comparison
        .quantizers
        .keys()
        .filter(|t| failing.contains(t.as_str()) || feeds_a_failure(t) || under_a_failing_sqrt(t))
        .cloned()
        .collect();
    wanted.sort();
    if wanted.is_empty() {
        return Ok(());
    }
    let fed = |t: &str| feeds.iter().find(|(n, _)| n == t).map(|(_, v)| v.clone());
    let kept = compared.tensors.as_ref().map(|(r, _)| r);
    let computed: Vec<String> = wanted
        .iter()
        .filter(|t| fed(t).is_none() && !kept.is_some_and(|k| k.contains_key(t.as_str())))
        .cloned()
        .collect();
    let run = if computed.is_empty() {
        std::collections::HashMap::new()
    } else {
        steps
            .run("measuring the quantizers on the reference", || {
                job.run_reference(feeds, &Selection::Names(computed.clone()))
            })?
            .tensors
    };
    let comparison = &mut compared.comparison;
    for t in &wanted {
        let Some(values) = fed(t)
            .or_else(|| run.get(t).cloned())
            .or_else(|| compared.tensors.as_ref().and_then(|(r, _)| r.get(t).cloned()))
        else {
            continue;
        };
        let range = comparison.quantizers[t];
        comparison.quantizer_effects.insert(t.clone(), job.judging.quantizer_effect(t, &range, &values));
    }
    Ok(())
}

/// A quantized candidate's floor is what its quantizers' resolution does, each at the step its
/// values need: a step that outliers force on an activation, that a zero point leaving half the
/// codes unused coarsens, or that one large channel forces on a weight stored with one scale, is
/// the fault the causes name, and left in the floor it hides that fault under a floor far above
/// the candidate (measured: floor 3.4e1 against a candidate's 9.5e-1). Those take the step fit to
/// their bulk or their side of 0, or one per channel; returns what was refit.
fn refit_faulty_steps(
    steps: &mut layerwise_model::quant::QuantizerSteps,
    comparison: &layerwise_analysis::Comparison,
) -> Vec<String> {
    use layerwise_model::quant::Step;
    let mut refit = Vec::new();
    for (tensor, step) in &mut steps.activations {
        if let (Some(e), Step::Absolute(s)) =
            (comparison.quantizer_effects.get(tensor.as_str()).filter(|e| e.step_forced_by_outliers()), *step)
        {
            refit.push(format!("'{tensor}' (step {s:.2e} forced by outliers, taken as {:.2e})", e.bulk_scale));
            *step = Step::Absolute(e.bulk_scale);
        } else if let (Some(shift), Step::Absolute(s)) =
            (comparison.quantizer_effects.get(tensor.as_str()).and_then(|e| e.zero_point_shift.as_ref()), *step)
        {
            refit.push(format!(
                "'{tensor}' (step {s:.2e} of a zero point that leaves {:.0}% of the codes unused, taken as {:.2e})",
                100.0 * shift.unused(),
                shift.fit_scale
            ));
            *step = Step::Absolute(shift.fit_scale);
        }
    }
    for w in &mut steps.weights {
        if let Some(channels) =
            comparison.per_tensor_weights.get(&w.weight).filter(|c| c.unequal() && w.steps.len() == 1)
        {
            refit.push(format!(
                "'{}' (one scale {:.2e} for channels {:.0}x apart, taken per channel)",
                w.weight,
                channels.scale,
                {
                    let live = channels.channel_max.iter().copied().filter(|m| *m > 0.0);
                    live.clone().fold(0f32, f32::max) / live.fold(f32::INFINITY, f32::min)
                }
            ));
            w.steps = channels.own_steps();
            w.axis = channels.axis;
        }
    }
    refit
}
