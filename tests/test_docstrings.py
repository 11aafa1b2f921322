"""Every docstring example in the package runs and is true (they are documentation users copy from)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import graphbisect

# Modules whose import has side effects (the CLI entry point runs the command).
_SKIP = {"graphbisect.__main__"}
MODULES = sorted(
    info.name for info in pkgutil.walk_packages(graphbisect.__path__, "graphbisect.") if info.name not in _SKIP
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) in {name} failed (output above)"
