//! `.npy` / `.npz` reading and writing with the element type decided at run time.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::path::Path;

use half::{bf16, f16};
use npyz::{NpyFile, TypeChar, WriterBuilder};

use crate::{DType, RuntimeError, Tensor, TensorData};

fn bad(path: &Path, why: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::TensorFile { path: path.to_path_buf(), why: why.to_string() }
}

/// Reads one array from an `.npy` stream. `path` and `name` are only for messages.
pub fn read_npy<R: Read>(reader: R, path: &Path) -> Result<Tensor, RuntimeError> {
    let npy = NpyFile::new(reader).map_err(|e| bad(path, format!("not a valid .npy array: {e}")))?;
    tensor_from_npy(npy, path)
}

fn tensor_from_npy<R: Read>(npy: NpyFile<R>, path: &Path) -> Result<Tensor, RuntimeError> {
    if npy.order() == npyz::Order::Fortran {
        return Err(bad(path, "Fortran-ordered arrays are not supported; save with np.ascontiguousarray(a)"));
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let npyz::DType::Plain(ts) = npy.dtype() else {
        return Err(bad(path, "structured (record) arrays are not tensors"));
    };
    // An absurd shape in a header must be an error, not an allocation that fails.
    let bytes = layerwise_model::tensor::tensor_bytes(&shape, ts.size_field() as usize);
    layerwise_model::tensor::check_fits(bytes, &shape).map_err(|why| bad(path, why))?;
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
        _ => return Err(bad(path, format!("unsupported numpy dtype '{ts}'"))),
    };
    let e = |e: io::Error| bad(path, format!("cannot read array data: {e}"));
    let data = match dtype {
        DType::F32 => TensorData::F32(npy.into_vec().map_err(e)?),
        DType::F16 => TensorData::F16(npy.into_vec().map_err(e)?),
        DType::F64 => TensorData::F64(npy.into_vec().map_err(e)?),
        DType::I8 => TensorData::I8(npy.into_vec().map_err(e)?),
        DType::I16 => TensorData::I16(npy.into_vec().map_err(e)?),
        DType::I32 => TensorData::I32(npy.into_vec().map_err(e)?),
        DType::I64 => TensorData::I64(npy.into_vec().map_err(e)?),
        DType::U8 => TensorData::U8(npy.into_vec().map_err(e)?),
        DType::U16 => TensorData::U16(npy.into_vec().map_err(e)?),
        DType::U32 => TensorData::U32(npy.into_vec().map_err(e)?),
        DType::U64 => TensorData::U64(npy.into_vec().map_err(e)?),
        DType::Bool => TensorData::Bool(npy.into_vec().map_err(e)?),
        DType::BF16 => unreachable!(),
    };
    if data.len() != shape.iter().product::<usize>() {
        return Err(bad(path, "array data is shorter than its shape says"));
    }
    Ok(Tensor::new(shape, data))
}

pub fn read_npy_file(path: &Path) -> Result<Tensor, RuntimeError> {
    let f = File::open(path).map_err(|e| bad(path, format!("cannot open: {e}")))?;
    read_npy(BufReader::new(f), path)
}

/// Reads every array of an `.npz` archive, in the archive's order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>, RuntimeError> {
    let f = File::open(path).map_err(|e| bad(path, format!("cannot open: {e}")))?;
    read_npz_from(BufReader::new(f), path)
}

pub fn read_npz_from<R: Read + Seek>(reader: R, path: &Path) -> Result<Vec<(String, Tensor)>, RuntimeError> {
    let mut archive = npyz::npz::NpzArchive::new(reader).map_err(|e| bad(path, format!("not a valid .npz archive: {e}")))?;
    let names: Vec<String> = archive.array_names().map(str::to_string).collect();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let npy = archive
            .by_name(&name)
            .map_err(|e| bad(path, format!("array '{name}': {e}")))?
            .ok_or_else(|| bad(path, format!("array '{name}' disappeared")))?;
        let inner = path.join(&name);
        let tensor = tensor_from_npy(npy, &inner)?;
        out.push((name, tensor));
    }
    Ok(out)
}

fn write_typed<T: npyz::Serialize + npyz::AutoSerialize + Copy, W: Write>(w: W, shape: &[u64], v: &[T]) -> io::Result<()> {
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
        let options = npyz::zip::write::FileOptions::default().compression_method(npyz::zip::CompressionMethod::Stored).large_file(true);
        zip.start_file(npyz::npz::file_name_from_array_name(name), options).map_err(|e| io(e.into()))?;
        write_npy(&mut zip, t).map_err(io)?;
    }
    let mut w = zip.finish().map_err(|e| io(e.into()))?;
    w.flush().map_err(io)
}
