"""Small stand-ins for issue 35's models: tensors onnx's shape inference leaves untyped or unshaped.

``ai.onnx.ml``'s Scaler has no type inference, so what reads its output is untyped too (a Mul), and an
SVMClassifier's labels, an ArgMax of it and the LabelEncoders after that have an element type but no shape.
onnx.reference and ONNX Runtime disagree on an SVMClassifier's probabilities (three classes, ``prob_a`` /
``prob_b`` given: the pairwise coupling differs), a real difference on that one node, as in the issue's
skl2onnx Scaler → SVMClassifier → Cast reduced with ``--target reference``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

ML = "ai.onnx.ml"


def _svm(rng: np.random.Generator, source: str) -> onnx.NodeProto:
    """A 3-class RBF SVMClassifier of 3 features, with probabilities (where the two runtimes differ)."""
    support = rng.standard_normal((6, 3)).astype(np.float32)
    return helper.make_node(
        "SVMClassifier", [source], ["lab", "prob"], name="svm", domain=ML, classlabels_ints=[0, 1, 2],
        coefficients=rng.standard_normal(12).tolist(), kernel_params=[0.3, 0.0, 3.0], kernel_type="RBF",
        rho=rng.standard_normal(3).tolist(), support_vectors=support.ravel().tolist(), vectors_per_class=[2, 2, 2],
        post_transform="NONE", prob_a=[-1.0] * 3, prob_b=[0.1] * 3)


def _model(nodes: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto], ml_opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)],
                             ir_version=8)


def _outputs() -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info("labf", TensorProto.FLOAT, ["N"]),
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 3])]


def scaler_svm() -> onnx.ModelProto:
    """Scaler → SVMClassifier → Cast (skl2onnx's pipeline): ``s`` untyped, ``lab`` typed without a shape."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Scaler", ["x"], ["s"], name="scaler", domain=ML, offset=[0.5, 0.0, 0.0],
                              scale=[1.0, 2.0, 3.0]),
             _svm(rng, "s"),
             helper.make_node("Cast", ["lab"], ["labf"], name="cast", to=TensorProto.FLOAT)]
    return _model(nodes, _outputs(), 1)


def string_chain() -> onnx.ModelProto:
    """Scaler → ArgMax → LabelEncoder (int64 → string) → LabelEncoder (string → float) → Mul → SVMClassifier →
    Cast: the SVMClassifier's input is weighted by a class *name*, a string tensor without a shape in between."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Scaler", ["x"], ["s"], name="scaler", domain=ML, offset=[0.5, 0.0, 0.0],
                              scale=[1.0, 2.0, 3.0]),
             helper.make_node("ArgMax", ["s"], ["a"], name="argmax", axis=1, keepdims=1),
             helper.make_node("LabelEncoder", ["a"], ["name"], name="to_name", domain=ML, keys_int64s=[0, 1, 2],
                              values_strings=["lo", "mid", "hi"]),
             helper.make_node("LabelEncoder", ["name"], ["w"], name="to_weight", domain=ML,
                              keys_strings=["lo", "mid", "hi"], values_floats=[0.5, 1.0, 2.0]),
             helper.make_node("Mul", ["s", "w"], ["z"], name="mul"),
             _svm(rng, "z"),
             helper.make_node("Cast", ["lab"], ["labf"], name="cast", to=TensorProto.FLOAT)]
    return _model(nodes, _outputs(), 2)


def scaler_sequence() -> onnx.ModelProto:
    """Scaler → SplitToSequence → ConcatFromSequence → Relu: ``seq`` is a sequence nothing types."""
    nodes = [helper.make_node("Scaler", ["x"], ["s"], name="scaler", domain=ML, offset=[0.5, 0.0, 0.0],
                              scale=[1.0, 2.0, 3.0]),
             helper.make_node("SplitToSequence", ["s"], ["seq"], name="split", axis=1),
             helper.make_node("ConcatFromSequence", ["seq"], ["c"], name="concat", axis=0),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 1])], 1)


def inputs() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)}
