//! The values fed to the model: from `.npz`/`.npy` files or seeded random data, checked against
//! the model's declared inputs.

use std::collections::HashMap;
use std::path::PathBuf;

use half::{bf16, f16};
use layerwise_model::onnx::{tensor_shape_proto::dimension::Value as DimValue, type_proto};
use layerwise_model::{data_type_name, GraphIndex, Model};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::npy::{excerpt, read_npy_file_checked, read_npz_checked};
use crate::{shape_string, DType, RuntimeError, Tensor, TensorData};

/// One dimension of a declared input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeclaredDim {
    Fixed(usize),
    /// A named dynamic dimension (`batch`), or an unnamed one (empty string).
    Dynamic(String),
}

/// A model input as the model declares it.
#[derive(Debug, Clone)]
pub struct InputDecl {
    pub name: String,
    pub dtype: Result<DType, String>,
    /// `None` when the model declares no shape at all.
    pub dims: Option<Vec<DeclaredDim>>,
}

/// The model's inputs (graph inputs that are not initializers), in declaration order.
pub fn declared_inputs(model: &Model, index: &GraphIndex) -> Vec<InputDecl> {
    model
        .graph()
        .input
        .iter()
        .filter(|v| index.is_graph_input(v.name()))
        .map(|v| {
            let tensor = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                Some(type_proto::Value::TensorType(t)) => Some(t),
                _ => None,
            };
            let dtype = match tensor {
                None => Err("not a tensor input".to_string()),
                Some(t) => DType::from_onnx(t.elem_type())
                    .ok_or_else(|| format!("element type {} is not supported", data_type_name(t.elem_type()))),
            };
            let dims = tensor.and_then(|t| t.shape.as_ref()).map(|s| {
                s.dim
                    .iter()
                    .map(|d| match &d.value {
                        Some(DimValue::DimValue(v)) if *v >= 0 => DeclaredDim::Fixed(*v as usize),
                        // Some exporters write '?' for "unknown": anonymous, not one shared symbol.
                        Some(DimValue::DimParam(p)) if p != "?" => DeclaredDim::Dynamic(p.clone()),
                        _ => DeclaredDim::Dynamic(String::new()),
                    })
                    .collect()
            });
            InputDecl { name: v.name().to_string(), dtype, dims }
        })
        .collect()
}

/// How the user asked for inputs.
#[derive(Debug, Clone, Default)]
pub struct InputOptions {
    /// `--inputs FILE.npz`
    pub npz: Option<PathBuf>,
    /// `--input NAME=FILE.npy`
    pub npy: Vec<(String, PathBuf)>,
    /// `--input-shape NAME:1x3x48x320`
    pub shapes: Vec<(String, Vec<usize>)>,
    /// `--val-range NAME:LO,HI`
    pub ranges: Vec<(String, f64, f64)>,
    /// `--seed`
    pub seed: u64,
    /// Values given in memory (the Python API), by input name.
    pub given: Vec<(String, Tensor)>,
    /// Samples given in memory (the Python API's iterable of dicts), each named, one run each as
    /// the files of `--inputs DIR` are.
    pub given_samples: Vec<(String, Vec<(String, Tensor)>)>,
}

/// A prepared input value and where it came from.
#[derive(Debug, Clone)]
pub struct PreparedInput {
    pub name: String,
    pub tensor: Tensor,
    /// `npz:FILE`, `npy:FILE` or `random(seed=S, range=[LO,HI])`.
    pub source: String,
}

/// Default range of random values: [0, 1] as Polygraphy does (integers 0 or 1).
pub const DEFAULT_RANGE: (f64, f64) = (0.0, 1.0);

