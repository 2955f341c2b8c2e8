//! The command line: argument parsing and the commands, for the `layerwise` binary and for the
//! Python package's `layerwise` command (which runs the same code).

/// Writes a line of the terminal summary to stdout. A reader that went away (`layerwise ... | head`)
/// is no failure of layerwise's: the work and its files are still done, the rest of the summary is
/// not printed, and the exit status is the run's (`println!` would panic there).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// [`say!`] without the line end.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

use std::path::PathBuf;

use crate::demo::{demo_model, PLANTED_NODE};
use crate::fix::{fix, FixOptions};
use crate::pipeline::ToleranceField;
use crate::pipeline::{bisect, bisect_model, BisectOptions, Marking};
use crate::write_rule::Reads;
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use layerwise_analysis::Status;
use layerwise_model::convert::{check_float_types, float_tensor_set, ConvertOptions};
use layerwise_model::GraphIndex;
use layerwise_model::{Model, Selection};
use layerwise_report::{escape, Outputs};
use layerwise_runtime::float32_tensors;
use layerwise_runtime::inputs::InputOptions;
use layerwise_runtime::BackendSpec;

/// Find the layer where a model's accuracy breaks between a float32 reference (ONNX Runtime) and a
/// candidate backend or precision.
///
/// Exit codes: 0 all outputs within tolerance, 1 diverged, 2 usage, input or run error.
#[derive(Parser)]
#[command(name = "layerwise", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Show what ONNX Runtime and TensorRT log as it happens. Without it their lines stay off the
    /// terminal; ONNX Runtime's are kept in the report's backend notes.
    #[arg(short, long, global = true)]
    verbose: bool,
    /// Show no progress on stderr (errors and the results still show). Progress is a spinner on
    /// a terminal and one line per step elsewhere (a file, a pipe, a notebook).
    #[arg(short, long, global = true)]
    quiet: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Compare every tensor of the reference and candidate runs and walk back from the worst output
    /// to the first divergent layer.
    Bisect(Box<BisectArgs>),
    /// Convert a float32 model to FP16, keeping chosen nodes and unsafe ops in FP32.
    Convert(ConvertArgs),
    /// Find a small set of nodes to keep in FP32 so every output is within tolerance, verify it,
    /// and write the fixed FP16 model.
    Fix(Box<FixArgs>),
    /// Render a saved JSON report as HTML, Markdown, CSV or Model Explorer node data.
    Report(ReportCmdArgs),
    /// Build a TensorRT engine (no GPU needed) with every tensor marked as an output and show
    /// which ONNX nodes each engine layer computes (cargo feature `tensorrt`; without it, says so).
    TrtLayers(TrtLayersArgs),
    /// Run the whole pipeline on a built-in model with a planted FP16 overflow.
    Demo(DemoArgs),
    /// Combine the partial reports of `bisect --inputs DIR --shard I/N` (every shard) into the
    /// report one run over all samples writes.
    Merge(MergeArgs),
    /// (internal) Load a model with ONNX Runtime's default options and run it once, in this
    /// process: `convert` and `fix` run it as a child process to survive a crash.
    #[command(hide = true)]
    CheckLoad(CheckLoadArgs),
}

#[derive(Args)]
struct CheckLoadArgs {
    model: PathBuf,
    /// Input values (npz); without them the session is only created.
    #[arg(long)]
    inputs: Option<PathBuf>,
}

#[derive(Args)]
struct ConvertArgs {
    /// The float32 ONNX model (never modified).
    model: PathBuf,
    /// Target: `fp16` or `bf16` (a strongly typed FP16 or BF16 model), or `fp16-emulated`,
    /// `bf16-emulated`, `tf32-emulated`: the float32 model that `--cand sim:fp16|bf16|tf32` runs,
    /// for other tools such as Polygraphy.
    #[arg(long, default_value = "fp16", value_parser = ["fp16", "bf16", "fp16-emulated", "bf16-emulated", "tf32-emulated"])]
    to: String,
    /// Nodes to keep in FP32 (names as layerwise reports them), comma-separated.
    #[arg(long = "keep-fp32", value_delimiter = ',', value_name = "NODES")]
    keep_fp32: Vec<String>,
    /// Op types to keep in FP32, comma-separated (e.g. LayerNormalization,Softmax).
    #[arg(long = "keep-fp32-op", value_delimiter = ',', value_name = "OPS")]
    keep_fp32_op: Vec<String>,
    /// Keep float graph inputs and outputs FP32, with Casts inside the model (the default).
    #[arg(long, conflicts_with = "fp16_io")]
    keep_io_types: bool,
    /// Make float graph inputs and outputs FP16 too.
    #[arg(long)]
    fp16_io: bool,
    /// Also convert nodes that read weights beyond the FP16 range (they become inf).
    #[arg(long)]
    allow_weight_overflow: bool,
    /// The converted model.
    #[arg(short, long)]
    output: PathBuf,
}

