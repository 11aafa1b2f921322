"""Workflows report every backend call by kind (graphbisect/backends/cost.py), on real IREE bugs.

``passes --target iree`` lists the fired features by compiling the model once per feature: those compiles are
counted (they were not: "invocations: target 6" hid 30 compiles), and the pass candidates that compile a
module the listing compiled already are served from the command's compile cache. A reduction of a failure at
compile tests its candidates by compiling them alone: the same result, with no candidate run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.backends import resolve
from graphbisect.backends.iree import FEATURES
from graphbisect.cli.main import main
from graphbisect.examples.hosts import host_network
from graphbisect.examples.iree_bugs import iree_bug_model
from graphbisect.model import load_model
from graphbisect.workflows.passes import PassesOptions, find_culprit_passes
from graphbisect.workflows.reduce import CRASH_BASELINE_RUNS, VERIFY_RUNS, ReduceOptions, ReduceResult, reduce_model

#: graphbisect.oracle.tester.COMPILE_ONLY_ENV (spelled out: the test runs on a build without it, and fails there)
COMPILE_ONLY_ENV = "GRAPHBISECT_COMPILE_ONLY"
iree_installed = pytest.mark.skipif(not resolve("iree", require_available=False)[1].availability().available,
                                    reason="iree-base-compiler is not installed (pip install 'graphbisect[iree]')")


@iree_installed
def test_iree_passes_counts_the_feature_listing_compiles_and_the_cache_hits() -> None:
    model, inputs, _ = iree_bug_model("f64-output", blocks=1)
    result = find_culprit_passes(load_model(model), inputs=inputs, options=PassesOptions(target="iree"))
    assert result.culprits == ("demote-f64-to-f32",)
    target = result.backend_calls["target"]
    assert target["runs"] == result.invocations["target"]
    # one run lists the fired features: the model, twice more for the compiler's noise, once per feature
    assert target["compiles"] + target["compile_cache_hits"] >= target["runs"] - 1 + 2 + len(FEATURES)
    # candidates disabling one feature compile what the listing compiled: served by the cache
    assert target["compile_cache_hits"] >= 1


@iree_installed
def test_compare_does_not_build_the_probe_after_the_plain_compile_crashed(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    model, inputs, _ = iree_bug_model("maxunpool")
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", **inputs)
    main(["compare", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "in.npz"), "--target", "iree",
          "--json", str(tmp_path / "r.json")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["backend_calls"]["target"] == {"runs": 1, "compiles": 1, "compile_cache_hits": 0}
    assert "probe model was not built" in (report["layerwise_note"] or "")
    assert "invocations: " in capsys.readouterr().out


def _reduce_both_ways(model: onnx.ModelProto, inputs: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      target: str) -> tuple[ReduceResult, ReduceResult, int]:
    """The reduction with candidates compiled alone (the default) and, with ``GRAPHBISECT_COMPILE_ONLY=off``,
    compiled and run as before; and the candidates the search tested (from the bundle's report)."""
    results = []
    for name, setting in (("alone", None), ("run", "off")):
        if setting is None:
            monkeypatch.delenv(COMPILE_ONLY_ENV, raising=False)
        else:
            monkeypatch.setenv(COMPILE_ONLY_ENV, setting)
        results.append(reduce_model(load_model(model), tmp_path / name, inputs=inputs,
                                    options=ReduceOptions(target=target)))
    search = json.loads((tmp_path / "alone" / "report.json").read_text())["search"]
    return results[0], results[1], int(search["tests"] - search["cache_hits"])


def _assert_same_result_without_candidate_runs(alone: ReduceResult, run: ReduceResult, tested: int) -> None:
    assert alone.signature.kind.value == "crash-load"
    assert (alone.kept_nodes, alone.signature, alone.one_minimal, alone.verified, alone.journey) == \
        (run.kept_nodes, run.signature, run.one_minimal, run.verified, run.journey)
    # every candidate and re-verification built its model and ran nothing; before, each was a run too
    assert alone.invocations["target"] == run.invocations["target"] - tested - VERIFY_RUNS
    assert alone.backend_calls["target"]["compiles"] == run.backend_calls["target"]["compiles"]
    assert alone.backend_calls["target"]["runs"] == alone.invocations["target"]


def test_an_ort_session_creation_crash_is_reduced_by_building_candidates_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Runtime's ReluClip fusion rejects a float64 Clip when it creates the session (a real crash): the
    150-node host reduces to the same nodes with CRASH_BASELINE_RUNS target runs, not one per candidate."""
    host = host_network(150, bug="relu_clip_f64", position="main", seed=2)
    alone, run, tested = _reduce_both_ways(host.model, host.inputs, tmp_path, monkeypatch, "onnxruntime")
    _assert_same_result_without_candidate_runs(alone, run, tested)
    assert alone.invocations["target"] == CRASH_BASELINE_RUNS and tested > 5


@iree_installed
def test_an_iree_compile_failure_is_reduced_by_compiling_candidates_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nod-ai/AMD-SHARK-ModelDev#718 (torch.aten.max_unpool2d has no lowering): the MaxUnpool alone, as before,
    and no candidate ran after its compile."""
    model, inputs, truth = iree_bug_model("maxunpool")
    alone, run, tested = _reduce_both_ways(model, inputs, tmp_path, monkeypatch, "iree")
    _assert_same_result_without_candidate_runs(alone, run, tested)
    assert alone.kept_nodes == truth.nodes and alone.one_minimal
