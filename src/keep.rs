//! Running the candidate with chosen nodes kept at reference precision: the one mechanism behind
//! `fix`'s search and `bisect`'s counterfactual checks.
//!
//! `sim:fp16` keeps nodes in the emulation itself. Any other FP16 candidate is given the model
//! converted to FP16 with the keep list in FP32 (the converter's keep list), saved to a
//! temporary file and loaded like a user's model.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::Result;
use layerwise_model::convert::{convert_fp16, float_tensor_set, layernorm_fp32_beyond, Conversion, ConvertOptions};
use layerwise_model::extract::{extract_groups, TensorType};
use layerwise_model::{DataType, GraphIndex, Model, Precision, Selection};
use layerwise_runtime::{float32_tensors, Backend, DType, RunOutput, RunRequest, Tensor};

/// Converts `model`, then has ONNX Runtime type the result: a node whose FP16/BF16 inputs it
/// refuses (an op without that type at the model's opset: Conv takes bfloat16 only from opset
/// 22) is kept in FP32, with ONNX Runtime's words as the reason (`options.refused`), and the
/// conversion redone. Returns the conversion and every refusal, which do not depend on the keep
/// list (a converted node reads the target type whatever its neighbours are).
pub fn convert_checked(
    model: &Model,
    index: &GraphIndex,
    float: &HashSet<String>,
    options: &ConvertOptions,
) -> Result<(Conversion, BTreeMap<String, String>)> {
    let mut options = options.clone();
    loop {
        let conversion = convert_fp16(model, index, float, &options)?;
        let converted = model.derived(conversion.proto.clone(), "converted.onnx");
        let Err(e) = check_converted_types(model, index, &converted, &conversion, options.target) else {
            return Ok((conversion, options.refused));
        };
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
                let why = format!(
                    "ONNX Runtime refuses {op} with {} inputs at opset {}",
                    options.target.name().to_uppercase(),
                    model.opset()
                );
                options.refused.insert(node, why);
            }
            // Not a type refusal layerwise can act on: the model is what the rules give.
            _ => return Ok((conversion, options.refused)),
        }
    }
}

/// Nodes per piece of a converted model's type check. ONNX Runtime's session for a reduced
/// precision model on the CPU builds in time that grows faster than its node count (a decoder of
/// 5,603 nodes 2.7 s, of 11,203 nodes 11 s: its CPU provider's FP16 handling), while what the
/// check looks for, a node's input types against its op's schema, is each node's own.
const TYPE_CHECK_NODES: usize = 1000;

/// [`layerwise_runtime::check_types`] of `converted` (the conversion of `model`), in pieces of
/// [`TYPE_CHECK_NODES`] consecutive nodes for a large model, each fed at its border with the
/// types the conversion gives those tensors, checked in graph order (the first refusal found is
/// the one a whole-model check finds first, up to ONNX Runtime's own order). Where a border type
/// is not known, or a piece fails for anything but a refusal, the whole model is checked.
fn check_converted_types(
    model: &Model,
    index: &GraphIndex,
    converted: &Model,
    conversion: &Conversion,
    target: Precision,
) -> Result<(), layerwise_runtime::RuntimeError> {
    let graph = converted.graph();
    if graph.node.len() <= 2 * TYPE_CHECK_NODES || index.nodes.iter().any(|n| n.has_subgraphs) {
        return layerwise_runtime::check_types(converted);
    }
    match check_types_in_pieces(model, index, converted, conversion, target) {
        Some(Err(e)) if e.to_string().contains(") is invalid") => Err(e),
        Some(Ok(())) => Ok(()),
        _ => layerwise_runtime::check_types(converted),
    }
}

