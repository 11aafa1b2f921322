"""The host side of backend isolation: one long-lived worker process per backend spec.

Backends segfault (often that *is* the bug), hang, leak, print to fd 1/2 from C++, and two versions of one
library cannot share an interpreter. So every backend runs in a worker process
(``python -m graphbisect.backends.worker``, see :mod:`.worker` for the protocol; on Linux forked from a process
that has imported numpy and graphbisect and no backend, :mod:`.zygote`), started lazily and reused for many
invocations. A crash, a signal or a hang kills the worker, never the caller: it becomes a
:class:`~graphbisect.backends.base.RunResult` with status ``crash`` or ``timeout``, and the next call starts
a fresh worker.

Example:
    >>> with BackendProcess("onnxruntime:opt_level=basic") as ort:      # doctest: +SKIP
    ...     result = ort.run("model.onnx", {"x": x})
    ...     result.status, result.outputs["y"].shape
    (<RunStatus.OK: 'ok'>, (1, 10))

POSIX only (pipes are passed with ``pass_fds`` and hangs are stopped by killing the process group).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect import errors
from graphbisect.backends import zygote
from graphbisect.backends.base import RAN_WITH, BackendSpec, Capability, Phase, RunResult, RunStatus
from graphbisect.backends.children import kill_recorded_groups
from graphbisect.backends.command import CALLER_CWD_ENV
from graphbisect.backends.cost import Cost
from graphbisect.backends.machine import memory_hint, out_of_memory, path_text, unusable_path
from graphbisect.backends.registry import HOST_OPTIONS, Availability, BackendInfo, resolve, spec_timeout
from graphbisect.backends.worker import InputsWriter
from graphbisect.backends.zygote import ForkedProcess, package_path
from graphbisect.compare.metrics import STATS_FIELDS, TensorStats, Tolerance, stats_from_columns
from graphbisect.errors import BackendError, BackendUnavailableError, InputError, ModelError, SpecError
from graphbisect.storage.packfile import PackReader, StaleDataError

__all__ = ["DEFAULT_TIMEOUT", "LOG_TAIL_BYTES", "BackendProcess", "CompareTo", "availability_under", "compile_cache"]

logger = logging.getLogger(__name__)
#: A run still going, every ``PROGRESS_SECONDS`` (:mod:`graphbisect.backends.worker`): the CLI prints these records
#: as stage lines; a library user sees them with INFO logging.
progress_log = logging.getLogger("graphbisect.progress")

#: Seconds one invocation may take when neither the spec (``timeout=``) nor the caller says otherwise.
DEFAULT_TIMEOUT = 600.0
#: How much of what the backend printed during one invocation ends up in :attr:`RunResult.log`.
LOG_TAIL_BYTES = 64 * 1024
#: The worker log is truncated before an invocation once it grows past this size.
LOG_ROTATE_BYTES = 32 * 1024 * 1024
#: Starting a worker (importing the backend library) may take at least this long.
MIN_START_SECONDS = 120.0
#: How often a waiting host checks that the worker is still alive.
POLL_SECONDS = 0.5


#: The folder of the compile cache that workers started in this context share (:func:`compile_cache`).
_COMPILE_CACHE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("graphbisect_compile_cache",
                                                                            default=None)
#: The environment variable a worker's runtime reads the compile cache's folder from, set by the host for its
#: workers only. In the host's own environment only ``off`` (or ``0``, ``no``) is read: no cache. A folder named
#: there is never used: a cache this run did not create may hold planted entries (a module or a compile error
#: that a key never compiled to), which a worker would take as its compile's result (docs/security.md).
COMPILE_CACHE_ENV = "GRAPHBISECT_COMPILE_CACHE"


@contextlib.contextmanager
def compile_cache(folder: Path | None) -> Iterator[None]:
    """Workers started in this block (in this thread) share the compile cache ``folder``: a compiler backend
    (IREE) compiles a model it compiled before with the same options only once, and counts the repeat as a
    cache hit (:mod:`graphbisect.backends.cost`). A command's work folder holds it, so it lives as long as
    that. ``None``: no cache.

    Example:
        >>> with compile_cache(Path("work") / "compile-cache"):       # doctest: +SKIP
        ...     BackendProcess("iree").run(model, inputs)
    """
    token = _COMPILE_CACHE.set(Path(folder).absolute() if folder is not None else None)
    try:
        yield
    finally:
        _COMPILE_CACHE.reset(token)


def _cache_switched_off() -> bool:
    """True when the host's own environment says ``GRAPHBISECT_COMPILE_CACHE=off`` (the one value read there);
    any other value is inherited state, not this run's own, and is ignored (logged once)."""
    value = os.environ.get(COMPILE_CACHE_ENV, "").strip()
    if value.lower() in ("0", "off", "no"):
        return True
    if value and value not in _IGNORED_CACHE_VALUES:
        _IGNORED_CACHE_VALUES.add(value)
        logger.warning("%s=%s in the environment is ignored: a compile cache is a run's own folder, never one "
                       "it inherits (only 'off' is read there)", COMPILE_CACHE_ENV, value)
    return False


_IGNORED_CACHE_VALUES: set[str] = set()


class _WorkerDied(Exception):
    """The worker's reply pipe closed: the process is gone."""


class _WorkerTimeout(Exception):
    """No complete reply before the deadline."""


class _Lines:
    """Bytes read from a pipe, taken out a line at a time; each byte is searched for the end of its line once.

    A reply of megabytes (the statistics or the output index of tens of thousands of tensors) arrives in 64 KiB
    reads: appending each to one ``bytes`` and searching it whole after each was quadratic (0.12 s for a 10 MB
    reply, 20 s for 50 MB, on a 2-core AMD EPYC).

    Example:
        >>> lines = _Lines()
        >>> lines.add(b'{"a": 1}\\n{"b"'); lines.pop(), lines.pop()
        (b'{"a": 1}', None)
        >>> lines.add(b': 2}\\n'); lines.pop()
        b'{"b": 2}'
    """

    def __init__(self) -> None:
        self._data = bytearray()
        self._searched = 0  # bytes of _data known to hold no newline

    def add(self, chunk: bytes) -> None:
        self._data += chunk

    def pop(self) -> bytes | None:
        """The first whole line (without its newline), removed; None until one has arrived."""
        end = self._data.find(b"\n", self._searched)
        if end < 0:
            self._searched = len(self._data)
            return None
        line = bytes(self._data[:end])
        del self._data[:end + 1]
        self._searched = 0
        return line


