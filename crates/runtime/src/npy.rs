//! `.npy` / `.npz` reading and writing with the element type decided at run time.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::path::Path;

use half::{bf16, f16};
use npyz::{NpyFile, NpyHeader, TypeChar, WriterBuilder};

use crate::{shape_string, DType, RuntimeError, Tensor, TensorData};

fn bad(path: &Path, why: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::TensorFile { path: path.to_path_buf(), why: why.to_string() }
}

/// The longest `.npy` header read: every version-1 header fits (numpy itself reads at most 10,000
/// bytes unless told otherwise). A version-2 header may claim 4 GiB, which was allocated and read
/// (decompressed, in an `.npz`) before anything else.
pub const MAX_HEADER_BYTES: usize = 65_535;
/// The deepest bracket nesting a header may have: a plain array's nests 2 deep (the dict and the
/// shape tuple). A 1,000,000-deep header was parsed recursively and echoed whole into the error.
const MAX_NESTING: usize = 8;
/// The most characters an error quotes of what a file says (a header, an array name).
pub const MAX_QUOTED: usize = 160;

/// `text` as an error may quote it: at most [`MAX_QUOTED`] characters, with the length of the rest.
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}... ({} bytes in all)", &text[..cut], text.len()),
    }
}

/// Checks what an array's header declares (its name in an `.npz`, `""` for an `.npy`; its type
/// and shape) before any of its data is read: a caller that knows what it wants (the model's
/// declared input) refuses a wrong type or shape here, not after decompressing gigabytes.
pub type Expect<'a> = &'a mut dyn FnMut(&str, DType, &[usize]) -> Result<(), RuntimeError>;

/// Reads an `.npy` header from `reader`, bounded ([`MAX_HEADER_BYTES`], [`MAX_NESTING`]); returns
/// it and how many bytes it took.
fn read_header<R: Read>(reader: &mut R, path: &Path) -> Result<(NpyHeader, u64), RuntimeError> {
    let invalid = |why: &str| bad(path, format!("not a valid .npy array: {}", excerpt(why)));
    let mut bytes = vec![0u8; 8];
    reader.read_exact(&mut bytes).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => invalid("magic not found for NPY file"),
        _ => invalid(&e.to_string()),
    })?;
    if &bytes[..6] != b"\x93NUMPY" {
        return Err(invalid("magic not found for NPY file"));
    }
    let size_bytes = match bytes[6] {
        1 => 2,
        2 | 3 => 4,
        v => return Err(invalid(&format!("format version {v}.{} is not one numpy writes", bytes[7]))),
    };
    let mut size = [0u8; 4];
    reader.read_exact(&mut size[..size_bytes]).map_err(|_| invalid("its header is cut short"))?;
    bytes.extend_from_slice(&size[..size_bytes]);
    let len = u32::from_le_bytes(size) as usize;
    if len > MAX_HEADER_BYTES {
        return Err(bad(path, format!("its .npy header says it is {len} bytes, more than the {MAX_HEADER_BYTES} layerwise reads (numpy reads at most 10000); refused")));
    }
    let start = bytes.len();
    reader.take(len as u64).read_to_end(&mut bytes).map_err(|e| invalid(&e.to_string()))?;
    if bytes.len() - start < len {
        return Err(invalid("its header is cut short"));
    }
    let (mut depth, mut deepest, mut quote) = (0usize, 0usize, None);
    for &b in &bytes[start..] {
        match (quote, b) {
            (Some(q), _) if b == q => quote = None,
            (Some(_), _) => {}
            (None, b'\'' | b'"') => quote = Some(b),
            (None, b'(' | b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, b')' | b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > MAX_NESTING {
        return Err(bad(
            path,
            format!("its .npy header nests brackets {deepest} deep (an array's header nests 2); refused"),
        ));
    }
    let header = NpyHeader::from_reader(&bytes[..]).map_err(|e| invalid(&e.to_string()))?;
    Ok((header, bytes.len() as u64))
}

/// The element type and shape a header declares, checked to be something layerwise can hold:
/// a plain C-ordered array of a supported type whose size fits in memory.
fn declared(header: &NpyHeader, path: &Path) -> Result<(DType, Vec<usize>), RuntimeError> {
    let npyz::DType::Plain(ts) = header.dtype() else {
        return Err(bad(path, "structured (record) arrays are not tensors"));
    };
    let dtype = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 4) => DType::F32,
        (TypeChar::Float, 2) => DType::F16,
        (TypeChar::Float, 8) => DType::F64,
        (TypeChar::Int, 1) => DType::I8,
        (TypeChar::Int, 2) => DType::I16,
        (TypeChar::Int, 4) => DType::I32,
        (TypeChar::Int, 8) => DType::I64,
        (TypeChar::Uint, 1) => DType::U8,
        (TypeChar::Uint, 2) => DType::U16,
        (TypeChar::Uint, 4) => DType::U32,
        (TypeChar::Uint, 8) => DType::U64,
        (TypeChar::Bool, 1) => DType::Bool,
        // bfloat16 arrays are saved by layerwise as raw uint16 with a `.bf16` marker in the name.
        _ => return Err(bad(path, format!("unsupported numpy dtype '{}'", excerpt(&ts.to_string())))),
    };
    let shape: Vec<usize> = header.shape().iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
    // An absurd shape in a header must be an error, not an allocation that fails.
    let bytes = layerwise_model::tensor::tensor_bytes(&shape, dtype.size());
    layerwise_model::tensor::check_fits(bytes, &shape).map_err(|why| bad(path, why))?;
    Ok((dtype, shape))
}

