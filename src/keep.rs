//! Running the candidate with chosen nodes kept at reference precision: the one mechanism behind
//! `fix`'s search and `bisect`'s counterfactual checks.
//!
//! `sim:fp16` keeps nodes in the emulation itself. Any other FP16 candidate is given the model
//! converted to FP16 with the keep list in FP32 (the converter's keep list), saved to a
//! temporary file and loaded like a user's model.

use std::collections::{BTreeMap, HashSet};

use anyhow::Result;
use layerwise_model::convert::{convert_fp16, float_tensor_set, Conversion, ConvertOptions};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_runtime::{float32_tensors, Backend, RunOutput, RunRequest, Tensor};

/// Converts `model`, then has ONNX Runtime type the result: a node whose FP16/BF16 inputs it
/// refuses (an op without that type at the model's opset: Conv takes bfloat16 only from opset
/// 22) is kept in FP32, with ONNX Runtime's words as the reason (`options.refused`), and the
/// conversion redone. Returns the conversion and every refusal, which do not depend on the keep
/// list (a converted node reads the target type whatever its neighbours are).
pub fn convert_checked(model: &Model, index: &GraphIndex, float: &HashSet<String>, options: &ConvertOptions) -> Result<(Conversion, BTreeMap<String, String>)> {
    let mut options = options.clone();
    loop {
        let conversion = convert_fp16(model, index, float, &options)?;
        let converted = model.derived(conversion.proto.clone(), "converted.onnx");
        let converted_index = GraphIndex::build(converted.graph())?;
        let Err(e) = layerwise_runtime::tensor_types(&converted, &converted_index, &[]) else { return Ok((conversion, options.refused)) };
        let message = e.to_string();
        // "... Type 'tensor(bfloat16)' of input parameter (x) of operator (Conv) in node (name) is invalid."
        let refused = message.rfind(") is invalid").and_then(|end| {
            let start = message[..end].rfind("in node (")? + "in node (".len();
            let op_start = message[..start].rfind("of operator (")? + "of operator (".len();
            let op_end = message[op_start..].find(')')? + op_start;
            Some((message[op_start..op_end].to_string(), message[start..end].to_string()))
        });
        match refused {
            Some((op, node)) if index.node(&node).is_some() && !options.refused.contains_key(&node) => {
                let why = format!("ONNX Runtime refuses {op} with {} inputs at opset {}", options.target.name().to_uppercase(), model.opset());
                options.refused.insert(node, why);
            }
            // Not a type refusal layerwise can act on: the model is what the rules give.
            _ => return Ok((conversion, options.refused)),
        }
    }
}

pub struct KeepRunner<'a> {
    model: &'a Model,
    index: &'a GraphIndex,
    /// The candidate emulates FP16 and keeps nodes itself.
    emulated: bool,
    /// The candidate emulates a stored precision (FP16, BF16), so a keep list means the file
    /// `convert` writes with it: the converter's own FP32 nodes are kept too.
    storage: bool,
    /// The nodes the converter keeps in FP32 by itself (nothing asked), found once.
    converter_fp32: Option<Vec<(String, String)>>,
    /// What a converted model is converted to: BF16 for a BF16 candidate, FP16 otherwise.
    target: layerwise_model::convert::Target,
    /// Nodes ONNX Runtime refuses in the target type, found by the first conversion.
    refused: Option<BTreeMap<String, String>>,
    float: Option<HashSet<String>>,
}

