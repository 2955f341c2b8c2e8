//! Comparing every tensor of two runs, in parallel.

use std::collections::HashMap;

use layerwise_model::GraphIndex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use layerwise_model::pair::{Operand, PairReducer};
use layerwise_model::{shape_string, DType, Tensor};
use rayon::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::histogram::{histogram, Histogram};
use crate::metrics::{compute, Metrics, Tolerance, ToleranceSet};

/// The comparison of one tensor present in both runs.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
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
    /// Holds integers (an index, a count, a rounded value; not a quantizer's codes), judged
    /// exactly: a changed value is a whole step ([`crate::IntegerTensors`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds_integers: bool,
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

    /// Holds integers and some of them changed: an error that starts where it first appears,
    /// however small its relative size (355 frames against 354).
    pub fn integers_changed(&self) -> bool {
        self.holds_integers && !self.pass
    }

    /// What the walk follows first, before the largest error: inf/NaN, then changed integers (a
    /// class id off by one, however small its relative error). One rule for the output the walk
    /// starts at and the input it steps into.
    pub fn walk_rank(&self) -> (bool, bool) {
        (self.error_level() == f64::INFINITY, self.integers_changed())
    }

    /// Passes on matching inf/NaN alone: every value is NaN or inf in the reference and the
    /// candidate matches it (NaN inputs make NaN outputs), so nothing of it was judged.
    pub fn unjudged(&self) -> bool {
        self.pass && self.metrics.numel > 0 && self.metrics.ref_nan + self.metrics.ref_inf == self.metrics.numel
    }
}

/// Every compared tensor (topological order) and what could not be compared.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    pub records: Vec<TensorRecord>,
    /// (tensor, reason) for tensors that one side lacks.
    pub not_compared: Vec<(String, String)>,
    /// A quantized candidate's activation quantizers, under the reference tensors they hold: what
    /// its causes compare the reference's values with.
    pub quantizers: HashMap<String, layerwise_model::quant::QuantizerRange>,
    /// What each of those quantizers does to the reference's values (clipped, rounded to 0, the
    /// step outliers force), where measured: the quantizers near a failing tensor.
    pub quantizer_effects: HashMap<String, layerwise_model::quant::QuantizerEffect>,
    /// The weights a quantized candidate stores with one scale, under the reference weight's name.
    pub per_tensor_weights: HashMap<String, layerwise_model::quant::WeightChannels>,
    /// The products a quantized candidate's integer kernels would sum, under the node's name.
    pub integer_accumulations: HashMap<String, layerwise_model::quant::IntegerAccumulation>,
    /// The graph inputs that hold inf/NaN, with their (NaN, inf) counts: both sides are fed them,
    /// and no record is compared for them, so the causes read them here.
    pub input_nonfinite: HashMap<String, (usize, usize)>,
    position: HashMap<String, usize>,
}

impl Comparison {
    /// A comparison assembled from records of several runs (search marking, split runs, samples),
    /// put in topological order.
    pub fn from_records(
        mut records: Vec<TensorRecord>,
        not_compared: Vec<(String, String)>,
        order: &[String],
    ) -> Comparison {
        let rank: HashMap<&str, usize> = order.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
        records.sort_by_key(|r| rank.get(r.name.as_str()).copied().unwrap_or(usize::MAX));
        let position = records.iter().enumerate().map(|(i, r)| (r.name.clone(), i)).collect();
        Comparison {
            records,
            not_compared,
            position,
            quantizers: HashMap::new(),
            quantizer_effects: HashMap::new(),
            per_tensor_weights: HashMap::new(),
            integer_accumulations: HashMap::new(),
            input_nonfinite: HashMap::new(),
        }
    }

    pub fn get(&self, tensor: &str) -> Option<&TensorRecord> {
        self.position.get(tensor).map(|&i| &self.records[i])
    }

