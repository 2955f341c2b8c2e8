"""layerwise: find where a model's accuracy breaks between a float32 reference (ONNX Runtime)
and a candidate backend or precision (FP16, BF16, TF32, TensorRT).

    import layerwise
    r = layerwise.bisect("model.onnx", inputs={"x": array}, cand="sim:fp16")
    r.status, r.first_divergent.node, r.tensors["name"].rel_l2_err, r.to_dict()

The work is the same Rust code the ``layerwise`` command runs; results are identical for the same
inputs. See docs/python.md.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "bisect",
    "fix",
    "convert",
    "Report",
    "FixReport",
    "TensorResult",
    "LayerwiseError",
    "InputError",
    "__version__",
]

# ONNX Runtime: the library of the user's own `onnxruntime` (or `onnxruntime-gpu`) package when it
# is new enough, so that results match what their code runs; otherwise layerwise's own discovery
# (its cache, or `pip download`). Set before the extension first loads ONNX Runtime.
_MIN_ORT = (1, 24)


def _use_python_onnxruntime() -> None:
    os.environ.setdefault("LAYERWISE_PYTHON", sys.executable)
    if os.environ.get("LAYERWISE_ORT_LIB") or os.environ.get("ORT_DYLIB_PATH"):
        return
    try:
        import onnxruntime  # noqa: F401
    except Exception:
        return
    parts = onnxruntime.__version__.split(".")[:2]
    try:
        version = tuple(int(p) for p in parts)
    except ValueError:
        return
    if version < _MIN_ORT:
        return
    capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
    libs = sorted(glob.glob(os.path.join(capi, "libonnxruntime.so*")) + glob.glob(os.path.join(capi, "libonnxruntime*.dylib")) + glob.glob(os.path.join(capi, "onnxruntime.dll")))
    if libs:
        os.environ["LAYERWISE_ORT_LIB"] = libs[0]


_use_python_onnxruntime()

from . import _native  # noqa: E402

__version__: str = _native.__version__

#: Raised for what exits 2 on the command line (bad input, a model that cannot run, ...), with
#: the command line's message.
LayerwiseError = _native.LayerwiseError
#: The same class: input errors are the common case.
InputError = _native.LayerwiseError

ArrayLike = Any
Inputs = Union[None, Mapping[str, ArrayLike], Iterable[Mapping[str, ArrayLike]]]


def _raw(name: str, value: ArrayLike) -> Tuple[str, str, List[int], bytes]:
    import numpy as np

    a = np.ascontiguousarray(np.asarray(value))
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return (str(name), a.dtype.str, [int(d) for d in a.shape], a.tobytes())


def _split_inputs(inputs: Inputs) -> Tuple[list, list]:
    """One sample (a mapping of input name to array) or many (an iterable of such mappings)."""
    if inputs is None:
        return [], []
    if isinstance(inputs, Mapping):
        return [_raw(k, v) for k, v in inputs.items()], []
    samples = []
    for i, sample in enumerate(inputs):
        if not isinstance(sample, Mapping):
            raise InputError(f"input error: sample {i} is a {type(sample).__name__}, not a mapping of input names to arrays")
        samples.append((f"sample_{i:06d}", [_raw(k, v) for k, v in sample.items()]))
    if not samples:
        raise InputError("input error: the iterable of samples is empty")
    return [], samples


def _progress_lines() -> bool:
    """One line per step where standard error is no terminal (a notebook), the spinner otherwise."""
    try:
        return not sys.stderr.isatty()
    except Exception:
        return True


def _options(**kwargs: Any) -> str:
    out = {"progress_lines": _progress_lines()}
    for key, value in kwargs.items():
        if value is None:
            continue
        if key in ("input_shapes",):
            value = [[k, [int(d) for d in v]] for k, v in dict(value).items()]
        elif key == "val_ranges":
            value = [[k, float(lo), float(hi)] for k, (lo, hi) in dict(value).items()]
        elif key in ("cand_model", "json", "html", "markdown", "repro", "output"):
            value = os.fspath(value)
        elif key == "tensors":
            value = list(value)
        elif key in ("atol", "rtol", "range_tol") and isinstance(value, Mapping):
            value = {str(k): float(v) for k, v in value.items()}
        out[key] = value
    return json.dumps(out)


class _Node:
    """A read-only view of one object of the JSON report, with its fields as attributes."""

    __slots__ = ("_d",)

    def __init__(self, d: Mapping[str, Any]):
        self._d = d

    def __getattr__(self, name: str) -> Any:
        if name in self._d:
            return _wrap(self._d[name])
        if name in _OPTIONAL_SECTIONS:
            # A section this run did not produce (samples on one sample, isolation on a pass).
            return None
        raise AttributeError(f"a layerwise report has no field '{name}' (see docs/report-format.md)")

    def __getitem__(self, name: str) -> Any:
        return _wrap(self._d[name])

    def __dir__(self) -> List[str]:
        return list(self._d)

    def to_dict(self) -> Dict[str, Any]:
        return dict(self._d)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({json.dumps(self._d)[:200]})"


def _wrap(v: Any) -> Any:
    if isinstance(v, dict):
        return _Node(v)
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    return v


def _number(v: Any) -> Any:
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    return v


class TensorResult(_Node):
    """One compared tensor: `name`, `node`, `op_type`, `pass_`, and every metric of the report
    (`rel_l2_err`, `max_abs_err`, `max_rel_err`, `cosine`, `snr_db`, ...) as attributes; "inf" and
    "nan" of the JSON come back as floats."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name == "pass_":
            return self._d["pass"]
        if name in self._d:
            return _number(_wrap(self._d[name]))
        metrics = self._d.get("metrics", {})
        if name in metrics:
            return _number(metrics[name])
        raise AttributeError(name)


