#!/usr/bin/env bash
# BF16 on the H100 (issue "emulation that accumulates as the GPU does"): each model of
# $R/models.txt (lines: NAME FILE ARGS..., @R in ARGS stands for $R) converted by
# `layerwise convert --to bf16` and run by ONNX Runtime's CUDA provider against the float32 CPU
# reference. JSON reports and terminal output land in $OUT/bf16.tar.gz.
# GPU machine, repository root, after `source scripts/gpu/unstage.sh`: bash scripts/gpu/bf16.sh R
set -u
R=$(realpath "$1")
W=/tmp/bf16-work; mkdir -p $W/out; cd $W
while read -r name file args; do
    [ -z "$name" ] && continue
    m=$R/$file; args=${args//@R/$R}
    "$R/layerwise" convert "$m" --to bf16 -o ${name}_bf16.onnx > out/${name}_convert_bf16.txt 2>&1 || { echo "$name: convert failed"; continue; }
    "$R/layerwise" bisect "$m" $args --cand ort:cuda --cand-model ${name}_bf16.onnx --json out/${name}_cuda_bf16.json > out/${name}_cuda_bf16.txt 2>&1
    echo "$name bf16 exit $?: $(grep -m1 VERDICT out/${name}_cuda_bf16.txt)"
done < $R/models.txt
tar -czf "$OUT/bf16.tar.gz" -C $W out
