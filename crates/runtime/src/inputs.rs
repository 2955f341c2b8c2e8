//! The values fed to the model: from `.npz`/`.npy` files or seeded random data, checked against
//! the model's declared inputs.

use std::collections::HashMap;
use std::path::PathBuf;

use half::{bf16, f16};
use layerwise_model::onnx::{tensor_shape_proto::dimension::Value as DimValue, type_proto};
use layerwise_model::{data_type_name, GraphIndex, Model};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::npy::{read_npy_file, read_npz};
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
                Some(t) => DType::from_onnx(t.elem_type()).ok_or_else(|| format!("element type {} is not supported", data_type_name(t.elem_type()))),
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
            return Err(RuntimeError::Input(format!("--val-range names '{name}', which is not a model input (inputs: {})", names())));
        }
        if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err(RuntimeError::Input(format!("--val-range for '{name}' must be LO,HI with LO <= HI, got {lo},{hi}")));
        }
    }

    let mut from_files: HashMap<String, (Tensor, String)> = HashMap::new();
    let mut npz_arrays: Vec<String> = Vec::new();
    if let Some(path) = &options.npz {
        for (name, tensor) in read_npz(path)? {
            npz_arrays.push(name.clone());
            if !known(&name) {
                return Err(RuntimeError::UnknownArray { file: path.clone(), array: name, inputs: decls.iter().map(|d| d.name.clone()).collect() });
            }
            from_files.insert(name, (tensor, format!("npz:{}", path.display())));
        }
    }
    for (name, path) in &options.npy {
        from_files.insert(name.clone(), (read_npy_file(path)?, format!("npy:{}", path.display())));
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
            if let Some((_, shape)) = options.shapes.iter().find(|(n, _)| *n == decl.name).filter(|(_, s)| *s != tensor.shape) {
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
        check_fits(tensor_bytes(&shape, dtype.size()), &shape).map_err(|why| RuntimeError::Input(format!("input '{}': {why}", decl.name)))?;
        let (lo, hi) = options.ranges.iter().find(|(n, _, _)| *n == decl.name).map(|(_, lo, hi)| (*lo, *hi)).unwrap_or(DEFAULT_RANGE);
        // One stream per input, derived from the seed and the input's position: adding an input
        // file for one input does not change the random values of the others.
        let mut rng = ChaCha8Rng::seed_from_u64(options.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(position as u64));
        let tensor = random_tensor(&mut rng, dtype, shape, lo, hi);
        let source = format!("random(seed={}, range=[{lo},{hi}])", options.seed);
        prepared.push(PreparedInput { name: decl.name.clone(), tensor, source });
    }
    if !unresolved.is_empty() {
        // An example with the first unresolved input's rank: its fixed dims, 1 for the first
        // dynamic one (usually the batch), 64 for the others.
        let decl = decls.iter().find(|d| unresolved.iter().any(|u| u.starts_with(&format!("'{}'", d.name)))).expect("unresolved input");
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
    let declared: Vec<String> = dims.iter().map(|d| match d { DeclaredDim::Fixed(v) => v.to_string(), DeclaredDim::Dynamic(n) if n.is_empty() => "?".into(), DeclaredDim::Dynamic(n) => n.clone() }).collect();
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
        if b <= a { a } else { rng.random_range(a..=b) }
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
