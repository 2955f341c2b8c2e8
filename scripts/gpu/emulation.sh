#!/usr/bin/env bash
# GPU runs for docs/gpu.md "Emulations against the H100" (issue 14): BF16 models converted by
# layerwise run by ONNX Runtime's CUDA provider, and how the tensor cores round TF32 inputs.
# Runs on the lent GPU machine in the repository root after ONNX Runtime's GPU build is unpacked
# in /tmp/ortgpu and LD_LIBRARY_PATH is set (docs/gpu.md). Expects in .gpu/run/ (carried):
# `layerwise` and yolov8n.onnx (nudenet 3.4.2's 320n.onnx).
source "$(dirname "$0")/setup.sh"
python3 "$ROOT/scripts/gpu/tf32_rounding.py" > "$OUT/tf32_rounding.json" 2>&1; cat "$OUT/tf32_rounding.json"
"$R/layerwise" demo --out-dir demo > /dev/null
for m in yolov8n demo; do
    src=$R/$m.onnx; [ $m = demo ] && src=demo/demo.onnx
    shape=""; [ $m = yolov8n ] && shape="--input-shape images:1x3x320x320"
    "$R/layerwise" convert "$src" --to bf16 -o ${m}_bf16.onnx > "$OUT/${m}_bf16_convert.out" 2>&1; cat "$OUT/${m}_bf16_convert.out" | head -3
    run "${m}_cuda_bf16" "$R/layerwise" bisect "$src" $shape --cand ort:cuda --cand-model ${m}_bf16.onnx --json "$OUT/${m}_cuda_bf16.json"
    "$R/layerwise" convert "$src" --to fp16 -o ${m}_fp16.onnx > /dev/null 2>&1
    run "${m}_cuda_fp16" "$R/layerwise" bisect "$src" $shape --cand ort:cuda --cand-model ${m}_fp16.onnx --json "$OUT/${m}_cuda_fp16.json"
done
