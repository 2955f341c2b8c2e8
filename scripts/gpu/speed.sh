#!/usr/bin/env bash
# GPU timings for docs/gpu.md "No rebuild tax" (issue 15): a full bisect of an FP16-converted
# recognizer on ort:cuda with cuDNN's exhaustive and heuristic convolution algorithm search, the
# plain candidate run alone, and fix on the detector. Runs on the lent GPU machine after ONNX
# Runtime's GPU build is unpacked (docs/gpu.md). Expects .gpu/run/{layerwise,rec.onnx,det.onnx}.
set -u
ROOT=$PWD
R=$ROOT/.gpu/run
export LAYERWISE_ORT_LIB=/tmp/ortgpu/libonnxruntime.so.1.31.1
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" /tmp/gpu-work && cd /tmp/gpu-work
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$R/layerwise" convert "$R/rec.onnx" --to fp16 -o rec_fp16.onnx > /dev/null
REC="$R/rec.onnx --input-shape x:1x3x48x320 --val-range x:0,255 --cand-model rec_fp16.onnx"
run() {
    local tag=$1; shift
    echo; echo "\$ layerwise $*"
    /usr/bin/time -f "wall %e s, peak RSS %M KB" "$R/layerwise" "$@" > "$OUT/$tag.out" 2> "$OUT/$tag.err"
    echo "exit $?; $(tail -n 1 "$OUT/$tag.err")"; grep -E "^VERDICT|First|cause" "$OUT/$tag.out" | head -3
    python3 -c "import json,sys; r=json.load(open('$OUT/$tag.json')); print(' '.join(f'{k}={v:.2f}' for k,v in r['run_info']['durations_s']))" 2>/dev/null
}
for search in exhaustive heuristic; do
    run "rec_plain_$search" bisect $REC --cand ort:cuda,conv_search=$search --no-isolate --no-counterfactual --no-noise-floor --json "$OUT/rec_plain_$search.json"
    run "rec_full_$search" bisect $REC --cand ort:cuda,conv_search=$search --json "$OUT/rec_full_$search.json"
    run "det_fix_$search" fix "$R/det.onnx" --input-shape x:1x3x640x640 --val-range x:-1,1 --cand ort:cuda,conv_search=$search --json "$OUT/det_fix_$search.json"
done
