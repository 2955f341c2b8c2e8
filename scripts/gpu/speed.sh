#!/usr/bin/env bash
# GPU timings for docs/gpu.md "No rebuild tax" (issue 15): a full bisect of an FP16-converted
# recognizer on ort:cuda with cuDNN's exhaustive and heuristic convolution algorithm search, the
# plain candidate run alone, and fix on the detector. Runs on the lent GPU machine after ONNX
# Runtime's GPU build is unpacked (docs/gpu.md). Expects .gpu/run/{layerwise,rec.onnx,det.onnx}.
source "$(dirname "$0")/setup.sh"
"$R/layerwise" convert "$R/rec.onnx" --to fp16 -o rec_fp16.onnx > /dev/null
REC="$R/rec.onnx --input-shape x:1x3x48x320 --val-range x:0,255 --cand-model rec_fp16.onnx"
for search in exhaustive heuristic; do
    run "rec_plain_$search" "$R/layerwise" bisect $REC --cand ort:cuda,conv_search=$search --no-isolate --no-counterfactual --no-noise-floor --json "$OUT/rec_plain_$search.json"
    run "rec_full_$search" "$R/layerwise" bisect $REC --cand ort:cuda,conv_search=$search --json "$OUT/rec_full_$search.json"
    run "det_fix_$search" "$R/layerwise" fix "$R/det.onnx" --input-shape x:1x3x640x640 --val-range x:-1,1 --cand ort:cuda,conv_search=$search --json "$OUT/det_fix_$search.json"
done
