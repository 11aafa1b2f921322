"""Session-wide fixtures shared by test packages (expensive runs done once)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.triage_models import write_models


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core this process may use, at most 8 (each worker's tests start backend
    workers of their own: Paddle or OpenVINO ones take ~1 GB)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 8))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep caches (ORT optimizer catalogue, paddle2onnx conversions) out of the user's ~/.cache.

    Worker processes inherit the environment, so they use the same folder.
    """
    old = os.environ.get("GRAPHBISECT_CACHE")
    os.environ["GRAPHBISECT_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("GRAPHBISECT_CACHE", None)
    else:
        os.environ["GRAPHBISECT_CACHE"] = old


@pytest.fixture(scope="session")
def triage_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of 4 host networks (2 LayerNorm bugs, 1 FuseReluClip crash, 1 healthy) and a broken file."""
    return write_models(tmp_path_factory.mktemp("triage-in"))


@pytest.fixture(scope="session")
def local_triage(triage_input: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The triage of :func:`triage_input` with the local executor (2 worker processes)."""
    from graphbisect.workflows.triage import triage

    return triage(triage_input, tmp_path_factory.mktemp("triage-out"), executor="local", jobs=2)


@pytest.fixture(scope="session")
def ort_release_pythons() -> dict[str, Path]:
    """Interpreters of other ONNX Runtime releases (see tests/ort_releases.py), made once and cached."""
    from tests.ort_releases import release_pythons

    try:
        return release_pythons()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot make the ONNX Runtime release environments: {exc}")


@pytest.fixture(scope="session")
def two_distributions_python() -> Path:
    """An interpreter with onnxruntime 1.30.0 and onnxruntime-gpu 1.31.1 both installed (see tests/ort_releases.py),
    made once and cached; skipped where PyPI cannot be reached."""
    from tests.ort_releases import two_distributions_python

    try:
        return two_distributions_python()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot make the environment with two onnxruntime distributions: {exc}")
