//! What a candidate computes in, as one type every crate asks: how values are stored between ops
//! ([`Precision`]), whether float32 products run on TF32 tensor cores, and the quantization
//! family of a Q/DQ model ([`QuantFamily`]). Its name ([`Arithmetic`]'s `Display`) is what the
//! reports print and the key of the default tolerances and walk rule, matched exhaustively.

use std::fmt;

use crate::DataType;

/// How a value is stored between ops: the numeric precision a backend computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    Fp32,
    Fp16,
    Bf16,
}

impl Precision {
    /// Relative error of one rounding to this storage (half an ulp at 1.0).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Precision::Fp16 => 1.0 / 2048.0,
            Precision::Bf16 => 1.0 / 256.0,
            Precision::Fp32 => f32::EPSILON as f64 / 2.0,
        }
    }

    /// The distance between neighbouring values of this storage at magnitude `x` (`None` for
    /// float32, whose step the comparison never blames).
    pub fn spacing(self, x: f64) -> Option<f64> {
        if !(x > 0.0 && x.is_finite()) {
            return None;
        }
        let e = x.log2().floor();
        match self {
            // Below the smallest normal the spacing stays that of 2^-14; above 65504 is inf.
            Precision::Fp16 => Some(2f64.powf(e.clamp(-14.0, 15.0) - 10.0)),
            Precision::Bf16 => Some(2f64.powf(e.max(-126.0) - 7.0)),
            Precision::Fp32 => None,
        }
    }

    /// The ONNX type a value stored in this precision has.
    pub fn data_type(self) -> DataType {
        match self {
            Precision::Fp32 => DataType::Float,
            Precision::Fp16 => DataType::Float16,
            Precision::Bf16 => DataType::Bfloat16,
        }
    }

    /// "float32", "FP16", "BF16".
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "float32",
            Precision::Fp16 => "FP16",
            Precision::Bf16 => "BF16",
        }
    }
}

/// The formats of a Q/DQ model, grouped as their default tolerances are (int8 and uint8 alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFamily {
    Int4,
    Int8,
    Int16,
    Fp8E4M3,
    Fp8E5M2,
}

impl QuantFamily {
    pub const ALL: [QuantFamily; 5] =
        [QuantFamily::Int4, QuantFamily::Int8, QuantFamily::Int16, QuantFamily::Fp8E4M3, QuantFamily::Fp8E5M2];

    /// "INT8", "FP8 E4M3", ...
    pub fn name(self) -> &'static str {
        match self {
            QuantFamily::Int4 => "INT4",
            QuantFamily::Int8 => "INT8",
            QuantFamily::Int16 => "INT16",
            QuantFamily::Fp8E4M3 => "FP8 E4M3",
            QuantFamily::Fp8E5M2 => "FP8 E5M2",
        }
    }

    /// A float8 format (steps that grow with magnitude), not an integer grid.
    pub fn is_float8(self) -> bool {
        match self {
            QuantFamily::Fp8E4M3 | QuantFamily::Fp8E5M2 => true,
            QuantFamily::Int4 | QuantFamily::Int8 | QuantFamily::Int16 => false,
        }
    }
}

impl fmt::Display for QuantFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the candidate computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arithmetic {
    /// float32 throughout (another runtime, other kernels), with its matrix products and
    /// convolutions on TF32 tensor cores where `tf32`.
    Float32 { tf32: bool },
    /// Values stored in FP16 between ops (emulated, a converted model, a GPU provider in FP16);
    /// `tf32`: the float32 ops left run on TF32 tensor cores.
    Fp16 { tf32: bool },
    /// Values stored in BF16 between ops: float32's range, 8 significant bits.
    Bf16 { tf32: bool },
    /// A Q/DQ model: float32 between its quantizers, judged by its coarsest family.
    Quantized(QuantFamily),
}

impl Arithmetic {
    pub const FLOAT32: Arithmetic = Arithmetic::Float32 { tf32: false };
    pub const TF32: Arithmetic = Arithmetic::Float32 { tf32: true };
    pub const FP16: Arithmetic = Arithmetic::Fp16 { tf32: false };
    pub const BF16: Arithmetic = Arithmetic::Bf16 { tf32: false };

