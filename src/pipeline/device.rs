//! Samples compared on the GPU where both sides ran (issue 41): with the reference and the
//! candidate on ONNX Runtime's CUDA provider of one GPU, each side's every tensor stays in GPU
//! memory and each pair is reduced there (`layerwise_runtime::device_stats`); only the totals
//! come to the host, where they become the same metrics the host computes. Copying every tensor
//! out was about 100x a plain run of PP-OCRv4's recognizer on an H100 (docs/gpu.md).

use std::collections::HashMap;

use anyhow::{anyhow, Result};
use layerwise_analysis::{compute, metrics_of_totals, missing_reason, tensor_record, Comparison, MemoryPlan, Metrics, TensorRecord};
use layerwise_model::Selection;
use layerwise_runtime::device_stats::{sample_layouts, DevicePair, DeviceReducer, ElementKind, SampleLayout};
use layerwise_runtime::{DType, DeviceTensor, ExecutionProvider, RunRequest, Tensor};

use super::compare::{Compared, Job};
use super::steps::Steps;

/// `memory.comparison` of a sample compared on the GPU.
pub const DEVICE: &str = "device";

/// Set to `0` to compare on the host even where both sides run on one GPU (benchmarks of the two).
const OFF_SWITCH: &str = "LAYERWISE_DEVICE_COMPARE";

