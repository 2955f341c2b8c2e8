"""Second round of H100 probes (see probes.py): raw outputs of ONNX Runtime's CUDA kernels where the
first round left the mechanism open, saved to $OUT/probes2.npz for analysis on the CPU
(scripts/gpu/analyze_probes2.py): recurrent ops in FP16 and TF32 (GRU also with
linear_before_reset=1, the form cuDNN runs), ReduceMean in FP16 where the sum stays in range
(is the sum rounded to FP16 before the division?), and BF16 reductions of growing size (from
which size are partial sums kept in BF16?)."""
import os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(__file__))
import probes as P  # noqa: E402  (reuses its model builder and session helpers; runs no probe of its own with FILTER)

OUT = os.environ.get("OUT", "/tmp/probe-out")
rng = np.random.default_rng(1)
saved = {}


def gpu(op, inputs, outputs, attrs, opset, dtype, feeds, tf32=True, consts=()):
    m = P.model(op, inputs, outputs, attrs, opset, dtype, consts)
    out, err = P.run(m, feeds, "cuda", tf32)
    if out is None:
        print(op, dtype, "error", err)
        return None
    return out[0]


for seq, H in ((64, 128), (1000, 64)):
    I = 32
    x = rng.normal(0, 1, (seq, 1, I)).astype(np.float32)
    for op, gates in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
        w = rng.normal(0, 1 / np.sqrt(I), (1, gates * H, I)).astype(np.float32)
        r = rng.normal(0, 1 / np.sqrt(H), (1, gates * H, H)).astype(np.float32)
        b = rng.normal(0, 0.1, (1, 2 * gates * H)).astype(np.float32)
        if op == "LSTM":
            b[0, 2 * H:3 * H] += 1.0
        attrs = {"hidden_size": H}
        if op == "GRU":
            attrs["linear_before_reset"] = 1
        feeds = {"x": x, "w": w, "r": r, "b": b}
        ins = [("x", [seq, 1, I]), ("w", [1, gates * H, I]), ("r", [1, gates * H, H]), ("b", [1, 2 * gates * H])]
        key = f"{op}_s{seq}"
        for k, v in feeds.items():
            saved[f"{key}_in_{k}"] = v
        for d in ("fp16",):
            y = gpu(op, ins, ["y"], attrs, 14, d, feeds)
            if y is not None:
                saved[f"{key}_{d}"] = y
        for mode, flag in (("tf32on", True), ("tf32off", False)):
            y = gpu(op, ins, ["y"], attrs, 14, "fp32", feeds, flag)
            if y is not None:
                saved[f"{key}_{mode}"] = y

for n in (1000, 3000, 20000):
    x = rng.uniform(0.5, 3.0, (4, n)).astype(np.float32)
    saved[f"rmean_{n}_in"] = x
    y = gpu("ReduceMean", [("x", [4, n])], ["y"], {"axes": [1], "keepdims": 1}, 17, "fp16", {"x": x})
    if y is not None:
        saved[f"rmean_{n}_fp16"] = y

for n in (4096, 8192, 16384, 32768, 65536, 262144):
    x = (1 + rng.uniform(0, 1e-2, (4, n))).astype(np.float32)
    saved[f"bsum_{n}_in"] = x
    axes = P.oh.make_tensor("axes", P.TP.INT64, [1], [1])
    y = gpu("ReduceSum", [("x", [4, n])], ["y"], {"keepdims": 1}, 17, "bf16", {"x": x}, consts=(axes,))
    if y is not None:
        saved[f"bsum_{n}_bf16"] = y
    y = gpu("ReduceSum", [("x", [4, n])], ["y"], {"keepdims": 1}, 17, "fp16", {"x": x / 64}, consts=(axes,))
    if y is not None:
        saved[f"hsum_{n}_fp16"] = y

np.savez_compressed(os.path.join(OUT, "probes2.npz"), **saved)
print("saved", len(saved), "arrays")
