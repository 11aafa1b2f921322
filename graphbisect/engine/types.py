"""Values and plug-in interfaces of the reduction engine.

The engine knows nothing about models: a *unit* is an index ``0..n-1`` into the caller's list (nodes,
passes, precision pins, ...) and a *keep-set* is the ``frozenset`` of units a candidate keeps. The caller
injects a :class:`TestFunction` that answers, for a keep-set, whether the candidate still fails the same
way (:attr:`Outcome.FAIL`, "interesting"), does not fail (:attr:`Outcome.PASS`), or could not be judged
(:attr:`Outcome.UNRESOLVED`: invalid candidate, a different failure, a crash of the harness).

Example:
    >>> def test(keep: frozenset[int]) -> Outcome:
    ...     return Outcome.FAIL if 3 in keep else Outcome.PASS
    >>> TestResult.of(test(frozenset({3})))
    TestResult(outcome=<Outcome.FAIL: 'fail'>, invoked=True, detail=None)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from graphbisect.errors import GraphBisectError

__all__ = [
    "BudgetExhausted",
    "Closure",
    "Counts",
    "MapFunction",
    "Outcome",
    "ProgressCallback",
    "ProgressEvent",
    "SearchAborted",
    "SearchResult",
    "SearchStats",
    "StopReason",
    "SubmitExecutor",
    "TestFunction",
    "TestResult",
]


class Outcome(str, enum.Enum):
    """What one test of a candidate says. Only ``FAIL`` ("fails the same way") is interesting."""

    FAIL = "fail"
    PASS = "pass"
    UNRESOLVED = "unresolved"


@dataclass(frozen=True)
class TestResult:
    """An outcome plus what it cost.

    ``invoked`` tells the engine whether the backend actually ran: a candidate rejected before running
    (it failed validation, say) costs nothing and is not charged to the invocation budget. ``detail`` is
    free-form evidence (a failure signature, an error message) kept in the cache and the journal.

    Example:
        >>> TestResult(Outcome.UNRESOLVED, invoked=False, detail="dangling input").invoked
        False
    """

    __test__ = False  # not a pytest test class, despite the name

    outcome: Outcome
    invoked: bool = True
    detail: Any = None

    @classmethod
    def of(cls, value: Outcome | TestResult) -> TestResult:
        """Normalize what a :class:`TestFunction` returned; a bare outcome means the backend ran."""
        if isinstance(value, TestResult):
            return value
        if isinstance(value, Outcome):
            return cls(value)
        raise TypeError(f"the test function returned {value!r}; it must return an Outcome or a TestResult")


class StopReason(str, enum.Enum):
    """Why a search stopped before proving its result minimal (``SearchResult.stop_reason``)."""

    MAX_INVOCATIONS = "max_invocations"  # Budget.max_invocations backend invocations spent
    DEADLINE = "deadline"  # Budget.deadline_seconds elapsed
    INTERRUPTED = "interrupted"  # KeyboardInterrupt (Ctrl-C) during the search
    MAX_ROUNDS = "max_rounds"  # Reducer stopped after its round limit while still making progress
    ASSUMPTION = "assumption_violated"  # a bisection helper's precondition did not hold
    ERROR = "error"  # the test function raised (see SearchAborted)
    NO_PROGRESS = "no_progress"  # Budget.max_stall invocations in a row without a failing candidate


@dataclass(frozen=True)
class Counts:
    """Counters of one phase (or all phases) of a search.

    ``tests`` and ``cache_hits`` count what the *serial* algorithm asked for, so they are identical for
    any ``jobs``; ``runs`` counts calls of the test function, ``invocations`` those that ran the backend
    and ``speculative`` the runs a parallel evaluation made that the serial algorithm would not have.
    So ``tests == cache_hits + runs - speculative`` always holds.
    """

    tests: int = 0  # candidates evaluated (cache hits included)
    cache_hits: int = 0  # answered by the cache (or a resumed journal) without calling the test
    replayed: int = 0  # of the cache hits, those answered by a journal from an earlier run
    runs: int = 0  # calls of the test function
    invocations: int = 0  # runs that invoked the backend (TestResult.invoked)
    fails: int = 0  # outcomes of the runs ...
    passes: int = 0
    unresolved: int = 0
    speculative: int = 0  # runs made in parallel beyond the serial algorithm's path
    skipped: int = 0  # candidates dropped untested: no smaller than the current set after closure

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in _COUNT_FIELDS})

    def __sub__(self, other: Counts) -> Counts:
        return Counts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in _COUNT_FIELDS})


_COUNT_FIELDS = dataclasses.fields(Counts)


@dataclass(frozen=True)
class SearchStats(Counts):
    """Totals (the inherited :class:`Counts` fields), per-phase counts and elapsed wall time.

    Example:
        >>> stats = SearchStats(tests=3, phases=(("ddmin", Counts(tests=3)),))
        >>> stats.phase("ddmin").tests, stats.phase("sweep").tests
        (3, 0)
    """

    phases: tuple[tuple[str, Counts], ...] = ()
    seconds: float = 0.0

    @classmethod
    def build(cls, phases: Mapping[str, Counts], seconds: float) -> SearchStats:
        """Sum ``phases`` into totals; phases are kept sorted by name so equal runs compare equal."""
        total = sum(phases.values(), Counts())
        totals = {f.name: getattr(total, f.name) for f in _COUNT_FIELDS}
        return cls(**totals, phases=tuple(sorted(phases.items())), seconds=seconds)

    def phase(self, name: str) -> Counts:
        """The counts of one phase (all zero when the phase never ran)."""
        return dict(self.phases).get(name, Counts())

    def since(self, earlier: SearchStats) -> SearchStats:
        """What happened between ``earlier`` and this snapshot of the same evaluator."""
        before = dict(earlier.phases)
        phases = {name: counts - before.get(name, Counts()) for name, counts in self.phases}
        return SearchStats.build(
            {name: c for name, c in phases.items() if c != Counts()}, self.seconds - earlier.seconds
        )


@dataclass(frozen=True)
class SearchResult:
    """What a search returns: the smallest failing keep-set it found, and how it got there.

    ``minimal`` is true only when the search finished and proved the keep-set 1-minimal (no single unit,
    or atom, can be removed, closure applied, with the candidate still failing); otherwise ``stop_reason`` says why it
    stopped and ``keep`` is the best failing set found so far. ``history`` is the journey of best sizes
    as ``(backend runs so far, size)`` pairs, runs replayed from a journal included (``Evaluator.runs``).
    ``found`` is set by the bisection helpers: the prefix length (:func:`bisect_prefix`) or the culprit
    unit (:func:`find_one`). ``trail``: every candidate the search ran, as ``(runs so far, size, failed)``
    (``Evaluator.trail``), where ``history`` holds only the accepted steps; set by a plan over a whole
    evaluator (:func:`graphbisect.strategies.subgraph.plan`), () otherwise.

    Example:
        >>> r = SearchResult(frozenset({3}), minimal=True, stop_reason=None, stats=SearchStats(),
        ...                  history=((0, 8), (5, 1)))
        >>> sorted(r.keep), r.history[-1]
        ([3], (5, 1))
    """

    keep: frozenset[int]
    minimal: bool
    stop_reason: StopReason | None
    stats: SearchStats
    history: tuple[tuple[int, int], ...]
    found: int | None = None
    trail: tuple[tuple[int, int, bool], ...] = ()


@dataclass(frozen=True)
class ProgressEvent:
    """A snapshot for progress bars, sent to :class:`ProgressCallback` after every batch of tests (the
    ``on_progress`` callback of ``graphbisect.reduce``, ``passes`` and ``precision``: what the CLI's progress line
    draws).

    ``phase``: the step of the search (``hints``, ``cone``, ``probdd``, ``sweep``...); ``tests``: candidates
    tested so far, cache hits included; ``invocations``: backend runs they took; ``start_size`` and
    ``best_size``: the units (nodes, passes) at the start and in the smallest failing set so far (None before
    one is known); ``elapsed_seconds``; ``max_invocations`` and ``deadline_seconds``: the budget, when set.
    ``proof_runs``: the runs the current best set still needs before it can be called 1-minimal (its
    single removals not tested yet), were it the answer; None while it has more than
    :data:`~graphbisect.engine.search.PROOF_SHOWN_UP_TO` atoms (``PROOF_SHOWN_UP_TO_SINGLE`` when every atom is
    one unit and there is no closure, as in ``precision``) or no search holds one. A smaller failing
    set found meanwhile needs its own. ``seconds_per_run``: this session's elapsed time per invocation so
    far (None before the first), so ``proof_runs * seconds_per_run`` is what that proof would take at the
    pace so far: the expected remaining cost of a search that has found its answer.
    """

    phase: str
    tests: int
    invocations: int
    cache_hits: int
    start_size: int | None
    best_size: int | None
    elapsed_seconds: float
    max_invocations: int | None = None
    deadline_seconds: float | None = None
    proof_runs: int | None = None
    seconds_per_run: float | None = None


class BudgetExhausted(Exception):
    """Raised by :meth:`Evaluator.evaluate` when a test would need an invocation the budget lacks.

    The search functions catch it and return the best-so-far; callers of ``evaluate`` catch it likewise.
    """

    def __init__(self, reason: StopReason) -> None:
        super().__init__(f"search budget exhausted: {reason.value}")
        self.reason = reason


class SearchAborted(GraphBisectError):
    """The test function raised; ``result`` holds the best failing keep-set found before that.

    The original exception is the ``__cause__``: a debugging tool must never hide it.
    """

    def __init__(self, message: str, *, result: SearchResult, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.result = result


class TestFunction(Protocol):
    """Decide one candidate: does the model restricted to ``keep`` still fail the same way?"""

    def __call__(self, keep: frozenset[int], /) -> Outcome | TestResult: ...


class Closure(Protocol):
    """Complete a keep-set with what it needs (dependencies kept together); must return a superset."""

    def __call__(self, keep: frozenset[int], /) -> Iterable[int]: ...


class ProgressCallback(Protocol):
    """Receives :class:`ProgressEvent` snapshots; must be quick and must not raise."""

    def __call__(self, event: ProgressEvent, /) -> None: ...


class SubmitExecutor(Protocol):
    """The part of :class:`concurrent.futures.Executor` the engine uses (thread/process pools, Ray...)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]: ...


MapFunction = Callable[[Callable[[frozenset[int]], Any], Sequence[frozenset[int]]], Iterable[Any]]
"""A ``map``-style executor: ``mapper(test, keeps)`` yields the test's results in the order of ``keeps``."""
