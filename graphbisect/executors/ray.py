"""The Ray executor: tasks run as Ray tasks on a cluster (``ray:ADDRESS``) or a local Ray instance (``ray``).

Ray does the scheduling, placement and fault tolerance; graphbisect adds no scheduler of its own:

* each task asks for one CPU, and ``gpus_per_task`` GPUs when the target backend needs a GPU
  (:attr:`~graphbisect.backends.base.Capability.NEEDS_GPU`), so Ray places it on a node that has one;
* a task whose worker process or node dies is re-run by Ray (``max_retries``); an exception raised by
  the task itself is its result and is not retried (``retry_exceptions=False``);
* tasks read their model from, and write their bundle to, the paths they are given: on a multi-node
  cluster INPUT_DIR and OUT_DIR must be on a filesystem every node mounts at the same path, and every node
  needs the same graphbisect and backends installed.

``ray`` is imported only here, so graphbisect works without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from graphbisect.errors import BackendUnavailableError
from graphbisect.executors.base import DEFAULT_RETRIES, WorkerLostError

__all__ = ["RayExecutor"]

log = logging.getLogger(__name__)

#: Ray exceptions that mean "the worker/node running the task went away", not "the task failed".
_LOST = ("WorkerCrashedError", "NodeDiedError", "OwnerDiedError", "ObjectLostError", "ActorDiedError",
         "LocalRayletDiedError", "TaskUnschedulableError")


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailableError("the ray executor needs Ray, which is not installed",
                                      hint="pip install 'graphbisect[ray]' (or use --executor local)") from exc
    return ray


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """The process's SIGTERM and SIGINT handlers as they were before: ``ray.init`` installs its own in the
    driver (SIGTERM then raises ``SystemExit`` wherever the process is, so pytest under ``timeout``, or a
    reduction under a job scheduler, caught it as an error and ran on). Only the main thread can set them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


#: Seconds to wait for a TCP connection to a ``ray:HOST:PORT`` address before ``ray.init`` is asked to join it.
CONNECT_TIMEOUT_S = 5.0


def _unreachable(address: str | None, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why nothing accepts a TCP connection at a ``HOST:PORT`` (or ``ray://HOST:PORT``) address, or None when
    something does or the address names no port (``auto``, ``local``: Ray finds those itself).

    ``ray.init`` retries an address where nothing listens for minutes, printing only its own warnings (a
    mistyped port hung ``triage --executor ray:HOST:PORT`` for over two minutes); a refused or timed-out
    connection here answers in at most ``timeout`` seconds.

    Example:
        >>> _unreachable("auto") is None
        True
    """
    if not address:
        return None
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    host = host.strip("[]")  # an IPv6 address in brackets
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer from {host}:{port} within {timeout:g} s"
    except OSError as exc:  # refused, no route, a name that does not resolve
        return f"no connection to {host}:{port} ({exc.strerror or type(exc).__name__})"


class RayExecutor:
    """Runs tasks on Ray (see the module docstring). Joins a running Ray session if there is one."""

    def __init__(self, address: str | None = None, *, jobs: int | None = None, gpus_per_task: float = 0.0,
                 max_retries: int = DEFAULT_RETRIES) -> None:
        ray = _ray()
        self._owned = not ray.is_initialized()
        if self._owned:
            kwargs: dict[str, Any] = {"address": address, "log_to_driver": False, "include_dashboard": False}
            if address is None:  # a local instance sized by -j; a cluster has its own size
                kwargs["num_cpus"] = jobs or os.cpu_count() or 1
            log.info("connecting to Ray at %s", address or "a new local instance")
            why = _unreachable(address)
            if why is not None:
                raise BackendUnavailableError(f"no Ray cluster to join at {address}: {why}",
                                              hint="check the address (`ray status` on the cluster's head node "
                                                   "prints it; its GCS port is 6379 unless set), or use "
                                                   "executor='ray' for a local instance",
                                              cli_hint="check the address (`ray status` on the cluster's head "
                                                       "node prints it; its GCS port is 6379 unless set), or use "
                                                       "--executor ray for a local instance")
            try:
                with _signals_kept():
                    ray.init(**kwargs)
            except ConnectionError as exc:  # ray:auto with no cluster running: the environment's, not ours
                raise BackendUnavailableError(f"no Ray cluster to join at {address}: {exc}",
                                              hint="start one (ray start --head), or use executor='ray' for a "
                                                   "local instance",
                                              cli_hint="start one (ray start --head), or use --executor ray for "
                                                       "a local instance") from exc
        self.address = address or "local"
        self.gpus_per_task = gpus_per_task
        self.max_retries = max_retries
        self._workers = jobs or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remotes: dict[Callable[..., Any], Any] = {}

    @property
    def workers(self) -> int:
        return self._workers

    @property
    def name(self) -> str:
        return f"ray:{self.address}"

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` as a Ray task; the returned future raises WorkerLostError if lost."""
        ref = self._remote(fn).remote(*args, **kwargs)
        outer: Future[Any] = Future()
        ref.future().add_done_callback(lambda done: _settle(outer, done, fn))
        return outer

    def _remote(self, fn: Callable[..., Any]) -> Any:
        if fn not in self._remotes:
            options: dict[str, Any] = {"num_cpus": 1, "max_retries": self.max_retries, "retry_exceptions": False}
            if self.gpus_per_task:
                options["num_gpus"] = self.gpus_per_task
            self._remotes[fn] = _ray().remote(**options)(fn)
        return self._remotes[fn]

    def close(self) -> None:
        """Disconnect from (and, for a local instance this executor started, stop) Ray."""
        if self._owned:
            _ray().shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _settle(outer: Future[Any], done: Future[Any], fn: Callable[..., Any]) -> None:
    exc = done.exception()
    if exc is None:
        outer.set_result(done.result())
    elif type(exc).__name__ in _LOST:
        lost = WorkerLostError(f"Ray lost the worker running {getattr(fn, '__name__', fn)} on every attempt",
                               hint="a node or worker died (out of memory?); see `ray status` and the Ray logs")
        lost.__cause__ = exc
        outer.set_exception(lost)
    else:
        cause = getattr(exc, "cause", None)  # RayTaskError wraps the task's own exception
        outer.set_exception(cause if isinstance(cause, BaseException) else exc)
