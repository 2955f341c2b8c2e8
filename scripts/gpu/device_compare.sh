#!/usr/bin/env bash
# Issue 41: samples compared on the GPU where both sides ran (src/pipeline/device.rs). On the lent
# GPU machine, repository root, after `source scripts/gpu/unstage.sh`, with the layerwise binary,
# the GPU test binary (tests/device_reduction.rs, built with `cargo test --release --test
# device_reduction --no-run`, both stripped) and rec.onnx in $R:
#   R=DIR SIZES="64" bash scripts/gpu/device_compare.sh
# 1. the kernels against the host's metrics (the test binary);
# 2. for each N: PP-OCRv4's recognizer, its FP16 conversion as the candidate, N seeded samples,
#    both sides on the GPU (`--ref ort:cuda,tf32=off --cand ort:cuda`), compared on the GPU and,
#    with LAYERWISE_DEVICE_COMPARE=0, copied to the host as before: wall, each sample after the
#    first (progress lines), and how far the two reports' metrics are apart;
# 3. on a machine with several GPUs, the same compared on the GPU with `--devices` over all of
#    them: wall, and whether the report equals the one-GPU run's (run_info and the note aside);
# 4. one plain candidate run per sample (Python, a warm CUDA session), for the ratio.
source "$(dirname "$0")/setup.sh"
SIZES=${SIZES:-64}
HOST=${HOST:-1}    # 0: skip the runs that copy every tensor to the host
BATCHES=${BATCHES:-}  # e.g. "8 32": also compared on the GPU with --batch B, against the run above
PLAIN=${PLAIN:-1}  # 0: skip the plain candidate runs
echo "== the GPU totals against the host's metrics"
"$R/device_reduction" --include-ignored > "$OUT/device_reduction.txt" 2>&1
grep -E "^test |test result|panicked" "$OUT/device_reduction.txt"
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
"$R/layerwise" convert "$R/rec.onnx" --to fp16 -o rec_fp16.onnx > /dev/null
for N in $SIZES; do
    samples "$N"
    ARGS="$R/rec.onnx --inputs samples --ref ort:cuda,tf32=off --cand ort:cuda --cand-model rec_fp16.onnx"
    run device_$N "$R/layerwise" bisect $ARGS --json "$OUT/device_$N.json"
    per_sample "$OUT/device_$N.err" "$N" "  compared on the GPU"
    for B in $BATCHES; do
        run batch${B}_$N "$R/layerwise" bisect $ARGS --batch "$B" --json "$OUT/batch${B}_$N.json"
        python3 - "$OUT/device_$N.json" "$OUT/batch${B}_$N.json" "$B" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
width = int(sys.argv[3])
print(f"  --batch {width}: verdict {a['verdict']['status']} / {b['verdict']['status']}; first divergent", (a["verdict"].get("first_divergent") or {}).get("tensor"), "/", (b["verdict"].get("first_divergent") or {}).get("tensor"))
ra, rb = a["samples"]["runs"], b["samples"]["runs"]
same_status = sum(x["status"] == y["status"] and x.get("first_divergent") == y.get("first_divergent") for x, y in zip(ra, rb))
print(f"  per-sample status and first divergent equal: {same_status} of {len(ra)}")
ta = {t["name"]: t for t in a["tensors"]}
worst = 0.0
for t in b["tensors"]:
    o = ta.get(t["name"])
    if o and isinstance(o["metrics"]["rel_l2_err"], float) and isinstance(t["metrics"]["rel_l2_err"], float):
        x, y = o["metrics"]["rel_l2_err"], t["metrics"]["rel_l2_err"]
        if max(x, y) > 0:
            worst = max(worst, abs(x - y) / max(x, y))
print(f"  verdict sample's tensors: largest relative difference of rel_l2_err unbatched / batched: {worst:.2e}")
d = b["run_info"]["durations_s"]
batches = [v for k, v in d if "samples at once" in k or k.startswith("comparing ") and "samples' tensors" in k]
runs = [(k, v) for k, v in d if "samples at once" in k or "samples' tensors" in k]
groups = [runs[i:i+3] for i in range(0, len(runs), 3)]
per = sorted(sum(v for _, v in g) / width for g in groups[1:])
if per:
    print(f"  each sample after the first batch: median {1000 * per[len(per) // 2]:.2f} ms (batches {len(groups)}), check run", [round(v, 2) for k, v in d if "to check the batch" in k])
print("  notes:", [n for n in b["cand"]["notes"] if "batch" in n][:1])
PY
        if [ "$GPUS" != 0 ]; then
            run devices_batch${B}_$N "$R/layerwise" bisect $ARGS --batch "$B" --devices "$GPUS" --json "$OUT/devices_batch${B}_$N.json"
            same_reports "$OUT/batch${B}_$N.json" "$OUT/devices_batch${B}_$N.json"
        fi
    done
    if [ "$GPUS" != 0 ] && [ "${UNBATCHED_DEVICES:-1}" = 1 ]; then
        run devices_$N "$R/layerwise" bisect $ARGS --devices "$GPUS" --json "$OUT/devices_$N.json"
        same_reports "$OUT/device_$N.json" "$OUT/devices_$N.json"
    fi
    [ "$HOST" = 1 ] || continue
    LAYERWISE_DEVICE_COMPARE=0 run host_$N "$R/layerwise" bisect $ARGS --json "$OUT/host_$N.json"
    per_sample "$OUT/host_$N.err" "$N" "  copied to the host"
    python3 - "$OUT/host_$N.json" "$OUT/device_$N.json" <<'PY'
import json, math, sys
h, d = (json.load(open(p)) for p in sys.argv[1:])
print("  verdict host / device:", h["verdict"]["status"], "/", d["verdict"]["status"], "| first divergent:", (h["verdict"].get("first_divergent") or {}).get("tensor"), "/", (d["verdict"].get("first_divergent") or {}).get("tensor"))
print("  memory.comparison host / device:", h.get("memory", {}).get("comparison"), "/", d.get("memory", {}).get("comparison"))
hr = {r["name"]: r for r in h["tensors"]}
dr = {r["name"]: r for r in d["tensors"]}
print("  tensors compared host / device:", len(hr), "/", len(dr), "| pass flags equal:", sum(hr[k]["pass"] == dr[k]["pass"] for k in hr if k in dr))
worst = {}
for k in hr:
    if k not in dr: continue
    for f in ("rel_l2_err", "max_abs_err", "mean_abs_err", "cosine", "violations", "worst_index"):
        a, b = hr[k]["metrics"].get(f), dr[k]["metrics"].get(f)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            rel = 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))
            worst[f] = max(worst.get(f, 0.0), rel)
print("  largest relative difference per metric (the verdict's sample, every tensor):", {k: f"{v:.1e}" for k, v in worst.items()})
PY
done
[ "$PLAIN" = 1 ] || exit 0
plain_runs | tee "$OUT/plain.txt"
