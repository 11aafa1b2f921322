"""An exact op reading an accepted difference is judged by a run of it alone (issue 35, case 6).

On an ONNX Runtime ``quantize_dynamic`` model, OpenVINO's DynamicQuantizeLinear rounded activations to the
neighbouring step (1 LSB, which the tolerance accepts on a quantized tensor), and the layerwise analysis called
the MatMulInteger reading them a root at "inf×": an exact op maps equal inputs to equal outputs, so its
difference may be only the one it read. It may also add its own — ONNX Runtime's u8×s8 MatMulInteger saturates
its 16-bit pair sums on an AVX2 CPU without VNNI — and only a run of it alone on the oracle's inputs tells which.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.backends import BackendProcess
from graphbisect.compare import MismatchKind, TensorStats, Tolerance, compare_tensors
from graphbisect.localize.layerwise import analyze_layers
from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models

ROWS, DEPTH, COLUMNS = 64, 256, 8


def _weights() -> np.ndarray:
    return np.random.default_rng(0).integers(-127, 127, (DEPTH, COLUMNS)).astype(np.int8)


def _nodes() -> list[onnx.NodeProto]:
    return [helper.make_node("Erf", ["x"], ["e"], name="erf"),
            helper.make_node("DynamicQuantizeLinear", ["e"], ["q", "s", "z"], name="dql"),
            helper.make_node("MatMulInteger", ["q", "w", "z"], ["acc"], name="mmi"),
            helper.make_node("Cast", ["acc"], ["acc_f"], name="cast", to=TensorProto.FLOAT),
            helper.make_node("Mul", ["acc_f", "s"], ["y"], name="scale")]


def test_without_a_run_alone_the_exact_op_is_not_a_root() -> None:
    w = _weights()
    x_q = np.random.default_rng(1).integers(0, 255, (2, DEPTH)).astype(np.uint8)
    flipped = x_q.copy()
    flipped[0, 3] += 1  # a rounding flip: one step
    oracle = {"q": x_q, "s": np.float32(0.02), "z": np.uint8(128)}
    target = {**oracle, "q": flipped}
    for values in (oracle, target):
        values["acc"] = (values["q"].astype(np.int32) - 128) @ w.astype(np.int32)
        values["acc_f"] = values["acc"].astype(np.float32)
        values["y"] = values["acc_f"] * values["s"]
    tol = Tolerance(quantized={"q": 0.02})  # q compared in steps: 1 LSB is within --int-atol 1
    report = analyze_layers(_nodes(), oracle, target, tol)
    rows = {row.tensor: row for row in report.rows}
    assert rows["q"].stats.passed and rows["q"].lsb == 1  # accepted
    first = report.first_divergence
    assert first is not None and first.tensor == "acc" and first.passes_on and math.isnan(first.amplification)
    causes = {cause.node: cause for cause in report.root_causes}
    assert causes["mmi"].role == "uncertain" and not causes["mmi"].is_root  # was: a root at inf×
    assert [row.node for row in report.uncertain] == ["mmi"]
    exact = TensorStats("acc", MismatchKind.OK)
    wrong = compare_tensors("acc", oracle["acc"], oracle["acc"] + 1)
    received = analyze_layers(_nodes(), oracle, target, tol, alone={"acc": exact})
    assert {c.node: c.role for c in received.root_causes}["mmi"] == "carries"
    confirmed = analyze_layers(_nodes(), oracle, target, tol, alone={"acc": wrong})
    assert {c.node: c.is_root for c in confirmed.root_causes}["mmi"] is True


@pytest.mark.slow
def test_compare_runs_the_exact_op_alone_and_says_what_it_found(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    graph = helper.make_graph(_nodes(), "erf_dql",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, DEPTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, COLUMNS])],
                              [numpy_helper.from_array(_weights(), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.random.default_rng(0).standard_normal((ROWS, DEPTH)).astype(np.float32)
    result = compare_models(load_model(model), oracle="openvino", target="onnxruntime:opt_level=disable",
                            inputs={"x": x})
    assert result.layerwise is not None
    first = result.layerwise.first_divergence
    assert first is not None and first.tensor == "acc" and first.passes_on  # OpenVINO's Erf flipped steps
    # The truth, measured apart: ONNX Runtime's MatMulInteger on OpenVINO's quantized activations against the
    # exact integer product.
    probe = helper.make_model(helper.make_graph(
        _nodes()[:2], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, DEPTH])],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [ROWS, DEPTH]),
         helper.make_tensor_value_info("z", TensorProto.UINT8, [])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(probe, tmp_path / "q.onnx")
    with BackendProcess("openvino", workdir=tmp_path / "ov") as proc:
        quantized = proc.run(tmp_path / "q.onnx", {"x": x})
        q, z = np.array(quantized.outputs["q"]), np.array(quantized.outputs["z"])
    alone = helper.make_model(helper.make_graph(
        [_nodes()[2]], "mmi", [helper.make_tensor_value_info("q", TensorProto.UINT8, [ROWS, DEPTH]),
                               helper.make_tensor_value_info("z", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("acc", TensorProto.INT32, [ROWS, COLUMNS])],
        [numpy_helper.from_array(_weights(), "w")]), opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(alone, tmp_path / "mmi.onnx")
    with BackendProcess("onnxruntime:opt_level=disable", workdir=tmp_path / "ort") as proc:
        ran = np.array(proc.run(tmp_path / "mmi.onnx", {"q": q, "z": z}).outputs["acc"])
    adds_its_own = not np.array_equal(ran, (q.astype(np.int32) - int(z)) @ _weights().astype(np.int32))
    cause = {c.node: c for c in result.layerwise.root_causes}["mmi"]
    assert cause.is_root is adds_its_own, (cause, adds_its_own)
    assert cause.evidence == ("confirmed" if adds_its_own else "received")
