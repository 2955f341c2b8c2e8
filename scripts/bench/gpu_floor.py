"""The GPU floor for one reference/candidate pair (docs/performance.md, issue 55): two plain ONNX
Runtime sessions on the CUDA provider, the float32 reference with TF32 off and the candidate file
as it is (the sessions layerwise's `--ref ort:cuda,tf32=off --cand ort:cuda --cand-model CAND`
compares), created and run once each, in one process, timed from before the first session to after
the second run; `import onnxruntime` is not counted.

usage: python3 scripts/bench/gpu_floor.py MODEL CAND_MODEL IN.npz
Prints one JSON line.
"""
import json
import sys
import time

import numpy as np
import onnxruntime as ort

model, cand, inputs = sys.argv[1:4]
with np.load(inputs) as d:
    feeds = {k: d[k] for k in d.files}


def cand_feeds(session):
    # A converted model may declare FP16 inputs: the same values, converted (as layerwise feeds it).
    out = {}
    for i in session.get_inputs():
        v = feeds[i.name]
        out[i.name] = v.astype(np.float16) if i.type == "tensor(float16)" else v
    return out


t0 = time.perf_counter()
s1 = ort.InferenceSession(model, providers=[("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"])
t1 = time.perf_counter()
s1.run(None, feeds)
t2 = time.perf_counter()
s2 = ort.InferenceSession(cand, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
t3 = time.perf_counter()
s2.run(None, cand_feeds(s2))
t4 = time.perf_counter()
print(json.dumps({"session1_s": t1 - t0, "run1_s": t2 - t1, "session2_s": t3 - t2, "run2_s": t4 - t3,
                  "floor_s": t4 - t0, "providers": s2.get_providers()}))
