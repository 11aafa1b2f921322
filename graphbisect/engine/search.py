"""What every search shares: the current failing configuration, hints, the 1-minimality sweep, stopping.

A search works on *atoms*: disjoint groups of units removed or kept together (one unit each by default;
a caller-supplied partition, e.g. fusion groups or graph regions, otherwise). Units of the start set that
are in no atom are *fixed*: always kept. A candidate is accepted only when, after the closure, it is a
proper subset of the current set and fails (Hypothesis' rule: strictly simpler, failing the same way).

:func:`run_search` is the frame around an algorithm: try the caller's hints first, run the algorithm,
then the one-by-one sweep that proves the result 1-minimal, and turn a budget stop or Ctrl-C into the
best-so-far result instead of losing it.

**Deferring heavy removals.** When the test measures *how far* a non-failing candidate is from failing (a
``margin``, in units where 1 is the whole failure threshold: ``precision``'s output error in tolerances),
the sweep remembers what each atom's last single removal did to the margin. Where the failure is not
monotone (int8 error: lowering one more node can cancel another's error), every removal re-opens others,
and the plain sweep walks the whole set again after each one (PP-OCRv4 rec int8: 1,106 sweep tests for 136
atoms). Atoms whose removal moved the margin by more than the whole threshold (:data:`DEFER_ABOVE`) rarely
become removable after a few more removals, so the rotating passes skip them, and a closing round tries
them (and the others, cached by then) on the final set. Either way every single-atom removal of the final
set is tested before the set is called 1-minimal.

Example:
    >>> from graphbisect.engine import Evaluator, Outcome
    >>> ev = Evaluator(lambda keep: Outcome.FAIL if {2, 6} <= keep else Outcome.PASS, n=8)
    >>> r = sweep(ev, hints=[{2, 3, 6}])
    >>> sorted(r.keep), r.minimal, r.stats.phase("hints").tests
    ([2, 6], True, 1)
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence

from graphbisect.engine.cache import encode_key
from graphbisect.engine.evaluator import Evaluator
from graphbisect.engine.types import BudgetExhausted, SearchAborted, SearchResult, StopReason, TestResult

__all__ = ["DEFER_ABOVE", "Margin", "SearchRun", "run_search", "sweep"]

Margin = Callable[[TestResult], "float | None"]
"""How far a tested candidate was from failing, 1 being the whole failure threshold (lower: closer; None:
not known); see the module docstring."""

DEFER_ABOVE = 1.0
"""A single removal that moved the margin by more than this is deferred to the sweep's closing round."""

PROOF_SHOWN_UP_TO = 256
"""The most atoms a current set may have for progress events to count the runs its 1-minimality proof still
needs (:meth:`SearchRun.proof_runs`: one closure per atom, made once per current set; 31 ms at 502 atoms)."""

PROOF_SHOWN_UP_TO_SINGLE = 1024
"""The same where every atom is one unit and the evaluator has no closure (precision's searches): each removal's
cache key is then cut out of the current set's (:func:`_removal_keys`): 1 ms at 502 atoms, 13 ms at 1,024 in
the worst case (no two units consecutive)."""

logger = logging.getLogger(__name__)


