"""Other ONNX Runtime releases, each in its own virtual environment, for ``python=`` targets.

A ``python=`` worker needs only numpy and its backend library, so each environment holds exactly
``onnxruntime==VERSION`` and ``numpy<2`` (the older wheels are built against numpy 1). They are made once
and cached under ``$GRAPHBISECT_TEST_VENVS`` (default ``~/.cache/graphbisect/test-venvs``), keyed by the
release and this interpreter's version, built in a temporary folder and renamed into place (so a concurrent
or interrupted test run never sees half an environment). Creating them needs PyPI (or a local index):
CI installs from scratch; here a missing environment costs ~10-30 s per release, made in parallel.

Each release was checked to have the bugs the tests use (measured on CPU, Python 3.11):

* the keepdims=0 LayerNorm mis-fusion (onnxruntime#30513) by the level-1 LayerNorm fusion — registered as
  ``LayerNormFusion`` up to 1.17 and ``LayerNormFusionL1`` from 1.20 — and by ``SimplifiedLayerNormFusion``;
* the FuseReluClip rewrite rule (Level1_RuleBasedTransformer) failing session creation on a float64 Clip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import venv
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["LAYERNORM_FUSION", "ORT_RELEASES", "ORT_RUNNER", "TWO_DISTRIBUTIONS", "release_pythons",
           "two_distributions_python", "write_ort_runner"]

#: Releases under test -> the name of their level-1 LayerNorm fusion (the one onnxruntime#30513 is in).
LAYERNORM_FUSION: Mapping[str, str] = {
    "1.17.3": "LayerNormFusion",
    "1.20.1": "LayerNormFusionL1",
    "1.22.1": "LayerNormFusionL1",
}
ORT_RELEASES: tuple[str, ...] = tuple(LAYERNORM_FUSION)

#: Seconds one environment may take to install.
INSTALL_TIMEOUT = 600


def _root() -> Path:
    base = os.environ.get("GRAPHBISECT_TEST_VENVS")
    return Path(base) if base else Path.home() / ".cache" / "graphbisect" / "test-venvs"


def _python_of(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _make(version: str) -> Path:
    """The interpreter of the cached environment for ``version`` (created when missing)."""
    return _environment(f"onnxruntime-{version}", [[f"onnxruntime=={version}", "numpy<2"]])


#: The environment of :func:`two_distributions_python`: onnxruntime, then onnxruntime-gpu over it (the CPU and
#: GPU wheels share the ``onnxruntime`` package folder; the one installed last owns the files).
TWO_DISTRIBUTIONS = {"onnxruntime": "1.30.0", "onnxruntime-gpu": "1.31.1"}


def two_distributions_python() -> Path:
    """An interpreter with both ``onnxruntime`` 1.30.0 and ``onnxruntime-gpu`` 1.31.1 installed, the GPU wheel
    last, as users end up with them (issue 23): ``import onnxruntime`` gives 1.31.1 while the ``onnxruntime``
    distribution's metadata says 1.30.0. The GPU wheel (~250 MB, no CUDA libraries: its CUDA provider cannot be
    created here) comes from PyPI; made once and cached like the release environments."""
    cpu, gpu = (f"{name}=={version}" for name, version in TWO_DISTRIBUTIONS.items())
    offline_fast = ["--retries", "1", "--timeout", "30"]  # no network: skip in seconds, not minutes
    return _environment(f"{cpu}+{gpu}".replace("==", "-"), [[*offline_fast, cpu], [*offline_fast, "--no-deps", gpu]])


def _environment(name: str, installs: list[list[str]]) -> Path:
    """The interpreter of the cached environment ``name``, made with one ``pip install`` per entry of
    ``installs`` in order (created when missing)."""
    root = _root()
    folder = root / f"{name}-py{sys.version_info.major}.{sys.version_info.minor}"
    if (folder / "ready").exists():
        return _python_of(folder)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        venv.create(staging, with_pip=False, symlinks=os.name != "nt")
        # This interpreter's pip installs into the new environment: no pip bootstrap per environment.
        for requirements in installs:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "--python", str(_python_of(staging)), "install", "--quiet",
                 "--disable-pip-version-check", "--no-input", *requirements],
                capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"pip could not install {' '.join(requirements)}: {proc.stderr.strip()[-2000:]}")
        (staging / "ready").write_text(name + "\n")
        try:
            staging.rename(folder)  # a venv's interpreter finds its site-packages relative to itself
        except OSError:
            if not (folder / "ready").exists():  # another run won the race only if it finished
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _python_of(folder)


def release_pythons(versions: tuple[str, ...] = ORT_RELEASES) -> dict[str, Path]:
    """Each release's interpreter, making the missing environments in parallel."""
    with ThreadPoolExecutor(max_workers=len(versions)) as pool:
        return dict(zip(versions, pool.map(_make, versions), strict=True))


#: A user's own program for a ``command:`` target: runs the model with whatever ``onnxruntime`` its interpreter
#: imports (every optimization, as ``onnxruntime:opt_level=all``), and says on stderr which one that was.
ORT_RUNNER = """\
import sys

import numpy as np
import onnxruntime as ort

model, inputs, outputs = sys.argv[1:4]
sys.stderr.write(f"run.py: onnxruntime {ort.__version__} under {sys.executable}\\n")
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
with np.load(inputs) as feeds:
    values = session.run(None, {name: feeds[name] for name in feeds.files})
np.savez(outputs, **{out.name: value for out, value in zip(session.get_outputs(), values)})
"""


def write_ort_runner(folder: Path) -> Path:
    """:data:`ORT_RUNNER` written as ``folder/run.py``."""
    path = folder / "run.py"
    path.write_text(ORT_RUNNER)
    return path
