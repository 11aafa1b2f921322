"""`graphbisect passes` states only what the trusted checker re-established (issue 35).

The model: the keepdims=0 LayerNorm host, which ONNX Runtime 1.31's LayerNormFusionL1 mis-fuses (and, with it
disabled, SimplifiedLayerNormFusion). The checker (:mod:`graphbisect.checker.configurations`) runs each claimed
configuration once, plainly, against one plain oracle run; a claim it does not find is printed and written as
not holding.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from graphbisect.checker.configurations import (
    FAILS,
    PASSES,
    Configuration,
    ConfigurationClaim,
    check_configurations,
)
from graphbisect.checker.values import Limits
from graphbisect.cli.main import main
from graphbisect.cli.passes_cmd import print_passes
from graphbisect.compare import Tolerance
from graphbisect.examples.hosts import host_inputs, host_network
from graphbisect.model import load_model
from graphbisect.workflows.passes import PassesOptions, PassesResult, check_passes, find_culprit_passes
from graphbisect.workflows.passes_claims import with_disabled

TARGET = "onnxruntime:opt_level=all"
ORACLE = "onnxruntime:opt_level=disable"  # the default oracle
L1, SIMPLIFIED = "LayerNormFusionL1", "SimplifiedLayerNormFusion"


@pytest.fixture(scope="module")
def ln(tmp_path_factory: pytest.TempPathFactory) -> tuple[PassesResult, Path, dict[str, Any]]:
    """The pass search on the LayerNorm host: (result, the model file, the inputs)."""
    tmp = tmp_path_factory.mktemp("ln")
    path = tmp / "ln.onnx"
    onnx.save(host_network(150, bug="layernorm_keepdims0").model, path)
    feeds = host_inputs()
    result = find_culprit_passes(load_model(path), inputs=feeds, options=PassesOptions(target=TARGET),
                                 workdir=tmp / "work")
    return result, path, feeds


def test_every_claim_of_a_real_answer_holds_and_is_what_is_printed(
        ln: tuple[PassesResult, Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    result, _, _ = ln
    assert set(result.culprits) == {L1, SIMPLIFIED} and result.required == (L1,)
    audit = result.audit
    assert audit is not None and audit["holds"] is True
    claims = {c["id"]: c for c in audit["claims"]}
    assert set(claims) == {"failure", "identity", "workaround", "disable_minimal", "reproduces", "enable_minimal",
                           "alone"}
    assert all(c["holds"] is True for c in claims.values()), claims
    # "fails the same way" is the compiled node the search matched by: a LayerNormalization made by LayerNormFusion
    assert "compiled with a LayerNormalization made by LayerNormFusion" in claims["reproduces"]["evidence"]
    assert result.minimal
    # the checker's runs: one oracle run, one per distinct configuration (the target, the workaround, each culprit
    # enabled again — one of which is the target —, the culprit spec, every pass disabled)
    assert audit["runs"] == {"oracle": 1, "target": 6}
    assert result.invocations["audit oracle"] == 1 and result.invocations["audit target"] == 6
    data = json.loads(json.dumps(result.to_json()))
    assert data["audit"]["claims"] == audit["claims"] and data["minimal"] is True
    print_passes(result)
    printed = capsys.readouterr().out
    assert "checked (oracle 1, target 6 plain runs" in printed
    for claim in claims.values():
        assert f"  holds: {claim['claim']}" in printed
    assert "the checker:" not in printed and "NOT confirmed" not in printed
    assert "minimal: yes (1-minimal, both sets)" in printed
    assert "audit target 6 (6 compiles)" in printed


def test_the_checker_catches_a_configuration_claimed_to_pass_that_fails(
        ln: tuple[PassesResult, Path, dict[str, Any]], tmp_path: Path) -> None:
    """The wrong pass disabled: LayerNormFusionL1 still mis-fuses, and the checker says so."""
    _, path, feeds = ln
    wrong = Configuration(with_disabled(TARGET, add=[SIMPLIFIED]), path)
    right = Configuration(with_disabled(TARGET, add=[L1, SIMPLIFIED]), path)
    audit = check_configurations(ORACLE, path, feeds, [
        ConfigurationClaim("wrong", "disabling SimplifiedLayerNormFusion fixes it", ((wrong, PASSES),)),
        ConfigurationClaim("right", "disabling both fixes it", ((right, PASSES),)),
        ConfigurationClaim("target", "the target fails", ((Configuration(TARGET, path), FAILS),)),
    ], Limits(), workdir=tmp_path)
    held = {c.id: c for c in audit.claims}
    assert held["wrong"].holds is False and "mismatch" in held["wrong"].evidence
    assert held["right"].holds is True and held["target"].holds is True
    assert audit.holds is False and audit.runs == {"oracle": 1, "target": 3}


def test_a_false_answer_is_neither_printed_nor_written_as_fact(
        ln: tuple[PassesResult, Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An answer naming the wrong pass (SimplifiedLayerNormFusion alone), checked as the workflow checks its own:
    the workaround, the enable-set and "reproduces alone" do not hold, so 1-minimal is withdrawn and the lines
    say the checker does not confirm them."""
    real, path, feeds = ln
    assert real.culprit_target is not None
    wrong = dataclasses.replace(
        real, culprits=(SIMPLIFIED,), required=(SIMPLIFIED,), each_alone=(SIMPLIFIED,), minimal=True, audit=None,
        fixed_target=with_disabled(TARGET, add=[SIMPLIFIED]),
        culprit_target=with_disabled(real.culprit_target, add=[L1], remove=[SIMPLIFIED]), notes=())
    checked = check_passes(wrong, oracle=ORACLE, model_of=lambda _spec: path, inputs=feeds, tolerance=Tolerance(),
                           compiled_as=("LayerNormalization", "LayerNormFusion"), workdir=tmp_path)
    assert checked.audit is not None
    held = {c["id"]: c["holds"] for c in checked.audit["claims"]}
    assert held["failure"] is True and held["workaround"] is False
    assert held["reproduces"] is False and held["alone"] is False  # another fused node: another failure
    assert checked.audit["holds"] is False and checked.minimal is False
    data = checked.to_json()
    assert data["minimal"] is False
    assert any(note.startswith("not claimed 1-minimal") for note in data["notes"])
    print_passes(checked)
    printed = capsys.readouterr().out
    assert f"workaround (NOT confirmed): --target '{wrong.fixed_target}'  — the checker: DOES NOT HOLD" in printed
    assert "minimal: not claimed: the checker does not confirm it" in printed
    assert "minimal: yes" not in printed
    assert f"  DOES NOT HOLD: with {SIMPLIFIED} disabled the failure disappears — " in printed


def test_the_cli_writes_the_audit_and_exits_on_the_failure(tmp_path: Path) -> None:
    """`graphbisect passes --json`: the audit section and its runs, a target that does not fail."""
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    from graphbisect.examples.patterns import pattern_model

    model = tmp_path / "relu_clip.onnx"
    onnx.save(pattern_model("relu_clip_f32"), model)
    np.savez(tmp_path / "x.npz", x=x)
    code = main(["passes", str(model), "--inputs", str(tmp_path / "x.npz"), "--json", str(tmp_path / "r.json")])
    data = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and not data["failed"]
    assert [(c["id"], c["holds"]) for c in data["audit"]["claims"]] == [("no_failure", True)]
    assert data["invocations"]["audit target"] == 1 and data["invocations"]["audit oracle"] == 1