#[derive(Args)]
struct FixArgs {
    /// The float32 ONNX model (never modified).
    model: PathBuf,
    #[arg(long = "ref", default_value = "ort:cpu")]
    reference: BackendSpec,
    /// Candidate: sim:fp16 or sim:bf16 (keeps nodes in the emulation; the fixed model is FP16 or
    /// BF16), or a backend that runs the model converted with the keep list each round (e.g.
    /// ort:cpu, evaluated in the converted model's own types); sim:int8 or sim:fp8: the model
    /// quantized by layerwise (see --quant-config), the fix the nodes to leave unquantized.
    /// Default: sim:fp16, or ort:cpu where --cand-model is quantized (run as deployed).
    #[arg(long = "cand")]
    candidate: Option<BackendSpec>,
    /// A Q/DQ version of the model (QuantizeLinear/DequantizeLinear nodes): the fix is the
    /// smallest set of nodes to leave unquantized in it, run on --cand (ort:cpu: its integer
    /// kernels); -o writes it with those nodes unquantized and OUT.nodes-to-exclude.json beside it.
    #[arg(long, value_name = "QDQ_MODEL")]
    cand_model: Option<PathBuf>,
    /// With --cand sim:int8 or sim:fp8: the quantization config (JSON: format, op_types,
    /// per_channel, nodes_to_exclude, calibration; docs/quantization.md); the fixed model is the
    /// Q/DQ model re-quantized with the set excluded.
    #[arg(long, value_name = "FILE")]
    quant_config: Option<PathBuf>,
    #[command(flatten)]
    inputs: InputArgs,
    #[command(flatten)]
    tolerances: ToleranceArgs,
    /// The fixed FP16 model; the keep list goes beside it as OUT.keep-fp32.json.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// The fix report (schema layerwise.fix/1).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Most rounds (candidate runs that add to the keep set) before giving up; a quantized
    /// candidate's search over its quantizers (a bisection of a few runs) counts its runs, and
    /// stops there with the passing set it has. The prune runs that drop from a passing set are
    /// not counted. 0: no search.
    #[arg(long, default_value_t = 12)]
    max_rounds: usize,
    /// Most memory a run may add, e.g. 512M or 4G: refused before anything runs where the
    /// reference's tensors (every tensor of every sample, held for the trials) cannot fit, and
    /// any run that grows past it (plus 128 MiB of ONNX Runtime's own) is stopped with exit 2.
    /// Default: 90% of the memory available when each run starts.
    #[arg(long, value_name = "SIZE", value_parser = crate::pipeline::parse_size)]
    max_memory: Option<u64>,
    /// What the keep list must bring about: `elementwise` (every output within tolerance), or
    /// `answer` (the answers of the outputs judged by --task, or a classifier recognised by its
    /// Softmax, unchanged on every case; every other output within tolerance), `answer:SHARE` (on
    /// at least that share of each judged output's cases, e.g. answer:0.99). Verified on the file
    /// written either way.
    #[arg(long, default_value = "elementwise", value_name = "TARGET", value_parser = crate::fix::FixTarget::parse)]
    target: crate::fix::FixTarget,
    /// Judge an output in the model's own terms (repeatable), as bisect --task does:
    /// OUTPUT:classify[,topk=5], OUTPUT:ctc[,blank=0], OUTPUT:mask[,min_iou=0.9],
    /// OUTPUT:embedding[,min_cosine=0.99], OUTPUT:detect[,...]; the answers of the written model
    /// are reported, and with --target answer they are what the keep list must hold.
    #[arg(long = "task", value_name = "OUTPUT:TASK", value_parser = crate::pipeline::parse_task)]
    tasks: Vec<(String, layerwise_analysis::answers::Task)>,
}

#[derive(Args)]
struct BisectArgs {
    /// The ONNX model (never modified).
    model: PathBuf,
    /// Reference backend spec.
    #[arg(long = "ref", default_value = "ort:cpu")]
    reference: BackendSpec,
    /// Candidate backend spec: sim:fp16|bf16|tf32[,engine=trt] (emulated on the CPU),
    /// sim:int8|fp8 (the model quantized to Q/DQ by layerwise, calibrated on the inputs, run on
    /// ONNX Runtime's CPU provider; see --quant-config),
    /// ort:cpu[,opt=LEVEL][,threads=N][,typed=on|off], ort:cuda[,tf32=on|off][,device=N],
    /// ort:trt[,fp16], ort:nvrtx, trt[,opt=N] (feature tensorrt), npz:PATH (saved tensors).
    /// Default: sim:fp16, or ort:cpu where --cand-model is quantized (run as deployed).
    #[arg(long = "cand")]
    candidate: Option<BackendSpec>,
    /// Run the candidate on this model instead (e.g. one made by `layerwise convert`); tensors are
    /// paired by name, then by structure where names differ (see --match), and FP16/BF16 tensors
    /// are compared as float32. Each model gets the inputs it declares.
    #[arg(long, value_name = "MODEL")]
    cand_model: Option<PathBuf>,
    /// With --cand sim:int8 or sim:fp8: the quantization config (JSON: format int8|uint8|fp8,
    /// op_types, per_channel, nodes_to_exclude, calibration "minmax"); defaults where absent.
    #[arg(long, value_name = "FILE")]
    quant_config: Option<PathBuf>,
    #[command(flatten)]
    inputs: InputArgs,
    #[command(flatten)]
    tolerances: ToleranceArgs,
    #[command(flatten)]
    reports: ReportArgs,
    /// Save every tensor of both runs as .npy files under DIR/ref and DIR/cand (and the inputs as
    /// DIR/inputs.npz), for later comparison with --cand npz:DIR/cand.
    #[arg(long, value_name = "DIR")]
    save_tensors: Option<PathBuf>,
    /// Compare only these tensors (comma-separated), besides the model outputs. Default: all.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    tensors: Option<Vec<String>>,
    /// How many of the worst tensors to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// How the candidate marks tensors as outputs: `all` in one run, or `search`: the model's
    /// outputs plus a few tensors per run, bisecting the blame path (about log2(N) runs; for
    /// compilers whose fusions marking would change, e.g. --cand trt).
    #[arg(long, default_value = "all", value_parser = ["all", "search"])]
    mark: String,
    /// Most memory for exposed tensors of both runs at once, e.g. 512M or 4G; beyond it the
    /// tensors are compared in groups over several runs. Default: half the available memory.
    /// (A paired comparison, the default where both sides run on ONNX Runtime, holds no tensors.)
    #[arg(long, value_name = "SIZE", value_parser = crate::pipeline::parse_size)]
    max_memory: Option<u64>,
    /// Run the reference and the candidate as separate sessions and compare the tensors they
    /// return. By default, where both run on ONNX Runtime with the same provider (ort:cpu and
    /// sim:*), they run paired as one session that reduces each pair of tensors to its metrics
    /// as it is computed, so memory does not grow with the number of tensors.
    #[arg(long)]
    separate_runs: bool,
    /// Run N samples of --inputs DIR at once (each tensor's samples found along the dimension its
    /// shape gives), where both sides run on ONNX Runtime's CUDA provider of one GPU
    /// (`--ref ort:cuda,tf32=off --cand ort:cuda`); refused elsewhere. Each side's run then costs
    /// about what one sample's does. The first batch is checked against its first sample run
    /// alone; a batched run may choose other GPU kernels than a run of one sample, and the report
    /// says it ran batched.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch: u32,
    /// Judge an output in the model's own terms beside its element-wise error (repeatable):
    /// OUTPUT:classify[,topk=5], OUTPUT:ctc[,blank=0], OUTPUT:mask[,min_iou=0.9],
    /// OUTPUT:embedding[,min_cosine=0.99],
    /// OUTPUT:detect[,boxes=0:4,scores=4:,class=K,format=xywh|xyxy,conf=0.25,iou=0.5]. An output
    /// computed by a Softmax over the last axis of [N, C] is judged as a classifier unasked.
    #[arg(long = "task", value_name = "OUTPUT:TASK", value_parser = crate::pipeline::parse_task)]
    tasks: Vec<(String, layerwise_analysis::answers::Task)>,
    /// Do not run blame-chain nodes alone to tell introduced from propagated error.
    #[arg(long)]
    no_isolate: bool,
    /// Do not re-run the candidate with each break kept at reference precision.
    #[arg(long)]
    no_counterfactual: bool,
    /// Do not measure the noise floor (the reference re-run with its weights perturbed
    /// by one rounding of the candidate's arithmetic).
    #[arg(long)]
    no_noise_floor: bool,
    /// Leave If/Loop nodes as they are. By default each is replaced by what the reference ran (the
    /// branch taken, the iterations made), so the tensors inside are compared as
    /// `Node/then/tensor`, `Node/iter3/tensor`.
    #[arg(long)]
    keep_control_flow: bool,
    /// How a --cand-model's tensors are paired with the reference's: `auto` (names first, then
    /// structure: op types, topology, attributes and weight shapes, looking through Casts,
    /// Identity and Q/DQ pairs) or `name` (names only).
    #[arg(long = "match", default_value = "auto", value_parser = ["auto", "name"])]
    match_mode: String,
    /// Process only share I of N (0 <= I < N) of the samples of --inputs DIR (sample k goes to
    /// shard k mod N) and write a partial report for `layerwise merge`, e.g. from a Slurm array
    /// or a Kubernetes indexed Job.
    #[arg(long, value_name = "I/N", value_parser = parse_shard)]
    shard: Option<(usize, usize)>,
    /// Spread the samples of --inputs DIR over these GPUs (e.g. 0,1): one shard per GPU, run at
    /// the same time in this process, merged into the report one run over every sample writes.
    /// The GPU backends (ort:cuda, ort:trt, ort:nvrtx) run on each shard's GPU.
    #[arg(long, value_name = "GPU,...", value_delimiter = ',')]
    devices: Option<Vec<u32>>,
    /// Write the first divergent layer (with upstream nodes if it alone does not show the error)
    /// as a standalone model with its inputs and both sides' outputs, in ONNX's backend-test
    /// layout, into this new or empty folder.
    #[arg(long, value_name = "DIR")]
    repro: Option<PathBuf>,
}

