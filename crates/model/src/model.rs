use std::fs;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use prost::Message;
use sha2::{Digest, Sha256};

use crate::onnx::{tensor_proto, GraphProto, ModelProto, StringStringEntryProto, TensorProto};
use crate::ModelError;

/// A loaded ONNX model and where it came from.
///
/// The protobuf is decoded from a single in-memory copy of the file: `raw_data` fields are slices of
/// that buffer (prost `Bytes`), so weights are never copied a second time on load. External data is
/// not read at load time; it is only checked to exist and to be long enough.
#[derive(Debug, Clone)]
pub struct Model {
    pub proto: ModelProto,
    /// Where the model was loaded from (or a label for models built in memory).
    pub path: PathBuf,
    /// Folder that external data locations are relative to; `None` for in-memory models.
    pub base_dir: Option<PathBuf>,
    pub sha256: String,
}

/// Size in bytes of one element of an ONNX data type, if it has a fixed size.
pub fn data_type_size(data_type: i32) -> Option<usize> {
    use tensor_proto::DataType as D;
    Some(match D::try_from(data_type).ok()? {
        D::Float | D::Int32 | D::Uint32 => 4,
        D::Uint8 | D::Int8 | D::Bool | D::Float8e4m3fn | D::Float8e4m3fnuz | D::Float8e5m2 | D::Float8e5m2fnuz => 1,
        D::Uint16 | D::Int16 | D::Float16 | D::Bfloat16 => 2,
        D::Int64 | D::Uint64 | D::Double | D::Complex64 => 8,
        D::Complex128 => 16,
        _ => return None,
    })
}

/// Lower-case name of an ONNX data type (`float`, `float16`, `int64`, ...).
pub fn data_type_name(data_type: i32) -> String {
    tensor_proto::DataType::try_from(data_type)
        .map(|d| d.as_str_name().to_ascii_lowercase())
        .unwrap_or_else(|_| format!("type{data_type}"))
}

