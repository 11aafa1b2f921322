"""Run several searches (passes) over one evaluator until none of them makes progress.

A :class:`Pass` is a search function plus an optional *partition*: how to group the current keep-set into
atoms for that pass (fusion groups, graph regions, blocks of a repeated layer...). A :class:`Reducer` runs
its passes in order, each starting from the previous one's result, and repeats the round until a whole
round removes nothing (Hypothesis' shrinker loop). All passes share the evaluator, hence one cache, one
journal, one budget: a candidate tested by one pass is free for every later one, so the final round that
confirms the fixpoint costs (almost) nothing.

Example:
    >>> from graphbisect.engine import Evaluator, Outcome, Pass, Reducer, ddmin, probdd
    >>> ev = Evaluator(lambda keep: Outcome.FAIL if {5, 9} <= keep else Outcome.PASS, n=32)
    >>> blocks = Pass("blocks", ddmin, partition=lambda keep: [[u for u in keep if u // 8 == b] for b in range(4)])
    >>> r = Reducer(ev, [blocks, Pass("units", probdd)]).run()
    >>> sorted(r.keep), r.minimal
    ([5, 9], True)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from graphbisect.engine.evaluator import Evaluator
from graphbisect.engine.probdd import probdd
from graphbisect.engine.types import SearchResult, SearchStats, StopReason

__all__ = ["Partition", "Pass", "Reducer", "SearchFunction"]

logger = logging.getLogger(__name__)

Partition = Callable[[frozenset[int]], Sequence[Iterable[int]]]
"""Groups the current keep-set into disjoint atoms for one pass; units left out stay fixed."""


class SearchFunction(Protocol):
    """The signature shared by :func:`ddmin`, :func:`probdd` and :func:`sweep`."""

    def __call__(
        self,
        evaluator: Evaluator,
        start: Iterable[int] | None = ...,
        *,
        atoms: Sequence[Iterable[int]] | None = ...,
        hints: Sequence[Iterable[int]] = ...,
        phase: str = ...,
    ) -> SearchResult: ...


@dataclass(frozen=True)
class Pass:
    """One search of a reduction round: its name (the statistics phase), algorithm and partition."""

    name: str
    search: SearchFunction = probdd
    partition: Partition | None = None  # None: one atom per unit


class Reducer:
    """Loops its passes until a round makes no progress, under the evaluator's budget.

    Args:
        evaluator: shared by all passes.
        passes: run in this order every round (default: ProbDD over single units).
        max_rounds: stop after this many rounds even if still making progress (``None``: no limit).
    """

    def __init__(
        self, evaluator: Evaluator, passes: Sequence[Pass] = (Pass("probdd"),), *, max_rounds: int | None = None
    ) -> None:
        if not passes:
            raise ValueError("a Reducer needs at least one pass")
        self.evaluator = evaluator
        self.passes = tuple(passes)
        self.max_rounds = max_rounds

    def run(self, start: Iterable[int] | None = None, *, hints: Sequence[Iterable[int]] = ()) -> SearchResult:
        """Reduce ``start`` (default: all units, assumed to fail); ``hints`` go to the first pass."""
        ev = self.evaluator
        keep = ev.universe if start is None else frozenset(start)
        stats0 = ev.stats()
        history = [(ev.runs, len(keep))]
        rounds = 0
        while True:
            rounds += 1
            before = keep
            for index, step in enumerate(self.passes):
                atoms = step.partition(keep) if step.partition is not None else None
                first = rounds == 1 and index == 0
                result = step.search(ev, keep, atoms=atoms, hints=hints if first else (), phase=step.name)
                history.extend(h for h in result.history if h[1] < history[-1][1])
                keep = result.keep
                if result.stop_reason is not None:
                    return self._result(keep, result.stop_reason, stats0, history)
            logger.info("reduction round %d: %d -> %d units", rounds, len(before), len(keep))
            if keep == before:
                return self._result(keep, None, stats0, history)
            if self.max_rounds is not None and rounds >= self.max_rounds:
                return self._result(keep, StopReason.MAX_ROUNDS, stats0, history)

    def _result(
        self, keep: frozenset[int], stop: StopReason | None, stats0: SearchStats, history: list[tuple[int, int]]
    ) -> SearchResult:
        return SearchResult(
            keep=keep,
            minimal=stop is None,
            stop_reason=stop,
            stats=self.evaluator.stats().since(stats0),
            history=tuple(history),
        )
