//! `--devices 0,1`: the samples of `--inputs DIR` spread over GPUs within one machine, one job per
//! GPU at once, taking samples from one shared queue; the steps after the walk run once, by the
//! job that holds the verdict's sample.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use anyhow::{anyhow, bail, Context, Result};
use layerwise_analysis::{chosen_sample, SampleData};
use layerwise_report::Report;

use super::bisect::{bisect_from_queue, SampleQueue};
use super::options::{BisectOptions, Marking};
use super::setup::samples;

/// Runs the samples of `options.inputs` (a folder) over `devices`: one job per GPU, all at once,
/// each taking the next sample not yet taken (so a GPU that is faster, or a job whose samples are
/// quicker, takes more). When the queue is empty each job hands its samples' numbers over; the
/// one holding the whole set's verdict sample (diverged first, then the largest output error, the earliest on ties,
/// as one run chooses) runs the noise floor, the nodes alone and the counterfactual on its GPU
/// and writes the report with the aggregation over every sample; the others stop. The report is
/// what one run over every sample writes (`run_info` aside); its candidate notes say how the
/// samples were spread and where the follow-up steps ran.
pub fn bisect_on_devices(options: &BisectOptions, devices: &[u32]) -> Result<Report> {
    if devices.is_empty() {
        bail!("--devices needs at least one GPU index");
    }
    if options.shard.is_some() {
        bail!("--devices and --shard do not combine: --devices already splits the samples into one shard per GPU");
    }
    if options.mark != Marking::All {
        bail!("--devices spreads the samples of --inputs DIR, and --mark search runs one sample; use --mark all");
    }
    if options.inputs.npz.as_ref().is_none_or(|d| !d.is_dir()) {
        bail!("--devices spreads the samples of --inputs DIR over GPUs; give a folder of .npz files");
    }
    if !options.reference.ort_gpu() && !options.candidate.ort_gpu() {
        bail!(
            "--devices spreads samples over GPUs, but neither --ref {} nor --cand {} runs on one",
            options.reference,
            options.candidate
        );
    }
    if options.save_tensors.is_some() {
        bail!("--devices and --save-tensors do not combine: each GPU's job would write its own samples' tensors; run without --devices to save them");
    }
    for spec in [&options.reference, &options.candidate] {
        spec.on_device(devices[0])?;
    }
    let total = samples(&options.inputs)?.len();
    let count = devices.len().min(total);
    let jobs: Vec<(String, BisectOptions)> = devices[..count]
        .iter()
        .map(|&d| (format!("GPU {d}"), BisectOptions { device: Some(d), ..options.clone() }))
        .collect();
    spread_over_jobs(options, jobs)
}

/// The samples of `options.inputs` (a folder) spread over `jobs` run at once, each named by its
/// label (`GPU 1`), as [`bisect_on_devices`] describes; public so that the spreading and the
/// merged report can be checked on the CPU.
pub fn spread_over_jobs(options: &BisectOptions, jobs: Vec<(String, BisectOptions)>) -> Result<Report> {
    let total = samples(&options.inputs)?.len();
    let count = jobs.len();
    if count == 0 || count > total {
        bail!("{count} jobs for {total} samples: give between one job and one per sample");
    }
    let (labels, jobs): (Vec<String>, Vec<BisectOptions>) = jobs
        .into_iter()
        .map(|(label, o)| {
            (
                label,
                BisectOptions {
                    shard: None,
                    outputs: Default::default(),
                    progress: false,
                    progress_lines: false,
                    repro: None,
                    ..o
                },
            )
        })
        .unzip();
    let next = AtomicUsize::new(0);
    let (to_lead, from_jobs) = mpsc::channel();
    let mut replies = Vec::new();
    let mut links = Vec::new();
    for j in 0..count {
        let (reply, from_lead) = mpsc::channel();
        replies.push(reply);
        links.push(QueueLink { job: j, next: &next, to_lead: Some(to_lead.clone()), from_lead });
    }
    drop(to_lead);
    let (results, spread) = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .zip(links)
            .map(|(o, mut link)| {
                scope.spawn(move || {
                    // Every job's CPU sessions get an equal share of the cores while they run at once.
                    let _share = layerwise_runtime::share_cpu();
                    let result = bisect_from_queue(o, &mut link);
                    link.fail_if_not_handed_over();
                    result
                })
            })
            .collect();
        let spread = lead(from_jobs, &replies, count);
        drop(replies);
        let results: Vec<Result<Option<super::BisectOutcome>>> =
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a GPU's job panicked")))).collect();
        (results, spread)
    });
    let mut carried = None;
    for (j, r) in results.into_iter().enumerate() {
        if let Some(outcome) = r.with_context(|| format!("the job on {}", labels[j]))? {
            carried = Some((j, outcome.report));
        }
    }
    let spread = spread?;
    let (j, mut report) = carried.ok_or_else(|| anyhow!("no GPU's job carried the verdict"))?;
    let taken = spread.iter().zip(&labels).map(|(n, label)| format!("{label} ran {n}")).collect::<Vec<_>>().join(", ");
    report.cand.notes.push(format!(
        "{total} samples spread over {count} jobs at once with --devices, taken from one queue ({taken}); the steps after the walk ran once, on {}, which ran the verdict's sample",
        labels[j]
    ));
    Ok(report)
}

