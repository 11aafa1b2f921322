"""Cache, budget, interruption, errors, progress and parallel evaluation."""

from __future__ import annotations

import io
import itertools
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from engine_helpers import Recorder, any_clause

from graphbisect.cli.progress import ProgressLine
from graphbisect.engine import (
    Budget,
    BudgetExhausted,
    Evaluator,
    Outcome,
    Pass,
    ProgressEvent,
    Reducer,
    SearchAborted,
    SearchResult,
    StopReason,
    TestResult,
    ddmin,
    probdd,
    sweep,
)

ALGORITHMS: dict[str, Callable[..., SearchResult]] = {"ddmin": ddmin, "probdd": probdd, "sweep": sweep}


def test_cache_hits_never_call_the_test() -> None:
    test = Recorder({3})
    ev = Evaluator(test, 64)
    first = ddmin(ev)
    calls = len(test.calls)
    second = probdd(ev)  # same evaluator: its whole path may be cached already
    assert first.keep == second.keep == {3}
    assert len(test.calls) == calls + second.stats.runs
    assert second.stats.cache_hits == second.stats.tests - second.stats.runs
    again = ddmin(ev)
    assert again.stats.runs == 0 and again.stats.cache_hits == again.stats.tests > 0
    assert len(set(test.calls)) == len(test.calls), "no keep-set is tested twice"


def test_record_seeds_the_cache() -> None:
    test = Recorder({1})
    ev = Evaluator(test, 4)
    ev.record({0, 1, 2}, Outcome.FAIL)
    assert ev.evaluate({0, 1, 2}).outcome is Outcome.FAIL and test.calls == []


def test_budget_exhaustion_returns_best_so_far_not_minimal() -> None:
    test = Recorder({10, 900})
    result = ddmin(Evaluator(test, 1024, budget=Budget(max_invocations=7)))
    assert result.stop_reason is StopReason.MAX_INVOCATIONS and not result.minimal
    assert result.stats.invocations == 7 == len(test.calls)
    assert {10, 900} <= result.keep and len(result.keep) < 1024
    assert result.history[-1] == (result.history[-1][0], len(result.keep))


def test_rejected_candidates_are_not_charged_to_the_budget() -> None:
    def test(keep: frozenset[int]) -> TestResult:
        if len(keep) % 2:  # odd-sized candidates are rejected before the backend runs
            return TestResult(Outcome.UNRESOLVED, invoked=False)
        return TestResult(Outcome.FAIL if {1, 2} <= keep else Outcome.PASS)

    ev = Evaluator(test, 64, budget=Budget(max_invocations=1000))
    result = probdd(ev)
    assert result.stats.invocations < result.stats.runs
    assert ev.meter.spent == result.stats.invocations


def test_deadline_stops_the_search() -> None:
    now = [0.0]

    def slow(keep: frozenset[int]) -> Outcome:
        now[0] += 10.0  # each backend run takes ten (fake) seconds
        return Outcome.FAIL if 5 in keep else Outcome.PASS

    result = ddmin(Evaluator(slow, 1024, budget=Budget(deadline_seconds=35.0), clock=lambda: now[0]))
    assert result.stop_reason is StopReason.DEADLINE and not result.minimal
    assert result.stats.invocations == 4 and 5 in result.keep


def test_evaluate_raises_budget_exhausted_but_serves_cache_hits() -> None:
    ev = Evaluator(Recorder({1}), 4, budget=Budget(max_invocations=1))
    ev.evaluate({1, 2})
    assert ev.evaluate({2, 1}).outcome is Outcome.FAIL
    with pytest.raises(BudgetExhausted) as info:
        ev.evaluate({1})
    assert info.value.reason is StopReason.MAX_INVOCATIONS


def interrupting(after: int, culprits: set[int]) -> Recorder:
    test = Recorder(culprits)
    inner = test.predicate

    def predicate(keep: frozenset[int]) -> bool:
        if len(test.calls) > after:
            raise KeyboardInterrupt
        return inner(keep)

    test.predicate = predicate
    return test


