use layerwise_analysis::num::FiniteOrString;
use layerwise_analysis::{Comparison, Extras, Histogram, TensorRecord, Tolerance, Verdict, WalkRule};
use layerwise_model::{GraphIndex, Model, Tensor, WeightRange};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const SCHEMA: &str = "layerwise.report/1";

/// Everything a report is built from.
pub struct ReportContext<'a> {
    pub model: &'a Model,
    pub index: &'a GraphIndex,
    pub ref_spec: String,
    pub cand_spec: String,
    /// The candidate's own model file (`--cand-model`), where it runs one.
    pub cand_model: Option<String>,
    pub ref_notes: Vec<String>,
    pub cand_notes: Vec<String>,
    pub tolerance: Tolerance,
    /// Tensors given their own tolerance.
    pub tensor_tolerances: Vec<(String, Tolerance)>,
    /// The precision whose default tolerances apply where none was given (`TF32`, `FP16`, ...).
    pub tolerance_defaults: layerwise_model::Arithmetic,
    pub rule: WalkRule,
    pub inputs: Vec<InputInfo>,
    pub comparison: &'a Comparison,
    pub verdict: &'a Verdict,
    pub weights: &'a [WeightRange],
    pub unavailable: Vec<(String, String)>,
    /// Values of the first divergent tensor, reference against candidate.
    pub histogram: Option<Histogram>,
    /// The candidate's compiled layers (TensorRT), each with the ONNX nodes it computes.
    pub engine_layers: Vec<(String, Vec<String>)>,
    /// Search marking, isolation, counterfactual checks, memory split, samples.
    pub extras: Extras,
    /// The one non-deterministic part of a report: when and how long.
    pub run_info: RunInfo,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RunInfo {
    pub generated_at_unix_s: u64,
    pub durations_s: Vec<(String, f64)>,
    /// The process's peak resident memory so far (Linux `VmHWM`), in MiB; absent elsewhere.
    pub peak_memory_mib: Option<f64>,
}

impl RunInfo {
    /// Run facts as of now: the time, the given step durations and the peak memory.
    pub fn now(durations_s: Vec<(String, f64)>) -> RunInfo {
        let generated_at_unix_s =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        RunInfo { generated_at_unix_s, durations_s, peak_memory_mib: peak_memory_mib() }
    }
}

