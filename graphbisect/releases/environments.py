"""One virtual environment per release, made once and cached: the interpreter a ``python=`` target runs.

An environment holds the release and what a graphbisect worker needs beside it (numpy), nothing else: it is
keyed by the package, the release and this interpreter's Python version (``onnxruntime-1.20.1-py3.11``), and its
requirements are a function of those (:data:`PACKAGES`). It is built in a temporary folder beside the cache and
renamed into place with a ``ready`` marker, so a concurrent or interrupted run never sees half an environment;
a second run finds it and installs nothing. The layout is the one ``tests/ort_releases.py`` keeps, so the test
suite's release environments can be shared (``cache=`` that folder).

``numpy<2`` in every environment of a Python that has numpy 1 wheels (< 3.13): ONNX Runtime releases before
1.19 were built against numpy 1, and one numpy for every release of a range leaves the release the only thing
that changes between two runs. Installs use this interpreter's pip (``pip --python ENV``: no pip in each
environment), wheels only (``--only-binary :all:``: a release without a wheel for this Python fails in seconds
and is a skip, never a source build), several at once (``jobs``).
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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from graphbisect.errors import InputError

__all__ = ["PACKAGES", "Environment", "Recipe", "cache_root", "environment_folder", "prepare_environments"]

log = logging.getLogger(__name__)

#: Seconds one release may take to install.
INSTALL_TIMEOUT = 900


@dataclass(frozen=True)
class Recipe:
    """How to install a release of ``package``, and which backends (spec names) it provides."""

    package: str
    backends: tuple[str, ...]
    #: what beside the release a worker needs, for this Python
    extras: tuple[str, ...] = ()

    def requirements(self, version: str) -> list[str]:
        """The pip requirements of the environment of ``version``."""
        return [f"{self.package}=={version}", *self.extras]


_NUMPY = ("numpy<2",) if sys.version_info < (3, 13) else ("numpy",)

#: The packages ``graphbisect releases`` can install, by name. Others are not built yet.
PACKAGES: Mapping[str, Recipe] = {
    "onnxruntime": Recipe("onnxruntime", ("onnxruntime",), _NUMPY),
}


@dataclass(frozen=True)
class Environment:
    """A release's interpreter. ``python`` None: this interpreter, which has the release installed.
    ``error``: why it cannot be made (then ``python`` is None and nothing runs). ``installed``: made by this call
    (else found in the cache), in ``seconds``."""

    version: str
    python: Path | None
    installed: bool = False
    seconds: float = 0.0
    error: str | None = None

    @property
    def usable(self) -> bool:
        return self.error is None


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


def _host_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def prepare_environments(package: str, versions: Sequence[str], *, cache: Path | str | None = None, jobs: int = 2,
                         use_host: bool = True,
                         on_ready: Callable[[Environment], None] | None = None) -> dict[str, Environment]:
    """The environment of each release of ``package`` in ``versions``, installing the missing ones, ``jobs`` at
    a time. The release installed in this interpreter runs here (``use_host``): nothing to install. A release
    that cannot be installed gets an :class:`Environment` with its ``error`` (pip's words), not an exception.
    ``on_ready`` is called as each one is ready (from worker threads, one call at a time)."""
    recipe = recipe_of(package)
    root = cache_root(cache)
    host = _host_version(package) if use_host else None
    missing = [v for v in versions if v != host and not (environment_folder(root, package, v) / "ready").exists()]
    if missing:
        _require_pip()
        root.mkdir(parents=True, exist_ok=True)

    lock = threading.Lock()

    def one(version: str) -> Environment:
        found = Environment(version, None) if version == host else _environment(recipe, version, root)
        if on_ready is not None:
            with lock:  # one call at a time: the caller prints
                on_ready(found)
        return found

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(zip(versions, pool.map(one, versions), strict=True))


def recipe_of(package: str) -> Recipe:
    """The :class:`Recipe` of ``package``; :class:`InputError` for one not built yet."""
    try:
        return PACKAGES[package]
    except KeyError:
        raise InputError(f"graphbisect releases cannot install {package!r} yet (it can: {', '.join(PACKAGES)})",
                         hint="openvino, onnxruntime-gpu, iree and paddlepaddle are not built yet") from None


def _require_pip() -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InputError(f"this interpreter ({sys.executable}) has no pip to install releases with",
                         hint=f"{sys.executable} -m ensurepip, or install pip into its environment")


def _environment(recipe: Recipe, version: str, root: Path) -> Environment:
    folder = environment_folder(root, recipe.package, version)
    if (folder / "ready").exists():
        return Environment(version, _python_of(folder))
    start = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        venv.create(staging, with_pip=False, symlinks=os.name != "nt")
        requirements = recipe.requirements(version)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "--python", str(_python_of(staging)), "install", "--quiet",
                 "--disable-pip-version-check", "--no-input", "--only-binary", ":all:", *requirements],
                capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return Environment(version, None, error=f"pip install {' '.join(requirements)} took more than "
                               f"{INSTALL_TIMEOUT} s")
        if proc.returncode != 0:
            return Environment(version, None, seconds=time.monotonic() - start,
                               error=f"cannot install {' '.join(requirements)}: {_pip_error(proc.stderr)}")
        (staging / "ready").write_text(f"{folder.name}\n{' '.join(requirements)}\n")
        try:
            staging.rename(folder)  # a venv's interpreter finds its site-packages relative to itself
        except OSError:
            if not (folder / "ready").exists():  # another run won the race only if it finished
                raise
        seconds = time.monotonic() - start
        log.info("installed %s in %.0f s", folder.name, seconds)
        return Environment(version, _python_of(folder), installed=True, seconds=seconds)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _pip_error(stderr: str) -> str:
    """pip's own error lines (``ERROR: No matching distribution found for ...``), else its last line."""
    lines = [re.sub(r" \(from versions: [^)]*\)", "", line.removeprefix("ERROR: ").strip())
             for line in stderr.splitlines() if line.startswith("ERROR")]
    text = "; ".join(lines) or (stderr.strip().splitlines() or ["pip failed"])[-1]
    return text[-500:]
