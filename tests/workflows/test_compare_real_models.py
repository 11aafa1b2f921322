"""`compare` on real third-party models from PyPI wheels (tests/real_models.py) against real OpenVINO."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models
from tests.real_models import silero_vad

pytest.importorskip("openvino")
pytestmark = pytest.mark.openvino


def test_constants_openvino_stores_differently_are_never_causes(tmp_path: Path) -> None:
    """Silero VAD (OpenVINO export) passes on OpenVINO, but with every tensor exposed its Slice ends of
    INT64_MIN come back as INT32_MIN (score inf): they used to be the first divergence and top root causes."""
    result = compare_models(load_model(silero_vad("silero_vad_openvino_16k.onnx")), target="openvino",
                            all_tensors=True, workdir=tmp_path)
    assert result.passed
    layers = result.layerwise
    assert layers is not None
    assert layers.first_divergence is None and layers.root_causes == ()
    flagged = layers.differing_constants
    assert flagged and all(row.op_type == "Constant" for row in flagged)
    assert all(row["constant"] for row in result.to_json()["layers"] if row["node"] in {r.node for r in flagged})
