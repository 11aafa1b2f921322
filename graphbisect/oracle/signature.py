"""Failure signatures: *how* a model fails, so a reduction never drifts to a different bug.

The most common complaint about minimizers (the PyTorch minifier, C-Reduce without care) is that they
shrink a wrong-result bug into an unrelated crash. A candidate is accepted only when its signature
*matches* the baseline's:

* ``mismatch`` (values beyond tolerance), ``nan`` (target NaN/Inf where the oracle is finite), ``shape`` /
  ``dtype`` / ``missing`` (structural) are distinct kinds. A mismatch has a **value class**: ``float`` values
  beyond tolerance, or ``exact`` integer/boolean values that differ (a flipped argmax, a wrong index). The
  classes do not match each other: a wrong classification must not shrink into "some float is slightly off".
  When both fail, the class is ``float`` (the numeric error is the root symptom, the flip its consequence).
  Unless the evidence says otherwise: when the original's first divergence is an integer tensor (ONNX
  Runtime's ReshapeFusion swaps ids for a shape, which a Cast turns into a float error downstream), the
  baseline's detail is :data:`EXACT_ROOTED` and both classes are that failure — the integer error, or the
  float error it causes — so the reduction may end where the integers go wrong.
  A mismatch also records its **band** (:func:`~graphbisect.compare.metrics.decade`, the error's order of
  magnitude in tolerances) for the report; bands are not compared unless asked (``strict_band``) or the failure
  is matched by kind alone (``reduce``), because the error legitimately grows or shrinks when the comparison
  point moves from a final output to the culprit's own output.
* ``crash`` at ``load`` (session/engine creation) or ``run``: exception class plus the message normalized
  (addresses, paths, long numbers, temp names removed, and every name the backend chose — the model's node and
  tensor names, OpenVINO's per-process numbers and renamed outputs — replaced by ``<name>``:
  :mod:`graphbisect.oracle.names`), or the process's exit code/signal. The op, the stage and the reason stay.
* ``unsupported``: the target *refused* the model, its message saying it lacks an op, a type or an opset
  (:func:`graphbisect.oracle.outcome.is_unsupported`, the rule of compare's ``target-unsupported``); detail as
  for a crash. Not a crash: a missing feature, and a reduction of it is the smallest model the target refuses.
* ``timeout``.
* a user ``--fail-regex`` replaces all of the above: any output whose log/message matches is the failure.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, replace

import onnx

from graphbisect.backends.base import Phase, RunResult, RunStatus, message_cause
from graphbisect.compare import Comparison, MismatchKind, TensorStats
from graphbisect.compare.metrics import decade
from graphbisect.oracle.floor import NoiseFloor
from graphbisect.oracle.names import erase_names, found_names
from graphbisect.oracle.outcome import is_unsupported

__all__ = ["FailureKind", "ModelNames", "Signature", "crash_names", "failing_above", "names_in", "normalize_message",
           "rooted_in_integers", "signature_of", "without_status"]


class FailureKind(str, enum.Enum):
    NONE = "none"  # the target agrees with the oracle
    MISMATCH = "mismatch"
    NAN = "nan"
    STRUCTURE = "structure"  # shape, dtype or missing output
    CRASH_LOAD = "crash-load"
    CRASH_RUN = "crash-run"
    UNSUPPORTED = "unsupported"  # the target refused the model: an op, a type or an opset it lacks
    TIMEOUT = "timeout"
    REGEX = "regex"  # matched the user's --fail-regex

    @property
    def raised(self) -> bool:
        """Whether the target raised (or died): the detail is its error, ``"<ErrorType>: <message>"`` or
        ``"exit <code>"``, and no output was produced."""
        return self in (FailureKind.CRASH_LOAD, FailureKind.CRASH_RUN, FailureKind.UNSUPPORTED)


_STRUCTURAL = {MismatchKind.SHAPE, MismatchKind.DTYPE, MismatchKind.MISSING}

# The stable part of a crash message. The generated repro.py carries a copy (a test keeps them equal).
_NORMALIZERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),  # addresses
    (re.compile(r"(?<![\w.\-/])(?:[A-Za-z]:)?(?:[\w.\-]*/)+([\w.\-]+)"), r"\1"),  # paths → basename
    (re.compile(r"\b\d{5,}\b"), "N"),  # long numbers: pids, sizes, timestamps
    (re.compile(r"tmp[\w\-]{6,}"), "tmp?"),  # temporary names
    (re.compile(r"(\.(?:cc|cpp|cxx|cu|c|hpp|h|py)):\d+"), r"\1"),  # source line numbers move between builds
    # candidate-3f2a.onnx while reducing, model.onnx in a bundle; not the ONNX domains ("ai.onnx.ml.Scaler")
    (re.compile(r"(?<![\w.\-])(?!ai\.onnx\b)[\w.\-]+\.onnx\b(?!\.\w)"), "model.onnx"),
    (re.compile(r"\s+"), " "),
)

_OLD_DOMAIN = re.compile(r"(?<![\w.\-])model\.onnx\.(?=\w)")


def normalize_message(message: str | None, names: Collection[str] = ()) -> str:
    """The stable part of an error message: its cause (:func:`~graphbisect.backends.base.message_cause`:
    first paragraph, name lists collapsed, model dumps cut) without addresses, paths and volatile numbers,
    and without the names the backend chose (:func:`~graphbisect.oracle.names.erase_names`; ``names``: the
    model's, from :func:`crash_names` or :class:`ModelNames`).

    The whole paragraph counts, not its first line: OpenVINO's first line is only a source location
    (``Exception from src/inference/src/cpp/core.cpp:84:``) for every load error, so a first-line signature
    made a Conv conversion failure and an LSTM one "the same failure".

    The names go last, from the text the other rules left, so a signature recorded before they went (a
    bundle, a resumed work folder) becomes today's by :meth:`Signature.without_names` alone.

    Example:
        >>> normalize_message("/src/ort/relu_clip_fusion.cc:83 Unexpected data type for Clip 'min' input of 11")
        "relu_clip_fusion.cc Unexpected data type for Clip 'min' input of 11"
        >>> normalize_message("Load model from /tmp/w/candidate-3f2a.onnx failed")
        'Load model from model.onnx failed'
        >>> normalize_message("Exception from src/core.cpp:84:\\nCheck failed at src/conv.cpp:38:\\nrank unknown")
        'Exception from core.cpp: Check failed at conv.cpp: rank unknown'
        >>> normalize_message("While validating node 'opset8::If If_5381 (...)' with friendly_name 'If_5381'")
        "While validating node 'opset8::If <name> (...)' with friendly_name '<name>'"

    """
    return erase_names(_volatile(message_cause(message)), names)


#: A status a backend prints before its message: ONNX Runtime's ``[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION :``.
_STATUS = re.compile(r"\[\w+\]\s*:\s*\d+\s*:\s*[A-Z][A-Z_]*\s*:\s*")


def without_status(detail: str) -> str:
    """A crash's ``"<ErrorType>: <message>"`` (normalized) without the error type and the status codes a backend
    prints before the message: what stays the same when a release renames the error a failure raises (ONNX
    Runtime raised FuseReluClip's float64 crash as ``RuntimeException``, status 6, up to 1.22 and as ``Fail``,
    status 1, from 1.31). Across releases a crash is the same failure when this is the same (``verify``).

    Example:
        >>> without_status("RuntimeException: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Exception during "
        ...                "initialization: relu_clip_fusion.cc Unexpected data type")
        'Exception during initialization: relu_clip_fusion.cc Unexpected data type'
    """
    error_type, sep, message = detail.partition(": ")
    text = message if sep and re.fullmatch(r"[A-Za-z_][\w.]*", error_type) else detail
    return _STATUS.sub("", text).strip()


def names_in(message: str | None, names: Collection[str]) -> list[str]:
    """The members of ``names`` (as :func:`crash_names` gives them) that :func:`normalize_message` takes out
    of ``message``, sorted: what a bundle records for ``repro.py`` to take out of the messages it observes.

    Example:
        >>> names_in("Got invalid dimensions for input: /blk/x.1 for the following indices", {"x.1", "y.2"})
        ['x.1']
    """
    return sorted(found_names(_volatile(message_cause(message)), names))


def _volatile(text: str) -> str:
    """``text`` without addresses, paths, long numbers, temporary names and source line numbers."""
    for pattern, replacement in _NORMALIZERS:
        text = pattern.sub(replacement, text)
    return text.strip()


def crash_names(names: Iterable[str]) -> frozenset[str]:
    """Node and tensor names as a normalized crash message shows them (paths cut to their last part, like
    the message's), less plain words: a name of letters alone (``x``, ``input``, ``MatMul``) or of no letter
    (``12``) can be a word or a number of the reason, so it is replaced only where the message's format says
    it is a name (:data:`~graphbisect.oracle.names.POSITIONS`).

    Example:
        >>> sorted(crash_names(["/blk5/pool/MatMul_output_0", "x", "x.1", "12", "/blk5/pool/MatMul"]))
        ['MatMul_output_0', 'x.1']
    """
    # One pass of the rules over all the names at once, NUL-separated (no rule reads or crosses a NUL): a name at
    # a time cost ~14 µs, 3.5 s for a 50,000-node model.
    # A damaged model's protobuf may hand over a name as bytes (not UTF-8): no message shows it as text.
    unique = {name for name in names if isinstance(name, str) and "\0" not in name}
    shown = _volatile("\0".join(sorted(unique))).split("\0")
    return frozenset(name.strip() for name in shown if _distinctive(name.strip()))


def _distinctive(name: str) -> bool:
    return any(c.isalpha() for c in name) and not name.isalpha()


class ModelNames(Collection[str]):
    """The :func:`crash_names` of a model's nodes and tensors (its subgraphs' too), computed on first use:
    only a crash reads them, and a 50,000-node model has ~150,000 names.

    Example:
        >>> "MatMul_output_0" in ModelNames(model)                     # doctest: +SKIP
        True
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model = model

    @functools.cached_property
    def names(self) -> frozenset[str]:
        found: set[str] = set()
        _graph_names(self._model.graph, found)
        return crash_names(found)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _graph_names(graph: onnx.GraphProto, found: set[str]) -> None:
    """Add the names of ``graph``'s values, initializers and nodes (subgraphs' included) to ``found``."""
    found.update([value.name for value in graph.input], [value.name for value in graph.output],
                 [value.name for value in graph.value_info], [tensor.name for tensor in graph.initializer])
    for node in graph.node:
        found.add(node.name)
        found.update(node.input, node.output)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _graph_names(attribute.g, found)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    _graph_names(sub, found)


@dataclass(frozen=True)
class Signature:
    """How a target run failed (or ``kind == NONE`` when it did not)."""

    kind: FailureKind
    detail: str = ""  # crash: "<ErrorType>: <normalized message>" or "exit <code>"; mismatch: worst kind
    band: int | None = None  # mismatch: the score's nearest power of ten (compare.metrics.decade)

    @property
    def failed(self) -> bool:
        return self.kind is not FailureKind.NONE

    def matches(self, other: Signature, *, strict_band: bool = False) -> bool:
        """Whether ``other`` (a candidate's signature) is the same failure as this (the baseline's)."""
        if self.kind is not other.kind or not self.failed:
            return False
        if (self.kind.raised or self.kind is FailureKind.MISMATCH) and not _same_detail(self.detail, other.detail):
            return False
        if strict_band and self.band is not None and other.band is not None:
            return abs(self.band - other.band) <= 1
        return True

    def describe(self) -> str:
        if not self.failed:
            return "no failure"
        extra = f" ({self.detail})" if self.detail else ""
        band = f", error ~1e{self.band}× tolerance" if self.band is not None else ""
        return f"{self.kind.value}{extra}{band}"

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind.value, "detail": self.detail, "band": self.band}

    def matched_on(self) -> str | None:
        """How a candidate's failure is found to be this one, in words for a report (None: not a crash).

        Example:
            >>> Signature(FailureKind.CRASH_RUN, "exit 3").matched_on()
            'the stage (crash at run) and the exit status'
        """
        if not self.kind.raised:
            return None
        stage = {FailureKind.CRASH_LOAD: "crash at load", FailureKind.CRASH_RUN: "crash at run",
                 FailureKind.UNSUPPORTED: "a refusal"}[self.kind]
        if self.detail.startswith("exit "):
            return f"the stage ({stage}) and the exit status"
        return (f"the stage ({stage}), the error type and the message's cause (its first paragraph), without "
                "addresses, paths, source line numbers and every name the backend chose — the model's node and "
                "tensor names, the nodes it numbered or renamed — each shown as <name>; the op and the reason stay")

    def without_names(self, names: Collection[str] = ()) -> Signature:
        """This signature with the names a backend chose taken out of a crash's message, as
        :func:`signature_of` does now (``names``: the model's, see :func:`crash_names`): what a signature
        recorded before that (a bundle, a resumed work folder) is re-read as. Idempotent.

        Example:
            >>> Signature(FailureKind.CRASH_LOAD, "RuntimeError: node 'opset8::If If_5381 (x)'").without_names().detail
            "RuntimeError: node 'opset8::If <name> (x)'"
        """
        if not self.kind.raised or self.detail.startswith("exit "):
            return self
        return replace(self, detail=erase_names(self.detail, names))

    @classmethod
    def from_json(cls, data: dict[str, object], message: str | None = None, *,
                  names: Collection[str] = ()) -> Signature:
        """A recorded signature as graphbisect classifies now: a crash recorded before the ``unsupported``
        kind existed whose error (``message``, the recorded raw one, else the detail) says the backend lacks
        an op, a type or an opset is ``unsupported`` — else an old bundle of a refusal would re-verify as
        "a different failure". A crash's message loses the names a backend chose (:meth:`without_names`,
        with the model's ``names`` where the caller has them), as :func:`signature_of` computes it now.

        Example:
            >>> Signature.from_json({"kind": "crash-load", "detail": "NotImplemented: [ONNXRuntimeError] : 9 : "
            ...                      "NOT_IMPLEMENTED : Could not find an implementation for Add(14)"}).kind.value
            'unsupported'
        """
        band = data.get("band")
        kind, detail = FailureKind(str(data["kind"])), str(data.get("detail", ""))
        if kind.raised:  # the file-name rule took the ONNX domains for files before: "model.onnx.ml.Scaler"
            detail = _OLD_DOMAIN.sub("ai.onnx.", detail)
        if kind in (FailureKind.CRASH_LOAD, FailureKind.CRASH_RUN) and not detail.startswith("exit "):
            error_type, _, text = detail.partition(": ")
            if is_unsupported(error_type, message or text):
                kind = FailureKind.UNSUPPORTED
        return cls(kind, detail, int(band) if isinstance(band, (int, float)) else None).without_names(names)


