"""onnx.reference's cost known before it runs (:mod:`graphbisect.backends.reference_cost`), and the bundle's
spec check that no longer waits out its limit on a model onnx.reference would take hours on."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphbisect
from graphbisect.backends import reference_cost
from graphbisect.workflows.maintainer import SPEC_MARGIN


def _upsampler(channels: int, side: int, mode: str = "cubic") -> onnx.ModelProto:
    """x → Relu → Resize(2×, ``mode``) → y, and x → Relu → Add 1 → z: an upsampler beside another branch."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Resize", ["r", "", "scales"], ["y"], name="up", mode=mode),
         helper.make_node("Add", ["r", "one"], ["z"], name="plus_one")],
        "upsampler", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", channels, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", channels, 2 * side, 2 * side]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", channels, side, side])],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
         numpy_helper.from_array(np.array(1, np.float32), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_the_estimate_is_never_far_above_what_onnx_reference_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run the estimate puts at three times a limit is skipped by the spec check: the estimate must not
    exceed three times what onnx.reference really takes, or a run that would have finished is lost (measured:
    0.97-1.17 times)."""
    from onnx.reference import ReferenceEvaluator

    monkeypatch.setattr(reference_cost, "MIN_STEPS", 1)  # this small model is estimated too
    model = _upsampler(4, 8, mode="nearest")
    cost = reference_cost.estimate(model, {"x": (1, 4, 8, 8)})
    assert cost is not None and (cost.node, cost.op_type) == ("up", "Resize")
    assert cost.steps == 4 * 16 * 16 * (4 * 8)  # outputs × the input's indices before its last axis
    evaluator = ReferenceEvaluator(model)
    started = time.perf_counter()
    evaluator.run(None, {"x": np.ones((1, 4, 8, 8), np.float32)})
    assert cost.seconds <= SPEC_MARGIN * (time.perf_counter() - started)


def test_a_model_without_a_slow_loop_has_no_estimate() -> None:
    assert reference_cost.estimate(_upsampler(4, 8), {"x": (1, 4, 8, 8)}) is None  # below MIN_STEPS
    assert reference_cost.estimate(_upsampler(64, 64), {}) is None  # its dims are not known


def test_a_bundle_does_not_wait_for_a_spec_check_of_hours(tmp_path: Path) -> None:
    """The user's check rejects negative pixels; cubic upsampling overshoots below zero (on every backend). The
    reduced model is the 1×32×24×24 → 48×48 Resize, which onnx.reference would interpolate for ~20 minutes
    (57 million Python steps): the spec check used to run it until its 120 s limit stopped it, and now says
    it was not run, and why."""
    def non_negative(outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
        return all(bool((value >= 0).all()) for value in outputs.values())

    result = graphbisect.reduce(_upsampler(32, 24), tmp_path / "bug", shapes={"x": (1, 32, 24, 24)},
                                check=non_negative)
    assert result.failed and result.final_nodes == 1 and result.one_minimal
    report = json.loads((tmp_path / "bug" / "report.json").read_text())
    spec = report["spec_check"]
    assert spec["verdict"] == "unavailable" and spec["reference_estimate"]["node"] == "up"
    assert spec["reference_estimate"]["seconds"] > SPEC_MARGIN * 120 and "was not run" in spec["text"]
    assert "reference" not in report["report_runs"]  # no onnx.reference run was started
    assert "interpolates" in (tmp_path / "bug" / "report.md").read_text()
