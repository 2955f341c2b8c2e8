#!/usr/bin/env bash
# GPU runs for docs/gpu.md "Diagnoses on the H100" (issue 12) and the hardware side of the
# emulation tables (issue 14). Runs on the lent GPU machine, in the repository root, after ONNX
# Runtime's GPU build is unpacked in /tmp/ortgpu and LD_LIBRARY_PATH is set (docs/gpu.md).
# Expects in .gpu/run/ (carried): `layerwise` (this tree), `layerwise-before` (the tree before the
# diagnoses work, commit dc3af35), and the models det.onnx, rec.onnx, cls.onnx (rapidocr-onnxruntime
# 1.4.4) and yolov8n.onnx (nudenet 3.4.2's 320n.onnx).
source "$(dirname "$0")/setup.sh"
shape() {
    case $1 in
        det) echo "--input-shape x:1x3x640x640 --val-range x:-1,1" ;;
        rec) echo "--input-shape x:1x3x48x320 --val-range x:-1,1" ;;
        cls) echo "--input-shape x:1x3x48x192 --val-range x:-1,1" ;;
        yolov8n) echo "--input-shape images:1x3x320x320" ;;
    esac
}
# Usage: diagnoses.sh [all|det-strict]
WHAT=${1:-all}
# Issue 12 with the tolerance that makes the detector's output fail (its Sigmoid output is tiny:
# range_tol would pass anything), before and after.
if [ "$WHAT" = det-strict ]; then
    for range in "-1,1" "0,1"; do
        tag=${range/,/_}
        for b in before after; do
            bin=$R/layerwise; [ $b = before ] && bin=$R/layerwise-before
            run "det_strict_${b}_$tag" "$bin" bisect "$R/det.onnx" --input-shape x:1x3x640x640 --val-range "x:$range" --cand ort:cuda --atol 1e-6 --range-tol 0 --json "$OUT/det_strict_${b}_$tag.json"
        done
    done
    exit 0
fi
# Issue 12: the text detector under TF32, before and after, on both input ranges.
for range in "-1,1" "0,1"; do
    tag=${range/,/_}
    run "det_tf32_before_$tag" "$R/layerwise-before" bisect "$R/det.onnx" --input-shape x:1x3x640x640 --val-range "x:$range" --cand ort:cuda --json "$OUT/det_tf32_before_$tag.json"
    run "det_tf32_after_$tag" "$R/layerwise" bisect "$R/det.onnx" --input-shape x:1x3x640x640 --val-range "x:$range" --cand ort:cuda --json "$OUT/det_tf32_after_$tag.json"
done
# Issue 14: the hardware's answers for TF32 (ort:cuda), float32 without TF32, and CUDA's FP16
# kernels on models converted by layerwise; the emulations run on the CPU against these reports.
for m in rec det cls yolov8n; do
    run "${m}_cuda_tf32" "$R/layerwise" bisect "$R/$m.onnx" $(shape $m) --cand ort:cuda --json "$OUT/${m}_cuda_tf32.json"
    run "${m}_cuda_fp32" "$R/layerwise" bisect "$R/$m.onnx" $(shape $m) --cand ort:cuda,tf32=off --json "$OUT/${m}_cuda_fp32.json"
    "$R/layerwise" convert "$R/$m.onnx" --to fp16 -o "${m}_fp16.onnx" > "$OUT/${m}_convert.out" 2>&1
    run "${m}_cuda_fp16" "$R/layerwise" bisect "$R/$m.onnx" $(shape $m) --cand ort:cuda --cand-model "${m}_fp16.onnx" --json "$OUT/${m}_cuda_fp16.json"
done