@pytest.mark.parametrize("name", ALGORITHMS)
def test_ctrl_c_returns_best_so_far(name: str) -> None:
    test = interrupting(8, {100, 101})
    result = ALGORITHMS[name](Evaluator(test, 256))
    assert result.stop_reason is StopReason.INTERRUPTED and not result.minimal
    assert {100, 101} <= result.keep
    if name != "sweep":
        assert len(result.keep) < 256  # progress made before Ctrl-C is kept
    assert result.stats.runs == 8  # the interrupted test has no result


def test_ctrl_c_inside_a_parallel_batch() -> None:
    test = interrupting(12, {7})
    with ThreadPoolExecutor(4) as pool:
        result = ddmin(Evaluator(test, 512, jobs=4, executor=pool))
    assert result.stop_reason is StopReason.INTERRUPTED and 7 in result.keep and len(result.keep) < 512


def test_a_raising_test_aborts_with_the_cause_and_the_best_so_far() -> None:
    test = Recorder({3})
    inner = test.predicate

    def predicate(keep: frozenset[int]) -> bool:
        if len(test.calls) == 5:
            raise ValueError("harness bug")
        return inner(keep)

    test.predicate = predicate
    with pytest.raises(SearchAborted, match="ValueError: harness bug") as info:
        ddmin(Evaluator(test, 64))
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.result.stop_reason is StopReason.ERROR and 3 in info.value.result.keep
    assert len(info.value.result.keep) < 64


def test_progress_events_track_the_search() -> None:
    events: list[ProgressEvent] = []
    result = probdd(Evaluator(Recorder({9, 99}), 128, on_progress=events.append, budget=Budget(max_invocations=500)))
    assert events and all(e.start_size == 128 and e.max_invocations == 500 for e in events)
    tests = [e.tests for e in events]
    sizes = [e.best_size for e in events if e.best_size is not None]
    assert tests == sorted(tests) and sizes == sorted(sizes, reverse=True)
    assert events[-1].best_size == len(result.keep) == 2
    assert events[-1].invocations == result.stats.invocations
    assert {e.phase for e in events} >= {"probdd", "sweep"}


def test_progress_counts_the_runs_the_best_sets_proof_still_needs() -> None:
    """The progress line's expected remaining cost: during the sweep, the best set's single removals not tested
    yet, one fewer per test, 0 when the result is proven 1-minimal; a removal tested earlier is not counted."""
    culprits = {3, 17, 40, 41, 90}
    events: list[ProgressEvent] = []
    ev = Evaluator(Recorder(culprits), 128, on_progress=events.append)
    ev.evaluate(frozenset(culprits) - {40})  # one proof step made before the search: cached
    result = sweep(ev, hints=[culprits | {7}])
    assert result.keep == culprits and result.minimal
    proving = [(e.invocations, e.proof_runs) for e in events if e.best_size == len(culprits)]
    assert proving[0][1] == len(culprits) - 1  # the removal of 40 is known to pass
    assert all(later[1] == first[1] - (later[0] - first[0]) for first, later in itertools.pairwise(proving))
    assert proving[-1][1] == 0 and events[-1].seconds_per_run is not None and events[-1].seconds_per_run > 0
    # the line says it once a smaller set fails: the whole start set's proof is no estimate of what is left
    lines = [_line(e) for e in events]
    assert all("1-minimal in" not in line for e, line in zip(events, lines) if e.best_size == 128)
    assert f"| 1-minimal in {proving[0][1]} runs ~" in lines[events.index(next(e for e in events if e.best_size == 5))]


def _line(event: ProgressEvent) -> str:
    """What the CLI's progress line shows on a terminal for ``event``."""
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    ProgressLine(stream)(event)
    return stream.getvalue()


# -- parallel evaluation -------------------------------------------------------------------------------