    /// A candidate storing values in `storage`, with TF32 tensor cores for its float32 products.
    pub fn of(storage: Precision, tf32: bool) -> Arithmetic {
        match storage {
            Precision::Fp32 => Arithmetic::Float32 { tf32 },
            Precision::Fp16 => Arithmetic::Fp16 { tf32 },
            Precision::Bf16 => Arithmetic::Bf16 { tf32 },
        }
    }

    /// How values are stored between ops (float32 between a Q/DQ model's quantizers).
    pub fn storage(self) -> Precision {
        match self {
            Arithmetic::Float32 { .. } | Arithmetic::Quantized(_) => Precision::Fp32,
            Arithmetic::Fp16 { .. } => Precision::Fp16,
            Arithmetic::Bf16 { .. } => Precision::Bf16,
        }
    }

    /// Whether float32 matrix products and convolutions run on TF32 tensor cores.
    pub fn tf32(self) -> bool {
        match self {
            Arithmetic::Float32 { tf32 } | Arithmetic::Fp16 { tf32 } | Arithmetic::Bf16 { tf32 } => tf32,
            Arithmetic::Quantized(_) => false,
        }
    }

    /// The quantization family of a Q/DQ candidate.
    pub fn quantized(self) -> Option<QuantFamily> {
        match self {
            Arithmetic::Quantized(family) => Some(family),
            Arithmetic::Float32 { .. } | Arithmetic::Fp16 { .. } | Arithmetic::Bf16 { .. } => None,
        }
    }

    /// Every name [`Arithmetic`]'s `Display` gives, with the arithmetic it stands for: the
    /// storage formats name themselves whatever their float32 ops do, as their defaults do.
    pub fn names() -> Vec<(&'static str, Arithmetic)> {
        let mut names = vec![
            ("float32", Arithmetic::FLOAT32),
            ("TF32", Arithmetic::TF32),
            ("FP16", Arithmetic::FP16),
            ("BF16", Arithmetic::BF16),
        ];
        names.extend(QuantFamily::ALL.map(|f| (f.name(), Arithmetic::Quantized(f))));
        names
    }

    /// The arithmetic a name of [`Arithmetic`]'s `Display` stands for (`None` for any other text).
    pub fn from_name(name: &str) -> Option<Arithmetic> {
        Arithmetic::names().into_iter().find(|(n, _)| *n == name).map(|(_, a)| a)
    }
}

impl Default for Arithmetic {
    fn default() -> Arithmetic {
        Arithmetic::FLOAT32
    }
}

impl fmt::Display for Arithmetic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Arithmetic::Float32 { tf32: false } => "float32",
            Arithmetic::Float32 { tf32: true } => "TF32",
            Arithmetic::Fp16 { .. } => "FP16",
            Arithmetic::Bf16 { .. } => "BF16",
            Arithmetic::Quantized(family) => family.name(),
        };
        f.write_str(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every arithmetic's name reads back as an arithmetic with the same name (a storage format
    /// reads back without its TF32 flag, which its defaults do not depend on).
    #[test]
    fn every_name_reads_back() {
        let every = [
            Arithmetic::FLOAT32,
            Arithmetic::TF32,
            Arithmetic::FP16,
            Arithmetic::of(Precision::Fp16, true),
            Arithmetic::BF16,
            Arithmetic::of(Precision::Bf16, true),
        ]
        .into_iter()
        .chain(QuantFamily::ALL.map(Arithmetic::Quantized));
        for a in every {
            let back = Arithmetic::from_name(&a.to_string()).unwrap_or_else(|| panic!("{a} does not read back"));
            assert_eq!(back.to_string(), a.to_string());
            assert_eq!((back.storage(), back.quantized()), (a.storage(), a.quantized()));
        }
        assert_eq!(Arithmetic::from_name("fp16"), None, "names are exact: a typo is no arithmetic");
    }
}