/// Builds every model input, checking files against the declared types and shapes.
pub fn prepare_inputs(decls: &[InputDecl], options: &InputOptions) -> Result<Vec<PreparedInput>, RuntimeError> {
    let known = |name: &str| decls.iter().any(|d| d.name == name);
    let names = || decls.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ");
    let named = options.npy.iter().map(|(n, _)| n).chain(options.shapes.iter().map(|(n, _)| n));
    for name in named {
        if !known(name) {
            return Err(RuntimeError::Input(format!("the model has no input '{name}' (its inputs: {})", names())));
        }
    }
    // One value per input and option: a second would silently lose to the first.
    let repeated = |what: &str, names: Vec<&String>| -> Result<(), RuntimeError> {
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(RuntimeError::Input(format!("{what} is given twice for input '{name}'")));
            }
        }
        Ok(())
    };
    repeated("--input-shape", options.shapes.iter().map(|(n, _)| n).collect())?;
    repeated("--val-range", options.ranges.iter().map(|(n, _, _)| n).collect())?;
    repeated("--input", options.npy.iter().map(|(n, _)| n).collect())?;
    for (name, lo, hi) in &options.ranges {
        if !known(name) {
            return Err(RuntimeError::Input(format!(
                "--val-range names '{name}', which is not a model input (inputs: {})",
                names()
            )));
        }
        if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err(RuntimeError::Input(format!(
                "--val-range for '{name}' must be LO,HI with LO <= HI, got {lo},{hi}"
            )));
        }
    }

    let mut from_files: HashMap<String, (Tensor, String)> = HashMap::new();
    let mut npz_arrays: Vec<String> = Vec::new();
    // Each array's header is checked against the declared input before its data is read: a
    // header that lies about the shape is refused before gigabytes are decompressed.
    if let Some(path) = &options.npz {
        let source = format!("npz:{}", path.display());
        let mut expect = |name: &str, dtype: DType, shape: &[usize]| match decls.iter().find(|d| d.name == name) {
            None => Err(RuntimeError::UnknownArray {
                file: path.clone(),
                array: excerpt(name),
                inputs: decls.iter().map(|d| d.name.clone()).collect(),
            }),
            Some(decl) => check_header(decl, dtype, shape, &source),
        };
        for (name, tensor) in read_npz_checked(path, &mut expect)? {
            npz_arrays.push(name.clone());
            from_files.insert(name, (tensor, source.clone()));
        }
    }
    for (name, path) in &options.npy {
        let source = format!("npy:{}", path.display());
        let decl = decls.iter().find(|d| d.name == *name).expect("checked above");
        let tensor = read_npy_file_checked(path, &mut |_, dtype, shape| check_header(decl, dtype, shape, &source))?;
        from_files.insert(name.clone(), (tensor, source));
    }
    for (name, tensor) in &options.given {
        if !known(name) {
            return Err(RuntimeError::Input(format!("the model has no input '{name}' (its inputs: {})", names())));
        }
        from_files.insert(name.clone(), (tensor.clone(), "given".to_string()));
    }

    let mut prepared = Vec::with_capacity(decls.len());
    let mut unresolved = Vec::new();
    let mut symbols: HashMap<String, (usize, String)> = HashMap::new();
    for (position, decl) in decls.iter().enumerate() {
        let dtype = decl.dtype.clone().map_err(|why| RuntimeError::Input(format!("input '{}': {why}", decl.name)))?;
        if let Some((tensor, source)) = from_files.remove(&decl.name) {
            if let Some((_, shape)) =
                options.shapes.iter().find(|(n, _)| *n == decl.name).filter(|(_, s)| *s != tensor.shape)
            {
                return Err(RuntimeError::Input(format!(
                    "--input-shape {}:{} conflicts with the shape {} that {source} holds for '{}'; leave --input-shape out for inputs given as files",
                    decl.name,
                    shape_string(shape),
                    shape_string(&tensor.shape),
                    decl.name
                )));
            }
            check_file_input(decl, dtype, &tensor, &source, &mut symbols)?;
            prepared.push(PreparedInput { name: decl.name.clone(), tensor, source });
            continue;
        }
        if let Some(npz) = &options.npz {
            return Err(RuntimeError::Input(format!(
                "input '{}' is not in {} (it holds: {}); add it, or leave --inputs out to use random data",
                decl.name,
                npz.display(),
                npz_arrays.join(", ")
            )));
        }
        let shape = match options.shapes.iter().find(|(n, _)| *n == decl.name) {
            Some((_, shape)) => {
                if let Some(dims) = &decl.dims {
                    check_shape(decl, dims, shape, "--input-shape", &mut symbols)?;
                }
                shape.clone()
            }
            None => match &decl.dims {
                None => {
                    unresolved.push(format!("'{}' (no declared shape)", decl.name));
                    continue;
                }
                Some(dims) => {
                    let dynamic: Vec<String> = dims
                        .iter()
                        .enumerate()
                        .filter_map(|(i, d)| match d {
                            DeclaredDim::Dynamic(n) if n.is_empty() => Some(format!("dim {i}")),
                            DeclaredDim::Dynamic(n) => Some(format!("dim {i} '{n}'")),
                            DeclaredDim::Fixed(_) => None,
                        })
                        .collect();
                    if !dynamic.is_empty() {
                        unresolved.push(format!("'{}' ({})", decl.name, dynamic.join(", ")));
                        continue;
                    }
                    dims.iter().map(|d| if let DeclaredDim::Fixed(v) = d { *v } else { 0 }).collect()
                }
            },
        };
        check_fits(tensor_bytes(&shape, dtype.size()), &shape)
            .map_err(|why| RuntimeError::Input(format!("input '{}': {why}", decl.name)))?;
        let (lo, hi) = options
            .ranges
            .iter()
            .find(|(n, _, _)| *n == decl.name)
            .map(|(_, lo, hi)| (*lo, *hi))
            .unwrap_or(DEFAULT_RANGE);
        // One stream per input, derived from the seed and the input's position: adding an input
        // file for one input does not change the random values of the others.
        let mut rng =
            ChaCha8Rng::seed_from_u64(options.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(position as u64));
        let tensor = random_tensor(&mut rng, dtype, shape, lo, hi);
        let source = format!("random(seed={}, range=[{lo},{hi}])", options.seed);
        prepared.push(PreparedInput { name: decl.name.clone(), tensor, source });
    }
    if !unresolved.is_empty() {
        // An example with the first unresolved input's rank: its fixed dims, 1 for the first
        // dynamic one (usually the batch), 64 for the others.
        let decl = decls
            .iter()
            .find(|d| unresolved.iter().any(|u| u.starts_with(&format!("'{}'", d.name))))
            .expect("unresolved input");
        let dims: Vec<String> = decl
            .dims
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, d)| match d {
                DeclaredDim::Fixed(v) => v.to_string(),
                DeclaredDim::Dynamic(_) if i == 0 => "1".into(),
                DeclaredDim::Dynamic(_) => "64".into(),
            })
            .collect();
        let example = (decl.name.as_str(), if dims.is_empty() { "1x64".to_string() } else { dims.join("x") });
        return Err(RuntimeError::Input(format!(
            "dynamic dimensions without a value in {}; give each with --input-shape NAME:D0xD1x... (e.g. --input-shape {}:{}), or provide the input with --inputs/--input",
            unresolved.join("; "),
            example.0,
            example.1
        )));
    }
    Ok(prepared)
}

