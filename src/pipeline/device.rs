//! Samples compared on the GPU where both sides ran: with the reference and the
//! candidate on ONNX Runtime's CUDA provider of one GPU, each side's every tensor stays in GPU
//! memory and each pair is reduced there (`layerwise_runtime::device_stats`); only the totals
//! come to the host, where they become the same metrics the host computes. Copying every tensor
//! out was about 100x a plain run of PP-OCRv4's recognizer on an H100 (docs/gpu.md).

use std::collections::HashMap;

use anyhow::{anyhow, Result};
use layerwise_analysis::{
    compute, metrics_of_totals, missing_reason, tensor_record, Comparison, MemoryPlan, Metrics, TensorRecord,
    ToleranceSet,
};
use layerwise_model::{GraphIndex, Selection};
use layerwise_runtime::device_stats::{sample_layouts, DevicePair, DeviceReducer, ElementKind, SampleLayout};
use layerwise_runtime::{shape_string, DType, DeviceRun, DeviceTensor, ExecutionProvider, RunRequest, Tensor};

use super::compare::{Compared, Job};
use super::steps::Steps;

/// Set to `0` to compare on the host even where both sides run on one GPU (benchmarks of the two).
const OFF_SWITCH: &str = "LAYERWISE_DEVICE_COMPARE";

