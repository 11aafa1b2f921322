"""The same bug, not the same kind (issue 23): reduce, compare, passes, verify and repro.py match a wrong result
by its identity (where it first goes wrong, what the target compiled there, how strongly) above the target's
noise floor.

The GPU case runs on any machine through ``tf32ort``, a **stand-in** for ONNX Runtime's CUDA execution provider
computing MatMul/Conv in TF32 (graphbisect/examples/tf32_target.py: ONNX Runtime with MatMul/Gemm/Conv weights
rounded to TF32): every matrix product is off by up to a few tolerances with every optimization off, which is
the noise floor the real CUDA EP shows (``tests/backends/test_cuda_ep.py`` runs the real one where a GPU is).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graphbisect as gb
from graphbisect.errors import GraphBisectError
from graphbisect.examples import host_network
from graphbisect.examples.bundled import example_inputs_path, example_model_path
from graphbisect.examples.tf32_target import register

TF32 = "tf32ort:opt_level=all"
LN = ("LayerNormFusionL1", "SimplifiedLayerNormFusion")
EXAMPLE_LN = tuple(f"/blk10/norm/{n}" for n in ("ReduceMean", "Sub", "Pow", "ReduceMean_1", "Add", "Sqrt", "Div",
                                                 "Mul", "Add_1"))


@pytest.fixture(scope="module", autouse=True)
def _tf32() -> None:
    register()


def _example_inputs() -> dict[str, np.ndarray]:
    return dict(np.load(example_inputs_path()))


def test_tf32_reduce_keeps_the_mis_fused_layernorm_not_a_noisy_matmul(tmp_path: Path) -> None:
    """Judged by kind, this reduced to the one MatMul whose TF32 error is 2x the tolerance (28-39 runs)."""
    result = gb.reduce(example_model_path(), tmp_path / "bug", target=TF32, inputs=_example_inputs())
    assert result.kept_nodes == EXAMPLE_LN and result.one_minimal and result.verified
    report = json.loads((tmp_path / "bug" / "report.json").read_text())
    assert report["identity"]["made_by"] == "LayerNormFusion" and report["identity"]["band"] == 4
    floor = report["noise_floor"]
    assert floor["measured"] and floor["spec"] == "tf32ort:opt_level=disable"
    assert result.invocations["target"] <= 20


def test_tf32_compare_shows_the_floor_and_the_real_first_divergence(tmp_path: Path) -> None:
    result = gb.compare(example_model_path(), target=TF32, inputs=_example_inputs())
    assert result.noise_floor is not None and result.noise_floor.measured
    layers = result.layerwise
    assert layers is not None and layers.first_divergence is not None
    assert layers.first_divergence.node == "/blk10/norm/Add_1"
    assert layers.first_divergence.compiled_as is not None
    assert layers.first_divergence.compiled_as.kind == "LayerNormalization"
    # the first tensor beyond the tolerance: TF32's, as with every optimization off (it was the first divergence)
    embed = layers.rows[0]
    assert embed.node == "/embed/MatMul" and not embed.stats.passed and embed.at_floor
    # The one root: /blk15's LayerNorm reads a fused-away Reshape and, run alone on the oracle's input, passes.
    assert [rc.node for rc in layers.root_causes if rc.is_root] == ["/blk10/norm/Add_1"]
    assert result.root_cause_check is not None and "/blk15/norm/Add_1" in result.root_cause_check.received
    data = result.to_json()
    assert data["noise_floor"]["spec"] == "tf32ort:opt_level=disable"
    assert any(row["at_floor"] for row in data["layers"])  # type: ignore[index, union-attr]
    assert result.outcome.cls.value == "divergence"
    from graphbisect.artifacts.compare_report import write_csv, write_html

    write_csv(result, tmp_path / "layers.csv")
    write_html(result, tmp_path / "report.html")
    table = (tmp_path / "layers.csv").read_text().splitlines()
    assert table[0].endswith(",floor,at_floor") and table[1].endswith(",True")  # /embed/MatMul: kernel precision
    page = (tmp_path / "report.html").read_text()
    assert "<tr class='floor'>" in page and "noise floor (tf32ort:opt_level=disable)" in page


def test_tf32_passes_name_the_fusion_the_user_hit() -> None:
    """Judged by kind every pass disabled still failed (TF32), and 'no set of passes explains the failure'."""
    result = gb.passes(example_model_path(), target=TF32, inputs=_example_inputs())
    assert set(result.culprits) == set(LN) and result.required == ("LayerNormFusionL1",)
    assert any(note.startswith("noise floor (tf32ort:opt_level=disable)") for note in result.notes)
    # the checker judges above the floor too, measured again: with the culprits disabled only TF32's own error is
    # left, so the workaround holds (by the tolerance alone it read "does not hold" and `minimal` was withdrawn)
    claims = {c["id"]: c for c in (result.audit or {})["claims"]}
    assert claims["workaround"]["holds"] is True, claims["workaround"]
    assert "only within the target's noise floor" in claims["workaround"]["evidence"]
    assert result.minimal and all(c["holds"] for c in claims.values())


def test_a_model_wrong_only_by_kernel_precision_is_not_reduced(tmp_path: Path) -> None:
    """No bug, only TF32: compare says noise-floor, and reduce stops with the fix instead of reducing noise."""
    host = host_network(120, bug=None, seed=5)
    found = gb.compare(host.model, target=TF32, inputs=host.inputs)
    assert not found.passed and found.outcome.cls.value == "noise-floor"
    assert found.layerwise is not None and found.layerwise.first_divergence is None
    with pytest.raises(GraphBisectError) as caught:
        gb.reduce(host.model, tmp_path / "bug", target=TF32, inputs=host.inputs)
    assert "only within its own noise floor" in caught.value.message
    hint, cli_hint = caught.value.hint or "", caught.value.cli_hint or ""
    assert "use_tf32=0" in hint and "target='tf32ort:opt_level=disable'" in hint  # gb.reduce's argument
    assert "use_tf32=0" in cli_hint and "--target tf32ort:opt_level=disable" in cli_hint
    assert not (tmp_path / "bug" / "model.onnx").exists()


@pytest.fixture(scope="module")
def ln_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, gb.ReduceResult]:
    """The LayerNormFusion(L1) keepdims=0 bug (onnxruntime#30513) in a 400-node host, reduced on ORT CPU."""
    folder = tmp_path_factory.mktemp("ln400")
    host = host_network(400, bug="layernorm_keepdims0", position="branch", seed=11)
    model = folder / "model.onnx"
    model.write_bytes(host.model.SerializeToString())
    np.savez(folder / "inputs.npz", **host.inputs)
    return folder / "bug", model, gb.reduce(model, folder / "bug", inputs=host.inputs)


def test_layernorm_keepdims0_reduces_to_the_fusion_not_its_sibling(ln_bundle) -> None:  # type: ignore[no-untyped-def]
    """Judged by kind the bundle was the 6-node core SimplifiedLayerNormFusion mis-fuses (the mean and its Sub
    cut away): disabling only that pass 'fixed' the bundle while the user's model still failed."""
    bundle, _, result = ln_bundle
    kept = {name.rsplit("/", 1)[1] for name in result.kept_nodes}
    assert result.final_nodes <= 9 and {"ReduceMean", "Sub"} <= kept and result.one_minimal
    identity = json.loads((bundle / "report.json").read_text())["identity"]
    assert (identity["compiled_kind"], identity["made_by"]) == ("LayerNormalization", "LayerNormFusion")
    assert "made by LayerNormFusion" in (bundle / "report.md").read_text()


def _repro(bundle: Path, disabled: str | None) -> subprocess.CompletedProcess[str]:
    """repro.py of ``bundle`` with ``disabled`` optimizers (as a build with that fix would run it)."""
    copy = bundle.with_name(f"{bundle.name}-{disabled or 'as-recorded'}".replace(";", "-"))
    if not copy.exists():
        import shutil

        shutil.copytree(bundle, copy)
        if disabled:
            config = json.loads((copy / "repro_config.json").read_text())
            config["options"]["disabled_optimizers"] = disabled.split(";")
            (copy / "repro_config.json").write_text(json.dumps(config))
    return subprocess.run([sys.executable, str(copy / "repro.py")], capture_output=True, text=True, check=False,
                          timeout=300)


@pytest.mark.parametrize(("disabled", "outcome", "repro_says"), [
    (None, "reproduces", "REPRODUCED"),
    ("SimplifiedLayerNormFusion", "reproduces", "REPRODUCED"),  # the sibling's fix leaves the user's bug
    ("LayerNormFusionL1", "different", "A DIFFERENT FAILURE"),  # the user's pass fixed, the sibling now fails
    ("LayerNormFusionL1;SimplifiedLayerNormFusion", "fixed", "FIXED"),
])
def test_verify_and_repro_agree_on_the_identity(ln_bundle, disabled, outcome, repro_says) -> None:  # type: ignore[no-untyped-def]
    bundle, _, _ = ln_bundle
    target = "onnxruntime:opt_level=all" + (f",disabled={disabled}" if disabled else "")
    verified = gb.verify(bundle, target=target)
    assert verified.outcome == outcome, verified.note
    proc = _repro(bundle, disabled)
    assert repro_says in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == (0 if outcome == "fixed" else 1)
    if outcome == "different":
        assert "SimplifiedLayerNormalization made by SimplifiedLayerNormFusion" in (verified.note or "")
    if outcome == "fixed":
        assert "re-check that model" in (verified.note or "") and "re-check that model" in proc.stdout


def test_verify_model_rechecks_the_original(ln_bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A fixed bundle is not a fixed model: verify --model says whether the user's model still fails."""
    bundle, model, _ = ln_bundle
    inputs = model.with_name("inputs.npz")
    half = "onnxruntime:opt_level=all,disabled=LayerNormFusionL1"
    from graphbisect.cli.main import main

    assert main(["verify", str(bundle), "--target", half, "--model", str(model), "--inputs", str(inputs),
                 "--json", str(tmp_path / "v.json")]) == 1
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["outcome"] == "different" and data["original"]["failed"] and data["original"]["recorded_model"]
    assert "SimplifiedLayerNormalization" in data["original"]["first_divergence"]["compiled_as"]
    both = "onnxruntime:opt_level=all,disabled=LayerNormFusionL1;SimplifiedLayerNormFusion"
    assert main(["verify", str(bundle), "--target", both, "--model", str(model), "--inputs", str(inputs),
                 "--json", str(tmp_path / "w.json")]) == 0
    assert json.loads((tmp_path / "w.json").read_text())["original"]["failed"] is False
