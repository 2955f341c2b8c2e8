"""Does exposing tensors change what ONNX Runtime's CUDA provider computes for an FP16 file?
Runs FILE32 (float32, TF32 off) and FILE16 on CUDA: FILE16 with only its outputs (as deployed), and
with every LayerNorm's Pow output exposed too (what a bisect marks). Prints each run's output error
(relative L2 against float32), its inf/NaN count, and how many LayerNormalization nodes ONNX
Runtime fused in each session (from the optimized model it writes).
usage: python3 deployed_vs_exposed.py FILE32 FILE16 INPUTS.npz"""
import sys, tempfile, os
import numpy as np
import onnx
import onnxruntime as ort

f32, f16, inputs = sys.argv[1:4]
feeds = dict(np.load(inputs))


def run(path, extra=()):
    m = onnx.load(path)
    for name in extra:
        m.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT16, None))
    so = ort.SessionOptions()
    opt = os.path.join(tempfile.mkdtemp(), "opt.onnx")
    so.optimized_model_filepath = opt
    s = ort.InferenceSession(m.SerializeToString(), so, providers=[("CUDAExecutionProvider", {"use_tf32": 0})])
    y = s.run([m.graph.output[0].name], feeds)[0].astype(np.float64)
    fused = sum(n.op_type == "LayerNormalization" for n in onnx.load(opt).graph.node)
    return y, fused


ref, _ = run(f32)
pows = [n.output[0] for n in onnx.load(f16).graph.node if n.op_type == "Pow"]
for label, extra in [("deployed (outputs only)", ()), (f"exposed ({len(pows)} Pow outputs marked)", pows)]:
    y, fused = run(f16, extra)
    finite = np.isfinite(y)
    err = np.linalg.norm(np.where(finite, y, 0) - ref) / np.linalg.norm(ref)
    print(f"{label}: rel L2 {err:.3e}, {int((~finite).sum())} inf/NaN of {y.size}, {fused} LayerNormalization nodes fused")
