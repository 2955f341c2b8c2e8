//! `--devices 0,1`: the samples of `--inputs DIR` spread over GPUs within one machine, one shard
//! per GPU run at the same time, combined as `layerwise merge` combines shards.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use layerwise_report::Report;

use super::options::{BisectOptions, Marking};
use super::setup::samples;
use super::bisect;

/// Runs the samples of `options.inputs` (a folder) over `devices`: shard `j` of `N` (samples
/// `k` with `k % N == j`) on `devices[j]`, all shards at once, then merges them. The merged
/// report is what one run over every sample writes (`run_info` aside); its candidate notes say
/// which GPU ran which shard.
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
        bail!("--devices spreads samples over GPUs, but neither --ref {} nor --cand {} runs on one", options.reference, options.candidate);
    }
    for spec in [&options.reference, &options.candidate] {
        spec.on_device(devices[0])?;
    }
    let total = samples(&options.inputs)?.len();
    let count = devices.len().min(total);
    let shards: Vec<BisectOptions> = (0..count)
        .map(|j| BisectOptions {
            shard: Some((j, count)),
            device: Some(devices[j]),
            outputs: Default::default(),
            progress: false,
            progress_lines: false,
            repro: None,
            ..options.clone()
        })
        .collect();
    let results: Vec<Result<Report>> = std::thread::scope(|scope| {
        let handles: Vec<_> = shards.iter().map(|o| scope.spawn(move || bisect(o).map(|out| out.report))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a shard's thread panicked")))).collect()
    });
    let mut partials = Vec::new();
    for (j, r) in results.into_iter().enumerate() {
        let report = r.with_context(|| format!("shard {j} of {count} on GPU {}", devices[j]))?;
        partials.push((PathBuf::from(format!("shard {j} on GPU {}", devices[j])), report));
    }
    let mut merged = crate::merge::merge_reports(partials)?;
    let spread = (0..count).map(|j| format!("shard {j} on GPU {}", devices[j])).collect::<Vec<_>>().join(", ");
    merged.cand.notes.push(format!("{total} samples spread over {count} GPUs with --devices: {spread}"));
    Ok(merged)
}
