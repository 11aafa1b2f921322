"""The passes strategy's runner: one warm worker for a sequence of specs where the backend allows it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from graphbisect.backends import BackendSpec
from graphbisect.backends.worker import save_npz
from graphbisect.examples import pattern_model
from graphbisect.strategies.passes import PassSpace, SpecRunner


def test_spec_runner_keeps_one_worker_across_disabled_lists(tmp_path: Path) -> None:
    model, inputs = tmp_path / "ln.onnx", tmp_path / "inputs.npz"
    onnx.save(pattern_model("layernorm_keepdims0"), str(model))
    save_npz(inputs, {"x": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)})
    space = PassSpace(BackendSpec.parse("ort:opt_level=all"), ["LayerNormFusionL1", "SimplifiedLayerNormFusion"])
    runner = SpecRunner(tmp_path / "work", timeout=None)
    try:
        runs = [runner.run(space.spec_disabling(frozenset(keep)), model, inputs) for keep in ({0}, {0, 1}, set())]
        oracle = runner.run(BackendSpec.parse("reference"), model, inputs)  # another backend: another worker
    finally:
        runner.close()
    assert [run.info["disabled"] for run in runs] == [["LayerNormFusionL1"], list(space.passes), []]
    assert runner.started == 2
    expected = np.asarray(oracle.outputs["y"])
    errors = [float(np.max(np.abs(np.asarray(run.outputs["y"]) - expected))) for run in runs]
    assert errors[1] < 1e-3 < min(errors[0], errors[2])  # only with both fusions off is the result right
