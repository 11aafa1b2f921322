"""The output rule for a command's ``-o`` folder of files (``precision -o``): new, empty, or its own earlier one.

A command that writes a fixed set of files into a folder the user names (``overrides.json``, ``trtexec.txt``,
``mixed_precision.onnx`` ...) would replace the user's files of those names, or add its files to another
command's result (a reduce bundle). So the folder must be new, empty, or one an earlier run of the same command
wrote, which it marked (``mark``); anything else is refused before anything runs (issue 36, as ``reduce``,
``passes`` and ``triage`` refuse theirs). A link or a file in place of the folder is refused too: the files are
written only into the folder named.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "fp16"
    >>> claim_output_folder(out, mark=".graphbisect-precision", command="precision", writes="overrides.json")
    >>> sorted(p.name for p in out.iterdir())
    ['.graphbisect-precision']
"""

from __future__ import annotations

from pathlib import Path

from graphbisect.errors import InputError

__all__ = ["check_output_folder", "claim_output_folder"]


def check_output_folder(folder: Path, *, mark: str, command: str, writes: str) -> None:
    """Raise :class:`InputError` unless ``folder`` is missing, an empty folder or one marked ``mark`` by an
    earlier ``graphbisect command`` (``writes`` names the files it would replace, for the message)."""
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError(f"the output folder {folder} exists and is not a folder (or is a symbolic link)",
                         hint="choose a new or empty folder for -o")
    if not folder.exists():
        return
    names = sorted(p.name for p in folder.iterdir())
    if names and mark not in names:
        raise InputError(
            f"the output folder {folder} holds files that are not an earlier `graphbisect {command}`'s "
            f"({', '.join(names[:5])}{' …' if len(names) > 5 else ''}): {writes} would replace them",
            hint=f"choose a new or empty folder for -o (an earlier `graphbisect {command} -o` folder is fine; "
            "graphbisect never replaces a file it did not write)")


def claim_output_folder(folder: Path, *, mark: str, command: str, writes: str) -> None:
    """:func:`check_output_folder`, then make the folder (if missing) and mark it as this command's."""
    check_output_folder(folder, mark=mark, command=command, writes=writes)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    marked = folder / mark
    if not marked.exists():
        marked.write_text(f"a `graphbisect {command}` output folder: a later run replaces its files\n",
                          encoding="utf-8")
