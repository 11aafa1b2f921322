"""The work folder of a workflow: the caller's (kept afterwards), or a temporary one removed on exit.

A temporary folder holds the oracle's activation store (hundreds of MB on an OCR model). It is removed when
the workflow returns or raises, and when the CLI is terminated (``SIGTERM``/``SIGHUP`` unwind like an
exception, see :mod:`graphbisect.cli.main`). A process killed outright (``SIGKILL``, the OOM killer) cannot
clean up, so each temporary folder names its owner process (:mod:`graphbisect.storage.tempfolders`), and the next
work folder made on this machine removes the folders whose owner is gone.

**A caller's folder is graphbisect's own for the run** (issue 24 case 5): it must be new, empty, or one an
earlier run marked (``.graphbisect-workdir``), so no file of the user's is overwritten; and the run holds an
exclusive lock on it (:func:`graphbisect.storage.lockfile.folder_lock`), so a second run on the same ``--workdir``
stops at once instead of reading the first one's values.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from graphbisect.errors import InputError
from graphbisect.storage.lockfile import folder_lock
from graphbisect.storage.tempfolders import OWNER_FILE, PREFIX, claim, reclaim_abandoned

__all__ = ["MARK_FILE", "OWNER_FILE", "check_work_folder", "own_folder", "reclaim_abandoned", "work_folder"]

logger = logging.getLogger(__name__)

#: Marks a caller's work folder as graphbisect's: a later run may use it again.
MARK_FILE = ".graphbisect-workdir"


@contextlib.contextmanager
def work_folder(workdir: Path | None, prefix: str, *,
                protect: Iterable[Path | None] = ()) -> Iterator[tuple[Path, bool]]:
    """Yield ``(folder, kept)``: ``workdir`` (created if needed, ``kept=True``) or a fresh temporary folder.

    ``protect`` names the user's files (the model): a ``workdir`` that is the folder holding one of them is
    refused with :class:`InputError`, since the workflow writes ``model.onnx``, ``inputs.npz``... there.

    Example:
        >>> with work_folder(None, "demo") as (folder, kept):
        ...     folder.is_dir(), kept
        (True, False)
    """
    if workdir is not None:
        with own_folder(Path(workdir), what=f"graphbisect {prefix}", protect=protect) as folder:
            yield folder, True
        return
    reclaim_abandoned()
    tmp = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{prefix}-"))
    try:
        claim(tmp)
        yield tmp, False
    finally:
        _remove(tmp)


def _remove(folder: Path, tries: int = 5) -> None:
    """Remove a temporary work folder that a background thread may still be writing into.

    Ctrl-C or SIGTERM unwinds the main thread while another (compare's oracle thread, saving its probe model)
    still writes there: ``rmtree`` then failed with "Directory not empty", exit 3 (issue 36). So the folder
    is renamed first (that thread's next file fails on its own, old path) and removed in a few tries; should
    it stay, the next run reclaims it (its owner file names this process)."""
    gone = folder.with_name(f"{folder.name}-removed")
    with contextlib.suppress(OSError):
        folder.rename(gone)
        folder = gone
    for _ in range(tries):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            return
        time.sleep(0.1)
    logger.warning("could not remove the temporary folder %s; the next graphbisect run removes it", folder)


@contextlib.contextmanager
def own_folder(workdir: Path, *, what: str, protect: Iterable[Path | None] = ()) -> Iterator[Path]:
    """Hold the caller's ``workdir`` for the block: created if missing, refused (:class:`InputError`) when it
    is the folder of one of the ``protect`` files, a link or a file, or holds files without graphbisect's
    mark; locked, so a second run using it stops at once (:class:`~graphbisect.storage.lockfile.LockedError`)."""
    workdir = Path(workdir)
    check_work_folder(workdir, protect)
    if workdir.is_symlink() or (workdir.exists() and not workdir.is_dir()):
        raise InputError(f"the work folder {workdir} exists and is not a folder (or is a symbolic link)",
                         hint="choose a new or empty folder for workdir=",
                         cli_hint="choose a new or empty folder for --workdir")
    workdir.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in workdir.iterdir())
    if names and MARK_FILE not in names:
        raise InputError(
            f"the work folder {workdir} holds files graphbisect did not put there ({', '.join(names[:5])}"
            f"{' …' if len(names) > 5 else ''}): the run writes model.onnx, inputs.npz, activations/ ... into it",
            hint="choose a new or empty folder for workdir= (a folder an earlier graphbisect run used is fine)",
            cli_hint="choose a new or empty folder for --workdir (a folder an earlier graphbisect run used is fine)")
    mark = workdir / MARK_FILE
    if not mark.exists():  # written before the lock: a locked folder is always marked
        mark.write_text("a graphbisect work folder: a later run may replace what it holds\n", encoding="utf-8")
    with folder_lock(workdir, what=what, hint="wait for it to finish, or choose another workdir=",
                     cli_hint="wait for it to finish, or choose another --workdir"):
        yield workdir


def check_work_folder(workdir: Path, protect: Iterable[Path | None]) -> None:
    """Raise :class:`InputError` when ``workdir`` is the folder holding one of the user's files ``protect``."""
    for path in protect:
        if path is not None and workdir.exists() and Path(path).parent.resolve() == workdir.resolve():
            raise InputError(f"the work folder {workdir} is the folder of {path}: files written there "
                             "(model.onnx, inputs.npz, ...) could overwrite yours",
                             hint="choose an empty or new folder for workdir=, e.g. a subfolder",
                             cli_hint="choose an empty or new folder for --workdir, e.g. a subfolder")
