"""How much a reduction may spend: backend invocations and wall time.

Backend invocations are the cost that matters (a TensorRT engine build takes seconds to minutes), so the
budget counts only tests that really ran the backend (``TestResult.invoked``); cache hits and candidates
rejected before running are free.

Example:
    >>> clock = iter([0.0, 1.0, 30.0, 30.0]).__next__
    >>> meter = BudgetMeter(Budget(max_invocations=2, deadline_seconds=10), clock=clock)
    >>> meter.charge(1); meter.slots(4)
    1
    >>> meter.slots(4), meter.reason()
    (0, <StopReason.DEADLINE: 'deadline'>)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from graphbisect.engine.types import StopReason
from graphbisect.settings.options import INVOCATIONS, check_fields, option, seconds, whole

__all__ = ["Budget", "BudgetMeter"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """Limits of one reduction run; ``None`` means unlimited.

    Example:
        >>> Budget(max_invocations=200).unlimited, Budget().unlimited
        (False, True)
    """

    max_invocations: int | None = option(None, INVOCATIONS)
    deadline_seconds: float | None = option(None, seconds(zero=True).or_none())
    #: Stop after this many invocations in a row without a FAIL, or ``stall_per_unit`` times the current
    #: best set's size if that is more (a 1-minimality sweep needs one passing run per unit). A search in
    #: which every candidate passes makes no progress: it stops and reports what it has instead of
    #: spending hundreds of runs. None: no such limit.
    max_stall: int | None = option(None, whole(1).or_none())
    stall_per_unit: float = 2.0

    def __post_init__(self) -> None:
        check_fields(self)  # an OptionError is a ValueError too

    @property
    def unlimited(self) -> bool:
        return self.max_invocations is None and self.deadline_seconds is None


class BudgetMeter:
    """The running account of a :class:`Budget`; the deadline counts from the meter's creation.

    One meter is shared by every search of an :class:`~graphbisect.engine.Evaluator`, so several
    searches in one run (strategy passes, rounds) draw on the same budget.
    """

    def __init__(self, budget: Budget, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._start = clock()
        self.spent = 0
        self.interrupted = False
        self.since_fail = 0  # invocations since the last FAIL (the stall)
        self.best: int | None = None  # size of the current best failing set, for the stall limit

    def elapsed(self) -> float:
        """Seconds since the meter started."""
        return self._clock() - self._start

    def charge(self, invocations: int = 1, *, failed: bool = False) -> None:
        """Record backend invocations that happened; ``failed``: the run found the failure (progress)."""
        self.spent += invocations
        self.since_fail = 0 if failed else self.since_fail + invocations

    def stall_limit(self) -> int | None:
        """Invocations without a FAIL after which the search stops (None: unlimited)."""
        if self.budget.max_stall is None:
            return None
        return max(self.budget.max_stall, int(self.budget.stall_per_unit * (self.best or 0)))

    def slots(self, wanted: int) -> int:
        """How many new tests may start now (at most ``wanted``); 0 when the budget is exhausted."""
        if self.reason() is not None:
            return 0
        if self.budget.max_invocations is None:
            return wanted
        return min(wanted, self.budget.max_invocations - self.spent)

    def interrupt(self) -> None:
        """Ctrl-C: no further invocation may start, in this search or any later one of the same run.

        A search that catches ``KeyboardInterrupt`` returns its best-so-far; without this the next search
        phase (or strategy pass) would simply start, and the user's Ctrl-C would stop only one phase.
        """
        self.interrupted = True

    def reason(self) -> StopReason | None:
        """Why no further invocation may start, or ``None`` while the budget lasts."""
        if self.interrupted:
            return StopReason.INTERRUPTED
        limit = self.budget.max_invocations
        if limit is not None and self.spent >= limit:
            return StopReason.MAX_INVOCATIONS
        deadline = self.budget.deadline_seconds
        if deadline is not None and self.elapsed() >= deadline:
            return StopReason.DEADLINE
        stall = self.stall_limit()
        if stall is not None and self.since_fail >= stall:
            return StopReason.NO_PROGRESS
        return None