/// Waits for every job's samples, tells the one holding the verdict's sample to go on (with every
/// job's numbers) and the others to stop. Returns how many samples each job ran. A job that failed
/// before handing over stops the others; its error is the one reported.
fn lead(
    from_jobs: mpsc::Receiver<(usize, Option<Vec<SampleData>>)>,
    replies: &[mpsc::Sender<Option<Vec<SampleData>>>],
    count: usize,
) -> Result<Vec<usize>> {
    let mut handed: Vec<Option<Vec<SampleData>>> = vec![None; count];
    let mut failed = false;
    for _ in 0..count {
        // Every job sends once (its samples, or that it failed); a job that panicked dropped its sender.
        match from_jobs.recv() {
            Ok((j, Some(data))) => handed[j] = Some(data),
            Ok((_, None)) | Err(_) => {
                failed = true;
                break;
            }
        }
    }
    if failed {
        for reply in replies {
            let _ = reply.send(None);
        }
        bail!("a GPU's job failed");
    }
    let spread: Vec<usize> = handed.iter().map(|d| d.as_ref().map_or(0, Vec::len)).collect();
    let mut every: Vec<(SampleData, usize)> = handed
        .into_iter()
        .enumerate()
        .flat_map(|(j, d)| d.unwrap_or_default().into_iter().map(move |s| (s, j)))
        .collect();
    // The folder's order, as one run takes the samples.
    every.sort_by(|a, b| a.0.run.sample.cmp(&b.0.run.sample));
    let data: Vec<SampleData> = every.iter().map(|(d, _)| d.clone()).collect();
    let carrier = chosen_sample(&data).map(|c| every[c].1);
    for (j, reply) in replies.iter().enumerate() {
        let _ = reply.send((Some(j) == carrier).then(|| data.clone()));
    }
    Ok(spread)
}

/// A job's end of the shared queue and of its line to the lead.
struct QueueLink<'a> {
    job: usize,
    next: &'a AtomicUsize,
    /// Taken when the samples are handed over, so that the lead sees every sender gone once all
    /// jobs have handed over or died.
    to_lead: Option<mpsc::Sender<(usize, Option<Vec<SampleData>>)>>,
    from_lead: mpsc::Receiver<Option<Vec<SampleData>>>,
}

impl QueueLink<'_> {
    /// A job that ended (in error) before handing its samples over tells the lead, so that the
    /// others are not kept waiting.
    fn fail_if_not_handed_over(&mut self) {
        if let Some(to_lead) = self.to_lead.take() {
            // The others take no more samples.
            self.next.store(usize::MAX / 2, Ordering::SeqCst);
            let _ = to_lead.send((self.job, None));
        }
    }
}

impl SampleQueue for QueueLink<'_> {
    fn next(&mut self) -> Option<usize> {
        Some(self.next.fetch_add(1, Ordering::SeqCst))
    }

    fn next_batch(&mut self, n: usize) -> Vec<usize> {
        // Every job takes `n` at a time from 0, so the batches are those of a single run.
        let first = self.next.fetch_add(n, Ordering::SeqCst);
        (first..first.saturating_add(n)).collect()
    }

    fn hand_over(&mut self, data: Vec<SampleData>) -> Result<Option<Vec<SampleData>>> {
        let to_lead = self.to_lead.take().ok_or_else(|| anyhow!("a job handed its samples over twice"))?;
        // A lead that is gone stopped because another job failed: that job's error is the one told.
        if to_lead.send((self.job, Some(data))).is_err() {
            return Ok(None);
        }
        drop(to_lead);
        Ok(self.from_lead.recv().unwrap_or(None))
    }
}
