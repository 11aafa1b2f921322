"""Starting backend workers by forking a process that has already imported what every worker imports.

A worker (:mod:`graphbisect.backends.worker`) started as a new interpreter spends ~0.1-0.2 s of CPU importing
numpy and graphbisect before it loads its backend library; a reduction starts about nine, the test suite
thousands. A *zygote* is one interpreter per (interpreter, environment, backend imports) that has done those
imports and forks a worker on request: the worker is a new process, in its own process group, with its own
pipes, folder, log and exact environment. It has imported nothing of its backend yet but the modules its backend
row names (``BackendInfo.zygote_imports``: for ``reference``, onnx's Python operators and ml_dtypes, ~0.07 s of
CPU), modules whose import starts no thread and builds no runtime. The backend's runtime is
still built by the worker after the fork, and a library with threads or sessions is imported there, so no
backend state (sessions, thread pools, kernel caches, the library's own threads) is ever shared or inherited:
a forked worker is as fresh as a started one.

These rules keep a fork as faithful as an exec:

* a zygote forks only while it has one thread (``/proc/self/task``): a library that started a thread at
  import (a ``sitecustomize`` that imports a runtime) makes it refuse, and that environment's workers are
  started as new interpreters, as before. The one exception is OpenBLAS's idle thread pool, which numpy's
  OpenBLAS starts at import where numpy may compute with several threads (a backend that computes with numpy:
  ``BackendInfo.numpy_blas``): the zygote stops it as OpenBLAS itself does before every fork
  (``blas_thread_shutdown_``, :func:`_stop_blas_threads`), keeping the thread count OpenBLAS read from this same
  environment, and each worker's OpenBLAS starts the pool again at its first threaded call: the BLAS threads
  of a started worker. Where the pool cannot be stopped so (an OpenBLAS that does not export the function, an
  OpenMP build, another BLAS with threads), the zygote has threads and refuses;
* the zygote is keyed by the interpreter, the modules it imports for the backend, and the whole environment
  except the per-worker variables (:func:`per_worker`), which the worker reads at run time and
  gets exactly; a module that fails to import ends the zygote (its workers are started, and fail as they would);
* a worker reseeds numpy's global generator (a started worker seeds it at import; a forked one would share
  the zygote's state with every other worker);
* a worker's environment is the one the zygote's interpreter started with (so what a wrapper script given as
  the interpreter, or its ``sitecustomize``, set is there, as for a started worker), with only what differs
  per worker replaced: the :func:`per_worker` variables and the worker's own link to graphbisect.

The host is not the worker's parent: the zygote reaps its workers and sends each exit status back, so a
worker killed by a signal is reported as one (:class:`ForkedProcess` answers ``poll``/``wait`` as
``subprocess.Popen`` does). Linux only; ``GRAPHBISECT_WORKER_START=exec`` starts every worker as a new
interpreter.

Protocol: the host and its zygote share a ``SOCK_SEQPACKET`` Unix socket pair; each message is one JSON
object. The zygote says ``{"ready": true, "threads": n, "blas": [paths]}`` once it has imported (``blas``: the
OpenBLAS libraries whose thread pool it stopped), then answers
``{"op": "spawn", "argv": [...], "env": {...}, "cwd": dir, "log": path, "package": dir, "id": n}`` (``env``:
the :func:`per_worker` variables; with the worker's request and reply pipes attached as ``SCM_RIGHTS``) with
``{"id": n, "pid": p}`` or ``{"id": n, "refused": why}``, and sends ``{"exited": p, "status": s}``
(``subprocess``'s returncode: minus the signal) for each worker it reaped. It exits when the host closes its end.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graphbisect.storage.tempfolders import PREFIX, alive, claim

__all__ = ["ENV", "PER_WORKER_NAMES", "PER_WORKER_PREFIX", "ForkedProcess", "close_all", "package_path", "per_worker",
           "prestart", "spawn"]

logger = logging.getLogger(__name__)

#: ``exec``: start every worker as a new interpreter (no zygote); anything else: fork where a zygote can.
ENV = "GRAPHBISECT_WORKER_START"
#: Variables that may differ between the workers of one host and are read only at run time, never by the imports
#: a zygote makes (:func:`per_worker`): graphbisect's own, by this prefix (no module of graphbisect reads one at
#: import, tests/test_structure.py): those the host sets for each worker and those a user or a test sets for one
#: run (``GRAPHBISECT_CACHE``: in the key, each test that set its own started a zygote of its own); and
#: ``PYTEST_CURRENT_TEST``, which pytest sets anew for each phase of each test (in the key, graphbisect called from
#: a test suite, a CI harness's or ours, started a zygote per test phase: ~900 zygotes, ~0.5 CPU-s each, in ours).
#: Not part of a zygote's key; each worker gets exactly the values its request has, as a started worker would.
PER_WORKER_PREFIX, PER_WORKER_NAMES = "GRAPHBISECT_", frozenset({"PYTEST_CURRENT_TEST"})
#: The modules a zygote imports before it forks (what every worker imports before its backend library).
PRELOAD = ("graphbisect.backends.worker",)
#: Seconds a zygote may take to import :data:`PRELOAD` and say it is ready, and to answer one spawn.
READY_SECONDS, SPAWN_SECONDS = 120.0, 30.0
#: Zygotes without a live worker beyond this many are closed (each holds ~40 MB of imported modules).
MAX_IDLE = 4
#: The exit status reported for a worker whose zygote died before it could reap it (the true one is lost).
UNKNOWN_STATUS = 255
_MAX_MESSAGE = 1 << 20
#: A zygote's program: its environment as the interpreter started it (wrapper and ``sitecustomize`` included),
#: taken before graphbisect is imported, is what its workers start from.
_BOOT = ("import os, sys; launched = dict(os.environ); from graphbisect.backends.zygote import main; "
         "sys.exit(main(launched=launched))")
#: A zygote's temporary folder (its link to graphbisect, its log), removed by the zygote when it ends (or,
#: should it be killed, by a later workflow: the folder names the zygote as its owner,
#: :mod:`graphbisect.storage.tempfolders`).
FOLDER_PREFIX = f"{PREFIX}zygote-"


class _Zygote:
    """The host's end of one zygote process."""

    def __init__(self, python: str, env: Mapping[str, str], folder: Path, package: Path,
                 imports: Sequence[str] = ()) -> None:
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(folder / "zygote.log", "ab") as log:
                self.proc = subprocess.Popen(
                    [python, "-c", _BOOT, "--socket", str(child.fileno()), "--package", str(package),
                     *(arg for name in imports for arg in ("--import", name))],
                    pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    env=dict(env), cwd=folder, start_new_session=True)
        finally:
            child.close()
        self._sock = host
        self._lock = threading.Lock()  # one spawn at a time
        self._changed = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self.live: set[int] = set()
        self.dead = False
        self.used = time.monotonic()
        self._next = 0
        self.ready = self._handshake()
        if self.ready:
            threading.Thread(target=self._read, name="graphbisect-zygote", daemon=True).start()

    def _handshake(self) -> bool:
        if not select.select([self._sock], [], [], READY_SECONDS)[0]:
            self.close()
            return False
        data = self._sock.recv(_MAX_MESSAGE)
        message = json.loads(data) if data else {}
        if not message.get("ready") or message.get("threads") != 1:  # it could never fork
            logger.debug("zygote %d is not usable: %s", self.proc.pid, message or "no answer")
            self.close()
            return False
        logger.debug("zygote %d is ready (OpenBLAS thread pools stopped: %s)", self.proc.pid,
                     message.get("blas") or "none")
        return True

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], *, cwd: Path, log: Path, package: Path,
              fds: Sequence[int]) -> ForkedProcess | None:
        """Fork a worker; None when the zygote refused (more than one thread) or is gone."""
        with self._lock:
            self._next += 1
            ident = self._next
            own = {k: v for k, v in env.items() if per_worker(k)}  # the rest is the zygote's own start's
            request = {"op": "spawn", "id": ident, "argv": list(argv), "env": own, "cwd": str(cwd),
                       "log": str(log), "package": str(package)}
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
            except OSError:
                self._gone()
                return None
            deadline = time.monotonic() + SPAWN_SECONDS
            with self._changed:
                while ident not in self._replies and not self.dead:
                    if not self._changed.wait(deadline - time.monotonic()):
                        break
                reply = self._replies.pop(ident, None)
            if reply is None:  # no answer in time: do not trust this zygote again
                self.close()
                return None
            if "pid" not in reply:
                logger.debug("zygote %d refused a worker: %s", self.proc.pid, reply.get("refused"))
                return None
            pid = int(reply["pid"])
            with self._changed:
                self.live.add(pid)
            self.used = time.monotonic()
            return ForkedProcess(pid, self)

    def status(self, pid: int, timeout: float | None) -> int | None:
        """The worker's exit status, waiting up to ``timeout`` seconds (None: until it is known)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                if pid in self._exits:
                    self.live.discard(pid)
                    return self._exits.pop(pid)
                if self.dead and not alive(pid):
                    logger.warning("worker %d ended after its zygote was gone: its exit status is unknown", pid)
                    self.live.discard(pid)
                    return UNKNOWN_STATUS
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                # a dead zygote reports nothing: look again for the orphan's end now and then
                self._changed.wait(0.1 if self.dead else remaining)

    def close(self) -> None:
        """Close the socket: the zygote exits (its workers run on; the host stops them itself)."""
        with contextlib.suppress(OSError):  # shutdown first: the reader thread's recv holds the socket open
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
        self._gone()

    def _gone(self) -> None:
        with self._changed:
            self.dead = True
            self._changed.notify_all()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:  # the zygote ended (or was closed): reap it, so its pid no longer counts as alive
                self._gone()
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
                return
            message = json.loads(data)
            with self._changed:
                if "exited" in message:
                    self._exits[int(message["exited"])] = int(message["status"])
                else:
                    self._replies[int(message["id"])] = message
                self._changed.notify_all()


class ForkedProcess:
    """A worker a zygote forked: ``pid``, ``returncode``, ``poll()`` and ``wait()`` as ``subprocess.Popen``'s,
    thread-safe as Popen's: the zygote reports an exit once, so one caller at a time asks it and the others read
    the answer (two threads killing one worker, the main thread unwinding a signal and the run it interrupted,
    had one of them wait for that report forever, and the run with it)."""

    def __init__(self, pid: int, zygote: _Zygote) -> None:
        self.pid, self._zygote = pid, zygote
        self.returncode: int | None = None
        self._asking = threading.Lock()

    def poll(self) -> int | None:
        if self.returncode is None and self._asking.acquire(blocking=False):  # else another caller asks now
            try:
                if self.returncode is None:
                    self.returncode = self._zygote.status(self.pid, 0)
            finally:
                self._asking.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._asking.acquire(timeout=-1 if deadline is None else max(0.0, timeout or 0.0)):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
        try:
            if self.returncode is None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self.returncode = self._zygote.status(self.pid, left)
                if self.returncode is None:
                    raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            return self.returncode
        finally:
            self._asking.release()


# --------------------------------------------------------------------------------------------- host side
_zygotes: dict[tuple[Any, ...], _Zygote | None] = {}  # None: this key's zygote could not fork (use exec)
_registry_lock = threading.Lock()


def spawn(python: str, argv: Sequence[str], env: Mapping[str, str], *, cwd: Path, log: Path,
          package: Path, fds: Sequence[int], imports: Sequence[str] = ()) -> ForkedProcess | None:
    """Fork the worker ``python -m graphbisect.backends.worker *argv`` from the zygote for ``python``, ``env``
    and ``imports`` (started on first use; it imports :data:`PRELOAD` and the modules ``imports`` names),
    with the pipes ``fds`` (their numbers in ``argv`` are the host's and are
    renumbered), in ``cwd``, its fds 1 and 2 appended to ``log``, its environment what ``python`` started with
    ``env`` has (:func:`_worker_env`). ``package``
    is the folder on ``env``'s PYTHONPATH that holds graphbisect for this worker (it differs between workers
    and is not part of the key). None where no zygote can fork it: the caller starts the worker itself (a
    zygote's failure never keeps a worker from starting)."""
    if not _usable(env):
        return None
    try:
        return _spawn(python, argv, env, cwd=cwd, log=log, package=package, fds=fds, imports=tuple(imports))
    except Exception as exc:  # whatever went wrong, the worker is started the plain way
        logger.warning("could not fork a worker from a zygote (%s: %s); starting it as a new interpreter",
                       type(exc).__name__, exc)
        return None


def _spawn(python: str, argv: Sequence[str], env: Mapping[str, str], *, cwd: Path, log: Path,
           package: Path, fds: Sequence[int], imports: tuple[str, ...]) -> ForkedProcess | None:
    base = {k: v for k, v in env.items() if not per_worker(k)}
    entries = base.get("PYTHONPATH", "").split(os.pathsep)
    if entries[0] == str(package):  # each worker's link to this graphbisect: the zygote has its own
        base["PYTHONPATH"] = os.pathsep.join(entries[1:])
    key, zygote = _zygote_for(python, base, imports)
    if zygote is None:
        return None
    process = zygote.spawn(argv, env, cwd=cwd, log=log, package=package, fds=fds)
    if process is None and not zygote.dead:  # refused: it has threads, and will keep them
        with _registry_lock:
            _zygotes[key] = None
    return process


def per_worker(name: str) -> bool:
    """Whether the environment variable ``name`` is given to each forked worker as its request has it, outside
    the zygote's key (:data:`PER_WORKER_PREFIX`)."""
    return name.startswith(PER_WORKER_PREFIX) or name in PER_WORKER_NAMES


def _zygote_for(python: str, base: Mapping[str, str],
                imports: tuple[str, ...]) -> tuple[tuple[Any, ...], _Zygote | None]:
    """The key and the zygote of ``python`` with the environment ``base`` that imported ``imports`` (started now
    if there is none)."""
    key = (os.getpid(), python, tuple(sorted(base.items())), imports)
    with _registry_lock:
        if key in _zygotes and (_zygotes[key] is None or not _zygotes[key].dead):  # type: ignore[union-attr]
            return key, _zygotes[key]
        zygote = _start(python, base, imports)
        _zygotes[key] = zygote
        _close_idle(keep=zygote)
    return key, zygote


def prestart(python: str, env: Mapping[str, str], imports: Sequence[str] = ()) -> None:
    """Start the zygote that :func:`spawn` will fork from for ``python``, ``env`` (a worker's environment
    without its link to graphbisect) and ``imports``, in a daemon thread, so that its imports overlap the
    caller's work; a :func:`spawn` meanwhile waits for it. Nothing where no zygote would be used; a failure is
    only logged (the first :func:`spawn` tries again, or starts its worker the plain way)."""
    if not _usable(env):
        return
    base = {k: v for k, v in env.items() if not per_worker(k)}
    base["PYTHONPATH"] = base.get("PYTHONPATH", "")  # as :func:`_spawn` has it once the worker's link is off

    def start() -> None:
        try:
            _zygote_for(python, base, tuple(imports))
        except Exception:  # a spawn starts one, or its worker the plain way, itself
            logger.debug("could not start a zygote ahead", exc_info=True)

    threading.Thread(target=start, name="graphbisect-zygote-start", daemon=True).start()


def package_path(workdir: Path) -> Path:
    """A folder holding only a link to this graphbisect package, for the worker's PYTHONPATH.

    Not the package's parent folder: for a regular install that is site-packages, and putting it first on a
    foreign interpreter's path would shadow that interpreter's own numpy and backend library.
    """
    package = Path(__file__).resolve().parents[1]
    folder = workdir / "pythonpath"
    link = folder / "graphbisect"
    if link.is_symlink() and link.resolve() == package:
        return folder
    folder.mkdir(exist_ok=True)
    tmp = folder / f".graphbisect-{os.getpid()}-{threading.get_ident()}"
    try:
        tmp.symlink_to(package, target_is_directory=True)
        os.replace(tmp, link)  # atomic, also when another process did the same
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        shutil.rmtree(link, ignore_errors=True)
        shutil.copytree(package, link, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    return folder


def _usable(env: Mapping[str, str]) -> bool:
    return (sys.platform.startswith("linux") and hasattr(socket, "send_fds")
            and env.get(ENV, "").strip().lower() != "exec")


def _start(python: str, base: Mapping[str, str], imports: tuple[str, ...]) -> _Zygote | None:
    try:
        folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))  # the zygote removes it when it ends
    except OSError as exc:
        logger.debug("no folder for a zygote: %s", exc)
        return None
    try:
        env, package = dict(base), package_path(folder)  # the same link a worker's PYTHONPATH holds
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package), base.get("PYTHONPATH")) if p)
        zygote = _Zygote(python, env, folder, package, imports)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        logger.debug("cannot start a zygote with %s: %s", python, exc)
        return None
    if not zygote.ready:
        logger.debug("no zygote with %s; its log: %s", python,
                     (folder / "zygote.log").read_text(errors="replace")[-2000:] if folder.exists() else "")
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return zygote


