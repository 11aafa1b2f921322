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
