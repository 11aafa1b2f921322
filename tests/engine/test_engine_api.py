"""The engine's public façade is pinned, and every docstring example runs."""

from __future__ import annotations

import doctest
import importlib

import pytest

from graphbisect import engine

MODULES = [
    "",
    ".bisect",
    ".budget",
    ".cache",
    ".ddmin",
    ".evaluator",
    ".journal",
    ".probdd",
    ".reducer",
    ".search",
    ".types",
]


def test_public_api_is_pinned() -> None:
    assert sorted(engine.__all__) == [
        "Budget",
        "BudgetExhausted",
        "BudgetMeter",
        "Closure",
        "Counts",
        "Evaluator",
        "Journal",
        "JournalError",
        "KILLED_DETAIL",
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
    for name in engine.__all__:
        assert hasattr(engine, name), name


@pytest.mark.parametrize("suffix", MODULES)
def test_docstring_examples(suffix: str) -> None:
    module = importlib.import_module("graphbisect.engine" + suffix)
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0


def test_engine_imports_no_onnx() -> None:
    import subprocess
    import sys

    code = "import sys, graphbisect.engine; print('onnx' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