class _Worker:
    """One worker process and its two pipes."""

    def __init__(self, python: str, args: list[str], env: Mapping[str, str], *, cwd: Path, log_path: Path,
                 package: Path, imports: Sequence[str] = ()) -> None:
        """``python -m graphbisect.backends.worker *args`` with its two pipes, forked from a zygote where one
        can (:mod:`.zygote`: numpy, graphbisect and ``imports`` already imported), else started as a new
        interpreter."""
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        args = [*args, "--requests", str(request_r), "--replies", str(reply_w)]
        try:
            proc: subprocess.Popen[bytes] | ForkedProcess | None = zygote.spawn(
                python, args, env, cwd=cwd, log=log_path, package=package, fds=(request_r, reply_w),
                imports=imports)
            if proc is None:
                with open(log_path, "ab") as log:
                    proc = subprocess.Popen(
                        [python, "-m", "graphbisect.backends.worker", *args], pass_fds=(request_r, reply_w),
                        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=dict(env), cwd=cwd,
                        start_new_session=True,  # own process group: killpg stops children
                    )
        except BaseException:
            for fd in (request_w, reply_r):
                os.close(fd)
            raise
        finally:
            os.close(request_r)
            os.close(reply_w)
        self.proc = proc
        os.set_blocking(request_w, False)
        self.folder = Path(cwd)  # the worker's folder: where it records the groups of programs it runs
        self._out, self._in = request_w, reply_r
        self._lines = _Lines()
        self.phase = Phase.LOAD

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: Mapping[str, Any], deadline: float) -> None:
        data = memoryview(json.dumps(message).encode("utf-8") + b"\n")  # what is left, not copied at each write
        while data:
            if not select.select([], [self._out], [], _remaining(deadline))[1]:
                raise _WorkerTimeout
            try:
                data = data[os.write(self._out, data):]
            except BrokenPipeError as exc:
                raise _WorkerDied from exc

    def receive(self, deadline: float) -> dict[str, Any]:
        while (line := self._lines.pop()) is None:
            if not select.select([self._in], [], [], min(_remaining(deadline), POLL_SECONDS))[0]:
                if self.proc.poll() is not None:
                    raise _WorkerDied  # gone, though something it started may still hold the pipe open
                if _remaining(deadline) <= 0:
                    raise _WorkerTimeout
                continue
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise _WorkerDied
            self._lines.add(chunk)
        message: dict[str, Any] = json.loads(line)
        return message

    def kill(self) -> int:
        """Kill the whole process group (the backend's children too), and the groups of the programs it
        was running (a ``command`` target's, :mod:`~graphbisect.backends.children`); return the exit status."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        returncode = self.proc.wait()
        kill_recorded_groups(self.folder)
        self._close_fds()
        return returncode

    def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not within ``grace`` seconds. It is killed whatever
        happens meanwhile (a worker still building answers with progress events, not with the exit: issue 36
        found ``TimeoutExpired`` escaping here, exit 3 and the worker left running)."""
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(_WorkerDied, _WorkerTimeout, OSError, ValueError, subprocess.TimeoutExpired):
                    deadline = time.monotonic() + grace
                    self.send({"op": "exit"}, deadline)
                    while "event" in self.receive(deadline):  # an earlier request's events are no answer
                        pass
                    self.proc.wait(timeout=_remaining(deadline))
        finally:
            self.kill()

    def _close_fds(self) -> None:
        for fd in (self._out, self._in):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._out = self._in = -1


def _reply_peak(reply: Mapping[str, Any]) -> int | None:
    """The worker's peak memory a reply carries (``worker.peak_memory``; None from a worker that did not say)."""
    peak = reply.get("peak_memory")
    return int(peak) if isinstance(peak, (int, float)) and peak > 0 else None


def _reply_cost(reply: Mapping[str, Any]) -> dict[str, int]:
    """The compiles a worker's reply says its request made (none from a worker too old to count them)."""
    cost = reply.get("cost") or {}
    return {"compiles": int(cost.get("compiles", 0)), "compile_cache_hits": int(cost.get("compile_cache_hits", 0))}


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


@dataclasses.dataclass
class _State:
    """What the finalizer needs to clean up, kept apart from the BackendProcess so it can be collected."""

    worker: _Worker | None = None
    owned_workdir: Path | None = None
    inputs: InputsWriter | None = None
    #: Held by the thread that drives the worker (``BackendProcess`` serializes its calls with it).
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def shutdown(self) -> None:
        if self.inputs is not None:
            self.inputs.discard()
        worker, self.worker = self.worker, None
        if worker is not None:
            if self.lock.acquire(blocking=False):
                try:
                    worker.stop()
                finally:
                    self.lock.release()
            else:
                # Another thread waits on it (a build in the background while Ctrl-C or SIGTERM unwinds the
                # main thread): it would answer an exit only after that build, minutes later. That thread's
                # call fails as closed (BackendProcess._lost_worker).
                worker.kill()
        if self.owned_workdir is not None:
            shutil.rmtree(self.owned_workdir, ignore_errors=True)
            self.owned_workdir = None


