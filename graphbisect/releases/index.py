"""Which releases of a package exist for this Python and platform, and which of them a ``--range`` selects.

The list comes from the package index pip is configured with (``pip index versions --json``), which lists only
the releases with a file this interpreter can install. Final releases only, unless ``pre`` (pre-releases and
development releases too). Versions are ordered by their release numbers (``1.9.0`` < ``1.10.0``); a version
string of another form is left out, with a warning.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from graphbisect.errors import InputError

__all__ = ["VersionRange", "index_versions", "is_prerelease", "release_key", "select_versions"]

log = logging.getLogger(__name__)

#: Seconds the package index may take to answer.
INDEX_TIMEOUT = 120

_VERSION = re.compile(r"^v?(?P<release>\d+(?:\.\d+)*)(?:[-_.]?(?P<pre>a|b|rc)(?P<pre_n>\d*))?"
                      r"(?:[-_.]?post(?P<post>\d*))?(?:[-_.]?dev(?P<dev>\d*))?$", re.IGNORECASE)


def release_key(version: str) -> tuple[tuple[int, ...], int, int, int, int]:
    """A sort key of a PEP 440 version of the common forms (``1.22.1``, ``1.23.0rc1``, ``1.2.post1``,
    ``1.3.dev2``). Raises ``ValueError`` for another form.

    Example:
        >>> sorted(["1.10.0", "1.9.1", "1.10.0rc1"], key=release_key)
        ['1.9.1', '1.10.0rc1', '1.10.0']
    """
    found = _VERSION.match(version.strip())
    if found is None:
        raise ValueError(f"not a version graphbisect can order: {version!r}")
    release = tuple(int(part) for part in found["release"].split("."))
    while len(release) > 1 and release[-1] == 0:  # 1.18 == 1.18.0
        release = release[:-1]
    pre = {"a": 0, "b": 1, "rc": 2}.get((found["pre"] or "").lower(), 3)
    dev = int(found["dev"] or 0) if found["dev"] is not None else 1 << 30
    if found["dev"] is not None and found["pre"] is None and found["post"] is None:
        pre = -1  # 1.3.dev2 comes before 1.3a1
    return release, pre, int(found["pre_n"] or 0), int(found["post"] or -1) if found["post"] is not None else -1, dev


def is_prerelease(version: str) -> bool:
    """A pre-release (``a``, ``b``, ``rc``) or a development release."""
    found = _VERSION.match(version.strip())
    return found is not None and (found["pre"] is not None or found["dev"] is not None)


@dataclass(frozen=True)
class VersionRange:
    """``A..B``, both ends included; either may be left out (``1.18..``, ``..1.22.1``)."""

    oldest: str | None = None
    newest: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> VersionRange:
        """``"A..B"`` (or ``None``: every release). Raises :class:`InputError` for another form."""
        if text is None or text.strip() in ("", ".."):
            return cls()
        oldest, sep, newest = text.partition("..")
        if not sep:
            raise InputError(f"the release range {text!r} is not a range",
                             hint="write OLDEST..NEWEST, e.g. 1.17.3..1.22.1, or leave out one end: 1.20..")
        ends = [end.strip() or None for end in (oldest, newest)]
        for end in ends:
            if end is not None:
                try:
                    release_key(end)
                except ValueError as exc:
                    raise InputError(f"the release range {text!r}: {exc}", hint="write versions as 1.22.1") from exc
        if ends[0] is not None and ends[1] is not None and release_key(ends[0]) > release_key(ends[1]):
            raise InputError(f"the release range {text!r} starts after it ends", hint="write the older release first")
        return cls(ends[0], ends[1])

    def __contains__(self, version: object) -> bool:
        key = release_key(str(version))
        return (self.oldest is None or release_key(self.oldest) <= key) and \
            (self.newest is None or key <= release_key(self.newest))

    def __str__(self) -> str:
        return f"{self.oldest or ''}..{self.newest or ''}"


def select_versions(versions: Iterable[str], within: VersionRange = VersionRange(), *,
                    pre: bool = False) -> list[str]:
    """The versions within ``within``, oldest first, each once; pre-releases only with ``pre``.

    Example:
        >>> select_versions(["1.22.1", "1.20.1", "1.23.0rc1", "1.17.3"], VersionRange.parse("1.18..1.23"))
        ['1.20.1', '1.22.1']
    """
    chosen: dict[tuple[object, ...], str] = {}
    for version in versions:
        try:
            key = release_key(version)
        except ValueError:
            log.warning("left out %r: not a version graphbisect can order", version)
            continue
        if (pre or not is_prerelease(version)) and version in within:
            chosen.setdefault(key, version)
    return [chosen[key] for key in sorted(chosen)]


def index_versions(package: str, *, pre: bool = False, pip: Sequence[str] | None = None) -> list[str]:
    """The releases of ``package`` the configured package index has for this interpreter (as pip lists them:
    ``--json``, or, from a pip without it, its ``Available versions:`` line).

    Raises :class:`InputError` when pip cannot list them (no network, no such package, no pip)."""
    command = [*(pip or [sys.executable, "-m", "pip"]), "index", "versions", package, "--json",
               "--disable-pip-version-check", *(["--pre"] if pre else [])]
    proc = _pip(command, package)
    if proc.returncode != 0 and "no such option: --json" in proc.stderr:  # pip before --json: its text line
        proc = _pip([part for part in command if part != "--json"], package)
        listed = re.search(r"^Available versions:(.*)$", proc.stdout, re.M) if proc.returncode == 0 else None
        if listed is not None:
            return [v.strip() for v in listed.group(1).split(",") if v.strip()]
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")] or proc.stderr.splitlines()
        raise InputError(f"cannot list the releases of {package} from the package index: "
                         f"{' '.join(errors[-3:]).strip() or f'pip exited with {proc.returncode}'}", hint=_INDEX_HINT)
    try:
        listed = json.loads(proc.stdout)["versions"]
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"pip index versions {package} gave no list of versions: {proc.stdout[:200]!r}",
                         hint="check pip index versions PACKAGE --json by hand") from exc
    return [str(version) for version in listed]


def _pip(command: Sequence[str], package: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(command), capture_output=True, text=True, timeout=INDEX_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"cannot list the releases of {package}: {exc}", hint=_INDEX_HINT) from exc


_INDEX_HINT = ("check the network and pip's index (pip config list), or name the releases yourself with "
               "--versions A,B,C")
