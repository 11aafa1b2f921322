"""The example models really fail (or pass) the way their ground truth says, on the installed onnxruntime.

Every bug is re-verified by running it, so an onnxruntime release that fixes one turns its tests into skips
with a reason instead of failures.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from graphbisect.examples import (
    BUGS,
    LOOKALIKES,
    POSITIONS,
    HostNetwork,
    build_example,
    example_inputs_path,
    example_model_path,
    ground_truth,
    host_network,
    light_models,
    pattern_model,
    transformer,
    transformer_inputs,
    wide_model,
)
from graphbisect.examples.bundled import npz_bytes
from graphbisect.examples.hosts import host_inputs
from graphbisect.examples.zoo import LIGHT_MODEL_NAMES, light_model_inputs

DISABLE, ALL = "ORT_DISABLE_ALL", "ORT_ENABLE_ALL"
ATOL = 1e-4
Feeds = Mapping[str, np.ndarray]


# ---------------------------------------------------------------------------------------------- helpers


def _session(model: onnx.ModelProto, level: str, disabled: Sequence[str] = (),
             optimized: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 4  # the crash bug logs a red error line before raising
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))


def _run(model: onnx.ModelProto, feeds: Feeds, level: str, disabled: Sequence[str] = ()) -> list[np.ndarray]:
    return _session(model, level, disabled).run(None, dict(feeds))


def _max_error(model: onnx.ModelProto, feeds: Feeds, disabled: Sequence[str] = ()) -> float:
    """Largest max-abs error over all outputs, ``all`` (minus ``disabled`` passes) vs ``disable``."""
    oracle, target = _run(model, feeds, DISABLE), _run(model, feeds, ALL, disabled)
    return max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(oracle, target, strict=True))


def _crashes(model: onnx.ModelProto, level: str = ALL, disabled: Sequence[str] = ()) -> bool:
    try:
        _session(model, level, disabled)
    except Exception:  # onnxruntime raises its own Fail/RuntimeException types
        return True
    return False


def _expose(model: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """Copy of ``model`` that also outputs ``tensors`` (what a layerwise probe does)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in tensors)
    for value in probe.graph.output[len(model.graph.output):]:
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return probe