    /// Notes which of the run's graph inputs hold inf/NaN (see `input_nonfinite`).
    pub fn note_input_nonfinite(&mut self, feeds: &[(String, layerwise_model::Tensor)]) {
        self.input_nonfinite = feeds
            .iter()
            .map(|(name, t)| (name.clone(), t.non_finite_counts()))
            .filter(|(_, (nan, inf))| nan + inf > 0)
            .collect();
    }

    /// The data inputs of `node` that hold inf/NaN on either side, each with its count in the
    /// reference and in the candidate: a graph input's from `input_nonfinite` (the same on both
    /// sides), a computed tensor's from its record. Weights are left out.
    pub fn nonfinite_inputs_of(
        &self,
        index: &GraphIndex,
        node: &layerwise_model::NodeInfo,
    ) -> Vec<(String, usize, usize)> {
        let mut found: Vec<(String, usize, usize)> = Vec::new();
        for t in node.all_inputs() {
            let counts = if index.is_graph_input(t) {
                self.input_nonfinite.get(t).map(|(nan, inf)| (nan + inf, nan + inf))
            } else if index.is_constant_like(t) {
                None
            } else {
                self.get(t).map(|r| r.metrics.nonfinite_counts())
            };
            if let Some((reference, candidate)) = counts.filter(|&(r, c)| r + c > 0) {
                if !found.iter().any(|(n, ..)| n == t) {
                    found.push((t.clone(), reference, candidate));
                }
            }
        }
        found
    }

    /// Whether every model output is within tolerance: each compared and passing, but for the
    /// weights passed straight to an output, which no run is compared on (see [`WEIGHT_OUTPUT`]).
    pub fn outputs_pass(&self, index: &GraphIndex) -> bool {
        index.outputs.iter().filter(|o| !is_weight_output(index, o)).all(|o| self.get(o).is_some_and(|r| r.pass))
    }

    /// The largest error level among `tensors` that were compared (0 when none was): a sample's
    /// output error, passing or not.
    pub fn largest_error(&self, tensors: &[String]) -> f64 {
        tensors.iter().filter_map(|t| self.get(t)).map(|r| r.error_level()).fold(0.0, f64::max)
    }
}

/// The record of `name` from both sides' shapes and types; `metrics` runs only when the shapes match.
pub fn tensor_record(
    index: &GraphIndex,
    name: &str,
    (ref_shape, ref_dtype): (&[usize], DType),
    (cand_shape, cand_dtype): (&[usize], DType),
    tolerances: &ToleranceSet,
    metrics: impl FnOnce(Tolerance) -> Metrics,
) -> TensorRecord {
    let node = index.producer(name);
    let mut record = TensorRecord {
        name: name.to_string(),
        node: node.map(|n| n.name.clone()).unwrap_or_default(),
        // An output no node computes is a graph input passed straight through (as the reports
        // call a graph input elsewhere).
        op_type: node.map(|n| n.op_type.clone()).unwrap_or_else(|| {
            if index.is_graph_input(name) {
                "input".into()
            } else {
                String::new()
            }
        }),
        topo_index: node.map(|n| n.topo_index).unwrap_or(0),
        shape: ref_shape.to_vec(),
        ref_dtype: ref_dtype.name().to_string(),
        cand_dtype: cand_dtype.name().to_string(),
        is_output: index.outputs.iter().any(|o| o == name),
        constant_like: index.is_constant_like(name),
        holds_integers: tolerances.integers.holds(name, ref_dtype),
        mismatch: None,
        metrics: Metrics::default(),
        pass: false,
    };
    if ref_shape != cand_shape {
        record.mismatch = Some(format!(
            "shape {} in the reference, {} in the candidate",
            shape_string(ref_shape),
            shape_string(cand_shape)
        ));
        return record;
    }
    record.metrics = metrics(tolerances.judging(name, ref_dtype));
    record.pass = record.metrics.passes();
    record
}

