//! `--cand sim:int8` / `sim:fp8`: the float32 model quantized by layerwise's own quantizer
//! (`layerwise_model::quantize`) with ranges calibrated on the samples, then judged as any Q/DQ
//! candidate model (`--cand ort:cpu --cand-model`): one path, not a parallel pipeline.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use layerwise_model::quantize::{plan, quantize, QuantConfig, SimFormat};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_runtime::{Backend, RunRequest, Tensor};

/// What the emulation quantized with: kept so that `fix` re-quantizes with its keep set excluded.
#[derive(Debug, Clone)]
pub struct SimQuantized {
    pub config: QuantConfig,
    /// Tensor -> (min, max) over the calibration samples.
    pub ranges: HashMap<String, (f32, f32)>,
    pub samples: usize,
    /// Weight inputs computed by Constant nodes, quantized per tensor as activations.
    pub weights_as_activations: usize,
}

impl SimQuantized {
    /// The report's note: what is modelled, and what is not.
    pub fn note(&self, spec: &str) -> String {
        format!(
            "{spec} models {}{}; calibrated by min/max over {} sample{} on ONNX Runtime's CPU provider with optimizations off (as quantize_static calibrates), the same samples judged here (ranges that hold every judged value: no clipping a new input would meet); the Q/DQ model runs on ONNX Runtime's CPU provider as --cand ort:cpu{} --cand-model runs one: {}",
            self.config.describe(),
            match self.weights_as_activations {
                0 => String::new(),
                n => format!("; {n} weight input(s) computed by Constant nodes, not stored as initializers, are quantized per tensor as activations, as quantize_static does (stored as initializers they would be weights)"),
            },
            self.samples,
            if self.samples == 1 { "" } else { "s" },
            ",opt=basic",
            if self.config.format == SimFormat::Fp8 { ARITHMETIC_FP8 } else { ARITHMETIC }
        )
    }

    /// The Q/DQ model of `model` with `exclude` (node names) left float as well.
    pub fn requantize(
        &self,
        model: &Model,
        index: &GraphIndex,
        exclude: &[String],
    ) -> Result<layerwise_model::onnx::ModelProto> {
        let mut config = self.config.clone();
        for n in exclude {
            if !config.nodes_to_exclude.contains(n) {
                config.nodes_to_exclude.push(n.clone());
            }
        }
        Ok(quantize(model, index, &config, &self.ranges)?)
    }
}

/// The backend that calibrates: quantize_static's calibration session (CPU, no graph
/// optimizations), so that the ranges are its ranges bit for bit.
pub const CALIBRATION_SPEC: &str = "ort:cpu,opt=disable";

/// What the int8/uint8 Q/DQ model computes at `opt=basic` (below ONNX Runtime's Q/DQ fusions,
/// `BackendSpec::parse`): every op in float32 on dequantized values, which holds a sum of int8
/// code products exactly while it stays below 2^24 and rounds it by float32's step beyond.
pub const ARITHMETIC: &str = "the file's arithmetic, the same on every CPU: every op computed in float32 on dequantized values (ONNX Runtime's Q/DQ fusions off: its fused u8s8 integer kernels saturate on x86 CPUs without VNNI), so a Conv/MatMul/Gemm's sum of int8 code products is exact below 2^24 and within float32's rounding above";
/// The same for float8, run at `opt=basic` (see `BackendSpec::parse`): no integer kernel.
pub const ARITHMETIC_FP8: &str = "float8 e4m3fn rounding at each quantizer (round to nearest even, saturating at 448 x scale), every op computed in float32 on dequantized values (no float8 kernels)";

