"""A BERT-base-sized encoder for the benchmarks (docs/performance.md), seeded: token and position
embeddings (30522 x 768, 512 x 768), 12 layers of hidden 768, 12 heads, FFN 3072 with GELU through
Erf, sequence 512; about 110M parameters (440 MB, one file). Even layers use the LayerNormalization
op, odd layers the decomposed form (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add).

usage: python3 scripts/bench/make_transformer.py OUT.onnx [LAYERS]
       python3 scripts/bench/make_transformer.py --decoder OUT.onnx
The decoder variant is about 1.07B parameters (hidden 2048, 16 heads, FFN 8192, 20 layers, vocabulary
32000, sequence 128, a causal mask), stored as external data beside OUT (OUT.data, 4.3 GB).
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

decoder = sys.argv[1] == "--decoder"
args = sys.argv[2:] if decoder else sys.argv[1:]
out = args[0]
if decoder:
    layers = 20
    H, HEADS, FF, SEQ, VOCAB = 2048, 16, 8192, 128, 32000
else:
    layers = int(args[1]) if len(args) > 1 else 12
    H, HEADS, FF, SEQ, VOCAB = 768, 12, 3072, 512, 30522
rng = np.random.default_rng(0)
inits, nodes = [], []


def weight(name, shape, scale=0.02):
    inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
    return name


def const(name, value):
    inits.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def node(op, inputs, name, **attrs):
    out_name = f"{name}_out"
    nodes.append(helper.make_node(op, inputs, [out_name], name=name, **attrs))
    return out_name


def layer_norm(x, prefix, decomposed):
    gamma = const(f"{prefix}/gamma", np.ones(H, np.float32))
    beta = const(f"{prefix}/beta", np.zeros(H, np.float32))
    if not decomposed:
        return node("LayerNormalization", [x, gamma, beta], f"{prefix}/LayerNorm", axis=-1, epsilon=1e-12)
    mean = node("ReduceMean", [x], f"{prefix}/ReduceMean", axes=[-1], keepdims=1)
    centered = node("Sub", [x, mean], f"{prefix}/Sub")
    squared = node("Pow", [centered, const(f"{prefix}/two", np.array(2.0, np.float32))], f"{prefix}/Pow")
    var = node("ReduceMean", [squared], f"{prefix}/ReduceMean_1", axes=[-1], keepdims=1)
    shifted = node("Add", [var, const(f"{prefix}/eps", np.array(1e-12, np.float32))], f"{prefix}/Add")
    std = node("Sqrt", [shifted], f"{prefix}/Sqrt")
    normed = node("Div", [centered, std], f"{prefix}/Div")
    scaled = node("Mul", [normed, gamma], f"{prefix}/Mul")
    return node("Add", [scaled, beta], f"{prefix}/Add_1")


def dense(x, prefix, n_in, n_out):
    y = node("MatMul", [x, weight(f"{prefix}/W", (n_in, n_out))], f"{prefix}/MatMul")
    return node("Add", [y, const(f"{prefix}/b", np.zeros(n_out, np.float32))], f"{prefix}/BiasAdd")


ids = "input_ids"
tok = node("Gather", [weight("embeddings/word", (VOCAB, H)), ids], "embeddings/Gather", axis=0)
pos = node("Add", [tok, weight("embeddings/position", (1, SEQ, H))], "embeddings/AddPosition")
x = layer_norm(pos, "embeddings/ln", decomposed=False)
heads_shape = const("shape/heads", np.array([1, SEQ, HEADS, H // HEADS], np.int64))
merged_shape = const("shape/merged", np.array([1, SEQ, H], np.int64))
scale = const("attention/scale", np.array(1.0 / np.sqrt(H // HEADS), np.float32))
causal = const("attention/causal_mask", np.triu(np.full((1, 1, SEQ, SEQ), -1e4, np.float32), k=1)) if decoder else None
for i in range(layers):
    p = f"layer{i}"
    q, k, v = (dense(x, f"{p}/attention/{n}", H, H) for n in ("query", "key", "value"))
    qh = node("Transpose", [node("Reshape", [q, heads_shape], f"{p}/attention/q_heads")], f"{p}/attention/q_t", perm=[0, 2, 1, 3])
    kh = node("Transpose", [node("Reshape", [k, heads_shape], f"{p}/attention/k_heads")], f"{p}/attention/k_t", perm=[0, 2, 3, 1])
    vh = node("Transpose", [node("Reshape", [v, heads_shape], f"{p}/attention/v_heads")], f"{p}/attention/v_t", perm=[0, 2, 1, 3])
    scores = node("Mul", [node("MatMul", [qh, kh], f"{p}/attention/scores"), scale], f"{p}/attention/scaled")
    if decoder:
        scores = node("Add", [scores, causal], f"{p}/attention/causal")
    probs = node("Softmax", [scores], f"{p}/attention/Softmax", axis=-1)
    context = node("MatMul", [probs, vh], f"{p}/attention/context")
    merged = node("Reshape", [node("Transpose", [context], f"{p}/attention/c_t", perm=[0, 2, 1, 3]), merged_shape], f"{p}/attention/merge")
    attn = dense(merged, f"{p}/attention/output", H, H)
    x = layer_norm(node("Add", [attn, x], f"{p}/attention/residual"), f"{p}/attention/ln", decomposed=i % 2 == 1)
    h = dense(x, f"{p}/ffn/in", H, FF)
    # GELU: x * 0.5 * (1 + erf(x / sqrt(2)))
    erf = node("Erf", [node("Div", [h, const(f"{p}/ffn/sqrt2", np.array(np.sqrt(2.0), np.float32))], f"{p}/ffn/gelu_div")], f"{p}/ffn/gelu_erf")
    gelu = node("Mul", [node("Mul", [h, node("Add", [erf, const(f"{p}/ffn/one", np.array(1.0, np.float32))], f"{p}/ffn/gelu_add")], f"{p}/ffn/gelu_mul"), const(f"{p}/ffn/half", np.array(0.5, np.float32))], f"{p}/ffn/gelu")
    f = dense(gelu, f"{p}/ffn/out", FF, H)
    x = layer_norm(node("Add", [f, x], f"{p}/ffn/residual"), f"{p}/ffn/ln", decomposed=i % 2 == 1)
nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
graph = helper.make_graph(
    nodes,
    "decoder-1b" if decoder else "bert-base-sized",
    [helper.make_tensor_value_info(ids, TensorProto.INT64, [1, SEQ])],
    [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, SEQ, H])],
    inits,
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
if decoder:
    import os
    onnx.save(model, out, save_as_external_data=True, all_tensors_to_one_file=True, location=os.path.basename(out) + ".data", size_threshold=1024)
else:
    onnx.save(model, out)
params = sum(int(np.prod(t.dims)) for t in inits)
print(f"{out}: {len(nodes)} nodes, {params / 1e6:.1f}M parameters")
