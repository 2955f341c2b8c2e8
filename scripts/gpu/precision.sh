#!/usr/bin/env bash
# One precision on the H100 for the models of R/models.txt (lines: NAME FILE ARGS..., @R in ARGS
# stands for R), against the float32 CPU reference: `fp16` and `bf16` convert each model with
# `layerwise convert --to MODE` and run the file on ONNX Runtime's CUDA provider; `tf32` runs the
# float32 model there with TF32 on (the provider's default). JSON reports and terminal output land
# in $OUT/MODE.tar.gz (MODEL_cuda_MODE.json, as scripts/emulation_table.py reads them).
# GPU machine, repository root, after `source scripts/gpu/unstage.sh`: bash scripts/gpu/precision.sh R MODE
set -u
R=$(realpath "$1"); mode=$2
W=/tmp/$mode-work; mkdir -p $W/out; cd $W
while read -r name file args; do
    [ -z "$name" ] && continue
    m=$R/$file; args=${args//@R/$R}
    cand=()
    if [ "$mode" != tf32 ]; then
        "$R/layerwise" convert "$m" --to $mode -o ${name}_$mode.onnx > out/${name}_convert_$mode.txt 2>&1 || { echo "$name: convert failed"; continue; }
        cand=(--cand-model ${name}_$mode.onnx)
    fi
    "$R/layerwise" bisect "$m" $args --cand ort:cuda "${cand[@]}" --json out/${name}_cuda_$mode.json > out/${name}_cuda_$mode.txt 2>&1
    echo "$name $mode exit $?: $(grep -m1 VERDICT out/${name}_cuda_$mode.txt)"
done < $R/models.txt
tar -czf "$OUT/$mode.tar.gz" -C $W out
