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
  A mismatch also records its **band**
  (``floor(log10(score))``, the error's order of magnitude in tolerances) for the report; bands are not
  compared unless asked (``strict_band``), because the error legitimately grows or shrinks when the
  comparison point moves from a final output to the culprit's own output.
* ``crash`` at ``load`` (session/engine creation) or ``run``: exception class plus the message normalized
  (addresses, paths, long numbers, temp names removed), or the process's exit code/signal.
* ``unsupported``: the target *refused* the model, its message saying it lacks an op, a type or an opset
  (:func:`graphbisect.oracle.outcome.is_unsupported`, the rule of compare's ``target-unsupported``); detail as
  for a crash. Not a crash: a missing feature, and a reduction of it is the smallest model the target refuses.
* ``timeout``.
* a user ``--fail-regex`` replaces all of the above: any output whose log/message matches is the failure.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass

from graphbisect.backends.base import Phase, RunResult, RunStatus, message_cause
from graphbisect.compare import Comparison, MismatchKind
from graphbisect.oracle.outcome import is_unsupported

__all__ = ["FailureKind", "Signature", "normalize_message", "rooted_in_integers", "signature_of"]


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
    (re.compile(r"(?:[A-Za-z]:)?(?:[\w.\-]*/)+([\w.\-]+)"), r"\1"),  # paths → basename
    (re.compile(r"\b\d{5,}\b"), "N"),  # long numbers: pids, sizes, timestamps
    (re.compile(r"tmp[\w\-]{6,}"), "tmp?"),  # temporary names
    (re.compile(r"(\.(?:cc|cpp|cxx|cu|c|hpp|h|py)):\d+"), r"\1"),  # source line numbers move between builds
    (re.compile(r"[\w.\-]+\.onnx\b"), "model.onnx"),  # candidate-3f2a.onnx while reducing, model.onnx in a bundle
    (re.compile(r"\s+"), " "),
)


def normalize_message(message: str | None) -> str:
    """The stable part of an error message: its cause (:func:`~graphbisect.backends.base.message_cause`:
    first paragraph, name lists collapsed, model dumps cut) without addresses, paths and volatile numbers.

    The whole paragraph counts, not its first line: OpenVINO's first line is only a source location
    (``Exception from src/inference/src/cpp/core.cpp:84:``) for every load error, so a first-line signature
    made a Conv conversion failure and an LSTM one "the same failure".

    Example:
        >>> normalize_message("/src/ort/relu_clip_fusion.cc:83 Unexpected data type for Clip 'min' input of 11")
        "relu_clip_fusion.cc Unexpected data type for Clip 'min' input of 11"
        >>> normalize_message("Load model from /tmp/w/candidate-3f2a.onnx failed")
        'Load model from model.onnx failed'
        >>> normalize_message("Exception from src/core.cpp:84:\\nCheck failed at src/conv.cpp:38:\\nrank unknown")
        'Exception from core.cpp: Check failed at conv.cpp: rank unknown'

    """
    text = message_cause(message)
    for pattern, replacement in _NORMALIZERS:
        text = pattern.sub(replacement, text)
    return text.strip()


@dataclass(frozen=True)
class Signature:
    """How a target run failed (or ``kind == NONE`` when it did not)."""

    kind: FailureKind
    detail: str = ""  # crash: "<ErrorType>: <normalized message>" or "exit <code>"; mismatch: worst kind
    band: int | None = None  # mismatch: floor(log10(score))

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

    @classmethod
    def from_json(cls, data: dict[str, object], message: str | None = None) -> Signature:
        """A recorded signature as graphbisect classifies now: a crash recorded before the ``unsupported``
        kind existed whose error (``message``, the recorded raw one, else the detail) says the backend lacks
        an op, a type or an opset is ``unsupported`` — else an old bundle of a refusal would re-verify as
        "a different failure".

        Example:
            >>> Signature.from_json({"kind": "crash-load", "detail": "NotImplemented: [ONNXRuntimeError] : 9 : "
            ...                      "NOT_IMPLEMENTED : Could not find an implementation for Add(14)"}).kind.value
            'unsupported'
        """
        band = data.get("band")
        kind, detail = FailureKind(str(data["kind"])), str(data.get("detail", ""))
        if kind in (FailureKind.CRASH_LOAD, FailureKind.CRASH_RUN) and not detail.startswith("exit "):
            error_type, _, text = detail.partition(": ")
            if is_unsupported(error_type, message or text):
                kind = FailureKind.UNSUPPORTED
        return cls(kind, detail, int(band) if isinstance(band, (int, float)) else None)


def signature_of(
    run: RunResult, comparison: Comparison | None, *, fail_regex: re.Pattern[str] | None = None
) -> Signature:
    """The signature of one target run, given its comparison with the oracle (None when it crashed)."""
    if fail_regex is not None:
        text = "\n".join(filter(None, (run.message, run.log, run.error_type)))
        matched = fail_regex.search(text) is not None
        return Signature(FailureKind.REGEX, fail_regex.pattern) if matched else Signature(FailureKind.NONE)
    if run.status is RunStatus.TIMEOUT:
        return Signature(FailureKind.TIMEOUT)
    if run.status is RunStatus.CRASH:
        kind = FailureKind.CRASH_LOAD if run.phase is Phase.LOAD else FailureKind.CRASH_RUN
        if run.error_type or run.message:
            detail = f"{run.error_type or 'Error'}: {normalize_message(run.message)}"
            if is_unsupported(run.error_type, run.message):
                kind = FailureKind.UNSUPPORTED
        else:
            detail = f"exit {run.exit_code}"
        return Signature(kind, detail)
    if comparison is None or comparison.passed:
        return Signature(FailureKind.NONE)
    worst = comparison.worst
    assert worst is not None
    if worst.kind is MismatchKind.NAN:
        return Signature(FailureKind.NAN, "target NaN/Inf where the oracle is finite")
    if worst.kind in _STRUCTURAL:
        return Signature(FailureKind.STRUCTURE, worst.kind.value)
    floats = [s for s in comparison.failing if not _exact(s.oracle_dtype)]
    if not floats:
        return Signature(FailureKind.MISMATCH, EXACT_VALUES)
    worst = max(floats, key=lambda s: s.score)
    band = math.floor(math.log10(worst.score)) if math.isfinite(worst.score) and worst.score > 0 else None
    return Signature(FailureKind.MISMATCH, FLOAT_VALUES, band)


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
