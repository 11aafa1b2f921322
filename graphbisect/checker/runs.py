"""Plain runs for the checker: one model, its own outputs only, in a worker of its own, with no compile cache.

A *plain* run is what a user's own script would do: the model as it is (no tensor exposed that the model does
not output), the spec as written, no cache of an earlier build. Each :class:`Runner` starts its workers in a
temporary folder of its own and removes it when closed; :meth:`Runner.fresh` runs in a worker started for that
one run (for the flakiness check: nothing carried over between the runs).

Where the target can describe what it compiled (a registry row's ``compiled_option``, e.g. ONNX Runtime's
``save_optimized=1``, which writes the optimized model and changes nothing it computes), :meth:`Runner.run`
asks it to, and :func:`compiled_nodes` reads the description as ``(op_type, name)`` pairs.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from graphbisect.backends.base import BackendSpec, RunResult
from graphbisect.backends.process import BackendProcess, compile_cache
from graphbisect.backends.registry import resolve

__all__ = ["Run", "Runner", "compiled_nodes", "describing"]


@dataclass(frozen=True)
class Run:
    """One plain run: what happened, the outputs copied out of the worker, and the compiled graph's nodes
    where the target described them (None: it did not)."""

    result: RunResult
    outputs: Mapping[str, Any]
    compiled: tuple[tuple[str, str], ...] | None = None

    @property
    def ok(self) -> bool:
        return self.result.ok

    def crash_text(self) -> str:
        """``"<ErrorType>: <message>"`` of a run that did not complete (its status for a timeout)."""
        if self.result.ok:
            return ""
        if self.result.error_type or self.result.message:
            return f"{self.result.error_type or 'Error'}: {self.result.message or ''}"
        return self.result.describe()


def describing(spec: BackendSpec) -> BackendSpec | None:
    """``spec`` with the option that makes it describe its compiled graph, or None when it cannot."""
    _, row = resolve(spec, require_available=False)
    if row.compiled_option is None:
        return None
    key, value = row.compiled_option
    return spec.with_options(**{key: value})


class Runner:
    """Plain runs of one spec: each counted in :attr:`runs`, its builds in :attr:`compiles`. Its workers'
    folders are made in ``folder`` (default: the system's temporary folder) and removed when it closes."""

    def __init__(self, spec: BackendSpec, *, describe: bool = False, timeout: float | None = None,
                 folder: Path | None = None) -> None:
        self.spec = spec
        self.run_spec = (describing(spec) or spec) if describe else spec
        self.timeout = timeout
        self.runs = 0
        self.compiles = 0  # builds of a model the workers made for these runs (as they counted them)
        self._folder = Path(tempfile.mkdtemp(prefix="graphbisect-check-", dir=folder))
        self._process: BackendProcess | None = None

    def run(self, model: Path, inputs: Mapping[str, Any] | Path) -> Run:
        """``model`` on ``inputs`` in this runner's worker (started on the first run, without a compile cache)."""
        if self._process is None:
            with compile_cache(None):
                self._process = BackendProcess(self.run_spec, workdir=self._folder / "worker", timeout=self.timeout)
        return self._run(self._process, model, inputs)

    def fresh(self, model: Path, inputs: Mapping[str, Any] | Path) -> Run:
        """``model`` on ``inputs`` in a worker started for this run alone, closed after it."""
        folder = Path(tempfile.mkdtemp(prefix="fresh-", dir=self._folder))
        with compile_cache(None), BackendProcess(self.run_spec, workdir=folder, timeout=self.timeout) as process:
            return self._run(process, model, inputs)

    def _run(self, process: BackendProcess, model: Path, inputs: Mapping[str, Any] | Path) -> Run:
        self.runs += 1
        result = process.run(model, inputs)
        self.compiles += result.compiles
        outputs = {name: _copy(value) for name, value in result.outputs.items()}
        return Run(result, outputs, compiled_nodes(result.info))

    def close(self) -> None:
        if self._process is not None:
            self._process.close()
            self._process = None
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def compiled_nodes(info: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """``(op_type, name)`` of every node of the compiled graph a run described: ONNX Runtime's optimized model
    (``optimized_model``) or OpenVINO's execution graph (``exec_graph``: each layer's type and name); None when the
    run described nothing the checker reads."""
    path = info.get("optimized_model")
    if isinstance(path, str) and Path(path).is_file():
        model = onnx.load(path, load_external_data=False)
        return tuple((node.op_type, node.name) for node in model.graph.node)
    graph = info.get("exec_graph")
    if isinstance(graph, list):
        return tuple((str(item.get("layer_type") or ""), str(item.get("name", ""))) for item in graph
                     if isinstance(item, Mapping))
    return None


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return None if value is None else value.copy()
