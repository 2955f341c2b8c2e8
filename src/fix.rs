//! `layerwise fix`: from the first divergent layer to the smallest set of nodes to keep in FP32,
//! verified by re-running the candidate, and written out as an FP16 model with FP32 islands.
//! docs/fix.md describes the search and the outputs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use layerwise_analysis::{
    add_passed_through, compare_all, is_weight_output, passed_through, pattern_of, verdict_order, walk_back, Candidate,
    Comparison, Status, ToleranceSet, Verdict, WalkRule, WEIGHT_OUTPUT,
};
use layerwise_model::convert::{check_float_types, float_tensor_set, ConvertOptions};
use layerwise_model::{scan_fp16_weight_range, GraphIndex, Model, Selection, WeightRange};
use layerwise_report::{
    render_fix_terminal, write_atomic, FixReport, FixStage, FixStatus, KeptPattern, LoadCheck, ModelCheck,
    OutputChange, Round, FIX_SCHEMA,
};
use layerwise_runtime::inputs::prepare_inputs;
use layerwise_runtime::{float32_tensors, Backend, Precision, RunOutput, RunRequest, Tensor};

use crate::keep::{HeldRun, KeepRunner};
use crate::pipeline::noise_floor::{noise_floor as noise_floor_of, FloorTarget};
use crate::pipeline::setup::{feeds_of, set_up, Judging, Setup};
use crate::pipeline::{BisectOptions, Steps};
use crate::write_rule::check_writable_target;

/// Everything `layerwise fix` takes.
#[derive(Debug, Clone)]
pub struct FixOptions {
    pub bisect: BisectOptions,
    /// Where to write the fixed FP16 model (and `<output>.keep-fp32.json` beside it).
    pub output: Option<PathBuf>,
    /// Most rounds of adding a pattern before giving up.
    pub max_rounds: usize,
}

pub struct FixOutcome {
    pub report: FixReport,
    pub text: String,
}

/// A candidate run's comparison and verdict.
type Judged = (Comparison, Verdict);

/// One sample of the set the keep list must hold on: its inputs and the reference's tensors.
struct Sample {
    name: String,
    feeds: Vec<(String, Tensor)>,
    reference: std::collections::HashMap<String, Tensor>,
    /// The candidate's latest runs of this sample (an emulating candidate's): a run is computed
    /// from the one it changes least, re-running only what its keep list changes.
    runs: Vec<HeldRun<'static>>,
}

/// Candidate runs held per sample to compute the next from: two cover the search's steps (a
/// trial differs least from the last run, or from the one before it where that trial failed).
const HELD_RUNS: usize = 2;

struct Search<'a> {
    index: &'a GraphIndex,
    /// Every sample (one unless `--inputs DIR` or a list of samples is given); a keep list must
    /// bring every output within tolerance on each.
    samples: Vec<Sample>,
    /// The sample the last run judged by: the first with the largest output error.
    judged: usize,
    order: Vec<String>,
    candidate: Box<dyn Backend>,
    keeper: KeepRunner<'a>,
    tolerances: ToleranceSet,
    rule: WalkRule,
    /// The candidate's arithmetic as bisect's walk reads it (the same `Judging`), so that a
    /// TF32 candidate is walked as TF32 in both.
    walk_as: Candidate,
    weights: Vec<WeightRange>,
    runs: usize,
    /// Progress on stderr: one step per candidate run.
    steps: Steps,
}

impl Search<'_> {
    /// Candidate runs with `keep` in FP32 (emulated directly, or on a converted model), one per
    /// sample: the verdict of the sample whose outputs err most (the earliest on ties), which
    /// passes only when every sample does.
    fn run(&mut self, keep: &[String]) -> Result<(Comparison, Verdict)> {
        self.runs += 1;
        let nodes = format!("keeping {} node{} in FP32", keep.len(), if keep.len() == 1 { "" } else { "s" });
        let mut worst: Option<(f64, usize, (Comparison, Verdict))> = None;
        for k in 0..self.samples.len() {
            let label = match self.samples.len() {
                1 => format!("candidate run {} ({nodes})", self.runs),
                n => {
                    format!("candidate run {} ({nodes}), sample {} of {n} ({})", self.runs, k + 1, self.samples[k].name)
                }
            };
            let Search { steps, keeper, candidate, samples, .. } = self;
            let (feeds, held) = (&samples[k].feeds, &samples[k].runs);
            let run = steps.run(&label, || {
                if let Some(run) = keeper.run_all_from(candidate.as_mut(), keep, feeds, held)? {
                    return Ok(run);
                }
                let out = keeper.run(candidate.as_mut(), keep, feeds, &Selection::All)?;
                Ok(HeldRun::whole(keeper, keep, out.tensors))
            })?;
            let judged = self.judge(k, run.tensor_map());
            if self.keeper.emulated() {
                let runs = &mut self.samples[k].runs;
                runs.push(run);
                if runs.len() > HELD_RUNS {
                    runs.remove(0);
                }
            }
            let error = judged.0.largest_error(&self.index.outputs);
            let failing = judged.1.status == Status::Diverged;
            if worse(failing, error, worst.as_ref().map(|(e, _, (_, v))| (v.status == Status::Diverged, *e))) {
                worst = Some((error, k, judged));
            }
        }
        let (_, k, judged) = worst.expect("at least one sample");
        self.judged = k;
        Ok(judged)
    }

    /// Drops the latest run of each sample from those held to compute the next from (a trial whose
    /// keep list was not taken), so that the run of the keep list that stands stays held however
    /// many trials fail after it.
    fn forget_last_run(&mut self) {
        for sample in &mut self.samples {
            sample.runs.pop();
        }
    }

    /// The sample the last run judged by.
    fn sample(&self) -> &Sample {
        &self.samples[self.judged]
    }

    /// The model outputs of `out` (a run of the written file, whose intermediate tensors have other
    /// names) against the reference: whether every output is within tolerance.
    fn judge_outputs(&self, k: usize, out: &RunOutput) -> (Comparison, bool) {
        let outputs: Vec<String> = self.index.outputs.clone();
        let comparison = compare_all(self.index, &outputs, &self.samples[k].reference, &out.tensors, &self.tolerances);
        let pass = comparison.outputs_pass(self.index);
        (comparison, pass)
    }

    fn judge(&self, k: usize, tensors: &std::collections::HashMap<String, Tensor>) -> (Comparison, Verdict) {
        let mut comparison =
            compare_all(self.index, &self.order, &self.samples[k].reference, tensors, &self.tolerances);
        comparison.note_input_nonfinite(&self.samples[k].feeds);
        let verdict = walk_back(self.index, &comparison, &self.weights, self.rule, self.walk_as);
        (comparison, verdict)
    }
}

/// Whether a sample (failing or not, its output error) is worse than the worst so far, by
/// bisect's order of samples ([`verdict_order`]); the earlier sample stays on ties.
fn worse(failing: bool, error: f64, so_far: Option<(bool, f64)>) -> bool {
    so_far.is_none_or(|s| verdict_order((failing, error), s) == std::cmp::Ordering::Greater)
}

/// The kind of pattern for an If or Loop left as it is, kept FP32 whole.
const OPAQUE_CONTROL_FLOW: &str = "control_flow_left_as_is";

/// On a blame chain with no first divergent layer, the node (not yet kept, with a float output)
/// whose output error is the largest multiple, at least 2x, of its input's: where the drift meets
/// the most sensitive consumer. Keeping an integer op in FP32 would change nothing.
fn strongest_amplifier(comparison: &Comparison, verdict: &Verdict, keep: &[String]) -> Option<(String, String)> {
    let float_output = |tensor: &str| comparison.get(tensor).is_some_and(|r| r.ref_dtype.starts_with("float"));
    verdict
        .chain
        .windows(2)
        .filter(|w| {
            !keep.contains(&w[0].node) && float_output(&w[0].tensor) && w[1].error > 0.0 && w[0].error.is_finite()
        })
        .map(|w| (w[0].error / w[1].error, &w[0]))
        .filter(|(ratio, _)| *ratio >= 2.0)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(ratio, step)| {
            (
                step.node.clone(),
                format!(
                    "{} ({}): drift, and it is the chain's strongest amplifier ({ratio:.1}x)",
                    step.node, step.op_type
                ),
            )
        })
}

/// The nodes (not kept yet) where the reference leaves FP16's range from inputs within it: an FP16
/// candidate stores inf there whatever comes before, so each is an overflow of its own, which
/// this run may not show as one (inf from an earlier overflow already reaches it). Found from the
/// reference's values alone, all in one round: a model with many independent overflows needs one
/// round for them, not a round each (and more than `--max-rounds`). One kept without need is
/// dropped by the pruning.
fn range_exits(index: &GraphIndex, comparison: &Comparison, keep: &[String]) -> Vec<(String, String)> {
    // Float32 tensors are what an FP16 model stores in FP16 (a float64 one stays as it is).
    let beyond = |t: &str| comparison.get(t).filter(|r| r.metrics.ref_fp16_overflow > 0 && r.ref_dtype == "float32");
    index
        .nodes
        .iter()
        .filter(|n| !keep.contains(&n.name))
        .filter(|n| n.inputs.iter().all(|t| t.is_empty() || index.is_constant_like(t) || beyond(t).is_none()))
        .filter_map(|n| {
            let (t, r) = n.outputs.iter().find_map(|t| Some((t, beyond(t)?)))?;
            let why = format!("{} ({}): the reference reaches {} in '{t}' from inputs within FP16's range, beyond the FP16 maximum 65504: an FP16 run stores inf there", n.name, n.op_type, num(r.metrics.ref_max_abs));
            Some((n.name.clone(), why))
        })
        .collect()
}

