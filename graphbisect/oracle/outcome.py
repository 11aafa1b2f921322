"""What a comparison of target and oracle *means*: every result of ``compare`` falls into one class.

A failing comparison is not always a bug of the target. On ONNX's own node tests, most non-passing models
are ops one backend does not implement, or ops that draw random numbers; a user reading ``FAIL`` must be
told which. The classes (:class:`OutcomeClass`), decided from what actually ran:

* ``pass`` — the target's outputs match the oracle's;
* ``divergence`` — the target ran and its values differ (or its outputs' shapes/types): a real
  disagreement, what ``reduce`` is for;
* ``noise-floor`` — the values differ beyond the tolerance, but no more than the target's own kernels differ
  with its optimizations off (:mod:`graphbisect.oracle.floor`: TF32 on a GPU): kernel precision, not a
  transformation to reduce;
* ``random-op`` — the values differ, but the model has an op that draws random numbers (``RandomNormal``,
  ``Bernoulli``, ``Dropout`` in training mode...): two backends cannot be expected to agree;
* ``target-unsupported`` / ``oracle-unsupported`` — the backend refused the model for lack of an op, a
  type or an opset (its message says so: "NOT_IMPLEMENTED", "Could not find an implementation", ...);
* ``target-crash`` / ``oracle-crash`` — any other failure at load or run;
* ``target-timeout`` / ``oracle-timeout``.

Example:
    >>> classify_failed_run(RunResult(RunStatus.CRASH, phase=Phase.LOAD, error_type="NotImplemented",
    ...     message="[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Foo"),
    ...     "target").cls.value
    'target-unsupported'
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx

from graphbisect.backends.base import Phase, RunResult, RunStatus, message_cause
from graphbisect.compare import Comparison, MismatchKind, TensorStats
from graphbisect.oracle.floor import NoiseFloor
from graphbisect.text.printable import shown

__all__ = ["RANDOM_OPS", "UNSUPPORTED_PATTERN", "Outcome", "OutcomeClass", "Refusal", "classify_comparison",
           "classify_failed_run", "headline", "is_unsupported", "random_ops", "refusal_of"]


class OutcomeClass(str, enum.Enum):
    PASS = "pass"
    DIVERGENCE = "divergence"
    NOISE_FLOOR = "noise-floor"
    RANDOM_OP = "random-op"
    TARGET_UNSUPPORTED = "target-unsupported"
    TARGET_CRASH = "target-crash"
    TARGET_TIMEOUT = "target-timeout"
    ORACLE_UNSUPPORTED = "oracle-unsupported"
    ORACLE_CRASH = "oracle-crash"
    ORACLE_TIMEOUT = "oracle-timeout"


@dataclass(frozen=True)
class Outcome:
    """A class and one line saying why (the op, the message, the outputs)."""

    cls: OutcomeClass
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"class": self.cls.value, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.cls.value}: {self.detail}" if self.detail else self.cls.value


#: Ops whose outputs are random draws (ai.onnx), so two backends need not agree.
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})

#: Messages of backends refusing an op, a type or an opset they do not implement (ONNX Runtime, onnx.reference,
#: OpenVINO, Paddle, IREE's ONNX importer, graphbisect's own typed-value refusals), searched in
#: ``"<error type>: <message's cause>"`` (:func:`~graphbisect.backends.base.message_cause`, what a crash
#: signature keeps: a ``command``'s stderr, in its message's second paragraph, does not count), ignoring case.
#: The generated ``repro.py`` gets this text in its config, so it classifies a refusal the same way.
UNSUPPORTED_PATTERN = (
    r"NOT_IMPLEMENTED|Could not find an implementation|No Op registered|is not a registered function/op"
    r"|not (?:yet )?(?:implemented|supported)|unsupported|no (?:kernel|implementation) (?:for|is)"
    r"|Unable to find (?:a )?(?:implementation|kernel)|Opset \d+ is under development"
    r"|ONNX Runtime only \*guarantees\* support|is under development and support for this is limited"
    r"|NotImplementedError|has no (?:kernel|implementation)|No registered implementation"
    r"|must be installed to use"
    # IREE: an ONNX op its importer has no conversion for (or not for these attributes/types) stays a generic
    # torch.operator <{name = "onnx.X"}>, which iree-compile then refuses to legalize
    r"|failed to legalize operation 'torch\.operator'"
    # IREE's importer: a type it has no form for ("Unsupport list element type": a sequence of maps, skl2onnx's
    # ZipMap output; "unhandled torch type": a sequence input)
    r"|unsupport\b|unhandled torch type"
    # OpenVINO's ONNX frontend: an op with no translator ("No conversion rule found for operations:
    # ai.onnx.ml.Scaler") or one its translator refused ("-- Loop-17 with a message: ..."): the model was not
    # converted, whatever the op, as IREE's importer and ONNX Runtime's missing kernels are classed
    r"|No conversion rule found|OpConversionFailure|wasn't fully converted"
)
_UNSUPPORTED = re.compile(UNSUPPORTED_PATTERN, re.IGNORECASE)


def is_unsupported(error_type: str | None, message: str | None) -> bool:
    """Whether a failed run's error says the backend lacks an op, a type or an opset (``target-unsupported``),
    judged on the error type and the message's cause only: a signature's detail is made of those, so a
    candidate's kind never depends on text its detail leaves out.

    Example:
        >>> is_unsupported("NotImplemented", "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an "
        ...                "implementation for Add(14) node with name 'add'")
        True
        >>> is_unsupported("Fail", "Unexpected data type for Clip 'min' input of 11")
        False
    """
    return _UNSUPPORTED.search(f"{error_type or ''}: {message_cause(message)}") is not None


@dataclass(frozen=True)
class Refusal:
    """What a backend's refusal names (:func:`refusal_of`): the op or type it lacks and the sentence that says so.

    ``what``: ``ai.onnx.ml.TreeEnsembleRegressor``, ``Loop``, ``Add(14)``, ``list element type`` ("" when the
    message names nothing); ``reason``: the informative part of the message on one line, what a title shows.
    """

    what: str
    reason: str

    @property
    def family(self) -> str:
        """What the backend lacks, as bugs are grouped: the domain of an op of another domain than ``ai.onnx``
        (every op of ``ai.onnx.ml`` is one missing feature), else the op or type itself (its opset cut).

        Example:
            >>> Refusal("ai.onnx.ml.Scaler", "").family, Refusal("Add(14)", "").family
            ('ai.onnx.ml', 'Add')
        """
        if not re.fullmatch(r"[\w.:]+(?:\(\d+\))?(?:, *[\w.:]+(?:\(\d+\))?)*", self.what):
            return self.what  # a type, a sentence
        ops = [op.strip() for op in self.what.split(",")]
        domains = {op.rpartition(".")[0] for op in ops}
        if ops and len(domains) == 1 and next(iter(domains)):
            return next(iter(domains))
        return ", ".join(re.sub(r"\(\d+\)$", "", op) for op in ops)


# Each backend's way of naming what it refused: (pattern on the message's cause with its framing taken out, the
# reason's wording). The first that matches names it; the kind (unsupported or not) is UNSUPPORTED_PATTERN's alone.
# The patterns read a raw message and a signature's detail (one line) alike.
_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    # OpenVINO's ONNX frontend: no translator for these ops
    (re.compile(r"No conversion rule found for operations?: *(?P<what>\S+(?:, *\S+)*)"),
     "no conversion rule found for {what}"),
    # OpenVINO: a translator that refused its node, the reason after it
    (re.compile(r"-- (?P<what>[A-Za-z_][\w.:]*?)(?:-\d+)? with a message: *(?P<body>.*)", re.DOTALL),
     "cannot convert {what}: {body}"),
    # IREE's ONNX importer: an op left as a generic torch.operator
    (re.compile(r'"torch\.operator"[^\n]*?<\{name = "onnx\.(?P<what>[\w.]+)"\}>'),
     "IREE's ONNX importer has no conversion for onnx.{what}"),
    (re.compile(r"unhandled torch type: *'?(?P<what>[^'\n]+)"), "IREE's ONNX importer has no type for {what}"),
    # ONNX Runtime
    (re.compile(r"Could not find an implementation for (?P<what>[\w.]+\(\d+\))"), "no kernel for {what}"),
    (re.compile(r"No Op registered for (?P<what>[\w.]+) with domain_version"), "no op registered for {what}"),
    # any: "Unsupported value_info type: x" (OpenVINO), "Unsupport list element type" (IREE)
    (re.compile(r"unsupport(?:ed)? (?P<what>[\w ]{1,40}? type)\b(?P<body>: *\S+)?", re.IGNORECASE),
     "unsupported {what}{body}"),
)
#: What only frames a message (OpenVINO): where it was thrown, the check that failed (its reason follows), the
#: frontend's report headings. A title leaves them out.
_FRAMING = re.compile(r"^\w+: (?=Exception from )|Exception from \S+?:(?:\d+:)?|Check '.*?' failed at \S+?:(?:\d+:)?"
                      r"|FrontEnd API failed with OpConversionFailure:|Model wasn't fully converted\."
                      r"|Failed operations detailed log:|Summary:|Loading input model|While validating (?:ONNX )?node "
                      r"'.*?':", re.MULTILINE)


def refusal_of(error_type: str | None, message: str | None) -> Refusal | None:
    """What a refusal names (see :class:`Refusal`), or None when the error is not a refusal (:func:`is_unsupported`).
    ``message``: the backend's, or a signature's detail (``"RuntimeError: ..."``, ``error_type`` None).

    Example:
        >>> refusal_of("RuntimeError", "Exception from src/inference/src/cpp/core.cpp:84:\\nFrontEnd API failed "
        ...            "with OpConversionFailure:\\nSummary:\\n-- No conversion rule found for operations: "
        ...            "ai.onnx.ml.Scaler").reason
        'no conversion rule found for ai.onnx.ml.Scaler'
        >>> refusal_of("IreeImportError", "OnnxImportError: Unsupport list element type")
        Refusal(what='list element type', reason='unsupported list element type')
    """
    if not is_unsupported(error_type, message):
        return None
    cause = _unframed(message)
    for pattern, wording in _REFUSALS:
        found = pattern.search(cause)
        if found is not None:
            what = found["what"].strip()
            body = " ".join((found.groupdict().get("body") or "").split())
            return Refusal(what, wording.format(what=what, body=body).strip(" :"))
    return Refusal("", " ".join(cause.split()))


def headline(error_type: str | None, message: str | None, limit: int = 200) -> str:
    """The informative part of a failure's message on one line, for titles and tables: what a refusal names
    (:func:`refusal_of`), else the first line of the message's cause that is not only framing (OpenVINO's
    ``Exception from src/inference/src/cpp/core.cpp:84:`` is the first line of every load error it raises).
    ``message``: the backend's, or a signature's detail (``"RuntimeError: ..."``, ``error_type`` None).

    Example:
        >>> headline(None, "RuntimeError: Exception from core.cpp: Exception from plugin.cpp: Exception from "
        ...          "partial_shape.cpp:261:\\nto_shape was called on a dynamic shape.")
        'to_shape was called on a dynamic shape.'
    """
    refusal = refusal_of(error_type, message)
    lines = [line.strip() for line in _unframed(message).splitlines() if line.strip()]
    text = refusal.reason if refusal is not None else " ".join(lines[0].split()) if lines else ""
    text = text or " ".join(message_cause(message).split())
    return text if len(text) <= limit else text[:limit].rstrip() + " ..."


def _unframed(message: str | None) -> str:
    """The message's cause without the parts :data:`_FRAMING` matches."""
    return _FRAMING.sub(" ", message_cause(message)).strip()