#[derive(Args)]
struct ToleranceArgs {
    /// Absolute tolerance. An element passes if |cand - ref| <= atol + rtol*|ref| + range_tol*max|ref|.
    /// Default: 1e-4 for FP16 and TF32 candidates (sim:tf32, ort:cuda with TF32 on), 8e-4 for BF16,
    /// 1e-5 for float32 ones. NAME:VALUE sets one tensor's (an output, usually); repeatable.
    #[arg(long, value_name = "[NAME:]VALUE", value_parser = parse_tolerance)]
    atol: Vec<(Option<String>, f64)>,
    /// Relative tolerance. Default: 1e-2 for FP16 and TF32 candidates, 8e-2 for BF16, 1e-3 for
    /// float32 ones. NAME:VALUE sets one tensor's; repeatable.
    #[arg(long, value_name = "[NAME:]VALUE", value_parser = parse_tolerance)]
    rtol: Vec<(Option<String>, f64)>,
    /// Tolerance relative to the tensor's range: adds range_tol * max|ref| to each element's
    /// allowance. Default: 1e-2 for FP16 and TF32 candidates, 8e-2 for BF16, 1e-4 for float32
    /// ones; 0 gives numpy's allclose. NAME:VALUE sets one tensor's; repeatable.
    #[arg(long, value_name = "[NAME:]VALUE", value_parser = parse_tolerance)]
    range_tol: Vec<(Option<String>, f64)>,
}

impl ToleranceArgs {
    fn field(&self, field: ToleranceField) -> &[(Option<String>, f64)] {
        match field {
            ToleranceField::Atol => &self.atol,
            ToleranceField::Rtol => &self.rtol,
            ToleranceField::RangeTol => &self.range_tol,
        }
    }

    /// The value for every tensor (the last given without a name).
    fn global(&self, field: ToleranceField) -> Option<f64> {
        self.field(field).iter().rev().find(|(name, _)| name.is_none()).map(|(_, v)| *v)
    }

    fn by_tensor(&self) -> Vec<(String, ToleranceField, f64)> {
        [ToleranceField::Atol, ToleranceField::Rtol, ToleranceField::RangeTol]
            .into_iter()
            .flat_map(|f| self.field(f).iter().filter_map(move |(name, v)| name.clone().map(|n| (n, f, *v))))
            .collect()
    }
}

/// `VALUE` (every tensor) or `NAME:VALUE` (one tensor; the name may hold colons, as `logits:0`).
fn parse_tolerance(s: &str) -> Result<(Option<String>, f64), String> {
    let number = |v: &str| v.trim().parse::<f64>().ok().filter(|x| *x >= 0.0 && x.is_finite());
    if let Some(v) = number(s) {
        return Ok((None, v));
    }
    if s.trim().parse::<f64>().is_ok() {
        return Err(format!("a tolerance must be non-negative and finite, not {s}"));
    }
    match s.rsplit_once(':') {
        Some((name, v)) if !name.is_empty() => number(v)
            .map(|v| (Some(name.to_string()), v))
            .ok_or_else(|| format!("the tolerance for '{name}' must be non-negative and finite, not '{v}'")),
        _ => Err(format!("'{s}' is neither a non-negative number nor NAME:VALUE")),
    }
}

#[derive(Args)]
struct ReportArgs {
    /// Write the JSON report (schema layerwise.report/1) here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    formats: FormatArgs,
}

/// The report formats rendered from the JSON report (by `bisect`, or later by `report`).
#[derive(Args)]
struct FormatArgs {
    /// Write a self-contained HTML report (plots, the first divergent layer's neighbourhood, a
    /// sortable table of every tensor).
    #[arg(long)]
    html: Option<PathBuf>,
    /// Write a Markdown summary for a pull request or issue.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Write one CSV row per tensor with every metric.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write per-node error as Model Explorer node data (JSON).
    #[arg(long)]
    model_explorer: Option<PathBuf>,
}

impl FormatArgs {
    fn outputs(self, json: Option<PathBuf>) -> Outputs {
        Outputs { json, html: self.html, markdown: self.markdown, csv: self.csv, model_explorer: self.model_explorer }
    }
}

#[derive(Args)]
struct MergeArgs {
    /// The partial JSON reports, one per shard, in any order.
    #[arg(required = true)]
    partials: Vec<PathBuf>,
    /// Write the merged JSON report here.
    #[arg(long)]
    json: PathBuf,
    #[command(flatten)]
    formats: FormatArgs,
}

#[derive(Args)]
struct ReportCmdArgs {
    /// A JSON report written by `bisect --json`.
    report: PathBuf,
    /// A fix report (`fix --json`) to include in the Markdown summary.
    #[arg(long)]
    fix: Option<PathBuf>,
    #[command(flatten)]
    formats: FormatArgs,
}