impl Job<'_> {
    /// The GPU both sides run on, where this job's samples can be compared there: both on ONNX
    /// Runtime's CUDA provider of the same GPU, every tensor asked for, and nothing needing the
    /// tensors on the host afterwards (`keep_tensors`: one sample, whose later steps read them, or
    /// `--save-tensors`).
    pub(super) fn device_of_both(&self, keep_tensors: bool) -> Option<u32> {
        if keep_tensors
            || self.options.selection != Selection::All
            || self.judging.quantization.is_some()
            || std::env::var(OFF_SWITCH).is_ok_and(|v| v == "0")
        {
            return None;
        }
        // The outputs passed straight from an input are the values fed, which no run returns.
        if !layerwise_analysis::passed_through(&self.index).is_empty() {
            return None;
        }
        match (self.reference.ort_options()?.ep, self.candidate.ort_options()?.ep) {
            (ExecutionProvider::Cuda { device: r, .. }, ExecutionProvider::Cuda { device: c, .. })
                if r.unwrap_or(0) == c.unwrap_or(0) =>
            {
                Some(r.unwrap_or(0))
            }
            _ => None,
        }
    }

    /// One sample compared on the GPU (see the module), or `None` where it cannot be: the sides
    /// run elsewhere, or the kernels could not be built (the reason goes to the notes, once, and
    /// the tensors are copied out as before).
    pub(super) fn compare_on_device(
        &mut self,
        feeds: &[(String, Tensor)],
        steps: &mut Steps,
        keep_tensors: bool,
    ) -> Result<Option<Compared>> {
        let Some(device) = self.device_of_both(keep_tensors) else { return Ok(None) };
        if !self.reducer_on(device, steps) {
            return Ok(None);
        }
        let (reference_run, candidate_run) = self.runs_on_device(feeds, device, "", steps)?;
        let candidate_of = by_reference_name(self.cand_model.is_some(), &self.cand_names, &candidate_run);
        let reducer = self.device_reducer.as_mut().expect("built above");
        let (index, tolerances) = (&self.index, &self.judging.tolerances);
        let names = compared_names(&self.order, &index.outputs);
        let (records, not_compared, reduced) = steps.run("comparing tensors on the GPU", || {
            // One sample a run: every tensor whole.
            sample_records(
                reducer,
                index,
                tolerances,
                &names,
                (&reference_run, &candidate_of),
                (1, 1),
                |_| Some(SampleLayout::Shared),
                device,
            )
        })?;
        let mut notes = self.batch_note().into_iter().collect::<Vec<_>>();
        // Which GPU is said by `--devices`' own note: the report is the same whichever ran it.
        notes.push(format!(
            "compared on the GPU where both sides ran: {reduced} tensor pairs reduced there by layerwise's own CUDA kernels (float64 totals, built with NVRTC), only their totals copied to the host"
        ));
        let bytes = run_bytes(&reference_run);
        Ok(self.device_compared(records, not_compared, (&reference_run, &candidate_run), notes, bytes).pop())
    }

    /// Both sides run on `feeds` with their tensors left on GPU `device` (`what` says how many
    /// samples a run holds, for the steps' labels).
    fn runs_on_device(
        &mut self,
        feeds: &[(String, Tensor)],
        device: u32,
        what: &str,
        steps: &mut Steps,
    ) -> Result<(DeviceRun, DeviceRun)> {
        let request = RunRequest { model: self.model, index: &self.index, inputs: feeds, selection: &Selection::All };
        let reference_label =
            format!("running reference {}{what} (tensors left on GPU {device})", self.options.reference);
        let reference_run = steps.run(&reference_label, || {
            let run =
                self.reference.run_on_device(&request).ok_or_else(|| anyhow!("the reference does not run on CUDA"))?;
            run.map_err(|e| anyhow!(e)).map_err(|e| e.context(format!("reference {}", self.options.reference)))
        })?;
        let cand_selection = self.candidate_selection(&Selection::All);
        let cand_request = match &self.cand_model {
            Some((cm, ci)) => RunRequest { model: cm, index: ci, inputs: feeds, selection: &cand_selection },
            None => RunRequest { model: self.model, index: &self.index, inputs: feeds, selection: &Selection::All },
        };
        let candidate_label =
            format!("running candidate {}{what} (tensors left on GPU {device})", self.options.candidate);
        let candidate_run = steps.run(&candidate_label, || {
            let run = self
                .candidate
                .run_on_device(&cand_request)
                .ok_or_else(|| anyhow!("the candidate does not run on CUDA"))?;
            run.map_err(|e| anyhow!(e)).map_err(|e| e.context(format!("candidate {}", self.options.candidate)))
        })?;
        Ok((reference_run, candidate_run))
    }

    /// Each sample's comparison from its records: a backend's own reason for a tensor it did not
    /// give (not a tensor type) instead of "missing", both runs' notes, `notes` after the
    /// candidate's, and `bytes` (one side's tensors of one sample) as the memory plan's.
    fn device_compared(
        &self,
        records: Vec<Vec<TensorRecord>>,
        mut not_compared: Vec<(String, String)>,
        (reference, candidate): (&DeviceRun, &DeviceRun),
        notes: Vec<String>,
        bytes: usize,
    ) -> Vec<Compared> {
        for (t, why) in reference.unavailable.iter().chain(&candidate.unavailable) {
            if let Some(entry) = not_compared.iter_mut().find(|(n, _)| n == t) {
                entry.1 = why.clone();
            }
        }
        let mut candidate_notes = candidate.notes.clone();
        candidate_notes.extend(notes);
        let unavailable: Vec<(String, String)> =
            reference.unavailable.iter().chain(&candidate.unavailable).cloned().collect();
        let memory = MemoryPlan {
            budget_bytes: None,
            estimated_bytes: bytes as u64,
            groups: 1,
            largest_group_bytes: 0,
            shapes_from: "the runs on the GPU".into(),
            comparison: layerwise_analysis::ComparisonMode::Device,
            separate_because: None,
        };
        records
            .into_iter()
            .map(|sample_records| Compared {
                comparison: Comparison::from_records(sample_records, not_compared.clone(), &self.order),
                tensors: None,
                histograms: HashMap::new(),
                notes: (reference.notes.clone(), candidate_notes.clone()),
                unavailable: unavailable.clone(),
                engine_layers: Vec::new(),
                memory: Some(memory.clone()),
                deployed_differs: Vec::new(),
                output_values: HashMap::new(),
                answers: Vec::new(),
            })
            .collect()
    }

    /// Whether the GPU reduction kernels are built for `device` (built on the first call; where
    /// they cannot be, the reason is kept for the notes and this stays false).
    fn reducer_on(&mut self, device: u32, steps: &mut Steps) -> bool {
        if self.device_refused.is_some() {
            return false;
        }
        if self.device_reducer.is_none() {
            match steps.run("building the GPU reduction kernels (NVRTC)", || {
                DeviceReducer::new(device).map_err(|e| anyhow!(e))
            }) {
                Ok(reducer) => self.device_reducer = Some(reducer),
                Err(e) => self.device_refused = Some(format!("{e:#}")),
            }
        }
        self.device_reducer.is_some()
    }

    /// Why samples that could be compared on the GPU were not (the kernels could not be built).
    pub(super) fn device_note(&self) -> Option<String> {
        self.device_refused.as_ref().map(|why| {
            format!("tensors copied to the host to be compared: the GPU reduction could not be used ({why})")
        })
    }
}

