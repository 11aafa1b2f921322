"""The target's noise floor, re-measured by the checker with plain runs of its own.

A bundle whose ``report.json`` records a measured ``noise_floor`` states a criterion: an output of the target
fails only when its error is beyond the tolerance *and*, for a float value mismatch, beyond ``margin`` times the
target's own error with its optimizations off (its **floor**, in tolerances) — unless that floor is
:data:`CAP` tolerances or more, which is a kernel computing wrong, not precision, and hides nothing. A NaN, an
integer that differs or another shape always fails. The checker reads from the bundle only that a floor was
measured, at which level (it must be the target's backend at its lowest ``opt_level``) and the margin; the floor
itself it measures again, on the very model it judges (the bundle's, or a single removal of it), as one plain
run of the bundle's target at that level against the plain oracle's outputs.

Example:
    >>> floor = Floor({"y": 2.0}, margin=10.0)
    >>> floor.counts(Difference("y", "mismatch", 15.0)), floor.counts(Difference("y", "mismatch", 25.0))
    (False, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from graphbisect.backends.base import BackendSpec
from graphbisect.backends.registry import resolve
from graphbisect.checker.values import Difference, Limits, compare_outputs

__all__ = ["CAP", "Floor", "FloorRule", "floor_rule", "rule_of"]

#: The largest floor that is precision: a target wrong by this many tolerances with its optimizations off is a
#: kernel computing wrong, and that floor hides nothing (the criterion bundles state).
CAP = 100.0


@dataclass(frozen=True)
class Floor:
    """A floor measured on one model: output -> the floor run's score there (inf: not precision)."""

    scores: Mapping[str, float]
    margin: float

    def counts(self, difference: Difference) -> bool:
        """Whether a failing output fails above the floor (a passing one never counts)."""
        if not difference.failed:
            return False
        if difference.kind != "mismatch" or not difference.score > 1.0:
            return True  # a NaN, exact values, a shape, or the cosine bound alone: never kernel precision
        level = self.scores.get(difference.name, 0.0)
        return level >= CAP or difference.score > max(1.0, self.margin * level)

    def above(self, differences: Sequence[Difference]) -> list[Difference]:
        """``differences`` with each failure within the floor turned into a pass (its score kept)."""
        return [d if not d.failed or self.counts(d) else replace(d, kind="ok") for d in differences]

    def describe(self) -> str:
        """One line for a claim's evidence: the worst output beyond the tolerance with optimizations off."""
        noisy = sorted(((n, s) for n, s in self.scores.items() if 1.0 < s < CAP), key=lambda item: -item[1])
        if not noisy:
            return "within the tolerance at every output"
        name, score = noisy[0]
        return f"{name!r} at {score:.3g}× tolerance (a failure counts there only above {self.margin * score:.3g}×)"


@dataclass(frozen=True)
class FloorRule:
    """What a bundle states about the floor: None ``spec`` for the tolerance alone; ``why_not`` when the
    recorded floor cannot be measured again (what it decides is then not established)."""

    spec: BackendSpec | None
    margin: float = 10.0
    why_not: str | None = None

    def measure(self, oracle: Mapping[str, Any], outputs: Mapping[str, Any], limits: Limits) -> Floor:
        """The floor of one completed floor run (its ``outputs``) against ``oracle``'s outputs."""
        return Floor({d.name: (d.score if d.kind in ("ok", "mismatch") else math.inf)
                      for d in compare_outputs(oracle, outputs, limits)}, self.margin)


def floor_rule(report: Mapping[str, Any], target: BackendSpec) -> FloorRule:
    """The criterion ``report`` states for ``target``'s failures (see the module docstring)."""
    record = report.get("noise_floor")
    if not isinstance(record, Mapping) or record.get("measured") is not True:
        return FloorRule(None)  # none measured: the tolerance alone judges, as the bundle says
    try:
        margin = float(record.get("margin", 10.0))
    except (TypeError, ValueError) as exc:
        return FloorRule(None, why_not=f"the recorded noise floor's margin cannot be read ({exc})")
    return rule_of(str(record.get("spec")), margin, target)


def rule_of(spec_text: str, margin: float, target: BackendSpec) -> FloorRule:
    """The floor ``spec_text`` states, with ``margin``: accepted when it is ``target``'s backend at its lowest
    ``opt_level``, and then run as ``target`` itself at that level (its options, which the trust rule checked;
    the recorded spec's pass options, e.g. a culprit spec's ``disabled=``, select nothing at that level)."""
    try:
        spec = BackendSpec.parse(spec_text)
        _, row = resolve(target, require_available=False)
        _, floor_row = resolve(spec, require_available=False)
    except Exception as exc:  # a malformed record or an unknown backend: the bundle's data, not a checker fault
        return FloorRule(None, why_not=f"the recorded noise floor cannot be read ({type(exc).__name__}: {exc})")
    lowest = row.opt_levels[0] if row.opt_levels else None
    if floor_row.name != row.name or lowest is None or spec.options.get("opt_level") != lowest \
            or not (math.isfinite(margin) and margin >= 1.0):
        return FloorRule(None, why_not=f"the recorded noise floor ({_brief(spec)}, margin {margin:g}) is not the "
                         f"target {_brief(target)} with its optimizations off (opt_level={lowest})")
    return FloorRule(target.with_options(opt_level=lowest), margin)


def _brief(spec: BackendSpec) -> str:
    text = str(spec)
    return text if len(text) <= 160 else text[:159] + "…"