#[derive(Args)]
struct TrtLayersArgs {
    model: PathBuf,
    /// Mark only these tensors (comma-separated) besides the outputs. Default: all.
    #[arg(long, value_delimiter = ',')]
    tensors: Option<Vec<String>>,
    /// Builder optimization level (0-5).
    #[arg(long)]
    opt: Option<i32>,
    /// Input shapes (dynamic dimensions need one), as for bisect.
    #[command(flatten)]
    inputs: InputArgs,
}

/// The subcommand exists in every build, so that docs/tensorrt.md's example says what to do
/// rather than "unrecognized subcommand".
#[cfg(not(feature = "tensorrt"))]
fn run_trt_layers(_args: TrtLayersArgs) -> Result<u8> {
    anyhow::bail!("trt-layers: this layerwise was built without native TensorRT; rebuild with `--features tensorrt` (docs/tensorrt.md)")
}

#[cfg(feature = "tensorrt")]
fn run_trt_layers(args: TrtLayersArgs) -> Result<u8> {
    use layerwise_runtime::trt::{build_engine, TrtOptions};
    let model = Model::load(&args.model)?;
    let index = GraphIndex::build(model.graph())?;
    let selection = args.tensors.map(Selection::Names).unwrap_or(Selection::All);
    let (options, _samples) = args.inputs.options()?;
    let inputs = layerwise_runtime::inputs::prepare_inputs(
        &layerwise_runtime::inputs::declared_inputs(&model, &index),
        &options,
    )?;
    let shapes: Vec<(String, Vec<usize>)> = inputs.into_iter().map(|i| (i.name, i.tensor.shape)).collect();
    let built = build_engine(
        &model,
        &index,
        &selection,
        &shapes,
        &TrtOptions { opt_level: args.opt, ..TrtOptions::default() },
    )?;
    say!(
        "{}: engine of {} bytes, {} layers, {} tensors marked as outputs{} ({})",
        args.model.display(),
        built.size,
        built.layers.len(),
        built.marked.len(),
        if built.not_exposable.is_empty() {
            String::new()
        } else {
            format!(", {} not exposable", built.not_exposable.len())
        },
        if built.from_cache { "from the cache".to_string() } else { format!("built in {:.2} s", built.build_seconds) }
    );
    for layer in &built.layers {
        say!("  {}\n    <- {}", shown(&layer.name), shown(layer.onnx_nodes.join(", ")));
    }
    for t in &built.not_exposable {
        say!("  not exposable: {}", shown(t));
    }
    say!("engine: {}", shown(built.path.display()));
    Ok(0)
}

#[derive(Args)]
struct InputArgs {
    /// Model inputs from an .npz file (keys are input names), or a folder of .npz files, one
    /// sample each: every sample is run and the metrics aggregated (bisect).
    #[arg(long = "inputs", value_name = "FILE.npz|DIR")]
    npz: Option<PathBuf>,
    /// One input from an .npy file; repeatable.
    #[arg(long = "input", value_name = "NAME=FILE.npy", value_parser = parse_named_path)]
    npy: Vec<(String, PathBuf)>,
    /// Shape of an input with dynamic dimensions, e.g. x:1x3x48x320; repeatable.
    #[arg(long = "input-shape", value_name = "NAME:SHAPE", value_parser = parse_shape)]
    shapes: Vec<(String, Vec<usize>)>,
    /// Range of random values for an input, e.g. x:-1,1 (default 0,1); repeatable.
    #[arg(long = "val-range", value_name = "NAME:LO,HI", value_parser = parse_range)]
    ranges: Vec<(String, f64, f64)>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Samples from a Python file whose function (`load_data`, or FUNC) yields dicts of input
    /// name to array, as Polygraphy's data loaders do; each is one sample, as the files of
    /// --inputs DIR are. Needs numpy in that Python (LAYERWISE_PYTHON, default python3).
    #[arg(long, value_name = "FILE.py[:FUNC]", conflicts_with = "npz")]
    data_loader_script: Option<String>,
    /// The most samples read from --data-loader-script: a loader that yields more is refused as
    /// one that does not end (its samples are also bounded by half the free space of the
    /// temporary folder).
    #[arg(long, value_name = "N", default_value_t = 10_000, requires = "data_loader_script")]
    max_loader_samples: usize,
}

#[derive(Args)]
struct DemoArgs {
    /// Folder for the demo model and its report.
    #[arg(long, default_value = "layerwise-demo")]
    out_dir: PathBuf,
    /// Write into a folder that is not empty, replacing the demo's own files there (a demo run
    /// before); anything else in it stays. Without it the folder must be new or empty.
    #[arg(long)]
    force: bool,
}

fn parse_named_path(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s.split_once('=').ok_or("expected NAME=FILE.npy")?;
    if name.is_empty() || path.is_empty() {
        return Err("expected NAME=FILE.npy".into());
    }
    Ok((name.to_string(), PathBuf::from(path)))
}

fn parse_shape(s: &str) -> Result<(String, Vec<usize>), String> {
    let (name, shape) = s.rsplit_once(':').ok_or("expected NAME:D0xD1x..., e.g. x:1x3x224x224")?;
    let dims: Result<Vec<usize>, _> = shape.split('x').map(|d| d.trim().parse::<usize>()).collect();
    match dims {
        Ok(d) if !name.is_empty() && !d.is_empty() => Ok((name.to_string(), d)),
        _ => Err(format!("'{shape}' is not a shape like 1x3x224x224")),
    }
}

fn parse_range(s: &str) -> Result<(String, f64, f64), String> {
    let (name, range) = s.rsplit_once(':').ok_or("expected NAME:LO,HI")?;
    let (lo, hi) = range.split_once(',').ok_or("expected NAME:LO,HI")?;
    let lo: f64 = lo.trim().parse().map_err(|_| format!("'{lo}' is not a number"))?;
    let hi: f64 = hi.trim().parse().map_err(|_| format!("'{hi}' is not a number"))?;
    Ok((name.to_string(), lo, hi))
}

impl InputArgs {
    /// The `--data-loader-script` file, which the run reads and no output may replace.
    fn script(&self) -> Option<PathBuf> {
        self.data_loader_script.as_deref().map(|spec| PathBuf::from(crate::data_loader::script_and_function(spec).0))
    }

