"""The tensorrt runtime, in-process against ONNX Runtime on a small hand-built ONNX model.

UNTESTED ON A GPU IN THIS REPOSITORY SO FAR: the development machines have neither an NVIDIA GPU nor
TensorRT, so the GPU tests skip there. They run where ``tensorrt`` (≥ 10.8) imports, a CUDA memory
provider (``cuda-python`` or ``torch``) imports and CUDA sees a GPU. The option-parsing tests need neither
(the runtime module imports TensorRT only in ``load``) and run everywhere.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import ModelProto, TensorProto, helper, numpy_helper  # noqa: E402

from graphbisect.backends.tensorrt import TensorRT, parse_shapes  # noqa: E402
from graphbisect.errors import BackendUnavailableError, ModelError, SpecError  # noqa: E402


def _gpu_count() -> int:
    try:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart
        err, count = cudart.cudaGetDeviceCount()
        return int(count) if err == cudart.cudaError_t.cudaSuccess else 0
    except ImportError:
        pass
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def trt() -> object:
    """The tensorrt module; skips unless it imports and CUDA sees a GPU."""
    module = pytest.importorskip("tensorrt")
    if _gpu_count() == 0:
        pytest.skip("needs an NVIDIA GPU and cuda-python or torch")
    return module


def _model(dynamic_batch: bool) -> ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((6,)).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv_out"], ["relu_out"], name="relu"),
        helper.make_node("ReduceMean", ["relu_out"], ["y"], name="mean", keepdims=0, axes=[2, 3]),
    ]
    batch: str | int = "N" if dynamic_batch else 2
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 6])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trt")
    onnx.save(_model(False), str(folder / "static.onnx"))
    onnx.save(_model(True), str(folder / "dynamic.onnx"))
    return folder


@pytest.fixture(scope="module")
def feed() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)}


def _ort(path: Path, feed: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    model = onnx.load(str(path))
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n != "y")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feed), strict=True))


@pytest.mark.gpu
def test_outputs_and_intermediates_match_ort(trt: object, folder: Path, feed: dict[str, np.ndarray]) -> None:
    runtime = TensorRT({"tf32": "0"}, str(folder))
    runtime.load(str(folder / "static.onnx"), ["y", "conv_out"])
    got = runtime.run(feed)
    want = _ort(folder / "static.onnx", feed, ["y", "conv_out"])
    for name in ("y", "conv_out"):
        np.testing.assert_allclose(got[name], want[name], atol=1e-4, rtol=1e-4, err_msg=name)
    assert runtime.info()["built_at"] == "load"


@pytest.mark.gpu
def test_dynamic_batch_builds_at_first_run_and_fp16_runs(
    trt: object, folder: Path, feed: dict[str, np.ndarray]
) -> None:
    runtime = TensorRT({"fp16": "1", "report_layers": "1"}, str(folder))
    runtime.load(str(folder / "dynamic.onnx"), None)
    assert runtime.info()["built_at"] is None
    got = runtime.run(feed)
    want = _ort(folder / "dynamic.onnx", feed, ["y"])
    np.testing.assert_allclose(got["y"], want["y"], atol=5e-2, rtol=5e-2)
    assert runtime.info()["built_at"] == "run" and runtime.info()["layers"]


@pytest.mark.gpu
def test_unknown_tensor_fails_at_load(trt: object, folder: Path) -> None:
    runtime = TensorRT({}, str(folder))
    with pytest.raises(ModelError, match="no tensor named nope"):
        runtime.load(str(folder / "static.onnx"), ["y", "nope"])


@pytest.mark.gpu
def test_strongly_typed_network_runs_the_typed_fp16_model(trt: object, folder: Path, tmp_path: Path,
                                                          feed: dict[str, np.ndarray]) -> None:
    """TensorRT 11's mixed precision: Cast islands in the ONNX model, a strongly typed network (typed=1)."""
    from graphbisect.model import load_model
    from graphbisect.precision.lowering import Lowering
    from graphbisect.precision.modes import PrecisionMode

    model = load_model(folder / "static.onnx")
    lowering = Lowering(model, PrecisionMode.FP16, typed=True)
    typed = tmp_path / "typed.onnx"
    onnx.save(lowering.lower(keep_fp32=()), str(typed))
    proto = onnx.load(str(typed))
    assert [n.op_type for n in proto.graph.node] == ["Cast", "Conv", "Relu", "ReduceMean", "Cast"]
    assert {t.data_type for t in proto.graph.initializer} == {TensorProto.FLOAT16}
    runtime = TensorRT({"typed": "1", "report_layers": "1"}, str(tmp_path))
    runtime.load(str(typed), None)
    got = runtime.run(feed)["y"]
    want = _ort(folder / "static.onnx", feed, ["y"])["y"]
    np.testing.assert_allclose(got, want, atol=5e-2, rtol=5e-2)
    assert not np.array_equal(got, want), "an FP16 engine does not reproduce FP32 bit for bit"
    assert runtime.info()["typed"] is True


def test_option_parsing() -> None:
    assert parse_shapes("x:1x3x8x8;m:4") == {"x": (1, 3, 8, 8), "m": (4,)}
    with pytest.raises(SpecError, match="NAME:DxDxD"):
        parse_shapes("x=1x3")
    with pytest.raises(SpecError, match="out of range"):
        TensorRT({"opt_level": "9"}, "/tmp")
    with pytest.raises(SpecError, match="no option"):
        TensorRT({"int8": "1"}, "/tmp")
    with pytest.raises(SpecError, match="strongly typed"):
        TensorRT({"typed": "1", "fp16": "1"}, "/tmp")


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt is installed here")
def test_load_without_tensorrt_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailableError, match="tensorrt Python package") as info:
        TensorRT({}, str(tmp_path)).load(str(tmp_path / "model.onnx"), None)
    assert "graphbisect[tensorrt]" in (info.value.hint or "")
