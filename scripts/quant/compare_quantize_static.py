#!/usr/bin/env python3
"""Issue 40: layerwise's own quantizer (`--cand sim:int8`) against onnxruntime's quantize_static.

Builds a small CNN (Conv+bias -> Relu -> Conv+bias -> Relu -> MaxPool -> Flatten -> Gemm(transB)
-> MatMul), quantizes it both ways on the same calibration samples, and compares every quantizer
the two models share: activation scales and zero points, weight scales and stored values, int32
bias values. Two configs:
  int8   layerwise {"format": "int8"}   vs quantize_static QInt8/QInt8, ActivationSymmetric=True
  uint8  layerwise {"format": "uint8"}  vs quantize_static QUInt8/QInt8 (its defaults)
both per-channel weights, MinMax, op types Conv/MatMul/Gemm. Then runs both models on ONNX Runtime's
CPU provider and prints their outputs' relative L2 against each other and against float32. Every
scale, zero point and stored value must be bit-identical.

Usage: python compare_quantize_static.py LAYERWISE_BINARY [WORKDIR]
(needs onnx, numpy, onnxruntime; checked with onnxruntime 1.31.1). Exit 1 on any mismatch.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

N_CALIB = 4


def float_model(path):
    rng = np.random.default_rng(1)
    t = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)
    inits = {"w": t(4, 3, 3, 3), "b": t(4), "w2": t(4, 4, 3, 3), "b2": t(4), "wg": t(5, 64), "bg": t(5), "wm": t(5, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], name="fc", transB=1),
        helper.make_node("MatMul", ["g", "wm"], ["y"], name="mm"),
    ]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


class Reader(CalibrationDataReader):
    def __init__(self, samples):
        self.it = iter([{"x": s} for s in samples])

    def get_next(self):
        return next(self.it, None)


def quantizers(path):
    """tensor -> (scale, zero point) of each QuantizeLinear on an activation; (node, slot) -> (values, scales)
    of each DequantizeLinear of an initializer, found by the node reading it."""
    m = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    acts, weights = {}, {}
    dq_out = {}
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear":
            acts[n.input[0]] = (inits[n.input[1]], inits[n.input[2]])
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            dq_out[n.output[0]] = (inits[n.input[0]], inits[n.input[1]])
    for n in m.graph.node:
        for slot, i in enumerate(n.input):
            if i in dq_out:
                weights[(n.name, slot)] = dq_out[i]
    return acts, weights


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    binary = os.path.abspath(sys.argv[1])
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="qs-compare-")
    os.makedirs(work, exist_ok=True)
    os.chdir(work)
    float_model("float.onnx")
    rng = np.random.default_rng(7)
    samples = [rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32) for _ in range(N_CALIB)]
    os.makedirs("calib", exist_ok=True)
    for k, s in enumerate(samples):
        np.savez(f"calib/s{k}.npz", x=s)
    failures = 0
    for fmt, act_type, extra in [("int8", QuantType.QInt8, {"ActivationSymmetric": True}), ("uint8", QuantType.QUInt8, {})]:
        quantize_static("float.onnx", f"ort_{fmt}.onnx", Reader(samples), quant_format=QuantFormat.QDQ,
                        activation_type=act_type, weight_type=QuantType.QInt8, per_channel=True,
                        op_types_to_quantize=["Conv", "MatMul", "Gemm"], extra_options=extra)
        with open(f"cfg_{fmt}.json", "w") as f:
            json.dump({"format": fmt}, f)
        # Calibrated on the same samples, by a reference run unoptimized as quantize_static's calibration
        # session runs the model (optimized, ONNX Runtime's fused kernels move a few activations' min/max
        # by a float32 bit or two); the fix writes the whole Q/DQ model where nothing is excluded.
        out = subprocess.run([binary, "-q", "fix", "float.onnx", "--ref", "ort:cpu,opt=disable", "--cand", "sim:int8", "--quant-config", f"cfg_{fmt}.json",
                              "--inputs", "calib", "-o", f"ours_{fmt}.onnx", "--json", f"fix_{fmt}.json",
                              "--atol", "1", "--rtol", "1", "--range-tol", "1"], capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stdout, out.stderr)
            sys.exit(f"layerwise fix failed ({out.returncode})")
        excluded = json.load(open(f"ours_{fmt}.onnx.nodes-to-exclude.json"))["nodes_to_exclude"]
        assert excluded == [], f"nothing should be excluded: {excluded}"
        ours_a, ours_w = quantizers(f"ours_{fmt}.onnx")
        theirs_a, theirs_w = quantizers(f"ort_{fmt}.onnx")
        print(f"== {fmt}: {len(ours_a)} activation quantizers ours, {len(theirs_a)} quantize_static's; "
              f"{len(ours_w)} stored weights/biases ours, {len(theirs_w)} theirs")
        for t in sorted(set(ours_a) | set(theirs_a)):
            if t not in ours_a or t not in theirs_a:
                print(f"  activation {t}: only {'ours' if t in ours_a else 'quantize_static'}")
                continue
            (s1, z1), (s2, z2) = ours_a[t], theirs_a[t]
            ok = np.array_equal(s1, s2) and np.array_equal(z1.astype(np.int64), z2.astype(np.int64)) and z1.dtype == z2.dtype
            failures += not ok
            print(f"  activation {t:4s} scale {float(s1):.8g} vs {float(s2):.8g}, zero point {int(z1)} ({z1.dtype}) vs {int(z2)} ({z2.dtype}): {'same' if ok else 'DIFFERENT'}")
        for key in sorted(set(ours_w) | set(theirs_w)):
            if key not in ours_w or key not in theirs_w:
                print(f"  weight {key}: only {'ours' if key in ours_w else 'quantize_static'}")
                failures += 1
                continue
            (v1, s1), (v2, s2) = ours_w[key], theirs_w[key]
            same_scale = s1.shape == s2.shape and np.array_equal(s1, s2)
            diff = int(np.abs(v1.astype(np.int64) - v2.astype(np.int64)).max()) if v1.shape == v2.shape else -1
            ok = same_scale and v1.dtype == v2.dtype and diff == 0
            failures += not ok
            print(f"  {key[0]} input {key[1]}: {v1.dtype} {list(v1.shape)}, scales {'same' if same_scale else 'DIFFERENT'} ({s1.size}), "
                  f"largest stored-value difference {diff}: {'same' if ok else 'DIFFERENT'}")
        x = samples[0]
        run = lambda p: ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        ref, ours, theirs = run("float.onnx"), run(f"ours_{fmt}.onnx"), run(f"ort_{fmt}.onnx")
        print(f"  output y on sample 0 (onnxruntime {ort.__version__} CPU): ours vs float32 rel L2 {rel_l2(ours, ref):.3e}, "
              f"quantize_static's vs float32 {rel_l2(theirs, ref):.3e}, ours vs quantize_static's {rel_l2(ours, theirs):.3e}")
    print("RESULT:", "same quantizers" if failures == 0 else f"{failures} differences")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
