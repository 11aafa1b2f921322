"""``repro.py``: a standalone script that reproduces a bundle's failure with only numpy and the backend library.

It is the first file a runtime engineer opens, so it is short, commented and free of graphbisect. Its
design:

* **The script text is constant per backend type.** Everything specific to one failure (backend options,
  input and output names, tolerances, the recorded failure) is data in ``repro_config.json`` beside it,
  read at run time with :func:`json.load`. Tensor names, node names and spec values therefore never
  become source code: a model whose tensors are named with triple quotes or ``__import__('os').system(...)`` cannot
  break or hijack the script.
* **It runs the backend with the spec's exact options** (for ONNX Runtime: providers, optimization level,
  disabled optimizers, intra-op threads, session config entries, as :mod:`graphbisect.backends.onnxruntime`
  sets them), compares every output with the bundle's tolerances using :mod:`graphbisect.compare`'s
  semantics (``numpy.allclose`` per element; NaN/Inf in the target where the oracle is finite is a failure
  of its own kind) and prints what it saw.
* **The backend runs in a child process** (the script re-executes itself with ``--child``), so a segfault,
  an abort or a hang is observed and matched against the recorded failure like graphbisect's isolated
  workers do. ``--in-process`` skips that, for a debugger.
* **Exit status:** 1 while the recorded failure reproduces (a different failure also exits 1, with a loud
  note), 0 once fixed, 2 when the script itself cannot run (missing library or file).
* **Kernel pins travel with the bundle.** An ``openvino:tactics=REC.json`` target's record, restricted to
  the bundle model's nodes, is written as ``tactics.json`` (:func:`tactic_files`) and the script's OpenVINO
  section replays it the way :mod:`graphbisect.backends.openvino` does (record the unpinned build, pin the
  choices that differ as ``primitives_priority`` in the IR XML, compile the pinned IR).
* **A backend without a section** (a future one) still gets a bundle: its ``repro.py`` explains that it
  cannot replay that backend standalone and points to ``graphbisect verify DIR`` (exit 2).

Crash messages are matched on their stable part, :func:`crash_key`: the cause (first paragraph, name
lists collapsed, model dumps cut) without addresses,
paths, long numbers, temporary names and source line numbers, so a rebuilt library that moved the
``throw`` by three lines still counts as the same bug. The script carries an identical copy of that
function (a test pins the two together).

Example:
    >>> config = repro_config(content)           # doctest: +SKIP
    >>> script = render_repro(content)           # doctest: +SKIP
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphbisect.backends import BackendSpec, get
from graphbisect.backends.iree import IreeOptions, repro_section
from graphbisect.backends.onnxoptimizer import OptimizerOptions
from graphbisect.backends.onnxruntime import OPT_LEVELS, OrtOptions
from graphbisect.backends.registry import HOST_OPTIONS
from graphbisect.backends.tensorrt import parse_shapes
from graphbisect.backends.worker import option_flag
from graphbisect.errors import SpecError
from graphbisect.oracle.signature import FailureKind, Signature, normalize_message

if TYPE_CHECKING:
    from graphbisect.artifacts.content import BundleContent

__all__ = [
    "CONFIG_FORMAT",
    "CONTROL_TACTICS_FILE",
    "REPRO_BACKENDS",
    "TACTICS_FILE",
    "crash_key",
    "expected_failure",
    "has_standalone_repro",
    "render_repro",
    "repro_config",
    "repro_options",
    "tactic_files",
]

logger = logging.getLogger(__name__)

CONFIG_FORMAT = "graphbisect-repro"
CONFIG_VERSION = 1
DEFAULT_TIMEOUT_SECONDS = 600.0
#: The bundle files holding the target's (and the control's) tactic record, restricted to the bundle model.
TACTICS_FILE = "tactics.json"
CONTROL_TACTICS_FILE = "control_tactics.json"
_TACTICS_BACKENDS = frozenset({"openvino"})  # backends whose repro section replays ``tactics=``

#: The stable part of a crash message (one definition, in the signature module).
crash_key = normalize_message


# ------------------------------------------------------------------------------------- configuration
def _runtime_options(spec: BackendSpec) -> dict[str, str]:
    return {k: v for k, v in spec.options.items() if k not in HOST_OPTIONS}


def _ort_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The session settings graphbisect's ONNX Runtime backend derives from these options."""
    parsed = OrtOptions.parse(options)
    return {
        "providers": list(parsed.providers),
        "graph_optimization_level": OPT_LEVELS[parsed.opt_level],
        "disabled_optimizers": list(parsed.disabled),
        "intra_op_num_threads": parsed.threads,
        "session_config": [list(entry) for entry in parsed.config],
    }


_OV_PRECISIONS = {"f32": "f32", "fp32": "f32", "f16": "f16", "fp16": "f16", "bf16": "bf16"}  # as openvino.py


def _openvino_options(options: Mapping[str, str]) -> dict[str, Any]:
    precision = options.get("precision", "f32").strip().lower()
    if precision not in _OV_PRECISIONS:
        raise SpecError(f"openvino option precision={precision!r} is not one of f32, f16, bf16")
    threads = options.get("threads")
    return {
        "device": options.get("device", "CPU").strip() or "CPU",
        "precision": _OV_PRECISIONS[precision],
        "threads": int(threads) if threads is not None else None,
        "tactics": TACTICS_FILE if options.get("tactics") else None,  # the bundle's copy (see tactic_files)
    }


def _onnxoptimizer_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The passes graphbisect's onnxoptimizer backend applies, and the ORT session it runs the result in.

    ``passes`` is None for the installed onnxoptimizer's default list, resolved where the script runs (as the
    runtime resolves it in its worker).
    """
    parsed = OptimizerOptions.parse(options)
    return {"passes": list(parsed.passes) or None, "disabled": list(parsed.disabled),
            "onnxruntime": _ort_options(parsed.ort_options())}


def _iree_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The target CPU, iree-compile flags (features already turned into flags), opset and runtime device."""
    return IreeOptions.parse(options).to_json()


def _tri_state(options: Mapping[str, str], key: str) -> bool | None:
    return option_flag(options, key) if key in options else None


def _tensorrt_options(options: Mapping[str, str]) -> dict[str, Any]:
    def number(key: str) -> int | None:
        return int(options[key]) if key in options else None

    return {
        "fp16": option_flag(options, "fp16"),
        "bf16": option_flag(options, "bf16"),
        "tf32": _tri_state(options, "tf32"),
        "opt_level": number("opt_level"),
        "workspace_mib": number("workspace"),
        "shapes": {name: list(dims) for name, dims in parse_shapes(options.get("shapes", "")).items()},
        "device": number("device") or 0,
    }


def _command_options(options: Mapping[str, str]) -> dict[str, Any]:
    return {"cmd": options.get("cmd", ""), "shell": option_flag(options, "shell")}


def _no_options(options: Mapping[str, str]) -> dict[str, Any]:
    return {}


def _raw_options(options: Mapping[str, str]) -> dict[str, Any]:
    return dict(options)


def repro_options(spec: BackendSpec) -> dict[str, Any]:
    """The backend settings ``repro.py`` applies for ``spec`` (what graphbisect's runtime derives from it).

    Example:
        >>> repro_options(BackendSpec.parse("ort:opt_level=basic,threads=1"))["graph_optimization_level"]
        'ORT_ENABLE_BASIC'
    """
    backend = _backend(spec)
    return backend.options(_runtime_options(spec))


def has_standalone_repro(spec: BackendSpec) -> bool:
    """Whether ``repro.py`` can replay ``spec`` on its own (False: it points to ``graphbisect verify``).

    Example:
        >>> has_standalone_repro(BackendSpec.parse("onnxoptimizer:passes=fuse_pad_into_pool"))
        True
    """
    return _backend(spec).code is not None


