//! Comparing every tensor of two runs, in parallel.

use std::collections::HashMap;

use layerwise_model::GraphIndex;
use layerwise_runtime::Tensor;
use rayon::prelude::*;
use serde::Serialize;

use crate::metrics::{compute, Metrics, Tolerance};

/// The comparison of one tensor present in both runs.
#[derive(Debug, Clone, Serialize)]
pub struct TensorRecord {
    pub name: String,
    /// Name of the producing node.
    pub node: String,
    pub op_type: String,
    /// Topological index of the producing node.
    pub topo_index: usize,
    pub shape: Vec<usize>,
    pub ref_dtype: String,
    pub cand_dtype: String,
    pub is_output: bool,
    /// Computed from weights alone (not a layer).
    pub constant_like: bool,
    /// Why the tensor could not be compared element by element (shape mismatch), if so.
    pub mismatch: Option<String>,
    pub metrics: Metrics,
    pub pass: bool,
}

impl TensorRecord {
    pub fn error_level(&self) -> f64 {
        if self.mismatch.is_some() {
            f64::INFINITY
        } else {
            self.metrics.error_level()
        }
    }
}

/// Every compared tensor (topological order) and what could not be compared.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    pub records: Vec<TensorRecord>,
    /// (tensor, reason) for tensors that one side lacks.
    pub not_compared: Vec<(String, String)>,
    position: HashMap<String, usize>,
}

impl Comparison {
    /// A comparison assembled from records of several runs (search marking, split runs, samples),
    /// put in topological order.
    pub fn from_records(mut records: Vec<TensorRecord>, not_compared: Vec<(String, String)>, order: &[String]) -> Comparison {
        let rank: HashMap<&str, usize> = order.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
        records.sort_by_key(|r| rank.get(r.name.as_str()).copied().unwrap_or(usize::MAX));
        let position = records.iter().enumerate().map(|(i, r)| (r.name.clone(), i)).collect();
        Comparison { records, not_compared, position }
    }

    pub fn get(&self, tensor: &str) -> Option<&TensorRecord> {
        self.position.get(tensor).map(|&i| &self.records[i])
    }
}

/// Compares the tensors both runs returned, in the order of `order` (topological), in parallel.
pub fn compare_all(
    index: &GraphIndex,
    order: &[String],
    reference: &HashMap<String, Tensor>,
    candidate: &HashMap<String, Tensor>,
    tol: Tolerance,
) -> Comparison {
    let mut not_compared = Vec::new();
    let mut both = Vec::new();
    for name in order {
        match (reference.get(name), candidate.get(name)) {
            (Some(r), Some(c)) => both.push((name, r, c)),
            (None, _) => not_compared.push((name.clone(), "missing from the reference run".to_string())),
            (_, None) => not_compared.push((name.clone(), "missing from the candidate run".to_string())),
        }
    }
    let records: Vec<TensorRecord> = both
        .par_iter()
        .map(|(name, r, c)| {
            let node = index.producer(name);
            let mut record = TensorRecord {
                name: name.to_string(),
                node: node.map(|n| n.name.clone()).unwrap_or_default(),
                op_type: node.map(|n| n.op_type.clone()).unwrap_or_default(),
                topo_index: node.map(|n| n.topo_index).unwrap_or(0),
                shape: r.shape.clone(),
                ref_dtype: r.dtype().name().to_string(),
                cand_dtype: c.dtype().name().to_string(),
                is_output: index.outputs.iter().any(|o| o == *name),
                constant_like: index.is_constant_like(name),
                mismatch: None,
                metrics: Metrics::default(),
                pass: false,
            };
            if r.shape != c.shape {
                record.mismatch = Some(format!("shape {} in the reference, {} in the candidate", r.shape_string(), c.shape_string()));
                return record;
            }
            record.metrics = compute(&r.to_f32(), &c.to_f32(), tol);
            record.pass = record.metrics.passes();
            record
        })
        .collect();
    let position = records.iter().enumerate().map(|(i, r)| (r.name.clone(), i)).collect();
    Comparison { records, not_compared, position }
}
