"""Issue 26, items 1 and 2, on real backends: quantized models on OpenVINO against ONNX Runtime.

1. An int8-weight MiniLM layer (:func:`~graphbisect.examples.quantized.int8_weight_model`): OpenVINO's default
   dynamic quantization computes its FullyConnected in i8, hundreds of tolerances off; ``compare`` shows the i8
   the backend ran where the model computes f32, ``openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0`` passes,
   and a bundle records the key, which ``repro.py`` and ``verify`` apply; ``reduce``'s report says it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.cli.main import main
from graphbisect.examples.quantized import int8_weight_model
from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models
from graphbisect.workflows.verify import verify_bundle

pytest.importorskip("openvino")
pytestmark = pytest.mark.openvino

ORACLE = "onnxruntime:opt_level=disable"
NO_DYNAMIC_QUANTIZATION = "openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0"


def _repro(bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script must not need graphbisect
    return subprocess.run([sys.executable, str(bundle / "repro.py"), *args], cwd=bundle, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


# --- item 1: what the backend really computed, and OpenVINO config keys -------------------------------------
def test_int8_weights_fail_by_default_and_pass_without_dynamic_quantization(tmp_path: Path) -> None:
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


def test_compare_prints_the_precision_the_target_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, inputs = int8_weight_model()
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", **inputs)
    for target in ("openvino", "onnxruntime"):  # ONNX Runtime's MatMulNBits (accuracy_level 4) does it too
        assert main(["compare", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "in.npz"), "--oracle", ORACLE,
                     "--target", target, "--csv", str(tmp_path / f"{target}.csv")]) == 1
        out = capsys.readouterr().out
        assert "1 ran in a lower precision than the model" in out  # the compiled graph's summary
        assert "i8<f32" in out  # the table's "ran in" column
        assert "the target ran in i8 where the model computes f32" in out
        assert ("DYNAMIC_QUANTIZATION_GROUP_SIZE=0" if target == "openvino"
                else "session.qdq_matmulnbits_accuracy_level=0") in out
        assert "ran in i8, the model f32" in (tmp_path / f"{target}.csv").read_text()


def test_a_bundle_records_the_config_key_and_repro_applies_it(tmp_path: Path) -> None:
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
