"""Issue 26, items 1 and 2, on real backends: quantized models on OpenVINO against ONNX Runtime.

1. An int8-weight MiniLM layer (:func:`~graphbisect.examples.quantized.int8_weight_model`): OpenVINO's default
   dynamic quantization computes its FullyConnected in i8, hundreds of tolerances off; ``compare`` shows the i8
   the backend ran where the model computes f32, ``openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0`` passes,
   and a bundle records the key, which ``repro.py`` and ``verify`` apply; ``reduce``'s report says it too.
2. A QDQ network (:func:`~graphbisect.examples.quantized.qdq_model`) whose QuantizeLinears OpenVINO rounds 1 LSB
   apart from ONNX at hundreds of values, beside a weight-only-int8 MatMul (``fc``) that its dynamic quantization
   puts tens of LSB off at its int16 QuantizeLinear: quantized tensors are compared in quantization steps, so the
   1-LSB rounding passes and the planted node is localized first; without the dynamic quantization no row fails.

OpenVINO quantizes activations dynamically only on a CPU with AVX2-VNNI or AVX512-VNNI: elsewhere it computes the
int8-weight FullyConnected in f32 whatever the group size, and the tests that need the wrong result skip, saying
so (:func:`tests.cpu_premises.openvino_dynamic_quantization` checks it on the real backend).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.artifacts.compare_report import write_csv, write_html, write_json
from graphbisect.cli.main import main
from graphbisect.examples.quantized import QDQ_PLANTED, int8_weight_model, qdq_model
from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models
from graphbisect.workflows.verify import verify_bundle
from tests.cpu_premises import require_openvino_dynamic_quantization

pytest.importorskip("openvino")
pytestmark = pytest.mark.openvino

ORACLE = "onnxruntime:opt_level=disable"
NO_DYNAMIC_QUANTIZATION = "openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0"


@pytest.fixture
def dynamic_quantization() -> None:
    """The premise of a test needing OpenVINO's wrong result: it quantizes int8-weight activations on this CPU."""
    require_openvino_dynamic_quantization()