def _subgraph(model: onnx.ModelProto, keep: set[str], feeds: Feeds) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The kept nodes alone, their cut inputs fed with the oracle's values and dangling outputs exposed.

    This is the reducer's view of a candidate, so it checks that ``core`` ground truth really fails alone.
    """
    nodes = [node for node in model.graph.node if node.name in keep]
    produced = {out for node in nodes for out in node.output}
    consumed = {name for node in nodes for name in node.input}
    initializers = [init for init in model.graph.initializer if init.name in consumed]
    cut = sorted(consumed - produced - {init.name for init in initializers} - {""})
    dangling = [out for node in nodes for out in node.output if out not in consumed]
    values = _oracle_values(model, [*cut, *dangling], feeds)
    graph = helper.make_graph(
        nodes, "candidate",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(values[name].dtype),
                                       values[name].shape) for name in cut],
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(values[name].dtype), None)
         for name in dangling], initializers)
    candidate = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return candidate, {name: values[name] for name in cut}


def _oracle_values(model: onnx.ModelProto, names: Sequence[str], feeds: Feeds) -> dict[str, np.ndarray]:
    wanted = [name for name in names if name not in feeds]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in wanted)
    session = _session(probe, DISABLE)
    values = dict(zip(wanted, session.run(wanted, dict(feeds)), strict=True))
    return {**{name: feeds[name] for name in names if name in feeds}, **values}


def _fails(model: onnx.ModelProto, feeds: Feeds) -> bool:
    return _crashes(model) or _max_error(model, feeds) > 1e-2


@functools.cache
def _reproduces(bug: str) -> bool:
    model = pattern_model(bug)
    if BUGS[bug].kind == "crash":
        return _crashes(model) and not _crashes(model, DISABLE)
    return _max_error(model, _square_input()) > 0.1


def _require(bug: str | Sequence[str] | None) -> None:
    names = [] if bug is None else [bug] if isinstance(bug, str) else list(bug)
    for name in names:
        if not _reproduces(name):
            pytest.skip(f"onnxruntime {ort.__version__} no longer reproduces {name!r} "
                        f"({BUGS[name].reference}); the example needs a new bug")


def _square_input(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((8, 8)).astype(np.float32)}


def _names(model: onnx.ModelProto) -> list[str]:
    return [node.name for node in model.graph.node]


# ------------------------------------------------------------------------------------------- patterns


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_bug_pattern_reproduces_in_onnxruntime(bug: str) -> None:
    _require(bug)
    model = pattern_model(bug)
    onnx.checker.check_model(model, full_check=True)
    assert not _crashes(model, DISABLE)
    if BUGS[bug].kind == "crash":
        with pytest.raises(Exception, match="Clip 'min'"):
            _session(model, ALL)
        assert _crashes(model, "ORT_ENABLE_BASIC")
    else:
        assert _max_error(model, _square_input()) > 0.5
        assert _max_error(model, _square_input(1)) > 0.5


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_bug_site_core_fails_alone_and_is_minimal(bug: str) -> None:
    """The recorded ``core`` fails with oracle-fed inputs, and dropping any one of its nodes passes."""
    _require(bug)
    builder_model = pattern_model(bug)
    host = host_network(150, bug=bug, position="main")
    (site,) = host.sites
    assert set(site.core) < set(site.nodes)
    feeds = dict(host.inputs)
    candidate, cut_feeds = _subgraph(host.model, set(site.core), feeds)
    assert _fails(candidate, cut_feeds), "the core alone must fail the same way"
    for dropped in site.core:
        candidate, cut_feeds = _subgraph(host.model, set(site.core) - {dropped}, feeds)
        assert not _fails(candidate, cut_feeds), f"core still fails without {dropped}: not minimal"
    assert len(builder_model.graph.node) == len(site.nodes)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_disabling_the_recorded_passes_fixes_the_pattern(bug: str) -> None:
    _require(bug)
    model = pattern_model(bug)
    (site,) = [s for s in host_network(150, bug=bug).sites]
    if BUGS[bug].kind == "crash":
        assert not _crashes(model, ALL, disabled=site.passes)
    else:
        assert _max_error(model, _square_input(), disabled=site.passes) < ATOL
        for single in site.passes:  # either pass alone is enough to break it
            assert _max_error(model, _square_input(), disabled=[single]) > 0.5


_FUSED_TO = {"layernorm_keepdims1": "LayerNormalization", "rmsnorm_keepdims1": "SimplifiedLayerNormalization",
             "relu_clip_f32": "Clip", "layernorm_node": "LayerNormalization"}


@pytest.mark.parametrize("name", sorted(LOOKALIKES))
def test_lookalike_passes_although_fused(name: str, tmp_path: Path) -> None:
    model = pattern_model(name)
    onnx.checker.check_model(model, full_check=True)
    assert _max_error(model, _square_input()) < ATOL
    _session(model, ALL, optimized=tmp_path / "optimized.onnx")
    optimized = [node.op_type for node in onnx.load(tmp_path / "optimized.onnx").graph.node]
    assert optimized == [_FUSED_TO[name]], f"{name} should be a fusable look-alike, got {optimized}"


def test_unknown_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="known patterns"):
        pattern_model("layernorm")


# ---------------------------------------------------------------------------------------------- hosts

_HOST_CASES = [
    *[(n, None, "main") for n in (150, 500, 2000)],
    *[(n, "layernorm_keepdims0", pos) for n in (150, 500, 2000) for pos in POSITIONS],
    *[(n, "relu_clip_f64", pos) for n in (150, 500) for pos in ("main", "branch", "masked")],
    (2000, "relu_clip_f64", "branch"),
]


@functools.cache
def _host(num_nodes: int, bug: str | None, position: str) -> HostNetwork:
    return host_network(num_nodes, bug=bug, position=position)


@pytest.mark.parametrize(("num_nodes", "bug", "position"), _HOST_CASES)
def test_host_is_valid_and_fails_as_specified(num_nodes: int, bug: str | None, position: str) -> None:
    _require(bug)
    host = _host(num_nodes, bug, position)
    model = host.model
    onnx.checker.check_model(model, full_check=True)
    names = _names(model)
    assert len(names) == num_nodes
    assert len(set(names)) == len(names)
    assert [value.name for value in model.graph.input] == ["x"]
    assert set(host.culprit_nodes) <= set(names) and set(host.core_nodes) <= set(host.culprit_nodes)
    assert set(host.support_nodes) <= set(names)
    truth = ground_truth(model)
    assert truth is not None and truth["culprit_nodes"] == list(host.culprit_nodes)
    oracle = _run(model, host.inputs, DISABLE)
    if host.kind == "crash":
        assert _crashes(model)
        return
    target = _run(model, host.inputs, ALL)
    error = float(np.abs(oracle[0] - target[0]).max())
    if bug is None:
        assert (host.kind, host.culprit_nodes) == ("none", ())
        assert error < ATOL
    elif position == "two-distant":
        assert error < ATOL, "the taps must not touch y"
        assert int(oracle[1][0]) != int(target[1][0])
    else:
        assert error > 1e-3
    if position == "masked" and bug is not None:
        cosine = float(np.sum(oracle[0] * target[0]) / np.linalg.norm(oracle[0]) / np.linalg.norm(target[0]))
        assert cosine > 0.999, "masked: the output error must be small relative to the output"


def _site_tensor(model: onnx.ModelProto, nodes: Sequence[str], op_type: str) -> str:
    by_name = {node.name: node for node in model.graph.node}
    return next(by_name[name].output[0] for name in nodes if by_name[name].op_type == op_type)


@pytest.mark.parametrize("num_nodes", [150, 2000])
def test_two_distant_sites_are_both_needed(num_nodes: int) -> None:
    """Blocking one site's fusions (by exposing its Div) keeps ``label``; both fused sites flip it.

    Exposing the Sub instead blocks only LayerNormFusionL1, so SimplifiedLayerNormFusion computes the
    core variant a reducer produces by cutting at the Sub: it must flip ``label`` together too.
    """
    _require("layernorm_keepdims0")
    host = _host(num_nodes, "layernorm_keepdims0", "two-distant")
    first, second = host.sites
    assert host.requires_all_sites and {"ArgMax"} <= {
        node.op_type for node in host.model.graph.node if node.name in host.support_nodes}
    variants = {
        "both": ([], True),
        "first only": ([_site_tensor(host.model, second.nodes, "Div")], False),
        "second only": ([_site_tensor(host.model, first.nodes, "Div")], False),
        "both cores": ([_site_tensor(host.model, s.nodes, "Sub") for s in host.sites], True),
    }
    oracle = _session(host.model, DISABLE)
    inputs = [host_inputs(seed) for seed in range(8)]
    expected = [oracle.run(["label"], x)[0] for x in inputs]
    for name, (exposed, flips) in variants.items():
        target = _session(_expose(host.model, exposed), ALL)
        flipped = [bool((target.run(["label"], x)[0] != want).any()) for x, want in zip(inputs, expected,
                                                                                          strict=True)]
        assert flipped == [flips] * len(inputs), name


def test_probe_exposing_the_div_hides_the_bug() -> None:
    """Layerwise probes that mark every tensor unfuse the pattern: the documented probe masking."""
    _require("layernorm_keepdims0")
    host = _host(150, "layernorm_keepdims0", "main")
    (site,) = host.sites
    probe = _expose(host.model, [_site_tensor(host.model, site.nodes, "Div")])
    assert _max_error(probe, host.inputs) < ATOL


def test_host_generation_is_deterministic_and_seeded() -> None:
    first = host_network(500, bug="layernorm_keepdims0", position="masked", seed=3)
    again = host_network(500, bug="layernorm_keepdims0", position="masked", seed=3)
    other = host_network(500, bug="layernorm_keepdims0", position="masked", seed=4)
    assert first.model.SerializeToString() == again.model.SerializeToString()
    assert first.model.SerializeToString() != other.model.SerializeToString()
    np.testing.assert_array_equal(first.inputs["x"], again.inputs["x"])


def test_several_bugs_become_independent_sites() -> None:
    host = host_network(400, bug=["layernorm_keepdims0", "relu_clip_f64"], position="branch")
    assert host.kind == "crash" and not host.requires_all_sites
    assert [site.bug for site in host.sites] == ["layernorm_keepdims0", "relu_clip_f64"]
    assert host.culprit_nodes == host.sites[1].nodes


def test_50k_node_host_builds_fast() -> None:
    start = time.perf_counter()
    host = host_network(50_000, bug="layernorm_keepdims0", position="branch")
    assert time.perf_counter() - start < 30
    assert len(host.model.graph.node) == 50_000
    assert host.model.ByteSize() < 16 * 2**20


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_nodes": 500, "bug": "layernorm"}, "unknown bug"),
    ({"num_nodes": 500, "bug": "layernorm_keepdims0", "position": "side"}, "unknown position"),
    ({"num_nodes": 500, "bug": "relu_clip_f64", "position": "two-distant"}, "two or more mismatch bugs"),
    ({"num_nodes": 50}, "too small"),
])
def test_bad_host_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        host_network(**kwargs)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------- bundled


def test_bundled_example_is_shipped_small_and_deterministic() -> None:
    model_path, inputs_path = example_model_path(), example_inputs_path()
    assert model_path.is_file() and inputs_path.is_file(), "run python -m graphbisect.examples.build_bundled"
    assert model_path.stat().st_size + inputs_path.stat().st_size < 300_000
    rebuilt = build_example()
    assert model_path.read_bytes() == rebuilt.model.SerializeToString(), "regenerate the bundled example"
    assert inputs_path.read_bytes() == npz_bytes(rebuilt.inputs)
    with np.load(inputs_path) as archive:
        assert list(archive) == ["x"]
        np.testing.assert_array_equal(archive["x"], rebuilt.inputs["x"])


def test_bundled_example_fails_at_all_vs_disable() -> None:
    _require("layernorm_keepdims0")
    model = onnx.load(example_model_path())
    onnx.checker.check_model(model, full_check=True)
    assert 150 <= len(model.graph.node) <= 300
    truth = ground_truth(model)
    assert truth is not None and truth["position"] == "branch"
    assert set(truth["culprit_nodes"]) <= set(_names(model))
    with np.load(example_inputs_path()) as archive:
        feeds = dict(archive)
    assert _max_error(model, feeds) > 0.05
    assert _max_error(model, feeds, disabled=truth["passes"]) < ATOL


# ------------------------------------------------------------------------------------------------ zoo


def test_light_models_load_and_run() -> None:
    models = light_models()
    if not models:
        pytest.skip(f"onnx {onnx.__version__} ships no backend-test light models")
    assert set(models) == set(LIGHT_MODEL_NAMES)
    for name, path in models.items():
        model = onnx.load(path)
        (output,) = _run(model, light_model_inputs(model), DISABLE)
        assert output.size == 1000, name


def test_transformer_is_large_valid_and_healthy() -> None:
    model = transformer(num_layers=24)
    onnx.checker.check_model(model, full_check=True)
    assert len(model.graph.node) >= 1300
    assert _max_error(model, transformer_inputs()) < ATOL
    truth = ground_truth(model)
    assert truth is not None and truth["kind"] == "none"


def test_transformer_bug_layer_fails() -> None:
    _require("layernorm_keepdims0")
    model = transformer(num_layers=4, seq=16, bug_layer=0)
    truth = ground_truth(model)
    assert truth is not None and set(truth["culprit_nodes"]) <= set(_names(model))
    assert _max_error(model, transformer_inputs(16)) > 1e-2
    with pytest.raises(ValueError, match="seq == hidden"):
        transformer(num_layers=4, seq=8, bug_layer=0)


@pytest.mark.parametrize("bug", [None, *sorted(BUGS)])
def test_wide_model(bug: str | None) -> None:
    _require(bug)
    host = wide_model(2000, bug=bug)
    onnx.checker.check_model(host.model, full_check=True)
    assert len(host.model.graph.node) == 2000
    assert set(host.culprit_nodes) <= set(_names(host.model))
    if bug is None:
        assert _max_error(host.model, host.inputs) < ATOL
    elif host.kind == "crash":
        assert _crashes(host.model)
    else:
        assert _max_error(host.model, host.inputs) > 1e-2
