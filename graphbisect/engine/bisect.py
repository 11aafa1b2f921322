"""Binary-search helpers for when the caller knows more than delta debugging assumes.

* :func:`bisect_prefix`: the failure is *monotone along an order* (keeping the first ``k`` units of a
  topological order fails for every ``k`` at or above some threshold): find the smallest failing prefix
  in ``ceil(log2(n + 1))`` tests, e.g. "up to which node does the model still fail?".
* :func:`find_one`: *exactly one* unit among the candidates is needed (with ``base`` always kept): halve
  the candidates, keeping the half that still fails, in ``ceil(log2(n))`` tests plus one to confirm.

UNRESOLVED counts as "does not fail", as everywhere in the engine. Both return a :class:`SearchResult`
whose ``found`` is the prefix length, or the culprit unit; ``minimal`` means the answer is established.

Example:
    >>> from graphbisect.engine import Evaluator, Outcome, bisect_prefix, find_one
    >>> ev = Evaluator(lambda keep: Outcome.FAIL if 37 in keep else Outcome.PASS, n=100)
    >>> bisect_prefix(ev).found, find_one(ev, range(100)).found
    (38, 37)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from graphbisect.engine.evaluator import Evaluator
from graphbisect.engine.search import SearchRun
from graphbisect.engine.types import BudgetExhausted, SearchAborted, SearchResult, StopReason

__all__ = ["bisect_prefix", "find_one"]

logger = logging.getLogger(__name__)


def bisect_prefix(
    evaluator: Evaluator,
    order: Sequence[int] | None = None,
    *,
    base: Iterable[int] = (),
    phase: str = "bisect",
) -> SearchResult:
    """Smallest ``k`` such that ``base ∪ order[:k]`` fails, assuming the whole ``order`` fails.

    Args:
        evaluator: tests candidates.
        order: the units in prefix order (default ``range(n)``).
        base: units kept in every candidate.
        phase: name in statistics.

    Returns ``found = k`` and ``keep`` = the (closed) failing prefix; ``minimal`` when ``k`` is proven.
    """
    order = list(range(evaluator.n) if order is None else order)
    base = frozenset(base)
    run = SearchRun(evaluator, base.union(order), [(u,) for u in order], phase)
    low, high = 0, len(order)  # invariant: the answer lies in [low, high] and prefix `high` fails

    def search() -> None:
        nonlocal low, high
        while low < high:
            mid = (low + high) // 2
            if run.fails(base.union(order[:mid])):
                high = mid
            else:
                low = mid + 1

    stop = _guarded(run, search)
    return run.result(stop, minimal=stop is None, found=high if stop is None else None)


def find_one(
    evaluator: Evaluator,
    candidates: Iterable[int],
    *,
    base: Iterable[int] = (),
    phase: str = "find_one",
) -> SearchResult:
    """The single culprit among ``candidates``, when exactly one of them is needed besides ``base``.

    Each step keeps one half of the remaining candidates; if it does not fail, the culprit is in the
    other half (by the assumption, so that side is not tested). The answer is confirmed by one last
    test unless already known; if the confirmation does not fail, the assumption was wrong and the result
    says so (``stop_reason`` "assumption_violated", ``keep`` the best failing set actually tested).
    """
    remaining = list(dict.fromkeys(candidates))
    base = frozenset(base)
    run = SearchRun(evaluator, base.union(remaining), [(u,) for u in remaining], phase)
    verdict: list[StopReason] = []

    def search() -> None:
        nonlocal remaining
        while len(remaining) > 1:
            half = len(remaining) // 2
            remaining = remaining[:half] if run.fails(base.union(remaining[:half])) else remaining[half:]
        if remaining and not run.fails(base | {remaining[0]}):
            logger.warning("%s: no single candidate fails alone; the one-culprit assumption is wrong", phase)
            verdict.append(StopReason.ASSUMPTION)

    stop = _guarded(run, search) or (verdict[0] if verdict else None)
    found = remaining[0] if stop is None and remaining else None
    return run.result(stop, minimal=stop is None and bool(remaining), found=found)


def _guarded(run: SearchRun, search: Callable[[], None]) -> StopReason | None:
    """Run ``search`` turning budget stops and Ctrl-C into a stop reason (as :func:`run_search` does)."""
    try:
        search()
    except BudgetExhausted as exc:
        return exc.reason
    except KeyboardInterrupt:
        run.ev.meter.interrupt()  # later phases stop too
        logger.warning("%s interrupted", run.phase)
        return StopReason.INTERRUPTED
    except Exception as exc:
        raise SearchAborted(
            f"{run.phase}: the test function raised {type(exc).__name__}: {exc}",
            result=run.result(StopReason.ERROR, minimal=False),
        ) from exc
    return None