def tactic_files(content: BundleContent) -> dict[str, str]:
    """Bundle file name -> the tactic record file (``tactics=``) of the target or the control that uses one.

    The bundle writes each record restricted to the nodes of its model; ``repro_config.json`` names the file.
    """
    files: dict[str, str] = {}
    for name, spec in ((TACTICS_FILE, content.target), (CONTROL_TACTICS_FILE, content.control)):
        if spec is not None and spec.options.get("tactics") and get(spec.name).name in _TACTICS_BACKENDS:
            files[name] = spec.options["tactics"]
    return files


def expected_failure(signature: Signature, target_message: str | None = None) -> dict[str, Any]:
    """What ``repro.py`` must observe to call the failure reproduced (the ``expect`` of its config).

    Example:
        >>> sig = Signature(FailureKind.CRASH_RUN, "SIGSEGV: the worker process was killed by signal SIGSEGV (11)")
        >>> expected_failure(sig)["exit_code"]
        -11
    """
    expect: dict[str, Any] = {"kind": signature.kind.value, "detail": signature.detail, "band": signature.band}
    if signature.kind in (FailureKind.CRASH_LOAD, FailureKind.CRASH_RUN):
        error_type, _, message = signature.detail.partition(": ")
        exit_code = _death_exit_code(signature.detail, error_type, message)
        expect["error_type"] = None if signature.detail.startswith("exit ") else error_type
        expect["exit_code"] = exit_code
        if exit_code is None:
            # The raw message keeps what the signature's 300-character normalized one may have cut.
            expect["message_key"] = crash_key(target_message or signature.detail)
        if target_message:
            expect["message"] = target_message
    elif signature.kind is FailureKind.REGEX:
        expect["regex"] = signature.detail
    return expect


def _death_exit_code(detail: str, error_type: str, message: str) -> int | None:
    """The exit status of a worker that died inside the backend (signal → negative); None for an exception.

    The worker host (:mod:`graphbisect.backends.process`) records such deaths as ``SIGSEGV: the worker process
    was killed by signal SIGSEGV (11) during run`` or ``WorkerExit: ... exited with code 3 ...``, and a crash
    without a message as ``exit <code>``.
    """
    bare = re.fullmatch(r"exit (-?\d+)", detail)
    if bare:
        return int(bare.group(1))
    if error_type != "WorkerExit" and not error_type.startswith("SIG"):
        return None
    killed = re.search(r"killed by signal \w+ \((\d+)\)", message)
    if killed:
        return -int(killed.group(1))
    exited = re.search(r"exited with code (-?\d+)", message)
    return int(exited.group(1)) if exited else None


def repro_config(content: BundleContent) -> dict[str, Any]:
    """``repro_config.json``: everything failure-specific that ``repro.py`` needs, as plain JSON data."""
    spec = content.target
    backend = _backend(spec)
    tol = content.tolerance
    timeout = spec.options.get("timeout")
    expect = expected_failure(content.signature, content.target_message)
    return {
        "format": CONFIG_FORMAT,
        "version": CONFIG_VERSION,
        "backend": backend.name,
        "library": backend.library,
        "target_spec": str(spec),
        "oracle_spec": str(content.oracle),
        "python": spec.options.get("python"),
        "recorded_library_version": _recorded_version(content.report, backend.library),
        "options": backend.options(_runtime_options(spec)),
        "timeout_seconds": float(timeout) if timeout else DEFAULT_TIMEOUT_SECONDS,
        "inputs": list(content.inputs),
        "outputs": list(content.oracle_outputs),
        "tolerance": {
            "atol": tol.atol,
            "rtol": tol.rtol,
            "min_cosine": tol.min_cosine,
            "per_output": {name: list(pair) for name, pair in tol.per_output.items()},
            "check_dtype": tol.check_dtype,
        },
        "expect": expect,
        "standalone": backend.code is not None,
        **({"control": _control_config(content.control)} if content.control is not None else {}),
    }


def _control_config(control: BackendSpec) -> dict[str, Any]:
    options = repro_options(control)
    if options.get("tactics"):
        options["tactics"] = CONTROL_TACTICS_FILE
    return {"target_spec": str(control), "options": options,
            "purpose": "the same backend that must not fail here (e.g. the culprit passes disabled)"}


def _recorded_version(report: Mapping[str, Any], library: str | None) -> str | None:
    versions = report.get("versions")
    if not isinstance(versions, Mapping) or library is None:
        return None
    for key in (library, "target"):
        value = versions.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping) and isinstance(value.get("library_version"), str):
            return str(value["library_version"])
    return None


def render_repro(content: BundleContent) -> str:
    """The text of ``repro.py`` for the bundle's target backend (the same text for every bundle of it).

    A backend without a section gets a script that says so and points to ``graphbisect verify`` (exit 2).
    Raises :class:`~graphbisect.errors.SpecError` for a target no bundle can hold (Paddle).
    """
    backend = _backend(content.target)
    if backend.code is None:
        return _NO_STANDALONE
    return "".join((_HEADER.replace("@LIBRARY@", backend.label), _COMMON_IMPORTS, backend.code, _COMMON))


# ----------------------------------------------------------------------------------- per backend
@dataclass(frozen=True)
class _ReproBackend:
    """How ``repro.py`` drives one backend type."""

    name: str
    label: str  # the libraries the script needs, for its docstring
    library: str | None  # the importable library whose version is reported
    options: Any  # (runtime options) -> JSON-able settings for the script
    code: str | None  # load_target / run_target / import_library for this backend; None: no standalone script


def _backend(spec: BackendSpec) -> _ReproBackend:
    info = get(spec.name)
    if info.name == "paddle":
        raise SpecError(
            "no repro.py for a paddle target: Paddle Inference runs only whole Paddle models, while a bundle holds "
            "a reduced ONNX model",
            hint="bundles are written for ONNX targets (onnxruntime, openvino, tensorrt, reference, command); "
            "compare the converted ONNX model on one of them to reduce a Paddle conversion bug",
        )
    backend = REPRO_BACKENDS.get(info.name)
    if backend is None:  # still a bundle: repro.py says to replay it with `graphbisect verify`
        logger.warning("repro.py has no section for backend %r: the bundle's repro.py points to "
                       "`graphbisect verify` (sections exist for %s)", info.name, ", ".join(sorted(REPRO_BACKENDS)))
        return _ReproBackend(info.name, "graphbisect", info.import_name, _raw_options, None)
    return backend


# Everything below is the text of repro.py: a header, the imports, one backend section, the common part.
# The templates contain no placeholders except @LIBRARY@ in the header (a constant per backend).
_HEADER = r'''#!/usr/bin/env python3
"""Reproduce a failure that graphbisect reduced to model.onnx.

    python repro.py                # exit 1: the failure reproduces, 0: fixed, 2: this script cannot run
    python repro.py --in-process   # run the backend in this process (for a debugger: gdb --args python ...)

Needs numpy and @LIBRARY@.

Everything it reads lies next to it: model.onnx (the reduced model), inputs.npz (a value for every graph
input), oracle_outputs.npz (the expected outputs, computed by the trusted oracle backend) and
repro_config.json (the backend options, tolerances and the recorded failure).
This script is the same for every bundle of this backend; all case-specific data is in repro_config.json.
"""

'''

_COMMON_IMPORTS = r'''import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPRODUCES, FIXED, CANNOT_RUN = 1, 0, 2

try:
    import numpy as np
except ImportError:
    print("repro.py cannot run: numpy is not installed (pip install numpy)", file=sys.stderr)
    sys.exit(CANNOT_RUN)


class CannotRun(Exception):
    """This script cannot run here (a library or a file is missing): exit 2, nothing was tested."""

'''

