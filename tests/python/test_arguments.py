"""Issue 37, "Contradictions": the Python API's arguments are checked as the command line checks its
options. A wrong type raises TypeError and a value out of range ValueError, each naming the
parameter and what it takes: no str split into letters (`keep_fp32="Relu"`), no command-line help
text (`convert(to="fp8")`), no value the command line refuses (`max_memory=0`), no JSON parser
position (`cand=5`, `atol=nan`).

Run after installing the package (`pip install .`): `python -m pytest tests/python`.
"""

import math
import shutil
import subprocess

import numpy as np
import pytest

import layerwise


from conftest import cli


def x(scale: float = 0.01) -> np.ndarray:
    return (np.random.default_rng(0).random((1, 8, 64)) * scale).astype(np.float32)


def test_a_str_given_for_names_is_one_name(demo, tmp_path):
    # It was split into letters: "node 'e' does not exist".
    layerwise.convert(demo, tmp_path / "kept.onnx", keep_fp32="encoder/ln/Pow")
    assert (tmp_path / "kept.onnx").is_file()
    r = layerwise.bisect(demo, inputs={"x": x()}, tensors="ln_squared", progress=False)
    assert "ln_squared" in r.tensors


def test_convert_to_an_unknown_target_names_the_accepted_ones(demo, tmp_path):
    with pytest.raises(ValueError) as raised:
        layerwise.convert(demo, tmp_path / "out.onnx", to="fp8")
    message = str(raised.value)
    assert message.startswith("to must be one of 'fp16', 'bf16', 'fp16-emulated', 'bf16-emulated', 'tf32-emulated'"), message
    assert "'fp8'" in message and "Usage" not in message and "--help" not in message
    assert not (tmp_path / "out.onnx").exists()


