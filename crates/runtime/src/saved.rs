//! Tensors saved with `--save-tensors`, and the `npz:PATH` backend that reads them back, so a
//! candidate run made on another machine (a GPU box) can be compared anywhere.
//!
//! Layout of a saved run: `DIR/<role>/manifest.json` plus one `.npy` file per tensor, and the
//! inputs used for the run in `DIR/inputs.npz`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use layerwise_model::Selection;
use sha2::{Digest, Sha256};

use crate::backend::{Backend, RunOutput, RunRequest};
use crate::npy::{read_npy_file, read_npz, write_npy, write_npy_file, write_npz};
use crate::spec::{BackendSpec, ExecutionProvider, Precision};
use crate::{RuntimeError, Tensor};

const MANIFEST: &str = "manifest.json";
pub const INPUTS_FILE: &str = "inputs.npz";

/// A short fingerprint of a tensor (type, shape and values), to tell whether two runs were fed the
/// same inputs.
pub fn fingerprint(t: &Tensor) -> String {
    let mut bytes = Vec::with_capacity(t.size_bytes() + 128);
    write_npy(&mut bytes, t).expect("writing to memory cannot fail");
    Sha256::digest(&bytes).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// A file name for a tensor: its name with characters unsafe in file names replaced, prefixed by
/// its position so two names that sanitize alike do not collide.
fn file_name(position: usize, name: &str) -> String {
    let clean: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).take(100).collect();
    format!("{position:05}_{clean}.npy")
}

/// Saves one run's tensors under `dir/role`, and the inputs (once) under `dir/inputs.npz`.
pub fn save_run(
    dir: &Path,
    role: &str,
    spec: &BackendSpec,
    order: &[String],
    tensors: &HashMap<String, Tensor>,
    engine_layers: &[(String, Vec<String>)],
    inputs: &[(String, Tensor)],
) -> Result<PathBuf, RuntimeError> {
    let run_dir = dir.join(role);
    let io = |path: &Path, e: std::io::Error| RuntimeError::Io { path: path.to_path_buf(), cause: e };
    fs::create_dir_all(&run_dir).map_err(|e| io(&run_dir, e))?;
    let mut entries = Vec::new();
    for (i, name) in order.iter().filter(|n| tensors.contains_key(*n)).enumerate() {
        let file = file_name(i, name);
        write_npy_file(&run_dir.join(&file), &tensors[name])?;
        entries.push(serde_json::json!({ "name": name, "file": file }));
    }
    let input_prints: BTreeMap<&str, String> = inputs.iter().map(|(n, t)| (n.as_str(), fingerprint(t))).collect();
    let manifest = serde_json::json!({
        "schema": "layerwise.saved-run/1",
        "spec": spec.to_string(),
        "inputs": input_prints,
        "tensors": entries,
        "engine_layers": engine_layers.iter().map(|(n, nodes)| serde_json::json!({ "name": n, "onnx_nodes": nodes })).collect::<Vec<_>>(),
    });
    let manifest_path = run_dir.join(MANIFEST);
    fs::write(&manifest_path, serde_json::to_vec_pretty(&manifest).expect("json"))
        .map_err(|e| io(&manifest_path, e))?;
    let inputs_path = dir.join(INPUTS_FILE);
    let named: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    write_npz(&inputs_path, &named)?;
    Ok(run_dir)
}

/// The `npz:PATH` backend.
pub struct SavedBackend {
    spec: BackendSpec,
    label: String,
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
    precision: Precision,
    input_prints: Option<BTreeMap<String, String>>,
    engine_layers: Vec<(String, Vec<String>)>,
}

