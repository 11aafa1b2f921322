"""`tactics`: record, replay and isolate per-node kernel choices of a target backend.

* :func:`record_tactics` — one target build with ``report_tactics=1``: its :class:`TacticRecord`.
* :func:`replay_tactics` — a build with a record forced (spec option ``tactics=PATH``), re-recorded: the
  choices the backend silently replaced are reported, and the outputs are returned for comparison.
* :func:`isolate_tactics` — given a good and a bad record (or ``builds`` target builds sorted into good
  and bad by the verdict), the fewest (node, choice) pairs whose bad choices make the good build bad,
  found by delta debugging over replays and confirmed by replay
  (:func:`graphbisect.strategies.tactics.isolate`).

The verdict of a build: with an ``oracle`` spec, the usual comparison of outputs against the oracle's
(default tolerances); without one, the good build's own outputs are the reference and the comparison is
bit-exact unless a tolerance is given, which is what "this kernel changes the numbers" means.

The target's backend must have the TACTICS capability; the candidate record travels as a file that the
target's worker re-reads at each build, so one worker serves the whole search.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.backends import BackendProcess, BackendSpec, Capability, RunResult, resolve
from graphbisect.backends.cost import CallTally, Cost
from graphbisect.compare import Tolerance
from graphbisect.data import random_inputs, save_inputs, validate_inputs
from graphbisect.engine import Budget, Evaluator, Outcome, TestResult
from graphbisect.errors import BackendError, SpecError
from graphbisect.model import Model
from graphbisect.model.io import save_proto, strip_to_external, write_weights_file
from graphbisect.oracle.as_built import oracle_failed_hint, require_outputs
from graphbisect.oracle.signature import Signature
from graphbisect.oracle.tester import judge
from graphbisect.settings.options import INVOCATIONS, Allowed, check_value, whole
from graphbisect.strategies.tactics import Isolation, TacticSpace, isolate
from graphbisect.tactics.diff import ChoiceChange, NotApplied
from graphbisect.tactics.record import TacticRecord, save_record
from graphbisect.workflows.scratch import work_folder

__all__ = [
    "EXACT",
    "IsolateResult",
    "RecordResult",
    "ReplayResult",
    "isolate_tactics",
    "record_tactics",
    "replay_tactics",
]

logger = logging.getLogger(__name__)

#: Bit-exact comparison: any difference is a mismatch.
EXACT = Tolerance(atol=0.0, rtol=0.0)


@dataclass(frozen=True)
class RecordResult:
    """One build's tactic record and the run that produced it."""

    record: TacticRecord
    run: RunResult

    @property
    def invocations(self) -> dict[str, int]:
        """{role: runs}: the target's one run."""
        return {"target": 1}

    @property
    def backend_calls(self) -> dict[str, dict[str, int]]:
        """{role: {"runs", "compiles", "compile_cache_hits"}}: the run and the build it made
        (:mod:`graphbisect.backends.cost`)."""
        return {"target": Cost.of_run(self.run).to_json()}

    def to_json(self) -> dict[str, object]:
        return {"run": self.run.describe(), "record": self.record.to_json(), "invocations": self.invocations,
                "backend_calls": self.backend_calls}


@dataclass(frozen=True)
class ReplayResult:
    """A build with a record forced: what it really used, which choices it did not honour, its outputs."""

    requested: TacticRecord
    actual: TacticRecord
    not_applied: tuple[NotApplied, ...]
    run: RunResult

    @property
    def applied(self) -> bool:
        """Every requested choice was honoured."""
        return not self.not_applied

    @property
    def record(self) -> TacticRecord:
        """What the build really used (the same as :attr:`actual`; ``--json`` ``record``)."""
        return self.actual

    @property
    def invocations(self) -> dict[str, int]:
        """{role: runs}: the target's one run."""
        return {"target": 1}

    @property
    def backend_calls(self) -> dict[str, dict[str, int]]:
        """{role: {"runs", "compiles", "compile_cache_hits"}}: the run and the build it made (none when it
        reused an earlier build of the same record, :mod:`graphbisect.backends.cost`)."""
        return {"target": Cost.of_run(self.run).to_json()}

    def to_json(self) -> dict[str, object]:
        return {"applied": self.applied, "not_applied": [n.to_json() for n in self.not_applied],
                "run": self.run.describe(), "record": self.record.to_json(), "invocations": self.invocations,
                "backend_calls": self.backend_calls}