/// Each sample's records, what was not compared, and how many pairs the GPU reduced.
type SampleRecords = (Vec<Vec<TensorRecord>>, Vec<(String, String)>, usize);

/// Each of `count` samples' records from two runs holding `width` samples each, where
/// `layout_of` places a tensor's samples: float and 32/64-bit integer pairs reduced on the GPU in
/// one call, other element types (bool, 8- and 16-bit: few and small) copied out and compared on
/// the host, a shape mismatch recorded as one. Also what was not compared, and how many pairs the GPU reduced.
#[allow(clippy::too_many_arguments)]
fn sample_records(
    reducer: &mut DeviceReducer,
    index: &GraphIndex,
    tolerances: &ToleranceSet,
    names: &[&String],
    (reference, candidate_of): (&DeviceRun, &HashMap<&str, &DeviceTensor>),
    (count, width): (usize, usize),
    layout_of: impl Fn(&str) -> Option<SampleLayout>,
    device: u32,
) -> Result<SampleRecords> {
    let mut records: Vec<Vec<TensorRecord>> = vec![Vec::new(); count];
    let mut not_compared = Vec::new();
    // (sample, name, per-sample shapes and types, pair)
    let mut on_device: Vec<(usize, &str, (Vec<usize>, DType), (Vec<usize>, DType), DevicePair)> = Vec::new();
    for name in names {
        let Some((r, c)) = both_sides(index, name, reference, candidate_of, &mut not_compared) else { continue };
        if let Some(why) = layerwise_analysis::different_meaning(r.dtype, c.dtype) {
            not_compared.push((name.to_string(), why));
            continue;
        }
        let layout = layout_of(name.as_str()).ok_or_else(|| anyhow!("tensor '{name}' was not in the checked batch"))?;
        let (rs, cs) = (layout.per_sample(&r.shape, width), layout.per_sample(&c.shape, width));
        let tol = tolerances.judging(name, r.dtype);
        let same_shape = r.shape == c.shape;
        // A model output may be judged part by part (`OutputJudge`), which needs its values:
        // it is compared on the host, as are types the GPU's kernels do not read.
        let is_output = index.outputs.contains(*name);
        match (element_kind(r.dtype), element_kind(c.dtype)) {
            (Some(rk), Some(ck)) if same_shape && !is_output => {
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
            _ if !same_shape => {
                for record in records.iter_mut() {
                    record.push(tensor_record(index, name, (&rs, r.dtype), (&cs, c.dtype), tolerances, |_| {
                        Metrics::default()
                    }));
                }
            }
            _ => {
                for (k, record) in records.iter_mut().enumerate() {
                    let (rv, cv) =
                        (sample_part(reducer, r, layout, k, width)?, sample_part(reducer, c, layout, k, width)?);
                    record.push(tensor_record(index, name, (&rs, r.dtype), (&cs, c.dtype), tolerances, |t| {
                        if is_output {
                            tolerances.output(name, r.dtype).metrics(&rv.to_f32(), &cv.to_f32(), &rs)
                        } else {
                            compute(&rv.to_f32(), &cv.to_f32(), t)
                        }
                    }));
                }
            }
        }
    }
    let pairs: Vec<DevicePair> = on_device.iter().map(|(.., p)| *p).collect();
    let totals = reducer.reduce(&pairs).map_err(|e| anyhow!("comparing on GPU {device}: {e}"))?;
    for ((k, name, r, c, _), t) in on_device.iter().zip(&totals) {
        let metrics = metrics_of_totals(t);
        records[*k].push(tensor_record(index, name, (&r.0, r.1), (&c.0, c.1), tolerances, |_| metrics));
    }
    Ok((records, not_compared, pairs.len()))
}

/// The candidate's tensors under the reference names they were paired with (a separate candidate
/// model names its own: `cand_names`, reference to candidate).
fn by_reference_name<'a>(
    separate_model: bool,
    cand_names: &'a HashMap<String, String>,
    candidate: &'a DeviceRun,
) -> HashMap<&'a str, &'a DeviceTensor> {
    if separate_model {
        cand_names.iter().filter_map(|(r, c)| candidate.tensors.get(c).map(|t| (r.as_str(), t))).collect()
    } else {
        candidate.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect()
    }
}

