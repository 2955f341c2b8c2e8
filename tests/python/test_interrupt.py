"""Ctrl-C during a run from Python stops it at its next step, raises KeyboardInterrupt and leaves
no temporary files behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "make_transformer.py"


def test_ctrl_c_stops_the_run_and_cleans_up(tmp_path):
    model = tmp_path / "encoder.onnx"
    subprocess.run([sys.executable, str(GENERATOR), str(model), "2"], check=True, capture_output=True)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # A Python whose parent ignores SIGINT (a background job of a shell without job control, as
    # a CI script may be started) installs no handler and never sees Ctrl-C: the child installs
    # the one an interactive Python has.
    code = (
        "import signal, sys, layerwise\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "try:\n"
        f"    layerwise.bisect({str(model)!r})\n"
        "except KeyboardInterrupt as e:\n"
        "    print('INTERRUPTED:', e)\n"
        "    sys.exit(3)\n"
        "print('FINISHED')\n"
    )
    env = dict(os.environ, TMPDIR=str(scratch))
    started = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # Progress comes one line per step (stderr is a pipe): interrupt once the candidate runs
    # (with the reference, paired in one session, by default).
    seen = []
    for line in p.stderr:
        seen.append(line)
        if "running candidate" in line or "paired" in line:
            p.send_signal(signal.SIGINT)
            break
    out, err = p.communicate(timeout=300)
    err = "".join(seen) + err
    assert p.returncode == 3, (p.returncode, out, err)
    assert "interrupted" in out, out
    # ONNX Runtime's own `.ses` session file is ONNX Runtime's (docs/reliability.md); layerwise's
    # scratch folders must be gone.
    left = [f for f in scratch.iterdir() if f.name != ".ses"]
    assert not left, f"temporary files left: {left}"
    assert time.monotonic() - started < 300
