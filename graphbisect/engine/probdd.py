"""Probabilistic delta debugging (ProbDD, Wang et al., FSE 2021), deterministic, with caller priors.

Every atom ``i`` carries ``p[i]``, the probability that it is needed for the failure. Each step sorts the
atoms that are not known to be needed by ``p`` (ascending; ties keep their original order) and removes the
prefix of length ``k`` maximizing the expected gain ``k * prod(1 - p[j])`` (the number of atoms removed
times the chance that none of them was needed). If the candidate still fails, those atoms are gone. If not,
Bayes' rule for "at least one of the removed atoms is needed" gives ``p[j] /= 1 - prod(1 - p)`` for each
of them, and a lone atom gets ``p = 1``. The search ends when every remaining atom has ``p = 1``; the
closing one-by-one sweep then proves (and, for non-monotone failures, establishes) 1-minimality.

Why ProbDD and not its counter-based simplification CDD (Zhang et al., ICSE 2025)? CDD shows that with one
shared initial probability ProbDD's updates behave like per-round counters, and replaces them by a
precomputed subset size per round. That equivalence needs *uniform* priors. Ours are not: layerwise
comparison tells us which nodes are suspicious (the first divergence and its neighbourhood), and the
per-atom probabilities are exactly where that evidence goes (``prior`` as a mapping). With uniform priors
both behave alike; we also drop ProbDD's random shuffling, which CDD found to contribute little, so a
search is reproducible from its journal.

The initial probability defaults to ``1 / m`` for ``m`` atoms: graph reduction typically ends with one to a
few nodes out of hundreds, whereas ProbDD's 0.1 (tuned for program text, where a tenth of the tokens
survive) would remove only ~10 atoms per step, O(n) tests for one culprit among 1024 instead of O(log n).

**Dense answers.** ProbDD's default prior says few atoms are needed. Where most are (an int8 search on a
CRNN keeps 352 of 502 units in FP32), groups of two or more nearly always contain a needed atom, each
failure only raises its own members' probabilities, and ProbDD spends about two tests per atom before it
removes them one by one; the closing sweep alone, which removes them one by one from the start, needs about
one test per atom plus its proof pass. Removing one atom at a time is the best group test when an atom is
needed with probability at least :data:`UNGAR` ((3 - √5) / 2 ≈ 0.38; Ungar, 1960). With ``dense_after``,
ProbDD estimates that probability once, after that many tests, by maximum likelihood over the groups it
removed (a removal of ``g`` atoms succeeds with probability ``(1 - ρ)**g``), and above :data:`UNGAR` it stops
and leaves the rest to the sweep. On that CRNN: 2,049 → 1,282 tests for a 1-minimal answer (329 units, not
352: another local minimum). Before enough tests the estimate is unreliable (all removals of large groups fail
for any density above ~1/size), so the check is made once, late enough that groups have shrunk.

Parallel mode speculates along the chain of candidates the serial algorithm would try if each one passed
(the probability update on PASS is deterministic), tests ``jobs`` of them at once and keeps the first
failure in chain order: results are identical to ``jobs=1``.

Example:
    >>> from graphbisect.engine import Evaluator, Outcome, probdd
    >>> ev = Evaluator(lambda keep: Outcome.FAIL if {3, 700} <= keep else Outcome.PASS, n=1024)
    >>> r = probdd(ev)
    >>> sorted(r.keep), r.minimal, r.stats.invocations < 60
    ([3, 700], True, True)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence

from graphbisect.engine.evaluator import Evaluator
from graphbisect.engine.search import Margin, SearchRun, run_search
from graphbisect.engine.types import SearchResult

__all__ = ["UNGAR", "density_estimate", "probdd"]

logger = logging.getLogger(__name__)

_MIN_PROBABILITY = 1e-9  # a zero prior would make the Bayes update divide by zero

UNGAR = (3 - math.sqrt(5)) / 2
"""The probability of being needed above which testing atoms one at a time beats testing groups (Ungar,
"The cutoff point for group testing", 1960): see "Dense answers" in the module docstring."""


def probdd(
    evaluator: Evaluator,
    start: Iterable[int] | None = None,
    *,
    atoms: Sequence[Iterable[int]] | None = None,
    hints: Sequence[Iterable[int]] = (),
    phase: str = "probdd",
    prior: float | Mapping[int, float] | None = None,
    margin: Margin | None = None,
    dense_after: int | None = None,
) -> SearchResult:
    """Reduce ``start`` (default: all units, assumed to fail) to a 1-minimal failing keep-set.

    Args:
        evaluator: tests candidates (cache, closure, journal, budget, parallelism).
        start: a failing keep-set to reduce.
        atoms: disjoint groups of units removed together; units of ``start`` outside every atom stay.
        hints: keep-sets to try first, in order; the first that fails becomes the starting point.
        phase: name of this search in statistics and progress events.
        prior: initial probability that an atom is needed: one number for all atoms, or per *unit*
            (an atom's is then the chance that any of its listed units is needed; atoms with no listed
            unit get the default ``1 / number of atoms``).
        margin: how far a tested candidate was from failing: the closing sweep tries the closest
            removals first (see :mod:`graphbisect.engine.search`).
        dense_after: after this many tests, hand over to the sweep when an atom is estimated to be needed
            with probability of at least :data:`UNGAR` ("Dense answers" in the module docstring); None: never.
    """

    def algorithm(run: SearchRun) -> None:
        _probdd(run, prior, dense_after)

    return run_search(evaluator, start, atoms=atoms, hints=hints, phase=phase, algorithm=algorithm, margin=margin)


def _probdd(run: SearchRun, prior: float | Mapping[int, float] | None, dense_after: int | None) -> None:
    p = _initial(run.atoms, prior)
    if not run.fixed and not run.ev.allow_empty and p:
        # The empty set is known not to fail, i.e. "at least one atom is needed": a free observation.
        p = _after_pass(p, range(len(p)))
    removals: list[tuple[int, bool]] = []  # (atoms removed, whether the candidate failed), in order
    while True:
        chain = _lookahead(p, run.ev.jobs)
        if not chain:
            return
        winner = run.try_candidates([run.without(removed) for removed, _ in chain])
        if dense_after is not None:
            seen = len(chain) if winner is None else winner + 1  # the speculation beyond a winner is dropped
            removals += [(len(removed), i == winner) for i, (removed, _) in enumerate(chain[:seen])]
            if len(removals) >= dense_after:
                undecided = sum(q < 1.0 for q in (chain[-1][1] if winner is None else p))
                density = density_estimate(removals) if undecided >= dense_after else 0.0  # else: nearly done
                if density >= UNGAR:
                    logger.info("ProbDD stops after %d tests: an atom is needed with probability ~%.2f (maximum "
                                "likelihood), above %.2f, so one-by-one removal is cheaper", len(removals),
                                density, UNGAR)
                    return
                dense_after = None  # checked once: later the current set is smaller and denser anyway
        if winner is None:
            p = chain[-1][1]
            continue
        before = chain[winner - 1][1] if winner else p  # the candidates before the winner passed
        p = [before[i] for i in run.survivors]


def density_estimate(removals: Sequence[tuple[int, bool]]) -> float:
    """The maximum-likelihood probability ``ρ`` that an atom is needed, from group removals ``(g, failed)``:
    a removal of ``g`` atoms fails (the candidate is accepted) with probability ``(1 - ρ)**g``. The log-likelihood
    is concave in ``ρ``, so a ternary search finds it; with no accepted removal it is 1 (every group was needed).

    Example:
        >>> round(density_estimate([(1, True), (1, False), (1, True), (1, False)]), 2)
        0.5
        >>> density_estimate([(8, False), (4, False)])
        1.0
    """
    if not any(failed for _, failed in removals):
        return 1.0

    def log_likelihood(rho: float) -> float:
        total = 0.0
        for g, failed in removals:
            none_needed = (1.0 - rho) ** g
            total += g * math.log1p(-rho) if failed else math.log(max(1.0 - none_needed, 1e-300))
        return total

    low, high = 1e-9, 1.0 - 1e-9
    for _ in range(100):
        a, b = low + (high - low) / 3, high - (high - low) / 3
        if log_likelihood(a) < log_likelihood(b):
            low = a
        else:
            high = b
    return (low + high) / 2


def _initial(atoms: Sequence[frozenset[int]], prior: float | Mapping[int, float] | None) -> list[float]:
    default = 1.0 / max(len(atoms), 1)
    if prior is None or isinstance(prior, (int, float)):
        value = default if prior is None else float(prior)
        return [_clamp(value)] * len(atoms)
    result = []
    for atom in atoms:
        listed = [prior[u] for u in atom if u in prior]
        none_needed = math.prod(1.0 - _clamp(q) for q in listed)
        result.append(_clamp(1.0 - none_needed) if listed else default)
    return result


def _lookahead(p: list[float], depth: int) -> list[tuple[tuple[int, ...], list[float]]]:
    """The next ``depth`` removals the serial algorithm would try if each of them passed."""
    chain: list[tuple[tuple[int, ...], list[float]]] = []
    for _ in range(depth):
        removed = _select(p)
        if not removed:
            break
        p = _after_pass(p, removed)
        chain.append((removed, p))
    return chain


def _select(p: Sequence[float]) -> tuple[int, ...]:
    """The prefix (by ascending ``p``) with the largest expected gain ``k * prod(1 - p)``.

    With ``p`` ascending the gain ratio ``(k+1)/k * (1 - p[k+1])`` decreases, so the gain is unimodal
    and the scan stops at its peak.
    """
    order = sorted((i for i, q in enumerate(p) if q < 1.0), key=lambda i: p[i])
    best_k, best_gain, none_needed = 0, 0.0, 1.0
    for k, i in enumerate(order, start=1):
        none_needed *= 1.0 - p[i]
        gain = k * none_needed
        if gain <= best_gain:
            break
        best_k, best_gain = k, gain
    return tuple(order[:best_k])


def _after_pass(p: Sequence[float], removed: Iterable[int]) -> list[float]:
    """Bayes update after removing ``removed`` made the failure go away: one of them is needed."""
    removed = list(removed)
    updated = list(p)
    if len(removed) == 1:
        updated[removed[0]] = 1.0
        return updated
    some_needed = 1.0 - math.prod(1.0 - p[i] for i in removed)
    for i in removed:
        updated[i] = min(1.0, p[i] / some_needed) if some_needed > 0 else 1.0
    return updated


def _clamp(q: float) -> float:
    return min(1.0, max(_MIN_PROBABILITY, q))
