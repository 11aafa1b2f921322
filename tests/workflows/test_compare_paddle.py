"""`compare --target paddle`: Paddle Inference's optimized program, seen by its output hooks, on ONNX names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphbisect.cli.main import main
from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models

pytestmark = pytest.mark.paddle
ORACLE = "onnxruntime:opt_level=disable"


def _bf16_cpu() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_bf16" in flags or "amx_bf16" in flags


needs_bf16 = pytest.mark.skipif(not _bf16_cpu(), reason="oneDNN bf16 needs a CPU with AVX512-BF16 or AMX")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("paddle")
    pytest.importorskip("paddle2onnx")
    from tests.paddle_models import export_mobilenet_v2, export_transformer_block

    root = tmp_path_factory.mktemp("paddle-hooks")
    return {"mobilenet": export_mobilenet_v2(root / "mobilenet"),
            "transformer": export_transformer_block(root / "transformer")}


def test_optimized_program_maps_onto_onnx_tensors_without_false_divergence(models: dict[str, Path]) -> None:
    """FP32 Paddle agrees with ONNX Runtime: every hooked tensor that maps lands on the right ONNX tensor
    (a wrong mapping would show as a divergence), in a CNN and in attention, where shapes repeat."""
    for name, least in (("mobilenet", 50), ("transformer", 12)):
        model = load_model(models[name])
        result = compare_models(model, oracle=ORACLE, target="paddle")
        assert result.passed and result.layerwise is not None, name
        assert result.layerwise.first_divergence is None, (name, result.layerwise.first_divergence)
        assert result.layerwise.compared >= least, (name, result.layerwise.compared)
        assert result.compiled is not None and result.compiled.source == "optimized program (output hooks)"
        tensors = {out for node in model.nodes for out in node.output}
        assert set(result.compiled.values) <= tensors


@needs_bf16
def test_onednn_bf16_first_divergence_is_the_first_fused_conv(models: dict[str, Path]) -> None:
    """oneDNN bf16 (a real Paddle option) changes values from the first conv on: the first divergence is
    Paddle's fused conv, mapped to the ONNX nodes it covers (conv, batch norm, relu6)."""
    result = compare_models(load_model(models["mobilenet"]), oracle=ORACLE, target="paddle:bf16=1")
    assert not result.passed and result.layerwise is not None
    first = result.layerwise.first_divergence
    assert first is not None and first.compiled_as is not None
    assert first.compiled_as.name == "onednn_op.fused_conv2d:0" and first.tensor == "p2o.pd_op.relu6.0.0"
    assert {"Conv.0", "BatchNormalization.0", "Clip.0"} <= set(first.compiled_as.originals)
    assert result.layerwise.root_causes and result.layerwise.root_causes[0].compiled_as == first.compiled_as


@needs_bf16
def test_paddle_as_oracle_and_the_cli_table(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Both directions: Paddle bf16 as the oracle against ONNX Runtime, and the CLI's table with ONNX names."""
    result = compare_models(load_model(models["transformer"]), oracle="paddle:bf16=1", target="onnxruntime")
    assert not result.passed and result.layerwise is not None
    first = result.layerwise.first_divergence
    # bf16 changes every tensor from the first fc on: the first tensor both sides have already diverges.
    assert first is not None and first is next(row for row in result.layerwise.rows if row.compared)
    assert first.tensor.startswith("p2o.pd_op.")
    assert main(["compare", str(models["transformer"]), "--target", "paddle", "--oracle", "onnxruntime",
                 "--rows", "0"]) == 0
    out = capsys.readouterr().out
    assert "compiled as" in out and "fused_matmul" in out and "Softmax.0" in out and "layer_norm" in out


def test_compare_names_the_users_paddle_model_not_the_converted_cache(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26 item 8: a Paddle run printed ``model   ~/.cache/graphbisect/paddle2onnx/<hash>.onnx``, a file the
    user never saw. The header and the JSON name the user's Paddle program; the JSON keeps the converted file."""
    program = models["transformer"]
    assert main(["compare", str(program), "--target", "paddle", "--no-layerwise",
                 "--json", str(tmp_path / "c.json")]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("model "))
    model = load_model(program)
    assert model.paddle_source is not None and model.path is not None
    assert header.split()[1] == str(model.paddle_source) and "paddle2onnx" not in header, header
    data = json.loads((tmp_path / "c.json").read_text())["model"]
    assert data["path"] == str(model.paddle_source) and data["converted"] == str(model.path)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A greedy decoder sharing its embedding between the prompt and a 3-step ``while`` loop."""
    pytest.importorskip("paddle")
    pytest.importorskip("paddle2onnx")
    from tests.paddle_models import export_greedy_decoder

    return export_greedy_decoder(tmp_path_factory.mktemp("paddle-decoder"), steps=3)


def test_a_loop_body_sharing_the_prompts_embedding_shows_no_divergence_on_a_pass(
        decoder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 35, case 6: a greedy decoder calls one embedding on the prompt and again inside a ``while`` loop.
    Paddle labels the body's ops by their position in the body (``pd_op.embedding:0`` twice), so the loop's last
    embedding was compared as the prompt's: "first divergence: Gather … inf×" on a PASS."""
    assert main(["compare", str(decoder), "--target", "paddle", "--oracle", ORACLE, "--rows", "0"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "first divergence" not in out, out
    assert "no intermediate tensor diverges" in out, out


def test_a_first_divergence_on_a_pass_says_its_alignment_is_inferred(
        decoder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tolerance of 0 on the intermediates and the default one on the logits: Paddle's float rounding is a first
    divergence while the outputs pass. Its value is a hooked tensor matched by inference, and the text says so."""
    assert main(["compare", str(decoder), "--target", "paddle", "--oracle", ORACLE, "--rows", "0", "--atol", "0",
                 "--rtol", "0", "--atol", "fetch_name_0:1e-4", "--rtol", "fetch_name_0:1e-3",
                 "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "first divergence" in out, out
    assert "matched to this tensor by inference (op order, type and shape), so the alignment may be wrong" in out
    first = json.loads((tmp_path / "c.json").read_text())["first_divergence"]
    assert first is not None and first["aligned"] is True


def test_a_branch_and_a_0d_tensor_show_no_divergence_on_a_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    """The embedding's second call in an ``if`` branch (a block of its own) stays unmapped, and the ``sum`` its
    condition reads, 0-D in Paddle and [1] in the converted model, compares as the same value: on main, "first
    divergence: compiled node sum … inf×" on a PASS (shape 1 against a scalar)."""
    from tests.paddle_models import export_branch_net

    prefix = export_branch_net(tmp_path / "branch")
    assert main(["compare", str(prefix), "--target", "paddle", "--oracle", ORACLE, "--rows", "0"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "first divergence" not in out, out
    assert "no intermediate tensor diverges" in out, out
