# Sourced by the GPU scripts (diagnoses.sh, emulation.sh, speed.sh): run on the lent GPU machine in
# the repository root, after ONNX Runtime's GPU build is unpacked in /tmp/ortgpu and
# LD_LIBRARY_PATH is set (docs/gpu.md). Binaries and models are carried in .gpu/run/; outputs go
# to $OUT; work happens in /tmp/gpu-work.
set -u
ROOT=$PWD
R=${R:-$ROOT/.gpu/run}
export LAYERWISE_ORT_LIB=${LAYERWISE_ORT_LIB:-/tmp/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" /tmp/gpu-work && cd /tmp/gpu-work
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

# run TAG BINARY ARGS...: the command, its exit status and /usr/bin/time line, the verdict lines,
# how many raw ONNX Runtime log lines reached stderr, and the step times of $OUT/TAG.json when the
# command wrote that report. Output in $OUT/TAG.out and $OUT/TAG.err.
run() {
    local tag=$1; shift
    echo; echo "\$ $(basename "$1") ${*:2}"
    /usr/bin/time -f "wall %e s, peak RSS %M KB" "$@" > "$OUT/$tag.out" 2> "$OUT/$tag.err"
    local rc=$?
    echo "exit $rc; $(tail -n 1 "$OUT/$tag.err"); raw ONNX Runtime lines on stderr: $(grep -c 'onnxruntime:' "$OUT/$tag.err")"
    grep -E "^VERDICT|^First|  cause|sensitive" "$OUT/$tag.out" | head -4
    if [ -f "$OUT/$tag.json" ]; then
        python3 -c "import json; r=json.load(open('$OUT/$tag.json')); print(' '.join(f'{k}={v:.2f}' for k, v in r.get('run_info', {}).get('durations_s', [])))"
    fi
}

# samples N: N seeded inputs of the recognizer (1x3x48x320 in [0,255]) as samples/sKK.npz.
samples() {
    python3 - "$1" <<'PY'
import numpy as np, os, shutil, sys
shutil.rmtree("samples", ignore_errors=True)  # an earlier script's samples would join the set
os.makedirs("samples")
rng = np.random.default_rng(0)
n = int(sys.argv[1])
for i in range(n):
    np.savez(f"samples/s{i:0{len(str(n - 1))}d}.npz", x=(rng.random((1, 3, 48, 320)) * 255).astype(np.float32))
PY
}

# same_reports ONE.json DEVICES.json: whether the --devices report equals the one-GPU report,
# run_info and the note naming the GPUs aside (printed, with that note and any differing keys).
same_reports() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for r in (a, b):
    r.pop("run_info", None)
note = [n for n in b["cand"]["notes"] if "--devices" in n]
b["cand"]["notes"] = [n for n in b["cand"]["notes"] if "--devices" not in n]
print("devices note:", note)
print("report over the GPUs identical to the one-GPU run's (run_info and that note aside):", a == b)
if a != b:
    print("differing keys:", [k for k in a if a[k] != b.get(k)])
PY
}

# per_sample ERR N LABEL: from a run's progress lines (its stderr, ERR) over N samples, the time
# each sample after the first took (median, min, max; the lines have 0.1 s resolution).
per_sample() {
    python3 - "$1" "$2" "$3" <<'PY'
import re, sys
n = int(sys.argv[2])
starts = [float(m.group(2)) for m in re.finditer(r"sample (\d+) of %d \([^)]*\)(?:, about \d+ s left)? \((\d+\.\d+) s\)" % n, open(sys.argv[1]).read())]
gaps = sorted(b - a for a, b in zip(starts[1:], starts[2:]))
if gaps:
    print(f"{sys.argv[3]}: progress lines {len(starts)}; each sample after the first: median {gaps[len(gaps) // 2]:.3f} s, min {gaps[0]:.3f}, max {gaps[-1]:.3f}")
PY
}

# plain_runs [LIMIT]: rec_fp16.onnx in its own warm CUDA session (Python), each sample of samples/
# (the first LIMIT, default all) run once: the first run, and the median of the later ones.
plain_runs() {
    python3 - "${1:-0}" <<'PY'
import glob, sys, time, numpy as np, onnxruntime as ort
s = ort.InferenceSession("rec_fp16.onnx", providers=["CUDAExecutionProvider"])
name, half = s.get_inputs()[0].name, s.get_inputs()[0].type == "tensor(float16)"
files = sorted(glob.glob("samples/*.npz"))
files = files[:int(sys.argv[1])] if int(sys.argv[1]) > 0 else files
times = []
for f in files:
    x = np.load(f)["x"]
    x = x.astype(np.float16) if half else x
    t0 = time.perf_counter()
    s.run(None, {name: x})
    times.append(time.perf_counter() - t0)
later = sorted(times[1:])
print(f"plain candidate run: first {times[0]:.3f} s, each later run median {1000 * later[len(later) // 2]:.2f} ms (of {len(later)})")
PY
}
