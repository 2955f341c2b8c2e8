"""The Python API on generated models: every field the docs use, samples from an iterator, the
CLI's messages as exceptions, the HTML, and numbers identical to the command line's.

Run after installing the package (`pip install .`): `python -m pytest tests/python`.
"""

import json
import math
import subprocess

import numpy as np
import pytest

import layerwise


from conftest import cli


def loud(seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).random((1, 8, 64)) * scale).astype(np.float32)


def test_bisect_returns_typed_results(demo):
    r = layerwise.bisect(demo, inputs={"x": loud()}, cand="sim:fp16", progress=False)
    assert r.status == "diverged"
    assert r.first_divergent is not None
    assert r.first_divergent.node == "encoder/ln/Pow"
    assert r.first_divergent.cause.kind == "value_overflow"
    assert math.isinf(r.tensors["ln_squared"].rel_l2_err)
    assert r.tensors["ln_squared"].op_type == "Pow"
    assert r.tensors["ln_squared"].pass_ is False
    d = r.to_dict()
    assert d["schema"] == "layerwise.report/1"
    assert d["verdict"]["first_divergent"]["node"] == "encoder/ln/Pow"
    assert r.noise_floor.ill_conditioned is False
    quiet = layerwise.bisect(demo, inputs={"x": loud(scale=0.01)}, progress=False)
    assert quiet.status == "pass" and quiet.first_divergent is None


