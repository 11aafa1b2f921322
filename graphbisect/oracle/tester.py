"""The verdict on one candidate: materialize → save → run the target in an isolated worker → compare → judge.

This is the test function the engine is given. Its contract with the engine:

* ``FAIL``: the candidate fails with a signature that *matches* the baseline's (the same bug);
* ``PASS``: the target agrees with the oracle on the candidate;
* ``UNRESOLVED``: a different failure (never accepted: no drift to another bug), or a candidate that could
  not be made valid — the latter costs no backend invocation (``invoked=False``).

With ``repeats=n`` (a target seen to be flaky) a candidate is accepted only when ``n`` more runs of it fail
the same way too: a failure that does not repeat is UNRESOLVED, never the step a result rests on.

Expected values come from the oracle's activation store, so judging a candidate costs one target run.

**A failure at compile is tested by compiling.** When the baseline crashed while the target built the model
(a compiler's diagnostic or crash, a session that cannot be created: :attr:`FailureKind.CRASH_LOAD`), a
candidate is only built (:meth:`BackendProcess.compile <graphbisect.backends.process.BackendProcess.compile>`),
never run: a build that fails is judged as the run's crash would be (the same phase and message), and a build
that succeeds cannot fail that way whatever the run would do (a run's crash is at run), so it is a PASS. The
verdicts that decide the search (FAIL or not) are the ones a run gives; a candidate that builds and would then
have failed otherwise (UNRESOLVED) is a PASS, which every search treats alike. Each such test is a compile and
no run (:mod:`graphbisect.backends.cost`). ``GRAPHBISECT_COMPILE_ONLY=off`` (:data:`COMPILE_ONLY_ENV`) runs every
candidate as before, for a benchmark's "before".

**A region compiled otherwise is seen at build.** A wrong result whose identity names the node the target compiled
there (a fused ``LayerNormalization`` made by ``LayerNormFusion``) fails the same way only where the candidate's
build makes that node again. On a target that says what it compiled once it has built a model
(``BackendInfo.described_at_build``: ONNX Runtime's saved optimized model), a candidate that keeps a part of the
region is built first; where the build made no such node it is UNRESOLVED without a run (a compile and no run),
and otherwise its run uses that build (``CandidateTester(build_decides=True)``).

**What a test cost is in its result.** Each invoked result's ``detail`` carries ``cost``: the runs and compiles
of its calls (a flaky target's repeats and a describing worker's included), so the journal that records the
result records its cost with it, in the same line. A search's backend calls are the sum over its journal
(:func:`journal_cost`): a run killed mid-search (``kill -9``) and resumed counts what the killed session ran.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import queue
import re
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from graphbisect.backends import BackendProcess, BackendSpec, RunResult
from graphbisect.backends.cost import Cost
from graphbisect.backends.process import CompareTo
from graphbisect.compare import Comparison, Tolerance, compare_outputs
from graphbisect.engine import Outcome, TestResult
from graphbisect.engine.journal import KILLED_DETAIL
from graphbisect.errors import GraphBisectError, InputError
from graphbisect.localize.compiled import CompiledGraph, compiled_graph, describes
from graphbisect.model.io import remove_model
from graphbisect.oracle.floor import NoiseFloor
from graphbisect.oracle.identity import IdentityCheck
from graphbisect.oracle.signature import (
    CHECK_REJECTED,
    EXACT_ROOTED,
    EXACT_VALUES,
    FailureKind,
    ModelNames,
    Signature,
    failing_above,
    signature_of,
)
from graphbisect.storage.values import is_exact, numpy_dtype
from graphbisect.strategies.subgraph import Candidate, SubgraphSpace, check_file

__all__ = ["BUILT_ONLY", "BUILT_OTHERWISE", "COMPILE_ONLY_ENV", "CandidateTester", "Judgement", "OutputCheck",
           "TargetPool", "WorkerPool", "check_accepts", "compiled_of", "compiles_only", "journal_cost",
           "judge", "model_digest"]

#: The run info key of a build that decided its candidate without a run (``run_built_first``): why, as
#: :meth:`IdentityCheck.compiled_differs` says it.
BUILT_OTHERWISE = "built_otherwise"
#: The run info key (true) of a ``run_built_first`` result that is its build alone: decided (``BUILT_OTHERWISE``),
#: or a crash at load, which a run would have reported as well.
BUILT_ONLY = "built_only"

#: A Python check: ``check(outputs, expected) -> bool``, True when the target's outputs are acceptable.
OutputCheck = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], bool]

log = logging.getLogger(__name__)

#: The environment variable that, set to ``off``, makes a compile-failure search run its candidates as any other
#: search does (compile and run) instead of only compiling them: a benchmark's "before" in the same build.
COMPILE_ONLY_ENV = "GRAPHBISECT_COMPILE_ONLY"


def compiles_only(baseline: Signature, fail_regex: re.Pattern[str] | None = None) -> bool:
    """Whether candidates of a search for ``baseline`` are tested by building them alone (see the module
    docstring): a crash at load, judged by its signature (a ``--fail-regex`` may match what a run prints),
    unless :data:`COMPILE_ONLY_ENV` is ``off``.

    Example:
        >>> compiles_only(Signature(FailureKind.CRASH_LOAD, "IreeCompileError: failed to legalize ..."))
        True
        >>> compiles_only(Signature(FailureKind.CRASH_RUN, "RuntimeError: ..."))
        False
    """
    if os.environ.get(COMPILE_ONLY_ENV, "").strip().lower() in ("0", "off", "no"):
        return False
    return fail_regex is None and baseline.kind is FailureKind.CRASH_LOAD


class TargetRunner(Protocol):
    def run(self, model: str | Path, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None,
            ) -> RunResult: ...

    def compile(self, model: str | Path, outputs: Sequence[str] | None = None) -> RunResult: ...


class TargetPool(Protocol):
    """Where candidate runs go: :class:`WorkerPool` (this machine's target workers) or an
    :class:`~graphbisect.executors.candidates.ExecutorPool` (tasks on Ray or local processes)."""

    def acquire(self) -> contextlib.AbstractContextManager[TargetRunner]: ...

    @property
    def invocations(self) -> int: ...

    @property
    def cost(self) -> Cost:
        """The runs so far and what they compiled (:mod:`graphbisect.backends.cost`)."""
        ...

    def close(self) -> None: ...


class WorkerPool:
    """``size`` isolated target workers shared by parallel candidate evaluations (one run per worker at a time).

    The worker released last is handed out first, and a worker starts on its first run: a caller that runs
    fewer candidates at once than the pool has workers (a serial phase; ``precision --jobs`` capped by memory
    after its first run) starts no more workers than it runs at once, and reuses warm ones."""

    def __init__(self, spec: BackendSpec | str, size: int, workdir: Path, *, timeout: float | None = None) -> None:
        self.procs = [BackendProcess(spec, workdir=workdir / f"worker-{i}", timeout=timeout) for i in range(size)]
        self._free: queue.LifoQueue[BackendProcess] = queue.LifoQueue()
        for proc in reversed(self.procs):  # worker-0 first
            self._free.put(proc)

    @contextlib.contextmanager
    def acquire(self) -> Iterator[BackendProcess]:
        proc = self._free.get()
        try:
            yield proc
        finally:
            self._free.put(proc)

    def run(self, model: str | Path, inputs: Mapping[str, np.ndarray] | str | Path,
            outputs: Sequence[str] | None = None, *, compare_to: CompareTo | None = None) -> RunResult:
        """Run ``model`` on the next free worker (callers in parallel threads each get their own)."""
        with self.acquire() as proc:
            return proc.run(model, inputs, outputs, compare_to=compare_to)

    @property
    def invocations(self) -> int:
        return sum(proc.invocations for proc in self.procs)

    @property
    def cost(self) -> Cost:
        """Every worker's runs and compiles (:attr:`BackendProcess.cost`), summed."""
        return sum((proc.cost for proc in self.procs), Cost())

    def close(self) -> None:
        for proc in self.procs:
            proc.close()


class Judgement:
    """A run of the target judged against expected values."""

    def __init__(self, run: RunResult, comparison: Comparison | None, signature: Signature,
                 floor: NoiseFloor | None = None) -> None:
        self.run, self.comparison, self.signature = run, comparison, signature
        self.other_identity: str | None = None  # why a failure of the baseline's kind is another one
        self.built_otherwise = False  # not run: its build compiled the identity's region otherwise
        self.compiled: CompiledGraph | None = None  # what its build said it compiled, where one came first
        #: the outputs that fail above the target's noise floor (every failing one without a floor)
        self.failing = failing_above(comparison, floor)

    @property
    def failing_tensors(self) -> list[str]:
        return [s.name for s in self.failing]


def judge(run: RunResult, expected: Callable[[str], np.ndarray], outputs: Sequence[str], tol: Tolerance,
          fail_regex: re.Pattern[str] | None = None, *, check: OutputCheck | None = None,
          floor: NoiseFloor | None = None, names: Collection[str] = ()) -> Judgement:
    """Compare a target run with the oracle's values of ``outputs`` and compute its failure signature.

    ``check`` (a Python callable) replaces the tolerance as the verdict on a run that completed: it gets the
    target's values of ``outputs`` and the oracle's, and returns True when they are acceptable. The
    comparison is still computed, for the report. ``floor``: the target's noise floor; a value mismatch within
    its margin is kernel precision, not a failure (:mod:`graphbisect.oracle.floor`). ``names``: the model's node
    and tensor names, taken out of a crash's message (:class:`~graphbisect.oracle.signature.ModelNames`; every
    run a workflow compares must get the same ones, those of the model it started from).
    """
    comparison = None
    if run.ok:
        comparison = compare_outputs({name: expected(name) for name in outputs}, run.outputs, tol, outputs)
    signature = signature_of(run, comparison, fail_regex=fail_regex, floor=floor, names=names)
    if check is not None and run.ok and fail_regex is None:
        signature = Signature(FailureKind.NONE) if check_accepts(check, run, expected, outputs) else \
            Signature(FailureKind.MISMATCH, CHECK_REJECTED)
    return Judgement(run, comparison, signature, floor)


def check_accepts(check: OutputCheck, run: RunResult, expected: Callable[[str], np.ndarray],
                  outputs: Sequence[str]) -> bool:
    """The Python ``check``'s verdict on a completed run: ``check(the run's values of outputs, the oracle's)``.
    Raises :class:`~graphbisect.errors.InputError` naming the check when it raises."""
    produced = {name: run.outputs[name] for name in outputs if name in run.outputs}
    try:
        return bool(check(produced, {name: expected(name) for name in outputs}))
    except Exception as exc:
        name = getattr(check, "__qualname__", repr(check))
        raise InputError(f"the Python check {name} raised {type(exc).__name__}: {exc} "
                         f"(outputs {', '.join(produced)})",
                         hint="the check gets every candidate's outputs (the tensors it computes, not only the "
                         "model's outputs) as dicts of arrays by name; make it return True or False for any "
                         "of them") from exc


class CandidateTester:
    """The engine's test function for subgraph candidates (see the module docstring)."""

    def __init__(self, space: SubgraphSpace, pool: TargetPool, baseline: Signature, tol: Tolerance, *,
                 fail_regex: re.Pattern[str] | None = None, strict_band: bool = False, compare: bool = True,
                 check: OutputCheck | None = None, repeats: int = 0, floor: NoiseFloor | None = None,
                 identity: IdentityCheck | None = None, describing: TargetPool | None = None,
                 names: Collection[str] | None = None, build_decides: bool = False) -> None:
        """``compare=False``: the target's exit status is the verdict (an external check), no output is compared.
        ``check``: a Python callable judges the outputs instead of the tolerance (see :func:`judge`).
        ``repeats``: extra runs a failing candidate must fail the same way in before it is accepted.
        ``floor``: the target's noise floor. ``identity``: the baseline's identity (where it first goes wrong,
        what the target compiled there): a candidate failing otherwise is a different failure.
        ``names``: taken out of crash messages (default: the space's model's, which hold every candidate's);
        the baseline's signature must have been computed with the same.

        ``describing``: where candidates run that must say what they compiled (the target's
        ``describing_spec``), when the identity names a compiled node: those that keep a part of its region,
        whose nodes may then be fused otherwise. A candidate keeping the whole region runs plain (describing costs
        ONNX Runtime a copy of every weight per run), though it may compile the region as another kernel kind
        (OpenVINO: a PRelu fed by a MatMul is an ``Eltwise``, alone a Snippets ``Subgraph``). The final model is
        re-verified describing (reduce's ``_verify``), which records what it compiles the region as.

        ``build_decides``: the describing target says what it compiled once it has built the model
        (``BackendInfo.described_at_build``). Each described candidate is then built first: one whose build
        compiled the region otherwise cannot fail the same way whatever its run computes
        (:meth:`IdentityCheck.compiled_differs`), so it is not run (UNRESOLVED, one compile and no run: the
        cheapest call that decides it); the others run on that build (the same worker, or the same executor
        task). Not on a flaky target, where only a run's pass proves a node needed."""
        self.space, self.pool, self.baseline, self.tol = space, pool, baseline, tol
        self.names: Collection[str] = ModelNames(space.model.proto) if names is None else names
        self.fail_regex, self.strict_band, self.compare, self.check = fail_regex, strict_band, compare, check
        self.repeats, self.floor, self.identity, self.describing = repeats, floor, identity, describing
        #: candidates are built, not run: the baseline crashed at load (see the module docstring)
        self.compile_only = compiles_only(baseline, fail_regex)
        self.other_identity = 0  # candidates that failed like the baseline by kind, but with another identity
        self._region: frozenset[int] = frozenset()
        if identity is not None and identity.identity.compiled_kind is not None and describing is not None:
            index = dict(zip(space.model.node_names, range(len(space.model.nodes)), strict=True))
            self._region = frozenset(index[name] for name in identity.identity.region if name in index)
        self.build_decides = build_decides and not repeats and compare and identity is not None and \
            not self.compile_only
        self.built_otherwise = 0  # candidates decided by their build: the region compiled otherwise, not run
        self._counting = threading.Lock()  # candidates are tested on several threads at once (--jobs)
        self.unrepeated = 0  # candidates that failed like the baseline once, then did not
        #: keep-set → digest of the exact model the target ran, for the candidates that failed like the baseline:
        #: the only ones a search accepts, so the only final models a re-verification is compared with (hashing
        #: every candidate cost 3.5 ms each at 50,000 nodes for nothing)
        self.tested: dict[frozenset[int], str] = {}
        self._gate: bool | None = None  # whether onnx.checker may veto candidates (decided on first use)

    def __call__(self, keep: frozenset[int]) -> TestResult:
        try:
            candidate = self.space.materialize(keep)
        except KeyError as exc:
            return TestResult(Outcome.UNRESOLVED, invoked=False, detail=f"no oracle value for cut tensor {exc}")
        if not candidate.outputs:
            return TestResult(Outcome.UNRESOLVED, invoked=False, detail="candidate has no comparable output")
        impossible = self._cannot_match(candidate)
        if impossible:
            return TestResult(Outcome.UNRESOLVED, invoked=False, detail=impossible)
        path = self.space.workdir / f"candidate-{next(_NAMES)}.onnx"
        candidate.save(path, durable=False)  # deleted after its run: no fsync
        try:
            invalid = self.space.check(candidate, path) if self._checker_gates() else None
            if invalid:
                log.warning("skipping an invalid candidate of %d nodes: %s", len(keep), invalid)
                return TestResult(Outcome.UNRESOLVED, invoked=False, detail=f"invalid model: {invalid}")
            outputs = candidate.outputs if self.compare else ()
            described = self.describing is not None and bool(self._region & keep) and not self._region <= keep
            with (self.describing if described and self.describing is not None else self.pool).acquire() as proc:
                built, cost, compiled = self._build_first(proc, path, candidate) if described else (None, Cost(), None)
                verdict = built if built is not None else self._attempt(proc, path, candidate, outputs)
                if built is None:
                    cost += self._cost(verdict.run)
                    if verdict.run.info.get("session_reused"):  # it ran on that build: what it compiled is known
                        verdict.compiled = compiled
                outcome = Outcome.UNRESOLVED if verdict.built_otherwise else \
                    self._outcome(verdict, candidate, len(keep))
                for _ in range(self.repeats if outcome is Outcome.FAIL else 0):
                    again = self._attempt(proc, path, candidate, outputs)
                    cost += self._cost(again.run)
                    if self._outcome(again, candidate, len(keep)) is not Outcome.FAIL:
                        self.unrepeated += 1
                        log.info("candidate of %d nodes failed like the baseline once, then gave %s: not accepted",
                                 len(keep), again.signature.describe())
                        outcome, verdict = Outcome.UNRESOLVED, again
                        break
            if outcome is Outcome.FAIL:
                self.tested[keep] = candidate.digest
        finally:
            remove_model(path)
        detail: dict[str, object] = {"signature": verdict.signature.to_json(), "failing": verdict.failing_tensors,
                                     "cost": cost.to_json()}
        if verdict.other_identity:
            detail["identity"] = verdict.other_identity
        if self.compile_only or verdict.built_otherwise:
            detail["compiled_only"] = True
        return TestResult(outcome, invoked=True, detail=detail)

    def _build_first(self, proc: TargetRunner, path: Path, candidate: Candidate
                     ) -> tuple[Judgement | None, Cost, CompiledGraph | None]:
        """With :attr:`build_decides`: build the candidate, and where the build compiled the region otherwise (or
        crashed: a run would crash the same way at load) its judgement, which no run can change; else None (the
        run that follows uses this build). And what the build cost, and what it compiled (the run reports the same
        description: its identity check reuses it). A runner that builds, decides and runs in one call
        (``run_built_first``: an executor's task, whose next call may go to another worker) returns the run's
        judgement too, and what both cost."""
        if not self.build_decides or self.identity is None:
            return None, Cost(), None
        in_one = getattr(proc, "run_built_first", None)
        if in_one is not None:  # an executor's task builds, decides and runs on its worker: one task, one build
            ran = in_one(path, candidate.feeds, candidate.outputs, self.identity)
            if not ran.info.get(BUILT_ONLY):  # it ran: judged as any run
                return self._judge(ran, candidate.outputs), Cost.of_run(ran), None
            cost = Cost(0, ran.compiles, ran.compile_cache_hits)
            why = ran.info.get(BUILT_OTHERWISE)  # none: its build crashed, as a run would have at load
            return (self._judge(ran, ()) if why is None else self._decided(ran, str(why))), cost, None
        built = proc.compile(path)
        cost = Cost(0, built.compiles, built.compile_cache_hits)
        if not built.ok:
            return self._judge(built, ()), cost, None
        compiled = candidate_compiled(candidate, built)
        why = self.identity.compiled_differs(compiled)
        return (None if why is None else self._decided(built, why)), cost, compiled

    def _decided(self, built: RunResult, why: str) -> Judgement:
        """The verdict on a candidate its build decided (:meth:`_build_first`): no run, another identity."""
        with self._counting:
            self.built_otherwise += 1
        verdict = Judgement(built, None, Signature(FailureKind.NONE))
        verdict.other_identity, verdict.built_otherwise = f"{why} (seen at build, not run)", True
        return verdict

    def _judge(self, run: RunResult, outputs: Sequence[str]) -> Judgement:
        """:func:`judge` of one target call on a candidate, with this tester's tolerance, check and floor."""
        return judge(run, self.space.values, outputs, self.tol, self.fail_regex, check=self.check, floor=self.floor,
                     names=self.names)

    def _attempt(self, proc: TargetRunner, path: Path, candidate: Candidate, outputs: Sequence[str]) -> Judgement:
        """One target call on the saved candidate, judged: a build alone when :attr:`compile_only` (a build that
        succeeds is no failure: the baseline's happens at load), else a run."""
        if self.compile_only:
            built = proc.compile(path)
            return Judgement(built, None, Signature(FailureKind.NONE)) if built.ok else self._judge(built, outputs)
        return self._judge(proc.run(path, candidate.feeds), outputs)

    def _cost(self, call: RunResult) -> Cost:
        """What one :meth:`_attempt` cost: a build alone (:attr:`compile_only`) is compiles and no run."""
        return Cost(0, call.compiles, call.compile_cache_hits) if self.compile_only else Cost.of_run(call)

    def _outcome(self, verdict: Judgement, candidate: Candidate, nodes: int) -> Outcome:
        if self.baseline.matches(verdict.signature, strict_band=self.strict_band):
            why = self.identity_differs(verdict, candidate)
            if why is None:
                return Outcome.FAIL
            verdict.other_identity = why
            self.other_identity += 1
            log.debug("candidate of %d nodes fails with another identity: %s", nodes, why)
            return Outcome.UNRESOLVED
        if verdict.signature.failed:
            log.debug("candidate of %d nodes fails differently: %s", nodes, verdict.signature.describe())
            return Outcome.UNRESOLVED
        return Outcome.PASS

    def identity_differs(self, verdict: Judgement, candidate: Candidate) -> str | None:
        """Why a run that fails like the baseline by kind is another failure (None: it is the same one). What
        the target compiled is matched too when the run described it."""
        place, made, _ = self.identity_parts(verdict, candidate)
        return place or made

    def identity_parts(self, verdict: Judgement, candidate: Candidate,
                       ) -> tuple[str | None, str | None, CompiledGraph | None]:
        """:meth:`identity_differs` in its two parts: (why the run's values fail elsewhere or otherwise, why what
        it says it compiled is not what the identity recorded, what it compiled: None when it did not say)."""
        if self.identity is None or verdict.comparison is None:
            return None, None, None
        compiled = verdict.compiled
        if compiled is None and self.identity.identity.compiled_kind is not None:
            compiled = candidate_compiled(candidate, verdict.run)
        compared = {s.name: s for s in verdict.comparison.outputs}
        return (self.identity.place_differs(verdict.failing, compared), self.identity.compiled_differs(compiled),
                compiled)

    def _checker_gates(self) -> bool:
        """Whether ``onnx.checker`` may veto candidates: only when the model itself passes it. Runtimes load
        models the checker refuses (an input of unknown rank, as converters write them); vetoing those
        would skip every candidate without a run and call the untouched model minimal."""
        if self._gate is None:
            path = self.space.workdir / "whole-model-check.onnx"
            self.space.materialize(range(self.space.size)).save(path, durable=False)
            try:
                invalid = check_file(path)
            finally:
                remove_model(path)
            self._gate = invalid is None
            if invalid:
                log.warning("the model itself fails onnx.checker (%s); candidates are not vetoed by it", invalid)
        return self._gate

    def _cannot_match(self, candidate: Candidate) -> str | None:
        """Why the candidate cannot fail like the baseline whatever the target does, judged from the types
        of its outputs alone (None when it can): an integer/boolean flip needs an integer or boolean output,
        a float error or a NaN a float one (an error rooted in integers, an output of either class). Such
        candidates would cost a run and end UNRESOLVED or PASS, which the search treats alike, so they are not run."""
        if not self.compare or self.baseline.kind not in (FailureKind.MISMATCH, FailureKind.NAN) or \
                self.baseline.detail in (CHECK_REJECTED, EXACT_ROOTED):
            return None
        kinds = {_value_class(elem_type) for elem_type in candidate.output_types}
        if self.baseline.detail == EXACT_VALUES:
            return None if kinds - {"float"} else "no integer/boolean output, and the failure is an integer flip"
        return None if kinds - {"exact"} else "no float output, and the failure is a float error"


def journal_cost(results: Iterable[TestResult], *, compile_only: bool) -> Cost:
    """The backend calls behind the journaled results of a :class:`CandidateTester` (see the module docstring).

    A result that killed the run testing it (:data:`~graphbisect.engine.journal.KILLED_DETAIL`) counts as one
    call of the search's kind (a build alone when ``compile_only``), the one it was making (a candidate killed
    while the build that could decide it was still going counts as a run: one run too many at most); a result
    of a journal written before costs were recorded counts nothing (its calls are in the state file's count).

    Example:
        >>> from graphbisect.engine.journal import KILLED_DETAIL
        >>> ran = TestResult(Outcome.FAIL, detail={"cost": {"runs": 2, "compiles": 2}})
        >>> journal_cost([ran, TestResult(Outcome.UNRESOLVED, detail=KILLED_DETAIL),
        ...               TestResult(Outcome.UNRESOLVED, invoked=False)], compile_only=False)
        Cost(runs=3, compiles=2, compile_cache_hits=0)
    """
    total = Cost()
    for result in results:
        if not result.invoked:
            continue
        if result.detail == KILLED_DETAIL:
            total += Cost(compiles=1) if compile_only else Cost(runs=1)
        elif isinstance(result.detail, Mapping) and isinstance(result.detail.get("cost"), Mapping):
            total += Cost.from_json(result.detail["cost"])
    return total


def compiled_of(proto: onnx.ModelProto, outputs: Sequence[str], run: RunResult) -> CompiledGraph | None:
    """What the target compiled for a call on the model ``proto`` (graph outputs ``outputs``): a describing spec's
    run (or, where ``BackendInfo.described_at_build``, build) info, mapped onto its nodes; None when it did not
    describe it."""
    if not run.ok or not describes(run.info):
        return None
    return compiled_graph(proto.graph.node, outputs, run.info, constants={t.name: t for t in proto.graph.initializer})


def candidate_compiled(candidate: Candidate, run: RunResult) -> CompiledGraph | None:
    """:func:`compiled_of` a candidate's call."""
    return compiled_of(candidate.proto, candidate.outputs, run)


def _value_class(elem_type: int) -> str:
    """"exact" (integer, boolean), "float", or "unknown" (no type: could be either)."""
    if not elem_type:
        return "unknown"
    try:
        return "exact" if is_exact(np.empty(0, numpy_dtype(elem_type))) else "float"
    except (KeyError, ValueError, GraphBisectError):  # types graphbisect cannot hold
        return "unknown"


def model_digest(proto: onnx.ModelProto) -> str:
    """sha256 of a model's deterministic serialization: two candidates are the same model when equal."""
    return hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()


#: Candidate file names, unique in this process (parallel evaluations never share one). A counter, not a
#: hash of the node set: sorting and hashing 50,000 indices cost 5-8 ms per candidate.
_NAMES = itertools.count()
