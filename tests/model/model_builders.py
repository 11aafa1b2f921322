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


def external_chain_model(folder: Path, width: int = 512) -> tuple[Path, onnx.ModelProto, dict[str, np.ndarray]]:
    """A model saved with external data (``model.onnx`` + ``model.onnx.data``, a few MB) that ONNX Runtime
    miscompiles: ``x[8, width]`` → MatMul + Add → a tap (MatMul to ``[8, 8]``, the LayerNorm with
    ``ReduceMean(keepdims=0)`` that LayerNormFusion gets wrong, MatMul back) added to the stream → Gemm → ``y``.

    The two ``width × width`` weights (1 MiB each at 512) stay on disk after loading; the tap's weights and
    the biases (2–16 KiB) are read at load time. Returns the path, the same model with inline weights, and
    inputs.
    """
    from graphbisect.examples import GraphBuilder
    from graphbisect.examples.patterns import layernorm_keepdims0

    rng = np.random.default_rng(0)
    b = GraphBuilder(seed=0)

    def weight(shape: tuple[int, int], hint: str) -> str:
        return b.const((rng.standard_normal(shape) * shape[0] ** -0.5).astype(np.float32), hint)

    h = b.op("Add", [b.op("MatMul", ["x", weight((width, width), "w0")]), b.const(
        (0.01 * rng.standard_normal(width)).astype(np.float32), "b0")])
    down = b.op("MatMul", [h, weight((width, 8), "down")])
    up = b.op("MatMul", [layernorm_keepdims0(b, down, width=8), weight((8, width), "up")])
    h = b.op("Add", [h, up])
    b.op("Gemm", [h, weight((width, width), "w1"), b.const(np.zeros(width, np.float32), "b1")], transB=1,
         output="y")
    proto = b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, width])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, width])], graph_name="external_chain")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # onnx.save_model converts its argument to external data in place
    onnx.save_model(copy, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=1024)
    return path, proto, {"x": rng.standard_normal((8, width)).astype(np.float32)}