class SearchRun:
    """The state of one search: current failing keep-set as atoms, and the journey of its size."""

    def __init__(
        self,
        evaluator: Evaluator,
        start: Iterable[int] | None,
        atoms: Sequence[Iterable[int]] | None,
        phase: str,
    ) -> None:
        self.ev = evaluator
        self.phase = phase
        self.keep = evaluator.universe if start is None else frozenset(start)
        if self.keep and (min(self.keep) < 0 or max(self.keep) >= evaluator.n):
            raise ValueError(
                f"{phase}: the start set has units outside 0..{evaluator.n - 1} "
                f"(min {min(self.keep)}, max {max(self.keep)}); units are indices into the caller's list"
            )
        self.atoms = _atoms(self.keep, atoms)
        self.fixed = self.keep.difference(*self.atoms)
        self.survivors: list[int] = list(range(len(self.atoms)))  # old positions of atoms after accept
        self._stats0 = evaluator.stats()
        # (runs, size): runs include those an earlier session made and the journal replays (Evaluator.runs)
        self.history: list[tuple[int, int]] = [(evaluator.runs, len(self.keep))]
        self.visited: list[frozenset[int]] = [self.keep]  # every current set, oldest first (ranked sweep)
        self._removals: tuple[frozenset[int], list[str]] | None = None  # (keep, its removals' cache keys)
        evaluator.proof_runs = self.proof_runs
        evaluator.set_best(len(self.keep), phase=phase, start=True)

    def proof_runs(self) -> int | None:
        """The single-atom removals of the current set not tested yet: the runs the sweep must still make
        before calling it 1-minimal, if no smaller set fails (None above :data:`PROOF_SHOWN_UP_TO` atoms).
        A removal the closure makes no smaller, or empty, is never tested and not counted.

        Example:
            >>> from graphbisect.engine import Evaluator, Outcome
            >>> ev = Evaluator(lambda keep: Outcome.FAIL if {2, 6} <= keep else Outcome.PASS, n=8)
            >>> run = SearchRun(ev, {2, 3, 6}, None, "sweep")
            >>> run.proof_runs(), ev.evaluate({2, 6}).outcome.value, run.proof_runs()
            (3, 'fail', 2)
        """
        single = self.ev.closure is None and all(len(atom) == 1 for atom in self.atoms)
        if len(self.atoms) > (PROOF_SHOWN_UP_TO_SINGLE if single else PROOF_SHOWN_UP_TO):
            return None
        if self._removals is None or self._removals[0] != self.keep:  # keys made once per set; then 0.03 ms a call
            if single:
                keys = _removal_keys(self.keep, [next(iter(atom)) for atom in self.atoms])
                keys = keys if self.ev.is_candidate(frozenset()) or len(self.keep) > 1 else []
            else:
                closed = (self._closed(self.without([i])) for i in range(len(self.atoms)))
                keys = [encode_key(keep) for keep in closed if keep is not None]
            self._removals = (self.keep, keys)
        return sum(1 for key in self._removals[1] if self.ev.cache.get(key) is None)

    def without(self, positions: Collection[int]) -> frozenset[int]:
        """The current set minus the atoms at ``positions``."""
        dropped = set(positions)
        return self.fixed.union(*(a for i, a in enumerate(self.atoms) if i not in dropped))

    def only(self, positions: Iterable[int]) -> frozenset[int]:
        """The fixed units plus the atoms at ``positions``."""
        return self.fixed.union(*(self.atoms[i] for i in positions))

    def try_candidates(self, candidates: Iterable[Iterable[int]], phase: str | None = None) -> int | None:
        """Test candidates in order; accept the first that fails and return its index.

        ``candidates`` may be lazy: it is consumed only as far as the search gets. Candidates that the
        closure makes no smaller than the current set (or empty) are skipped untested: they could not
        be accepted anyway.
        """
        return self._try_closed((self._closed(c) for c in candidates), phase)

    def _try_closed(self, closed: Iterable[frozenset[int] | None], phase: str | None = None) -> int | None:
        """:meth:`try_candidates` of candidates already through :meth:`_closed` (None: skipped untested)."""
        phase = phase or self.phase
        found = self.ev.find_first_fail(closed, phase=phase)
        if found is None:
            return None
        self.accept(found[1], phase)
        return found[0]

    def _closed(self, candidate: Iterable[int]) -> frozenset[int] | None:
        keep = self.ev.apply_closure(candidate)
        return keep if keep < self.keep and self.ev.is_candidate(keep) else None

    def fails(self, candidate: Iterable[int], phase: str | None = None) -> bool:
        """Whether ``candidate`` fails (for bisection); accepted when it does and is smaller.

        Unlike :meth:`try_candidates`, a candidate whose closure equals the current set is known to
        fail without a test, and one that is not a subset is tested anyway.
        """
        phase = phase or self.phase
        keep = self.ev.apply_closure(candidate)
        if keep == self.keep:
            return True
        if not self.ev.is_candidate(keep):
            self.ev.count_skipped(phase)
            return False
        if self.ev.first_fail([keep], phase=phase) is None:
            return False
        if keep < self.keep:
            self.accept(keep, phase)
        return True

    def accept(self, keep: frozenset[int], phase: str) -> None:
        """Make ``keep`` (a failing proper subset) the current set; atoms shrink to what it kept."""
        self.survivors = [i for i, a in enumerate(self.atoms) if a & keep]
        self.atoms = [self.atoms[i] & keep for i in self.survivors]
        self.fixed &= keep
        self.keep = keep
        self.history.append((self.ev.runs, len(keep)))
        self.visited.append(keep)
        self.ev.set_best(len(keep), phase=phase)
        logger.debug("%s: reduced to %d units", phase, len(keep))

    def try_hints(self, hints: Sequence[Iterable[int]]) -> None:
        """Adopt the first hint (restricted to the current set, plus fixed units) that fails."""
        if hints:
            self.try_candidates(((frozenset(h) & self.keep) | self.fixed for h in hints), "hints")

    def sweep(self, margin: Margin | None = None) -> None:
        """Remove single atoms until none can go: afterwards the current set is 1-minimal.

        Each pass starts where the last removal happened, and the sweep ends after a full pass without a
        removal, so every single-atom removal of the *final* set has been tested (cache hits are free:
        after ddmin the whole sweep usually is). With ``margin``, heavy removals are deferred (module docstring).
        """
        if margin is not None:
            self._ranked_sweep(margin)
            return
        start = 0
        while self.atoms:
            m = len(self.atoms)
            order = [(start + t) % m for t in range(m)]
            winner = self.try_candidates((self.without((j,)) for j in order), "sweep")
            if winner is None:
                return
            start = order[winner] % max(len(self.atoms), 1)

    def _ranked_sweep(self, margin: Margin) -> None:
        """The sweep with heavy removals deferred (module docstring): rotating passes over the atoms whose
        last single removal moved the margin by at most :data:`DEFER_ABOVE` (or was never measured), as the
        plain sweep rotates; when a whole pass of them finds nothing, a closing round tries the others on
        the same set, and only a closing round without a removal ends it.
        """
        last = self._last_changes(margin)
        start = 0
        while self.atoms:
            m = len(self.atoms)
            rotation = [(start + t) % m for t in range(m)]
            light = [j for j in rotation if last.get(self.atoms[j], -math.inf) <= DEFER_ABOVE]
            winner = self._try_single_removals(light, last, margin)
            if winner is None:  # the closing round: the light atoms were all just tested on this set
                light = [j for j in rotation if last.get(self.atoms[j], -math.inf) > DEFER_ABOVE]
                winner = self._try_single_removals(light, last, margin)
            if winner is None:
                return
            start = light[winner] % max(len(self.atoms), 1)

    def _try_single_removals(self, order: Sequence[int], last: dict[frozenset[int], float],
                             margin: Margin) -> int | None:
        """Try removing each atom of ``order`` alone, accept the first that fails (its index in ``order``), and
        note in ``last`` what each tested removal did to the margin."""
        tried: list[tuple[frozenset[int], frozenset[int] | None]] = []
        base = self._margin_of(self.keep, margin) or 0.0
        winner = self._try_closed(self._single_removals(order, tried), "sweep")
        for atom, closed in tried[: None if winner is None else winner]:
            value = self._margin_of(closed, margin) if closed is not None else None
            if value is not None:
                last[atom] = value - base
        return winner

    def _single_removals(self, order: Sequence[int],
                         tried: list[tuple[frozenset[int], frozenset[int] | None]]
                         ) -> Iterator[frozenset[int] | None]:
        """The current set without each atom of ``order`` in turn, closed (:meth:`_closed`: the set tested, or
        None), noting (atom, that set) as consumed."""
        for j in order:
            closed = self._closed(self.without((j,)))
            tried.append((self.atoms[j], closed))
            yield closed

    def _margin_of(self, keep: frozenset[int], margin: Margin) -> float | None:
        measured = self.ev.cache.get(keep)
        return margin(measured) if measured is not None else None

    def _last_changes(self, margin: Margin) -> dict[frozenset[int], float]:
        """Per atom, the margin change of the most recent cached test that removed just that atom from a set
        this search was at (what the algorithm before the sweep already measured)."""
        last: dict[frozenset[int], float] = {}
        for keep in reversed(self.visited):
            if len(last) == len(self.atoms):  # every atom has its most recent change
                break
            base = self._margin_of(keep, margin) or 0.0
            for atom in self.atoms:
                if atom in last or not atom <= keep:
                    continue
                value = self._margin_of(self.ev.apply_closure(keep - atom), margin)
                if value is not None:
                    last[atom] = value - base
        return last

    def result(self, stop_reason: StopReason | None, *, minimal: bool, found: int | None = None) -> SearchResult:
        return SearchResult(
            keep=self.keep,
            minimal=minimal,
            stop_reason=stop_reason,
            stats=self.ev.stats().since(self._stats0),
            history=tuple(self.history),
            found=found,
        )


