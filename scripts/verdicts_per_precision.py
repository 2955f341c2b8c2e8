#!/usr/bin/env python3
"""Bisects real models under sim:fp16, sim:bf16 and sim:tf32 and tabulates the verdicts, the noise
floor (what it perturbed, how far the output moved, the candidate's multiple of it) and the
mechanism each verdict states: docs/bisect.md's "Verdicts per precision" table.

    python3 scripts/verdicts_per_precision.py LAYERWISE MODELS.txt OUT_PREFIX

MODELS.txt: one model per line, `name path [bisect arguments...]` (`#` starts a comment; `@DIR`
in an argument is replaced by the folder of MODELS.txt, and `MODELS` in a path by the MODELS
environment variable: where the wheels' models were extracted). Writes OUT_PREFIX.json (every report's
verdict, noise floor and tolerances) and OUT_PREFIX.md (the table), and prints the table.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

CANDIDATES = ["sim:fp16", "sim:bf16", "sim:tf32"]


def short(v):
    if isinstance(v, str):
        return v
    if v is None:
        return "-"
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    return f"{v:.2e}" if v != 0 else "0"


def mechanism(report):
    v = report["verdict"]
    fd = v.get("first_divergent")
    if fd:
        return f"`{fd['node']}` ({fd['cause']['kind']})"
    for c in v.get("conclusions", []):
        if c.startswith("measured mechanism:"):
            kind = c.split("measured mechanism: ", 1)[1].split(" at ", 1)[0]
            node = c.split(" at '", 1)[1].split("'", 1)[0]
            return f"no layer at fault; mechanism {kind} at `{node}`"
        if c.startswith("TF32:"):
            node = c.split("enters at '", 1)[1].split("'", 1)[0] if "enters at '" in c else "?"
            return f"TF32 enters at `{node}`"
    return "-"


def main():
    layerwise, models_file, out_prefix = sys.argv[1:4]
    base = os.path.dirname(os.path.abspath(models_file))
    rows, records = [], []
    for line in open(models_file):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.replace("MODELS", os.environ.get("MODELS", "MODELS"))
        name, path, *args = line.split()
        path = path if os.path.isabs(path) else os.path.join(base, path)
        args = [a.replace("@DIR", base) for a in args]
        for cand in CANDIDATES:
            with tempfile.TemporaryDirectory() as d:
                report_path = os.path.join(d, "r.json")
                started = time.time()
                run = subprocess.run([layerwise, "bisect", path, "--cand", cand, *args, "--json", report_path, "--quiet"], capture_output=True, text=True)
                seconds = time.time() - started
                if run.returncode not in (0, 1):
                    said = [l for l in run.stderr.strip().splitlines() if l.startswith("error")] or run.stderr.strip().splitlines()[-1:]
                    rows.append(f"| {name} | {cand} | exit {run.returncode} | {said[0][:160] if said else ''} | | | |")
                    records.append({"model": name, "candidate": cand, "exit": run.returncode, "stderr": run.stderr[-2000:]})
                    continue
                report = json.load(open(report_path))
            number = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}
            outputs = [number.get(o["rel_l2_err"], o["rel_l2_err"]) for o in report["outputs"] if o["compared"]]
            worst = max(outputs, default=None)
            floor = report.get("noise_floor")
            floor_text = "-"
            if floor:
                floor_text = f"{short(floor['output_error'])} ({floor['moved_values']} moved, {floor['exact_values']} exact); x{short(floor['ratio'])}"
                if floor["ill_conditioned"]:
                    floor_text += ", **ill-conditioned**"
            status = report["verdict"]["status"]
            rows.append(f"| {name} | {cand} | {status} | {short(worst)} | {floor_text} | {mechanism(report)} | {seconds:.1f} s |")
            records.append({
                "model": name,
                "candidate": cand,
                "exit": run.returncode,
                "seconds": round(seconds, 2),
                "status": status,
                "worst_output_error": worst,
                "tolerances": report["tolerances"],
                "noise_floor": floor,
                "first_divergent": report["verdict"].get("first_divergent"),
                "conclusions": report["verdict"]["conclusions"],
                "summary": report["verdict"]["summary"],
            })
            print(rows[-1], flush=True)
    header = "| model | candidate | verdict | worst output rel L2 | noise floor (values moved, exact); candidate's multiple | first divergent layer or mechanism | time |\n| --- | --- | --- | --- | --- | --- | --- |"
    table = header + "\n" + "\n".join(rows) + "\n"
    open(out_prefix + ".md", "w").write(table)
    json.dump(records, open(out_prefix + ".json", "w"), indent=1)
    print(table)


if __name__ == "__main__":
    main()
