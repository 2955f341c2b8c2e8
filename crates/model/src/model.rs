use std::fs;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use prost::Message;
use sha2::{Digest, Sha256};

use crate::onnx::{tensor_proto, GraphProto, ModelProto, NodeProto, StringStringEntryProto, TensorProto};
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
    /// Files that only tensors of node attributes (Constants) kept as external data were read
    /// from on load: read in then, they are no longer referenced, but no output may replace them.
    pub attribute_files: Vec<PathBuf>,
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
    ///
    /// A model path that names (or links to) a device, a FIFO or a folder is refused before a
    /// byte is read ([`open_regular`]); a link to a regular file elsewhere is followed, since the
    /// user named it.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        use std::io::Read;
        if !path.exists() {
            return Err(ModelError::NotFound(path.to_path_buf()));
        }
        let read = |cause| ModelError::Read { path: path.to_path_buf(), cause };
        let mut file = open_regular(path).map_err(read)?;
        let mut data = Vec::with_capacity(file.metadata().map_or(0, |m| m.len() as usize));
        file.read_to_end(&mut data).map_err(read)?;
        Model::from_bytes(data, path)
    }

    /// Decodes and checks the bytes of an `.onnx` file that lives (or would live) at `path`;
    /// external data resolves against `path`'s folder. The fuzz targets enter here.
    pub fn from_bytes(data: Vec<u8>, path: &Path) -> Result<Model, ModelError> {
        let sha256 = hex(&Sha256::digest(&data));
        let proto = ModelProto::decode(Bytes::from(data))
            .map_err(|cause| ModelError::Decode { path: path.to_path_buf(), cause })?;
        let base_dir =
            path.parent().map(|p| if p.as_os_str().is_empty() { PathBuf::from(".") } else { p.to_path_buf() });
        let mut model = Model { proto, path: path.to_path_buf(), base_dir, sha256, attribute_files: Vec::new() };
        model.check_is_model()?;
        model.check_external_data()?;
        model.inline_external_attributes()?;
        Ok(model)
    }

    /// Decodes an `.onnx` file written by a runtime (an optimized model), without the checks and
    /// hash of [`Model::load`]: weights stay slices of the one buffer read.
    pub fn read_proto(path: &Path) -> Result<ModelProto, ModelError> {
        let data = fs::read(path).map_err(|cause| ModelError::Read { path: path.to_path_buf(), cause })?;
        ModelProto::decode(Bytes::from(data)).map_err(|cause| ModelError::Decode { path: path.to_path_buf(), cause })
    }

    /// Wraps a model built in memory (tests, the demo). It must not reference external data.
    pub fn from_proto(proto: ModelProto, label: &str) -> Result<Model, ModelError> {
        let sha256 = hex(&Sha256::digest(proto.encode_to_vec()));
        let model = Model { proto, path: PathBuf::from(label), base_dir: None, sha256, attribute_files: Vec::new() };
        model.check_is_model()?;
        model.check_external_data()?;
        Ok(model)
    }

    /// A model derived from this one (an extraction, a rewrite kept in memory): its external data
    /// still resolves against this model's folder.
    pub fn derived(&self, proto: ModelProto, label: &str) -> Model {
        let sha256 = hex(&Sha256::digest(proto.encode_to_vec()));
        Model {
            proto,
            path: self.path.with_file_name(label),
            base_dir: self.base_dir.clone(),
            sha256,
            attribute_files: self.attribute_files.clone(),
        }
    }

    pub fn graph(&self) -> &GraphProto {
        self.proto.graph.as_ref().expect("checked on load")
    }

    /// Opset version of the default ONNX domain.
    pub fn opset(&self) -> i64 {
        default_opset(&self.proto)
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
        let (_, file, file_len) = self.open_external(&ext.location).map_err(err)?;
        let numel: i128 = t.dims.iter().map(|&d| d as i128).product();
        let expected = data_type_size(t.data_type()).map(|s| numel * s as i128);
        if let (Some(len), Some(expected)) = (ext.length, expected) {
            if len as i128 != expected {
                return Err(err(format!("length {len} does not match {expected} bytes implied by its shape and type")));
            }
        }
        let needed = ext.offset as i128 + ext.length.map(|l| l as i128).or(expected).unwrap_or(0);
        if needed > file_len as i128 {
            return Err(err(format!(
                "'{}' is {file_len} bytes but the tensor needs bytes up to {needed}",
                file.display()
            )));
        }
        Ok(())
    }

    /// Reads the external data of node attributes (a Constant's `value`, in the graph, its bodies
    /// and its functions) into the model. ONNX Runtime resolves such a tensor against the model's
    /// path, which a model handed over from memory does not have (it read `w.data` from the working
    /// folder instead, another model's weights).
    fn inline_external_attributes(&mut self) -> Result<(), ModelError> {
        let mut tensors: Vec<&mut TensorProto> = Vec::new();
        let mut stack: Vec<&mut NodeProto> = Vec::new();
        // A sparse tensor (an attribute's `sparse_value`, a graph's sparse initializer) keeps its
        // values and indices in tensors of their own, which may be external as any other (a
        // `location` of `.ssh/id_rsa` was resolved against the working folder, unchecked).
        fn sparse_parts(sparse: &mut crate::onnx::SparseTensorProto) -> impl Iterator<Item = &mut TensorProto> {
            sparse.values.iter_mut().chain(sparse.indices.iter_mut()).filter(|t| is_external(t))
        }
        if let Some(g) = self.proto.graph.as_mut() {
            tensors.extend(g.sparse_initializer.iter_mut().flat_map(sparse_parts));
            stack.extend(g.node.iter_mut());
        }
        for f in self.proto.functions.iter_mut() {
            stack.extend(f.node.iter_mut());
        }
        while let Some(node) = stack.pop() {
            for attr in node.attribute.iter_mut() {
                tensors.extend(attr.t.iter_mut().filter(|t| is_external(t)));
                tensors.extend(attr.tensors.iter_mut().filter(|t| is_external(t)));
                tensors
                    .extend(attr.sparse_tensor.iter_mut().chain(attr.sparse_tensors.iter_mut()).flat_map(sparse_parts));
                for g in attr.g.iter_mut().chain(attr.graphs.iter_mut()) {
                    tensors.extend(g.sparse_initializer.iter_mut().flat_map(sparse_parts));
                    stack.extend(g.node.iter_mut());
                }
            }
        }
        let reader = Model {
            proto: ModelProto::default(),
            path: self.path.clone(),
            base_dir: self.base_dir.clone(),
            sha256: String::new(),
            attribute_files: Vec::new(),
        };
        let mut files = Vec::new();
        for t in tensors {
            reader.check_one_external(t)?;
            if let Some(f) = ExternalRef::parse(t).ok().and_then(|e| reader.external_file(&e.location)) {
                if !files.contains(&f) {
                    files.push(f);
                }
            }
            t.raw_data = Some(Bytes::from(reader.external_bytes(t)?));
            t.external_data.clear();
            t.data_location = None;
        }
        self.attribute_files = files;
        Ok(())
    }

    /// The files this model's external data lives in (each once), which no output may replace.
    pub fn external_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.attribute_files.clone();
        if let Some(g) = &self.proto.graph {
            for_each_initializer(g, &mut |t| {
                if let Some(f) =
                    ExternalRef::parse(t).ok().filter(|_| is_external(t)).and_then(|e| self.external_file(&e.location))
                {
                    if !files.contains(&f) {
                        files.push(f);
                    }
                }
            });
        }
        files
    }

    /// Whether `other`'s external data resolves against the same folder as this model's.
    pub fn same_folder(&self, other: &Model) -> bool {
        let canonical = |m: &Model| m.base_dir.as_ref().and_then(|b| fs::canonicalize(b).ok());
        canonical(self).is_some() && canonical(self) == canonical(other)
    }

    /// Absolute path of an external data file referenced by this model.
    pub(crate) fn external_file(&self, location: &str) -> Option<PathBuf> {
        self.base_dir.as_ref().map(|b| b.join(location))
    }

    /// Opens the external data file `location` (a relative path without `..`, as
    /// [`ExternalRef::parse`] checked): the one check of external data, for every command and on
    /// every read. Resolved with its links (the file's and its folders'), it must lie inside the
    /// model's folder, resolved too, and be a regular file: a link to `/etc/passwd`, or a folder
    /// linked to another, is refused before a byte is read (`convert`
    /// embedded the link's target in the written model). Returns the opened file, its path as
    /// the model names it, and its length.
    fn open_external(&self, location: &str) -> Result<(fs::File, PathBuf, u64), String> {
        let Some(base) = &self.base_dir else {
            return Err("the model was built in memory, so external data has no folder to resolve against".into());
        };
        let file = base.join(location);
        let folder = fs::canonicalize(base)
            .map_err(|e| format!("cannot resolve the model's folder '{}': {e}", base.display()))?;
        let resolved = fs::canonicalize(&file).map_err(|e| format!("cannot open '{}': {e}", file.display()))?;
        if !resolved.starts_with(&folder) {
            return Err(format!(
                "location '{location}' points outside the model's folder (through a symbolic link, to '{}'); refused",
                resolved.display()
            ));
        }
        let opened = open_regular(&resolved).map_err(|e| format!("cannot open '{}': {e}", file.display()))?;
        let len = opened.metadata().map_err(|e| format!("cannot open '{}': {e}", file.display()))?.len();
        Ok((opened, file, len))
    }

    /// Like [`Model::runtime_bytes`], with every weight of 1 KiB and more written to
    /// `scratch/model.onnx.data` (the folder returned) instead of the bytes. Taking `proto` lets each
    /// weight's memory go as soon as it is written, so a large rewrite is never held twice.
    pub fn runtime_bytes_weights_apart(
        &self,
        mut proto: ModelProto,
        scratch: &Path,
    ) -> Result<(Vec<u8>, PathBuf), ModelError> {
        self.relocate_weights(&mut proto, &scratch.join("model.onnx.data"), "model.onnx.data", true)?;
        Ok((proto.encode_to_vec(), scratch.to_path_buf()))
    }

    /// The bytes a runtime should load for `proto` (a rewrite of this model), and the folder its
    /// external data resolves against. Runtimes refuse external data outside the model's own
    /// folder (ONNX Runtime resolves links too), so a rewrite is loaded from memory with the
    /// original model's folder as its external-data folder. A rewrite over 1 GiB reads its
    /// external tensors in and moves every large tensor into `scratch`, which becomes the folder.
    pub fn runtime_bytes(&self, proto: &ModelProto, scratch: &Path) -> Result<(Vec<u8>, Option<PathBuf>), ModelError> {
        let mut external = false;
        if let Some(g) = &proto.graph {
            for_each_initializer(g, &mut |t| external |= is_external(t));
        }
        let oversized = proto.encoded_len() > PROTOBUF_LIMIT;
        if oversized {
            // Raw data are shared `Bytes`, so this clone copies no weights.
            let mut proto = proto.clone();
            self.relocate_weights(&mut proto, &scratch.join("model.onnx.data"), "model.onnx.data", oversized)?;
            return Ok((proto.encode_to_vec(), Some(scratch.to_path_buf())));
        }
        let folder = match (&self.base_dir, external) {
            (Some(base), true) => {
                Some(fs::canonicalize(base).map_err(|cause| ModelError::Read { path: base.clone(), cause })?)
            }
            _ => None,
        };
        Ok((proto.encode_to_vec(), folder))
    }

    /// `proto` (a rewrite of this model) with its external tensors read in, where they total at
    /// most `limit` bytes; `None` above it (or when it has none).
    pub fn inlined_within(&self, proto: &ModelProto, limit: u64) -> Result<Option<ModelProto>, ModelError> {
        let mut external_bytes = 0u64;
        if let Some(g) = &proto.graph {
            for_each_initializer(g, &mut |t| {
                if is_external(t) {
                    let numel: u64 = t.dims.iter().map(|&d| d.max(0) as u64).product();
                    external_bytes += ExternalRef::parse(t)
                        .ok()
                        .and_then(|e| e.length)
                        .unwrap_or(numel * data_type_size(t.data_type()).unwrap_or(0) as u64);
                }
            });
        }
        if external_bytes == 0 || external_bytes > limit {
            return Ok(None);
        }
        // Raw data are shared `Bytes`, so this clone copies no weights.
        let mut proto = proto.clone();
        self.materialize_external(&mut proto)?;
        Ok(Some(proto))
    }

    /// Reads every external tensor of `proto` into inline raw data.
    fn materialize_external(&self, proto: &mut ModelProto) -> Result<(), ModelError> {
        for_each_initializer_mut(proto, &mut |t| {
            if is_external(t) {
                let bytes = self.external_bytes(t)?;
                t.raw_data = Some(Bytes::from(bytes));
                t.external_data.clear();
                t.data_location = None;
            }
            Ok(())
        })
    }

    /// Writes every external tensor of `proto` (and, when `move_inline`, every inline tensor of
    /// 1 KiB and more) into `data_path`, which the tensors then name as `location` (the file's
    /// name once in place: callers may write to a temporary name and rename).
    /// External tensors are streamed through a small buffer,
    /// so no weight is ever held whole in memory; offsets are aligned to 64 KiB so that ONNX
    /// Runtime can map them.
    fn relocate_weights(
        &self,
        proto: &mut ModelProto,
        data_path: &Path,
        location: &str,
        move_inline: bool,
    ) -> Result<(), ModelError> {
        const ALIGN: u64 = 64 << 10;
        let io = |cause| ModelError::Write { path: data_path.to_path_buf(), cause };
        let mut file = std::io::BufWriter::with_capacity(1 << 20, fs::File::create(data_path).map_err(io)?);
        let mut offset = 0u64;
        for_each_initializer_mut(proto, &mut |t| {
            let padding = offset.next_multiple_of(ALIGN) - offset;
            let length = if is_external(t) {
                file.write_all(&vec![0u8; padding as usize]).map_err(io)?;
                self.stream_external(t, &mut file)?
            } else if let Some(raw) = t.raw_data.take_if(|r| move_inline && r.len() >= 1024) {
                file.write_all(&vec![0u8; padding as usize]).map_err(io)?;
                file.write_all(&raw).map_err(io)?;
                raw.len() as u64
            } else {
                return Ok(());
            };
            offset += padding;
            let entry = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
            t.external_data = vec![
                entry("location", location.to_string()),
                entry("offset", offset.to_string()),
                entry("length", length.to_string()),
            ];
            t.data_location = Some(tensor_proto::DataLocation::External as i32);
            offset += length;
            Ok(())
        })?;
        file.flush().map_err(io)?;
        Ok(())
    }
}

