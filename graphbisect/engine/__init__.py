"""A generic reduction engine: delta debugging over a list of units, with no ONNX inside.

The caller (a strategy) numbers its units ``0..n-1`` and supplies a test deciding whether a keep-set still
fails the same way. The engine supplies the search (:func:`ddmin`, :func:`probdd`, :func:`sweep`, the
bisection helpers, a :class:`Reducer` looping several passes) and everything around it through one
:class:`Evaluator`: closure over dependencies, outcome cache, crash-safe :class:`Journal`, :class:`Budget`,
statistics, progress events and parallel evaluation with results identical to a serial run.

Example:
    >>> from graphbisect.engine import Evaluator, Outcome, probdd
    >>> ev = Evaluator(lambda keep: Outcome.FAIL if {7, 300} <= keep else Outcome.PASS, n=512)
    >>> sorted(probdd(ev).keep)
    [7, 300]
"""

from __future__ import annotations

from graphbisect.engine.bisect import bisect_prefix, find_one
from graphbisect.engine.budget import Budget, BudgetMeter
from graphbisect.engine.cache import OutcomeCache, decode_key, encode_key
from graphbisect.engine.ddmin import ddmin
from graphbisect.engine.evaluator import Evaluator
from graphbisect.engine.journal import KILLED_DETAIL, Journal, JournalError
from graphbisect.engine.probdd import probdd
from graphbisect.engine.reducer import Partition, Pass, Reducer, SearchFunction
from graphbisect.engine.search import SearchRun, run_search, sweep
from graphbisect.engine.types import (
    BudgetExhausted,
    Closure,
    Counts,
    MapFunction,
    Outcome,
    ProgressCallback,
    ProgressEvent,
    SearchAborted,
    SearchResult,
    SearchStats,
    StopReason,
    SubmitExecutor,
    TestFunction,
    TestResult,
)

__all__ = [
    "KILLED_DETAIL",
    "Budget",
    "BudgetExhausted",
    "BudgetMeter",
    "Closure",
    "Counts",
    "Evaluator",
    "Journal",
    "JournalError",
    "MapFunction",
    "Outcome",
    "OutcomeCache",
    "Partition",
    "Pass",
    "ProgressCallback",
    "ProgressEvent",
    "Reducer",
    "SearchAborted",
    "SearchFunction",
    "SearchResult",
    "SearchRun",
    "SearchStats",
    "StopReason",
    "SubmitExecutor",
    "TestFunction",
    "TestResult",
    "bisect_prefix",
    "ddmin",
    "decode_key",
    "encode_key",
    "find_one",
    "probdd",
    "run_search",
    "sweep",
]
