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
  of its own kind) and prints what it saw. A mismatch reproduces only in its recorded **value class** (float
  values beyond tolerance, or integer/boolean values that differ; either for a failure rooted in integers), as
  :meth:`~graphbisect.oracle.signature.Signature.matches` rules; the script words the classes as the signature
  does (a test keeps them equal).
* **The backend runs in a child process** (the script re-executes itself with ``--child``), so a segfault,
  an abort or a hang is observed and matched against the recorded failure like graphbisect's isolated
  workers do. ``--in-process`` skips that, for a debugger.
* **Exit status:** 1 while the recorded failure reproduces (a different failure also exits 1, with a loud
  note), 0 once fixed, 2 when the script itself cannot run (missing library or file).
* **Kernel pins travel with the bundle.** An ``openvino:tactics=REC.json`` target's record, restricted to
  the bundle model's nodes, is written as ``tactics.json`` (:func:`tactic_files`) and the script's OpenVINO
  section replays it the way :mod:`graphbisect.backends.openvino` does (record the unpinned build, pin the
  choices that differ as ``primitives_priority`` in the IR XML, compile the pinned IR).
* **Each backend's section has one module** in :mod:`graphbisect.artifacts.repro_backends` (its script text,
  its options function, its ``BACKEND`` record); this module holds the common text and renders it.
* **A backend without a section** (a future one) still gets a bundle: its ``repro.py`` explains that it
  cannot replay that backend standalone and points to ``graphbisect verify DIR`` (exit 2).
* **A bundle is data** (the trust rule, :mod:`graphbisect.backends.inert`): the script carries its backend's
  rules (:attr:`ReproBackend.inert`) and the source of
  :func:`~graphbisect.backends.inert.untrusted_values`, and refuses (exit 2) a ``repro_config.json`` that
  sets anything not known to be inert — a program to run, a session config key or compiler flag that names a
  file — unless it is run with ``--trust``.

Crash messages are matched on their stable part, :func:`crash_key`: the cause (first paragraph, name
lists collapsed, model dumps cut) without addresses,
paths, long numbers, temporary names and source line numbers, so a rebuilt library that moved the
``throw`` by three lines still counts as the same bug, and without the names the backend chose
(:mod:`graphbisect.oracle.names`, embedded verbatim; the model's names in the recorded message are the
config's ``expect.names``). The script carries an identical copy of that function (a test pins the two
together).

Example:
    >>> config = repro_config(content)           # doctest: +SKIP
    >>> script = render_repro(content)           # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import json
import logging
import pprint
import re
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from graphbisect.artifacts.repro_backends import REPRO_BACKENDS, TACTICS_FILE, ReproBackend
from graphbisect.artifacts.repro_backends._common import _raw_options, embedded_source
from graphbisect.backends import BackendSpec, get
from graphbisect.backends.command import check_mode
from graphbisect.backends.inert import untrusted_values
from graphbisect.backends.registry import HOST_OPTIONS, custom_origin, how_to_register
from graphbisect.errors import SpecError
from graphbisect.oracle import names
from graphbisect.oracle.floor import FLOOR_CAP
from graphbisect.oracle.outcome import UNSUPPORTED_PATTERN
from graphbisect.oracle.signature import (
    CHECK_REJECTED,
    FailureKind,
    ModelNames,
    Signature,
    names_in,
    normalize_message,
)
from graphbisect.storage import npzguard
from graphbisect.storage.npzguard import model_declared
from graphbisect.storage.values import declared_dtypes
from graphbisect.text import printable

if TYPE_CHECKING:
    from graphbisect.artifacts.content import BundleContent

__all__ = [
    "CONFIG_FORMAT",
    "CONTROL_TACTICS_FILE",
    "JUDGE_EXIT_STATUS",
    "JUDGE_PYTHON_CHECK",
    "JUDGE_TOLERANCE",
    "REPRO_BACKENDS",
    "TACTICS_FILE",
    "crash_key",
    "death_exit_code",
    "expected_failure",
    "has_standalone_repro",
    "judged_by",
    "render_repro",
    "repro_config",
    "repro_options",
    "tactic_files",
]

logger = logging.getLogger(__name__)

CONFIG_FORMAT = "graphbisect-repro"
CONFIG_VERSION = 1
DEFAULT_TIMEOUT_SECONDS = 600.0
#: The bundle files holding the target's (``TACTICS_FILE``, defined with the backend sections) and the
#: control's tactic record, restricted to the bundle model.
CONTROL_TACTICS_FILE = "control_tactics.json"
_TACTICS_BACKENDS = frozenset({"openvino"})  # backends whose repro section replays ``tactics=``

#: The stable part of a crash message (one definition, in the signature module).
crash_key = normalize_message

#: What judged a completed run during the reduction, so what ``repro.py`` and ``graphbisect verify`` must judge
#: it by (``judge`` in repro_config.json): the tolerance; a Python output check (``reduce(check=callable)``),
#: which no bundle holds, so a completed run gets no verdict; or an external check's exit status (a
#: ``command`` target without ``{outputs}``: exit 0 is no failure, nothing is compared).
JUDGE_TOLERANCE, JUDGE_PYTHON_CHECK, JUDGE_EXIT_STATUS = "tolerance", "python-check", "exit-status"


def judged_by(signature: Signature, target: BackendSpec) -> str:
    """What judges a completed run of ``target`` for a bundle recorded with ``signature`` (see JUDGE_*).

    Example:
        >>> judged_by(Signature(FailureKind.MISMATCH, CHECK_REJECTED), BackendSpec.parse("ort"))
        'python-check'
        >>> judged_by(Signature(FailureKind.CRASH_RUN, "CommandFailed: command exited with code 1"),
        ...           BackendSpec("command", {"cmd": "python check.py {model} {inputs}"}))
        'exit-status'
    """
    if get(target.name).name == "command" and check_mode(target.options.get("cmd", "")):
        return JUDGE_EXIT_STATUS
    if signature.kind is FailureKind.MISMATCH and signature.detail == CHECK_REJECTED:
        return JUDGE_PYTHON_CHECK
    return JUDGE_TOLERANCE


# ------------------------------------------------------------------------------------- configuration
def _runtime_options(spec: BackendSpec) -> dict[str, str]:
    return {k: v for k, v in spec.options.items() if k not in HOST_OPTIONS}


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