@dataclass(frozen=True)
class IsolateResult:
    """The culprit choices, the builds that were classified, and the cost."""

    isolation: Isolation
    builds: tuple[dict[str, Any], ...]
    differing: int
    not_applied: Mapping[str, tuple[NotApplied, ...]]  # per culprit group index, from its replay
    invocations: Mapping[str, int]
    seconds: float
    good: TacticRecord
    bad: TacticRecord
    bad_signature: Signature = field(default_factory=lambda: Signature.from_json({"kind": "none"}))
    #: role -> {"runs", "compiles", "compile_cache_hits"}: :attr:`invocations` with the builds they made
    #: (:mod:`graphbisect.backends.cost`; a replay of a record built before reuses its build)
    backend_calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return bool(self.isolation.culprits)

    # The --json fields that are the isolation's, as typed attributes.
    @property
    def culprits(self) -> tuple[ChoiceChange, ...]:
        """Every culprit choice (the groups' choices, in order); JSON adds whether its replay applied it."""
        return self.isolation.culprits

    @property
    def groups(self) -> tuple[tuple[ChoiceChange, ...], ...]:
        """The 1-minimal groups of choices, each of which alone turns the good build bad."""
        return self.isolation.groups

    @property
    def confirmed(self) -> bool:
        """The bad build with every culprit reverted passes (nothing else matters)."""
        return self.isolation.confirmed

    @property
    def minimal(self) -> bool:
        return self.isolation.minimal

    @property
    def verdict(self) -> str:
        """Why the search stopped, in words."""
        return self.isolation.verdict

    @property
    def differing_choices(self) -> int:
        """How many (node, choice) pairs differ between the good and the bad build (:attr:`differing`)."""
        return self.differing

    def to_json(self) -> dict[str, object]:
        unapplied = {n.node for group in self.not_applied.values() for n in group}
        return {
            "culprits": [{**c.to_json(), "applied": c.node not in unapplied} for c in self.culprits],
            "groups": [[c.node for c in g] for g in self.groups],
            "confirmed": self.confirmed, "minimal": self.minimal,
            "verdict": self.verdict, "differing_choices": self.differing_choices,
            "bad_signature": self.bad_signature.to_json(), "builds": list(self.builds),
            "invocations": dict(self.invocations),
            "backend_calls": {role: dict(calls) for role, calls in self.backend_calls.items()},
            "seconds": round(self.seconds, 3),
        }


def _tactics_spec(target: BackendSpec | str) -> BackendSpec:
    spec, info = resolve(target)
    if not info.has(Capability.TACTICS):
        with_tactics = ", ".join(b.name for b in _backends_with_tactics())
        raise SpecError(f"backend {info.name!r} cannot record or replay kernel choices",
                        hint=f"use a backend with the tactics capability: {with_tactics}")
    return spec


def _backends_with_tactics() -> list[Any]:
    from graphbisect.backends.registry import all_backends

    return [b for b in all_backends() if b.has(Capability.TACTICS)]


def _prepare(model: Model, inputs: Mapping[str, np.ndarray] | None, workdir: Path, seed: int) -> tuple[Path, Path]:
    feeds = validate_inputs(model, inputs) if inputs is not None else random_inputs(model, seed=seed)
    inputs_path = save_inputs(workdir / "inputs.npz", feeds)
    refs = write_weights_file(model, workdir / "weights.bin")
    onnx_path = save_proto(strip_to_external(model.proto, refs), workdir / "model.onnx")
    return onnx_path, inputs_path


def _record_of(run: RunResult, what: str) -> TacticRecord:
    if not run.ok:
        raise BackendError(f"the target failed to build or run {what}: {run.describe()}",
                           hint="a crashing build has no tactic record; reduce the crash with `graphbisect reduce`")
    data = run.info.get("tactic_record")
    if not isinstance(data, dict):
        raise BackendError(f"the target reported no tactic record for {what}",
                           hint="its runtime must fill info['tactic_record'] when report_tactics=1")
    return TacticRecord.from_json(data)


def record_tactics(model: Model, target: BackendSpec | str, *, inputs: Mapping[str, np.ndarray] | None = None,
                   workdir: Path | None = None, seed: int = 0) -> RecordResult:
    """Build and run ``model`` once on ``target`` and return the build's tactic record."""
    spec = _tactics_spec(target).with_options(report_tactics="1")
    with work_folder(workdir, "tactics", protect=(model.path,)) as (work, _kept):
        onnx_path, inputs_path = _prepare(model, inputs, work, seed)
        with BackendProcess(spec, workdir=work / "target") as proc:
            run = proc.run(onnx_path, inputs_path, output_dir=work / "outputs")
        return RecordResult(_record_of(run, "the model"), run)


