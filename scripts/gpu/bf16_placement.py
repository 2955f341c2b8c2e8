"""Which nodes of a BF16 model ONNX Runtime's CUDA provider has no kernel for: creates a CUDA
session with verbose logging and collects the op types it reports without a CUDA kernel.
GPU machine, after `source scripts/gpu/unstage.sh`: python3 scripts/gpu/bf16_placement.py MODEL..."""
import json
import os
import re
import subprocess
import sys

if len(sys.argv) > 1 and sys.argv[1] == "--one":
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 0
    try:
        ort.InferenceSession(sys.argv[2], so, providers=["CUDAExecutionProvider"])
        print("SESSION OK")
    except Exception as e:  # the refusal is the measurement
        print("SESSION FAILED", str(e)[:300])
    sys.exit(0)

result = {}
for model in sys.argv[1:]:
    p = subprocess.run([sys.executable, __file__, "--one", model], capture_output=True, text=True)
    text = p.stdout + p.stderr
    missing = sorted(set(re.findall(r"CUDA kernel not found in registries for Op type: (\w+)", text)))
    result[os.path.basename(model)] = {"session": "ok" if "SESSION OK" in text else "failed", "no_cuda_kernel": missing,
                                       "error": next((l for l in text.splitlines() if "SESSION FAILED" in l), "")}
print(json.dumps(result, indent=1))