def expected_failure(signature: Signature, target_message: str | None = None,
                     names: Collection[str] = ()) -> dict[str, Any]:
    """What ``repro.py`` must observe to call the failure reproduced (the ``expect`` of its config).

    ``names``: the bundle model's node and tensor names (:class:`~graphbisect.oracle.signature.ModelNames`);
    those in the recorded message go to the config as ``names``, which the script takes out of the message it
    observes, as ``graphbisect verify`` does.

    Example:
        >>> sig = Signature(FailureKind.CRASH_RUN, "SIGSEGV: the worker process was killed by signal SIGSEGV (11)")
        >>> expected_failure(sig)["exit_code"]
        -11
    """
    expect: dict[str, Any] = {"kind": signature.kind.value, "detail": signature.detail, "band": signature.band}
    if signature.kind.raised:
        error_type, _, message = signature.detail.partition(": ")
        exit_code = death_exit_code(signature.detail, error_type, message)
        expect["error_type"] = None if signature.detail.startswith("exit ") else error_type
        expect["exit_code"] = exit_code
        if exit_code is None:
            # The raw message keeps what the signature's 300-character normalized one may have cut.
            expect["names"] = names_in(target_message or signature.detail, names)
            expect["message_key"] = crash_key(target_message or signature.detail, names)
        if target_message:
            expect["message"] = target_message
    elif signature.kind is FailureKind.REGEX:
        expect["regex"] = signature.detail
    return expect


def death_exit_code(detail: str, error_type: str, message: str) -> int | None:
    """The exit status of a worker that died inside the backend (signal → negative); None for an exception.

    The worker host (:mod:`graphbisect.backends.process`) records such deaths as ``SIGSEGV: the worker process
    was killed by signal SIGSEGV (11) during run`` or ``WorkerExit: ... exited with code 3 ...``, and a crash
    without a message as ``exit <code>``; a ``command`` backend's program as ``CommandFailed: command exited
    with code 1`` (its status is its verdict: matched as a number, "code 1" is not a prefix of "code 13").
    """
    bare = re.fullmatch(r"exit (-?\d+)", detail)
    if bare:
        return int(bare.group(1))
    if error_type not in ("WorkerExit", "CommandFailed") and not error_type.startswith("SIG"):
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
    # the library whose release is reported: the backend's, or the one a command's package= names
    package = spec.options.get("package", "").strip() if backend.name == "command" else ""  # cmd: too
    library = backend.library or package or None
    tol = content.tolerance
    timeout = spec.options.get("timeout")
    expect = expected_failure(content.signature, content.target_message, ModelNames(content.model))
    return {
        "format": CONFIG_FORMAT,
        "version": CONFIG_VERSION,
        "backend": backend.name,
        "library": library,
        "target_spec": str(spec),
        "oracle_spec": str(content.oracle),
        "python": spec.options.get("python"),
        "recorded_library_version": _recorded_version(content.report, library),
        "options": backend.options(_runtime_options(spec)),
        "timeout_seconds": float(timeout) if timeout else DEFAULT_TIMEOUT_SECONDS,
        "inputs": list(content.inputs),
        "outputs": list(content.oracle_outputs),
        # the dims model.onnx declares (null where dynamic): the .npz members are held to them before reading
        "declared": {**{role: {name: None if dims is None else list(dims) for name, dims in declared.items()}
                        for role, declared in zip(("inputs", "outputs"), model_declared(content.model), strict=True)},
                     # and the dtype each input's value must have (npzguard.type_problem)
                     "types": declared_dtypes(content.model)},
        "tolerance": {
            "atol": tol.atol,
            "rtol": tol.rtol,
            "min_cosine": tol.min_cosine,
            "per_output": {name: list(pair) for name, pair in tol.per_output.items()},
            "check_dtype": tol.check_dtype,
            # quantized outputs compare in quantization steps (graphbisect.compare.quantization)
            "int_atol": tol.int_atol,
            "quantized": {name: step for name, step in tol.quantized.items() if name in content.oracle_outputs},
        },
        "expect": expect,
        # what the recorded failure is beyond its kind (graphbisect.oracle.identity) and the target's noise floor
        # (graphbisect.oracle.floor): a run is judged on them as graphbisect verify judges it
        "identity": _identity_config(content.report),
        "noise_floor": _floor_config(content.report),
        "original_nodes": content.report.get("original_nodes"),
        "kept_nodes": [n.get("name") for n in content.report.get("kept_nodes", []) if isinstance(n, Mapping)],
        "judge": judged_by(content.signature, spec),
        # what a refusal says (graphbisect's rule): an error matching it is "unsupported", not a crash
        "unsupported_pattern": UNSUPPORTED_PATTERN,
        "standalone": backend.code is not None,
        # a custom backend: how it was registered, so that another process can register it again (how_to_register)
        **({"custom_backend": origin} if (origin := custom_origin(spec.name)) is not None else {}),
        **({"control": _control_config(content.control)} if content.control is not None else {}),
    }


def _identity_config(report: Mapping[str, Any]) -> dict[str, Any] | None:
    record = report.get("identity")
    if not isinstance(record, Mapping) or record.get("matched_by") != "identity":
        return None
    keys = ("describe", "tensor", "band", "region", "compiled_kind", "made_by", "after")
    return {key: record.get(key) for key in keys}


def _floor_config(report: Mapping[str, Any]) -> dict[str, Any] | None:
    floor = report.get("noise_floor")
    if not isinstance(floor, Mapping) or not floor.get("measured"):
        return None
    return {"spec": floor.get("spec"), "margin": floor.get("margin"), "cap": FLOOR_CAP,
            "scores": dict(floor.get("scores", {}))}


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
    if backend.code is None:  # said once per bundle, here: the other callers only read the section's facts
        logger.warning("repro.py has no section for backend %r: the bundle's repro.py points to "
                       "`graphbisect verify` (sections exist for %s)", backend.name, ", ".join(sorted(REPRO_BACKENDS)))
        return _NO_STANDALONE.replace("@HOW_TO_REGISTER@", inspect.getsource(how_to_register).rstrip())
    return "".join((_HEADER.replace("@LIBRARY@", backend.label), _COMMON_IMPORTS, backend.source() or "",
                    _trust_section(backend), _option_fields(backend), _COMMON))


