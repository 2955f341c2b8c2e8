"""Issue 41 probe: what a sample costs on the GPU when both sides run there and every tensor pair is
compared, against one plain candidate run. Not layerwise itself: a Python prototype of two designs,
to choose the one to build.

  plain      the candidate file alone (its own outputs), a CUDA session, one run per sample
  ref        the float32 file alone, TF32 off
  pair-copy  one CUDA session of both programs (TF32 off) whose outputs are every tensor of each
             side flattened and concatenated per side and type: three outputs copied to the host
             once (float32 reference, the candidate's float16 and float32 tensors); the per-tensor
             reductions then run on the host (timed separately, numpy, one thread)
  pair-red   the same session with the reductions on the GPU: per pair max|d|, sum|d|, sum d^2,
             sum r^2, sum c^2, sum r*c, max|r| as ONNX ops, one [7 * pairs] output (batch 1 only)
  pair-red-batched
             the same per sample: each tensor reduced over every axis but the first, one [B, 7 * pairs]
             output (only tensors whose first dimension is the input's symbolic batch dimension)

Batched rows run B samples in one run (the model's first dimension), time per sample = run / B.
Every tensor is flattened whole (the batch with it): only the time is measured here, not which
sample a value belongs to, and the host's reduction is over the whole vectors, not per tensor.

usage: python3 paired_reduce_probe.py REF.onnx CAND_FP16.onnx [--batches 1,8,32] [--runs 20] [--rows plain,ref,pair-copy,pair-red,pair-red-batched]
Prints one JSON line per row.
"""
import argparse
import json
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, shape_inference

parser = argparse.ArgumentParser()
parser.add_argument("ref")
parser.add_argument("cand")
parser.add_argument("--batches", default="1,8,32")
parser.add_argument("--runs", type=int, default=20)
parser.add_argument("--rows", default="plain,ref,pair-red,pair-red-batched")
args = parser.parse_args()

ref, cand = onnx.load(args.ref), onnx.load(args.cand)
inputs = {i.name for i in ref.graph.input}


def elem_types(m):
    inferred = shape_inference.infer_shapes(m)
    t = {vi.name: vi.type.tensor_type.elem_type for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)}
    t.update({i.name: i.data_type for i in m.graph.initializer})
    return t


def prefixed(m, p):
    ren = lambda n: n if (n == "" or n in inputs) else p + n
    nodes, inits = [], []
    for n in m.graph.node:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        del c.input[:]
        c.input.extend(ren(x) for x in n.input)
        del c.output[:]
        c.output.extend(ren(x) for x in n.output)
        c.name = p + n.name
        nodes.append(c)
    for i in m.graph.initializer:
        c = onnx.TensorProto()
        c.CopyFrom(i)
        c.name = ren(i.name)
        inits.append(c)
    return nodes, inits


rt, ct = elem_types(ref), elem_types(cand)
cand_made = {o for n in cand.graph.node for o in n.output}
pairs = [o for n in ref.graph.node for o in n.output
         if o and o in cand_made and rt.get(o) == TensorProto.FLOAT and ct.get(o) in (TensorProto.FLOAT, TensorProto.FLOAT16)]
rn, ri = prefixed(ref, "r/")
cn, ci = prefixed(cand, "c/")
opset = max(o.version for o in ref.opset_import if o.domain in ("", "ai.onnx"))
ops = [helper.make_opsetid("", opset)]
flat_shape = helper.make_tensor("probe/flat", TensorProto.INT64, [1], [-1])
one = helper.make_tensor("probe/one", TensorProto.INT64, [1], [1])


def paired_copy():
    nodes, groups = [], {"R": [], TensorProto.FLOAT16: [], TensorProto.FLOAT: []}
    for k, t in enumerate(pairs):
        nodes.append(helper.make_node("Reshape", ["r/" + t, "probe/flat"], [f"pr{k}"]))
        nodes.append(helper.make_node("Reshape", ["c/" + t, "probe/flat"], [f"pc{k}"]))
        groups["R"].append(f"pr{k}")
        groups[ct[t]].append(f"pc{k}")
    outs = []
    for name, members in groups.items():
        if members:
            out = f"all_{name}"
            nodes.append(helper.make_node("Concat", members, [out], axis=0))
            dtype = TensorProto.FLOAT16 if name == TensorProto.FLOAT16 else TensorProto.FLOAT
            outs.append(helper.make_tensor_value_info(out, dtype, None))
    g = helper.make_graph(rn + cn + nodes, "paired_copy", list(ref.graph.input), outs, ri + ci + [flat_shape])
    return helper.make_model(g, opset_imports=ops, ir_version=ref.ir_version)


def ranks(m):
    inferred = shape_inference.infer_shapes(m)
    batch = m.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    # Only tensors whose first dimension is the input's batch dimension count as batched.
    return {vi.name: len(vi.type.tensor_type.shape.dim) for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
            if vi.type.tensor_type.HasField("shape") and vi.type.tensor_type.shape.dim and vi.type.tensor_type.shape.dim[0].dim_param == batch}


