"""The OpenVINO bug patterns (``OPENVINO_BUGS``) really fail to compile on the installed OpenVINO, in a host and
alone, and run on onnxruntime; a release that fixes one turns its tests into skips with a reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from graphbisect.examples import host_network
from graphbisect.examples.patterns import OPENVINO_BUGS, GraphBuilder, reduce_reshape_matmul

pytestmark = pytest.mark.openvino

_REASONS = {"reduce_reshape_matmul": "Incompatible MatMul matrix dimension",
            "if_rank2_condition": "Rank of If condition input must be equal to 0 or 1"}


def _compile_error(model: onnx.ModelProto, tmp_path: Path) -> str | None:
    ov = pytest.importorskip("openvino")
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    try:
        ov.Core().compile_model(str(path), "CPU")
    except RuntimeError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("bug", sorted(OPENVINO_BUGS))
@pytest.mark.parametrize("position", ["main", "masked"])
def test_openvino_refuses_the_host_and_onnxruntime_runs_it(bug: str, position: str, tmp_path: Path) -> None:
    host = host_network(200, bug=bug, position=position)
    onnx.checker.check_model(host.model, full_check=True)
    session = ort.InferenceSession(host.model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert all(np.isfinite(out).all() for out in session.run(None, dict(host.inputs)))
    error = _compile_error(host.model, tmp_path)
    if error is None:
        pytest.skip(f"this OpenVINO compiles {bug!r} ({OPENVINO_BUGS[bug].reference}); the example needs a new bug")
    assert _REASONS[bug] in error


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
def test_the_reduce_reshape_matmul_core_fails_alone(op: str, tmp_path: Path) -> None:
    """The three core nodes on a graph input, with either Reduce: what a reduction ends with."""
    b = GraphBuilder()
    reduce_reshape_matmul(b, "x", op=op)
    b.nodes.pop()  # the trailing Reshape: the MatMul's output is the graph's
    out = b.nodes[-1].output[0]
    model = b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                    [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], graph_name="core")
    assert [node.op_type for node in model.graph.node] == [op, "Reshape", "MatMul"]
    error = _compile_error(model, tmp_path)
    if error is None:
        pytest.skip(f"this OpenVINO compiles the {op} chain; the example needs a new bug")
    assert _REASONS["reduce_reshape_matmul"] in error


def test_openvino_patterns_need_the_stream_shape() -> None:
    with pytest.raises(ValueError, match="position='main' or 'masked'"):
        host_network(200, bug="if_rank2_condition", position="branch")
