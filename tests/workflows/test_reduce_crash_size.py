"""A compile crash reduced to its size when the shape at fault is computed by the graph (issue 35, case 5).

OpenVINO 2026.4.1 (CPU) fails to compile a keepdims=0 ReduceMean → Reshape → MatMul chain ("Incompatible MatMul
matrix dimension"). Here the Reshape's target shape is computed, as exporters write it: Shape → Gather → Concat
``[batch, -1]``, and the chain sits between residual blocks of a 56-node host. The three nodes at fault, the shape
fed as a constant, fail the same way. Before, every candidate that ended at the MatMul (the trailing Reshape
removed) was refused by ``onnx.checker`` without a run ("invalid model: Field 'shape' of 'type' is required but
missing": a MatMul fed a Reshape of a computed shape has no shape for shape inference), the engine took those
removals for "the failure disappears", and reduce wrote 4 nodes, "1-minimal: yes". Now the candidate declares the
tensor from its captured value and runs.

The same host as an exporter writes it, declaring the shape tensors with symbolic lengths (``[Concat_dim_0]``):
the Reshape's shape, cut, was fed at run time (a declared dynamic dimension), OpenVINO then compiles the chain,
and reduce kept the whole shape computation: 6 nodes where 3 fail the same way (7 before the fix above). The
shape is computed from static shapes alone, a constant of the original; it is now fed as one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.model import load_model
from graphbisect.workflows.reduce import ReduceOptions, reduce_model, work_dir_for

pytestmark = pytest.mark.openvino

_TOKENS, _CHANNELS = 4, 16


class _Host:
    """A graph under construction: nodes named ``<Op>_<n>``, weights drawn from one seeded generator."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(0)

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        name = f"{op_type}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [f"{name}_out"], name=name, **attrs))
        return f"{name}_out"

    def const(self, value: np.ndarray) -> str:
        name = f"c{len(self.weights)}"
        self.weights.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, *shape: int) -> str:
        return self.const((self.rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    def block(self, x: str) -> str:
        """MatMul → Add → Relu → Add (residual): 4 nodes OpenVINO compiles."""
        h = self.op("Relu", [self.op("Add", [self.op("MatMul", [x, self.weight(_CHANNELS, _CHANNELS)]),
                                             self.weight(_CHANNELS)])])
        return self.op("Add", [h, x])


def _host(blocks: int = 6, *, symbolic: bool = False) -> tuple[onnx.ModelProto, tuple[str, str, str], str]:
    """``blocks`` residual blocks, the pooled projection, ``blocks`` more; the names of the three nodes at fault
    and of the computed shape. ``symbolic``: the shape tensors are declared with a symbolic length."""
    g = _Host()
    x = "x"
    for _ in range(blocks):
        x = g.block(x)
    pooled = g.op("ReduceMean", [x], axes=[0], keepdims=0)
    batch = g.op("Gather", [g.op("Shape", [x]), g.const(np.array([0], np.int64))], axis=0)
    flat = g.op("Reshape", [pooled, g.op("Concat", [batch, g.const(np.array([-1], np.int64))], axis=0)])
    projected = g.op("MatMul", [flat, g.weight(_TOKENS * _CHANNELS, _CHANNELS)])
    core, shape_at_fault = (g.nodes[-6].name, g.nodes[-2].name, g.nodes[-1].name), g.nodes[-3].output[0]
    x = g.op("Add", [x, g.op("Reshape", [projected, g.const(np.array([1, 1, _CHANNELS], np.int64))])])
    for _ in range(blocks):
        x = g.block(x)
    g.nodes[-1].output[0] = "y"
    shape = [1, _TOKENS, _CHANNELS]
    graph = helper.make_graph(g.nodes, "host", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], g.weights)
    if symbolic:
        graph.value_info.extend(helper.make_tensor_value_info(node.output[0], TensorProto.INT64,
                                                              [f"{node.name}_dim_0"])
                                for node in g.nodes if node.op_type in ("Shape", "Gather", "Concat"))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model, core, shape_at_fault


@pytest.mark.parametrize("symbolic", [False, True], ids=["inferred", "declared-symbolic"])
def test_a_crash_behind_a_computed_shape_reduces_to_the_three_nodes_at_fault(symbolic: bool, tmp_path: Path) -> None:
    ov = pytest.importorskip("openvino")
    model, core, shape_at_fault = _host(symbolic=symbolic)
    assert len(model.graph.node) == 56
    compiler = ov.Core()
    with pytest.raises(RuntimeError, match="Incompatible MatMul matrix dimension"):
        compiler.compile_model(compiler.read_model(model.SerializeToString(), b""), "CPU")
    feed = {"x": np.random.default_rng(1).standard_normal((1, _TOKENS, _CHANNELS)).astype(np.float32)}
    out = tmp_path / "bundle"
    result = reduce_model(load_model(model), out, inputs=feed,
                          options=ReduceOptions(target="openvino", keep_work=True))
    assert result.failed and result.signature.kind.value == "crash-load", result.notes
    assert result.kept_nodes == core, result.kept_nodes  # was + the trailing Reshape; declared: + Shape, Gather, Concat
    assert result.one_minimal and result.verified and not result.flaky, result.notes
    journal = (work_dir_for(out) / "journal.jsonl").read_text().splitlines()[1:]
    invalid = [entry for entry in map(json.loads, journal) if "invalid model" in str(entry.get("detail"))]
    assert not invalid, invalid  # every candidate was a model the checker passes, and ran
    bundled = onnx.load(out / "model.onnx")
    assert [node.op_type for node in bundled.graph.node] == ["ReduceMean", "Reshape", "MatMul"]
    assert shape_at_fault in {tensor.name for tensor in bundled.graph.initializer}  # fed as a constant
