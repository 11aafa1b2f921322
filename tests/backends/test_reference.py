"""The reference backend (onnx.reference) through a worker."""

from __future__ import annotations

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
