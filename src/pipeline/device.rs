//! Samples compared on the GPU where both sides ran (issue 41): with the reference and the
//! candidate on ONNX Runtime's CUDA provider of one GPU, each side's every tensor stays in GPU
//! memory and each pair is reduced there (`layerwise_runtime::device_stats`); only the totals
//! come to the host, where they become the same metrics the host computes. Copying every tensor
//! out was about 100x a plain run of PP-OCRv4's recognizer on an H100 (docs/gpu.md).

use std::collections::HashMap;

use anyhow::{anyhow, Result};
use layerwise_analysis::{compute, metrics_of_totals, missing_reason, tensor_record, Comparison, MemoryPlan, PairTotals, TensorRecord};
use layerwise_model::Selection;
use layerwise_runtime::device_stats::{DevicePair, DeviceReducer, DeviceTotals, ElementKind};
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
    fn device_of_both(&self, keep_tensors: bool) -> Option<u32> {
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
        if self.device_refused.is_some() {
            return Ok(None);
        }
        if self.device_reducer.is_none() {
            match steps.run("building the GPU reduction kernels (NVRTC)", || DeviceReducer::new(device).map_err(|e| anyhow!(e))) {
                Ok(reducer) => self.device_reducer = Some(reducer),
                Err(e) => {
                    self.device_refused = Some(format!("{e:#}"));
                    return Ok(None);
                }
            }
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
        let mut names: Vec<&String> = Vec::new();
        for t in self.order.iter().chain(&index.outputs) {
            if !names.contains(&t) {
                names.push(t);
            }
        }
        let compared = steps.run("comparing tensors on the GPU", || {
            let mut records: Vec<TensorRecord> = Vec::new();
            let mut not_compared = Vec::new();
            let mut on_device: Vec<(&str, &DeviceTensor, &DeviceTensor, DevicePair)> = Vec::new();
            for name in names {
                let (r, c) = match (reference_run.tensors.get(name), candidate_of.get(name.as_str())) {
                    (Some(r), Some(c)) => (r, *c),
                    (None, _) => {
                        not_compared.push((name.clone(), missing_reason(index, name, "reference")));
                        continue;
                    }
                    (_, None) => {
                        not_compared.push((name.clone(), missing_reason(index, name, "candidate")));
                        continue;
                    }
                };
                let tol = tolerances.of(name);
                match (element_kind(r.dtype), element_kind(c.dtype)) {
                    (Some(rk), Some(ck)) if r.shape == c.shape => {
                        let len = r.shape.iter().product();
                        let pair = DevicePair { reference: r.ptr, candidate: c.ptr, len, reference_kind: rk, candidate_kind: ck, atol: tol.atol, rtol: tol.rtol, range_tol: tol.range_tol };
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
                let metrics = metrics_of_totals(&pair_totals(t));
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

    /// Why samples that could be compared on the GPU were not (the kernels could not be built).
    pub(super) fn device_note(&self) -> Option<String> {
        self.device_refused.as_ref().map(|why| format!("tensors copied to the host to be compared: the GPU reduction could not be used ({why})"))
    }
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

/// The device's totals as the analysis takes them (the same fields: two crates that do not depend
/// on each other).
fn pair_totals(t: &DeviceTotals) -> PairTotals {
    PairTotals {
        numel: t.numel,
        sum_abs: t.sum_abs,
        sum_d2: t.sum_d2,
        sum_r2: t.sum_r2,
        sum_c2: t.sum_c2,
        sum_rc: t.sum_rc,
        worst: t.worst,
        worst_index: t.worst_index,
        compared_max: t.compared_max,
        ref_max_abs: t.ref_max_abs,
        max_rel: t.max_rel,
        ref_nan: t.ref_nan,
        ref_inf: t.ref_inf,
        cand_nan: t.cand_nan,
        cand_inf: t.cand_inf,
        nonfinite_mismatch: t.nonfinite_mismatch,
        ref_fp16_overflow: t.ref_fp16_overflow,
        nonzero: t.nonzero,
        subnormal: t.subnormal,
        sentinels: t.sentinels,
        finite_violations: t.finite_violations,
    }
}