#: The one ONNX Runtime run used by every section that runs on ORT (onnxruntime, onnxoptimizer).
_ORT_RUN_TARGET = r'''

def run_target(session, inputs, output_names):
    """Run once; feed only what the session accepts (cut tensors may be initializers it overrides).
    Tensors of types numpy lacks (bfloat16, float8, int4...) travel as OrtValues of raw bits, which
    InferenceSession.run cannot take or give."""
    accepted = {i.name for i in session.get_inputs()} | {i.name for i in session.get_overridable_initializers()}
    feed = {name: value for name, value in inputs.items() if name in accepted}
    declared = {o.name: o.type for o in session.get_outputs()}
    typed_out = any(declared.get(name, "").replace("tensor(", "").rstrip(")").upper() in ORT_NAMES
                    for name in output_names)
    if not typed_out and not any(extension_code(value) for value in feed.values()):
        return dict(zip(output_names, session.run(output_names, feed)))
    import onnxruntime as ort

    values = {}
    for name, value in feed.items():
        code = extension_code(value)
        if code:
            raw = np.asarray(encode(value), order="C")
            if code in PACKED_BITS:  # ORT takes the shape from the array and reads the bytes packed
                packed, raw = pack(raw, code), np.zeros(value.shape, np.uint8)
                raw.reshape(-1)[:packed.size] = packed
            values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, code)
        else:
            values[name] = ort.OrtValue.ortvalue_from_numpy(value)
    results = session.run_with_ort_values(output_names, values)
    return {name: from_ortvalue(result) for name, result in zip(output_names, results)}


def from_ortvalue(value):
    import ctypes

    code = value.element_type() if value.is_tensor() else None
    if code not in ELEM_TYPES:
        return value.numpy()
    shape = tuple(value.shape())
    data = np.frombuffer(ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes()), np.uint8)
    if code in PACKED_BITS:
        return typed(unpack(data, code, shape), code)
    return typed(data.view(STORAGE[code]).reshape(shape), code)
'''

_ORT_CODE = r'''
# ------------------------------------------------------------------------------ the target: ONNX Runtime
def import_library(options):
    """Import onnxruntime and check that the requested execution providers exist; returns its version."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise CannotRun(f"onnxruntime is not installed ({exc}); pip install onnxruntime") from exc
    missing = [p for p in options["providers"] if p not in onnxruntime.get_available_providers()]
    if missing:
        raise CannotRun(f"execution provider(s) {missing} are not available in onnxruntime "
                        f"{onnxruntime.__version__} (available: {onnxruntime.get_available_providers()})")
    if not hasattr(onnxruntime.GraphOptimizationLevel, options["graph_optimization_level"]):
        raise CannotRun(f"onnxruntime {onnxruntime.__version__} has no {options['graph_optimization_level']}")
    return onnxruntime.__version__


def load_target(model_path, options):
    """Create the session exactly as graphbisect did: same providers, optimization level, disabled
    optimizers, intra-op threads and session config entries."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, options["graph_optimization_level"])
    if options["intra_op_num_threads"] is not None:
        so.intra_op_num_threads = options["intra_op_num_threads"]
    for key, value in options["session_config"]:
        so.add_session_config_entry(key, value)
    return ort.InferenceSession(str(model_path), so, providers=options["providers"],
                                disabled_optimizers=options["disabled_optimizers"])


''' + _ORT_RUN_TARGET

_REFERENCE_CODE = r'''
# ------------------------------------------------------------------- the target: onnx.reference (numpy)
def import_library(options):
    """Import onnx (its reference evaluator); returns its version."""
    try:
        import onnx
    except ImportError as exc:
        raise CannotRun(f"onnx is not installed ({exc}); pip install onnx") from exc
    return onnx.__version__


def load_target(model_path, options):
    """The ONNX reference evaluator: the specification written in numpy."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(str(model_path))


def run_target(evaluator, inputs, output_names):
    """Run once, feeding the evaluator's inputs."""
    accepted = set(evaluator.input_names)
    values = evaluator.run(output_names, {name: value for name, value in inputs.items() if name in accepted})
    return dict(zip(output_names, (as_value(v) for v in values)))

'''

_ONNXOPTIMIZER_CODE = r'''
# ------------------------------------------- the target: onnxoptimizer's passes, then ONNX Runtime without its own
def import_library(options):
    """Import onnx, onnxoptimizer and onnxruntime; check the pass names; returns onnxoptimizer's version."""
    try:
        import onnx  # the passes need it too
        import onnxoptimizer
        import onnxruntime
    except ImportError as exc:
        raise CannotRun(f"{exc}; pip install onnx onnxoptimizer onnxruntime") from exc
    available = set(onnxoptimizer.get_available_passes())
    unknown = [name for name in (options["passes"] or []) + options["disabled"] if name not in available]
    if unknown:
        raise CannotRun(f"onnxoptimizer {onnxoptimizer.__version__} has no pass(es) {unknown}")
    missing = [p for p in options["onnxruntime"]["providers"] if p not in onnxruntime.get_available_providers()]
    if missing:
        raise CannotRun(f"execution provider(s) {missing} are not available in onnxruntime {onnxruntime.__version__}")
    return onnxoptimizer.__version__


def load_target(model_path, options):
    """Apply the passes as graphbisect did (one at a time, in order; the default list when none are named,
    minus the disabled ones), then create an ONNX Runtime session on the result with its optimizations off."""
    import onnx
    import onnxoptimizer
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    passes = options["passes"] or list(onnxoptimizer.get_fuse_and_elimination_passes())
    for name in (p for p in passes if p not in set(options["disabled"])):
        model = onnxoptimizer.optimize(model, [name])
    session = options["onnxruntime"]
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, session["graph_optimization_level"])
    if session["intra_op_num_threads"] is not None:
        so.intra_op_num_threads = session["intra_op_num_threads"]
    for key, value in session["session_config"]:
        so.add_session_config_entry(key, value)
    return ort.InferenceSession(model.SerializeToString(), so, providers=session["providers"],
                                disabled_optimizers=session["disabled_optimizers"])


''' + _ORT_RUN_TARGET