impl SavedBackend {
    pub fn open(spec: &BackendSpec, path: &Path) -> Result<SavedBackend, RuntimeError> {
        let bad = |why: String| RuntimeError::TensorFile { path: path.to_path_buf(), why };
        if !path.exists() {
            return Err(bad("does not exist".into()));
        }
        let mut backend = SavedBackend {
            spec: spec.clone(),
            label: spec.to_string(),
            path: path.to_path_buf(),
            tensors: HashMap::new(),
            // Saved tensors of unknown origin get the looser (FP16) default tolerances.
            precision: Precision::Fp16,
            input_prints: None,
            engine_layers: Vec::new(),
        };
        // Anything but a folder is read as an `.npz` file, which must be a regular file: a FIFO or
        // a link to /dev/zero is refused before a byte is read.
        if !path.is_dir() {
            backend.tensors = read_npz(path)?.into_iter().collect();
            return Ok(backend);
        }
        let manifest_path = path.join(MANIFEST);
        if !manifest_path.exists() {
            let roles: Vec<String> = ["ref", "cand"]
                .iter()
                .filter(|r| path.join(r).join(MANIFEST).exists())
                .map(|r| r.to_string())
                .collect();
            if !roles.is_empty() {
                return Err(bad(format!(
                    "this folder holds saved runs {}; name one, e.g. npz:{}",
                    roles.join(" and "),
                    path.join(&roles[roles.len() - 1]).display()
                )));
            }
            for entry in fs::read_dir(path).map_err(|e| bad(e.to_string()))?.filter_map(|e| e.ok()) {
                let p = entry.path();
                if p.extension().is_some_and(|x| x == "npy") {
                    let name = p.file_stem().unwrap_or_default().to_string_lossy().to_string();
                    backend.tensors.insert(name, read_npy_file(&inside(path, &p).map_err(bad)?)?);
                }
            }
            if backend.tensors.is_empty() {
                return Err(bad("holds no manifest.json and no .npy files".into()));
            }
            return Ok(backend);
        }
        let manifest_path = inside(path, &manifest_path).map_err(bad)?;
        let mut text = String::new();
        layerwise_model::open_regular(&manifest_path)
            .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
            .map_err(|e| bad(format!("cannot read manifest: {e}")))?;
        let manifest: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("manifest is not JSON: {e}")))?;
        let saved_spec = manifest["spec"].as_str().unwrap_or_default();
        let float32_cpu =
            matches!(BackendSpec::parse(saved_spec), Ok(BackendSpec::Ort(o)) if o.ep == ExecutionProvider::Cpu);
        backend.precision = if float32_cpu { Precision::Fp32 } else { Precision::Fp16 };
        backend.input_prints = manifest["inputs"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect());
        for layer in manifest["engine_layers"].as_array().into_iter().flatten() {
            let nodes = layer["onnx_nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect();
            backend.engine_layers.push((layer["name"].as_str().unwrap_or_default().to_string(), nodes));
        }
        for entry in manifest["tensors"].as_array().ok_or_else(|| bad("manifest has no tensor list".into()))? {
            let (Some(name), Some(file)) = (entry["name"].as_str(), entry["file"].as_str()) else {
                return Err(bad("manifest entry without name or file".into()));
            };
            // One plain file name: `block..1` is one (a tensor's name may hold dots), `..` and
            // `a/b` are not.
            let mut parts = std::path::Path::new(file).components();
            let plain = matches!((parts.next(), parts.next()), (Some(std::path::Component::Normal(_)), None));
            if !plain || file.contains(['/', '\\']) {
                return Err(bad(format!("manifest names file '{}' outside the folder", crate::npy::excerpt(file))));
            }
            backend.tensors.insert(name.to_string(), read_npy_file(&inside(path, &path.join(file)).map_err(bad)?)?);
        }
        Ok(backend)
    }
}

/// `file`, a file of the saved run in `folder`, where it resolves (links followed) inside that
/// folder: a tensor file that is a link out of it is a read of another file, which the user never
/// named (found by the red team: a link to a file beside the model was read as a saved tensor).
fn inside(folder: &Path, file: &Path) -> Result<PathBuf, String> {
    let resolved = fs::canonicalize(file).map_err(|e| format!("cannot open '{}': {e}", file.display()))?;
    let root = fs::canonicalize(folder).map_err(|e| format!("cannot open '{}': {e}", folder.display()))?;
    // A file with other names (hard links) may be one outside the folder under another name: a
    // saved run's files are layerwise's own, each with one name (found by the red team: a hard
    // link to a file beside the model was read as a saved tensor).
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let links = fs::metadata(&resolved).map(|m| m.nlink()).unwrap_or(1);
        if links > 1 {
            return Err(format!(
                "'{}' has {links} names (hard links), so it may be a file outside the saved run's folder under another name; a saved run's files have one name each, as layerwise writes them (copy the folder to give them their own)",
                file.display()
            ));
        }
    }
    if resolved.starts_with(&root) {
        Ok(resolved)
    } else {
        Err(format!(
            "'{}' resolves to '{}', outside the saved run's folder; a saved run's files must lie in it",
            file.display(),
            resolved.display()
        ))
    }
}

impl Backend for SavedBackend {
    fn spec(&self) -> &BackendSpec {
        &self.spec
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn run(&mut self, request: &RunRequest) -> Result<RunOutput, RuntimeError> {
        if let Some(prints) = &self.input_prints {
            for (name, tensor) in request.inputs {
                if prints.get(name).is_some_and(|p| *p != fingerprint(tensor)) {
                    return Err(RuntimeError::Backend {
                        backend: self.label.clone(),
                        why: format!(
                            "the saved tensors in {} were computed from a different value of input '{name}'; \
                             compare with the same inputs (--inputs {})",
                            self.path.display(),
                            self.path.parent().unwrap_or(Path::new(".")).join(INPUTS_FILE).display()
                        ),
                    });
                }
            }
        }
        let wanted: Vec<String> = match request.selection {
            Selection::All => request.index.computed_tensors().map(str::to_string).collect(),
            Selection::Names(names) => names.clone(),
        };
        let mut output = RunOutput { engine_layers: self.engine_layers.clone(), ..RunOutput::default() };
        output.notes.push(format!("saved tensors from {}", self.path.display()));
        for name in wanted {
            match self.tensors.get(&name) {
                Some(t) => {
                    output.tensors.insert(name, t.clone());
                }
                None => output.unavailable.push((name, "not among the saved tensors".into())),
            }
        }
        Ok(output)
    }
}
