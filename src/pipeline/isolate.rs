//! Introduced or propagated: each blame-chain node run alone on the reference's values.

use std::collections::HashMap;

use anyhow::{Context, Result};
use layerwise_analysis::{Isolation, LocalError, Verdict};
use layerwise_model::extract::{extract_groups_pulling, TensorType};
use layerwise_model::{GraphIndex, Selection};
use layerwise_runtime::{tensor_types, Precision, RunRequest, Tensor};

use super::compare::{Compared, Job};

/// Most chain nodes run alone.
const ISOLATE_MAX: usize = 128;

/// Runs each blame-chain node alone on the candidate, fed the reference's values.
pub(super) fn isolate(
    job: &mut Job,
    feeds: &[(String, Tensor)],
    compared: &Compared,
    verdict: &Verdict,
) -> Result<Isolation> {
    let started = std::time::Instant::now();
    let mut skipped = Vec::new();
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut steps_by_node = Vec::new();
    // A long chain: the nodes nearest the first divergent layer (the chain's end) are the ones
    // that matter; those nearest the output are left, and the report says so.
    let beyond = verdict.chain.len().saturating_sub(ISOLATE_MAX);
    if beyond > 0 {
        skipped.push((
            format!("{beyond} chain nodes nearest the output"),
            format!("at most {ISOLATE_MAX} chain nodes are run alone, those nearest the first divergent layer"),
        ));
    }
    // A stored value on the chain (a Constant that is a model output) computes nothing to run.
    for step in verdict.chain.iter().skip(beyond).filter(|s| !job.index.is_stored_value(&s.tensor)) {
        let Some(node) = job.index.node(&step.node) else { continue };
        if node.has_subgraphs {
            skipped.push((node.name.clone(), format!("{} has a subgraph", node.op_type)));
            continue;
        }
        // The candidate's node: of the same name, else (a Relu a quantizer took over) the one
        // computing the twin of the chain tensor.
        let mut name = node.name.clone();
        if let Some((_, ci)) = &job.cand_model {
            if ci.node(&node.name).is_none() {
                let twin = job.cand_names.get(&step.tensor).filter(|_| job.judging.quantization.is_some());
                match twin.and_then(|t| ci.producer(t)) {
                    Some(p) => name = p.name.clone(),
                    None => {
                        skipped.push((node.name.clone(), "not in the candidate model".into()));
                        continue;
                    }
                }
            }
        }
        groups.push(vec![name]);
        steps_by_node.push(step.clone());
    }
    if groups.is_empty() {
        return Ok(Isolation { nodes: Vec::new(), introducing: None, skipped });
    }
    // Reference values of every input and output of the chain nodes.
    let mut wanted: Vec<String> = Vec::new();
    for step in &steps_by_node {
        let node = job.index.node(&step.node).expect("checked");
        wanted.extend(
            node.inputs
                .iter()
                .chain(&node.outputs)
                .filter(|t| !t.is_empty() && job.index.producer_index(t).is_some())
                .cloned(),
        );
    }
    // A candidate model's tensor holds the value of the reference tensor the matching paired it with.
    let reference_of = job.reference_names();
    // A quantized candidate's nodes read through their quantizers, which are fed what they
    // quantize: the reference's twin of each quantizer's input.
    wanted.extend(job.quantized_reference_tensors(&reference_of));
    wanted.sort();
    wanted.dedup();
    let held = compared.tensors.as_ref().map(|(r, _)| r);
    let reference: HashMap<String, Tensor> = if held.is_some_and(|r| wanted.iter().all(|t| r.contains_key(t))) {
        let r = held.expect("checked");
        wanted.iter().map(|t| (t.clone(), r[t].clone())).collect()
    } else {
        reference_values(job, feeds, &wanted)?
    };
    super::steps::timing("isolation: reference values", started);
    let started = std::time::Instant::now();
    let graph_inputs: HashMap<&str, &Tensor> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let value = |t: &str| {
        let t = reference_of.get(t).map_or(t, String::as_str);
        reference.get(t).or_else(|| graph_inputs.get(t).copied())
    };
    // Types as the candidate's model declares them (a converted model reads FP16).
    let cand_types = match &job.cand_model {
        Some((cm, ci)) => {
            Some(tensor_types(cm, ci, &feeds.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect::<Vec<_>>())?)
        }
        None => None,
    };
    let type_of = |t: &str| -> Option<TensorType> {
        let v = value(t)?;
        let dtype = cand_types.as_ref().and_then(|ct| ct.get(t)).and_then(|ty| ty.dtype).unwrap_or(v.dtype());
        let elem = layerwise_model::DataType::try_from(dtype.onnx()).ok()?;
        Some(TensorType { elem, dims: v.shape.clone() })
    };
    let (source, source_index) = match &job.cand_model {
        Some((cm, ci)) => (cm, ci),
        None => (job.model, &job.index),
    };
    // A weight-only tensor on the chain (a rotary angle) has the reference's value to read: fed
    // that, each node is run alone rather than with the weight-only nodes before it.
    let on_chain = |t: &str| verdict.chain.iter().any(|s| s.tensor == t) && value(t).is_some();
    // A quantized candidate's node is run alone with its own quantizers: its inputs' Q/DQ pairs
    // come along, fed the reference's value of what they quantize.
    // A quantizer whose output holds another chain tensor is that chain step's own, run alone
    // there: the node reading it is fed the reference's value instead (no fault counted twice).
    let chain_twin = |t: &str| reference_of.get(t).is_some_and(|r| verdict.chain.iter().any(|s| &s.tensor == r));
    // Only where the float tensor the quantizer reads has a reference value to be fed: a QOperator
    // file's float op whose output is named afresh in its Q/DQ form (the name taken by the file's
    // own DequantizeLinear) has none, and the DequantizeLinear's output is fed instead.
    let fed_from_reference = |t: &str| {
        let Some(p) = source_index.producer(t) else { return false };
        let float = match p.op_type.as_str() {
            "QuantizeLinear" | "DynamicQuantizeLinear" => p.inputs.first(),
            _ => p
                .inputs
                .first()
                .and_then(|c| source_index.producer(c))
                .filter(|q| q.op_type == "QuantizeLinear")
                .and_then(|q| q.inputs.first()),
        };
        // A stored weight's DequantizeLinear reads no quantizer: it comes along as it is.
        float.is_none_or(|f| value(f).is_some() || source_index.is_constant_like(f))
    };
    // A dynamic quantizer's range node comes along with it, fed what it quantizes.
    let quantizer = |t: &str| {
        job.judging.quantization.is_some()
            && !chain_twin(t)
            && source_index.producer(t).is_some_and(|p| {
                matches!(p.op_type.as_str(), "QuantizeLinear" | "DequantizeLinear" | "DynamicQuantizeLinear")
            })
            && fed_from_reference(t)
    };
    // A converted candidate's edge Cast (`x__to_fp16`, which `convert` adds between FP32 and FP16
    // nodes) has no reference twin to be fed: it comes along, fed the reference's value of what it
    // casts (it was "no type and shape known for '..._to_fp16'", every chain node left unrun).
    let edge_cast = |t: &str| {
        value(t).is_none() && source_index.producer(t).is_some_and(|p| p.op_type == "Cast" && p.inputs.len() == 1)
    };
    let pull = |t: &str| (source_index.is_constant_like(t) && !on_chain(t)) || quantizer(t) || edge_cast(t);
    // A node whose inputs have no reference value to feed (a QOperator op's input named afresh in
    // its Q/DQ form) is left out on its own, saying why, rather than every chain node with it.
    let extraction = match extract_groups_pulling(source, source_index, &groups, &type_of, &pull) {
        Ok(e) => e,
        Err(joint) => {
            let mut kept = Vec::new();
            for (group, step) in groups.iter().zip(std::mem::take(&mut steps_by_node)) {
                match extract_groups_pulling(source, source_index, std::slice::from_ref(group), &type_of, &pull) {
                    Ok(_) => {
                        kept.push(group.clone());
                        steps_by_node.push(step);
                    }
                    Err(e) => skipped.push((step.node.clone(), e.to_string())),
                }
            }
            if kept.is_empty() {
                return Err(joint.into());
            }
            groups = kept;
            extract_groups_pulling(source, source_index, &groups, &type_of, &pull)?
        }
    };
    super::steps::timing("isolation: extracted", started);
    let started = std::time::Instant::now();
    let extracted = source.derived(extraction.proto, "isolated.onnx");
    let extracted_index = GraphIndex::build(extracted.graph())?;
    let mut local_feeds = Vec::new();
    for group in &extraction.groups {
        for (local, original) in &group.inputs {
            let v = value(original).ok_or_else(|| anyhow::anyhow!("no reference value for '{original}'"))?;
            local_feeds.push((local.clone(), v.clone()));
        }
    }
    job.candidate.keep_fp32(&[]);
    let out = job.candidate.run(&RunRequest {
        model: &extracted,
        index: &extracted_index,
        inputs: &local_feeds,
        selection: &Selection::All,
    })?;
    super::steps::timing("isolation: candidate run", started);
    let started = std::time::Instant::now();
    let mut nodes = Vec::new();
    for (group, step) in extraction.groups.iter().zip(&steps_by_node) {
        let twin = job.cand_names.get(&step.tensor).unwrap_or(&step.tensor);
        let Some((local, _)) = group.outputs.iter().find(|(_, o)| o == twin || *o == step.tensor) else {
            skipped.push((
                step.node.clone(),
                format!("the candidate's value of '{}' is not computed by that node alone", step.tensor),
            ));
            continue;
        };
        let (Some(r), Some(c)) = (reference.get(&step.tensor), out.tensors.get(local)) else {
            skipped.push((step.node.clone(), "the candidate returned no value".into()));
            continue;
        };
        if r.shape != c.shape {
            skipped.push((
                step.node.clone(),
                format!("shape {} alone, {} in the model", c.shape_string(), r.shape_string()),
            ));
            continue;
        }
        let local = layerwise_analysis::compute(
            &r.to_f32(),
            &c.to_f32(),
            job.judging.tolerances.judging(&step.tensor, r.dtype()),
        );
        let local_error = local.error_level();
        // An input whose reference values exceed the FP16 range cannot be stored in FP16: run alone,
        // the node sees that overflow, but in the model it comes from upstream.
        let node = job.index.node(&step.node).expect("chain node");
        let overflowing_input = (job.judging.precision() == Precision::Fp16)
            .then(|| {
                node.inputs.iter().filter(|t| !t.is_empty() && !job.index.is_constant_like(t)).find(|t| {
                    // Only a float tensor is stored in FP16: an int32 input beyond 65504 is not.
                    value(t).is_some_and(|v| {
                        v.dtype().is_float()
                            && v.to_f32().iter().any(|x| x.is_finite() && x.abs() > layerwise_model::fp16::FP16_MAX)
                    })
                })
            })
            .flatten();
        let note = overflowing_input.map(|t| {
            format!("its input '{t}' exceeds the FP16 range in the reference, so its overflow comes from upstream")
        });
        let introduces = local_error >= job.judging.rule.min_break && note.is_none();
        // The node that loses information to storage (absorption, a cancellation's or a periodic
        // function's operand) errs by a tiny relative L2 by nature: what it loses is absolute, so
        // it is judged by that (the Add absorbing x was marked 'propagates').
        let storage_loss =
            verdict.first_divergent.as_ref().filter(|fd| fd.node == step.node && fd.cause.best.kind.is_storage_loss());
        let (role, note) = match storage_loss {
            Some(fd) if !introduces && local.max_abs_err >= 0.5 * fd.evidence.output_max_abs_err => (
                "loses",
                Some(format!(
                    "its relative L2 is small by nature: run alone it is off by up to {} absolute ({} in the model run), the information its consumer needs",
                    layerwise_report::format_number(local.max_abs_err),
                    layerwise_report::format_number(fd.evidence.output_max_abs_err)
                )),
            ),
            _ => (if introduces { "introduces" } else { "propagates" }, note),
        };
        nodes.push(LocalError {
            node: step.node.clone(),
            op_type: step.op_type.clone(),
            tensor: step.tensor.clone(),
            local_error,
            in_model_error: step.error,
            role: role.to_string(),
            note,
        });
    }
    super::steps::timing("isolation: judged", started);
    let topo = |n: &str| job.index.node(n).map_or(0, |i| i.topo_index);
    let introducing = nodes
        .iter()
        .filter(|n| n.role == "introduces")
        .max_by(|a, b| a.local_error.total_cmp(&b.local_error).then(topo(&b.node).cmp(&topo(&a.node))))
        .map(|n| n.node.clone());
    Ok(Isolation { nodes, introducing, skipped })
}

