#!/usr/bin/env bash
# Graph size on the GPU (docs/performance.md, issue 55). Run on the lent GPU machine in the
# repository root, after ONNX Runtime's GPU package is unpacked (`source scripts/gpu/unstage.sh`),
# with the layerwise binary in $R and the onnx wheels (onnx, protobuf, ml_dtypes for the machine's
# Python) in $R/py. For each SPEC, side by side, RUNS times: the GPU floor (scripts/bench/gpu_floor.py:
# two plain CUDA sessions, the reference with TF32 off and the converted candidate) and
#   layerwise bisect MODEL --inputs IN.npz --ref ort:cuda,tf32=off --cand ort:cuda --cand-model FP16
# (or, for fix:BLOCKS:EVERY, `layerwise fix MODEL --ref ort:cuda,tf32=off --cand ort:cuda`), each with
# its wall time, peak host RSS (scripts/bench/timed.py) and peak GPU memory (nvidia-smi's memory.used
# sampled every 100 ms, less the idle value).
# Usage: R=DIR [STEPS=1] bash scripts/bench/gpu_scale.sh RUNS SPEC...
#   STEPS=1: the bisect runs under scripts/bench/rss_steps.py (peak RSS per step, in its .out).
#   SPEC: decoder-overflow:BLOCKS (one block in the middle overflows FP16), fix:BLOCKS:EVERY (every
#   EVERY-th block overflows on its own: BLOCKS / EVERY independent overflows).
set -u
root=$PWD
R=${R:-$root/.gpu/run}
runs=$1; shift
work=${WORK:-/tmp/gpu-scale}
mkdir -p "$work" /tmp/pyonnx
python3 -c "import onnx" 2>/dev/null || python3 -m pip install -q --no-deps --target /tmp/pyonnx "$R"/py/*.whl
export PYTHONPATH=/tmp/pyonnx:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)

# measure TAG CMD...: wall s, peak host MiB, peak GPU MiB above idle, exit status.
measure() {
    local tag=$1; shift
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$work/$tag.gpu" &
    local smi=$!
    python3 scripts/bench/timed.py "$work/$tag.time" "$@" > "$work/$tag.out" 2> "$work/$tag.err"
    local rc=$?
    kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
    read -r wall rss < <(tail -1 "$work/$tag.time")
    local gpu
    gpu=$(sort -n "$work/$tag.gpu" | tail -1)
    printf "%-34s exit %s  wall %7.2f s  host %6d MiB  GPU %6d MiB\n" "$tag" "$rc" "$wall" $((rss / 1024)) $((gpu - idle))
}

for spec in "$@"; do
    IFS=: read -r kind blocks every <<< "$spec"
    model=$work/$kind-$blocks.onnx inputs=$work/$kind-$blocks.npz fp16=$work/$kind-$blocks-fp16.onnx
    if [ ! -f "$model" ]; then
        case $kind in
            decoder-overflow) python3 scripts/bench/make_decoder.py "$model" "$blocks" --overflow $((blocks / 2)) --inputs "$inputs" > /dev/null ;;
            fix) python3 scripts/bench/make_decoder.py "$model" "$blocks" --overflow-every "$every" --inputs "$inputs" > /dev/null ;;
        esac
        "$R/layerwise" convert "$model" --to fp16 -o "$fp16" > /dev/null
    fi
    for i in $(seq "$runs"); do
        measure "$kind-$blocks floor #$i" python3 scripts/bench/gpu_floor.py "$model" "$fp16" "$inputs"
        grep -o '"floor_s": [0-9.]*' "$work/$kind-$blocks floor #$i.out"
        if [ "$kind" = fix ]; then
            measure "$kind-$blocks fix #$i" "$R/layerwise" fix "$model" --inputs "$inputs" --ref ort:cuda,tf32=off --cand ort:cuda -o "$work/fixed.onnx" --json "$work/fix.json"
        else
            measure "$kind-$blocks bisect #$i" ${STEPS:+python3 scripts/bench/rss_steps.py} "$R/layerwise" bisect "$model" --inputs "$inputs" --ref ort:cuda,tf32=off --cand ort:cuda --cand-model "$fp16" --json "$work/bisect.json"
        fi
        grep -m1 -E "^VERDICT|^FIXED|^NOT FIXED|^error" "$work/$kind-$blocks "*"#$i.out" "$work/$kind-$blocks "*"#$i.err" 2>/dev/null | grep -v floor | head -2
    done
done
