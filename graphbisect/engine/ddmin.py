"""Zeller's ddmin, complement-first, over atoms (units by default).

At granularity ``g`` the current set is split into ``g`` contiguous chunks. First every *complement*
(remove one chunk) is tried, then, for ``g > 2``, every *subset* (keep one chunk). A failing complement
continues at ``max(g - 1, 2)``, a failing subset at 2; when nothing fails, ``g`` doubles. The loop ends
when no complement at single-atom granularity fails: then every single-atom removal of the final set has
been tested, so the closing sweep of :func:`~graphbisect.engine.search.run_search` is all cache hits.

Complement-first (picire's default order) suits graph reduction: failures usually need a handful of
units *plus* context, so removing a chunk succeeds far more often than keeping a lone chunk does.

Each batch of complements (and of subsets) is independent, so with ``jobs > 1`` they are tested in
parallel and the first failure *in serial order* wins: the result is identical to ``jobs=1``.

Example:
    >>> from graphbisect.engine import Evaluator, Outcome, ddmin
    >>> ev = Evaluator(lambda keep: Outcome.FAIL if {3, 12} <= keep else Outcome.PASS, n=16)
    >>> r = ddmin(ev)
    >>> sorted(r.keep), r.minimal
    ([3, 12], True)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from graphbisect.engine.evaluator import Evaluator
from graphbisect.engine.search import SearchRun, run_search
from graphbisect.engine.types import SearchResult

__all__ = ["ddmin"]

logger = logging.getLogger(__name__)


def ddmin(
    evaluator: Evaluator,
    start: Iterable[int] | None = None,
    *,
    atoms: Sequence[Iterable[int]] | None = None,
    hints: Sequence[Iterable[int]] = (),
    phase: str = "ddmin",
) -> SearchResult:
    """Reduce ``start`` (default: all units, assumed to fail) to a 1-minimal failing keep-set.

    Args:
        evaluator: tests candidates (cache, closure, journal, budget, parallelism).
        start: a failing keep-set to reduce.
        atoms: disjoint groups of units removed together; units of ``start`` outside every atom stay.
        hints: keep-sets to try first, in order; the first that fails becomes the starting point.
        phase: name of this search in statistics and progress events.
    """
    return run_search(evaluator, start, atoms=atoms, hints=hints, phase=phase, algorithm=_ddmin)


def _ddmin(run: SearchRun) -> None:
    granularity = 2
    while len(run.atoms) >= 2:
        m = len(run.atoms)
        granularity = min(granularity, m)
        chunks = _split(m, granularity)
        if run.try_candidates(run.without(chunk) for chunk in chunks) is not None:
            granularity = max(granularity - 1, 2)
            continue
        # For g == 2 each subset is the other chunk's complement, already tried.
        if granularity > 2 and run.try_candidates(run.only(chunk) for chunk in chunks) is not None:
            granularity = 2
            continue
        if granularity >= m:
            return
        granularity = min(2 * granularity, m)


def _split(m: int, g: int) -> list[range]:
    """``g`` contiguous, nearly equal ranges covering ``range(m)``."""
    bounds = [m * i // g for i in range(g + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(g)]
