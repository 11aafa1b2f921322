"""`precision --target paddle:precision=bf16`: the fewest Paddle op types to keep in FP32 under oneDNN bf16.

Real Paddle Inference on a CPU with AVX512-BF16/AMX (skipped elsewhere), on MobileNetV2 from
``paddle.vision.models``: a legacy program (whose bf16 op types ``set_bfloat16_op`` controls) and a PIR
program (which ignores it, on Paddle 3.3.1).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from graphbisect.backends.paddle import bf16_cpu_refusal
from graphbisect.compare import Tolerance
from graphbisect.errors import BackendError
from graphbisect.model import load_model
from graphbisect.workflows.precision import find_precision

pytestmark = pytest.mark.paddle
ORACLE = "onnxruntime:opt_level=disable"
TARGET = "paddle:precision=bf16"
# Plain bf16 misses it (max error ~0.4 on logits of ~±5); FP32 convolutions meet it (~5e-3).
TOL = Tolerance(atol=2e-2, rtol=2e-2)

needs_bf16 = pytest.mark.skipif(bf16_cpu_refusal() is not None, reason="oneDNN bf16 needs AVX512-BF16 or AMX")


def test_a_cpu_without_bf16_is_refused_naming_the_missing_flags() -> None:
    why = bf16_cpu_refusal("processor : 0\nflags : fpu sse2 avx2 avx512f avx512bw\n")
    assert why is not None and "avx512_bf16" in why and "amx_bf16" in why and "avx512bw, avx512f" in why
    assert bf16_cpu_refusal("flags : fpu avx512f amx_bf16 amx_tile\n") is None


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("paddle")
    pytest.importorskip("paddle2onnx")
    from tests.paddle_models import export_mobilenet_v2

    root = tmp_path_factory.mktemp("paddle-precision")
    return {"legacy": export_mobilenet_v2(root / "legacy", legacy=True).parent,
            "pir": export_mobilenet_v2(root / "pir").parent}


_STANDALONE = """\
import sys
import numpy as np
from paddle import inference

model, inputs, expected, lines = sys.argv[1:5]
config = inference.Config(model + "/inference.pdmodel", model + "/inference.pdiparams")
config.disable_gpu()
exec(open(lines).read())  # the lines graphbisect emitted (or none: plain bf16 below)
if len(sys.argv) > 5:
    config.enable_mkldnn()
    config.enable_mkldnn_bfloat16()