/// The config of `--quant-config` (defaults where none is given) for `sim:int8` (`fp8` false:
/// int8, or uint8 where the file says so) or `sim:fp8`.
pub fn load_config(path: Option<&Path>, fp8: bool) -> Result<QuantConfig> {
    let Some(path) = path else {
        return Ok(QuantConfig {
            format: if fp8 { SimFormat::Fp8 } else { SimFormat::Int8 },
            ..QuantConfig::default()
        });
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("--quant-config {}", path.display()))?;
    let shown = path.display().to_string();
    let mut config = QuantConfig::parse(&text, &shown)?;
    let gives_format = serde_json::from_str::<serde_json::Value>(&text).ok().is_some_and(|v| v.get("format").is_some());
    match (fp8, gives_format, config.format) {
        (true, false, _) => config.format = SimFormat::Fp8,
        (true, true, SimFormat::Fp8) | (false, _, SimFormat::Int8 | SimFormat::Uint8) => {}
        (true, true, f) => bail!("--quant-config {shown} says format \"{}\", and --cand sim:fp8 quantizes to fp8: use --cand sim:int8, or \"format\": \"fp8\"", f.name()),
        (false, _, SimFormat::Fp8) => bail!("--quant-config {shown} says format \"fp8\", and --cand sim:int8 quantizes to int8 or uint8: use --cand sim:fp8"),
    }
    Ok(config)
}

/// The min and max of every float32 activation the quantizer needs, over every sample (`feeds`),
/// from the reference's runs: the graph inputs from the feeds, the rest computed. Tensors of
/// other types (shapes, indices) get none, and stay unquantized.
pub fn calibrate(
    model: &Model,
    index: &GraphIndex,
    reference: &mut dyn Backend,
    feeds: &[Vec<(String, Tensor)>],
    tensors: &[String],
) -> Result<HashMap<String, (f32, f32)>> {
    let mut ranges: HashMap<String, (f32, f32)> = HashMap::new();
    let computed: Vec<String> = tensors.iter().filter(|t| index.producer(t).is_some()).cloned().collect();
    let mut widen = |name: &str, t: &Tensor| {
        if t.dtype() != layerwise_runtime::DType::F32 {
            return;
        }
        let values = t.to_f32();
        let entry = ranges.entry(name.to_string()).or_insert((f32::INFINITY, f32::NEG_INFINITY));
        for &v in values.iter().filter(|v| !v.is_nan()) {
            entry.0 = entry.0.min(v);
            entry.1 = entry.1.max(v);
        }
    };
    for sample in feeds {
        for (name, t) in sample.iter().filter(|(n, _)| tensors.contains(n)) {
            widen(name, t);
        }
        let out = reference.run(&RunRequest {
            model,
            index,
            inputs: sample,
            selection: &Selection::Names(computed.clone()),
        })?;
        for t in &computed {
            match out.tensors.get(t) {
                Some(v) => widen(t, v),
                None => bail!("calibration: the reference ({}) did not return tensor '{t}'", reference.spec()),
            }
        }
    }
    // A tensor that was NaN throughout has no range: 0, as for a tensor of zeros.
    for r in ranges.values_mut() {
        if r.0 > r.1 {
            *r = (0.0, 0.0);
        }
    }
    Ok(ranges)
}

/// The Q/DQ candidate of `model`: calibrated on `feeds` by `reference`, quantized by `config`.
pub fn quantized_candidate(
    model: &Model,
    index: &GraphIndex,
    reference: &mut dyn Backend,
    feeds: &[Vec<(String, Tensor)>],
    config: QuantConfig,
) -> Result<(Model, SimQuantized)> {
    let planned = plan(model, index, &config)?;
    if planned.nodes.is_empty() {
        bail!(
            "cannot quantize the model: it has no node of the quantized op types ({}) left after nodes_to_exclude",
            config.op_types.join(", ")
        );
    }
    let ranges = calibrate(model, index, reference, feeds, &planned.activations)?;
    let quantized = SimQuantized {
        config,
        ranges,
        samples: feeds.len(),
        weights_as_activations: planned.weights_as_activations.len(),
    };
    let proto = quantize(model, index, &quantized.config, &quantized.ranges)?;
    Ok((model.derived(proto, "sim-quantized.onnx"), quantized))
}
