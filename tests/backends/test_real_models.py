"""Backends on real third-party models from PyPI wheels (see tests/real_models.py).

Silero VAD (``silero_vad_op18_ifless.onnx``: inputs ``input`` [batch, samples], ``state`` [2, batch, 128] and
a 0-d int64 sample rate ``sr``, compared with ``Equal`` against the constant 16000 to pick an ``If`` branch).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graphbisect.backends import BackendProcess
from tests.real_models import silero_vad

pytest.importorskip("openvino")


def _vad_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "input": rng.uniform(-1, 1, (1, 512)).astype(np.float32),
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, dtype=np.int64),  # 0-d, as the model declares it
    }


@pytest.mark.openvino
def test_openvino_feeds_a_scalar_input_as_a_scalar(tmp_path: Path) -> None:
    """OpenVINO refuses a [1] tensor for a [] port; a 0-d input must reach it 0-d (it used to be made [1])."""
    model = silero_vad()
    with BackendProcess("onnxruntime:opt_level=disable", workdir=tmp_path / "ort") as ort, \
            BackendProcess("openvino", workdir=tmp_path / "ov") as ov:
        expected = ort.run(model, _vad_inputs())
        got = ov.run(model, _vad_inputs())
    assert got.ok, got.describe()
    assert set(got.outputs) == set(expected.outputs) == {"output", "stateN"}
    for name, value in expected.outputs.items():
        assert got.outputs[name].shape == value.shape
        np.testing.assert_allclose(got.outputs[name], value, atol=1e-4, rtol=1e-3)


def test_worker_returns_0d_outputs_0d(tmp_path: Path) -> None:
    """The sample rate after Reshape→Gather is 0-d in ONNX Runtime; the worker must not store it as [1]."""
    import onnx

    model = onnx.load(str(silero_vad()))
    gathered = next(n.output[0] for n in model.graph.node if n.op_type == "Gather")
    model.graph.output.append(onnx.helper.make_tensor_value_info(gathered, onnx.TensorProto.INT64, []))
    path = tmp_path / "vad_probe.onnx"
    onnx.save(model, str(path))
    with BackendProcess("onnxruntime", workdir=tmp_path / "ort") as ort:
        result = ort.run(path, _vad_inputs(), [gathered, "output"])
    assert result.ok, result.describe()
    assert result.outputs[gathered].shape == ()
    assert int(result.outputs[gathered]) == 16000


def _col2im_model(path: Path) -> Path:
    """One Col2Im whose block count does not add up: another OpenVINO conversion failure at load."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Col2Im", ["x", "size", "block"], ["y"], name="c2i")], "col2im",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([3, 3], np.int64), "size"),
         numpy_helper.from_array(np.array([1, 2], np.int64), "block")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(path))
    return path


@pytest.mark.openvino
def test_openvino_load_errors_keep_their_cause(tmp_path: Path) -> None:
    """Every OpenVINO load error starts "Exception from src/inference/src/cpp/core.cpp:84:": the signature and
    the CLI line must carry what follows (silero-vad's half model: a Conv inside an If has no static rank)."""
    from graphbisect.oracle.signature import signature_of

    with BackendProcess("openvino", workdir=tmp_path / "ov") as ov:
        half = {k: v for k, v in _vad_inputs().items() if k != "sr"}  # this variant has no sr input
        conv = ov.run(silero_vad("silero_vad_half.onnx"), half)
        col2im = ov.run(_col2im_model(tmp_path / "col2im.onnx"), {"x": np.zeros((1, 4, 4), np.float32)})
    assert not conv.ok and not col2im.ok
    assert conv.message and conv.message.startswith("Exception from src/inference/src/cpp/core.cpp")
    assert not signature_of(conv, None).matches(signature_of(col2im, None))
    assert "has to be known (static)" in signature_of(conv, None).detail
    assert "Exception from" not in conv.describe()
    assert "The input data tensor's rank has to be known (static)" in conv.describe()


def test_reference_crash_signature_ignores_the_known_tensor_names(tmp_path: Path) -> None:
    """onnx.reference fails on Silero's sequence model (its LSTM yields no cell state `cn`) with every known
    tensor name and the whole model in the message; the LSTM alone fails the same way."""
    import onnx

    from graphbisect.oracle.signature import signature_of

    full = silero_vad("silero_vad_16k_sequence.onnx")
    model = onnx.load(str(full))
    lstm = next(n for n in model.graph.node if n.op_type == "LSTM")
    alone = tmp_path / "lstm.onnx"
    weights = {t.name for t in model.graph.initializer}
    onnx.utils.extract_model(str(full), str(alone), [x for x in lstm.input if x and x not in weights],
                             list(lstm.output))
    inputs = {"input": np.zeros((1, 576), np.float32), "h": np.zeros((1, 1, 128), np.float32),
              "c": np.zeros((1, 1, 128), np.float32)}
    small = onnx.load(str(alone))
    feed = {i.name: np.zeros([d.dim_value or 1 for d in i.type.tensor_type.shape.dim], np.float32)
            for i in small.graph.input if i.name not in {t.name for t in small.graph.initializer}}
    assert len(small.graph.node) == 1 < len(model.graph.node)
    with BackendProcess("reference", workdir=tmp_path / "ref") as ref:
        whole, one = ref.run(full, inputs), ref.run(alone, feed)
    assert not whole.ok and not one.ok, (whole.describe(), one.describe())
    assert signature_of(whole, None).matches(signature_of(one, None)), (signature_of(whole, None).detail,
                                                                        signature_of(one, None).detail)
    assert len(signature_of(whole, None).detail) < 300
    assert len(whole.describe()) < 700
