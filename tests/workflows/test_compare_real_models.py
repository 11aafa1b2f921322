"""`compare` on real third-party models from PyPI wheels (tests/real_models.py) against real OpenVINO."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from graphbisect.cli.main import main
from graphbisect.data import random_input_notes, random_inputs
from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models
from tests.real_models import magika, silero_vad

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


def test_relative_error_only_where_the_oracle_is_not_zero(tmp_path: Path) -> None:
    """Magika's activation multiplies by exact zeros: OpenVINO's 1e-8 there read as "max rel 1e+301"."""
    model = load_model(magika())
    result = compare_models(model, target="openvino", inputs=random_inputs(model, shapes={"bytes": (1, 2048)}),
                            workdir=tmp_path)
    assert result.layerwise is not None
    rels = [row.stats.max_rel for row in result.layerwise.rows if row.compared]
    assert all(math.isnan(rel) or rel < 1e3 for rel in rels), max(rels)


def test_random_inputs_take_the_values_the_model_compares_them_with() -> None:
    """Magika one-hot encodes bytes by Equal against 0..256 (drawn 0..9 before); Silero VAD's sample rate is
    compared with 16000 (drawn as 0..9, which picks the wrong branch)."""
    bytes_ = random_inputs(load_model(magika()), shapes={"bytes": (1, 2048)})["bytes"]
    assert bytes_.dtype == np.int32 and 200 < bytes_.max() <= 256 and bytes_.min() >= 0
    vad = load_model(silero_vad())
    assert int(random_inputs(vad, shapes={"input": (1, 512), "state": (2, 1, 128)})["sr"]) == 16000
    notes = random_input_notes(vad)
    assert "compared with: 16000" in notes["sr"] and "uniform" in notes["input"]


def test_compare_json_says_which_inputs_were_random_and_the_if_bodies(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON used to name a temporary inputs.npz deleted by then; If bodies were silently not probed."""
    out = tmp_path / "c.json"
    assert main(["compare", str(silero_vad()), "--target", "openvino", "--shape", "input:1x512",
                 "--shape", "state:2x1x128", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["inputs"] is None or Path(data["inputs"]).is_file()
    assert data["random_inputs"]["sr"].endswith("16000") and data["seed"] == 0
    assert "bodies of 1 control-flow node" in data["layerwise_note"]
    assert "random inputs" in capsys.readouterr().err


def test_outputs_below_atol_are_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Scaled to ~1e-7 (as a random-weight model's outputs), any target passes at atol 1e-4: say so."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((4, 4), 1e-8, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "tiny.onnx"))
    with caplog.at_level("WARNING"):
        result = compare_models(load_model(tmp_path / "tiny.onnx"), target="openvino", layerwise=False,
                                workdir=tmp_path / "w")
    assert result.passed
    assert any("every oracle value is within atol" in r.message and "'y'" in r.message for r in caplog.records)