    /// The input options, and the scratch folder of a data loader's samples (kept alive for the
    /// run).
    fn options(self) -> Result<(InputOptions, Option<layerwise_model::scratch::ScratchDir>)> {
        let (npz, guard) = match &self.data_loader_script {
            Some(spec) => {
                let (guard, folder) = crate::data_loader::samples_from_script(spec, self.max_loader_samples)?;
                (Some(folder), Some(guard))
            }
            None => (self.npz, None),
        };
        Ok((
            InputOptions {
                npz,
                npy: self.npy,
                shapes: self.shapes,
                ranges: self.ranges,
                seed: self.seed,
                ..Default::default()
            },
            guard,
        ))
    }
}

fn exit_for(status: Status) -> u8 {
    match status {
        Status::Pass => 0,
        Status::Diverged => 1,
    }
}

/// `--cand` as given, else the library's default (`pipeline::default_candidate`), said on
/// standard error where it is not the FP16 emulation.
fn candidate_or_default(
    given: Option<BackendSpec>,
    cand_model: Option<&std::path::Path>,
    quiet: bool,
) -> Result<BackendSpec> {
    if let Some(spec) = given {
        return Ok(spec);
    }
    let (spec, why) = crate::pipeline::default_candidate(cand_model)?;
    if let Some(why) = why.filter(|_| !quiet) {
        eprintln!("layerwise: {why}");
    }
    Ok(spec)
}

fn run_bisect(args: BisectArgs, quiet: bool) -> Result<u8> {
    let data_loader_script = args.inputs.script();
    let candidate = candidate_or_default(args.candidate, args.cand_model.as_deref(), quiet)?;
    let mut options = BisectOptions {
        model: args.model,
        reference: args.reference,
        candidate,
        cand_model: args.cand_model,
        quant_config: args.quant_config,
        inputs: InputOptions::default(),
        atol: args.tolerances.global(ToleranceField::Atol),
        rtol: args.tolerances.global(ToleranceField::Rtol),
        range_tol: args.tolerances.global(ToleranceField::RangeTol),
        tensor_tolerances: args.tolerances.by_tensor(),
        outputs: args.reports.formats.outputs(args.reports.json),
        save_tensors: args.save_tensors,
        data_loader_script,
        selection: args.tensors.map(Selection::Names).unwrap_or(Selection::All),
        top: args.top,
        progress: !quiet,
        progress_lines: false,
        mark: if args.mark == "search" { Marking::Search } else { Marking::All },
        max_memory: args.max_memory,
        isolate: !args.no_isolate,
        counterfactual: !args.no_counterfactual,
        noise_floor: !args.no_noise_floor,
        keep_control_flow: args.keep_control_flow,
        match_structure: args.match_mode == "auto",
        batch: args.batch as usize,
        repro: args.repro,
        shard: args.shard,
        separate_runs: args.separate_runs,
        holds_reference_tensors: false,
        tasks: args.tasks,
        device: None,
    };
    // Outputs are checked before a data-loader script runs (and again with the samples it made).
    crate::pipeline::check_outputs(&options)?;
    let (inputs, _samples) = args.inputs.options()?;
    options.inputs = inputs;
    if let Some(devices) = &args.devices {
        let mut reads = crate::pipeline::bisect_reads(&options);
        for (what, path) in options.outputs.paths() {
            reads.check_output_file(path, what)?;
        }
        let merged = crate::pipeline::devices::bisect_on_devices(&options, devices)?;
        options.outputs.write(&merged, None)?;
        say!("{}", shown(&merged.verdict.summary));
        for (what, path) in options.outputs.paths() {
            say!("{what}: {}", shown(path.display()));
        }
        return Ok(exit_for(merged.verdict.status));
    }
    let outcome = bisect(&options)?;
    say_raw!("{}", escape::terminal_lines(&outcome.text));
    for (what, path) in options.outputs.paths() {
        say!("{what}: {}", shown(path.display()));
    }
    if let Some(repro) = &outcome.report.extras.repro {
        match &repro.folder {
            Some(folder) if repro.reproduces => {
                say!("repro: {} ({} node(s); the candidate's error shows there too)", shown(folder), repro.nodes.len())
            }
            Some(folder) => say!(
                "repro: {} ({} node(s); the error does not show on its own there, see its README)",
                shown(folder),
                repro.nodes.len()
            ),
            None => say!("repro: not written: {}", shown(&repro.note)),
        }
    }
    Ok(exit_for(outcome.report.verdict.status))
}

