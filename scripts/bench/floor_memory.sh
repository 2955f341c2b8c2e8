#!/usr/bin/env bash
# Time and peak memory against the floor, on the CPU (docs/performance.md, issue 55). For each SPEC,
# RUNS times, side by side: the floor (scripts/bench/floor.py: two plain ONNX Runtime sessions of the
# unmodified model, created and run once), `layerwise bisect MODEL --inputs IN.npz` (sim:fp16) and
# `layerwise bisect MODEL --inputs IN.npz --cand ort:cpu --cand-model FP16` (the model converted by
# `layerwise convert --to fp16`: the typed evaluation), each with its wall time and peak RSS
# (/usr/bin/time). Prints one line per run and the medians.
# Usage: scripts/bench/floor_memory.sh RUNS SPEC...   SPEC: decoder-overflow:BLOCKS, decoder:BLOCKS
#   LAYERWISE=path (default target/release/layerwise, built here), WORK=dir (models kept there).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
runs=$1; shift
py=python3
python3 -c "import onnx, onnxruntime, numpy" 2>/dev/null || { echo "needs numpy, onnx and onnxruntime==1.31.1 (pip)" >&2; exit 2; }
if [ -z "${LAYERWISE:-}" ]; then cargo build --release -q; LAYERWISE=$root/target/release/layerwise; fi
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
measure() { # TAG CMD...: prints TAG wall_s peak_MiB
    local tag=$1; shift
    /usr/bin/time -f "%e %M" -o "$work/time" "$@" > "$work/out" 2>&1 || [ $? -le 1 ] || { echo "FAILED: $*" >&2; tail -5 "$work/out" >&2; exit 1; }
    read -r wall rss < <(tail -1 "$work/time")
    echo "$tag $wall $((rss / 1024))"
}
for spec in "$@"; do
    kind=${spec%%:*} blocks=${spec#*:}
    model=$work/$kind-$blocks.onnx inputs=$work/$kind-$blocks.npz fp16=$work/$kind-$blocks-fp16.onnx
    if [ ! -f "$model" ]; then
        case $kind in
            decoder) $py scripts/bench/make_decoder.py "$model" "$blocks" --inputs "$inputs" > /dev/null ;;
            decoder-overflow) $py scripts/bench/make_decoder.py "$model" "$blocks" --overflow $((blocks / 2)) --inputs "$inputs" > /dev/null ;;
            *) echo "unknown model kind: $kind" >&2; exit 2 ;;
        esac
        "$LAYERWISE" convert "$model" --to fp16 -o "$fp16" > /dev/null
    fi
    for _ in $(seq "$runs"); do
        measure "$spec floor" $py scripts/bench/floor.py "$model" "$inputs"
        measure "$spec sim:fp16" "$LAYERWISE" bisect "$model" --inputs "$inputs" --json "$work/s.json"
        measure "$spec --cand-model" "$LAYERWISE" bisect "$model" --inputs "$inputs" --cand ort:cpu --cand-model "$fp16" --json "$work/c.json"
    done
done | tee "$work/lines"
echo "medians (wall s, peak MiB):"
$py - "$work/lines" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    *tag, wall, rss = line.split()
    rows.setdefault(" ".join(tag), []).append((float(wall), int(rss)))
for tag, v in rows.items():
    w = statistics.median(x for x, _ in v)
    m = statistics.median(y for _, y in v)
    floor = rows[tag.rsplit(" ", 1)[0] + " floor"] if not tag.endswith("floor") else v
    fw = statistics.median(x for x, _ in floor)
    fm = statistics.median(y for _, y in floor)
    print(f"{tag:40s} {w:8.2f} s {m:6d} MiB   {w / fw:4.2f}x time  {m / fm:4.2f}x memory  (runs: {', '.join(f'{x:.2f} s/{y}' for x, y in v)})")
PY
