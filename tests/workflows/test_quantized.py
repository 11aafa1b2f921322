"""Issue 26, items 1 and 2, on real backends: quantized models on OpenVINO against ONNX Runtime.

1. An int8-weight MiniLM layer (:func:`~graphbisect.examples.quantized.int8_weight_model`): OpenVINO's default
   dynamic quantization computes its FullyConnected in i8, hundreds of tolerances off; ``compare`` shows the i8
   the backend ran where the model computes f32, ``openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0`` passes,
   and a bundle records the key, which ``repro.py`` and ``verify`` apply.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    fixed = compare_models(loaded, oracle=ORACLE, target=NO_DYNAMIC_QUANTIZATION, inputs=inputs,
                           workdir=tmp_path / "b")
    assert fixed.passed, fixed.comparison
    assert fixed.target_run.info["config"] == {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


def test_a_bundle_records_the_config_key_and_repro_applies_it(tmp_path: Path) -> None:
    from graphbisect.api import reduce
    from graphbisect.artifacts import load_bundle

    model, inputs = int8_weight_model()
    target = "openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=64"  # still dynamic quantization: still fails
    result = reduce(model, tmp_path / "bug", oracle=ORACLE, target=target, inputs=inputs)
    assert result.failed
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
