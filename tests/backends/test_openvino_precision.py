"""openvino:precision=... is refused where the device computes in another precision (real CPU plugin).

On an AVX512-BF16 CPU without FP16 the CPU plugin compiles ``precision=f16`` in bf16; on a CPU without BF16
it compiles ``precision=bf16`` in f32, silently. The compiled model's ``INFERENCE_PRECISION_HINT`` says what
runs: graphbisect must refuse the spec before any run rather than report results of another precision.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ov = pytest.importorskip("openvino")

from graphbisect.backends import BackendProcess  # noqa: E402
from graphbisect.errors import SpecError  # noqa: E402
from tests.real_models import silero_vad  # noqa: E402

pytestmark = pytest.mark.openvino


def _compiled_precision(requested: str) -> str:
    import openvino.opset13 as ops

    x = ops.parameter([1, 8], ov.Type.f32, name="x")
    compiled = ov.Core().compile_model(ov.Model([ops.relu(x)], [x], "p"), "CPU",
                                       {"INFERENCE_PRECISION_HINT": requested})
    return str(compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name())


def _unsupported() -> tuple[str, str]:
    """A low precision this CPU does not compute in, and what it computes instead (skip when it has both)."""
    for requested in ("bf16", "f16"):
        actual = _compiled_precision(requested)
        if actual != requested:
            return requested, actual
    pytest.skip("this CPU computes both bf16 and f16 natively: nothing to refuse")


def test_a_precision_the_cpu_does_not_run_is_refused(tmp_path: Path) -> None:
    requested, actual = _unsupported()
    with BackendProcess(f"openvino:precision={requested}", workdir=tmp_path) as process, \
            pytest.raises(SpecError, match=f"precision={requested} is not what CPU computes here.*{actual}"):
        process.validate()


def test_a_precision_the_cpu_runs_is_reported(tmp_path: Path) -> None:
    import numpy as np

    with BackendProcess("openvino:precision=f32", workdir=tmp_path) as process:
        result = process.run(silero_vad(), {"input": np.zeros((1, 512), np.float32),
                                            "state": np.zeros((2, 1, 128), np.float32),
                                            "sr": np.array(16000, np.int64)})
    assert result.ok, result.describe()
    assert result.info["inference_precision"] == "f32" and result.info["precision_as_requested"] is True


def test_precision_command_refuses_instead_of_answering(tmp_path: Path) -> None:
    """`graphbisect precision` used to answer "no node needs FP32" about an f32 run."""
    requested, actual = _unsupported()
    mode = {"bf16": "bf16", "f16": "fp16"}[requested]
    proc = subprocess.run(
        [sys.executable, "-m", "graphbisect", "precision", str(silero_vad("silero_vad_openvino_16k.onnx")),
         "--mode", mode, "--target", f"openvino:precision={requested}", "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"INFERENCE_PRECISION_HINT={actual}" in proc.stderr
    assert "no node needs FP32" not in proc.stdout
