"""The reference backend (onnx.reference) through a worker."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from graphbisect.backends import BackendProcess, Phase, RunStatus
from graphbisect.errors import ModelError, SpecError


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    with BackendProcess("ref", workdir=tmp_path_factory.mktemp("ref")) as process:
        yield process


def test_runs_the_model(ref: BackendProcess, models: dict[str, Path], x23: np.ndarray) -> None:
    result = ref.run(models["relu_add"], {"x": x23})
    assert result.ok, result.describe()
    np.testing.assert_array_equal(result.outputs["y"], np.maximum(x23, 0) + 1)
    assert result.info["library"] == "onnx"
    assert result.info["library_version"] == onnx.__version__


def test_returns_intermediates(ref: BackendProcess, models: dict[str, Path], x23: np.ndarray, odd_name: str) -> None:
    probe = ref.run(models["relu_add_probe"], {"x": x23}, [odd_name, "y"])
    np.testing.assert_array_equal(probe.outputs[odd_name], np.maximum(x23, 0))
    # the evaluator keeps every tensor, so even the plain model can answer
    plain = ref.run(models["relu_add"], {"x": x23}, [odd_name])
    np.testing.assert_array_equal(plain.outputs[odd_name], np.maximum(x23, 0))
    with pytest.raises(ModelError, match="no tensor named 'nope'"):
        ref.run(models["relu_add"], {"x": x23}, ["nope"])


def test_unsupported_op_crashes_at_load(ref: BackendProcess, tmp_path: Path, x23: np.ndarray) -> None:
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                              ir_version=8)
    onnx.save(model, tmp_path / "custom.onnx")
    result = ref.run(tmp_path / "custom.onnx", {"x": x23})
    assert (result.status, result.phase) == (RunStatus.CRASH, Phase.LOAD)
    assert "Frobnicate" in (result.message or "")


def test_shape_error_crashes_at_run(ref: BackendProcess, models: dict[str, Path]) -> None:
    a, b = np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)
    result = ref.run(models["matmul"], {"a": a, "b": b})
    assert (result.status, result.phase) == (RunStatus.CRASH, Phase.RUN)
    assert "MatMul" in (result.message or "")
    assert "Unable to multiply shapes (2, 3), (4, 5)" in result.log  # the traceback is in the log slice
    good = ref.run(models["matmul"], {"a": a, "b": np.ones((3, 5), np.float32)})
    np.testing.assert_array_equal(good.outputs["y"], np.full((2, 5), 3, np.float32))


def test_options_are_rejected() -> None:
    with BackendProcess("reference:timeout=5") as process:  # host option: fine
        process.validate()
    with pytest.raises(SpecError):
        BackendProcess("reference:opt_level=1")


def _slow_resizes(path: Path, pairs: int = 2) -> Path:
    """Linear Resize up and down ``pairs`` times on a [1, 1, 12, 12] image: onnx.reference computes each output
    element in Python (about half a second a node here), as it made a 1,493-node PicoDet run for 600 s."""
    from onnx import TensorProto, numpy_helper

    nodes, x = [], "x"
    for i in range(pairs):
        nodes += [helper.make_node("Resize", [x, "", "up"], [f"u{i}"], name=f"up{i}", mode="linear"),
                  helper.make_node("Resize", [f"u{i}", "", "down"], [f"d{i}"], name=f"down{i}", mode="linear")]
        x = f"d{i}"
    scales = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up"),
              numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "down")]
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 12, 12])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1, 12, 12])], scales)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_long_run_says_it_is_running_and_which_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26 item 8: an onnx.reference run printed nothing for 600 s. A run still going says so every
    ``PROGRESS_SECONDS`` (here 0.1 s), with how many nodes of the model are done and which one runs; the CLI
    prints it as a stage line."""
    import logging

    from graphbisect.cli.main import main

    monkeypatch.setenv("GRAPHBISECT_PROGRESS_SECONDS", "0.1")
    model = _slow_resizes(tmp_path / "slow.onnx")
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    progress = logging.getLogger("graphbisect.progress")
    keep = Keep()
    progress.addHandler(keep)
    level = progress.level
    progress.setLevel(logging.INFO)
    try:
        with BackendProcess("reference", workdir=tmp_path / "worker") as worker:
            run = worker.run(model, {"x": np.ones((1, 1, 12, 12), np.float32)})
    finally:
        progress.removeHandler(keep)
        progress.setLevel(level)
    assert run.status is RunStatus.OK, run.describe()
    counted = [r for r in records if " of 4 done" in r]
    assert counted and all(r.startswith("reference: still running, ") for r in counted), records
    # which node runs, while one does (how many reports fall mid-run depends on the machine's scheduling);
    # never "4 of 4 done" with a node still said to run
    assert any(re.search(r" node [0-3] of 4 done \(now Resize '(up|down)[01]'\)", r) for r in counted), records
    assert not any(" 4 of 4 done (now" in r for r in counted), records
    # and how long the whole run takes: its Resizes are Python loops, each step measured on this machine
    assert any(re.search(r"; the whole run takes about [0-9.]+ s at this machine's pace \(Resize 'up[01]' "
                         r"interpolates 6\.9e\+03 times in Python, [0-9]+ µs each\)", r) for r in counted), records
    assert main(["compare", str(model), "--oracle", "reference", "--no-layerwise"]) == 0
    assert "… reference: still running, " in capsys.readouterr().err
