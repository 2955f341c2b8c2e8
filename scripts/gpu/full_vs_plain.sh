#!/usr/bin/env bash
# Issue "paired everywhere", GPU part: a full one-sample bisect (`--cand ort:cuda --cand-model`
# the FP16 file) against one plain candidate run, both in fresh processes after a warm-up, for each
# recognizer given (1x3x48x320 in [0,255], seeded). On the lent GPU machine, repository root, after
# `source scripts/gpu/unstage.sh`: R=DIR bash scripts/gpu/full_vs_plain.sh rec.onnx rec5.onnx
# (DIR holds layerwise and the models).
source "$(dirname "$0")/setup.sh"
samples 1
for model in "$@"; do
    name=${model%.onnx}
    "$R/layerwise" convert "$R/$model" --to fp16 -o "${name}_fp16.onnx" > /dev/null
    for attempt in 0 1 2; do
        python3 - "${name}_fp16.onnx" <<'PY'
import sys, time, numpy as np, onnxruntime as ort
x = np.load("samples/s0.npz")["x"]
t = time.perf_counter()
s = ort.InferenceSession(sys.argv[1], providers=["CUDAExecutionProvider"])
s.run(None, {s.get_inputs()[0].name: x.astype(np.float16) if s.get_inputs()[0].type == "tensor(float16)" else x})
print(f"{sys.argv[1]}: plain candidate run {time.perf_counter() - t:.2f} s")
PY
        run "${name}_full_$attempt" "$R/layerwise" bisect "$R/$model" --inputs samples/s0.npz --cand ort:cuda --cand-model "${name}_fp16.onnx" --json "$OUT/${name}_full_$attempt.json"
    done
done