fn peak_memory_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some((kib / 1024.0 * 10.0).round() / 10.0)
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Report {
    #[schemars(extend("const" = SCHEMA))]
    pub schema: String,
    pub layerwise_version: String,
    pub model: ModelInfo,
    #[serde(rename = "ref")]
    pub reference: BackendInfo,
    pub cand: BackendInfo,
    pub tolerances: Tolerances,
    pub inputs: Vec<InputInfo>,
    pub tensors: Vec<TensorRecord>,
    pub not_compared: Vec<NotCompared>,
    pub weights_out_of_fp16_range: Vec<WeightInfo>,
    pub outputs: Vec<OutputInfo>,
    pub worst_output: Option<String>,
    pub verdict: Verdict,
    /// The first divergent node's inputs and consumers, and its tensor's value histogram.
    pub first_divergent_detail: Option<Detail>,
    #[serde(flatten)]
    pub extras: Extras,
    pub run_info: RunInfo,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Detail {
    pub inputs: Vec<Neighbour>,
    pub consumers: Vec<Neighbour>,
    pub histogram: Option<Histogram>,
    /// The candidate engine's layer (a TensorRT fused region) that computes the node, if the
    /// candidate is a compiled engine.
    pub engine_layer: Option<EngineLayerInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EngineLayerInfo {
    pub name: String,
    /// How many ONNX nodes the layer computes (fused together).
    pub onnx_nodes: usize,
}

/// A tensor next to the first divergent node: one of its inputs, or a consumer's output.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Neighbour {
    pub tensor: String,
    /// The node producing `tensor` (empty for graph inputs and weights).
    pub node: String,
    pub op_type: String,
    pub weight: bool,
    /// Relative L2 error; `null` when the tensor was not compared (a graph input is exact: 0).
    #[serde(default, with = "layerwise_analysis::num::option_finite")]
    #[schemars(with = "Option<FiniteOrString>")]
    pub error: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelInfo {
    pub path: String,
    pub sha256: String,
    pub ir_version: i64,
    pub opset: i64,
    pub node_count: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BackendInfo {
    pub spec: String,
    pub notes: Vec<String>,
    /// The model file this side ran, where it is not the report's `model` (`--cand-model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl BackendInfo {
    /// The spec, and the model file it ran where that is another: "ort:cpu on q.onnx".
    pub fn described(&self) -> String {
        match &self.model {
            Some(m) => format!("{} on {m}", self.spec),
            None => self.spec.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Tolerances {
    #[serde(with = "layerwise_analysis::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub atol: f64,
    #[serde(with = "layerwise_analysis::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub rtol: f64,
    #[serde(with = "layerwise_analysis::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub range_tol: f64,
    /// The precision whose defaults apply where no tolerance was given: `FP16`, `BF16`, `TF32`
    /// (FP16's defaults: the same 10-bit mantissa) or `float32`.
    pub defaults_for: String,
    pub rule: String,
    pub walk: WalkRule,
    /// Tensors given their own tolerance (`--atol logits:1e-3`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_tensor: Vec<TensorTolerance>,
}

/// One tensor's own tolerance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TensorTolerance {
    pub tensor: String,
    #[serde(flatten)]
    pub tolerance: Tolerance,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct InputInfo {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: String,
    pub source: String,
    pub nan: usize,
    pub inf: usize,
}

impl InputInfo {
    /// What the report says of an input fed to the model: `source` says where it came from.
    pub fn of(name: &str, tensor: &Tensor, source: &str) -> InputInfo {
        let (nan, inf) = tensor.non_finite_counts();
        InputInfo {
            name: name.to_string(),
            shape: tensor.shape.clone(),
            dtype: tensor.dtype().name().to_string(),
            source: source.to_string(),
            nan,
            inf,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NotCompared {
    pub tensor: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct WeightInfo {
    pub name: String,
    pub kind: String,
    pub numel: usize,
    /// Largest |w|: inf when the weight holds inf (a plain f64 would be written as `null`).
    #[serde(with = "layerwise_analysis::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub max_abs: f64,
    pub overflow_count: usize,
    pub subnormal_count: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OutputInfo {
    pub name: String,
    pub compared: bool,
    pub pass: bool,
    #[serde(with = "layerwise_analysis::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub rel_l2_err: f64,
    #[serde(with = "layerwise_analysis::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub max_abs_err: f64,
    /// Every value of the output is NaN or inf in the reference and the candidate matches it
    /// (NaN inputs make NaN outputs): it passes on matching inf/NaN alone, and nothing of it was
    /// judged. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unjudged: bool,
}

fn neighbour(ctx: &ReportContext, tensor: &str) -> Neighbour {
    let node = ctx.index.producer(tensor);
    Neighbour {
        tensor: tensor.to_string(),
        node: node.map(|n| n.name.clone()).unwrap_or_default(),
        op_type: node.map(|n| n.op_type.clone()).unwrap_or_else(|| {
            if ctx.index.is_graph_input(tensor) {
                "input".into()
            } else {
                "weight".into()
            }
        }),
        weight: ctx.index.is_constant_like(tensor),
        error: match ctx.comparison.get(tensor) {
            Some(r) => Some(r.error_level()),
            None if ctx.index.is_graph_input(tensor) => Some(0.0),
            None => None,
        },
    }
}

fn detail(ctx: &ReportContext) -> Option<Detail> {
    let fd = ctx.verdict.first_divergent.as_ref()?;
    let node = ctx.index.node(&fd.node)?;
    let inputs = node.inputs.iter().filter(|i| !i.is_empty()).map(|i| neighbour(ctx, i)).collect();
    let mut consumers = Vec::new();
    for out in node.outputs.iter().filter(|o| !o.is_empty()) {
        for &c in ctx.index.consumers(out) {
            for t in ctx.index.nodes[c].outputs.iter().filter(|o| !o.is_empty()).take(1) {
                consumers.push(neighbour(ctx, t));
            }
        }
    }
    let engine_layer = ctx
        .engine_layers
        .iter()
        .find(|(_, nodes)| nodes.contains(&fd.node))
        .map(|(name, nodes)| EngineLayerInfo { name: name.clone(), onnx_nodes: nodes.len() });
    Some(Detail { inputs, consumers, histogram: ctx.histogram.clone(), engine_layer })
}

pub fn build_report(ctx: ReportContext) -> Report {
    let first_divergent_detail = detail(&ctx);
    let mut not_compared: Vec<NotCompared> =
        ctx.comparison.not_compared.iter().map(|(t, r)| NotCompared { tensor: t.clone(), reason: r.clone() }).collect();
    for (t, r) in &ctx.unavailable {
        if !not_compared.iter().any(|n| &n.tensor == t) {
            not_compared.push(NotCompared { tensor: t.clone(), reason: r.clone() });
        }
    }
    for (t, owner) in ctx.index.subgraph_tensors() {
        not_compared.push(NotCompared {
            tensor: t.to_string(),
            reason: format!("produced inside a subgraph of node '{owner}'; not visible from the main graph"),
        });
    }
    // An output the graph lists twice is one output.
    let mut seen = std::collections::HashSet::new();
    let outputs = ctx
        .index
        .outputs
        .iter()
        .filter(|o| seen.insert(o.as_str()))
        .map(|o| match ctx.comparison.get(o) {
            Some(r) => OutputInfo {
                name: o.clone(),
                compared: true,
                pass: r.pass,
                rel_l2_err: r.error_level(),
                max_abs_err: r.metrics.max_abs_err,
                unjudged: r.unjudged(),
            },
            None => OutputInfo {
                name: o.clone(),
                compared: false,
                pass: false,
                rel_l2_err: f64::NAN,
                max_abs_err: f64::NAN,
                unjudged: false,
            },
        })
        .collect();
    Report {
        schema: SCHEMA.to_string(),
        layerwise_version: env!("CARGO_PKG_VERSION").to_string(),
        model: ModelInfo {
            path: ctx.model.path.display().to_string(),
            sha256: ctx.model.sha256.clone(),
            ir_version: ctx.model.proto.ir_version.unwrap_or(0),
            opset: ctx.model.opset(),
            node_count: ctx.index.nodes.len(),
        },
        reference: BackendInfo { spec: ctx.ref_spec, notes: ctx.ref_notes, model: None },
        cand: BackendInfo { spec: ctx.cand_spec, notes: ctx.cand_notes, model: ctx.cand_model },
        tolerances: Tolerances {
            atol: ctx.tolerance.atol,
            rtol: ctx.tolerance.rtol,
            range_tol: ctx.tolerance.range_tol,
            defaults_for: ctx.tolerance_defaults.to_string(),
            by_tensor: ctx.tensor_tolerances.iter().map(|(t, tol)| TensorTolerance { tensor: t.clone(), tolerance: *tol }).collect(),
            rule: "element passes if |cand - ref| <= atol + rtol * |ref| + range_tol * max|ref| (max over the reference tensor); a tensor passes if all elements pass and no inf/NaN differs".to_string(),
            walk: ctx.rule,
        },
        inputs: ctx.inputs,
        tensors: ctx.comparison.records.clone(),
        not_compared,
        weights_out_of_fp16_range: ctx
            .weights
            .iter()
            .map(|w| WeightInfo {
                name: w.name.clone(),
                kind: w.kind.to_string(),
                numel: w.numel,
                max_abs: w.max_abs as f64,
                overflow_count: w.overflow_count,
                subnormal_count: w.subnormal_count,
            })
            .collect(),
        outputs,
        worst_output: ctx.verdict.worst_output.clone(),
        first_divergent_detail,
        verdict: ctx.verdict.clone(),
        extras: ctx.extras,
        run_info: ctx.run_info,
    }
}
