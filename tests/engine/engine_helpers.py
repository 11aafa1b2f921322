"""Synthetic failures with known answers, shared by the engine tests (no ONNX anywhere)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Mapping

from graphbisect.engine import Evaluator, Outcome, SearchResult, TestResult


class Recorder:
    """A test function that fails when all culprits are kept, and records every keep-set it was asked."""

    def __init__(self, culprits: Iterable[int] = (), predicate: Callable[[frozenset[int]], bool] | None = None):
        culprit_set = frozenset(culprits)
        self.predicate = predicate or (lambda keep: culprit_set <= keep)
        self.calls: list[frozenset[int]] = []

    def __call__(self, keep: frozenset[int]) -> Outcome | TestResult:
        self.calls.append(keep)
        return Outcome.FAIL if self.predicate(keep) else Outcome.PASS


def any_clause(clauses: Iterable[Iterable[int]]) -> Callable[[frozenset[int]], bool]:
    """Monotone failure: some clause (a set of units needed together) is fully kept."""
    sets = [frozenset(c) for c in clauses]
    return lambda keep: any(c <= keep for c in sets)


def random_function(n: int, seed: int, density: float = 0.3) -> Callable[[frozenset[int]], bool]:
    """A non-monotone failure: an arbitrary truth table over all subsets, failing on the full set."""
    rng = random.Random(seed)
    table = {frozenset(s) for r in range(n + 1) for s in itertools.combinations(range(n), r) if rng.random() < density}
    table.add(frozenset(range(n)))
    return lambda keep: keep in table


def dependency_closure(parents: Mapping[int, Iterable[int]]) -> Callable[[frozenset[int]], frozenset[int]]:
    """Closure adding every (transitive) parent, like the producers a kept graph node needs."""

    def closure(keep: frozenset[int]) -> frozenset[int]:
        result, stack = set(keep), list(keep)
        while stack:
            for parent in parents.get(stack.pop(), ()):
                if parent not in result:
                    result.add(parent)
                    stack.append(parent)
        return frozenset(result)

    return closure


def assert_one_minimal(ev: Evaluator, result: SearchResult, fails: Callable[[frozenset[int]], bool]) -> None:
    """Brute force: no single-unit removal (after closure) yields a smaller non-empty failing set."""
    assert fails(result.keep), "the result must fail"
    for unit in result.keep:
        candidate = ev.apply_closure(result.keep - {unit})
        if candidate < result.keep and (candidate or ev.allow_empty):
            assert not fails(candidate), f"removing {unit} from {sorted(result.keep)} still fails"