/// The pieces of [`check_converted_types`]; `None` where a border type is not known.
fn check_types_in_pieces(
    model: &Model,
    index: &GraphIndex,
    converted: &Model,
    conversion: &Conversion,
    target: Precision,
) -> Option<Result<(), layerwise_runtime::RuntimeError>> {
    use layerwise_model::builder::{tensor_type, Dim};
    use layerwise_model::onnx::{GraphProto, ModelProto, ValueInfoProto};
    let graph = converted.graph();
    // The original model's types (ONNX Runtime's, asked once per model: for its float tensors,
    // or for the inputs' shapes to estimate memory). Concrete dimensions where the model's are
    // symbolic change no node's input types, which is what the check is about.
    let original = layerwise_runtime::tensor_types_for_any_shapes(model, index).ok()?;
    let producer: HashMap<&str, usize> = graph
        .node
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().filter(|o| !o.is_empty()).map(move |o| (o.as_str(), i)))
        .collect();
    let declared: HashMap<&str, &ValueInfoProto> = graph.input.iter().map(|v| (v.name(), v)).collect();
    let weights: HashSet<&str> = graph.initializer.iter().map(|w| w.name()).collect();
    let reduced = target.data_type();
    // A computed tensor's type in the converted model: a Cast's target, the reduced type where
    // the conversion stores it so, else its type in the original model; dims as the original's.
    let dims_of = |t: &str| {
        original.get(t).map(|ty| {
            ty.dims
                .iter()
                .enumerate()
                .map(|(i, d)| d.map_or_else(|| Dim::Symbolic(format!("{t}__lw_d{i}")), |d| Dim::Fixed(d as i64)))
                .collect::<Vec<_>>()
        })
    };
    let type_of = |t: &str| -> Option<ValueInfoProto> {
        if let Some(v) = declared.get(t) {
            return Some((*v).clone());
        }
        let node = &graph.node[*producer.get(t)?];
        let elem = if node.op_type() == "Cast" {
            let to = node.attribute.iter().find(|a| a.name() == "to")?.i?;
            DataType::try_from(to as i32).ok()?
        } else if conversion.reduced_tensors.contains(t) {
            reduced
        } else {
            DataType::try_from(original.get(t)?.dtype?.onnx()).ok()?
        };
        let dims = if node.op_type() == "Cast" { node.input.first().and_then(|i| dims_of(i)) } else { dims_of(t) };
        Some(ValueInfoProto {
            name: Some(t.to_string()),
            r#type: Some(tensor_type(elem, dims.as_deref())),
            ..Default::default()
        })
    };
    let shell = ModelProto { graph: None, ..converted.proto.clone() };
    // What the check finds, a node's input types against its op's schema, is the same for every
    // node of one op, attributes and input and output types (a decoder's repeated blocks): the
    // first of each, in graph order, is checked, so the first refusal found is still the first.
    let weight_types: HashMap<&str, (i32, &[i64])> =
        graph.initializer.iter().map(|w| (w.name(), (w.data_type(), w.dims.as_slice()))).collect();
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut representatives: Vec<layerwise_model::onnx::NodeProto> = Vec::new();
    for node in &graph.node {
        use prost::Message;
        let mut signature =
            layerwise_model::onnx::NodeProto { name: None, input: Vec::new(), output: Vec::new(), ..node.clone() }
                .encode_to_vec();
        for t in node.input.iter().chain(&node.output) {
            match weight_types.get(t.as_str()) {
                Some((elem, dims)) => signature.extend(format!("|w{elem}{dims:?}").bytes()),
                None if t.is_empty() => signature.extend(b"|-"),
                // Untyped here: told apart by its name (checked on its own).
                None => {
                    signature.extend(type_of(t).map_or_else(|| format!("|{t}"), |v| format!("|{:?}", v.r#type)).bytes())
                }
            }
        }
        if seen.insert(signature) {
            representatives.push(node.clone());
        }
    }
    for nodes in representatives.chunks(TYPE_CHECK_NODES) {
        let made: HashSet<&str> = nodes.iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
        let mut inputs: Vec<ValueInfoProto> = Vec::new();
        let mut read: HashSet<&str> = HashSet::new();
        for t in nodes.iter().flat_map(|n| n.input.iter()).filter(|t| !t.is_empty()) {
            if made.contains(t.as_str()) || !read.insert(t.as_str()) || weights.contains(t.as_str()) {
                continue;
            }
            inputs.push(type_of(t)?);
        }
        let part = GraphProto {
            name: graph.name.clone(),
            initializer: graph.initializer.iter().filter(|w| read.contains(w.name())).cloned().collect(),
            input: inputs,
            output: made
                .iter()
                .filter(|t| !t.is_empty())
                .map(|t| ValueInfoProto { name: Some(t.to_string()), ..Default::default() })
                .collect(),
            node: nodes.to_vec(),
            ..Default::default()
        };
        let piece = converted.derived(ModelProto { graph: Some(part), ..shell.clone() }, "type-check-piece.onnx");
        if let Err(e) = layerwise_runtime::check_types(&piece) {
            return Some(Err(e));
        }
    }
    Some(Ok(()))
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
    target: Precision,
    /// Nodes ONNX Runtime refuses in the target type, found by the first conversion.
    refused: Option<BTreeMap<String, String>>,
    /// The conversion with nothing kept, made while finding `refused` (the last one
    /// [`convert_checked`] makes is it): kept so that it is not made again.
    unkept: Option<Conversion>,
    float: Option<HashSet<String>>,
    /// The model converted with nothing kept, for telling what a keep list changes.
    plain: Option<PlainStructure>,
    /// A converted model's stored weights, which every conversion shares where equal.
    stored: Option<std::sync::Arc<HashMap<String, layerwise_model::onnx::TensorProto>>>,
}

/// The nodes and weights' stored types of the model converted with nothing kept: all that tells
/// what a keep list changes. Held without the weights' values: with them, a second converted copy
/// of the weights stayed through the counterfactual's runs (decoder of 11,201 nodes: 36 MB).
struct PlainStructure {
    nodes: HashMap<String, layerwise_model::onnx::NodeProto>,
    weights: HashMap<String, (i32, Vec<i64>)>,
}

impl<'a> KeepRunner<'a> {
    /// Prepares `candidate` (its keep list is reset) to run `model` with keep lists.
    pub fn new(model: &'a Model, index: &'a GraphIndex, candidate: &mut dyn Backend) -> KeepRunner<'a> {
        let emulated = candidate.keep_fp32(&[]);
        let target = if candidate.precision() == Precision::Bf16 { Precision::Bf16 } else { Precision::Fp16 };
        let storage = candidate.precision() != Precision::Fp32;
        KeepRunner {
            model,
            index,
            emulated,
            storage,
            converter_fp32: None,
            target,
            refused: None,
            unkept: None,
            float: None,
            plain: None,
            stored: None,
        }
    }

    /// Every conversion shares the weights it stores as `converted` stores them (the `--cand-model`
    /// file): the counterfactual's conversion then makes no second FP16 copy of them (decoder of
    /// 56,001 nodes: 186 MB).
    pub fn sharing_weights_of(mut self, converted: &layerwise_model::Model) -> KeepRunner<'a> {
        let graph = converted.graph();
        self.stored = Some(std::sync::Arc::new(
            graph
                .initializer
                .iter()
                .filter(|t| t.raw_data.is_some())
                .map(|t| (t.name().to_string(), t.clone()))
                .collect(),
        ));
        self
    }

    /// What every conversion of this runner starts from: its target type, and the stored weights
    /// it shares ([`KeepRunner::sharing_weights_of`]).
    fn convert_options(&self) -> ConvertOptions {
        ConvertOptions { target: self.target, stored: self.stored.clone(), ..Default::default() }
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

    /// The nodes ONNX Runtime refuses in the target type, with its words: found once, on the model
    /// converted with nothing kept (so every node is checked), by [`convert_checked`]. They do not
    /// depend on the keep list, so every later conversion of this model takes them as they are
    /// instead of having ONNX Runtime type-check it again.
    pub fn refused(&mut self) -> Result<&BTreeMap<String, String>> {
        if self.refused.is_none() {
            let (model, index) = (self.model, self.index);
            let everything = self.convert_options();
            let (unkept, refused) = convert_checked(model, index, self.float()?, &everything)?;
            self.refused = Some(refused);
            self.unkept = Some(unkept);
        }
        Ok(self.refused.as_ref().expect("just found"))
    }

    /// The model converted with nothing kept: [`KeepRunner::convert`] of an empty keep list,
    /// made once.
    fn unkept(&mut self) -> Result<&Conversion> {
        if self.unkept.is_none() {
            let refused = self.refused()?.clone();
            // Dropped by `converter_fp32` for an emulation: made again if asked.
            if self.unkept.is_none() {
                let options = ConvertOptions { refused, ..self.convert_options() };
                self.unkept = Some(convert_fp16(self.model, self.index, self.float()?, &options)?);
            }
        }
        Ok(self.unkept.as_ref().expect("just made"))
    }

    /// The model converted to FP16 (BF16) with `keep` in FP32, and what ONNX Runtime refuses in the
    /// target type ([`KeepRunner::refused`]) in FP32 too.
    pub fn convert(&mut self, keep: &[String]) -> Result<Conversion> {
        if keep.is_empty() {
            return Ok(self.unkept()?.clone());
        }
        let (model, index) = (self.model, self.index);
        let refused = self.refused()?.clone();
        let options = ConvertOptions { keep_nodes: keep.iter().cloned().collect(), refused, ..self.convert_options() };
        Ok(convert_fp16(model, index, self.float()?, &options)?)
    }

    /// The nodes the converter keeps in FP32 whatever the keep list is (ops that stay FP32,
    /// readers of weights beyond FP16's range, what ONNX Runtime refuses in the target type), with
    /// the reason. Empty where the model cannot be converted (BF16 before opset 13).
    pub fn converter_fp32(&mut self) -> &[(String, String)] {
        if self.converter_fp32.is_none() {
            let index = self.index;
            let found = self
                .unkept()
                .map(|c| c.fp32_nodes.iter().filter(|(n, _)| index.node(n).is_some()).cloned().collect())
                .unwrap_or_default();
            self.converter_fp32 = Some(found);
            // An emulation runs no converted model: not held through its runs.
            if self.emulated {
                self.unkept = None;
            }
        }
        self.converter_fp32.as_deref().expect("just set")
    }

    /// The nodes the converter keeps in FP32 when `keep` is the keep list, with the reason: its
    /// own ([`KeepRunner::converter_fp32`]) and those the list makes it keep (a LayerNorm left
    /// with parts of two types).
    pub fn converter_fp32_with(&mut self, keep: &[String]) -> Vec<(String, String)> {
        let kept: HashSet<&String> = keep.iter().collect();
        let mut found: Vec<(String, String)> =
            self.converter_fp32().iter().filter(|(n, _)| !kept.contains(n)).cloned().collect();
        let fp32: HashSet<&str> = keep.iter().chain(found.iter().map(|(n, _)| n)).map(String::as_str).collect();
        let (model, index, target) = (self.model, self.index, self.target);
        // Where ONNX Runtime cannot type the model, no conversion exists (as for
        // `converter_fp32`), and none keeps more.
        let beyond = match self.float() {
            Ok(float) => layernorm_fp32_beyond(model, index, float, &fp32, target),
            Err(_) => Vec::new(),
        };
        found.extend(beyond);
        found
    }

    /// What an emulating candidate keeps for `keep`: the nodes FP32 in the file `convert` writes
    /// with that keep list (the list and the converter's own FP32 nodes), so that the emulation
    /// computes what the written model computes.
    pub fn as_written(&mut self, keep: &[String]) -> Vec<String> {
        let mut all = keep.to_vec();
        if self.storage {
            all.extend(self.converter_fp32_with(keep).into_iter().map(|(n, _)| n));
        }
        all
    }

    /// One candidate run with `keep` in FP32, returning the selected tensors. The candidate's own
    /// keep list is reset afterwards.
    pub fn run(
        &mut self,
        candidate: &mut dyn Backend,
        keep: &[String],
        inputs: &[(String, Tensor)],
        selection: &Selection,
    ) -> Result<RunOutput> {
        if self.emulated {
            let as_written = self.as_written(keep);
            candidate.keep_fp32(&as_written);
            let out = candidate.run(&RunRequest { model: self.model, index: self.index, inputs, selection });
            candidate.keep_fp32(&[]);
            let mut out = out?;
            layerwise_analysis::add_passed_through(self.model.graph(), self.index, inputs, &mut out.tensors);
            return Ok(out);
        }
        let converted = self.convert(keep)?;
        let dir = layerwise_model::scratch::ScratchDir::new("layerwise-keep-")?;
        let path = dir.path().join("candidate.onnx");
        self.model.save_standalone(&converted.proto, &path)?;
        let cm = Model::load(&path)?;
        let ci = GraphIndex::build(cm.graph())?;
        // An input passed straight to an output is returned as the converted model was fed it.
        let mut out = run_converted(candidate, &cm, &ci, inputs, selection)?;
        layerwise_analysis::add_passed_through(cm.graph(), &ci, inputs, &mut out.tensors);
        Ok(out)
    }

    /// The model outputs of a converted candidate with `keep` in FP32, computed by re-running only
    /// the part of the model the keep list changes: the nodes that differ from the model converted
    /// with nothing kept, everything they feed, and what must be recomputed because the
    /// candidate's value of a tensor at their border is not at hand in the converted type. The
    /// border is fed the candidate's own values (`before`, its run under the reference's names,
    /// as the comparison holds them); outputs the keep list does not reach are taken from it as
    /// they are. Returns `None` where this does not apply (an emulating candidate, a model with
    /// control flow, a border value missing), and the caller runs the whole model; else the outputs
    /// and how many nodes ran.
    pub fn run_changed_part(
        &mut self,
        candidate: &mut dyn Backend,
        keep: &[String],
        inputs: &[(String, Tensor)],
        before: &HashMap<String, Tensor>,
    ) -> Result<Option<(RunOutput, usize)>> {
        if self.emulated || self.index.nodes.iter().any(|n| n.has_subgraphs) {
            return Ok(None);
        }
        if self.plain.is_none() {
            // The converter's own FP32 nodes are read from the plain conversion: found first, so
            // that it need not be held after this.
            self.converter_fp32();
            let plain = self.convert(&[])?;
            let graph = plain.proto.graph.expect("a converted model has a graph");
            let index = GraphIndex::build(&graph)?;
            let mut nodes: Vec<Option<layerwise_model::onnx::NodeProto>> = graph.node.into_iter().map(Some).collect();
            self.plain = Some(PlainStructure {
                nodes: index
                    .nodes
                    .iter()
                    .filter_map(|n| Some((n.name.clone(), nodes[n.proto_index].take()?)))
                    .collect(),
                weights: graph
                    .initializer
                    .iter()
                    .map(|w| (w.name().to_string(), (w.data_type(), w.dims.clone())))
                    .collect(),
            });
            // Made again if asked for (a run with nothing kept); not held through the runs.
            self.unkept = None;
        }
        let converted = self.convert(keep)?;
        let graph = converted.proto.graph.as_ref().expect("a converted model has a graph");
        let index = GraphIndex::build(graph)?;
        let plain = self.plain.as_ref().expect("just set");
        // An initializer counts as the same where its name, type and dimensions are (a keep list
        // changes a weight's stored type, not its values).
        let weights: HashMap<&str, (i32, &Vec<i64>)> =
            graph.initializer.iter().map(|w| (w.name(), (w.data_type(), &w.dims))).collect();
        let weight_changed = |t: &str| {
            weights.get(t).map(|(ty, dims)| (*ty, *dims)) != plain.weights.get(t).map(|(ty, dims)| (*ty, dims))
        };
        let mut changed_tensors: HashSet<&str> = HashSet::new();
        let mut part: Vec<bool> = vec![false; index.nodes.len()];
        for (i, node) in index.nodes.iter().enumerate() {
            let proto = &graph.node[node.proto_index];
            let differs = plain.nodes.get(node.name.as_str()) != Some(proto)
                || node
                    .inputs
                    .iter()
                    .any(|t| changed_tensors.contains(t.as_str()) || (index.is_initializer(t) && weight_changed(t)));
            if differs {
                part[i] = true;
                changed_tensors.extend(node.outputs.iter().map(String::as_str));
            }
        }
        // The border, walked back from the changed nodes: a value the candidate has in the type
        // the converted model stores it in is fed; any other tensor's producer joins the part.
        let expected_reduced = |t: &str| converted.reduced_tensors.contains(t);
        let usable = |t: &str, v: &Tensor| -> bool {
            let reduced = matches!(v.dtype(), DType::F16 | DType::BF16);
            reduced == expected_reduced(t) && (!reduced || v.dtype() == self.reduced_dtype())
        };
        let feeds: HashMap<&str, &Tensor> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut border: HashMap<String, Tensor> = HashMap::new();
        let mut stack: Vec<usize> = (0..index.nodes.len()).filter(|&i| part[i]).collect();
        while let Some(i) = stack.pop() {
            for t in index.nodes[i].inputs.iter().filter(|t| !t.is_empty() && !index.is_initializer(t)) {
                let Some(p) = index.producer_index(t) else {
                    // A graph input: fed as the whole run is fed.
                    let Some(v) = feeds.get(t.as_str()) else { return Ok(None) };
                    border.insert(t.clone(), (*v).clone());
                    continue;
                };
                if part[p] || border.contains_key(t) || index.is_constant_like(t) {
                    continue;
                }
                match before.get(t) {
                    Some(v) if usable(t, v) => {
                        border.insert(t.clone(), v.clone());
                    }
                    _ => {
                        part[p] = true;
                        stack.push(p);
                    }
                }
            }
        }
        // Outputs the part does not reach are the candidate's as they are.
        let mut result = RunOutput::default();
        let mut computed = Vec::new();
        for o in &self.index.outputs {
            if index.producer_index(o).is_some_and(|p| part[p]) {
                computed.push(o.clone());
            } else {
                let Some(v) = before.get(o) else { return Ok(None) };
                result.tensors.insert(o.clone(), v.clone());
            }
        }
        if computed.is_empty() {
            // The keep list reaches no output: nothing to run.
            return Ok(Some((result, 0)));
        }
        let members: Vec<String> =
            (0..index.nodes.len()).filter(|&i| part[i]).map(|i| index.nodes[i].name.clone()).collect();
        // Types as the converted model stores them: a graph input as it declares it.
        let declared: HashMap<&str, i32> =
            graph.input.iter().filter_map(|v| Some((v.name(), declared_elem(v)?))).collect();
        let types = |t: &str| -> Option<TensorType> {
            let v = border.get(t)?;
            let elem = declared.get(t).copied().unwrap_or(v.dtype().onnx());
            Some(TensorType { elem: DataType::try_from(elem).ok()?, dims: v.shape.clone() })
        };
        let rerun = members.len();
        let cm = self.model.derived(converted.proto.clone(), "counterfactual.onnx");
        let mut extraction = extract_groups(&cm, &index, &[members], &types)?;
        let group = &extraction.groups[0];
        let mut outputs = Vec::new();
        for o in computed {
            let Some((local, _)) = group.outputs.iter().find(|(_, t)| *t == o) else { return Ok(None) };
            outputs.push((local.clone(), o));
        }
        // The part returns only the model outputs: fewer copies off the device, and nothing in
        // the way of the runtime's fusions.
        extraction
            .proto
            .graph
            .as_mut()
            .expect("an extraction has a graph")
            .output
            .retain(|v| outputs.iter().any(|(local, _)| local == v.name()));
        let part_inputs: Vec<(String, Tensor)> =
            group.inputs.iter().map(|(local, t)| (local.clone(), border[t].clone())).collect();
        let part_model = cm.derived(extraction.proto, "counterfactual-part.onnx");
        let part_index = GraphIndex::build(part_model.graph())?;
        let selection = Selection::Names(outputs.iter().map(|(local, _)| local.clone()).collect());
        let mut out = run_converted(candidate, &part_model, &part_index, &part_inputs, &selection)?;
        for (local, o) in outputs {
            let Some(v) = out.tensors.remove(&local) else { return Ok(None) };
            result.tensors.insert(o, v);
        }
        result.notes = out.notes;
        Ok(Some((result, rerun)))
    }

    /// The nodes (by topological position) whose results differ between runs keeping `a` and
    /// keeping `b` (as written): those kept in one and not the other, and every node they feed.
    /// An emulation changes nothing else for a node kept (its outputs unrounded, its weights and
    /// graph inputs read unrounded, its non-kept readers reading a rounded copy).
    fn affected(&self, a: &HashSet<String>, b: &HashSet<String>) -> Vec<bool> {
        let index = self.index;
        let mut affected = vec![false; index.nodes.len()];
        for name in a.symmetric_difference(b) {
            if let Some(node) = index.node(name) {
                affected[node.topo_index] = true;
            }
        }
        // Nodes are in topological order: a reader comes after what it reads.
        for i in 0..index.nodes.len() {
            if !affected[i]
                && index.nodes[i].inputs.iter().any(|t| index.producer_index(t).is_some_and(|p| affected[p]))
            {
                affected[i] = true;
            }
        }
        affected
    }

    /// The computed tensors of `nodes` (by topological position) that `wanted` accepts, in pieces
    /// of consecutive positions: fixed boundaries, so that a piece a later run computes again
    /// the same way runs in the session the candidate kept for it.
    fn pieces(&self, nodes: &[bool], wanted: &dyn Fn(&str) -> bool) -> Vec<Vec<String>> {
        let mut pieces: Vec<(usize, Vec<String>)> = Vec::new();
        for (i, node) in self.index.nodes.iter().enumerate().filter(|(i, _)| nodes[*i]) {
            let piece = i / PIECE_NODES;
            if pieces.last().map(|(p, _)| *p) != Some(piece) {
                pieces.push((piece, Vec::new()));
            }
            pieces
                .last_mut()
                .expect("just pushed")
                .1
                .extend(node.outputs.iter().filter(|t| !t.is_empty() && wanted(t)).cloned());
        }
        pieces.into_iter().map(|(_, p)| p).filter(|p| !p.is_empty()).collect()
    }

    /// The tensors that `nodes` compute in one piece and read in a later one.
    fn crossing(&self, nodes: &[bool]) -> HashSet<String> {
        let index = self.index;
        let mut crossing = HashSet::new();
        for (i, node) in index.nodes.iter().enumerate().filter(|(i, _)| nodes[*i]) {
            for t in &node.inputs {
                if index.producer_index(t).is_some_and(|p| nodes[p] && p / PIECE_NODES != i / PIECE_NODES) {
                    crossing.insert(t.clone());
                }
            }
        }
        crossing
    }

    /// Every tensor of the emulating candidate's run with `keep` in FP32, as [`KeepRunner::run`]
    /// returns them with `Selection::All`, computed from the held run of the same inputs that
    /// `keep` changes least: what it does not change is taken from it, the rest runs again in
    /// pieces fed at their border with its values. Without a held run every node runs, in pieces.
    /// `None` where this does not apply (a converted candidate, control flow, a candidate that
    /// cannot run parts); the caller then runs the whole model.
    pub fn run_all_from(
        &mut self,
        candidate: &mut dyn Backend,
        keep: &[String],
        inputs: &[(String, Tensor)],
        held: &[HeldRun],
    ) -> Result<Option<HeldRun<'static>>> {
        if !self.emulated || self.index.nodes.iter().any(|n| n.has_subgraphs) {
            return Ok(None);
        }
        let kept: HashSet<String> = self.as_written(keep).into_iter().collect();
        let (affected, base) = match held
            .iter()
            .map(|h| (self.affected(&h.kept, &kept), h))
            .min_by_key(|(a, _)| a.iter().filter(|&&x| x).count())
        {
            Some((affected, h)) => (affected, Some(h)),
            None => (vec![true; self.index.nodes.len()], None),
        };
        let index = self.index;
        let unaffected = |t: &str| index.producer_index(t).is_none_or(|p| !affected[p]);
        let mut tensors: HashMap<String, Tensor> = match base {
            Some(h) => h.tensors().filter(|(t, _)| unaffected(t)).map(|(t, v)| (t.clone(), v.clone())).collect(),
            None => HashMap::new(),
        };
        // A tensor the held run does not hold (not a tensor: a sequence) is not asked for again.
        let returned = |t: &str| base.is_none_or(|h| h.get(t).is_some());
        let pieces = self.pieces(&affected, &returned);
        let as_written: Vec<String> = kept.iter().cloned().collect();
        candidate.keep_fp32(&as_written);
        let known = |t: &str| if unaffected(t) { base.and_then(|h| h.get(t)) } else { None };
        let computed = candidate.run_pieces(
            &RunRequest { model: self.model, index, inputs, selection: &Selection::All },
            &known,
            &pieces,
        );
        candidate.keep_fp32(&[]);
        match computed {
            Some(Ok(computed)) => tensors.extend(computed),
            // Where a piece cannot run (a value that is not a tensor), the whole model does.
            None | Some(Err(_)) => return Ok(None),
        }
        layerwise_analysis::add_passed_through(self.model.graph(), index, inputs, &mut tensors);
        Ok(Some(HeldRun { kept, shared: None, tensors }))
    }

    /// The model outputs of the emulating candidate's run with `keep` in FP32, computed as
    /// [`KeepRunner::run_changed_part`] does for a converted candidate: only the nodes whose
    /// results `keep` changes against `baseline` run again, in pieces, fed at their border with
    /// the baseline's values. A border value the baseline lacks is computed first, in its run
    /// (only what it needs, from what it holds), and kept there for the next check: the prefix
    /// runs once for every check. Returns the outputs and how many nodes ran again; `None` where
    /// this does not apply, and the caller runs the whole model.
    pub fn outputs_from(
        &mut self,
        candidate: &mut dyn Backend,
        keep: &[String],
        inputs: &[(String, Tensor)],
        baseline: &mut HeldRun,
    ) -> Result<Option<(RunOutput, usize)>> {
        if !self.emulated || self.index.nodes.iter().any(|n| n.has_subgraphs) {
            return Ok(None);
        }
        let index = self.index;
        let kept: HashSet<String> = self.as_written(keep).into_iter().collect();
        let affected = self.affected(&baseline.kept, &kept);
        let unaffected = |t: &str| index.producer_index(t).is_none_or(|p| !affected[p]);
        // What runs again: the changed nodes that an output needs.
        let mut part = vec![false; index.nodes.len()];
        let mut stack: Vec<usize> =
            index.outputs.iter().filter_map(|o| index.producer_index(o)).filter(|&p| affected[p]).collect();
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut part[i], true) {
                continue;
            }
            stack.extend(index.nodes[i].inputs.iter().filter_map(|t| index.producer_index(t)).filter(|&p| affected[p]));
        }
        // The baseline's values it needs: its border, and the outputs it does not reach.
        let mut needed: Vec<String> = Vec::new();
        for node in index.nodes.iter().enumerate().filter(|(i, _)| part[*i]).map(|(_, n)| n) {
            needed.extend(
                node.inputs
                    .iter()
                    .filter(|t| index.producer_index(t).is_some_and(|p| !affected[p]) && !index.is_constant_like(t))
                    .cloned(),
            );
        }
        needed.extend(index.outputs.iter().filter(|o| index.producer_index(o).is_some_and(|p| !affected[p])).cloned());
        needed.sort();
        needed.dedup();
        needed.retain(|t| baseline.get(t).is_none());
        // What computes the border values the baseline lacks (the prefix): nodes the keep list
        // does not change, so they compute under `keep` what they compute under the baseline's
        // keep list, and run in the same pass as the part (one program, and a piece holding both
        // builds once).
        let mut prefix = vec![false; index.nodes.len()];
        let mut stack: Vec<usize> = needed.iter().filter_map(|t| index.producer_index(t)).collect();
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut prefix[i], true) {
                continue;
            }
            stack.extend(
                index.nodes[i]
                    .inputs
                    .iter()
                    .filter(|t| baseline.get(t).is_none())
                    .filter_map(|t| index.producer_index(t)),
            );
        }
        let both: Vec<bool> = part.iter().zip(&prefix).map(|(a, b)| *a || *b).collect();
        // Returned: the outputs, what one piece hands the next, and the border asked for, which
        // (with what a piece of the prefix hands the next) is kept in the baseline for the next
        // check: its border is computed from there, not from the inputs. Fewer outputs build and
        // copy faster.
        let crossing = self.crossing(&both);
        let outputs: HashSet<&str> = index.outputs.iter().map(String::as_str).collect();
        let asked: HashSet<&str> = needed.iter().map(String::as_str).collect();
        let pieces = self.pieces(&both, &|t| crossing.contains(t) || outputs.contains(t) || asked.contains(t));
        let as_written: Vec<String> = kept.iter().cloned().collect();
        candidate.keep_fp32(&as_written);
        let known = |t: &str| if unaffected(t) { baseline.get(t) } else { None };
        let computed = candidate.run_pieces(
            &RunRequest { model: self.model, index, inputs, selection: &Selection::All },
            &known,
            &pieces,
        );
        candidate.keep_fp32(&[]);
        let mut computed = match computed {
            Some(Ok(computed)) => computed,
            None | Some(Err(_)) => return Ok(None),
        };
        let of_prefix: Vec<String> =
            computed.keys().filter(|t| index.producer_index(t).is_some_and(|p| prefix[p])).cloned().collect();
        for t in of_prefix {
            let v = computed.remove(&t).expect("a key just listed");
            baseline.tensors.insert(t, v);
        }
        let mut out = RunOutput::default();
        for o in &index.outputs {
            let value = if unaffected(o) { baseline.get(o).cloned() } else { computed.remove(o) };
            if let Some(v) = value {
                out.tensors.insert(o.clone(), v);
            }
        }
        layerwise_analysis::add_passed_through(self.model.graph(), index, inputs, &mut out.tensors);
        Ok(Some((out, part.iter().filter(|&&p| p).count())))
    }

    fn reduced_dtype(&self) -> DType {
        match self.target {
            Precision::Bf16 => DType::BF16,
            Precision::Fp16 => DType::F16,
            Precision::Fp32 => DType::F32,
        }
    }
}

