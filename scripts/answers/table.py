#!/usr/bin/env python3
"""docs/bisect.md's table of answer-level verdicts on real models: for PP-OCRv4's recognizer (CTC),
PP-OCR's orientation classifier (a Softmax, recognised) and nudenet's YOLOv8n (detection), under
sim:fp16, sim:bf16 and sim:int8, the element-wise verdict, the answers, and `fix`'s keep count held
to the element-wise tolerance and to the answer (`--target answer`).

    python3 scripts/answers/table.py LAYERWISE WORK_DIR [CANDIDATE...]

(CANDIDATE: FP16, BF16, INT8; all three by default.) A BF16 fix writes a BF16 model, which needs
opset 13: PP-OCR's models (opset 11 and 12) run their BF16 rows converted to opset 17 by onnx's
version converter, as `fix`'s refusal says to.

Needs pip (the wheels: rapidocr-onnxruntime 1.4.4, nudenet 3.4.2, scikit-image 0.25.2's photos)
and Pillow (reading the photos, drawing the text lines). Inputs, as the packages make them:
printed text lines drawn with DejaVu Sans (rapidocr: (pixels / 255 - 0.5) / 0.5, 48 high), two of
the classifier's upside down; four of scikit-image's photos resized to 320x320 in [0, 1] (nudenet).
Writes WORK_DIR/table.md and prints it.
"""

import glob
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
from PIL import Image, ImageDraw, ImageFont

LW, WORK = sys.argv[1], os.path.abspath(sys.argv[2])
os.makedirs(WORK, exist_ok=True)


def wheel(requirement, members):
    """The wheel's files `members` extracted under WORK."""
    d = os.path.join(WORK, "wheels")
    os.makedirs(d, exist_ok=True)
    name = requirement.split("==")[0].replace("-", "_").lower()
    found = [w for w in glob.glob(os.path.join(d, "*.whl")) if os.path.basename(w).lower().startswith(name)]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "-d", d, requirement], check=True)
        found = [w for w in glob.glob(os.path.join(d, "*.whl")) if os.path.basename(w).lower().startswith(name)]
    with zipfile.ZipFile(found[0]) as z:
        for m in members:
            z.extract(m, WORK)
    return [os.path.join(WORK, m) for m in members]


rec, cls = wheel("rapidocr-onnxruntime==1.4.4", [
    "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
    "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"])
(yolo,) = wheel("nudenet==3.4.2", ["nudenet/320n.onnx"])
photos = wheel("scikit-image==0.25.2", [f"skimage/data/{n}.png" for n in ("astronaut", "camera", "coffee", "chelsea")])

font = ImageFont.truetype(glob.glob("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")[0], 30)


def text_line(text, width, flip=False):
    im = Image.new("RGB", (width, 48), "white")
    ImageDraw.Draw(im).text((6, 6), text, fill="black", font=font)
    if flip:
        im = im.rotate(180)
    return ((np.asarray(im, np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].copy()


texts = ["Invoice 2026-12", "layerwise FP16", "Total: 348.50", "HELLO world 42"]
for d in ("rec_in", "cls_in", "yolo_in"):
    os.makedirs(os.path.join(WORK, d), exist_ok=True)
for i, t in enumerate(texts):
    np.savez(os.path.join(WORK, f"rec_in/s{i}.npz"), x=text_line(t, 320))
    np.savez(os.path.join(WORK, f"cls_in/s{i}.npz"), x=text_line(t[:10], 192, flip=i % 2 == 1))
for i, p in enumerate(photos):
    im = Image.open(p).convert("RGB").resize((320, 320))
    np.savez(os.path.join(WORK, f"yolo_in/s{i}.npz"), images=(np.asarray(im, np.float32) / 255).transpose(2, 0, 1)[None].copy())
with open(os.path.join(WORK, "per_tensor.json"), "w") as f:
    # PP-OCR's models are opset 11/12: per-channel int8 weights need 13.
    json.dump({"per_channel": False}, f)

MODELS = [
    ("PP-OCRv4 rec (CTC)", rec, "rec_in", ["--task", "softmax_11.tmp_0:ctc,blank=0"]),
    # Given, not left to the recognition: the opset 17 conversion of its BF16 rows reshapes around
    # the Softmax (a [N, C] Softmax is recognised only as the output's own producer).
    ("PP-OCR cls (classifier)", cls, "cls_in", ["--task", "save_infer_model/scale_0.tmp_1:classify"]),
    ("YOLOv8n (detect)", yolo, "yolo_in", ["--task", "output0:detect"]),
]
CANDS = [("FP16", ["--cand", "sim:fp16"]), ("BF16", ["--cand", "sim:bf16"]),
         ("INT8", ["--cand", "sim:int8", "--quant-config", os.path.join(WORK, "per_tensor.json")])]


def run(args, report):
    out = subprocess.run([LW, *args, "-q", "--json", report], capture_output=True, text=True, cwd=WORK)
    if out.returncode not in (0, 1):
        return None, out.stdout + out.stderr
    with open(report) as f:
        return json.load(f), out.stdout


def answers(records):
    return "; ".join(
        f"{a['changed_cases']} of {a['cases']} changed" if not a.get("not_judged") else "not judged"
        for a in records) or "-"


ONLY = sys.argv[3:]


def opset17(model):
    """The model converted to opset 17 where it is older (a BF16 file needs 13)."""
    import onnx
    from onnx import version_converter

    m = onnx.load(model)
    if next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) >= 13:
        return model
    path = model[:-len(".onnx")] + ".opset17.onnx"
    if not os.path.exists(path):
        onnx.save(version_converter.convert_version(m, 17), path)
    return path


rows = ["| model | candidate | element-wise verdict (worst output rel L2) | answers (4 samples) | fix, element-wise: keep | fix --target answer: keep |",
        "| --- | --- | --- | --- | --- | --- |"]
for name, model, inputs, task in MODELS:
    for cand, cand_args in CANDS:
        if ONLY and cand not in ONLY:
            continue
        tag = f"{os.path.basename(model)}.{cand}"
        common = [opset17(model) if cand == "BF16" else model, "--inputs", inputs, *cand_args, *task]
        b, said = run(["bisect", *common, "--no-noise-floor"], os.path.join(WORK, tag + ".bisect.json"))
        if b is None:
            rows.append(f"| {name} | {cand} | refused: {said.strip().splitlines()[-1][:120]} | | | |")
            continue
        worst = max((o["rel_l2_err"] for o in b["outputs"] if o.get("compared")), default=float("nan"))
        cells = []
        for target in ([], ["--target", "answer"]):
            f, said = run(["fix", *common, *target], os.path.join(WORK, tag + (".answer" if target else "") + ".fix.json"))
            if f is None:
                cells.append("error: " + said.strip().splitlines()[-1][:100])
            else:
                why = " (ill-conditioned: stopped before searching)" if "ill-conditioned" in f["summary"] else ""
                cells.append(f"{'FIXED' if f['status'] == 'fixed' else 'NOT FIXED' + why}, {len(f['keep_fp32'])}")
        verdict = f"{b['verdict']['status'].upper()} ({worst:.2e})"
        rows.append(f"| {name} | {cand} | {verdict} | {answers(b.get('answers', []))} | {cells[0]} | {cells[1]} |")
        print(rows[-1], flush=True)
table = "\n".join(rows) + "\n"
with open(os.path.join(WORK, "table.md"), "w") as f:
    f.write(table)
print(table)
