"""The onnxoptimizer backend: real onnxoptimizer passes, then ONNX Runtime with its optimizations off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxoptimizer")
pytest.importorskip("onnxruntime")

from graphbisect.backends import BackendProcess, resolve
from graphbisect.backends.base import Capability
from graphbisect.errors import SpecError

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10.0


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Identity → Transpose → Transpose (inverse) → Relu: eliminate_identity and fuse_consecutive_transposes fire."""
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0, 2]),
             helper.make_node("Transpose", ["b"], ["c"], perm=[1, 0, 2]),
             helper.make_node("Relu", ["c"], ["y"])]
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3, 4]) for name in ("x", "y")]
    graph = helper.make_graph(nodes, "transposes", io[:1], io[1:])
    path = tmp_path_factory.mktemp("oo") / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_registry_row() -> None:
    spec, info = resolve("onnxoptimizer:disabled=eliminate_identity")
    assert info.has(Capability.PASSES) and info.has(Capability.ONNX_INPUT) and info.has(Capability.INTERMEDIATES)
    assert info.extra == "optimizer" and spec.option_list("disabled") == ["eliminate_identity"]


def test_runs_and_reports_fired_passes(model_path: Path, tmp_path: Path) -> None:
    with BackendProcess("onnxoptimizer:save_optimized=1", workdir=tmp_path) as proc:
        run = proc.run(model_path, {"x": X})
    assert run.ok, run.describe()
    np.testing.assert_array_equal(run.outputs["y"], np.maximum(X, 0))
    assert run.info["fired_passes"] == ["fuse_consecutive_transposes", "eliminate_identity"]
    assert run.info["fired_required"] == [] and run.info["nodes_before"] == 4 and run.info["nodes_after"] == 2
    # The fused transposes become one identity Transpose; eliminate_nop_transpose ran before them in the
    # default order (one sweep, no fixed point), so it stays.
    optimized = onnx.load(run.info["optimized_model"])
    assert [n.op_type for n in optimized.graph.node] == ["Transpose", "Relu"]


def test_disabled_pass_does_not_run(model_path: Path, tmp_path: Path) -> None:
    with BackendProcess("onnxoptimizer:disabled=eliminate_identity", workdir=tmp_path) as proc:
        run = proc.run(model_path, {"x": X})
    assert run.ok and run.info["fired_passes"] == ["fuse_consecutive_transposes"]
    assert "eliminate_identity" not in run.info["passes"]


def test_explicit_pass_list(model_path: Path, tmp_path: Path) -> None:
    with BackendProcess("onnxoptimizer:passes=eliminate_identity;eliminate_nop_cast", workdir=tmp_path) as proc:
        run = proc.run(model_path, {"x": X})
    assert run.info["passes"] == ["eliminate_identity", "eliminate_nop_cast"]
    assert run.info["fired_passes"] == ["eliminate_identity"]


def test_unknown_pass_name_is_refused_with_a_suggestion(model_path: Path, tmp_path: Path) -> None:
    with BackendProcess("onnxoptimizer:disabled=eliminate_identiy", workdir=tmp_path) as proc, \
            pytest.raises(SpecError) as err:
        proc.run(model_path, {"x": X})
    assert "eliminate_identity" in (err.value.hint or "")


def test_pass_search_candidates_share_a_worker_and_give_what_fresh_workers_give(model_path: Path,
                                                                                tmp_path: Path) -> None:
    """Every option of the row is an argument of one optimization or one session, so the pass search's candidates
    (``disabled=`` sets) run in one worker, and give what a fresh worker each gives: the passes that fired and the
    outputs, bit for bit."""
    from graphbisect.backends import BackendSpec
    from graphbisect.backends.worker import save_npz
    from graphbisect.strategies.passes import SpecRunner, run_spec

    inputs = tmp_path / "inputs.npz"
    save_npz(inputs, {"x": X})
    specs = [BackendSpec.parse(f"onnxoptimizer{disabled}") for disabled in (
        "", ":disabled=eliminate_identity", ":disabled=fuse_consecutive_transposes;eliminate_identity", "")]
    fresh = [run_spec(spec, model_path, inputs, tmp_path / "fresh", None) for spec in specs]
    runner = SpecRunner(tmp_path / "warm", timeout=None)
    try:
        warm = [runner.run(spec, model_path, inputs) for spec in specs]
    finally:
        runner.close()
    assert runner.started == 1
    assert [run.info["fired_passes"] for run in fresh] == [run.info["fired_passes"] for run in warm] == [
        ["fuse_consecutive_transposes", "eliminate_identity"], ["fuse_consecutive_transposes"], [],
        ["fuse_consecutive_transposes", "eliminate_identity"]]
    assert all(np.asarray(a.outputs["y"]).tobytes() == np.asarray(b.outputs["y"]).tobytes()
               for a, b in zip(fresh, warm, strict=True))
