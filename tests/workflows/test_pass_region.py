"""The pass search on the diverging region, confirmed on the whole model (real ONNX Runtime, no stand-ins).

ORT's keepdims=0 LayerNorm bug (:mod:`graphbisect.examples.patterns`): ``LayerNormFusionL1`` fuses the nine
nodes, ``SimplifiedLayerNormFusion`` their six-node tail when L1 does not fire; both ignore keepdims.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphbisect.examples import GraphBuilder
from graphbisect.examples.hosts import host_inputs, host_network
from graphbisect.examples.patterns import layernorm_keepdims0
from graphbisect.model import load_model
from graphbisect.workflows.passes import PassesOptions, find_culprit_passes

LN = ("LayerNormFusionL1", "SimplifiedLayerNormFusion")
TARGET = "onnxruntime:opt_level=all"


def test_region_search_gives_the_whole_model_answer_with_four_whole_model_runs(tmp_path: Path) -> None:
    host = host_network(300, bug="layernorm_keepdims0")
    model = load_model(host.model)
    region = find_culprit_passes(model, inputs=host.inputs, workdir=tmp_path / "region",
                                 options=PassesOptions(target=TARGET))
    whole = find_culprit_passes(model, inputs=host.inputs, workdir=tmp_path / "whole",
                                options=PassesOptions(target=TARGET, region=False))
    assert set(region.culprits) == set(LN) and region.culprits == whole.culprits
    # On the region the failure's identity is known (the LayerNormalization LayerNormFusionL1 made), so the
    # enable-set is that pass; the whole-model search matches by kind, where either sibling reproduces.
    assert region.required == region.each_alone == ("LayerNormFusionL1",) and region.minimal
    assert len(whole.required) == 1 and whole.required[0] in LN
    assert any("match by kind" in note for note in whole.notes)
    assert region.fixed_target == whole.fixed_target  # the workaround: the same two names disabled
    scope = region.scope
    assert scope["searched_on"] == "region" and set(scope["region_nodes"]) == set(host.culprit_nodes)
    assert scope["confirmed"] and scope["required_reproduces"]
    # the whole-model runs: the saving baseline, the replay of its optimized model and the two confirmations
    assert scope["whole_model_target_runs"] == 4 < whole.invocations["target"] - 10
    assert region.invocations["oracle"] == whole.invocations["oracle"] == 1
    # the culprit target enables only the enable-set: every other pass ORT registers stays off
    disabled = region.culprit_target.split("disabled=")[1].split(",")[0].split(";")  # type: ignore[union-attr]
    assert set(whole.searched) - set(region.required) <= set(disabled)
    assert not set(region.required) & set(disabled)


def _two_sites() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two keepdims=0 LayerNorms in a row; the first one's Sub output is also a graph output, which keeps
    LayerNormFusionL1 away from it: there only SimplifiedLayerNormFusion fuses (the tail), while the
    second site is fused by LayerNormFusionL1. The first divergence is the first site."""
    b = GraphBuilder(seed=3)
    first = layernorm_keepdims0(b, "x", prefix="first")
    second = layernorm_keepdims0(b, b.op("Relu", [first]), prefix="second", gamma_seed=1)
    sub = next(node.output[0] for node in b.nodes if node.name == "/first/Sub")
    value = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [8, 8]) for name in ("x", second, sub)]
    model = b.model([value[0]], [value[1], value[2]], graph_name="two_sites")
    return model, {"x": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)}


def test_region_culprits_that_do_not_fix_the_whole_model_fall_back_to_the_whole_search(tmp_path: Path) -> None:
    proto, feeds = _two_sites()
    model = load_model(proto)
    result = find_culprit_passes(model, inputs=feeds, workdir=tmp_path / "region", options=PassesOptions(target=TARGET))
    whole = find_culprit_passes(model, inputs=feeds, workdir=tmp_path / "whole",
                                options=PassesOptions(target=TARGET, region=False))
    assert result.failed and set(result.culprits) == set(LN) and result.culprits == whole.culprits
    assert result.scope["searched_on"] == "whole model"
    assert any("do not fix the whole model" in note and "SimplifiedLayerNormFusion" in note for note in result.notes)


def test_a_model_that_does_not_fail_costs_one_target_run(tmp_path: Path) -> None:
    model = load_model(host_network(150, bug=None).model)
    result = find_culprit_passes(model, inputs=host_inputs(), workdir=tmp_path, options=PassesOptions(target=TARGET))
    assert not result.failed and result.culprits == ()
    # the search's one target run, and the checker's plain runs that "the target does not fail" holds
    assert result.invocations == {"oracle": 1, "target": 1, "audit oracle": 1, "audit target": 1}