def run_search(
    evaluator: Evaluator,
    start: Iterable[int] | None,
    *,
    atoms: Sequence[Iterable[int]] | None,
    hints: Sequence[Iterable[int]],
    phase: str,
    algorithm: Callable[[SearchRun], None],
    margin: Margin | None = None,
) -> SearchResult:
    """Hints, then ``algorithm``, then the sweep (ranked by ``margin`` when given); a budget stop or Ctrl-C
    returns the best-so-far.

    An exception from the test function becomes :class:`SearchAborted` (chained, carrying the
    best-so-far), so neither the cause nor the progress is lost.
    """
    run = SearchRun(evaluator, start, atoms, phase)
    try:
        run.try_hints(hints)
        algorithm(run)
        run.sweep(margin)
    except BudgetExhausted as exc:
        logger.info("%s stopped (%s) at %d units", phase, exc.reason.value, len(run.keep))
        return run.result(exc.reason, minimal=False)
    except KeyboardInterrupt:
        evaluator.meter.interrupt()  # later phases stop too
        logger.warning("%s interrupted; returning the best failing set so far (%d units)", phase, len(run.keep))
        return run.result(StopReason.INTERRUPTED, minimal=False)
    except Exception as exc:
        raise SearchAborted(
            f"{phase}: the test function raised {type(exc).__name__}: {exc}",
            result=run.result(StopReason.ERROR, minimal=False),
            hint="a test function should return Outcome.UNRESOLVED for candidates it cannot judge; "
            "SearchAborted.result holds the best failing set found before the error",
        ) from exc
    return run.result(None, minimal=True)


