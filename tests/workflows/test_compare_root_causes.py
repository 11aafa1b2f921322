"""Root causes behind fusions: a node whose inputs the target did not expose is never blamed for error it received.

Before, an unexposed input counted as exact: on the bundled example ONNX Runtime's correct LayerNorm after a
fused-away Reshape ranked as a second "root" (927× tolerance) although the error upstream was already 1,229×;
on OpenVINO the ten listed "roots" were MatMuls reading a tensor it eliminated, and the op at fault was not
listed. Such nodes are now run alone on the oracle's values (one more target run) before any is called a root.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphbisect as gb
from graphbisect.cli.main import main
from graphbisect.examples.bundled import example_inputs_path, example_model_path
from tests.cpu_premises import require_openvino_dynamic_quantization


def test_the_examples_correct_layernorm_behind_a_fused_away_reshape_is_not_a_root(tmp_path: Path) -> None:
    result = gb.compare(example_model_path(), inputs=dict(np.load(example_inputs_path())))
    layers = result.layerwise
    assert layers is not None and layers.first_divergence is not None
    assert layers.first_divergence.node == "/blk10/norm/Add_1"
    assert [c.node for c in layers.root_causes if c.is_root] == ["/blk10/norm/Add_1"]
    assert layers.root_causes[0].evidence == "measured"
    # Its input, /blk15/Reshape's output, is fused away; the error reaching it is already >1,000x tolerance.
    row = next(r for r in layers.rows if r.node == "/blk15/norm/Add_1")
    assert row.hidden_inputs == ("/blk15/Reshape_output_0",) and row.input_score > 1000 > row.stats.score
    # Run alone on the oracle's input (its 9 fused nodes), ONNX Runtime computes it right: it received its error.
    check = result.root_cause_check
    assert check is not None and check.received == ("/blk15/norm/Add_1",) and not check.confirmed
    assert check.target_runs == 1 and check.regions == 1 and check.nodes == 9
    assert result.invocations == {"oracle": 1, "target": 3}  # plain, probe, and the one run alone
    data = result.to_json()
    assert data["root_cause_check"]["received"] == ["/blk15/norm/Add_1"]  # type: ignore[index]
    assert all(c["evidence"] == "measured" for c in data["root_causes"] if c["is_root"])  # type: ignore[union-attr]


def test_the_cli_says_which_causes_were_run_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--example"]) == 1
    causes = capsys.readouterr().out.split("root causes")[1]
    assert "/blk15/norm/Add_1" not in causes.split("(1 failing node")[0]  # never listed as a root
    assert ("1 failing node whose inputs the target did not expose (or that compute exactly on inputs already "
            "off) was run alone") in causes
    assert "1 received its error" in causes


def _projections_behind_an_eliminated_identity(projections: int = 12) -> onnx.ModelProto:
    """OpenVINO 2026.4's FullyConnected with int8 weights quantizes its activations dynamically (group size 32;
    on a CPU with AVX2-VNNI or AVX512-VNNI): a real single-op wrong result, ~137x tolerance. A
    LayerNormalization after it feeds an Identity that OpenVINO eliminates (no execution node names it, so its
    output is not exposed), read by 12 MatMuls whose large weights multiply the error they receive."""
    rng = np.random.default_rng(0)
    width = 64
    inits = [numpy_helper.from_array(rng.integers(-127, 128, size=(width, width)).astype(np.int8), "w8"),
             numpy_helper.from_array(np.float32(0.01), "ws"),
             numpy_helper.from_array((rng.standard_normal(width) * 0.5 + 1).astype(np.float32), "g"),
             numpy_helper.from_array((rng.standard_normal(width) * 0.1).astype(np.float32), "b")]
    nodes = [helper.make_node("DequantizeLinear", ["w8", "ws"], ["w"], name="q/dq"),
             helper.make_node("MatMul", ["x", "w"], ["h"], name="q/MatMul"),
             helper.make_node("Add", ["h", "x"], ["r"], name="res/Add"),
             helper.make_node("LayerNormalization", ["r", "g", "b"], ["n0"], name="ln", axis=-1),
             helper.make_node("Identity", ["n0"], ["n"], name="id")]
    outs = []
    for i in range(projections):
        inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) / 0.5).astype(np.float32), f"wp{i}"))
        nodes.append(helper.make_node("MatMul", ["n", f"wp{i}"], [f"p{i}"], name=f"proj{i}/MatMul"))
        outs.append(f"p{i}")
    nodes.append(helper.make_node("Sum", outs, ["y"], name="out/Sum"))
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "ov_host", [vi("x", TensorProto.FLOAT, [1, 4, width])],
                              [vi("y", TensorProto.FLOAT, [1, 4, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.openvino
def test_openvino_matmuls_reading_an_eliminated_tensor_are_not_roots_and_the_fault_is_first(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    require_openvino_dynamic_quantization()  # the fault at q/MatMul
    report = tmp_path / "r.json"
    model = tmp_path / "host.onnx"
    onnx.save(_projections_behind_an_eliminated_identity(), model)
    assert main(["compare", str(model), "--target", "openvino", "--json", str(report)]) == 1
    data = json.loads(report.read_text())
    assert data["first_divergence"]["node"] == "q/MatMul"
    causes = data["root_causes"]
    assert causes[0]["node"] == "q/MatMul" and causes[0]["is_root"] and causes[0]["evidence"] == "measured"
    projections = [c for c in causes if c["node"].startswith("proj")]
    assert projections and not any(c["is_root"] for c in projections)
    assert all(c["hidden_inputs"] == ["n"] and c["evidence"] == "received" for c in projections)
    # The error reaching them (the LayerNorm's, through the Identity) is their input score, not zero.
    assert all(c["input_score"] > 10 for c in projections)
    check = data["root_cause_check"]
    assert check["target_runs"] == 1 and check["regions"] == 12 and len(check["received"]) == 12
    assert data["invocations"]["target"] == 3
