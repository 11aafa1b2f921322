"""OpenVINO CPU tactics for real (no mocks): record, bit-exact replay, forced kernels change outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")

from graphbisect.backends.openvino import OpenVino
from graphbisect.tactics import TacticRecord, save_record
from graphbisect.tactics.openvino import NodeNames, onnx_node_of
from tests.tactics.tactics_builders import save_cnn

pytestmark = pytest.mark.openvino

X = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)


def _build(model: Path, work: Path, **options: str) -> tuple[np.ndarray, dict]:
    rt = OpenVino({"report_tactics": "1", **options}, str(work))
    rt.load(str(model), None)
    return rt.run({"x": X})["y"], rt.info()


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, TacticRecord]:
    folder = tmp_path_factory.mktemp("cnn")
    model = save_cnn(folder)
    y, info = _build(model, folder)
    return model, y, TacticRecord.from_json(info["tactic_record"])


def test_record_names_onnx_nodes(cnn: tuple[Path, np.ndarray, TacticRecord]) -> None:
    _, _, rec = cnn
    assert {"conv0", "conv1", "conv2", "conv3", "matmul1", "softmax"} <= set(rec.nodes)
    assert rec.as_dict()["softmax"].layer == "y"  # OpenVINO names a graph output's producer after the tensor
    assert "relu0" in rec.as_dict()["conv0"].fused
    assert all(not c.choice.endswith("_f32") for c in rec.choices)


def test_replay_of_own_record_is_bit_exact(cnn: tuple[Path, np.ndarray, TacticRecord], tmp_path: Path) -> None:
    model, y, rec = cnn
    replayed, info = _build(model, tmp_path, tactics=str(save_record(rec, tmp_path / "a.json")))
    assert np.array_equal(replayed, y)
    assert info["tactics_not_applied"] == [] and info["tactics_pinned"] == {}


def test_forced_reference_kernel_is_applied_and_changes_outputs(
    cnn: tuple[Path, np.ndarray, TacticRecord], tmp_path: Path
) -> None:
    model, y, rec = cnn
    forced = rec.with_choices({"conv2": "ref_any"})
    out, info = _build(model, tmp_path, tactics=str(save_record(forced, tmp_path / "b.json")))
    assert TacticRecord.from_json(info["tactic_record"]).choice_of("conv2") == "ref_any"
    assert info["tactics_not_applied"] == []
    assert not np.array_equal(out, y)
    assert np.allclose(out, y, atol=1e-5)  # another kernel, same math


def test_silent_fallback_is_reported(cnn: tuple[Path, np.ndarray, TacticRecord], tmp_path: Path) -> None:
    model, _, rec = cnn
    if rec.choice_of("conv0") == "jit_avx2":
        pytest.skip("this CPU's default conv kernel is jit_avx2")
    forced = rec.with_choices({"conv0": "jit_avx2"})  # 3x3 conv: the plugin falls back on AVX-512 CPUs
    _, info = _build(model, tmp_path, tactics=str(save_record(forced, tmp_path / "c.json")))
    used = TacticRecord.from_json(info["tactic_record"]).choice_of("conv0")
    expected = [] if used == "jit_avx2" else [{"node": "conv0", "requested": "jit_avx2", "used": used}]
    assert info["tactics_not_applied"] == expected


def test_onnx_node_of_handles_prefixes_and_output_tensors() -> None:
    names = NodeNames(frozenset({"/l1/conv/Conv", "softmax"}), {"y": "softmax"})
    assert onnx_node_of("/l1/conv/Conv/WithoutBiases", names) == "/l1/conv/Conv"
    assert onnx_node_of("y/sink_port_0", names) == "softmax"
    assert onnx_node_of("x_abcd_acdb_conv0", names) is None