class BackendProcess:
    """A backend spec served by an isolated, reusable worker process.

    ``spec`` is validated with :func:`~graphbisect.backends.registry.resolve`. ``workdir`` holds the worker's
    log (``worker.log``), inputs written for it and its scratch files; a temporary folder is created (and
    removed by :meth:`close`) when it is None. ``timeout`` is the limit in seconds for one invocation when the
    spec has no ``timeout=`` option (default :data:`DEFAULT_TIMEOUT`).

    The worker starts on the first :meth:`run` (or :meth:`validate`) and serves every later call, so the
    backend library is imported once. Not thread-safe for concurrent calls: calls are serialized.

    Attributes:
        spec: the canonical spec (aliases resolved).
        backend: the registry row.
        invocations: how many times :meth:`run` was called.
        compiles: the builds of a model the worker made, in runs, in :meth:`load` and in validating the spec or
            listing its passes (ONNX Runtime's optimizer names: sessions of a probe model; see :attr:`cost`).
        compile_cache_hits: the compiles served from the compile cache instead.
        worker_info: what the worker reported at start (python, python_version, numpy, pid, library,
            library_version, library_path), measured in the worker's interpreter.
    """

    def __init__(self, spec: BackendSpec | str, *, workdir: Path | None = None, timeout: float | None = None) -> None:
        self.spec, self.backend = resolve(spec)
        self._timeout_arg = timeout
        self.timeout = spec_timeout(self.spec, timeout, fallback=DEFAULT_TIMEOUT)
        self.python = self.spec.options.get("python") or sys.executable
        _check_foreign_python(self.spec, self.backend)
        self.runtime_options = {k: v for k, v in self.spec.options.items() if k not in HOST_OPTIONS}
        # the cache of the block that made it (compile_cache), unless the host's environment says off
        self.compile_cache = None if _cache_switched_off() else _COMPILE_CACHE.get()
        self.invocations = 0
        self.compiles = 0  # builds of a model, ahead of a run (load) or in one, as the workers counted them
        self.compile_cache_hits = 0
        self.worker_info: dict[str, Any] = {}
        self._state = _State()
        if workdir is None:
            _require_usable_folder(Path(tempfile.gettempdir()), "the temporary folder")
            workdir = Path(tempfile.mkdtemp(prefix=f"graphbisect-{self.backend.name}-"))
            self._state.owned_workdir = workdir
        self.workdir = Path(workdir).absolute()
        _require_usable_folder(self.workdir, "the work folder")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._state.inputs = self._inputs = InputsWriter(self.workdir)
        self.log_path = self.workdir / "worker.log"
        self._validated = False
        self._configured = False  # the running worker's runtime was made with runtime_options
        self._lock = self._state.lock  # close() kills at once a worker a call holds (_State.shutdown)
        self._finalizer = weakref.finalize(self, _State.shutdown, self._state)

    # ------------------------------------------------------------------------------------------ public
    def run(
        self,
        model: str | Path,
        inputs: Mapping[str, np.ndarray] | str | Path,
        outputs: Sequence[str] | None = None,
        *,
        output_dir: Path | None = None,
        compare_to: CompareTo | None = None,
        durable: bool = False,
        sent: Callable[[], object] | None = None,
    ) -> RunResult:
        """Run ``model`` on ``inputs`` (arrays, or an ``.npz`` path) and return what happened.

        ``outputs`` names the tensors to return (``None`` = the model's outputs); intermediate tensors must be
        outputs of ``model`` (pass a probe model). The outputs are written into ``output_dir`` as one packed
        run (``values.bin`` and its index ``manifest.json``, :mod:`graphbisect.storage.packfile`) and read from it
        when asked for; without ``output_dir`` they go to a scratch folder that is deleted at once (they are
        read first; large ones stay mapped, which POSIX allows). ``durable`` (with ``output_dir``) has the
        worker fsync them before it replies: for outputs a later session reads back (``reduce --resume``).
        With ``compare_to`` the worker compares every output the oracle's activation store holds with it and
        returns their statistics (:attr:`RunResult.stats`) instead of their values, except ``compare_to.keep``.
        ``sent`` is called once the worker has the request, before it builds and runs (in this thread: work
        of this process that should not hold up the request starts there).

        A backend exception, a signal, an exit or a timeout is a result (``status`` crash or timeout), never
        an exception. Raises :class:`~graphbisect.errors.SpecError` for an invalid spec option value (checked
        by the worker before the first run), :class:`ModelError`/:class:`InputError` for a missing model or
        inputs file or a requested tensor the model does not have, and
        :class:`~graphbisect.errors.BackendError` when the worker cannot be driven at all.
        """
        with self._lock:
            ready = self._ready()
            compare = compare_to.to_json() if compare_to is not None else None
            request = self._request(model, inputs, outputs, output_dir)  # then straight to the worker
            if compare is not None:
                request["compare"] = compare
            if durable and output_dir is not None:
                request["durable"] = True
            self.invocations += 1
            return self._counted(self._invoke(request, inputs, keep_outputs=output_dir is not None, sent=sent),
                                 ready)

    def load(self, model: str | Path, outputs: Sequence[str] | None = None) -> bool:
        """Build the session of ``model`` exposing ``outputs`` now, without running it: a :meth:`run` of the
        same model file and outputs that follows uses it instead of building it again. Returns whether it
        was built. Nothing runs, so it is no invocation; a failure here is not a result either (the worker
        is restarted if it died): the :meth:`run` that follows builds the session again and reports
        whatever happens then. For a caller with other work to do while the backend builds.
        """
        return self.compile(model, outputs).ok

    def compile(self, model: str | Path, outputs: Sequence[str] | None = None) -> RunResult:
        """Build the session of ``model`` exposing ``outputs`` (``None``: its own) without running it, and say
        what happened as a result: ``ok`` (no outputs; ``info``, the runtime's after the build), or exactly the
        crash or timeout at load a :meth:`run` would have reported (phase load, the same message; a worker that
        died is replaced).

        For a failure that happens at compile (a compiler's diagnostic or crash, a session that cannot be
        created): whether a model shows it needs no run, no inputs sent and no outputs read. A :meth:`run` of
        the same model file and outputs that follows uses the build instead of making it again. Counted as the
        compile it is (:attr:`compiles`, :attr:`compile_cache_hits`), not as an invocation (a run).

        Example:
            >>> BackendProcess("iree").compile("model.onnx").describe()  # doctest: +SKIP
            "crash at load: IreeCompileError: failed to legalize operation 'torch.aten.max_unpool2d' ..."
        """
        model_path = Path(model).absolute()
        if not (model_path.exists() or any(model_path.parent.glob(f"{model_path.name}.*"))):
            raise ModelError(f"model {model_path} does not exist", hint="check the path of the model file")
        with self._lock:
            ready = self._ready()
            if self._log_size() > LOG_ROTATE_BYTES:
                os.truncate(self.log_path, 0)
            offset = self._log_size()
            request = {"op": "load", "model": str(model_path),
                       "outputs": list(dict.fromkeys(outputs)) if outputs is not None else None}
            worker = self._state.worker
            assert worker is not None
            worker.phase = Phase.LOAD
            started = time.monotonic()
            try:
                deadline = started + self.timeout
                worker.send(request, deadline)
                reply = worker.receive(deadline)
            except (_WorkerDied, _WorkerTimeout) as exc:
                result = self._lost_worker(exc, offset, time.monotonic() - started)
            except BaseException:
                self._discard_worker()  # e.g. KeyboardInterrupt: its reply would answer the next request
                raise
            else:
                if not reply.get("ok", False):
                    raise self._error(reply.get("error", {}), "load")
                seconds = time.monotonic() - started
                if reply.get("status") == "ok":
                    spent = _reply_cost(reply)
                    result = RunResult(RunStatus.OK, log=self._log_since(offset), seconds=seconds,
                                       ran_with=self.ran_with, info=reply.get("info") or {},
                                       compiles=spent["compiles"],
                                       compile_cache_hits=spent["compile_cache_hits"], peak_memory=_reply_peak(reply))
                else:  # the crash fields of a run's reply
                    result = self._result(reply, self.workdir, offset, seconds, keep_outputs=True)
            return self._counted(result, ready)

    def start(self) -> None:
        """Start the worker process now, without waiting for it: its interpreter and imports then overlap
        the caller's own work until the first call (which starts it anyway, and waits for it to be ready).
        A no-op while a worker runs."""
        with self._lock:
            if not self._finalizer.alive:
                raise BackendError(f"backend {self.spec} was closed", hint="create a new BackendProcess")
            if self._state.worker is None:
                self._start()

    def validate(self) -> None:
        """Start the worker and let the runtime check its option values (raises :class:`SpecError`).

        ONNX Runtime, for example, checks ``disabled=`` names against the optimizers of the installed version,
        because ORT itself silently ignores unknown names. :meth:`run` does this once by itself.
        """
        with self._lock:
            self._ensure_ready()

    def registered_passes(self, among: Sequence[str] | None = None) -> list[str] | None:
        """Every optimization pass the backend could run under this spec, as its worker's library lists them;
        with ``among``, only those of these names (cheaper where the backend can tell without listing all: ONNX
        Runtime's catalogue is ~400 probe sessions on a fresh machine, a few names a handful).

        For a target that crashes before it can report which passes fired; ``None`` when the runtime cannot
        list its passes. Asked of the worker, so ``python=`` gets the other interpreter's library's names.
        """
        request: dict[str, Any] = {"op": "passes"}
        if among is not None:
            request["among"] = list(among)
        with self._lock:
            self._ensure_ready()
            reply = self._call_checked(request, self.timeout + MIN_START_SECONDS)
            self._spend(reply)
        passes = reply.get("passes")
        return [str(name) for name in passes] if passes is not None else None

    def can_reconfigure(self, spec: BackendSpec | str) -> bool:
        """Whether :meth:`reconfigure` can switch this process to ``spec`` (same backend and interpreter, a
        backend whose row is ``reconfigurable``, or a spec on the CPU that differs from this one only in options
        its row lists as ``reconfigurable_options``: what was checked to give what a fresh worker gives)."""
        other, info = resolve(spec, require_available=False)
        if info.name != self.backend.name or other.options.get("python") != self.spec.options.get("python"):
            return False
        if self.backend.reconfigurable:
            return True
        changed = {key for key in {*other.options, *self.spec.options}
                   if other.options.get(key) != self.spec.options.get(key)}
        return bool(changed) and changed <= self.backend.reconfigurable_options and \
            self.backend.device_of(self.spec.options) is None

    def reconfigure(self, spec: BackendSpec | str) -> None:
        """Serve ``spec`` from now on, in the running worker where there is one.

        The worker re-creates its runtime with the new options (and validates them) before the next call,
        instead of a new process being started and importing the backend library again: the pass search
        runs one spec per candidate. Raises :class:`SpecError` when :meth:`can_reconfigure` says no.
        """
        if not self.can_reconfigure(spec):
            raise SpecError(f"a worker for {self.spec} cannot serve {spec}",
                            hint="start a BackendProcess for it: another backend or interpreter needs its own worker")
        with self._lock:
            new, _ = resolve(spec)
            if new == self.spec:
                return
            self.spec = new
            self.timeout = spec_timeout(new, self._timeout_arg, fallback=DEFAULT_TIMEOUT)
            self.runtime_options = {k: v for k, v in new.options.items() if k not in HOST_OPTIONS}
            self._validated = self._configured = False

    @property
    def ran_with(self) -> dict[str, Any]:
        """What runs this spec, measured in the current worker (empty before the first call): the backend
        library's version and location, the interpreter and its numpy. See :attr:`RunResult.ran_with`.

        Where the runtime measured what runs its work itself (``command`` with ``package=``: the program's
        interpreter and that distribution), that instead. Else empty for a backend without a library
        (``command``): its worker only launches an external program, whose version graphbisect cannot know, so no
        interpreter is named as what ran it."""
        measured = self.worker_info.get("measured")
        if isinstance(measured, dict):
            return {key: measured[key] for key in RAN_WITH if key in measured}
        if self.backend.import_name is None:
            return {}
        return {key: self.worker_info[key] for key in RAN_WITH if key in self.worker_info}

    @property
    def cost(self) -> Cost:
        """Every call so far: the runs (:attr:`invocations`), and the compiles the worker made for them and for
        :meth:`load` (:mod:`graphbisect.backends.cost`)."""
        return Cost(self.invocations, self.compiles, self.compile_cache_hits)

    def _ready(self) -> Cost:
        """Make the worker ready (:meth:`_ensure_ready`) and return what that compiled (a first validation's
        builds), which the call it was made for counts in its result (:meth:`_counted`)."""
        before = self.cost
        self._ensure_ready()
        return self.cost - before

    def _counted(self, result: RunResult, ready: Cost) -> RunResult:
        """Count what a call's request compiled, and return its result with ``ready``'s compiles added."""
        self.compiles += result.compiles
        self.compile_cache_hits += result.compile_cache_hits
        if not ready:
            return result
        return dataclasses.replace(result, compiles=result.compiles + ready.compiles,
                                   compile_cache_hits=result.compile_cache_hits + ready.compile_cache_hits)

    def _spend(self, reply: Mapping[str, Any]) -> None:
        """Count the compiles a reply of the worker says its request made (a load, a validation, a listing)."""
        spent = _reply_cost(reply)
        self.compiles += spent["compiles"]
        self.compile_cache_hits += spent["compile_cache_hits"]

    @property
    def pid(self) -> int | None:
        """The current worker's process id (None before the first call and after a crash)."""
        worker = self._state.worker
        return worker.pid if worker is not None else None

    def close(self) -> None:
        """Stop the worker and remove the temporary workdir (if this object created it)."""
        self._finalizer()

    def __enter__(self) -> BackendProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BackendProcess({str(self.spec)!r}, pid={self.pid}, invocations={self.invocations})"

    # ----------------------------------------------------------------------------------------- startup
    def _ensure_ready(self) -> None:
        if not self._finalizer.alive:
            raise BackendError(f"backend {self.spec} was closed", hint="create a new BackendProcess")
        worker = self._state.worker
        if worker is not None and worker.proc.poll() is None:
            if self._configured:
                return
        else:
            if worker is not None:
                logger.info("worker %d for %s is gone (%s); starting a new one", worker.pid, self.spec,
                            _exit_text(self._discard_worker() or 0))
            self._start()
        self._init_runtime()
        if not self._validated:
            self._spend(self._call_checked({"op": "validate"}, self.timeout + MIN_START_SECONDS))
            self._validated = True

    def _start(self) -> None:
        args = ["--workdir", str(self.workdir), "--log", str(self.log_path),
                "--log-level", logging.getLevelName(_effective_level())]
        try:
            worker = _Worker(self.python, args, self._worker_env(), cwd=self.workdir, log_path=self.log_path,
                             package=package_path(self.workdir), imports=self.backend.zygote_imports)
        except OSError as exc:
            raise SpecError(f"cannot start a worker for {self.spec.as_written()} with {self.python}: {exc}",
                            hint="python= must name an executable Python interpreter") from exc
        self._state.worker = worker
        if not self._finalizer.alive:  # close() ran while it started (another thread unwinding a signal)
            self._discard_worker()
            raise BackendError(f"backend {self.spec} was closed while its worker started",
                               hint="the run is ending (Ctrl-C, SIGTERM); nothing was measured")
        self._inputs.close()  # it holds none of the values sent before (even should the pid be reused)
        logger.debug("started worker %d for %s", worker.pid, self.spec)

    def _init_runtime(self) -> None:
        """(Re-)create the worker's runtime with :attr:`runtime_options`."""
        init = {"op": "init", "runtime": self.backend.runtime, "options": self.runtime_options,
                "path": list(self.backend.path),
                "library": self.backend.import_name, "distributions": list(self.backend.distributions)}
        self.worker_info = self._call_checked(init, max(self.timeout, MIN_START_SECONDS))
        self._configured = True
        logger.debug("worker for %s initialized: %s", self.spec, self.worker_info)

    def _worker_env(self) -> dict[str, str]:
        """The environment of the worker: graphbisect importable even by a foreign interpreter."""
        env = _worker_base_env(self.backend)
        env["PYTHONPATH"] = _importing_env(self.workdir)["PYTHONPATH"]
        # graphbisect's own variables for its workers: always this run's values, never inherited ones
        env[CALLER_CWD_ENV] = os.getcwd()  # where a `command` backend runs its program
        if self.compile_cache is not None:
            env[COMPILE_CACHE_ENV] = str(self.compile_cache)
        return env

    def _call_checked(self, message: Mapping[str, Any], seconds: float) -> dict[str, Any]:
        """Send a control request and return the reply; raise the matching error if it failed."""
        worker = self._state.worker
        assert worker is not None
        offset = self._log_size()
        try:
            deadline = time.monotonic() + seconds
            worker.send(message, deadline)
            reply = worker.receive(deadline)
        except KeyboardInterrupt:
            self._discard_worker()
            raise
        except (_WorkerDied, _WorkerTimeout) as exc:
            status = self._discard_worker()
            what = "did not answer" if isinstance(exc, _WorkerTimeout) else _exit_text(status or 0)
            raise BackendError(
                f"the worker for {self.spec} {what} during {message['op']}; the end of its log:\n"
                f"{self._log_since(offset)[-4000:]}",
                hint=f"check that {self.python} can import numpy, graphbisect and the backend library",
            ) from exc
        if not reply.get("ok", False):
            self._state.worker = None
            worker.stop()
            raise self._error(reply.get("error", {}), message["op"])
        return reply

    def _discard_worker(self) -> int | None:
        """Kill the current worker (if any) and forget it; return its exit status."""
        worker, self._state.worker = self._state.worker, None
        return worker.kill() if worker is not None else None

    def _error(self, error: Mapping[str, Any], op: str) -> errors.GraphBisectError:
        kind, message, hint = error.get("type", "Error"), error.get("message", ""), error.get("hint")
        if error.get("usage"):
            cls = getattr(errors, kind, None)
            if isinstance(cls, type) and issubclass(cls, errors.GraphBisectError):
                return cls(f"{self.spec.as_written()}: {message}", hint=hint)
        if out_of_memory(f"{kind}: {message}"):  # the machine's memory (ulimit -v), not a missing library
            return BackendError(f"the worker for {self.spec} ran out of memory during {op}: {kind}: {message}",
                                hint=memory_hint())
        if kind in ("ModuleNotFoundError", "ImportError") and op == "init":
            library = self.backend.import_name or "its library"
            return BackendUnavailableError(
                f"backend {self.backend.name!r} cannot import {library} under {self.python}: {message}",
                hint=f"install {library} into that interpreter, or drop python= to use this one",
            )
        return BackendError(f"the worker for {self.spec} failed during {op}: {kind}: {message}",
                            hint=hint or f"see the worker log {self.log_path}")

    # --------------------------------------------------------------------------------------- invocation
    def _request(self, model: str | Path, inputs: Mapping[str, np.ndarray] | str | Path,
                 outputs: Sequence[str] | None, output_dir: Path | None) -> dict[str, Any]:
        model_path = Path(model).absolute()
        if not (model_path.exists() or any(model_path.parent.glob(f"{model_path.name}.*"))):
            raise ModelError(f"model {model_path} does not exist", hint="check the path of the model file")
        sent: dict[str, Any] | str
        if isinstance(inputs, Mapping):
            sent = self._inputs.write(inputs, self._worker_pid())  # what the worker does not hold yet
        else:
            inputs_path = Path(inputs).absolute()
            if not inputs_path.is_file():
                raise InputError(f"inputs file {inputs_path} does not exist",
                                 hint="pass a mapping of arrays or the path of an .npz file")
            sent = str(inputs_path)
        scratch = self.workdir / f"outputs-{self.invocations + 1}"
        return {
            "op": "run",
            "model": str(model_path),
            "inputs": sent,
            "outputs": list(dict.fromkeys(outputs)) if outputs is not None else None,
            "output_dir": str(Path(output_dir).absolute() if output_dir is not None else scratch),
        }

    def _worker_pid(self) -> int:
        worker = self._state.worker
        assert worker is not None, "a run request is made for a started worker"
        return worker.pid

    def _invoke(self, request: dict[str, Any], inputs: Mapping[str, np.ndarray] | str | Path, *,
                keep_outputs: bool, sent: Callable[[], object] | None = None) -> RunResult:
        if self._log_size() > LOG_ROTATE_BYTES:
            os.truncate(self.log_path, 0)
        offset = self._log_size()
        started = time.monotonic()
        deadline = started + self.timeout
        try:
            reply = self._exchange(request, inputs, deadline, sent)
            if not reply.get("ok", True):
                self._inputs.close()  # the worker may not have read them all: start afresh next time
                raise self._error(reply.get("error", {}), "run")
            return self._result(reply, Path(request["output_dir"]), offset, time.monotonic() - started,
                                keep_outputs=keep_outputs)
        except (_WorkerDied, _WorkerTimeout) as exc:
            return self._lost_worker(exc, offset, time.monotonic() - started)
        except BaseException:
            self._discard_worker()  # e.g. KeyboardInterrupt: its reply would answer the next request
            raise
        finally:
            if not keep_outputs and os.name == "posix":
                shutil.rmtree(request["output_dir"], ignore_errors=True)  # returned maps stay readable

    def _exchange(self, request: dict[str, Any], inputs: Mapping[str, np.ndarray] | str | Path,
                  deadline: float, sent: Callable[[], object] | None = None) -> dict[str, Any]:
        """Send a run request and wait for its final reply, tracking the phase from the worker's events;
        ``sent`` is called once the request is sent."""
        for attempt in (1, 2):
            worker = self._state.worker
            assert worker is not None
            worker.phase = Phase.LOAD
            try:
                worker.send(request, deadline)
                if sent is not None:
                    sent()
                    sent = None
                reply = worker.receive(deadline)
            except _WorkerDied:
                # Died before it even read the request (e.g. killed between calls): not this invocation's
                # doing, so retry once on a fresh worker.
                if attempt == 2:
                    raise
                logger.info("worker %d for %s died before the invocation started (%s); restarting",
                            worker.pid, self.spec, _exit_text(worker.kill()))
                self._state.worker = None
                self._ensure_ready()
                if isinstance(inputs, Mapping):  # the new worker holds none of the values sent before
                    request["inputs"] = self._inputs.write(inputs, self._worker_pid())
                continue
            return self._await_done(worker, reply, deadline)
        raise AssertionError("unreachable")

    def _await_done(self, worker: _Worker, reply: dict[str, Any], deadline: float) -> dict[str, Any]:
        while reply.get("event") != "done":
            if reply.get("event") == "loaded":
                worker.phase = Phase.RUN
            elif reply.get("event") == "progress":
                progress_log.info("%s", self._describe_progress(reply))
            reply = worker.receive(deadline)
        return reply

    def _describe_progress(self, event: Mapping[str, Any]) -> str:
        """``reference: still running, 20 s so far, node 812 of 1493 done (now Conv '/backbone/conv')`` for a
        progress event, and what the run takes where the runtime foresees it (onnx.reference's Python loops)."""
        stage = "building the model" if event.get("phase") == "load" else "running"
        text = f"{self.spec.as_written()}: still {stage}, {float(event.get('seconds', 0)):.0f} s so far"
        if event.get("total"):
            text += f", node {event.get('done')} of {event.get('total')} done"
            if event.get("node") and int(event.get("done") or 0) < int(event["total"]):  # all done: none runs now
                text += f" (now {event['node']})"
        if event.get("expected"):
            text += f"; the whole run takes {event['expected']}"
        return text

    def _lost_worker(self, exc: Exception, offset: int, seconds: float) -> RunResult:
        worker = self._state.worker
        if worker is None:  # close() killed it while this call waited (another thread, unwinding a signal)
            raise BackendError(f"backend {self.spec} was closed while a call was waiting for its worker",
                               hint="the run is ending (Ctrl-C, SIGTERM); nothing was measured")
        ran_with = self.ran_with  # the worker that died: its versions are what ran
        self._state.worker = None
        phase = worker.phase
        status = worker.kill()
        log = self._log_since(offset)
        # a worker lost while it built (its count died with it) had started one compile; the cache is not known
        compiles = 1 if phase is Phase.LOAD else 0
        if isinstance(exc, _WorkerTimeout):
            logger.warning("%s timed out after %.3g s during %s; worker killed", self.spec, self.timeout,
                           phase.value)
            return RunResult(RunStatus.TIMEOUT, phase=phase, log=log, seconds=seconds, ran_with=ran_with,
                             compiles=compiles,
                             message=f"no result within {self.timeout:g} s (during {phase.value}); "
                             "the worker process group was killed")
        error_type = signal.Signals(-status).name if status < 0 and -status in _SIGNALS else "WorkerExit"
        return RunResult(RunStatus.CRASH, phase=phase, error_type=error_type, exit_code=status, log=log,
                         seconds=seconds, ran_with=ran_with, compiles=compiles,
                         message=f"the worker process {_exit_text(status)} during {phase.value}")

    def _result(self, reply: Mapping[str, Any], output_dir: Path, offset: int, seconds: float, *,
                keep_outputs: bool) -> RunResult:
        log = self._log_since(offset)
        info = dict(reply.get("info") or {})
        spent = _reply_cost(reply)
        if reply.get("status") != "ok":
            return RunResult(RunStatus.CRASH, phase=Phase(reply.get("phase", "run")), log=log, info=info,
                             error_type=reply.get("error_type"), message=reply.get("message"),
                             exit_code=reply.get("exit_code"), seconds=seconds, ran_with=self.ran_with,
                             compiles=spent["compiles"], compile_cache_hits=spent["compile_cache_hits"],
                             peak_memory=_reply_peak(reply))
        # Kept outputs stay on disk until read; a scratch folder goes away, so its outputs are read now
        # (only large ones stay mapped).
        files = OutputFiles(output_dir, {**reply["pack"], "tensors": reply["outputs"]})
        outputs: Mapping[str, Any] = files if keep_outputs else {name: files.read_now(name) for name in files}
        stats = self._stats(reply.get("stats"))
        return RunResult(RunStatus.OK, outputs=outputs, log=log, info=info, seconds=seconds, ran_with=self.ran_with,
                         stats=stats, compiles=spent["compiles"],
                         compile_cache_hits=spent["compile_cache_hits"], peak_memory=_reply_peak(reply))

    def _stats(self, stats: Mapping[str, Any] | None) -> dict[str, TensorStats]:
        """The statistics a worker measured against the oracle's store (``worker.compare_to_store``)."""
        if not stats:
            return {}
        if tuple(stats.get("fields") or ()) != STATS_FIELDS or "columns" not in stats:
            raise BackendError(f"the worker for {self.spec} sent statistics in another form (fields "
                               f"{stats.get('fields')}, {'' if 'columns' in stats else 'no '}columns)",
                               hint="the worker runs another graphbisect: check python= and PYTHONPATH")
        return {s.name: s for s in stats_from_columns(stats["columns"])}

    # ------------------------------------------------------------------------------------------- log
    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def _log_since(self, offset: int) -> str:
        """What the worker printed since ``offset`` (the last :data:`LOG_TAIL_BYTES` of it)."""
        try:
            with open(self.log_path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(offset if offset <= size else 0, size - LOG_TAIL_BYTES))
                return fh.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""