impl Model {
    /// Loads and checks an `.onnx` file. The file is never modified.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        if !path.exists() {
            return Err(ModelError::NotFound(path.to_path_buf()));
        }
        let data = fs::read(path).map_err(|source| ModelError::Read { path: path.to_path_buf(), source })?;
        Model::from_bytes(data, path)
    }

    /// Decodes and checks the bytes of an `.onnx` file that lives (or would live) at `path`;
    /// external data resolves against `path`'s folder. The fuzz targets enter here.
    pub fn from_bytes(data: Vec<u8>, path: &Path) -> Result<Model, ModelError> {
        let sha256 = hex(&Sha256::digest(&data));
        let proto = ModelProto::decode(Bytes::from(data))
            .map_err(|source| ModelError::Decode { path: path.to_path_buf(), source })?;
        let base_dir = path.parent().map(|p| if p.as_os_str().is_empty() { PathBuf::from(".") } else { p.to_path_buf() });
        let model = Model { proto, path: path.to_path_buf(), base_dir, sha256 };
        model.check_is_model()?;
        model.check_external_data()?;
        Ok(model)
    }

    /// Wraps a model built in memory (tests, the demo). It must not reference external data.
    pub fn from_proto(proto: ModelProto, label: &str) -> Result<Model, ModelError> {
        let sha256 = hex(&Sha256::digest(proto.encode_to_vec()));
        let model = Model { proto, path: PathBuf::from(label), base_dir: None, sha256 };
        model.check_is_model()?;
        model.check_external_data()?;
        Ok(model)
    }

    /// A model derived from this one (an extraction, a rewrite kept in memory): its external data
    /// still resolves against this model's folder.
    pub fn derived(&self, proto: ModelProto, label: &str) -> Model {
        let sha256 = hex(&Sha256::digest(proto.encode_to_vec()));
        Model { proto, path: self.path.with_file_name(label), base_dir: self.base_dir.clone(), sha256 }
    }

    pub fn graph(&self) -> &GraphProto {
        self.proto.graph.as_ref().expect("checked on load")
    }

    /// Opset version of the default ONNX domain.
    pub fn opset(&self) -> i64 {
        self.proto
            .opset_import
            .iter()
            .find(|o| o.domain().is_empty() || o.domain() == "ai.onnx")
            .map(|o| o.version())
            .unwrap_or(0)
    }

    fn check_is_model(&self) -> Result<(), ModelError> {
        let not_a_model = |why: &str| ModelError::NotAModel { path: self.path.clone(), why: why.to_string() };
        if self.proto.ir_version.unwrap_or(0) <= 0 {
            return Err(not_a_model("ir_version is missing"));
        }
        let Some(graph) = &self.proto.graph else { return Err(not_a_model("it has no graph")) };
        if self.proto.opset_import.is_empty() {
            return Err(not_a_model("it imports no operator set"));
        }
        if graph.output.is_empty() {
            return Err(not_a_model("its graph has no outputs"));
        }
        Ok(())
    }

    /// Every external-data reference must stay inside the model's folder, name an existing file and
    /// fit in it. Checked up front so that a missing file is a clear error, not a runtime failure.
    fn check_external_data(&self) -> Result<(), ModelError> {
        let mut result = Ok(());
        for_each_initializer(self.graph(), &mut |t| {
            if result.is_ok() && is_external(t) {
                result = self.check_one_external(t);
            }
        });
        result
    }

    fn check_one_external(&self, t: &TensorProto) -> Result<(), ModelError> {
        let err = |why: String| ModelError::ExternalData { tensor: t.name().to_string(), why };
        let ext = ExternalRef::parse(t).map_err(err)?;
        let Some(base) = &self.base_dir else {
            return Err(err("the model was built in memory, so external data has no folder to resolve against".into()));
        };
        let file = base.join(&ext.location);
        let meta = fs::metadata(&file).map_err(|e| err(format!("cannot open '{}': {e}", file.display())))?;
        let numel: i128 = t.dims.iter().map(|&d| d as i128).product();
        let expected = data_type_size(t.data_type()).map(|s| numel * s as i128);
        if let (Some(len), Some(expected)) = (ext.length, expected) {
            if len as i128 != expected {
                return Err(err(format!("length {len} does not match {expected} bytes implied by its shape and type")));
            }
        }
        let needed = ext.offset as i128 + ext.length.map(|l| l as i128).or(expected).unwrap_or(0);
        if needed > meta.len() as i128 {
            return Err(err(format!(
                "'{}' is {} bytes but the tensor needs bytes up to {needed}",
                file.display(),
                meta.len()
            )));
        }
        Ok(())
    }

    /// Absolute path of an external data file referenced by this model.
    pub(crate) fn external_file(&self, location: &str) -> Option<PathBuf> {
        self.base_dir.as_ref().map(|b| b.join(location))
    }

    /// The bytes a runtime should load for `proto` (a rewrite of this model), and the folder its
    /// external data resolves against. Runtimes refuse external data outside the model's own
    /// folder (ONNX Runtime resolves links too), so a rewrite is loaded from memory with the
    /// original model's folder as its external-data folder. A rewrite over 1 GiB reads its
    /// external tensors in and moves every large tensor into `scratch`, which becomes the folder.
    pub fn runtime_bytes(&self, proto: &ModelProto, scratch: &Path) -> Result<(Vec<u8>, Option<PathBuf>), ModelError> {
        if proto.encoded_len() > PROTOBUF_LIMIT {
            let mut proto = proto.clone();
            self.materialize_external(&mut proto)?;
            externalize_large_tensors(&mut proto, scratch, "model.onnx.data")?;
            return Ok((proto.encode_to_vec(), Some(scratch.to_path_buf())));
        }
        let mut external = false;
        if let Some(g) = &proto.graph {
            for_each_initializer(g, &mut |t| external |= is_external(t));
        }
        let folder = match (&self.base_dir, external) {
            (Some(base), true) => Some(fs::canonicalize(base).map_err(|source| ModelError::Read { path: base.clone(), source })?),
            _ => None,
        };
        Ok((proto.encode_to_vec(), folder))
    }

    /// Reads every external tensor of `proto` into inline raw data.
    fn materialize_external(&self, proto: &mut ModelProto) -> Result<(), ModelError> {
        let mut stack: Vec<&mut GraphProto> = proto.graph.iter_mut().collect();
        while let Some(graph) = stack.pop() {
            for t in graph.initializer.iter_mut().filter(|t| is_external(t)) {
                let bytes = self.external_bytes(t)?;
                t.raw_data = Some(Bytes::from(bytes));
                t.external_data.clear();
                t.data_location = None;
            }
            for node in graph.node.iter_mut() {
                for attr in node.attribute.iter_mut() {
                    stack.extend(attr.g.iter_mut());
                    stack.extend(attr.graphs.iter_mut());
                }
            }
        }
        Ok(())
    }
}

/// Protobuf messages cannot exceed 2 GiB; stay clear of it.
const PROTOBUF_LIMIT: usize = 1 << 30;