/// Why two tensors paired by name are not compared, where one holds floats and the other integers
/// or truth values: a quantized model's uint8 codes under the float tensor's name measure nothing
/// as an error of the values (the codes of 0.5 at scale 1/255 are 128). Every comparison (host,
/// paired, GPU) asks this first.
pub fn different_meaning(reference: DType, candidate: DType) -> Option<String> {
    let kind = |t: DType| match t {
        DType::Bool => "truth values",
        t if t.is_float() => "values",
        _ => "integers",
    };
    (kind(reference) != kind(candidate)).then(|| {
        format!(
            "{} {} in the reference, {} {} in the candidate: different meanings under one name (a quantized model's codes, say), never compared",
            reference.name(),
            kind(reference),
            candidate.name(),
            kind(candidate)
        )
    })
}

/// Why a model output that no node computes is not compared: a weight the model passes straight
/// to its output holds whatever each side stores for it, which no run of either side returns.
pub const WEIGHT_OUTPUT: &str =
    "a weight (initializer) passed straight to the output: no node computes it, and neither run returns it";

/// Whether `tensor`, a model output, is a weight passed straight to it: no run is compared on it
/// (see [`WEIGHT_OUTPUT`]).
pub fn is_weight_output(index: &GraphIndex, tensor: &str) -> bool {
    index.producer_index(tensor).is_none() && index.is_initializer(tensor) && index.outputs.iter().any(|o| o == tensor)
}

/// Why `tensor` is missing from a comparison where a side lacks it: the shared reason for a model
/// output no node computes (a weight), else which side lacked it.
pub fn missing_reason(index: &GraphIndex, tensor: &str, side: &str) -> String {
    if is_weight_output(index, tensor) {
        WEIGHT_OUTPUT.to_string()
    } else {
        format!("missing from the {side} run")
    }
}

/// The model outputs that are graph inputs passed straight through, no node between (each once,
/// in the model's order). Every run returns such an output as the value it was fed: both sides
/// are compared on it (the runs themselves return only what nodes compute).
pub fn passed_through(index: &GraphIndex) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for o in &index.outputs {
        if index.producer_index(o).is_none() && index.is_graph_input(o) && !out.contains(o) {
            out.push(o.clone());
        }
    }
    out
}

/// The value a run of `graph` returns for its graph input `name` passed straight to an output:
/// the value in `feeds`, in the type the graph declares for that input (a run gives an FP16 or
/// BF16 input the float32 value converted, and returns it so). `None` when nothing feeds it.
pub fn fed_value(graph: &layerwise_model::onnx::GraphProto, name: &str, feeds: &[(String, Tensor)]) -> Option<Tensor> {
    use layerwise_model::onnx::type_proto;
    use layerwise_model::TensorData;
    let (_, fed) = feeds.iter().find(|(n, _)| n == name)?;
    let elem = graph.input.iter().find(|v| v.name() == name).and_then(|v| {
        match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(type_proto::Value::TensorType(tt)) => Some(tt.elem_type()),
            _ => None,
        }
    });
    Some(match (&fed.data, elem) {
        (TensorData::F32(v), Some(10)) => {
            Tensor::new(fed.shape.clone(), TensorData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect()))
        }
        (TensorData::F32(v), Some(16)) => {
            Tensor::new(fed.shape.clone(), TensorData::BF16(v.iter().map(|&x| half::bf16::from_f32(x)).collect()))
        }
        _ => fed.clone(),
    })
}

/// Adds to `tensors` (a run of `graph` on `feeds`) the outputs it passes straight from its inputs
/// (see [`passed_through`]), where the run did not return them itself.
pub fn add_passed_through(
    graph: &layerwise_model::onnx::GraphProto,
    index: &GraphIndex,
    feeds: &[(String, Tensor)],
    tensors: &mut HashMap<String, Tensor>,
) {
    for name in passed_through(index) {
        if let (std::collections::hash_map::Entry::Vacant(slot), Some(v)) =
            (tensors.entry(name.clone()), fed_value(graph, &name, feeds))
        {
            slot.insert(v);
        }
    }
}