_SIGNALS = {int(s) for s in signal.Signals}


def _exit_text(status: int) -> str:
    """``killed by signal SIGSEGV (11)`` or ``exited with code 3``."""
    if status < 0 and -status in _SIGNALS:
        return f"was killed by signal {signal.Signals(-status).name} ({-status})"
    return f"exited with code {status}"


@dataclasses.dataclass(frozen=True)
class CompareTo:
    """Compare a run's outputs with the oracle's activation store in the worker (``BackendProcess.run``).

    ``store``: the store's folder, read only through ``ActivationStore.open(store)``; ``keep``: outputs whose
    values come back as well (e.g. the model's outputs, for a failure signature).
    """

    store: Path
    tolerance: Tolerance
    keep: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"store": str(Path(self.store).absolute()), "tolerance": self.tolerance.to_json(),
                "keep": list(self.keep)}


class OutputFiles(PackReader):
    """Outputs kept on disk (the worker's packed run, :mod:`graphbisect.storage.packfile`), read when asked for.

    A probe run of a 50,000-node model returns 50,000 tensors; readers such as the layerwise comparison
    touch each once and drop it. A :class:`~graphbisect.storage.packfile.PackReader` of the index the worker replied
    (its ``outputs`` entries and its ``pack``: data file, size, token), so the run's data file is mapped once,
    on the first read (one descriptor, however many tensors); tensors up to 64 KiB are copied out of the map,
    larger ones are views of it. A later run into the same folder is refused, never misread.
    """

    def read_now(self, name: str) -> Any:
        """The value of ``name`` read into memory (memory-mapped only above 64 MiB): its file may go away."""
        return self.value(name, mapped=False)

    def value(self, name: str, *, mapped: bool = True) -> Any:
        try:
            return super().value(name, mapped=mapped)
        except StaleDataError as exc:
            raise BackendError(f"output {name!r} of an earlier run was overwritten by a later run into "
                               f"{self.folder}", hint=exc.hint) from exc


