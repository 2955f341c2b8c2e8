"""Issue 41: where a GPU job's fixed cost goes, and whether two of them at once slow each other.

Each mode runs in a fresh process (python3 session_build_probe.py MODE FP32.onnx FP16.onnx):
CUDA session build and first two runs of PP-OCRv4's recognizer (float32 with TF32 off, as
layerwise's GPU reference; its FP16 conversion, as the candidate) on a batch of 8 seeded inputs,
  alone32 / alone16       one session on GPU 0 (alone16 DEVICE: on that GPU; two such processes
                          at once tell a process-wide wait from a device's own)
  sequential              float32 then FP16, on GPU 0, one after the other
  threads_one_gpu         both at once on GPU 0, two threads
  threads_two_gpus        FP16 on GPU 0 and on GPU 1 at once, two threads of one process
  heuristic16             FP16 alone with cudnn_conv_algo_search=HEURISTIC (for scale only)
Prints one JSON line per session: build, first run and second run in seconds, and the mode's wall.
"""
import json, sys, threading, time
import numpy as np
import onnxruntime as ort

mode, fp32, fp16 = sys.argv[1:4]
x = (np.random.default_rng(0).random((8, 3, 48, 320)) * 255).astype(np.float32)


def session(path, device, tf32=True, search="EXHAUSTIVE"):
    options = {"device_id": device, "cudnn_conv_algo_search": search}
    if not tf32:
        options["use_tf32"] = 0
    started = time.perf_counter()
    s = ort.InferenceSession(path, providers=[("CUDAExecutionProvider", options)])
    built = time.perf_counter() - started
    name = s.get_inputs()[0].name
    feed = {name: x.astype(np.float16) if s.get_inputs()[0].type == "tensor(float16)" else x}
    times = []
    for _ in range(2):
        t = time.perf_counter()
        s.run(None, feed)
        times.append(time.perf_counter() - t)
    return {"model": path, "device": device, "search": search, "build_s": round(built, 3), "first_run_s": round(times[0], 3), "second_run_s": round(times[1], 4)}


def together(jobs):
    results = [None] * len(jobs)
    def go(i, job):
        results[i] = session(*job)
    threads = [threading.Thread(target=go, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


started = time.perf_counter()
if mode == "alone32":
    out = [session(fp32, 0, tf32=False)]
elif mode == "alone16":
    out = [session(fp16, int(sys.argv[4]) if len(sys.argv) > 4 else 0)]
elif mode == "sequential":
    out = [session(fp32, 0, tf32=False), session(fp16, 0)]
elif mode == "threads_one_gpu":
    out = together([(fp32, 0, False), (fp16, 0)])
elif mode == "threads_two_gpus":
    out = together([(fp16, 0), (fp16, 1)])
elif mode == "heuristic16":
    out = [session(fp16, 0, search="HEURISTIC")]
else:
    sys.exit(f"unknown mode {mode}")
wall = time.perf_counter() - started
for o in out:
    print(json.dumps({"mode": mode, "wall_s": round(wall, 3), **o}))