/// Protobuf messages cannot exceed 2 GiB; stay clear of it.
const PROTOBUF_LIMIT: usize = 1 << 30;

impl Model {
    /// Saves `proto` (a rewrite of this model) as a standalone model at `path`: external tensors
    /// are read in, and a result over 1 GiB moves its large tensors into `<path>.data` beside it.
    /// The file is written to a temporary name and renamed, so it is complete or absent.
    /// Where [`Model::save_standalone`] puts the weights of a model over 1 GiB: `<path>.data`,
    /// an output too, which no input may be.
    pub fn oversized_data_path(path: &Path) -> PathBuf {
        let mut name = path.file_name().map(|f| f.to_os_string()).unwrap_or_else(|| "model.onnx".into());
        name.push(".data");
        path.with_file_name(name)
    }

    pub fn save_standalone(&self, proto: &ModelProto, path: &Path) -> Result<(), ModelError> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name =
            path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_else(|| "model.onnx".into());
        let io = |cause| ModelError::Write { path: path.to_path_buf(), cause };
        let mut external_bytes = 0u64;
        if let Some(g) = &proto.graph {
            for_each_initializer(g, &mut |t| {
                if is_external(t) {
                    external_bytes += ExternalRef::parse(t).ok().and_then(|e| e.length).unwrap_or(0);
                }
            });
        }
        let mut proto = proto.clone();
        let oversized = proto.encoded_len() as u64 + external_bytes > PROTOBUF_LIMIT as u64;
        // A device (/dev/null) is written to, never renamed over.
        if !oversized && fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
            self.materialize_external(&mut proto)?;
            return crate::scratch::write_if_not_a_file(path, &proto.encode_to_vec()).unwrap_or(Ok(())).map_err(io);
        }
        // A model that stays under the protobuf limit with its weights inline is written as one
        // file; a larger one streams its weights into `<path>.data` beside it.
        let mut data_file = None;
        if oversized {
            let data_path = Model::oversized_data_path(path);
            let data_name = data_path
                .file_name()
                .map(|f| f.to_string_lossy().to_string())
                .unwrap_or_else(|| format!("{file_name}.data"));
            let (tmp, tracked) = crate::scratch::create_tracked(
                || tempfile::Builder::new().prefix(".layerwise-").suffix(".data.tmp").tempfile_in(&dir),
                |t| t.path(),
            )
            .map_err(io)?;
            self.relocate_weights(&mut proto, tmp.path(), &data_name, true)?;
            data_file = Some((tmp, dir.join(data_name), tracked));
        } else {
            self.materialize_external(&mut proto)?;
        }
        let (mut tmp, _tracked) = crate::scratch::create_tracked(
            || tempfile::Builder::new().prefix(".layerwise-").suffix(".tmp").tempfile_in(&dir),
            |t| t.path(),
        )
        .map_err(io)?;
        tmp.write_all(&proto.encode_to_vec()).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        // Temporary files are private (0600); a written model gets the usual 0644.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for f in std::iter::once(tmp.path()).chain(data_file.as_ref().map(|(d, _, _)| d.path())) {
                fs::set_permissions(f, fs::Permissions::from_mode(0o644)).map_err(io)?;
            }
        }
        if let Some((data, final_path, _tracked)) = data_file {
            data.as_file().sync_all().map_err(io)?;
            data.persist(&final_path).map_err(|e| io(e.error))?;
            crate::scratch::note_written(&final_path);
        }
        tmp.persist(path).map_err(|e| io(e.error))?;
        crate::scratch::note_written(path);
        Ok(())
    }

    /// The bytes of an externally stored tensor.
    fn external_bytes(&self, t: &TensorProto) -> Result<Vec<u8>, ModelError> {
        let mut bytes = Vec::new();
        self.for_each_external_chunk(t, &mut |chunk| {
            bytes.extend_from_slice(chunk);
            Ok(())
        })?;
        Ok(bytes)
    }

    /// Streams an external tensor's bytes to `out` through an 8 MiB
    /// buffer; returns the byte count.
    fn stream_external(&self, t: &TensorProto, out: &mut dyn Write) -> Result<u64, ModelError> {
        self.for_each_external_chunk(t, &mut |chunk| {
            out.write_all(chunk).map_err(|e| format!("cannot write a copy: {e}"))
        })
    }

    /// Calls `f` on successive chunks (whole elements, at most 8 MiB) of an external tensor's
    /// bytes; returns the byte count.
    pub(crate) fn for_each_external_chunk(
        &self,
        t: &TensorProto,
        f: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<u64, ModelError> {
        use std::io::{Read, Seek, SeekFrom};
        let err = |why: String| ModelError::ExternalData { tensor: t.name().to_string(), why };
        let ext = ExternalRef::parse(t).map_err(err)?;
        let (mut file, path, _) = self.open_external(&ext.location).map_err(err)?;
        let numel: u64 = t.dims.iter().map(|&d| d.max(0) as u64).product();
        let len = ext.length.unwrap_or(numel * data_type_size(t.data_type()).unwrap_or(0) as u64);
        file.seek(SeekFrom::Start(ext.offset)).map_err(|e| err(format!("cannot seek in '{}': {e}", path.display())))?;
        let mut buf = vec![0u8; (8usize << 20).min(len as usize)];
        let mut left = len;
        while left > 0 {
            let n = (buf.len() as u64).min(left) as usize;
            file.read_exact(&mut buf[..n]).map_err(|e| {
                err(format!("cannot read {len} bytes at offset {} of '{}': {e}", ext.offset, path.display()))
            })?;
            f(&buf[..n]).map_err(err)?;
            left -= n as u64;
        }
        Ok(len)
    }
}

