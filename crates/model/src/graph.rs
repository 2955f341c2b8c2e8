use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::onnx::{GraphProto, NodeProto};
use crate::ModelError;

/// One node of the main graph, with the name layerwise uses for it everywhere.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The node's own name when it is non-empty and unique, otherwise a stable synthetic name
    /// `OpType#i` (`i` = position in the model file), so reports never show an empty name.
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// Position of the node in the model file.
    pub proto_index: usize,
    /// Position in the topological order (index into [`GraphIndex::nodes`]).
    pub topo_index: usize,
    pub has_subgraphs: bool,
    /// Main-graph tensors that the node's bodies (If/Loop/Scan) read from the outer scope: data
    /// inputs as real as `inputs`, though not listed there.
    pub outer_inputs: Vec<String>,
}

impl NodeInfo {
    /// Every tensor the node reads: its inputs, then what its bodies read from the outer scope.
    pub fn all_inputs(&self) -> impl Iterator<Item = &String> {
        self.inputs.iter().chain(&self.outer_inputs).filter(|t| !t.is_empty())
    }
}

/// Topological order, producers and consumers of the main graph.
#[derive(Debug, Clone)]
pub struct GraphIndex {
    /// Nodes in a stable topological order (file order among independent nodes).
    pub nodes: Vec<NodeInfo>,
    /// Graph inputs that are not initializers (the values a user feeds).
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    producer: HashMap<String, usize>,
    consumers: HashMap<String, Vec<usize>>,
    initializers: HashSet<String>,
    constant_like: HashSet<String>,
    subgraph_tensors: HashMap<String, String>,
}

/// Ops whose output is not a function of their inputs: never treated as constants.
const NONDETERMINISTIC: &[&str] =
    &["RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"];

