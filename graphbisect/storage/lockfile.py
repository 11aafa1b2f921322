"""An exclusive, non-blocking lock on a folder: two runs writing the same place must not interleave.

The lock is an ``flock`` on ``<folder>/lock``, held by an open file descriptor, so the kernel releases it
when the process ends however it ends (``kill -9`` included): a stale lock file never blocks a later run.
The file records the holder's pid for the error message. :func:`try_lock` is the same kind of lock on any
open file: :mod:`graphbisect.storage.packfile` holds one on each temporary data file it writes, so a later run can
tell a dead writer's leftover (its lock is free) from a live writer's file.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with folder_lock(folder, what="a reduction"):
    ...     pass
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from graphbisect.errors import GraphBisectError

__all__ = ["LockedError", "folder_lock", "try_lock"]

log = logging.getLogger(__name__)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; runs are then not protected from each other
    fcntl = None  # type: ignore[assignment]


class LockedError(GraphBisectError):
    """Another process holds the lock."""


def try_lock(fd: int, *, wait: bool = False) -> bool:
    """Take an exclusive ``flock`` on the open file ``fd``; it holds until every descriptor of that open
    file is closed or the process ends, however it ends (another open of the same file, even in this
    process, does not get it). Without ``wait``, return False at once when another holds it.

    Where the platform has no ``flock`` (Windows), no lock is taken and the answer is ``wait``: a lock that
    does not exist proves nothing about other processes. A file system that refuses locks raises ``OSError``.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return wait
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def folder_lock(folder: Path, *, what: str, hint: str = "wait for it to finish, or choose another -o folder",
                cli_hint: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (created if missing) for the block; raise :class:`LockedError`
    at once when another process holds it. ``what`` names the protected work in the message."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None and not try_lock(fd):
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise LockedError(f"{folder} is in use by another process (pid {holder}), running {what}",
                              hint=hint, cli_hint=cli_hint)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        log.debug("locked %s", folder)
        yield
    finally:
        os.close(fd)  # releases the flock
