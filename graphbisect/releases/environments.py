"""One virtual environment per release, made once and cached: the interpreter a ``python=`` target runs.

An environment holds the release and what a graphbisect worker needs beside it, nothing else: it is keyed by the
package, the release and this interpreter's Python version (``openvino-2024.0.0-py3.11``), and its requirements
are a function of those (:data:`~graphbisect.releases.packages.PACKAGES`). It is built in a temporary folder
beside the cache and renamed into place with a ``ready`` marker, so a concurrent or interrupted run never sees
half an environment; a second run finds it and installs nothing. The layout is the one ``tests/ort_releases.py``
keeps, so the test suite's release environments can be shared (``cache=`` that folder).

**The installer.** uv where it is there (the ``uv`` package, which ``graphbisect[releases]`` installs, else a
``uv`` on ``PATH``), else this interpreter's pip (``pip --python ENV``: no pip in each environment); ``installer``
chooses. Measured here (benchmarks/README.md): one environment of ``onnxruntime==1.20.1 numpy<2`` takes pip
11.8 s and uv 1.3 s from an empty wheel cache. uv reads its own configuration (``UV_INDEX_URL``, ``uv.toml``), not
pip's: where pip is set to a private index, set uv's too or choose ``pip``. Either installs wheels only
(``--only-binary :all:``: a release without a wheel for this Python fails in seconds and is a skip, never a source
build), several at once (``jobs``), each with its own wheel cache shared by every environment.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import venv
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from graphbisect.errors import InputError
from graphbisect.releases.packages import Recipe, recipe_of

__all__ = ["INSTALLERS", "Environment", "cache_root", "environment_folder", "find_uv", "prepare_environments"]

log = logging.getLogger(__name__)

#: Seconds one release may take to install.
INSTALL_TIMEOUT = 900
#: ``auto``: uv where it is there (:func:`find_uv`), else pip.
INSTALLERS = ("auto", "uv", "pip")


@dataclass(frozen=True)
class Environment:
    """A release's interpreter. ``python`` None: this interpreter, which has the release installed.
    ``error``: why it cannot be made (then ``python`` is None and nothing runs). ``installed``: made by this call
    (else found in the cache), in ``seconds``, by ``installer`` (``uv`` or ``pip``; empty when nothing was
    installed)."""

    version: str
    python: Path | None
    installed: bool = False
    seconds: float = 0.0
    error: str | None = None
    installer: str = ""

    @property
    def usable(self) -> bool:
        return self.error is None

    @property
    def folder(self) -> Path | None:
        """The environment's folder (the one holding ``bin/``); None for this interpreter's release."""
        return None if self.python is None else self.python.parent.parent


def cache_root(cache: Path | str | None = None) -> Path:
    """``cache``, else ``$GRAPHBISECT_CACHE/releases``, else ``~/.cache/graphbisect/releases``."""
    if cache is not None:
        return Path(cache)
    base = os.environ.get("GRAPHBISECT_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "graphbisect") / "releases"


def environment_folder(root: Path, package: str, version: str) -> Path:
    """Where the environment of ``package==version`` for this Python lives under ``root``."""
    return root / f"{package}-{version}-py{sys.version_info.major}.{sys.version_info.minor}"


def _python_of(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _host_version(recipe: Recipe) -> str | None:
    """The release installed in this interpreter: every distribution of ``recipe`` at one version, else None."""
    try:
        found = {metadata.version(dist) for dist in recipe.distributions}
    except metadata.PackageNotFoundError:
        return None
    return found.pop() if len(found) == 1 else None


def find_uv() -> str | None:
    """uv's executable: the ``uv`` package's (``pip install 'graphbisect[releases]'``), else one on ``PATH``."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return shutil.which("uv")
    try:
        return str(find_uv_bin())
    except FileNotFoundError:
        return shutil.which("uv")


def prepare_environments(package: str | Recipe, versions: Sequence[str], *, cache: Path | str | None = None,
                         jobs: int = 2, use_host: bool = True, installer: str = "auto",
                         on_ready: Callable[[Environment], None] | None = None) -> dict[str, Environment]:
    """The environment of each release of ``package`` (a name in the table, or a :class:`Recipe`: any package's)
    in ``versions``, installing the missing ones, ``jobs`` at a time, with ``installer`` (:data:`INSTALLERS`). The
    release installed in this interpreter runs here (``use_host``): nothing to install. A release that cannot be
    installed gets an :class:`Environment` with its ``error`` (the installer's words), not an exception.
    ``on_ready`` is called as each one is ready (from worker threads, one call at a time). Raises
    :class:`InputError` for an unknown package or installer, or when no installer is there and something must be
    installed."""
    recipe = package if isinstance(package, Recipe) else recipe_of(package)
    package = recipe.package
    if installer not in INSTALLERS:
        raise InputError(f"installer {installer!r} is not one of {', '.join(INSTALLERS)}", hint="installer='uv'",
                         cli_hint="--installer uv")
    root = cache_root(cache)
    host = _host_version(recipe) if use_host else None
    missing = [v for v in versions if v != host and not (environment_folder(root, package, v) / "ready").exists()]
    tool = _Installer("pip")
    if missing:
        tool = _installer(installer)
        root.mkdir(parents=True, exist_ok=True)

    lock = threading.Lock()

    def one(version: str) -> Environment:
        found = Environment(version, None) if version == host else _environment(recipe, version, root, tool)
        if on_ready is not None:
            with lock:  # one call at a time: the caller prints
                on_ready(found)
        return found

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(zip(versions, pool.map(one, versions), strict=True))