fn run_convert(args: ConvertArgs) -> Result<u8> {
    // -o, and the weights file beside it for a model over 1 GiB, against the model and its
    // external data (crate::write_rule).
    let data_file = Model::oversized_data_path(&args.output);
    let mut reads = Reads::new();
    reads.file("the input model", &args.model);
    reads.check_output_file(&args.output, "-o")?;
    reads.check_output_file(&data_file, "the weights file written beside -o (for a model over 1 GiB)")?;
    let model = Model::load(&args.model)?;
    let mut reads = Reads::new();
    reads.external_data(&model, "the input model's external data");
    reads.refuse_overlap(&args.output, "-o")?;
    reads.refuse_overlap(&data_file, "the weights file written beside -o (for a model over 1 GiB)")?;
    let index = GraphIndex::build(model.graph())?;
    if let Some(rounding) = args.to.strip_suffix("-emulated").and_then(layerwise_model::Rounding::from_name) {
        let computed = float32_tensors(&model, &index)?;
        let keep: std::collections::HashSet<usize> = args
            .keep_fp32
            .iter()
            .map(|n| index.node(n).map(|i| i.proto_index).with_context(|| format!("--keep-fp32: no node '{n}'")))
            .collect::<Result<_>>()?;
        let emulated = layerwise_model::emulate(&model, &model.proto, &computed, &keep, rounding)?;
        model.save_standalone(&emulated.proto, &args.output)?;
        say!(
            "{}: {} tensors rounded, {} weights rounded -> {}",
            shown(args.model.display()),
            emulated.rounded_tensors,
            emulated.rounded_weights,
            shown(args.output.display())
        );
        return Ok(0);
    }
    // A file that already holds FP16/BF16 tensors (converted before, or mixed precision) is not
    // what the converter expects: its errors would name the converter's own tensors.
    let already_reduced = layerwise_runtime::typed::has_reduced_precision(&model);
    let hint = if already_reduced {
        format!(
            " ({} already holds FP16 or BF16 tensors: converted before? convert the float32 model)",
            args.model.display()
        )
    } else {
        String::new()
    };
    let float = float_tensor_set(
        &model,
        &float32_tensors(&model, &index).with_context(|| format!("typing {}{hint}", args.model.display()))?,
    );
    let options = ConvertOptions {
        keep_nodes: args.keep_fp32.into_iter().collect(),
        keep_ops: args.keep_fp32_op.into_iter().collect(),
        keep_io_types: !args.fp16_io,
        keep_overflowing_weight_consumers: !args.allow_weight_overflow,
        target: if args.to == "bf16" { layerwise_model::Precision::Bf16 } else { layerwise_model::Precision::Fp16 },
        ..Default::default()
    };
    // Written to a scratch file first and checked in a child process: an FP16 model can crash
    // ONNX Runtime, and the output appears only once it is known to load.
    let scratch = layerwise_model::scratch::ScratchDir::new("layerwise-convert-")?;
    let staged = scratch.path().join("converted.onnx");
    let mut convert = |o: &ConvertOptions| Ok(crate::keep::convert_checked(&model, &index, &float, o)?.0);
    // The written model is run once, not only loaded, on seeded random inputs (the check `fix`
    // makes; a model can load and fail to run), where the inputs' shapes are all known and stay
    // float32.
    let decls = layerwise_runtime::inputs::declared_inputs(&model, &index);
    let feeds: Option<Vec<(String, layerwise_runtime::Tensor)>> = if args.fp16_io {
        None
    } else {
        layerwise_runtime::inputs::prepare_inputs(&decls, &InputOptions::default())
            .ok()
            .map(|inputs| inputs.into_iter().map(|i| (i.name, i.tensor)).collect())
    };
    let (conversion, load) =
        crate::load_check::convert_that_loads(&model, &options, &staged, feeds.as_deref(), &mut convert)
            .with_context(|| format!("converting {}{hint}", args.model.display()))?;
    let problems = check_float_types(&conversion.proto, &float);
    if !problems.is_empty() {
        bail!("the converted model failed its type check (nothing written){hint}: {}", problems.join("; "));
    }
    // A model ONNX Runtime refuses (other than for a CPU kernel it lacks) or crashes on is not
    // written.
    if crate::load_check::unusable(&load) {
        bail!(
            "ONNX Runtime cannot load the converted model ({}; nothing written){hint}: {}",
            load.status,
            load.detail.unwrap_or_default()
        );
    }
    model.save_standalone(&conversion.proto, &args.output)?;
    say!(
        "{}: {} nodes {}, {} FP32, {} Casts inserted -> {}",
        shown(args.model.display()),
        conversion.fp16_nodes,
        shown(args.to.to_uppercase()),
        conversion.fp32_nodes.len(),
        conversion.casts_inserted,
        shown(args.output.display())
    );
    // One line a node, except where many share a reason (a quantized encoder's 192 quantizers
    // printed 192 lines): more than 10 get one line with their count and the first few.
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for (node, why) in &conversion.fp32_nodes {
        match by_reason.iter_mut().find(|(w, _)| *w == why.as_str()) {
            Some((_, nodes)) => nodes.push(node),
            None => by_reason.push((why, vec![node])),
        }
    }
    for (why, nodes) in &by_reason {
        if nodes.len() <= 10 {
            for node in nodes {
                say!("  FP32 {}: {}", shown(node), shown(why));
            }
        } else {
            say!("  FP32 {} nodes: {} (first {}, ...)", nodes.len(), shown(why), shown(nodes[..3].join(", ")));
        }
    }
    if already_reduced {
        say!("  note: {} already held FP16 or BF16 tensors; converting its float32 original gives the converter's full choice", shown(args.model.display()));
    }
    match load.status {
        layerwise_report::LoadStatus::Loads if feeds.is_some() => say!("  ONNX Runtime loads and runs it with its default options on seeded random inputs (checked in a separate process){}", load.detail.map(|d| format!(": {}", shown(d))).unwrap_or_default()),
        layerwise_report::LoadStatus::Loads => say!(
            "  ONNX Runtime loads it with its default options (checked in a separate process; not run: {}){}",
            if args.fp16_io { "its inputs are FP16" } else { "an input has dimensions only a run can give" },
            load.detail.map(|d| format!(": {}", shown(d))).unwrap_or_default()
        ),
        layerwise_report::LoadStatus::RunsBelowDefault => say!("  ONNX Runtime {}", shown(load.detail.unwrap_or_default())),
        _ => say!("  ONNX Runtime with its default options ({}): {}", load.status, shown(load.detail.unwrap_or_default())),
    }
    // A constant FP16 flushes to 0 (an epsilon under a Log or a Div) is no overflow and the
    // converter keeps no reader for it, but it can make the file give inf/NaN on real inputs (a
    // note-transcription model's 1e-10 under a Log: every output non-finite). Said, not judged:
    // whether it matters depends on the inputs.
    if options.target == layerwise_model::Precision::Fp16 {
        let fp32: std::collections::HashSet<&str> = conversion.fp32_nodes.iter().map(|(n, _)| n.as_str()).collect();
        for w in layerwise_model::scan_fp16_weight_range(&model)?.iter().filter(|w| w.underflow_count > 0) {
            // Only where it can be an epsilon: a small constant added (or a floor taken) on the way
            // to a Log, Div or Sqrt, or read by one of those; a Conv's tiny weights or a
            // Greater's FLT_MIN were warned of too.
            let epsilon_readers = ["Add", "Sub", "Max", "Clip", "Log", "Div", "Sqrt", "Reciprocal", "Pow"];
            let readers: Vec<&str> = index
                .consumers(&w.name)
                .iter()
                .map(|&c| &index.nodes[c])
                .filter(|n| !fp32.contains(n.name.as_str()) && epsilon_readers.contains(&n.op_type.as_str()))
                .filter(|n| w.numel <= 16 || !matches!(n.op_type.as_str(), "Add" | "Sub" | "Max" | "Clip"))
                .map(|n| n.name.as_str())
                .collect();
            if !readers.is_empty() {
                say!(
                    "  weight '{}' has {} of {} values that FP16 flushes to 0 (largest {:.3e}), read in FP16 by {}: where such a value keeps a Log, Div or Sqrt away from 0, the file can give inf/NaN; `layerwise bisect` on real inputs shows whether it does (`--keep-fp32` keeps its readers)",
                    shown(&w.name),
                    w.underflow_count,
                    w.numel,
                    w.underflow_max,
                    shown(readers.join(", "))
                );
            }
        }
    }
    for (w, readers) in &conversion.overflowing_weights {
        if readers.is_empty() {
            // A weight no node reads (a graph output, or unused) keeps its float32 value.
            say!("  weight '{}' is beyond the FP16 range; no node reads it, and it stays float32", shown(w));
        } else {
            say!("  weight '{}' is beyond the FP16 range; read by {}", shown(w), shown(readers.join(", ")));
        }
    }
    Ok(0)
}