def _check_foreign_python(spec: BackendSpec, backend: BackendInfo) -> None:
    if "python" in spec.options and not backend.has(Capability.FOREIGN_PYTHON):
        raise SpecError(f"backend {backend.name!r} cannot run under another interpreter (python=)",
                        hint="remove python= from the spec; the command backend runs an external program anyway")


def _worker_base_env(backend: BackendInfo) -> dict[str, str]:
    """A worker's environment for ``backend`` before its own variables and its link to graphbisect."""
    env = dict(os.environ)
    env.setdefault("ORT_DISABLE_TELEMETRY", "1")  # as _importing_env says
    env["PYTHONUNBUFFERED"] = "1"
    if not backend.numpy_blas:  # numpy there needs no BLAS threads (BackendInfo.numpy_blas)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.pop(COMPILE_CACHE_ENV, None)
    env.pop(CALLER_CWD_ENV, None)
    return env


def prestart(spec: BackendSpec | str) -> None:
    """Start the zygote that :class:`BackendProcess` workers of ``spec`` will be forked from now, in the
    background (:func:`~graphbisect.backends.zygote.prestart`): its interpreter's imports then overlap the
    caller's own (a command's imports, loading the model) instead of holding up its first worker. Nothing for
    a spec that names no installed backend; a worker started before it is ready waits for it, as it would."""
    try:
        found, info = resolve(spec)
    except errors.GraphBisectError:
        return  # said by the command itself, where it starts its workers
    if "python" not in found.options or info.has(Capability.FOREIGN_PYTHON):
        zygote.prestart(found.options.get("python") or sys.executable, _worker_base_env(info),
                        imports=info.zygote_imports)


