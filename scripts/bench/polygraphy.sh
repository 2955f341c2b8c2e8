#!/usr/bin/env bash
# End-to-end benchmark against Polygraphy on the same ORT-only job (docs/performance.md):
#   Polygraphy: run --onnxrt --onnx-outputs mark all on the float32 model with --save-outputs,
#               then on the FP16-emulated model with --load-outputs (compares every tensor);
#   layerwise:  bisect --ref ort:cpu --cand sim:fp16 (also walks back, isolates and checks), with
#               its defaults (a paired comparison) and with --separate-runs.
# Wall time and peak RSS (/usr/bin/time), several runs, medians.
#
# Usage: scripts/bench/polygraphy.sh RUNS MODEL SHAPE_NAME SHAPE [MODEL SHAPE_NAME SHAPE ...]
#   SHAPE as 1x3x48x320. The models are not in the repository; docs/performance.md says where the
#   ones measured come from (pip wheels).
# Polygraphy and its ONNX Runtime go into a virtual environment under target/, never into the product.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=$1; shift
venv=target/bench-venv
if [ ! -x "$venv/bin/polygraphy" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q polygraphy==0.53.6 onnxruntime==1.31.1 onnx numpy
fi
cargo build --release -q
lw=target/release/layerwise
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

measure() { # command...: prints "wall_s rss_mib"; exit 1 (tensors out of tolerance) is a result, not a failure
    local rc=0
    /usr/bin/time -f "%e %M" -o "$work/time" "$@" >"$work/out" 2>&1 || rc=$?
    if [ "$rc" -gt 1 ]; then echo "FAILED ($rc): $*" >&2; tail -20 "$work/out" >&2; exit 1; fi
    tail -1 "$work/time" | awk '{printf "%s %.0f\n", $1, $2/1024}'
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf "%-28s %-12s %10s %12s\n" model tool "wall s" "peak MiB"
while [ $# -gt 0 ]; do
    model=$1 name=$2 shape=$3; shift 3
    emu="$work/$(basename "$model" .onnx).emulated.onnx"
    "$lw" convert "$model" --to fp16-emulated -o "$emu" >/dev/null
    pg_shape="$name:[${shape//x/,}]"
    declare -a pw=() pr=() lw_w=() lw_r=() sep_w=() sep_r=()
    for i in $(seq "$runs"); do
        read -r w1 r1 < <(measure "$venv/bin/polygraphy" run "$model" --onnxrt --onnx-outputs mark all --input-shapes "$pg_shape" --save-outputs "$work/ref.json")
        read -r w2 r2 < <(measure "$venv/bin/polygraphy" run "$emu" --onnxrt --onnx-outputs mark all --input-shapes "$pg_shape" --load-outputs "$work/ref.json" --rtol 1e-2 --atol 1e-4)
        pw+=("$(echo "$w1 + $w2" | bc)"); pr+=("$(( r1 > r2 ? r1 : r2 ))")
        rm -f "$work/ref.json"
        read -r w3 r3 < <(measure "$lw" bisect "$model" --cand sim:fp16 --input-shape "$name:$shape" --json "$work/report.json")
        lw_w+=("$w3"); lw_r+=("$r3")
        read -r w4 r4 < <(measure "$lw" bisect "$model" --cand sim:fp16 --input-shape "$name:$shape" --separate-runs --json "$work/report.json")
        sep_w+=("$w4"); sep_r+=("$r4")
    done
    printf "%-28s %-12s %10s %12s\n" "$(basename "$model")" polygraphy "$(printf '%s\n' "${pw[@]}" | median)" "$(printf '%s\n' "${pr[@]}" | median)"
    printf "%-28s %-12s %10s %12s\n" "$(basename "$model")" layerwise "$(printf '%s\n' "${lw_w[@]}" | median)" "$(printf '%s\n' "${lw_r[@]}" | median)"
    printf "%-28s %-12s %10s %12s\n" "$(basename "$model")" "lw separate" "$(printf '%s\n' "${sep_w[@]}" | median)" "$(printf '%s\n' "${sep_r[@]}" | median)"
done