def sweep(
    evaluator: Evaluator,
    start: Iterable[int] | None = None,
    *,
    atoms: Sequence[Iterable[int]] | None = None,
    hints: Sequence[Iterable[int]] = (),
    phase: str = "sweep",
    margin: Margin | None = None,
) -> SearchResult:
    """One-by-one removal until 1-minimal: n tests per pass; best for small sets or near-minimal starts.

    Example:
        >>> from graphbisect.engine import Evaluator, Outcome
        >>> ev = Evaluator(lambda keep: Outcome.FAIL if 1 in keep else Outcome.PASS, n=3)
        >>> sorted(sweep(ev).keep)
        [1]
    """
    return run_search(evaluator, start, atoms=atoms, hints=hints, phase=phase, algorithm=_nothing, margin=margin)


def _removal_keys(keep: frozenset[int], units: Iterable[int]) -> list[str]:
    """:func:`~graphbisect.engine.cache.encode_key` of ``keep`` without each of ``units`` (members of ``keep``), cut
    out of ``keep``'s own key: its runs of consecutive units are made once, and each key joins the runs before
    and after the one that loses the unit with what is left of that run.

    Example:
        >>> _removal_keys(frozenset({1, 2, 3, 7}), [2, 7, 1])
        ['1,3,7', '1-3', '2-3,7']
    """
    items = sorted(keep)
    runs: list[tuple[int, int]] = []
    for unit in items:
        if runs and unit == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], unit)
        else:
            runs.append((unit, unit))
    parts = [_span(a, b) for a, b in runs]
    starts = [a for a, _ in runs]
    keys = []
    for unit in units:
        r = bisect.bisect_right(starts, unit) - 1
        a, b = runs[r]
        left = parts[:r] + ([_span(a, unit - 1)] if unit > a else [])
        right = ([_span(unit + 1, b)] if unit < b else []) + parts[r + 1:]
        keys.append(",".join(left + right))
    return keys


def _span(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}-{b}"


def _nothing(run: SearchRun) -> None:
    """The sweep alone is the algorithm."""


def _atoms(keep: frozenset[int], atoms: Sequence[Iterable[int]] | None) -> list[frozenset[int]]:
    if atoms is None:
        return [frozenset((u,)) for u in sorted(keep)]
    result: list[frozenset[int]] = []
    seen: set[int] = set()
    for atom in atoms:
        group = frozenset(atom) & keep
        if group & seen:
            raise ValueError(f"atoms must be disjoint; units {sorted(group & seen)} appear in two atoms")
        seen |= group
        if group:
            result.append(group)
    return result
