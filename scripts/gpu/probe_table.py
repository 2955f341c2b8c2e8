"""Prints the per-probe table of docs/measurements/h100-2026-11-23-probes.md from the JSON that
scripts/gpu/probes.py writes. usage: python3 scripts/gpu/probe_table.py probes.json"""
import json
import sys

d = json.load(open(sys.argv[1]))


def cell(s):
    if s is None:
        return "—"
    if isinstance(s, str):
        return "refused (" + ("no kernel" if "implementation" in s or "memcpy" in s else "type not allowed") + ")"
    return ("inf/NaN x%d" % s["nonfinite"]) if s["nonfinite"] else "%.2e" % s["rel_l2"]


print(f"Device: {d['device']}, onnxruntime-gpu {d['onnxruntime']}. Relative L2 error against float32 (CPU); 'inf/NaN xN' = N non-finite values.\n")
print("| probe | precision | H100 (CUDA provider) | per-op emulation | H100 vs emulation | sequential sum/state in the format |")
print("| --- | --- | --- | --- | --- | --- |")
for r in d["probes"]:
    if r.get("dtype") == "tf32":
        print(f"| {r['probe']} | TF32 | on {cell(r['gpu_tf32_on'])}, off {cell(r['gpu_tf32_off'])} | {cell(r['emul_tf32'])} | | |")
    elif "dtype" in r:
        print(f"| {r['probe']} | {r['dtype'].upper()} | {cell(r['gpu'])} | {cell(r['emul'])} | {cell(r.get('gpu_vs_emul'))} | {cell(r.get('step'))} |")
