"""`compare`'s target probe as a replay of the optimized model ONNX Runtime saved, and when it is not used."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.backends import BackendProcess, BackendSpec
from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models
from tests.workflows.test_compare import _layernorm_keepdims0


def _conv_chain(channels: int = 32) -> onnx.ModelProto:
    """Conv → Relu → Conv → Relu: at ``opt_level=all`` on a CPU with NCHWc kernels (AVX2 and newer) ONNX
    Runtime fuses each Conv+Relu into an NCHWc Conv whose output stays in the blocked layout between the two."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32), w)
             for w in ("w1", "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    shape = [1, channels, 8, 8]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_fused_target_is_probed_by_replaying_the_graph_its_plain_run_built(tmp_path: Path) -> None:
    """No second optimizing build: the optimized model the plain run saved runs with optimizations off, and
    its final outputs are the plain run's bit for bit, so the table describes the build that failed."""
    result = compare_models(load_model(_layernorm_keepdims0()), workdir=tmp_path)
    probe = result.target_probe
    assert probe is not None and probe.ran == "replay" and probe.fallback is None
    assert probe.spec == "onnxruntime:opt_level=disable"
    assert result.compiled is not None and probe.exposed == len(result.compiled.surviving) - 1  # y is the output
    assert result.invocations == {"oracle": 1, "target": 2}
    assert not result.passed and not result.probe_masking
    first = result.layerwise.first_divergence if result.layerwise is not None else None
    assert first is not None and first.compiled_as is not None and first.compiled_as.kind == "LayerNormalization"
    # The probe's final outputs compare with the oracle exactly as the plain run's did.
    assert result.probed_comparison is not None and result.comparison is not None
    assert result.probed_comparison.outputs == result.comparison.outputs
    assert result.to_json()["target_probe"] == {"ran": "replay", "spec": "onnxruntime:opt_level=disable",
                                                "exposed": probe.exposed, "fallback": None}
    left = {p.name for p in (tmp_path / "target").iterdir()}
    assert not left & {"replay.onnx", "optimized.onnx", "optimized.weights"}, left


def test_the_replay_built_while_the_compiled_graph_is_mapped_is_the_one_run(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    """The target's worker builds the replay's session (BackendProcess.load: no invocation) while this process
    maps the optimized model; the replay then runs that same file with the same outputs, so the worker uses
    the session it built (tests/backends/test_process.py), and the counts are those of a replay built later."""
    calls: list[tuple[str, str, tuple[str, ...], str]] = []
    real_load, real_run = BackendProcess.load, BackendProcess.run

    def load(self: BackendProcess, model: Path, outputs: list[str] | None = None) -> bool:
        calls.append(("load", Path(model).name, tuple(outputs or ()), str(self.spec)))
        return real_load(self, model, outputs)

    def run(self: BackendProcess, model: Path, inputs: object, outputs: list[str] | None = None,
            **options: object) -> object:
        calls.append(("run", Path(model).name, tuple(outputs or ()), str(self.spec)))
        return real_run(self, model, inputs, outputs, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(BackendProcess, "load", load)
    monkeypatch.setattr(BackendProcess, "run", run)
    result = compare_models(load_model(_layernorm_keepdims0()), workdir=tmp_path)
    assert result.target_probe is not None and result.target_probe.ran == "replay"
    assert result.invocations == {"oracle": 1, "target": 2}
    loads = [call for call in calls if call[0] == "load"]
    replays = [call for call in calls if call[0] == "run" and call[1] == "replay.onnx"]
    assert len(loads) == 1 and len(replays) == 1
    assert loads[0][1:] == replays[0][1:] and replays[0][3] == "onnxruntime:opt_level=disable"


def _capture_waits_for_a_build(monkeypatch: pytest.MonkeyPatch, built: str
                               ) -> tuple[list[bool], list[tuple[str, str, tuple[str, ...]]]]:
    """Make the oracle's capture wait (up to 20 s) until a worker has begun building the file named ``built``
    (BackendProcess.compile, which load calls); returns whether each capture saw it begin in time, and every
    build without a run and every run called."""
    building = threading.Event()
    waited: list[bool] = []
    calls: list[tuple[str, str, tuple[str, ...]]] = []
    real_compile, real_run = BackendProcess.compile, BackendProcess.run

    def compile(self: BackendProcess, model: Path, outputs: list[str] | None = None) -> object:
        calls.append(("compile", Path(model).name, tuple(outputs or ())))
        if Path(model).name == built:
            building.set()
        return real_compile(self, model, outputs)

    def run(self: BackendProcess, model: Path, inputs: object, outputs: list[str] | None = None,
            **options: object) -> object:
        calls.append(("run", Path(model).name, tuple(outputs or ())))
        if Path(model).name == "probe.onnx" and options.get("output_dir") is not None:  # the oracle's capture
            waited.append(building.wait(timeout=20))
        return real_run(self, model, inputs, outputs, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(BackendProcess, "compile", compile)
    monkeypatch.setattr(BackendProcess, "run", run)
    return waited, calls


def test_the_replay_is_built_while_the_oracle_still_captures(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """On a large model the oracle's capture of every tensor ends after the target's plain run: the target's
    worker builds the replay (and this process maps its compiled graph) meanwhile, not after. Here the oracle's
    capture waits until the replay's build has started, and the result is the one of a later build."""
    waited, _ = _capture_waits_for_a_build(monkeypatch, "replay.onnx")
    result = compare_models(load_model(_layernorm_keepdims0()), workdir=tmp_path)
    assert waited == [True], "the replay was built only after the oracle's capture"
    assert result.target_probe is not None and result.target_probe.ran == "replay"
    assert result.invocations == {"oracle": 1, "target": 2}
    assert result.layerwise is not None and result.layerwise.first_divergence is not None


def test_the_probe_model_is_written_once_the_target_has_its_run_request(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """The oracle's probe model (shape inference, which holds the interpreter's lock for its whole call) and the
    mapping's view of the model are made while the target builds, and start once the target's worker has its
    run request: started before, they held the request up (~0.1 s at 5,000 nodes) while its worker waited."""
    from graphbisect.backends import process
    from graphbisect.workflows import compare

    events: list[str] = []
    real_send, real_background = process._Worker.send, compare._in_background

    def send(self: process._Worker, message: dict[str, object], deadline: float) -> None:
        real_send(self, message, deadline)
        if message.get("op") == "run" and Path(str(message["model"])).name == "model.onnx":
            events.append("target request sent")

    def in_background(job: object, name: str = "graphbisect-oracle") -> object:
        events.append(name)
        return real_background(job, name)  # type: ignore[arg-type]

    monkeypatch.setattr(process._Worker, "send", send)
    monkeypatch.setattr(compare, "_in_background", in_background)
    result = compare_models(load_model(_layernorm_keepdims0()), workdir=tmp_path)
    assert events.index("target request sent") < events.index("graphbisect-probe")
    assert events.index("target request sent") < events.index("graphbisect-original")
    assert result.target_probe is not None and result.target_probe.ran == "replay"
    assert result.invocations == {"oracle": 1, "target": 2}


def test_an_oracle_failing_after_the_target_ran_leaves_the_target_worker_on_its_spec(tmp_path: Path) -> None:
    """The replay the target's worker builds during the oracle's capture is undone when the oracle then fails
    (here it times out): a caller's worker serves the spec it was given again, and the replay file is gone."""
    from graphbisect.workflows.compare import OracleFailed
    from graphbisect.workflows.probe import describing_spec

    described = describing_spec(BackendSpec.parse("onnxruntime:opt_level=all"))
    assert described is not None
    oracle = BackendSpec.parse("onnxruntime:opt_level=disable,timeout=0.001")
    model = load_model(_layernorm_keepdims0())
    with BackendProcess(oracle, workdir=tmp_path / "o") as oracle_proc, \
            BackendProcess(described, workdir=tmp_path / "t") as target_proc:
        with pytest.raises(OracleFailed):
            compare_models(model, oracle=oracle, target="onnxruntime:opt_level=all", workdir=tmp_path / "c",
                           workers=(oracle_proc, target_proc))
        assert target_proc.spec == described
        assert not list((tmp_path / "t").rglob("replay.onnx"))


def test_a_replay_that_cannot_expose_every_surviving_tensor_is_not_used() -> None:
    """ONNX Runtime's NCHWc Conv keeps ``r1`` only in its blocked layout (as ``reorder_token_*``): the saved
    model has no tensor ``r1`` to expose, so the probe model is built again, as before, and the result says why."""
    result = compare_models(load_model(_conv_chain()))
    assert result.compiled is not None
    if not any(node.name.endswith("_nchwc") for node in result.compiled.nodes):
        pytest.skip("this CPU has no NCHWc kernels: ONNX Runtime keeps the NCHW layout")
    probe = result.target_probe
    assert probe is not None and probe.ran == "probe model"
    assert probe.spec == "onnxruntime:opt_level=all,save_optimized=1"
    assert probe.fallback is not None and "(r1)" in probe.fallback and "NCHWc" in probe.fallback
    assert result.to_json()["target_probe"]["fallback"] == probe.fallback
    assert result.passed and result.layerwise is not None
    assert {row.tensor for row in result.layerwise.rows if row.compared} == {"r1", "y"}


def test_a_probe_model_the_replay_cannot_stand_for_is_built_while_the_oracle_still_captures(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Once the compiled graph is mapped the replay is known not to expose ``r1`` (NCHWc): the target's worker
    builds the probe model then, during the oracle's capture, not after it (~0.1 s of the critical path of an
    OCR model). Here the oracle's capture waits until that build has started; the probe's run then uses the
    session built ahead (the same file and outputs), and the counts are those of a probe built later."""
    waited, calls = _capture_waits_for_a_build(monkeypatch, "probe-target.onnx")
    result = compare_models(load_model(_conv_chain()), workdir=tmp_path)
    assert result.compiled is not None
    if not any(node.name.endswith("_nchwc") for node in result.compiled.nodes):
        pytest.skip("this CPU has no NCHWc kernels: ONNX Runtime keeps the NCHW layout")
    assert waited == [True], "the probe model was built only after the oracle's capture"
    probe = result.target_probe
    assert probe is not None and probe.ran == "probe model" and probe.fallback is not None
    assert ("compile", "probe-target.onnx", ()) in calls and ("run", "probe-target.onnx", ()) in calls
    assert result.invocations == {"oracle": 1, "target": 2}
    assert result.backend_calls["target"]["compiles"] == 3  # the plain build, the replay's, the probe's: once each
    assert result.passed and result.layerwise is not None
    assert {row.tensor for row in result.layerwise.rows if row.compared} == {"r1", "y"}


@pytest.mark.openvino
def test_openvino_probe_model_is_built_while_the_oracle_still_captures(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """OpenVINO has no replay of what it compiled, so its probe is the model with the surviving tensors exposed:
    its worker builds it once the execution graph is mapped, during the oracle's capture (built after it, it was
    ~0.2 s more after a `reference` capture of an 860-node OCR model). Here the oracle's capture waits until that
    build has started; the run that follows uses it, the counts are a probe's built later, and so is the table."""
    pytest.importorskip("openvino")
    from graphbisect.workflows import compare

    model = load_model(_conv_chain())
    with monkeypatch.context() as before:  # the probe model built after the capture, as before
        before.setattr(compare._ProbeAhead, "start", staticmethod(lambda *_args: lambda: None))
        later = compare_models(model, target="openvino", workdir=tmp_path / "later")
    waited, calls = _capture_waits_for_a_build(monkeypatch, "probe-target.onnx")
    result = compare_models(model, target="openvino", workdir=tmp_path / "ahead")
    assert waited == [True], "the probe model was built only after the oracle's capture"
    probe = result.target_probe
    assert probe is not None and probe.ran == "probe model" and probe.fallback is None
    assert ("compile", "probe-target.onnx", ()) in calls and ("run", "probe-target.onnx", ()) in calls
    assert result.invocations == later.invocations == {"oracle": 1, "target": 2}
    assert result.backend_calls["target"] == later.backend_calls["target"]  # runs 2; the builds: plain, probe,
    # and OpenVINO's precision probe of its config
    assert result.layerwise is not None and later.layerwise is not None
    assert [(row.tensor, row.stats.to_json()) for row in result.layerwise.rows] == \
        [(row.tensor, row.stats.to_json()) for row in later.layerwise.rows]
    assert any(row.compared for row in result.layerwise.rows if row.tensor != "y")


@pytest.mark.openvino
def test_a_probe_model_that_fails_to_build_ahead_is_not_built_again(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """A probe model built ahead that OpenVINO cannot load (here its file is truncated before the build, a real
    failure of the real backend) is the probe's result as it is: reported, not built a second time (for a
    compiler target that would be a second compile of minutes that fails the same way)."""
    pytest.importorskip("openvino")
    calls: list[str] = []
    real_compile, real_run = BackendProcess.compile, BackendProcess.run

    def compile(self: BackendProcess, model: Path, outputs: list[str] | None = None) -> object:
        if Path(model).name == "probe-target.onnx":
            Path(model).write_bytes(Path(model).read_bytes()[:100])
        calls.append(f"compile {Path(model).name}")
        return real_compile(self, model, outputs)

    def run(self: BackendProcess, model: Path, *args: object, **options: object) -> object:
        calls.append(f"run {Path(model).name}")
        return real_run(self, model, *args, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(BackendProcess, "compile", compile)
    monkeypatch.setattr(BackendProcess, "run", run)
    result = compare_models(load_model(_conv_chain()), target="openvino", workdir=tmp_path)
    assert calls.count("compile probe-target.onnx") == 1 and "run probe-target.onnx" not in calls
    assert result.invocations == {"oracle": 1, "target": 1}
    assert result.passed and result.layerwise_note is not None
    assert "the target failed on the probe model" in result.layerwise_note


@pytest.mark.openvino
def test_an_oracle_failing_while_the_probe_model_builds_ahead_is_raised_at_once(monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Path) -> None:
    """The oracle times out after the target's plain run, while the target's worker builds the probe model ahead:
    the oracle's error is raised then, not after that build (a compiler target's build takes minutes; here it is
    held for 30 s). Nothing waits for it: the workers are closed, and the build, let go, fails on its own."""
    pytest.importorskip("openvino")
    from graphbisect.workflows.compare import OracleFailed

    release = threading.Event()
    real_compile = BackendProcess.compile

    def compile(self: BackendProcess, model: Path, outputs: list[str] | None = None) -> object:
        if Path(model).name == "probe-target.onnx":
            release.wait(30)
        return real_compile(self, model, outputs)

    monkeypatch.setattr(BackendProcess, "compile", compile)
    started = time.monotonic()
    try:
        with pytest.raises(OracleFailed):
            compare_models(load_model(_conv_chain()), oracle="onnxruntime:opt_level=disable,timeout=0.001",
                           target="openvino", workdir=tmp_path)
        assert time.monotonic() - started < 20
    finally:
        release.set()


def _contrib_gelu() -> onnx.ModelProto:
    """MatMul → com.microsoft Gelu → Relu → MatMul → Sigmoid: onnx's shape inference knows no contrib op, so
    ``g``, ``r`` and ``m2`` have no inferred type (ONNX Runtime runs them all the same)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), w) for w in ("w1", "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
             helper.make_node("Gelu", ["m1"], ["g"], name="gelu", domain="com.microsoft"),
             helper.make_node("Relu", ["g"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["m2"], name="mm2"),
             helper.make_node("Sigmoid", ["m2"], ["y"], name="sig")]
    graph = helper.make_graph(nodes, "contrib", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def test_a_replay_that_cannot_declare_a_surviving_tensor_is_not_used() -> None:
    """The replay declares each tensor it exposes with the model's element type (so ORT refuses one its
    optimized graph computes in another type); ``g``, ``r`` and ``m2`` have none, so the probe model is built
    as before (exposing them untyped) and the result says why."""
    result = compare_models(load_model(_contrib_gelu()))
    probe = result.target_probe
    assert probe is not None and probe.ran == "probe model"
    assert probe.spec == "onnxruntime:opt_level=all,save_optimized=1"
    assert probe.fallback is not None and "no type" in probe.fallback and "g, r, m2" in probe.fallback
    assert result.to_json()["target_probe"]["fallback"] == probe.fallback
    assert result.invocations == {"oracle": 1, "target": 2}  # nothing was run for the replay
    assert result.passed and result.layerwise is not None
    assert {row.tensor for row in result.layerwise.rows if row.compared} == {"m1", "g", "r", "m2", "y"}
