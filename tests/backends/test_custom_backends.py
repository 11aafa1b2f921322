"""Custom backends: a runtime class from another distribution (entry point) or registered at run time
gets isolated workers, specs and every command, like the built-in ones."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

import graphbisect
from graphbisect.backends import BackendProcess, Capability, resolve
from graphbisect.backends.registry import all_backends
from graphbisect.errors import SpecError
from graphbisect.examples.patterns import pattern_model

# A compiler team's runtime: ONNX Runtime at a chosen optimization level, written against the Runtime
# protocol only (no graphbisect import), the way a plug-in distribution would ship it.
RUNTIME = '''
"""A plug-in runtime for graphbisect."""

from __future__ import annotations

LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class TeamRuntime:
    """ONNX Runtime at a chosen optimization level, as a team's own plug-in."""

    capabilities = ("onnx-input", "intermediates")
    options = {"level": "graph optimization level: basic|extended|all (default all)"}
    inert_options = {"level": "any"}  # no value of it runs a program or writes a file: a bundle needs no --trust

    def __init__(self, options, workdir):
        self.level = options.get("level", "all")
        if self.level not in LEVELS:
            raise ValueError(f"level={self.level!r} is not one of {sorted(LEVELS)}")
        self.session = None
        self.outputs = None

    def load(self, model, outputs):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[self.level])
        self.session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        self.outputs = list(outputs) if outputs else [o.name for o in self.session.get_outputs()]

    def run(self, inputs):
        return dict(zip(self.outputs, self.session.run(self.outputs, dict(inputs))))

    def info(self):
        import onnxruntime as ort

        return {"library": "onnxruntime", "library_version": ort.__version__, "level": self.level}
