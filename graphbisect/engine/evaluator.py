"""The evaluator: every candidate of every search goes through here.

An :class:`Evaluator` owns what one reduction run shares across its searches: the injected test, the
closure over units, the outcome cache, the journal, the budget meter, the statistics, the progress
callback and the (optional) parallel executor. Strategies create one per unit space and hand it to as
many searches as they like (:func:`ddmin`, :func:`probdd`, the bisection helpers, a :class:`Reducer`),
so a candidate tested by one search is free for the next and the budget covers them all.

Parallel evaluation keeps results identical to ``jobs=1``: :meth:`Evaluator.first_fail` answers "which is
the first of these candidates, in this order, that fails?" exactly like the serial loop would, but runs up
to ``jobs`` of the not-yet-cached candidates at once. The price is *speculation*: when candidate 0 fails,
the runs of candidates 1..jobs-1 were not needed. They are cached, counted in ``Counts.speculative`` and
charged to the budget (a parallel run may therefore stop earlier on ``max_invocations`` than a serial one).

Example:
    >>> from graphbisect.engine import Evaluator, Outcome
    >>> ev = Evaluator(lambda keep: Outcome.FAIL if 5 in keep else Outcome.PASS, n=8)
    >>> ev.first_fail([frozenset({1, 2}), frozenset({5, 6}), frozenset({5})], phase="demo")
    1
    >>> ev.stats().tests, ev.stats().invocations
    (2, 2)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from graphbisect.engine.arena import share_main_arena
from graphbisect.engine.budget import Budget, BudgetMeter
from graphbisect.engine.cache import OutcomeCache, encode_key
from graphbisect.engine.journal import Journal
from graphbisect.engine.types import (
    BudgetExhausted,
    Closure,
    Counts,
    MapFunction,
    Outcome,
    ProgressCallback,
    ProgressEvent,
    SearchStats,
    SubmitExecutor,
    TestFunction,
    TestResult,
)

__all__ = ["Evaluator"]

logger = logging.getLogger(__name__)

_EXHAUSTED: Any = object()  # end-of-candidates sentinel (None is a valid, skipped, candidate)


@dataclass
class _Tally:
    """Mutable twin of :class:`Counts`, one per phase."""

    tests: int = 0
    cache_hits: int = 0
    replayed: int = 0
    runs: int = 0
    invocations: int = 0
    fails: int = 0
    passes: int = 0
    unresolved: int = 0
    speculative: int = 0
    skipped: int = 0

    def freeze(self) -> Counts:
        return Counts(**vars(self))

    def count_run(self, result: TestResult) -> None:
        self.runs += 1
        self.invocations += int(result.invoked)
        if result.outcome is Outcome.FAIL:
            self.fails += 1
        elif result.outcome is Outcome.PASS:
            self.passes += 1
        else:
            self.unresolved += 1


class Evaluator:
    """Tests candidates for the searches: closure, cache, journal, budget, statistics, parallelism.

    Args:
        test: decides a keep-set (see :class:`~graphbisect.engine.types.TestFunction`).
        n: number of units; the universe is ``range(n)``.
        closure: completes every candidate before it is tested and cached (dependencies kept together).
        cache: share one cache between evaluators of the same unit space and test; a new one by default.
        journal: crash-safe record; its finished entries for ``scope`` pre-populate the cache.
        scope: the journal namespace of this unit space.
        budget: invocation and wall-time limits, shared by all searches of this evaluator.
        jobs: how many candidates may be tested at once; needs a thread-safe (or picklable) ``test``.
        executor: a ``concurrent.futures`` executor or a ``map``-style callable; for ``jobs > 1`` without
            one, the evaluator makes (and owns) a thread pool: call :meth:`shutdown` or use ``with``.
        on_progress: called with a :class:`ProgressEvent` after every batch of tests.
        allow_empty: whether the empty keep-set is a candidate; by default it is assumed not to fail
            (an empty model reproduces nothing), so it is never tested.
        clock: time source (tests inject a fake one).
    """

    def __init__(
        self,
        test: TestFunction | Callable[[frozenset[int]], Outcome | TestResult],
        n: int,
        *,
        closure: Closure | Callable[[frozenset[int]], Iterable[int]] | None = None,
        cache: OutcomeCache | None = None,
        journal: Journal | None = None,
        scope: str = "",
        budget: Budget | None = None,
        jobs: int = 1,
        executor: SubmitExecutor | MapFunction | None = None,
        on_progress: ProgressCallback | Callable[[ProgressEvent], None] | None = None,
        allow_empty: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if n < 0:
            raise ValueError(f"the number of units must be >= 0, got {n}")
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        self.test = test
        self.n = n
        self.closure = closure
        self.cache = cache if cache is not None else OutcomeCache()
        self.journal = journal
        self.scope = scope
        self.meter = BudgetMeter(budget or Budget(), clock=clock)
        self.jobs = jobs
        self.on_progress = on_progress
        self.allow_empty = allow_empty
        self._executor = executor
        self._owned_pool: ThreadPoolExecutor | None = None
        self._tallies: dict[str, _Tally] = {}
        self._reused: set[str] = set()  # journal results of an earlier session that this one used
        self.start_size: int | None = None
        self.best_size: int | None = None
        #: ``(runs, size)`` at the start and at each new smallest failing set, across every search this
        #: evaluator serves (a plan's hints, slices and sweeps alike), runs as :attr:`runs` counts them
        self.journey: list[tuple[int, int]] = []
        #: ``(runs, size, failed)`` for every candidate run, in the order the runs ended (runs as :attr:`runs`
        #: counts them, an earlier session's replayed from the journal where this one used it): what the
        #: search tested, of which :attr:`journey` holds the accepted steps
        self.trail: list[tuple[int, int, bool]] = []
        #: the runs the current best set still needs to be proven 1-minimal (a :class:`SearchRun
        #: <graphbisect.engine.search.SearchRun>` sets it; :class:`ProgressEvent` ``proof_runs``)
        self.proof_runs: Callable[[], int | None] | None = None
        if journal is not None:
            self._load(journal)

    # -- public API --------------------------------------------------------------------------------

    @property
    def universe(self) -> frozenset[int]:
        """All units, ``{0, ..., n-1}``."""
        return frozenset(range(self.n))

    @property
    def invocations(self) -> int:
        """Backend invocations so far, over all searches of this evaluator."""
        return self.meter.spent

    @property
    def runs(self) -> int:
        """Backend runs behind the results used so far: this session's invocations plus the earlier sessions'
        runs it replayed from the journal, each once. A resumed search's journey is measured in these, so the
        steps made before the stop keep their place instead of all collapsing onto the start."""
        return self.meter.spent + len(self._reused)

    def apply_closure(self, keep: Iterable[int]) -> frozenset[int]:
        """The candidate that is actually tested (and cached) for ``keep``."""
        keep = frozenset(keep)
        return keep if self.closure is None else frozenset(self.closure(keep))

    def is_candidate(self, keep: frozenset[int]) -> bool:
        """Whether ``keep`` may be tested at all (the empty set only with ``allow_empty``)."""
        return bool(keep) or self.allow_empty

    def evaluate(self, keep: Iterable[int], *, phase: str = "evaluate") -> TestResult:
        """Test one keep-set (after closure), through the cache. Raises :class:`BudgetExhausted`.

        Example:
            >>> from graphbisect.engine import Evaluator, Outcome
            >>> ev = Evaluator(lambda keep: Outcome.FAIL, n=4)
            >>> ev.evaluate({1}).outcome, ev.evaluate({1}).outcome, ev.stats().cache_hits
            (<Outcome.FAIL: 'fail'>, <Outcome.FAIL: 'fail'>, 1)
        """
        closed = self.apply_closure(keep)
        self.first_fail([closed], phase=phase)
        result = self.cache.get(closed)
        assert result is not None  # first_fail ran or found it
        return result

    def record(self, keep: Iterable[int], result: Outcome | TestResult) -> None:
        """Seed the cache with a known result, e.g. the baseline run of the full model (not journaled)."""
        self.cache.put(self.apply_closure(keep), TestResult.of(result))

    def first_fail(self, keeps: Iterable[frozenset[int] | None], *, phase: str) -> int | None:
        """Index of the first keep-set that FAILs, testing in order and stopping there, as serially.

        ``keeps`` are tested as given (callers apply the closure) and may be a lazy iterable, consumed
        only as far as needed; a ``None`` entry is a candidate the caller skipped (counted, never
        tested). Up to ``jobs`` uncached candidates run at once; runs past the winner are speculative.
        Raises :class:`BudgetExhausted` when the next candidate in order needs an invocation and the
        budget has none left.
        """
        found = self.find_first_fail(keeps, phase=phase)
        return None if found is None else found[0]

    def find_first_fail(
        self, keeps: Iterable[frozenset[int] | None], *, phase: str
    ) -> tuple[int, frozenset[int]] | None:
        """Like :meth:`first_fail`, also returning the failing keep-set."""
        source = iter(keeps)
        buffer: list[tuple[str, frozenset[int]] | None] = []  # pulled from source, not yet scanned
        offset = 0
        while True:
            end, pending = self._window(source, buffer)
            if end == 0:
                return None
            fresh = self._run_many([entry for i in pending if (entry := buffer[i]) is not None], phase)
            winner = self._scan(buffer, end, fresh, phase)
            self._emit(phase)
            if winner is not None:
                entry = buffer[winner]
                assert entry is not None
                return offset + winner, entry[1]
            offset += end
            del buffer[:end]

    def count_skipped(self, phase: str, count: int = 1) -> None:
        """Note candidates a search dropped without testing (no smaller than its current set)."""
        self._tally(phase).skipped += count

    def set_best(self, size: int, *, phase: str, start: bool = False) -> None:
        """Tell progress listeners the size of the current best failing set (a smaller one extends
        :attr:`journey`)."""
        if start and self.start_size is None:
            self.start_size = size
        if not self.journey or size < self.journey[-1][1]:
            self.journey.append((self.runs, size))
        self.best_size = size
        self.meter.best = size
        self._emit(phase)

    def stats(self) -> SearchStats:
        """Cumulative statistics of this evaluator (diff two snapshots with ``SearchStats.since``)."""
        return SearchStats.build({name: t.freeze() for name, t in self._tallies.items()}, self.meter.elapsed())

    def shutdown(self) -> None:
        """Release the thread pool this evaluator made for ``jobs > 1`` (not an injected executor)."""
        if self._owned_pool is not None:
            self._owned_pool.shutdown(wait=True)
            self._owned_pool = None

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    # -- batching ----------------------------------------------------------------------------------

    def _window(
        self, source: Iterator[frozenset[int] | None], buffer: list[tuple[str, frozenset[int]] | None]
    ) -> tuple[int, list[int]]:
        """Plan the next batch: ``buffer[:end]``, and which positions must run (first of each key).

        Pulls candidates from ``source`` into ``buffer`` as needed. The window ends after a cached FAIL
        (nothing behind it can matter) or before the first uncached candidate that does not fit into the
        free slots; ``end == 0`` means the candidates are exhausted.
        """
        slots = self.meter.slots(self.jobs)
        pending: dict[str, int] = {}
        end = 0
        while True:
            if end == len(buffer):
                item = next(source, _EXHAUSTED)
                if item is _EXHAUSTED:
                    break
                buffer.append(None if item is None else (encode_key(item), item))
            entry = buffer[end]
            cached = None if entry is None else self.cache.get(entry[0])
            if entry is not None and cached is None and entry[0] not in pending:
                if len(pending) >= slots:
                    break
                pending[entry[0]] = end
            end += 1
            if cached is not None and cached.outcome is Outcome.FAIL:
                break
        if end == 0 and buffer:
            reason = self.meter.reason()
            assert reason is not None  # no slot although the next candidate needs one
            raise BudgetExhausted(reason)
        return end, list(pending.values())

    def _scan(
        self, buffer: list[tuple[str, frozenset[int]] | None], end: int, fresh: dict[str, TestResult], phase: str
    ) -> int | None:
        """Account for ``buffer[:end]`` in serial order and find its first FAIL."""
        tally = self._tally(phase)
        unclaimed = set(fresh)  # runs not yet attributed to a position of the serial path
        for i in range(end):
            entry = buffer[i]
            if entry is None:
                tally.skipped += 1
                continue
            key = entry[0]
            tally.tests += 1
            result = self.cache.get(key)
            assert result is not None
            if key in unclaimed:
                unclaimed.discard(key)
            else:
                tally.cache_hits += 1
                if self.cache.was_replayed(key):
                    tally.replayed += 1
                    if key not in self._reused:
                        self._reused.add(key)
                        self.trail.append((self.runs, len(entry[1]), result.outcome is Outcome.FAIL))
            if result.outcome is Outcome.FAIL:
                tally.speculative += len(unclaimed)
                return i
        return None

    # -- running -----------------------------------------------------------------------------------

    def _run_many(self, batch: list[tuple[str, frozenset[int]]], phase: str) -> dict[str, TestResult]:
        if not batch:
            return {}
        if self.jobs == 1 or len(batch) == 1:
            return {key: self._run_one(key, keep, phase) for key, keep in batch}
        executor = self._parallel_executor()
        if hasattr(executor, "submit"):
            return self._run_submitted(executor, batch, phase)
        return self._run_mapped(executor, batch, phase)

    def _run_one(self, key: str, keep: frozenset[int], phase: str) -> TestResult:
        self._begin(key)
        try:
            raw = self.test(keep)
        except BaseException:
            self._abort(key)
            raise
        return self._store(key, raw, phase, len(keep))

    def _run_submitted(
        self, executor: SubmitExecutor, batch: list[tuple[str, frozenset[int]]], phase: str
    ) -> dict[str, TestResult]:
        futures: dict[Future[Any], str] = {}
        done: dict[str, TestResult] = {}
        try:
            sizes = {key: len(keep) for key, keep in batch}
            for key, keep in batch:
                self._begin(key)
                futures[executor.submit(self.test, keep)] = key
            # Record each result as soon as it exists: if we die later, it is not lost.
            for future in as_completed(futures):
                key = futures[future]
                done[key] = self._store(key, future.result(), phase, sizes[key])
        except BaseException:
            self._abandon(futures, done)
            raise
        return done

    def _run_mapped(
        self, mapper: MapFunction, batch: list[tuple[str, frozenset[int]]], phase: str
    ) -> dict[str, TestResult]:
        done: dict[str, TestResult] = {}
        try:
            for key, _ in batch:
                self._begin(key)
            # strict=False: a short answer is reported below with a clearer message than zip's.
            results = mapper(self.test, [keep for _, keep in batch])
            for (key, keep), raw in zip(batch, results, strict=False):
                done[key] = self._store(key, raw, phase, len(keep))
        except BaseException:
            for key, _ in batch:
                if key not in done:
                    self._abort(key)
            raise
        if len(done) != len(batch):
            raise RuntimeError(f"the map executor returned {len(done)} results for {len(batch)} candidates")
        return done

    def _abandon(self, futures: dict[Future[Any], str], done: dict[str, TestResult]) -> None:
        for future, key in futures.items():
            if key not in done:
                future.cancel()
                self._abort(key)

    def _parallel_executor(self) -> SubmitExecutor | MapFunction:
        if self._executor is not None:
            return self._executor
        if self._owned_pool is None:
            share_main_arena()  # else each thread's arena returns and re-faults every candidate's pages
            self._owned_pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="graphbisect-test")
        return self._owned_pool

    def _store(self, key: str, raw: Any, phase: str, size: int) -> TestResult:
        try:
            result = TestResult.of(raw)
        except TypeError:
            self._abort(key)  # a wrong return type is a bug to fix, not a crash to skip on resume
            raise
        self.cache.put(key, result)
        self._tally(phase).count_run(result)
        self.meter.charge(int(result.invoked), failed=result.outcome is Outcome.FAIL)
        self.trail.append((self.runs, size, result.outcome is Outcome.FAIL))
        if self.journal is not None:
            self.journal.finish(key, result, scope=self.scope)
        logger.debug("%s: {%s} -> %s", phase, key, result.outcome.value)
        return result

    def _begin(self, key: str) -> None:
        if self.journal is not None:
            self.journal.begin(key, scope=self.scope)

    def _abort(self, key: str) -> None:
        if self.journal is not None:
            self.journal.abort(key, scope=self.scope)

    # -- bookkeeping -------------------------------------------------------------------------------

    def _load(self, journal: Journal) -> None:
        replayed = journal.completed(self.scope)
        for key, result in replayed.items():
            self.cache.put(key, result, replayed=True)
        if replayed:
            logger.info("resumed %d finished tests from journal %s", len(replayed), journal.path)

    def _tally(self, phase: str) -> _Tally:
        return self._tallies.setdefault(phase, _Tally())

    def _emit(self, phase: str) -> None:
        if self.on_progress is None:
            return
        total = sum((t.freeze() for t in self._tallies.values()), Counts())
        budget = self.meter.budget
        elapsed = self.meter.elapsed()
        self.on_progress(
            ProgressEvent(
                phase=phase,
                tests=total.tests,
                invocations=total.invocations,
                cache_hits=total.cache_hits,
                start_size=self.start_size,
                best_size=self.best_size,
                elapsed_seconds=elapsed,
                max_invocations=budget.max_invocations,
                deadline_seconds=budget.deadline_seconds,
                proof_runs=self.proof_runs() if self.proof_runs is not None else None,
                seconds_per_run=elapsed / self.meter.spent if self.meter.spent else None,
            )
        )