/// Nodes that may be kept in FP32 (they compute a float tensor, from the inputs or from weights
/// alone, or an integer from a float; not Constants), in topological order, `keep` excluded.
fn keepable(index: &GraphIndex, sample: &Sample, keep: &[String]) -> Vec<String> {
    // The reference's tensors, and the model's inputs as fed (a Cast may read one directly).
    let float = |t: &String| {
        sample
            .reference
            .get(t)
            .or_else(|| sample.feeds.iter().find(|(n, _)| n == t).map(|(_, v)| v))
            .is_some_and(|t| t.dtype().is_float())
    };
    index
        .nodes
        .iter()
        .filter(|n| !keep.contains(&n.name))
        // Nodes computing from weights alone (a Slice or Concat of an LSTM's weights) count too:
        // left out, they round the weights their kept readers take (found by the independent
        // tester on Silero VAD, whose every weight is a Constant reshaped in its branch). A
        // Constant's own precision follows its readers. A node that computes an integer from a
        // float (a Cast to int32, ArgMax) counts: kept, it reads its input as float32 holds it.
        .filter(|n| {
            n.op_type != "Constant"
                && (n.outputs.iter().any(float)
                    || layerwise_analysis::may_compute_integer_from_float(&n.op_type)
                        && n.inputs.first().is_some_and(float))
        })
        .map(|n| n.name.clone())
        .collect()
}

/// The smallest contiguous region (topological order) whose nodes, kept in FP32 beside `keep`,
/// bring every output within tolerance: the start found by bisection, then the end, then chunks of
/// the region dropped where the outputs still pass. `None` when keeping every node does not pass.
fn region_search(
    search: &mut Search,
    index: &GraphIndex,
    keep: &[String],
    rounds: &mut Vec<Round>,
) -> Result<Option<(Vec<String>, Judged)>> {
    let nodes = keepable(index, search.sample(), keep);
    let trial = |search: &mut Search,
                 region: &[String],
                 stage: FixStage,
                 rounds: &mut Vec<Round>|
     -> Result<(bool, (Comparison, Verdict))> {
        let all: Vec<String> = keep.iter().chain(region).cloned().collect();
        let outcome = search.run(&all)?;
        let pass = outcome.1.status == Status::Pass;
        rounds.push(Round {
            stage,
            keep_fp32: all.len(),
            status: outcome.1.status,
            worst_output: outcome.1.worst_output.clone(),
            first_divergent: outcome.1.first_divergent.as_ref().map(|f| f.node.clone()),
        });
        Ok((pass, outcome))
    };
    let (pass, mut best) = trial(search, &nodes, FixStage::Region, rounds)?;
    if !pass {
        return Ok(None);
    }
    // Start: the latest `lo` for which nodes[lo..] still fixes it (nodes[n..] = keep alone fails).
    let (mut ok, mut bad) = (0, nodes.len());
    while bad - ok > 1 {
        let mid = (ok + bad) / 2;
        let (pass, outcome) = trial(search, &nodes[mid..], FixStage::Region, rounds)?;
        if pass {
            ok = mid;
            best = outcome;
        } else {
            bad = mid;
        }
    }
    let lo = ok;
    // End: the earliest `hi` for which nodes[lo..hi] still fixes it.
    let (mut ok, mut bad) = (nodes.len(), lo);
    while ok - bad > 1 {
        let mid = (ok + bad) / 2;
        let (pass, outcome) = trial(search, &nodes[lo..mid], FixStage::Region, rounds)?;
        if pass {
            ok = mid;
            best = outcome;
        } else {
            bad = mid;
        }
    }
    let mut region: Vec<String> = nodes[lo..ok].to_vec();
    // Prune: drop eighths of the region that are not needed.
    let chunk = region.len().div_ceil(8).max(1);
    let mut start = 0;
    while start < region.len() && region.len() > 1 {
        let end = (start + chunk).min(region.len());
        let without: Vec<String> = region[..start].iter().chain(&region[end..]).cloned().collect();
        let (pass, outcome) = trial(search, &without, FixStage::Prune, rounds)?;
        if pass {
            region = without;
            best = outcome;
        } else {
            start = end;
        }
    }
    Ok(Some((region, best)))
}

/// Every model output before and after, but for the weights passed straight to an output, which
/// no run is compared on (the summary names them).
fn output_changes(index: &GraphIndex, before: &Comparison, after: &Comparison) -> Vec<OutputChange> {
    let mut seen = std::collections::HashSet::new();
    index
        .outputs
        .iter()
        .filter(|o| !is_weight_output(index, o) && seen.insert(o.as_str()))
        .map(|o| {
            let b = before.get(o);
            let a = after.get(o);
            OutputChange {
                name: o.clone(),
                before_rel_l2: b.map(|r| r.error_level()).unwrap_or(f64::NAN),
                before_pass: b.is_some_and(|r| r.pass),
                after_rel_l2: a.map(|r| r.error_level()).unwrap_or(f64::NAN),
                after_pass: a.is_some_and(|r| r.pass),
            }
        })
        .collect()
}

/// The written file at `path`, read back and evaluated in its own types on every sample: it must
/// hold on each. The worst sample's outputs (the first failing one, else the largest error), or
/// why the evaluation could not run.
fn typed_check(search: &Search, path: &Path) -> Result<Result<Option<(bool, f64, Comparison)>, String>> {
    let written = Model::load(path)?;
    let wi = GraphIndex::build(written.graph())?;
    let mut typed = layerwise_runtime::typed::TypedBackend::new(&layerwise_runtime::BackendSpec::ort_cpu(), None);
    let mut checked: Result<Option<(bool, f64, Comparison)>, String> = Ok(None);
    for k in 0..search.samples.len() {
        match typed.run(&RunRequest {
            model: &written,
            index: &wi,
            inputs: &search.samples[k].feeds,
            selection: &Selection::Names(Vec::new()),
        }) {
            Ok(out) => {
                let (comparison, pass) = search.judge_outputs(k, &out);
                let error = comparison.largest_error(&search.index.outputs);
                let so_far = match &checked {
                    Ok(Some((p, e, _))) => Some((!p, *e)),
                    _ => None,
                };
                if worse(!pass, error, so_far) {
                    checked = Ok(Some((pass, error, comparison)));
                }
            }
            Err(e) => return Ok(Err(e.to_string())),
        }
    }
    Ok(checked)
}

/// Whether keep-list name `name` is a node the inlining of `inlined` made (`If/output0`,
/// `Loop/final0`): no node of the written file, whose If or Loop interface is float32 already.
fn made_by_inlining(name: &str, inlined: &[String]) -> bool {
    inlined.iter().any(|n| {
        name.strip_prefix(n.as_str())
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|rest| ["If", "Loop"].iter().any(|op| layerwise_model::inline::made_by_inlining(op, rest)))
    })
}

/// `trtexec` flags that keep the same layers in FP32 in a weakly typed TensorRT 10 build, as they
/// are pasted into a shell (the `--layerPrecisions` value one quoted word). A node inside an If or
/// Loop body (`Node/then/inner`, as layerwise names it once inlined) is named by its own name in
/// the file, the name TensorRT's ONNX parser gives its layer. A name that cannot be given there
/// ([`layerwise_report::escape::trtexec_layer_refusal`]) is left out; the reports name it. So is a
/// node the inlining made (`If/output0`, `Loop/final0`): the file has no such layer, and the float32
/// interface of its If or Loop already is what keeping it asks.
pub fn trtexec_flags(keep: &[String], inlined: &[String], low: &str) -> String {
    let keep: Vec<&String> = keep
        .iter()
        .filter(|n| layerwise_report::escape::trtexec_layer_refusal(n).is_none() && !made_by_inlining(n, inlined))
        .collect();
    if keep.is_empty() {
        return String::new();
    }
    // The innermost body holding the node: the longest inlined node name that prefixes it.
    let own_name = |name: &str| -> String {
        inlined
            .iter()
            .filter_map(|n| name.strip_prefix(n.as_str())?.strip_prefix('/')?.split_once('/').map(|(_, rest)| rest))
            .min_by_key(|rest| rest.len())
            .unwrap_or(name)
            .to_string()
    };
    // A Loop's iterations share one body, so one layer: named once.
    let mut named = std::collections::HashSet::new();
    let spec: Vec<String> =
        keep.iter().map(|n| format!("{}:fp32", own_name(n))).filter(|layer| named.insert(layer.clone())).collect();
    let value = layerwise_report::escape::shell_quoted(&spec.join(",")).expect("names a shell word can hold");
    format!("--{low} --precisionConstraints=obey --layerPrecisions={value}")
}

/// The keep list `fix -o OUT` writes beside the model: `OUT.keep-fp32.json`.
pub(crate) fn keep_list_path(out: &Path) -> PathBuf {
    PathBuf::from(format!("{}.keep-fp32.json", out.display()))
}

/// Every output of `fix` against what the run reads and each other ([`crate::write_rule`]),
/// before any work.
pub fn check_fix_outputs(options: &FixOptions) -> Result<()> {
    let b = &options.bisect;
    let mut reads = crate::pipeline::bisect_reads(b);
    for (what, path) in b.outputs.paths() {
        reads.check_output_file(path, &format!("the {what}"))?;
    }
    if let Some(out) = &options.output {
        check_writable_target(out, "the fixed model")?;
        if std::fs::metadata(out).is_ok_and(|m| !m.is_file()) {
            anyhow::bail!("-o {} is not a regular file: fix checks the model it writes by reading it back; give a file path, or leave -o out", out.display());
        }
        for (what, path) in files_written_at(out) {
            reads.check_output_file(&path, what)?;
        }
    }
    Ok(())
}

