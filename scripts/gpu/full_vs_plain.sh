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
# The counterfactual's independent oracle: each check of the first round's report (which re-ran
# only the part of the model its keep list changes, `nodes_rerun`) against the whole model
# converted with that keep list and run as the candidate model, only the outputs marked (as the
# counterfactual's reference run marks them).
for model in "$@"; do
    name=${model%.onnx}
    python3 - "$OUT/${name}_full_0.json" > "${name}_checks.tsv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
cf = r.get("counterfactual") or {}
for k, c in enumerate(cf.get("checks", [])):
    print(k, cf["output"], c["output_error_after"], c.get("nodes_rerun", "whole"), ",".join(c["kept"]), sep="\t")
PY
    while IFS=$'\t' read -r k output after rerun kept; do
        "$R/layerwise" convert "$R/$model" --to fp16 --keep-fp32 "$kept" -o "${name}_kept_$k.onnx" > /dev/null
        "$R/layerwise" bisect "$R/$model" --inputs samples/s0.npz --cand ort:cuda --cand-model "${name}_kept_$k.onnx" \
            --tensors "$output" --no-isolate --no-counterfactual --no-noise-floor --json "$OUT/${name}_kept_$k.json" > /dev/null 2>&1
        whole=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(next(t['metrics']['rel_l2_err'] for t in r['tensors'] if t['name']==sys.argv[2]))" "$OUT/${name}_kept_$k.json" "$output")
        echo "$name check $k: nodes re-run $rerun; output error with the part re-run $after, whole kept model $whole"
    done < "${name}_checks.tsv"
done