def random_ops(nodes: Iterable[onnx.NodeProto]) -> list[str]:
    """The ops among ``nodes`` that draw random numbers: :data:`RANDOM_OPS`, and ``Dropout`` given a
    ``training_mode`` input (a constant ``False`` is not looked up: graphbisect then says "may")."""
    found = []
    for node in nodes:
        if node.op_type in RANDOM_OPS or (node.op_type == "Dropout" and len(node.input) >= 3 and node.input[2]):
            found.append(f"{node.op_type} {shown(node.name)}".strip())
    return found


def classify_failed_run(run: RunResult, role: str) -> Outcome:
    """The class of a failed run of the ``role`` ("target" or "oracle") backend."""
    if run.status is RunStatus.TIMEOUT:
        return Outcome(OutcomeClass(f"{role}-timeout"), run.describe())
    if is_unsupported(run.error_type, run.message):
        hint = run.info.get("error_hint")  # what the backend knows would run it (IREE: a newer opset)
        return Outcome(OutcomeClass(f"{role}-unsupported"), run.describe() + (f" (hint: {hint})" if hint else ""))
    phase = "while loading the model" if run.phase is Phase.LOAD else "while running it"
    return Outcome(OutcomeClass(f"{role}-crash"), f"{phase}: {run.describe()}")


