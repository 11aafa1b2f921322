"""OpenVINO on a hand-written DFT with a uint8 Cast output: a deterministic target is not called flaky when what
it says it compiled the region as differs between the original's runs and the reduced model's (issue 35, case 4,
the DFT half; the PRelu half is test_reduce_compiled_as.py).

The DFT builds its twiddles at run time from the signal's length (Shape → Range → outer product → Cos, Sin: OpenVINO
runs them as ``Math`` nodes), multiplies them with the mean-removed signal (two MatMuls), concatenates real and
imaginary parts, scales them and casts them to uint8. OpenVINO 2026.4.1 (CPU) differs from ONNX Runtime there
(its cosine at large angles, and its Convert saturates out-of-range values where ONNX Runtime's cast wraps). The
first divergence of the original is the scaling Mul, which OpenVINO compiles as an ``Eltwise``; the reduced model,
the Cast alone fed the Mul's values, compiles to no node OpenVINO names. Before, re-verification took that for
another failure: "NOT re-verified, flaky target … the target compiled the region as nothing it named, not
Eltwise", the search repeated with three runs per candidate and "1-minimal: NOT PROVEN", while four fresh compiles
give bit-identical outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.model import load_model
from graphbisect.workflows.reduce import ReduceOptions, reduce_model

pytestmark = pytest.mark.openvino

_N = 128  # the signal's length, the model's dynamic dim


def _dft_host(conditioning: int = 6) -> onnx.ModelProto:
    """``x[1, N]`` → ``conditioning`` soft-clip blocks → mean removal → DFT → ``y`` (uint8 ``[1, 2N]``)."""
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []

    def const(value: object, dtype: type = np.float32) -> str:
        weights.append(numpy_helper.from_array(np.asarray(value, dtype), f"c{len(weights)}"))
        return weights[-1].name

    def op(op_type: str, inputs: list[str], **attrs: object) -> str:
        name = f"{op_type}_{len(nodes)}"
        nodes.append(helper.make_node(op_type, inputs, [f"{name}_out"], name=name, **attrs))
        return f"{name}_out"

    x = "x"
    for _ in range(conditioning):
        x = op("Add", [x, op("Mul", [op("Tanh", [op("Mul", [x, const(0.05)])]), const(0.5)])])
    x = op("Sub", [x, op("ReduceMean", [x], axes=[-1], keepdims=1)])
    length = op("Cast", [op("Gather", [op("Shape", [x]), const(1, np.int64)], axis=0)], to=TensorProto.FLOAT)
    steps = op("Range", [const(0.0), length, const(1.0)])
    outer = op("Mul", [op("Unsqueeze", [steps, const([1], np.int64)]), op("Unsqueeze", [steps, const([0], np.int64)])])
    angle = op("Mul", [outer, op("Div", [const(2 * np.pi), length])])
    real = op("MatMul", [x, op("Cos", [angle])])
    imag = op("MatMul", [x, op("Neg", [op("Sin", [angle])])])
    op("Cast", [op("Mul", [op("Concat", [real, imag], axis=-1), const(3000.0)])], to=TensorProto.UINT8)
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "dft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "N"])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, "M"])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _openvino_outputs(model: onnx.ModelProto, feed: np.ndarray, compiles: int) -> list[np.ndarray]:
    ov = pytest.importorskip("openvino")
    outputs = []
    for _ in range(compiles):
        core = ov.Core()
        compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32"})
        outputs.append(np.asarray(compiled({"x": feed})[0]))
    return outputs


def test_a_deterministic_dft_mismatch_is_re_verified_not_flaky(tmp_path: Path) -> None:
    """43 → 1 node (the Cast), re-verified, not flaky, 1-minimal; a note says what the original compiled the
    region as."""
    model = _dft_host()
    assert len(model.graph.node) == 43
    feed = (np.random.default_rng(0).standard_normal((1, _N)) * 4).astype(np.float32)
    first, *again = _openvino_outputs(model, feed, 4)
    assert all(np.array_equal(first, other) for other in again)  # a deterministic target, bit for bit
    result = reduce_model(load_model(model), tmp_path / "bundle", inputs={"x": feed},
                          options=ReduceOptions(target="openvino"))
    assert result.failed and result.signature.kind.value == "mismatch", result.notes
    assert result.kept_nodes == ("Cast_42",), result.notes
    assert result.verified and not result.flaky and result.one_minimal, result.notes
    assert not any("flaky" in note or "NOT re-verified" in note for note in result.notes), result.notes
    report = json.loads((tmp_path / "bundle" / "report.json").read_text())
    assert any("where the original compiled it as Eltwise" in note for note in report["notes"]), report["notes"]
    claims = {claim["id"]: claim["holds"] for claim in report["audit"]["claims"]}
    assert claims["identity"] is True and claims["flaky"] is True and claims["one_minimal"] is True, claims