impl Job<'_> {
    /// The GPU both sides run on, where this job's samples can be compared there: both on ONNX
    /// Runtime's CUDA provider of the same GPU, every tensor asked for, and nothing needing the
    /// tensors on the host afterwards (`keep_tensors`: one sample, whose later steps read them, or
    /// `--save-tensors`).
    pub(super) fn device_of_both(&self, keep_tensors: bool) -> Option<u32> {
        if keep_tensors || self.options.selection != Selection::All || self.judging.quantization.is_some() || std::env::var(OFF_SWITCH).is_ok_and(|v| v == "0") {
            return None;
        }
        // The outputs passed straight from an input are the values fed, which no run returns.
        if !layerwise_analysis::passed_through(&self.index).is_empty() {
            return None;
        }
        match (self.reference.ort_options()?.ep, self.candidate.ort_options()?.ep) {
            (ExecutionProvider::Cuda { device: r, .. }, ExecutionProvider::Cuda { device: c, .. }) if r.unwrap_or(0) == c.unwrap_or(0) => Some(r.unwrap_or(0)),
            _ => None,
        }
    }

    /// One sample compared on the GPU (see the module), or `None` where it cannot be: the sides
    /// run elsewhere, or the kernels could not be built (the reason goes to the notes, once, and
    /// the tensors are copied out as before).
    pub(super) fn compare_on_device(&mut self, feeds: &[(String, Tensor)], steps: &mut Steps, keep_tensors: bool) -> Result<Option<Compared>> {
        let Some(device) = self.device_of_both(keep_tensors) else { return Ok(None) };
        if !self.reducer_on(device, steps) {
            return Ok(None);
        }
        let request = RunRequest { model: self.model, index: &self.index, inputs: feeds, selection: &Selection::All };
        let reference_label = format!("running reference {} (tensors left on GPU {device})", self.options.reference);
        let reference_run = steps.run(&reference_label, || {
            let run = self.reference.run_on_device(&request).ok_or_else(|| anyhow!("the reference does not run on CUDA"))?;
            run.map_err(|e| anyhow!(e)).map_err(|e| e.context(format!("reference {}", self.options.reference)))
        })?;
        let cand_selection = self.candidate_selection(&Selection::All);
        let cand_request = match &self.cand_model {
            Some((cm, ci)) => RunRequest { model: cm, index: ci, inputs: feeds, selection: &cand_selection },
            None => RunRequest { model: self.model, index: &self.index, inputs: feeds, selection: &Selection::All },
        };
        let candidate_label = format!("running candidate {} (tensors left on GPU {device})", self.options.candidate);
        let candidate_run = steps.run(&candidate_label, || {
            let run = self.candidate.run_on_device(&cand_request).ok_or_else(|| anyhow!("the candidate does not run on CUDA"))?;
            run.map_err(|e| anyhow!(e)).map_err(|e| e.context(format!("candidate {}", self.options.candidate)))
        })?;
        // The candidate's tensors under the reference names they were paired with (a separate
        // candidate model names its own).
        let candidate_of: HashMap<&str, &DeviceTensor> = match &self.cand_model {
            Some(_) => self.cand_names.iter().filter_map(|(r, c)| candidate_run.tensors.get(c).map(|t| (r.as_str(), t))).collect(),
            None => candidate_run.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect(),
        };
        let reducer = self.device_reducer.as_mut().expect("built above");
        let (index, tolerances) = (&self.index, &self.judging.tolerances);
        let names = compared_names(&self.order, &index.outputs);
        let compared = steps.run("comparing tensors on the GPU", || {
            let mut records: Vec<TensorRecord> = Vec::new();
            let mut not_compared = Vec::new();
            let mut on_device: Vec<(&str, &DeviceTensor, &DeviceTensor, DevicePair)> = Vec::new();
            for name in names {
                let Some((r, c)) = both_sides(index, name, &reference_run, &candidate_of, &mut not_compared) else { continue };
                let tol = tolerances.of(name);
                match (element_kind(r.dtype), element_kind(c.dtype)) {
                    (Some(rk), Some(ck)) if r.shape == c.shape => {
                        let len = r.shape.iter().product();
                        let pair = DevicePair { reference: r.ptr, candidate: c.ptr, len, blocks: 1, reference_stride: len, candidate_stride: len, reference_kind: rk, candidate_kind: ck, atol: tol.atol, rtol: tol.rtol, range_tol: tol.range_tol };
                        on_device.push((name.as_str(), r, c, pair));
                    }
                    // Other element types (indices, shapes) are few and small: compared on the host.
                    _ => {
                        let (rv, cv) = (downloaded(reducer, r)?, downloaded(reducer, c)?);
                        records.push(tensor_record(index, name, (&r.shape, r.dtype), (&c.shape, c.dtype), || compute(&rv.to_f32(), &cv.to_f32(), tol)));
                    }
                }
            }
            let pairs: Vec<DevicePair> = on_device.iter().map(|(_, _, _, p)| *p).collect();
            let totals = reducer.reduce(&pairs).map_err(|e| anyhow!("comparing on GPU {device}: {e}"))?;
            for ((name, r, c, _), t) in on_device.iter().zip(&totals) {
                let metrics = metrics_of_totals(t);
                records.push(tensor_record(index, name, (&r.shape, r.dtype), (&c.shape, c.dtype), || metrics));
            }
            let reference_bytes: usize = on_device.iter().map(|(_, r, _, _)| r.shape.iter().product::<usize>() * r.dtype.size()).sum();
            Ok((records, not_compared, reference_bytes, pairs.len()))
        })?;
        let (records, mut not_compared, reference_bytes, reduced) = compared;
        // A backend's own reason (not a tensor type) says more than "missing".
        for (t, why) in reference_run.unavailable.iter().chain(&candidate_run.unavailable) {
            if let Some(entry) = not_compared.iter_mut().find(|(n, _)| n == t) {
                entry.1 = why.clone();
            }
        }
        let mut candidate_notes = candidate_run.notes.clone();
        candidate_notes.extend(self.batch_note());
        // Which GPU is said by `--devices`' own note: the report is the same whichever ran it.
        candidate_notes.push(format!(
            "compared on the GPU where both sides ran: {reduced} tensor pairs reduced there by layerwise's own CUDA kernels (float64 totals, built with NVRTC), only their totals copied to the host"
        ));
        let memory = MemoryPlan {
            budget_bytes: None,
            estimated_bytes: reference_bytes as u64,
            groups: 1,
            largest_group_bytes: 0,
            shapes_from: "the runs on the GPU".into(),
            comparison: DEVICE.into(),
            separate_because: None,
        };
        let unavailable = reference_run.unavailable.iter().chain(&candidate_run.unavailable).cloned().collect();
        Ok(Some(Compared {
            comparison: Comparison::from_records(records, not_compared, &self.order),
            tensors: None,
            histograms: HashMap::new(),
            notes: (reference_run.notes.clone(), candidate_notes),
            unavailable,
            engine_layers: Vec::new(),
            memory: Some(memory),
            deployed_differs: Vec::new(),
        }))
    }

    /// Whether the GPU reduction kernels are built for `device` (built on the first call; where
    /// they cannot be, the reason is kept for the notes and this stays false).
    fn reducer_on(&mut self, device: u32, steps: &mut Steps) -> bool {
        if self.device_refused.is_some() {
            return false;
        }
        if self.device_reducer.is_none() {
            match steps.run("building the GPU reduction kernels (NVRTC)", || DeviceReducer::new(device).map_err(|e| anyhow!(e))) {
                Ok(reducer) => self.device_reducer = Some(reducer),
                Err(e) => self.device_refused = Some(format!("{e:#}")),
            }
        }
        self.device_reducer.is_some()
    }

    /// Why samples that could be compared on the GPU were not (the kernels could not be built).
    pub(super) fn device_note(&self) -> Option<String> {
        self.device_refused.as_ref().map(|why| format!("tensors copied to the host to be compared: the GPU reduction could not be used ({why})"))
    }
}

