"""`verify` says FIXED only when it shows the user's model fixed (issue 35, case 3).

`reduce --example --no-layerwise` matches its candidates by the failure's kind alone and ends on the
SimplifiedLayerNormFusion core of the mis-fused LayerNorm, not the LayerNormFusion the model fails by. Disabling
SimplifiedLayerNormFusion fixes that bundle and not the model: before, `verify` said FIXED and exited 0, which a
CI job reads as fixed while the user's model still failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphbisect
from graphbisect.cli.main import main
from graphbisect.examples import example_inputs_path, example_model_path

SIBLING_OFF = "onnxruntime:opt_level=all,disabled=SimplifiedLayerNormFusion"


@pytest.fixture(scope="module")
def kind_only_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bundle = tmp_path_factory.mktemp("kind-only") / "bug"
    result = graphbisect.reduce(example_model_path(), bundle, inputs=example_inputs_path(), layerwise=False)
    assert result.failed and result.identity is None  # matched by kind alone
    assert json.loads((bundle / "report.json").read_text())["identity"]["matched_by"] == "kind"
    return bundle


@pytest.mark.slow
def test_a_kind_matched_bundle_passing_is_not_called_fixed(kind_only_bundle: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    verdict = tmp_path / "v.json"
    status = main(["verify", str(kind_only_bundle), "--target", SIBLING_OFF, "--json", str(verdict)])
    out = capsys.readouterr().out
    assert status == 4, out
    assert "FIXED ON THE REDUCED MODEL ONLY" in out and "\nFIXED:" not in out
    assert "not shown for the original" in out and "--model" in out
    assert json.loads(verdict.read_text())["outcome"] == "fixed-reduced"
    # the user's model, re-checked: it still fails (exit 1), as a CI job must see
    status = main(["verify", str(kind_only_bundle), "--target", SIBLING_OFF, "--model", str(example_model_path()),
                   "--inputs", str(example_inputs_path())])
    assert status == 1
    out = capsys.readouterr().out
    assert "STILL FAILS" in out
    # The note went on advising "re-check the original: graphbisect verify BUNDLE --model ..." (issue 38).
    assert "--model" not in out, out


@pytest.mark.slow
def test_the_original_passing_shows_it_fixed(kind_only_bundle: Path) -> None:
    result = graphbisect.verify(kind_only_bundle, target="onnxruntime:opt_level=disable", model=example_model_path())
    assert result.outcome == "fixed" and result.original is not None and not result.original["failed"]
    assert result.note is None  # never advice to re-check the model just re-checked
    assert graphbisect.verify(kind_only_bundle, target="onnxruntime:opt_level=disable").outcome == "fixed-reduced"