fn run_fix(args: FixArgs, quiet: bool) -> Result<u8> {
    let data_loader_script = args.inputs.script();
    let candidate = candidate_or_default(args.candidate, args.cand_model.as_deref(), quiet)?;
    let mut options = FixOptions {
        bisect: BisectOptions {
            data_loader_script,
            atol: args.tolerances.global(ToleranceField::Atol),
            rtol: args.tolerances.global(ToleranceField::Rtol),
            range_tol: args.tolerances.global(ToleranceField::RangeTol),
            tensor_tolerances: args.tolerances.by_tensor(),
            outputs: Outputs { json: args.json, ..Outputs::default() },
            progress: !quiet,
            cand_model: args.cand_model,
            quant_config: args.quant_config,
            max_memory: args.max_memory,
            holds_reference_tensors: true,
            tasks: args.tasks,
            ..BisectOptions::new(&args.model, args.reference, candidate)
        },
        output: args.output,
        max_rounds: args.max_rounds,
        target: args.target,
    };
    // Outputs are checked before a data-loader script runs (and again with the samples it made).
    crate::fix::check_fix_outputs(&options)?;
    let (inputs, _samples) = args.inputs.options()?;
    options.bisect.inputs = inputs;
    let outcome = fix(&options)?;
    say_raw!("{}", escape::terminal_lines(&outcome.text));
    Ok(if outcome.report.status == layerwise_report::FixStatus::Fixed { 0 } else { 1 })
}

/// `I/N` with 0 <= I < N.
fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s.split_once('/').ok_or_else(|| format!("'{s}' is not I/N (e.g. 0/4)"))?;
    let (i, n): (usize, usize) = (
        i.trim().parse().map_err(|_| format!("'{i}' is not a shard index"))?,
        n.trim().parse().map_err(|_| format!("'{n}' is not a shard count"))?,
    );
    if n == 0 {
        return Err(format!("shard {i}/0: there must be at least one shard"));
    }
    if i >= n {
        return Err(format!("shard {i}/{n}: the index must be 0 to {}", n - 1));
    }
    Ok((i, n))
}

fn run_merge(args: MergeArgs) -> Result<u8> {
    let outputs = args.formats.outputs(Some(args.json));
    let mut partials: Vec<(&str, &std::path::Path)> =
        args.partials.iter().map(|p| ("a partial report", p.as_path())).collect();
    // The model the partial reports name, and its external data, are inputs too (`merge ... --json
    // w.data` replaced the model's weights).
    let mut models = Vec::new();
    for p in &args.partials {
        if let Ok(report) = layerwise_report::read_report(p) {
            for m in models_of_report(p, &report, None) {
                if !models.contains(&m) {
                    models.push(m);
                }
            }
        }
    }
    partials.extend(models.iter().map(|(what, p)| (*what, p.as_path())));
    let mut reads = Reads::new();
    for (what, path) in partials {
        reads.file(what, path);
    }
    for (what, path) in outputs.paths() {
        reads.check_output_file(path, what)?;
    }
    let merged = crate::merge::merge(&args.partials)?;
    outputs.write(&merged, None)?;
    say!("{}", shown(&merged.verdict.summary));
    for (what, path) in outputs.paths() {
        say!("{what}: {}", shown(path.display()));
    }
    Ok(exit_for(merged.verdict.status))
}

