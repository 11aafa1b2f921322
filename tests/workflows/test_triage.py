"""`graphbisect triage` on a folder of real failing models, with the local executor (Ray: tests/executors)."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from pathlib import Path

import onnx
import pytest

from graphbisect.cli.main import main
from graphbisect.examples.flaky_target import script_path
from graphbisect.examples.patterns import pattern_model
from graphbisect.workflows.triage import TriageOptions, TriageResult, discover_models, triage
from tests.triage_models import write_models

#: The interpreter running the tests (activated venv or not): a bare `python` may be another one.
PY = shlex.quote(sys.executable)

LN_CULPRITS = ("LayerNormFusionL1", "SimplifiedLayerNormFusion")


def dedup_view(result: TriageResult) -> dict[str, object]:
    """What must not depend on the executor: bugs (key, models, culprits, pattern), passed, errors."""
    return {
        "bugs": [(b.key, b.models, b.culprits, b.pattern, b.smallest, b.smallest_nodes) for b in result.bugs],
        "passed": [o.name for o in result.by_status("passed")],
        "errors": [o.name for o in result.by_status("error")],
    }


def test_discover_lists_models_with_their_inputs(triage_input: Path) -> None:
    found = {name: inputs for name, _path, inputs in discover_models(triage_input)}
    assert sorted(found) == ["broken", "healthy", "ln_branch", "ln_main", "relu_clip"]
    assert found["ln_main"] == triage_input / "ln_main.npz" and found["broken"] is None


def test_a_models_external_data_is_not_called_a_stray_entry(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """triage warned that a model's own weights, model.onnx.data beside it, were "not a model and not a model's
    inputs, so not triaged" (issue 35, case 6: a folder whose model keeps its weights as external data)."""
    folder = tmp_path / "in"
    folder.mkdir()
    onnx.save(pattern_model("layernorm_keepdims0"), folder / "model.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    (folder / "notes.txt").write_text("not a model")
    with caplog.at_level("WARNING", logger="graphbisect.workflows.triage"):
        assert [name for name, _, _ in discover_models(folder)] == ["model"]
    assert (folder / "model.onnx.data").is_file()
    assert "'notes.txt'" in caplog.text and "model.onnx.data" not in caplog.text


def test_local_triage_deduplicates_real_bugs(local_triage: TriageResult) -> None:
    result = local_triage
    assert len(result.bugs) == 2
    layernorm, crash = result.bugs  # most frequent first
    assert layernorm.models == ("ln_branch", "ln_main") and layernorm.count == 2
    assert layernorm.culprits == LN_CULPRITS and layernorm.signature["kind"] == "mismatch"
    assert layernorm.smallest_nodes is not None and layernorm.smallest_nodes <= 9
    assert crash.models == ("relu_clip",) and crash.culprits == ("FuseReluClip",)
    assert crash.signature["kind"] == "crash-load" and crash.op_types == ("Relu", "Clip")
    assert [o.name for o in result.by_status("passed")] == ["healthy"]
    (error,) = result.by_status("error")
    assert error.name == "broken" and "not a readable ONNX model" in str(error.message) and error.hint
    for outcome in result.by_status("failed"):
        assert outcome.one_minimal and (Path(str(outcome.bundle)) / "repro.py").exists()


def test_summary_files(local_triage: TriageResult) -> None:
    data = json.loads(local_triage.summary["json"].read_text())
    assert data["format"] == "graphbisect-triage"
    assert data["counts"] == {"models": 5, "failed": 3, "passed": 1, "errors": 1, "distinct_bugs": 2}
    assert data["bugs"][0]["models"] == ["ln_branch", "ln_main"]
    assert data["errors"][0]["model"] == "broken" and data["errors"][0]["hint"]
    markdown = local_triage.summary["md"].read_text()
    assert "2 distinct bugs" in markdown and "| ln_branch, ln_main |" in markdown
    import onnxruntime

    ran = f"onnxruntime {onnxruntime.__version__} (Python"  # measured in the models' workers, per role
    assert [text[:len(ran)] for text in data["ran_with"]["target"]] == [ran]
    failed = next(model for model in data["models"] if model["status"] == "failed")
    assert failed["versions"]["target"]["library_version"] == onnxruntime.__version__
    assert f"- target ran with {ran}" in markdown
    assert "<table>" in local_triage.summary["html"].read_text()


def test_rerun_skips_finished_models(local_triage: TriageResult) -> None:
    out = local_triage.summary["json"].parent
    started = time.monotonic()
    again = triage(Path(json.loads(local_triage.summary["json"].read_text())["meta"]["input_dir"]), out, jobs=1)
    assert time.monotonic() - started < 15
    assert sorted(again.skipped) == ["broken", "healthy", "ln_branch", "ln_main", "relu_clip"]
    assert dedup_view(again) == dedup_view(local_triage)


def test_rerun_resumes_a_reduction_stopped_by_its_budget(tmp_path: Path) -> None:
    folder = write_models(tmp_path / "in")
    for path in folder.iterdir():
        if not path.name.startswith("relu_clip"):
            path.unlink()
    out = tmp_path / "out"
    first = triage(folder, out, options=TriageOptions(max_invocations=1), jobs=1)
    (stopped,) = first.outcomes
    assert stopped.status == "failed" and not stopped.one_minimal
    assert (out / "bundles" / "relu_clip.work" / "journal.jsonl").exists()
    second = triage(folder, out, jobs=1)
    (done,) = second.outcomes
    assert second.skipped == () and done.one_minimal and done.op_types == ("Relu", "Clip")
    # counted over both sessions (a crash at session creation: the resumed candidates are compiled alone)
    assert done.invocations["target"] >= stopped.invocations["target"]
    assert done.backend_calls["target"]["compiles"] > stopped.backend_calls["target"]["compiles"]


def test_changed_model_is_triaged_again(tmp_path: Path, triage_input: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(triage_input / "healthy.onnx", folder / "model.onnx")
    out = tmp_path / "out"
    assert [o.status for o in triage(folder, out, jobs=1).outcomes] == ["passed"]
    shutil.copy(triage_input / "broken.onnx", folder / "model.onnx")
    again = triage(folder, out, jobs=1)
    assert again.skipped == () and [o.status for o in again.outcomes] == ["error"]


def test_cli_triage(tmp_path: Path, triage_input: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("healthy.onnx", "healthy.npz", "broken.onnx"):
        shutil.copy(triage_input / name, folder / name)
    code = main(["triage", str(folder), "-o", str(tmp_path / "out"), "-j", "1", "--json", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    assert code == 0 and "healthy: passed" in out and "broken: ERROR" in out
    assert json.loads((tmp_path / "s.json").read_text())["counts"]["errors"] == 1
    assert main(["triage", str(folder), "-o", str(tmp_path / "out"), "--executor", "slurm"]) == 2
    onnx.checker.check_model(str(folder / "healthy.onnx"))


def test_a_failure_the_reduction_does_not_see_again_is_not_called_passed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A healthy model behind a target that perturbs its outputs at random: seed 2 perturbs the first run
    (the comparison's) and not the second (the reduction's). The comparison measured a failure, so the model
    must not be listed as passed, and the reduction's backend runs must be counted."""
    monkeypatch.setenv("FLAKY_MODE", "perturb")
    monkeypatch.setenv("FLAKY_RATE", "0.5")
    monkeypatch.setenv("FLAKY_SEED", "2")
    monkeypatch.setenv("FLAKY_COUNTER", str(tmp_path / "counter"))
    folder = tmp_path / "in"
    folder.mkdir()
    onnx.save(pattern_model("relu_clip_f32"), folder / "healthy.onnx")
    flaky = f"command:cmd={PY} {script_path()} {{model}} {{inputs}} {{outputs}}"
    result = triage(folder, tmp_path / "out", options=TriageOptions(target=flaky), jobs=1)
    (outcome,) = result.outcomes
    # the comparison's run, the reduction's, then the checker's plain run of the verdict
    assert (tmp_path / "counter").read_text() == "3"
    assert outcome.status == "failed" and outcome.bundle is None
    assert outcome.signature is not None and outcome.signature["kind"] == "mismatch"
    assert any("does not reproduce reliably" in note for note in outcome.notes)
    assert outcome.step_invocations["reduce"]["target"] == 1
    # the checker's plain run (the third, not perturbed) does not see the failure: said beside the verdict
    (claim,) = (outcome.audit or {})["claims"]
    assert claim["holds"] is False and "within tolerance" in claim["evidence"]
    summary = json.loads(result.summary["json"].read_text())
    assert summary["passed"] == [] and summary["counts"]["failed"] == 1


@pytest.mark.openvino
def test_models_openvino_refuses_for_lack_of_ai_onnx_ml_are_one_bug(tmp_path: Path) -> None:
    """Issue 26 item 7: three models OpenVINO refuses for lack of ``ai.onnx.ml`` — two ops with no conversion
    rule and a ZipMap's sequence of maps ("Unsupported value_info type") — were three bugs, two of them
    ``crash-load``; they are one ``unsupported`` bug, "lacks ai.onnx.ml", and a Loop OpenVINO cannot convert is
    another. The signature column and the bundle's title show the op and the reason, never OpenVINO's opening
    "Exception from src/inference/src/cpp/core.cpp:84:"."""
    pytest.importorskip("openvino")
    from tests.refusal_models import write_refused

    folder = write_refused(tmp_path / "in")
    result = triage(folder, tmp_path / "out", options=TriageOptions(target="openvino"), jobs=1)
    assert [o.status for o in result.outcomes] == ["failed"] * 4, [(o.name, o.message) for o in result.outcomes]
    assert [(b.models, b.lacks, b.signature["kind"]) for b in result.bugs] == [
        (("scaler", "tree_ensemble", "zipmap"), "ai.onnx.ml", "unsupported"),
        (("passthrough_loop",), "Loop", "unsupported")]
    ml, loop = result.bugs
    assert ml.smallest_nodes == 1 and loop.op_types == ("Loop",)
    markdown = result.summary["md"].read_text()
    assert "unsupported: lacks ai.onnx.ml (no conversion rule found for ai.onnx.ml." in markdown
    assert "unsupported: lacks Loop (cannot convert Loop: The provided loop body graph canonical inputs" in markdown
    assert "Exception from" not in markdown and "model.onnx.ml" not in markdown
    title = (Path(str(loop.smallest_bundle)) / "report.md").read_text().splitlines()[0]
    assert title.startswith("# openvino: unsupported: cannot convert Loop: The provided loop body graph"), title
