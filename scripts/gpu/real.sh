#!/usr/bin/env bash
# Hardware truth for real models (issues "fixes that hold on the GPU" and "emulation that
# accumulates as the GPU does"): each model of .gpu/run/models.txt (lines: NAME FILE ARGS..., where @R in ARGS stands for .gpu/run) is
# converted by layerwise to FP16 (and BF16 at opset >= 13), and each converted file, plus each file
# under .gpu/run/fixed/NAME*.onnx (written by `layerwise fix` on the CPU), runs on ONNX Runtime's CUDA
# provider against the float32 CPU reference; TF32 runs the original model with tf32 on. All JSON
# reports land in $OUT/real.tar.gz (the device tool returns at most 8 files).
# GPU machine, repository root, after `source scripts/gpu/unstage.sh`.
set -u
R=$PWD/.gpu/run
W=/tmp/real-work; mkdir -p $W/out; cd $W
while read -r name file args; do
    [ -z "$name" ] && continue
    m=$R/$file; args=${args//@R/$R}
    echo "== $name"
    "$R/layerwise" convert "$m" --to fp16 -o ${name}_fp16.onnx > out/${name}_convert_fp16.txt 2>&1
    "$R/layerwise" bisect "$m" $args --cand ort:cuda --cand-model ${name}_fp16.onnx --json out/${name}_cuda_fp16.json > out/${name}_cuda_fp16.txt 2>&1; echo "fp16 exit $?"; grep -m1 VERDICT out/${name}_cuda_fp16.txt
    if "$R/layerwise" convert "$m" --to bf16 -o ${name}_bf16.onnx > out/${name}_convert_bf16.txt 2>&1; then
        "$R/layerwise" bisect "$m" $args --cand ort:cuda --cand-model ${name}_bf16.onnx --json out/${name}_cuda_bf16.json > out/${name}_cuda_bf16.txt 2>&1; echo "bf16 exit $?"; grep -m1 VERDICT out/${name}_cuda_bf16.txt
    fi
    "$R/layerwise" bisect "$m" $args --cand ort:cuda --json out/${name}_cuda_tf32.json > out/${name}_cuda_tf32.txt 2>&1; echo "tf32 exit $?"; grep -m1 VERDICT out/${name}_cuda_tf32.txt
    for f in $R/fixed/${name}__*.onnx; do
        [ -e "$f" ] || continue
        tag=$(basename "$f" .onnx)
        "$R/layerwise" bisect "$m" $args --cand ort:cuda --cand-model "$f" --json out/${tag}_cuda.json > out/${tag}_cuda.txt 2>&1; echo "$tag exit $?"; grep -m1 VERDICT out/${tag}_cuda.txt
    done
done < $R/models.txt
tar -czf "$OUT/real.tar.gz" -C $W out
