//! The name mapping between the two sides: which reference tensor a candidate tensor holds.

/// The reference tensor a candidate tensor holds, for the quantizer readers: its pair
/// (`names`, [`reference_names`]), or a graph input of the reference (`index`), which both sides
/// are fed.
pub fn reference_of<'j>(
    index: &'j layerwise_model::GraphIndex,
    names: &'j std::collections::HashMap<String, String>,
) -> impl Fn(&str) -> Option<String> + 'j {
    move |t: &str| names.get(t).cloned().or_else(|| index.is_graph_input(t).then(|| t.to_string()))
}

/// The matching's pairs read backwards: candidate tensor -> reference tensor (`cand_names` maps
/// each reference tensor to the candidate tensor holding its value).
pub fn reference_names(
    cand_names: &std::collections::HashMap<String, String>,
) -> std::collections::HashMap<String, String> {
    cand_names.iter().map(|(r, c)| (c.clone(), r.clone())).collect()
}
