"""The Python examples of the docs, run as written: each ```python block of docs/python.md and
docs/report-format.md is executed in a folder holding `model.onnx` (layerwise's demo model) and,
for the schema example, `report.json` and `docs/schema/`, with `array`, `a` and `b` bound to
inputs of the demo's shape that overflow its LayerNorm in FP16. A block that raises fails here."""

import os
import pathlib
import re
import shutil
import subprocess

import numpy as np

from conftest import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]


def blocks(doc):
    return re.findall(r"^```python\n(.*?)^```", (ROOT / doc).read_text(), flags=re.M | re.S)


def test_every_python_example_in_the_docs_runs(demo, tmp_path, monkeypatch):
    shutil.copy(demo, tmp_path / "model.onnx")
    subprocess.run([cli(), "bisect", "model.onnx", "--json", "report.json"], cwd=tmp_path, capture_output=True)
    assert (tmp_path / "report.json").is_file()
    shutil.copytree(ROOT / "docs" / "schema", tmp_path / "docs" / "schema")
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    found = 0
    for doc in ["docs/python.md", "docs/report-format.md"]:
        for code in blocks(doc):
            found += 1
            names = {name: rng.uniform(0, 1, (1, 8, 64)).astype(np.float32) for name in ("array", "a", "b")}
            exec(compile(code, f"{doc} (block {found})", "exec"), names)
    assert found >= 2, f"found {found} python blocks in the docs"
    assert (tmp_path / "fixed.onnx").is_file() and (tmp_path / "model_fp16.onnx").is_file()