class _Builder:
    """One target worker that builds the model with whatever record is in its candidate file."""

    def __init__(self, target: BackendSpec, work: Path, onnx_path: Path, inputs_path: Path) -> None:
        self.candidate = (work / "candidate-tactics.json").absolute()
        self.onnx_path, self.inputs_path = onnx_path, inputs_path
        self.spec = target.with_options(tactics=str(self.candidate), report_tactics="1")
        self.proc = BackendProcess(self.spec, workdir=work / "target")
        self.fresh_builds = 0

    def build(self, record: TacticRecord, *, fresh: bool = False) -> ReplayResult:
        """Build and run with ``record`` forced.

        The worker reuses a session while the model *file* is the same, so each distinct record gets its
        own copy of the (weightless: weights are external) model file: same record, same session. With
        ``fresh``, the copy is new whatever the record, so the target builds again (one of ``--builds N``).
        """
        save_record(record, self.candidate)
        digest = hashlib.sha256(json.dumps(record.to_json(), sort_keys=True).encode()).hexdigest()[:16]
        if fresh:
            self.fresh_builds += 1
            digest = f"build{self.fresh_builds}-{digest}"
        model_path = self.onnx_path.with_name(f"model-{digest}.onnx")
        if not model_path.exists():
            shutil.copyfile(self.onnx_path, model_path)
        run = self.proc.run(model_path, self.inputs_path)
        actual = _record_of(run, "the replay") if run.ok else record
        not_applied = tuple(NotApplied(str(d["node"]), str(d["requested"]), str(d["used"]))
                            for d in run.info.get("tactics_not_applied", ()))
        return ReplayResult(record, actual, not_applied, run)

    def close(self) -> None:
        self.proc.close()


def replay_tactics(model: Model, target: BackendSpec | str, record: TacticRecord, *,
                   inputs: Mapping[str, np.ndarray] | None = None, workdir: Path | None = None,
                   seed: int = 0) -> ReplayResult:
    """Build ``model`` on ``target`` with ``record`` forced; report what took effect (outputs are kept)."""
    spec = _tactics_spec(target)
    with work_folder(workdir, "tactics", protect=(model.path,)) as (work, _kept):
        onnx_path, inputs_path = _prepare(model, inputs, work, seed)
        builder = _Builder(spec, work, onnx_path, inputs_path)
        try:
            result = builder.build(record)
            outputs = {k: np.array(v) for k, v in result.run.outputs.items()}
        finally:
            builder.close()
    # the outputs copied before the worker's folder goes; what ran it and what it compiled kept
    run = replace(result.run, outputs=outputs)
    return ReplayResult(result.requested, result.actual, result.not_applied, run)


@dataclass
class _Judge:
    """The verdict of a build: reference outputs, tolerance and the model's outputs."""

    reference: Mapping[str, np.ndarray]
    tolerance: Tolerance
    outputs: Sequence[str]

    def signature(self, run: RunResult) -> Signature:
        return judge(run, self.reference.__getitem__, self.outputs, self.tolerance).signature


#: ``builds``: 0 (good and bad records are given) or enough builds to find a good and a bad one.
_BUILDS = Allowed("0 (with good and bad records) or a whole number >= 2",
                  lambda v: whole(0).test(v) and v != 1, "4")


def isolate_tactics(
    model: Model,
    target: BackendSpec | str,
    *,
    good: TacticRecord | None = None,
    bad: TacticRecord | None = None,
    builds: int = 0,
    perturb: Sequence[str] = (),
    oracle: BackendSpec | str | None = None,
    tolerance: Tolerance | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    workdir: Path | None = None,
    seed: int = 0,
    max_invocations: int | None = None,
) -> IsolateResult:
    """The minimal (node, choice) pairs that make a good build bad, confirmed by replay.

    Give ``good`` and ``bad`` records, or ``builds`` (>= 2): that many target builds are recorded and
    sorted by their verdict (each compiled anew, nothing pinned; with ``perturb`` implementation names,
    every build after the first asks for them on a random half of the nodes: a way to find a bad kernel on
    a deterministic backend).
    """
    started = time.monotonic()
    check_value("isolate_tactics", "builds", builds, _BUILDS)
    check_value("isolate_tactics", "max_invocations", max_invocations, INVOCATIONS)
    spec = _tactics_spec(target)
    with work_folder(workdir, "tactics", protect=(model.path,)) as (work, _kept):
        onnx_path, inputs_path = _prepare(model, inputs, work, seed)
        builder = _Builder(spec, work, onnx_path, inputs_path)
        calls = CallTally({"oracle": Cost()})
        try:
            verdict = _reference(model, oracle, tolerance, builder, good=good, inputs_path=inputs_path,
                                 onnx_path=onnx_path, work=work, calls=calls)
            pair, build_rows = _pick_pair(builder, verdict, good, bad, builds=builds, perturb=perturb, seed=seed)
            result = _isolate(builder, verdict, pair, max_invocations)
        finally:
            builder.close()
        calls.add("target", builder.proc.cost)
    isolation, not_applied, bad_signature = result
    return IsolateResult(isolation, tuple(build_rows), TacticSpace.between(*pair).size, not_applied,
                         calls.runs(), time.monotonic() - started, pair[0], pair[1], bad_signature,
                         backend_calls=calls.to_json())