def test_the_numbers_match_the_command_line(demo, tmp_path):
    x = loud(seed=3)
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run([cli(), "bisect", str(demo), "--input", f"x={tmp_path / 'x.npy'}", "--json", str(tmp_path / "cli.json")], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    from_cli = json.loads((tmp_path / "cli.json").read_text())
    from_api = layerwise.bisect(demo, inputs={"x": x}, progress=False).to_dict()
    for d in (from_cli, from_api):
        d.pop("run_info")
        for i in d["inputs"]:
            i.pop("source")  # npy:PATH on the command line, "given" from Python
    assert from_api == from_cli


def test_samples_from_an_iterator_are_aggregated(demo):
    def loader():
        for seed, scale in [(1, 0.01), (2, 1.0), (3, 0.02)]:
            yield {"x": loud(seed, scale)}

    r = layerwise.bisect(demo, inputs=loader(), progress=False)
    assert r.samples.count == 3
    assert r.samples.worst_sample == "sample_000001"
    assert [run.status for run in r.samples.runs] == ["pass", "diverged", "pass"]
    assert r.first_divergent.node == "encoder/ln/Pow"


def test_bad_input_raises_the_command_lines_message(demo, tmp_path):
    with pytest.raises(layerwise.InputError) as raised:
        layerwise.bisect(demo, inputs={"nope": loud()}, progress=False)
    message = str(raised.value)
    assert "the model has no input 'nope' (its inputs: x)" in message
    np.save(tmp_path / "nope.npy", loud())
    done = subprocess.run([cli(), "bisect", str(demo), "--input", f"nope={tmp_path / 'nope.npy'}"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "the model has no input 'nope' (its inputs: x)" in done.stderr
    with pytest.raises(layerwise.LayerwiseError, match="model file not found"):
        layerwise.bisect(tmp_path / "missing.onnx", progress=False)


def test_the_html_report_renders_inline_with_its_charts(demo):
    html = layerwise.bisect(demo, inputs={"x": loud()}, progress=False)._repr_html_()
    assert html.lstrip().lower().startswith("<!doctype html")
    assert "<svg" in html and "encoder/ln/Pow" in html


def test_fix_and_convert(demo, tmp_path):
    fixed = layerwise.fix(demo, inputs={"x": loud()}, output=tmp_path / "fixed.onnx", progress=False)
    assert fixed.status == "fixed"
    assert "encoder/ln/Pow" in fixed.keep_fp32
    assert (tmp_path / "fixed.onnx").is_file()
    layerwise.convert(demo, tmp_path / "demo_fp16.onnx", to="fp16")
    assert (tmp_path / "demo_fp16.onnx").is_file()
    with pytest.raises(layerwise.LayerwiseError, match="would overwrite the input model"):
        layerwise.convert(demo, demo)


def test_fix_takes_a_sample_set_and_holds_on_every_sample(demo, tmp_path):
    """Issue "a newcomer's day", item 2: a list of samples is used, not replaced by random inputs;
    the keep list is searched and checked on every sample."""
    samples = [{"x": loud(seed=s, scale=sc)} for s, sc in [(0, 0.01), (1, 1.0), (2, 0.5)]]
    r = layerwise.fix(demo, inputs=samples, cand="sim:fp16", progress=False)
    assert r.status == "fixed", r.summary
    assert len(r.samples) == 3
    assert "on every one of the 3 samples" in r.summary
    # The quiet sample alone needs nothing kept: the loud ones decided the keep list.
    quiet = layerwise.fix(demo, inputs=samples[:1], cand="sim:fp16", progress=False)
    assert quiet.keep_fp32 == [] and r.keep_fp32 != []
    html = r._repr_html_()
    assert "FIXED" in html and "text-align:left !important" in html


def test_sizes_as_text_and_absent_sections(demo):
    r = layerwise.bisect(demo, inputs={"x": loud()}, max_memory="2G", progress=False)
    assert r.status == "diverged"
    # One sample: no samples section, and saying so is None, not an AttributeError.
    assert r.samples is None
    with pytest.raises(AttributeError, match="no field 'nonsense'"):
        r.nonsense
    with pytest.raises(layerwise.LayerwiseError, match="max_memory"):
        layerwise.bisect(demo, inputs={"x": loud()}, max_memory="lots", progress=False)


def test_a_quantized_cand_model_without_cand_runs_as_deployed_as_on_the_command_line(tmp_path):
    """The candidate's default is the CLI's: a Q/DQ cand_model runs on ort:cpu, not the FP16 emulation."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    float_graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "f", [x], [y], [numpy_helper.from_array(w, "w")])
    scale = float(np.abs(w).max() / 127)
    quantized_graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["w_q", "s", "z"], ["w_f"], name="w_dq"),
            helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["x_q"], name="x_q"),
            helper.make_node("DequantizeLinear", ["x_q", "sx", "z"], ["x_f"], name="x_dq"),
            helper.make_node("MatMul", ["x_f", "w_f"], ["y"], name="mm"),
        ],
        "q",
        [x],
        [y],
        [
            numpy_helper.from_array(np.round(w / scale).astype(np.int8), "w_q"),
            numpy_helper.from_array(np.array(scale, np.float32), "s"),
            numpy_helper.from_array(np.array(1 / 127, np.float32), "sx"),
            numpy_helper.from_array(np.array(0, np.int8), "z"),
        ],
    )
    for graph, name in ((float_graph, "m.onnx"), (quantized_graph, "q.onnx")):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.save(model, str(tmp_path / name))
    r = layerwise.bisect(tmp_path / "m.onnx", cand_model=tmp_path / "q.onnx", val_ranges={"x": (-1, 1)}, progress=False)
    d = r.to_dict()
    assert d["cand"]["spec"] == "ort:cpu"
    assert d["tolerances"]["defaults_for"] == "INT8"
    # A float cand_model keeps the FP16 emulation.
    r = layerwise.bisect(tmp_path / "m.onnx", cand_model=tmp_path / "m.onnx", val_ranges={"x": (-1, 1)}, progress=False)
    assert r.to_dict()["cand"]["spec"] == "sim:fp16"


def ctc_head(path):
    """A CTC head whose decoded string FP16 changes under an element-wise PASS (tests/answers.rs):
    step 2's scores 1.0002 and 1.0004 round to one value, and the first class wins."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.array(
        [[0, 0, 3], [3, 0, 0], [0, 1.0002, 1.0004], [3, 0, 0], [0, 3, 0]], dtype=np.float32
    ).reshape(1, 5, 3)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "table"], ["logits"], name="scores")],
        "ctc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(table, "table")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_task_and_the_fix_held_to_the_answer(tmp_path):
    """Issue 56: `task` as --task, `target` as fix --target."""
    model = tmp_path / "ctc.onnx"
    ctc_head(model)
    x = {"x": np.zeros((1, 5, 3), np.float32)}
    r = layerwise.bisect(model, inputs=x, task={"logits": "ctc,blank=0"}, progress=False)
    assert r.status == "pass"
    assert (r.answers[0].output, r.answers[0].task, r.answers[0].changed_cases) == ("logits", "ctc", 1)
    # Without a task there are no answers, and saying so is None.
    assert layerwise.bisect(model, inputs=x, progress=False).answers is None
    elementwise = layerwise.fix(model, inputs=x, task={"logits": "ctc"}, progress=False)
    assert elementwise.keep_fp32 == [] and elementwise.answers[0].changed_cases == 1
    held = layerwise.fix(model, inputs=x, task={"logits": "ctc"}, target="answer", progress=False)
    assert held.status == "fixed", held.summary
    assert (held.target, held.keep_fp32, held.answers[0].changed_cases) == ("answer", ["scores"], 0)
    # The notebook view shows the answers as the terminal does.
    assert "answer of 'logits' (ctc, given): held" in held._repr_html_()
    with pytest.raises(ValueError, match="at most 1"):
        layerwise.fix(model, inputs=x, task={"logits": "ctc"}, target="answer:2", progress=False)
    with pytest.raises(ValueError, match="is not OUTPUT:TASK|not a task|task"):
        layerwise.bisect(model, inputs=x, task={"logits": "guess"}, progress=False)