/// What `fix -o OUT` writes: the model, and beside it the keep list (an output too, found by the
/// independent tester: it replaced an input model named like it) and the weights file of a model
/// over 1 GiB.
fn files_written_at(out: &Path) -> [(&'static str, PathBuf); 4] {
    [
        ("-o", out.to_path_buf()),
        ("the keep list written beside -o", keep_list_path(out)),
        ("the weights file written beside -o (for a model over 1 GiB)", Model::oversized_data_path(out)),
        ("the exclusion list written beside -o (a quantized candidate)", exclusion_list_path(out)),
    ]
}

/// The exclusion list `fix -o OUT --cand-model QDQ.onnx` writes beside the model:
/// `OUT.nodes-to-exclude.json`.
pub(crate) fn exclusion_list_path(out: &Path) -> PathBuf {
    PathBuf::from(format!("{}.nodes-to-exclude.json", out.display()))
}

pub fn fix(options: &FixOptions) -> Result<FixOutcome> {
    check_fix_outputs(options)?;
    let b = &options.bisect;
    let mut steps = Steps::new(b.progress, b.progress_lines);
    let original = steps.run("loading model", || Model::load(&b.model).map_err(Into::into))?;
    let written = options.output.as_deref().map(files_written_at);
    let fixed_model: Vec<(&str, &Path)> =
        written.iter().flatten().map(|(what, path)| (*what, path.as_path())).collect();
    crate::pipeline::check_not_external_data(&original, "the input model's external data", b, &fixed_model)?;
    let original_index = GraphIndex::build(original.graph()).with_context(|| format!("{}", b.model.display()))?;
    // The plan bisect makes: backends, inputs, and the control flow as the reference ran it
    // (bodies inlined, so nodes inside can be kept); the fixed model is the original with the keep
    // list resolved into its bodies.
    let setup = set_up(&original, b, &mut steps)?;
    let mut sets = Vec::new();
    for (name, sample) in &setup.samples {
        sets.push((
            name.clone(),
            feeds_of(&prepare_inputs(&setup.decls, sample).map_err(|e| setup.owners.explain(name, e))?),
        ));
    }
    if sets.is_empty() {
        bail!("no inputs to run");
    }
    if let Some((cm, _)) = &setup.cand_model {
        // A Q/DQ candidate is fixed by leaving nodes unquantized in its own model.
        if setup.judging.quantization.is_none() {
            bail!(
                "fix --cand-model takes a Q/DQ version of the model (QuantizeLinear/DequantizeLinear nodes), and {} has none: fix converts a float model to FP16 itself (leave --cand-model out), and bisect compares any other candidate model",
                cm.path.display()
            );
        }
        // Operators that compute on quantized values themselves (QOperator format) have no
        // float counterpart to keep: unquantizing them would mean rebuilding the float graph.
        let integer_ops: std::collections::BTreeSet<&str> = cm
            .graph()
            .node
            .iter()
            .map(|n| n.op_type())
            .filter(|op| layerwise_model::quant::is_integer_op(op))
            .collect();
        if !integer_ops.is_empty() {
            bail!(
                "fix --cand-model takes a Q/DQ model (float ops between QuantizeLinear/DequantizeLinear pairs, quantize_static's QuantFormat.QDQ), and {} computes with {} (the QOperator format, or dynamic quantization): its nodes have no float counterpart to leave unquantized; quantize it again in the QDQ format",
                cm.path.display(),
                integer_ops.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
        return fix_quantized(options, setup, sets, steps);
    }
    let inlined: Vec<String> =
        setup.control_flow.as_ref().map(|cf| cf.inlined.iter().map(|i| i.node.clone()).collect()).unwrap_or_default();
    // If and Loop nodes left as they are (samples that take different branches, a Loop whose trip
    // count the run decides): the emulation does not round inside their bodies and the typed check
    // runs each as one ONNX Runtime call, so neither can vouch for an FP16 body. They stay FP32
    // whole (found by the independent tester: FIXED for an If whose branch overflows FP16).
    let opaque: Vec<(String, String)> = setup
        .control_flow
        .as_ref()
        .map(|cf| {
            cf.kept
                .iter()
                .filter(|(n, _)| setup.index.node(n).is_some_and(|info| matches!(info.op_type.as_str(), "If" | "Loop")))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    // Each If replaced by the branch these inputs took: the other branch is written converted with
    // nothing kept, and no run saw it (the summary says so).
    let branches_taken: Vec<(String, String)> = setup
        .control_flow
        .as_ref()
        .map(|cf| cf.inlined.iter().filter(|i| i.op_type == "If").map(|i| (i.node.clone(), i.taken.clone())).collect())
        .unwrap_or_default();
    let flattened = setup.control_flow.is_some();
    let Setup { model, index, mut reference, mut candidate, .. } = setup;
    let (model, index): (&Model, &GraphIndex) = (&model, &index);
    let keeper = KeepRunner::new(model, index, candidate.as_mut());
    // A BF16 emulation is fixed into a BF16 model; anything else into FP16.
    let low = if candidate.precision() == Precision::Bf16 { Precision::Bf16 } else { Precision::Fp16 };
    let target = if low == Precision::Bf16 {
        layerwise_model::convert::Target::Bf16
    } else {
        layerwise_model::convert::Target::Fp16
    };
    // Said before any run: a BF16 file needs opset 13 (the search would end in the same refusal).
    if low == Precision::Bf16 && model.opset() < 13 {
        bail!(
            "fix --cand {} writes a BF16 model, which needs opset 13 or later (Cast and most ops take bfloat16 from there); this model is opset {}: convert it with onnx's version converter first (onnx.version_converter.convert_version(model, 17)); bisect --cand {} needs no conversion",
            b.candidate,
            model.opset(),
            b.candidate
        );
    }
    // A TF32 candidate (sim:tf32) is judged as TF32: FP16's tolerances, its floor from what the
    // tensor cores read.
    let tensor_cores = candidate.precision() == Precision::Fp32 && candidate.tf32();
    let judging = if tensor_cores { Judging::new(Precision::Fp32, true, b)? } else { Judging::new(low, false, b)? };
    let (tolerances, rule) = (judging.tolerances.clone(), judging.rule);
    let low_flag = if low == Precision::Bf16 { "bf16" } else { "fp16" };
    let mut samples = Vec::new();
    let total = sets.len();
    for (k, (name, feeds)) in sets.into_iter().enumerate() {
        let label = if total == 1 {
            "running the reference".to_string()
        } else {
            format!("running the reference, sample {} of {total} ({name})", k + 1)
        };
        // In a set, a reference run that fails on one sample says which, as bisect's does.
        let ran = steps.run(&label, || {
            Ok(reference.run(&RunRequest { model, index, inputs: &feeds, selection: &Selection::All })?)
        });
        let mut out = if total > 1 { ran.with_context(|| format!("sample {name}"))? } else { ran? };
        // An input passed straight to an output is returned as it was fed (no run returns it).
        add_passed_through(model.graph(), index, &feeds, &mut out.tensors);
        crate::pipeline::refuse_empty_outputs(
            &index.outputs,
            |o| out.tensors.get(o).map(|t| t.shape.as_slice()),
            &feeds,
        )
        .with_context(|| format!("sample '{name}'"))?;
        samples.push(Sample { name, feeds, reference: out.tensors, runs: Vec::new() });
    }
    // Every computed tensor, and the outputs passed straight from an input (compared as bisect
    // compares them: each side returns the value it was fed).
    let order: Vec<String> = index.computed_tensors().map(str::to_string).chain(passed_through(index)).collect();
    let weights = scan_fp16_weight_range(model)?;
    let mut search = Search {
        index,
        samples,
        judged: 0,
        order,
        candidate,
        keeper,
        tolerances,
        rule,
        walk_as: judging.candidate,
        weights,
        runs: 0,
        steps,
    };

    let (first, first_verdict) = search.run(&[])?;
    // As bisect: a verdict on no output at all would say nothing.
    if index.outputs.iter().all(|o| first.get(o).is_none()) {
        bail!(
            "no model output could be compared: {}",
            index
                .outputs
                .iter()
                .map(|o| format!(
                    "{o}: {}",
                    first.not_compared.iter().find(|(t, _)| t == o).map_or(
                        if is_weight_output(index, o) { WEIGHT_OUTPUT } else { "missing from a run" },
                        |(_, why)| why.as_str()
                    )
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    let mut rounds = vec![Round {
        stage: FixStage::Diagnose,
        keep_fp32: 0,
        status: first_verdict.status,
        worst_output: first_verdict.worst_output.clone(),
        first_divergent: first_verdict.first_divergent.as_ref().map(|f| f.node.clone()),
    }];
    let mut keep: Vec<String> = Vec::new();
    let mut patterns: Vec<KeptPattern> = Vec::new();
    let mut last = (first.clone(), first_verdict.clone());
    // The nodes inside each If or Loop kept whole: the keep list's count of one node understates it
    // (an independent tester saw "keeping 1 of 5 nodes" where that node was the whole model).
    let mut inside_kept_whole = 0;
    if !opaque.is_empty() {
        for (node, why) in &opaque {
            let inside = model.graph().node.iter().find(|n| n.name() == node.as_str()).map_or(0, nodes_in_bodies);
            inside_kept_whole += inside;
            keep.push(node.clone());
            patterns.push(KeptPattern {
                kind: OPAQUE_CONTROL_FLOW.into(),
                nodes: vec![node.clone()],
                because: format!("'{node}' is left as it is ({why}): neither the emulation nor the typed check sees inside it, so it stays FP32 whole, with the {inside} nodes of its bodies"),
            });
        }
        last = search.run(&keep)?;
        rounds.push(Round {
            stage: FixStage::Pattern,
            keep_fp32: keep.len(),
            status: last.1.status,
            worst_output: last.1.worst_output.clone(),
            first_divergent: last.1.first_divergent.as_ref().map(|f| f.node.clone()),
        });
    }
    let mut stuck = None;
    // An output as sensitive to one rounding of every weight as to the candidate has no small fix.
    let mut noise_floor = None;
    // Measured only where it can stop the search: an output the candidate takes to inf/NaN is
    // never ill-conditioned (a finite floor is no match for it), and two whole reference runs of
    // a large model would decide nothing.
    let candidate_error = |worst: &str| last.0.get(worst).map_or(f64::NAN, |r| r.error_level());
    if last.1.status == Status::Diverged && b.noise_floor {
        if let Some(worst) = last.1.worst_output.clone().as_deref().filter(|w| candidate_error(w).is_finite()) {
            // As bisect: the weights only the first divergent layer's pattern reads stay exact
            // (found by the independent tester: fix called a rotary output ill-conditioned where
            // bisect measured that keeping the angle fixes it).
            let left_for_the_fix =
                crate::pipeline::weights_only_the_fix_reads(index, judging.precision, &last.1, &last.0);
            let target = FloorTarget {
                output: worst,
                candidate_error: candidate_error(worst),
                perturbation: judging.perturbation(),
                exact: &Default::default(),
                left_for_the_fix: &left_for_the_fix,
                seed: b.inputs.seed,
                quantizers: None,
            };
            // Timed in run_info, shown as no step of its own (the progress lines stay as they were).
            let started = std::time::Instant::now();
            let floor = noise_floor_of(
                reference.as_mut(),
                model,
                index,
                &search.sample().feeds,
                &search.sample().reference,
                search.tolerances.of(worst),
                target,
            )?;
            search.steps.record("measuring the noise floor", started.elapsed().as_secs_f64());
            if floor.ill_conditioned {
                stuck = Some(format!(
                    "no small keep list can exist: output '{worst}' is ill-conditioned for these inputs; {} moves it by rel L2 {}, the candidate by {} ({})",
                    floor.rounds,
                    num(floor.output_error),
                    num(floor.candidate_error),
                    if floor.ratio < 1.0 { format!("1/{:.0} of it", 1.0 / floor.ratio) } else { format!("{:.1}x", floor.ratio) }
                ));
            }
            noise_floor = Some(floor);
        }
    }
    let ill_conditioned = noise_floor.as_ref().is_some_and(|f: &layerwise_analysis::NoiseFloor| f.ill_conditioned);
    while last.1.status == Status::Diverged && rounds.len() <= options.max_rounds && !ill_conditioned {
        // The first divergent layer, and every other node where inf/NaN are born in this run:
        // each is a break of its own, and fixing them one run at a time would cost a run each.
        // With no first divergent layer (drift), the chain's strongest amplifier.
        let mut culprits = match (&last.1.first_divergent, strongest_amplifier(&last.0, &last.1, &keep)) {
            (Some(fd), _) => vec![(fd.node.clone(), format!("{} ({}): {}", fd.node, fd.op_type, fd.cause.best.detail))],
            (None, Some((node, why))) => vec![(node, why)],
            (None, None) => {
                stuck = Some(format!("{}; no layer is left to keep in FP32", last.1.summary.trim_end_matches('.')));
                break;
            }
        };
        let first = culprits[0].0.clone();
        for n in last.1.non_finite.iter().filter(|n| n.origin && !n.weight && n.node != first) {
            culprits.push((n.node.clone(), format!("{} ({}) produces {} inf/NaN", n.node, n.op_type, n.mismatched)));
        }
        if low == Precision::Fp16 {
            for exit in range_exits(index, &last.0, &keep) {
                if !culprits.iter().any(|(n, _)| *n == exit.0) {
                    culprits.push(exit);
                }
            }
        }
        let mut added = false;
        for (node, because) in culprits {
            // An island holds every reader of a value FP16 cannot hold (its edge would overflow).
            let mut pattern = layerwise_analysis::keep_pattern(index, &node, &last.0, low == Precision::Fp16);
            if low == Precision::Fp16 {
                // A constant FP16 flushes to 0 (an epsilon) is kept float32 by keeping its readers.
                if let Some(fd) = last
                    .1
                    .first_divergent
                    .as_ref()
                    .filter(|fd| fd.node == node && fd.cause.best.kind == layerwise_analysis::CauseKind::Underflow)
                {
                    for &c in fd.cause.best.weight.as_deref().map(|w| index.consumers(w)).unwrap_or(&[]) {
                        let reader = &index.nodes[c].name;
                        if !pattern.nodes.contains(reader) {
                            pattern.nodes.insert(0, reader.clone());
                        }
                    }
                }
            }
            let new: Vec<String> = pattern.nodes.iter().filter(|n| !keep.contains(n)).cloned().collect();
            if new.is_empty() {
                continue;
            }
            keep.extend(new);
            patterns.push(KeptPattern { kind: pattern.kind.to_string(), nodes: pattern.nodes, because });
            added = true;
        }
        if !added {
            stuck = Some(format!("node '{first}' is already kept in FP32 and still diverges"));
            break;
        }
        last = search.run(&keep)?;
        rounds.push(Round {
            stage: FixStage::Pattern,
            keep_fp32: keep.len(),
            status: last.1.status,
            worst_output: last.1.worst_output.clone(),
            first_divergent: last.1.first_divergent.as_ref().map(|f| f.node.clone()),
        });
    }
    // The targeted keeps did not do it: a contiguous region in topological order, shrunk from both
    // ends, then pruned. `--max-rounds 0` asks for no search at all (an independent tester saw 22
    // region and prune rounds run under it).
    if last.1.status == Status::Diverged && !ill_conditioned && options.max_rounds > 0 {
        match region_search(&mut search, index, &keep, &mut rounds)? {
            Some((region, outcome)) => {
                stuck = None;
                patterns.push(KeptPattern { kind: "region".into(), nodes: region.clone(), because: "keeping the recognised patterns did not fix the outputs; the smallest contiguous region that does, pruned".into() });
                keep.extend(region);
                last = outcome;
            }
            None => {
                let why = "even keeping every node that computes a float, or an integer from a float, in FP32 (measured) does not bring the outputs within tolerance";
                stuck = Some(match stuck {
                    Some(s) => format!("{s}; {why}"),
                    None => why.to_string(),
                });
            }
        }
    }
    // Where the file goes, planned once the search passes (prune rounds only keep passing lists).
    let writing = if last.1.status == Status::Pass {
        let (source, source_index): (&Model, &GraphIndex) =
            if flattened { (&original, &original_index) } else { (model, index) };
        let float = if flattened {
            float_tensor_set(&original, &float32_tensors(&original, &original_index)?)
        } else {
            search.keeper.float()?.clone()
        };
        // Written beside -o and moved there only once it holds: a fix that fails leaves the
        // user's file at -o as it was.
        let staging = match &options.output {
            Some(out) => Some(layerwise_model::scratch::StagedDir::beside(out, ".layerwise-fix-")?),
            None => None,
        };
        let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-fix-")?;
        let path = match (&options.output, &staging) {
            (Some(out), Some(staging)) => {
                staging.path().join(out.file_name().unwrap_or(std::ffi::OsStr::new("fixed.onnx")))
            }
            _ => scratch.path().join("fixed.onnx"),
        };
        // What ONNX Runtime refuses in the target type was found once, on the model the search ran
        // converted with nothing kept, and does not depend on the keep list: the file is converted
        // with it, and the child's session is its own type check (no second one here). A model
        // whose control flow was inlined is written from the original, whose nodes the search's
        // model names otherwise: checked by `convert_checked` as before.
        let refused = if flattened { None } else { Some(search.keeper.refused()?.clone()) };
        Some(Writing { source, source_index, float, refused, target, path, _staging: staging, _scratch: scratch })
    } else {
        None
    };
    // The file for the keep list as it stands before the prune rounds is written and loaded in a
    // child process beside them: where no round drops a pattern (independent overflows, each
    // needed), it is the file written, and the child's wait is hidden; otherwise it is written
    // again for the pruned list.
    let mut written_beside: Option<(Vec<String>, Result<(layerwise_model::convert::Conversion, LoadCheck)>, f64)> =
        None;
    // Drop patterns that turn out unnecessary once the others are kept (earliest first).
    if last.1.status == Status::Pass && patterns.len() > 1 {
        let early_keep = keep.clone();
        let feeds = search.samples[0].feeds.clone();
        written_beside = std::thread::scope(|scope| -> Result<_> {
            let beside = writing.as_ref().map(|w| {
                let (early_keep, feeds) = (&early_keep, &feeds);
                scope.spawn(move || {
                    let started = std::time::Instant::now();
                    (w.convert_and_check(early_keep, feeds), started.elapsed().as_secs_f64())
                })
            });
            let mut i = 0;
            while i < patterns.len() && patterns.len() > 1 {
                // What the emulation cannot see inside is not its to drop.
                if patterns[i].kind == OPAQUE_CONTROL_FLOW {
                    i += 1;
                    continue;
                }
                let without: Vec<String> = keep.iter().filter(|n| !patterns[i].nodes.contains(n)).cloned().collect();
                let trial = search.run(&without)?;
                rounds.push(Round {
                    stage: FixStage::Prune,
                    keep_fp32: without.len(),
                    status: trial.1.status,
                    worst_output: trial.1.worst_output.clone(),
                    first_divergent: trial.1.first_divergent.as_ref().map(|f| f.node.clone()),
                });
                if trial.1.status == Status::Pass {
                    keep = without;
                    patterns.remove(i);
                    last = trial;
                } else {
                    // The next trial differs least from the keep list that stands, not from this one.
                    search.forget_last_run();
                    i += 1;
                }
            }
            Ok(beside.map(|handle| {
                let (result, seconds) = handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (early_keep.clone(), result, seconds)
            }))
        })?;
    }
    let fixed = last.1.status == Status::Pass;
    let outputs = output_changes(index, &first, &last.0);
    let converter_fp32: Vec<(String, String)> = search.keeper.converter_fp32().to_vec();

    let mut fixed_model = None;
    let mut fixed_model_fp32_nodes = Vec::new();
    let mut fixed_model_check = None;
    let mut load_check: Option<LoadCheck> = None;
    let mut fixed = fixed;
    let mut check_failure = None;
    // FP16 that needs a large keep list, or none found: would BF16 need any? The model run whole
    // in BF16 (`sim:bf16`, nothing kept) on every sample, judged by BF16's own tolerances, measured
    // (a diffusion UNet kept 280 of 2,103 nodes for FP16 where BF16 passed at 2.46e-2).
    let bf16_wanted = |fixed: bool, keep: &[String]| {
        low == Precision::Fp16 && !tensor_cores && (!fixed || keep.len() >= LARGE_KEEP_LIST)
    };
    // Where it is wanted whatever the written file's checks find, it runs beside them (on its own
    // copies: they read nothing it computes). Started beside the prune rounds too, it made no
    // measurable difference (decoder-overflows:100, 3.01-3.31 s against 3.10-3.36 s).
    let bf16_beside = (fixed && bf16_wanted(fixed, &keep)).then(|| {
        let (model, index, options) = (model.clone(), index.clone(), b.clone());
        let samples = bf16_samples(&search.samples, &index);
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            (bf16_whole(&samples, &model, &index, &options), started.elapsed().as_secs_f64())
        })
    });
    if fixed {
        // The file `fix` writes (or would write, without -o: a scratch copy), checked in its own
        // types by the typed evaluation, which shares no code with the emulation that chose the
        // keep list. FIXED stands only on that check.
        // The file written: the original with the keep list resolved into its control-flow bodies;
        // otherwise the model the search ran (its own functions inlined, the IR version ONNX
        // Runtime reads), whose node names the keep list uses.
        let writing = writing.as_ref().expect("planned where the search passed, as fixed says");
        let (float, path) = (&writing.float, writing.path.clone());
        let backend = format!(
            "typed evaluation of {}",
            if let Some(out) = &options.output {
                out.display().to_string()
            } else {
                "the fixed model (not written: no -o)".into()
            }
        );
        // The file is written once, where it is moved to, and checked in a child process with
        // ONNX Runtime's defaults first (an FP16 model can crash ONNX Runtime, and so this process
        // in the typed evaluation); op types that crash it are kept in FP32.
        let label = "writing the fixed model and loading it in a child process";
        let (conversion, load) = match written_beside.take() {
            Some((early_keep, result, seconds)) if early_keep == keep => {
                search.steps.record(&format!("{label} (beside the prune rounds)"), seconds);
                result?
            }
            _ => {
                let started = std::time::Instant::now();
                let written = writing.convert_and_check(&keep, &search.samples[0].feeds)?;
                search.steps.record(label, started.elapsed().as_secs_f64());
                written
            }
        };
        let started = std::time::Instant::now();
        let checked = typed_check(&search, &path)?;
        search.steps.record("evaluating the fixed model in its own types", started.elapsed().as_secs_f64());
        let problems = check_float_types(&conversion.proto, float);
        load_check = Some(load);
        fixed_model_fp32_nodes = conversion.fp32_nodes.clone();
        let check = match checked {
            Ok(Some((pass, _, comparison))) => ModelCheck {
                backend,
                structural_problems: problems,
                outputs: output_changes(index, &first, &comparison),
                pass,
                not_run: None,
            },
            Ok(None) => ModelCheck {
                backend,
                structural_problems: problems,
                outputs: Vec::new(),
                pass: false,
                not_run: Some("no sample to run".into()),
            },
            Err(e) => ModelCheck {
                backend,
                structural_problems: problems,
                outputs: Vec::new(),
                pass: false,
                not_run: Some(e),
            },
        };
        // A model that ONNX Runtime refuses (but for a CPU kernel it lacks) or crashes on is no
        // fix, whatever the typed evaluation says.
        let crashed = load_check
            .as_ref()
            .filter(|l| crate::load_check::unusable(l))
            .map(|l| format!("{}: {}", l.status, l.detail.clone().unwrap_or_default()));
        if let Some(how) = crashed {
            fixed = false;
            check_failure = Some(format!("the fixed model does not load: {how}"));
        } else if !check.pass {
            fixed = false;
            let worst = check
                .outputs
                .iter()
                .filter(|o| !o.after_pass)
                .map(|o| format!("'{}' rel L2 {}", o.name, num(o.after_rel_l2)))
                .collect::<Vec<_>>();
            check_failure = Some(match &check.not_run {
                Some(why) => format!("the emulation passes with this keep list, but the written model could not be checked in its own types: {why}"),
                None => format!(
                    "the emulation passes with this keep list, but the written model, evaluated in its own types, fails: {}",
                    if worst.is_empty() { "its outputs are out of tolerance".to_string() } else { worst.join(", ") }
                ),
            });
            // A model that does not hold is not written (its staging folder goes with it).
        } else if let Some(out) = &options.output {
            for (staged, destination) in
                [(path.clone(), out.clone()), (Model::oversized_data_path(&path), Model::oversized_data_path(out))]
            {
                if staged.exists() {
                    std::fs::rename(&staged, &destination).with_context(|| {
                        format!("-o: moving the fixed model into place at {}", destination.display())
                    })?;
                    layerwise_model::scratch::note_written(&destination);
                }
            }
            let path = out;
            let keep_json = serde_json::json!({ "keep_fp32": keep, "patterns": patterns, "trtexec_flags": trtexec_flags(&keep, &inlined, low_flag) });
            write_atomic(&keep_list_path(path), &serde_json::to_vec_pretty(&keep_json)?)?;
            fixed_model = Some(path.display().to_string());
        }
        fixed_model_check = Some(check);
    }
    if let Some(why) = check_failure {
        stuck = Some(why);
    }

    let bf16_label = "running the model whole in BF16 (sim:bf16, nothing kept)";
    let other_precision = match bf16_beside {
        Some(beside) => {
            let (result, seconds) = beside.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            search.steps.ran_beside(bf16_label, seconds);
            Some(result?)
        }
        None if bf16_wanted(fixed, &keep) => {
            let samples = bf16_samples(&search.samples, index);
            Some(search.steps.run(bf16_label, || bf16_whole(&samples, model, index, b))?)
        }
        None => None,
    };
    let bf16_note = match &other_precision {
        Some(o) if o.pass => format!(
            "; BF16 needs no keep list: {} with nothing kept has every output within BF16's tolerance, each element judged by its absolute, relative (rtol {2}) and range terms (worst output relative L2 {1}, which the tolerance does not bound)",
            o.candidate,
            num(o.worst_output_rel_l2),
            num(o.rtol)
        ),
        _ => String::new(),
    };
    let by_converter = if converter_fp32.is_empty() {
        String::new()
    } else {
        let shown: Vec<String> = converter_fp32.iter().take(3).map(|(n, why)| format!("{n}: {why}")).collect();
        let more = if converter_fp32.len() > 3 {
            format!("; and {} more, listed in the fix report (fixed_model_fp32_nodes)", converter_fp32.len() - 3)
        } else {
            String::new()
        };
        format!(
            " ({} more FP32 in the written model by the converter's own rules: {}{more})",
            converter_fp32.len(),
            shown.join("; ")
        )
    };
    // The outputs no run is compared on (weights passed straight to an output) are named, and
    // no summary claims them.
    let mut weight_outputs: Vec<&String> = Vec::new();
    for o in index.outputs.iter().filter(|o| is_weight_output(index, o)) {
        if !weight_outputs.contains(&o) {
            weight_outputs.push(o);
        }
    }
    let compared = if weight_outputs.is_empty() { "" } else { " compared" };
    let summary = if fixed && keep.is_empty() {
        format!(
            "all{compared} outputs are within tolerance in {}; nothing to keep in FP32{by_converter}",
            low_flag.to_uppercase()
        )
    } else if fixed {
        format!(
            "keeping {} of {} nodes in FP32 ({}{}) brings every{compared} output within tolerance{}, in the emulation and in the written model's own types; found in {} candidate runs{by_converter}{bf16_note}",
            keep.len(),
            index.nodes.len(),
            keep_list_summary(&patterns),
            if inside_kept_whole > 0 { format!("; the control flow kept whole holds {inside_kept_whole} more nodes in its bodies, all FP32 too") } else { String::new() },
            if search.samples.len() > 1 { format!(" on every one of the {} samples", search.samples.len()) } else { String::new() },
            search.runs
        )
    } else {
        format!(
            "no fix found after {} candidate runs: {}{bf16_note}",
            search.runs,
            stuck.unwrap_or_else(|| "the round limit was reached".into())
        )
    };
    let mut summary = summary;
    let hand_overs = keep.iter().filter(|n| made_by_inlining(n, &inlined)).count();
    if fixed && hand_overs > 0 {
        summary.push_str(&format!(
            "; {hand_overs} of the kept names hand a body's value to its If's or Loop's output, which the written file holds as that node's float32 output, not as a node of its own (so its FP32 node list is shorter)"
        ));
    }
    if !branches_taken.is_empty() {
        let shown: Vec<String> =
            branches_taken.iter().take(3).map(|(n, taken)| format!("'{n}' took its {taken}")).collect();
        let more =
            if branches_taken.len() > 3 { format!(" and {} more", branches_taken.len() - 3) } else { String::new() };
        summary.push_str(&format!(
            "; searched and checked on the If branches these inputs took ({}{more}): the branches not taken are written converted with nothing kept in FP32, and no run here computed them",
            shown.join(", ")
        ));
    }
    for o in weight_outputs {
        let said = format!("; output '{o}' was not compared: {WEIGHT_OUTPUT}");
        if !summary.contains(&said) {
            summary.push_str(&said);
        }
    }
    let report = FixReport {
        schema: FIX_SCHEMA.to_string(),
        model: b.model.display().to_string(),
        reference: b.reference.to_string(),
        candidate: b.candidate.to_string(),
        status: if fixed { FixStatus::Fixed } else { FixStatus::NotFixed },
        summary,
        node_count: index.nodes.len(),
        trtexec_flags: trtexec_flags(&keep, &inlined, low_flag),
        keep_fp32: keep,
        patterns,
        rounds,
        candidate_runs: search.runs,
        samples: if search.samples.len() > 1 {
            search.samples.iter().map(|s| s.name.clone()).collect()
        } else {
            Vec::new()
        },
        noise_floor,
        outputs,
        fixed_model,
        fixed_model_fp32_nodes,
        fixed_model_check,
        fixed_model_load: load_check,
        other_precision,
        run_info: layerwise_report::RunInfo::now(search.steps.finish()),
    };
    if let Some(json) = &b.outputs.json {
        let mut bytes = serde_json::to_vec_pretty(&report)?;
        bytes.push(b'\n');
        write_atomic(json, &bytes)?;
    }
    let text = render_fix_terminal(&report, if low == Precision::Bf16 { "BF16" } else { "FP16" });
    Ok(FixOutcome { report, text })
}

/// A keep list this long is large: `fix` then measures the model whole in BF16 as well.
const LARGE_KEEP_LIST: usize = 16;

/// Where and how `fix` writes its file: the model written (the original where control flow was
/// inlined), its float tensors, what ONNX Runtime refuses in the target type, and the path (in a
/// staging folder beside -o, or a scratch folder without it).
struct Writing<'a> {
    source: &'a Model,
    source_index: &'a GraphIndex,
    float: std::collections::HashSet<String>,
    refused: Option<std::collections::BTreeMap<String, String>>,
    target: layerwise_model::convert::Target,
    path: PathBuf,
    _staging: Option<layerwise_model::scratch::StagedDir>,
    _scratch: layerwise_model::scratch::ScratchDir,
}

impl Writing<'_> {
    /// The model converted with `keep` in FP32, written to the path, and loaded and run on `feeds`
    /// by ONNX Runtime in a child process (op types that crash it kept in FP32).
    fn convert_and_check(
        &self,
        keep: &[String],
        feeds: &[(String, Tensor)],
    ) -> Result<(layerwise_model::convert::Conversion, LoadCheck)> {
        let options =
            ConvertOptions { keep_nodes: keep.iter().cloned().collect(), target: self.target, ..Default::default() };
        let mut convert = |o: &ConvertOptions| match &self.refused {
            Some(refused) => Ok(layerwise_model::convert::convert_fp16(
                self.source,
                self.source_index,
                &self.float,
                &ConvertOptions { refused: refused.clone(), ..o.clone() },
            )?),
            None => Ok(crate::keep::convert_checked(self.source, self.source_index, &self.float, o)?.0),
        };
        crate::load_check::convert_that_loads(self.source, &options, &self.path, Some(feeds), &mut convert)
    }
}

/// Nodes in `node`'s bodies (If branches, Loop and Scan bodies), nested bodies included.
fn nodes_in_bodies(node: &layerwise_model::onnx::NodeProto) -> usize {
    node.attribute
        .iter()
        .flat_map(|a| a.g.iter().chain(&a.graphs))
        .map(|g| g.node.len() + g.node.iter().map(nodes_in_bodies).sum::<usize>())
        .sum()
}

/// The keep list in the one-line summary: each group with its nodes where there are few; else a
/// count of groups by kind (the full list is in the JSON and the keep-list file).
fn keep_list_summary(patterns: &[KeptPattern]) -> String {
    if patterns.len() <= 3 {
        return patterns
            .iter()
            .map(|p| format!("{} [{}]", p.kind, layerwise_report::kept_nodes(&p.nodes)))
            .collect::<Vec<_>>()
            .join("; ");
    }
    // Groups can share nodes: each kind counts its distinct nodes (the keep list is their union).
    let mut kinds: Vec<(&str, usize, std::collections::BTreeSet<&str>)> = Vec::new();
    for p in patterns {
        let i = match kinds.iter().position(|(k, _, _)| *k == p.kind) {
            Some(i) => i,
            None => {
                kinds.push((p.kind.as_str(), 0, Default::default()));
                kinds.len() - 1
            }
        };
        kinds[i].1 += 1;
        kinds[i].2.extend(p.nodes.iter().map(String::as_str));
    }
    let kinds: Vec<String> = kinds
        .iter()
        .map(|(k, groups, nodes)| {
            format!("{groups} {k} group{} ({} distinct nodes)", if *groups == 1 { "" } else { "s" }, nodes.len())
        })
        .collect();
    format!("{} groups: {}; every node in the fix report and the keep list", patterns.len(), kinds.join(", "))
}

/// Each sample's inputs and the reference's values of the model outputs: what [`bf16_whole`] reads.
type OutputSamples = Vec<(Vec<(String, Tensor)>, std::collections::HashMap<String, Tensor>)>;

fn bf16_samples(samples: &[Sample], index: &GraphIndex) -> OutputSamples {
    samples
        .iter()
        .map(|s| {
            (
                s.feeds.clone(),
                index.outputs.iter().filter_map(|o| s.reference.get(o).map(|t| (o.clone(), t.clone()))).collect(),
            )
        })
        .collect()
}

/// The model run whole in BF16 emulation with nothing kept, on every sample, judged by BF16's
/// tolerances (the user's, where given).
fn bf16_whole(
    samples: &OutputSamples,
    model: &Model,
    index: &GraphIndex,
    options: &BisectOptions,
) -> Result<layerwise_report::OtherPrecision> {
    let spec = layerwise_runtime::BackendSpec::sim(layerwise_model::Rounding::Bf16);
    let mut bf16 = layerwise_runtime::create_backend(&spec)?;
    let judging = Judging::new(Precision::Bf16, false, options)?;
    let (mut pass, mut worst) = (true, 0f64);
    for (feeds, reference) in samples {
        let mut out =
            bf16.run(&RunRequest { model, index, inputs: feeds, selection: &Selection::Names(index.outputs.clone()) })?;
        add_passed_through(model.graph(), index, feeds, &mut out.tensors);
        let comparison = compare_all(index, &index.outputs, reference, &out.tensors, &judging.tolerances);
        pass &= comparison.outputs_pass(index);
        worst = worst.max(comparison.largest_error(&index.outputs));
    }
    Ok(layerwise_report::OtherPrecision {
        candidate: spec.to_string(),
        pass,
        worst_output_rel_l2: worst,
        rtol: judging.tolerances.all.rtol,
    })
}

fn num(v: f64) -> String {
    layerwise_report::format_number(v)
}

/// The most kept patterns of a quantized candidate's set that `fix` tries dropping one at a time.
const MOST_PRUNED: usize = 24;

/// `fix --cand-model QDQ.onnx`: the smallest set of nodes to leave unquantized in the Q/DQ
/// candidate (docs/fix.md, "Quantized candidates"). Each round keeps the first divergent layer's
/// pattern unquantized ([`crate::keep::UnquantizedRunner`]) until every output is within
/// tolerance on every sample; then each kept pattern that is not needed is dropped again. The
/// model with those nodes unquantized is written (with -o, else to a scratch copy), read back and
/// run on the candidate backend: FIXED needs that run to pass. Beside it goes the exclusion list
/// the quantizers take (`nodes_to_exclude`, the float model's node names).
fn fix_quantized(
    options: &FixOptions,
    setup: Setup,
    sets: Vec<(String, Vec<(String, Tensor)>)>,
    mut steps: Steps,
) -> Result<FixOutcome> {
    use std::collections::HashMap;
    let b = &options.bisect;
    let Setup { model, index, cand_model, cand_names, mut reference, mut candidate, judging, order, sim_quant, .. } =
        setup;
    let (model, index): (&Model, &GraphIndex) = (&model, &index);
    let (cm, ci) = cand_model.as_ref().expect("checked by the caller");
    let runner = crate::keep::UnquantizedRunner::new(model, index, cm, ci, &cand_names);
    let mut references = Vec::new();
    for (name, feeds) in &sets {
        let mut out = steps.run(&format!("running the reference ({name})"), || {
            Ok(reference.run(&RunRequest { model, index, inputs: feeds, selection: &Selection::All })?)
        })?;
        add_passed_through(model.graph(), index, feeds, &mut out.tensors);
        references.push(out.tensors);
    }
    let tolerances = judging.tolerances.clone();
    let mut runs = 0;
    // Which sample the last judgement was worst on.
    let worst_sample = std::cell::Cell::new(0);
    // The worst sample's comparison and verdict with `keep` unquantized.
    let mut judge = |keep: &[String], steps: &mut Steps| -> Result<Judged> {
        runs += 1;
        let mut worst: Option<(f64, Judged)> = None;
        for (k, ((name, feeds), reference)) in sets.iter().zip(&references).enumerate() {
            let out = steps.run(
                &format!(
                    "candidate run {runs} ({} node{} unquantized, {name})",
                    keep.len(),
                    if keep.len() == 1 { "" } else { "s" }
                ),
                || runner.run(candidate.as_mut(), keep, feeds, &Selection::All),
            )?;
            let mut comparison = compare_all(index, &order, reference, &out.tensors, &tolerances);
            comparison.note_input_nonfinite(feeds);
            let verdict = walk_back(index, &comparison, &[], judging.rule, judging.candidate);
            let error = comparison.largest_error(&index.outputs);
            if worse(
                verdict.status == Status::Diverged,
                error,
                worst.as_ref().map(|(e, (_, v))| (v.status == Status::Diverged, *e)),
            ) {
                worst = Some((error, (comparison, verdict)));
                worst_sample.set(k);
            }
        }
        Ok(worst.expect("at least one sample").1)
    };
    let round = |stage: FixStage, keep: &[String], v: &Verdict| Round {
        stage,
        keep_fp32: keep.len(),
        status: v.status,
        worst_output: v.worst_output.clone(),
        first_divergent: v.first_divergent.as_ref().map(|f| f.node.clone()),
    };
    let first = judge(&[], &mut steps)?;
    let mut rounds = vec![round(FixStage::Diagnose, &[], &first.1)];
    let mut patterns: Vec<KeptPattern> = Vec::new();
    let mut last = first.clone();
    let mut stuck = None;
    // The quantizers measured one at a time on the worst sample: those at fault are left out
    // first, the largest error alone first, before the walk's first divergent layers.
    use layerwise_analysis::QuantizerAlone;
    let by_error: Vec<(QuantizerAlone, bool)> = match (&first.1.worst_output, first.1.status) {
        (Some(output), Status::Diverged) => {
            let names = crate::pipeline::reference_names(&cand_names);
            let of = crate::pipeline::reference_of(index, &names);
            let pair = crate::pipeline::quantizers::QuantizedPair {
                model,
                index,
                candidate: cand_model.as_ref().expect("checked by the caller"),
                reference_of: &of,
                tolerance: tolerances.of(output),
                fault_threshold: judging.rule.min_break,
            };
            let error = first.0.get(output).map_or(f64::INFINITY, |r| r.error_level());
            let found = steps.run("measuring each quantizer alone", || {
                crate::pipeline::quantizers::measure(&pair, &sets[worst_sample.get()].1, output, error)
            })?;
            // Those at fault first, then the others by their error alone: where leaving the faulty
            // ones out is not enough, the next largest follow.
            found
                .map(|f| {
                    let faulty: Vec<QuantizerAlone> = f.at_fault().cloned().collect();
                    let rest =
                        f.each.iter().filter(|q| q.error > 0.0 && !faulty.iter().any(|a| a.node == q.node)).cloned();
                    faulty.iter().cloned().map(|q| (q, true)).chain(rest.map(|q| (q, false))).collect()
                })
                .unwrap_or_default()
        }
        _ => Default::default(),
    };
    // Each quantizer's readers left unquantized, in that order: the smallest leading part of the
    // list that brings the outputs within tolerance, found by bisection over its length (a few
    // candidate runs, not one a quantizer), where the whole list does.
    let mut groups: Vec<KeptPattern> = Vec::new();
    // Every activation quantizer of the candidate, by its QuantizeLinear: those measured in the
    // order above, then the others (not measured alone, or nothing alone) in graph order.
    let (_, ci) = cand_model.as_ref().expect("checked by the caller");
    let measured: Vec<(String, Option<(QuantizerAlone, bool)>)> =
        by_error.into_iter().map(|(q, f)| (q.node.clone(), Some((q, f)))).collect();
    let measured_nodes: std::collections::HashSet<&str> = measured.iter().map(|(m, _)| m.as_str()).collect();
    let rest: Vec<(String, Option<(QuantizerAlone, bool)>)> = ci
        .nodes
        .iter()
        .filter(|n| {
            n.op_type == "QuantizeLinear"
                && !ci.is_constant_like(n.inputs.first().map_or("", String::as_str))
                && !measured_nodes.contains(n.name.as_str())
        })
        .map(|n| (n.name.clone(), None))
        .collect();
    drop(measured_nodes);
    // The nodes already in a group, so that each node is kept by the first quantizer that needs it.
    let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (q_node, alone) in measured.into_iter().chain(rest) {
        // In the candidate: the nodes that read its DequantizeLinear's output (which then has no
        // reader), and the node that computes what it quantizes: quantize_static quantizes a
        // node's output for its own sake unless that node is excluded too, so without it the
        // exclusion list would not give the model written (a MiniLM's attention scores stayed
        // quantized). Candidate nodes keep the float model's names.
        let Some(q) = ci.node(&q_node) else { continue };
        let dequantized: Vec<&String> = q
            .outputs
            .iter()
            .flat_map(|o| ci.consumers(o))
            .map(|&c| &ci.nodes[c])
            .filter(|c| c.op_type == "DequantizeLinear")
            .flat_map(|c| &c.outputs)
            .collect();
        let producer = q.inputs.first().and_then(|x| ci.producer(x)).map(|p| p.name.clone());
        let readers: Vec<String> = dequantized
            .iter()
            .flat_map(|d| ci.consumers(d))
            .map(|&c| ci.nodes[c].name.clone())
            .chain(producer)
            .collect();
        let new: Vec<String> =
            runner.translate(&readers).kept.into_iter().filter(|n| taken.insert(n.clone())).collect();
        if new.is_empty() {
            continue;
        }
        let because = match &alone {
            Some((a, faulty)) => format!(
                "the quantizer of '{}' (QuantizeLinear '{}') alone gives '{}' rel L2 {:.2e}{}: the nodes that read it and the one that computes what it quantizes are left unquantized",
                a.tensor,
                a.node,
                first.1.worst_output.as_deref().unwrap_or_default(),
                a.error,
                if *faulty { ", at fault" } else { ", the largest alone of those left" }
            ),
            None => format!("the quantizer QuantizeLinear '{q_node}' (not measured alone, or nothing alone): the nodes that read it and the one that computes what it quantizes are left unquantized"),
        };
        groups.push(KeptPattern { kind: "quantizer".to_string(), because, nodes: new });
    }
    // `--max-rounds 0` adds nothing: not the quantizers' search either.
    if options.max_rounds > 0 && !groups.is_empty() && last.1.status == Status::Diverged {
        let keep_of = |k: usize| -> Vec<String> { groups[..k].iter().flat_map(|p| p.nodes.clone()).collect() };
        let whole = judge(&keep_of(groups.len()), &mut steps)?;
        rounds.push(round(FixStage::Pattern, &keep_of(groups.len()), &whole.1));
        let (mut failing, mut passing) = (0, groups.len());
        if whole.1.status != Status::Diverged {
            let mut best = whole;
            while passing - failing > 1 {
                let mid = (failing + passing) / 2;
                let trial = judge(&keep_of(mid), &mut steps)?;
                rounds.push(round(FixStage::Pattern, &keep_of(mid), &trial.1));
                if trial.1.status == Status::Diverged {
                    failing = mid;
                } else {
                    passing = mid;
                    best = trial;
                }
            }
            last = best;
        } else {
            // Not enough alone: the walk goes on from there.
            last = whole;
        }
        groups.truncate(passing);
        patterns = groups;
    }
    while last.1.status == Status::Diverged && rounds.len() <= options.max_rounds {
        let Some(fd) = last.1.first_divergent.clone() else {
            stuck = Some("the outputs diverge with no first divergent layer to leave unquantized".to_string());
            break;
        };
        let pattern = pattern_of(index, &fd.node);
        let kept: Vec<String> = patterns.iter().flat_map(|p| p.nodes.clone()).collect();
        let plan = runner.translate(&pattern.nodes);
        let new: Vec<String> = plan.kept.into_iter().filter(|n| !kept.contains(n)).collect();
        if new.is_empty() {
            stuck = Some(if plan.without_counterpart.is_empty() {
                format!("'{}' is already unquantized and the outputs still diverge", fd.node)
            } else {
                format!(
                    "'{}' has no counterpart in the candidate ({} fused away or renamed) and the outputs still diverge",
                    fd.node,
                    plan.without_counterpart.join(", ")
                )
            });
            break;
        }
        patterns.push(KeptPattern {
            kind: pattern.kind.to_string(),
            because: format!("'{}' is the first divergent layer with the earlier rounds' nodes unquantized", fd.node),
            nodes: new,
        });
        let keep: Vec<String> = patterns.iter().flat_map(|p| p.nodes.clone()).collect();
        last = judge(&keep, &mut steps)?;
        rounds.push(round(FixStage::Pattern, &keep, &last.1));
    }
    // The smallest set: each pattern the others do without is dropped, latest first, one candidate
    // run a pattern; beyond MOST_PRUNED patterns that would be more runs than the search took, and
    // the set stays as the bisection left it (the summary says so).
    let unpruned = (patterns.len() > MOST_PRUNED).then_some(patterns.len());
    if last.1.status != Status::Diverged && unpruned.is_none() {
        for k in (0..patterns.len()).rev() {
            if patterns.len() == 1 {
                break;
            }
            let without: Vec<String> =
                patterns.iter().enumerate().filter(|(j, _)| *j != k).flat_map(|(_, p)| p.nodes.clone()).collect();
            let trial = judge(&without, &mut steps)?;
            if trial.1.status != Status::Diverged {
                patterns.remove(k);
                rounds.push(round(FixStage::Prune, &without, &trial.1));
                last = trial;
            }
        }
    }
    let keep: Vec<String> = patterns.iter().flat_map(|p| p.nodes.clone()).collect();
    let searched_fixed = last.1.status != Status::Diverged;
    // The model as written, read back and run: every FIXED holds in that file.
    let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-fix-quantized-")?;
    let path = options.output.clone().unwrap_or_else(|| scratch.path().join("unquantized.onnx"));
    // `sim:int8`/`sim:fp8`: the float model quantized again with the config and the set excluded
    // (what a user's quantizer given the exclusion list writes), not the search's bypassed copy.
    let (written_proto, excluded) = match &sim_quant {
        Some(sq) => {
            let mut excluded = sq.config.nodes_to_exclude.clone();
            excluded.extend(keep.iter().filter(|k| !sq.config.nodes_to_exclude.contains(k)).cloned());
            (steps.run("quantizing the model with the set excluded", || sq.requantize(model, index, &keep))?, excluded)
        }
        None => (runner.model(&keep)?.model, keep.clone()),
    };
    cm.save_standalone(&written_proto, &path).with_context(|| format!("writing {}", path.display()))?;
    let written = Model::load(&path)?;
    let written_index = GraphIndex::build(written.graph())?;
    let mut check_outputs = Vec::new();
    let mut check_pass = true;
    // ((fails, failed before), largest output error) of the sample whose numbers the check reports.
    let mut check_worst: Option<((bool, bool), f64)> = None;
    let reference_of: HashMap<&str, &str> =
        cand_names.iter().filter(|(r, _)| index.outputs.contains(r)).map(|(r, c)| (c.as_str(), r.as_str())).collect();
    // Both models as deployed: only their outputs, so that ONNX Runtime fuses the Q/DQ pairs into
    // integer kernels, as exposing the tensors between them (the search's runs) prevents. The
    // check's before and after are the given and the written model so run, on the same sample.
    let mut deployed = |m: &Model,
                        mi: &GraphIndex,
                        feeds: &[(String, Tensor)],
                        reference: &HashMap<String, Tensor>,
                        label: String,
                        steps: &mut Steps|
     -> Result<Comparison> {
        let out = steps.run(&label, || {
            Ok(candidate.run(&RunRequest {
                model: m,
                index: mi,
                inputs: feeds,
                selection: &Selection::Names(Vec::new()),
            })?)
        })?;
        let tensors: HashMap<String, Tensor> = out
            .tensors
            .into_iter()
            .filter_map(|(c, v)| reference_of.get(c.as_str()).map(|r| (r.to_string(), v)))
            .collect();
        Ok(compare_all(index, &index.outputs, reference, &tensors, &tolerances))
    };
    for ((name, feeds), reference) in sets.iter().zip(&references) {
        let given = deployed(
            cm,
            ci,
            feeds,
            reference,
            format!("running the candidate model as deployed ({name})"),
            &mut steps,
        )?;
        let comparison = deployed(
            &written,
            &written_index,
            feeds,
            reference,
            format!("running the written model ({name})"),
            &mut steps,
        )?;
        // The worst sample: a failing one before any passing one, then one the given model
        // failed (what the fix is for: a tester saw a sample that passed before shown, the one
        // that failed never), then the largest output error (found by the independent tester: the
        // first sample's numbers were shown as the worst).
        let passes = comparison.outputs_pass(index);
        let key = (!passes, !given.outputs_pass(index));
        let error = comparison.largest_error(&index.outputs);
        if check_worst.is_none_or(|(k, e)| key > k || (key == k && error > e)) {
            check_outputs = output_changes(index, &given, &comparison);
            check_worst = Some((key, error));
        }
        check_pass &= passes;
    }
    let fixed = searched_fixed && check_pass;
    let exclusion = if let Some(out) = &options.output {
        let list = exclusion_list(&excluded);
        let mut bytes = serde_json::to_vec_pretty(&list)?;
        bytes.push(b'\n');
        write_atomic(&exclusion_list_path(out), &bytes)?;
        Some(exclusion_list_path(out))
    } else {
        None
    };
    let family = judging.quantization.as_ref().and_then(|q| q.coarsest()).map_or("INT8", |f| f.family());
    let summary = match (&stuck, fixed) {
        (_, true) if keep.is_empty() => "every output is within tolerance with nothing left unquantized".to_string(),
        (_, true) => format!(
            "leaving {} node{} unquantized brings every output within tolerance, measured on the written model ({}){}{}",
            keep.len(),
            if keep.len() == 1 { "" } else { "s" },
            keep.join(", "),
            exclusion.as_ref().map(|p| format!("; nodes_to_exclude in {}", p.display())).unwrap_or_default(),
            unpruned.map(|n| format!("; not pruned: {n} patterns, more than the {MOST_PRUNED} dropped one at a time, so a smaller set may exist")).unwrap_or_default()
        ),
        // The written model is quantized again with the set excluded, which is not the search's
        // copy (a graph input's quantizer, say): its check may pass where the search's runs did
        // not, and the summary must say both rather than a bare NOT FIXED above a passing check.
        (Some(why), false) if check_pass => format!("no set of nodes left unquantized was found by the search: {why}; the model written with its {} node{} excluded passes the check below, but it was quantized again and is not the copy the search judged, so it is not called FIXED", keep.len(), if keep.len() == 1 { "" } else { "s" }),
        (Some(why), false) => format!("no set of nodes left unquantized was found: {why}"),
        (None, false) if searched_fixed => "the search's set passes, but the written model does not: it is not FIXED".to_string(),
        (None, false) => format!("no set found within {} rounds", options.max_rounds),
    };
    let report = FixReport {
        schema: FIX_SCHEMA.to_string(),
        model: b.model.display().to_string(),
        reference: b.reference.to_string(),
        candidate: match (&sim_quant, &b.quant_config) {
            (Some(_), Some(config)) => format!("{} --quant-config {}", b.candidate, config.display()),
            (Some(_), None) => b.candidate.to_string(),
            (None, _) => format!("{} --cand-model {}", b.candidate, cm.path.display()),
        },
        status: if fixed { FixStatus::Fixed } else { FixStatus::NotFixed },
        summary,
        node_count: index.nodes.len(),
        trtexec_flags: String::new(),
        keep_fp32: keep,
        patterns,
        rounds,
        candidate_runs: runs,
        samples: if sets.len() > 1 { sets.iter().map(|(n, _)| n.clone()).collect() } else { Vec::new() },
        noise_floor: None,
        // As deployed (integer kernels), as the check runs them: the search's runs expose every
        // tensor, which keeps ONNX Runtime from fusing, and their numbers are another model's
        // (an independent tester saw "5.50 -> 5.50" beside a check saying 2.63).
        outputs: if check_outputs.is_empty() {
            output_changes(index, &first.0, &last.0)
        } else {
            check_outputs.clone()
        },
        fixed_model: options.output.as_ref().map(|p| p.display().to_string()),
        fixed_model_fp32_nodes: Vec::new(),
        fixed_model_check: Some(ModelCheck {
            backend: b.candidate.to_string(),
            structural_problems: Vec::new(),
            outputs: check_outputs,
            pass: check_pass,
            not_run: None,
        }),
        fixed_model_load: None,
        other_precision: None,
        run_info: layerwise_report::RunInfo::now(steps.finish()),
    };
    if let Some(json) = &b.outputs.json {
        let mut bytes = serde_json::to_vec_pretty(&report)?;
        bytes.push(b'\n');
        write_atomic(json, &bytes)?;
    }
    // The FP16 report's line about the written files names a keep list this fix does not write.
    let mut text = render_fix_terminal(&report, family);
    if let Some(path) = &report.fixed_model {
        let fp16_line = format!("  fixed model: {path} (0 FP32 nodes), keep list: {path}.keep-fp32.json");
        text = text.replace(
            &fp16_line,
            &format!(
                "  fixed model: {path} (the Q/DQ model with the set unquantized), exclusion list: {}",
                exclusion_list_path(Path::new(path)).display()
            ),
        );
    }
    Ok(FixOutcome { report, text })
}

/// The nodes to leave unquantized as the quantizers take them: ONNX Runtime's `quantize_static`
/// (`nodes_to_exclude`, node names of the float model) and ModelOpt's
/// `modelopt.onnx.quantization.quantize` (`nodes_to_exclude`, read as regular expressions: each
/// name escaped and anchored).
fn exclusion_list(keep: &[String]) -> serde_json::Value {
    serde_json::json!({
        "nodes_to_exclude": keep,
        "onnxruntime.quantization.quantize_static": { "nodes_to_exclude": keep },
        "modelopt.onnx.quantization.quantize": { "nodes_to_exclude": keep.iter().map(|n| python_regex_exact(n)).collect::<Vec<_>>() },
    })
}

/// A Python regular expression matching exactly `name`: every ASCII character other than a letter,
/// digit or '_' escaped (Python's `re` takes an escaped punctuation character as itself).
fn python_regex_exact(name: &str) -> String {
    let mut out = String::from("^");
    for c in name.chars() {
        if c.is_ascii() && !c.is_ascii_alphanumeric() && c != '_' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('$');
    out
}
