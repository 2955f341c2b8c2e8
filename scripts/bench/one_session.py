"""One plain ONNX Runtime session of a model, ONNX Runtime reading the file itself, created and run
once (CPUExecutionProvider, two intra-op threads as on this 2-core machine). Measures the least
memory a process computing the model in ONNX Runtime holds (docs/performance.md, "The memory
target against the floor's own memory"): run it under `/usr/bin/time -f %M`.

usage: python3 scripts/bench/one_session.py MODEL IN.npz
Prints the process's peak RSS before the session, after it was built and after the run (MiB).
"""
import argparse
import resource

import numpy as np
import onnxruntime as ort


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("inputs")
args = parser.parse_args()
before = peak_mib()
options = ort.SessionOptions()
options.intra_op_num_threads = 2
session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
built = peak_mib()
with np.load(args.inputs) as d:
    feeds = {k: d[k] for k in d.files}
session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
print(f"peak RSS: before the session {before} MiB, after its build {built} MiB, after the run {peak_mib()} MiB")