/// Both sides' `name`, or `None` with the side that lacks it said in `not_compared`.
fn both_sides<'a>(
    index: &layerwise_model::GraphIndex,
    name: &str,
    reference: &'a layerwise_runtime::DeviceRun,
    candidate_of: &HashMap<&str, &'a DeviceTensor>,
    not_compared: &mut Vec<(String, String)>,
) -> Option<(&'a DeviceTensor, &'a DeviceTensor)> {
    match (reference.tensors.get(name), candidate_of.get(name)) {
        (Some(r), Some(c)) => Some((r, *c)),
        (None, _) => {
            not_compared.push((name.to_string(), missing_reason(index, name, "reference")));
            None
        }
        (_, None) => {
            not_compared.push((name.to_string(), missing_reason(index, name, "candidate")));
            None
        }
    }
}

/// The tensors compared, in order: the job's order, then any model output not in it.
fn compared_names<'a>(order: &'a [String], outputs: &'a [String]) -> Vec<&'a String> {
    let mut names: Vec<&String> = Vec::new();
    for t in order.iter().chain(outputs) {
        if !names.contains(&t) {
            names.push(t);
        }
    }
    names
}

fn element_kind(dtype: DType) -> Option<ElementKind> {
    match dtype {
        DType::F32 => Some(ElementKind::F32),
        DType::F16 => Some(ElementKind::F16),
        DType::BF16 => Some(ElementKind::Bf16),
        _ => None,
    }
}

fn downloaded(reducer: &mut DeviceReducer, t: &DeviceTensor) -> Result<Tensor> {
    let bytes = t.shape.iter().product::<usize>() * t.dtype.size();
    let raw = reducer.download(t.ptr, bytes).map_err(|e| anyhow!(e))?;
    Tensor::from_le_bytes(t.dtype, t.shape.clone(), &raw).ok_or_else(|| anyhow!("a {} tensor copied from the GPU could not be read", t.dtype.name()))
}


fn shape_text(shape: &[usize]) -> String {
    format!("[{}]", shape.iter().map(usize::to_string).collect::<Vec<_>>().join("x"))
}

/// The samples' inputs as one batch: each input concatenated along its first dimension, in the
/// samples' order. The samples must give every input the same shape.
pub(crate) fn batched_feeds(samples: &[Vec<(String, Tensor)>]) -> Result<Vec<(String, Tensor)>, String> {
    let first = samples.first().ok_or("no sample")?;
    let mut out = Vec::new();
    for (i, (name, t)) in first.iter().enumerate() {
        if t.shape.is_empty() {
            return Err(format!("input '{name}' is a scalar: there is no first dimension to put samples in"));
        }
        let mut bytes = Vec::with_capacity(t.size_bytes() * samples.len());
        for s in samples {
            let (n, v) = &s[i];
            if n != name || v.shape != t.shape || v.dtype() != t.dtype() {
                return Err(format!("input '{name}' differs in shape or type between samples"));
            }
            bytes.extend(v.to_le_bytes());
        }
        let mut shape = t.shape.clone();
        shape[0] *= samples.len();
        out.push((name.clone(), Tensor::from_le_bytes(t.dtype(), shape, &bytes).ok_or("a batched input could not be assembled")?));
    }
    Ok(out)
}

/// How far a batched run's value of a sample may be from the same sample run alone (relative
/// L2): float32 kernels chosen for another batch size reorder sums (about 1e-6 relative); a
/// tensor whose samples lie elsewhere differs by its whole size.
const BATCH_CHECK_REL_L2: f64 = 1e-3;