def _option_fields(backend: ReproBackend) -> str:
    """``OPTION_FIELDS``: the kinds of the settings the backend's section reads, as its defaults have them (a
    setting whose default is null may be anything: its kind depends on the spec). Constant per backend."""
    def shape(value: Any) -> Any:
        if isinstance(value, dict):
            return {f"{key}?" if item is None else key: shape(item) for key, item in value.items()}
        return {list: "list", bool: "boolean", int: "number", float: "number", str: "string"}.get(type(value), "any")

    return f"# the kinds of this backend's settings (repro_config.json options): check_config\n" \
           f"OPTION_FIELDS = {pprint.pformat(shape(backend.options({})), width=110)}\n\n\n"


def _trust_section(backend: ReproBackend) -> str:
    """The script's trust rule: its backend's rules and graphbisect's own function applying them (constant
    per backend, like the rest of the script)."""
    rules = json.loads(json.dumps(backend.inert))  # plain dicts, lists and strings: a Python literal too
    return "".join((_TRUST_HEAD, f"INERT_OPTIONS = {pprint.pformat(rules, width=110)}\n",
                    f"BUNDLE_FILES = {(TACTICS_FILE, CONTROL_TACTICS_FILE)!r}\n\n\n",
                    inspect.getsource(untrusted_values), _TRUST_TAIL))


# ----------------------------------------------------------------------------------- per backend
# Each backend's section, options and ReproBackend value live in graphbisect/artifacts/repro_backends/.
def _backend(spec: BackendSpec) -> ReproBackend:
    info = get(spec.name)
    if info.name == "paddle":
        raise SpecError(
            "no repro.py for a paddle target: Paddle Inference runs only whole Paddle models, while a bundle holds "
            "a reduced ONNX model",
            hint="bundles are written for ONNX targets (onnxruntime, openvino, tensorrt, reference, command); "
            "compare the converted ONNX model on one of them to reduce a Paddle conversion bug",
        )
    backend = REPRO_BACKENDS.get(info.name)
    if backend is None:  # still a bundle: repro.py says to replay it with `graphbisect verify` (render_repro warns)
        return ReproBackend(info.name, "graphbisect", info.import_name, _raw_options, None)
    return backend


# Everything below is the text of repro.py: a header, the imports, one backend section, the common part.
# The templates contain no placeholders except @LIBRARY@ in the header (a constant per backend).
_HEADER = r'''#!/usr/bin/env python3
"""Reproduce a failure that graphbisect reduced to model.onnx.

    python repro.py                # exit 1: the failure reproduces, 0: fixed, 2: this script cannot run or judge
    python repro.py --in-process   # run the backend in this process (for a debugger: gdb --args python ...)
    python repro.py --trust        # run although repro_config.json sets options that can run a program,
                                   # load a library or write a file (read it first: it came with the bundle)

Needs numpy and @LIBRARY@.

Everything it reads lies next to it: model.onnx (the reduced model), inputs.npz (a value for every graph
input), oracle_outputs.npz (the expected outputs, computed by the trusted oracle backend) and
repro_config.json (the backend options, tolerances and the recorded failure).
This script is the same for every bundle of this backend; all case-specific data is in repro_config.json.
"""

'''

_COMMON_IMPORTS = r'''from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import traceback
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

_TRUST_HEAD = r'''
# ---------------------------------------------------------------------------------------- trust
# A bundle is data: repro_config.json was written by whoever sent it. Its options run only when each one is
# known to be inert (it cannot run a program, load a library or write a file): INERT_OPTIONS is graphbisect's
# allow-list for this backend, untrusted_values its own rule. Anything else needs --trust.
'''

_TRUST_TAIL = r'''

def refuse_untrusted(config):
    """Raise CannotRun naming every option of repro_config.json (the target's and the control's) that is not
    known to be inert."""
    found = untrusted_values(INERT_OPTIONS, config.get("options"), BUNDLE_FILES)
    if config.get("control") is not None:
        control = config["control"].get("options") if isinstance(config["control"], dict) else None
        found += [(f"control {option}", value, why)
                  for option, value, why in untrusted_values(INERT_OPTIONS, control, BUNDLE_FILES)]
    if found:
        lines = "\n".join(f"  {option}={value}: {why}" for option, value, why in found)
        raise CannotRun(f"repro_config.json sets options not known to be inert, chosen by whoever wrote this "
                        f"bundle:\n{lines}\nRead repro_config.json; to run it anyway: python repro.py --trust")
