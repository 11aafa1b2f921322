"""model_differences: why a re-verified model is not the model that failed."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from graphbisect.model.diff import describe_type, model_differences


def _model(x_shape: list[int | str] | None, value_info: bool) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, ["n", 8])]
                              if value_info else [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_names_the_declarations_that_differ() -> None:
    tested, verified = _model(["n", 8], True), _model([8, 8], False)
    found = model_differences(tested, verified)
    assert "graph input 'x': FLOAT[n,8] in the tested model, FLOAT[8,8] in the re-verified one" in found
    assert "value_info 'h': FLOAT[n,8] in the tested model, absent in the re-verified one" in found
    assert model_differences(tested, _model(["n", 8], True)) == []


def test_describes_unknown_rank_and_untyped() -> None:
    assert describe_type(helper.make_tensor_value_info("x", TensorProto.FLOAT, None)) == "FLOAT[rank unknown]"
    assert describe_type(onnx.ValueInfoProto(name="x")) == "untyped"
