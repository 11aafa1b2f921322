"""Candidate runs on an executor: one reduction's target invocations fanned out over Ray (or processes).

The reduction itself stays in its process: engine, journal, activation store and the materialized
candidates. Only the **target invocation** travels. A task gets the path of a saved candidate (in the
work folder, next to the shared ``weights.bin``), its feeds and the target spec; it runs the candidate in
a :class:`~graphbisect.backends.BackendProcess` that its worker process keeps between tasks (so a
backend is loaded once per worker, not once per candidate) and returns the
:class:`~graphbisect.backends.RunResult` with its outputs in memory.

:class:`ExecutorPool` has the interface of :class:`~graphbisect.oracle.tester.WorkerPool`, so the
candidate tester, the journal and the engine's parallel mode are unchanged: with ``jobs=N`` the engine
tests N candidates at once and each test waits for its task. Hence results do not depend on the executor.
A task whose worker is lost is run again by the executor (``max_retries``); lost every time, the
reduction stops with its best result so far and resumes with ``--resume``, and the candidate is not
counted as a pass or a failure. On a multi-node Ray cluster the work folder must be on a filesystem every
node mounts at the same path (as triage's OUT_DIR), since a task reads the candidate by path.

Example:
    >>> pool = ExecutorPool.open("ray:auto", "onnxruntime:opt_level=all", work / "target", jobs=4)  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from graphbisect.backends import BackendProcess, BackendSpec, Capability, RunResult, resolve
from graphbisect.backends.cost import Cost
from graphbisect.executors.base import Executor
from graphbisect.executors.factory import make_executor

if TYPE_CHECKING:
    from graphbisect.oracle.identity import Identity, IdentityCheck

__all__ = ["ExecutorPool", "run_candidate"]

#: Backend workers of this process, by (spec, timeout, scratch folder): kept between tasks, closed at exit.
_WORKERS: dict[tuple[str, float | None, str], BackendProcess] = {}
_LOCK = threading.Lock()


def run_candidate(spec: str, model: str, feeds: Mapping[str, np.ndarray], timeout: float | None,
                  scratch: str, *, compile_only: bool = False, built_first: BuiltFirst | None = None) -> RunResult:
    """The task: run ``model`` on ``feeds`` with the target ``spec`` in this process's backend worker (with
    ``compile_only``, only build it: :meth:`BackendProcess.compile <graphbisect.backends.BackendProcess.compile>`).
    With ``built_first``: build it, and where the build compiled the failure's region otherwise
    (``IdentityCheck.compiled_differs``) or crashed, return the build (its info's
    ``built_only`` true, and ``built_otherwise`` the reason), else run it on that build (its ``compiles``
    counting the build).

    The worker's files live in ``scratch/HOST-PID``, inside the reduction's work folder, so they go with it: a
    Ray worker is killed at cluster shutdown (with its children) and would never remove a folder of its own."""
    key = (spec, timeout, scratch)
    with _LOCK:
        proc = _WORKERS.get(key)
        if proc is None:
            for old_key, old in list(_WORKERS.items()):  # workers of reductions whose folder is gone
                if not old.workdir.exists():
                    old.close()
                    del _WORKERS[old_key]
            workdir = Path(scratch) / f"{socket.gethostname()}-{os.getpid()}"
            proc = _WORKERS[key] = BackendProcess(spec, workdir=workdir, timeout=timeout)
        if compile_only:
            return proc.compile(model)
        built = proc.compile(model) if built_first is not None else None
        if built is not None and built_first is not None:
            from graphbisect.oracle.tester import BUILT_ONLY, BUILT_OTHERWISE

            if not built.ok:  # the crash at load a run would report
                return dataclasses.replace(built, info={**built.info, BUILT_ONLY: True})
            if why := built_first.decides(model, built):
                return dataclasses.replace(built, info={BUILT_ONLY: True, BUILT_OTHERWISE: why})
        run = proc.run(model, dict(feeds))
        if built is not None:
            run = dataclasses.replace(run, compiles=run.compiles + built.compiles,
                                      compile_cache_hits=run.compile_cache_hits + built.compile_cache_hits)
        # The worker's output files are overwritten by its next run, and its folder may be on another
        # machine: the result carries copies, and a saved optimized model travels as its graph (weights stay).
        info = dict(run.info)
        optimized = info.pop("optimized_model", None)
        if isinstance(optimized, str) and Path(optimized).exists():
            info["optimized_graph"] = onnx.load(optimized, load_external_data=False).SerializeToString()
        return dataclasses.replace(run, outputs={name: np.array(value) for name, value in run.outputs.items()},
                                   info=info)


@dataclasses.dataclass(frozen=True)
class BuiltFirst:
    """What a task needs to decide a candidate by its build: the failure's identity and the candidate's graph
    outputs (its model is read from the file the task builds)."""

    identity: Identity
    outputs: tuple[str, ...]

    def decides(self, model: str, built: RunResult) -> str | None:
        """Why the build of ``model`` compiled the region otherwise (None: run it)."""
        from graphbisect.oracle.identity import IdentityCheck
        from graphbisect.oracle.tester import compiled_of

        compiled = compiled_of(onnx.load(model, load_external_data=False), self.outputs, built)
        return IdentityCheck(self.identity, after=()).compiled_differs(compiled)


@atexit.register
def _close_workers() -> None:
    for proc in _WORKERS.values():
        proc.close()
    _WORKERS.clear()


class _Runner:
    """What :meth:`ExecutorPool.acquire` yields: ``run`` like a BackendProcess, executed as a task."""

    def __init__(self, pool: ExecutorPool) -> None:
        self._pool = pool

    def run(self, model: str | Path, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
            ) -> RunResult:
        if outputs is not None:
            raise ValueError("candidate runs return the model's own outputs; pass outputs=None")
        pool = self._pool
        future = pool.executor.submit(run_candidate, str(pool.spec), str(model), dict(inputs), pool.timeout,
                                      str(pool.scratch))
        result: RunResult = future.result()  # WorkerLostError when the worker was lost every time
        with pool.lock:
            pool.runs += 1
            pool.spent += Cost.of_run(result)
        return result

    def run_built_first(self, model: str | Path, inputs: Mapping[str, np.ndarray], outputs: Sequence[str],
                        identity: IdentityCheck) -> RunResult:
        """One task that builds ``model`` and runs it on that build unless the build decides it
        (:func:`run_candidate`'s ``built_first``): a build and a run in one worker, as a
        :class:`~graphbisect.oracle.tester.WorkerPool`'s ``compile`` then ``run`` are."""
        from graphbisect.oracle.tester import BUILT_ONLY

        pool = self._pool
        future = pool.executor.submit(run_candidate, str(pool.spec), str(model), dict(inputs), pool.timeout,
                                      str(pool.scratch), built_first=BuiltFirst(identity.identity, tuple(outputs)))
        result: RunResult = future.result()
        with pool.lock:
            if result.info.get(BUILT_ONLY):
                pool.spent += Cost(0, result.compiles, result.compile_cache_hits)
            else:
                pool.runs += 1
                pool.spent += Cost.of_run(result)
        return result

    def compile(self, model: str | Path, outputs: Sequence[str] | None = None) -> RunResult:
        """Build ``model`` without running it, as a task (:meth:`BackendProcess.compile
        <graphbisect.backends.BackendProcess.compile>`): a compile, no run."""
        if outputs is not None:
            raise ValueError("candidate builds are of the model's own outputs; pass outputs=None")
        pool = self._pool
        future = pool.executor.submit(run_candidate, str(pool.spec), str(model), {}, pool.timeout,
                                      str(pool.scratch), compile_only=True)
        result: RunResult = future.result()
        with pool.lock:
            pool.spent += Cost(0, result.compiles, result.compile_cache_hits)
        return result


class ExecutorPool:
    """Target runs as executor tasks, with :class:`~graphbisect.oracle.tester.WorkerPool`'s interface."""

    def __init__(self, spec: BackendSpec | str, executor: Executor, scratch: Path, *, timeout: float | None = None,
                 owned: bool = False) -> None:
        self.spec = spec if isinstance(spec, BackendSpec) else BackendSpec.parse(spec)
        self.executor, self.scratch, self.timeout, self._owned = executor, Path(scratch).absolute(), timeout, owned
        self.lock = threading.Lock()
        self.runs = 0
        self.spent = Cost()  # the runs' compiles, as each task's RunResult carried them back

    @classmethod
    def open(cls, executor: str, spec: BackendSpec | str, scratch: Path, *, jobs: int, timeout: float | None = None
             ) -> ExecutorPool:
        """A pool on a new executor (``local``, ``ray``, ``ray:ADDRESS``) with ``jobs`` tasks at once; a target
        that needs a GPU asks Ray for one per task. Its workers keep their files under ``scratch`` (a folder
        of the reduction's work folder, which every node mounts)."""
        parsed, info = resolve(spec)
        gpus = 1.0 if info.has(Capability.NEEDS_GPU) else 0.0
        return cls(parsed, make_executor(executor, jobs=jobs, gpus_per_task=gpus), scratch, timeout=timeout,
                   owned=True)

    @contextlib.contextmanager
    def acquire(self) -> Iterator[_Runner]:
        yield _Runner(self)

    @property
    def invocations(self) -> int:
        return self.runs

    @property
    def cost(self) -> Cost:
        """The runs and what they compiled, summed from the tasks' results (:mod:`graphbisect.backends.cost`)."""
        with self.lock:
            return self.spent

    def close(self) -> None:
        if self._owned:
            self.executor.close()
