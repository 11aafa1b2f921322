"""The checker judges a bundle's failure above the target's noise floor, which it measures again itself.

Real bundle: the LayerNormFusion keepdims=0 bug on ONNX Runtime (``opt_level=all``), against ``onnx.reference``,
under a tolerance of about an ulp (atol = rtol = 1e-7) and inputs around 10, so ONNX Runtime's own kernels, with
every optimization off, already differ from the reference by a few tolerances (the mean's last bit, amplified by
the centring): the bundle records that noise floor, measured, and the search judged every candidate above it.
The checker used to judge by the tolerance alone: five removals that leave only kernel precision were "failing
another way" (report.md's "1-minimal for the recorded failure only" listed them), and the search's own lowest
failing level was ``disable``, the floor itself.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import graphbisect
from graphbisect.checker import audit_bundle
from graphbisect.examples.patterns import pattern_model

#: removals that leave nothing but unfused kernels: the target's error there is its own noise floor
NOISE_ONLY = ("/norm/Pow", "/norm/ReduceMean_1", "/norm/Add", "/norm/Sqrt", "/norm/Mul")


@pytest.fixture(scope="module")
def floor_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("floor") / "bug"
    x = (np.random.default_rng(0).standard_normal((16, 16)) * 3 + 10).astype(np.float32)
    graphbisect.reduce(pattern_model("layernorm_keepdims0", width=16), out, oracle="reference",
                       target="onnxruntime:opt_level=all", inputs={"x": x}, atol=1e-7, rtol=1e-7)
    floor = json.loads((out / "report.json").read_text())["noise_floor"]
    assert floor["measured"] and floor["spec"] == "onnxruntime:opt_level=disable"
    assert floor["scores"]["y"] > 1.0, floor  # the premise: the target's kernels alone are beyond the tolerance
    return out


def test_removals_that_leave_only_kernel_precision_do_not_fail(floor_bundle: Path) -> None:
    result = audit_bundle(floor_bundle)
    held = {claim.id: claim.holds for claim in result.claims}
    assert held["failure"] and held["identity"] and held["one_minimal"], result.to_json()
    assert "noise floor (onnxruntime:opt_level=disable) measured again" in result.claim("failure").evidence
    minimal = result.claim("one_minimal")
    assert not set(NOISE_ONLY) & set(minimal.fail_otherwise), minimal.evidence
    # each removal is judged above its own floor: one more run of the target's floor spec per removal
    assert result.runs["target"] >= 1 + 9 + 9


def test_the_lowest_failing_level_is_not_the_floor_itself(floor_bundle: Path) -> None:
    report = json.loads((floor_bundle / "report.json").read_text())
    levels = report["optimization_levels"]
    assert levels["levels"]["disable"] == "passes" and levels["lowest_failing"] != "disable", levels
    claim = audit_bundle(floor_bundle).claim("lowest_level")
    assert claim is not None and claim.holds is True and "disable: passes" in claim.evidence


def test_a_floor_that_cannot_be_measured_again_decides_nothing(floor_bundle: Path, tmp_path: Path) -> None:
    """A recorded floor that is not the target with its optimizations off is not run: what it decides is not
    established (judged by the tolerance alone, it would be)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(floor_bundle, bundle)
    path = bundle / "report.json"
    report = json.loads(path.read_text())
    report["noise_floor"]["spec"] = "onnxruntime:opt_level=all"
    path.write_text(json.dumps(report))
    _resign(bundle)
    result = audit_bundle(bundle)
    held = {claim.id: claim.holds for claim in result.claims}
    assert held["expected_outputs"] is True and held["flaky"] is True
    for claim_id in ("failure", "identity", "magnitude", "one_minimal", "lowest_level"):
        assert held[claim_id] is None, (claim_id, result.to_json())
    assert "is not the target onnxruntime:opt_level=all with its optimizations off" in \
        result.claim("failure").evidence


def _resign(bundle: Path) -> None:
    path = bundle / "report.json"
    report = json.loads(path.read_text())
    for entry in (e for e in report["files"] if "sha256" in e):
        data = (bundle / entry["name"]).read_bytes()
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    path.write_text(json.dumps(report))
