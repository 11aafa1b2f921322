"""Temporary folders that name their owner process, so a folder a killed process left is removed later.

A process killed outright (``SIGKILL``, the OOM killer) cannot clean up. So each of graphbisect's temporary
folders (``graphbisect-*`` in the temp folder: a workflow's work folder, a worker zygote's) names the process
that removes it in ``.graphbisect-owner``, and :func:`reclaim_abandoned` (run when a workflow makes a new
one) removes the folders whose owner is gone. Standard library only: a zygote imports it too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["OWNER_FILE", "PREFIX", "alive", "claim", "reclaim_abandoned"]

logger = logging.getLogger(__name__)

OWNER_FILE = ".graphbisect-owner"
#: Every temporary folder of graphbisect's starts so (the rest of its name says whose it is).
PREFIX = "graphbisect-"


def claim(folder: Path, pid: int | None = None) -> None:
    """Name ``pid`` (default: this process) as the process that removes ``folder``."""
    (Path(folder) / OWNER_FILE).write_text(f"{os.getpid() if pid is None else pid}\n", encoding="utf-8")


def reclaim_abandoned(root: Path | None = None) -> list[Path]:
    """Remove this user's temporary folders (under ``root``, default the temp folder) whose owner process no
    longer exists; return them. Folders without an owner file are never touched."""
    removed: list[Path] = []
    base = Path(root or tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for folder in base.glob(f"{PREFIX}*"):
            try:
                if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                    continue
                pid = int((folder / OWNER_FILE).read_text(encoding="utf-8").strip())
            except (OSError, ValueError):
                continue
            if alive(pid):
                continue
            shutil.rmtree(folder, ignore_errors=True)
            logger.info("removed %s, left by process %d, which no longer exists", folder, pid)
            removed.append(folder)
    return removed


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs: a zombie (ended, not yet reaped by its parent, or never by a
    container's init) does not; one of another user does."""
    if pid <= 0:
        return True  # not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists under another user
        return True
    with contextlib.suppress(OSError, IndexError):  # Linux: the state after the command's name
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True
