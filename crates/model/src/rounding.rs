//! The reduced precisions layerwise emulates on float32 hardware, and how each rounds a value.

use half::{bf16, f16};

/// What an emulation rounds values to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// IEEE half: 11 significant bits, largest finite value 65504. Every stored tensor and weight.
    Fp16,
    /// bfloat16: 8 significant bits, float32's exponent range. Every stored tensor and weight.
    Bf16,
    /// TensorFloat-32: 11 significant bits, float32's range, only the multiplied inputs of the ops
    /// in [`TF32_OPS`]; accumulation and every stored tensor stay float32.
    Tf32,
}

/// Ops whose multiplied inputs a TF32 tensor core reads in TF32 on ONNX Runtime's CUDA provider,
/// with those inputs' slots, as measured on an H100 (docs/emulation.md, per-op table): Conv,
/// MatMul, Gemm, a two-operand Einsum, and the recurrent ops cuDNN runs (LSTM, RNN, and GRU with
/// `linear_before_reset=1`: the CUDA provider runs the other GRU on the CPU). ConvTranspose showed
/// no TF32 effect there and is not rounded.
pub const TF32_OPS: &[(&str, &[usize])] = &[
    ("Conv", &[0, 1]),
    ("MatMul", &[0, 1]),
    ("Gemm", &[0, 1]),
    ("Einsum", &[0, 1]),
    ("LSTM", &[0, 1, 2]),
    ("RNN", &[0, 1, 2]),
    ("GRU", &[0, 1, 2]),
];

/// The input slots of `node` that TF32 tensor cores read (see [`TF32_OPS`]).
pub fn tf32_slots(node: &crate::onnx::NodeProto) -> &'static [usize] {
    let int_attr = |name: &str| node.attribute.iter().find(|a| a.name() == name).and_then(|a| a.i).unwrap_or(0);
    match node.op_type() {
        "Einsum" if node.input.len() < 2 => &[],
        "GRU" if int_attr("linear_before_reset") == 0 => &[],
        op => TF32_OPS.iter().find(|(o, _)| *o == op).map(|(_, s)| *s).unwrap_or(&[]),
    }
}

impl Rounding {
    pub fn name(self) -> &'static str {
        match self {
            Rounding::Fp16 => "fp16",
            Rounding::Bf16 => "bf16",
            Rounding::Tf32 => "tf32",
        }
    }

    pub fn from_name(name: &str) -> Option<Rounding> {
        [Rounding::Fp16, Rounding::Bf16, Rounding::Tf32].into_iter().find(|r| r.name() == name)
    }

    /// Rounds a float32 value to this precision (round to nearest, ties to even) and back.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Rounding::Fp16 => f16::from_f32(x).to_f32(),
            Rounding::Bf16 => bf16::from_f32(x).to_f32(),
            Rounding::Tf32 => round_tf32(x),
        }
    }

    /// Relative error of one rounding (half an ulp at 1.0).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Rounding::Fp16 | Rounding::Tf32 => 1.0 / 2048.0,
            Rounding::Bf16 => 1.0 / 256.0,
        }
    }

    /// The ONNX type a stored value has in this precision (TF32 is not a storage type).
    pub fn storage_type(self) -> Option<crate::DataType> {
        match self {
            Rounding::Fp16 => Some(crate::DataType::Float16),
            Rounding::Bf16 => Some(crate::DataType::Bfloat16),
            Rounding::Tf32 => None,
        }
    }
}

/// float32 rounded to TF32's 10 stored mantissa bits (round to nearest, ties to even); inf and NaN
/// pass through. Values whose rounding carries past float32's largest exponent become inf.
pub fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let bits = x.to_bits();
    let lsb = (bits >> 13) & 1;
    f32::from_bits(bits.wrapping_add(0x0FFF + lsb) & !0x1FFF)
}

/// The Veltkamp constant that splits a float32 into its leading 11 significant bits: for
/// `c = x * (2^13 + 1)`, `c - (c - x)` is `x` rounded to 11 bits, in float32 arithmetic alone.
pub const TF32_SPLITTER: f32 = 8193.0;

/// The Veltkamp constant that splits a float32 into its leading 8 significant bits (BF16):
/// `2^16 + 1`. Exact for |x| below about 5.2e33, beyond which `x * 65537` overflows.
pub const BF16_SPLITTER: f32 = 65537.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_veltkamp_split_rounds_as_tf32_does() {
        // Random bit patterns over the normal range, and the halfway cases.
        let mut state = 0x9E37_79B9u32;
        let mut values: Vec<f32> = (0..200_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                f32::from_bits(state)
            })
            .filter(|x| x.is_normal() && x.abs() < 1e30 && x.abs() > 1e-30)
            .collect();
        values.extend([1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), -(1.0 + 2f32.powi(-11)), 1.5, 0.1, 3.0e5]);
        for &x in &values {
            let c = x * TF32_SPLITTER;
            let split = c - (c - x);
            assert_eq!(split.to_bits(), round_tf32(x).to_bits(), "x = {x:e}");
            let c = x * BF16_SPLITTER;
            let split = c - (c - x);
            assert_eq!(split.to_bits(), Rounding::Bf16.round(x).to_bits(), "bf16, x = {x:e}");
        }
    }
}
