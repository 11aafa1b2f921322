"""The onnxruntime backend on real ORT: options, a real optimizer bug, name validation, fired passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from graphbisect.backends import BackendProcess, Phase, RunResult, RunStatus
from graphbisect.backends.onnxruntime import OnnxRuntime, OrtOptions, optimizer_catalog
from graphbisect.errors import InputError, ModelError, SpecError


def _run(spec: str, model: Path, feeds: dict[str, np.ndarray], tmp_path: Path, **kwargs: Any) -> RunResult:
    with BackendProcess(spec, workdir=tmp_path / spec.replace(":", "_").replace(";", "_")) as process:
        return process.run(model, feeds, **kwargs)


def test_runs_the_model(ort: BackendProcess, models: dict[str, Path], x23: np.ndarray) -> None:
    result = ort.run(models["relu_add"], {"x": x23, "unused": x23})  # feeds the model lacks are ignored
    assert result.ok, result.describe()
    np.testing.assert_array_equal(result.outputs["y"], np.maximum(x23, 0) + 1)
    assert result.info["library"] == "onnxruntime"
    assert result.info["providers"] == ["CPUExecutionProvider"]
    assert result.info["load_seconds"] >= 0


def test_relu_clip_float64_bug_crashes_at_load_and_runs_unoptimized(models: dict[str, Path], tmp_path: Path) -> None:
    """ORT's FuseReluClip rule throws on float64 Clip bounds (opset 17) while building the session."""
    x = np.array([[-1.0, 3.0, 9.0], [0.5, -2.0, 6.5]])
    crash = _run("onnxruntime:opt_level=basic", models["relu_clip64"], {"x": x}, tmp_path)
    assert (crash.status, crash.phase) == (RunStatus.CRASH, Phase.LOAD)
    assert crash.error_type == "Fail"
    assert "Unexpected data type for Clip 'min' input of 11" in (crash.message or "")
    assert crash.describe().startswith("crash at load: Fail:")
    assert "[E:onnxruntime" in crash.log  # what ORT's C++ logger printed to fd 2 during this invocation

    expected = np.clip(np.maximum(x, 0), 0, 6)
    for spec in ("onnxruntime:opt_level=disable", "onnxruntime:opt_level=basic,disabled=FuseReluClip"):
        ok = _run(spec, models["relu_clip64"], {"x": x}, tmp_path)
        assert ok.ok, (spec, ok.describe())
        np.testing.assert_array_equal(ok.outputs["y"], expected)


def test_fired_passes_name_transformers_and_rewrite_rules(models: dict[str, Path], tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    conv = _run("onnxruntime:report_passes=1", models["conv_relu"], {"x": x}, tmp_path)
    assert conv.ok, conv.describe()
    assert "ConvActivationFusion" in conv.info["fired_passes"]
    assert "[V:onnxruntime" not in conv.log  # verbose chatter is parsed, not dumped into the log

    # FuseReluClip is a rewrite rule: ORT logs only "Level1_RuleBasedTransformer modified", the runtime
    # attributes it to the rule.
    clip = _run("onnxruntime:opt_level=basic,report_passes=1", models["relu_clip32"],
                {"x": np.ones((2, 3), np.float32)}, tmp_path)
    assert clip.ok, clip.describe()
    assert clip.info["fired_passes"] == ["FuseReluClip"]

    quiet = _run("onnxruntime:opt_level=disable,report_passes=1", models["conv_relu"], {"x": x}, tmp_path)
    assert quiet.info["fired_passes"] == []


@pytest.mark.parametrize(("name", "suggestion"), [
    ("LayerNormFusion", "LayerNormFusionL1"),  # the class name; ORT 1.31 registers L1/L2 variants
    ("PadFusion", "Pad_Fusion"),  # rewrite rule names differ from class names
    ("fuserelucllip", "FuseReluClip"),
])
def test_unknown_disabled_names_fail_before_any_run(models: dict[str, Path], x23: np.ndarray, tmp_path: Path,
                                                    name: str, suggestion: str) -> None:
    with BackendProcess(f"onnxruntime:disabled={name}", workdir=tmp_path) as process:
        with pytest.raises(SpecError) as err:
            process.validate()
        assert name in err.value.message and "silently ignores" in err.value.message
        assert suggestion in (err.value.hint or "")
        with pytest.raises(SpecError):
            process.run(models["relu_add"], {"x": x23})
        assert not (tmp_path / f"outputs-{process.invocations}").exists()


def test_catalogue_lists_transformers_and_rules() -> None:
    catalog = optimizer_catalog(OrtOptions())
    assert {"ConvActivationFusion", "ConstantFolding", "LayerNormFusionL1"} <= set(catalog.transformers)
    assert {"FuseReluClip", "EliminateIdentity", "Pad_Fusion"} <= set(catalog.rules["Level1_RuleBasedTransformer"])
    assert catalog.unverified == ()
    catalog.check(["Pad_Fusion", "ConvActivationFusion", "Level2_RuleBasedTransformer"])


def test_valid_names_depend_on_the_session_config() -> None:
    """CastChainElimination exists only when its config entry enables it."""
    with pytest.raises(SpecError):
        optimizer_catalog(OrtOptions()).check(["CastChainElimination"])
    enabled = OrtOptions.parse({"config": "optimization.enable_cast_chain_elimination=1"})
    optimizer_catalog(enabled).check(["CastChainElimination"])


def test_sessions_do_not_spin_unless_the_config_says_so() -> None:
    """Idle intra-op threads block between graphbisect's few runs per session (no busy-waiting that takes a
    core from the next candidate's build); a spec's own allow_spinning wins."""
    import onnxruntime as ort

    from graphbisect.backends.onnxruntime import _session_options

    plain = _session_options(ort, OrtOptions.parse({}), "all")
    assert plain.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    spinning = _session_options(ort, OrtOptions.parse({"config": "session.intra_op.allow_spinning=1"}), "all")
    assert spinning.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_save_optimized_reports_the_file(models: dict[str, Path], tmp_path: Path) -> None:
    x = np.zeros((1, 3, 8, 8), np.float32)
    result = _run("onnxruntime:opt_level=extended,save_optimized=1,threads=1,config=session.disable_prepacking=1",
                  models["conv_relu"], {"x": x}, tmp_path)
    assert result.ok, result.describe()
    assert Path(result.info["optimized_model"]).stat().st_size > 0


def test_layout_level_exists_on_this_ort(models: dict[str, Path], x23: np.ndarray, tmp_path: Path) -> None:
    assert _run("onnxruntime:opt_level=layout", models["relu_add"], {"x": x23}, tmp_path).ok


def test_unavailable_provider_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        OnnxRuntime({"providers": "NoSuchExecutionProvider"}, str(tmp_path))
    assert "CPUExecutionProvider" in (err.value.hint or "")


def test_requesting_a_non_output_needs_a_probe_model(ort: BackendProcess, models: dict[str, Path],
                                                     x23: np.ndarray, odd_name: str) -> None:
    with pytest.raises(ModelError) as err:
        ort.run(models["relu_add"], {"x": x23}, [odd_name])
    assert "probe model" in (err.value.hint or "")
    result = ort.run(models["relu_add_probe"], {"x": x23}, [odd_name])
    np.testing.assert_array_equal(result.outputs[odd_name], np.maximum(x23, 0))


def test_missing_input_is_an_input_error(ort: BackendProcess, models: dict[str, Path], x23: np.ndarray) -> None:
    with pytest.raises(InputError, match="'x'"):
        ort.run(models["relu_add"], {"z": x23})