/// Nodes (in topological order) per piece of a part run again ([`KeepRunner::run_all_from`]):
/// small enough that a session for one builds fast (build time grows faster than the node
/// count) and that a change rebuilds little, large enough that a run is not all overhead.
const PIECE_NODES: usize = 256;

/// A candidate run of one sample, held to compute later runs from: the nodes it kept in FP32 (as
/// written) and its tensors, its own or shared with the comparison.
pub struct HeldRun<'t> {
    kept: HashSet<String>,
    shared: Option<&'t HashMap<String, Tensor>>,
    tensors: HashMap<String, Tensor>,
}

impl<'t> HeldRun<'t> {
    /// The candidate's tensors from the comparison (nothing kept).
    pub fn of_comparison(tensors: &'t HashMap<String, Tensor>) -> HeldRun<'t> {
        HeldRun { kept: HashSet::new(), shared: Some(tensors), tensors: HashMap::new() }
    }

    /// A run keeping `keep` (as the runner writes it) of which no tensor is held yet.
    pub fn nothing_yet(runner: &mut KeepRunner, keep: &[String]) -> HeldRun<'t> {
        HeldRun { kept: runner.as_written(keep).into_iter().collect(), shared: None, tensors: HashMap::new() }
    }

    /// A whole run of the candidate keeping `keep`, which returned `tensors`.
    pub fn whole(runner: &mut KeepRunner, keep: &[String], tensors: HashMap<String, Tensor>) -> HeldRun<'t> {
        HeldRun { kept: runner.as_written(keep).into_iter().collect(), shared: None, tensors }
    }

    pub fn get(&self, tensor: &str) -> Option<&Tensor> {
        self.tensors.get(tensor).or_else(|| self.shared?.get(tensor))
    }

    fn tensors(&self) -> impl Iterator<Item = (&String, &Tensor)> {
        self.tensors.iter().chain(self.shared.into_iter().flatten().filter(|(t, _)| !self.tensors.contains_key(*t)))
    }

    /// Every tensor held.
    pub fn into_tensors(self) -> HashMap<String, Tensor> {
        let mut all: HashMap<String, Tensor> = self.shared.cloned().unwrap_or_default();
        all.extend(self.tensors);
        all
    }

    pub fn tensor_map(&self) -> &HashMap<String, Tensor> {
        &self.tensors
    }
}

