"""A small CNN + MLP head built with onnx.helper: several Convs (3x3, depthwise, 1x1), MatMuls, Softmax."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def cnn_model() -> onnx.ModelProto:
    """conv0 (3x3) conv1 (depthwise) conv2 (1x1) conv3 (3x3), each + Relu; GAP; MatMul-Tanh-MatMul-Softmax."""
    rng = np.random.default_rng(0)
    nodes, inits, x, channels = [], [], "x", 3
    for i, (out, k, group) in enumerate([(16, 3, 1), (16, 3, 16), (32, 1, 1), (32, 3, 1)]):
        inits.append(numpy_helper.from_array((rng.standard_normal((out, channels // group, k, k)) * 0.3)
                                             .astype(np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array((rng.standard_normal(out) * 0.3).astype(np.float32), f"b{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}",
                                      pads=[k // 2] * 4, group=group))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        x, channels = f"r{i}", out
    inits.append(numpy_helper.from_array((rng.standard_normal((32, 64)) * 0.3).astype(np.float32), "fw"))
    inits.append(numpy_helper.from_array((rng.standard_normal((64, 10)) * 0.3).astype(np.float32), "fw2"))
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fw"], ["m1"], name="matmul1"),
        helper.make_node("Tanh", ["m1"], ["t1"], name="tanh1"),
        helper.make_node("MatMul", ["t1", "fw2"], ["m2"], name="matmul2"),
        helper.make_node("Softmax", ["m2"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save_cnn(folder: Path) -> Path:
    path = folder / "cnn.onnx"
    onnx.save(cnn_model(), str(path))
    return path


def save_int64_output(folder: Path, op: str = "MatMul") -> Path:
    """``op`` (``MatMul`` ``mm`` of int64 a [4, 8] and b [8, 4], or ``Add`` ``add`` of a + a, a [3]) writing
    int64 graph output ``s``, read by Cast ``cast`` -> Mul ``mul`` (by float ``f`` [1]) -> ``y``.

    OpenVINO's CPU plugin computes int64 in i32 and renames the op computing ``s`` to ``s.0`` and the
    Convert back to int64 before the Result ``s.0.0`` (OpenVINO 2026.4); the MatMul kernel honours
    ``primitives_priority`` (``ref_any``), the Eltwise does not.
    """
    vi = helper.make_tensor_value_info
    if op == "MatMul":
        node, inputs = helper.make_node("MatMul", ["a", "b"], ["s"], name="mm"), \
            [vi("a", TensorProto.INT64, [4, 8]), vi("b", TensorProto.INT64, [8, 4])]
    else:
        node, inputs = helper.make_node("Add", ["a", "a"], ["s"], name="add"), [vi("a", TensorProto.INT64, [3])]
    nodes = [node, helper.make_node("Cast", ["s"], ["c"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["c", "f"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, f"int64_{op.lower()}", [*inputs, vi("f", TensorProto.FLOAT, [1])],
                              [vi("s", TensorProto.INT64, None), vi("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / f"int64_{op.lower()}.onnx"
    onnx.save(model, str(path))
    return path
