"""What a bundle may say about the reporter's files: their names, never where they live.

A bundle is attached to public issues. The interpreter that ran a backend, the folder of its library, the
user's model and the command line's ``-o`` folder are facts of the run, but their absolute paths tell where
the reporter keeps things (``/home/alice/work/secret-project/...``) and help no maintainer: what a maintainer
needs are versions (kept) and, at most, which kind of install (``site-packages/onnxruntime``). So every path
the bundle's reports describe goes through here: a file by its name, a library by its place in its
``site-packages``, a command line's files relative to the folder it ran in.

The backend *specs* stay as given where they are data (``report.json``'s ``target``, ``repro_config.json``):
they are what ``graphbisect verify`` replays on the reporter's machine. ``report.md`` shows them through
:func:`shareable_text`.

Example:
    >>> file_name("/home/alice/models/net.onnx"), library_location("/venv/lib/python3.11/site-packages/onnxruntime")
    ('net.onnx', 'site-packages/onnxruntime')
    >>> shareable_ran_with({"library": "onnxruntime", "python": "/home/alice/.venv/bin/python3"})["python"]
    'python3'
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

__all__ = ["file_name", "library_location", "shareable_command", "shareable_ran_with", "shareable_report",
           "shareable_text"]

_PACKAGE_FOLDERS = ("site-packages", "dist-packages")


def file_name(path: object) -> str:
    """The last component of ``path`` (POSIX or Windows spelling); a bare name is returned as it is.

    Example:
        >>> file_name("C:\\\\Users\\\\bob\\\\m.onnx"), file_name("bug/"), file_name("m.onnx")
        ('m.onnx', 'bug', 'm.onnx')
    """
    text = str(path).rstrip("/\\")
    if not text:
        return str(path)
    return PureWindowsPath(text).name if "\\" in text else PurePosixPath(text).name


def library_location(path: object) -> str:
    """Where a library was imported from, as far as it tells the kind of install: from its ``site-packages``
    (or ``dist-packages``) folder on, else its folder's name (a source checkout)."""
    text = str(path).replace("\\", "/")
    parts = [p for p in text.split("/") if p]
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] in _PACKAGE_FOLDERS:
            return "/".join(parts[index:])
    return file_name(path)


def shareable_ran_with(facts: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A backend's measured facts (:attr:`~graphbisect.backends.RunResult.ran_with`) with its interpreter by
    name and its library by :func:`library_location`; versions as measured."""
    if facts is None:
        return None
    shared = dict(facts)
    if shared.get("python"):
        shared["python"] = file_name(shared["python"])
    if shared.get("library_path"):
        shared["library_path"] = library_location(shared["library_path"])
    return shared


def shareable_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """A run's report facts as a bundle may carry them: the original model by its file name and each role's
    ``versions`` by :func:`shareable_ran_with` (the command line is made shareable where it is recorded)."""
    shared = dict(report)
    original = report.get("original_model")
    if isinstance(original, Mapping) and original.get("path"):
        shared["original_model"] = {**original, "path": file_name(original["path"])}
    versions = report.get("versions")
    if isinstance(versions, Mapping):
        shared["versions"] = {role: shareable_ran_with(facts) if isinstance(facts, Mapping) else facts
                              for role, facts in versions.items()}
    return shared


#: An absolute path inside a text: at its start or after ``=``, ``,``, ``;``, ``:`` or a space (a spec's option
#: value, a command's words), up to the next such separator.
_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[=,;:\s]))(/[^\s,;:=`|]+)")


def shareable_text(text: str, cwd: Path | None = None) -> str:
    """``text`` (a backend spec, one argument of a command line) with each absolute path that names a file
    here made relative to ``cwd`` (default: the current folder) when inside it, else its file name.

    What names a file or folder here, or one about to be made in an existing folder below the root (an
    ``-o`` folder), is a path; anything else stays as written: a tensor name such as ``/blk0/Add_output_0``
    or ``/Add_1_output_0`` (a ``--tol`` argument) is not a file.

    Example:
        >>> shareable_text("command:cmd=/usr/bin/env {model}", cwd=Path("/tmp"))
        'command:cmd=env {model}'
        >>> shareable_text("/nonexistent-root/y:1e-3"), shareable_text("/Add_1_output_0")
        ('/nonexistent-root/y:1e-3', '/Add_1_output_0')
    """
    here = (cwd or Path.cwd()).absolute()

    def local(match: re.Match[str]) -> str:
        path = Path(match.group(1))
        if not (path.exists() or (path.parent.is_dir() and path.parent != path.parent.parent)):
            return match.group(1)  # not a file here: a tensor name, a URL part, an option's text
        return os.path.relpath(path, here) if path.is_relative_to(here) and path != here else file_name(path)

    return _ABSOLUTE.sub(local, text)


def shareable_command(argv: Sequence[str], cwd: Path | None = None) -> str:
    """``argv`` as a shell line, each argument through :func:`shareable_text`.

    Example:
        >>> shareable_command(["graphbisect", "reduce", "/tmp/m.onnx", "--tol", "/blk/y:1e-3"], cwd=Path("/tmp"))
        'graphbisect reduce m.onnx --tol /blk/y:1e-3'
    """
    return shlex.join(shareable_text(arg, cwd) for arg in argv)