predictor = inference.create_predictor(config)
x = np.load(inputs)["x"]
handle = predictor.get_input_handle("x")
handle.reshape(list(x.shape))
handle.copy_from_cpu(x)
predictor.run()
out = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
ref = np.load(expected)
print(float(np.max(np.abs(out - ref) - (ATOL + RTOL * np.abs(ref)))))
"""


@needs_bf16
def test_fewest_op_types_in_fp32_and_the_emitted_config_reproduces_it(models: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    """The search runs on Paddle's own bf16: the op types are those the optimized program computed in bf16,
    the answer is 1-minimal and verified, and the emitted config lines, run by a script that uses only
    Paddle, meet the tolerance where plain ``enable_mkldnn_bfloat16()`` does not."""
    model = load_model(models["legacy"])
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)}
    result = find_precision(model, mode="bf16", oracle=ORACLE, target=TARGET, inputs=feeds, tolerance=TOL,
                            out_dir=tmp_path / "out")
    assert {"fused_conv2d", "pool2d"} <= set(result.units)
    assert not result.all_lowered_meets  # plain bf16 misses the tolerance
    assert result.keep_fp32 == ("fused_conv2d",) and result.minimal and result.meets_tolerance
    low = result.extra["low_precision_op_types"]
    assert isinstance(low, list) and "fused_conv2d" not in low and "pool2d" in low  # measured, per op type
    assert result.extra["runtime_pins_not_applied"] == []
    overrides = json.loads((tmp_path / "out" / "overrides.json").read_text())
    assert overrides["unit"] == "paddle_op_type" and "trtexec" not in overrides
    assert "fused_conv2d" not in overrides["paddle_set_bfloat16_op"]

    # The emitted lines, standalone: they reproduce the verified result; plain bf16 does not.
    from tests.paddle_models import ort_run

    np.savez(tmp_path / "x.npz", **feeds)
    np.save(tmp_path / "expected.npy", ort_run(model.path, feeds)[model.output_names[0]])
    script = tmp_path / "standalone.py"
    script.write_text(_STANDALONE.replace("ATOL", repr(TOL.atol)).replace("RTOL", repr(TOL.rtol)))
    empty = tmp_path / "none.txt"
    empty.write_text("")

    def excess(lines: Path, *plain: str) -> float:
        run = subprocess.run([sys.executable, str(script), str(models["legacy"]), str(tmp_path / "x.npz"),
                              str(tmp_path / "expected.npy"), str(lines), *plain],
                             capture_output=True, text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stderr[-2000:]
        return float(run.stdout.strip().splitlines()[-1])

    lines = tmp_path / "out" / "paddle_config.txt"
    assert "config.set_bfloat16_op(" in lines.read_text()
    assert excess(lines) <= 0  # within atol + rtol * |ref| everywhere
    assert excess(empty, "plain-bf16") > 0


@needs_bf16
def test_a_pir_program_that_ignores_the_op_list_is_refused_with_the_reason(models: dict[str, Path]) -> None:
    """Paddle 3.3.1 PIR programs place bf16 ops by a fixed list: with every type kept in FP32 they still run
    in bf16. That is measured (dtype hook) and refused, not searched."""
    with pytest.raises(BackendError, match="ignores its FP32 pins") as caught:
        find_precision(load_model(models["pir"]), mode="bf16", oracle=ORACLE, target=TARGET, tolerance=TOL)
    assert "onednn_op.fused_conv2d" in str(caught.value) and "PIR" in (caught.value.hint or "")


def test_a_paddle_target_without_its_own_bf16_is_refused_with_the_spec_to_use(models: dict[str, Path]) -> None:
    """Paddle cannot run the emulated ONNX candidates: the error says which target spec searches Paddle."""
    from graphbisect.errors import InputError

    with pytest.raises(InputError, match="runs only its own model format") as caught:
        find_precision(load_model(models["legacy"]), mode="bf16", oracle=ORACLE, target="paddle:bf16=1")
    # in the words of each front end: the API's argument, and the flag on the command line
    assert "target='paddle:precision=bf16'" in (caught.value.hint or "")
    assert "--target paddle:precision=bf16" in (caught.value.cli_hint or "")


def test_keep_fp32_without_bf16_is_a_spec_error() -> None:
    from graphbisect.backends.paddle import PaddleInference
    from graphbisect.errors import SpecError

    with pytest.raises(SpecError, match="bf16 is off"):
        PaddleInference({"keep_fp32": "fused_conv2d"}, "/tmp")


@needs_bf16
def test_a_kept_type_named_as_set_bfloat16_op_names_it_is_reported_not_applied_on_pir(
        models: dict[str, Path], tmp_path: Path) -> None:
    """``keep_fp32=fused_conv2d`` (the spelling set_bfloat16_op and the option's help use) on a PIR program,
    which ignores the list: the convolutions still write bf16, under the hook label
    ``onednn_op.fused_conv2d``. The run info must say the pin was not applied (and why), not that the
    optimized program does not run the type; before the fix it reported ``not_applied: []`` and
    ``unverified: ["fused_conv2d"]``."""
    from graphbisect.backends.paddle import PaddleInference

    runtime = PaddleInference({"precision": "bf16", "keep_fp32": "fused_conv2d"}, str(tmp_path))
    runtime.load(str(models["pir"]), None)
    runtime.run({"x": np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)})
    facts = runtime.info()["keep_fp32"]
    assert "onednn_op.fused_conv2d" in facts["low_precision_op_types"]  # what ran: bf16 convolutions
    assert facts["not_applied"] == ["fused_conv2d"] and facts["unverified"] == []
    assert "PIR" in facts["why"]
