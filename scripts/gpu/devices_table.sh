#!/usr/bin/env bash
# Issue 41's table: PP-OCRv4's recognizer and its FP16 conversion, both sides on the GPU
# (`--ref ort:cuda,tf32=off --cand ort:cuda --cand-model rec_fp16.onnx`), N seeded samples, on one
# GPU and with `--devices` over every GPU of the machine, compared on the GPU one sample a run and
# with `--batch 8`. Per run: wall (/usr/bin/time), each sample after the first (median of the
# run_info steps), peak memory of each GPU (nvidia-smi sampled every 100 ms, less what the GPU
# held before), and whether the --devices report equals the one-GPU report (run_info and the note
# aside). Then one plain candidate run per sample (warm CUDA session) for the ratio.
# On the lent machine, repository root, after `source scripts/gpu/unstage.sh`, with layerwise and
# rec.onnx in $R:   R=DIR SIZES="64 256 1024" MODES="batch8 device" bash scripts/gpu/devices_table.sh
source "$(dirname "$0")/setup.sh"
SIZES=${SIZES:-"64 256 1024"}
MODES=${MODES:-"batch8 device"}
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
"$R/layerwise" convert "$R/rec.onnx" --to fp16 -o rec_fp16.onnx > /dev/null
# run TAG BINARY ARGS...: as setup.sh's, with the step times summed by step (a run of 1,024 samples
# has thousands).
run() {
    local tag=$1; shift
    echo; echo "\$ $(basename "$1") ${*:2}"
    LAYERWISE_TIMING=1 /usr/bin/time -f "wall %e s, peak RSS %M KB" "$@" > "$OUT/$tag.out" 2> "$OUT/$tag.err"
    echo "exit $?; $(tail -n 1 "$OUT/$tag.err")"
    grep -E "^VERDICT|^First" "$OUT/$tag.out" | head -2
    [ -f "$OUT/$tag.json" ] && python3 - "$OUT/$tag.json" <<'PY'
import json, re, sys
sums = {}
for k, v in json.load(open(sys.argv[1])).get("run_info", {}).get("durations_s", []):
    k = re.sub(r"GPU \d+", "GPU n", k)
    n, t = sums.get(k, (0, 0.0))
    sums[k] = (n + 1, t + v)
print("; ".join(f"{k}: {t:.2f} s" + (f" ({n}x)" if n > 1 else "") for k, (n, t) in sums.items()))
PY
}

printf 'samples\tmode\tGPUs\twall_s\tsample_steps_ms\tsample_wall_ms\treduction_ms\tpeak_MiB_per_GPU\tsame_as_one_GPU\n' > "$OUT/table.tsv"

# measured TAG N MODE GPUS ARGS...: one run with the GPUs' memory sampled, and its table row.
measured() {
    local tag=$1 n=$2 mode=$3 gpus=$4; shift 4
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits > "$OUT/$tag.idle"
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/$tag.mem" &
    local sampler=$!
    run "$tag" "$@"
    kill "$sampler"; wait "$sampler" 2>/dev/null
    python3 - "$OUT" "$tag" "$n" "$mode" "$gpus" <<'PY' | tee -a "$OUT/table.tsv"
import json, re, sys
out, tag, n, mode, gpus = sys.argv[1:]
def used(path):
    peak = {}
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            peak[parts[0]] = max(peak.get(parts[0], 0), int(parts[1]))
    return peak
idle, peak = used(f"{out}/{tag}.idle"), used(f"{out}/{tag}.mem")
memory = "/".join(str(peak[g] - idle.get(g, 0)) for g in sorted(peak))
wall = re.search(r"wall ([\d.]+) s", open(f"{out}/{tag}.err").read().splitlines()[-1])
report = json.load(open(f"{out}/{tag}.json"))
width = 8 if mode.startswith("batch") else 1
steps = [v for k, v in report["run_info"]["durations_s"] if ("tensors left on GPU" in k and " again " not in k) or (k.startswith("comparing ") and "on the GPU" in k)]
groups = [sum(steps[i:i + 3]) / width for i in range(0, len(steps), 3)][1:]
groups.sort()
sample_ms = f"{1000 * groups[len(groups) // 2]:.2f}" if groups else "-"
# Every sample's wall, its share of the whole sample loop: from the first batch's end to the
# last sample's (LAYERWISE_TIMING marks), one GPU only (two jobs' marks interleave).
err = open(f"{out}/{tag}.err").read()
marks = [float(m.group(1)) for m in re.finditer(r"\[timing\] \+([\d.]+)s \(cpu [\d.]+s\) compared and walked", err)]
wall_ms = f"{1000 * (marks[-1] - marks[width - 1]) / (len(marks) - width):.2f}" if gpus == "1" and len(marks) > width else "-"
reductions = sorted(float(m.group(1)) for m in re.finditer(r"GPU reduction of \d+ pairs in \d+ chunks: ([\d.]+) ms", err))
reduction_ms = f"{reductions[len(reductions) // 2]:.2f}" if reductions else "-"
same = "-"
if gpus != "1":
    one = json.load(open(f"{out}/{tag.replace('_gpus', '_gpu1')}.json"))
    for r in (one, report):
        r.pop("run_info", None)
    report["cand"]["notes"] = [x for x in report["cand"]["notes"] if "--devices" not in x]
    same = str(one == report)
print(n, mode, gpus, wall.group(1) if wall else "-", sample_ms, wall_ms, reduction_ms, memory, same, sep="\t")
PY
}

for N in $SIZES; do
    samples "$N"
    ARGS="$R/rec.onnx --inputs samples --ref ort:cuda,tf32=off --cand ort:cuda --cand-model rec_fp16.onnx"
    for MODE in $MODES; do
        EXTRA=""
        [ "$MODE" = batch8 ] && EXTRA="--batch 8"
        measured "${MODE}_${N}_gpu1" "$N" "$MODE" 1 "$R/layerwise" bisect $ARGS $EXTRA --json "$OUT/${MODE}_${N}_gpu1.json"
        if [ -n "${OLD:-}" ]; then
            # The same run with another build (OLD: its binary), for a before/after in one call.
            measured "${MODE}old_${N}_gpu1" "$N" "${MODE}-old" 1 "$OLD" bisect $ARGS $EXTRA --json "$OUT/${MODE}old_${N}_gpu1.json"
        fi
        if [ "$GPUS" != 0 ]; then
            measured "${MODE}_${N}_gpus" "$N" "$MODE" "$GPUS" "$R/layerwise" bisect $ARGS $EXTRA --devices "$GPUS" --json "$OUT/${MODE}_${N}_gpus.json"
        fi
    done
done
plain_runs 256 | tee "$OUT/plain.txt"