/// Compares the tensors both runs returned, in the order of `order` (topological), in parallel.
pub fn compare_all(
    index: &GraphIndex,
    order: &[String],
    reference: &HashMap<String, Tensor>,
    candidate: &HashMap<String, Tensor>,
    tol: &ToleranceSet,
) -> Comparison {
    let mut not_compared = Vec::new();
    let mut both = Vec::new();
    for name in order {
        match (reference.get(name), candidate.get(name)) {
            (Some(r), Some(c)) => match different_meaning(r.dtype(), c.dtype()) {
                Some(why) => not_compared.push((name.clone(), why)),
                None => both.push((name, r, c)),
            },
            (None, _) => not_compared.push((name.clone(), missing_reason(index, name, "reference"))),
            (_, None) => not_compared.push((name.clone(), missing_reason(index, name, "candidate"))),
        }
    }
    let records: Vec<TensorRecord> = both
        .par_iter()
        .map(|(name, r, c)| {
            let (ref_side, cand_side) = ((r.shape.as_slice(), r.dtype()), (c.shape.as_slice(), c.dtype()));
            tensor_record(index, name, ref_side, cand_side, tol, |t| {
                if index.outputs.contains(*name) {
                    tol.output(name, r.dtype()).metrics(&r.to_f32(), &c.to_f32(), &r.shape)
                } else {
                    compute(&r.to_f32(), &c.to_f32(), t)
                }
            })
        })
        .collect();
    let position = records.iter().enumerate().map(|(i, r)| (r.name.clone(), i)).collect();
    Comparison {
        records,
        not_compared,
        position,
        quantizers: HashMap::new(),
        quantizer_effects: HashMap::new(),
        per_tensor_weights: HashMap::new(),
        integer_accumulations: HashMap::new(),
        input_nonfinite: HashMap::new(),
    }
}

/// What a paired run (`layerwise_runtime::paired`) hands over, reduced as it comes: each tensor's
/// metrics and, for a tensor out of tolerance, its histogram. The tensors themselves are not kept,
/// so memory does not grow with the number compared. The metrics are [`compute`]'s, the same
/// kernel as [`compare_all`].
pub struct PairedComparison {
    tol: ToleranceSet,
    /// The model outputs, judged by [`crate::OutputJudge`].
    outputs: std::collections::HashSet<String>,
    reduced: Mutex<HashMap<String, Reduced>>,
    /// The tensors in the order they arrived: the session's execution order.
    arrival: Mutex<Vec<String>>,
    reference_bytes: AtomicU64,
    /// Tensors whose values are kept besides their metrics (outputs judged by their answers).
    keep: std::collections::HashSet<String>,
    kept: Mutex<HashMap<String, KeptValues>>,
}

/// A tensor's shape and both sides' values, as float32.
pub type KeptValues = (Vec<usize>, Vec<f32>, Vec<f32>);

enum Reduced {
    Compared {
        record_inputs: ((Vec<usize>, DType), (Vec<usize>, DType)),
        metrics: Option<Metrics>,
        histogram: Option<Histogram>,
    },
    Unavailable(String),
}

/// Bins of the histograms reports show for tensors out of tolerance.
pub const HISTOGRAM_BINS: usize = 40;

impl PairedComparison {
    pub fn new(tol: ToleranceSet, outputs: &[String]) -> PairedComparison {
        PairedComparison {
            tol,
            outputs: outputs.iter().cloned().collect(),
            reduced: Mutex::new(HashMap::new()),
            arrival: Mutex::new(Vec::new()),
            reference_bytes: AtomicU64::new(0),
            keep: Default::default(),
            kept: Mutex::new(HashMap::new()),
        }
    }

    /// Keeps the values of `tensors` (of the same shape on both sides) besides their metrics.
    pub fn keeping_values_of(mut self, tensors: impl IntoIterator<Item = String>) -> PairedComparison {
        self.keep = tensors.into_iter().collect();
        self
    }

