#!/usr/bin/env bash
# Issue 41: sample sets over one and two GPUs. The FP16 recognizer (`--cand ort:cuda --cand-model
# rec_fp16.onnx`, 1x3x48x320 in [0,255], seeded) on N samples for each N in $SIZES: one GPU, then
# `--devices` over every GPU of the machine; wall time, per-sample time after the first (progress
# lines of the one-GPU run), peak GPU memory per GPU (nvidia-smi, sampled every 100 ms), and whether
# the two reports are identical (run_info and the --devices note aside). Then one plain candidate
# run per sample (a warm CUDA session of the FP16 file, in Python) for the per-sample ratio.
# On the lent GPU machine, repository root, after `source scripts/gpu/unstage.sh`:
# R=DIR SIZES="64 256" bash scripts/gpu/devices_scale.sh (R holds layerwise and rec.onnx).
source "$(dirname "$0")/setup.sh"
SIZES=${SIZES:-64 256}
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
echo "GPUs: $GPUS; CPU cores: $(nproc)"
"$R/layerwise" convert "$R/rec.onnx" --to fp16 -o rec_fp16.onnx > /dev/null
# peak TAG CMD...: runs CMD with nvidia-smi sampling memory, prints each GPU's peak MiB.
peak() {
    local tag=$1; shift
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/$tag.mem" &
    local smi=$!
    "$@"
    kill $smi; wait $smi 2>/dev/null
    python3 - "$OUT/$tag.mem" <<'PY'
import sys, collections
peak = collections.defaultdict(int)
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 2 and parts[1].isdigit():
        peak[parts[0]] = max(peak[parts[0]], int(parts[1]))
print("peak GPU memory (MiB, whole GPU):", dict(peak))
PY
}
for N in $SIZES; do
    samples "$N"
    REC="$R/rec.onnx --inputs samples --cand ort:cuda --cand-model rec_fp16.onnx"
    peak one_$N run one_$N "$R/layerwise" bisect $REC --json "$OUT/one_$N.json"
    per_sample "$OUT/one_$N.err" "$N" "one GPU, $N samples"
    peak devices_$N run devices_$N "$R/layerwise" bisect $REC --devices "$GPUS" --json "$OUT/devices_$N.json"
    same_reports "$OUT/one_$N.json" "$OUT/devices_$N.json"
done
# One plain candidate run of each sample: a CUDA session of the FP16 file created once, then each
# sample run once (the first run apart), as a user's own loop pays it.
plain_runs | tee "$OUT/plain.txt"