def _repro(bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script must not need graphbisect
    return subprocess.run([sys.executable, str(bundle / "repro.py"), *args], cwd=bundle, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


# --- item 1: what the backend really computed, and OpenVINO config keys -------------------------------------
def test_int8_weights_fail_by_default_and_pass_without_dynamic_quantization(tmp_path: Path,
                                                                             dynamic_quantization: None) -> None:
    model, inputs = int8_weight_model()
    loaded = load_model(model)
    failing = compare_models(loaded, oracle=ORACLE, target="openvino", inputs=inputs, workdir=tmp_path / "a")
    assert not failing.passed and failing.comparison is not None
    assert failing.comparison.outputs[0].score > 100  # the MiniLM's bundle said 254x
    # what OpenVINO says it ran, beside what the model computes there
    assert failing.layerwise is not None and failing.layerwise.first_divergence is not None
    fc = failing.layerwise.first_divergence.compiled_as
    assert fc is not None and fc.kind == "FullyConnected" and "matmul" in fc.originals
    assert (fc.precision, fc.model_precision, fc.lower_precision) == (("i8",), ("f32",), ("i8",))
    data = failing.to_json()
    assert data["compiled_graph"]["lower_precision"] == [  # type: ignore[index]
        {"name": fc.name, "kind": "FullyConnected", "originals": list(fc.originals), "precision": ["i8"],
         "model_precision": ["f32"]}]
    assert data["root_causes"][0]["compiled_as"]["lower_precision"] == ["i8"]  # type: ignore[index]

    fixed = compare_models(loaded, oracle=ORACLE, target=NO_DYNAMIC_QUANTIZATION, inputs=inputs,
                           workdir=tmp_path / "b")
    assert fixed.passed, fixed.comparison
    assert fixed.target_run.info["config"] == {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
    assert fixed.compiled is not None and not fixed.compiled.lower_precision  # i8 weights, computed in f32


@pytest.mark.parametrize("target", ["openvino", "onnxruntime"])  # ONNX Runtime's MatMulNBits (accuracy_level 4)
def test_compare_prints_the_precision_the_target_ran(target: str, tmp_path: Path,  # computes in i8 too
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    if target == "openvino":  # the ONNX Runtime half does not depend on OpenVINO's premise
        require_openvino_dynamic_quantization()
    model, inputs = int8_weight_model()
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", **inputs)
    assert main(["compare", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "in.npz"), "--oracle", ORACLE,
                 "--target", target, "--csv", str(tmp_path / f"{target}.csv")]) == 1
    out = capsys.readouterr().out
    assert "1 ran in a lower precision than the model" in out  # the compiled graph's summary
    assert "i8<f32" in out  # the table's "ran in" column
    assert "the target ran in i8 where the model computes f32" in out
    assert ("DYNAMIC_QUANTIZATION_GROUP_SIZE=0" if target == "openvino"
            else "session.qdq_matmulnbits_accuracy_level=0") in out
    assert "ran in i8, the model f32" in (tmp_path / f"{target}.csv").read_text()


def test_a_bundle_records_the_config_key_and_repro_applies_it(tmp_path: Path, dynamic_quantization: None) -> None:
    from graphbisect.api import reduce
    from graphbisect.artifacts import load_bundle

    model, inputs = int8_weight_model()
    target = "openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=64"  # still dynamic quantization: still fails
    result = reduce(model, tmp_path / "bug", oracle=ORACLE, target=target, inputs=inputs)
    assert result.failed
    # reduce's report says what the target ran the blamed node in
    assert result.identity is not None and result.identity.ran_in == "ran in i8 where the model computes f32"
    assert "ran in i8 where the model computes f32" in (tmp_path / "bug" / "report.md").read_text()
    bundle = tmp_path / "bug"
    assert json.loads((bundle / "report.json").read_text())["target"] == target
    config = json.loads((bundle / "repro_config.json").read_text())
    assert config["options"]["config"] == [["DYNAMIC_QUANTIZATION_GROUP_SIZE", "64"]]

    proc = _repro(bundle)  # an inert key: no --trust needed
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    with load_bundle(bundle) as loaded:
        assert verify_bundle(loaded).outcome == "reproduces"

    # repro.py compiles with the recorded key: recorded as 0, the same model passes
    config["options"]["config"] = [["DYNAMIC_QUANTIZATION_GROUP_SIZE", "0"]]
    (bundle / "repro_config.json").write_text(json.dumps(config))
    proc = _repro(bundle)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- item 2: integer tensors in quantization steps -----------------------------------------------------------------
def test_a_qdq_model_localizes_the_planted_node_first(tmp_path: Path, dynamic_quantization: None) -> None:
    model, inputs = qdq_model()
    result = compare_models(load_model(model), oracle=ORACLE, target="openvino", inputs=inputs, workdir=tmp_path)
    assert not result.passed and result.layerwise is not None
    rows = {row.tensor: row for row in result.layerwise.rows if row.compared}
    # OpenVINO's rounding: hundreds of input values quantize 1 LSB apart from ONNX's x / scale, within --int-atol 1
    x_q = rows["x_q"]
    assert x_q.stats.max_abs == 1.0 and x_q.stats.passed and x_q.stats.score == 1.0 and x_q.lsb == 1.0
    assert rows["y1"].stats.max_abs > 0 and rows["y1"].stats.passed  # DequantizeLinear of a 1-LSB-off Conv output
    first = result.layerwise.first_divergence
    assert first is not None and first.compiled_as is not None and QDQ_PLANTED in first.compiled_as.originals
    assert first.lsb is not None and 20 < first.lsb < 100  # tens of LSB, not inf
    top = result.layerwise.root_causes[0]
    assert top.is_root and top.compiled_as is not None and QDQ_PLANTED in top.compiled_as.originals
    assert all(rc.compiled_as is not None and QDQ_PLANTED in rc.compiled_as.originals
               for rc in result.layerwise.root_causes)  # nothing else is blamed
    data = result.to_json()
    assert data["tolerance"]["int_atol"] == 1.0 and data["tolerance"]["quantized_tensors"] >= 9  # type: ignore[index]
    assert {r["tensor"]: r["lsb"] for r in data["layers"]}["x_q"] == 1.0  # type: ignore[index]


def test_a_passing_qdq_run_marks_no_row_failed(tmp_path: Path) -> None:
    model, inputs = qdq_model()
    result = compare_models(load_model(model), oracle=ORACLE, target=NO_DYNAMIC_QUANTIZATION, inputs=inputs,
                            workdir=tmp_path / "work", all_tensors=True)  # every intermediate: the rounding shows
    assert result.passed and result.layerwise is not None and not result.probe_masking
    rows = {row.tensor: row for row in result.layerwise.rows if row.compared}
    assert {"x_q", "x_dq", "c1", "c1_q", "y1", "fc", "fc_q", "y2"} <= set(rows)
    assert rows["x_q"].stats.max_abs == 1.0 and rows["c1_q"].stats.max_abs == 1.0  # the rounding is there
    assert [row.tensor for row in result.layerwise.rows if not row.stats.passed] == []
    assert result.layerwise.first_divergence is None and result.layerwise.root_causes == ()
    write_json(result, tmp_path / "c.json")
    write_csv(result, tmp_path / "c.csv")
    write_html(result, tmp_path / "c.html")
    assert all(r["passed"] for r in json.loads((tmp_path / "c.json").read_text())["layers"])
    with (tmp_path / "c.csv").open() as table:
        assert {row["kind"] for row in csv.DictReader(table)} == {"ok"}
    page = (tmp_path / "c.html").read_text()
    assert "<tr class='fail'>" not in page and "<tr class='first'>" not in page  # the legend still names them


def test_a_qdq_bundle_compares_its_quantized_output_in_steps(tmp_path: Path, dynamic_quantization: None) -> None:
    from graphbisect.api import reduce

    model, inputs = qdq_model()
    result = reduce(model, tmp_path / "bug", oracle=ORACLE, target="openvino", inputs=inputs)
    assert result.failed and QDQ_PLANTED in result.kept_nodes
    bundle = tmp_path / "bug"
    config = json.loads((bundle / "repro_config.json").read_text())
    tolerance = config["tolerance"]
    assert tolerance["int_atol"] == 1.0 and set(tolerance["quantized"]) == set(config["outputs"])
    assert json.loads((bundle / "report.json").read_text())["tolerance"]["quantized"] == tolerance["quantized"]
    proc = _repro(bundle)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    config["options"]["config"] = [["DYNAMIC_QUANTIZATION_GROUP_SIZE", "0"]]  # the same kernels, exact activations
    (bundle / "repro_config.json").write_text(json.dumps(config))
    proc = _repro(bundle)
    assert proc.returncode == 0, proc.stdout + proc.stderr
