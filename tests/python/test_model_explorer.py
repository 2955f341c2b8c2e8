"""The --model-explorer node data attaches in Google's Model Explorer: its keys are the node ids
the ONNX adapter itself gives, for named and unnamed nodes and nodes inside If branches. Needs `pip install model-explorer-onnx==0.4.2 ai-edge-model-explorer==0.1.34` (.ci/run
installs them in the test environment)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

try:
    from model_explorer_onnx.main import ONNXAdapter
except ImportError as e:  # pragma: no cover - a missing dependency is a failure, with the fix
    raise ImportError("this test needs Model Explorer's ONNX adapter: pip install model-explorer-onnx==0.4.2 ai-edge-model-explorer==0.1.34") from e


def model_with_awkward_names(path):
    """x -> two unnamed Relu -> Mul 'dup' -> an unnamed Mul -> Exp 'grow' -> If(x_sum > 0) with an
    unnamed node in each branch -> y. The Exp overflows FP16 for inputs near 1. (ONNX Runtime
    refuses repeated node names, so a model it runs has none.)"""
    v = lambda n, t=TensorProto.FLOAT, s=(1, 16): helper.make_tensor_value_info(n, t, list(s))
    k = numpy_helper.from_array(np.full([1], 12.0, np.float32), "k")
    branch = lambda name, out, op: helper.make_graph([helper.make_node(op, ["g"], [out])], name, [], [v(out)])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Mul", ["b", "k"], ["m1"], name="dup"),
        helper.make_node("Mul", ["m1", "k"], ["m2"]),
        helper.make_node("Exp", ["m2"], ["g"], name="grow"),
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
        helper.make_node("If", ["c"], ["y"], name="gate", then_branch=branch("then", "t", "Sqrt"), else_branch=branch("else", "e", "Neg")),
    ]
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    graph = helper.make_graph(nodes, "awkward", [v("x")], [v("y")], [k, zero])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def adapter_ids(path):
    graphs = ONNXAdapter().convert(str(path), {})["graphs"]
    return {node.id for g in graphs for node in g.nodes}


def test_node_data_is_keyed_by_the_adapters_node_ids(tmp_path):
    path = tmp_path / "awkward.onnx"
    model_with_awkward_names(path)
    beside = os.path.join(os.path.dirname(sys.executable), "layerwise")
    layerwise = beside if os.path.exists(beside) else shutil.which("layerwise")
    done = subprocess.run([layerwise, "bisect", str(path), "--model-explorer", str(tmp_path / "me.json"), "--json", str(tmp_path / "r.json")], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    results = json.loads((tmp_path / "me.json").read_text())["results"]
    ids = adapter_ids(path)
    missing = sorted(set(results) - ids)
    assert not missing, f"node data the adapter has no node for: {missing}; its ids: {sorted(ids)}"
    # Every computing node of the model, branches included, carries a value.
    for expected in ["node", "node_1", "dup", "node_2", "grow", "sum", "positive", "gate/then_branch/node", "gate_phi"]:
        assert expected in results, (expected, sorted(results))