# Sections a report holds only when the run produced them (docs/report-format.md).
_OPTIONAL_SECTIONS = frozenset({
    "first_divergent_detail", "worst_output", "search", "isolation", "counterfactual", "memory",
    "samples", "noise_floor", "control_flow", "matching", "repro", "shard", "explorer_ids",
})


class Report:
    """The result of `bisect`: the JSON report (schema layerwise.report/1) as typed objects."""

    def __init__(self, report_json: str):
        self._json = report_json
        self._d: Dict[str, Any] = json.loads(report_json)
        self.tensors: Dict[str, TensorResult] = {t["name"]: TensorResult(t) for t in self._d["tensors"]}

    @property
    def status(self) -> str:
        """"pass" or "diverged"."""
        return self._d["verdict"]["status"]

    @property
    def verdict(self) -> _Node:
        return _Node(self._d["verdict"])

    @property
    def first_divergent(self) -> Optional[_Node]:
        """The first divergent node (`node`, `op_type`, `tensor`, `input_error`, `output_error`,
        `cause`, `evidence`), or None when the verdict names none."""
        fd = self._d["verdict"].get("first_divergent")
        return None if fd is None else _Node(fd)

    @property
    def summary(self) -> str:
        return self._d["verdict"]["summary"]

    @property
    def outputs(self) -> List[_Node]:
        return [_Node(o) for o in self._d["outputs"]]

    def __getattr__(self, name: str) -> Any:
        # Every other top-level field of the report: model, ref, cand, tolerances, inputs,
        # not_compared, noise_floor, samples, control_flow, matching, ...
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._d:
            return _wrap(self._d[name])
        if name in _OPTIONAL_SECTIONS:
            # A section this run did not produce (samples on one sample, isolation on a pass).
            return None
        raise AttributeError(f"a layerwise report has no field '{name}' (see docs/report-format.md)")

    def to_dict(self) -> Dict[str, Any]:
        """The JSON report, identical to what `bisect --json` writes."""
        return json.loads(self._json)

    def to_json(self) -> str:
        return self._json

    def _repr_html_(self) -> str:
        return _native.render_html(self._json)

    def __repr__(self) -> str:
        return f"<layerwise.Report {self.status}: {self.summary}>"


