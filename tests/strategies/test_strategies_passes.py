"""The passes strategy's runner: one warm worker for a sequence of specs where the backend allows it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.backends import BackendProcess, BackendSpec
from graphbisect.backends.worker import save_npz
from graphbisect.examples import pattern_model
from graphbisect.strategies.passes import PassSpace, SpecRunner, run_spec


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


@pytest.mark.paddle
def test_paddle_delete_pass_specs_share_a_worker_and_give_what_fresh_workers_give(tmp_path: Path) -> None:
    """Paddle's pass-search candidates differ only in ``delete_pass`` (a setting of one predictor's analysis): they
    run in one worker, each on a predictor of its own, and give what a fresh worker each gives — the outputs bit for
    bit, the passes run, fired and matched — also after a predictor that fails to build (its bookkeeping pass
    deleted). A spec that changes another option (threads: process-wide) gets a worker of its own."""
    pytest.importorskip("paddle")
    from tests.paddle_models import CONV_NET_INPUT, export_conv_net

    prefix = export_conv_net(tmp_path / "conv")
    name, shape = CONV_NET_INPUT
    inputs = tmp_path / "inputs.npz"
    save_npz(inputs, {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)})
    specs = [BackendSpec.parse(f"paddle{deleted}") for deleted in (
        "", ":delete_pass=conv2d_bias_bn_onednn_fuse_pass", ":delete_pass=dead_code_elimination_pass",
        ":delete_pass=conv2d_bias_bn_onednn_fuse_pass;conv_activation_onednn_fuse_pass", "")]
    fresh = [run_spec(spec, prefix, inputs, tmp_path / "fresh", None) for spec in specs]
    runner = SpecRunner(tmp_path / "warm", timeout=None)
    try:
        warm = [runner.run(spec, prefix, inputs) for spec in specs]
        assert runner.started == 1
        runner.run(BackendSpec.parse("paddle:threads=2"), prefix, inputs)
        assert runner.started == 2
    finally:
        runner.close()
    with BackendProcess("paddle:device=gpu", workdir=tmp_path / "gpu") as gpu:  # not started: GPUs were not checked
        assert not gpu.can_reconfigure("paddle:device=gpu,delete_pass=conv2d_bias_bn_onednn_fuse_pass")
    assert [run.ok for run in fresh] == [True, True, False, True, True]
    assert fresh[1].info["passes_run"] != fresh[0].info["passes_run"]  # the deletion changed what ran
    keys = ("passes_run", "fired_passes", "pass_matches", "deleted_passes", "deleted_but_ran")
    for spec, alone, shared in zip(specs, fresh, warm, strict=True):
        assert (alone.ok, alone.phase) == (shared.ok, shared.phase), spec
        assert [alone.info.get(key) for key in keys] == [shared.info.get(key) for key in keys], spec
        assert alone.outputs.keys() == shared.outputs.keys(), spec
        for output in alone.outputs:
            assert np.asarray(alone.outputs[output]).tobytes() == np.asarray(shared.outputs[output]).tobytes(), spec
