"""Module layering: each area imports in one direction (a façade on top, leaves below), no circles.

Counts every ``graphbisect`` import, also those under ``TYPE_CHECKING``: a circle there is still a circle
for the reader and for a type checker.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "graphbisect"

AREAS = {
    "artifacts": ["bundle", "content", "report", "repro", "charts", "environment", "model_text", "repro_min",
                  "shareable", "compare_text", "compare_report"],
    "model": ["graph", "io", "normalize", "external", "load"],
    "executors": ["base", "local", "ray", "factory", "candidates"],
}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("graphbisect."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("graphbisect.")}
    return found


@pytest.mark.parametrize("area", sorted(AREAS))
def test_area_has_no_import_cycle(area: str) -> None:
    names = [n for n in AREAS[area] if (PACKAGE / area / f"{n}.py").exists()]
    edges = {n: {m.rsplit(".", 1)[1] for m in _imports(PACKAGE / area / f"{n}.py")
                 if m.startswith(f"graphbisect.{area}.") and m.rsplit(".", 1)[1] in names} for n in names}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            assert state.get(nxt) != 1, f"import cycle in graphbisect/{area}: {' -> '.join([*path, node, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for name in names:
        if name not in state:
            visit(name, [])


def test_executor_interface_does_not_know_its_implementations() -> None:
    assert not {m for m in _imports(PACKAGE / "executors" / "base.py") if m.startswith("graphbisect.executors.")}


def test_repro_backends_do_not_import_repro() -> None:
    """``artifacts/repro.py`` imports the per-backend sections of ``artifacts/repro_backends/``, never the reverse."""
    sections = sorted((PACKAGE / "artifacts" / "repro_backends").glob("*.py"))
    assert {p.stem for p in sections} >= {"__init__", "_common", "onnxruntime", "reference", "onnxoptimizer",
                                          "openvino", "tensorrt", "command", "iree"}
    for path in sections:
        wrong = {m for m in _imports(path) if m.startswith("graphbisect.artifacts.")
                 and not m.startswith("graphbisect.artifacts.repro_backends")}
        assert not wrong, f"{path.name} imports {sorted(wrong)}"


def _module_graph() -> dict[str, set[str]]:
    """Every module of the package → the modules it imports (anywhere in it: lazily in a function, under
    ``TYPE_CHECKING``). A package's ``__init__`` is its façade of re-exports and counts as no module; a name
    imported from a package that is one of its modules is that module."""
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")
               if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("graphbisect"):
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def test_no_import_circle_anywhere() -> None:
    """No two modules import each other, directly or around a circle, not even lazily (issue 38: process ↔
    zygote, metrics ↔ nonfinite, compiled ↔ paddle_hooks were)."""
    graph = _module_graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, f"import circle: {' -> '.join([*path, node, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


#: The modules at the package root: only the public surface (issue 38). The on-disk layer is ``storage/``, the
#: words for names and files ``text/``, the option ranges ``settings/``, the generated documents ``docs/``; a new
#: module goes into the room that owns its concept.
ROOT_MODULES = {"__init__", "__main__", "_version", "api", "errors"}


def test_no_new_module_at_the_package_root() -> None:
    found = {p.stem for p in PACKAGE.glob("*.py")}
    assert found <= ROOT_MODULES, f"new module(s) at the package root: {sorted(found - ROOT_MODULES)}"


def test_the_storage_layer_imports_only_itself_and_errors() -> None:
    """``storage/`` is the bottom of the house: backend workers, maybe under another interpreter with only numpy,
    import it, so it imports nothing of graphbisect but its own modules and :mod:`graphbisect.errors`."""
    for path in sorted((PACKAGE / "storage").glob("*.py")):
        wrong = {m for m in _imports(path) if not m.startswith("graphbisect.storage.") and m != "graphbisect.errors"}
        assert not wrong, f"storage/{path.name} imports {sorted(wrong)}"


def _front_end_imports(path: Path) -> set[str]:
    """The modules of the package ``path`` imports, and ``graphbisect.api`` where it imports one of the API's
    functions through the package itself (``from graphbisect import compare`` is ``api.compare``)."""
    import graphbisect.api

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "graphbisect":
            found |= {f"graphbisect.{a.name}" for a in node.names}
            if {a.name for a in node.names} & set(graphbisect.api.__all__):
                found.add("graphbisect.api")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("graphbisect."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("graphbisect.")}
    return found


def test_the_cli_and_the_api_are_two_siblings_over_the_workflows() -> None:
    """One road from a front end to the workflows (issue 38: compare, passes, precision and triage went through
    ``api.py`` and reduce did not, so an option was parsed and checked on two roads): the CLI calls the workflows
    and never the API; the workflows know neither front end."""
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        wrong = {m for m in _front_end_imports(path) if m == "graphbisect.api" or m.startswith("graphbisect.api.")}
        assert not wrong, f"cli/{path.name} imports the API ({sorted(wrong)}): call the workflow it calls instead"
    for path in sorted((PACKAGE / "workflows").glob("*.py")):
        wrong = {m for m in _front_end_imports(path) if m == "graphbisect.api" or m.startswith("graphbisect.cli")}
        assert not wrong, f"workflows/{path.name} imports a front end: {sorted(wrong)}"


#: The most lines a function or method may take, from its ``def`` line to its last line, docstring included: a
#: reader should see its steps at once (issue 38: 14 were longer, ``compare_models`` 117 lines).
MAX_FUNCTION_LINES = 60


def _long_functions(root: Path, most: int) -> list[str]:
    """Every function and method under ``root`` (nested ones too) over ``most`` lines, as ``path:line name (n
    lines)``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_60_lines() -> None:
    long = _long_functions(PACKAGE, MAX_FUNCTION_LINES)
    assert not long, (f"{len(long)} function(s) over {MAX_FUNCTION_LINES} lines, def to last line; split each "
                      f"into steps a reader can name: {'; '.join(long)}")