/// Moves inline raw data of 1 KiB and more into one external file beside the model, as ONNX's own
/// `save_model(..., save_as_external_data=True)` does, so a rewritten large model stays loadable.
fn externalize_large_tensors(proto: &mut ModelProto, dir: &Path, data_name: &str) -> Result<(), ModelError> {
    let data_path = dir.join(data_name);
    let io = |source| ModelError::Write { path: data_path.clone(), source };
    let mut file = std::io::BufWriter::new(fs::File::create(&data_path).map_err(io)?);
    let mut offset = 0u64;
    let mut stack: Vec<&mut GraphProto> = proto.graph.iter_mut().collect();
    while let Some(graph) = stack.pop() {
        for t in graph.initializer.iter_mut() {
            let Some(raw) = t.raw_data.take_if(|r| r.len() >= 1024) else { continue };
            file.write_all(&raw).map_err(io)?;
            let entry = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
            t.external_data = vec![
                entry("location", data_name.to_string()),
                entry("offset", offset.to_string()),
                entry("length", raw.len().to_string()),
            ];
            t.data_location = Some(tensor_proto::DataLocation::External as i32);
            offset += raw.len() as u64;
        }
        for node in graph.node.iter_mut() {
            for attr in node.attribute.iter_mut() {
                stack.extend(attr.g.iter_mut());
                stack.extend(attr.graphs.iter_mut());
            }
        }
    }
    file.flush().map_err(io)?;
    Ok(())
}

impl Model {
    /// Saves `proto` (a rewrite of this model) as a standalone model at `path`: external tensors
    /// are read in, and a result over 1 GiB moves its large tensors into `<path>.data` beside it.
    /// The file is written to a temporary name and renamed, so it is complete or absent.
    pub fn save_standalone(&self, proto: &ModelProto, path: &Path) -> Result<(), ModelError> {
        let mut proto = proto.clone();
        self.materialize_external(&mut proto)?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name = path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_else(|| "model.onnx".into());
        if proto.encoded_len() > PROTOBUF_LIMIT {
            externalize_large_tensors(&mut proto, &dir, &format!("{file_name}.data"))?;
        }
        let io = |source| ModelError::Write { path: path.to_path_buf(), source };
        let mut tmp = tempfile::Builder::new().prefix(".layerwise-").suffix(".tmp").tempfile_in(&dir).map_err(io)?;
        tmp.write_all(&proto.encode_to_vec()).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        // Temporary files are private (0600); a written model gets the usual 0644.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o644)).map_err(io)?;
        }
        tmp.persist(path).map_err(|e| io(e.error))?;
        Ok(())
    }

    /// The bytes of an externally stored tensor.
    pub(crate) fn external_bytes(&self, t: &TensorProto) -> Result<Vec<u8>, ModelError> {
        use std::io::{Read, Seek, SeekFrom};
        let err = |why: String| ModelError::ExternalData { tensor: t.name().to_string(), why };
        let ext = ExternalRef::parse(t).map_err(err)?;
        let path = self.external_file(&ext.location).ok_or_else(|| err("in-memory model".into()))?;
        let numel: u64 = t.dims.iter().map(|&d| d.max(0) as u64).product();
        let len = ext.length.unwrap_or(numel * data_type_size(t.data_type()).unwrap_or(0) as u64) as usize;
        let mut buf = vec![0u8; len];
        let mut f = fs::File::open(&path).map_err(|e| err(format!("cannot open '{}': {e}", path.display())))?;
        f.seek(SeekFrom::Start(ext.offset))
            .and_then(|_| f.read_exact(&mut buf))
            .map_err(|e| err(format!("cannot read {len} bytes at offset {} of '{}': {e}", ext.offset, path.display())))?;
        Ok(buf)
    }
}

pub(crate) fn is_external(t: &TensorProto) -> bool {
    t.data_location == Some(tensor_proto::DataLocation::External as i32)
}

/// The parsed `external_data` entries of a tensor.
pub(crate) struct ExternalRef {
    pub location: String,
    pub offset: u64,
    pub length: Option<u64>,
}

impl ExternalRef {
    pub(crate) fn parse(t: &TensorProto) -> Result<ExternalRef, String> {
        let get = |key: &str| t.external_data.iter().find(|e: &&StringStringEntryProto| e.key() == key).map(|e| e.value());
        let location = get("location").ok_or("no 'location' entry")?.to_string();
        let rel = Path::new(&location);
        if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
            return Err(format!("location '{location}' points outside the model's folder; refused"));
        }
        let number = |key: &str| -> Result<Option<u64>, String> {
            get(key).map(|v| v.parse::<u64>().map_err(|_| format!("'{key}' is not a byte count: '{v}'"))).transpose()
        };
        Ok(ExternalRef { location, offset: number("offset")?.unwrap_or(0), length: number("length")? })
    }
}

/// Visits the initializers of a graph and of all its subgraphs.
pub(crate) fn for_each_initializer(graph: &GraphProto, f: &mut dyn FnMut(&TensorProto)) {
    for t in &graph.initializer {
        f(t);
    }
    for node in &graph.node {
        for attr in &node.attribute {
            for g in attr.g.iter().chain(attr.graphs.iter()) {
                for_each_initializer(g, f);
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