impl Job<'_> {
    /// `--batch N`: several samples compared on the GPU in one run of each side (see
    /// [`Job::compare_on_device`]). The first batch is checked against its first sample run
    /// alone: every tensor's samples must lie in its first dimension and the values of that
    /// sample agree (`BATCH_CHECK_REL_L2`). `None` where batching does not apply or the check
    /// failed (the reason goes to the notes); the caller then compares the samples one by one.
    /// A batch shorter than `--batch` runs padded with copies of its last sample (one session
    /// for every batch); only the samples' own comparisons are returned.
    pub(super) fn compare_batch_on_device(&mut self, samples: &[Vec<(String, Tensor)>], steps: &mut Steps) -> Result<Option<Vec<Compared>>> {
        let width = self.options.batch;
        if width < 2 || self.batch_refused.is_some() || samples.is_empty() {
            return Ok(None);
        }
        let Some(device) = self.device_of_both(false) else { return Ok(None) };
        if !self.reducer_on(device, steps) {
            return Ok(None);
        }
        let mut padded: Vec<Vec<(String, Tensor)>> = samples.to_vec();
        while padded.len() < width {
            padded.push(samples.last().expect("one sample").clone());
        }
        let feeds = match batched_feeds(&padded) {
            Ok(f) => f,
            Err(why) => {
                self.batch_refused = Some(why);
                return Ok(None);
            }
        };
        // The check run: the batch's first sample alone, the reference side.
        let alone = if self.batch_layouts.is_none() {
            let request = RunRequest { model: self.model, index: &self.index, inputs: &samples[0], selection: &Selection::All };
            let run = steps.run(&format!("running reference {} on one sample (to check the batch)", self.options.reference), || {
                self.reference.run_on_device(&request).ok_or_else(|| anyhow!("the reference does not run on CUDA"))?.map_err(|e| anyhow!(e))
            })?;
            Some(run)
        } else {
            None
        };
        let request = RunRequest { model: self.model, index: &self.index, inputs: &feeds, selection: &Selection::All };
        let label = format!("running reference {} on {width} samples at once (tensors left on GPU {device})", self.options.reference);
        let reference_run = steps.run(&label, || self.reference.run_on_device(&request).ok_or_else(|| anyhow!("the reference does not run on CUDA"))?.map_err(|e| anyhow!(e)))?;
        let cand_selection = self.candidate_selection(&Selection::All);
        let cand_request = match &self.cand_model {
            Some((cm, ci)) => RunRequest { model: cm, index: ci, inputs: &feeds, selection: &cand_selection },
            None => RunRequest { model: self.model, index: &self.index, inputs: &feeds, selection: &Selection::All },
        };
        let label = format!("running candidate {} on {width} samples at once (tensors left on GPU {device})", self.options.candidate);
        let candidate_run = steps.run(&label, || self.candidate.run_on_device(&cand_request).ok_or_else(|| anyhow!("the candidate does not run on CUDA"))?.map_err(|e| anyhow!(e)))?;
        let candidate_of: HashMap<&str, &DeviceTensor> = match &self.cand_model {
            Some(_) => self.cand_names.iter().filter_map(|(r, c)| candidate_run.tensors.get(c).map(|t| (r.as_str(), t))).collect(),
            None => candidate_run.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect(),
        };
        let reducer = self.device_reducer.as_mut().expect("built above");
        if let Some(alone) = &alone {
            let one: HashMap<String, Vec<usize>> = alone.tensors.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
            let batched: HashMap<String, Vec<usize>> = reference_run.tensors.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
            let checked = sample_layouts(&one, &batched, width).and_then(|layouts| {
                check_first_sample(reducer, alone, &reference_run, &layouts).map(|()| layouts)
            });
            match checked {
                Ok(layouts) => self.batch_layouts = Some((layouts, batched)),
                Err(why) => {
                    self.batch_refused = Some(why);
                    return Ok(None);
                }
            }
        }
        let (layouts, checked_shapes) = self.batch_layouts.as_ref().expect("checked on the first batch");
        // A later batch of other shapes (another input size) is not the batch that was checked.
        if let Some((name, t)) = reference_run.tensors.iter().find(|(n, t)| checked_shapes.get(n.as_str()).is_some_and(|s| *s != t.shape)) {
            self.batch_refused = Some(format!("a later batch gives tensor '{name}' the shape {}, not the checked batch's", shape_text(&t.shape)));
            return Ok(None);
        }
        let (index, tolerances) = (&self.index, &self.judging.tolerances);
        let names = compared_names(&self.order, &index.outputs);
        let count = samples.len();
        let results = steps.run(&format!("comparing {count} samples' tensors on the GPU"), || {
            let mut records: Vec<Vec<TensorRecord>> = vec![Vec::new(); count];
            let mut not_compared = Vec::new();
            // (sample, name, per-sample shapes and types, pair)
            let mut on_device: Vec<(usize, &str, (Vec<usize>, DType), (Vec<usize>, DType), DevicePair)> = Vec::new();
            for name in names {
                let Some((r, c)) = both_sides(index, name, &reference_run, &candidate_of, &mut not_compared) else { continue };
                let layout = layouts.get(name.as_str()).copied().ok_or_else(|| anyhow!("tensor '{name}' was not in the checked batch"))?;
                let (rs, cs) = (layout.per_sample(&r.shape, width), layout.per_sample(&c.shape, width));
                let tol = tolerances.of(name);
                let split_ok = r.shape == c.shape;
                match (element_kind(r.dtype), element_kind(c.dtype)) {
                    (Some(rk), Some(ck)) if split_ok => {
                        for k in 0..count {
                            let (first, blocks, block, stride) = layout.part(k, width, r.shape.iter().product());
                            let at = |t: &DeviceTensor| (t.ptr as usize + first * t.dtype.size()) as *const std::ffi::c_void;
                            let pair = DevicePair {
                                reference: at(r),
                                candidate: at(c),
                                len: blocks * block,
                                blocks,
                                reference_stride: stride,
                                candidate_stride: stride,
                                reference_kind: rk,
                                candidate_kind: ck,
                                atol: tol.atol,
                                rtol: tol.rtol,
                                range_tol: tol.range_tol,
                            };
                            on_device.push((k, name.as_str(), (rs.clone(), r.dtype), (cs.clone(), c.dtype), pair));
                        }
                    }
                    _ if !split_ok => {
                        for record in records.iter_mut() {
                            record.push(tensor_record(index, name, (&rs, r.dtype), (&cs, c.dtype), Metrics::default));
                        }
                    }
                    _ => {
                        let (rv, cv) = (downloaded(reducer, r)?, downloaded(reducer, c)?);
                        let (rf, cf) = (rv.to_f32(), cv.to_f32());
                        for (k, record) in records.iter_mut().enumerate() {
                            let (first, blocks, block, stride) = layout.part(k, width, rf.len());
                            let gather = |v: &[f32]| -> Vec<f32> { (0..blocks).flat_map(|b| v[first + b * stride..first + b * stride + block].iter().copied()).collect() };
                            let (rk, ck) = (gather(&rf), gather(&cf));
                            record.push(tensor_record(index, name, (&rs, r.dtype), (&cs, c.dtype), || compute(&rk, &ck, tol)));
                        }
                    }
                }
            }
            let pairs: Vec<DevicePair> = on_device.iter().map(|(.., p)| *p).collect();
            let totals = reducer.reduce(&pairs).map_err(|e| anyhow!("comparing on GPU {device}: {e}"))?;
            for ((k, name, r, c, _), t) in on_device.iter().zip(&totals) {
                let metrics = metrics_of_totals(t);
                records[*k].push(tensor_record(index, name, (&r.0, r.1), (&c.0, c.1), || metrics));
            }
            Ok((records, not_compared, pairs.len()))
        })?;
        let (records, mut not_compared, reduced) = results;
        for (t, why) in reference_run.unavailable.iter().chain(&candidate_run.unavailable) {
            if let Some(entry) = not_compared.iter_mut().find(|(n, _)| n == t) {
                entry.1 = why.clone();
            }
        }
        let mut candidate_notes = candidate_run.notes.clone();
        candidate_notes.push(format!(
            "compared on the GPU where both sides ran, {width} samples in each run of either side (their first dimension; each tensor's samples found there and checked against one sample run alone, within {BATCH_CHECK_REL_L2:.0e} relative L2): {reduced} tensor pairs of this batch reduced there by layerwise's own CUDA kernels (float64 totals, built with NVRTC), only their totals copied to the host; a batched run may choose other GPU kernels than a run of one sample"
        ));
        let unavailable: Vec<(String, String)> = reference_run.unavailable.iter().chain(&candidate_run.unavailable).cloned().collect();
        let bytes = reference_run.tensors.values().map(|t| t.shape.iter().product::<usize>() * t.dtype.size()).sum::<usize>() / width;
        Ok(Some(
            records
                .into_iter()
                .map(|sample_records| {
                    Compared {
                        comparison: Comparison::from_records(sample_records, not_compared.clone(), &self.order),
                        tensors: None,
                        histograms: HashMap::new(),
                        notes: (reference_run.notes.clone(), candidate_notes.clone()),
                        unavailable: unavailable.clone(),
                        engine_layers: Vec::new(),
                        memory: Some(MemoryPlan { budget_bytes: None, estimated_bytes: bytes as u64, groups: 1, largest_group_bytes: 0, shapes_from: "the runs on the GPU".into(), comparison: DEVICE.into(), separate_because: None }),
                        deployed_differs: Vec::new(),
                    }
                })
                .collect(),
        ))
    }

    /// Why `--batch` was not used, where it was asked for and both sides ran on one GPU.
    pub(super) fn batch_note(&self) -> Option<String> {
        self.batch_refused.as_ref().map(|why| format!("--batch {} not used, the samples were run one at a time: {why}", self.options.batch))
    }
}