_OPENVINO_CODE = r'''
# -------------------------------------------------------------------------------- the target: OpenVINO
SINK_SUFFIX = "/sink_port_0"  # the ONNX frontend names a graph output's Result "<name>/sink_port_0"


def import_library(options):
    """Import openvino and check the device; returns its version."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise CannotRun(f"openvino is not installed ({exc}); pip install openvino") from exc
    base = options["device"].split(".")[0].split(":")[0].upper()
    devices = ov.Core().available_devices
    if base not in ("AUTO", "HETERO", "MULTI", "BATCH") and not any(d.split(".")[0] == base for d in devices):
        raise CannotRun(f"OpenVINO device {options['device']} is not available here (devices: {devices})")
    return ov.get_version()


def load_target(model_path, options):
    """Read and compile the ONNX model as graphbisect did (device, inference precision, threads, and the
    kernel choices of the tactic record next to this script, when repro_config.json names one)."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(model_path))
    names = {}  # ONNX output name -> output index
    for index, (result, port) in enumerate(zip(model.get_results(), model.outputs)):
        friendly = result.get_friendly_name()
        if friendly.endswith(SINK_SUFFIX):
            names.setdefault(friendly[: -len(SINK_SUFFIX)], index)
        for name in port.get_names():
            names.setdefault(name, index)
    compiled = compile_ov(core, model, options)
    if options.get("tactics"):
        compiled = pin_tactics(core, model, compiled, options, model_path)
    return compiled, names


def compile_ov(core, model, options):
    config = {"INFERENCE_PRECISION_HINT": options["precision"]}
    if options["threads"] is not None:
        config["INFERENCE_NUM_THREADS"] = options["threads"]
    compiled = core.compile_model(model, options["device"], config)
    try:  # a device without the requested precision compiles in another one, silently
        actual = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    except Exception:
        actual = None
    if actual is not None and actual != options["precision"]:
        raise CannotRun(f"precision={options['precision']} was recorded, but {options['device']} here computes "
                        f"{actual} (INFERENCE_PRECISION_HINT): this machine cannot replay the recorded run")
    return compiled


# Kernel pins, as graphbisect.backends.openvino replays tactics=: record which kernel the unpinned build gave
# each ONNX node, pin the record's choices that differ (default kernels cannot always be asked for back),
# by writing primitives_priority into the IR XML (the only form the CPU plugin honours), and compile that.
PRECISION_SUFFIX = r"_(?:f32|f16|bf16|i8|u8|i32|i64|fp32|fp16|undef|dynamic)$"
NOT_KERNELS = {"Input", "Output", "Const", "Parameter", "Result"}


def pin_tactics(core, model, compiled, options, model_path):
    """The model compiled with the record's differing kernel choices pinned (unchanged when none differ)."""
    import openvino as ov

    try:
        wanted = json.loads((HERE / options["tactics"]).read_text(encoding="utf-8"))["choices"]
    except (OSError, ValueError, KeyError) as exc:
        raise CannotRun(f"cannot read the tactic record {options['tactics']}: {exc}") from exc
    nodes, producers = onnx_names(model_path)
    current = build_choices(compiled, nodes, producers)
    pins, unmapped = ir_pins(wanted, current, ir_layers(model, nodes, producers))
    if unmapped:  # a kernel of fused nodes (Conv + BatchNormalization) exists only after OpenVINO's fusions
        from openvino._offline_transformations import apply_moc_transformations

        fused = model.clone()
        apply_moc_transformations(fused, cf=False)
        fused_pins, fused_unmapped = ir_pins(wanted, current, ir_layers(fused, nodes, producers))
        if len(fused_unmapped) < len(unmapped):
            model, pins, unmapped = fused, fused_pins, fused_unmapped
    if unmapped:
        print(f"note: no OpenVINO layer stands for {unmapped[:5]}: their kernels are not pinned", file=sys.stderr)
    if not pins:
        return compiled
    with tempfile.TemporaryDirectory(prefix="repro-tactics-") as tmp:
        plain, pinned = Path(tmp) / "model.xml", Path(tmp) / "pinned.xml"
        ov.save_model(model, str(plain), compress_to_fp16=False)
        missing = pin_ir_xml(plain, pinned, pins)
        if missing:
            raise RuntimeError(f"OpenVINO's IR has no layer named {', '.join(missing[:5])}")
        compiled = compile_ov(core, core.read_model(str(pinned), str(Path(tmp) / "model.bin")), options)
    now = build_choices(compiled, nodes, producers)
    lost = [c for c in wanted if c["node"] in now and now[c["node"]][1] != c["choice"]]
    if lost:
        print(f"note: OpenVINO did not apply {len(lost)} pinned kernel choice(s): {lost[:5]}", file=sys.stderr)
    return compiled


def onnx_names(model_path):
    """The ONNX node names and each tensor's producer (empty without onnx: OpenVINO's names are used)."""
    try:
        import onnx
    except ImportError:
        return set(), {}
    graph = onnx.load(str(model_path), load_external_data=False).graph
    return {n.name for n in graph.node}, {out: n.name for n in graph.node for out in n.output if out}


def onnx_node_of(name, nodes, producers):
    """The ONNX node an OpenVINO op name stands for: the name or a /-prefix of it, as a node or tensor name."""
    if not nodes:
        return name
    if name.endswith(SINK_SUFFIX):
        name = name[: -len(SINK_SUFFIX)]
    parts = name.split("/")
    for end in range(len(parts), 0, -1):
        prefix = "/".join(parts[:end])
        if prefix in nodes:
            return prefix
        if prefix in producers:
            return producers[prefix]
    return None


def build_choices(compiled, nodes, producers):
    """ONNX node -> (execution layer, kernel without its precision suffix) of a compiled model."""
    choices = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        facts = {key: info[key].astype(str) for key in info.keys()}
        primitive = facts.get("primitiveType") or ""
        if facts.get("layerType") in NOT_KERNELS or not primitive or primitive.startswith("unknown"):
            continue
        candidates = [op.get_friendly_name(), *(n for n in facts.get("originalLayersNames", "").split(",") if n)]
        node = next((n for n in (onnx_node_of(c, nodes, producers) for c in candidates) if n is not None), None)
        if node is not None and node not in choices:
            choices[node] = (op.get_friendly_name(), re.sub(PRECISION_SUFFIX, "", primitive), facts.get("layerType"))
    return choices


def ir_layers(model, nodes, producers):
    """IR layer -> (op type, the ONNX nodes it stands for: its own name and its fused names)."""
    layers = {}
    for op in model.get_ops():
        if op.get_type_name() in ("Parameter", "Result", "Constant"):
            continue
        info = op.get_rt_info()
        originals = {op.get_friendly_name()}
        if "fused_names_0" in info:
            originals.update(n for n in info["fused_names_0"].astype(str).split(",") if n)
        found = {n for n in (onnx_node_of(o, nodes, producers) for o in originals) if n is not None}
        old_type, old_nodes = layers.get(op.get_friendly_name(), (op.get_type_name(), frozenset()))
        layers[op.get_friendly_name()] = (old_type, frozenset(old_nodes | found))
    return layers


TYPE_ALIASES = {"fullyconnected": ("matmul",), "pooling": ("maxpool", "avgpool"), "softmax": ("softmax",)}


def same_kind(exec_type, ir_type):
    """Whether an execution layer type (Convolution) can be the IR op type (Convolution, GroupConvolution)."""
    if not exec_type:
        return False
    want, have = exec_type.lower(), ir_type.lower()
    return want in have or any(alias in have for alias in TYPE_ALIASES.get(want, ()))


def ir_pins(wanted, current, layers):
    """IR layer -> kernel for the record's choices that differ from the unpinned build, and the nodes no IR
    layer stands for (graphbisect's tactics.openvino.ir_pins)."""
    pins, unmapped = {}, []
    for choice in wanted:
        layer, have, layer_type = current.get(choice["node"], (None, None, None))
        if layer is None or have == choice["choice"]:
            continue
        if layer in layers:
            pins[layer] = choice["choice"]
            continue
        found = [name for name, (op_type, nodes) in layers.items()
                 if choice["node"] in nodes and same_kind(layer_type, op_type)]
        if not found:
            unmapped.append(choice["node"])
        for name in found:
            pins[name] = choice["choice"]
    return pins, unmapped


def pin_ir_xml(xml_in, xml_out, pins):
    """Copy an IR XML with <rt_info><attribute name="primitives_priority" value="cpu:KERNEL"/> in the pinned
    layers; returns the names of pinned layers it does not have."""
    import xml.etree.ElementTree as ET

    tree = ET.parse(str(xml_in))
    found = set()
    for layer in tree.getroot().iter("layer"):
        name = layer.get("name") or ""
        if name not in pins:
            continue
        found.add(name)
        rt_info = layer.find("rt_info")
        if rt_info is None:
            rt_info = ET.SubElement(layer, "rt_info")
        for old in [a for a in rt_info.findall("attribute") if a.get("name") == "primitives_priority"]:
            rt_info.remove(old)
        value = pins[name] if pins[name].startswith("cpu:") else f"cpu:{pins[name]}"
        ET.SubElement(rt_info, "attribute", {"name": "primitives_priority", "version": "0", "value": value})
    tree.write(str(xml_out), encoding="utf-8", xml_declaration=True)
    return sorted(set(pins) - found)


def run_target(target, inputs, output_names):
    """Run once; outputs are found by index (compiled port names merge across fused nodes)."""
    compiled, names = target
    request = compiled.create_infer_request()
    feed = {}
    for port in compiled.inputs:
        name = next((n for n in sorted(port.get_names()) if n in inputs), None)
        if name is not None:
            feed[port] = np.asarray(inputs[name], order="C")  # keeps 0-d (ascontiguousarray makes it [1])
    request.infer(feed)
    return {name: np.array(request.get_output_tensor(names[name]).data, copy=True)
            for name in output_names if name in names}

'''