def classify_comparison(target_run: RunResult, comparison: Comparison | None,
                        nodes: Iterable[onnx.NodeProto], floor: NoiseFloor | None = None) -> Outcome:
    """The class of a comparison whose oracle ran: pass, divergence, noise-floor (``floor``: the target's),
    random-op or a target failure."""
    if not target_run.ok or comparison is None:
        return classify_failed_run(target_run, "target")
    if comparison.passed:
        return Outcome(OutcomeClass.PASS, "")
    if floor is not None and not any(floor.exceeds(s) for s in comparison.failing):
        return Outcome(OutcomeClass.NOISE_FLOOR, f"{_describe_failing(comparison.failing)}; within "
                       f"{floor.margin:g}× what {floor.spec} (the target with its optimizations off) errs there")
    failing = comparison.failing
    worst = comparison.worst
    assert worst is not None
    what = _describe_failing(failing)
    randoms = random_ops(nodes)
    if randoms and worst.kind not in (MismatchKind.SHAPE, MismatchKind.DTYPE, MismatchKind.MISSING):
        return Outcome(OutcomeClass.RANDOM_OP, f"{what}; the model draws random numbers ({', '.join(randoms[:3])})")
    return Outcome(OutcomeClass.DIVERGENCE, what)


def _describe_failing(failing: Sequence[TensorStats]) -> str:
    parts = []
    for stats in failing[:3]:
        if stats.kind in (MismatchKind.MISMATCH, MismatchKind.NAN):
            parts.append(f"{shown(stats.name)} ({stats.kind.value}, {stats.mismatches}/{stats.numel} elements)")
        else:
            parts.append(f"{shown(stats.name)} ({stats.kind.value}: oracle {stats.oracle_shape} "
                         f"{stats.oracle_dtype or ''}, target {stats.target_shape} {stats.target_dtype or ''})")
    more = f" and {len(failing) - 3} more" if len(failing) > 3 else ""
    return "outputs differ: " + ", ".join(parts) + more
