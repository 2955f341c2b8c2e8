//! Search marking: find the first divergent layer with a few candidate runs, each marking only the
//! model's outputs and one or a few tensors, instead of one run marking every tensor.
//!
//! Marking every tensor changes what a compiler such as TensorRT fuses, so the engine under test is
//! not the one that failed. The search walks the *blame path*: from the worst output back to the
//! graph inputs, at each node into the data input computed by the longest chain of nodes (the
//! model's trunk). Along it, a tensor *diverges* when its error reaches the threshold `tau`
//! (the walk's drift ceiling, or half the output's error when that is smaller). Error grows
//! along a path, so a binary search finds the earliest diverged tensor in ceil(log2 L) runs for a
//! path of L tensors. Its producer is then judged by the walk's own rule; if one of its other
//! inputs diverges too, the error came in from that branch and the search continues there.

use std::collections::{HashMap, HashSet};

use layerwise_model::GraphIndex;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::compare::TensorRecord;
use crate::num::FiniteOrString;
use crate::verdict::WalkRule;

/// One candidate run of the search.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SearchRun {
    /// Tensors marked besides the model's outputs.
    pub marked: Vec<String>,
    /// `outputs` (the first run), `bisect` (a probe on the blame path) or `inputs` (the other
    /// inputs of the node the bisection settled on).
    pub purpose: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SearchResult {
    pub runs: Vec<SearchRun>,
    /// The divergence threshold used on the path (relative L2).
    #[serde(with = "crate::num::finite")]
    #[schemars(with = "FiniteOrString")]
    pub threshold: f64,
    /// The measured chain, worst output first, ending at the first divergent node's output.
    pub chain: Vec<String>,
    /// The node the search settled on, if the outputs diverge.
    pub node: Option<String>,
    /// Every record measured, of any run.
    #[serde(skip)]
    pub records: Vec<TensorRecord>,
    /// Tensors the candidate could not provide when marked (folded constants, fused away).
    pub unavailable: Vec<(String, String)>,
}

/// What one candidate run returns: records of the marked tensors and the model outputs, and the
/// marked tensors the backend could not provide, with the reason.
pub type Measured = (Vec<TensorRecord>, Vec<(String, String)>);

/// Runs the search. `measure(marked)` runs the candidate with `marked` (and the model outputs)
/// marked and compares them against the reference.
pub fn search_first_divergent<E>(
    index: &GraphIndex,
    rule: WalkRule,
    mut measure: impl FnMut(&[String]) -> Result<Measured, E>,
) -> Result<SearchResult, E> {
    let mut known: HashMap<String, TensorRecord> = HashMap::new();
    let mut runs = Vec::new();
    let mut unavailable: Vec<(String, String)> = Vec::new();
    let mut run = |marked: Vec<String>,
                   purpose: &'static str,
                   known: &mut HashMap<String, TensorRecord>,
                   unavailable: &mut Vec<(String, String)>|
     -> Result<(), E> {
        let (records, missing) = measure(&marked)?;
        runs.push(SearchRun { marked, purpose: purpose.to_string() });
        for r in records {
            known.insert(r.name.clone(), r);
        }
        unavailable.extend(missing);
        Ok(())
    };
    // The first run also marks the data inputs of the nodes producing the outputs: where branches
    // merge right at an output, that tells which branch carries the error at no extra run.
    let mut first: Vec<String> = index
        .outputs
        .iter()
        .filter_map(|o| index.producer(o))
        .flat_map(|n| n.all_inputs())
        .filter(|i| !index.is_constant_like(i) && index.producer_index(i).is_some() && !index.outputs.contains(i))
        .cloned()
        .collect();
    first.sort_by_key(|t| index.producer_index(t));
    first.dedup();
    run(first, "outputs", &mut known, &mut unavailable)?;

    let worst = index
        .outputs
        .iter()
        .filter_map(|o| known.get(o))
        .filter(|r| !r.pass)
        .max_by(|a, b| a.error_level().total_cmp(&b.error_level()).then(b.topo_index.cmp(&a.topo_index)))
        .map(|r| (r.name.clone(), r.error_level()));
    let Some((worst, worst_error)) = worst else {
        return Ok(finish(runs, f64::NAN, Vec::new(), None, known, unavailable));
    };
    let tau = rule.max_drift.min(worst_error / 2.0);
    let depth = depths(index);
    let diverged = |r: &TensorRecord| r.error_level() >= tau;

    // The chain of diverged tensors, output first; each new path starts at a diverged tensor.
    let mut chain: Vec<String> = Vec::new();
    let mut start = worst;
    let mut visited: HashSet<String> = HashSet::new();
    let mut unmeasurable: HashSet<String> = HashSet::new();
    loop {
        let node = index.producer(&start).expect("the blame path holds computed tensors only");
        let inputs = data_inputs(index, node);
        // With every data input of the producer measured, follow the one that diverges (the
        // error came in from there) or settle on the producer.
        if inputs.iter().all(|i| known.contains_key(i) || unmeasurable.contains(i)) {
            if chain.last() != Some(&start) {
                chain.push(start.clone());
            }
            visited.insert(start.clone());
            let next = inputs
                .iter()
                .filter_map(|i| known.get(i))
                .filter(|r| diverged(r) && !visited.contains(&r.name))
                .max_by(|a, b| a.error_level().total_cmp(&b.error_level()))
                .map(|r| r.name.clone());
            match next {
                Some(next) => {
                    start = next;
                    continue;
                }
                None => {
                    let node = node.name.clone();
                    return Ok(finish(runs, tau, chain, Some(node), known, unavailable));
                }
            }
        }
        let path = blame_path(index, &depth, &start);
        // path[lo] is diverged; path[hi] (or the graph inputs, at hi == len) is not.
        let (mut lo, mut hi) = (0usize, path.len());
        let mut dropped: HashSet<usize> = HashSet::new();
        while hi - lo > 1 {
            let mut mid = (lo + hi) / 2;
            // Skip positions the candidate cannot provide.
            while dropped.contains(&mid) && mid + 1 < hi {
                mid += 1;
            }
            if dropped.contains(&mid) {
                break;
            }
            if !known.contains_key(&path[mid]) {
                run(vec![path[mid].clone()], "bisect", &mut known, &mut unavailable)?;
            }
            match known.get(&path[mid]) {
                Some(r) if diverged(r) => lo = mid,
                Some(_) => hi = mid,
                None => {
                    dropped.insert(mid);
                }
            }
        }
        for t in &path[..lo] {
            if known.contains_key(t) && chain.last() != Some(t) {
                chain.push(t.clone());
            }
        }
        start = path[lo].clone();
        // Its producer's data inputs not yet known, measured in one run; the top of the loop
        // then follows or settles.
        let settled = index.producer(&start).expect("the blame path holds computed tensors only");
        let mut missing: Vec<String> =
            data_inputs(index, settled).into_iter().filter(|i| !known.contains_key(i)).collect();
        if !missing.is_empty() {
            missing.sort_by_key(|t| index.producer_index(t));
            run(missing.clone(), "inputs", &mut known, &mut unavailable)?;
            // What the candidate could not provide counts as measured and not diverged.
            unmeasurable.extend(missing.into_iter().filter(|t| !known.contains_key(t)));
        }
    }
}

