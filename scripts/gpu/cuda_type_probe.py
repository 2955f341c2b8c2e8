"""Which ONNX ops ONNX Runtime's CUDA provider runs in FP16 and BF16: one one-node model per op
and type, a CUDA-only session (`session.disable_cpu_ep_fallback`), created and run once.
GPU machine, after `source scripts/gpu/unstage.sh`: python3 scripts/gpu/cuda_type_probe.py OUT.json [OPSET...] (default 18)"""
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

# PROBE_PROVIDER=CPUExecutionProvider checks the probe models themselves on a machine without a GPU.
PROVIDER = os.environ.get("PROBE_PROVIDER", "CUDAExecutionProvider")
DEVICE = "cuda" if PROVIDER == "CUDAExecutionProvider" else "cpu"
X4 = [1, 2, 8, 8]
B = TensorProto.BOOL
I64 = TensorProto.INT64

# op: (float inputs' shapes, extra constant inputs [(name, array)], attributes, opset)
UNARY = "Abs Ceil Cos Elu Erf Exp Floor HardSigmoid HardSwish Identity LeakyRelu Log Neg Reciprocal Relu Round Selu Sigmoid Sign Sin Softplus Softsign Sqrt Tanh Softmax LogSoftmax GlobalAveragePool GlobalMaxPool Flatten LpNormalization Dropout Mish Gelu".split()
BINARY = "Add Sub Mul Div Pow Max Min Sum Mean PRelu".split()
COMPARE = "Equal Less Greater LessOrEqual GreaterOrEqual".split()
SPECS = {op: ([X4], [], {}) for op in UNARY}
SPECS.update({op: ([X4, X4], [], {}) for op in BINARY + COMPARE})
a = lambda *v: np.array(v, dtype=np.int64)
SPECS.update({
    "Clip": ([X4, [], []], [], {}),
    "MatMul": ([[8, 16], [16, 4]], [], {}),
    "Gemm": ([[8, 16], [16, 4], [4]], [], {}),
    "Conv": ([X4, [3, 2, 3, 3]], [], {}),
    "ConvTranspose": ([X4, [2, 3, 3, 3]], [], {}),
    "AveragePool": ([X4], [], {"kernel_shape": [2, 2]}),
    "MaxPool": ([X4], [], {"kernel_shape": [2, 2]}),
    "ReduceMean": ([X4], [("axes", a(-1))], {}),
    "ReduceSum": ([X4], [("axes", a(-1))], {}),
    "ReduceMax": ([X4], [("axes", a(-1))], {}),
    "ReduceMin": ([X4], [("axes", a(-1))], {}),
    "ReduceProd": ([X4], [("axes", a(-1))], {}),
    "ReduceSumSquare": ([X4], [("axes", a(-1))], {}),
    "ReduceL1": ([X4], [("axes", a(-1))], {}),
    "ReduceL2": ([X4], [("axes", a(-1))], {}),
    "ReduceLogSum": ([X4], [("axes", a(-1))], {}),
    "ReduceLogSumExp": ([X4], [("axes", a(-1))], {}),
    "ArgMax": ([X4], [], {}),
    "LayerNormalization": ([X4, [8], [8]], [], {}),
    "BatchNormalization": ([X4, [2], [2], [2], [2]], [], {}),
    "InstanceNormalization": ([X4, [2], [2]], [], {}),
    "GroupNormalization": ([X4, [2], [2]], [], {"num_groups": 2}),
    "Concat": ([X4, X4], [], {"axis": 1}),
    "Transpose": ([X4], [], {"perm": [0, 2, 3, 1]}),
    "Reshape": ([X4], [("shape", a(1, -1))], {}),
    "Unsqueeze": ([X4], [("axes", a(0))], {}),
    "Squeeze": ([X4], [("axes", a(0))], {}),
    "Slice": ([X4], [("starts", a(1)), ("ends", a(4)), ("axes", a(2))], {}),
    "Gather": ([X4], [("indices", a(0, 1))], {"axis": 2}),
    "GatherElements": ([X4], [("indices", np.zeros(X4, np.int64))], {}),
    "Expand": ([[1, 2, 1, 8]], [("shape", a(1, 2, 8, 8))], {}),
    "Tile": ([X4], [("repeats", a(1, 1, 2, 1))], {}),
    "Split": ([X4], [("split", a(8))], {"axis": 2}),
    "Pad": ([X4], [("pads", a(0, 0, 1, 1, 0, 0, 1, 1))], {}),
    "Resize": ([X4], [("roi", np.zeros(0, np.float32)), ("scales", np.array([1, 1, 2, 2], np.float32))], {}),
    "DepthToSpace": ([[1, 4, 8, 8]], [], {"blocksize": 2}),
    "Einsum": ([[8, 16], [16, 4]], [], {"equation": "ij,jk->ik"}),
    "CumSum": ([X4], [("axis", np.array(3, np.int64))], {}),
    "Trilu": ([X4], [], {}),
    "ScatterND": ([X4], [("indices", a(0).reshape(1, 1)), ("updates", None)], {}),
    "Where": ([X4, X4], [("condition", np.ones(X4, bool))], {}),
    "LSTM": ([[5, 1, 8], [1, 64, 8], [1, 64, 16]], [], {"hidden_size": 16}),
    "GRU": ([[5, 1, 8], [1, 48, 8], [1, 48, 16]], [], {"hidden_size": 16}),
    "RNN": ([[5, 1, 8], [1, 16, 8], [1, 16, 16]], [], {"hidden_size": 16}),
})