/// The model files a report names (the model, its external data, a fixed model), which rendering
/// it must not replace. A relative path is taken from the working folder and from the report's.
fn models_of_report(
    report_path: &std::path::Path,
    report: &layerwise_report::Report,
    fix: Option<&layerwise_report::FixReport>,
) -> Vec<(&'static str, std::path::PathBuf)> {
    let report_dir = report_path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let mut named: Vec<(&'static str, &str)> = vec![("the report's model", report.model.path.as_str())];
    if let Some(f) = fix {
        named.push(("the fix report's model", f.model.as_str()));
        if let Some(m) = &f.fixed_model {
            named.push(("the fixed model", m.as_str()));
        }
    }
    // The keep list written beside the fixed model is the fix's too (`report --fix --markdown
    // FIXED.keep-fp32.json` replaced it).
    let keep_lists: Vec<String> = fix
        .and_then(|f| f.fixed_model.as_ref())
        .map(|m| crate::fix::keep_list_path(std::path::Path::new(m)).display().to_string())
        .into_iter()
        .collect();
    named.extend(keep_lists.iter().map(|k| ("the keep list beside the fixed model", k.as_str())));
    let mut files = Vec::new();
    for (what, name) in named.into_iter().filter(|(_, n)| !n.is_empty()) {
        let path = std::path::Path::new(name);
        let candidates =
            if path.is_absolute() { vec![path.to_path_buf()] } else { vec![path.to_path_buf(), report_dir.join(path)] };
        for p in candidates.into_iter().filter(|p| p.is_file()) {
            // External data is listed, not read; a model too big to hold any (inline weights near
            // protobuf's 2 GB) is not decoded just to render a report.
            let small = std::fs::metadata(&p).is_ok_and(|m| m.len() < 256 << 20);
            if let Some(model) = small.then(|| Model::load(&p).ok()).flatten() {
                files
                    .extend(model.external_files().into_iter().map(|f| ("the external data of the report's model", f)));
            }
            files.push((what, p));
        }
    }
    files
}

fn run_report(args: ReportCmdArgs) -> Result<u8> {
    let report = layerwise_report::read_report(&args.report)?;
    let fix = match &args.fix {
        Some(path) => Some(layerwise_report::read_fix_report(path).map_err(|e| match e {
            layerwise_report::ReadError::Schema { .. } => anyhow::anyhow!(
                "--fix expects a report written by `layerwise fix --json` (schema layerwise.fix/1): {e}"
            ),
            e => e.into(),
        })?),
        None => None,
    };
    let outputs = args.formats.outputs(None);
    if outputs.paths().is_empty() {
        bail!("nothing to write: give --html, --markdown, --csv or --model-explorer");
    }
    let mut reads = Reads::new();
    reads.file("the report", &args.report);
    if let Some(f) = &args.fix {
        reads.file("the fix report", f);
    }
    for (what, path) in models_of_report(&args.report, &report, fix.as_ref()) {
        reads.file(what, path);
    }
    for (what, path) in outputs.paths() {
        reads.check_output_file(path, what)?;
    }
    outputs.write(&report, fix.as_ref())?;
    for (what, path) in outputs.paths() {
        say!("{what}: {}", shown(path.display()));
    }
    Ok(0)
}

fn run_demo(args: DemoArgs, quiet: bool) -> Result<u8> {
    if !args.force {
        crate::write_rule::check_fresh_folder(&args.out_dir, "demo --out-dir")
            .map_err(|e| anyhow::anyhow!("{e}; or add --force to replace the files of an earlier demo there"))?;
    }
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    let proto = demo_model();
    let model_path = args.out_dir.join("demo.onnx");
    layerwise_report::write_atomic(&model_path, &prost_encode(&proto))?;
    let model = Model::load(&model_path)?;
    let json = args.out_dir.join("report.json");
    let outputs = Outputs {
        json: Some(json.clone()),
        html: Some(args.out_dir.join("report.html")),
        markdown: None,
        csv: Some(args.out_dir.join("tensors.csv")),
        model_explorer: Some(args.out_dir.join("model-explorer.json")),
    };
    let options = BisectOptions {
        outputs: outputs.clone(),
        top: 8,
        progress: !quiet,
        ..BisectOptions::new(&model_path, BackendSpec::ort_cpu(), BackendSpec::sim(layerwise_model::Rounding::Fp16))
    };
    say!("layerwise demo: a model with a decomposed LayerNorm whose x² overflows in FP16, and a healthy branch.");
    say!("Comparing ONNX Runtime float32 (ort:cpu) with FP16 emulation (sim:fp16), every tensor.\n");
    let outcome = bisect_model(&model, &options)?;
    say_raw!("{}", escape::terminal_lines(&outcome.text));
    say!("\nModel:       {}", shown(model_path.display()));
    for (what, path) in outputs.paths() {
        say!("{what}: {}", shown(path.display()));
    }
    // A folder name no pasted command can hold (control characters) gets no command to paste.
    // A relative path starting with `-` would be read as an option: `./` first (`--out-dir=-rf`).
    let pasted = if model_path.is_relative() && model_path.display().to_string().starts_with('-') {
        std::path::Path::new(".").join(&model_path)
    } else {
        model_path.clone()
    };
    if let Some(model) = escape::shell_word(&pasted.display().to_string()) {
        say!("Try it yourself: layerwise bisect {model} --cand sim:fp16");
    }
    match &outcome.report.verdict.first_divergent {
        Some(fd) if fd.node == PLANTED_NODE => {}
        other => bail!(
            "the demo expected the break at '{PLANTED_NODE}' but found {}",
            other.as_ref().map(|f| f.node.clone()).unwrap_or_else(|| "none".into())
        ),
    }

    say!("\nNow the fix: the smallest set of nodes to keep in FP32, verified by re-running the candidate.\n");
    let fixed_path = args.out_dir.join("demo_fp16_fixed.onnx");
    let fix_options = FixOptions {
        bisect: BisectOptions {
            outputs: Outputs { json: Some(args.out_dir.join("fix.json")), ..Outputs::default() },
            ..BisectOptions::new(&model_path, BackendSpec::ort_cpu(), BackendSpec::sim(layerwise_model::Rounding::Fp16))
        },
        output: Some(fixed_path.clone()),
        max_rounds: 12,
        target: crate::fix::FixTarget::Elementwise,
    };
    let fixed = fix(&fix_options)?;
    say_raw!("{}", escape::terminal_lines(&fixed.text));
    say!("Fix report:  {}", shown(args.out_dir.join("fix.json").display()));
    if fixed.report.status != layerwise_report::FixStatus::Fixed {
        bail!("the demo's fix did not verify");
    }
    // The pull-request summary, with the fix.
    let markdown = args.out_dir.join("summary.md");
    Outputs { markdown: Some(markdown.clone()), ..Outputs::default() }.write(&outcome.report, Some(&fixed.report))?;
    say!("Markdown summary: {}", shown(markdown.display()));
    Ok(0)
}

/// Text from a model or the user, as one line of the terminal (`escape::terminal`).
fn shown(text: impl std::fmt::Display) -> String {
    escape::terminal(&text.to_string()).into_owned()
}

fn prost_encode(proto: &layerwise_model::onnx::ModelProto) -> Vec<u8> {
    use prost::Message;
    proto.encode_to_vec()
}

/// Runs the command line `args` (the program name first) and returns the exit status: 0 within
/// tolerance (or fixed), 1 diverged, 2 usage, input or run error. Clap's own messages (`--help`,
/// usage errors) and errors are printed as the binary prints them; Ctrl-C removes temporary files
/// and ends the process.
pub fn main_with_args<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code().clamp(0, 255) as u8;
        }
    };
    // Ctrl-C (and SIGTERM, SIGHUP) would end the process without running destructors: remove the
    // temporary files and folders first. Reports and models are renamed into place when complete,
    // so an interrupted run leaves the previous file or none, never a partial one.
    let _ = ctrlc::set_handler(|| {
        layerwise_model::scratch::remove_all_before_exit();
        // Each output is written whole or not at all; a run with several may stop between two.
        // Written with errors ignored: `eprintln!` panics where stderr is gone (a parent that
        // read it has exited), and a panic here would leave the process running.
        use std::io::Write;
        let written = layerwise_model::scratch::written();
        let _ = if written.is_empty() {
            writeln!(std::io::stderr(), "layerwise: interrupted; temporary files removed, no output written")
        } else {
            let names: Vec<String> = written.iter().map(|p| shown(p.display())).collect();
            writeln!(std::io::stderr(), "layerwise: interrupted; temporary files removed; complete before the interrupt and kept: {}; nothing else written", names.join(", "))
        };
        // `_exit`, not `exit`: other threads may be inside ONNX Runtime, and running its static
        // destructors under them aborts the process (cpuinfo's "called before initialized").
        // SAFETY: `_exit` ends the process at once; nothing runs after it.
        unsafe { libc::_exit(130) }
    });
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Errors quote names from the model: one line, its control characters shown escaped.
            eprintln!("error: {}", shown(format!("{e:#}")));
            2
        }
    }
}

/// Runs a command line inside a host process (the Python API): the exit status, or the error the
/// command line would print (its exit status is 2), with no signal handler installed.
pub fn run_in_process<I, T>(args: I) -> Result<u8>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    run(Cli::try_parse_from(args)?)
}

fn run(cli: Cli) -> Result<u8> {
    layerwise_runtime::backend_log::set_echo(cli.verbose);
    match cli.command {
        Command::Bisect(args) => run_bisect(*args, cli.quiet),
        Command::Convert(args) => run_convert(args),
        Command::Fix(args) => run_fix(*args, cli.quiet),
        Command::Report(args) => run_report(args),
        Command::TrtLayers(args) => run_trt_layers(args),
        Command::Demo(args) => run_demo(args, cli.quiet),
        Command::Merge(args) => run_merge(args),
        Command::CheckLoad(args) => crate::load_check::run_check_load(&args.model, args.inputs.as_deref()),
    }
}
