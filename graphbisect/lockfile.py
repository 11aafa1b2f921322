"""An exclusive, non-blocking lock on a folder: two runs writing the same place must not interleave.

The lock is an ``flock`` on ``<folder>/lock``, held by an open file descriptor, so the kernel releases it
when the process ends however it ends (``kill -9`` included): a stale lock file never blocks a later run.
The file records the holder's pid for the error message.

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

__all__ = ["LockedError", "folder_lock"]

log = logging.getLogger(__name__)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; runs are then not protected from each other
    fcntl = None  # type: ignore[assignment]


class LockedError(GraphBisectError):
    """Another process holds the lock."""


@contextlib.contextmanager
def folder_lock(folder: Path, *, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (created if missing) for the block; raise :class:`LockedError`
    at once when another process holds it. ``what`` names the protected work in the message."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise LockedError(f"{folder} is in use by another process (pid {holder}), running {what}",
                                  hint="wait for it to finish, or choose another -o folder") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        log.debug("locked %s", folder)
        yield
    finally:
        os.close(fd)  # releases the flock
