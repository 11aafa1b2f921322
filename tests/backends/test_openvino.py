"""The openvino runtime, in-process against ONNX Runtime on small hand-built ONNX models.

Real OpenVINO (CPU plugin). Pins: f32 is the default precision even where the CPU would pick bf16;
intermediates come back by ONNX tensor name, both from a probe model (graph outputs added with
onnx.helper, as the host does) and from names the runtime adds itself; values match ORT.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ov = pytest.importorskip("openvino")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import ModelProto, TensorProto, helper, numpy_helper  # noqa: E402

from graphbisect.backends.openvino import OpenVino  # noqa: E402
from graphbisect.compare import compare_tensors  # noqa: E402
from graphbisect.errors import InputError, ModelError, SpecError  # noqa: E402
from tests.cpu_premises import openvino_dynamic_quantization  # noqa: E402

pytestmark = pytest.mark.openvino

INTERMEDIATES = ["conv_out", "bias_out", "relu_out", "pooled"]


def _model() -> ModelProto:
    """x[N,3,8,8] → Conv → Add(bias) → Relu → GlobalAveragePool → Flatten → MatMul → Add → y[N,5]."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((1, 6, 1, 1)).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.standard_normal((5,)).astype(np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["conv_out", "b"], ["bias_out"], name="bias"),
        helper.make_node("Relu", ["bias_out"], ["relu_out"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu_out"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc_w"], ["mm"], name="fc"),
        helper.make_node("Add", ["mm", "fc_b"], ["y"], name="fc_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ov")
    model = _model()
    plain = folder / "model.onnx"
    onnx.save(model, str(plain))
    probe = ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in INTERMEDIATES)
    probe_path = folder / "probe.onnx"
    onnx.save(probe, str(probe_path))
    return {"plain": plain, "probe": probe_path, "workdir": folder}


@pytest.fixture(scope="module")
def feed() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)}


@pytest.fixture(scope="module")
def oracle(paths: dict[str, Path], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ORT on the probe model (no graph optimizations): every tensor of interest, by name."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(paths["probe"]), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def _assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], names: list[str]) -> None:
    assert sorted(got) == sorted(names)
    for name in names:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5, err_msg=name)


def test_model_outputs_match_ort_in_f32_by_default(
    paths: dict[str, Path], feed: dict[str, np.ndarray], oracle: dict[str, np.ndarray]
) -> None:
    runtime = OpenVino({}, str(paths["workdir"]))
    runtime.load(str(paths["plain"]), None)
    _assert_close(dict(runtime.run(feed)), oracle, ["y"])
    info = runtime.info()
    assert info["precision"] == "f32"
    assert info["inference_precision"] == "f32"
    assert info["outputs"] == {"y": ["y"]}


def test_probe_model_outputs_by_onnx_name(
    paths: dict[str, Path], feed: dict[str, np.ndarray], oracle: dict[str, np.ndarray]
) -> None:
    runtime = OpenVino({}, str(paths["workdir"]))
    runtime.load(str(paths["probe"]), ["y", *INTERMEDIATES])
    _assert_close(dict(runtime.run(feed)), oracle, ["y", *INTERMEDIATES])
    # Without a selection, a probe model's own outputs come back under their ONNX names.
    runtime.load(str(paths["probe"]), None)
    assert sorted(runtime.run(feed)) == sorted(["y", *INTERMEDIATES])


def test_runtime_adds_intermediates_itself(
    paths: dict[str, Path], feed: dict[str, np.ndarray], oracle: dict[str, np.ndarray]
) -> None:
    runtime = OpenVino({"threads": "1"}, str(paths["workdir"]))
    runtime.load(str(paths["plain"]), ["conv_out", "relu_out"])  # not graph outputs of model.onnx
    _assert_close(dict(runtime.run(feed)), oracle, ["conv_out", "relu_out"])


def test_unknown_tensor_fails_at_load(paths: dict[str, Path]) -> None:
    runtime = OpenVino({}, str(paths["workdir"]))
    with pytest.raises(ModelError, match="no tensor named no_such_tensor"):
        runtime.load(str(paths["plain"]), ["y", "no_such_tensor"])


