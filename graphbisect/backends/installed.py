"""Which installed distribution a backend library is imported from: what ``graphbisect backends`` reports.

A distribution's metadata is not what runs. ``onnxruntime`` and ``onnxruntime-gpu`` (and
``onnxruntime-openvino``, ``onnxruntime-directml``, ...) install the same ``onnxruntime`` package folder: the
one installed last overwrites the other's files, and both keep their metadata. With both wheels installed
(common), ``importlib.metadata.version("onnxruntime")`` said 1.30.0, the CPU wheel's, where ``import
onnxruntime`` — and every worker — ran onnxruntime-gpu 1.31.1 (issue 23). A distribution in another folder
of ``sys.path`` is shadowed the same way by the one found first.

:func:`measure` imports the library and reports its ``__version__``, the folder it was imported from and the
distribution whose files those are: among the distributions that install files into that package folder
(:func:`installs_of`), the one whose recorded Python files (``RECORD`` hashes) are the ones there; the
others are *overwritten* (same folder, their files replaced) or *shadowed* (another folder). Importing a
backend library belongs in a child process (:func:`graphbisect.backends.process.availability_under`), never in
graphbisect's own: this module imports only the standard library.

Example:
    >>> facts = measure("json")
    >>> facts["version"], facts["distribution"], facts["installed"]
    ('2.0.9', None, [])
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["Install", "installs_of", "measure", "note"]

logger = logging.getLogger(__name__)

#: At most this many of a distribution's recorded ``.py`` files are hashed to tell whose files are in place.
MAX_HASHED = 400


@dataclass(frozen=True)
class Install:
    """One installed distribution with files in a module's package folder."""

    name: str
    version: str
    location: str  # the package folder its files are in
    state: str  # "imported" | "overwritten" (same folder, files replaced) | "shadowed" (another folder)


def measure(import_name: str) -> dict[str, Any]:
    """Import ``import_name`` and report what that gave: ``version`` (its ``__version__``), ``location`` (the folder
    it was imported from), ``distribution`` (whose files those are; None for a module no distribution installed,
    a list's worth when their files are identical), ``installed`` (:class:`Install` of every distribution with
    files there, as dicts) and ``note`` (:func:`note`). On an import failure: ``error`` instead."""
    try:
        module = sys.modules.get(import_name) or importlib.import_module(import_name)
    except Exception as exc:  # an installed library that does not import (missing shared libraries...)
        return {"error": f"{type(exc).__name__}: {exc}"}
    version = getattr(module, "__version__", None)
    version = version if isinstance(version, str) else None
    file = getattr(module, "__file__", None)
    if not file:
        return {"version": version, "location": None, "distribution": None, "installed": [], "note": None}
    installs = installs_of(import_name, Path(file), version)
    owners = [i.name for i in installs if i.state == "imported"]
    if version is None and len(owners) == 1:  # a module without __version__: its distribution's
        version = next(i.version for i in installs if i.state == "imported")
    return {"version": version, "location": str(Path(file).parent), "distribution": " or ".join(owners) or None,
            "installed": [asdict(i) for i in installs], "note": note(import_name, installs)}


def installs_of(import_name: str, module_file: Path, version: str | None = None) -> list[Install]:
    """Every installed distribution with files in ``import_name``'s package folder, the imported one first.

    ``module_file`` is the imported module's ``__file__``. Several distributions in the imported folder (one
    overwrote the other) are told apart by which one's recorded ``.py`` hashes match the files there; when
    several match (identical files), those whose version is ``version`` win.
    """
    parts = import_name.split(".")
    package = module_file.parent if module_file.name == "__init__.py" else module_file
    root = package.parents[len(parts) - 1]
    relative = "/".join(parts) if module_file.name == "__init__.py" else module_file.relative_to(root).as_posix()
    here = _resolved(package)
    found: list[tuple[metadata.Distribution, Path]] = []
    for dist in _candidates(parts[0]):
        files = [f for f in dist.files or () if f.as_posix() == relative or f.as_posix().startswith(relative + "/")]
        if files:
            found.append((dist, _resolved(Path(str(dist.locate_file(relative))))))
    local = [dist for dist, where in found if where == here]
    mismatches = {id(dist): _mismatched(dist, relative) for dist in local} if len(local) > 1 else {}
    best = min(mismatches.values(), default=0)
    imported = [d for d in local if mismatches.get(id(d), 0) == best]
    if len(imported) > 1 and version is not None and any(d.version == version for d in imported):
        imported = [d for d in imported if d.version == version]
    installs = []
    for dist, where in found:
        state = "imported" if any(dist is d for d in imported) else "overwritten" if where == here else "shadowed"
        installs.append(Install(dist.metadata["Name"] or "?", dist.version, str(where), state))
    return sorted(installs, key=lambda i: (i.state != "imported", i.name))


def note(import_name: str, installs: Sequence[Install]) -> str | None:
    """What to say when more than one distribution installs ``import_name`` (None otherwise).

    Example:
        >>> note("onnxruntime", [Install("onnxruntime-gpu", "1.31.1", "/v/onnxruntime", "imported"),
        ...                      Install("onnxruntime", "1.30.0", "/v/onnxruntime", "overwritten")]).split(";")[0]
        '2 distributions install onnxruntime: `import onnxruntime` loads onnxruntime-gpu 1.31.1'
    """
    if len(installs) < 2:
        return None
    imported = [i for i in installs if i.state == "imported"]
    others = [i for i in installs if i.state != "imported"]
    how = {"overwritten": "its files in the same folder were overwritten by the other's",
           "shadowed": "installed in {location}, after the imported one on sys.path"}
    loads = (" or ".join(f"{i.name} {i.version}" for i in imported) + (" (identical files)" if len(imported) > 1
                                                                        else "")) or "files no distribution records"
    rest = "; ".join(f"{i.name} {i.version}: {how[i.state].format(location=i.location)}" for i in others)
    text = f"{len(installs)} distributions install {import_name}: `import {import_name}` loads {loads}"
    text += f"; {rest}" if rest else ""
    if any(i.state == "overwritten" for i in installs) or len(imported) > 1:
        names = " ".join(sorted({i.name for i in installs}))
        text += (f". Uninstalling one deletes files the other needs: keep one (pip uninstall -y {names}, then "
                 "install the one you want)")
    return text


def _candidates(top: str) -> Iterator[metadata.Distribution]:
    """Installed distributions that may have files under the top-level package ``top`` (every copy of each,
    whichever ``sys.path`` folder holds it)."""
    names = {_normal(n) for n in metadata.packages_distributions().get(top, ())}
    seen: set[str] = set()
    for dist in metadata.distributions():
        name = _normal(dist.metadata["Name"] or "")
        where = f"{name} {dist.locate_file('')}"  # one found twice through two sys.path entries counts once
        if name in names and where not in seen:
            seen.add(where)
            yield dist


def _mismatched(dist: metadata.Distribution, relative: str) -> int:
    """How many of ``dist``'s recorded ``.py`` files under ``relative`` are missing or differ from the record."""
    count = 0
    checked = 0
    for entry in dist.files or ():
        path = entry.as_posix()
        if not (path.startswith(relative + "/") and path.endswith(".py")) or entry.hash is None:
            continue
        checked += 1
        if checked > MAX_HASHED:
            break
        if entry.hash.mode != "sha256":
            continue
        try:
            digest = hashlib.sha256(Path(str(dist.locate_file(entry))).read_bytes()).digest()
        except OSError:
            count += 1
            continue
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != entry.hash.value:
            count += 1
    return count


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path.absolute()