/// The check of a batch: the reference's values of its first sample equal (within
/// `BATCH_CHECK_REL_L2`) those of that sample run alone, in every float tensor.
fn check_first_sample(reducer: &mut DeviceReducer, alone: &layerwise_runtime::DeviceRun, batched: &layerwise_runtime::DeviceRun, layouts: &HashMap<String, SampleLayout>) -> Result<(), String> {
    let mut names = Vec::new();
    let mut pairs = Vec::new();
    for (name, a) in &alone.tensors {
        let (Some(b), Some(layout)) = (batched.tensors.get(name), layouts.get(name)) else { continue };
        let (Some(ak), Some(bk)) = (element_kind(a.dtype), element_kind(b.dtype)) else { continue };
        let batch = match layout {
            SampleLayout::Split { outer, block, .. } => b.shape.iter().product::<usize>() / (outer * block).max(1),
            SampleLayout::Shared => 1,
        };
        let (first, blocks, block, stride) = layout.part(0, batch, b.shape.iter().product());
        let len = blocks * block;
        if len != a.shape.iter().product::<usize>() || first != 0 {
            return Err(format!("tensor '{name}' holds {} values for one sample and {len} for each of the batch's", a.shape.iter().product::<usize>()));
        }
        // The sample alone holds its values in a row; the batch, every `stride` elements.
        pairs.push(DevicePair { reference: a.ptr, candidate: b.ptr, len, blocks, reference_stride: block, candidate_stride: stride, reference_kind: ak, candidate_kind: bk, atol: 0.0, rtol: 0.0, range_tol: 0.0 });
        names.push(name.clone());
    }
    let totals = reducer.reduce(&pairs)?;
    for (name, t) in names.iter().zip(&totals) {
        let m = metrics_of_totals(t);
        // Equal non-finite values (an overflow both runs share) agree; a mismatch does not.
        if m.nonfinite_mismatch > 0 || m.rel_l2_err > BATCH_CHECK_REL_L2 {
            return Err(format!("tensor '{name}' of the batch's first sample differs from that sample run alone (relative L2 {:.2e}): its samples are not where the batch puts them, or the batch changes what is computed", m.error_level()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_put_one_after_the_other_in_the_first_dimension() {
        let sample = |v: f32| vec![("x".to_string(), Tensor::f32(vec![1, 2], vec![v, v + 0.5])), ("ids".to_string(), Tensor::new(vec![1], layerwise_runtime::TensorData::I64(vec![v as i64])))];
        let batch = batched_feeds(&[sample(1.0), sample(2.0), sample(3.0)]).unwrap();
        assert_eq!(batch[0].1, Tensor::f32(vec![3, 2], vec![1.0, 1.5, 2.0, 2.5, 3.0, 3.5]));
        assert_eq!(batch[1].1, Tensor::new(vec![3], layerwise_runtime::TensorData::I64(vec![1, 2, 3])));
        let other = vec![("x".to_string(), Tensor::f32(vec![1, 3], vec![0.0; 3])), ("ids".to_string(), Tensor::new(vec![1], layerwise_runtime::TensorData::I64(vec![0])))];
        assert!(batched_feeds(&[sample(1.0), other]).unwrap_err().contains("input 'x' differs in shape or type between samples"));
        let scalar = vec![("t".to_string(), Tensor::f32(vec![], vec![1.0]))];
        assert!(batched_feeds(&[scalar.clone(), scalar]).unwrap_err().contains("scalar"));
    }
}
