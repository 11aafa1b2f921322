"""`verify`'s verdict is the checker's: re-established with plain runs, or UNDECIDED, or said not checked.

The search decides REPRODUCES / FIXED / DIFFERENT by its own signature matching against the recorded oracle
outputs; the independent checker then runs the target and the bundle's oracle once each, plainly, and judges
the verdict's claim by its own rule. A verdict it finds false is printed as UNDECIDED (exit 2), never as the
unconfirmed word. Here the search's classification is made wrong on purpose (the backends are real).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import graphbisect
import graphbisect.workflows.verify as verify_module
from graphbisect.cli.main import main
from graphbisect.examples import example_inputs_path, example_model_path

FIX = "onnxruntime:opt_level=all,disabled=LayerNormFusionL1;SimplifiedLayerNormFusion"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("checked") / "bug"
    assert graphbisect.reduce(example_model_path(), folder, inputs=example_inputs_path()).failed
    return folder


def _saying(monkeypatch: pytest.MonkeyPatch, outcome: str) -> None:
    """The search's classification replaced by ``outcome`` whatever it found (the runs stay real)."""
    classify = verify_module._classify

    def wrong(*args: Any, **kwargs: Any) -> verify_module.Verification:
        return dataclasses.replace(classify(*args, **kwargs), outcome=outcome, note=None)

    monkeypatch.setattr(verify_module, "_classify", wrong)


@pytest.mark.slow
def test_an_honest_verdict_is_confirmed_with_one_plain_run_each(bundle: Path) -> None:
    reproduces = graphbisect.verify(bundle)
    assert reproduces.outcome == "reproduces"
    audit = reproduces.to_json()["audit"]
    assert audit["holds"] is True and audit["verdict"] == "reproduces", audit
    assert "fails the same way as the recorded failure" in audit["claim"]
    assert audit["runs"] == {"oracle": 1, "target": 1}
    fixed = graphbisect.verify(bundle, target=FIX)
    assert fixed.outcome == "fixed" and fixed.audit is not None and fixed.audit["holds"] is True
    assert "passes" in fixed.audit["claim"]


@pytest.mark.slow
@pytest.mark.parametrize(("said", "target"), [("fixed", None), ("different", None), ("reproduces", FIX)])
def test_a_wrong_verdict_is_caught_and_printed_undecided(bundle: Path, said: str, target: str | None, *,
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    _saying(monkeypatch, said)
    verdict = tmp_path / "v.json"
    status = main(["verify", str(bundle), "--json", str(verdict), *(["--target", target] if target else [])])
    out = capsys.readouterr().out
    assert status == 2, out
    assert "UNDECIDED" in out and f"the search said {said.upper()}" in out, out
    assert "checker: NOT confirmed with 1 target and 1 oracle plain runs" in out, out
    assert f"\n{said.upper()}" not in out and "REPRODUCES:" not in out and "\nFIXED:" not in out, out
    record = json.loads(verdict.read_text())
    assert record["outcome"] == "undecided"
    assert record["audit"]["verdict"] == said and record["audit"]["holds"] is False
    assert record["audit"]["evidence"] in record["note"]


@pytest.mark.slow
def test_an_untrusted_recorded_oracle_is_not_run_and_the_verdict_says_not_checked(
        bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    program = tmp_path / "evil.sh"
    program.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    program.chmod(0o755)
    copy = tmp_path / "downloaded"
    shutil.copytree(bundle, copy)
    report = json.loads((copy / "report.json").read_text())
    report["oracle"] = f"onnxruntime:opt_level=disable,python={program}"
    (copy / "report.json").write_text(json.dumps(report))
    status = main(["verify", str(copy)])
    out = capsys.readouterr().out
    assert status == 1 and "REPRODUCES:" in out, out
    assert "checker: REPRODUCES not checked by the checker: the recorded oracle" in out
    assert "not run without --trust" in out
    assert not marker.exists()


@pytest.mark.slow
def test_on_another_release_a_pass_name_it_does_not_print_is_not_established_not_refuted(bundle: Path) -> None:
    """ONNX Runtime 1.17.3 names no pass in its fused LayerNormalization (1.32 names LayerNormFusionL1): the same
    failure, at the same place and strength, on the same kind of fused node. The search matches it across releases
    by what stays; the checker, which matches names, cannot tell which pass made it there — so REPRODUCES stands,
    said not checked with that reason, never turned UNDECIDED by a name (a crash's error type the same way)."""
    from tests.ort_releases import release_pythons

    python = release_pythons(("1.17.3",))["1.17.3"]
    result = graphbisect.verify(bundle, target=f"onnxruntime:opt_level=all,python={python}")
    assert result.outcome == "reproduces", result.note
    assert result.audit is not None and result.audit["holds"] is None, result.audit
    assert "on release 1.17.3 (recorded on" in result.audit["evidence"]
    assert "which pass made it is not established" in result.audit["evidence"]