_TENSORRT_CODE = r'''
# ------------------------------------------------------------------------ the target: TensorRT (GPU)
def import_library(options):
    """Import tensorrt and a CUDA memory provider (cuda-python, else torch); returns TensorRT's version."""
    try:
        import tensorrt
    except ImportError as exc:
        raise CannotRun(f"tensorrt is not installed ({exc}); pip install tensorrt") from exc
    cuda_memory()
    return tensorrt.__version__


def cuda_memory():
    """(malloc, copy_in, copy_out, free, synchronize) on the GPU, via cuda-python or torch."""
    try:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart

        def call(fn, *args):
            err, *values = fn(*args)
            if err != cudart.cudaError_t.cudaSuccess:
                raise RuntimeError(f"{fn.__name__} failed: {cudart.cudaGetErrorString(err)[1]!r}")
            return values[0] if len(values) == 1 else None

        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        return (lambda n: int(call(cudart.cudaMalloc, max(n, 1))),
                lambda ptr, a: a.nbytes and call(cudart.cudaMemcpy, ptr, a.ctypes.data, a.nbytes, h2d),
                lambda a, ptr: a.nbytes and call(cudart.cudaMemcpy, a.ctypes.data, ptr, a.nbytes, d2h),
                lambda ptr: call(cudart.cudaFree, ptr), lambda: call(cudart.cudaDeviceSynchronize))
    except ImportError:
        pass
    try:
        import torch
    except ImportError as exc:
        raise CannotRun("TensorRT needs cuda-python (pip install cuda-python) or torch for GPU memory") from exc
    buffers = {}

    def malloc(n):
        t = torch.empty(max(n, 1), dtype=torch.uint8, device="cuda")
        buffers[t.data_ptr()] = t
        return t.data_ptr()

    def copy_in(ptr, a):
        buffers[ptr][: a.nbytes].copy_(torch.from_numpy(a.reshape(-1).view(np.uint8)))

    def copy_out(a, ptr):
        a.reshape(-1).view(np.uint8)[:] = buffers[ptr][: a.nbytes].cpu().numpy()

    return malloc, copy_in, copy_out, lambda ptr: buffers.pop(ptr, None), torch.cuda.synchronize


class TensorRTBuildError(RuntimeError):
    """TensorRT rejected the model (same class name and first line as graphbisect's runtime)."""


def load_target(model_path, options):
    """Parse the ONNX model; the engine is built at the first run (for the fed shapes of dynamic inputs)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model_path)):
        errors = [f"{parser.get_error(i).code()}: {parser.get_error(i).desc()}" for i in range(parser.num_errors)]
        raise TensorRTBuildError(f"TensorRT's ONNX parser rejected {model_path.name}:\n  " + "\n  ".join(errors))
    return {"trt": trt, "logger": logger, "builder": builder, "network": network, "parser": parser,
            "options": options}


def build_engine(target, inputs):
    """Build with the spec's flags; inputs with dynamic dims get a profile pinned to the fed shapes."""
    trt, builder, network, options = target["trt"], target["builder"], target["network"], target["options"]
    config = builder.create_builder_config()
    if options["fp16"]:
        config.set_flag(trt.BuilderFlag.FP16)
    if options["bf16"]:
        config.set_flag(trt.BuilderFlag.BF16)
    if options["tf32"] is False:
        config.clear_flag(trt.BuilderFlag.TF32)
    if options["opt_level"] is not None:
        config.builder_optimization_level = options["opt_level"]
    if options["workspace_mib"] is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options["workspace_mib"] << 20)
    profile = None
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if any(d < 0 for d in tensor.shape):
            shape = tuple(options["shapes"].get(tensor.name) or np.shape(inputs[tensor.name]))
            profile = profile or builder.create_optimization_profile()
            profile.set_shape(tensor.name, shape, shape, shape)
    if profile is not None:
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TensorRTBuildError("TensorRT could not build an engine for model.onnx:")
    return trt.Runtime(target["logger"]).deserialize_cuda_engine(serialized)


def run_target(target, inputs, output_names):
    """Build the engine, copy the inputs to the GPU, execute, copy the outputs back."""
    trt = target["trt"]
    engine = build_engine(target, inputs)
    context = engine.create_execution_context()
    malloc, copy_in, copy_out, free, synchronize = cuda_memory()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    is_input = {name: engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT for name in names}
    pointers, outputs = {}, {}
    try:
        for name in (n for n in names if is_input[n]):
            array = np.ascontiguousarray(inputs[name], dtype=trt.nptype(engine.get_tensor_dtype(name)))
            context.set_input_shape(name, array.shape)
            pointers[name] = malloc(array.nbytes)
            copy_in(pointers[name], array)
            context.set_tensor_address(name, pointers[name])
        for name in (n for n in names if not is_input[n]):
            shape = tuple(context.get_tensor_shape(name))
            outputs[name] = np.empty(shape, dtype=trt.nptype(engine.get_tensor_dtype(name)))
            pointers[name] = malloc(outputs[name].nbytes)
            context.set_tensor_address(name, pointers[name])
        context.execute_async_v3(0)
        synchronize()
        for name, array in outputs.items():
            copy_out(array, pointers[name])
    finally:
        for pointer in pointers.values():
            free(pointer)
    # TensorRT cannot return a graph input as an output: such outputs are the fed values.
    return {**{name: inputs[name] for name in output_names if name in inputs}, **outputs}

'''

_COMMAND_CODE = r'''
# --------------------------------------------------------------------- the target: an external command
class CommandFailed(RuntimeError):
    """The command exited non-zero or wrote no outputs (same class name and first line as graphbisect's)."""


def import_library(options):
    """Nothing to import for an external command (so no version): check there is a command template."""
    if options["cmd"]:
        return None
    raise CannotRun("repro_config.json has no command template (options.cmd)")


def load_target(model_path, options):
    """The command template of the spec; {model}, {inputs} and {outputs} are filled in at run."""
    return model_path, options["cmd"], options["shell"]


def run_target(target, inputs, output_names):
    """Write the inputs to an .npz, run the command (from the current directory), read its outputs .npz."""
    import shlex

    model_path, template, shell = target
    with tempfile.TemporaryDirectory(prefix="repro-command-") as tmp:
        paths = {"model": str(model_path), "inputs": os.path.join(tmp, "inputs.npz"),
                 "outputs": os.path.join(tmp, "outputs.npz")}
        save_arrays(paths["inputs"], inputs)
        if shell:
            command = template.format(**{k: shlex.quote(v) for k, v in paths.items()})
        else:
            command = [part.format(**paths) for part in shlex.split(template)]
        proc = subprocess.run(command, shell=shell, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        stderr = proc.stderr.decode("utf-8", errors="replace")
        sys.stderr.write(stderr)
        if proc.returncode != 0:
            status = (f"was killed by signal {signal.Signals(-proc.returncode).name} ({-proc.returncode})"
                      if proc.returncode < 0 else f"exited with code {proc.returncode}")
            tail = "\n".join(stderr.strip().splitlines()[-20:])[-4000:]
            raise CommandFailed(f"command {status}" + (f"\n{tail}" if tail else ""))
        if not os.path.isfile(paths["outputs"]):
            raise CommandFailed("command exited 0 but wrote no outputs file outputs.npz (the {outputs} path)")
        return load_arrays(paths["outputs"])


def save_arrays(path, arrays):
    """An .npz for any tensor names (numpy's savez rejects some, e.g. 'file')."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)

'''