/// Bytes of every tensor of a run.
fn run_bytes(run: &DeviceRun) -> usize {
    run.tensors.values().map(|t| t.shape.iter().product::<usize>() * t.dtype.size()).sum()
}

/// Both sides' `name`, or `None` with the side that lacks it said in `not_compared`.
fn both_sides<'a>(
    index: &GraphIndex,
    name: &str,
    reference: &'a DeviceRun,
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
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    order.iter().chain(outputs).filter(|t| seen.insert(t.as_str())).collect()
}

fn element_kind(dtype: DType) -> Option<ElementKind> {
    match dtype {
        DType::F32 => Some(ElementKind::F32),
        DType::F16 => Some(ElementKind::F16),
        DType::BF16 => Some(ElementKind::Bf16),
        DType::I64 => Some(ElementKind::I64),
        DType::I32 => Some(ElementKind::I32),
        _ => None,
    }
}

/// Sample `k`'s values of `t`, a tensor of a run of `width` samples whose samples lie as `layout`
/// says, copied to the host.
fn sample_part(
    reducer: &mut DeviceReducer,
    t: &DeviceTensor,
    layout: SampleLayout,
    k: usize,
    width: usize,
) -> Result<Tensor> {
    let size = t.dtype.size();
    let (first, blocks, block, stride) = layout.part(k, width, t.shape.iter().product());
    let mut bytes = Vec::with_capacity(blocks * block * size);
    for b in 0..blocks {
        let at = (t.ptr as usize + (first + b * stride) * size) as *const std::ffi::c_void;
        bytes.extend(reducer.download(at, block * size).map_err(|e| anyhow!(e))?);
    }
    let shape = layout.per_sample(&t.shape, width);
    Tensor::from_le_bytes(t.dtype, shape, &bytes)
        .ok_or_else(|| anyhow!("a {} tensor copied from the GPU could not be read", t.dtype.name()))
}

