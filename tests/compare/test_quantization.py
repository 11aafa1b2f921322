"""Which tensors are quantized and their step (issue 26, item 2): QDQ pairs, ONNX Runtime's QLinear operators, the
ops that keep a grid; indices, shapes and bounds never."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.compare import Tolerance
from graphbisect.compare.quantization import quantization_steps, with_quantization
from graphbisect.examples.quantized import qdq_model
from graphbisect.model import load_model

S8, S16 = np.float32(0.05), np.float32(0.002)
CONSTANTS = {"s": S8, "s2": S16, "z": np.int8(0), "shape": np.array([1, -1]), "idx": np.array([0, 2]),
             "lo": np.float32(0.0), "per_channel": np.array([0.5, 0.02, 0.1], np.float32)}


def _steps(*nodes: object) -> dict[str, float]:
    return {name: round(step, 6) for name, step in quantization_steps(list(nodes), CONSTANTS).items()}  # type: ignore[arg-type]


def test_a_qdq_pair_marks_both_sides_of_both_nodes() -> None:
    steps = _steps(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                   helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]))
    assert steps == {"x": 0.05, "q": 0.05, "dq": 0.05}


def test_grid_keeping_ops_carry_the_step_and_indices_shapes_bounds_stay_exact() -> None:
    steps = _steps(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                   helper.make_node("Reshape", ["q", "shape"], ["r"]),
                   helper.make_node("Gather", ["r", "idx"], ["g"]),
                   helper.make_node("DequantizeLinear", ["g", "s", "z"], ["dq"]),
                   helper.make_node("Clip", ["dq", "lo"], ["c"]),
                   helper.make_node("ArgMax", ["c"], ["am"]),
                   helper.make_node("Conv", ["c", "w"], ["conv"]),  # a new value: a grid only if re-quantized
                   helper.make_node("Relu", ["conv"], ["relu"]),
                   helper.make_node("QuantizeLinear", ["relu", "s2", "z"], ["q2"]))
    assert steps == {"x": 0.05, "q": 0.05, "r": 0.05, "g": 0.05, "dq": 0.05, "c": 0.05, "relu": 0.002,
                     "q2": 0.002, "conv": 0.002}  # conv: read only by a Relu that is quantized
    assert not {"shape", "idx", "lo", "am", "w"} & set(steps)


def test_a_tensor_read_elsewhere_too_is_not_on_the_grid() -> None:
    steps = _steps(helper.make_node("Conv", ["x", "w"], ["conv"]),
                   helper.make_node("QuantizeLinear", ["conv", "s", "z"], ["q"]),
                   helper.make_node("Sigmoid", ["conv"], ["y"]))
    assert "conv" not in steps and steps["q"] == 0.05


def test_onnx_runtime_quantized_operators_and_unknown_scales() -> None:
    steps = _steps(helper.make_node("QLinearConv", ["xq", "s", "z", "wq", "per_channel", "z", "s2", "z"], ["yq"]),
                   helper.make_node("DynamicQuantizeLinear", ["f"], ["dq8", "dscale", "dzero"]),
                   helper.make_node("DequantizeLinear", ["yq", "runtime_scale", "z"], ["y"]))
    assert steps["xq"] == 0.05 and steps["wq"] == 0.02  # a per-channel scale counts by its finest step
    assert steps["yq"] == 0.002 and steps["dq8"] == 0.0 and "dscale" not in steps
    assert steps["y"] == 0.0  # its scale is not a constant: quantized, step unknown


def test_with_quantization_reads_the_model_and_keeps_a_callers_own() -> None:
    model = load_model(qdq_model()[0])
    tol = with_quantization(Tolerance(int_atol=2), model)
    assert tol.int_atol == 2
    assert {"x", "x_q", "x_dq", "c1", "c1_q", "y1", "fc", "fc_q", "y2"} <= set(tol.quantized)
    assert tol.quantized["fc_q"] == pytest.approx(0.001) and tol.quantized["x_q"] == pytest.approx(0.05)
    own = Tolerance(quantized={"x_q": 0.5})
    assert with_quantization(own, model) is own
    plain = load_model(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]), ir_version=8,
        opset_imports=[helper.make_opsetid("", 17)]))
    assert with_quantization(Tolerance(), plain) == Tolerance()
    assert numpy_helper  # the scales of a model are read from its initializers
