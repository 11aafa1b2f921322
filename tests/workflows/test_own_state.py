"""Issue 24, "a run's state is its own": no run uses state another run left behind (cases 4 to 6).

Each test failed on the code before the fix; real worker processes and files, no mocks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from graphbisect.cli.main import main
from graphbisect.examples import host_network
from graphbisect.model import load_model
from graphbisect.workflows.reduce import ReduceOptions, reduce_model, work_dir_for


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