def signature_of(
    run: RunResult, comparison: Comparison | None, *, fail_regex: re.Pattern[str] | None = None,
    floor: NoiseFloor | None = None, names: Collection[str] = (),
) -> Signature:
    """The signature of one target run, given its comparison with the oracle (None when it crashed).

    ``floor``: the target's noise floor (:mod:`graphbisect.oracle.floor`); a value mismatch within its margin
    is kernel precision, not a failure. ``names``: the model's node and tensor names (:class:`ModelNames` of the
    model a reduction started from: its candidates' are among them), replaced in a crash's message like the
    names the backend made up."""
    if fail_regex is not None:
        text = "\n".join(filter(None, (run.message, run.log, run.error_type)))
        matched = fail_regex.search(text) is not None
        return Signature(FailureKind.REGEX, fail_regex.pattern) if matched else Signature(FailureKind.NONE)
    if run.status is RunStatus.TIMEOUT:
        return Signature(FailureKind.TIMEOUT)
    if run.status is RunStatus.CRASH:
        kind = FailureKind.CRASH_LOAD if run.phase is Phase.LOAD else FailureKind.CRASH_RUN
        if run.error_type or run.message:
            detail = f"{run.error_type or 'Error'}: {normalize_message(run.message, names)}"
            if is_unsupported(run.error_type, run.message):
                kind = FailureKind.UNSUPPORTED
        else:
            detail = f"exit {run.exit_code}"
        return Signature(kind, detail)
    failing = failing_above(comparison, floor)
    if not failing:
        return Signature(FailureKind.NONE)
    worst = Comparison(failing).worst
    assert worst is not None
    if worst.kind is MismatchKind.NAN:
        return Signature(FailureKind.NAN, "target NaN/Inf where the oracle is finite")
    if worst.kind in _STRUCTURAL:
        return Signature(FailureKind.STRUCTURE, worst.kind.value)
    floats = [s for s in failing if not _exact(s.oracle_dtype)]
    if not floats:
        return Signature(FailureKind.MISMATCH, EXACT_VALUES)
    worst = max(floats, key=lambda s: s.score)
    return Signature(FailureKind.MISMATCH, FLOAT_VALUES, decade(worst.score))


