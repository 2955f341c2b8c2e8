"""What the second probe round (scripts/gpu/probes2.py) shows, computed on the CPU from the H100's
recorded outputs: usage: python3 scripts/gpu/analyze_probes2.py probes2.npz

- ReduceMean in FP16 with the sum in range: is the H100's value the mean rounded once ('direct',
  the per-op emulation) or the float32 sum rounded to FP16, then divided ('via FP16 sum')?
- ReduceSum in FP16 and BF16 over growing sizes: error against one rounding of the exact sum.
- LSTM in FP16: hypotheses of which intermediates cuDNN stores in FP16; LSTM under TF32: the
  recurrence on TF32-rounded X, W, R."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import probes as P  # noqa: E402

d = np.load(sys.argv[1])
r16 = lambda x: P.round_to(x, "fp16")


def rl2(a, b):
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


for n in (1000, 3000, 20000):
    x = r16(d[f"rmean_{n}_in"])
    g = d[f"rmean_{n}_fp16"].ravel()
    exact = x.astype(np.float64).sum(1) / n
    direct = r16(exact.astype(np.float32))
    via = r16((r16(x.sum(1, dtype=np.float64).astype(np.float32)) / n).astype(np.float32))
    print(f"ReduceMean FP16 n={n}: H100 = direct in {int((g == direct).sum())}/4 rows, = via FP16 sum in {int((g == via).sum())}/4 rows")
for n in (4096, 8192, 16384, 32768, 65536, 262144):
    for key, fmt, scale in ((f"hsum_{n}_fp16", "fp16", 64), (f"bsum_{n}_bf16", "bf16", 1)):
        if key in d:
            x = P.round_to(d[f"bsum_{n}_in"] / scale, fmt)
            ex = x.astype(np.float64).sum(1)
            once = np.abs(P.round_to(ex.astype(np.float32), fmt) - ex) / ex
            print(f"ReduceSum {fmt.upper()} n={n}: H100 rel err {np.abs(d[key].ravel() - ex).max() / ex.max():.2e}, one rounding of the exact sum {once.max():.2e}")
sig = lambda v: 1 / (1 + np.exp(-v))


def lstm(x, w, r, b, rnd, stored):
    """ONNX LSTM (forward, default activations); `stored` lists what is rounded by `rnd`."""
    H = r.shape[2]
    h = np.zeros((1, H), np.float32)
    c = h.copy()
    out = []
    W, R, B = w[0], r[0], b[0]
    xw = x[:, 0, :] @ W.T + B[: 4 * H]
    if "xw" in stored:
        xw = rnd(xw)
    for t in range(x.shape[0]):
        hr = h @ R.T + B[4 * H:]
        if "hr" in stored:
            hr = rnd(hr)
        g = xw[t:t + 1] + hr
        if "gates" in stored:
            g = rnd(g)
        i, o, f, cc = np.split(g, 4, axis=1)
        c = sig(f) * c + sig(i) * np.tanh(cc)
        h = sig(o) * np.tanh(c)
        if "c" in stored:
            c = rnd(c)
        if "h" in stored:
            h = rnd(h)
        out.append(h)
    return np.stack(out)[:, None]


for s in (64, 1000):
    k = f"LSTM_s{s}"
    x, w, r, b = (d[f"{k}_in_{n}"] for n in "xwrb")
    exact = lstm(x, w, r, b, lambda v: v, ())
    g = d[f"{k}_fp16"]
    rounded = [r16(v) for v in (x, w, r, b)]
    print(f"LSTM FP16 seq={s}: H100 error {rl2(g, exact):.2e}")
    for stored in ((), ("h",), ("h", "c"), ("xw", "hr", "h", "c"), ("xw", "hr", "gates", "h", "c")):
        hyp = r16(lstm(*rounded, r16, stored))
        print(f"  intermediates in FP16 {stored or '(output only)'}: error {rl2(hyp, exact):.2e}, H100 vs it {rl2(g, hyp):.2e}")
    t = lambda v: P.round_to(v, "tf32")
    hyp = lstm(t(x), t(w), t(r), b, lambda v: v, ())
    print(f"LSTM TF32 seq={s}: H100 error {rl2(d[f'{k}_tf32on'], exact):.2e}, X/W/R rounded to TF32 {rl2(hyp, exact):.2e}, H100 vs it {rl2(d[f'{k}_tf32on'], hyp):.2e}; tf32 off {rl2(d[f'{k}_tf32off'], exact):.2e}")
