"""The checker imports nothing from the search it checks (DESIGN: untrusted search, trusted checker)."""

from __future__ import annotations

import ast
from pathlib import Path

import graphbisect.checker

#: What the checker may use of graphbisect: how to run a backend, the backend table, reading a bundle's files.
ALLOWED = {
    "graphbisect.artifacts.bundle_read",  # reading the files (zip extraction, sha256 integrity); no claim
    "graphbisect.backends.base",
    "graphbisect.backends.process",  # the isolated worker that runs one model
    "graphbisect.backends.registry",  # the backend table: options, opt_levels, the trust rule
    "graphbisect.text.printable",  # escaping names for a terminal line (the standard library only); no claim
}
#: The rooms of the search: never imported by the checker, directly or by a module it is allowed.
SEARCH = ("graphbisect.engine", "graphbisect.strategies", "graphbisect.localize", "graphbisect.oracle",
          "graphbisect.compare", "graphbisect.workflows", "graphbisect.executors", "graphbisect.data.store")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("graphbisect")}


def test_the_checker_imports_only_what_it_may() -> None:
    folder = Path(graphbisect.checker.__file__).parent
    used = set().union(*(_imports(path) for path in folder.glob("*.py")))
    own = {name for name in used if name.startswith("graphbisect.checker")}
    assert used - own <= ALLOWED, sorted(used - own - ALLOWED)
    assert not any(name.startswith(SEARCH) for name in used)


#: What the allowed modules themselves import of the search's rooms, and why that is no path for a claim.
KNOWN = {
    # RunResult.stats' type: statistics a worker computes only for a run asked to compare (compare_to=), which the
    # checker never asks; its comparisons are its own (graphbisect.checker.values)
    "graphbisect.backends.base": {"graphbisect.compare.metrics"},
    "graphbisect.backends.process": {"graphbisect.compare.metrics"},
    "graphbisect.backends.registry": set(),
    "graphbisect.text.printable": set(),
    "graphbisect.artifacts.bundle_read": set(),
}


def test_the_modules_it_may_import_reach_the_search_only_as_known() -> None:
    root = Path(graphbisect.checker.__file__).parent.parent
    assert set(KNOWN) >= ALLOWED, f"say what {sorted(ALLOWED - set(KNOWN))} import of the search, in KNOWN"
    for module, known in KNOWN.items():
        path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
        assert {name for name in _imports(path) if name.startswith(SEARCH)} == known, module

