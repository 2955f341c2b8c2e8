#!/usr/bin/env bash
# Issue "paired everywhere", GPU part: 32 samples of the FP16 recognizer on ort:cuda (1x3x48x320 in
# [0,255], seeded), the time of each sample after the first (from the progress lines), and a full
# one-sample bisect against one plain candidate run (an ONNX Runtime CUDA session of the FP16 file
# created and run once, in one Python process). On the lent GPU machine, repository root, after
# `source scripts/gpu/unstage.sh`: R=.gpu/c bash scripts/gpu/samples32.sh (R holds layerwise and
# rec.onnx).
source "$(dirname "$0")/setup.sh"
"$R/layerwise" convert "$R/rec.onnx" --to fp16 -o rec_fp16.onnx > /dev/null
samples 32
# One plain candidate run: session creation included, as a user's own script pays it.
python3 - > "$OUT/plain.txt" <<'PY'
import time, numpy as np, onnxruntime as ort
x = np.load("samples/s00.npz")["x"]
for attempt in range(3):
    t = time.perf_counter()
    s = ort.InferenceSession("rec_fp16.onnx", providers=["CUDAExecutionProvider"])
    s.run(None, {"x": x.astype(np.float16) if s.get_inputs()[0].type == "tensor(float16)" else x})
    print(f"plain candidate run {attempt}: {time.perf_counter() - t:.2f} s ({s.get_providers()[0]})")
PY
cat "$OUT/plain.txt"
run one "$R/layerwise" bisect "$R/rec.onnx" --inputs samples/s00.npz --cand ort:cuda --cand-model rec_fp16.onnx --json "$OUT/one.json"
run thirty_two "$R/layerwise" bisect "$R/rec.onnx" --inputs samples --cand ort:cuda --cand-model rec_fp16.onnx --json "$OUT/thirty_two.json"
# Each sample's start, from the progress lines ("layerwise: sample k of 32 (...) (T s)").
python3 - "$OUT/thirty_two.err" <<'PY'
import re, sys
starts = [(int(m.group(1)), float(m.group(2))) for m in re.finditer(r"layerwise: sample (\d+) of 32 \([^)]*\)(?:, about \d+ s left)? \((\d+\.\d) s\)", open(sys.argv[1]).read())]
gaps = [b[1] - a[1] for a, b in zip(starts, starts[1:])]
print(f"samples seen: {len(starts)}; first sample {gaps[0]:.2f} s; each later sample: min {min(gaps[1:]):.2f} s, median {sorted(gaps[1:])[len(gaps[1:]) // 2]:.2f} s, max {max(gaps[1:]):.2f} s")
PY
