"""Per-op probes of ONNX Runtime's CUDA kernels in FP16, BF16 and TF32 (issue: emulation that
accumulates as the GPU does). Each probe is one op in a tiny model whose values are chosen so that
a reduced-precision *running* sum or state, not the result, leaves the format's range or loses
bits. Every probe is run three ways and written to $OUT/probes.json:

  gpu   ONNX Runtime's CUDA provider on the typed model: input float32 -> Cast(D) -> op in D ->
        Cast(float32) (TF32: the float32 model with use_tf32 on, and off);
  emul  what layerwise's per-op emulation computes: the op in float32 on the CPU on D-rounded
        inputs, its output rounded to D (TF32: Conv/MatMul/Gemm inputs rounded to TF32);
  step  for RNNs, the same recurrence with the state (h, c) rounded to D after every step
        (numpy), and for reductions a running sum kept in D (numpy, sequential order).

Usage (GPU machine, after `source scripts/gpu/unstage.sh`): python3 scripts/gpu/probes.py [FILTER]
"""
import json, os, sys
import numpy as np
import onnx
from onnx import TensorProto as TP, helper as oh
import onnxruntime as ort

OUT = os.environ.get("OUT", "/tmp/probe-out")
os.makedirs(OUT, exist_ok=True)
FILTER = sys.argv[1] if len(sys.argv) > 1 else ""
rng = np.random.default_rng(0)
DT = {"fp16": TP.FLOAT16, "bf16": TP.BFLOAT16}


def round_bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def round_to(x, d):
    x = np.asarray(x, np.float32)
    if d == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if d == "bf16":
        return round_bf16(x)
    if d == "tf32":
        c = x * np.float32(8193.0)
        return (c - (c - x)).astype(np.float32)
    return x


def model(op, inputs, outputs, attrs, opset, dtype, consts=()):
    """inputs: [(name, shape)] float inputs; consts: initializers (not cast)."""
    nodes, gin = [], []
    elem = DT.get(dtype, TP.FLOAT)
    for name, shape in inputs:
        gin.append(oh.make_tensor_value_info(name, TP.FLOAT, shape))
        if dtype in DT:
            nodes.append(oh.make_node("Cast", [name], [name + "_d"], to=elem))
    names = [n + "_d" if dtype in DT else n for n, _ in inputs]
    names += [c.name for c in consts]
    outs = [o + "_d" if dtype in DT else o for o in outputs]
    nodes.append(oh.make_node(op, names, outs, **attrs))
    gout = []
    for o, od in zip(outputs, outs):
        if dtype in DT:
            nodes.append(oh.make_node("Cast", [od], [o], to=TP.FLOAT))
        gout.append(oh.make_tensor_value_info(o, TP.FLOAT, None))
    g = oh.make_graph(nodes, "probe", gin, gout, initializer=list(consts))
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def session(mbytes, provider, tf32=True):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if provider == "cuda":
        prov = [("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0"})]
    else:
        prov = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(mbytes, so, providers=prov)
    if provider == "cuda" and "CUDAExecutionProvider" not in sess.get_providers():
        raise RuntimeError("CUDA provider did not start")
    return sess


def run(mbytes, feeds, provider, tf32=True):
    try:
        return [np.asarray(o, np.float32) for o in session(mbytes, provider, tf32).run(None, feeds)], None
    except Exception as e:  # a refused type or kernel is a finding too
        return None, str(e).splitlines()[0][:300]


def stats(a, ref):
    if a is None:
        return None
    a64, r64 = a.astype(np.float64), ref.astype(np.float64)
    fin = np.isfinite(a64)
    d = np.where(fin & np.isfinite(r64), a64 - r64, 0.0)
    nr = np.linalg.norm(r64[np.isfinite(r64)]) or 1.0
    return {"nonfinite": int((~fin).sum()), "rel_l2": float(np.linalg.norm(d) / nr),
            "max_abs": float(np.abs(d).max()) if d.size else 0.0,
            "first": [float(v) for v in a.ravel()[:3]], "absmax": float(np.nanmax(np.abs(np.where(fin, a64, 0))))}


RESULTS = []


