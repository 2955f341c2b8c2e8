//! Dense host tensors: what backends return, inputs are made of, and the analysis compares.

use std::borrow::Cow;

use half::{bf16, f16};

/// Element types layerwise can carry between backends and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
}

/// The values of a tensor, one vector per element type.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F64(Vec<f64>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
}

/// A dense host tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

/// Applies `$body` to the vector inside any [`TensorData`] variant.
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            crate::tensor::TensorData::F32($v) => $body,
            crate::tensor::TensorData::F16($v) => $body,
            crate::tensor::TensorData::BF16($v) => $body,
            crate::tensor::TensorData::F64($v) => $body,
            crate::tensor::TensorData::I8($v) => $body,
            crate::tensor::TensorData::I16($v) => $body,
            crate::tensor::TensorData::I32($v) => $body,
            crate::tensor::TensorData::I64($v) => $body,
            crate::tensor::TensorData::U8($v) => $body,
            crate::tensor::TensorData::U16($v) => $body,
            crate::tensor::TensorData::U32($v) => $body,
            crate::tensor::TensorData::U64($v) => $body,
            crate::tensor::TensorData::Bool($v) => $body,
        }
    };
}

impl DType {
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
    ];

    /// The numpy name (`float32`, `int64`, `bool`, ...); also used in reports.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::Bool => "bool",
        }
    }

    /// The ONNX `TensorProto.DataType` code.
    pub fn onnx(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
        }
    }

    pub fn from_onnx(code: i32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.onnx() == code)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// numpy's little-endian type string (`<f4`, `|b1`, ...). bfloat16 has none in numpy.
    pub fn numpy_descr(self) -> Option<&'static str> {
        Some(match self {
            DType::F32 => "<f4",
            DType::F16 => "<f2",
            DType::F64 => "<f8",
            DType::I8 => "|i1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
            DType::U16 => "<u2",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
            DType::Bool => "|b1",
            DType::BF16 => return None,
        })
    }
}