/// The samples' inputs as one run of `width` samples: a batch shorter than `width` padded with
/// copies of its last sample (one session for every batch).
fn padded_batch(samples: &[Vec<(String, Tensor)>], width: usize) -> Result<Vec<(String, Tensor)>, String> {
    let mut padded = samples.to_vec();
    while padded.len() < width {
        padded.push(samples.last().ok_or("no sample")?.clone());
    }
    batched_feeds(&padded)
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
        out.push((
            name.clone(),
            Tensor::from_le_bytes(t.dtype(), shape, &bytes).ok_or("a batched input could not be assembled")?,
        ));
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
    pub(super) fn compare_batch_on_device(
        &mut self,
        samples: &[Vec<(String, Tensor)>],
        steps: &mut Steps,
    ) -> Result<Option<Vec<Compared>>> {
        let width = self.options.batch;
        if width < 2 || self.batch_refused.is_some() || samples.is_empty() {
            return Ok(None);
        }
        let Some(device) = self.device_of_both(false) else { return Ok(None) };
        if !self.reducer_on(device, steps) {
            return Ok(None);
        }
        let feeds = match padded_batch(samples, width) {
            Ok(f) => f,
            Err(why) => {
                self.batch_refused = Some(why);
                return Ok(None);
            }
        };
        // The check run: the batch's first sample alone, the reference side.
        let alone = if self.batch_layouts.is_none() {
            let request =
                RunRequest { model: self.model, index: &self.index, inputs: &samples[0], selection: &Selection::All };
            let run = steps.run(
                &format!("running reference {} on one sample (to check the batch)", self.options.reference),
                || {
                    self.reference
                        .run_on_device(&request)
                        .ok_or_else(|| anyhow!("the reference does not run on CUDA"))?
                        .map_err(|e| anyhow!(e))
                },
            )?;
            Some(run)
        } else {
            None
        };
        let (reference_run, candidate_run) =
            self.runs_on_device(&feeds, device, &format!(" on {width} samples at once"), steps)?;
        let candidate_of = by_reference_name(self.cand_model.is_some(), &self.cand_names, &candidate_run);
        let reducer = self.device_reducer.as_mut().expect("built above");
        if let Some(alone) = &alone {
            let one: HashMap<String, Vec<usize>> =
                alone.tensors.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
            let batched: HashMap<String, Vec<usize>> =
                reference_run.tensors.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
            let checked = sample_layouts(&one, &batched, width)
                .and_then(|layouts| check_first_sample(reducer, alone, &reference_run, &layouts).map(|()| layouts));
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
        if let Some((name, t)) =
            reference_run.tensors.iter().find(|(n, t)| checked_shapes.get(n.as_str()).is_some_and(|s| *s != t.shape))
        {
            self.batch_refused = Some(format!(
                "a later batch gives tensor '{name}' the shape [{}], not the checked batch's",
                shape_string(&t.shape)
            ));
            return Ok(None);
        }
        let (index, tolerances) = (&self.index, &self.judging.tolerances);
        let names = compared_names(&self.order, &index.outputs);
        let count = samples.len();
        let (records, not_compared, reduced) =
            steps.run(&format!("comparing {count} samples' tensors on the GPU"), || {
                sample_records(
                    reducer,
                    index,
                    tolerances,
                    &names,
                    (&reference_run, &candidate_of),
                    (count, width),
                    |name| layouts.get(name).copied(),
                    device,
                )
            })?;
        let note = format!(
            "compared on the GPU where both sides ran, {width} samples in each run of either side (each tensor's samples found along the dimension its shape gives and checked against one sample run alone, within {BATCH_CHECK_REL_L2:.0e} relative L2): {reduced} tensor pairs of this batch reduced there by layerwise's own CUDA kernels (float64 totals, built with NVRTC), only their totals copied to the host; a batched run may choose other GPU kernels than a run of one sample"
        );
        let bytes = run_bytes(&reference_run) / width;
        Ok(Some(self.device_compared(records, not_compared, (&reference_run, &candidate_run), vec![note], bytes)))
    }

    /// Sample `position` of `run` (one sample, or the samples of one `--batch` run in their order
    /// there) run again on the GPU, every tensor of it copied to the host: reference tensors by
    /// the reference's names, candidate tensors by the candidate's own (as a run of one sample
    /// holds them), less in a batch the tensors every sample shares. `None` where the samples were
    /// not compared on the GPU, or where both sides' tensors of one sample, held three times over
    /// by the steps after the walk, would pass the memory budget.
    pub(super) fn held_from_device(
        &mut self,
        run: &[Vec<(String, Tensor)>],
        position: usize,
        steps: &mut Steps,
    ) -> Result<Option<(HashMap<String, Tensor>, HashMap<String, Tensor>)>> {
        let Some(device) = self.device_of_both(false) else { return Ok(None) };
        if self.device_reducer.is_none() || run.is_empty() {
            return Ok(None);
        }
        let width = if run.len() > 1 { self.options.batch } else { 1 };
        if width > 1 && self.batch_layouts.is_none() {
            return Ok(None);
        }
        let feeds = if width > 1 { padded_batch(run, width).map_err(|e| anyhow!(e))? } else { run[0].clone() };
        let (reference_run, candidate_run) =
            self.runs_on_device(&feeds, device, " again (the verdict's sample, its tensors to the host)", steps)?;
        if (run_bytes(&reference_run) + run_bytes(&candidate_run)) as u64 / width as u64 * 3 > self.budget {
            return Ok(None);
        }
        // The candidate's tensors take the layout of the reference tensor each holds the value of.
        let reference_of: HashMap<&str, &str> = match &self.cand_model {
            Some(_) => self.cand_names.iter().map(|(r, c)| (c.as_str(), r.as_str())).collect(),
            None => candidate_run.tensors.keys().map(|n| (n.as_str(), n.as_str())).collect(),
        };
        let layouts = self.batch_layouts.as_ref().map(|(l, _)| l);
        // In a batch, a tensor every sample shares was computed for the batch: a shape holds the
        // batch's size (PP-OCRv4's Reshape read [8, 120, 5] for one sample's [1, 120, 40]). Those
        // stay out, and the steps after the walk compute them for one sample.
        let layout_of = |reference_name: &str| match width {
            1 => Some(SampleLayout::Shared),
            _ => layouts.and_then(|l| l.get(reference_name).copied()).filter(|l| *l != SampleLayout::Shared),
        };
        let reducer = self.device_reducer.as_mut().expect("checked");
        let mut copied = |run: &DeviceRun,
                          name_for_layout: &dyn Fn(&str) -> Option<SampleLayout>|
         -> Result<HashMap<String, Tensor>> {
            let mut out = HashMap::new();
            for (name, t) in &run.tensors {
                // A tensor whose samples' places are unknown (a candidate tensor paired with none) stays out.
                let Some(layout) = name_for_layout(name) else { continue };
                out.insert(name.clone(), sample_part(reducer, t, layout, position, width)?);
            }
            Ok(out)
        };
        let reference = steps.run("copying the verdict's sample's reference tensors to the host", || {
            copied(&reference_run, &|n| layout_of(n))
        })?;
        let candidate = steps.run("copying the verdict's sample's candidate tensors to the host", || {
            copied(&candidate_run, &|n| reference_of.get(n).and_then(|r| layout_of(r)))
        })?;
        Ok(Some((reference, candidate)))
    }

    /// Why `--batch` was not used, where it was asked for and both sides ran on one GPU.
    pub(super) fn batch_note(&self) -> Option<String> {
        self.batch_refused
            .as_ref()
            .map(|why| format!("--batch {} not used, the samples were run one at a time: {why}", self.options.batch))
    }
}

/// The check of a batch: the reference's values of its first sample equal (within
/// `BATCH_CHECK_REL_L2`) those of that sample run alone, in every float tensor.
fn check_first_sample(
    reducer: &mut DeviceReducer,
    alone: &DeviceRun,
    batched: &DeviceRun,
    layouts: &HashMap<String, SampleLayout>,
) -> Result<(), String> {
    let mut names = Vec::new();
    let mut pairs = Vec::new();
    for (name, a) in &alone.tensors {
        let (Some(b), Some(layout)) = (batched.tensors.get(name), layouts.get(name)) else { continue };
        let (Some(ak), Some(bk)) = (element_kind(a.dtype), element_kind(b.dtype)) else { continue };
        // Integers are shapes and indices: a Shape's value holds the batch size itself.
        if [ak, bk].iter().any(|k| matches!(k, ElementKind::I64 | ElementKind::I32)) {
            continue;
        }
        let batch = match layout {
            SampleLayout::Split { outer, block, .. } => b.shape.iter().product::<usize>() / (outer * block).max(1),
            SampleLayout::Shared => 1,
        };
        let (first, blocks, block, stride) = layout.part(0, batch, b.shape.iter().product());
        let len = blocks * block;
        if len != a.shape.iter().product::<usize>() || first != 0 {
            return Err(format!(
                "tensor '{name}' holds {} values for one sample and {len} for each of the batch's",
                a.shape.iter().product::<usize>()
            ));
        }
        // The sample alone holds its values in a row; the batch, every `stride` elements.
        pairs.push(DevicePair {
            reference: a.ptr,
            candidate: b.ptr,
            len,
            blocks,
            reference_stride: block,
            candidate_stride: stride,
            reference_kind: ak,
            candidate_kind: bk,
            atol: 0.0,
            rtol: 0.0,
            range_tol: 0.0,
        });
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
        let sample = |v: f32| {
            vec![
                ("x".to_string(), Tensor::f32(vec![1, 2], vec![v, v + 0.5])),
                ("ids".to_string(), Tensor::new(vec![1], layerwise_runtime::TensorData::I64(vec![v as i64]))),
            ]
        };
        let batch = batched_feeds(&[sample(1.0), sample(2.0), sample(3.0)]).unwrap();
        assert_eq!(batch[0].1, Tensor::f32(vec![3, 2], vec![1.0, 1.5, 2.0, 2.5, 3.0, 3.5]));
        assert_eq!(batch[1].1, Tensor::new(vec![3], layerwise_runtime::TensorData::I64(vec![1, 2, 3])));
        let other = vec![
            ("x".to_string(), Tensor::f32(vec![1, 3], vec![0.0; 3])),
            ("ids".to_string(), Tensor::new(vec![1], layerwise_runtime::TensorData::I64(vec![0]))),
        ];
        assert!(batched_feeds(&[sample(1.0), other])
            .unwrap_err()
            .contains("input 'x' differs in shape or type between samples"));
        let scalar = vec![("t".to_string(), Tensor::f32(vec![], vec![1.0]))];
        assert!(batched_feeds(&[scalar.clone(), scalar]).unwrap_err().contains("scalar"));
    }
}
