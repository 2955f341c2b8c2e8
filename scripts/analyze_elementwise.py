"""Compares the H100's FP16/BF16 unary ops (scripts/gpu/elementwise_probe.py's npz) with the
float32 op rounded once to the type: per op and type, how many outputs differ, by how many units
in the last place, and the worst relative error where the exact output is at least 1e-3.
usage: python3 scripts/analyze_elementwise.py elementwise.npz"""
import math
import sys

import numpy as np

F = {
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x.astype(np.float64))),
    "Tanh": lambda x: np.tanh(x.astype(np.float64)),
    "Exp": lambda x: np.exp(x.astype(np.float64)),
    "Log": lambda x: np.log(x.astype(np.float64)),
    "Erf": lambda x: np.vectorize(math.erf)(x.astype(np.float64)),
    "Sqrt": lambda x: np.sqrt(x.astype(np.float64)),
    "Reciprocal": lambda x: 1 / x.astype(np.float64),
    "Relu": lambda x: np.maximum(x.astype(np.float64), 0),
    "HardSigmoid": lambda x: np.clip(0.2 * x.astype(np.float64) + 0.5, 0, 1),
    "HardSwish": lambda x: x * np.clip(x.astype(np.float64) / 6 + 0.5, 0, 1),
    "Softplus": lambda x: np.log1p(np.exp(x.astype(np.float64))),
}


def to_f32(bits, tag):
    return bits.view(np.float16).astype(np.float32) if tag == "fp16" else (bits.astype(np.uint32) << 16).view(np.float32)


def round_to(v, tag):
    v = v.astype(np.float32)
    if tag == "fp16":
        return v.astype(np.float16).astype(np.float32)
    b = v.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16  # round to nearest even
    return b.astype(np.uint32).view(np.float32)


d = np.load(sys.argv[1])
print("| op | type | outputs | differ from the float32 op rounded once | most ulps | worst relative error (|y| >= 1e-3) |")
print("| --- | --- | --- | --- | --- | --- |")
for key in sorted(k for k in d.files if k.endswith("_x")):
    op, tag, _ = key.rsplit("_", 2)
    x = to_f32(d[key], tag)
    y = to_f32(d[f"{op}_{tag}_y"], tag)
    with np.errstate(all="ignore"):
        exact = F[op](x)
        once = round_to(exact, tag)
    ok = np.isfinite(once) & np.isfinite(y)
    differ = ok & (once != y)
    bits = lambda v: v.view(np.uint32).astype(np.int64) >> (13 if tag == "fp16" else 16)
    ulps = np.abs(bits(once[ok]) - bits(y[ok])).max() if ok.any() else 0
    big = ok & (np.abs(exact) >= 1e-3)
    rel = (np.abs(y[big] - exact[big]) / np.abs(exact[big])).max() if big.any() else float("nan")
    print(f"| {op} | {tag} | {ok.sum()} | {differ.sum()} | {ulps} | {rel:.2e} |")
