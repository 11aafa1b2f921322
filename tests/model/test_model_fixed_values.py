"""Which tensors hold the same value for every input (:mod:`graphbisect.model.fixed_values`): what a reduction
may feed a candidate as a constant whatever the tensor's declaration says."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphbisect.model import load_model


def _model(batch: int | str) -> onnx.ModelProto:
    """``x[batch, 8]``: a shape computation (Shape → Gather → Concat), a random draw, and a value of ``x``."""
    node = helper.make_node
    nodes = [node("Shape", ["x"], ["s"], name="shape"),
             node("Gather", ["s", "zero"], ["b"], name="gather", axis=0),
             node("Concat", ["b", "minus_one"], ["target"], name="concat", axis=0),
             node("Reshape", ["x", "target"], ["flat"], name="reshape"),
             node("RandomNormal", [], ["noise"], name="noise", shape=[1]),
             node("Cast", ["noise"], ["drawn"], name="cast", to=TensorProto.INT64),
             node("ArgMax", ["flat"], ["index"], name="argmax", axis=1),
             node("Add", ["index", "drawn"], ["y"], name="add")]
    weights = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
               numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)], weights)
    graph.value_info.append(helper.make_tensor_value_info("target", TensorProto.INT64, ["target_dim_0"]))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_shape_computed_from_static_shapes_is_fixed_whatever_its_declaration() -> None:
    assert load_model(_model(2)).fixed_tensors == {"s", "b", "target"}


def test_a_shape_of_a_dynamic_dimension_a_random_draw_and_a_value_of_the_input_are_not_fixed() -> None:
    assert load_model(_model("batch")).fixed_tensors == frozenset()