def probe(name, op, inputs, outputs, attrs, opset, feeds, dtypes=("fp16", "bf16", "tf32"), consts=(), step=None):
    if FILTER and FILTER not in name:
        return
    f32 = model(op, inputs, outputs, attrs, opset, "fp32", consts)
    exact, err = run(f32, feeds, "cpu")
    if exact is None:
        RESULTS.append({"probe": name, "op": op, "error_cpu": err}); print(name, "CPU error", err); return
    for d in dtypes:
        if d == "bf16" and opset < 13:
            continue
        rec = {"probe": name, "op": op, "dtype": d, "opset": opset,
               "shapes": {k: list(v.shape) for k, v in feeds.items()}}
        if d == "tf32":
            on, e1 = run(f32, feeds, "cuda", True)
            off, e2 = run(f32, feeds, "cuda", False)
            rec["gpu_tf32_on"] = stats(on[0], exact[0]) if on else e1
            rec["gpu_tf32_off"] = stats(off[0], exact[0]) if off else e2
            # the emulation: multiplied inputs of Conv/ConvTranspose/MatMul/Gemm rounded to TF32
            if op in ("Conv", "ConvTranspose", "MatMul", "Gemm"):
                ef = dict(feeds)
                for k in list(ef)[:2]:
                    ef[k] = round_to(ef[k], "tf32")
                emu, _ = run(f32, ef, "cpu")
            else:
                emu = exact
            rec["emul_tf32"] = stats(emu[0], exact[0])
        else:
            md = model(op, inputs, outputs, attrs, opset, d, consts)
            rf = {k: round_to(v, d) for k, v in feeds.items()}
            gpu, e = run(md, feeds, "cuda")
            cpu_typed, _ = run(md, feeds, "cpu")
            emu_raw, _ = run(f32, rf, "cpu")
            emu = round_to(emu_raw[0], d)
            rec["exact_absmax"] = float(np.abs(exact[0]).max())
            rec["gpu"] = stats(gpu[0], exact[0]) if gpu else e
            rec["emul"] = stats(emu, exact[0])
            rec["cpu_typed"] = stats(cpu_typed[0], exact[0]) if cpu_typed else None
            if gpu:
                rec["gpu_vs_emul"] = stats(gpu[0], emu)
            if step is not None:
                st = step(rf, d)
                rec["step"] = stats(st, exact[0])
                if gpu:
                    rec["gpu_vs_step"] = stats(gpu[0], st)
        RESULTS.append(rec)
        print(json.dumps(rec)[:600], flush=True)


def seq_sum(x, d, axis=-1):
    """A running sum kept in D, sequential over the axis."""
    x = np.moveaxis(x, axis, -1)
    acc = np.zeros(x.shape[:-1], np.float32)
    for i in range(x.shape[-1]):
        acc = round_to(acc + x[..., i], d)
    return acc


