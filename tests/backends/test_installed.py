"""Which onnxruntime imports when two onnxruntime distributions are installed (issue 23, item 6).

``onnxruntime`` and ``onnxruntime-gpu`` install the same package folder; the one installed last owns its files
and both keep their metadata. ``graphbisect backends`` printed the first distribution's metadata version (the
CPU wheel's 1.30.0) where ``import onnxruntime`` — and every worker — gave onnxruntime-gpu 1.31.1. The
environment here is real: a throwaway venv with both wheels installed, the GPU one last
(``two_distributions_python``, tests/ort_releases.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import graphbisect
from graphbisect.artifacts import environment
from graphbisect.artifacts.environment import backend_facts, collect_environment, environment_summary
from graphbisect.backends import BackendProcess
from graphbisect.backends.installed import measure
from graphbisect.cli.main import main
from graphbisect.errors import BackendUnavailableError


def test_backends_reports_the_onnxruntime_that_imports(two_distributions_python: Path, models: dict[str, Path],
                                                       x23: np.ndarray, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    python = str(two_distributions_python)
    assert main(["backends", "--json", "--python", python]) == 0
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)["backends"]}["onnxruntime"]
    assert (row["version"], row["distribution"]) == ("1.31.1", "onnxruntime-gpu")
    assert Path(row["location"]).name == "onnxruntime"
    assert {(i["name"], i["version"], i["state"]) for i in row["installed"]} == {
        ("onnxruntime-gpu", "1.31.1", "imported"), ("onnxruntime", "1.30.0", "overwritten")}
    assert "2 distributions install onnxruntime" in row["note"] and "loads onnxruntime-gpu 1.31.1" in row["note"]
    assert "onnxruntime 1.30.0: its files in the same folder were overwritten" in row["note"]

    assert main(["backends", "--python", python]) == 0
    text = capsys.readouterr().out
    assert "onnxruntime    yes  1.31.1 (onnxruntime-gpu, " in text and "note: 2 distributions" in text

    # What the workers measure (ran_with), and so environment.json and report.md, agree with `backends`.
    with BackendProcess(f"onnxruntime:python={python}", workdir=tmp_path) as process:
        result = process.run(models["relu_add"], {"x": x23})
    assert result.ok, result.describe()
    assert result.ran_with["library_version"] == "1.31.1"
    assert result.ran_with["library_path"] == row["location"]
    env = collect_environment({"target": backend_facts(process.spec, result.ran_with)})
    assert env["backends"]["target"]["library_version"] == "1.31.1"
    assert dict(environment_summary(env))["target ran"].startswith("onnxruntime 1.31.1 (Python ")

    # graphbisect itself in that interpreter: environment.json's packages list both versions, and say which
    # one imports (environment.py alone: the venv has numpy and onnxruntime, not onnx).
    proc = subprocess.run([python, "-c", ENVIRONMENT_THERE, str(Path(environment.__file__))],
                          env={**os.environ, "PYTHONPATH": str(Path(graphbisect.__file__).parents[1])},
                          capture_output=True, text=True, timeout=120, check=True)
    there = json.loads(proc.stdout.splitlines()[-1])
    assert there["packages"]["onnxruntime"] == "1.30.0" and there["packages"]["onnxruntime-gpu"] == "1.31.1"
    assert "`import onnxruntime` loads onnxruntime-gpu 1.31.1" in there["shared_installs"]["onnxruntime"]
    assert there["summary"]["onnxruntime"] == there["shared_installs"]["onnxruntime"]  # a report.md row


ENVIRONMENT_THERE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("environment_there", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
env = module.collect_environment()
print(json.dumps({**env, "summary": dict(module.environment_summary(env))}))
"""


def test_a_provider_ort_cannot_create_is_refused_not_run_on_the_cpu(two_distributions_python: Path,
                                                                    models: dict[str, Path], x23: np.ndarray,
                                                                    tmp_path: Path) -> None:
    """onnxruntime-gpu lists CUDAExecutionProvider on a machine without CUDA's libraries; a session asking for it
    logs a warning and carries on on the CPU provider alone. graphbisect refuses, with ORT's reason."""
    spec = f"onnxruntime:python={two_distributions_python},providers=CUDAExecutionProvider"
    with BackendProcess(spec, workdir=tmp_path) as process, pytest.raises(BackendUnavailableError) as err:
        process.run(models["relu_add"], {"x": x23})
    assert "could not create CUDAExecutionProvider" in err.value.message
    assert "fell back to CPUExecutionProvider" in err.value.message
    assert "Failed to" in err.value.message  # ORT's own words: which library it could not load


def test_a_single_distribution_is_named_without_a_note() -> None:
    import onnxruntime

    facts = measure("onnxruntime")
    assert facts["version"] == onnxruntime.__version__
    assert facts["distribution"] == "onnxruntime" and facts["note"] is None
    assert facts["location"] == str(Path(onnxruntime.__file__).parent)
