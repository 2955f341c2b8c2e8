"""What the Python tests share: the installed `layerwise` command, and layerwise's demo model."""

import os
import shutil
import subprocess
import sys

import pytest


def cli() -> str:
    # The command the wheel installed, beside this Python (a venv need not be on PATH).
    beside = os.path.join(os.path.dirname(sys.executable), "layerwise")
    path = beside if os.path.exists(beside) else shutil.which("layerwise")
    assert path, "the package installs the `layerwise` command"
    return path


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """layerwise's demo model: a decomposed LayerNorm whose x^2 overflows FP16 for inputs in [0,1]."""
    folder = tmp_path_factory.mktemp("demo")
    subprocess.run([cli(), "demo", "--out-dir", str(folder)], check=True, capture_output=True)
    return folder / "demo.onnx"