class FixReport(_Node):
    """The result of `fix` (schema layerwise.fix/1): `status` ("fixed" or not), `keep_fp32`,
    `patterns`, `rounds`, `outputs`, `fixed_model`, `fixed_model_check`, `summary`, ..."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<layerwise.FixReport {self._d.get('status')}: {self._d.get('summary')}>"

    def _repr_html_(self) -> str:
        return _native.render_fix_html(json.dumps(self._d))


def bisect(
    model: Union[str, os.PathLike],
    inputs: Inputs = None,
    cand: str = "sim:fp16",
    ref: str = "ort:cpu",
    *,
    cand_model: Optional[Union[str, os.PathLike]] = None,
    atol: Optional[Union[float, Mapping[str, float]]] = None,
    rtol: Optional[Union[float, Mapping[str, float]]] = None,
    range_tol: Optional[Union[float, Mapping[str, float]]] = None,
    seed: int = 0,
    input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
    val_ranges: Optional[Mapping[str, Tuple[float, float]]] = None,
    tensors: Optional[Sequence[str]] = None,
    mark: str = "all",
    max_memory: Optional[Union[int, str]] = None,
    separate_runs: bool = False,
    isolate: bool = True,
    counterfactual: bool = True,
    noise_floor: bool = True,
    keep_control_flow: bool = False,
    match: str = "auto",
    progress: bool = True,
    json: Optional[Union[str, os.PathLike]] = None,
    html: Optional[Union[str, os.PathLike]] = None,
    markdown: Optional[Union[str, os.PathLike]] = None,
    repro: Optional[Union[str, os.PathLike]] = None,
) -> Report:
    """`layerwise bisect`, with the same options (see `layerwise bisect --help`).

    `inputs` is a mapping of input name to numpy array (one sample; inputs not given are random,
    seeded, as on the command line), or an iterable of such mappings (a data loader): every
    sample is run and aggregated as `--inputs DIR` does, without writing files.
    """
    single, samples = _split_inputs(inputs)
    options = _options(
        ref=ref, cand=cand, cand_model=cand_model, atol=atol, rtol=rtol, range_tol=range_tol, seed=seed,
        input_shapes=input_shapes, val_ranges=val_ranges, tensors=tensors, mark=mark, max_memory=max_memory,
        separate_runs=separate_runs, isolate=isolate, counterfactual=counterfactual, noise_floor=noise_floor, keep_control_flow=keep_control_flow,
        match=match, progress=progress, json=json, html=html, markdown=markdown, repro=repro,
    )
    return Report(_native.bisect(os.fspath(model), options, single, samples))


def fix(
    model: Union[str, os.PathLike],
    inputs: Inputs = None,
    cand: str = "sim:fp16",
    ref: str = "ort:cpu",
    *,
    output: Optional[Union[str, os.PathLike]] = None,
    atol: Optional[Union[float, Mapping[str, float]]] = None,
    rtol: Optional[Union[float, Mapping[str, float]]] = None,
    range_tol: Optional[Union[float, Mapping[str, float]]] = None,
    seed: int = 0,
    input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
    val_ranges: Optional[Mapping[str, Tuple[float, float]]] = None,
    max_rounds: int = 12,
    json: Optional[Union[str, os.PathLike]] = None,
    progress: bool = True,
) -> FixReport:
    """`layerwise fix`: the smallest keep-in-FP32 list that brings every output within tolerance,
    verified, and the fixed model written to `output` when given. `inputs` is one sample (a
    mapping of input name to array) or several (an iterable of such mappings): the keep list must
    hold on every sample."""
    single, samples = _split_inputs(inputs)
    options = _options(
        ref=ref, cand=cand, output=output, atol=atol, rtol=rtol, range_tol=range_tol, seed=seed,
        input_shapes=input_shapes, val_ranges=val_ranges, max_rounds=max_rounds, json=json, progress=progress,
    )
    return FixReport(_json_loads(_native.fix(os.fspath(model), options, single, samples)))


def convert(
    model: Union[str, os.PathLike],
    output: Union[str, os.PathLike],
    to: str = "fp16",
    *,
    keep_fp32: Sequence[str] = (),
    keep_fp32_op: Sequence[str] = (),
    fp16_io: bool = False,
    allow_weight_overflow: bool = False,
) -> None:
    """`layerwise convert`: writes `model` converted to `to` (fp16, bf16, fp16-emulated,
    bf16-emulated, tf32-emulated) at `output`. Raises LayerwiseError with the command's message."""
    argv = ["layerwise", "convert", os.fspath(model), "--to", to, "-o", os.fspath(output)]
    if keep_fp32:
        argv += ["--keep-fp32", ",".join(keep_fp32)]
    if keep_fp32_op:
        argv += ["--keep-fp32-op", ",".join(keep_fp32_op)]
    if fp16_io:
        argv.append("--fp16-io")
    if allow_weight_overflow:
        argv.append("--allow-weight-overflow")
    _native.run_command(argv)


def _json_loads(text: str) -> Dict[str, Any]:
    return json.loads(text)