/// A graph input's declared element type.
fn declared_elem(v: &layerwise_model::onnx::ValueInfoProto) -> Option<i32> {
    match v.r#type.as_ref()?.value.as_ref()? {
        layerwise_model::onnx::type_proto::Value::TensorType(t) => t.elem_type,
        _ => None,
    }
}

/// Runs a converted model on `candidate`; ONNX Runtime's CPU provider computes an FP16 model in
/// float32, so there it runs in its own types.
fn run_converted(
    candidate: &mut dyn Backend,
    model: &Model,
    index: &GraphIndex,
    inputs: &[(String, Tensor)],
    selection: &Selection,
) -> Result<RunOutput> {
    if let Some(threads) = crate::pipeline::setup::typed_candidate(candidate.spec(), model) {
        let mut typed = layerwise_runtime::typed::TypedBackend::new(candidate.spec(), threads);
        return Ok(typed.run(&RunRequest { model, index, inputs, selection })?);
    }
    Ok(candidate.run(&RunRequest { model, index, inputs, selection })?)
}

/// A Q/DQ candidate model run with chosen reference nodes kept unquantized
/// ([`layerwise_model::unquantize`]): the counterfactual and `fix` of a quantized candidate. The
/// rewritten model runs on the candidate backend itself (ONNX Runtime's CPU provider runs it
/// with its integer kernels where Q/DQ pairs remain), never emulated.
#[derive(Clone, Copy)]
pub struct UnquantizedRunner<'a> {
    reference: &'a Model,
    ref_index: &'a GraphIndex,
    candidate: &'a Model,
    cand_index: &'a GraphIndex,
    /// Reference tensor -> the candidate tensor holding its value (the matching's pairs).
    cand_names: &'a HashMap<String, String>,
    /// The candidate's file and its integer ops as its Q/DQ form names them (`with_file`).
    file: Option<(&'a Model, &'a [layerwise_model::qdq_form::Lifted])>,
}

