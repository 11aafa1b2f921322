"""An exact op is not blamed for the difference it reads (issue 35, case 6).

On an ONNX Runtime ``quantize_dynamic`` model, OpenVINO's DynamicQuantizeLinear rounded one activation to the
neighbouring step (1 LSB, which the tolerance accepts on a quantized tensor), and the layerwise analysis put the
first divergence and the top root cause on the MatMulInteger reading it: "inf×", a root — an exact kernel that
computed exactly what its inputs say. Here the values are those of that shape: the quantized activation 1 LSB
off at one element, the int32 product off by that element's weight row.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from graphbisect.compare import Tolerance
from graphbisect.localize.layerwise import analyze_layers


def test_an_exact_op_passes_on_an_accepted_difference() -> None:
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_s", "x_z"], name="dql"),
             helper.make_node("MatMulInteger", ["x_q", "w_q", "x_z"], ["acc"], name="mmi"),
             helper.make_node("Cast", ["acc"], ["acc_f"], name="cast", to=1),
             helper.make_node("Mul", ["acc_f", "x_s"], ["y"], name="scale")]
    rng = np.random.default_rng(0)
    w_q = rng.integers(-100, 100, (8, 4)).astype(np.int8)
    x_q = rng.integers(0, 255, (2, 8)).astype(np.uint8)
    flipped = x_q.copy()
    flipped[0, 3] += 1  # a rounding flip: one step
    oracle = {"x_q": x_q, "x_s": np.float32(0.02), "x_z": np.uint8(128)}
    target = {**oracle, "x_q": flipped}
    for values in (oracle, target):
        values["acc"] = (values["x_q"].astype(np.int32) - 128) @ w_q.astype(np.int32)
        values["acc_f"] = values["acc"].astype(np.float32)
        values["y"] = values["acc_f"] * values["x_s"]
    tol = Tolerance(quantized={"x_q": 0.02})  # x_q compared in steps: 1 LSB is within --int-atol 1
    report = analyze_layers(nodes, oracle, target, tol)
    rows = {row.tensor: row for row in report.rows}
    assert rows["x_q"].stats.passed and rows["x_q"].lsb == 1  # accepted
    first = report.first_divergence
    assert first is not None and first.tensor == "acc" and first.passes_on
    roles = {cause.node: cause.role for cause in report.root_causes}
    assert roles["mmi"] == "carries", roles  # it made no error: it read one
    assert not any(cause.is_root for cause in report.root_causes if cause.node == "mmi")