/// Reads one array whose header `reader` is at: the header first, checked ([`declared`], then
/// `expect`, then against the `available` bytes of data where they are known), and only then its
/// data, into a vector allocated once.
fn read_array<R: Read>(
    mut reader: R,
    path: &Path,
    name: &str,
    available: Option<u64>,
    expect: Expect,
) -> Result<Tensor, RuntimeError> {
    let (header, header_bytes) = read_header(&mut reader, path)?;
    let (dtype, shape) = declared(&header, path)?;
    expect(name, dtype, &shape)?;
    let numel: usize = shape.iter().product();
    let data_bytes = numel as u64 * dtype.size() as u64;
    if let Some(available) = available {
        let follow = available.saturating_sub(header_bytes);
        if data_bytes > follow {
            return Err(bad(
                path,
                format!(
                    "its header declares shape {} ({data_bytes} bytes of data), but only {follow} bytes follow",
                    shape_string(&shape)
                ),
            ));
        }
    }
    let fortran = header.order() == npyz::Order::Fortran;
    let npy = NpyFile::with_header(header, reader);
    let e = |e: io::Error| bad(path, format!("cannot read array data: {}", excerpt(&e.to_string())));
    macro_rules! values {
        ($t:ty) => {{
            let mut values: Vec<$t> = Vec::with_capacity(numel);
            for v in npy
                .data::<$t>()
                .map_err(|e| bad(path, format!("cannot read array data: {}", excerpt(&e.to_string()))))?
            {
                values.push(v.map_err(e)?);
            }
            // numpy and ONNX Runtime take Fortran-ordered arrays (`np.asfortranarray`, a
            // transposed view saved as it is): their values are put in C order.
            if fortran {
                values = c_order_of_fortran(&values, &shape);
            }
            values
        }};
    }
    let data = match dtype {
        DType::F32 => TensorData::F32(values!(f32)),
        DType::F16 => TensorData::F16(values!(f16)),
        DType::F64 => TensorData::F64(values!(f64)),
        DType::I8 => TensorData::I8(values!(i8)),
        DType::I16 => TensorData::I16(values!(i16)),
        DType::I32 => TensorData::I32(values!(i32)),
        DType::I64 => TensorData::I64(values!(i64)),
        DType::U8 => TensorData::U8(values!(u8)),
        DType::U16 => TensorData::U16(values!(u16)),
        DType::U32 => TensorData::U32(values!(u32)),
        DType::U64 => TensorData::U64(values!(u64)),
        DType::Bool => TensorData::Bool(values!(bool)),
        DType::BF16 => unreachable!(),
    };
    if data.len() != numel {
        return Err(bad(path, "array data is shorter than its shape says"));
    }
    Ok(Tensor::new(shape, data))
}

