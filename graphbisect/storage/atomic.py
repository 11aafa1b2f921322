"""Atomic file writes: a reader never sees a half-written file, and an interrupted write leaves the old one.

Every artifact, manifest, journal header, model and weights file graphbisect writes goes through here.
Only the standard library is imported: worker processes under another interpreter may use it too.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["NotARegularFile", "atomic_path", "atomic_write_bytes", "atomic_write_text", "not_regular"]

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


class NotARegularFile(OSError):
    """The path to write is a link, a folder, a device, a pipe or a socket: it is never replaced."""


def not_regular(path: str | Path) -> str | None:
    """Why ``path`` must not be replaced by a written file (None: it is missing or a regular file)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    how = "a link is never written through or replaced" if kind == "a symbolic link" else \
        "graphbisect replaces the file it writes"
    return f"it is {kind}: {how}, so name a new or regular file"


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, fsync it and rename it over ``path``.

    ``path`` must be missing or a regular file: a symbolic link, folder, device or pipe there raises
    :class:`NotARegularFile` (an ``OSError``) before anything is written, since the rename would replace it.

    The file is made readable by everyone (``mkstemp`` creates it private), as bundles are shared.
    ``durable=False`` skips the fsync (still atomic): for scratch files deleted right after use, such as
    reduction candidates, where the fsync was most of the write's cost.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_text("hi")
        >>> target.read_text()
        'hi'
    """
    path = Path(path)
    problem = not_regular(path)
    if problem is not None:  # a device, a pipe or a link would be replaced by a regular file
        raise NotARegularFile(f"cannot write {path}: {problem}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))
