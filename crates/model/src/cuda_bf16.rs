//! Which ops ONNX Runtime's CUDA provider runs in BF16, measured: `scripts/gpu/cuda_type_probe.py`
//! built one one-node BF16 model per op and opset 13..23 and created a CUDA-only session
//! (CPU fallback disabled) and ran it, on an H100 with onnxruntime-gpu 1.31.1
//! (docs/measurements/h100-2026-11-23-cuda-kernel-types.json). A BF16 model is written for a GPU
//! (ONNX Runtime's CPU provider has almost no BF16 kernels), so `convert --to bf16` keeps every
//! other op in FP32: a file ONNX Runtime's CUDA provider can load.

/// (op, opsets at which a BF16 node of it ran on the CUDA provider). Ops the probe does not list
/// are unknown and stay FP32.
const CUDA_BF16_KERNELS: &[(&str, &[i64])] = &[
    ("Abs", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Add", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("AveragePool", &[22, 23]),
    ("Concat", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Conv", &[22, 23]),
    ("Cos", &[22, 23]),
    ("Div", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Dropout", &[13, 14, 15, 16, 17, 18, 19, 20, 21]),
    ("Erf", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Exp", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Expand", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Flatten", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Gather", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("GatherElements", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Gelu", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Gemm", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("HardSigmoid", &[22, 23]),
    ("HardSwish", &[22, 23]),
    ("Identity", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("LayerNormalization", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("LpNormalization", &[22, 23]),
    ("MatMul", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Max", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Min", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Mish", &[22, 23]),
    ("Mul", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Neg", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Pow", &[15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("ReduceL1", &[18, 19, 20, 21, 22, 23]),
    ("ReduceL2", &[18]),
    ("ReduceLogSumExp", &[18]),
    ("ReduceMean", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("ReduceSum", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("ReduceSumSquare", &[18, 19, 20, 21, 22, 23]),
    ("Relu", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Reshape", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("ScatterND", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Sigmoid", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Sign", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Sin", &[22, 23]),
    ("Slice", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Softmax", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Softplus", &[22, 23]),
    ("Softsign", &[22, 23]),
    ("Split", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Sqrt", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Squeeze", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Sub", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Sum", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Tanh", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Tile", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Transpose", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Trilu", &[14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Unsqueeze", &[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
    ("Where", &[16, 17, 18, 19, 20, 21, 22, 23]),
];

/// The highest opset probed: a model above it is judged by it.
const LAST_PROBED_OPSET: i64 = 23;

/// Whether ONNX Runtime's CUDA provider (1.31.1) has a BF16 kernel for `op` in a model of `opset`.
pub fn has_cuda_bf16_kernel(op: &str, opset: i64) -> bool {
    let opset = opset.min(LAST_PROBED_OPSET);
    CUDA_BF16_KERNELS.iter().any(|(name, opsets)| *name == op && opsets.contains(&opset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_kernels_follow_the_opset() {
        assert!(has_cuda_bf16_kernel("MatMul", 13));
        // Conv took bfloat16 in ONNX only from opset 22.
        assert!(!has_cuda_bf16_kernel("Conv", 17));
        assert!(has_cuda_bf16_kernel("Conv", 22));
        assert!(has_cuda_bf16_kernel("Conv", 30));
        // Measured without a CUDA BF16 kernel at every opset.
        for op in ["Pad", "Resize", "Clip", "Log", "Reciprocal", "ReduceMax", "LSTM"] {
            assert!((13..=23).all(|v| !has_cuda_bf16_kernel(op, v)), "{op}");
        }
        assert!(!has_cuda_bf16_kernel("ReduceSumSquare", 17));
        assert!(has_cuda_bf16_kernel("ReduceSumSquare", 18));
    }
}