/// `values` laid out in Fortran order (the first index fastest) for `shape`, in C order.
fn c_order_of_fortran<T: Copy>(values: &[T], shape: &[usize]) -> Vec<T> {
    if shape.len() < 2 || values.is_empty() {
        return values.to_vec();
    }
    // Fortran strides: 1, d0, d0*d1, ...
    let mut strides = vec![1usize; shape.len()];
    for k in 1..shape.len() {
        strides[k] = strides[k - 1] * shape[k - 1];
    }
    let mut out = Vec::with_capacity(values.len());
    let mut index = vec![0usize; shape.len()];
    for _ in 0..values.len() {
        out.push(values[index.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()]);
        // The next C-order index: the last dimension fastest.
        for k in (0..shape.len()).rev() {
            index[k] += 1;
            if index[k] < shape[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

fn accept_any(_: &str, _: DType, _: &[usize]) -> Result<(), RuntimeError> {
    Ok(())
}

/// Reads one array from an `.npy` stream. `path` is only for messages.
pub fn read_npy<R: Read>(reader: R, path: &Path) -> Result<Tensor, RuntimeError> {
    read_array(reader, path, "", None, &mut accept_any)
}

/// Opens a file layerwise reads as input: a regular file only ([`layerwise_model::open_regular`]).
fn open(path: &Path) -> Result<(File, u64), RuntimeError> {
    let f = layerwise_model::open_regular(path).map_err(|e| bad(path, format!("cannot open: {e}")))?;
    let len = f.metadata().map_err(|e| bad(path, format!("cannot open: {e}")))?.len();
    Ok((f, len))
}

pub fn read_npy_file(path: &Path) -> Result<Tensor, RuntimeError> {
    read_npy_file_checked(path, &mut accept_any)
}

/// [`read_npy_file`], with the header checked by `expect` before the data is read.
pub fn read_npy_file_checked(path: &Path, expect: Expect) -> Result<Tensor, RuntimeError> {
    let (f, len) = open(path)?;
    read_array(BufReader::new(f), path, "", Some(len), expect)
}

/// Reads every array of an `.npz` archive, in the archive's order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>, RuntimeError> {
    read_npz_checked(path, &mut accept_any)
}

/// [`read_npz`], with each array's header checked by `expect` before its data is decompressed.
pub fn read_npz_checked(path: &Path, expect: Expect) -> Result<Vec<(String, Tensor)>, RuntimeError> {
    let (f, _) = open(path)?;
    read_npz_from_checked(BufReader::new(f), path, expect)
}

pub fn read_npz_from<R: Read + Seek>(reader: R, path: &Path) -> Result<Vec<(String, Tensor)>, RuntimeError> {
    read_npz_from_checked(reader, path, &mut accept_any)
}

/// The arrays of an `.npz` archive, as `(name, element type, shape)`, from their headers alone:
/// no data is decompressed.
pub fn npz_headers(path: &Path) -> Result<Vec<(String, DType, Vec<usize>)>, RuntimeError> {
    let (f, _) = open(path)?;
    let mut archive = open_archive(BufReader::new(f), path)?;
    let mut found = Vec::new();
    for i in 0..archive.len() {
        let mut member = archive
            .by_index(i)
            .map_err(|e| bad(path, format!("not a valid .npz archive: {}", excerpt(&e.to_string()))))?;
        let Some(name) = npyz::npz::array_name_from_file_name(member.name()).map(str::to_string) else { continue };
        let inner = path.join(excerpt(&name));
        let (header, _) = read_header(&mut member, &inner)?;
        let (dtype, shape) = declared(&header, &inner)?;
        found.push((name, dtype, shape));
    }
    Ok(found)
}

/// The element type and shape an `.npy` file's header declares; no data is read.
pub fn npy_header(path: &Path) -> Result<(DType, Vec<usize>), RuntimeError> {
    let (f, _) = open(path)?;
    let (header, _) = read_header(&mut BufReader::new(f), path)?;
    declared(&header, path)
}

fn open_archive<R: Read + Seek>(reader: R, path: &Path) -> Result<npyz::zip::ZipArchive<R>, RuntimeError> {
    npyz::zip::ZipArchive::new(reader)
        .map_err(|e| bad(path, format!("not a valid .npz archive: {}", excerpt(&e.to_string()))))
}

fn read_npz_from_checked<R: Read + Seek>(
    reader: R,
    path: &Path,
    expect: Expect,
) -> Result<Vec<(String, Tensor)>, RuntimeError> {
    let mut archive = open_archive(reader, path)?;
    let mut out: Vec<(String, Tensor)> = Vec::new();
    for i in 0..archive.len() {
        let member = archive
            .by_index(i)
            .map_err(|e| bad(path, format!("not a valid .npz archive: {}", excerpt(&e.to_string()))))?;
        let Some(name) = npyz::npz::array_name_from_file_name(member.name()).map(str::to_string) else { continue };
        let inner = path.join(excerpt(&name));
        if out.iter().any(|(n, _)| *n == name) {
            return Err(bad(&inner, "the archive holds two arrays of this name"));
        }
        let size = member.size();
        let tensor = read_array(member, &inner, &name, Some(size), expect)?;
        out.push((name, tensor));
    }
    Ok(out)
}

fn write_typed<T: npyz::Serialize + npyz::AutoSerialize + Copy, W: Write>(
    w: W,
    shape: &[u64],
    v: &[T],
) -> io::Result<()> {
    let mut writer = npyz::WriteOptions::new().default_dtype().shape(shape).writer(w).begin_nd()?;
    writer.extend(v.iter().copied())?;
    writer.finish()
}

/// Writes a tensor as `.npy` to any writer. bfloat16 is written as its uint16 bit pattern.
pub fn write_npy<W: Write>(w: W, t: &Tensor) -> io::Result<()> {
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    match &t.data {
        TensorData::F32(v) => write_typed(w, &shape, v),
        TensorData::F16(v) => write_typed::<f16, _>(w, &shape, v),
        TensorData::BF16(v) => write_typed(w, &shape, &v.iter().map(|x: &bf16| x.to_bits()).collect::<Vec<u16>>()),
        TensorData::F64(v) => write_typed(w, &shape, v),
        TensorData::I8(v) => write_typed(w, &shape, v),
        TensorData::I16(v) => write_typed(w, &shape, v),
        TensorData::I32(v) => write_typed(w, &shape, v),
        TensorData::I64(v) => write_typed(w, &shape, v),
        TensorData::U8(v) => write_typed(w, &shape, v),
        TensorData::U16(v) => write_typed(w, &shape, v),
        TensorData::U32(v) => write_typed(w, &shape, v),
        TensorData::U64(v) => write_typed(w, &shape, v),
        TensorData::Bool(v) => write_typed(w, &shape, v),
    }
}

pub fn write_npy_file(path: &Path, t: &Tensor) -> Result<(), RuntimeError> {
    let io = |e: io::Error| RuntimeError::Io { path: path.to_path_buf(), cause: e };
    let f = File::create(path).map_err(io)?;
    let mut w = BufWriter::new(f);
    write_npy(&mut w, t).map_err(io)?;
    w.flush().map_err(io)
}

/// Writes named tensors as an `.npz` archive (uncompressed, as `np.savez`).
pub fn write_npz(path: &Path, tensors: &[(&str, &Tensor)]) -> Result<(), RuntimeError> {
    let io = |e: io::Error| RuntimeError::Io { path: path.to_path_buf(), cause: e };
    let f = File::create(path).map_err(io)?;
    let mut zip = npyz::zip::ZipWriter::new(BufWriter::new(f));
    for (name, t) in tensors {
        let options = npyz::zip::write::FileOptions::default()
            .compression_method(npyz::zip::CompressionMethod::Stored)
            .large_file(true);
        zip.start_file(npyz::npz::file_name_from_array_name(name), options).map_err(|e| io(e.into()))?;
        write_npy(&mut zip, t).map_err(io)?;
    }
    let mut w = zip.finish().map_err(|e| io(e.into()))?;
    w.flush().map_err(io)
}
