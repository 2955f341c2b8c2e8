"""The emulation-versus-hardware tables of docs/gpu.md, from layerwise JSON reports.

usage: python3 scripts/emulation_table.py HW_DIR SIM_DIR [MODEL ...]
HW_DIR holds the GPU's reports (MODEL_cuda_tf32.json, MODEL_cuda_fp16.json, MODEL_cuda_bf16.json),
SIM_DIR the CPU emulations' on the same seeded inputs (MODEL_sim_tf32.json, MODEL_sim_fp16.json,
MODEL_sim_fp16_trt.json, MODEL_sim_bf16.json) and the typed evaluation of the converted file the
GPU ran (MODEL_typed_fp16.json, MODEL_typed_bf16.json: `bisect MODEL --cand ort:cpu --cand-model MODEL_fp16.onnx`).
Prints Markdown.
"""
import json
import os
import statistics
import sys

hw_dir, sim_dir = sys.argv[1], sys.argv[2]


def load(folder, name):
    path = os.path.join(folder, name)
    return json.load(open(path)) if os.path.exists(path) else None


def output_error(r):
    if r is None:
        return None
    errs = [o["rel_l2_err"] for o in r["outputs"] if o.get("compared", True)]
    errs = [float("inf") if e == "inf" else float("nan") if e == "nan" else e for e in errs]
    return max(errs) if errs else None


def verdict(r):
    if r is None:
        return "—"
    v = r["verdict"]
    if v["status"] == "pass":
        return "pass"
    fd = v.get("first_divergent")
    if fd:
        return f"`{fd['node']}` ({fd['cause']['kind']})"
    nf = r.get("noise_floor")
    if nf and nf.get("ill_conditioned"):
        return "diverged, ill-conditioned"
    return "diverged, no single layer"


def fmt(x):
    return "—" if x is None else f"{x:.2e}"


def ratio(a, b):
    # Both at float32's noise (a saturated output): no ratio means anything.
    if a is None or b is None or b == 0 or a != a or b != b or max(a, b) < 1e-12:
        return "—"
    return f"{a / b:.2f}"


def op_ratios(hw, sim, ops):
    """Median hardware/emulation ratio of per-tensor relative L2 error over tensors of `ops`."""
    if hw is None or sim is None:
        return "—"
    h = {t["name"]: t["metrics"]["rel_l2_err"] for t in hw["tensors"]}
    rs = []
    for t in sim["tensors"]:
        e = t["metrics"]["rel_l2_err"]
        if t["op_type"] in ops and isinstance(e, float) and e > 0 and isinstance(h.get(t["name"]), float) and h[t["name"]] > 0:
            rs.append(h[t["name"]] / e)
    return f"{statistics.median(rs):.2f} ({len(rs)})" if rs else "—"


models = sys.argv[3:] or ["rec", "det", "cls", "yolov8n", "demo"]
print("| model | TF32 on H100: output, verdict | sim:tf32: output, verdict | ratio | per Conv/MatMul median ratio (n) |")
print("| --- | --- | --- | --- | --- |")
for m in models:
    hw, sim = load(hw_dir, f"{m}_cuda_tf32.json"), load(sim_dir, f"{m}_sim_tf32.json")
    if hw is None and sim is None:
        continue
    print(f"| {m} | {fmt(output_error(hw))}, {verdict(hw)} | {fmt(output_error(sim))}, {verdict(sim)} | {ratio(output_error(hw), output_error(sim))} | {op_ratios(hw, sim, {'Conv', 'MatMul', 'Gemm'})} |")
print()
print("| model | CUDA FP16 model: output, verdict | sim:fp16: output, verdict | ratio | typed evaluation of that file: output, verdict | ratio |")
print("| --- | --- | --- | --- | --- | --- |")
for m in models:
    hw, sim, typed = load(hw_dir, f"{m}_cuda_fp16.json"), load(sim_dir, f"{m}_sim_fp16.json"), load(sim_dir, f"{m}_typed_fp16.json")
    if hw is None:
        continue
    print(f"| {m} | {fmt(output_error(hw))}, {verdict(hw)} | {fmt(output_error(sim))}, {verdict(sim)} | {ratio(output_error(hw), output_error(sim))} | {fmt(output_error(typed))}, {verdict(typed)} | {ratio(output_error(hw), output_error(typed))} |")
print()
print("| model | CUDA BF16 model: output, verdict | sim:bf16: output, verdict | ratio | typed evaluation of that file: output, verdict | ratio |")
print("| --- | --- | --- | --- | --- | --- |")
for m in models:
    hw, sim, typed = load(hw_dir, f"{m}_cuda_bf16.json"), load(sim_dir, f"{m}_sim_bf16.json"), load(sim_dir, f"{m}_typed_bf16.json")
    if hw is None:
        continue
    print(f"| {m} | {fmt(output_error(hw))}, {verdict(hw)} | {fmt(output_error(sim))}, {verdict(sim)} | {ratio(output_error(hw), output_error(sim))} | {fmt(output_error(typed))}, {verdict(typed)} | {ratio(output_error(hw), output_error(typed))} |")
