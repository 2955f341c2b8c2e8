//! A minimal reproduction for a bug report or a unit test: the first divergent layer (or the
//! smallest subgraph upstream of it that still shows the error on the candidate) as a standalone
//! model, with the reference's input values and both sides' outputs, in ONNX's backend-test
//! layout.

use std::io::Write as _;

use layerwise_analysis::Repro;

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use layerwise_analysis::Verdict;
use layerwise_model::extract::{extract_groups_pulling, TensorType};
use layerwise_model::{GraphIndex, Model, Selection};
use layerwise_runtime::{tensor_types, RunRequest, Tensor};

use super::compare::Job;

/// Levels of upstream producers tried around the first divergent node, and most nodes in a repro.
const MOST_LEVELS: usize = 3;
const MOST_NODES: usize = 32;

/// Writes the repro for `verdict` into `dir`, or says why none was written.
pub(super) fn write_repro(job: &mut Job, feeds: &[(String, Tensor)], verdict: &Verdict, dir: &Path) -> Result<Repro> {
    let not_written = |why: String| {
        Ok(Repro { folder: None, nodes: Vec::new(), reproduces: false, candidate_error: None, note: why })
    };
    let Some(fd) = verdict.first_divergent.clone() else {
        return not_written("no first divergent layer was named, so there is no layer to reproduce".into());
    };
    if job.cand_model.as_ref().is_some_and(|(_, ci)| ci.node(&fd.node).is_none()) {
        return not_written(format!("node '{}' has another name in the candidate model", fd.node));
    }
    if job.options.candidate.is_saved() {
        return not_written("a saved candidate cannot run a new model".into());
    }
    // Growing sets: the node with the nodes its cause needs (the Add that puts an epsilon FP16
    // flushes under a Log: the cause names the Add's constant, and a repro of the Log alone showed
    // another cause), then its upstream producers level by level.
    let fp16 = job.judging.precision() == layerwise_runtime::Precision::Fp16;
    let mut first = vec![fd.node.clone()];
    for n in layerwise_analysis::cause_nodes(&job.index, &fd, fp16) {
        let usable = job.index.node(&n).is_some_and(|i| !i.has_subgraphs)
            && job.cand_model.as_ref().is_none_or(|(_, ci)| ci.node(&n).is_some());
        if usable && !first.contains(&n) {
            first.push(n);
        }
    }
    // In graph order.
    first.sort_by_key(|n| job.index.node(n).map_or(usize::MAX, |i| i.topo_index));
    let mut sets: Vec<Vec<String>> = vec![first];
    for _ in 0..MOST_LEVELS {
        let last = sets.last().expect("one set").clone();
        let mut next = last.clone();
        for name in &last {
            let node = job.index.node(name).expect("a node of the model");
            for t in node.inputs.iter().filter(|t| !t.is_empty() && !job.index.is_constant_like(t)) {
                if let Some(p) = job.index.producer(t) {
                    if !p.has_subgraphs && !next.contains(&p.name) {
                        next.push(p.name.clone());
                    }
                }
            }
        }
        if next.len() == last.len() || next.len() > MOST_NODES {
            break;
        }
        sets.push(next);
    }
    // Reference values of everything the largest set reads and writes.
    let largest = sets.last().expect("one set");
    let mut wanted: Vec<String> = Vec::new();
    for name in largest {
        let node = job.index.node(name).expect("checked");
        wanted.extend(
            node.inputs
                .iter()
                .chain(&node.outputs)
                .filter(|t| !t.is_empty() && job.index.producer_index(t).is_some())
                .cloned(),
        );
    }
    // A quantized candidate's nodes come with their own quantizers (as isolation runs them), fed
    // the reference's value of what each quantizes: the candidate's names read through the matching.
    let reference_of = job.reference_names();
    let quantized = job.judging.quantization.is_some() && job.cand_model.is_some();
    wanted.extend(job.quantized_reference_tensors(&reference_of));
    wanted.sort();
    wanted.dedup();
    let reference = job.run_reference(feeds, &Selection::Names(wanted))?.tensors;
    let graph_inputs: HashMap<&str, &Tensor> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let value = |t: &str| {
        let t = reference_of.get(t).map_or(t, String::as_str);
        reference.get(t).or_else(|| graph_inputs.get(t).copied())
    };
    let cand_types = match &job.cand_model {
        Some((cm, ci)) => {
            Some(tensor_types(cm, ci, &feeds.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect::<Vec<_>>())?)
        }
        None => None,
    };
    let type_of = |t: &str, candidate: bool| -> Option<TensorType> {
        let v = value(t)?;
        let dtype = if candidate {
            cand_types.as_ref().and_then(|ct| ct.get(t)).and_then(|ty| ty.dtype).unwrap_or(v.dtype())
        } else {
            v.dtype()
        };
        Some(TensorType { elem: layerwise_model::DataType::try_from(dtype.onnx()).ok()?, dims: v.shape.clone() })
    };

    let quantizer = |t: &str| {
        job.cand_model.as_ref().is_some_and(|(_, ci)| {
            ci.producer(t).is_some_and(|p| p.op_type == "QuantizeLinear" || p.op_type == "DequantizeLinear")
        })
    };
    // The candidate's twin of the compared tensor (a quantized candidate's may be renamed).
    // The candidate's own output of the node, at the reference output's position: a quantized
    // candidate's twin is its output quantizer's, which the part does not hold.
    let twin = job.cand_names.get(&fd.tensor).cloned().unwrap_or_else(|| fd.tensor.clone());
    let own_output = job.cand_model.as_ref().and_then(|(_, ci)| {
        let position = job.index.node(&fd.node)?.outputs.iter().position(|o| o == &fd.tensor)?;
        ci.node(&fd.node)?.outputs.get(position).cloned()
    });
    let mut tried = None;
    let mut failure = None;
    for set in &sets {
        let made = extract_one(job.model, &job.index, set, &|t| type_of(t, false), &|_| false)?;
        let cand_made = match &job.cand_model {
            Some((cm, ci)) => match extract_one(cm, ci, set, &|t| type_of(t, true), &|t| quantized && quantizer(t)) {
                Ok(m) => Some(m),
                // The repro is an extra: a part that cannot stand alone is said, the verdict stays.
                Err(e) => {
                    failure = Some(format!("the candidate's part could not be extracted: {e:#}"));
                    continue;
                }
            },
            None => None,
        };
        // The repro's one inputs.npz feeds both models: the candidate's part must read the
        // reference part's inputs.
        if let Some((_, cand_inputs, _)) = &cand_made {
            if let Some(other) = cand_inputs.iter().find(|n| !made.1.contains(n)) {
                failure = Some(format!("the candidate's part reads '{other}', which the reference's part does not"));
                continue;
            }
        }
        let inputs: Vec<(String, Tensor)> = made
            .1
            .iter()
            .map(|name| {
                value(name)
                    .cloned()
                    .map(|v| (name.clone(), v))
                    .ok_or_else(|| anyhow::anyhow!("no reference value for '{name}'"))
            })
            .collect::<Result<_>>()?;
        let ref_out = job.reference.run(&RunRequest {
            model: &made.0,
            index: &GraphIndex::build(made.0.graph())?,
            inputs: &inputs,
            selection: &Selection::All,
        })?;
        let (cand_model, cand_index) = match &cand_made {
            Some((m, _, _)) => (m, GraphIndex::build(m.graph())?),
            None => (&made.0, GraphIndex::build(made.0.graph())?),
        };
        job.candidate.keep_fp32(&[]);
        let cand_out = match job.candidate.run(&RunRequest {
            model: cand_model,
            index: &cand_index,
            inputs: &inputs,
            selection: &Selection::All,
        }) {
            Ok(out) => out,
            Err(e) => {
                failure = Some(format!("the candidate could not run its part: {e}"));
                continue;
            }
        };
        let (Some(r), Some(c)) = (
            ref_out.tensors.get(&fd.tensor),
            cand_out
                .tensors
                .get(&twin)
                .or_else(|| own_output.as_ref().and_then(|o| cand_out.tensors.get(o)))
                .or_else(|| cand_out.tensors.get(&fd.tensor)),
        ) else {
            continue;
        };
        if r.shape != c.shape {
            continue;
        }
        let metrics = layerwise_analysis::compute(
            &r.to_f32(),
            &c.to_f32(),
            job.judging.tolerances.judging(&fd.tensor, r.dtype()),
        );
        let reproduces = !metrics.passes();
        let done = reproduces || set.len() == largest.len();
        tried = Some((
            set.clone(),
            made,
            cand_made,
            inputs,
            ref_out.tensors,
            cand_out.tensors,
            metrics.error_level(),
            reproduces,
        ));
        if done {
            break;
        }
    }
    let Some((nodes, (model, _, output_names), cand_made, inputs, ref_out, cand_out, error, reproduces)) = tried else {
        return not_written(match failure {
            Some(why) => format!("node '{}' could not be run on its own: {why}", fd.node),
            None => format!("node '{}' could not be run on its own", fd.node),
        });
    };

    // Written into a fresh sibling folder, renamed into place once complete.
    let staging = layerwise_model::scratch::StagedDir::beside(dir, ".layerwise-repro-")
        .with_context(|| format!("--repro {}", dir.display()))?;
    let root = staging.path();
    model.save_standalone(&model.proto, &root.join("model.onnx"))?;
    if let Some((cm, _, _)) = &cand_made {
        cm.save_standalone(&cm.proto, &root.join("candidate_model.onnx"))?;
    }
    let data = root.join("test_data_set_0");
    std::fs::create_dir_all(&data)?;
    let candidate_dir = root.join("candidate_outputs");
    std::fs::create_dir_all(&candidate_dir)?;
    use prost::Message;
    for (i, (name, t)) in inputs.iter().enumerate() {
        std::fs::write(data.join(format!("input_{i}.pb")), t.to_proto(name).encode_to_vec())?;
    }
    for (i, name) in output_names.iter().enumerate() {
        if let Some(t) = ref_out.get(name) {
            std::fs::write(data.join(format!("output_{i}.pb")), t.to_proto(name).encode_to_vec())?;
        }
        if let Some(t) = cand_out.get(name) {
            std::fs::write(candidate_dir.join(format!("output_{i}.pb")), t.to_proto(name).encode_to_vec())?;
        }
    }
    let npz: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    layerwise_runtime::npy::write_npz(&root.join("inputs.npz"), &npz)?;
    let cand_model_arg = if cand_made.is_some() { " --cand-model candidate_model.onnx" } else { "" };
    // Names and messages are Markdown text or code spans here, never markup (docs/security.md).
    use layerwise_report::escape::{markdown_code, markdown_text, shell_word};
    let mut readme = std::fs::File::create(root.join("README.md"))?;
    writeln!(readme, "# layerwise repro: {} ({})\n", markdown_text(&fd.node), markdown_text(&fd.op_type))?;
    writeln!(readme, "Cause named by `layerwise bisect`: {}.\n", markdown_text(&fd.cause.best.detail))?;
    writeln!(
        readme,
        "`model.onnx` holds {} node(s) of {} ({}); its inputs are the reference's values in the full model.",
        nodes.len(),
        markdown_code(&job.model.path.display().to_string()),
        markdown_text(&nodes.join(", "))
    )?;
    writeln!(
        readme,
        "`test_data_set_0/` has them as `input_N.pb` and the reference's ({}) outputs as `output_N.pb`, in ONNX's backend-test layout; `candidate_outputs/output_N.pb` are the candidate's ({}).\n",
        markdown_text(&job.options.reference.to_string()),
        markdown_text(&job.options.candidate.to_string())
    )?;
    if reproduces {
        writeln!(
            readme,
            "The candidate's {} differs from the reference's here too: relative L2 {}.\n",
            markdown_code(&fd.tensor),
            layerwise_report::format_number(error)
        )?;
    } else {
        writeln!(readme, "On its own (with up to {} levels of upstream nodes) the candidate's {} is within tolerance (relative L2 {}): the error needs more of the model around it.\n", MOST_LEVELS, markdown_code(&fd.tensor), layerwise_report::format_number(error))?;
    }
    // The backends as the user named them, each one shell word; one no pasted line can hold
    // (control characters) leaves the command out.
    // sim:int8/sim:fp8 quantized the model in memory: the written candidate model is that Q/DQ
    // model, run as its emulation runs it.
    let candidate_spec = match &job.options.candidate {
        layerwise_runtime::BackendSpec::Quantized { fp8: true, .. } => "ort:cpu,opt=basic".to_string(),
        layerwise_runtime::BackendSpec::Quantized { fp8: false, .. } => "ort:cpu".to_string(),
        other => other.to_string(),
    };
    // The tolerance that judged the tensor, given for every tensor: the repro's verdict is then
    // the bisect's (at the defaults, a repro said within tolerance could diverge).
    let judged = job.judging.tolerances.of(&fd.tensor);
    let tolerance = format!(" --atol {:e} --rtol {:e} --range-tol {:e}", judged.atol, judged.rtol, judged.range_tol);
    match (shell_word(&job.options.reference.to_string()), shell_word(&candidate_spec)) {
        (Some(reference), Some(candidate)) => {
            writeln!(readme, "Reproduce: {}", markdown_code(&format!("layerwise bisect model.onnx --ref {reference} --cand {candidate}{cand_model_arg} --inputs inputs.npz{tolerance}")))?
        }
        _ => writeln!(readme, "Reproduce: {} with the --ref and --cand named above", markdown_code(&format!("layerwise bisect model.onnx --inputs inputs.npz{tolerance}")))?,
    }
    drop(readme);
    staging.move_to(dir).with_context(|| format!("--repro {}", dir.display()))?;
    Ok(Repro {
        folder: Some(dir.display().to_string()),
        nodes,
        reproduces,
        candidate_error: Some(error),
        note: String::new(),
    })
}

