# Builds the GPU check's float32 model on the device (numpy + onnx are there): two large MatMuls,
# where TF32 (ONNX Runtime CUDA's default) differs from float32 by ~1e-4 relative.
import sys
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto as T

rng = np.random.default_rng(0)
w1 = (rng.standard_normal((2048, 2048)) / np.sqrt(2048)).astype(np.float32)
w2 = (rng.standard_normal((2048, 512)) / np.sqrt(2048)).astype(np.float32)
nodes = [
    helper.make_node("MatMul", ["x", "w1"], ["h"], name="big/MatMul"),
    helper.make_node("Relu", ["h"], ["r"], name="big/Relu"),
    helper.make_node("MatMul", ["r", "w2"], ["y"], name="head/MatMul"),
]
g = helper.make_graph(nodes, "tf32", [helper.make_tensor_value_info("x", T.FLOAT, [64, 2048])],
                      [helper.make_tensor_value_info("y", T.FLOAT, None)],
                      [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
onnx.save(m, sys.argv[1])