/// What a file's header declares for `decl`, checked before its data is read: the element type,
/// and the rank and fixed dimensions (a named dimension's agreement between inputs is checked
/// once the values are in, by [`check_file_input`]).
fn check_header(decl: &InputDecl, dtype: DType, shape: &[usize], source: &str) -> Result<(), RuntimeError> {
    let Ok(wanted) = decl.dtype.clone() else { return Ok(()) };
    if dtype != wanted {
        return Err(RuntimeError::Input(format!(
            "input '{}' must be {} but {source} holds {}",
            decl.name,
            wanted.name(),
            dtype.name()
        )));
    }
    if let Some(dims) = &decl.dims {
        check_shape(decl, dims, shape, source, &mut HashMap::new())?;
    }
    Ok(())
}

fn check_file_input(
    decl: &InputDecl,
    dtype: DType,
    tensor: &Tensor,
    source: &str,
    symbols: &mut HashMap<String, (usize, String)>,
) -> Result<(), RuntimeError> {
    if tensor.dtype() != dtype {
        return Err(RuntimeError::Input(format!(
            "input '{}' must be {} but {source} holds {}",
            decl.name,
            dtype.name(),
            tensor.dtype().name()
        )));
    }
    if let Some(dims) = &decl.dims {
        check_shape(decl, dims, &tensor.shape, source, symbols)?;
    }
    Ok(())
}