_COMMON = r'''
# ---------------------------------------------------------------------------------------- files
def read_config():
    """repro_config.json: backend options, tensor names, tolerances and the recorded failure."""
    try:
        return json.loads((HERE / "repro_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CannotRun(f"cannot read repro_config.json next to this script: {exc}") from exc


def load_arrays(path, names=None):
    """The values of an .npz by name (optionally checking that ``names`` are all there). Values a plain .npy
    cannot hold are described in its member __values__.json: raw bits or values plus the ONNX element type
    (bfloat16, float8, int4..., read with ml_dtypes), strings, sequences (lists), empty optionals (None)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            described = json.loads(data["__values__.json"])["values"] if "__values__.json" in data.files else {}
            hidden = set()
            for entry in described.values():
                hidden.update(entry_files(entry))
            arrays = {name: data[name] for name in data.files
                      if name != "__values__.json" and (name in described or f"{name}.npy" not in hidden)}
            for name, entry in described.items():
                arrays[name] = decode_value(entry, lambda file: data[file[:-4]])
    except (OSError, ValueError, KeyError) as exc:
        raise CannotRun(f"cannot read {path}: {exc}") from exc
    missing = [name for name in names or () if name not in arrays]
    if missing:
        raise CannotRun(f"{Path(path).name} has no array for {', '.join(map(json.dumps, missing))}")
    return arrays


# ONNX element types numpy lacks: (ml_dtypes name, stored as raw bits (else as integer values), storage dtype)
ELEM_TYPES = {16: ("bfloat16", True, "<u2"), 17: ("float8_e4m3fn", True, "u1"), 18: ("float8_e4m3fnuz", True, "u1"),
              19: ("float8_e5m2", True, "u1"), 20: ("float8_e5m2fnuz", True, "u1"), 21: ("uint4", False, "u1"),
              22: ("int4", False, "i1"), 23: ("float4_e2m1fn", True, "u1"), 24: ("float8_e8m0fnu", True, "u1"),
              25: ("uint2", False, "u1"), 26: ("int2", False, "i1")}
STORAGE = {code: np.dtype(storage) for code, (_, _, storage) in ELEM_TYPES.items()}
ML_NAMES = {name: code for code, (name, _, _) in ELEM_TYPES.items()}
ORT_NAMES = {"BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4",
             "FLOAT4E2M1", "FLOAT8E8M0", "UINT2", "INT2"}
PACKED_BITS = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2}
ONNX_FIELDS = {"bfloat16": 16, "e4m3fn": 17, "e4m3fnuz": 18, "e5m2": 19, "e5m2fnuz": 20, "uint4": 21, "int4": 22}


def ml_dtype(code):
    try:
        import ml_dtypes
    except ImportError as exc:
        raise CannotRun(f"this bundle holds {ELEM_TYPES[code][0]} tensors, which need ml_dtypes "
                        f"({exc}); pip install ml_dtypes") from exc
    return np.dtype(getattr(ml_dtypes, ELEM_TYPES[code][0]))


def typed(raw, code):
    """The tensor whose stored form (raw bits, or integer values for int4/int2) is ``raw``."""
    if code == 8:
        return raw.astype(object)
    return raw.view(ml_dtype(code)) if ELEM_TYPES[code][1] else raw.astype(ml_dtype(code))


def encode(array):
    """The stored form of an ml_dtypes tensor (inverse of typed)."""
    code = extension_code(array)
    return array.view(STORAGE[code]) if ELEM_TYPES[code][1] else array.astype(STORAGE[code])


def extension_code(value):
    """The ONNX element type of an ml_dtypes tensor, else 0."""
    return ML_NAMES.get(value.dtype.name, 0) if isinstance(value, np.ndarray) and value.dtype.names is None else 0


def pack(stored, code):
    """4-bit (2-bit) elements packed two (four) to a byte, first element in the low bits, as ONNX holds them."""
    width = PACKED_BITS[code]
    bits = stored.reshape(-1).view(np.uint8) & ((1 << width) - 1)
    per_byte = 8 // width
    lanes = np.zeros(-(-bits.size // per_byte) * per_byte, np.uint8)
    lanes[:bits.size] = bits
    lanes = lanes.reshape(-1, per_byte)
    packed = np.zeros(lanes.shape[0], np.uint8)
    for lane in range(per_byte):
        packed |= lanes[:, lane] << np.uint8(lane * width)
    return packed


def unpack(packed, code, shape):
    """The stored form (one element per byte) of packed 4-bit (2-bit) elements."""
    width = PACKED_BITS[code]
    count = int(np.prod(shape, dtype=np.int64))
    lanes = [(packed >> np.uint8(lane * width)) & np.uint8((1 << width) - 1) for lane in range(8 // width)]
    bits = np.stack(lanes, axis=-1).reshape(-1)[:count].reshape(shape)
    if ELEM_TYPES[code][1] or STORAGE[code].kind == "u":
        return bits
    half = 1 << (width - 1)
    return ((bits.astype(np.int8) ^ half) - half).astype(np.int8)


def entry_files(entry):
    if "sequence" in entry:
        return [file for item in entry["sequence"] for file in entry_files(item)]
    if "optional" in entry:
        return [] if entry["optional"] is None else entry_files(entry["optional"])
    return [entry["file"]]


def decode_value(entry, read):
    if "sequence" in entry:
        return [decode_value(item, read) for item in entry["sequence"]]
    if "optional" in entry:
        return None if entry["optional"] is None else decode_value(entry["optional"], read)
    raw = read(entry["file"])
    return raw if entry.get("elem_type") is None else typed(raw, entry["elem_type"])


def as_value(value):
    """A backend's output as compared here: lists stay lists; onnx < 1.18's structured float8/int4 become
    ml_dtypes arrays."""
    if value is None or isinstance(value, list):
        return value if value is None else [as_value(v) for v in value]
    value = np.asarray(value)
    if value.dtype.names and value.dtype.names[0] in ONNX_FIELDS:
        code = ONNX_FIELDS[value.dtype.names[0]]
        return typed(value.view(STORAGE[code]), code)
    return value


def numeric(array):
    """A numpy-native form for arithmetic comparison: ml_dtypes floats as float32, int4/int2 as int16,
    complex as (real, imag) pairs."""
    code = extension_code(array)
    if code:
        return array.astype(np.float32 if ELEM_TYPES[code][1] else np.int16)
    if array.dtype.kind == "c":
        return np.stack([array.real, array.imag], axis=-1)
    return array


# ----------------------------------------------------------------------------------- comparison
KIND_RANK = {"ok": 0, "mismatch": 1, "nan": 2, "dtype": 3, "shape": 4, "missing": 5}
FAILURE_OF = {"ok": "none", "mismatch": "mismatch", "nan": "nan", "dtype": "structure", "shape": "structure",
              "missing": "structure"}


def compare(name, expected, actual, tolerance):
    """Compare one output with the oracle's like graphbisect: |actual - expected| <= atol + rtol * |expected|
    per element (numpy.allclose); NaN/Inf where the oracle is finite is its own kind, "nan"."""
    if isinstance(expected, list) or isinstance(actual, list) or expected is None or actual is None:
        return compare_containers(name, expected, actual, tolerance)
    result = {"name": name, "kind": "ok", "numel": int(np.size(expected))}
    if actual is MISSING:
        return dict(result, kind="missing")
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        return dict(result, kind="shape", expected_shape=list(expected.shape), actual_shape=list(actual.shape))
    if tolerance["check_dtype"] and actual.dtype != expected.dtype:
        return dict(result, kind="dtype", expected_dtype=str(expected.dtype), actual_dtype=str(actual.dtype))
    exact = expected.dtype.kind in "biu" and actual.dtype.kind in "biu"
    expected, actual = numeric(expected), numeric(actual)  # bfloat16/float8 as float32, int4 as int16
    exact = exact or (expected.dtype.kind in "biu" and actual.dtype.kind in "biu")
    if expected.dtype.kind not in "biuf" or actual.dtype.kind not in "biuf":
        return dict(result, kind="ok" if np.array_equal(expected, actual) else "mismatch")
    atol, rtol = tolerance["per_output"].get(name, (tolerance["atol"], tolerance["rtol"]))
    if exact:
        atol, rtol = 0.0, 0.0  # integers (of every width) and booleans are exact
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    e_finite, a_finite = np.isfinite(e), np.isfinite(a)
    both = e_finite & a_finite
    same_nonfinite = ~e_finite & ~a_finite & ((e == a) | (np.isnan(e) & np.isnan(a)))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(both, np.abs(a - e), 0.0)
    bad = (diff > atol + rtol * np.abs(np.where(both, e, 0.0))) | (~both & ~same_nonfinite)
    result.update(mismatches=int(bad.sum()), max_abs=float(diff.max(initial=0.0)), atol=atol, rtol=rtol,
                  nonfinite=int((~a_finite & e_finite).sum()))
    if bad.any():
        worst = np.unravel_index(int(np.argmax(np.where(bad, np.where(both, diff, np.inf), -1.0))), e.shape)
        result.update(worst_index=[int(i) for i in worst], expected_value=float(e[worst]), actual_value=float(a[worst]))
    if result["nonfinite"]:
        result["kind"] = "nan"
    elif bad.any() or cosine_too_low(e[both], a[both], tolerance["min_cosine"]):
        result["kind"] = "mismatch"
    return result


MISSING = object()


def compare_containers(name, expected, actual, tolerance):
    """Sequences item by item (the worst item speaks for the sequence); None is an empty optional."""
    if actual is MISSING:
        return {"name": name, "kind": "missing", "numel": 0}
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        results = [compare(f"{name}[{i}]", e, a, tolerance) for i, (e, a) in enumerate(zip(expected, actual))]
        worst = max(results, key=lambda r: KIND_RANK[r["kind"]], default={"kind": "ok"})
        return dict(worst, name=name if worst["kind"] == "ok" else worst["name"],
                    numel=sum(r.get("numel", 0) for r in results))
    if expected is None and actual is None:
        return {"name": name, "kind": "ok", "numel": 0}
    def shape(v):
        return "empty optional" if v is None else f"sequence of {len(v)}" if isinstance(v, list) else list(np.shape(v))
    return {"name": name, "kind": "shape", "numel": 0, "expected_shape": shape(expected), "actual_shape": shape(actual)}


def cosine_too_low(e, a, min_cosine):
    if min_cosine is None:
        return False
    ne, na = float(np.dot(e, e)), float(np.dot(a, a))
    cosine = 1.0 if ne == na == 0.0 else (0.0 if ne == 0.0 or na == 0.0 else float(np.dot(e, a)) / (ne * na) ** 0.5)
    return cosine < min_cosine


def failure_kind(results):
    """The failure kind of a run, from its worst output (structure > nan > mismatch, like graphbisect)."""
    worst = max(results, key=lambda r: KIND_RANK[r["kind"]], default={"kind": "ok"})
    return FAILURE_OF[worst["kind"]]


# ------------------------------------------------------------------------------------------ run
def attempt(config, status_file=None):
    """Run the target once on model.onnx and compare with the oracle. Returns an outcome dict; with
    ``status_file`` it is also written there after each step, so a parent sees how far a dying child got."""
    outcome = {"phase": "setup"}

    def note(**changes):
        outcome.update(changes)
        if status_file is not None:
            Path(status_file).write_text(json.dumps(outcome), encoding="utf-8")
        return outcome

    for name in ("model.onnx", "inputs.npz", "oracle_outputs.npz"):
        if not (HERE / name).is_file():
            raise CannotRun(f"{name} is missing next to this script")
    note(library_version=import_library(config["options"]))
    inputs = load_arrays(HERE / "inputs.npz", config["inputs"])
    expected = load_arrays(HERE / "oracle_outputs.npz", config["outputs"])
    note(phase="load")
    try:
        target = load_target(HERE / "model.onnx", config["options"])
    except Exception as exc:  # the backend refused the model: possibly the recorded bug
        return note(kind="crash-load", error_type=type(exc).__name__, message=str(exc))
    note(phase="run")
    try:
        actual = run_target(target, inputs, config["outputs"])
    except Exception as exc:
        return note(kind="crash-run", error_type=type(exc).__name__, message=str(exc))
    results = [compare(name, expected[name], actual.get(name, MISSING), config["tolerance"])
               for name in config["outputs"]]
    return note(kind=failure_kind(results), outputs=results)


def attempt_in_child(config, control=False):
    """Run attempt() in a child process, so a segfault, an abort or a hang of the backend is observed (and
    compared with the recorded failure) instead of taking this script down."""
    with tempfile.TemporaryDirectory(prefix="repro-") as tmp:
        status_file = Path(tmp) / "status.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--child", str(status_file)]
        command += ["--control"] if control else []
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        try:
            log, _ = child.communicate(timeout=config["timeout_seconds"])
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(child)
            log, _ = child.communicate()
            timed_out = True
        outcome = json.loads(status_file.read_text(encoding="utf-8")) if status_file.is_file() else {}
    outcome["log"] = log.decode("utf-8", errors="replace")
    if outcome.get("kind") == "cannot-run":
        raise CannotRun(outcome["message"])
    if timed_out:
        outcome.update(kind="timeout", message=f"no result within {config['timeout_seconds']:g} s")
    elif "kind" not in outcome and outcome.get("phase", "setup") == "setup":
        raise CannotRun(f"the child process failed before the backend ran:\n{outcome['log'][-3000:]}")
    elif "kind" not in outcome:  # the process died inside the backend
        phase = outcome.get("phase", "load")
        outcome.update(kind=f"crash-{'run' if phase == 'run' else 'load'}", exit_code=child.returncode,
                       error_type=exit_name(child.returncode), message=f"the process {exit_text(child.returncode)}")
    return outcome


def kill_group(child):
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (AttributeError, OSError):
        child.kill()


def exit_name(code):
    try:
        return signal.Signals(-code).name if code < 0 else "exit"
    except ValueError:
        return "exit"


def exit_text(code):
    return f"was killed by signal {exit_name(code)} ({-code})" if code < 0 else f"exited with code {code}"


# --------------------------------------------------------------------------------------- verdict
VOLATILE = [  # the stable part of a crash message; the same list as graphbisect.artifacts.repro.crash_key
    (r"0x[0-9a-fA-F]+", "0x?"),  # addresses
    (r"(?:[A-Za-z]:)?(?:[\w.\-]*/)+([\w.\-]+)", r"\1"),  # paths -> basename
    (r"\b\d{5,}\b", "N"),  # pids, sizes, timestamps
    (r"tmp[\w\-]{6,}", "tmp?"),  # temporary names
    (r"(\.(?:cc|cpp|cxx|cu|c|hpp|h|py)):\d+", r"\1"),  # source line numbers move between builds
    (r"[\w.\-]+\.onnx\b", "model.onnx"),  # candidate_17.onnx during the reduction, model.onnx here
    (r"\s+", " "),
]


MODEL_DUMP = r"^[ \t]*(?:ir_version|opset_import|producer_name|graph)[ \t]*[:{]"  # a ModelProto in the text
QUOTED = r"(?:'[^'\n]*'|\"[^\"\n]*\")"
NAME_LIST = rf"[\[{{(]\s*{QUOTED}(?:\s*[,:]\s*{QUOTED})*\s*,?\s*[\]}})]"  # lists of tensor names


def message_cause(message, limit=4000):
    """What failed: the first paragraph, model dumps cut, name lists collapsed (graphbisect's message_cause)."""
    text = (message or "").strip()
    dump = re.search(MODEL_DUMP, text, re.MULTILINE)
    if dump is not None:
        text = text[: dump.start()]
    text = re.sub(NAME_LIST, "[...]", text)
    paragraph = re.split(r"\n[ \t]*\n", text.strip(), maxsplit=1)[0]
    joined = "\n".join(line.rstrip() for line in paragraph.splitlines() if line.strip())
    return joined if len(joined) <= limit else joined[:limit].rstrip() + " ..."


def crash_key(message):
    """The stable part of a crash message: its cause without addresses, paths, line numbers..."""
    text = message_cause(message)
    for pattern, replacement in VOLATILE:
        text = re.sub(pattern, replacement, text)
    return text.strip()


def is_recorded_failure(expect, outcome):
    """Whether this run failed the way graphbisect recorded (same kind; same crash message or exit status)."""
    if expect["kind"] == "regex":
        text = "\n".join(str(outcome.get(key) or "") for key in ("error_type", "message", "log"))
        return re.search(expect["regex"], text) is not None
    if outcome["kind"] != expect["kind"]:
        return False
    if expect.get("exit_code") is not None:
        return outcome.get("exit_code") == expect["exit_code"]
    if expect.get("message_key") is not None:
        actual = crash_key(f"{outcome.get('error_type')}: {outcome.get('message')}")
        return expect["message_key"] in actual
    return True


def describe(result):
    """One line about one compared output."""
    name, kind = json.dumps(result["name"]), result["kind"]
    if kind == "ok":
        return f"  ok        {name}"
    if kind in ("shape", "dtype"):
        return f"  {kind.upper():<9} {name}: expected {result['expected_' + kind]}, got {result['actual_' + kind]}"
    if kind == "missing":
        return f"  MISSING   {name}: the target did not produce it"
    line = f"  {kind.upper():<9} {name}: {result.get('mismatches', '?')} of {result['numel']} elements beyond tolerance"
    if "worst_index" in result:
        line += (f" (atol {result['atol']:g}, rtol {result['rtol']:g}); max abs error {result['max_abs']:.4g}; "
                 f"at index {result['worst_index']}: expected {result['expected_value']:.6g}, "
                 f"got {result['actual_value']:.6g}")
    return line


def print_outcome(config, outcome):
    """What ran, what was recorded and what happened now."""
    version = outcome.get("library_version")
    recorded = config.get("recorded_library_version")
    print(f"target    {config['target_spec']}" + (f"  ({config['library']} {version})" if version else ""))
    if recorded and version and not str(version).startswith(str(recorded)):
        print(f"          (the failure was recorded with {config['library']} {recorded})")
    if config.get("python"):
        print(f"          graphbisect ran this backend under {config['python']}: run this script with it")
    expect = config["expect"]
    print(f"recorded  {expect['kind']}: {expect.get('message') or expect.get('detail') or ''}".rstrip(": \n"))
    observed = outcome["kind"]
    if outcome.get("message"):
        observed += f": {outcome.get('error_type') or 'error'}: {outcome['message']}"
    print(f"observed  {observed.rstrip()}")
    for result in outcome.get("outputs", []):
        print(describe(result))


def verdict(config, outcome):
    """Print what happened and return the exit status."""
    print_outcome(config, outcome)
    expect = config["expect"]
    if is_recorded_failure(expect, outcome):
        print(f"\nREPRODUCED: {config['target_spec']} still fails the recorded way ({expect['kind']}).")
        return REPRODUCES
    if outcome["kind"] == "none" or expect["kind"] == "regex":
        print(f"\nFIXED: {config['target_spec']} no longer fails the recorded way "
              f"({'outputs match the oracle' if outcome['kind'] == 'none' else 'regex does not match'}).")
        return FIXED
    print(f"\n*** A DIFFERENT FAILURE: recorded {expect['kind']}, now {outcome['kind']}. The recorded bug may be "
          "fixed while another one shows; see the lines above. ***")
    return REPRODUCES


def main(argv=None):
    parser = argparse.ArgumentParser(description="Reproduce the failure recorded next to this script.")
    parser.add_argument("--in-process", action="store_true", help="run the backend in this process")
    parser.add_argument("--child", metavar="STATUS_JSON", help=argparse.SUPPRESS)
    parser.add_argument("--control", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        config = read_config()
        if args.child:
            return run_as_child(control_config(config) if args.control else config, Path(args.child))
        outcome = attempt(config) if args.in_process else attempt_in_child(config)
    except CannotRun as exc:
        print(f"repro.py cannot run: {exc}", file=sys.stderr)
        return CANNOT_RUN
    if not args.in_process and outcome.get("log", "").strip():
        print("--- backend output ---\n" + outcome["log"].rstrip() + "\n----------------------")
    code = verdict(config, outcome)
    if config.get("control"):
        report_control(config, args.in_process)
    return code


# -------------------------------------------------------------------------------------- control
def control_config(config):
    """The same case run with the control spec: the culprit optimization passes disabled too."""
    control = config["control"]
    return dict(config, target_spec=control["target_spec"], options=control["options"])


def report_control(config, in_process):
    """Run the control (culprit passes disabled) and say whether it passes; the exit status is unchanged."""
    control = control_config(config)
    print(f"\ncontrol   {control['target_spec']}")
    print(f"          ({config['control'].get('purpose', 'the culprit passes disabled')})")
    try:
        outcome = attempt(control) if in_process else attempt_in_child(control, control=True)
    except CannotRun as exc:
        print(f"CONTROL cannot run: {exc}")
        return
    for result in outcome.get("outputs", []):
        print(describe(result))
    if outcome["kind"] == "none":
        print("CONTROL PASSES: with the culprit passes disabled the outputs match the oracle.")
    else:
        print(f"CONTROL FAILS ({outcome['kind']}): disabling the culprit passes does not remove the failure here.")


def run_as_child(config, status_file):
    try:
        attempt(config, status_file)
    except CannotRun as exc:
        status_file.write_text(json.dumps({"kind": "cannot-run", "message": str(exc)}), encoding="utf-8")
        return CANNOT_RUN
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

_NO_STANDALONE = r'''#!/usr/bin/env python3
"""This bundle's target backend has no standalone reproduction script: replay it with graphbisect.

    graphbisect verify DIR     # exit 1: the failure reproduces, 0: fixed, 2: cannot run

DIR is the folder of this script. model.onnx, inputs.npz, oracle_outputs.npz and repro_config.json beside it
hold the case; this script only says so and exits 2 (nothing was tested).
"""