/// Opens `path` for reading only if it is a regular file, its links followed: a device
/// (`/dev/zero`, read without end), a FIFO (blocks until a writer comes), a socket or a folder is
/// refused before a byte is read. The path is checked first (opening some devices does
/// something), then opened without blocking (`O_NONBLOCK`, which a regular file ignores) and the
/// opened file checked again, so nothing swapped in between is read either. For every file
/// layerwise reads as input: models, external data, npz/npy files, saved runs, scripts.
pub fn open_regular(path: &Path) -> std::io::Result<fs::File> {
    fs::metadata(path).and_then(|m| regular(&m))?;
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    regular(&file.metadata()?)?;
    Ok(file)
}

/// Ok for a regular file; else an error saying what it is.
fn regular(meta: &fs::Metadata) -> std::io::Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    let what = file_kind(meta.file_type());
    Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("it is {what}, not a regular file; refused")))
}

#[cfg(unix)]
fn file_kind(t: fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a named pipe (FIFO)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn file_kind(t: fs::FileType) -> &'static str {
    if t.is_dir() {
        "a folder"
    } else {
        "a special file"
    }
}

/// Opset version of a model's default ONNX domain (0 when it imports none).
pub(crate) fn default_opset(proto: &ModelProto) -> i64 {
    proto
        .opset_import
        .iter()
        .find(|o| o.domain().is_empty() || o.domain() == "ai.onnx")
        .map(|o| o.version())
        .unwrap_or(0)
}

/// Whether a tensor's values live in an external file.
pub fn is_external(t: &TensorProto) -> bool {
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
        let get =
            |key: &str| t.external_data.iter().find(|e: &&StringStringEntryProto| e.key() == key).map(|e| e.value());
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

/// Visits the initializers of a model's graph and of all its subgraphs, mutably.
fn for_each_initializer_mut(
    proto: &mut ModelProto,
    f: &mut dyn FnMut(&mut TensorProto) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let mut stack: Vec<&mut GraphProto> = proto.graph.iter_mut().collect();
    while let Some(graph) = stack.pop() {
        for t in graph.initializer.iter_mut() {
            f(t)?;
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