class SlowThreadSafe(Recorder):
    """Records calls under a lock and sleeps a little so that runs really overlap."""

    def __init__(self, predicate: Callable[[frozenset[int]], bool]) -> None:
        super().__init__(predicate=predicate)
        self.lock = threading.Lock()
        self.overlap = 0
        self.running = 0

    def __call__(self, keep: frozenset[int]) -> Outcome:
        with self.lock:
            self.calls.append(keep)
            self.running += 1
            self.overlap = max(self.overlap, self.running)
        threading.Event().wait(0.0005)
        with self.lock:
            self.running -= 1
        return Outcome.FAIL if self.predicate(keep) else Outcome.PASS


CASES = [
    (256, [[17]]),
    (256, [[3, 250]]),
    (300, [[10, 11, 12, 200], [40, 41, 42, 43, 44]]),
    (64, [[i] for i in range(0, 64, 9)]),
]


@pytest.mark.parametrize("name", [*ALGORITHMS, "reducer"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_parallel_results_are_identical_to_serial(name: str, case: int) -> None:
    n, clauses = CASES[case]
    fails = any_clause(clauses)

    def search(ev: Evaluator) -> SearchResult:
        if name == "reducer":
            blocks = Pass(
                "blocks", ddmin, partition=lambda keep: [[u for u in keep if u // 16 == b] for b in range(n // 16 + 1)]
            )
            return Reducer(ev, [blocks, Pass("units", probdd)]).run(hints=[range(n // 2)])
        return ALGORITHMS[name](ev)

    serial = search(Evaluator(Recorder(predicate=fails), n))
    test = SlowThreadSafe(fails)
    with ThreadPoolExecutor(4) as pool:
        parallel = search(Evaluator(test, n, jobs=4, executor=pool))
    assert parallel.keep == serial.keep and parallel.minimal == serial.minimal
    assert [size for _, size in parallel.history] == [size for _, size in serial.history]
    assert parallel.stats.tests == serial.stats.tests  # the serial path, request for request
    # Only what actually ran is counted; whatever ran beyond the serial path is reported as speculative.
    s = parallel.stats
    assert s.tests == s.cache_hits + s.runs - s.speculative
    assert s.runs == len(test.calls) == len(set(test.calls))
    assert s.invocations == s.runs
    if name != "sweep" or case == 3:
        assert test.overlap > 1, "candidates really ran concurrently"


def test_parallel_with_an_owned_pool_and_a_map_executor() -> None:
    fails = any_clause([[5, 60]])
    serial = probdd(Evaluator(Recorder(predicate=fails), 128))
    with Evaluator(SlowThreadSafe(fails), 128, jobs=3) as ev:  # makes its own thread pool
        owned = probdd(ev)
    with ThreadPoolExecutor(3) as pool:
        mapped = probdd(Evaluator(Recorder(predicate=fails), 128, jobs=3, executor=pool.map))
    assert owned.keep == mapped.keep == serial.keep == {5, 60}
    assert owned.stats.tests == mapped.stats.tests == serial.stats.tests


def test_parallel_budget_counts_speculative_runs() -> None:
    with ThreadPoolExecutor(4) as pool:
        result = ddmin(Evaluator(SlowThreadSafe(any_clause([[1, 200]])), 256, jobs=4, executor=pool, budget=Budget(12)))
    assert result.stop_reason is StopReason.MAX_INVOCATIONS and result.stats.invocations == 12


@pytest.mark.parametrize("seed", range(10))
def test_parallel_equals_serial_on_random_failures(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([20, 50, 120])
    clauses = [rng.sample(range(n), rng.randint(1, 4)) for _ in range(rng.randint(1, 3))]
    for search in (ddmin, probdd):
        serial = search(Evaluator(Recorder(predicate=any_clause(clauses)), n))
        parallel = search(Evaluator(Recorder(predicate=any_clause(clauses)), n, jobs=4, executor=_inline_map))
        assert parallel.keep == serial.keep and parallel.stats.tests == serial.stats.tests


def _inline_map(fn: Callable[[frozenset[int]], Any], keeps: Sequence[frozenset[int]]) -> list[Any]:
    return [fn(k) for k in keeps]