def _close_idle(keep: _Zygote | None) -> None:
    idle = sorted((z for z in _zygotes.values() if z is not None and z is not keep and not z.dead and not z.live),
                  key=lambda z: z.used)
    for zygote in idle[:max(0, len(idle) - MAX_IDLE)]:
        zygote.close()


def close_all() -> None:
    """Close every zygote of this process (each ends once its workers have; a later worker starts a new one).
    Then the CPU time of every worker a zygote forked is in this process's ``RUSAGE_CHILDREN``, as a started
    worker's is once it ends: for a benchmark that measures its workers' CPU."""
    with _registry_lock:
        for zygote in _zygotes.values():
            if zygote is not None:
                zygote.close()
        _zygotes.clear()


atexit.register(close_all)  # each zygote removes its folder and exits before this process does


# ------------------------------------------------------------------------------------------- zygote side
def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # cannot tell: refuse


def _stop_blas_threads() -> list[str]:
    """Stop the idle thread pool of every OpenBLAS this process loaded (numpy's, which starts it at import where
    numpy may compute with more than one thread), as OpenBLAS itself does before every fork (its
    ``pthread_atfork`` handler, ``blas_thread_shutdown_``): the threads are joined, and the thread count
    OpenBLAS read from this environment when it loaded is kept; OpenBLAS starts the pool again, with that count,
    at its first threaded call, in each worker. The paths of the libraries whose pool was stopped (none where
    there was no other thread, or no OpenBLAS that exports the function: an OpenMP build's threads are not its
    own); the zygote's thread count then says whether it can fork."""
    if _threads() == 1:
        return []
    import ctypes

    stopped = []
    for path in _loaded_libraries():
        if "openblas" not in Path(path).name.lower():
            continue
        try:
            shutdown = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).blas_thread_shutdown_
        except (OSError, AttributeError):  # not loaded after all, or a build without the function
            continue
        shutdown.restype, shutdown.argtypes = ctypes.c_int, []
        shutdown()
        stopped.append(path)
    return stopped