def _importing_env(workdir: Path) -> dict[str, str]:
    """This environment, with this graphbisect importable by any interpreter
    (see :func:`~graphbisect.backends.zygote.package_path`)."""
    env = dict(os.environ)
    path = package_path(workdir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH")) if p)
    # ONNX Runtime's telemetry writes ~/.cache/Microsoft/DeveloperTools/.onnxruntime/ (a device id, an event
    # database) at import, outside every place the user named (docs/security.md); a value of yours is kept
    env.setdefault("ORT_DISABLE_TELEMETRY", "1")
    return env


_LISTING_SCRIPT = """\
import dataclasses, json
from graphbisect.backends.registry import all_backends
print(json.dumps({info.name: [info.import_name, dataclasses.asdict(info.availability(version=False))]
                  for info in all_backends()}))
"""
_MEASURE_SCRIPT = """\
import json, sys
from graphbisect.backends.installed import measure
facts = measure(sys.argv[1])
sys.stdout.flush()
print("\\n" + json.dumps(facts))
"""


def availability_under(python: str | None = None, timeout: float = MIN_START_SECONDS) -> dict[str, Availability]:
    """Which backends ``python`` (another interpreter, as ``python=`` names it; None: this one) can run, with
    what ``import`` of each library gives there — what ``graphbisect backends`` shows. Keyed by backend name.

    The backends are those registered under ``python`` (this process's table for this interpreter, custom
    ones included). Each installed library is imported in a child process of its own, in parallel (a library
    that crashes or hangs on import spoils only its own row; graphbisect's process imports none): its
    ``__version__``, folder and the distribution owning those files
    (:func:`graphbisect.backends.installed.measure`), so two distributions of one module (onnxruntime and
    onnxruntime-gpu) are told apart. A library that is installed but fails to import is not available.
    """
    interpreter = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="graphbisect-python-") as tmp:
        env = _importing_env(Path(tmp))
        if python is None:
            from graphbisect.backends.registry import all_backends

            rows = {info.name: (info.import_name, info.availability(version=False)) for info in all_backends()}
        else:
            listing = _run_child([python, "-c", _LISTING_SCRIPT], env, timeout, python)
            rows = {str(name): (entry[0], Availability(**entry[1])) for name, entry in listing.items()}
        libraries = sorted({lib for lib, avail in rows.values() if lib and avail.available})
        with ThreadPoolExecutor(max_workers=max(1, len(libraries))) as pool:
            measured = dict(zip(libraries, pool.map(
                lambda lib: _measured(interpreter, lib, env, timeout), libraries), strict=True))
    return {name: _imported(avail, measured.get(lib) if lib else None, lib, interpreter)
            for name, (lib, avail) in rows.items()}


