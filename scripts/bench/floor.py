"""The floor for one model (docs/performance.md): two plain ONNX Runtime sessions of the unmodified
model (default options, CPUExecutionProvider) created and run once each, in one process, timed from
before the first session to after the second run; `import onnxruntime` is not counted. Same as
corpus.py's floor, without the pass over the bytes. With --all-outputs, one session whose outputs
are every node output (ONNX Runtime alone computing every tensor), created and run once.

usage: python3 scripts/bench/floor.py MODEL IN.npz [--all-outputs]
Prints one JSON line.
"""
import argparse
import json
import time

import numpy as np
import onnx
import onnxruntime as ort

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("inputs")
parser.add_argument("--all-outputs", action="store_true")
args = parser.parse_args()
with np.load(args.inputs) as d:
    feeds = {k: d[k] for k in d.files}
if args.all_outputs:
    model = onnx.load(args.model)
    listed = {o.name for o in model.graph.output}
    for n in model.graph.node:
        for o in n.output:
            if o and o not in listed:
                model.graph.output.append(onnx.ValueInfoProto(name=o))
                listed.add(o)
    t0 = time.perf_counter()
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    s.run(None, feeds)
    t2 = time.perf_counter()
    print(json.dumps({"outputs": len(listed), "session_s": t1 - t0, "run_s": t2 - t1, "total_s": t2 - t0}))
else:
    t0 = time.perf_counter()
    s1 = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    s1.run(None, feeds)
    t2 = time.perf_counter()
    s2 = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    t3 = time.perf_counter()
    s2.run(None, feeds)
    t4 = time.perf_counter()
    print(json.dumps({"session1_s": t1 - t0, "run1_s": t2 - t1, "session2_s": t3 - t2, "run2_s": t4 - t3,
                      "floor_s": t4 - t0}))