def test_exec_graph_report(paths: dict[str, Path]) -> None:
    runtime = OpenVino({"report_exec": "1"}, str(paths["workdir"]))
    runtime.load(str(paths["plain"]), None)
    nodes = runtime.info()["exec_graph"]
    assert nodes and {"name", "layer_type", "primitive_type", "runtime_precision", "original_layers"} <= set(nodes[0])
    convs = [n for n in nodes if n["layer_type"] == "Convolution"]
    assert convs and "conv" in convs[0]["original_layers"]
    assert all(n["runtime_precision"] != "bf16" for n in nodes), "f32 by default"


def test_bf16_differs_where_the_cpu_has_it(
    paths: dict[str, Path], feed: dict[str, np.ndarray], oracle: dict[str, np.ndarray]
) -> None:
    if "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("this CPU has no bf16")
    runtime = OpenVino({"precision": "bf16"}, str(paths["workdir"]))
    runtime.load(str(paths["plain"]), None)
    got = runtime.run(feed)["y"]
    assert runtime.info()["inference_precision"] == "bf16"
    assert np.abs(got - oracle["y"]).max() > 1e-4, "bf16 is visibly less exact than the f32 default"


def test_inputs_are_checked(paths: dict[str, Path], feed: dict[str, np.ndarray]) -> None:
    runtime = OpenVino({}, str(paths["workdir"]))
    runtime.load(str(paths["plain"]), None)
    with pytest.raises(InputError, match="missing: x"):
        runtime.run({})
    with pytest.raises(InputError, match="unknown: z"):
        runtime.run({**feed, "z": feed["x"]})


