#!/usr/bin/env bash
# --devices on the lent GPU machine (docs/gpu.md, issue 15): the samples of a folder spread over
# GPUs, one shard per GPU at once, against one run over every sample. With one GPU the check runs
# two shards on GPU 0 at once (--devices 0,0): the concurrency and the merge, not two GPUs.
# Expects .gpu/run/{layerwise,rec.onnx}; ONNX Runtime's GPU build unpacked (docs/gpu.md).
source "$(dirname "$0")/setup.sh"
"$R/layerwise" convert "$R/rec.onnx" --to fp16 -o rec_fp16.onnx > /dev/null
samples 8
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
[ "$GPUS" = "0" ] && GPUS=0,0
REC="$R/rec.onnx --inputs samples --cand ort:cuda --cand-model rec_fp16.onnx"
run single "$R/layerwise" bisect $REC --json "$OUT/single.json"
run devices "$R/layerwise" bisect $REC --devices "$GPUS" --json "$OUT/devices.json"
same_reports "$OUT/single.json" "$OUT/devices.json"
