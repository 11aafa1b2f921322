"""Where a list of releases changes: a bisection with a yes / no / unknown predicate (cargo-bisect-rustc's
``least_satisfying``).

The elements are ordered oldest first and assumed to change once: ``NO`` before some index, ``YES`` from it on.
Both ends are asked first (stepping inward over ``UNKNOWN`` ends); when the newest is ``NO`` or the oldest
``YES`` there is nothing to bisect and the result says which. Otherwise the search keeps the last ``NO`` and the
first ``YES`` and asks the untested element nearest the middle between them; an ``UNKNOWN`` one is stepped
around (never guessed) and, when it lies between the two at the end, named: the change may be in it.
Without unknowns it asks at most ``ceil(log2 N) + 2`` elements; each unknown asked costs at most one more
(tests/releases/test_search.py checks both on every sequence). Pure: it knows nothing of releases.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Answer", "Change", "find_change"]

log = logging.getLogger(__name__)


class Answer(str, enum.Enum):
    """One element's answer: changed (``YES``), not yet (``NO``), or cannot tell (``UNKNOWN``: a skip)."""

    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"


#: ``find_change``'s outcomes.
FOUND, NEWEST_UNCHANGED, OLDEST_CHANGED, NOTHING_TESTABLE = "found", "newest-unchanged", "oldest-changed", "untestable"


@dataclass(frozen=True)
class Change:
    """Where the answers change.

    ``status``: ``found`` (``last_no`` and ``first_yes`` are set; ``unknown_between`` lists the skipped elements
    between them, any of which may hold the change), ``newest-unchanged`` (the newest testable element is
    ``NO``: ``last_no``), ``oldest-changed`` (the oldest testable element is ``YES``: ``first_yes``; the change,
    if any, is older than the list) or ``untestable`` (every element is ``UNKNOWN``). ``asked``: the indices
    asked, in order.
    """

    status: str
    last_no: int | None
    first_yes: int | None
    unknown_between: tuple[int, ...]
    asked: tuple[int, ...]


def find_change(n: int, ask: Callable[[int], Answer]) -> Change:
    """The change in ``n`` elements (index 0 the oldest), asking each element at most once.

    Example:
        >>> answers = "NNUNYYY"
        >>> found = find_change(len(answers), lambda i: {"N": Answer.NO, "Y": Answer.YES, "U": Answer.UNKNOWN}[
        ...     answers[i]])
        >>> found.status, found.last_no, found.first_yes
        ('found', 3, 4)
    """
    answers: dict[int, Answer] = {}
    order: list[int] = []

    def answer(i: int) -> Answer:
        if i not in answers:
            answers[i] = ask(i)
            order.append(i)
        return answers[i]

    def done(status: str, last_no: int | None, first_yes: int | None) -> Change:
        between = () if last_no is None or first_yes is None else tuple(
            i for i in range(last_no + 1, first_yes) if answers.get(i) is Answer.UNKNOWN)
        return Change(status, last_no, first_yes, between, tuple(order))

    hi = next((i for i in reversed(range(n)) if answer(i) is not Answer.UNKNOWN), None)
    if hi is None:
        return done(NOTHING_TESTABLE, None, None)
    if answers[hi] is Answer.NO:
        return done(NEWEST_UNCHANGED, hi, None)
    lo = next((i for i in range(hi) if answer(i) is not Answer.UNKNOWN), None)
    if lo is None or answers[lo] is Answer.YES:
        return done(OLDEST_CHANGED, None, lo if lo is not None else hi)
    while True:
        untested = [i for i in range(lo + 1, hi) if i not in answers]
        if not untested:
            return done(FOUND, lo, hi)
        middle = (lo + hi) / 2
        pick = min(untested, key=lambda i: (abs(i - middle), i))
        log.debug("between %d and %d: asking %d (%d untested)", lo, hi, pick, len(untested))
        got = answer(pick)
        if got is Answer.YES:
            hi = pick
        elif got is Answer.NO:
            lo = pick
