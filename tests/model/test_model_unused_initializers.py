"""A model with many initializers no node reads is slow to build: said before the first build (issue 36 item 8).

ONNX Runtime 1.32 built a model with 1e6 of them for over five minutes with no bound or hint (measured here:
2 s at 10,000, 21 s at 30,000; the time grows with their square). Each test failed before the warning existed.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.cli.main import main
from graphbisect.model import load_model
from graphbisect.model.graph import MANY_UNUSED_INITIALIZERS, warn_unused_initializers


def _model(unused: int, *, used: bool = True, as_output: bool = False) -> onnx.ModelProto:
    """``y = x + w`` (or Relu without ``w``) and ``unused`` initializers no node reads (``as_output``: the first
    of them is a graph output too)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]
    if as_output:
        outputs.append(helper.make_tensor_value_info("u0", TensorProto.FLOAT, [1]))
    initializers = [numpy_helper.from_array(np.full([1], i, np.float32), f"u{i}") for i in range(unused)]
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add") if used else \
        helper.make_node("Relu", ["x"], ["y"], name="relu")
    if used:
        initializers.append(numpy_helper.from_array(np.ones([1, 4], np.float32), "w"))
    graph = helper.make_graph([node], "g", [x], outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_unused_initializers_are_counted() -> None:
    assert load_model(_model(5)).unused_initializers == 5  # "w" is read
    assert load_model(_model(5, as_output=True)).unused_initializers == 4  # an output is used
    assert load_model(_model(0, used=False)).unused_initializers == 0


def test_many_unused_initializers_are_warned_about_with_what_to_do(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert warn_unused_initializers(load_model(_model(MANY_UNUSED_INITIALIZERS - 1))) is None
        message = warn_unused_initializers(load_model(_model(MANY_UNUSED_INITIALIZERS)))
    assert message is not None and f"{MANY_UNUSED_INITIALIZERS:,} initializers that no node reads" in message
    assert "eliminate_unused_initializer" in message and "--timeout" in message and "timeout=" in message
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [message]


def test_compare_warns_before_it_builds(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "unused.onnx"
    onnx.save(_model(MANY_UNUSED_INITIALIZERS, used=False), path)
    with caplog.at_level(logging.WARNING):
        assert main(["compare", str(path), "--no-layerwise"]) == 0
    warned = [r for r in caplog.records if "initializers that no node reads" in r.getMessage()]
    assert len(warned) == 1 and "10,000" in warned[0].getMessage()


def test_reduce_warns_before_it_builds(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from graphbisect.workflows.reduce import reduce_model

    class Built(Exception):
        """Raised at reduce's first stage: the warning must come before any build."""

    def stop(_stage: str) -> None:
        raise Built

    with caplog.at_level(logging.WARNING), pytest.raises(Built):
        reduce_model(load_model(_model(MANY_UNUSED_INITIALIZERS, used=False)), tmp_path / "bug",
                     inputs={"x": np.zeros([1, 4], np.float32)}, on_stage=stop)
    warned = [r for r in caplog.records if "initializers that no node reads" in r.getMessage()]
    assert len(warned) == 1 and "10,000" in warned[0].getMessage()
