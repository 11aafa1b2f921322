"""``reduce --resume`` continues exactly the recorded reduction: from any directory, and never on a work
folder whose model file changed since (its journal and activations belong to the recorded model)."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest

from graphbisect.cli.main import main
from graphbisect.examples import host_network
from graphbisect.model import load_model
from graphbisect.workflows.reduce import ReduceOptions, reduce_model, work_dir_for


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reduction stopped by its budget, started with a relative -o: the folder holding bug and bug.work."""
    host = host_network(100, bug="layernorm_keepdims0", position="branch", seed=6)
    folder = tmp_path_factory.mktemp("stopped")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        partial = reduce_model(load_model(host.model), Path("bug"), inputs=host.inputs,
                               options=ReduceOptions(max_invocations=2))
    assert not partial.one_minimal and work_dir_for(folder / "bug").is_dir()
    return folder


@pytest.fixture()
def interrupted(stopped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of ``stopped``'s folders in ``tmp_path`` (the current directory), for one test to change."""
    for name in ("bug", "bug.work"):
        shutil.copytree(stopped / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "bug"


def test_resume_works_from_another_directory(interrupted: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # run.json recorded the model copy as "bug.work/model.onnx", relative to where the run started:
    # resuming from elsewhere ended in "model not found: bug.work/model.onnx".
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["reduce", "--resume", str(interrupted), "--max-invocations", "1"]) == 1


def test_resume_refuses_a_work_folder_whose_model_changed(interrupted: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = work_dir_for(interrupted) / "model.onnx"
    model = onnx.load(path)
    node = next(n for n in model.graph.node if n.op_type == "Sqrt")
    node.op_type = "Abs"  # another model, same size
    onnx.save(model, path)
    capsys.readouterr()
    assert main(["reduce", "--resume", str(interrupted)]) == 2
    err = capsys.readouterr().err
    # It used to say "holds the bundle of another model ... pass --force", which --resume does not take.
    assert "model.onnx changed since the reduction recorded it" in err and "--force" not in err, err
