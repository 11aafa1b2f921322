"""What backend calls cost: runs, and the compiles behind them (one counter with kinds).

A *run* is one invocation of a backend on a model (:meth:`BackendProcess.run
<graphbisect.backends.process.BackendProcess.run>`). A *compile* is one build of a model by the backend: an
``iree-compile`` of the model (IREE), a session (ONNX Runtime, onnx.reference), a compiled model (OpenVINO),
an engine (TensorRT). A run that reuses the session of an earlier run compiles nothing; a run that asks a
compiler which of its features changed the program (IREE ``report_passes=1``) compiles once per feature more;
a build made ahead of a run (:meth:`BackendProcess.load <graphbisect.backends.process.BackendProcess.load>`)
is a compile and no run. A *compile cache hit* is a compile served from the compile cache
(:mod:`graphbisect.backends.iree`'s artifacts keyed by content hash) instead of the compiler.

Every figure is measured in the worker that did the work (:attr:`RunResult.compiles
<graphbisect.backends.base.RunResult.compiles>`); the host sums them per role in a :class:`CallTally`.

Example:
    >>> tally = CallTally()
    >>> tally.add("target", Cost(runs=2, compiles=18, compile_cache_hits=3))
    >>> tally.add("oracle", Cost(runs=1, compiles=1))
    >>> tally.describe()
    'target 2 (18 compiles, 3 cached), oracle 1 (1 compile)'
    >>> tally.runs()
    {'target': 2, 'oracle': 1}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphbisect.text.printable import plural

if TYPE_CHECKING:
    from graphbisect.backends.base import RunResult

__all__ = ["CallTally", "Cost", "describe_calls"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cost:
    """Backend calls of one kind each: ``runs``, ``compiles`` (builds by the compiler or runtime) and
    ``compile_cache_hits`` (compiles served from the cache instead).

    Example:
        >>> Cost(runs=1, compiles=17) + Cost(runs=1, compiles=1, compile_cache_hits=1)
        Cost(runs=2, compiles=18, compile_cache_hits=1)
    """

    runs: int = 0
    compiles: int = 0
    compile_cache_hits: int = 0

    @classmethod
    def of_run(cls, run: RunResult) -> Cost:
        """One run and what it compiled (measured by its worker)."""
        return cls(1, run.compiles, run.compile_cache_hits)

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.runs + other.runs, self.compiles + other.compiles,
                    self.compile_cache_hits + other.compile_cache_hits)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.runs - other.runs, self.compiles - other.compiles,
                    self.compile_cache_hits - other.compile_cache_hits)

    def __bool__(self) -> bool:
        return bool(self.runs or self.compiles or self.compile_cache_hits)

    def to_json(self) -> dict[str, int]:
        return {"runs": self.runs, "compiles": self.compiles, "compile_cache_hits": self.compile_cache_hits}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cost:
        return cls(int(data.get("runs", 0)), int(data.get("compiles", 0)), int(data.get("compile_cache_hits", 0)))

    def describe(self) -> str:
        """``2 (18 compiles, 3 cached)``: the runs, then the compiles and the cache hits when there were any."""
        extra = [plural(self.compiles, "compile")] if self.compiles else []
        if self.compile_cache_hits:
            extra.append(f"{self.compile_cache_hits} cached")
        return f"{self.runs}" + (f" ({', '.join(extra)})" if extra else "")


class CallTally:
    """Backend calls per role (``oracle``, ``target``, ``control``...), each a :class:`Cost`.

    The role's runs are what the results' ``invocations`` always said; ``to_json`` adds the compiles
    (the results' ``backend_calls``).
    """

    def __init__(self, roles: Mapping[str, Cost] | None = None) -> None:
        self._roles: dict[str, Cost] = dict(roles or {})

    def add(self, role: str, cost: Cost) -> None:
        """Count ``cost`` for ``role``."""
        self._roles[role] = self._roles.get(role, Cost()) + cost

    def count(self, role: str, run: RunResult) -> None:
        """Count one run of ``role`` and what it compiled."""
        self.add(role, Cost.of_run(run))

    def merge(self, other: CallTally) -> None:
        """Count every role of ``other`` too (the calls of a step made elsewhere: a sub-search, a verification).

        Example:
            >>> tally = CallTally({"target": Cost(1, 1)})
            >>> tally.merge(CallTally({"target": Cost(2, 1), "control": Cost(1, 1)}))
            >>> tally.describe()
            'target 3 (2 compiles), control 1 (1 compile)'
        """
        for role, cost in other._roles.items():
            self.add(role, cost)

    def roles(self) -> dict[str, Cost]:
        """{role: Cost}, in the order the roles were first counted."""
        return dict(self._roles)

    def get(self, role: str) -> Cost:
        return self._roles.get(role, Cost())

    def runs(self) -> dict[str, int]:
        """{role: runs}: the ``invocations`` of every result."""
        return {role: cost.runs for role, cost in self._roles.items()}

    def to_json(self) -> dict[str, dict[str, int]]:
        """{role: {"runs", "compiles", "compile_cache_hits"}}: a result's ``backend_calls``."""
        return {role: cost.to_json() for role, cost in self._roles.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Mapping[str, Any]]) -> CallTally:
        return cls({role: Cost.from_json(value) for role, value in data.items()})

    def describe(self) -> str:
        """``target 2 (18 compiles), oracle 1 (1 compile)``: the terminal's ``invocations:`` line."""
        return ", ".join(f"{role} {cost.describe()}" for role, cost in self._roles.items())


def describe_calls(invocations: Mapping[str, int], calls: Mapping[str, Mapping[str, Any]] | None) -> str:
    """The ``invocations:`` line of a result: its ``backend_calls`` where it has them, else its runs.

    Example:
        >>> describe_calls({"target": 2}, {"target": {"runs": 2, "compiles": 18}})
        'target 2 (18 compiles)'
        >>> describe_calls({"target": 2}, None)
        'target 2'
    """
    if calls:
        return CallTally.from_json(calls).describe()
    return ", ".join(f"{role} {n}" for role, n in invocations.items())