@dataclass(frozen=True)
class _Installer:
    """uv (``executable`` its program) or this interpreter's pip (``executable`` None)."""

    name: str
    executable: str | None = None

    def command(self, python: Path, requirements: Sequence[str]) -> list[str]:
        """Install ``requirements`` into the environment of ``python``, wheels only."""
        if self.executable is not None:
            return [self.executable, "pip", "install", "--quiet", "--no-progress", "--python", str(python),
                    "--only-binary", ":all:", *requirements]
        return [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                "--disable-pip-version-check", "--no-input", "--only-binary", ":all:", *requirements]


def _installer(installer: str) -> _Installer:
    """The installer ``installer`` names (``auto``: uv where it is there, else pip)."""
    uv = find_uv() if installer in ("auto", "uv") else None
    if uv is not None:
        return _Installer("uv", uv)
    if installer == "uv":
        raise InputError("installer uv: there is no uv here (neither the uv package nor uv on PATH)",
                         hint="pip install 'graphbisect[releases]', or --installer pip")
    proc = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InputError(f"this interpreter ({sys.executable}) has neither uv nor pip to install releases with",
                         hint=f"pip install 'graphbisect[releases]' (uv), or {sys.executable} -m ensurepip")
    return _Installer("pip")


def _environment(recipe: Recipe, version: str, root: Path, tool: _Installer) -> Environment:
    folder = environment_folder(root, recipe.package, version)
    if (folder / "ready").exists():
        return Environment(version, _python_of(folder))
    name = tool.name
    start = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        venv.create(staging, with_pip=False, symlinks=os.name != "nt")
        requirements = recipe.requirements(version)
        try:
            proc = subprocess.run(tool.command(_python_of(staging), requirements), capture_output=True, text=True,
                                  timeout=INSTALL_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return Environment(version, None, error=f"{name} install {' '.join(requirements)} took more than "
                               f"{INSTALL_TIMEOUT} s", installer=name)
        if proc.returncode != 0:
            return Environment(version, None, seconds=time.monotonic() - start, installer=name,
                               error=f"cannot install {' '.join(requirements)}: {_install_error(proc.stderr)}")
        (staging / "ready").write_text(f"{folder.name}\n{' '.join(requirements)}\n{name}\n")
        try:
            staging.rename(folder)  # a venv's interpreter finds its site-packages relative to itself
        except OSError:
            if not (folder / "ready").exists():  # another run won the race only if it finished
                raise
        seconds = time.monotonic() - start
        log.info("installed %s in %.1f s with %s", folder.name, seconds, name)
        return Environment(version, _python_of(folder), installed=True, seconds=seconds, installer=name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _uv_lines(stderr: str) -> list[str]:
    """uv's ``error:`` and ``cause:`` lines, each with the lines uv wrapped it onto (it wraps at the terminal's
    width, ``COLUMNS``: "... a matching Python" / "ABI tag ...")."""
    found: list[str] = []
    wrapped = False
    for line in stderr.splitlines():
        text = line.strip()
        if text.startswith(("error:", "cause:")):
            found.append(text.removeprefix("error: ").removeprefix("cause: "))
            wrapped = True
        elif wrapped and text and line[:1].isspace():
            found[-1] += " " + text
        else:
            wrapped = False
    return found


def _install_error(stderr: str) -> str:
    """The installer's own error lines: pip's (``ERROR: No matching distribution found for ...``), uv's
    (``error: No solution found ...``, ``cause: Because ... has no wheels with a matching Python ABI tag``), else
    its last line."""
    lines = [re.sub(r" \(from versions: [^)]*\)", "", line.removeprefix("ERROR: ").strip())
             for line in stderr.splitlines() if line.startswith("ERROR")]
    lines = lines or _uv_lines(stderr)
    text = "; ".join(lines) or (stderr.strip().splitlines() or ["the installer failed"])[-1]
    return text[-500:]