ref_ranks = ranks(ref)


def paired_reduce(per_sample):
    """per_sample: reduce each tensor over every axis but the first (taken as the batch; tensors of
    rank < 2 are left out), one [B, 7 * pairs] output; else over every axis, one [7 * pairs]."""
    nodes, stats = [], []
    for k, t in enumerate(pairs):
        rank = ref_ranks.get(t)
        if per_sample and (rank is None or rank < 2):
            continue
        axes = {"axes": list(range(1, rank))} if per_sample else {}
        r, c = "r/" + t, f"cf{k}"
        nodes.append(helper.make_node("Cast", ["c/" + t], [c], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Sub", [c, r], [f"d{k}"]))
        nodes.append(helper.make_node("Abs", [f"d{k}"], [f"ad{k}"]))
        nodes.append(helper.make_node("Abs", [r], [f"ar{k}"]))
        nodes.append(helper.make_node("Mul", [r, c], [f"rc{k}"]))
        parts = [("ReduceMax", f"ad{k}"), ("ReduceSum", f"ad{k}"), ("ReduceSumSquare", f"d{k}"), ("ReduceSumSquare", r),
                 ("ReduceSumSquare", c), ("ReduceSum", f"rc{k}"), ("ReduceMax", f"ar{k}")]
        outs = []
        for j, (op, x) in enumerate(parts):
            nodes.append(helper.make_node(op, [x], [f"s{k}_{j}"], keepdims=1 if per_sample else 0, **axes))
            nodes.append(helper.make_node("Reshape", [f"s{k}_{j}", "probe/col" if per_sample else "probe/one"], [f"s{k}_{j}v"]))
            outs.append(f"s{k}_{j}v")
        nodes.append(helper.make_node("Concat", outs, [f"st{k}"], axis=1 if per_sample else 0))
        stats.append(f"st{k}")
    nodes.append(helper.make_node("Concat", stats, ["stats"], axis=1 if per_sample else 0))
    print(json.dumps({"reduced_pairs": len(stats), "per_sample": per_sample}), flush=True)
    col = helper.make_tensor("probe/col", TensorProto.INT64, [2], [-1, 1])
    g = helper.make_graph(rn + cn + nodes, "paired_reduce", list(ref.graph.input),
                          [helper.make_tensor_value_info("stats", TensorProto.FLOAT, None)], ri + ci + [one, col])
    return helper.make_model(g, opset_imports=ops, ir_version=ref.ir_version)


def session(model, tf32):
    opts = ort.SessionOptions()
    prov = [("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0"})]
    src = model if isinstance(model, str) else model.SerializeToString()
    t0 = time.perf_counter()
    s = ort.InferenceSession(src, opts, providers=prov)
    return s, time.perf_counter() - t0


def timed(s, feeds, runs):
    for _ in range(3):
        out = s.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = s.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


rng = np.random.default_rng(0)
print(json.dumps({"pairs": len(pairs), "ref_nodes": len(ref.graph.node), "cand_nodes": len(cand.graph.node)}), flush=True)
built = {}
for name, make, tf32 in [("plain", lambda: args.cand, True), ("ref", lambda: args.ref, False), ("pair-copy", paired_copy, False), ("pair-red", lambda: paired_reduce(False), False), ("pair-red-batched", lambda: paired_reduce(True), False)]:
    if name not in args.rows.split(","):
        continue
    t0 = time.perf_counter()
    model = make()
    made = time.perf_counter() - t0
    s, build = session(model, tf32)
    for b in [int(x) for x in args.batches.split(",")]:
        if name == "pair-red" and b > 1:
            continue
        feeds = {"x": (rng.random((b, 3, 48, 320)) * 255).astype(np.float32)}
        median, out = timed(s, feeds, args.runs)
        row = {"row": name, "batch": b, "run_s": median, "per_sample_ms": 1e3 * median / b, "session_s": build, "graph_s": made,
               "out_bytes": int(sum(o.nbytes for o in out))}
        if name == "pair-copy":
            # The host's share: per-tensor reductions over the copied values (numpy, one thread).
            t1 = time.perf_counter()
            r_all = out[0].astype(np.float32, copy=False)
            c_all = np.concatenate([o.astype(np.float32) for o in out[1:]])
            d = c_all - r_all
            stats = (np.abs(d).max(), np.abs(d).sum(), (d * d).sum(), (r_all * r_all).sum(), (c_all * c_all).sum(), (r_all * c_all).sum())
            row["host_reduce_ms_one_thread"] = 1e3 * (time.perf_counter() - t1) / b
            row["values_per_side_per_sample"] = int(r_all.size // b)
        print(json.dumps(row), flush=True)
    del s