'''

_COMMON = r'''
# ---------------------------------------------------------------------------------------- files
def read_config():
    """repro_config.json: backend options, tensor names, tolerances and the recorded failure."""
    try:
        config = json.loads((HERE / "repro_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise CannotRun(f"cannot read repro_config.json next to this script: {type(exc).__name__}: {exc}") from exc
    check_config(config)
    return config


# What this script reads from repro_config.json, with the JSON kind of each field, nested fields too, and
# graphbisect's bound on any duration: a config of another shape cannot run (exit 2). A timeout_seconds of 1e308
# or "abc" ended in a traceback, exit 1, which reads "the failure reproduces" (issue 36 item 7); so did options
# without providers, a string for tolerance.per_output or identity, -Infinity for unsupported_pattern (the bundle
# fuzzer). A field ending in "?" may be missing or null; {"*": kind}: every value of an object; [kind]: every
# item of a list; [kind, kind]: a list of exactly those; "regex": a string Python's re reads; "any": anything;
# "score": a number, or "inf"/"nan" (how graphbisect writes a score JSON has no number for: a floor of inf).
# OPTION_FIELDS (above) are this backend's settings, as graphbisect writes them by default.
CONFIG_FIELDS = {
    "target_spec": "string", "options": OPTION_FIELDS, "inputs": ["string"], "outputs": ["string"],
    "tolerance": {"atol": "number", "rtol": "number", "min_cosine?": "number", "check_dtype": "any",
                  "per_output": {"*": ["number", "number"]}, "int_atol?": "number", "quantized?": {"*": "number"}},
    "expect": {"kind": "string", "regex?": "regex", "message_key?": "string", "names?": ["string"]},
    "identity?": {"describe": "any", "tensor": "any", "band?": "number", "compiled_kind?": "string",
                  "made_by?": "string", "after": ["string"]},
    "noise_floor?": {"scores": {"*": "score"}, "margin": "number", "cap?": "number"},
    "unsupported_pattern?": "regex", "kept_nodes?": "list", "library?": "string", "python?": "string",
    "control?": {"target_spec": "string", "options": OPTION_FIELDS},
}
JSON_KINDS = {str: "string", dict: "object", list: "list", int: "number", float: "number", bool: "boolean"}
MAX_SECONDS = 1e7


def kind_text(schema):
    """What ``schema`` (a CONFIG_FIELDS entry) asks for, in words."""
    if isinstance(schema, dict):
        return "a JSON object"
    if isinstance(schema, list):
        return "a JSON list" if len(schema) == 1 else f"a JSON list of {len(schema)} {schema[0]}s"
    return {"regex": "a regular expression (a JSON string)", "any": "set",
            "score": 'a JSON number, "inf" or "nan"'}.get(schema, f"a JSON {schema}")


def field_problem(value, schema, path):
    """(field, what it must be, what it is) of the first field under ``path`` that is not what ``schema`` asks
    for, or None."""
    found = "missing" if value is None else f"a JSON {JSON_KINDS.get(type(value), type(value).__name__)}"
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return path, kind_text(schema), found
        for key, inner in schema.items():
            name = key.rstrip("?")
            if name == "*":
                items = [(f"{path}[{json.dumps(k)[:60]}]", v) for k, v in value.items()]
            elif value.get(name) is None and key.endswith("?"):
                continue
            else:
                items = [(f"{path}.{name}" if path else name, value.get(name))]
            for where, item in items:
                problem = field_problem(item, inner, where)
                if problem is not None:
                    return problem
        return None
    if isinstance(schema, list):
        if not isinstance(value, list) or len(schema) > 1 and len(value) != len(schema):
            return path, kind_text(schema), found if not isinstance(value, list) else f"a list of {len(value)}"
        for index, item in enumerate(value):
            problem = field_problem(item, schema[0] if len(schema) == 1 else schema[index], f"{path}[{index}]")
            if problem is not None:
                return problem
        return None
    if schema == "any":
        return None if value is not None else (path, kind_text(schema), found)
    if schema == "regex":
        if not isinstance(value, str):
            return path, kind_text(schema), found
        try:
            re.compile(value)
        except (re.error, RecursionError, OverflowError) as exc:
            return path, kind_text(schema), f"one Python's re refuses ({exc})"
        return None
    if schema == "score" and value in ("inf", "-inf", "nan"):
        return None
    wanted = {"string": str, "number": (int, float), "score": (int, float), "boolean": bool, "list": list}[schema]
    if not isinstance(value, wanted) or isinstance(value, bool) and schema != "boolean":
        return path, kind_text(schema), found
    return None


def check_config(config):
    """Raise CannotRun naming the first field of repro_config.json this script could not use."""
    if not isinstance(config, dict):
        raise CannotRun("repro_config.json holds no JSON object: the bundle is damaged (copy it again)")
    problem = field_problem(config, CONFIG_FIELDS, "")
    if problem is not None:
        field, wanted, found = problem
        raise CannotRun(f"repro_config.json: {field} must be {wanted}, not {found}: the bundle is damaged (copy it "
                        "again, or re-create it with graphbisect reduce)")
    if config["expect"]["kind"] == "regex" and not isinstance(config["expect"].get("regex"), str):
        raise CannotRun("repro_config.json: expect.regex must be a regular expression (a JSON string), not "
                        f"{json.dumps(config['expect'].get('regex'))[:80]}: the bundle is damaged (copy it again, or "
                        "re-create it with graphbisect reduce)")
    timeout = config.get("timeout_seconds")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_SECONDS:
        raise CannotRun(f"repro_config.json: timeout_seconds must be a number of seconds > 0 and <= {MAX_SECONDS:.0e} "
                        f"(it is {json.dumps(timeout)[:80]}): set it, e.g. 600")


def load_arrays(path, names=None, declared=None):
    """The values of an .npz by name (optionally checking that ``names`` are all there). Values a plain .npy
    cannot hold are described in its member __values__.json: raw bits or values plus the ONNX element type
    (bfloat16, float8, int4..., read with ml_dtypes), strings, sequences (lists), empty optionals (None).
    Before anything is decompressed, its members are held to the dims the model ``declared`` and to the memory
    available (npz_refusal, graphbisect's own rule): a 2 MB file may decompress to gigabytes."""
    try:
        refusal = npz_refusal(path, declared)
    except OSError as exc:
        raise CannotRun(f"cannot read {path}: {exc}") from exc
    if refusal is not None:
        raise CannotRun(f"{Path(path).name}: {refusal} (refused before decompressing it). This bundle is unsafe: "
                        "graphbisect writes the values of the shapes its model declares; ask its sender for it again")
    try:
        with np.load(path, allow_pickle=False) as data:
            for info in data.zip.infolist():  # encrypted, another method: npzguard's rule, said before reading
                problem = member_unreadable(info)
                if problem is not None:
                    raise CannotRun(f"cannot read {path}: {problem} (the bundle is damaged: copy it again)")
            described = json.loads(data["__values__.json"])["values"] if "__values__.json" in data.files else {}
            if not isinstance(described, dict) or not all(isinstance(e, dict) for e in described.values()):
                raise CannotRun(f"cannot read {path}: member '__values__.json' is not graphbisect's manifest (the "
                                "bundle is damaged: copy it again)")
            hidden = set()
            for entry in described.values():
                hidden.update(entry_files(entry))
            arrays = {name: data[name] for name in data.files
                      if name != "__values__.json" and (name in described or f"{name}.npy" not in hidden)}
            for name, entry in described.items():
                arrays[name] = decode_value(entry, lambda file: data[file[:-4]])
    # __values__.json of another shape (a list, entries that are strings, nested 100,000 deep) is a damaged file
    # too: a RecursionError from it ended in the child's traceback, and so did a member's wrong CRC (BadZipFile:
    # MEMBER_ERRORS, npzguard's list; the bundle fuzzer, issue 36)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) + MEMBER_ERRORS \
            as exc:
        raise CannotRun(f"cannot read {path}: {type(exc).__name__}: {str(exc)[:300]} (the bundle is damaged: "
                        "copy it again)") from exc
    missing = [name for name in names or () if name not in arrays]
    if missing:
        raise CannotRun(f"{Path(path).name} has no array for {', '.join(map(json.dumps, missing))}")
    return arrays


def declared_dims(config, role):
    """{name: dims (None where dynamic) or None} that repro_config.json records for model.onnx's ``role``
    ("inputs", "outputs"); None when it records none (a bundle written before it did, or not a mapping)."""
    declared = config.get("declared")
    declared = declared.get(role) if isinstance(declared, dict) else None
    if not isinstance(declared, dict):
        return None

    def dims(value):
        if isinstance(value, list) and all(d is None or (isinstance(d, int) and not isinstance(d, bool))
                                           for d in value):
            return value
        return None

    return {str(name): dims(value) for name, value in declared.items()}


def declared_types(config):
    """{input name: the dtype its value must have} that repro_config.json records (declared.types), {} when it
    records none (a bundle written before it did) or not as names."""
    declared = config.get("declared")
    types = declared.get("types") if isinstance(declared, dict) else None
    if not isinstance(types, dict):
        return {}
    return {str(name): value for name, value in types.items() if isinstance(value, str)}


# ---------------------------------------------------------------------------------------- npz limits
# graphbisect/storage/npzguard.py, verbatim: each member's declared size against the model, before reading it
''' + embedded_source(npzguard) + r'''

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
    """A numpy-native form for arithmetic comparison: ml_dtypes floats as float32, int4/int2 as int16
    (complex stays complex: one element is one complex number, compared on its modulus)."""
    code = extension_code(array)
    if code:
        return array.astype(np.float32 if ELEM_TYPES[code][1] else np.int16)
    return array


# ----------------------------------------------------------------------------------- comparison
KIND_RANK = {"ok": 0, "floor": 0, "mismatch": 1, "nan": 2, "dtype": 3, "shape": 4, "missing": 5}
FAILURE_OF = {"ok": "none", "floor": "none", "mismatch": "mismatch", "nan": "nan", "dtype": "structure",
              "shape": "structure", "missing": "structure"}


def compare(name, expected, actual, tolerance):
    """Compare one output with the oracle's like graphbisect: |actual - expected| <= atol + rtol * |expected|
    per element (numpy.allclose); NaN/Inf where the oracle is finite is its own kind, "nan"; a quantized output
    (tolerance["quantized"]) in quantization steps, int_atol of them allowed."""
    if isinstance(expected, list) or isinstance(actual, list) or expected is None or actual is None:
        return compare_containers(name, expected, actual, tolerance)
    result = {"name": name, "kind": "ok", "numel": int(np.size(expected)), "values": value_class(expected)}
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
    if expected.dtype.kind not in "biufc" or actual.dtype.kind not in "biufc":
        return dict(result, kind="ok" if np.array_equal(expected, actual) else "mismatch")
    atol, rtol = tolerance["per_output"].get(name, (tolerance["atol"], tolerance["rtol"]))
    quantized, int_atol = tolerance.get("quantized") or {}, tolerance.get("int_atol", 1.0)
    if exact:  # integers (of every width) and booleans are exact, quantized ones within int_atol steps
        atol, rtol = (int_atol, 0.0) if name in quantized else (0.0, 0.0)
    elif quantized.get(name):  # a float on a quantization grid: int_atol steps more
        atol += int_atol * quantized[name]
    wide = np.complex128 if "c" in (expected.dtype.kind, actual.dtype.kind) else np.float64
    e, a = expected.astype(wide), actual.astype(wide)
    e_finite, a_finite = np.isfinite(e), np.isfinite(a)
    both = e_finite & a_finite
    same_nonfinite = ~e_finite & ~a_finite & ((e == a) | (np.isnan(e) & np.isnan(a)))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(both, np.abs(a - e), 0.0)
    bad = (diff > atol + rtol * np.abs(np.where(both, e, 0.0))) | (~both & ~same_nonfinite)
    with np.errstate(invalid="ignore", divide="ignore"):
        allowed = atol + rtol * np.abs(np.where(both, e, 0.0))
        ratio = np.where(diff > 0, diff / allowed, 0.0)  # the worst element's error in tolerances: its score
    result.update(mismatches=int(bad.sum()), max_abs=float(diff.max(initial=0.0)), atol=atol, rtol=rtol,
                  nonfinite=int((~a_finite & e_finite).sum()), score=float(np.nan_to_num(ratio, nan=np.inf).max(
                      initial=0.0)))
    if bad.any():
        worst = np.unravel_index(int(np.argmax(np.where(bad, np.where(both, diff, np.inf), -1.0))), e.shape)
        result.update(worst_index=[int(i) for i in worst], expected_value=plain(e[worst]), actual_value=plain(a[worst]))
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
        # graphbisect classes a sequence by its type name, "sequence(int64)": never an integer/boolean tensor
        return dict(worst, name=name if worst["kind"] == "ok" else worst["name"],
                    numel=sum(r.get("numel", 0) for r in results), values="float")
    if expected is None and actual is None:
        return {"name": name, "kind": "ok", "numel": 0}
    def shape(v):
        return "empty optional" if v is None else f"sequence of {len(v)}" if isinstance(v, list) else list(np.shape(v))
    return {"name": name, "kind": "shape", "numel": 0, "expected_shape": shape(expected), "actual_shape": shape(actual)}


def plain(value):
    """A number for JSON: a float, or [real, imag] for a complex one."""
    return [float(value.real), float(value.imag)] if np.iscomplexobj(value) else float(value)


def number_text(value):
    """A number as the report prints it (a complex one as 1.5-2j)."""
    return format(complex(*value) if isinstance(value, list) else value, ".6g")


def cosine_too_low(e, a, min_cosine):
    if min_cosine is None:
        return False
    ne, na = float(np.vdot(e, e).real), float(np.vdot(a, a).real)
    if ne == 0.0 or na == 0.0:
        return (0.0 if ne != na else 1.0) < min_cosine
    return float(np.vdot(e, a).real) / (ne * na) ** 0.5 < min_cosine


def failure_kind(results):
    """The failure kind of a run, from its worst output (structure > nan > mismatch, like graphbisect)."""
    worst = max(results, key=lambda r: KIND_RANK[r["kind"]], default={"kind": "ok"})
    return FAILURE_OF[worst["kind"]]


# The value class of a mismatch, as graphbisect's failure signature words it (a test keeps them equal): a
# wrong classification (an integer flip) and a float error are different failures, whichever was recorded —
# unless the recorded one is rooted in integers (the original's first divergence was an integer tensor, its
# float error that tensor's consequence): then either class is that failure.
FLOAT_VALUES = "values beyond tolerance"
EXACT_VALUES = "integer/boolean values differ"
EXACT_ROOTED = "integer/boolean values differ, and float values computed from them"


def value_class(expected):
    """"exact" for an oracle tensor of integers or booleans (graphbisect's rule, on the dtype's name), else
    "float"."""
    dtype = str(getattr(expected, "dtype", ""))
    return "exact" if dtype == "bool" or dtype.startswith(("int", "uint")) else "float"


def mismatch_detail(results):
    """A mismatch's value class: float values beyond tolerance when any float output fails (the numeric error
    is the root symptom, a flip its consequence), else integer/boolean values that differ."""
    failing = [r for r in results if r["kind"] == "mismatch"]
    return EXACT_VALUES if all(r.get("values") == "exact" for r in failing) else FLOAT_VALUES


def command_status(exc):
    """The exit status of a command target's program (a signal: negative), or None for another error: a
    recorded status is matched as a number (a recorded "exited with code 1" is not reproduced by code 13)."""
    if type(exc).__name__ != "CommandFailed":
        return None
    found = re.match(r"command (?:exited with code (-?\d+)|was killed by signal \w+ \((\d+)\))", str(exc))
    if found is None:
        return None
    return int(found.group(1)) if found.group(1) is not None else -int(found.group(2))


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
    inputs = load_arrays(HERE / "inputs.npz", config["inputs"], declared_dims(config, "inputs"))
    problem = type_problem(inputs, declared_types(config))
    if problem is not None:  # graphbisect refuses such a bundle too (bytes for a double input: issue 36)
        raise CannotRun(f"inputs.npz: {problem}: the bundle is damaged (copy it again, or re-create it with "
                        "graphbisect reduce)")
    expected = load_arrays(HERE / "oracle_outputs.npz", config["outputs"], declared_dims(config, "outputs"))
    note(phase="load")
    try:
        target = load_target(HERE / "model.onnx", config["options"])
    except CannotRun:  # not the target's failure: this machine cannot run it
        raise
    except Exception as exc:  # the backend refused the model: possibly the recorded bug
        return note(kind=raised_kind(config, "load", exc), error_type=type(exc).__name__, message=str(exc))
    note(phase="run")
    try:
        actual = run_target(target, inputs, compared_outputs(config))
    except CannotRun:  # not the target's failure: this machine cannot run it
        raise
    except Exception as exc:
        return note(kind=raised_kind(config, "run", exc), error_type=type(exc).__name__, message=str(exc),
                    exit_code=command_status(exc))
    results = [within_floor(config, compare(name, expected[name], actual.get(name, MISSING), config["tolerance"]))
               for name in compared_outputs(config)]
    kind = failure_kind(results)
    compiled = None
    if kind != "none" and (config.get("identity") or {}).get("compiled_kind") and "compiled_nodes" in globals():
        compiled = globals()["compiled_nodes"](target, HERE / "model.onnx", config["options"])
    return note(kind=kind, detail=mismatch_detail(results) if kind == "mismatch" else None, outputs=results,
                compiled=compiled)


def within_floor(config, result):
    """A value mismatch no larger than the target's noise floor allows is kernel precision (kind "floor"), as
    graphbisect judges it: beyond the tolerance but not beyond ``margin`` times the floor measured there, when
    that floor is precision (below ``cap``: an error that large with every optimization off is a kernel bug)."""
    floor = config.get("noise_floor")
    if not floor or result["kind"] != "mismatch" or not result.get("score", 0.0) > 1.0:
        return result
    level = float(floor["scores"].get(result["name"], 0.0))
    if 0.0 < level < float(floor.get("cap", math.inf)) and result["score"] <= max(1.0, float(floor["margin"]) * level):
        return dict(result, kind="floor", floor=level)
    return result


def compared_outputs(config):
    """The outputs a run is compared on: none when an external check's exit status is the verdict."""
    return [] if config.get("judge") == "exit-status" else config["outputs"]


def raised_kind(config, phase, exc):
    """"unsupported" when the error says the backend lacks an op, a type or an opset (graphbisect's rule, in
    the config), else a crash at ``phase``."""
    pattern = config.get("unsupported_pattern")
    if pattern and re.search(pattern, f"{type(exc).__name__}: {message_cause(str(exc))}", re.IGNORECASE):
        return "unsupported"
    return f"crash-{phase}"


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
    (r"(?<![\w.\-/])(?:[A-Za-z]:)?(?:[\w.\-]*/)+([\w.\-]+)", r"\1"),  # paths -> basename
    (r"\b\d{5,}\b", "N"),  # pids, sizes, timestamps
    (r"tmp[\w\-]{6,}", "tmp?"),  # temporary names
    (r"(\.(?:cc|cpp|cxx|cu|c|hpp|h|py)):\d+", r"\1"),  # source line numbers move between builds
    # candidate_17.onnx during the reduction, model.onnx here; not the ONNX domains ("ai.onnx.ml.Scaler")
    (r"(?<![\w.\-])(?!ai\.onnx\b)[\w.\-]+\.onnx\b(?!\.\w)", "model.onnx"),
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


def crash_key(message, names=()):
    """The stable part of a crash message: its cause without addresses, paths, line numbers..., and without
    the names the backend chose (erase_names below; ``names``: the model's, from repro_config.json)."""
    text = message_cause(message)
    for pattern, replacement in VOLATILE:
        text = re.sub(pattern, replacement, text)
    return erase_names(text.strip(), names)


# graphbisect/oracle/names.py, verbatim: how graphbisect takes the names a backend chose out of a message
''' + embedded_source(names) + r'''


def is_recorded_failure(expect, outcome):
    """Whether this run failed the way graphbisect recorded (same kind; for a mismatch the same value class,
    for a crash the same message or exit status)."""
    if expect["kind"] == "regex":
        text = "\n".join(str(outcome.get(key) or "") for key in ("error_type", "message", "log"))
        return re.search(expect["regex"], text) is not None
    if outcome["kind"] != expect["kind"]:
        return False
    if expect["kind"] == "mismatch" and expect.get("detail") in (FLOAT_VALUES, EXACT_VALUES):
        return outcome.get("detail") == expect["detail"]  # an integer flip is not a float error, nor vice versa
    if expect["kind"] == "mismatch" and expect.get("detail") == EXACT_ROOTED:
        return outcome.get("detail") in (FLOAT_VALUES, EXACT_VALUES)
    if expect.get("exit_code") is not None:
        return outcome.get("exit_code") == expect["exit_code"]
    if expect.get("message_key") is not None:
        actual = crash_key(f"{outcome.get('error_type')}: {outcome.get('message')}", set(expect.get("names") or ()))
        return expect["message_key"] in actual
    return True


def identity_differs(config, outcome):
    """Why a run that fails the recorded way by kind is another failure (None: the same one, or nothing
    recorded beyond the kind): graphbisect's rule (graphbisect.oracle.identity)."""
    ident = config.get("identity")
    if not ident or "outputs" not in outcome:
        return None
    failing = [r for r in outcome["outputs"] if r["kind"] not in ("ok", "floor")]
    elsewhere = [r["name"] for r in failing if r["name"] not in ident["after"]]
    if elsewhere:
        return f"it goes wrong at {elsewhere[0]!r}, which does not depend on the recorded first divergence"
    anchor = next((r for r in outcome["outputs"] if r["name"] == ident["tensor"]), None)
    if anchor is not None and ident.get("band") is not None:
        if anchor not in failing:
            return f"{ident['tensor']!r}, where the recorded failure starts, does not fail here"
        score = anchor.get("score", 0.0)
        band = math.floor(math.log10(score) + 0.5) if 0.0 < score < math.inf else None
        if band is not None and abs(band - ident["band"]) > 1:
            return f"{ident['tensor']!r} is off by ~1e{band}x tolerance, not ~1e{ident['band']}x"
    if ident.get("compiled_kind") and outcome.get("compiled") is not None:
        made = [(n["kind"], made_by(n["name"])) for n in outcome["compiled"]]
        if (ident["compiled_kind"], ident.get("made_by")) not in made:
            return (f"the target compiled no {ident['compiled_kind']}"
                    + (f" made by {ident['made_by']}" if ident.get("made_by") else ""))
    return None


def made_by(name):
    """The pass a compiled node's name says made it (ONNX Runtime: ``<node>/<Pass>/``), graphbisect's rule."""
    found = re.search(r"/([A-Za-z_][\w.]*)/(?:_token_\d+)?$", name or "")
    return found.group(1) if found else None


def describe(result):
    """One line about one compared output."""
    name, kind = json.dumps(result["name"]), result["kind"]
    if kind == "ok":
        return f"  ok        {name}"
    if kind == "floor":
        return (f"  floor     {name}: {result['score']:.3g}x tolerance, within {result['floor']:.3g}x that the "
                "target errs with its optimizations off (kernel precision, not the failure)")
    if kind in ("shape", "dtype"):
        return f"  {kind.upper():<9} {name}: expected {result['expected_' + kind]}, got {result['actual_' + kind]}"
    if kind == "missing":
        return f"  MISSING   {name}: the target did not produce it"
    line = f"  {kind.upper():<9} {name}: {result.get('mismatches', '?')} of {result['numel']} elements beyond tolerance"
    if "worst_index" in result:
        line += (f" (atol {result['atol']:g}, rtol {result['rtol']:g}); max abs error {result['max_abs']:.4g}; "
                 f"at index {result['worst_index']}: expected {number_text(result['expected_value'])}, "
                 f"got {number_text(result['actual_value'])}")
    return line


def print_outcome(config, outcome):
    """What ran, what was recorded and what happened now."""
    version = outcome.get("library_version")
    recorded = config.get("recorded_library_version")
    library = config.get("library") or config["target_spec"].split(":", 1)[0]
    print(f"target    {config['target_spec']}" + (f"  ({library} {version})" if version else ""))
    if recorded and version and not str(version).startswith(str(recorded)):
        print(f"          (the failure was recorded with {library} {recorded})")
    if config.get("python"):
        print(f"          graphbisect ran this backend under {config['python']}: run this script with it")
    expect = config["expect"]
    print(f"recorded  {expect['kind']}: {expect.get('message') or expect.get('detail') or ''}".rstrip(": \n"))
    observed = outcome["kind"] + (f" ({outcome['detail']})" if outcome.get("detail") else "")
    if config.get("judge") == "python-check" and "outputs" in outcome:
        observed = f"completed; by the tolerance (not the recorded judge): {observed}"
    if outcome.get("message"):
        observed += f": {outcome.get('error_type') or 'error'}: {outcome['message']}"
    print(f"observed  {observed.rstrip()}")
    for result in outcome.get("outputs", []):
        print(describe(result))


def verdict(config, outcome, in_process=False):
    """Print what happened and return the exit status (``in_process``: the backend's output was not captured)."""
    print_outcome(config, outcome)
    expect = config["expect"]
    if config.get("judge") == "python-check" and "outputs" in outcome:
        # The reduction's verdict on completed runs was a Python callable, which this script does not have:
        # the tolerance may accept what the check rejects (or the other way round), so it decides nothing.
        print(f"\nUNDECIDED: {config['target_spec']} ran, but the recorded failure is the verdict of a Python "
              "check (graphbisect.reduce(check=...)) that this script does not have. The comparison above uses "
              "the tolerance, for information only. Apply your check to the target's outputs, or run "
              "graphbisect.verify(BUNDLE, check=your_check).")
        return CANNOT_RUN
    if is_recorded_failure(expect, outcome):
        other = identity_differs(config, outcome)
        if other is None:
            print(f"\nREPRODUCED: {config['target_spec']} still fails the recorded way ({expect['kind']}).")
            return REPRODUCES
        print(f"\n*** A DIFFERENT FAILURE: the same kind ({expect['kind']}), but not the recorded one "
              f"({config['identity']['describe']}): {other}. The recorded bug may be fixed while another one "
              "shows. ***")
        return REPRODUCES
    if expect["kind"] == "regex" and in_process:
        # The regex may have matched what the backend printed, which went to this terminal, not to a log.
        print(f"\nNOT JUDGED: the recorded failure is a match of --fail-regex {expect['regex']!r}, which may be in "
              "what the backend printed; --in-process does not capture that. Run without --in-process to judge.")
        return CANNOT_RUN
    if outcome["kind"] == "none" or expect["kind"] == "regex":
        why = ("regex does not match" if outcome["kind"] != "none" else "the check command exited 0"
               if config.get("judge") == "exit-status" else "outputs match the oracle")
        print(f"\nFIXED: {config['target_spec']} no longer fails the recorded way ({why}).")
        original = config.get("original_nodes")
        if isinstance(original, int) and original > len(config.get("kept_nodes") or []) and \
                config.get("kept_nodes"):
            print(f"This model is {len(config['kept_nodes'])} of the {original} nodes of the model it was reduced "
                  "from: re-check that model, which may still fail another way (graphbisect verify BUNDLE --model "
                  "ORIGINAL.onnx).")
        return FIXED
    recorded = expect["kind"] + (f" ({expect['detail']})" if expect["kind"] == "mismatch" else "")
    now = outcome["kind"] + (f" ({outcome['detail']})" if outcome.get("detail") else "")
    print(f"\n*** A DIFFERENT FAILURE: recorded {recorded}, now {now}. The recorded bug may be "
          "fixed while another one shows; see the lines above. ***")
    return REPRODUCES


def main(argv=None):
    parser = argparse.ArgumentParser(description="Reproduce the failure recorded next to this script.")
    parser.add_argument("--in-process", action="store_true", help="run the backend in this process")
    parser.add_argument("--child", metavar="STATUS_JSON", help=argparse.SUPPRESS)
    parser.add_argument("--control", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trust", action="store_true",
                        help="run although repro_config.json sets options that can run a program, load a library "
                        "or write a file (read it first)")
    args = parser.parse_args(argv)
    try:
        config = read_config()
        if not (args.trust or args.child):  # a child is started only after this check
            refuse_untrusted(config)
        if args.child:
            return run_as_child(control_config(config) if args.control else config, Path(args.child))
        outcome = attempt(config) if args.in_process else attempt_in_child(config)
    except CannotRun as exc:
        print(f"repro.py cannot run: {exc}", file=sys.stderr)
        return CANNOT_RUN
    if not args.in_process and outcome.get("log", "").strip():
        print("--- backend output ---\n" + outcome["log"].rstrip() + "\n----------------------")
    code = verdict(config, outcome, args.in_process)
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
    print(control_verdict(config, outcome, in_process))


def control_verdict(config, outcome, in_process=False):
    """The control's line, judged as the recorded failure is (see verdict): a --fail-regex failure by its
    regex (matching outputs do not clear a regex on the log), a Python check's not at all."""
    expect = config["expect"]
    if config.get("judge") == "python-check" and "outputs" in outcome:
        return ("CONTROL UNDECIDED: the recorded failure is a Python check's verdict, which this script does not "
                "have (the comparison above is by the tolerance).")
    if expect["kind"] == "regex":
        if is_recorded_failure(expect, outcome):
            return "CONTROL FAILS (regex): disabling the culprit passes does not remove the failure here."
        if in_process:
            return "CONTROL NOT JUDGED: --in-process does not capture what the backend printed, where the regex may be."
        return "CONTROL PASSES: with the culprit passes disabled the regex does not match."
    if outcome["kind"] == "none":
        return "CONTROL PASSES: with the culprit passes disabled the outputs match the oracle."
    return f"CONTROL FAILS ({outcome['kind']}): disabling the culprit passes does not remove the failure here."


def run_as_child(config, status_file):
    try:
        attempt(config, status_file)
    except CannotRun as exc:
        status_file.write_text(json.dumps({"kind": "cannot-run", "message": str(exc)}), encoding="utf-8")
        return CANNOT_RUN
    return 0


def guarded_main(argv=None):
    """main(), where an error of this script itself exits 2 ("cannot run", nothing judged) with its traceback:
    Python's status for a traceback, 1, would read "the failure reproduces". A child's error is its parent's
    to judge (the status file says how far it got)."""
    try:
        return main(argv)
    except Exception:
        if "--child" in (sys.argv[1:] if argv is None else argv):
            raise
        traceback.print_exc()
        print("repro.py cannot run: the error above is this script's own, not the backend's; nothing was judged "
              "(check repro_config.json, or run graphbisect verify on this folder)", file=sys.stderr)
        return CANNOT_RUN


# ---------------------------------------------------------------------------------------- terminal
# graphbisect/text/printable.py, verbatim: names and messages from files as this script prints them (graphbisect's rule)
''' + embedded_source(printable) + r'''


class Printable:
    """A stream that shows control characters escaped (a backend's log or a recorded message cannot retitle or
    clear the terminal) and what the terminal's encoding lacks as \\x escapes (PYTHONIOENCODING=ascii and a
    "×" in a recorded message ended in a traceback)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        text = escape_controls(text)
        try:
            return self.stream.write(text)
        except UnicodeEncodeError:
            encoding = getattr(self.stream, "encoding", None) or "ascii"
            return self.stream.write(text.encode(encoding, "backslashreplace").decode(encoding))

    def __getattr__(self, name):
        return getattr(self.stream, name)


if __name__ == "__main__":
    sys.stdout, sys.stderr = Printable(sys.stdout), Printable(sys.stderr)
    sys.exit(guarded_main())
'''

_NO_STANDALONE = r'''#!/usr/bin/env python3
"""This bundle's target backend has no standalone reproduction script: replay it with graphbisect.

    graphbisect verify DIR     # exit 1: the failure reproduces, 0: fixed, 2: cannot run

DIR is the folder of this script. model.onnx, inputs.npz, oracle_outputs.npz and repro_config.json beside it
hold the case; this script only says so and exits 2 (nothing was tested). A custom backend must be known to
the process that verifies: repro_config.json's custom_backend says how it was registered, and this script
prints what to run.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CANNOT_RUN = 2
ENTRY_POINT_GROUP = "graphbisect.backends"


@HOW_TO_REGISTER@


def main():
    try:
        config = json.loads((HERE / "repro_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    config = config if isinstance(config, dict) else {}
    origin = config.get("custom_backend")
    print(f"repro.py cannot replay {config.get('target_spec', 'this target')!r} standalone: there is no standalone "
          f"script for the {config.get('backend', 'target')!r} backend.", file=sys.stderr)
    if isinstance(origin, dict):
        print(f"It is a custom backend; {how_to_register(origin, str(HERE))}", file=sys.stderr)
    else:
        print(f"Replay the bundle through graphbisect's isolated backends:\n\n    graphbisect verify "
              f"{shlex.quote(str(HERE))}\n", file=sys.stderr)
    return CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main())
'''