impl<'a> KeepRunner<'a> {
    /// Prepares `candidate` (its keep list is reset) to run `model` with keep lists.
    pub fn new(model: &'a Model, index: &'a GraphIndex, candidate: &mut dyn Backend) -> KeepRunner<'a> {
        let emulated = candidate.keep_fp32(&[]);
        let target = if candidate.precision() == layerwise_runtime::Precision::Bf16 { layerwise_model::convert::Target::Bf16 } else { layerwise_model::convert::Target::Fp16 };
        let storage = candidate.precision() != layerwise_runtime::Precision::Fp32;
        KeepRunner { model, index, emulated, storage, converter_fp32: None, target, refused: None, float: None }
    }

    /// Whether the candidate keeps nodes itself (FP16 emulation) rather than running a converted model.
    pub fn emulated(&self) -> bool {
        self.emulated
    }

    /// The float32 tensors of the model (ONNX Runtime's answer), asked once.
    pub fn float(&mut self) -> Result<&HashSet<String>> {
        if self.float.is_none() {
            self.float = Some(float_tensor_set(self.model, &float32_tensors(self.model, self.index)?));
        }
        Ok(self.float.as_ref().expect("just set"))
    }

    /// The model converted to FP16 (BF16) with `keep` in FP32. What ONNX Runtime refuses in the
    /// target type is found once, on the model converted with nothing kept (so every node is
    /// checked), and reused by every conversion.
    pub fn convert(&mut self, keep: &[String]) -> Result<Conversion> {
        let (model, index, target) = (self.model, self.index, self.target);
        if self.refused.is_none() {
            let everything = ConvertOptions { target, ..Default::default() };
            self.refused = Some(convert_checked(model, index, self.float()?, &everything)?.1);
        }
        let refused = self.refused.clone().expect("just found");
        let options = ConvertOptions { keep_nodes: keep.iter().cloned().collect(), target, refused, ..Default::default() };
        Ok(convert_fp16(model, index, self.float()?, &options)?)
    }

    /// The nodes the converter keeps in FP32 whatever the keep list is (ops that stay FP32,
    /// readers of weights beyond FP16's range, what ONNX Runtime refuses in the target type), with
    /// the reason. Empty where the model cannot be converted (BF16 before opset 13).
    pub fn converter_fp32(&mut self) -> &[(String, String)] {
        if self.converter_fp32.is_none() {
            let index = self.index;
            let found = self.convert(&[]).map(|c| c.fp32_nodes.into_iter().filter(|(n, _)| index.node(n).is_some()).collect()).unwrap_or_default();
            self.converter_fp32 = Some(found);
        }
        self.converter_fp32.as_deref().expect("just set")
    }

    /// What an emulating candidate keeps for `keep`: the nodes FP32 in the file `convert` writes
    /// with that keep list (the list and the converter's own FP32 nodes), so that the emulation
    /// computes what the written model computes.
    pub fn as_written(&mut self, keep: &[String]) -> Vec<String> {
        let mut all = keep.to_vec();
        if self.storage {
            for (n, _) in self.converter_fp32() {
                if !all.contains(n) {
                    all.push(n.clone());
                }
            }
        }
        all
    }

    /// One candidate run with `keep` in FP32, returning the selected tensors. The candidate's own
    /// keep list is reset afterwards.
    pub fn run(&mut self, candidate: &mut dyn Backend, keep: &[String], inputs: &[(String, Tensor)], selection: &Selection) -> Result<RunOutput> {
        if self.emulated {
            let as_written = self.as_written(keep);
            candidate.keep_fp32(&as_written);
            let out = candidate.run(&RunRequest { model: self.model, index: self.index, inputs, selection });
            candidate.keep_fp32(&[]);
            return Ok(out?);
        }
        let converted = self.convert(keep)?;
        let dir = layerwise_model::scratch::ScratchDir::new("layerwise-keep-")?;
        let path = dir.path().join("candidate.onnx");
        self.model.save_standalone(&converted.proto, &path)?;
        let cm = Model::load(&path)?;
        let ci = GraphIndex::build(cm.graph())?;
        // ONNX Runtime's CPU provider computes an FP16 model in float32: run it in its own types.
        if let Some(threads) = crate::pipeline::setup::typed_candidate(candidate.spec(), &cm) {
            let mut typed = layerwise_runtime::typed::TypedBackend::new(candidate.spec(), threads);
            return Ok(typed.run(&RunRequest { model: &cm, index: &ci, inputs, selection })?);
        }
        Ok(candidate.run(&RunRequest { model: &cm, index: &ci, inputs, selection })?)
    }
}