    /// The values kept so far ([`PairedComparison::keeping_values_of`]), leaving none.
    pub fn take_kept(&self) -> HashMap<String, KeptValues> {
        std::mem::take(&mut *self.kept.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Bytes of the reference tensors reduced so far: what two separate runs would have held per side.
    pub fn reference_bytes(&self) -> u64 {
        self.reference_bytes.load(Ordering::Relaxed)
    }

    /// The tensors reduced so far, in the order the session computed them.
    pub fn arrival(&self) -> Vec<String> {
        self.arrival.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The comparison in the order of `order` (topological), with the histograms of the tensors
    /// out of tolerance. `unavailable`: tensors one side could not give, with the reason.
    /// Takes what was reduced so far, leaving the reducer empty.
    pub fn finish(
        &self,
        index: &GraphIndex,
        order: &[String],
        unavailable: &[(String, String)],
    ) -> (Comparison, HashMap<String, Histogram>) {
        let mut reduced = std::mem::take(&mut *self.reduced.lock().unwrap_or_else(|p| p.into_inner()));
        let mut records = Vec::new();
        let mut not_compared = Vec::new();
        let mut histograms = HashMap::new();
        for name in order {
            match reduced.remove(name) {
                Some(Reduced::Compared { record_inputs: (r, c), metrics, histogram }) => {
                    let metrics = metrics.unwrap_or_default();
                    records.push(tensor_record(index, name, (&r.0, r.1), (&c.0, c.1), &self.tol, |_| metrics));
                    if let Some(h) = histogram {
                        histograms.insert(name.clone(), h);
                    }
                }
                Some(Reduced::Unavailable(why)) => not_compared.push((name.clone(), why)),
                None => {
                    let why = unavailable
                        .iter()
                        .find(|(n, _)| n == name)
                        .map_or_else(|| missing_reason(index, name, "paired"), |(_, w)| w.clone());
                    not_compared.push((name.clone(), why));
                }
            }
        }
        let position = records.iter().enumerate().map(|(i, r)| (r.name.clone(), i)).collect();
        (
            Comparison {
                records,
                not_compared,
                position,
                quantizers: HashMap::new(),
                quantizer_effects: HashMap::new(),
                per_tensor_weights: HashMap::new(),
                integer_accumulations: HashMap::new(),
                input_nonfinite: HashMap::new(),
            },
            histograms,
        )
    }
}

impl PairReducer for PairedComparison {
    fn reduce(&self, tensor: &str, reference: Operand<'_>, candidate: Operand<'_>) {
        let reduced = match (reference.dtype, candidate.dtype) {
            (Err(why), _) => Reduced::Unavailable(format!("reference: {why}")),
            (_, Err(why)) => Reduced::Unavailable(format!("candidate: {why}")),
            (Ok(rt), Ok(ct)) => match different_meaning(rt, ct) {
                Some(why) => Reduced::Unavailable(why),
                None => {
                    self.reference_bytes.fetch_add((reference.values.len() * rt.size()) as u64, Ordering::Relaxed);
                    if self.keep.contains(tensor) && reference.shape == candidate.shape {
                        self.kept.lock().unwrap_or_else(|p| p.into_inner()).insert(
                            tensor.to_string(),
                            (reference.shape.clone(), reference.values.to_vec(), candidate.values.to_vec()),
                        );
                    }
                    let (metrics, histogram) = if reference.shape == candidate.shape {
                        let m = if self.outputs.contains(tensor) {
                            self.tol.output(tensor, rt).metrics(&reference.values, &candidate.values, &reference.shape)
                        } else {
                            compute(&reference.values, &candidate.values, self.tol.judging(tensor, rt))
                        };
                        let h = (!m.passes()).then(|| histogram(&reference.values, &candidate.values, HISTOGRAM_BINS));
                        (Some(m), h)
                    } else {
                        (None, None)
                    };
                    Reduced::Compared {
                        record_inputs: ((reference.shape, rt), (candidate.shape, ct)),
                        metrics,
                        histogram,
                    }
                }
            },
        };
        self.reduced.lock().unwrap_or_else(|p| p.into_inner()).insert(tensor.to_string(), reduced);
        self.arrival.lock().unwrap_or_else(|p| p.into_inner()).push(tensor.to_string());
    }
}
