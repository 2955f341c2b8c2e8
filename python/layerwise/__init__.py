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
        return [_raw(k, v) for k, v in _check_mapping("inputs", inputs, "an array").items()], []
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise _wrong_type("inputs", "a mapping of input name to array (one sample) or an iterable of such mappings", inputs)
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


# Checking the arguments: every parameter of bisect, fix and convert is checked here, in one
# place, before anything runs. A wrong type raises TypeError and a value out of range ValueError,
# each naming the parameter and what it takes (never a JSON parser's position, never a str taken
# letter by letter). What only the command line's own parsers can judge (a backend spec's text, a
# size as text) raises LayerwiseError with their message, as on the command line.


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _wrong_type(name: str, wants: str, value: Any) -> TypeError:
    return TypeError(f"{name} must be {wants}, not {type(value).__name__} {_shown(value)}")


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"


def _is_int(value: Any) -> bool:
    import numbers

    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_real(value: Any) -> bool:
    import numbers

    return isinstance(value, numbers.Real) and not _is_bool(value)


def _check_str(name: str, value: Any, choices: Optional[Sequence[str]] = None) -> str:
    if not isinstance(value, str):
        wants = "one of " + ", ".join(repr(c) for c in choices) if choices else "a str"
        raise _wrong_type(name, wants, value)
    if choices is not None and value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, not {_shown(value)}")
    return value


def _check_bool(name: str, value: Any) -> bool:
    if not _is_bool(value):
        raise _wrong_type(name, "True or False", value)
    return bool(value)


def _check_int(name: str, value: Any, least: int) -> int:
    if not _is_int(value):
        raise _wrong_type(name, f"an int (at least {least})", value)
    if int(value) < least:
        raise ValueError(f"{name} must be at least {least}, not {int(value)}")
    return int(value)


def _check_number(name: str, value: Any, non_negative: bool = False) -> float:
    import math

    wants = "a non-negative finite number" if non_negative else "a finite number"
    if not _is_real(value):
        raise _wrong_type(name, wants, value)
    v = float(value)
    if not math.isfinite(v) or (non_negative and v < 0):
        raise ValueError(f"{name} must be {wants}, not {_shown(value)}")
    return v


def _check_path(name: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise _wrong_type(name, "a path (str or os.PathLike)", value)
    path = os.fspath(value)
    if not isinstance(path, str):
        raise _wrong_type(name, "a path as text (str or os.PathLike of str)", value)
    if not path:
        raise ValueError(f"{name} must be a path, not an empty str")
    return path


def _check_names(name: str, value: Any, comma_free: bool = False) -> List[str]:
    """A sequence of names; a single str is one name (never its letters)."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise _wrong_type(name, "a name (str) or a sequence of names", value)
    names = list(value)
    for i, n in enumerate(names):
        if not isinstance(n, str):
            raise TypeError(f"{name} must hold names (str), but item {i} is {type(n).__name__} {_shown(n)}")
        if not n:
            raise ValueError(f"{name}: item {i} is an empty name")
        if comma_free and "," in n:
            raise ValueError(f"{name}: name {_shown(n)} holds a comma, which the command line takes to separate names")
    return names


def _check_tolerance(name: str, value: Any) -> Any:
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{name} maps tensor names (str) to tolerances, but a key is {type(k).__name__} {_shown(k)}")
            out[k] = _check_number(f"{name}[{k!r}]", v, non_negative=True)
        return out
    if not _is_real(value):
        raise _wrong_type(name, "a non-negative finite number or a mapping of tensor name to one", value)
    return _check_number(name, value, non_negative=True)


def _check_mapping(name: str, value: Any, wants: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise _wrong_type(name, f"a mapping of input name to {wants}", value)
    for k in value:
        if not isinstance(k, str):
            raise TypeError(f"{name} maps input names (str) to {wants}, but a key is {type(k).__name__} {_shown(k)}")
    return value


def _check_shapes(name: str, value: Any) -> list:
    out = []
    for k, dims in _check_mapping(name, value, "a shape (a sequence of ints)").items():
        if isinstance(dims, (str, bytes)) or not isinstance(dims, Iterable):
            raise _wrong_type(f"{name}[{k!r}]", "a shape (a sequence of ints)", dims)
        out.append([k, [_check_int(f"{name}[{k!r}]", d, 0) for d in dims]])
    return out


def _check_tasks(name: str, value: Any) -> list:
    """{"logits": "ctc,blank=0"}: each output's task as `--task OUTPUT:TASK` gives it."""
    out = []
    for k, task in _check_mapping(name, value, "a task such as 'classify,topk=5' (a string)").items():
        out.append([k, _check_str(f"{name}[{k!r}]", task)])
    return out


def _check_ranges(name: str, value: Any) -> list:
    out = []
    for k, pair in _check_mapping(name, value, "a (low, high) pair").items():
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Iterable):
            raise _wrong_type(f"{name}[{k!r}]", "a (low, high) pair of numbers", pair)
        pair = list(pair)
        if len(pair) != 2:
            raise ValueError(f"{name}[{k!r}] must be a (low, high) pair of numbers, not {len(pair)} values")
        out.append([k, _check_number(f"{name}[{k!r}]", pair[0]), _check_number(f"{name}[{k!r}]", pair[1])])
    return out


