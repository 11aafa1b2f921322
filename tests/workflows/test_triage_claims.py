"""`graphbisect triage` states each model's verdict as the trusted checker's plain runs found it, and says what
its grouping into distinct bugs rests on (issue 35).

Models: ORT's FuseReluClip crash on a float64 Clip (crash-load, a 2-node bundle) and a healthy LayerNorm host, on
ONNX Runtime, passes not searched (the passes search has its own checked claims: test_passes_claims.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from graphbisect.cli.triage_cmd import _print_outcome, _report
from graphbisect.examples.patterns import pattern_model
from graphbisect.triage.dedup import group_bugs
from graphbisect.triage.outcome import ModelOutcome
from graphbisect.workflows import triage as triage_workflow
from graphbisect.workflows.triage import ModelTask, TriageOptions, TriageResult, triage, triage_one
from graphbisect.workflows.triage_claims import grouping_check, outcome_claim

OPTIONS = TriageOptions(passes=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("triage-claims-in")
    onnx.save(pattern_model("relu_clip_f64"), folder / "clip.onnx")
    onnx.save(pattern_model("layernorm_keepdims1"), folder / "healthy.onnx")
    return folder


def test_each_verdict_and_the_grouping_are_re_established_by_plain_runs(
        models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = triage(models, tmp_path / "out", options=OPTIONS, jobs=1)
    by_name = {o.name: o for o in result.outcomes}
    assert by_name["clip"].status == "failed" and by_name["healthy"].status == "passed"
    for outcome in result.outcomes:
        claim = outcome_claim(outcome)
        assert claim is not None and claim["holds"] is True, claim
        # one oracle and one target run per model, counted as the model's audit step
        assert outcome.step_invocations["audit"] == {"audit oracle": 1, "audit target": 1}
    assert "crash-load" in str(outcome_claim(by_name["clip"]))
    assert (by_name["clip"].audit or {})["bundle_audit"] is True  # reduce's audit of the bundle
    (bug,) = result.bugs
    assert bug.checked["failures"] is True and bug.checked["confirmed"] == ["clip"]
    assert bug.checked["bundles_audited"] is True and "culprit passes" in bug.checked["grouped_by"]
    summary = json.loads(result.summary["json"].read_text())
    assert summary["bugs"][0]["checked"]["failures"] is True
    assert summary["models"][0]["audit"]["claims"][0]["holds"] is True
    assert "1 of 1 re-established by plain runs" in result.summary["md"].read_text()
    assert result.invocations["audit oracle"] == 2 and result.invocations["audit target"] == 2
    for outcome in result.outcomes:
        _print_outcome(outcome)
    assert _report(result) == 1
    printed = capsys.readouterr().out
    assert "the checker" not in printed.split("\n\n")[0]  # no model line marked
    assert "failures re-established by plain runs (the checker): 1 of 1; the grouping into distinct bugs is the " \
        "search's" in printed
    assert "checker: 1 of 1 fail this way in a plain run; grouped by the search: the same kind (crash-load)" in printed


def test_wrong_verdicts_of_the_search_are_caught(models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The search's comparison made wrong (its result, not the backend): the crashing model said to pass, and
    said to fail with non-finite values; the healthy model said to fail. The checker's plain runs say otherwise,
    and what is printed says so beside the search's verdict; the group does not hold."""
    real = triage_workflow._compare
    lie: dict[str, Any] = {}

    def wrong(task: ModelTask, model: Any, feeds: Any) -> Any:
        verdict, calls, versions = real(task, model, feeds)
        return lie.get(task.name, verdict), calls, versions

    monkeypatch.setattr(triage_workflow, "_compare", wrong)
    out = tmp_path / "out"
    clip, healthy = (ModelTask(n, str(models / f"{n}.onnx"), str(out), OPTIONS) for n in ("clip", "healthy"))
    lie["clip"] = None
    said_passed = triage_one(clip)
    claim = outcome_claim(said_passed)
    assert said_passed.status == "passed" and claim is not None and claim["holds"] is False
    assert "crash at load" in claim["evidence"]

    fake = {"kind": "nan", "detail": "non-finite values", "outputs": []}
    lie["clip"] = fake
    said_nan = triage_one(clip)
    claim = outcome_claim(said_nan)
    assert claim is not None and claim["holds"] is False and "(crash-load, not nan)" in claim["evidence"]

    lie["healthy"] = fake
    said_failing = triage_one(healthy)
    claim = outcome_claim(said_failing)
    assert said_failing.status == "failed" and claim is not None and claim["holds"] is False
    assert "within tolerance" in claim["evidence"]

    failed = (said_nan, said_failing)
    bugs = [group_bugs(failed)[0]]
    checked = grouping_check(bugs[0], failed)
    assert checked["failures"] is False and checked["confirmed"] == []
    for outcome in (said_passed, said_nan, said_failing):
        _print_outcome(outcome)
    printed = capsys.readouterr().out
    assert "clip: passed" in printed and "the checker: DOES NOT HOLD: clip passes" in printed
    assert "the checker: DOES NOT HOLD: clip fails (nan)" in printed
    assert "the checker: DOES NOT HOLD: healthy fails (nan)" in printed
    result = TriageResult(failed, tuple(_with(b, failed) for b in bugs), {"md": out / "summary.md"}, "local", (), 1.0)
    _report(result)
    assert "failures re-established by plain runs (the checker): 0 of 2" in capsys.readouterr().out


def _with(bug: Any, outcomes: tuple[ModelOutcome, ...]) -> Any:
    import dataclasses

    return dataclasses.replace(bug, checked=grouping_check(bug, outcomes))


def test_a_verdict_the_checker_could_not_run_is_printed_as_not_established(
        capsys: pytest.CaptureFixture[str]) -> None:
    from graphbisect.workflows.triage_claims import not_established

    outcome = not_established(ModelOutcome("m", "m.onnx", "passed"), "the checker could not run: no such backend")
    claim = outcome_claim(outcome)
    assert claim is not None and claim["holds"] is None
    _print_outcome(outcome)
    assert "m: passed\n  the checker: not established: m passes: the target agrees with the oracle — the checker " \
        "could not run: no such backend" in capsys.readouterr().out
    _print_outcome(ModelOutcome("old", "old.onnx", "passed"))  # a record of an older triage
    assert "the verdict is the search's: not checked by plain runs" in capsys.readouterr().out
