"""Small models that real backends refuse for lack of an op or a type (issue 26 item 7), for the refusal tests.

Each one runs on ONNX Runtime (the oracle) and has one standard op before the refused part, so a reduction has
something to take away. OpenVINO 2026.4.1 has no ``ai.onnx.ml`` translators ("No conversion rule found for
operations: ai.onnx.ml.Scaler"), cannot load a graph output typed as a sequence of maps (a ``ZipMap``'s
``output_probability``, skl2onnx's classifiers: "Unsupported value_info type"), and cannot convert a ``Loop``
whose body passes a carried value through unchanged (body output = body input, as paddle2onnx writes its while
loops: "The provided loop body graph canonical inputs size (5), does not match ..."). IREE 3.13's ONNX importer
has no form for the sequence of maps ("Unsupport list element type").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["REFUSED", "write_refused"]

_X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
_ML = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]


def _model(nodes: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto],
           initializers: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "refused", [_X], outputs, initializers or [])
    return helper.make_model(graph, opset_imports=_ML, ir_version=8)


def tree_ensemble() -> onnx.ModelProto:
    """Abs → ai.onnx.ml.TreeEnsembleRegressor (one stump)."""
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["a"], ["y"], name="tree", domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0], nodes_values=[0.5, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 2.0])
    return _model([helper.make_node("Abs", ["x"], ["a"], name="abs"), tree],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])])


def scaler() -> onnx.ModelProto:
    """Relu → ai.onnx.ml.Scaler."""
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                   helper.make_node("Scaler", ["r"], ["y"], name="scaler", domain="ai.onnx.ml",
                                    offset=[0.0, 0.0, 0.0], scale=[2.0, 2.0, 2.0])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])


def zipmap() -> onnx.ModelProto:
    """Neg → ai.onnx.ml.LinearClassifier → ai.onnx.ml.ZipMap: a sequence of maps as a graph output."""
    seq_of_maps = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    return _model([helper.make_node("Neg", ["x"], ["n"], name="neg"),
                   helper.make_node("LinearClassifier", ["n"], ["label", "prob"], name="clf", domain="ai.onnx.ml",
                                    classlabels_ints=[0, 1], coefficients=[1.0, 2.0, 3.0, -1.0, -2.0, -3.0],
                                    intercepts=[0.1, -0.1], post_transform="SOFTMAX"),
                   helper.make_node("ZipMap", ["prob"], ["output_probability"], name="zip", domain="ai.onnx.ml",
                                    classlabels_int64s=[0, 1])],
                  [helper.make_tensor_value_info("label", TensorProto.INT64, [2]),
                   helper.make_value_info("output_probability", seq_of_maps)])


def passthrough_loop() -> onnx.ModelProto:
    """Relu → Loop (3 iterations) whose body returns its carried ``xi`` unchanged and counts in ``k``."""
    f, b = TensorProto.FLOAT, TensorProto.BOOL
    body = helper.make_graph(
        [helper.make_node("Add", ["k", "one"], ["k2"]), helper.make_node("Less", ["k2", "lim"], ["co"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("ci", b, []),
         helper.make_tensor_value_info("xi", f, [2, 3]), helper.make_tensor_value_info("k", f, [])],
        [helper.make_tensor_value_info("co", b, []), helper.make_tensor_value_info("xi", f, [2, 3]),
         helper.make_tensor_value_info("k2", f, [])])
    constants = [numpy_helper.from_array(np.array(3, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go"),
                 numpy_helper.from_array(np.array(0.0, np.float32), "k0"),
                 numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                 numpy_helper.from_array(np.array(3.0, np.float32), "lim")]
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                   helper.make_node("Loop", ["trips", "go", "r", "k0"], ["y", "count"], name="loop", body=body)],
                  [helper.make_tensor_value_info("y", f, [2, 3]), helper.make_tensor_value_info("count", f, [])],
                  constants)


#: name → builder
REFUSED: dict[str, Callable[[], onnx.ModelProto]] = {
    "tree_ensemble": tree_ensemble, "scaler": scaler, "zipmap": zipmap, "passthrough_loop": passthrough_loop}


def write_refused(folder: Path, names: tuple[str, ...] = tuple(REFUSED)) -> Path:
    """Write the models ``names`` (with their inputs as NAME.npz) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        onnx.save(REFUSED[name](), str(folder / f"{name}.onnx"))
        np.savez(folder / f"{name}.npz", x=np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32))
    return folder