def main():
    # ---- reductions: values 30 +- 1, so sums reach 30*N while means stay 30 -------------------------
    for n in (1024, 2048, 4096, 65536, 343440):
        x = (30 + rng.uniform(-1, 1, (1, n))).astype(np.float32)
        axes = oh.make_tensor("axes", TP.INT64, [1], [1])
        probe(f"ReduceSum n={n}", "ReduceSum", [("x", [1, n])], ["y"], {"keepdims": 1}, 17, {"x": x}, ("fp16", "bf16"), (axes,),
              step=lambda rf, d: seq_sum(rf["x"], d)[..., None])
        probe(f"ReduceMean n={n}", "ReduceMean", [("x", [1, n])], ["y"], {"axes": [1], "keepdims": 1}, 17, {"x": x}, ("fp16", "bf16"),
              step=lambda rf, d, n=n: round_to(seq_sum(rf["x"], d) / n, d)[..., None])
        probe(f"ReduceL2 n={n}", "ReduceL2", [("x", [1, n])], ["y"], {"axes": [1], "keepdims": 1}, 17, {"x": x}, ("fp16", "bf16"))
        probe(f"ReduceSumSquare n={n}", "ReduceSumSquare", [("x", [1, n])], ["y"], {"axes": [1], "keepdims": 1}, 17, {"x": x / 30}, ("fp16", "bf16"))
        probe(f"ReduceLogSumExp n={n}", "ReduceLogSumExp", [("x", [1, n])], ["y"], {"axes": [1], "keepdims": 1}, 17, {"x": x / 30}, ("fp16", "bf16"))
    # precision rather than range: ones plus small noise, a sum in D loses the low bits
    for n in (4096, 65536):
        x = (1 + rng.uniform(0, 1e-2, (4, n))).astype(np.float32)
        probe(f"ReduceMean ones n={n}", "ReduceMean", [("x", [4, n])], ["y"], {"axes": [1], "keepdims": 1}, 17, {"x": x}, ("fp16", "bf16"),
              step=lambda rf, d, n=n: round_to(seq_sum(rf["x"], d) / n, d)[..., None])
    # over several axes, as RivaGAN's ReduceMean does
    x = (27 + rng.uniform(-1, 1, (1, 4, 270, 318))).astype(np.float32)
    probe("ReduceMean 4x270x318 axes=1,2,3", "ReduceMean", [("x", [1, 4, 270, 318])], ["y"], {"axes": [1, 2, 3], "keepdims": 1}, 17, {"x": x}, ("fp16", "bf16"))

    # ---- pools ---------------------------------------------------------------------------------------
    for hw in (64, 256, 586):
        x = (30 + rng.uniform(-1, 1, (1, 8, hw, hw))).astype(np.float32)
        probe(f"GlobalAveragePool {hw}x{hw}", "GlobalAveragePool", [("x", [1, 8, hw, hw])], ["y"], {}, 17, {"x": x}, ("fp16", "bf16"))
    x = (30 + rng.uniform(-1, 1, (1, 4, 128, 128))).astype(np.float32)
    probe("AveragePool k=64", "AveragePool", [("x", [1, 4, 128, 128])], ["y"], {"kernel_shape": [64, 64], "strides": [64, 64]}, 17, {"x": x}, ("fp16", "bf16"))

    # ---- softmax: n equal logits, the sum of exp(0) reaches n -----------------------------------------
    for n in (4096, 100000):
        x = rng.uniform(-0.5, 0.5, (2, n)).astype(np.float32)
        probe(f"Softmax n={n}", "Softmax", [("x", [2, n])], ["y"], {"axis": -1}, 17, {"x": x}, ("fp16", "bf16"))
        probe(f"LogSoftmax n={n}", "LogSoftmax", [("x", [2, n])], ["y"], {"axis": -1}, 17, {"x": x}, ("fp16", "bf16"))

    # ---- normalizations: |x| ~ 300, x^2 ~ 9e4 beyond 65504 ---------------------------------------------
    for c in (768, 4096):
        x = (300 * rng.choice([-1, 1], (4, c)) + rng.uniform(-5, 5, (4, c))).astype(np.float32)
        g = np.ones(c, np.float32); b = np.zeros(c, np.float32)
        probe(f"LayerNormalization c={c}", "LayerNormalization", [("x", [4, c]), ("g", [c]), ("b", [c])], ["y"], {"axis": -1}, 17,
              {"x": x, "g": g, "b": b}, ("fp16", "bf16"))
        x2 = (rng.uniform(280, 320, (4, c))).astype(np.float32)
        probe(f"LayerNormalization mean300 c={c}", "LayerNormalization", [("x", [4, c]), ("g", [c]), ("b", [c])], ["y"], {"axis": -1}, 17,
              {"x": x2, "g": g, "b": b}, ("fp16", "bf16"))
    x = (300 * rng.choice([-1, 1], (1, 8, 64, 64)) + rng.uniform(-5, 5, (1, 8, 64, 64))).astype(np.float32)
    probe("InstanceNormalization 64x64", "InstanceNormalization", [("x", [1, 8, 64, 64]), ("s", [8]), ("b", [8])], ["y"], {}, 17,
          {"x": x, "s": np.ones(8, np.float32), "b": np.zeros(8, np.float32)}, ("fp16", "bf16"))
    probe("GroupNormalization g=2 64x64", "GroupNormalization", [("x", [1, 8, 64, 64]), ("s", [8]), ("b", [8])], ["y"], {"num_groups": 2}, 21,
          {"x": x, "s": np.ones(8, np.float32), "b": np.zeros(8, np.float32)}, ("fp16", "bf16"))
    xb = rng.uniform(-1, 1, (1, 8, 16, 16)).astype(np.float32)
    probe("BatchNormalization var=1e3", "BatchNormalization", [("x", [1, 8, 16, 16]), ("s", [8]), ("b", [8]), ("m", [8]), ("v", [8])], ["y"], {}, 15,
          {"x": xb, "s": np.ones(8, np.float32), "b": np.zeros(8, np.float32), "m": np.zeros(8, np.float32), "v": np.full(8, 1e3, np.float32)}, ("fp16", "bf16"))

    # ---- products: K positive products first, then K negative ones: a running sum peaks at K*9e4 ------
    for k in (256, 4096):
        a = np.concatenate([np.full((8, k // 2), 300.0), np.full((8, k // 2), 300.0)], 1).astype(np.float32)
        b = np.concatenate([np.full((k // 2, 8), 1.0), np.full((k // 2, 8), -1.0)], 0).astype(np.float32) + rng.uniform(0, 1e-3, (k, 8)).astype(np.float32)
        probe(f"MatMul cancel k={k}", "MatMul", [("a", [8, k]), ("b", [k, 8])], ["y"], {}, 17, {"a": a, "b": b})
        probe(f"Gemm cancel k={k}", "Gemm", [("a", [8, k]), ("b", [k, 8])], ["y"], {}, 17, {"a": a, "b": b})
        a1 = (1 + rng.uniform(0, 1e-2, (64, k))).astype(np.float32)
        probe(f"MatMul ones k={k}", "MatMul", [("a", [64, k]), ("b", [k, 64])], ["y"], {}, 17, {"a": a1, "b": np.ones((k, 64), np.float32)})
    for k in (64, 1024):
        a = rng.normal(0, 1, (256, k)).astype(np.float32); b = rng.normal(0, 1 / np.sqrt(k), (k, 256)).astype(np.float32)
        probe(f"MatMul normal k={k}", "MatMul", [("a", [256, k]), ("b", [k, 256])], ["y"], {}, 17, {"a": a, "b": b})
    for cin in (3, 64, 512):
        x = rng.uniform(0, 10, (1, cin, 32, 32)).astype(np.float32)
        w = rng.normal(0, 1, (32, cin, 3, 3)).astype(np.float32)
        probe(f"Conv cin={cin}", "Conv", [("x", [1, cin, 32, 32]), ("w", [32, cin, 3, 3])], ["y"], {"pads": [1, 1, 1, 1]}, 17, {"x": x, "w": w})
    x = np.full((1, 512, 16, 16), 30.0, np.float32); w = np.concatenate([np.full((8, 256, 3, 3), 10.0), np.full((8, 256, 3, 3), -10.0)], 1).astype(np.float32)
    probe("Conv cancel cin=512", "Conv", [("x", [1, 512, 16, 16]), ("w", [8, 512, 3, 3])], ["y"], {"pads": [1, 1, 1, 1]}, 17, {"x": x, "w": w})
    x = rng.uniform(0, 10, (1, 256, 16, 16)).astype(np.float32); w = rng.normal(0, 1, (256, 16, 4, 4)).astype(np.float32)
    probe("ConvTranspose cin=256", "ConvTranspose", [("x", [1, 256, 16, 16]), ("w", [256, 16, 4, 4])], ["y"], {"strides": [2, 2]}, 17, {"x": x, "w": w})
    a = rng.normal(0, 1, (4, 64, 512)).astype(np.float32); b = rng.normal(0, 1, (4, 512, 64)).astype(np.float32)
    probe("Einsum bij,bjk->bik", "Einsum", [("a", [4, 64, 512]), ("b", [4, 512, 64])], ["y"], {"equation": "bij,bjk->bik"}, 17, {"a": a, "b": b})
    a = (30 + rng.uniform(-1, 1, (8, 8192))).astype(np.float32)
    probe("Einsum ij->i (sum)", "Einsum", [("a", [8, 8192])], ["y"], {"equation": "ij->i"}, 17, {"a": a}, ("fp16", "bf16", "tf32"))

    def cumsum_step(x, d):
        acc = np.zeros(x.shape[0], np.float32); out = np.zeros_like(x)
        for i in range(x.shape[1]):
            acc = round_to(acc + x[:, i], d); out[:, i] = acc
        return out


    # ---- CumSum: ones, a running sum in D stalls at 2048 (fp16) / 256 (bf16) -----------------------------
    ax = oh.make_tensor("axis", TP.INT64, [], [1])
    for n in (4096, 65536):
        x = (1 + rng.uniform(0, 1e-3, (2, n))).astype(np.float32)
        probe(f"CumSum n={n}", "CumSum", [("x", [2, n])], ["y"], {}, 17, {"x": x}, ("fp16", "bf16"), (ax,),
              step=lambda rf, d: cumsum_step(rf["x"], d))


    # ---- recurrent ops: numpy recurrences with the state kept in float32 or rounded each step --------------
    sig = lambda v: 1 / (1 + np.exp(-v))


    def lstm_np(x, w, r, b, d, round_state):
        seq, batch, _ = x.shape; h = np.zeros((batch, r.shape[-1]), np.float32); c = h.copy(); hs = []
        W, R, B = w[0], r[0], b[0]; H = R.shape[1]
        for t in range(seq):
            g = x[t] @ W.T + h @ R.T + B[:4 * H] + B[4 * H:]
            i, o, f, cc = np.split(g, 4, axis=1)
            c = sig(f) * c + sig(i) * np.tanh(cc); h = sig(o) * np.tanh(c)
            if round_state:
                c = round_to(c, d); h = round_to(h, d)
            hs.append(h)
        return round_to(np.stack(hs)[:, None], d)


    def gru_np(x, w, r, b, d, round_state):
        seq, batch, _ = x.shape; H = r.shape[-1]; h = np.zeros((batch, H), np.float32); hs = []
        W, R, B = w[0], r[0], b[0]
        for t in range(seq):
            xw = x[t] @ W.T + B[:3 * H]; Wz, Wr, Wh = np.split(xw, 3, 1)
            Rz, Rr, Rh = np.split(R, 3, 0); Bz, Br, Bh = np.split(B[3 * H:], 3)
            z = sig(Wz + h @ Rz.T + Bz); rr = sig(Wr + h @ Rr.T + Br)
            hh = np.tanh(Wh + (rr * h) @ Rh.T + Bh)  # linear_before_reset = 0
            h = (1 - z) * hh + z * h
            if round_state:
                h = round_to(h, d)
            hs.append(h)
        return round_to(np.stack(hs)[:, None], d)


    for seq, H in ((64, 128), (1000, 64)):
        I = 32
        x = rng.normal(0, 1, (seq, 1, I)).astype(np.float32)
        w = rng.normal(0, 1 / np.sqrt(I), (1, 4 * H, I)).astype(np.float32)
        r = rng.normal(0, 1 / np.sqrt(H), (1, 4 * H, H)).astype(np.float32)
        b = rng.normal(0, 0.1, (1, 8 * H)).astype(np.float32)
        b[0, 2 * H:3 * H] += 1.0  # forget gate biased open: long memory, the cell state carries rounding
        probe(f"LSTM seq={seq} H={H}", "LSTM", [("x", [seq, 1, I]), ("w", [1, 4 * H, I]), ("r", [1, 4 * H, H]), ("b", [1, 8 * H])], ["y"],
              {"hidden_size": H}, 14, {"x": x, "w": w, "r": r, "b": b},
              step=lambda rf, d: lstm_np(rf["x"], rf["w"], rf["r"], rf["b"], d, True))
        wg = rng.normal(0, 1 / np.sqrt(I), (1, 3 * H, I)).astype(np.float32)
        rg = rng.normal(0, 1 / np.sqrt(H), (1, 3 * H, H)).astype(np.float32)
        bg = rng.normal(0, 0.1, (1, 6 * H)).astype(np.float32)
        probe(f"GRU seq={seq} H={H}", "GRU", [("x", [seq, 1, I]), ("w", [1, 3 * H, I]), ("r", [1, 3 * H, H]), ("b", [1, 6 * H])], ["y"],
              {"hidden_size": H}, 14, {"x": x, "w": wg, "r": rg, "b": bg},
              step=lambda rf, d: gru_np(rf["x"], rf["w"], rf["r"], rf["b"], d, True))
        wr = rng.normal(0, 1 / np.sqrt(I), (1, H, I)).astype(np.float32)
        rr_ = rng.normal(0, 0.9 / np.sqrt(H), (1, H, H)).astype(np.float32)
        br = np.zeros((1, 2 * H), np.float32)
        probe(f"RNN seq={seq} H={H}", "RNN", [("x", [seq, 1, I]), ("w", [1, H, I]), ("r", [1, H, H]), ("b", [1, 2 * H])], ["y"],
              {"hidden_size": H}, 14, {"x": x, "w": wr, "r": rr_, "b": br})

    with open(os.path.join(OUT, "probes.json"), "w") as f:
        json.dump({"onnxruntime": ort.__version__, "device": os.popen("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader").read().strip(),
                   "probes": RESULTS}, f, indent=1)
    print("wrote", len(RESULTS), "probe results")


if __name__ == "__main__":
    main()
