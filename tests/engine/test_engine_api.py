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
    """The engine is generic over lists of units: importing it loads no ONNX (the package's API needs numpy)."""
    import subprocess
    import sys

    code = "import sys, graphbisect.engine; print('onnx' in sys.modules, 'onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_engine_modules_import_only_the_standard_library() -> None:
    """No engine module imports numpy, onnx or another graphbisect package: strategies inject the domain."""
    import ast
    import sys
    from pathlib import Path

    folder = Path(engine.__file__).parent
    # graphbisect.settings.options (declared option ranges) is a leaf like graphbisect.errors: it imports only them.
    leaves = ("graphbisect.errors", "graphbisect.settings.options")
    for path in [*sorted(folder.glob("*.py")), folder.parent / "settings" / "options.py"]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                inside = name.startswith("graphbisect.engine") or name in leaves
                assert top in sys.stdlib_module_names or inside, f"{path.name} imports {name}"