/// Checks a concrete shape against the declared one; a named dynamic dimension must take the same
/// value in every input that uses it.
fn check_shape(
    decl: &InputDecl,
    dims: &[DeclaredDim],
    shape: &[usize],
    source: &str,
    symbols: &mut HashMap<String, (usize, String)>,
) -> Result<(), RuntimeError> {
    let declared: Vec<String> = dims
        .iter()
        .map(|d| match d {
            DeclaredDim::Fixed(v) => v.to_string(),
            DeclaredDim::Dynamic(n) if n.is_empty() => "?".into(),
            DeclaredDim::Dynamic(n) => n.clone(),
        })
        .collect();
    let mismatch = || {
        RuntimeError::Input(format!(
            "input '{}' has shape {} from {source}, but the model declares [{}]",
            decl.name,
            shape_string(shape),
            declared.join(", ")
        ))
    };
    if dims.len() != shape.len() {
        return Err(mismatch());
    }
    for (d, &v) in dims.iter().zip(shape) {
        match d {
            DeclaredDim::Fixed(f) if *f != v => return Err(mismatch()),
            DeclaredDim::Dynamic(name) if !name.is_empty() => {
                if let Some((prev, who)) = symbols.get(name) {
                    if *prev != v {
                        return Err(RuntimeError::Input(format!(
                            "dimension '{name}' is {v} in input '{}' but {prev} in input '{who}'",
                            decl.name
                        )));
                    }
                } else {
                    symbols.insert(name.clone(), (v, decl.name.clone()));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Uniform values in [lo, hi) for floats, integers in [lo, hi] for integer types, fair coin for bool.
pub fn random_tensor(rng: &mut ChaCha8Rng, dtype: DType, shape: Vec<usize>, lo: f64, hi: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let float = |rng: &mut ChaCha8Rng| lo + (hi - lo) * rng.random::<f64>();
    let int = |rng: &mut ChaCha8Rng| {
        let (a, b) = (lo.ceil() as i64, hi.floor() as i64);
        if b <= a {
            a
        } else {
            rng.random_range(a..=b)
        }
    };
    let data = match dtype {
        DType::F32 => TensorData::F32((0..n).map(|_| float(rng) as f32).collect()),
        DType::F16 => TensorData::F16((0..n).map(|_| f16::from_f64(float(rng))).collect()),
        DType::BF16 => TensorData::BF16((0..n).map(|_| bf16::from_f64(float(rng))).collect()),
        DType::F64 => TensorData::F64((0..n).map(|_| float(rng)).collect()),
        DType::I8 => TensorData::I8((0..n).map(|_| int(rng) as i8).collect()),
        DType::I16 => TensorData::I16((0..n).map(|_| int(rng) as i16).collect()),
        DType::I32 => TensorData::I32((0..n).map(|_| int(rng) as i32).collect()),
        DType::I64 => TensorData::I64((0..n).map(|_| int(rng)).collect()),
        DType::U8 => TensorData::U8((0..n).map(|_| int(rng).max(0) as u8).collect()),
        DType::U16 => TensorData::U16((0..n).map(|_| int(rng).max(0) as u16).collect()),
        DType::U32 => TensorData::U32((0..n).map(|_| int(rng).max(0) as u32).collect()),
        DType::U64 => TensorData::U64((0..n).map(|_| int(rng).max(0) as u64).collect()),
        DType::Bool => TensorData::Bool((0..n).map(|_| rng.random::<bool>()).collect()),
    };
    Tensor::new(shape, data)
}

pub use layerwise_model::tensor::{available_memory, check_fits, tensor_bytes};

/// The input shapes a sample will have, from the options alone: shapes given or declared for
/// random inputs, the headers of `.npz`/`.npy` files (no data read), values given in memory.
/// `None` where a shape cannot be told yet (an unresolved dimension, an unreadable file): the
/// inputs' own checks say why when they are prepared.
pub fn sample_shapes(decls: &[InputDecl], options: &InputOptions) -> Option<Vec<(String, DType, Vec<usize>)>> {
    let mut found: Vec<(String, DType, Vec<usize>)> = Vec::new();
    fn put(found: &mut Vec<(String, DType, Vec<usize>)>, name: &str, dtype: DType, shape: Vec<usize>) {
        if !found.iter().any(|(n, _, _)| n == name) {
            found.push((name.to_string(), dtype, shape));
        }
    }
    for (name, t) in &options.given {
        put(&mut found, name, t.dtype(), t.shape.clone());
    }
    // A file whose header does not match the model is left to the inputs' own checks.
    let matches = |name: &str, dtype: DType, shape: &[usize]| {
        decls.iter().find(|d| d.name == name).is_some_and(|d| check_header(d, dtype, shape, "").is_ok())
    };
    for (name, path) in &options.npy {
        let (dtype, shape) = crate::npy::npy_header(path).ok().filter(|(d, s)| matches(name, *d, s))?;
        put(&mut found, name, dtype, shape);
    }
    if let Some(path) = &options.npz {
        for (name, dtype, shape) in crate::npy::npz_headers(path).ok()? {
            if !matches(&name, dtype, &shape) {
                return None;
            }
            put(&mut found, &name, dtype, shape);
        }
    }
    for decl in decls {
        if found.iter().any(|(n, _, _)| *n == decl.name) {
            continue;
        }
        let dtype = decl.dtype.clone().ok()?;
        let shape = match options.shapes.iter().find(|(n, _)| *n == decl.name) {
            Some((_, shape)) => shape.clone(),
            None => decl
                .dims
                .as_ref()?
                .iter()
                .map(|d| if let DeclaredDim::Fixed(v) = d { Some(*v) } else { None })
                .collect::<Option<Vec<usize>>>()?,
        };
        // An input that alone cannot be held gets its own message where it is prepared.
        check_fits(tensor_bytes(&shape, dtype.size()), &shape).ok()?;
        put(&mut found, &decl.name, dtype, shape);
    }
    Some(found)
}

/// What a run holds at once, estimated before it starts from the sizes of what it holds: the
/// inputs, each side's computed tensors (ONNX Runtime's shape inference with the inputs'
/// shapes; a dimension it cannot infer counts as nothing, so the estimate stays a lower bound
/// there) and the weights. The multiples are measured (docs/security.md): peak RSS over the
/// sizes, for Relu, a 4-op chain, two inputs, an Expand to 4x and a MatMul with 256 MiB of
/// weights, at 1e7 to 1e8 elements, paired and `--separate-runs`, each rounded up to cover
/// every case measured (by 0 to 35 %).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryEstimate {
    /// Bytes of every input of the sample.
    pub inputs: u64,
    /// Bytes of every computed tensor of one side whose size is known.
    pub tensors: u64,
    /// The largest computed tensor, and its bytes.
    pub largest: Option<(String, u64)>,
    /// Whether the largest tensor is a model output (and so in every group already).
    pub largest_is_output: bool,
    /// Bytes of the model outputs, which every group of a split run returns again.
    pub outputs: u64,
    /// Bytes of the model's weights (and a candidate model's), which each session holds a copy of.
    pub weights: u64,
}

impl MemoryEstimate {
    /// The tensors one paired session holds: its inputs (layerwise's copies and the session's),
    /// the largest tensor's few live copies (reference, candidate, their roundings), a share of
    /// the rest. Measured: 5.6x the input for Relu, 12.0x one input for two inputs.
    pub fn paired(&self) -> u64 {
        4 * self.inputs + 5 * self.largest_bytes() / 2 + self.tensors / 2
    }

    /// The tensors separate runs hold with `group` bytes of tensors returned per run (outputs
    /// included): the inputs, both sides' copies of the group and the runtime's copy of the
    /// one being returned. Measured: 5.6x the input for Relu, 14.7x for a chain of 4.
    pub fn separate(&self, group: u64) -> u64 {
        7 * self.inputs / 2 + 3 * group + self.largest_bytes()
    }

    /// The smallest group a split can make: the largest tensor with the outputs.
    pub fn smallest_group(&self) -> u64 {
        self.outputs + if self.largest_is_output { 0 } else { self.largest_bytes() }
    }

    /// The least the tensors of a run can take: paired where it may pair, else separate runs
    /// with one tensor per group; `whole` where every tensor must be held at once
    /// (`--save-tensors`).
    pub fn least_tensors(&self, may_pair: bool, whole: bool) -> u64 {
        let separate =
            if whole { self.separate(self.tensors.max(self.outputs)) } else { self.separate(self.smallest_group()) };
        if may_pair {
            separate.min(self.paired())
        } else {
            separate
        }
    }

    /// The sessions' copies of the weights on top: layerwise's copy, the reference session's,
    /// the candidate's rounded copy and its session's (4x measured paired, 5x separate).
    pub fn with_weights(&self, tensors: u64) -> u64 {
        tensors + 5 * self.weights
    }

    fn largest_bytes(&self) -> u64 {
        self.largest.as_ref().map_or(0, |(_, b)| *b)
    }
}

/// The estimate for `model` fed `shapes` (of [`sample_shapes`]). `cand_weights`: a candidate
/// model's weights, held beside the reference's.
pub fn estimate_memory(
    model: &Model,
    index: &GraphIndex,
    shapes: &[(String, DType, Vec<usize>)],
    cand_weights: u64,
) -> MemoryEstimate {
    let bytes = |shape: &[usize], dtype: DType| tensor_bytes(shape, dtype.size()).unwrap_or(u64::MAX);
    let mut e = MemoryEstimate {
        inputs: shapes.iter().map(|(_, d, s)| bytes(s, *d)).fold(0u64, u64::saturating_add),
        ..Default::default()
    };
    e.weights = weight_bytes(model).saturating_add(cand_weights);
    let named: Vec<(String, Vec<usize>)> = shapes.iter().map(|(n, _, s)| (n.clone(), s.clone())).collect();
    // Where ONNX Runtime cannot type the model, the inputs and weights alone are the estimate.
    let Ok(types) = crate::tensor_types(model, index, &named) else { return e };
    for (name, ty) in &types {
        let Some(dtype) = ty.dtype else { continue };
        let Some(dims) = ty.dims.iter().copied().collect::<Option<Vec<usize>>>() else { continue };
        let b = bytes(&dims, dtype);
        e.tensors = e.tensors.saturating_add(b);
        if index.outputs.contains(name) {
            e.outputs = e.outputs.saturating_add(b);
        }
        if e.largest.as_ref().is_none_or(|(n, l)| b > *l || (b == *l && name < n)) {
            e.largest = Some((name.clone(), b));
            e.largest_is_output = index.outputs.contains(name);
        }
    }
    e
}

/// Bytes of a model's weights: its initializers, in the main graph and in subgraphs.
pub fn weight_bytes(model: &Model) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![model.graph()];
    while let Some(g) = stack.pop() {
        for t in &g.initializer {
            let dims: Vec<usize> = t.dims.iter().map(|&d| d.max(0) as usize).collect();
            total = total.saturating_add(
                layerwise_model::data_type_size(t.data_type()).and_then(|s| tensor_bytes(&dims, s)).unwrap_or(0),
            );
        }
        for n in &g.node {
            for a in &n.attribute {
                stack.extend(a.g.iter().chain(a.graphs.iter()));
            }
        }
    }
    total
}

/// Refuses, before anything runs, a run whose estimated memory cannot fit `max_memory` (the
/// tensors it holds at once, split as finely as it can be) or the memory available (with the
/// sessions' weights): `--input-shape x:1000000000` on a Relu passed
/// the input's own check and was killed by the kernel at 20.7 GB, leaving its scratch folder.
/// The sample with the largest inputs stands for all. `may_pair`: both sides may run in one
/// paired session; `held_samples`: how many samples' every tensor is held at once (0: none is;
/// 1: `--save-tensors`; `fix` keeps the reference's tensors of every sample for its trials).
#[allow(clippy::too_many_arguments)]
pub fn check_memory<'a>(
    model: &Model,
    index: &GraphIndex,
    decls: &[InputDecl],
    samples: impl Iterator<Item = &'a InputOptions>,
    cand: Option<&Model>,
    max_memory: Option<u64>,
    may_pair: bool,
    held_samples: usize,
) -> Result<(), RuntimeError> {
    let whole = held_samples > 0;
    let bytes = |s: &[(String, DType, Vec<usize>)]| {
        s.iter().map(|(_, d, s)| tensor_bytes(s, d.size()).unwrap_or(u64::MAX)).fold(0u64, u64::saturating_add)
    };
    let Some(shapes) = samples.filter_map(|o| sample_shapes(decls, o)).max_by_key(|s| bytes(s)) else { return Ok(()) };
    let e = estimate_memory(model, index, &shapes, cand.map_or(0, weight_bytes));
    let least = e.least_tensors(may_pair, whole).saturating_mul(held_samples.max(1) as u64);
    let largest = match &e.largest {
        Some((name, b)) => format!(", the largest tensor '{name}' {}", size(*b)),
        None => String::new(),
    };
    if let Some(limit) = max_memory.filter(|&l| least > l) {
        return Err(RuntimeError::Memory(format!(
            "--max-memory {}: this run holds at least {} of tensors at once ({} of inputs{largest}, {} of outputs; with the copies each side and ONNX Runtime hold), and {}; give --max-memory {} or more, or smaller inputs",
            size(limit),
            size(least),
            size(e.inputs),
            size(e.outputs),
            match held_samples {
                0 => "a single tensor cannot be split into smaller groups".to_string(),
                1 => "every tensor is held at once (--save-tensors, or fix's reference, which its trials compare against)".to_string(),
                n => format!("fix holds every tensor of the reference on each of the {n} samples at once (its trials compare against them)"),
            },
            size(least)
        )));
    }
    let total = e.with_weights(least);
    if let Some(available) = available_memory().filter(|&a| total > a) {
        return Err(RuntimeError::Memory(format!(
            "this run needs about {} of memory ({} of inputs, {} of tensors per side{largest}, {} of weights; with the copies each side and ONNX Runtime hold), more than the {} available; give smaller inputs, or run it where more memory is free",
            size(total),
            size(e.inputs),
            size(e.tensors),
            size(e.weights),
            size(available)
        )));
    }
    Ok(())
}

pub use layerwise_model::tensor::size;
