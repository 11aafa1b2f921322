"""Bisection helpers and the multi-pass Reducer."""

from __future__ import annotations

import math

import pytest
from engine_helpers import Recorder, any_clause, assert_one_minimal, dependency_closure

from graphbisect.engine import (
    Budget,
    Evaluator,
    Pass,
    Reducer,
    StopReason,
    bisect_prefix,
    ddmin,
    find_one,
    probdd,
    sweep,
)


@pytest.mark.parametrize("n", [1, 2, 17, 128, 1024])
def test_bisect_prefix_finds_the_smallest_failing_prefix(n: int) -> None:
    for threshold in sorted({0, 1, n // 3, n - 1, n} - {0} if n > 1 else {1}):
        needed = frozenset(range(threshold))
        test = Recorder(needed)
        result = bisect_prefix(Evaluator(test, n))
        assert result.found == threshold and result.keep == set(range(threshold)) and result.minimal
        assert len(test.calls) <= math.ceil(math.log2(n + 1))


def test_bisect_prefix_follows_an_order_and_keeps_a_base() -> None:
    order = [9, 3, 7, 1, 5]  # e.g. a topological order
    test = Recorder({7, 0})
    result = bisect_prefix(Evaluator(test, 10), order, base={0})
    assert result.found == 3 and result.keep == {0, 9, 3, 7}
    assert all(0 in keep for keep in test.calls)


@pytest.mark.parametrize("n", [2, 3, 16, 100, 1024])
def test_find_one_is_a_binary_search(n: int) -> None:
    for culprit in {0, 1, n // 2, n - 1}:
        test = Recorder({culprit})
        result = find_one(Evaluator(test, n), range(n))
        assert result.found == culprit and result.keep == {culprit} and result.minimal
        assert len(test.calls) <= math.ceil(math.log2(n)) + 1


def test_find_one_beats_ddmin_and_probdd_for_a_single_culprit() -> None:
    totals = {"find_one": 0, "ddmin": 0, "probdd": 0}
    for culprit in range(0, 1024, 37):
        totals["find_one"] += find_one(Evaluator(Recorder({culprit}), 1024), range(1024)).stats.invocations
        totals["ddmin"] += ddmin(Evaluator(Recorder({culprit}), 1024)).stats.invocations
        totals["probdd"] += probdd(Evaluator(Recorder({culprit}), 1024)).stats.invocations
    assert totals["find_one"] < totals["ddmin"] and totals["find_one"] < totals["probdd"]


def test_find_one_with_a_base_and_a_violated_assumption() -> None:
    result = find_one(Evaluator(Recorder({2, 40}), 64), range(32, 64), base=range(0, 32))
    assert result.found == 40 and result.keep == set(range(32)) | {40}
    wrong = find_one(Evaluator(Recorder({3, 40}), 64), range(64))  # two culprits, not one
    assert wrong.stop_reason is StopReason.ASSUMPTION and not wrong.minimal and wrong.found is None
    assert {3, 40} <= wrong.keep


def test_bisection_under_a_budget() -> None:
    result = find_one(Evaluator(Recorder({700}), 1024, budget=Budget(max_invocations=3)), range(1024))
    assert result.stop_reason is StopReason.MAX_INVOCATIONS and result.found is None and 700 in result.keep


def blocks_of(size: int) -> Pass:
    return Pass("blocks", ddmin, partition=lambda keep: [[u for u in keep if u // size == b] for b in range(64)])


def test_reducer_loops_passes_to_a_fixpoint_sharing_one_cache() -> None:
    fails = any_clause([[5, 9, 300], [200, 201]])
    test = Recorder(predicate=fails)
    ev = Evaluator(test, 512)
    result = Reducer(ev, [blocks_of(32), Pass("units", probdd), Pass("sweep", sweep)]).run()
    assert result.keep == {200, 201} and result.minimal and result.stop_reason is None
    assert_one_minimal(ev, result, fails)
    assert {name for name, _ in result.stats.phases} >= {"blocks", "units", "sweep"}
    assert len(test.calls) == len(set(test.calls)) == result.stats.runs
    sizes = [size for _, size in result.history]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 512 and sizes[-1] == 2


def test_reducer_hints_and_closure() -> None:
    parents = {i: [i - 1] for i in range(1, 64)}  # one chain: keeping i keeps 0..i
    test = Recorder({10})
    ev = Evaluator(test, 64, closure=dependency_closure(parents))
    result = Reducer(ev).run(hints=[range(12)])
    assert test.calls[0] == set(range(12)) and result.keep == set(range(11))


def test_reducer_stops_on_budget_and_round_limit() -> None:
    fails = any_clause([[1, 2, 3, 100]])
    limited = Reducer(Evaluator(Recorder(predicate=fails), 256, budget=Budget(max_invocations=10))).run()
    assert limited.stop_reason is StopReason.MAX_INVOCATIONS and not limited.minimal
    assert limited.stats.invocations == 10 and {1, 2, 3, 100} <= limited.keep
    one_round = Reducer(Evaluator(Recorder(predicate=fails), 256), [Pass("p")], max_rounds=1).run()
    assert one_round.stop_reason is StopReason.MAX_ROUNDS and one_round.keep == {1, 2, 3, 100}


def test_reducer_needs_a_pass() -> None:
    with pytest.raises(ValueError, match="at least one pass"):
        Reducer(Evaluator(Recorder({1}), 4), [])
