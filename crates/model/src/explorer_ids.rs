//! The node ids Google's Model Explorer gives an ONNX model (its `model-explorer-onnx` adapter,
//! 0.4.2), so that layerwise's per-node data attaches to the graph it draws.
//!
//! The adapter names nodes with onnx_ir's `NameFixPass`: a node keeps its name when no earlier
//! node of the same graph has it; an unnamed node becomes `node`, and a taken name becomes
//! `NAME_k` (`node_k` for unnamed ones) with one counter per base name shared by all graphs;
//! graphs are walked node by node, each node's subgraphs right after it. Then `EmbedIfPass`
//! moves If branches into the graph, renaming their nodes `IF/then_branch/NODE`.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::onnx::{GraphProto, ModelProto};

/// layerwise's name of a node (main graph, or inside an inlined If branch as
/// `If/then/node`) -> the adapter's id, for every node whose two names differ.
pub fn explorer_ids(model: &ModelProto) -> BTreeMap<String, String> {
    let Some(graph) = &model.graph else { return BTreeMap::new() };
    let mut counter: HashMap<String, usize> = HashMap::new();
    let mut ids = BTreeMap::new();
    walk(graph, None, &mut counter, &mut ids);
    ids
}

/// `inside`: for a branch of an If, (layerwise's prefix `If/then`, the adapter's prefix
/// `If/then_branch`).
fn walk(
    graph: &GraphProto,
    inside: Option<(&str, &str)>,
    counter: &mut HashMap<String, usize>,
    ids: &mut BTreeMap<String, String>,
) {
    let mut used: HashSet<String> = HashSet::new();
    let ours = crate::graph::node_names(&graph.node);
    for (node, our) in graph.node.iter().zip(&ours) {
        let base = if node.name().is_empty() { "node".to_string() } else { node.name().to_string() };
        let mut fixed = base.clone();
        while used.contains(&fixed) {
            let k = counter.entry(base.clone()).or_default();
            *k += 1;
            fixed = format!("{base}_{k}");
        }
        used.insert(fixed.clone());
        let (our_full, their_full) = match inside {
            Some((our_prefix, their_prefix)) => (format!("{our_prefix}/{our}"), format!("{their_prefix}/{fixed}")),
            None => (our.clone(), fixed.clone()),
        };
        if our_full != their_full {
            ids.insert(our_full.clone(), their_full.clone());
        }
        // Inlined, an If hands its branch's outputs on through Identity nodes `If/outputK`; the
        // adapter merges them in one `IF_phi` node.
        if node.op_type() == "If" {
            for k in 0..node.output.len() {
                ids.insert(format!("{our_full}/output{k}"), format!("{their_full}_phi"));
            }
        }
        for attr in &node.attribute {
            let Some(body) = attr.g.as_ref() else { continue };
            let short = match (node.op_type(), attr.name()) {
                ("If", "then_branch") => "then",
                ("If", "else_branch") => "else",
                // Loop and Scan bodies stay subgraphs in the adapter; their nodes keep their own
                // (fixed) names there, and layerwise names them per iteration: not mapped.
                _ => {
                    walk_names_only(body, counter);
                    continue;
                }
            };
            let ours_prefix = format!("{our_full}/{short}");
            let theirs_prefix = format!("{their_full}/{}", attr.name());
            walk(body, Some((&ours_prefix, &theirs_prefix)), counter, ids);
        }
    }
}

/// Advances the shared counters through a graph whose ids are not mapped.
fn walk_names_only(graph: &GraphProto, counter: &mut HashMap<String, usize>) {
    let mut ignored = BTreeMap::new();
    walk(graph, Some(("", "")), counter, &mut ignored);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{attr, Dim, ModelBuilder};
    use crate::DataType;

    #[test]
    fn unnamed_duplicate_and_branch_nodes_get_the_adapters_ids() {
        let mut b = ModelBuilder::new("ids", 17);
        b.input("x", DataType::Float, &[Dim::from(4)]);
        b.input("c", DataType::Bool, &[]);
        b.node("Relu", "", &["x"], &["a"], vec![]);
        b.node("Relu", "", &["a"], &["b"], vec![]);
        b.node("Neg", "dup", &["b"], &["d1"], vec![]);
        b.node("Neg", "dup", &["d1"], &["d2"], vec![]);
        b.node("Abs", "named", &["d2"], &["e"], vec![]);
        let branch = |name: &str, out: &str| crate::onnx::GraphProto {
            name: Some(name.into()),
            node: vec![crate::onnx::NodeProto {
                op_type: Some("Identity".into()),
                input: vec!["e".into()],
                output: vec![out.into()],
                ..Default::default()
            }],
            output: vec![crate::onnx::ValueInfoProto { name: Some(out.into()), ..Default::default() }],
            ..Default::default()
        };
        b.node(
            "If",
            "gate",
            &["c"],
            &["y"],
            vec![attr::graph("then_branch", branch("t", "t_out")), attr::graph("else_branch", branch("e", "e_out"))],
        );
        b.output("y", DataType::Float);
        let ids = explorer_ids(&b.build());
        assert_eq!(ids.get("Relu#0").map(String::as_str), Some("node"));
        assert_eq!(ids.get("Relu#1").map(String::as_str), Some("node_1"));
        assert_eq!(ids.get("dup#2").map(String::as_str), Some("dup"));
        assert_eq!(ids.get("dup#3").map(String::as_str), Some("dup_1"));
        assert!(!ids.contains_key("named"), "unique names are their own ids");
        // Each branch is a graph of its own: its unnamed node is `node` there, with the shared
        // counter (node_2, then node_3), under the If's name and the attribute.
        assert_eq!(ids.get("gate/then/Identity#0").map(String::as_str), Some("gate/then_branch/node"));
        assert_eq!(ids.get("gate/else/Identity#0").map(String::as_str), Some("gate/else_branch/node"));
        assert_eq!(
            ids.get("gate/output0").map(String::as_str),
            Some("gate_phi"),
            "the branch's output hand-over is the adapter's Phi"
        );
    }
}