def _loaded_libraries() -> list[str]:
    """The paths of the shared libraries mapped into this process (``/proc/self/maps``), each once."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return list(dict.fromkeys(fields[5] for line in lines if len(fields := line.split(maxsplit=5)) == 6
                              and fields[5].startswith("/") and ".so" in fields[5]))


def _send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def _worker_env(launched: Mapping[str, str], requested: Mapping[str, str], package: str,
                worker_package: str) -> dict[str, str]:
    """The environment a worker started as ``python`` with ``requested`` would have: the zygote's own start-up
    environment (the same key, so the same interpreter start: a wrapper's variables, ``sitecustomize``'s),
    with the per-worker variables as requested and the zygote's link to graphbisect replaced by the worker's."""
    env = {k: v for k, v in launched.items() if not per_worker(k)}
    env.update({k: v for k, v in requested.items() if per_worker(k)})
    if "PYTHONPATH" in env:
        env["PYTHONPATH"] = os.pathsep.join(worker_package if p == package else p
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    return env


def _child(request: Mapping[str, Any], fds: Sequence[int], sock: socket.socket, wakeup: Sequence[int],
           package: str, *, launched: Mapping[str, str]) -> None:
    """In the forked worker: become what ``subprocess.Popen`` would have started, then serve."""
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in wakeup:
            os.close(fd)
        os.setpgid(0, 0)  # its own process group (the zygote sets it too, so it is one before the host knows the pid)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(_worker_env(launched, request["env"], package, request["package"]))
        # later imports go through the worker's own link to graphbisect, as they would, not the zygote's
        sys.path[:] = [request["package"] if p == package else p for p in sys.path]
        # numpy's global generator was seeded when the zygote imported numpy and is not reseeded at fork (the
        # random module is): each worker draws its own, as a started one does (e.g. a runtime's random ops)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        argv = list(request["argv"])
        for name, fd in zip(("--requests", "--replies"), fds):
            os.set_inheritable(fd, True)  # as Popen's pass_fds leaves them
            argv[argv.index(name) + 1] = str(fd)
        from graphbisect.backends import worker

        sys.argv = [worker.__file__, *argv]
        worker.serve_and_exit(argv)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
            sys.stderr.flush()
    os._exit(code)


def _serve(sock: socket.socket, package: str, launched: Mapping[str, str]) -> int:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears it
    while True:
        ready = select.select([sock.fileno(), wake_r], [], [])[0]
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
        while True:  # reap every ended worker and say how it ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            with contextlib.suppress(OSError):
                _send(sock, {"exited": pid, "status": os.waitstatus_to_exitcode(status)})
        if sock.fileno() not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 4)
        except OSError:
            return 0
        if not data:
            return 0  # the host closed its end
        request = json.loads(data)
        threads = _threads()
        if threads != 1:
            for fd in fds:
                os.close(fd)
            _send(sock, {"id": request["id"], "refused": f"the zygote has {threads} threads"})
            continue
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, sock, (wake_r, wake_w), package, launched=launched)
        with contextlib.suppress(OSError):  # EACCES: the child already exec'd; ESRCH: it is gone
            os.setpgid(pid, pid)
        for fd in fds:
            os.close(fd)
        _send(sock, {"id": request["id"], "pid": pid})


def main(argv: Sequence[str] | None = None, launched: Mapping[str, str] | None = None) -> int:
    """Entry point of a zygote: ``python -c _BOOT --socket FD --package DIR [--import MODULE ...]``, run in its
    own temporary folder (which holds ``DIR``), which it removes when the host closes the socket or is gone.
    ``launched``: the environment the interpreter started with (default: the present one)."""
    args = list(sys.argv[1:] if argv is None else argv)
    launched = dict(os.environ if launched is None else launched)
    sock = socket.socket(fileno=int(args[args.index("--socket") + 1]))
    package = args[args.index("--package") + 1]
    folder = Path(package).parent  # DIR is <folder>/pythonpath
    try:
        claim(folder)
        imports = [args[i + 1] for i, arg in enumerate(args) if arg == "--import"]
        for name in (*PRELOAD, *imports):  # one that fails ends the zygote: its workers are started instead
            __import__(name)
        blas = _stop_blas_threads()
        # what the imports made lives as long as every worker: the collector of a forked worker need not look at
        # it again (nor touch its pages, which the workers share with this process until they write them)
        gc.freeze()
        _send(sock, {"ready": True, "threads": _threads(), "blas": blas})
        return _serve(sock, package, launched)
    finally:
        if folder.name.startswith(FOLDER_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)