impl GraphIndex {
    /// Indexes a main graph, rejecting graphs that no runtime could execute: a tensor produced twice,
    /// a node input that nothing provides, a graph output that nothing provides, or a cycle.
    pub fn build(graph: &GraphProto) -> Result<GraphIndex, ModelError> {
        let initializers: HashSet<String> = graph.initializer.iter().map(|t| t.name().to_string()).collect();
        let inputs: Vec<String> =
            graph.input.iter().map(|v| v.name().to_string()).filter(|n| !initializers.contains(n)).collect();
        let outputs: Vec<String> = graph.output.iter().map(|v| v.name().to_string()).collect();
        let names = node_names(&graph.node);

        let mut producer_by_proto: HashMap<String, usize> = HashMap::new();
        for (i, node) in graph.node.iter().enumerate() {
            for out in node.output.iter().filter(|o| !o.is_empty()) {
                if let Some(prev) = producer_by_proto.insert(out.clone(), i) {
                    return Err(ModelError::InvalidGraph(format!(
                        "tensor '{out}' is produced by two nodes, '{}' and '{}'",
                        names[prev], names[i]
                    )));
                }
                if initializers.contains(out) || inputs.contains(out) {
                    return Err(ModelError::InvalidGraph(format!(
                        "tensor '{out}' is both a graph input or initializer and an output of node '{}'",
                        names[i]
                    )));
                }
            }
        }

        // Dependencies: direct inputs plus outer-scope tensors that subgraphs read.
        let mut deps: Vec<Vec<usize>> = Vec::with_capacity(graph.node.len());
        for (i, node) in graph.node.iter().enumerate() {
            let mut d = Vec::new();
            for inp in node.input.iter().filter(|s| !s.is_empty()) {
                match producer_by_proto.get(inp) {
                    Some(&p) => d.push(p),
                    None if initializers.contains(inp) || inputs.contains(inp) => {}
                    None => {
                        return Err(ModelError::InvalidGraph(format!(
                            "node '{}' ({}) reads tensor '{inp}', which no node, graph input or initializer provides",
                            names[i],
                            node.op_type()
                        )))
                    }
                }
            }
            let mut outer = HashSet::new();
            for attr in &node.attribute {
                for g in attr.g.iter().chain(attr.graphs.iter()) {
                    collect_outer_refs(g, &mut outer);
                }
            }
            d.extend(outer.iter().filter_map(|t| producer_by_proto.get(t)).copied());
            d.sort_unstable();
            d.dedup();
            deps.push(d);
        }
        for out in &outputs {
            if !producer_by_proto.contains_key(out) && !initializers.contains(out) && !inputs.contains(out) {
                return Err(ModelError::InvalidGraph(format!("graph output '{out}' is not produced by any node")));
            }
        }

        let order = topological_order(&deps).map_err(|stuck| {
            let names: Vec<&str> = stuck.iter().take(5).map(|&i| names[i].as_str()).collect();
            ModelError::InvalidGraph(format!("the graph has a cycle; nodes involved include {}", names.join(", ")))
        })?;

        let mut nodes = Vec::with_capacity(order.len());
        for (topo_index, &i) in order.iter().enumerate() {
            let node = &graph.node[i];
            nodes.push(NodeInfo {
                name: names[i].clone(),
                op_type: node.op_type().to_string(),
                domain: node.domain().to_string(),
                inputs: node.input.clone(),
                outputs: node.output.clone(),
                proto_index: i,
                topo_index,
                has_subgraphs: node.attribute.iter().any(|a| a.g.is_some() || !a.graphs.is_empty()),
                outer_inputs: outer_refs_of(node)
                    .into_iter()
                    .filter(|t| producer_by_proto.contains_key(t) || initializers.contains(t) || inputs.contains(t))
                    .collect(),
            });
        }
        let mut producer = HashMap::new();
        let mut consumers: HashMap<String, Vec<usize>> = HashMap::new();
        for n in &nodes {
            for o in n.outputs.iter().filter(|o| !o.is_empty()) {
                producer.insert(o.clone(), n.topo_index);
            }
            for inp in n.inputs.iter().filter(|s| !s.is_empty()) {
                let list = consumers.entry(inp.clone()).or_default();
                if list.last() != Some(&n.topo_index) {
                    list.push(n.topo_index);
                }
            }
        }

        let mut constant_like = initializers.clone();
        for n in &nodes {
            let data_inputs: Vec<&String> = n.inputs.iter().filter(|s| !s.is_empty()).collect();
            let constant = if n.op_type == "Constant" {
                true
            } else {
                !data_inputs.is_empty()
                    && !n.has_subgraphs
                    && !NONDETERMINISTIC.contains(&n.op_type.as_str())
                    && data_inputs.iter().all(|i| constant_like.contains(*i))
            };
            if constant {
                constant_like.extend(n.outputs.iter().filter(|o| !o.is_empty()).cloned());
            }
        }

        let mut subgraph_tensors = HashMap::new();
        for n in nodes.iter().filter(|n| n.has_subgraphs) {
            for attr in &graph.node[n.proto_index].attribute {
                for g in attr.g.iter().chain(attr.graphs.iter()) {
                    collect_produced(g, &mut |t| {
                        subgraph_tensors.entry(t.to_string()).or_insert_with(|| n.name.clone());
                    });
                }
            }
        }

        Ok(GraphIndex { nodes, inputs, outputs, producer, consumers, initializers, constant_like, subgraph_tensors })
    }

    /// Topological index of the node producing `tensor`.
    pub fn producer_index(&self, tensor: &str) -> Option<usize> {
        self.producer.get(tensor).copied()
    }

    pub fn producer(&self, tensor: &str) -> Option<&NodeInfo> {
        self.producer_index(tensor).map(|i| &self.nodes[i])
    }

