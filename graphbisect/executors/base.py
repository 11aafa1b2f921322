"""The executor interface and the spec that picks one (``local`` or ``ray[:ADDRESS]``).

Contract shared by every executor:

* ``submit(fn, *args)`` runs ``fn(*args)`` somewhere and returns a :class:`concurrent.futures.Future`
  (so an executor is also a :class:`~graphbisect.engine.types.SubmitExecutor` for the engine);
  ``fn`` must be a module-level function and its arguments and result picklable;
* a task whose **worker was lost** (killed, out of memory, node gone) is run again elsewhere
  (``max_retries`` times); if it is lost every time, its future raises :class:`WorkerLostError`. An
  exception raised *by* ``fn`` is never retried: it is the task's result;
* results do not depend on the executor: tasks are pure functions of their arguments and callers
  order results by task, never by completion.

Example:
    >>> from graphbisect.executors import make_executor
    >>> with make_executor("local", jobs=1) as ex:          # doctest: +SKIP
    ...     ex.submit(pow, 2, 10).result()
    1024
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from graphbisect.errors import GraphBisectError, SpecError
from graphbisect.settings.options import parses

__all__ = ["DEFAULT_RETRIES", "EXECUTOR", "Executor", "ExecutorSpec", "WorkerLostError"]

log = logging.getLogger(__name__)

#: How many times a task whose worker was lost is run again (locally and on Ray).
DEFAULT_RETRIES = 1


class WorkerLostError(GraphBisectError):
    """A task's worker died (every attempt): the task has no result, which is neither a pass nor a failure."""


@runtime_checkable
class Executor(Protocol):
    """Runs independent tasks; see the module docstring for the contract."""

    @property
    def workers(self) -> int:
        """How many tasks may run at once."""
        ...

    @property
    def name(self) -> str:
        """``local`` or ``ray:<address>``, for reports."""
        ...

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


@dataclass(frozen=True)
class ExecutorSpec:
    """A parsed ``--executor`` value: ``local``, ``ray`` (start or join a local cluster) or ``ray:ADDRESS``."""

    kind: str
    address: str | None = None

    @classmethod
    def parse(cls, text: str) -> ExecutorSpec:
        """Parse ``local``, ``ray`` or ``ray:ADDRESS`` (``ray:auto``, ``ray:10.0.0.5:6379``, ``ray:ray://host:10001``).

        >>> ExecutorSpec.parse("ray:127.0.0.1:6379")
        ExecutorSpec(kind='ray', address='127.0.0.1:6379')
        """
        kind, _, address = text.strip().partition(":")
        if kind not in ("local", "ray") or (kind == "local" and address):
            raise SpecError(f"unknown executor {text!r}",
                            hint="use local (worker processes on this machine), ray (a local Ray instance) or "
                            "ray:ADDRESS (an existing cluster, e.g. ray:auto or ray:10.0.0.5:6379)")
        return cls(kind, address or None)


#: An executor spec option's values (``ReduceOptions.executor``, ``--executor``).
EXECUTOR = parses(ExecutorSpec.parse, "an executor spec: local, ray or ray:ADDRESS", "'local'")