def _run_child(argv: list[str], env: Mapping[str, str], timeout: float, python: str) -> Any:
    """The JSON on the last line a child interpreter prints; its failure to run is the caller's SpecError."""
    try:
        proc = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SpecError(f"cannot run {python}: {exc}", hint="name an executable Python interpreter") from exc
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BackendError(f"{python} could not list the backends: {proc.stderr.strip()[-2000:]}",
                           hint="a python= interpreter needs numpy (as graphbisect's workers do)")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measured(python: str, library: str, env: Mapping[str, str], timeout: float) -> dict[str, Any]:
    """:func:`graphbisect.backends.installed.measure` of ``library`` in a child of ``python`` (an ``error`` entry
    when it fails: a crash, a hang or an exception on import)."""
    try:
        proc = subprocess.run([python, "-c", _MEASURE_SCRIPT, library], env=dict(env), capture_output=True,
                              text=True, timeout=timeout, check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
        what = _exit_text(proc.returncode) if proc.returncode else "printed nothing"
        return {"error": f"the interpreter {what}: {proc.stderr.strip()[-600:]}"}
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _imported(avail: Availability, facts: Mapping[str, Any] | None, library: str | None,
              python: str) -> Availability:
    """``avail`` (found without importing) with what importing ``library`` under ``python`` gave."""
    if facts is None:
        return avail
    if "error" in facts:
        return Availability(False, None, f"{library} is installed but `import {library}` fails under {python}: "
                            f"{facts['error']}")
    return Availability(True, facts.get("version"), location=facts.get("location"),
                        distribution=facts.get("distribution"), installed=tuple(facts.get("installed") or ()),
                        note=facts.get("note"))


def _require_usable_folder(folder: Path, what: str) -> None:
    """Refuse ``folder`` (``what`` it is) when backend libraries cannot open files under it: a name that is not
    UTF-8 made ONNX Runtime refuse the model's path, reported as "the oracle failed" (issue 36)."""
    why = unusable_path(folder)
    if why is not None:
        raise InputError(f"{what} {path_text(folder)} cannot hold the models backends read: {why}",
                         hint="choose a folder whose path is valid UTF-8 (rename it, or name another with -o or "
                         "--workdir in the CLI, output= or workdir= in Python, or set TMPDIR to one)")


def _effective_level() -> int:
    return logging.getLogger("graphbisect").getEffectiveLevel()