def test_long_functions_are_found(tmp_path: Path) -> None:
    """The count runs from the ``def`` line (a decorator above it is not counted) to the last line, and takes in
    methods: ``fits`` is 60 lines (61 with its decorator), ``over`` 61."""
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    (package / "m.py").write_text(f"@decorator\ndef fits():\n    '''Doc.'''\n{body}\n\n"
                                  f"class C:\n    def over(self):\n        '''Doc.'''\n"
                                  + "".join(f"        x{i} = {i}\n" for i in range(59)))
    assert _long_functions(package, MAX_FUNCTION_LINES) == ["pkg/m.py:65 over (61 lines)"]


def _environment_reads_at_import(root: Path) -> list[str]:
    """Where a module reads the environment (``os.environ``, ``os.getenv``) while it is imported: at module or
    class level, in a default argument or a decorator, not inside a function body."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        stack: list[ast.AST] = list(ast.parse(source).body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                made = (*node.decorator_list, *node.args.defaults, *node.args.kw_defaults)
                stack.extend(d for d in made if d is not None)
                continue
            if isinstance(node, ast.Lambda):
                stack.extend(node.args.defaults)
                continue
            if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {ast.get_source_segment(source, node)}")
            stack.extend(ast.iter_child_nodes(node))
    return found


def test_no_module_reads_the_environment_when_imported() -> None:
    """A forked worker's modules were imported by its zygote, whose key leaves out graphbisect's own variables
    (``GRAPHBISECT_*``, :func:`graphbisect.backends.zygote.per_worker`): a module that read one at import would
    see the zygote's value, not the worker's. Every variable is read when it is needed."""
    reads = _environment_reads_at_import(PACKAGE)
    assert not reads, f"read the environment inside a function instead: {'; '.join(reads)}"


def test_environment_reads_at_import_are_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text("import os\nA = os.environ.get('GRAPHBISECT_X')\n"
                                  "def f(x=os.getenv('Y')):\n    return os.environ['Z']\n"
                                  "class C:\n    B = os.environ\n")
    assert _environment_reads_at_import(package) == [
        "pkg/m.py:6 os.environ", "pkg/m.py:3 os.getenv", "pkg/m.py:2 os.environ"]