/// The reference's values of `wanted`, from a run of only the nodes they are computed from: the
/// chain run alone ends at the first divergent layer, often far from the outputs, and nothing
/// after it is read. Every tensor that part computes and a later node reads (or a model output) is
/// a graph output of the part, as `wanted` is: ONNX Runtime fuses no node across a tensor it must
/// return, as it fuses none across one that a node outside the pattern reads in the whole graph,
/// so the part computes what the whole model computes. The whole model runs where the part is all
/// of it or holds a node with a subgraph.
fn reference_values(job: &mut Job, feeds: &[(String, Tensor)], wanted: &[String]) -> Result<HashMap<String, Tensor>> {
    let index = &job.index;
    let mut part = vec![false; index.nodes.len()];
    let mut stack: Vec<usize> = wanted.iter().filter_map(|t| index.producer_index(t)).collect();
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut part[i], true) {
            continue;
        }
        stack.extend(index.nodes[i].all_inputs().filter_map(|t| index.producer_index(t)));
    }
    let in_part = part.iter().filter(|&&p| p).count();
    if in_part == index.nodes.len() || index.nodes.iter().zip(&part).any(|(n, &p)| p && n.has_subgraphs) {
        return Ok(job.run_reference(feeds, &Selection::Names(wanted.to_vec()))?.tensors);
    }
    let started = std::time::Instant::now();
    let graph = job.model.graph();
    let mut boundary: Vec<String> = Vec::new();
    for node in index.nodes.iter().zip(&part).filter(|(_, &p)| p).map(|(n, _)| n) {
        for t in node.outputs.iter().filter(|t| !t.is_empty()) {
            if index.outputs.contains(t) || index.consumers(t).iter().any(|&c| !part[c]) {
                boundary.push(t.clone());
            }
        }
    }
    let kept: std::collections::HashSet<usize> =
        index.nodes.iter().zip(&part).filter(|(_, &p)| p).map(|(n, _)| n.proto_index).collect();
    let read: std::collections::HashSet<&str> = index
        .nodes
        .iter()
        .zip(&part)
        .filter(|(_, &p)| p)
        .flat_map(|(n, _)| n.all_inputs().map(String::as_str))
        .collect();
    let made: std::collections::HashSet<&str> = index
        .nodes
        .iter()
        .zip(&part)
        .filter(|(_, &p)| p)
        .flat_map(|(n, _)| n.outputs.iter().map(String::as_str))
        .collect();
    // The model's own outputs in the part keep their declared types; the rest carry a name only,
    // as `expose` adds them.
    let mut output: Vec<layerwise_model::onnx::ValueInfoProto> =
        graph.output.iter().filter(|v| made.contains(v.name())).cloned().collect();
    let mut listed: std::collections::HashSet<String> = output.iter().map(|v| v.name().to_string()).collect();
    for t in boundary {
        if listed.insert(t.clone()) {
            output.push(layerwise_model::onnx::ValueInfoProto { name: Some(t), ..Default::default() });
        }
    }
    let part_graph = layerwise_model::onnx::GraphProto {
        node: graph.node.iter().enumerate().filter(|(k, _)| kept.contains(k)).map(|(_, n)| n.clone()).collect(),
        initializer: graph.initializer.iter().filter(|w| read.contains(w.name())).cloned().collect(),
        sparse_initializer: graph
            .sparse_initializer
            .iter()
            .filter(|w| w.values.as_ref().is_some_and(|v| read.contains(v.name())))
            .cloned()
            .collect(),
        input: graph
            .input
            .iter()
            .filter(|v| !index.is_initializer(v.name()) || read.contains(v.name()))
            .cloned()
            .collect(),
        value_info: graph.value_info.iter().filter(|v| made.contains(v.name())).cloned().collect(),
        output,
        name: graph.name.clone(),
        doc_string: graph.doc_string.clone(),
        quantization_annotation: graph.quantization_annotation.clone(),
        metadata_props: graph.metadata_props.clone(),
    };
    let proto = &job.model.proto;
    let part_proto = layerwise_model::onnx::ModelProto {
        ir_version: proto.ir_version,
        opset_import: proto.opset_import.clone(),
        producer_name: proto.producer_name.clone(),
        producer_version: proto.producer_version.clone(),
        domain: proto.domain.clone(),
        model_version: proto.model_version,
        doc_string: proto.doc_string.clone(),
        graph: Some(part_graph),
        metadata_props: proto.metadata_props.clone(),
        training_info: proto.training_info.clone(),
        functions: proto.functions.clone(),
        ..Default::default()
    };
    let part_model = job.model.derived(part_proto, "isolation-reference.onnx");
    let part_index = GraphIndex::build(part_model.graph())?;
    super::steps::timing(&format!("isolation: reference part of {in_part} of {} nodes", index.nodes.len()), started);
    let request = RunRequest {
        model: &part_model,
        index: &part_index,
        inputs: feeds,
        selection: &Selection::Names(wanted.to_vec()),
    };
    let mut out = job.reference.run(&request).with_context(|| format!("reference {}", job.options.reference))?;
    layerwise_analysis::add_passed_through(job.model.graph(), &job.index, feeds, &mut out.tensors);
    Ok(out.tensors)
}
