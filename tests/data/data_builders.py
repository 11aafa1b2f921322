"""Small real ONNX models for the data tests."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphbisect.model import Model, load_model


def make_model(nodes, inputs, outputs, initializers=(), *, opset: int = 17) -> Model:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 8
    return load_model(proto)


def two_input_model() -> Model:
    """x: float32[batch, 3], y: float32[batch, 3] -> Add."""
    return make_model(
        [helper.make_node("Add", ["x", "y"], ["z"], name="add")],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 3])],
    )


def single_input_model() -> Model:
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )


def gather_model() -> Model:
    """ids: int64[batch, seq] indexes a 50-row embedding (axis 0); pos: int32[4] -> Cast -> Gather axis 1
    of a [2, 7] table; sel: int64[2, 3] -> GatherElements axis 1 of a [2, 5] table; hot: int64[3] -> OneHot
    with depth 6."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "table")
    small = numpy_helper.from_array(rng.standard_normal((2, 7)).astype(np.float32), "small")
    elems = numpy_helper.from_array(rng.standard_normal((2, 5)).astype(np.float32), "elems")
    depth = numpy_helper.from_array(np.array(6, np.int64), "depth")
    values = numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "values")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed", axis=0),
        helper.make_node("Cast", ["pos"], ["pos64"], name="cast", to=TensorProto.INT64),
        helper.make_node("Gather", ["small", "pos64"], ["cols"], name="cols", axis=1),
        helper.make_node("GatherElements", ["elems", "sel"], ["picked"], name="pick", axis=1),
        helper.make_node("OneHot", ["hot", "depth", "values"], ["onehot"], name="onehot"),
    ]
    return make_model(
        nodes,
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 16]),
            helper.make_tensor_value_info("pos", TensorProto.INT32, [4]),
            helper.make_tensor_value_info("sel", TensorProto.INT64, [2, 3]),
            helper.make_tensor_value_info("hot", TensorProto.INT64, [3]),
        ],
        [
            helper.make_tensor_value_info("emb", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("cols", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("picked", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("onehot", TensorProto.FLOAT, None),
        ],
        [table, small, elems, depth, values],
    )


def run(model: Model | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    proto = model.proto if isinstance(model, Model) else model
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))
