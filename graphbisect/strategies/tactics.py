"""Tactic isolation: the fewest (node, kernel choice) pairs that turn a good build into a bad one.

Units are the nodes whose implementation differs between a good and a bad build's tactic records. A keep
set is a build: the bad build's choices for the kept nodes, the good build's for the rest
(:meth:`TacticSpace.record_for`); the injected test replays it and answers FAIL when the bad build's
failure reproduces. The walk (:func:`isolate`):

1. replay the bad build (all units) and the good build (none): both must behave as recorded, otherwise
   the difference is not explained by the kernel choices (a flaky backend, or choices that cannot be
   forced) and the search stops with that verdict;
2. probabilistic delta debugging (:func:`graphbisect.engine.probdd`) to a 1-minimal failing group;
3. revert that group to the good choices and replay the rest: while it still fails, another independent
   group is responsible, and step 2 runs again on what is left. When it passes, the culprits are
   *confirmed by replay*: the bad choices of the culprits alone fail, and the bad build without them passes.

Example:
    >>> from graphbisect.engine import Evaluator, Outcome
    >>> from graphbisect.tactics import TacticChoice, TacticRecord
    >>> good = TacticRecord("x", None, None, tuple(TacticChoice(f"n{i}", "a") for i in range(6)))
    >>> bad = good.with_choices({f"n{i}": "b" for i in range(6)})
    >>> space = TacticSpace.between(good, bad)
    >>> def test(keep):  # n1 alone or n4 alone breaks the build
    ...     rec = space.record_for(keep)
    ...     return Outcome.FAIL if "b" in (rec.choice_of("n1"), rec.choice_of("n4")) else Outcome.PASS
    >>> result = isolate(space, Evaluator(test, space.size, allow_empty=True))
    >>> sorted(c.node for c in result.culprits), result.confirmed
    (['n1', 'n4'], True)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from graphbisect.engine import BudgetExhausted, Evaluator, Outcome, TestResult, probdd
from graphbisect.errors import InputError
from graphbisect.tactics.diff import ChoiceChange, compose, diff_records
from graphbisect.tactics.record import TacticRecord

__all__ = ["Isolation", "TacticSpace", "isolate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TacticSpace:
    """The units of a tactic bisection: the choices that differ between a good and a bad record."""

    good: TacticRecord
    bad: TacticRecord
    changes: tuple[ChoiceChange, ...]

    @classmethod
    def between(cls, good: TacticRecord, bad: TacticRecord) -> TacticSpace:
        """The space of the nodes whose choice differs; raises when there is none."""
        changes = diff_records(good, bad).changed
        if not changes:
            raise InputError("the good and the bad tactic records choose the same kernels for every node",
                             hint="the failure is not explained by kernel choices; compare the builds' other "
                             "settings (precision, version, device), or record more builds")
        return cls(good, bad, changes)

    @property
    def size(self) -> int:
        return len(self.changes)

    def record_for(self, keep: Iterable[int]) -> TacticRecord:
        """The bad build's choices for the units in ``keep``, the good build's for the others."""
        return compose(self.good, self.bad, [self.changes[i].node for i in sorted(keep)])

    def changes_of(self, keep: Iterable[int]) -> tuple[ChoiceChange, ...]:
        return tuple(self.changes[i] for i in sorted(keep))


@dataclass(frozen=True)
class Isolation:
    """What :func:`isolate` found.

    ``groups`` are the 1-minimal groups of choices, each of which alone turns the good build bad;
    ``confirmed`` is true when the bad build with every culprit reverted passes (so nothing else matters);
    ``verdict`` says in words why the search stopped when it could not finish.
    """

    groups: tuple[tuple[ChoiceChange, ...], ...]
    confirmed: bool
    minimal: bool
    verdict: str

    @property
    def culprits(self) -> tuple[ChoiceChange, ...]:
        return tuple(c for group in self.groups for c in group)


def isolate(space: TacticSpace, evaluator: Evaluator, *, max_groups: int = 16) -> Isolation:
    """Find every minimal group of differing choices that makes the good build bad (module docstring)."""
    universe = evaluator.universe
    try:
        replayed = evaluator.evaluate(universe, phase="replay-bad")
        if replayed.outcome is not Outcome.FAIL:
            return Isolation((), False, False, _not_repeated(replayed))
        if evaluator.evaluate(frozenset(), phase="replay-good").outcome is Outcome.FAIL:
            return Isolation((), False, False, "the good build's choices, replayed, fail too")
        return _groups(space, evaluator, universe, max_groups)
    except BudgetExhausted as exc:
        return Isolation((), False, False, f"stopped: {exc}")


def _not_repeated(replayed: TestResult) -> str:
    """Why the bad build's choices, replayed, did not fail, as far as the replay shows: some could not be
    forced (the test's ``detail["not_applied"]``), or all took effect and the failure still did not repeat."""
    detail = replayed.detail if isinstance(replayed.detail, dict) else {}
    missed = list(detail.get("not_applied") or ())
    if missed:
        shown = ", ".join(str(getattr(n, "node", n)) for n in missed[:6]) + (" ..." if len(missed) > 6 else "")
        return (f"the bad build's choices, replayed, do not fail, but {len(missed)} of them could not be forced "
                f"({shown}): the failure may lie in a choice this backend does not let the replay make")
    return ("the bad build's choices, replayed, took effect and do not fail: the failure is not caused by these "
            "kernel choices (a flaky backend, or something else that differed between the builds)")


def _groups(space: TacticSpace, evaluator: Evaluator, universe: frozenset[int], max_groups: int) -> Isolation:
    remaining, groups, minimal = universe, [], True
    for index in range(max_groups):
        result = probdd(evaluator, remaining, phase=f"group-{index + 1}")
        minimal = minimal and result.minimal
        groups.append(space.changes_of(result.keep))
        logger.info("culprit group %d: %s", index + 1, ", ".join(c.node for c in groups[-1]))
        remaining = remaining - result.keep
        if result.stop_reason is not None:
            return Isolation(tuple(groups), False, False, f"stopped: {result.stop_reason.value}")
        if not remaining or evaluator.evaluate(remaining, phase="confirm").outcome is not Outcome.FAIL:
            return Isolation(tuple(groups), True, minimal, "confirmed by replay")
    return Isolation(tuple(groups), False, minimal, f"more than {max_groups} independent culprit groups")
