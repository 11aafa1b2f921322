"""Executors: where independent tasks (one model's triage each) run — local worker processes or a Ray cluster.

Every executor has the :class:`~graphbisect.executors.base.Executor` interface (``submit`` returning a
``concurrent.futures.Future``, ``workers``, ``close``), retries a task whose *worker* was lost (never one
whose function raised), and is chosen by a spec string with :func:`make_executor`: ``local``, ``ray`` or
``ray:ADDRESS``.
"""

from __future__ import annotations

from graphbisect.executors.base import EXECUTOR, Executor, ExecutorSpec, WorkerLostError
from graphbisect.executors.factory import make_executor

__all__ = ["EXECUTOR", "Executor", "ExecutorSpec", "WorkerLostError", "make_executor"]
