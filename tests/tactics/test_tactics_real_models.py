"""Tactic replay on a real model: PP-OCR's direction classifier (rapidocr wheel), whose Convs are fused with
their BatchNormalization by OpenVINO (the kernel runs as a plugin-made ``Multiply_NNN`` Convolution that the
record names by the BatchNormalization node)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graphbisect.cli.main import main
from graphbisect.model import load_model
from graphbisect.tactics import TacticRecord, save_record
from graphbisect.workflows.tactics import record_tactics, replay_tactics
from tests.real_models import rapidocr_model

pytest.importorskip("openvino")
pytestmark = pytest.mark.openvino


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray], TacticRecord]:
    path = rapidocr_model()
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 48, 192)).astype(np.float32)}
    result = record_tactics(load_model(path), "openvino", inputs=feeds, workdir=tmp_path_factory.mktemp("rec"))
    return path, feeds, result.record


def test_a_kernel_is_forced_on_a_fused_conv_batchnorm(recorded: tuple[Path, dict[str, np.ndarray], TacticRecord],
                                                       tmp_path: Path) -> None:
    """It used to fail with "OpenVINO's IR has no layer named Multiply_NNN"."""
    path, feeds, record = recorded
    fused = next(c for c in record.choices if c.node.startswith("BatchNormalization") and c.layer_type == "Convolution")
    assert fused.layer != fused.node  # the plugin's own layer, not an ONNX node
    wanted = record.with_choices({fused.node: "ref_any"})
    result = replay_tactics(load_model(path), "openvino", wanted, inputs=feeds, workdir=tmp_path)
    assert result.run.ok, result.run.describe()
    assert result.actual.as_dict()[fused.node].choice == "ref_any"
    assert fused.node not in {item.node for item in result.not_applied}


def test_replay_does_not_say_ok_when_a_choice_was_not_applied(
        recorded: tuple[Path, dict[str, np.ndarray], TacticRecord], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """OpenVINO's Reduce keeps its kernel whatever is asked: the summary line must say so, not "ok"."""
    path, _feeds, record = recorded
    reduce = next(c for c in record.choices if c.layer_type == "Reduce")
    forced = save_record(record.with_choices({reduce.node: "ref_any"}), tmp_path / "forced.json")
    code = main(["tactics", "replay", str(path), str(forced), "--shape", "x:1x3x48x192",
                 "--workdir", str(tmp_path / "w")])
    first = capsys.readouterr().out.splitlines()[0]
    assert code == 1
    assert "NOT APPLIED" in first and ": ok" not in first