def _reference(model: Model, oracle: BackendSpec | str | None, tolerance: Tolerance | None, builder: _Builder, *,
               good: TacticRecord | None, inputs_path: Path, onnx_path: Path, work: Path,
               calls: CallTally) -> _Judge:
    """The reference outputs: the oracle's, or (no oracle) the good build's with a bit-exact comparison."""
    if oracle is not None:
        with BackendProcess(oracle, workdir=work / "oracle") as proc:
            run = proc.run(onnx_path, inputs_path, output_dir=work / "oracle-outputs")
            calls.add("oracle", proc.cost)
        if not run.ok:
            raise BackendError(f"the oracle {oracle} failed: {run.describe()}", hint=oracle_failed_hint(oracle, run))
        require_outputs(run, model.output_names, oracle)
        return _Judge(run.outputs, tolerance or Tolerance(), model.output_names)
    if good is None:
        raise SpecError("isolating tactics among builds needs an oracle",
                        hint="pass oracle=SPEC, or give the good and the bad record (good=, bad=)",
                        cli_hint="pass --oracle SPEC, or give the good and the bad record (--good, --bad)")
    replay = builder.build(good)
    if not replay.run.ok:
        raise BackendError(f"the good build, replayed, fails: {replay.run.describe()}",
                           hint="swap the records, or give an oracle (oracle=SPEC)",
                           cli_hint="swap the records, or give an --oracle")
    reference = {k: np.array(v) for k, v in replay.run.outputs.items()}
    return _Judge(reference, tolerance or EXACT, model.output_names)


def _pick_pair(builder: _Builder, verdict: _Judge, good: TacticRecord | None, bad: TacticRecord | None, *,
               builds: int, perturb: Sequence[str], seed: int) -> tuple[tuple[TacticRecord, TacticRecord], list[dict]]:
    if good is not None and bad is not None:
        return (good, bad), [{"index": 0, "role": "good", "given": True}, {"index": 1, "role": "bad", "given": True}]
    if builds < 2:
        raise SpecError("isolate needs a good and a bad record, or N >= 2 builds to sort",
                        hint="e.g. graphbisect.tactics.isolate('model.onnx', good=a, bad=b), or builds=4",
                        cli_hint="e.g. graphbisect tactics isolate model.onnx --good a.json --bad b.json, "
                                 "or --builds 4")
    return _classify_builds(builder, verdict, builds, perturb, seed)


def _classify_builds(builder: _Builder, verdict: _Judge, builds: int, perturb: Sequence[str],
                     seed: int) -> tuple[tuple[TacticRecord, TacticRecord], list[dict]]:
    """Record ``builds`` builds (perturbed after the first when asked) and take the first good and bad.

    Every build is compiled anew (never a session an earlier build left in the worker), and without
    ``perturb`` asks for nothing: pinning the first build's kernels would force every later build to repeat
    them, so a build that chooses other kernels could never be seen. Each row says whether the worker
    really built it (``fresh``) and how many choices it pinned.
    """
    rng = random.Random(seed)
    rows: list[dict] = []
    good = bad = None
    base: TacticRecord | None = None
    empty = TacticRecord("", None, None)  # nothing pinned: the backend's own choice
    for index in range(builds):
        wish = _perturbed(base, perturb, rng) if base is not None and perturb else empty
        replay = builder.build(wish, fresh=True)
        signature = verdict.signature(replay.run)
        record = replay.actual if replay.run.ok else wish
        base = base or record
        rows.append({"index": index, "role": "bad" if signature.failed else "good", "signature": signature.to_json(),
                     "fresh": not replay.run.info.get("session_reused", False),
                     "pinned": _count(replay.run.info.get("tactics_pinned")),
                     "differs_from_first": sum(1 for _ in _changed(base, record))})
        if signature.failed and bad is None:
            bad = record
        if not signature.failed and good is None:
            good = record
    if good is None or bad is None:
        raise BackendError(f"all {builds} builds were {'bad' if good is None else 'good'}: nothing to bisect",
                           hint=_no_pair_hint(all_bad=good is None, builds=builds, perturb=perturb, cli=False),
                           cli_hint=_no_pair_hint(all_bad=good is None, builds=builds, perturb=perturb, cli=True))
    return (good, bad), rows