def one(op, elem, opset):
    shapes, consts, attrs = SPECS[op]
    if op.startswith("Reduce") and op != "ReduceSum" and opset < 18:  # axes became an input at 18
        consts, attrs = [], {"axes": [-1]}
    inputs, feeds, inits = [], {}, []
    np_t = {TensorProto.FLOAT16: np.float16, TensorProto.BFLOAT16: None}[elem]
    for i, s in enumerate(shapes):
        inputs.append(helper.make_tensor_value_info(f"x{i}", elem, s))
    names = [f"x{i}" for i in range(len(shapes))]
    for name, arr in consts:
        if name == "condition":
            names.insert(0, name)
        else:
            names.append(name)
        if arr is None:  # updates of ScatterND: the float type
            inputs.append(helper.make_tensor_value_info(name, elem, [1, 2, 8, 8]))
            continue
        inits.append(onnx.numpy_helper.from_array(arr, name))
    node = helper.make_node(op, names, ["y"], **attrs)
    domain = "com.microsoft" if op in ("Gelu",) else ""
    node.domain = domain
    graph = helper.make_graph([node], op, inputs, [helper.make_tensor_value_info("y", B if op in COMPARE else I64 if op == "ArgMax" else elem, None)], inits)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=9)
    so = ort.SessionOptions()
    if PROVIDER != "CPUExecutionProvider":
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.log_severity_level = 3
    try:
        s = ort.InferenceSession(model.SerializeToString(), so, providers=[PROVIDER])
    except Exception as e:
        return "no kernel: " + str(e).split("\n")[0][-160:]
    try:
        feeds = {}
        for i in s.get_inputs():
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            if np_t is not None:
                feeds[i.name] = np.asarray(np.random.rand(*shape)).astype(np_t)
            else:
                pass
        if np_t is None:  # BF16 inputs: run through IO binding from bit patterns
            binding = s.io_binding()
            for i in s.get_inputs():
                shape = [d if isinstance(d, int) else 1 for d in i.shape]
                bits = (np.asarray(np.random.rand(*shape)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
                v = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx_element_type=TensorProto.BFLOAT16)
                binding.bind_ortvalue_input(i.name, v)
            binding.bind_output("y", DEVICE)
            s.run_with_iobinding(binding)
        else:
            s.run(None, feeds)
        return "ok"
    except Exception as e:
        return "session ok, run failed: " + str(e).split("\n")[0][-160:]


opsets = [int(v) for v in sys.argv[2:]] or [18]
out = {"onnxruntime": ort.__version__, "opsets": opsets, "float16": {}, "bfloat16": {}}
for op in sorted(SPECS):
    for key, elem in (("float16", TensorProto.FLOAT16), ("bfloat16", TensorProto.BFLOAT16)):
        out[key][op] = {str(v): one(op, elem, v) for v in opsets}
json.dump(out, open(sys.argv[1], "w"), indent=1, sort_keys=True)
for key in ("float16", "bfloat16"):
    for v in opsets:
        print(key, v, "ok:", " ".join(op for op, r in out[key].items() if r[str(v)] == "ok"))