/// What keeping a set of reference nodes unquantized does in the candidate.
pub struct Unquantizing {
    /// Candidate nodes (same name and op as the reference's) whose input quantizers are bypassed.
    pub nodes: Vec<String>,
    /// Quantizers that took a reference activation over, computed as that activation instead.
    pub quantizers: Vec<layerwise_model::unquantize::BypassedQuantizer>,
    /// Reference nodes of the keep list that do this, and those with no counterpart in the
    /// candidate (fused away, renamed): nothing is kept for them.
    pub kept: Vec<String>,
    pub without_counterpart: Vec<String>,
}

impl<'a> UnquantizedRunner<'a> {
    pub fn new(
        reference: &'a Model,
        ref_index: &'a GraphIndex,
        candidate: &'a Model,
        cand_index: &'a GraphIndex,
        cand_names: &'a HashMap<String, String>,
    ) -> UnquantizedRunner<'a> {
        UnquantizedRunner { reference, ref_index, candidate, cand_index, cand_names, file: None }
    }

    /// The candidate's file where `candidate` is its Q/DQ form (QOperator or dynamic integer
    /// ops): runs as deployed are of the file with the kept ops float ([`Self::model_in_file_form`]),
    /// what the user gets; runs that read tensors are of the Q/DQ form, whose tensors pair.
    pub fn with_file(
        mut self,
        file: Option<(&'a Model, &'a [layerwise_model::qdq_form::Lifted])>,
    ) -> UnquantizedRunner<'a> {
        self.file = file;
        self
    }

    /// The candidate's counterparts of the reference nodes `keep`: the node of the same name and
    /// op, else (a Relu or Clip a quantizer took over) the quantizer whose output holds its value.
    pub fn translate(&self, keep: &[String]) -> Unquantizing {
        let mut out = Unquantizing {
            nodes: Vec::new(),
            quantizers: Vec::new(),
            kept: Vec::new(),
            without_counterpart: Vec::new(),
        };
        for name in keep {
            let Some(node) = self.ref_index.node(name) else {
                out.without_counterpart.push(name.clone());
                continue;
            };
            if self.cand_index.node(name).is_some_and(|c| c.op_type == node.op_type) {
                out.nodes.push(name.clone());
                out.kept.push(name.clone());
                continue;
            }
            let held = node
                .outputs
                .first()
                .and_then(|o| self.cand_names.get(o))
                .filter(|c| self.cand_index.producer(c).is_some_and(|p| p.op_type == "DequantizeLinear"));
            let clamp = layerwise_model::matching::Clamp::of(self.reference.graph(), self.ref_index, node);
            match (held, clamp) {
                (Some(c), Some(clamp)) => {
                    out.quantizers.push(layerwise_model::unquantize::BypassedQuantizer {
                        dequantized: c.clone(),
                        activation: Some(clamp),
                    });
                    out.kept.push(name.clone());
                }
                _ => out.without_counterpart.push(name.clone()),
            }
        }
        out
    }

    /// The candidate model with `keep` (reference nodes) unquantized.
    pub fn model(&self, keep: &[String]) -> Result<layerwise_model::unquantize::Unquantized> {
        let plan = self.translate(keep);
        Ok(layerwise_model::unquantize::keep_unquantized(
            &self.candidate.proto,
            &plan.nodes,
            &plan.quantizers,
            Some(&self.reference.proto),
        )?)
    }

    /// `file` (the candidate as its file has it, QOperator or dynamic integer ops, whose Q/DQ form
    /// the runner holds) with `keep` unquantized: the kept ops read in the Q/DQ form and left
    /// unquantized, every other op as the file has it.
    pub fn model_in_file_form(
        &self,
        file: &layerwise_model::onnx::ModelProto,
        lifted: &[layerwise_model::qdq_form::Lifted],
        keep: &[String],
    ) -> Result<layerwise_model::unquantize::Unquantized> {
        let plan = self.translate(keep);
        // The file's names of the kept nodes: a QOperator op's float node is named otherwise.
        let file_name =
            |n: &String| lifted.iter().find(|l| &l.float_node == n).map_or_else(|| n.clone(), |l| l.node.clone());
        let only: std::collections::HashSet<String> = plan.nodes.iter().map(file_name).collect();
        let partial = layerwise_model::qdq_form::to_qdq_form_only(file, &only)?.map(|f| f.model);
        Ok(layerwise_model::unquantize::keep_unquantized(
            partial.as_ref().unwrap_or(file),
            &plan.nodes,
            &plan.quantizers,
            Some(&self.reference.proto),
        )?)
    }

    /// One run of the candidate with `keep` unquantized: the tensors of `selection` (in its own
    /// names; `Selection::Names(vec![])` runs it as deployed, only its outputs, its Q/DQ pairs
    /// fused) under the reference names they hold.
    pub fn run(
        &self,
        backend: &mut dyn Backend,
        keep: &[String],
        inputs: &[(String, Tensor)],
        selection: &Selection,
    ) -> Result<RunOutput> {
        let as_deployed = matches!(selection, Selection::Names(names) if names.is_empty());
        let rewritten = match self.file.filter(|_| as_deployed) {
            Some((file, lifted)) => self.model_in_file_form(&file.proto, lifted, keep)?,
            None => self.model(keep)?,
        };
        let dir = layerwise_model::scratch::ScratchDir::new("layerwise-unquantized-")?;
        let path = dir.path().join("candidate.onnx");
        self.candidate.save_standalone(&rewritten.model, &path)?;
        let cm = Model::load(&path)?;
        let ci = GraphIndex::build(cm.graph())?;
        let mut out = backend.run(&RunRequest { model: &cm, index: &ci, inputs, selection })?;
        let mut renamed = HashMap::with_capacity(self.cand_names.len());
        for (r, c) in self.cand_names {
            if let Some(v) = out.tensors.get(c) {
                renamed.insert(r.clone(), v.clone());
            }
        }
        out.tensors = renamed;
        layerwise_analysis::add_passed_through(self.reference.graph(), self.ref_index, inputs, &mut out.tensors);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerwise_model::builder::{f32_tensor, Dim, ModelBuilder};
    use layerwise_model::convert::{float_tensor_set, ConvertOptions};

    /// A chain of Add (of a weight) and Relu, long enough to be checked in pieces: converted to
    /// FP16, FP16 tensors cross every border into an Add that also reads an FP16 weight, so a
    /// border declared in any other type makes ONNX Runtime refuse the piece.
    #[test]
    fn a_converted_model_type_checks_in_pieces() {
        let mut b = ModelBuilder::new("chain", 17);
        b.input("x", DataType::Float, &[Dim::Fixed(1), Dim::Fixed(8)]);
        b.initializer(f32_tensor("w", &[8], &[0.5; 8]));
        let n = 3 * TYPE_CHECK_NODES + 10;
        let mut prev = "x".to_string();
        for i in 0..n {
            let out = format!("t{i}");
            if i % 2 == 0 {
                b.node("Add", &format!("n{i}"), &[&prev, "w"], &[&out], vec![]);
            } else {
                b.node("Relu", &format!("n{i}"), &[&prev], &[&out], vec![]);
            }
            prev = out;
        }
        b.output(&prev, DataType::Float);
        let model = Model::from_proto(b.build(), "chain.onnx").unwrap();
        let index = GraphIndex::build(model.graph()).unwrap();
        let float = float_tensor_set(&model, &float32_tensors(&model, &index).unwrap());
        let conversion = convert_fp16(&model, &index, &float, &ConvertOptions::default()).unwrap();
        let converted = model.derived(conversion.proto.clone(), "converted.onnx");
        // Piece borders fall inside the converted chain (a Cast of the input comes first).
        assert!(conversion.reduced_tensors.contains("t998") && conversion.reduced_tensors.contains("t1998"));
        let checked = check_types_in_pieces(&model, &index, &converted, &conversion, Precision::Fp16)
            .expect("every border type known");
        assert!(checked.is_ok(), "{checked:?}");
        assert!(layerwise_runtime::check_types(&converted).is_ok());
    }
}
