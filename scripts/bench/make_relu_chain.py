"""A chain of N Relu nodes (float32 1x64) for the graph-size benchmark (docs/performance.md, "Graph
size"): the largest node count for the least work, so what is measured is per-node cost.

usage: python3 scripts/bench/make_relu_chain.py OUT.onnx N [--inputs IN.npz]
  --inputs IN.npz   also write the input ("x", float32 1x64, seeded) for `bisect --inputs`.
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("n", type=int)
parser.add_argument("--inputs")
args = parser.parse_args()
names = ["x"] + [f"r{i}" for i in range(1, args.n)] + ["y"]
nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu{i}") for i in range(args.n)]
graph = helper.make_graph(
    nodes,
    f"relu-chain-{args.n}",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), args.out)
if args.inputs:
    np.savez(args.inputs, x=np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32))
print(f"{args.out}: {args.n} nodes")
