"""Atomic file writes: a reader never sees a half-written file, and an interrupted write leaves the old one.

Every artifact, manifest, journal header, model and weights file graphbisect writes goes through here.
Only the standard library is imported: worker processes under another interpreter may use it too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text"]


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, fsync it and rename it over ``path``.

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
