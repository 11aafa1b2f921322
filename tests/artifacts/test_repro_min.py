"""repro_min.py, ONNX text, the spec's word and the facts in report.md, on real ONNX Runtime bugs.

repro_min.py runs in a fresh virtual environment holding only numpy, onnx, onnxruntime and what they
depend on (linked from this interpreter's installation: no network, and nothing of graphbisect).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import graphbisect
from graphbisect.examples.patterns import pattern_model

ONLY = ("numpy", "onnx", "onnxruntime")


def _closure(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        dist = importlib.metadata.distribution(name)
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _linked_venv(root: Path, only: tuple[str, ...]) -> Path:
    """A venv at ``root`` holding only the distributions ``only`` and their dependencies, linked from this
    interpreter's install (no network); its python."""
    python = root / "bin" / "python"
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(root)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([str(python), "-c", where], text=True).strip())
    for dist in _closure(only):
        base = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if top != "__pycache__" and not (site / top).exists() and (base / top).exists():
                (site / top).symlink_to(base / top)
    return python


@pytest.fixture(scope="session")
def minimal_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with only numpy, onnx, onnxruntime and their dependencies, linked from this interpreter's install.

    Made afresh for each test session: its links point into the current environment, so a venv kept from an
    earlier session could point into one that has since been deleted (a CI clone's venv) and lack numpy.
    """
    return _linked_venv(tmp_path_factory.mktemp("minimal-venv"), ONLY)


@pytest.fixture(scope="session")
def numpy_only_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with numpy alone: neither onnx nor the backend's library."""
    return _linked_venv(tmp_path_factory.mktemp("numpy-venv"), ("numpy",))


def _run(python: Path, script: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(python), str(script)], capture_output=True, text=True, env=env, cwd=script.parent,
                          timeout=300, check=False)


def test_the_fresh_venv_has_only_the_backend(minimal_python: Path) -> None:
    probe = "import numpy, onnx, onnxruntime\ntry:\n    import graphbisect\nexcept ImportError:\n    print('isolated')"
    out = subprocess.run([str(minimal_python), "-c", probe], capture_output=True, text=True, cwd="/",
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, check=True)
    assert out.stdout.strip() == "isolated"


@pytest.fixture(scope="module")
def mismatch_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mismatch") / "bug"
    graphbisect.reduce(pattern_model("layernorm_keepdims0"), out)
    return out


@pytest.fixture(scope="module")
def crash_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("crash") / "bug"
    graphbisect.reduce(pattern_model("relu_clip_f64"), out)
    return out


def test_repro_min_reproduces_the_mismatch_and_passes_once_fixed(mismatch_bundle: Path, minimal_python: Path,
                                                                 tmp_path: Path) -> None:
    script = mismatch_bundle / "repro_min.py"
    text = script.read_text()
    assert 20 <= len(text.splitlines()) <= 60
    assert "keepdims=0" in text and "helper.make_node('ReduceMean'" in text
    proc = _run(minimal_python, script)
    assert proc.returncode == 1 and "AssertionError" in proc.stderr, proc.stderr[-2000:]
    # The same script with the target at the oracle's level: what it prints once ORT is fixed.
    fixed = tmp_path / "fixed.py"
    fixed.write_text(text.replace("ORT_ENABLE_ALL", "ORT_DISABLE_ALL"))
    proc = _run(minimal_python, fixed)
    assert proc.returncode == 0 and "the bug is fixed" in proc.stdout, proc.stderr[-2000:]


def test_repro_min_reproduces_the_crash(crash_bundle: Path, minimal_python: Path) -> None:
    proc = _run(minimal_python, crash_bundle / "repro_min.py")
    assert proc.returncode == 1
    assert "Unexpected data type for Clip 'min' input of 11" in proc.stderr


def test_report_shows_the_graph_the_spec_and_the_facts(mismatch_bundle: Path) -> None:
    report = (mismatch_bundle / "report.md").read_text()
    assert "ReduceMean <axes: ints = [-1], keepdims: int = 0>" in report  # the attribute behind the bug
    assert "compiled as LayerNormalization made by LayerNormFusion" in report  # what ORT compiled it into
    assert "agrees with the oracle and not with the target" in report
    assert re.search(r"Lowest failing level: `opt_level=(basic|extended)`", report)
    assert "## Command line" in report
    facts = json.loads((mismatch_bundle / "report.json").read_text())
    assert facts["spec_check"]["verdict"] == "oracle"
    assert facts["optimization_levels"]["levels"]["disable"] == "passes"
    assert facts["repro_min"]["written"] is True
    assert facts["report_runs"]["reference"] == 1
    from graphbisect.workflows.maintainer import command_line

    # the process that wrote it: this test run (pytest, or the `python -c` of a pytest-xdist worker)
    assert facts["command_line"] == command_line() and facts["command_line"].startswith("python")


def test_a_crash_bundle_says_crashes_and_keeps_the_whole_message(crash_bundle: Path) -> None:
    report = (crash_bundle / "report.md").read_text()
    assert "crashes on `model.onnx`" in report and "disagrees" not in report.split("\n\n")[1]
    assert "relu_clip_fusion.cc" in report and "Unexpected data type for Clip 'min' input of 11" in report
    assert not (crash_bundle / "target_outputs.npz").exists()
    facts = json.loads((crash_bundle / "report.json").read_text())
    assert facts["spec_check"]["verdict"] == "spec-runs-it"


def _statuses(bundle: Path, python: Path) -> tuple[int, int]:
    """(repro_min.py's exit status, repro.py's) under ``python``."""
    return _run(python, bundle / "repro_min.py").returncode, _run(python, bundle / "repro.py").returncode


@pytest.mark.parametrize("case", ["mismatch", "crash"])
def test_repro_min_and_repro_share_one_exit_status_contract(case: str, request: pytest.FixtureRequest,
                                                           minimal_python: Path, numpy_only_python: Path) -> None:
    """0 fixed, 1 reproduces, 2 cannot run. Without onnx, repro_min.py's ModuleNotFoundError exited 1: "the bug
    reproduces" on a machine where nothing was tested; repro.py said 2."""
    bundle: Path = request.getfixturevalue(f"{case}_bundle")
    assert _statuses(bundle, numpy_only_python) == (2, 2)
    missing = _run(numpy_only_python, bundle / "repro_min.py")
    assert "repro_min.py cannot run here: ModuleNotFoundError: No module named 'onnx'" in missing.stderr
    assert _statuses(bundle, minimal_python) == (1, 1)


def test_repro_min_says_cannot_run_when_the_oracle_fails(mismatch_bundle: Path, minimal_python: Path,
                                                         tmp_path: Path) -> None:
    """Without the oracle's values nothing is compared: exit 2, not a reproduction (here its run lacks the
    model's input)."""
    text = (mismatch_bundle / "repro_min.py").read_text()
    oracle = text.index("def run_oracle")
    broken = tmp_path / "oracle_fails.py"
    broken.write_text(text[:oracle] + text[oracle:].replace("sess.run(None, feeds)", "sess.run(None, {})", 1))
    proc = _run(minimal_python, broken)
    assert proc.returncode == 2 and "cannot run here: the oracle failed" in proc.stderr, proc.stderr[-2000:]
