use std::path::PathBuf;

/// Everything that can go wrong while reading, checking or rewriting a model.
///
/// Messages name the file, tensor or node at fault so that a user can act on them directly.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model file not found: {0}")]
    NotFound(PathBuf),
    #[error("cannot read {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{path} is not an ONNX model: protobuf decoding failed ({cause}); the file may be truncated, corrupt or of another format")]
    Decode { path: PathBuf, cause: prost::DecodeError },
    #[error("{path} decodes as protobuf but is not an ONNX model: {why}")]
    NotAModel { path: PathBuf, why: String },
    #[error("external data of initializer '{tensor}': {why}")]
    ExternalData { tensor: String, why: String },
    #[error("invalid graph: {0}")]
    InvalidGraph(String),
    #[error("tensor '{0}' does not exist in the main graph")]
    UnknownTensor(String),
    #[error("tensor '{tensor}' is produced inside a subgraph of node '{node}' and is not visible from the main graph, so it cannot be compared")]
    SubgraphTensor { tensor: String, node: String },
    #[error("tensor '{0}' is a graph input or initializer, not computed by the model: there is nothing to compare")]
    NotComputed(String),
    #[error("node '{0}' does not exist in the main graph (names as layerwise reports them: the node's own name, or OpType#i for unnamed nodes)")]
    UnknownNode(String),
    #[error("node '{name}' does not exist in the model as named; {why}: try '{suggestion}'")]
    UnknownNodeHint { name: String, why: String, suggestion: String },
    #[error("node '{name}' does not exist in the model: it names node '{inner}' of '{body}' (layerwise names a body's nodes after its If or Loop once inlined: `Node/then/inner`, `Node/iter3/inner`), and that body has no such node (a body's node by its own name, or OpType#i for unnamed ones)")]
    UnknownBodyNode { name: String, body: String, inner: String },
    #[error("{}", kept_constants_text(.0))]
    KeptConstants(Vec<(String, Vec<String>)>),
    #[error("no node of op type '{op}' in the model (its op types: {present})")]
    UnknownOpType { op: String, present: String },
    #[error("quantization config {path}: {why}")]
    QuantConfig { path: String, why: String },
    #[error("cannot quantize the model: {0}")]
    Quantize(String),
    #[error("cannot write {path}: {cause}")]
    Write { path: PathBuf, cause: std::io::Error },
}

/// The message of [`ModelError::KeptConstants`]: each Constant named in a keep list, with the
/// nodes that read it.
fn kept_constants_text(constants: &[(String, Vec<String>)]) -> String {
    let listed: Vec<String> = constants
        .iter()
        .map(|(name, readers)| {
            if readers.is_empty() {
                format!("'{name}' (read by no node)")
            } else {
                format!("'{name}' (read by {})", readers.join(", "))
            }
        })
        .collect();
    let mut readers: Vec<&str> = Vec::new();
    for r in constants.iter().flat_map(|(_, r)| r.iter().map(String::as_str)) {
        if !readers.contains(&r) {
            readers.push(r);
        }
    }
    let (one, it) = if constants.len() == 1 { ("", "it") } else { ("s", "them") };
    let instead = if readers.is_empty() {
        String::new()
    } else {
        format!("keep the nodes that read {it} instead (--keep-fp32 {}), or ", readers.join(","))
    };
    format!(
        "the keep list names {} Constant node{one}: {}. A Constant computes nothing: its value is stored in the precision the nodes reading it take, so naming it changes nothing; {instead}leave {it} out",
        constants.len(),
        listed.join("; ")
    )
}