def _check_size(name: str, value: Any) -> Any:
    if isinstance(value, str):
        return value  # parsed as --max-memory parses it ("512M", "2G")
    if not _is_int(value):
        raise _wrong_type(name, 'a size: bytes (an int of at least 1) or text such as "512M" or "2G"', value)
    if int(value) < 1:
        # As the command line refuses --max-memory 0.
        raise ValueError(f"{name}: size '{int(value)}' must be at least one byte")
    return int(value)


_PATHS = ("cand_model", "json", "html", "markdown", "repro", "output")
_FLAGS = ("separate_runs", "isolate", "counterfactual", "noise_floor", "keep_control_flow", "progress")
_CHOICES = {"mark": ("all", "search"), "match": ("auto", "name")}
CONVERT_TARGETS = ("fp16", "bf16", "fp16-emulated", "bf16-emulated", "tf32-emulated")


def _check_option(key: str, value: Any) -> Any:
    """One keyword argument of bisect or fix, checked, as the options' JSON takes it."""
    if key in ("ref", "cand"):
        return _check_str(key, value)
    if key in _CHOICES:
        return _check_str(key, value, _CHOICES[key])
    if key in _PATHS:
        return _check_path(key, value)
    if key in _FLAGS:
        return _check_bool(key, value)
    if key in ("atol", "rtol", "range_tol"):
        return _check_tolerance(key, value)
    if key == "seed":
        return _check_int(key, value, 0)
    if key == "max_rounds":
        return _check_int(key, value, 0)
    if key == "input_shapes":
        return _check_shapes(key, value)
    if key == "val_ranges":
        return _check_ranges(key, value)
    if key == "tensors":
        return _check_names(key, value)
    if key == "max_memory":
        return _check_size(key, value)
    if key == "task":
        return _check_tasks(key, value)
    if key == "target":
        return _check_str(key, value)
    raise TypeError(f"unexpected option {key!r}")


def _options(**kwargs: Any) -> str:
    out: Dict[str, Any] = {"progress_lines": _progress_lines()}
    for key, value in kwargs.items():
        if value is None:
            continue
        out[key] = _check_option(key, value)
    return json.dumps(out, allow_nan=False)


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
    "answers", "target",
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
    cand: Optional[str] = None,
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
    task: Optional[Mapping[str, str]] = None,
) -> Report:
    """`layerwise bisect`, with the same options (see `layerwise bisect --help`).

    `inputs` is a mapping of input name to numpy array (one sample; inputs not given are random,
    seeded, as on the command line), or an iterable of such mappings (a data loader): every
    sample is run and aggregated as `--inputs DIR` does, without writing files. `task` judges
    outputs by their answers, as `--task` does: {"logits": "ctc,blank=0"}; the report's `answers`.
    """
    model = _check_path("model", model)
    options = _options(
        ref=ref, cand=cand, cand_model=cand_model, atol=atol, rtol=rtol, range_tol=range_tol, seed=seed,
        input_shapes=input_shapes, val_ranges=val_ranges, tensors=tensors, mark=mark, max_memory=max_memory,
        separate_runs=separate_runs, isolate=isolate, counterfactual=counterfactual, noise_floor=noise_floor, keep_control_flow=keep_control_flow,
        match=match, progress=progress, json=json, html=html, markdown=markdown, repro=repro, task=task,
    )
    single, samples = _split_inputs(inputs)
    return Report(_native.bisect(model, options, single, samples))


def fix(
    model: Union[str, os.PathLike],
    inputs: Inputs = None,
    cand: Optional[str] = None,
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
    task: Optional[Mapping[str, str]] = None,
    target: str = "elementwise",
) -> FixReport:
    """`layerwise fix`: the smallest keep-in-FP32 list that brings every output within tolerance,
    verified, and the fixed model written to `output` when given. `inputs` is one sample (a
    mapping of input name to array) or several (an iterable of such mappings): the keep list must
    hold on every sample. `task` judges outputs by their answers, as `--task` does; with
    `target="answer"` (or "answer:0.99") the keep list is held to those answers instead of every
    output's element-wise tolerance, as `--target` does."""
    model = _check_path("model", model)
    options = _options(
        ref=ref, cand=cand, output=output, atol=atol, rtol=rtol, range_tol=range_tol, seed=seed,
        input_shapes=input_shapes, val_ranges=val_ranges, max_rounds=max_rounds, json=json, progress=progress,
        task=task, target=target,
    )
    single, samples = _split_inputs(inputs)
    return FixReport(_json_loads(_native.fix(model, options, single, samples)))


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
    model = _check_path("model", model)
    output = _check_path("output", output)
    to = _check_str("to", to, CONVERT_TARGETS)
    keep = _check_names("keep_fp32", keep_fp32, comma_free=True)
    keep_ops = _check_names("keep_fp32_op", keep_fp32_op, comma_free=True)
    # Every value joined to its option (`--to=...`) and the model after `--`: a path or name that
    # starts with '-' is a value, never an option of its own.
    argv = ["layerwise", "convert", f"--to={to}", f"--output={output}"]
    if keep:
        argv.append("--keep-fp32=" + ",".join(keep))
    if keep_ops:
        argv.append("--keep-fp32-op=" + ",".join(keep_ops))
    if _check_bool("fp16_io", fp16_io):
        argv.append("--fp16-io")
    if _check_bool("allow_weight_overflow", allow_weight_overflow):
        argv.append("--allow-weight-overflow")
    argv += ["--", model]
    _native.run_command(argv)


def _json_loads(text: str) -> Dict[str, Any]:
    return json.loads(text)