    /// Topological indices of the nodes reading `tensor`.
    pub fn consumers(&self, tensor: &str) -> &[usize] {
        self.consumers.get(tensor).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Topological indices of the nodes reading any output of node `node`.
    pub fn node_consumers(&self, node: usize) -> Vec<usize> {
        self.nodes[node].outputs.iter().flat_map(|t| self.consumers(t).iter().copied()).collect()
    }

    /// The first reader of node `node`'s outputs whose op type is `op`.
    pub fn consumer_of_type(&self, node: usize, op: &str) -> Option<usize> {
        self.node_consumers(node).into_iter().find(|&c| self.nodes[c].op_type == op)
    }

    /// The only reader of node `node`'s outputs, where its op type is `op`.
    pub fn sole_consumer_of_type(&self, node: usize, op: &str) -> Option<usize> {
        match self.node_consumers(node).as_slice() {
            [only] if self.nodes[*only].op_type == op => Some(*only),
            _ => None,
        }
    }

    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.name == name)
    }

    pub fn is_initializer(&self, tensor: &str) -> bool {
        self.initializers.contains(tensor)
    }

    pub fn is_graph_input(&self, tensor: &str) -> bool {
        self.inputs.iter().any(|i| i == tensor)
    }

    /// Weights and anything computed from weights alone (Constant nodes, Cast/Reshape of an
    /// initializer, ...). These are not layers: error in them is a property of the weights.
    pub fn is_constant_like(&self, tensor: &str) -> bool {
        self.constant_like.contains(tensor)
    }

    /// A value stored in the file: an initializer or a Constant node's output. Neither is a layer:
    /// it computes nothing, and an error in it (a value beyond the candidate's range) is the cause
    /// of the node that reads it, not a step of the walk.
    pub fn is_stored_value(&self, tensor: &str) -> bool {
        self.is_initializer(tensor)
            || self
                .producer(tensor)
                .is_some_and(|n| n.op_type == "Constant" && (n.domain.is_empty() || n.domain == "ai.onnx"))
    }

    /// The stored value of `tensor` in `graph` (the graph this index was built from): its
    /// initializer, else the `value` tensor of the Constant node computing it (PaddlePaddle's
    /// exports keep Clip bounds and BatchNorm parameters there).
    pub fn stored_tensor<'g>(&self, graph: &'g GraphProto, tensor: &str) -> Option<&'g crate::onnx::TensorProto> {
        if self.is_initializer(tensor) {
            return graph.initializer.iter().find(|w| w.name() == tensor);
        }
        let producer = self.producer(tensor).filter(|n| n.op_type == "Constant" && n.domain.is_empty())?;
        graph.node.get(producer.proto_index)?.attribute.iter().find(|a| a.name() == "value").and_then(|a| a.t.as_ref())
    }

    /// For a tensor produced inside an If/Loop/Scan body, the main-graph node that owns the body.
    pub fn subgraph_owner(&self, tensor: &str) -> Option<&str> {
        self.subgraph_tensors.get(tensor).map(String::as_str)
    }

    /// Every tensor computed by a main-graph node, in topological order.
    pub fn computed_tensors(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().flat_map(|n| n.outputs.iter()).filter(|o| !o.is_empty()).map(String::as_str)
    }

    /// Sorted names of tensors produced inside subgraphs, with their owning node.
    pub fn subgraph_tensors(&self) -> Vec<(&str, &str)> {
        let mut v: Vec<(&str, &str)> = self.subgraph_tensors.iter().map(|(t, n)| (t.as_str(), n.as_str())).collect();
        v.sort();
        v
    }
}

/// Names for every node: its own if non-empty and unique, otherwise `OpType#i` (or `name#i` for a
/// duplicated name), where `i` is the node's position in the file.
pub(crate) fn node_names(nodes: &[NodeProto]) -> Vec<String> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for n in nodes {
        *count.entry(n.name()).or_default() += 1;
    }
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| match n.name() {
            "" => format!("{}#{i}", n.op_type()),
            name if count[name] > 1 => format!("{name}#{i}"),
            name => name.to_string(),
        })
        .collect()
}

