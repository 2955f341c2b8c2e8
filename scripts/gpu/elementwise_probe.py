"""What ONNX Runtime's CUDA provider computes for unary ops in FP16 and BF16: every finite value
of the type goes through a one-node model (CUDA only), and the output bits are saved, so the CPU
can compare them with the float32 op rounded once (scripts/analyze_elementwise.py).
GPU machine, after `source scripts/gpu/unstage.sh`: python3 scripts/gpu/elementwise_probe.py OUT.npz"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

# PROBE_PROVIDER=CPUExecutionProvider checks the script itself on a machine without a GPU.
PROVIDER = os.environ.get("PROBE_PROVIDER", "CUDAExecutionProvider")
OPS = ["Sigmoid", "Tanh", "Exp", "Log", "Erf", "Sqrt", "Reciprocal", "Relu", "HardSigmoid", "HardSwish", "Softplus"]
OPSET = 22


def all_finite_bits(elem):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    if elem == TensorProto.FLOAT16:
        v = bits.view(np.float16).astype(np.float32)
    else:
        v = (bits.astype(np.uint32) << 16).view(np.float32)
    return bits[np.isfinite(v)]


results = {}
for op in OPS:
    for tag, elem in (("fp16", TensorProto.FLOAT16), ("bf16", TensorProto.BFLOAT16)):
        bits = all_finite_bits(elem)
        node = helper.make_node(op, ["x"], ["y"])
        graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", elem, [len(bits)])], [helper.make_tensor_value_info("y", elem, [len(bits)])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)
        so = ort.SessionOptions()
        if PROVIDER != "CPUExecutionProvider":
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        try:
            s = ort.InferenceSession(model.SerializeToString(), so, providers=[PROVIDER])
            b = s.io_binding()
            b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx_element_type=elem))
            b.bind_output("y", "cpu")
            s.run_with_iobinding(b)
            out = b.get_outputs()[0]
            y = np.frombuffer(bytes(out.numpy().tobytes()), dtype=np.uint16) if out.data_type() != "tensor(bfloat16)" else None
            if y is None:
                # bfloat16 OrtValues do not convert to numpy: read the raw buffer through a uint16 view.
                y = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint16 * len(bits)).from_address(out.data_ptr())).copy()
            results[f"{op}_{tag}_x"] = bits
            results[f"{op}_{tag}_y"] = y.astype(np.uint16)
            print(op, tag, "ok")
        except Exception as e:
            print(op, tag, "failed:", str(e).split("\n")[0][-150:])
np.savez_compressed(sys.argv[1], **results)