def failing_above(comparison: Comparison | None, floor: NoiseFloor | None) -> tuple[TensorStats, ...]:
    """The outputs of ``comparison`` that fail above ``floor`` (every failing one without a floor)."""
    if comparison is None:
        return ()
    return tuple(s for s in comparison.failing if floor is None or floor.exceeds(s))


FLOAT_VALUES = "values beyond tolerance"
EXACT_VALUES = "integer/boolean values differ"
#: a baseline whose first divergence is an integer tensor: its float error is that error's consequence
EXACT_ROOTED = "integer/boolean values differ, and float values computed from them"


def _same_detail(a: str, b: str) -> bool:
    """Whether two signatures' details are the same failure (see the module docstring's value classes)."""
    if a == b:
        return True
    return EXACT_ROOTED in (a, b) and {a, b} - {EXACT_ROOTED} <= {FLOAT_VALUES, EXACT_VALUES}


def rooted_in_integers(signature: Signature, first_divergence_dtype: str | None) -> Signature:
    """``signature`` (a baseline) made :data:`EXACT_ROOTED` when it is a float error whose first divergence, in
    the original, is an integer or boolean tensor (``first_divergence_dtype``, the oracle's dtype there)."""
    if signature.kind is FailureKind.MISMATCH and signature.detail == FLOAT_VALUES and \
            _exact(first_divergence_dtype):
        return Signature(FailureKind.MISMATCH, EXACT_ROOTED, signature.band)
    return signature
CHECK_REJECTED = "the Python check rejected the outputs"


def _exact(dtype: str | None) -> bool:
    return dtype is not None and (dtype == "bool" or dtype.startswith(("int", "uint")))
