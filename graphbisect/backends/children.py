"""Programs a worker starts (a ``command`` target): waited for by their exit, never by their output's end.

A program may leave a descendant behind that holds its stderr open (a daemon, ``sleep 60 &`` in a shell
line). Reading stderr through a pipe until EOF then waits for that descendant: a run that finished in one
second became "timeout after 10 s", and hung with the default timeout (issue 24 case 7). So:

* the program's stderr goes to a file, and only its last :data:`TAIL_BYTES` are read back (1 GB of stderr
  held in memory reached 3.2 GB of RSS);
* the program runs in a process group of its own; the worker waits for the program's *exit*, then kills
  the group, so nothing it started outlives the run;
* while it runs, the group is recorded in the worker's folder (:data:`GROUPS_FOLDER`), and the host kills
  the recorded groups when it kills a worker (a timeout, Ctrl-C): the worker's own process group does not
  hold them.

Standard library only: it runs in workers, maybe under another interpreter.

Example:
    >>> import tempfile, pathlib, sys
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> run_program([sys.executable, "-c", "import sys; sys.stderr.write('hi')"], shell=False, cwd=str(folder),
    ...             folder=folder)
    (0, 'hi')
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["GROUPS_FOLDER", "TAIL_BYTES", "kill_recorded_groups", "read_tail", "run_program"]

logger = logging.getLogger(__name__)

#: The subfolder of a worker's folder naming (one empty file each) the process groups of running programs.
GROUPS_FOLDER = "child-groups"
#: How much of a program's stderr is read back (the end: where the error is).
TAIL_BYTES = 64 * 1024


def run_program(command: str | list[str], *, shell: bool, cwd: str, folder: Path,
                env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run ``command`` in a process group of its own and return (its exit status, the tail of its stderr).

    Returns when the program exits, whatever its descendants do; they are killed then. Raises ``OSError``
    when it cannot be started. ``folder`` (the worker's) receives the stderr file and the group record.
    ``env``: the program's environment (default the worker's); its ``PATH`` also finds the program.
    """
    stderr_path = folder / "command-stderr.log"
    groups = folder / GROUPS_FOLDER
    groups.mkdir(parents=True, exist_ok=True)
    with open(stderr_path, "wb") as stderr:
        # its own group: killpg reaches what it starts
        proc = subprocess.Popen(command, shell=shell, stdin=subprocess.DEVNULL, stderr=stderr, cwd=cwd,
                                env=None if env is None else dict(env), start_new_session=True)
    record = groups / str(proc.pid)
    record.touch()
    try:
        returncode = proc.wait()
    finally:  # also on Ctrl-C: nothing the program started outlives the run
        _kill_group(proc.pid)
        proc.wait()
        record.unlink(missing_ok=True)
    try:
        return returncode, read_tail(stderr_path, TAIL_BYTES)
    finally:
        stderr_path.unlink(missing_ok=True)


def read_tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of ``path`` as text, with a first line saying how much came before."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - limit))
        text = handle.read().decode("utf-8", errors="replace")
    return f"[{size - limit} bytes of stderr before this]\n{text}" if size > limit else text


def kill_recorded_groups(folder: Path) -> None:
    """Kill the process groups a worker recorded in ``folder`` (the host, after killing that worker)."""
    groups = folder / GROUPS_FOLDER
    with contextlib.suppress(OSError):
        for record in list(groups.iterdir()):
            with contextlib.suppress(ValueError):
                _kill_group(int(record.name))
            record.unlink(missing_ok=True)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
        logger.debug("killed process group %d", pgid)
