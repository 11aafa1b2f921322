"""Keys, the outcome cache and the budget meter."""

from __future__ import annotations

import random

import pytest

from graphbisect.engine import (
    Budget,
    BudgetMeter,
    Outcome,
    OutcomeCache,
    StopReason,
    TestResult,
    decode_key,
    encode_key,
)


@pytest.mark.parametrize("seed", range(20))
def test_key_round_trip(seed: int) -> None:
    rng = random.Random(seed)
    keep = frozenset(rng.sample(range(200), rng.randint(0, 150)))
    assert decode_key(encode_key(keep)) == keep


def test_key_is_canonical_and_compact() -> None:
    assert encode_key([9, 1, 2, 3, 10, 5]) == "1-3,5,9-10"
    assert encode_key(range(10_000)) == "0-9999"
    assert encode_key(()) == "" and decode_key("") == frozenset()


def test_cache_by_key_and_replay_mark() -> None:
    cache = OutcomeCache()
    cache.put(frozenset({1, 2}), TestResult(Outcome.FAIL), replayed=True)
    assert frozenset({2, 1}) in cache and "1-2" in cache and len(cache) == 1
    assert cache.was_replayed(frozenset({1, 2}))
    cache.put("1-2", TestResult(Outcome.PASS))
    assert not cache.was_replayed("1-2") and cache.count(Outcome.PASS) == 1


def test_test_result_normalization() -> None:
    assert TestResult.of(Outcome.PASS) == TestResult(Outcome.PASS, invoked=True)
    with pytest.raises(TypeError, match="must return an Outcome or a TestResult"):
        TestResult.of(True)  # type: ignore[arg-type]


def test_budget_validation_and_meter() -> None:
    with pytest.raises(ValueError, match="max_invocations"):
        Budget(max_invocations=-1)
    now = [0.0]
    meter = BudgetMeter(Budget(max_invocations=3, deadline_seconds=10.0), clock=lambda: now[0])
    assert meter.slots(8) == 3 and meter.reason() is None
    meter.charge(2)
    assert meter.slots(8) == 1
    meter.charge(1)
    assert meter.slots(8) == 0 and meter.reason() is StopReason.MAX_INVOCATIONS
    unlimited = BudgetMeter(Budget(deadline_seconds=10.0), clock=lambda: now[0])
    now[0] = 10.0
    assert unlimited.reason() is StopReason.DEADLINE and unlimited.slots(4) == 0
