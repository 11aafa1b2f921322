"""`reduce`, `passes` and `precision` with an oracle that rewrites the graph: its verdict comes from the model as
built, as in `compare`.

Before: both judged the original model against the oracle's *capture* (intermediates exposed). ONNX Runtime
at opt_level=all fuses the keepdims=0 LayerNorm wrongly only when its tensors are not exposed, so `compare`
said FAIL while `reduce` and `passes` said the original model does not fail.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphbisect
from graphbisect.backends.base import BackendSpec
from graphbisect.backends.registry import get
from graphbisect.errors import GraphBisectError
from graphbisect.model import load_model
from graphbisect.model.normalize import elem_types
from graphbisect.workflows.passes import PassesOptions, find_culprit_passes
from graphbisect.workflows.reduce import ReduceOptions, reduce_model, work_dir_for
from tests.workflows.test_compare import _layernorm_keepdims0


def test_an_oracle_whose_capture_is_not_its_verdict_stops_the_reduction_and_says_why(tmp_path: Path) -> None:
    model = load_model(_layernorm_keepdims0())
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    options = ReduceOptions(oracle="onnxruntime:opt_level=all", target="reference")
    with pytest.raises(GraphBisectError) as info:
        reduce_model(model, tmp_path / "bug", inputs={"x": x}, options=options)
    error = info.value
    assert "computes the model differently when its intermediate tensors are exposed" in error.message
    assert "'y'" in error.message
    assert "target='onnxruntime:opt_level=all', oracle='reference'" in (error.hint or "")  # the API's words
    assert "--target onnxruntime:opt_level=all --oracle reference" in (error.cli_hint or "")  # the CLI's
    assert not (tmp_path / "bug" / "report.json").exists() and not work_dir_for(tmp_path / "bug").exists()


def test_a_rewriting_oracle_that_agrees_with_its_capture_reduces_with_the_verdict_of_its_plain_run(
        tmp_path: Path) -> None:
    # ORT wraps float -> int4 out of range (-9 -> 7) where the spec (onnx.reference) saturates (-9 -> -8).
    nodes = [helper.make_node("Mul", ["x", "three"], ["m"], name="triple"),
             helper.make_node("Cast", ["m"], ["q"], name="to_int4", to=TensorProto.INT4),
             helper.make_node("Cast", ["q"], ["y"], name="to_float", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [helper.make_tensor("three", TensorProto.FLOAT, [], [3.0])])
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    options = ReduceOptions(oracle="onnxruntime:opt_level=all", target="reference")
    result = reduce_model(model, tmp_path / "bug", inputs={"x": np.array([-3.0, 1.0, 2.0, 0.0], np.float32)},
                          options=options)
    assert result.failed and result.signature.kind.value == "mismatch" and result.verified
    assert "to_int4" in result.kept_nodes
    # the capture, the plain run that gives the verdict (same worker), the final model's check
    assert result.invocations["oracle"] == 3


def test_passes_judges_the_model_as_built_and_does_not_search_a_region_on_a_capture_that_differs(
        tmp_path: Path) -> None:
    model = load_model(_layernorm_keepdims0())
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    result = find_culprit_passes(model, inputs={"x": x}, options=PassesOptions(
        oracle="onnxruntime:opt_level=all", target="onnxruntime:opt_level=disable"), workdir=tmp_path / "w")
    assert result.failed and result.signature.kind.value == "mismatch"
    assert result.invocations["oracle"] == 2  # the capture and the model as built
    assert any("computes the model differently when its intermediate tensors are exposed" in note
               and "differ on 'y' (mismatch" in note for note in result.notes), result.notes
    assert result.scope["searched_on"] == "whole model" and not result.culprits


def test_precision_expects_what_a_rewriting_oracle_computes_on_the_model_as_built(tmp_path: Path) -> None:
    # compare (oracle = target = ORT opt_level=all) says PASS on this model; precision judged the FP32 baseline
    # against the oracle's capture, which does not mis-fuse, and refused: "the target does not meet the
    # tolerance even with every node in FP32".
    from graphbisect.workflows.precision import find_precision

    model = load_model(_layernorm_keepdims0())
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    result = find_precision(model, mode="fp16", oracle="onnxruntime:opt_level=all",
                            target="onnxruntime:opt_level=all", inputs={"x": x}, workdir=tmp_path / "work",
                            with_prefix=False, alone=False)
    assert result.extra["oracle_expected"] == "model as built (its capture's outputs differ)"
    assert result.meets_tolerance
    # the capture and the plain run share the oracle's worker
    assert result.invocations["oracle"] == 2


@pytest.mark.parametrize(("target", "passes_as_built"), [("reference", False), ("onnxruntime:opt_level=disable", False),
                                                         ("onnxruntime:opt_level=all", True)])
def test_compare_blames_the_oracles_capture_not_the_targets_probe_when_that_is_what_differs(
        target: str, passes_as_built: bool) -> None:
    # ORT at opt_level=all as the oracle: its plain run mis-fuses the keepdims=0 LayerNorm, its capture (every
    # tensor exposed) does not. A right target fails the verdict (plain vs plain) and passes the layerwise table
    # (its probe vs the oracle's capture); ORT all as the target too mis-fuses like the oracle as built (pass)
    # but not like its capture (the table fails). Before, compare called either flip PROBE MASKING and blamed
    # the target's probe ("exposing tensors prevented the fusion ... that causes the bug").
    from graphbisect.workflows.compare import compare_models

    model = load_model(_layernorm_keepdims0())
    result = compare_models(model, oracle="onnxruntime:opt_level=all", target=target)
    assert result.passed is passes_as_built and not result.probe_masking
    assert result.probed_comparison is not None and result.probed_comparison.passed is not passes_as_built
    note = result.layerwise_note or ""
    assert "PROBE MASKING" not in note and "ORACLE CAPTURE DIFFERS" in note, note
    flip = "fails where the model passes" if passes_as_built else "passes where the model fails"
    assert f"It is the oracle's capture, not the target's probe, that {flip} as built" in note
    assert "--target onnxruntime:opt_level=all --oracle reference" in note
    capture = result.to_json()["oracle_capture"]
    assert isinstance(capture, dict) and capture["differs"] is True and capture["identical"] == []
    assert "differ on 'y' (mismatch, 16/16 elements" in capture["description"]
    assert result.invocations == {"oracle": 2, "target": 2}


def test_compare_measures_a_rewriting_oracles_capture_that_agrees_and_keeps_quiet_about_it() -> None:
    # The same oracle on a model it fuses the same way with or without exposed tensors (keepdims=1 is fused
    # right, and exposing its tensors only stops the fusion): measured, within tolerance, no note.
    from graphbisect.workflows.compare import compare_models

    proto = _layernorm_keepdims0()
    for node in proto.graph.node:
        for attribute in node.attribute:
            if attribute.name == "keepdims":
                attribute.i = 1
    proto.graph.node[0].output[0] = "mean"
    result = compare_models(load_model(proto), oracle="onnxruntime:opt_level=all", target="reference")
    assert result.passed and not result.probe_masking and result.layerwise_note is None
    capture = result.to_json()["oracle_capture"]
    assert isinstance(capture, dict) and capture["differs"] is False


def _mixed_precision_exp() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """tf2onnx's mixed-precision shape: a float16 Conv between float32↔float16 Casts, then Exp (which turns the
    float16 rounding of the Conv's output into errors beyond tolerance). ONNX Runtime's CPU EP has no float16
    Conv: even at opt_level=disable it computes it in float32 between inserted Casts and removes the
    float32→float16→float32 pair — unless the float16 tensor is exposed as an output, which keeps the rounding."""
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((8, 4, 3, 3)) * 0.5).astype(np.float16)
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16, name="cast_in"),
             helper.make_node("Conv", ["x16", "W"], ["c16"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Cast", ["c16"], ["c32"], to=TensorProto.FLOAT, name="cast_out"),
             helper.make_node("Exp", ["c32"], ["y"], name="exp")]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [numpy_helper.from_array(weights, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, {"x": (rng.standard_normal((1, 4, 8, 8)) * 1.5).astype(np.float32)}


def test_a_float16_model_is_judged_by_the_oracles_plain_run_not_its_capture() -> None:
    """Issue 35, case 1: `compare` said FAIL against ONNX Runtime, where plain opt_level=all and plain
    opt_level=disable agree, because the oracle's capture (every intermediate exposed) computes other outputs
    than its plain run. The verdict is the plain run's; the capture is measured against it."""
    import onnxruntime as ort

    model, feeds = _mixed_precision_exp()

    def plain(level: ort.GraphOptimizationLevel, proto: onnx.ModelProto) -> np.ndarray:
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(["y"], feeds)[0]

    disable = plain(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, model)
    everything = plain(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, model)
    assert np.allclose(everything, disable, rtol=1e-3, atol=1e-4)  # the target is right
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in ("x16", "c16", "c32"))
    captured = plain(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, exposed)
    assert not np.allclose(captured, disable, rtol=1e-3, atol=1e-4)  # the premise: the capture differs

    result = graphbisect.compare(model, inputs=feeds)
    assert result.passed, result.to_json()["outputs"]
    assert result.invocations["oracle"] == 2  # the capture, and the plain run that is the verdict
    info = get("onnxruntime")
    assert not info.computes_as_written(BackendSpec.parse("onnxruntime:opt_level=disable"), elem_types(model))
    assert info.computes_as_written(BackendSpec.parse("onnxruntime:opt_level=disable"),
                                    elem_types(_layernorm_keepdims0()))