/// The computed, non-weight inputs of a node (what its bodies read from the outer scope included).
fn data_inputs(index: &GraphIndex, node: &layerwise_model::NodeInfo) -> Vec<String> {
    let mut inputs: Vec<String> = node
        .all_inputs()
        .filter(|i| !index.is_constant_like(i) && index.producer_index(i).is_some())
        .cloned()
        .collect();
    inputs.dedup();
    inputs
}

fn finish(
    runs: Vec<SearchRun>,
    threshold: f64,
    chain: Vec<String>,
    node: Option<String>,
    known: HashMap<String, TensorRecord>,
    unavailable: Vec<(String, String)>,
) -> SearchResult {
    let mut records: Vec<TensorRecord> = known.into_values().collect();
    records.sort_by(|a, b| a.topo_index.cmp(&b.topo_index).then(a.name.cmp(&b.name)));
    SearchResult { runs, threshold, chain, node, records, unavailable }
}

/// For every computed tensor, the length of the longest chain of (non-constant) nodes from the
/// graph inputs to it.
fn depths(index: &GraphIndex) -> HashMap<&str, usize> {
    let mut depth: HashMap<&str, usize> = HashMap::new();
    for node in &index.nodes {
        let d = 1 + node.all_inputs().filter_map(|i| depth.get(i.as_str())).copied().max().unwrap_or(0);
        for o in node.outputs.iter().filter(|o| !o.is_empty()) {
            if !index.is_constant_like(o) {
                depth.insert(o.as_str(), d);
            }
        }
    }
    depth
}

/// The path from `start` back to the graph inputs, always into the deepest computed data input.
fn blame_path(index: &GraphIndex, depth: &HashMap<&str, usize>, start: &str) -> Vec<String> {
    let mut path = vec![start.to_string()];
    let mut current = start.to_string();
    while let Some(node) = index.producer(&current) {
        let next = node.inputs.iter().filter(|i| depth.contains_key(i.as_str())).max_by_key(|i| depth[i.as_str()]);
        match next {
            Some(next) => {
                current = next.clone();
                path.push(current.clone());
            }
            None => break,
        }
    }
    path
}

/// The most candidate runs the search needs for a model of `nodes` nodes when the error enters on
/// the blame path: the outputs run, the bisection, and one run for the settled node's other inputs.
pub fn run_bound(nodes: usize) -> usize {
    (nodes.max(1) as f64).log2().ceil() as usize + 2
}
