#!/usr/bin/env bash
# The GPU check of docs/gpu.md. Runs on the lent GPU machine, in the repository root, after
# ONNX Runtime's GPU build is unpacked in /tmp/ortgpu and LD_LIBRARY_PATH is set (docs/gpu.md).
# Expects the layerwise binary and PP-OCRv4's recognizer in .gpu/run/ (carried).
set -u
ROOT=$PWD
B=$ROOT/.gpu/run/layerwise
REC=$ROOT/.gpu/run/rec.onnx
export LAYERWISE_ORT_LIB=/tmp/ortgpu/libonnxruntime.so.1.31.1
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" /tmp/gpu-work && cd /tmp/gpu-work
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 "$ROOT/scripts/gpu/make_tf32_model.py" matmul.onnx
run() { echo; echo "\$ layerwise $*"; /usr/bin/time -f "wall %e s, peak RSS %M KB" "$B" "$@"; echo "exit $?"; }
# TF32: a large float32 MatMul, then PP-OCRv4's recognizer, with TF32 on (the default) and off.
run bisect matmul.onnx --ref ort:cpu --cand ort:cuda --json "$OUT/tf32_on.json"
run bisect matmul.onnx --ref ort:cpu --cand ort:cuda,tf32=off --json "$OUT/tf32_off.json"
run bisect "$REC" --input-shape x:1x3x48x320 --val-range x:-1,1 --cand ort:cuda --json "$OUT/rec_tf32_on.json"
run bisect "$REC" --input-shape x:1x3x48x320 --val-range x:-1,1 --cand ort:cuda,tf32=off --json "$OUT/rec_tf32_off.json"
# FP16 models converted by layerwise, run by CUDA's FP16 kernels against ort:cpu float32.
"$B" demo --out-dir demo > /dev/null
run convert demo/demo.onnx --to fp16 -o demo_fp16.onnx
run bisect demo/demo.onnx --cand ort:cuda --cand-model demo_fp16.onnx --json "$OUT/demo_fp16_cuda.json"
run bisect demo/demo.onnx --cand ort:cuda --cand-model demo/demo_fp16_fixed.onnx --json "$OUT/demo_fixed_cuda.json"
run fix demo/demo.onnx --cand ort:cuda -o fixed_cuda.onnx --json "$OUT/fix_cuda.json"
run convert "$REC" --to fp16 -o rec_fp16.onnx
run bisect "$REC" --input-shape x:1x3x48x320 --val-range x:-1,1 --cand ort:cuda --cand-model rec_fp16.onnx --json "$OUT/rec_fp16_cuda.json"
run bisect "$REC" --input-shape x:1x3x48x320 --val-range x:-1,1 --cand sim:fp16
# ONNX Runtime's TensorRT provider needs TensorRT's own libraries, which the machine lacks.
run bisect matmul.onnx --cand ort:trt
