"""Issue 24, "a run's state is its own": no run uses state another run left behind (cases 4 to 6).

Each test failed on the code before the fix; real worker processes and files, no mocks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphbisect
from graphbisect.cli.main import main
from graphbisect.errors import GraphBisectError
from graphbisect.examples import host_network
from graphbisect.examples.bundled import example_inputs_path, example_model_path
from graphbisect.examples.flaky_target import script_path
from graphbisect.model import Model, load_model
from graphbisect.workflows.reduce import ReduceOptions, reduce_model, work_dir_for

EXAMPLE = [str(example_model_path()), "--inputs", str(example_inputs_path())]


# --- case 4: a stopped run's work folder is not the next run's -------------------------------------------
def test_case4_a_new_run_does_not_reduce_the_model_a_stopped_run_left(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    buggy = host_network(100, bug="layernorm_keepdims0", position="branch", seed=6)
    clean = host_network(100, seed=6)  # the same host without the bug: ONNX Runtime computes it right
    out = tmp_path / "bug"
    stopped = reduce_model(load_model(buggy.model), out, inputs=buggy.inputs, options=ReduceOptions(max_invocations=1))
    assert stopped.failed and work_dir_for(out).is_dir()
    shutil.rmtree(out)  # stopped before its bundle was written (Ctrl-C, kill): only bug.work is left
    model = tmp_path / "clean.onnx"
    model.write_bytes(clean.model.SerializeToString())
    capsys.readouterr()
    # It ran the target on the stopped run's bug.work/model.onnx and certified that model's bug (exit 1).
    assert main(["reduce", str(model), "-o", str(out), "--seed", "0"]) == 0
    captured = capsys.readouterr()
    assert "does not fail" in captured.out, captured.out
    assert "holds the state of another reduction" in captured.err and "starting afresh" in captured.err


def test_case4_a_work_folder_graphbisect_did_not_write_is_refused(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bug"
    mine = work_dir_for(out)
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    assert main(["reduce", "--example", "-o", str(out)]) == 2
    assert "graphbisect did not write (thesis.tex)" in capsys.readouterr().err
    assert (mine / "thesis.tex").read_text() == "mine"


# --- case 5: --workdir is locked, and must be new, empty or graphbisect's own ----------------------------
#: Holds the lock until the test has run the second compare: the test writes GB_TEST_RELEASE then (a fixed 4 s
#: sleep held it as long on every run; 60 s at most, so a test that fails first cannot leave it hanging).
_SLOW_TARGET = """import os, sys, time
deadline = time.monotonic() + 60
while not os.path.exists(os.environ["GB_TEST_RELEASE"]) and time.monotonic() < deadline:
    time.sleep(0.02)
from graphbisect.examples.flaky_target import main
sys.exit(main(sys.argv[1:]))
"""


def test_case5_a_second_compare_on_the_same_workdir_stops_at_once(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "slow_target.py"
    script.write_text(_SLOW_TARGET)
    workdir = tmp_path / "w"
    first = subprocess.Popen(
        [sys.executable, "-m", "graphbisect", "compare", *EXAMPLE, "--no-layerwise", "--workdir", str(workdir),
         "--target", f"command:cmd={sys.executable} {script} {{model}} {{inputs}} {{outputs}}"],
        env={**os.environ, "FLAKY_RATE": "0", "FLAKY_COUNTER": str(tmp_path / "counter"),
             "GB_TEST_RELEASE": str(tmp_path / "release")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (workdir / "lock").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # It used to run alongside and read the first run's values from the shared folder (wrong 2 of 3).
        assert main(["compare", *EXAMPLE, "--no-layerwise", "--workdir", str(workdir)]) == 2
        assert "in use by another process" in capsys.readouterr().err
    finally:
        (tmp_path / "release").touch()
        _, err = first.communicate(timeout=120)
    assert first.returncode == 1, err  # the first run was not disturbed: it finds the example's bug
    # and a later run may use the folder again: it is graphbisect's own now
    assert main(["compare", *EXAMPLE, "--no-layerwise", "--workdir", str(workdir)]) == 1


def test_case5_a_workdir_holding_the_users_files_is_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    mine = workdir / "model.onnx"  # another model of the user's, not the one compared
    mine.write_bytes(b"not overwritten")
    assert main(["compare", *EXAMPLE, "--no-layerwise", "--workdir", str(workdir)]) == 2
    said = capsys.readouterr().err
    assert "holds files graphbisect did not put there (model.onnx)" in said
    assert "hint: choose a new or empty folder for --workdir" in said  # the flag, on the command line
    assert mine.read_bytes() == b"not overwritten" and [p.name for p in workdir.iterdir()] == ["model.onnx"]
    # the same refusal in the Python API's words (it said "--workdir" to a caller of compare(workdir=...))
    with pytest.raises(GraphBisectError, match="holds files graphbisect did not put there") as refused:
        graphbisect.compare(example_model_path(), inputs=example_inputs_path(), layerwise=False, workdir=workdir)
    assert refused.value.hint is not None and refused.value.hint.startswith("choose a new or empty folder for workdir=")
    assert mine.read_bytes() == b"not overwritten"


# --- case 6: a crash is the baseline only after a majority of agreeing runs ----------------------------
def _three_nodes() -> Model:
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Neg", ["a"], ["b"], name="neg"),
             helper.make_node("Abs", ["b"], ["y"], name="abs")]
    graph = helper.make_graph(nodes, "three", [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])])
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


@pytest.mark.parametrize("seed", ["6", "23"])
def test_case6_two_crashes_by_chance_do_not_make_a_crash_flaky_no(seed: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # ONNX Runtime computes these 3 nodes right; the target crashes at random in 40 % of its runs. The seeds
    # make its first two runs crash (the n-th run's fault is drawn from (seed, n)); seed 6 keeps crashing
    # often, seed 23 passes most runs after those two.
    monkeypatch.setenv("FLAKY_MODE", "crash")
    monkeypatch.setenv("FLAKY_RATE", "0.4")
    monkeypatch.setenv("FLAKY_SEED", seed)
    monkeypatch.setenv("FLAKY_COUNTER", str(tmp_path / "counter"))
    target = f"command:cmd={sys.executable} {script_path()} {{model}} {{inputs}} {{outputs}}"
    # It took the two crashes as the baseline: seed 6 was certified "1-minimal, re-verified, flaky: no". Runs
    # that complete beside the crashes make the crash the target's flakiness (issue 36 item 10): these 3 nodes
    # compute right whenever the target completes, so there is no failure to reduce, and it is said, not exit 0.
    with pytest.raises(GraphBisectError, match="died in") as raised:
        reduce_model(_three_nodes(), tmp_path / "bug", inputs={"x": np.array([1, -2, 3, -4], np.float32)},
                     options=ReduceOptions(target=target))
    assert str(raised.value).startswith("flaky target:")
    assert not (tmp_path / "bug" / "model.onnx").exists()
