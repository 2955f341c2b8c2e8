#!/usr/bin/env bash
# Graph-size benchmark (docs/performance.md, "Graph size"): generates decoders and Relu chains of
# the given sizes, and times `layerwise bisect MODEL --inputs IN.npz` (release build) against the
# floor (scripts/bench/floor.py: two plain ONNX Runtime sessions created and run in one process).
# Prints, per model and run: nodes, floor s, layerwise wall s and CPU s (user + system: steadier
# than wall time on a shared machine), peak MiB, ratio, verdict, and
# layerwise's own step times (run_info.durations_s of its JSON report).
#
# Usage: scripts/bench/scale.sh RUNS SPEC...
#   SPEC: decoder:BLOCKS (passes), decoder-overflow:BLOCKS (one block in the middle overflows FP16,
#   so the verdict diverges and the follow-up steps run), decoder-overflows:BLOCKS (every 6th block
#   overflows on its own: BLOCKS / 6 independent overflows, for `fix`), relu:N.
#   COMMAND=fix times `layerwise fix` instead of `bisect`.
#   LAYERWISE=path (default target/release/layerwise, built here), EXTRA="--separate-runs ..."
#   (more bisect arguments), WORK=dir (default a temporary folder; models are kept there).
#   LAYERWISE_PAIRED_SEGMENT_NODES=N passes through: the paired step's segment size (0: one session).
# numpy, onnx and onnxruntime (the version layerwise loads) go into target/venv, never the product.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
runs=$1; shift
venv=target/venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import onnx, onnxruntime" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q onnx numpy onnxruntime==1.31.1
fi
py=$root/$venv/bin/python
if [ -z "${LAYERWISE:-}" ]; then cargo build --release -q; LAYERWISE=$root/target/release/layerwise; fi
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"

printf "%-22s %7s %8s %9s %9s %9s %6s %-9s %s\n" model nodes "floor s" "lw s" "lw cpu s" "peak MiB" ratio verdict "steps (s)"
for spec in "$@"; do
    kind=${spec%%:*} size=${spec#*:}
    model="$work/$kind-$size.onnx" inputs="$work/$kind-$size.npz"
    if [ ! -f "$model" ]; then
        case $kind in
            decoder) "$py" scripts/bench/make_decoder.py "$model" "$size" --inputs "$inputs" >/dev/null ;;
            decoder-overflow) "$py" scripts/bench/make_decoder.py "$model" "$size" --overflow $((size / 2)) --inputs "$inputs" >/dev/null ;;
            decoder-overflows) "$py" scripts/bench/make_decoder.py "$model" "$size" --overflow-every 6 --inputs "$inputs" >/dev/null ;;
            relu) "$py" scripts/bench/make_relu_chain.py "$model" "$size" --inputs "$inputs" >/dev/null ;;
            *) echo "unknown model kind: $kind" >&2; exit 2 ;;
        esac
    fi
    for _ in $(seq "$runs"); do
        floor=$("$py" scripts/bench/floor.py "$model" "$inputs" | "$py" -c "import json,sys; print(f'{json.load(sys.stdin)[\"floor_s\"]:.2f}')")
        rc=0
        # shellcheck disable=SC2086
        /usr/bin/time -f "%e %M %U %S" -o "$work/time" "$LAYERWISE" "${COMMAND:-bisect}" "$model" --inputs "$inputs" --json "$work/report.json" --quiet ${EXTRA:-} >"$work/out" 2>&1 || rc=$?
        if [ "$rc" -gt 1 ]; then echo "FAILED ($rc): $model" >&2; tail -20 "$work/out" >&2; exit 1; fi
        read -r wall rss user sys < <(tail -1 "$work/time")
        "$py" - "$work/report.json" "$kind:$size" "$floor" "$wall" "$rss" "$user" "$sys" <<'PY'
import json, sys
path, name, floor, wall, rss = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
cpu = float(sys.argv[6]) + float(sys.argv[7])
r = json.load(open(path))
nodes = r["model"]["node_count"] if "verdict" in r else r["node_count"]
import re
sums = {}
for k, v in r["run_info"]["durations_s"]:
    if k != "total":  # fix's "candidate run N" steps are summed: candidate_run=seconds(count)
        step = re.sub(r" \d+$", "", k.split(" (")[0]).replace(" ", "_")
        total, count = sums.get(step, (0.0, 0))
        sums[step] = (total + v, count + 1)
steps = " ".join(f"{k}={v:.2f}" + (f"({n})" if n > 1 else "") for k, (v, n) in sums.items())
verdict = r.get("status") if "verdict" not in r else r["verdict"] if isinstance(r["verdict"], str) else r["verdict"].get("status", "?")
print(f"{name:22} {nodes:7} {floor:8.2f} {wall:9.2f} {cpu:9.2f} {rss / 1024:9.0f} {wall / floor:6.1f} {verdict:9} {steps}")
PY
    done
done
