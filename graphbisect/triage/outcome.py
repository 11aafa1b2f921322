"""What triage found for one model: failed (with its bundle and bug key), passed, or error (with the message).

A :class:`ModelOutcome` is the value a triage task returns across process and Ray boundaries and the record
written to ``OUT_DIR/results/<name>.json`` (what a re-run reads to skip a finished model), so it holds only
plain data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from graphbisect.backends.cost import CallTally

__all__ = ["ERROR", "FAILED", "PASSED", "ModelOutcome", "total_calls"]

FAILED, PASSED, ERROR = "failed", "passed", "error"


@dataclass(frozen=True)
class ModelOutcome:
    """One model's triage result. ``identity`` ties it to the model file and the options that produced it."""

    name: str
    source: str
    status: str  # FAILED, PASSED or ERROR
    identity: str = ""
    signature: Mapping[str, Any] | None = None  # Signature.to_json() of the original model's failure
    culprits: tuple[str, ...] = ()  # minimal set of passes to disable (empty: none found or not searched)
    required: tuple[str, ...] = ()
    pattern: str | None = None  # pattern_hash of the reduced model
    op_types: tuple[str, ...] = ()  # the reduced model's nodes, in order
    #: an ``unsupported`` failure: what the target lacks, as bugs are grouped (:func:`graphbisect.triage.dedup.lacking`:
    #: ``ai.onnx.ml``, ``Loop``); None when the refusal names nothing
    lacks: str | None = None
    original_nodes: int | None = None
    final_nodes: int | None = None
    one_minimal: bool = False
    bundle: str | None = None
    invocations: Mapping[str, int] = field(default_factory=dict)  # the reduction's (over resumed sessions too)
    seconds: float = 0.0
    phases: Mapping[str, float] = field(default_factory=dict)  # step → seconds: load, compare, passes, reduce
    step_invocations: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # step → backend runs (this run)
    versions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # role -> RunResult.ran_with
    message: str | None = None  # error: what went wrong; otherwise notes
    hint: str | None = None
    notes: tuple[str, ...] = ()
    #: :attr:`invocations` by kind: role -> {"runs", "compiles", "compile_cache_hits"}
    #: (:mod:`graphbisect.backends.cost`); a record written before compiles were counted has none
    backend_calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: :attr:`step_invocations` by kind: step -> role -> {"runs", "compiles", "compile_cache_hits"}
    step_backend_calls: Mapping[str, Mapping[str, Mapping[str, int]]] = field(default_factory=dict)
    #: the trusted checker's record of this model's verdict (:mod:`graphbisect.workflows.triage_claims`:
    #: ``holds``, ``claims``, ``runs``, ``calls``; ``passes_audit`` / ``bundle_audit``: the holds of the passes
    #: search's and the bundle's own audits); None: not checked (an error, or a record of an older triage)
    audit: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["seconds"] = round(self.seconds, 3)
        data["phases"] = {step: round(seconds, 3) for step, seconds in self.phases.items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelOutcome:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for key in ("culprits", "required", "op_types", "notes"):
            values[key] = tuple(values.get(key) or ())
        return cls(**values)


def total_calls(outcomes: Iterable[ModelOutcome]) -> CallTally:
    """The backend calls of every step of ``outcomes`` (compare, passes, reduce), summed by role.

    Example:
        >>> one = ModelOutcome("a", "a.onnx", PASSED, step_backend_calls={"compare": {"target": {"runs": 2}}})
        >>> total_calls([one, one]).describe()
        'target 4'
    """
    total = CallTally()
    for outcome in outcomes:
        for calls in outcome.step_backend_calls.values():
            total.merge(CallTally.from_json(calls))
    return total
