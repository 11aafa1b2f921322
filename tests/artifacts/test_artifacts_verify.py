"""`graphbisect verify`: re-runs a bundle's target in an isolated worker and says reproduces / fixed / different."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from artifacts_builders import FIXED_TARGET

from graphbisect.artifacts import BundleContent, load_bundle, write_bundle
from graphbisect.cli.main import main
from graphbisect.cli.verify_cmd import verify_bundle

pytest.importorskip("onnxruntime")  # every bundle here comes from real ONNX Runtime runs


def test_verify_mismatch_bundle(mismatch_content: BundleContent, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    out = write_bundle(mismatch_content, tmp_path / "bundle")
    assert main(["verify", str(out)]) == 1
    assert "REPRODUCES" in capsys.readouterr().out
    report = tmp_path / "verdict.json"
    assert main(["verify", str(out), "--target", FIXED_TARGET, "--json", str(report)]) == 0
    assert "FIXED" in capsys.readouterr().out
    verdict = json.loads(report.read_text())
    assert verdict["outcome"] == "fixed" and verdict["observed"]["kind"] == "none"
    assert verdict["target"] == FIXED_TARGET and verdict["recorded"]["kind"] == "mismatch"


def test_verify_crash_bundle_and_zip(crash_content: BundleContent, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    write_bundle(crash_content, tmp_path / "bundle", zip=True)
    for given in (tmp_path / "bundle", tmp_path / "bundle.zip"):
        assert main(["verify", str(given)]) == 1
        out = capsys.readouterr().out
        assert "REPRODUCES" in out and "Unexpected data type for Clip 'min' input of 11" in out
    assert main(["verify", str(tmp_path / "bundle.zip"), "--target", FIXED_TARGET]) == 0
    assert "FIXED" in capsys.readouterr().out


def test_verify_hostile_names(hostile_content: BundleContent, tmp_path: Path) -> None:
    assert main(["verify", str(write_bundle(hostile_content, tmp_path / "b"))]) == 1


def test_a_different_failure_only_the_recorded_outputs_show_is_undecided(
        crash_content: BundleContent, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The search compares with the recorded oracle outputs and says DIFFERENT; the checker runs the oracle,
    whose outputs the target matches: the failure is the bundle's tampered outputs, never printed as a bug."""
    tampered = dataclasses.replace(crash_content, oracle_outputs={"y": np.full(4, 7.0)})
    out = write_bundle(tampered, tmp_path / "b")
    assert main(["verify", str(out), "--target", FIXED_TARGET]) == 2
    printed = capsys.readouterr().out
    assert "DIFFERENT FAILURE" not in printed and "the search said DIFFERENT" in printed, printed
    with load_bundle(out) as bundle:
        verification = verify_bundle(bundle, FIXED_TARGET)
    assert verification.outcome == "undecided" and verification.observed.kind.value == "mismatch"
    assert verification.audit is not None and verification.audit["verdict"] == "different"
    assert "within tolerance" in str(verification.audit["evidence"])


def test_verify_unusable_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plain").mkdir()
    assert main(["verify", str(tmp_path / "plain")]) == 2
    err = capsys.readouterr().err
    assert "not a graphbisect bundle" in err and "hint:" in err


def test_verify_dot_inside_the_bundle(mismatch_content: BundleContent, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`graphbisect verify .` from inside the bundle used to crash: PosixPath('.') has an empty name."""
    monkeypatch.chdir(write_bundle(mismatch_content, tmp_path / "bundle"))
    assert main(["verify", "."]) == 1
    assert "REPRODUCES" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path / "bundle" / "..")
    assert main(["verify", "nothing-here"]) == 2