/// `set` of `model` as a model of its own, with the extraction's renaming undone (one group: no
/// name can collide). Returns the model, its input names and its output names.
fn extract_one(
    model: &Model,
    index: &GraphIndex,
    set: &[String],
    types: &dyn Fn(&str) -> Option<TensorType>,
    also_pull: &dyn Fn(&str) -> bool,
) -> Result<(Model, Vec<String>, Vec<String>)> {
    let extraction =
        extract_groups_pulling(model, index, &[set.to_vec()], types, &|t| index.is_constant_like(t) || also_pull(t))?;
    let mut proto = extraction.proto;
    let suffix = "__lw_g0";
    let plain = |s: &mut String| {
        if let Some(p) = s.strip_suffix(suffix) {
            *s = p.to_string();
        }
    };
    if let Some(g) = proto.graph.as_mut() {
        for n in g.node.iter_mut() {
            n.input.iter_mut().chain(n.output.iter_mut()).for_each(plain);
            if let Some(name) = n.name.as_mut() {
                plain(name);
            }
        }
        for v in g.input.iter_mut().chain(g.output.iter_mut()) {
            if let Some(name) = v.name.as_mut() {
                plain(name);
            }
        }
    }
    let group = &extraction.groups[0];
    let strip = |s: &String| s.strip_suffix(suffix).unwrap_or(s).to_string();
    let inputs = group.inputs.iter().map(|(l, _)| strip(l)).collect();
    let outputs = group.outputs.iter().map(|(l, _)| strip(l)).collect();
    Ok((model.derived(proto, "repro.onnx"), inputs, outputs))
}