/// Kahn's algorithm, taking ready nodes in file order so the result is stable. On a cycle, returns
/// the nodes that could not be ordered.
fn topological_order(deps: &[Vec<usize>]) -> Result<Vec<usize>, Vec<usize>> {
    let n = deps.len();
    let mut remaining: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, d) in deps.iter().enumerate() {
        for &p in d {
            users[p].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..n).filter(|&i| remaining[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &u in &users[i] {
            remaining[u] -= 1;
            if remaining[u] == 0 {
                ready.push(Reverse(u));
            }
        }
    }
    if order.len() == n {
        Ok(order)
    } else {
        Err((0..n).filter(|&i| remaining[i] > 0).collect())
    }
}

/// Tensors a subgraph reads that it does not define itself (outer-scope references).
pub(crate) fn collect_outer_refs(graph: &GraphProto, out: &mut HashSet<String>) {
    let mut defined: HashSet<&str> = graph.input.iter().map(|v| v.name()).collect();
    defined.extend(graph.initializer.iter().map(|t| t.name()));
    for n in &graph.node {
        defined.extend(n.output.iter().map(String::as_str));
    }
    for n in &graph.node {
        for i in n.input.iter().filter(|i| !i.is_empty() && !defined.contains(i.as_str())) {
            out.insert(i.clone());
        }
        for attr in &n.attribute {
            for g in attr.g.iter().chain(attr.graphs.iter()) {
                let mut inner = HashSet::new();
                collect_outer_refs(g, &mut inner);
                out.extend(inner.into_iter().filter(|t| !defined.contains(t.as_str())));
            }
        }
    }
    for o in graph.output.iter().map(|v| v.name()).filter(|o| !defined.contains(o)) {
        out.insert(o.to_string());
    }
}

/// The outer-scope tensors that a body (and its nested bodies) reads, sorted.
pub(crate) fn outer_refs_of_graph(graph: &GraphProto) -> Vec<String> {
    let mut outer = HashSet::new();
    collect_outer_refs(graph, &mut outer);
    let mut v: Vec<String> = outer.into_iter().collect();
    v.sort();
    v
}

/// The outer-scope tensors that a node's bodies (If/Loop/Scan) read, sorted.
pub(crate) fn outer_refs_of(node: &NodeProto) -> Vec<String> {
    let mut outer = HashSet::new();
    for attr in &node.attribute {
        for g in attr.g.iter().chain(attr.graphs.iter()) {
            collect_outer_refs(g, &mut outer);
        }
    }
    let mut v: Vec<String> = outer.into_iter().collect();
    v.sort();
    v
}

/// Renames the outer-scope tensor `from` to `to` wherever a body (and its nested bodies) reads it,
/// leaving alone bodies that define a tensor of that name themselves (shadowing).
pub(crate) fn rename_outer_ref(graph: &mut GraphProto, from: &str, to: &str) {
    let shadowed = graph.input.iter().any(|v| v.name() == from)
        || graph.initializer.iter().any(|t| t.name() == from)
        || graph.node.iter().any(|n| n.output.iter().any(|o| o == from));
    if shadowed {
        return;
    }
    for n in graph.node.iter_mut() {
        for i in n.input.iter_mut().filter(|i| *i == from) {
            *i = to.to_string();
        }
        for attr in n.attribute.iter_mut() {
            for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()) {
                rename_outer_ref(g, from, to);
            }
        }
    }
    // A body output may be an outer tensor passed through unchanged.
    for o in graph.output.iter_mut().filter(|o| o.name() == from) {
        o.name = Some(to.to_string());
    }
}

pub(crate) fn collect_produced(graph: &GraphProto, f: &mut dyn FnMut(&str)) {
    for n in &graph.node {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            f(o);
        }
        for attr in &n.attribute {
            for g in attr.g.iter().chain(attr.graphs.iter()) {
                collect_produced(g, f);
            }
        }
    }
}

/// Names for what a rewrite adds, each unused in the graph: a model may hold a tensor of that name
/// already (an exporter's `val_251_scale`), which the new one would shadow. Where the plain name
/// is taken, `_1`, `_2`, ... follow it. Every name the graph defines or reads counts as taken.
pub struct FreshNames {
    taken: HashSet<String>,
}

impl FreshNames {
    pub fn of(graph: &GraphProto) -> FreshNames {
        let mut taken: HashSet<String> = HashSet::new();
        taken.extend(graph.initializer.iter().map(|t| t.name().to_string()));
        taken.extend(graph.input.iter().chain(&graph.output).chain(&graph.value_info).map(|v| v.name().to_string()));
        for n in &graph.node {
            taken.extend(n.input.iter().chain(&n.output).cloned());
            taken.insert(n.name().to_string());
        }
        FreshNames { taken }
    }

    /// `base`, or `base_k` with the least k that is free; taken from then on.
    pub fn fresh(&mut self, base: &str) -> String {
        if self.taken.insert(base.to_string()) {
            return base.to_string();
        }
        (1..).map(|k| format!("{base}_{k}")).find(|n| self.taken.insert(n.clone())).expect("some suffix is free")
    }
}