impl TensorData {
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::F64(_) => DType::F64,
            TensorData::I8(_) => DType::I8,
            TensorData::I16(_) => DType::I16,
            TensorData::I32(_) => DType::I32,
            TensorData::I64(_) => DType::I64,
            TensorData::U8(_) => DType::U8,
            TensorData::U16(_) => DType::U16,
            TensorData::U32(_) => DType::U32,
            TensorData::U64(_) => DType::U64,
            TensorData::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        with_data!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: TensorData) -> Tensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { shape, data }
    }

    pub fn f32(shape: Vec<usize>, values: Vec<f32>) -> Tensor {
        Tensor::new(shape, TensorData::F32(values))
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The values of an ONNX `TensorProto` held in the proto itself (`raw_data` or the typed
    /// fields), as ONNX's test data and Polygraphy's `.pb` files store them. Element types layerwise
    /// does not carry (strings, FP8, INT4, complex) and external data are errors.
    pub fn from_proto(t: &crate::onnx::TensorProto) -> Result<Tensor, String> {
        let dtype = DType::from_onnx(t.data_type()).ok_or_else(|| {
            format!("element type {} is not one layerwise carries", crate::data_type_name(t.data_type()))
        })?;
        if crate::is_external(t) {
            return Err("its values are in an external file".into());
        }
        let shape: Vec<usize> = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is negative")))
            .collect::<Result<_, _>>()?;
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or("its shape overflows")?;
        if let Some(raw) = t.raw_data.as_ref().filter(|r| !r.is_empty() || n == 0) {
            return Tensor::from_le_bytes(dtype, shape.clone(), raw)
                .ok_or_else(|| format!("{} bytes of raw data do not fill shape {}", raw.len(), shape_string(&shape)));
        }
        let data = match dtype {
            DType::F32 => TensorData::F32(t.float_data.clone()),
            DType::F64 => TensorData::F64(t.double_data.clone()),
            DType::I64 => TensorData::I64(t.int64_data.clone()),
            DType::U32 => TensorData::U32(t.uint64_data.iter().map(|&v| v as u32).collect()),
            DType::U64 => TensorData::U64(t.uint64_data.clone()),
            // The narrower types are stored one element per int32_data entry (FP16/BF16 as bits).
            DType::I32 => TensorData::I32(t.int32_data.clone()),
            DType::I16 => TensorData::I16(t.int32_data.iter().map(|&v| v as i16).collect()),
            DType::I8 => TensorData::I8(t.int32_data.iter().map(|&v| v as i8).collect()),
            DType::U16 => TensorData::U16(t.int32_data.iter().map(|&v| v as u16).collect()),
            DType::U8 => TensorData::U8(t.int32_data.iter().map(|&v| v as u8).collect()),
            DType::Bool => TensorData::Bool(t.int32_data.iter().map(|&v| v != 0).collect()),
            DType::F16 => TensorData::F16(t.int32_data.iter().map(|&v| f16::from_bits(v as u16)).collect()),
            DType::BF16 => TensorData::BF16(t.int32_data.iter().map(|&v| bf16::from_bits(v as u16)).collect()),
        };
        if data.len() != n {
            return Err(format!("{} values do not fill shape {}", data.len(), shape_string(&shape)));
        }
        Ok(Tensor::new(shape, data))
    }

    /// The tensor as an ONNX `TensorProto` named `name`, values in `raw_data` (ONNX's test-data
    /// `.pb` layout).
    pub fn to_proto(&self, name: &str) -> crate::onnx::TensorProto {
        crate::onnx::TensorProto {
            name: Some(name.to_string()),
            dims: self.shape.iter().map(|&d| d as i64).collect(),
            data_type: Some(self.dtype().onnx()),
            raw_data: Some(self.to_le_bytes().into()),
            ..Default::default()
        }
    }

    /// A tensor from little-endian bytes (what a device copy returns). `None` when the byte count
    /// does not match the shape.
    pub fn from_le_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Option<Tensor> {
        let n: usize = shape.iter().product();
        macro_rules! take {
            ($t:ty, $w:expr, $variant:ident, $conv:expr) => {{
                if bytes.len() != n * $w {
                    return None;
                }
                TensorData::$variant(
                    bytes.chunks_exact($w).map(|c| $conv(c.try_into().expect("chunk width"))).collect::<Vec<$t>>(),
                )
            }};
        }
        let data = match dtype {
            DType::F32 => take!(f32, 4, F32, f32::from_le_bytes),
            DType::F16 => take!(f16, 2, F16, f16::from_le_bytes),
            DType::BF16 => take!(bf16, 2, BF16, bf16::from_le_bytes),
            DType::F64 => take!(f64, 8, F64, f64::from_le_bytes),
            DType::I8 => take!(i8, 1, I8, i8::from_le_bytes),
            DType::I16 => take!(i16, 2, I16, i16::from_le_bytes),
            DType::I32 => take!(i32, 4, I32, i32::from_le_bytes),
            DType::I64 => take!(i64, 8, I64, i64::from_le_bytes),
            DType::U8 => take!(u8, 1, U8, u8::from_le_bytes),
            DType::U16 => take!(u16, 2, U16, u16::from_le_bytes),
            DType::U32 => take!(u32, 4, U32, u32::from_le_bytes),
            DType::U64 => take!(u64, 8, U64, u64::from_le_bytes),
            DType::Bool => take!(bool, 1, Bool, |b: [u8; 1]| b[0] != 0),
        };
        Some(Tensor::new(shape, data))
    }

    /// The values as little-endian bytes (what a device copy takes).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I8(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::U8(v) => v.clone(),
            TensorData::U16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::U64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size()
    }

    /// The values as float32 for comparison: borrowed when they already are, converted otherwise
    /// (FP16 candidates are compared as float32, the way they would be widened on the host).
    pub fn to_f32(&self) -> Cow<'_, [f32]> {
        match &self.data {
            TensorData::F32(v) => Cow::Borrowed(v),
            TensorData::F16(v) => Cow::Owned(v.iter().map(|x| x.to_f32()).collect()),
            TensorData::BF16(v) => Cow::Owned(v.iter().map(|x| x.to_f32()).collect()),
            TensorData::F64(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
            TensorData::I8(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
            TensorData::I16(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
            TensorData::I32(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
            TensorData::I64(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
            TensorData::U8(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
            TensorData::U16(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
            TensorData::U32(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
            TensorData::U64(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
            TensorData::Bool(v) => Cow::Owned(v.iter().map(|&x| x as u8 as f32).collect()),
        }
    }

    /// Count of NaN and of ±inf values (zero for integer tensors).
    pub fn non_finite_counts(&self) -> (usize, usize) {
        let count = |it: &mut dyn Iterator<Item = f32>| {
            it.fold((0, 0), |(n, i), x| (n + x.is_nan() as usize, i + x.is_infinite() as usize))
        };
        match &self.data {
            TensorData::F32(v) => count(&mut v.iter().copied()),
            TensorData::F16(v) => count(&mut v.iter().map(|x| x.to_f32())),
            TensorData::BF16(v) => count(&mut v.iter().map(|x| x.to_f32())),
            TensorData::F64(v) => count(&mut v.iter().map(|&x| x as f32)),
            _ => (0, 0),
        }
    }

    pub fn shape_string(&self) -> String {
        shape_string(&self.shape)
    }
}

/// `1x3x224x224`, or `scalar` for rank 0.
pub fn shape_string(shape: &[usize]) -> String {
    if shape.is_empty() {
        "scalar".to_string()
    } else {
        shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
    }
}

/// Bytes a tensor of `shape` with `elem`-byte elements takes; `None` when that overflows.
pub fn tensor_bytes(shape: &[usize], elem: usize) -> Option<u64> {
    shape.iter().try_fold(elem as u64, |acc, &d| acc.checked_mul(d as u64))
}

/// Memory the system reports available (MemAvailable), if it can tell.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// A byte count for messages: `16 B`, `3.8 KiB`, `381.5 MiB`, `3.7 GiB`.
pub fn size(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// Refuses a tensor that could not be held in memory: its size overflows, or exceeds the memory
/// available (or 64 GiB where that is unknown).
pub fn check_fits(bytes: Option<u64>, shape: &[usize]) -> Result<(), String> {
    let limit = available_memory().unwrap_or(64 << 30);
    match bytes {
        None => Err(format!("shape {} is too large to hold (its size overflows)", shape_string(shape))),
        Some(b) if b > limit => Err(format!(
            "shape {} needs {:.1} GiB, more than the {:.1} GiB of memory available",
            shape_string(shape),
            b as f64 / (1u64 << 30) as f64,
            limit as f64 / (1u64 << 30) as f64
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::TensorProto;

    fn proto(data_type: i32, dims: &[i64]) -> TensorProto {
        TensorProto { data_type: Some(data_type), dims: dims.to_vec(), ..Default::default() }
    }

    #[test]
    fn tensor_from_proto_reads_raw_and_typed_fields() {
        let mut raw = proto(1, &[2]);
        raw.raw_data = Some([1.5f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat().into());
        assert_eq!(Tensor::from_proto(&raw).unwrap(), Tensor::f32(vec![2], vec![1.5, -2.0]));

        let mut halfs = proto(10, &[2]);
        halfs.int32_data = vec![f16::from_f32(0.5).to_bits() as i32, f16::from_f32(-3.0).to_bits() as i32];
        assert_eq!(
            Tensor::from_proto(&halfs).unwrap().data,
            TensorData::F16(vec![f16::from_f32(0.5), f16::from_f32(-3.0)])
        );

        let mut bools = proto(9, &[3]);
        bools.int32_data = vec![1, 0, 1];
        assert_eq!(Tensor::from_proto(&bools).unwrap().data, TensorData::Bool(vec![true, false, true]));

        let mut wide = proto(13, &[1]);
        wide.uint64_data = vec![u64::MAX];
        assert_eq!(Tensor::from_proto(&wide).unwrap().data, TensorData::U64(vec![u64::MAX]));

        // A scalar has no dims and one value; an empty tensor has a zero dim and no raw bytes.
        let mut scalar = proto(7, &[]);
        scalar.int64_data = vec![-7];
        assert_eq!(Tensor::from_proto(&scalar).unwrap(), Tensor::new(vec![], TensorData::I64(vec![-7])));
        assert_eq!(Tensor::from_proto(&proto(1, &[0, 3])).unwrap().len(), 0);
    }

    #[test]
    fn tensor_from_proto_refuses_what_it_cannot_hold() {
        let mut short = proto(1, &[3]);
        short.float_data = vec![1.0, 2.0];
        assert_eq!(Tensor::from_proto(&short).unwrap_err(), "2 values do not fill shape 3");
        let mut short_raw = proto(6, &[2]);
        short_raw.raw_data = Some(vec![0u8; 5].into());
        assert_eq!(Tensor::from_proto(&short_raw).unwrap_err(), "5 bytes of raw data do not fill shape 2");
        assert_eq!(Tensor::from_proto(&proto(1, &[-1])).unwrap_err(), "dimension -1 is negative");
        assert!(Tensor::from_proto(&proto(8, &[1])).unwrap_err().contains("is not one layerwise carries"), "strings");
        assert_eq!(Tensor::from_proto(&proto(1, &[i64::MAX, 4])).unwrap_err(), "its shape overflows");
    }
}