import json
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CANNOT_RUN = 2


def main():
    try:
        config = json.loads((HERE / "repro_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    print(f"repro.py cannot replay {config.get('target_spec', 'this target')} standalone: there is no standalone "
          f"script for the {config.get('backend', 'target')!r} backend. Replay the bundle through graphbisect's "
          f"isolated backends:\n\n    graphbisect verify {shlex.quote(str(HERE))}\n", file=sys.stderr)
    return CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main())
'''


REPRO_BACKENDS: Mapping[str, _ReproBackend] = {
    "onnxruntime": _ReproBackend("onnxruntime", "onnxruntime", "onnxruntime", _ort_options, _ORT_CODE),
    "reference": _ReproBackend("reference", "onnx (onnx.reference)", "onnx", _no_options, _REFERENCE_CODE),
    "openvino": _ReproBackend("openvino", "openvino (and onnx, for tactics.json)", "openvino", _openvino_options,
                              _OPENVINO_CODE),
    "onnxoptimizer": _ReproBackend("onnxoptimizer", "onnx, onnxoptimizer and onnxruntime", "onnxoptimizer",
                                   _onnxoptimizer_options, _ONNXOPTIMIZER_CODE),
    "tensorrt": _ReproBackend("tensorrt", "tensorrt and cuda-python (or torch) on an NVIDIA GPU", "tensorrt",
                              _tensorrt_options, _TENSORRT_CODE),
    "command": _ReproBackend("command", "the command of the spec (no Python library)", None, _command_options,
                             _COMMAND_CODE),
    # The section is graphbisect's own pipeline (backends/iree.py), embedded verbatim.
    "iree": _ReproBackend("iree", "iree-base-compiler, iree-base-runtime and onnx (the ONNX importer needs it)",
                          "iree-base-compiler", _iree_options, repro_section()),
}
