"""Claims about configurations of a target — which specs, on which models, fail or pass — checked with plain runs.

``graphbisect passes`` and ``graphbisect precision`` answer with configurations: the target with some passes
disabled (``onnxruntime:opt_level=all,disabled=A;B``), a mixed-precision model the target runs. Each claim they
print is a list of ``(configuration, verdict)`` pairs the search says it measured; :func:`check_configurations`
runs each configuration once, plainly (:class:`~graphbisect.checker.runs.Runner`: a worker per spec, which the
models of that spec share, no compile cache, the model's own outputs), compares with the checker's rule
(:mod:`.values`) against one plain oracle run and says of each claim holds / does not hold / not established,
with the evidence. It takes spec strings and model files, never the search's objects: what the search built is
data to the checker, as a bundle is.

Verdicts (:data:`PASSES`, :data:`FAILS`, :data:`FAILS_SAME`, :data:`NOT_SAME`): "the same failure" is the
``reference`` configuration's failure as the checker itself observed it (not the search's signature): the same
class (float values, exact values, non-finite values, structure), on the same outputs, the worst score within a
decade, or a crash with the same normalized message; where ``compiled_as`` is given and the target describes
what it compiled, also a compiled node of that kind (made by that pass) — the rule
:mod:`graphbisect.checker.audit` applies to a bundle. Without a reference configuration, ``recorded`` (a failure as
a bundle's ``report.json`` records it: its signature, failing outputs and their scores, identity, message) is
the failure, judged exactly as :mod:`graphbisect.checker.audit` judges a bundle's target against its report:
what ``graphbisect releases`` uses, where each release runs another interpreter and no run of the search is one
to trust.

Example:
    >>> target = "onnxruntime:opt_level=all"
    >>> claims = [ConfigurationClaim("workaround", "disabling A removes the failure",
    ...                              ((Configuration(f"{target},disabled=A", "m.onnx"), PASSES),))]
    >>> check_configurations("reference", "m.onnx", feeds, claims, Limits(),
    ...                      reference=Configuration(target, "m.onnx"))                   # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphbisect.backends.base import BackendSpec, Phase
from graphbisect.checker.audit import _CRASHES, Audit, Claim, _Expected, _Judge, _Seen, _short
from graphbisect.checker.floor import Floor, FloorRule, rule_of
from graphbisect.checker.runs import Run, Runner
from graphbisect.checker.values import Limits, compare_outputs, worst

__all__ = ["FAILS", "FAILS_SAME", "KINDS", "NOT_SAME", "PASSES", "Configuration", "ConfigurationClaim",
           "check_configurations"]

#: The target's outputs are within the tolerance of the oracle's.
PASSES = "passes"
#: The target fails, any way (beyond tolerance, non-finite, another structure, a crash).
FAILS = "fails"
#: The target fails the way the ``reference`` configuration fails.
FAILS_SAME = "fails the same way"
#: The target does not fail the way the reference fails: it passes, or fails another way.
NOT_SAME = "does not fail the same way"
VERDICTS = (PASSES, FAILS, FAILS_SAME, NOT_SAME)
#: The kinds of failure a :data:`FAILS` claim may name, and what the checker's plain run must show for each: a
#: failing output of that class (``mismatch``: float values beyond tolerance or exact values that differ;
#: ``nan``: non-finite values where the oracle's are finite; ``structure``: a missing output, another shape or
#: dtype), a crash while loading (``crash-load``) or running (``crash-run``), a refusal (``unsupported``: a crash
#: at either; that its message is a refusal stays the claimant's reading), a ``timeout``.
KINDS = ("mismatch", "nan", "structure", "crash-load", "crash-run", "unsupported", "timeout")


@dataclass(frozen=True)
class Configuration:
    """One thing a user could run: ``spec`` (a backend spec string) on ``model`` (a file)."""

    spec: str
    model: str | os.PathLike[str]

    @property
    def key(self) -> tuple[str, str]:
        return str(BackendSpec.parse(self.spec)), str(Path(self.model).resolve())


@dataclass(frozen=True)
class ConfigurationClaim:
    """A claim: each configuration shows its verdict. ``label`` names each configuration in the evidence
    (default: its spec), e.g. ``"without LayerNormFusionL1"``."""

    id: str
    statement: str
    configurations: tuple[tuple[Configuration, str], ...]
    labels: tuple[str, ...] = ()
    #: with :data:`FAILS`: the kind of failure claimed too (one of :data:`KINDS`)
    kind: str | None = None

    def __post_init__(self) -> None:
        for _, verdict in self.configurations:
            if verdict not in VERDICTS:
                raise ValueError(f"unknown verdict {verdict!r}: one of {', '.join(VERDICTS)}")
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}: one of {', '.join(KINDS)}")


def check_configurations(oracle: str, oracle_model: str | os.PathLike[str], inputs: Mapping[str, Any],
                         claims: Sequence[ConfigurationClaim], limits: Limits, *,
                         reference: Configuration | None = None, compiled_as: tuple[str, str | None] | None = None,
                         timeout: float | None = None, workdir: Path | None = None,
                         progress: Callable[[str], None] | None = None,
                         floor: tuple[str, float] | None = None,
                         recorded: Mapping[str, Any] | None = None) -> Audit:
    """Each of ``claims`` checked with plain runs: ``oracle`` once on ``oracle_model``, each distinct
    configuration once (the reference's run serves every claim that names it too), compared under ``limits``.

    ``reference``: the configuration whose failure :data:`FAILS_SAME` and :data:`NOT_SAME` mean (None: those
    verdicts are not established). ``compiled_as``: ``(compiled kind, made by)`` the failure is recorded as,
    checked where the target describes its compiled graph. ``floor``: ``(spec, margin)`` of the noise floor the
    search judged above (:mod:`.floor`; accepted only as the reference's target with its optimizations off),
    measured again by one plain run of that spec per model, against the same oracle run. ``recorded``: the failure
    :data:`FAILS_SAME` and :data:`NOT_SAME` mean where no ``reference`` is given, as ``report.json`` records one
    (its ``signature``, ``outputs``, ``identity``, ``target_message``; module docstring). Returns an
    :class:`~graphbisect.checker.audit.Audit` whose ``calls`` count the runs (``oracle``, ``target``)."""
    started = time.monotonic()
    say = progress or (lambda _text: None)
    with tempfile.TemporaryDirectory(prefix="graphbisect-claims-", dir=workdir) as scratch:
        rule = FloorRule(None) if floor is None else \
            rule_of(floor[0], floor[1], BackendSpec.parse(reference.spec)) if reference is not None else \
            FloorRule(None, why_not="no reference target to check the floor's spec against")
        checker = _Configurations(oracle, Path(oracle_model), dict(inputs), limits, compiled_as=compiled_as,
                                  timeout=timeout, scratch=Path(scratch), floor=rule, recorded=recorded)
        try:
            say(f"checking {len(claims)} claims with plain runs (the checker)")
            result = tuple(checker.claim(c, reference) for c in claims)
        finally:
            checker.close()
    return Audit(str(oracle_model), result, checker.calls(), time.monotonic() - started)


class _Configurations:
    """One check: the oracle's plain run and each configuration's, made once."""

    def __init__(self, oracle: str, model: Path, inputs: dict[str, Any], limits: Limits, *,
                 compiled_as: tuple[str, str | None] | None, timeout: float | None, scratch: Path,
                 floor: FloorRule, recorded: Mapping[str, Any] | None = None) -> None:
        self.inputs, self.limits, self.compiled_as = inputs, limits, compiled_as
        #: the recorded failure's judge, for claims without a reference configuration
        self.recorded = None if recorded is None else _Judge(_Expected.of(recorded), limits, ())
        self.timeout, self.scratch = timeout, scratch
        self.oracle = Runner(BackendSpec.parse(oracle), timeout=timeout, folder=scratch)
        self.plain = self.oracle.run(model, inputs)
        self.runs: dict[tuple[str, str], Run] = {}
        #: one worker per spec, started on its first run: the models a spec runs share it (as a user's script
        #: runs several models in one process), never a compile cache
        self.runners: dict[str, Runner] = {}
        self.judges: dict[tuple[str, str], _Judge | str] = {}
        self.rule = floor
        self.floor_runner = Runner(floor.spec, timeout=timeout, folder=scratch) if floor.spec is not None else None
        self.floors: dict[str, Floor | str] = {}

    def close(self) -> None:
        self.oracle.close()
        for runner in [*self.runners.values(), *([self.floor_runner] if self.floor_runner else [])]:
            runner.close()

    def floor(self, model: str | os.PathLike[str]) -> Floor | str | None:
        """The target's noise floor on ``model`` (one plain run of the floor spec), why it cannot be had, or None
        where no floor is stated."""
        if self.rule.why_not is not None:
            return f"the noise floor cannot be measured again: {self.rule.why_not}"
        if self.floor_runner is None:
            return None
        key = str(Path(model).resolve())
        if key not in self.floors:
            run = self.floor_runner.run(Path(model), self.inputs)
            self.floors[key] = self.rule.measure(self.plain.outputs, run.outputs, self.limits) if run.ok else \
                f"the noise floor's run ({self.rule.spec}) does not complete: {_short(run.crash_text(), 160)}"
        return self.floors[key]

    def calls(self) -> dict[str, dict[str, int]]:
        runners = [*self.runners.values(), *([self.floor_runner] if self.floor_runner else [])]
        return {"oracle": {"runs": self.oracle.runs, "compiles": self.oracle.compiles},
                "target": {"runs": sum(r.runs for r in runners), "compiles": sum(r.compiles for r in runners)}}

    def run(self, configuration: Configuration) -> Run:
        """The configuration's plain run (once per spec and model)."""
        key = configuration.key
        if key not in self.runs:
            spec = key[0]
            if spec not in self.runners:
                self.runners[spec] = Runner(BackendSpec.parse(spec), describe=self.compiled_as is not None,
                                            timeout=self.timeout, folder=self.scratch)
            self.runs[key] = self.runners[spec].run(Path(configuration.model), self.inputs)
        return self.runs[key]

    def judge(self, reference: Configuration | None) -> _Judge | str:
        """The judge of "the same failure" as ``reference``'s plain run, or why there is none."""
        if reference is None:
            return self.recorded or "no reference failure was given"
        key = reference.key
        if key not in self.judges:
            run, floor = self.run(reference), self.floor(reference.model)
            expected = floor if isinstance(floor, str) and run.ok else \
                _observed(run, self.plain.outputs, self.limits, self.compiled_as, _of(floor))
            self.judges[key] = expected if isinstance(expected, str) else _Judge(expected, self.limits, ())
        return self.judges[key]

    def claim(self, claim: ConfigurationClaim, reference: Configuration | None) -> Claim:
        if not self.plain.ok:
            return Claim(claim.id, claim.statement, None,
                         f"the oracle does not run the model, so nothing decides: {_short(self.plain.crash_text())}")
        if not claim.configurations:
            return Claim(claim.id, claim.statement, None, "no configuration to run")
        labels = claim.labels or tuple(c.spec for c, _ in claim.configurations)
        held: list[bool | None] = []
        parts: list[str] = []
        for (configuration, verdict), label in zip(claim.configurations, labels):
            holds, text = self.verdict(configuration, verdict, reference)
            if holds and verdict == FAILS and claim.kind is not None:
                run = self.run(configuration)
                floor = self.floor(configuration.model) if run.ok else None
                holds, text = _kind_shown(run, self.plain.outputs, self.limits, claim.kind,
                                          floor if isinstance(floor, Floor) else None)
            held.append(holds)
            mark = {True: "as claimed", False: "NOT as claimed", None: "undecided"}[holds]
            parts.append(f"{label}: {text} ({mark})")
        result = False if False in held else None if None in held else True
        count = len({c.key for c, _ in claim.configurations})  # a configuration named twice runs once
        runs = "a plain run" if count == 1 else f"{count} plain runs"
        return Claim(claim.id, claim.statement, result, f"{runs}: " + "; ".join(parts), each=tuple(held))

    def verdict(self, configuration: Configuration, verdict: str, reference: Configuration | None
                ) -> tuple[bool | None, str]:
        """Whether ``configuration``'s plain run shows ``verdict``, and what it showed."""
        run = self.run(configuration)
        floor = self.floor(configuration.model) if run.ok else None
        if isinstance(floor, str):
            return None, f"{_plain_seen(run, self.plain.outputs, self.limits, None).text}; {floor}"
        if verdict in (PASSES, FAILS):
            seen = _plain_seen(run, self.plain.outputs, self.limits, floor)
            return (not seen.fails) if verdict == PASSES else seen.fails, seen.text
        judge = self.judge(reference)
        if isinstance(judge, str):
            return None, f"{_plain_seen(run, self.plain.outputs, self.limits, floor).text}; which failure: {judge}"
        seen = judge.judge(self.plain.outputs, run, floor=floor)
        if not seen.fails:
            return verdict == NOT_SAME, seen.text
        if seen.same is None:
            return None, seen.text
        if seen.same and self.compiled_as is not None:
            kind, made_by = self.compiled_as
            return verdict == FAILS_SAME, f"{seen.text}; compiled with a {kind}" + (f" made by {made_by}" if made_by
                                                                                     else "")
        return (seen.same if verdict == FAILS_SAME else not seen.same), \
            seen.text + ("" if seen.same else " — another failure than the reference's")


def _of(floor: Floor | str | None) -> Floor | None:
    return floor if isinstance(floor, Floor) else None


def _plain_seen(run: Run, oracle: Mapping[str, Any], limits: Limits, floor: Floor | None) -> _Seen:
    """Whether ``run`` fails at all against ``oracle``'s outputs (above ``floor``, where there is one)."""
    if not run.ok:
        phase = f"crash at {run.result.phase.value}" if run.result.phase else run.result.status.value
        return _Seen(True, None, f"{phase}: {_short(run.crash_text(), 200)}")
    differences = compare_outputs(oracle, run.outputs, limits)
    noisy = [d.name for d in differences if d.failed and floor is not None and not floor.counts(d)]
    differences = floor.above(differences) if floor is not None else differences
    bad = worst(differences)
    if bad is None:
        top = max((d.score for d in differences), default=0.0)
        within = f"beyond the tolerance only within the target's noise floor on {', '.join(noisy)}" if noisy \
            else "within tolerance"
        return _Seen(False, None, f"{within} (worst score {top:.3g})")
    return _Seen(True, None, "; ".join(d.describe() for d in differences if d.failed))


def _observed(run: Run, oracle: Mapping[str, Any], limits: Limits,
              compiled_as: tuple[str, str | None] | None, floor: Floor | None = None) -> _Expected | str:
    """The reference's failure as the checker observed it, in the audit's terms; or why it is no failure."""
    kind, made_by = compiled_as or (None, None)
    if not run.ok:
        status = run.result.status.value
        crash = "timeout" if status == "timeout" else "crash-load" if run.result.phase is Phase.LOAD else "crash-run"
        assert crash in _CRASHES
        return _Expected(crash, None, frozenset(), None, run.crash_text(), None, kind, made_by)
    differences = compare_outputs(oracle, run.outputs, limits)
    differences = floor.above(differences) if floor is not None else differences
    bad = worst(differences)
    if bad is None:
        return f"the reference configuration does not fail ({_plain_seen(run, oracle, limits, floor).text})"
    failing = frozenset(d.name for d in differences if d.failed)
    score = None if math.isnan(bad.score) else bad.score
    if bad.kind in ("mismatch", "exact"):
        return _Expected("mismatch", bad.kind, failing, score, None, None, kind, made_by)
    return _Expected(bad.kind, None, failing, score, None, None, kind, made_by)


def _kind_shown(run: Run, oracle: Mapping[str, Any], limits: Limits, kind: str,
                floor: Floor | None) -> tuple[bool, str]:
    """Whether the failing ``run`` fails as ``kind`` (:data:`KINDS`) above ``floor``, and what it showed."""
    seen = _plain_seen(run, oracle, limits, floor).text
    if not run.ok:
        status = run.result.status.value
        shown = "timeout" if status == "timeout" else "crash-load" if run.result.phase is Phase.LOAD else "crash-run"
        holds = shown == kind or (kind == "unsupported" and shown in ("crash-load", "crash-run"))
    else:
        differences = compare_outputs(oracle, run.outputs, limits)
        classes = {d.kind for d in (floor.above(differences) if floor is not None else differences) if d.failed}
        shown = ", ".join(sorted(classes))
        holds = bool(classes & ({"mismatch", "exact"} if kind == "mismatch" else {kind}))
    return holds, f"{seen} ({shown}{'' if holds else f', not {kind}'})"
