"""The local executor: a pool of worker *processes* on this machine (the default of ``graphbisect triage``).

Processes, not threads: one model's triage loads models, compares tensors and writes bundles in Python, so
threads would share one GIL. Workers are started with ``spawn`` (no fork of a process that may hold
threads and open backend pipes). When a worker dies (killed, out of memory) the standard pool breaks and
fails every task it held; this executor replaces the pool and resubmits each of those tasks up to
``max_retries`` times, then reports :class:`~graphbisect.executors.base.WorkerLostError`.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from graphbisect.executors.base import DEFAULT_RETRIES, WorkerLostError
from graphbisect.settings.options import cap_jobs, usable_cpus
from graphbisect.text.printable import plural

__all__ = ["LocalExecutor"]

log = logging.getLogger(__name__)


@dataclass
class _Task:
    """One submitted call and the future its caller holds, across attempts."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outer: Future[Any]
    attempt: int = 0


class LocalExecutor:
    """``jobs`` worker processes; ``submit`` returns a future that survives one lost worker (see module doc)."""

    def __init__(self, *, jobs: int | None = None, max_retries: int = DEFAULT_RETRIES) -> None:
        self._jobs, capped = cap_jobs(max(1, jobs or usable_cpus()))
        if capped is not None:
            log.warning("%s", capped)
        self.max_retries = max_retries
        self._lock = threading.RLock()
        self._generation = 0
        self._pool = self._new_pool()
        self.lost = 0  # tasks resubmitted because their pool broke

    @property
    def workers(self) -> int:
        return self._jobs

    @property
    def name(self) -> str:
        return "local"

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self._jobs, mp_context=multiprocessing.get_context("spawn"))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` in a worker process."""
        task = _Task(fn, args, kwargs, Future())
        self._attempt(task)
        return task.outer

    def _attempt(self, task: _Task) -> None:
        with self._lock:
            generation = self._generation
            try:
                inner = self._pool.submit(task.fn, *task.args, **task.kwargs)
            except BrokenProcessPool:  # broke between our tasks: replace it and submit there
                generation = self._renew(generation)
                inner = self._pool.submit(task.fn, *task.args, **task.kwargs)
        inner.add_done_callback(lambda done: self._settle(task, done, generation))

    def _settle(self, task: _Task, done: Future[Any], generation: int) -> None:
        exc = done.exception()
        if isinstance(exc, BrokenProcessPool):
            self._lost(task, exc, generation)
        elif exc is not None:
            task.outer.set_exception(exc)
        else:
            task.outer.set_result(done.result())

    def _lost(self, task: _Task, exc: BaseException, generation: int) -> None:
        with self._lock:
            self.lost += 1
            self._renew(generation)
        name = getattr(task.fn, "__name__", task.fn)
        if task.attempt < self.max_retries:
            task.attempt += 1
            log.warning("a worker process died while running %s; resubmitting it (attempt %d of %d)",
                        name, task.attempt + 1, self.max_retries + 1)
            self._attempt(task)
            return
        lost = WorkerLostError(f"the worker running {name} died {plural(task.attempt + 1, 'time')}",
                               hint="a worker process was killed (out of memory?); lower -j, or check dmesg")
        lost.__cause__ = exc
        task.outer.set_exception(lost)

    def _renew(self, generation: int) -> int:
        """Replace the pool of ``generation`` if nobody has yet; returns the current generation."""
        if generation == self._generation:
            self._pool.shutdown(wait=False, cancel_futures=False)
            self._pool = self._new_pool()
            self._generation += 1
        return self._generation

    def close(self) -> None:
        """Wait for running tasks and stop the workers."""
        with self._lock:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
