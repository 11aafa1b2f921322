"""A reduction's work folder (``DIR.work`` beside the bundle ``DIR``) is graphbisect's own.

It holds a reduction's resumable state: the model's copy, the inputs, the activation store, the journal. A new
run (without ``--resume``) removes what an earlier run left there, and a finished run removes the folder. So
that nothing else is ever removed (issue 36: a user's file placed in a stale ``DIR.work`` was deleted; through
a link ``DIR.work`` the removal and the new state went into a folder never named on the command line):

- the folder is never followed through a symbolic link: a link there (dangling or not) is refused;
- graphbisect removes only the entries it makes there (:data:`ENTRIES`: their names, the external data
  ``<model>.onnx.data*`` of the models it saves, and the temporaries ``.<entry>.*`` of its atomic writes); an
  entry of another name, or a link in place of one, is the user's: a run refuses to start (both a new one,
  which would remove it, and a resumed one, which would remove the folder when it finishes), and a run that
  finds one at its end (put there while it ran) leaves it, and the folder, in place.

What graphbisect's entries hold is written by graphbisect and its backends' workers (logs, compiled models,
values), with names it cannot list ahead: a folder of its own is removed whole.

Example:
    >>> import tempfile, pathlib
    >>> work = pathlib.Path(tempfile.mkdtemp()) / "bug.work"
    >>> check_own(work)          # a new folder: nothing of anyone's there
    >>> work.mkdir()
    >>> _ = (work / "run.json").write_text("{}"), (work / "NOTES.md").write_text("mine")
    >>> foreign(work)
    ['NOTES.md']
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from graphbisect.errors import InputError

__all__ = ["ENTRIES", "check_own", "foreign", "remove_own"]

log = logging.getLogger(__name__)

#: Every name a reduction gives an entry at the top of its work folder (files and folders; a folder's content
#: is its own). A new entry the reduction writes must be listed here, or the next run refuses the folder.
ENTRIES = frozenset({
    # state (prepare, baseline, noise floor, flakiness, journal)
    "lock", "run.json", "model.onnx", "inputs.npz", "baseline.json", "floor.json", "flaky.json", "journal.jsonl",
    # models saved to be run
    "probe.onnx", "probe-floor.onnx", "probe-target.onnx",
    # folders: the activation store, the workers' folders, the candidates, facts and the audit
    "activations", "oracle", "oracle-plain", "floor", "baseline", "baseline-saving", "evidence", "target",
    "target-describing", "candidates", "verify-target", "verify-oracle", "facts", "audit", "audited",
})


def _is_own_name(name: str) -> bool:
    if name in ENTRIES:
        return True
    return any(name.startswith(f".{entry}.")  # a temporary of an atomic write or a bundle's staging folder
               or (entry.endswith(".onnx") and name.startswith(f"{entry}.data"))  # a saved model's weights
               for entry in ENTRIES)


def foreign(work: Path) -> list[str]:
    """The entries of ``work`` that are not graphbisect's (sorted): another name, or a link in place of one."""
    return sorted(p.name for p in Path(work).iterdir() if p.is_symlink() or not _is_own_name(p.name))


def check_own(work: Path) -> None:
    """Raise :class:`InputError` unless ``work`` is missing or a real folder holding only graphbisect's entries:
    a link (dangling or not) or a file there, or a file of the user's inside, is refused, saying what to do."""
    work = Path(work)
    if work.is_symlink():
        raise InputError(
            f"the work folder {work} is a symbolic link (to {_target(work)}): a reduction's work folder is its own "
            "and is never followed through a link (it removes what an earlier run left there)",
            hint=f"remove the link ({work}), or choose another -o folder: graphbisect makes {work.name} itself")
    if not work.exists():
        return
    if not work.is_dir():
        raise InputError(f"the work folder {work} exists and is not a folder",
                         hint=f"move {work} away, or choose another -o folder")
    theirs = foreign(work)
    if theirs:
        raise InputError(
            f"{work} holds files graphbisect did not write ({', '.join(theirs[:5])}"
            f"{' …' if len(theirs) > 5 else ''}): it is the work folder of a reduction, which removes what an "
            "earlier run left there and the folder when it finishes",
            hint=f"move those files out of {work} (graphbisect never deletes a file it did not write), "
            "or choose another -o folder")


def remove_own(work: Path, *, keep: frozenset[str] = frozenset()) -> bool:
    """Remove graphbisect's entries of ``work`` (but ``keep``), then the folder when nothing else is left in it.
    Return whether the folder is gone. A link is unlinked, never followed (within graphbisect's folders too)."""
    work = Path(work)
    if work.is_symlink() or not work.is_dir():
        return False
    for path in work.iterdir():
        if path.name in keep or path.is_symlink() or not _is_own_name(path.name):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    theirs = foreign(work)
    if theirs:
        log.warning("%s is left in place: it holds files graphbisect did not write (%s)", work, ", ".join(theirs[:5]))
        return False
    if keep:
        return False
    try:
        work.rmdir()
    except OSError as exc:  # an entry made since the listing: left in place, like the user's
        log.debug("%s is left in place: %s", work, exc)
        return False
    return True


def _target(link: Path) -> str:
    try:
        return str(link.readlink())
    except OSError:
        return "?"