'''


@pytest.fixture
def plugin_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installed distribution ``team-backend`` (a package + a dist-info with an entry point) on sys.path."""
    site = tmp_path / "site"
    (site / "team_backend").mkdir(parents=True)
    (site / "team_backend" / "__init__.py").write_text(RUNTIME)
    info = site / "team_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: team-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""
        [graphbisect.backends]
        team = team_backend:TeamRuntime
    """))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield site


def test_an_entry_point_backend_joins_the_table(plugin_dist: Path) -> None:
    _, info = resolve("team:level=basic")
    assert info.name == "team" and info.runtime == "team_backend:TeamRuntime"
    assert info.inert_options == {"level": "any"}  # its declared allow-list of the trust rule
    assert info.capabilities == frozenset({Capability.ONNX_INPUT, Capability.INTERMEDIATES})
    assert info.path == (str(plugin_dist),)  # how the worker, started elsewhere, finds the module
    assert "team" in [row.name for row in all_backends()]
    with pytest.raises(SpecError, match="no option 'opt_level'"):
        resolve("team:opt_level=all")  # its documented options are validated like a built-in's


def test_an_entry_point_backend_runs_reduce_end_to_end(plugin_dist: Path, tmp_path: Path) -> None:
    """The ORT keepdims=0 LayerNorm bug, found through the plug-in: reduced, verified in fresh workers, bundled."""
    result = graphbisect.reduce(pattern_model("layernorm_keepdims0"), tmp_path / "bug", target="team:level=all")
    assert result.failed and result.one_minimal and result.verified
    assert result.final_nodes < result.original_nodes
    assert result.invocations["target"] >= 3
    report = (tmp_path / "bug" / "report.json").read_text()
    assert "team:level=all" in report
    assert graphbisect.verify(tmp_path / "bug").outcome == "reproduces"
    # repro.py has no section for a plug-in: it says to verify with the distribution that declares it installed
    config = json.loads((tmp_path / "bug" / "repro_config.json").read_text())
    recorded = {k: v for k, v in config["custom_backend"].items() if k != "path"}  # the module's folder: where found
    assert recorded == {"name": "team", "runtime": "team_backend:TeamRuntime", "registered": "entry point",
                        "entry_point": "team = team_backend:TeamRuntime", "distribution": "team-backend"}
    said = subprocess.run([sys.executable, str(tmp_path / "bug" / "repro.py")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert said.returncode == 2 and "install the distribution that declares it ('team-backend'" in said.stderr
    assert f"then: graphbisect verify {tmp_path / 'bug'}" in said.stderr
    # The plug-in describes nothing it compiled: the bundle's failure is matched by kind, so its passing on
    # level=basic does not show the model fixed — and it is not: the model still fails there (LayerNormFusion
    # runs at basic; the bundle, matched by kind, passes there). Before, verify said "fixed".
    assert graphbisect.verify(tmp_path / "bug", target="team:level=basic").outcome == "fixed-reduced"
    onnx.save(pattern_model("layernorm_keepdims0"), tmp_path / "original.onnx")
    rechecked = graphbisect.verify(tmp_path / "bug", target="team:level=basic", model=tmp_path / "original.onnx")
    assert rechecked.original is not None and rechecked.original["failed"]
    assert graphbisect.verify(tmp_path / "bug", target="onnxruntime:opt_level=disable",
                              model=tmp_path / "original.onnx").outcome == "fixed"


def test_a_broken_runtime_option_is_reported_by_the_worker(plugin_dist: Path, tmp_path: Path) -> None:
    with BackendProcess("team:level=max", workdir=tmp_path) as proc, pytest.raises(graphbisect.GraphBisectError,
                                                                                  match="level='max'"):
        proc.validate()


def test_register_backend_at_run_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A class registered in this process is imported by module path in the worker."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "my_runtime.py").write_text(RUNTIME)
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    module = importlib.import_module("my_runtime")
    info = graphbisect.register_backend(module.TeamRuntime, name="mine")
    try:
        assert info.runtime == "my_runtime:TeamRuntime"
        with pytest.raises(SpecError, match="taken by a built-in"):
            graphbisect.register_backend(module.TeamRuntime, name="ort")
        found = graphbisect.compare(pattern_model("layernorm_keepdims0"), target="mine", layerwise=False)
        assert not found.passed  # the real ORT bug, through the registered class
        assert found.target_run.info["level"] == "all"
    finally:
        graphbisect.unregister_backend("mine")
    with pytest.raises(SpecError, match="unknown backend 'mine'"):
        resolve("mine")


def test_a_bundle_of_a_backend_registered_by_a_script_says_how_to_register_it(tmp_path: Path) -> None:
    """A backend a script registers is known to that script's processes only: its bundle's repro.py told the
    maintainer to run `graphbisect verify BUNDLE`, which exited 2 "unknown backend" (issue 35, case 6). repro.py
    and verify now name the class the bundle recorded and print the command that registers it and verifies; that
    command reproduces the failure."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "my_runtime.py").write_text(RUNTIME)
    script = tmp_path / "make_bundle.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path / "mod")!r})
        import graphbisect, my_runtime
        from graphbisect.examples.patterns import pattern_model
        graphbisect.register_backend(my_runtime.TeamRuntime, name="mine")
        result = graphbisect.reduce(pattern_model("layernorm_keepdims0"), {str(tmp_path / "bug")!r}, target="mine")
        sys.exit(0 if result.failed else 3)
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    made = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, check=False,
                          env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    bundle = tmp_path / "bug"
    config = json.loads((bundle / "repro_config.json").read_text())
    assert config["custom_backend"]["registered"] == "register_backend"
    assert config["custom_backend"]["runtime"] == "my_runtime:TeamRuntime"
    said = subprocess.run([sys.executable, str(bundle / "repro.py")], capture_output=True, text=True, timeout=60,
                          check=False, env=env)
    assert said.returncode == 2 and "registered at run time" in said.stderr and "my_runtime:TeamRuntime" in said.stderr
    verified = subprocess.run([sys.executable, "-m", "graphbisect", "verify", str(bundle)], capture_output=True,
                              text=True, timeout=120, check=False, env=env, cwd=tmp_path)
    assert verified.returncode == 2 and "unknown backend 'mine'" in verified.stderr
    (command,) = [line.strip() for line in verified.stderr.splitlines() if line.strip().startswith("python -c")]
    assert command in said.stderr  # repro.py and verify say the same
    argv = shlex.split(command)
    assert argv[-1] == str(bundle)
    rerun = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=300, check=False,
                           env=env, cwd=tmp_path)
    assert rerun.returncode == 1 and "REPRODUCES" in rerun.stdout, rerun.stdout + rerun.stderr
