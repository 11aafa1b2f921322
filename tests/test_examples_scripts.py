"""Every script in examples/ runs on CPU with its demo model and does what its docstring says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import onnx
import pytest

from graphbisect.examples.patterns import pattern_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def test_every_example_is_listed_and_tested() -> None:
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    listed = (EXAMPLES / "README.md").read_text()
    tested = Path(__file__).read_text()
    assert scripts and all(f"({name})" in listed and f'"{name}"' in tested for name in scripts)


def test_reduce_in_ci(tmp_path: Path) -> None:
    model = tmp_path / "ln.onnx"
    onnx.save(pattern_model("layernorm_keepdims0"), model)
    proc = _run("reduce_in_ci.py", str(model), "-o", "bug-report", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    with zipfile.ZipFile(tmp_path / "bug-report.zip") as archive:
        names = archive.namelist()
    assert any(n.endswith("repro_min.py") for n in names) and any(n.endswith("report.md") for n in names)
    healthy = tmp_path / "ok.onnx"
    onnx.save(pattern_model("layernorm_keepdims1"), healthy)
    assert _run("reduce_in_ci.py", str(healthy), cwd=tmp_path).returncode == 0


def test_custom_backend(tmp_path: Path) -> None:
    proc = _run("custom_backend.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "FAIL" in proc.stdout and "verify: reproduces" in proc.stdout
    report = json.loads((tmp_path / "teamrt-bug" / "report.json").read_text())
    assert report["target"] == "teamrt:level=all"


def test_culprit_pass(tmp_path: Path) -> None:
    proc = _run("culprit_pass.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "culprits (disable these): " in proc.stdout and "LayerNorm" in proc.stdout
    assert (tmp_path / "culprit-pass-bug" / "repro.py").exists()


@pytest.mark.slow
def test_keep_fp32(tmp_path: Path) -> None:
    proc = _run("keep_fp32.py", "--modes", "fp16,int8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads((tmp_path / "fp32-sets" / "keep_fp32.json").read_text())
    assert set(answers["fp16"]) == {"block3/conv1", "block3/relu1", "block3/conv2"}
    assert {"block3/conv1", "block3/conv2"} <= set(answers["int8"])
    assert (tmp_path / "fp32-sets" / "fp16" / "overrides.json").exists()


@pytest.mark.slow
def test_triage_folder(tmp_path: Path) -> None:
    proc = _run("triage_folder.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "4 models: 3 failing, 2 distinct bugs" in proc.stdout
    assert (tmp_path / "triage-out" / "summary.md").exists()