#: What ``perturb`` may ask for where nothing else is known to work: the reference kernel every OpenVINO CPU
#: node has (an unknown name fails the build).
_PERTURB_DEFAULT = "ref_any"


def _no_pair_hint(*, all_bad: bool, builds: int, perturb: Sequence[str], cli: bool) -> str:
    """What to try when the builds gave no good and bad pair: never the perturbation that was just tried.

    Example:
        >>> _no_pair_hint(all_bad=False, builds=4, perturb=["ref_any"], cli=True).split(", or ")
        ['no build chose a failing kernel: build more often (--builds 8)', 'perturb with other implementations \
than ref_any (--perturb NAME;NAME, names a record of this target shows: graphbisect tactics record)', 'give --good \
and --bad records']
    """
    more = "--builds" if cli else "builds="
    more = f"{more} {2 * builds}" if cli else f"{more}{2 * builds}"
    if perturb:
        flag = "--perturb NAME;NAME" if cli else "perturb=[NAME, ...]"
        lister = "graphbisect tactics record" if cli else "graphbisect.tactics.record(model)"
        kernels = (f"perturb with other implementations than {';'.join(perturb)} ({flag}, names a record of this "
                   f"target shows: {lister})")
    else:
        kernels = f"perturb the kernels ({'--perturb ' if cli else 'perturb=['}{_PERTURB_DEFAULT}{'' if cli else ']'})"
    records = "--good and --bad records" if cli else "the good and the bad record (good=, bad=)"
    if all_bad:
        tolerance = "--atol/--rtol" if cli else "atol=/rtol="
        return (f"every build fails against the oracle: if that is the target's own noise, loosen {tolerance}; "
                f"else {kernels}, or give {records}")
    return f"no build chose a failing kernel: build more often ({more}), or {kernels}, or give {records}"


def _count(items: object) -> int | None:
    """How many pins a build reported (None: it reported none, e.g. it crashed while loading)."""
    return len(items) if isinstance(items, (dict, list)) else None


def _changed(a: TacticRecord, b: TacticRecord) -> Iterator[str]:
    have = a.as_dict()
    return (c.node for c in b.choices if c.node in have and have[c.node].choice != c.choice)


def _perturbed(base: TacticRecord, perturb: Sequence[str], rng: random.Random) -> TacticRecord:
    return base.with_choices({c.node: rng.choice(list(perturb)) for c in base.choices if rng.random() < 0.5})


def _isolate(builder: _Builder, verdict: _Judge, pair: tuple[TacticRecord, TacticRecord],
             max_invocations: int | None) -> tuple[Isolation, dict[str, tuple[NotApplied, ...]], Signature]:
    space = TacticSpace.between(*pair)
    bad_replay = builder.build(space.record_for(range(space.size)))
    bad_signature = verdict.signature(bad_replay.run)
    test = _tester(builder, verdict, space, bad_signature)
    evaluator = Evaluator(test, space.size, allow_empty=True, budget=Budget(max_invocations=max_invocations))
    evaluator.record(evaluator.universe, TestResult(
        Outcome.FAIL if bad_signature.failed else Outcome.PASS, detail={"not_applied": bad_replay.not_applied}))
    isolation = isolate(space, evaluator)
    not_applied = {}
    for index, group in enumerate(isolation.groups):
        keep = frozenset(space.changes.index(c) for c in group)
        cached = evaluator.cache.get(keep)
        detail = cached.detail if cached is not None and isinstance(cached.detail, dict) else {}
        not_applied[str(index)] = tuple(n for n in detail.get("not_applied", ()) if n.node in {c.node for c in group})
    logger.info("tactic isolation: %s after %d invocations", isolation.verdict, evaluator.invocations)
    return isolation, not_applied, bad_signature


def _tester(builder: _Builder, verdict: _Judge, space: TacticSpace,
            bad_signature: Signature) -> Callable[[frozenset[int]], TestResult]:
    def test(keep: frozenset[int]) -> TestResult:
        replay = builder.build(space.record_for(keep))
        signature = verdict.signature(replay.run)
        if bad_signature.matches(signature):
            outcome = Outcome.FAIL
        elif not signature.failed:
            outcome = Outcome.PASS
        else:
            outcome = Outcome.UNRESOLVED
        return TestResult(outcome, detail={"signature": signature.describe(), "not_applied": replay.not_applied})

    return test
