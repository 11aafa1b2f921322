"""Small real ONNX models for the model tests (built with onnx.helper, run with onnxruntime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(LIGHT_DIR.glob("*.onnx"))


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] | None = None,
    *,
    opset: int = 17,
    ir_version: int = 8,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def chain_model(length: int = 5) -> onnx.ModelProto:
    """x -> Relu -> Neg -> Relu -> ... -> y, float [2, 3]."""
    nodes = []
    for i in range(length):
        source = "x" if i == 0 else f"t{i - 1}"
        target = "y" if i == length - 1 else f"t{i}"
        nodes.append(helper.make_node("Relu" if i % 2 == 0 else "Neg", [source], [target], name=f"n{i}"))
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )


def weighted_model(size: int = 256) -> onnx.ModelProto:
    """y = Relu(x @ W1 + b1) @ W2 with sizeable float weights (size x size)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((size, size)).astype(np.float32), "W1")
    b1 = numpy_helper.from_array(rng.standard_normal(size).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((size, size)).astype(np.float32), "W2")
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, size])  # typed-field initializer
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["h2"], name="add"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu"),
        helper.make_node("MatMul", ["h3", "W2"], ["h4"], name="mm2"),
        helper.make_node("Reshape", ["h4", "shape"], ["y"], name="reshape"),
    ]
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])],
        [w1, b1, w2, shape],
    )


def if_model() -> onnx.ModelProto:
    """``outer = Neg(x)``; ``If(cond)`` whose then-branch reads ``outer`` from the outer scope."""
    then_out = helper.make_tensor_value_info("then_y", TensorProto.FLOAT, [2])
    else_out = helper.make_tensor_value_info("else_y", TensorProto.FLOAT, [2])
    then_graph = helper.make_graph([helper.make_node("Relu", ["outer"], ["then_y"])], "then", [], [then_out])
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["else_y"])], "else", [], [else_out])
    nodes = [
        helper.make_node("Neg", ["x"], ["outer"], name="neg"),
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_graph, else_branch=else_graph),
    ]
    return make_model(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )


def session(model: onnx.ModelProto | Path | str) -> ort.InferenceSession:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto | Path | str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))
