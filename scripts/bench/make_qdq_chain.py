"""A float chain of Tanh nodes (float32 1x64) and the same chain quantized Q/DQ int8 before each
Tanh, for timing the quantizers-alone step against graph size (docs/quantization.md, "Cost"):
N quantizers, 3N+1 nodes in the quantized model (Tanh, QuantizeLinear, DequantizeLinear per
layer, then a last Tanh). One scale (1/127) for every quantizer: iterated Tanh shrinks the values
towards 0, so the fixed step grows coarse along the chain and `bisect` diverges, which is what
runs the quantizers-alone step. Beyond 256 quantizers it chooses which to measure.

usage: python3 scripts/bench/make_qdq_chain.py FLOAT.onnx QDQ.onnx N
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

parser = argparse.ArgumentParser()
parser.add_argument("float_out")
parser.add_argument("qdq_out")
parser.add_argument("n", type=int, help="quantizers (layers)")
args = parser.parse_args()

value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 64])
# Float: x -> Tanh -> t1 -> Tanh -> t2 ... -> t{n} -> Tanh -> y.
names = ["x"] + [f"t{i}" for i in range(1, args.n + 1)] + ["y"]
float_nodes = [helper.make_node("Tanh", [names[i]], [names[i + 1]], name=f"tanh{i}") for i in range(args.n + 1)]
graph = helper.make_graph(float_nodes, f"tanh-chain-{args.n}", [value("x")], [value("y")])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), args.float_out)

# Q/DQ: the same Tanh nodes, each t{i} quantized before the next Tanh reads it.
scale = numpy_helper.from_array(np.array(1.0 / 127.0, dtype=np.float32), "scale")
zero = numpy_helper.from_array(np.array(0, dtype=np.int8), "zero_point")
nodes = [helper.make_node("Tanh", ["x"], ["t1"], name="tanh0")]
for i in range(1, args.n + 1):
    nodes.append(helper.make_node("QuantizeLinear", [f"t{i}", "scale", "zero_point"], [f"t{i}_q"], name=f"t{i}_quantize"))
    nodes.append(helper.make_node("DequantizeLinear", [f"t{i}_q", "scale", "zero_point"], [f"t{i}_dq"], name=f"t{i}_dequantize"))
    nodes.append(helper.make_node("Tanh", [f"t{i}_dq"], [names[i + 1]], name=f"tanh{i}"))
graph = helper.make_graph(nodes, f"tanh-chain-{args.n}-int8", [value("x")], [value("y")], initializer=[scale, zero])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), args.qdq_out)
print(f"{args.float_out}: {args.n + 1} nodes; {args.qdq_out}: {len(nodes)} nodes, {args.n} quantizers")