def test_max_memory_zero_is_refused_as_on_the_command_line(demo, tmp_path):
    with pytest.raises(ValueError, match=r"max_memory: size '0' must be at least one byte"):
        layerwise.bisect(demo, inputs={"x": x()}, max_memory=0, progress=False)
    done = subprocess.run([cli(), "bisect", str(demo), "--max-memory", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "must be at least one byte" in done.stderr


def test_a_wrong_type_names_the_parameter_not_a_json_position(demo):
    with pytest.raises(TypeError) as raised:
        layerwise.bisect(demo, inputs={"x": x()}, cand=5, progress=False)
    assert str(raised.value) == "cand must be a str, not int 5"
    with pytest.raises(ValueError) as raised:
        layerwise.bisect(demo, inputs={"x": x()}, atol=math.nan, progress=False)
    assert str(raised.value) == "atol must be a non-negative finite number, not nan"
    assert "line" not in str(raised.value) and "column" not in str(raised.value)


# Every parameter, given a value of the wrong type or out of range: (function, keyword arguments,
# exception, words the message must hold).
WRONG = [
    ("bisect", {"ref": ["ort:cpu"]}, TypeError, "ref must be a str"),
    ("bisect", {"cand_model": 3.5}, TypeError, "cand_model must be a path"),
    ("bisect", {"atol": "1e-3"}, TypeError, "atol must be a non-negative finite number or a mapping"),
    ("bisect", {"rtol": -0.1}, ValueError, "rtol must be a non-negative finite number"),
    ("bisect", {"range_tol": {"ln_squared": math.inf}}, ValueError, "range_tol['ln_squared'] must be a non-negative finite number"),
    ("bisect", {"atol": {1: 0.1}}, TypeError, "atol maps tensor names (str)"),
    ("bisect", {"seed": 1.5}, TypeError, "seed must be an int"),
    ("bisect", {"seed": -1}, ValueError, "seed must be at least 0"),
    ("bisect", {"seed": True}, TypeError, "seed must be an int"),
    ("bisect", {"input_shapes": {"x": 64}}, TypeError, "input_shapes['x'] must be a shape"),
    ("bisect", {"input_shapes": {"x": (1, 8, "64")}}, TypeError, "input_shapes['x'] must be an int"),
    ("bisect", {"input_shapes": [("x", (1, 8, 64))]}, TypeError, "input_shapes must be a mapping"),
    ("bisect", {"val_ranges": {"x": (0,)}}, ValueError, "val_ranges['x'] must be a (low, high) pair"),
    ("bisect", {"val_ranges": {"x": (0, math.nan)}}, ValueError, "val_ranges['x'] must be a finite number"),
    ("bisect", {"tensors": [1, 2]}, TypeError, "tensors must hold names (str), but item 0 is int 1"),
    ("bisect", {"tensors": 7}, TypeError, "tensors must be a name (str) or a sequence of names"),
    ("bisect", {"mark": "everything"}, ValueError, "mark must be one of 'all', 'search'"),
    ("bisect", {"max_memory": 2.5}, TypeError, "max_memory must be a size"),
    ("bisect", {"max_memory": -1}, ValueError, "max_memory: size '-1' must be at least one byte"),
    ("bisect", {"separate_runs": "no"}, TypeError, "separate_runs must be True or False"),
    ("bisect", {"isolate": 0}, TypeError, "isolate must be True or False"),
    ("bisect", {"counterfactual": None, "noise_floor": "off"}, TypeError, "noise_floor must be True or False"),
    ("bisect", {"keep_control_flow": 1}, TypeError, "keep_control_flow must be True or False"),
    ("bisect", {"match": "structure"}, ValueError, "match must be one of 'auto', 'name'"),
    ("bisect", {"progress": "quiet"}, TypeError, "progress must be True or False"),
    ("bisect", {"json": 5}, TypeError, "json must be a path"),
    ("bisect", {"html": b"r.html"}, TypeError, "html must be a path"),
    ("bisect", {"markdown": ""}, ValueError, "markdown must be a path, not an empty str"),
    ("bisect", {"repro": ["dir"]}, TypeError, "repro must be a path"),
    ("bisect", {"inputs": 5}, TypeError, "inputs must be a mapping of input name to array"),
    ("bisect", {"inputs": "x.npz"}, TypeError, "inputs must be a mapping of input name to array"),
    ("bisect", {"inputs": {0: np.zeros((1, 8, 64), np.float32)}}, TypeError, "inputs maps input names (str)"),
    ("fix", {"output": 3}, TypeError, "output must be a path"),
    ("fix", {"max_rounds": "12"}, TypeError, "max_rounds must be an int"),
    ("fix", {"max_rounds": -2}, ValueError, "max_rounds must be at least 0"),
    ("fix", {"atol": math.nan}, ValueError, "atol must be a non-negative finite number"),
    ("fix", {"cand": None, "ref": 1}, TypeError, "ref must be a str"),
    ("convert", {"to": 16}, TypeError, "to must be one of 'fp16'"),
    ("convert", {"keep_fp32": [5]}, TypeError, "keep_fp32 must hold names (str), but item 0 is int 5"),
    ("convert", {"keep_fp32": ["a,b"]}, ValueError, "keep_fp32: name 'a,b' holds a comma"),
    ("convert", {"keep_fp32_op": 5}, TypeError, "keep_fp32_op must be a name (str) or a sequence of names"),
    ("convert", {"fp16_io": "yes"}, TypeError, "fp16_io must be True or False"),
    ("convert", {"allow_weight_overflow": 1}, TypeError, "allow_weight_overflow must be True or False"),
]


@pytest.mark.parametrize("function,kwargs,error,words", WRONG, ids=[f"{f}-{'-'.join(k)}" for f, k, _, _ in WRONG])
def test_every_parameter_is_checked_by_name(demo, tmp_path, function, kwargs, error, words):
    out = tmp_path / "out.onnx"
    with pytest.raises(error) as raised:
        if function == "convert":
            layerwise.convert(demo, out, **kwargs)
        elif function == "fix":
            layerwise.fix(demo, inputs={"x": x()}, **{"progress": False, **kwargs})
        else:
            layerwise.bisect(demo, **{"inputs": {"x": x()}, "progress": False, **kwargs})
    message = str(raised.value)
    assert words in message, message
    assert " at line " not in message and "column" not in message, message
    # Nothing ran: nothing written.
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_looks_like_an_option_is_a_path(demo, tmp_path, monkeypatch):
    # convert builds a command line: "-h" as the model was its help text, not a missing file.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(layerwise.LayerwiseError, match="model file not found: -h"):
        layerwise.convert("-h", "out.onnx")
    shutil.copy(demo, tmp_path / "-m.onnx")
    layerwise.convert("-m.onnx", "-out.onnx", keep_fp32=["encoder/ln/Pow"])
    assert (tmp_path / "-out.onnx").is_file()


def test_the_native_layer_names_the_option_too(demo):
    # A direct caller of the extension gets the option's name, never a JSON position.
    from layerwise import _native

    with pytest.raises(ValueError, match=r"^bad option: cand: invalid type: integer `5`, expected a string"):
        _native.bisect(str(demo), '{"cand": 5}', [], [])
    with pytest.raises(ValueError, match=r"^max_memory: size '0' must be at least one byte"):
        _native.bisect(str(demo), '{"max_memory": 0}', [], [])
