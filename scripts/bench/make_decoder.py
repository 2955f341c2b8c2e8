"""A decoder of pre-LayerNorm blocks for the graph-size benchmark (docs/performance.md, "Graph size"),
seeded: per block a decomposed LayerNorm, single-head attention with Softmax, a decomposed LayerNorm
and an Erf GELU FFN, each with a residual Add; hidden 64, sequence 16, FFN 256; 28 nodes a block
(one more node in all: the output's Identity). Small tensors on purpose: what grows is the graph.
Per block: LayerNorm 7 (ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div; its gamma 1 and beta 0
left out, as exporters fold them), attention 7 (Q, K, V MatMuls, Transpose, MatMul, Softmax, MatMul;
1/sqrt(64) folded into Wq), residual Add, LayerNorm 7, FFN 5 (MatMul, Erf, Add, Mul, MatMul: GELU
u * 0.5 * (1 + erf(u / sqrt(2))) with 1/sqrt(2) folded into W1 and sqrt(2) * 0.5 into W2), residual Add.

usage: python3 scripts/bench/make_decoder.py OUT.onnx BLOCKS [--overflow BLOCK]... [--overflow-every K]
       [--affine] [--ln-overflow BLOCK] [--inputs IN.npz]
  --overflow BLOCK  scale that block's FFN input weights so that its activations exceed FP16's
                    range (65504), and its output weights so that what it adds to the residual
                    stays as small as the other blocks' (the blocks after it do not overflow):
                    the model then diverges under sim:fp16 at that block. May be
                    given several times: each block overflows on its own (`fix` must keep each).
  --overflow-every K
                    the same for every K-th block (K-1, 2K-1, ...): BLOCKS / K independent overflows.
  --affine          give each LayerNorm its gamma (Mul) and beta (Add), as exporters write them
                    before opset 17 (9 nodes a LayerNorm, 32 a block), and end with a final
                    LayerNorm, as decoders do.
  --ln-overflow BLOCK
                    scale that block's attention values so that the residual stream grows past
                    FP16's LayerNorm range: from that block's second LayerNorm on, every
                    LayerNorm's squared deviations exceed 65504 under FP16.
  --inputs IN.npz   also write the input ("x", float32 1x16x64, seeded) for `bisect --inputs`.
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("blocks", type=int)
parser.add_argument("--overflow", type=int, action="append", default=[])
parser.add_argument("--overflow-every", type=int, default=None)
parser.add_argument("--affine", action="store_true")
parser.add_argument("--ln-overflow", type=int, default=None)
parser.add_argument("--inputs")
args = parser.parse_args()
H, FF, SEQ = 64, 256, 16
overflowing = set(args.overflow)
if args.overflow_every:
    overflowing.update(range(args.overflow_every - 1, args.blocks, args.overflow_every))
rng = np.random.default_rng(0)
inits, nodes = [], []


def weight(name, shape, scale):
    inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
    return name


def const(name, value):
    inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
    return name


def node(op, inputs, name, **attrs):
    out_name = f"{name}_out"
    nodes.append(helper.make_node(op, inputs, [out_name], name=name, **attrs))
    return out_name


# Shared constants: one copy each, as an exporter folds them.
two = const("c/two", 2.0)
eps = const("c/eps", 1e-5)
one = const("c/one", 1.0)


def layer_norm(x, p):  # 7 nodes
    mean = node("ReduceMean", [x], f"{p}/ReduceMean", axes=[-1], keepdims=1)
    centered = node("Sub", [x, mean], f"{p}/Sub")
    var = node("ReduceMean", [node("Pow", [centered, two], f"{p}/Pow")], f"{p}/ReduceMean_1", axes=[-1], keepdims=1)
    std = node("Sqrt", [node("Add", [var, eps], f"{p}/AddEps")], f"{p}/Sqrt")
    normed = node("Div", [centered, std], f"{p}/Div")
    if not args.affine:
        return normed
    gamma = inits.append(numpy_helper.from_array((1 + 0.1 * rng.standard_normal(H)).astype(np.float32), f"{p}/gamma")) or f"{p}/gamma"
    beta = inits.append(numpy_helper.from_array((0.1 * rng.standard_normal(H)).astype(np.float32), f"{p}/beta")) or f"{p}/beta"
    return node("Add", [node("Mul", [normed, gamma], f"{p}/Mul"), beta], f"{p}/Add")


x = "x"
for b in range(args.blocks):
    p = f"block{b}"
    h = layer_norm(x, f"{p}/ln1")
    q = node("MatMul", [h, weight(f"{p}/Wq", (H, H), 0.1 / np.sqrt(H))], f"{p}/attn/q")
    k = node("MatMul", [h, weight(f"{p}/Wk", (H, H), 0.1)], f"{p}/attn/k")
    v = node("MatMul", [h, weight(f"{p}/Wv", (H, H), 0.1 if b != args.ln_overflow else 150.0)], f"{p}/attn/v")
    kt = node("Transpose", [k], f"{p}/attn/kT", perm=[0, 2, 1])
    probs = node("Softmax", [node("MatMul", [q, kt], f"{p}/attn/scores")], f"{p}/attn/Softmax", axis=-1)
    x = node("Add", [x, node("MatMul", [probs, v], f"{p}/attn/context")], f"{p}/attn/residual")
    h = layer_norm(x, f"{p}/ln2")
    w_in = 0.1 if b not in overflowing else 6000.0
    u = node("MatMul", [h, weight(f"{p}/W1", (H, FF), w_in / np.sqrt(2.0))], f"{p}/ffn/in")
    erf = node("Erf", [u], f"{p}/ffn/gelu_erf")
    gelu = node("Mul", [u, node("Add", [erf, one], f"{p}/ffn/gelu_add")], f"{p}/ffn/gelu")
    w_out = np.sqrt(2.0) * 0.5 * (0.05 if b not in overflowing else 1e-6)
    f = node("MatMul", [gelu, weight(f"{p}/W2", (FF, H), w_out)], f"{p}/ffn/out")
    x = node("Add", [x, f], f"{p}/ffn/residual")
if args.affine:
    x = layer_norm(x, "final_ln")
nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
graph = helper.make_graph(
    nodes,
    f"decoder-{args.blocks}",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, H])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, H])],
    inits,
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
onnx.save(model, args.out)
if args.inputs:
    np.savez(args.inputs, x=np.random.default_rng(1).standard_normal((1, SEQ, H)).astype(np.float32))
print(f"{args.out}: {len(nodes)} nodes ({args.blocks} blocks of {(len(nodes) - 1 - 9 * args.affine) // max(args.blocks, 1)})")