@pytest.mark.parametrize(
    ("options", "match"),
    [({"precision": "int4"}, "precision"), ({"threads": "many"}, "integer"), ({"colour": "1"}, "no option")],
)
def test_bad_options(options: dict[str, str], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        OpenVino(options, "/tmp")


# --- config=: other OpenVINO properties (issue 26) --------------------------------------------------------


@pytest.fixture(scope="module")
def int8_weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    from graphbisect.examples.quantized import int8_weight_model

    model, inputs = int8_weight_model()
    path = tmp_path_factory.mktemp("int8w") / "int8w.onnx"
    onnx.save(model, str(path))
    return path, inputs


def _ort(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def test_config_keys_reach_the_compiled_model(int8_weights: tuple[Path, dict[str, np.ndarray]],
                                              tmp_path: Path) -> None:
    # The CPU plugin quantizes an int8-weight FullyConnected's activations to i8 by default (group size 32):
    # hundreds of tolerances off. DYNAMIC_QUANTIZATION_GROUP_SIZE=0 turns that off, and the run info says so.
    # Only on a CPU with AVX2-VNNI or AVX512-VNNI: elsewhere both compute in f32, and only the compiled
    # model's own properties show that the keys reached it.
    path, feed = int8_weights
    want = _ort(path, feed)
    scores, group_sizes = {}, {}
    for config in ("", "DYNAMIC_QUANTIZATION_GROUP_SIZE=0;NUM_STREAMS=1"):
        runtime = OpenVino({"config": config, "report_exec": "1"}, str(tmp_path))
        runtime.validate()
        runtime.load(str(path), None)
        scores[config] = compare_tensors("y", want, runtime.run(feed)["y"]).score  # in tolerances
        info = runtime.info()
        group_sizes[config] = info["dynamic_quantization_group_size"]  # the compiled model's property
        fc = [n for n in info["exec_graph"] if n["layer_type"] == "FullyConnected"]
        assert [n["runtime_precision"] for n in fc] == ["i8"]  # i8 weights in both: the activations differ
    assert info["config"] == {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0", "NUM_STREAMS": "1"}
    assert group_sizes[""] > 0 and group_sizes["DYNAMIC_QUANTIZATION_GROUP_SIZE=0;NUM_STREAMS=1"] == 0
    assert scores["DYNAMIC_QUANTIZATION_GROUP_SIZE=0;NUM_STREAMS=1"] < 1
    if openvino_dynamic_quantization().active:
        assert scores[""] > 100
    else:  # no dynamic quantization on this CPU: the default computes in f32 too
        assert scores[""] < 1


@pytest.mark.parametrize(("config", "match"), [
    ("DYNAMIC_QUANTIZATION_GROUP_SIZE", "not KEY=VALUE"),
    ("INFERENCE_PRECISION_HINT=bf16", "precision="),
    ("INFERENCE_NUM_THREADS=2", "threads="),
    ("NUM_STREAMS=1;NUM_STREAMS=2", "given twice"),
])
def test_config_entries_are_checked_when_the_spec_is_read(config: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        OpenVino({"config": config}, "/tmp")


@pytest.mark.parametrize(("config", "match"), [
    ("NO_SUCH_PROPERTY=1", "Unsupported property NO_SUCH_PROPERTY"),
    ("DYNAMIC_QUANTIZATION_GROUP_SIZE=many", "Expected only unsigned integer"),
])
def test_validate_refuses_what_the_device_refuses(config: str, match: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=match) as caught:
        OpenVino({"config": config}, str(tmp_path)).validate()
    assert "DYNAMIC_QUANTIZATION_GROUP_SIZE" in (caught.value.hint or "")  # the keys the device takes
    assert caught.value.__cause__ is not None  # OpenVINO's own error stays the cause


# --- keep_fp32: per-node FP32 pins under bf16 -----------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_cpu() -> None:
    capabilities = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if "BF16" not in capabilities:
        pytest.skip(f"this CPU has no BF16 (OpenVINO CPU capabilities: {', '.join(capabilities)}): "
                    "precision=bf16 would run f32 and there is nothing to pin")


def _precisions(runtime: OpenVino) -> dict[str, str]:
    """Runtime precision of each arithmetic kernel of the last build, by execution node name."""
    arithmetic = {"Convolution", "Reduce", "FullyConnected", "Eltwise", "Pooling", "MVN", "Subgraph"}
    return {n["name"]: n["runtime_precision"] for n in runtime.info()["exec_graph"] if n["layer_type"] in arithmetic}


def test_keep_fp32_pins_one_node_to_f32_in_the_execution_graph(
    paths: dict[str, Path], feed: dict[str, np.ndarray], bf16_cpu: None
) -> None:
    plain = OpenVino({"precision": "bf16", "report_exec": "1"}, str(paths["workdir"]))
    plain.load(str(paths["plain"]), None)
    pinned = OpenVino({"precision": "bf16", "report_exec": "1", "keep_fp32": "conv"}, str(paths["workdir"]))
    pinned.load(str(paths["plain"]), None)
    # The Conv kernel (Conv, bias Add and Relu fused) switches to f32; the rest stays bf16.
    assert _precisions(plain) == {"conv": "bf16", "pool": "bf16", "y": "bf16"}
    assert _precisions(pinned) == {"conv": "f32", "pool": "bf16", "y": "bf16"}
    assert pinned.info()["keep_fp32"] == {"requested": 1, "missing": [], "pinned_layers": 1, "not_applied": [],
                                          "partly_applied": [], "unverified": []}
    assert not np.array_equal(plain.run(feed)["y"], pinned.run(feed)["y"])


def test_keep_fp32_reports_the_pins_the_plugin_drops(paths: dict[str, Path], bf16_cpu: None) -> None:
    """MatMul + bias Add become one FullyConnected (named after the Add) that does not inherit the mark: it
    computes in bf16 (its output is f32 only because it is the graph output). Reported, not hidden."""
    everything = "conv;bias;relu;pool;flatten;fc;fc_bias"
    runtime = OpenVino({"precision": "bf16", "report_exec": "1", "keep_fp32": everything}, str(paths["workdir"]))
    runtime.load(str(paths["plain"]), None)
    assert _precisions(runtime) == {"conv": "f32", "pool": "f32", "y": "bf16"}
    facts = runtime.info()["keep_fp32"]
    assert (facts["not_applied"], facts["partly_applied"], facts["unverified"]) == ([], ["fc_bias"], ["fc"])


def test_keep_fp32_file_is_read_at_every_load(paths: dict[str, Path], tmp_path: Path, bf16_cpu: None) -> None:
    pin_file = tmp_path / "keep.txt"
    pin_file.write_text("conv\nno_such_node\n")
    runtime = OpenVino({"precision": "bf16", "report_exec": "1", "keep_fp32": f"@{pin_file}"}, str(tmp_path))
    runtime.load(str(paths["plain"]), None)
    assert _precisions(runtime)["conv"] == "f32" and _precisions(runtime)["pool"] == "bf16"
    assert runtime.info()["keep_fp32"]["missing"] == ["no_such_node"]
    pin_file.write_text('["pool"]')  # a JSON list works too
    runtime.load(str(paths["plain"]), None)
    assert _precisions(runtime)["conv"] == "bf16" and _precisions(runtime)["pool"] == "f32"


def test_keep_fp32_check_sees_an_int64_outputs_renamed_kernel(tmp_path: Path) -> None:
    """OpenVINO computes the int64 MatMul writing graph output ``s`` as execution node ``s.0`` (f32) and converts
    it back in ``s.0.0``: the check finds the kernel. Before, no kernel mapped to ``mm`` and it was reported
    unverified ("no kernel names it")."""
    from tests.tactics.tactics_builders import save_int64_output

    runtime = OpenVino({"report_exec": "1", "keep_fp32": "mm"}, str(tmp_path))
    runtime.load(str(save_int64_output(tmp_path)), None)
    assert "s.0" in {n["name"] for n in runtime.info()["exec_graph"]}
    assert runtime.info()["keep_fp32"]["unverified"] == []


def test_keep_fp32_check_is_not_fooled_by_a_convert_back() -> None:
    """Execution graph captured from OpenVINO 2026.4 (bf16, no pin applied): Conv ``conv`` writes f64 graph output
    ``c``, computed in bf16 as ``c`` and converted back to f64 by ``c.0`` in f32. The Convert also maps to
    ``conv`` (``.N`` rename) but does not compute it: the pin is not applied, not "partly applied"."""
    from graphbisect.backends.openvino import _Pins
    from graphbisect.tactics.openvino import NodeNames

    def node(name: str, kind: str, precision: str, out: str, originals: list[str]) -> dict[str, object]:
        return {"name": name, "layer_type": kind, "primitive_type": "x", "runtime_precision": precision,
                "output_precisions": out, "original_layers": originals}

    exec_graph = [node("x", "Input", "f64", "f64", ["x"]),
                  node("Convert_3640", "Convert", "f64", "bf16", ["Convert_3640"]),
                  node("Convert_3640_abcd_acdb_c", "Reorder", "bf16", "bf16", []),
                  node("c", "Convolution", "bf16", "bf16", ["c"]),
                  node("c_bf16_f32_y", "Reorder", "bf16", "f32", []),
                  node("y", "Subgraph", "f32", "f32", ["y"]),
                  node("y.0", "Convert", "f32", "f64", ["y.0"]),
                  node("c_bf16_acdb_f32_abcd_c.0", "Reorder", "bf16", "f32", []),
                  node("c.0", "Convert", "f32", "f64", ["c.0"])]
    pins = _Pins(NodeNames(frozenset({"conv", "relu"}), {"c": "conv", "y": "relu"}),
                 {"c": {"conv"}, "y": {"relu"}}, frozenset({"conv"}), [])
    pins.check(exec_graph)
    assert (pins.not_applied, pins.partly_applied, pins.unverified) == (["conv"], [], [])


@pytest.mark.parametrize("value", ["@relative/keep.txt", "@/no/such/keep.txt"])
def test_keep_fp32_file_must_exist_by_absolute_path(value: str) -> None:
    with pytest.raises(SpecError, match="keep_fp32"):
        OpenVino({"keep_fp32": value}, "/tmp")


def test_the_openvino_override_snippet_builds_what_the_backend_builds(
    paths: dict[str, Path], feed: dict[str, np.ndarray], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    bf16_cpu: None,
) -> None:
    """The snippet `graphbisect precision -o` writes for OpenVINO is run as a user would: same kernels, same values."""
    from graphbisect.artifacts.overrides import PrecisionOverrides

    snippet = PrecisionOverrides("bf16", ("conv",), ("Conv",), ("pool", "fc")).snippets()["openvino"]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"onnx_path": str(paths["plain"])}
    exec(compile(snippet, "snippets.py", "exec"), namespace)
    compiled = namespace["compiled"]
    kernels = {op.get_friendly_name(): op.get_rt_info()["runtimePrecision"].astype(str)
               for op in compiled.get_runtime_model().get_ordered_ops()  # type: ignore[attr-defined]
               if op.get_rt_info()["layerType"].astype(str) in ("Convolution", "Reduce", "FullyConnected")}
    assert kernels == {"conv": "f32", "pool": "bf16", "y": "bf16"}
    assert (tmp_path / "keep_fp32.xml").is_file()

    backend = OpenVino({"precision": "bf16", "keep_fp32": "conv"}, str(tmp_path))
    backend.load(str(paths["plain"]), None)
    from_snippet = compiled(feed)[0]  # type: ignore[operator]
    np.testing.assert_array_equal(from_snippet, backend.run(feed)["y"])
