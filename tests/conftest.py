"""Session-wide fixtures shared by test packages (expensive runs done once)."""

from __future__ import annotations

import compileall
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.triage_models import write_models


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core this process may use, at most 8 (each worker's tests start backend
    workers of their own: Paddle or OpenVINO ones take ~1 GB)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 8))


def pytest_configure(config: pytest.Config) -> None:
    """Compile graphbisect's modules to bytecode once, before any test, also where ``PYTHONDONTWRITEBYTECODE``
    is set (as on this project's machines): the tests start many backend workers, ``command:`` targets and other
    interpreters that import graphbisect, and without a ``.pyc`` each of them compiles it from source first
    (~0.15 s of a core each; on 2 cores the suite took 9 min 48 s without, 7 min 48 s with them and the
    order below: 3 min less CPU).
    The files go where Python puts them (``graphbisect/**/__pycache__``, ignored by git); on the controller
    only, before the workers start."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):
        import graphbisect

        compileall.compile_dir(Path(graphbisect.__file__).parent, quiet=1, workers=0)  # workers=0: every core


#: Seconds each test file took (setup, calls and teardowns), as last recorded: the order files are handed to
#: workers in. Rewrite it after a change that moves the figures: ``GRAPHBISECT_RECORD_DURATIONS=1 python -m pytest``.
FILE_DURATIONS = Path(__file__).with_name("file_durations.json")
_measured: defaultdict[str, float] = defaultdict(float)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _recorded() -> dict[str, float]:
    """:data:`FILE_DURATIONS` (empty when missing or unreadable)."""
    try:
        return {str(name): float(seconds) for name, seconds in json.loads(FILE_DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (their tests keep their order). A file's tests share a worker (``--dist
    loadfile``) and workers take the next file when they run dry, so a long file taken last leaves the other
    worker idle until it ends; longest first keeps the workers' ends close (xdist's own order is by the number
    of tests, which hands out the slow IREE and flaky-target files, with few tests each, last). A file not
    recorded yet counts as a median one."""
    recorded = _recorded()
    if not recorded:
        return
    default = statistics.median(recorded.values())
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(_file_of(item.nodeid), index)
    items.sort(key=lambda item: (-recorded.get(_file_of(item.nodeid), default), first[_file_of(item.nodeid)]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _measured[_file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``GRAPHBISECT_RECORD_DURATIONS=1``, record what each file took in :data:`FILE_DURATIONS` (on the
    controller, which sees every worker's reports; files that did not run keep their figure)."""
    if not os.environ.get("GRAPHBISECT_RECORD_DURATIONS") or hasattr(session.config, "workerinput") or not _measured:
        return
    recorded = {**_recorded(), **{name: round(seconds, 1) for name, seconds in _measured.items()}}
    FILE_DURATIONS.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n", encoding="utf-8")


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


@pytest.fixture(scope="session", autouse=True)
def _every_bundle_audited() -> Iterator[None]:
    """Every bundle ``reduce`` writes in this process is audited by the trusted checker (it always is); here its
    claims must hold, or be withdrawn or corrected by the bundle (``WITHDRAWN_CLAIMS``): a test whose bundle
    states a claim the checker finds false fails, whatever the test itself asserts."""
    import graphbisect.workflows.reduce as reduce_workflow

    checked = reduce_workflow._checked

    def audited(run, content):  # type: ignore[no-untyped-def]
        content = checked(run, content)
        false = [c for c in content.report["audit"]["claims"]
                 if c["holds"] is False and c["id"] not in reduce_workflow.WITHDRAWN_CLAIMS]
        assert not false, f"the bundle states claims the checker finds false: {false}"
        return content

    reduce_workflow._checked = audited  # type: ignore[assignment]
    yield
    reduce_workflow._checked = checked  # type: ignore[assignment]
