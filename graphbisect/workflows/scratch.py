"""The work folder of a workflow: the caller's (kept afterwards), or a temporary one removed on exit."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["work_folder"]


@contextlib.contextmanager
def work_folder(workdir: Path | None, prefix: str) -> Iterator[tuple[Path, bool]]:
    """Yield ``(folder, kept)``: ``workdir`` (created if needed, ``kept=True``) or a fresh temporary folder.

    Example:
        >>> with work_folder(None, "demo") as (folder, kept):
        ...     folder.is_dir(), kept
        (True, False)
    """
    if workdir is not None:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        yield workdir, True
        return
    with tempfile.TemporaryDirectory(prefix=f"graphbisect-{prefix}-") as tmp:
        yield Path(tmp), False
