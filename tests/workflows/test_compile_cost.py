"""Workflows report every backend call by kind (graphbisect/backends/cost.py), on real IREE bugs.

``passes --target iree`` lists the fired features by compiling the model once per feature: those compiles are
counted (they were not: "invocations: target 6" hid 30 compiles), and the pass candidates that compile a
module the listing compiled already are served from the command's compile cache (tested in
tests/backends/test_iree.py, on the one ``passes`` search of the f64 bug its culprit test makes). ``reduce``,
``precision``, ``tactics``, ``verify`` and ``triage`` report the same ``backend_calls`` (their runs are their
``invocations``, role by role), and print them on their ``invocations:`` line. A reduction of a failure at
compile tests its candidates by compiling them alone: the same result, with no candidate run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.backends import resolve
from graphbisect.backends.cost import describe_calls
from graphbisect.cli.main import main
from graphbisect.compare import Tolerance
from graphbisect.examples import host_network
from graphbisect.examples.iree_bugs import iree_bug_model
from graphbisect.model import load_model
from graphbisect.workflows.reduce import (
    CRASH_BASELINE_RUNS,
    VERIFY_RUNS,
    ReduceOptions,
    ReduceResult,
    reduce_model,
    resume_reduction,
    work_dir_for,
)

#: graphbisect.oracle.tester.COMPILE_ONLY_ENV (spelled out: the test runs on a build without it, and fails there)
COMPILE_ONLY_ENV = "GRAPHBISECT_COMPILE_ONLY"
iree_installed = pytest.mark.skipif(not resolve("iree", require_available=False)[1].availability().available,
                                    reason="iree-base-compiler is not installed (pip install 'graphbisect[iree]')")


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


def _runs_are_the_invocations(invocations: dict, calls: dict) -> None:
    """``backend_calls`` counts the very runs ``invocations`` counts, role by role, and what they compiled."""
    assert {role: cost["runs"] for role, cost in calls.items()} == dict(invocations)
    assert all(set(cost) == {"runs", "compiles", "compile_cache_hits"} for cost in calls.values())


def _save(model: onnx.ModelProto, inputs: dict, folder: Path) -> tuple[str, str]:
    onnx.save(model, folder / "m.onnx")
    np.savez(folder / "in.npz", **inputs)
    return str(folder / "m.onnx"), str(folder / "in.npz")


@iree_installed
def test_reduce_counts_a_compile_per_iree_candidate_and_the_report_facts(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    model, inputs, truth = iree_bug_model("maxunpool", blocks=1)
    path, feeds = _save(model, inputs, tmp_path)
    assert main(["reduce", path, "--inputs", feeds, "--target", "iree", "-o", str(tmp_path / "b"),
                 "--json", str(tmp_path / "r.json")]) == 1
    result = json.loads((tmp_path / "r.json").read_text())
    assert tuple(result["kept_nodes"]) == truth.nodes
    _runs_are_the_invocations(result["invocations"], result["backend_calls"])
    # a compile crash leaves no module to reuse: every target call (baseline, candidate, re-verification)
    # compiled; the candidates were compiled alone, not run (a failure at compile). IREE's diagnostic names the
    # node (loc("site/unpool")): that node alone is the first candidate, and the only one the search needs.
    target = result["backend_calls"]["target"]
    search = json.loads((tmp_path / "b" / "report.json").read_text())["search"]
    candidates = search["tests"] - search["cache_hits"]
    assert candidates == 1
    assert target["runs"] == CRASH_BASELINE_RUNS  # the original's agreeing crashes; the re-verification only builds
    assert target["compiles"] + target["compile_cache_hits"] == target["runs"] + candidates + VERIFY_RUNS
    bundle = json.loads((tmp_path / "b" / "report.json").read_text())
    assert bundle["backend_calls"] == result["backend_calls"]
    _runs_are_the_invocations(bundle["report_runs"], bundle["report_calls"])  # the spec's word: onnx.reference
    assert result["report_calls"] == bundle["report_calls"] and bundle["report_calls"]["reference"]["compiles"] >= 1
    out = capsys.readouterr().out
    assert f"target {target['runs']} ({target['compiles']} compiles" in out and "; report facts: reference 1" in out
    assert f"target {target['runs']} ({target['compiles']} compiles" in (tmp_path / "b" / "report.md").read_text()


@pytest.fixture(scope="module")
def ort_reduction(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReduceResult, Path, str, str]:
    """The 100-node host's LayerNorm bug (seed 6) saved and reduced on ONNX Runtime: the result, its folder (the
    bundle is ``b`` there) and the model and inputs files. Two tests read it (the same reduction, done once)."""
    folder = tmp_path_factory.mktemp("ort-reduction")
    host = host_network(100, bug="layernorm_keepdims0", position="branch", seed=6)
    path, feeds = _save(host.model, host.inputs, folder)
    return reduce_model(load_model(path), folder / "b", inputs=host.inputs), folder, path, feeds


def test_reduce_counts_one_onnxruntime_session_per_candidate(ort_reduction: tuple[ReduceResult, Path, str, str]
                                                             ) -> None:
    result, folder, _, _ = ort_reduction
    assert result.one_minimal
    _runs_are_the_invocations(result.invocations, result.backend_calls)
    search = json.loads((folder / "b" / "report.json").read_text())["search"]
    # each candidate is another model file: its own session; the original's runs are sessions too
    assert result.backend_calls["target"]["compiles"] > search["tests"] - search["cache_hits"]
    assert result.backend_calls["oracle"]["compiles"] >= 1
    # the optimization levels and the passes that fired at the lowest failing one are report facts
    assert result.report_calls["target"]["compiles"] >= result.report_calls["target"]["runs"] >= 2


@iree_installed
def test_reduce_counts_compiles_across_resume_and_resumes_older_work_folders(tmp_path: Path) -> None:
    # iree-compile's SIGSEGV names no node: the search needs more than the 2 candidates allowed here
    model, inputs, truth = iree_bug_model("unique", blocks=1)
    first = reduce_model(load_model(model), tmp_path / "b", inputs=inputs,
                         options=ReduceOptions(target="iree", max_invocations=2))
    assert not first.one_minimal and first.stop_reason is not None
    state = json.loads((work_dir_for(tmp_path / "b") / "run.json").read_text())
    assert state["backend_calls"] == first.backend_calls  # recorded: a resumed run goes on counting from here
    before = first.backend_calls["target"]["compiles"]
    assert before >= first.invocations["target"]
    # The same stopped run as earlier versions left it: their journals carry no costs (the searches' calls
    # were in the state file's total), and the oldest state files count runs alone (no compiles).
    for older, dropped in (("previous", ("calls_outside_searches",)),
                           ("oldest", ("calls_outside_searches", "backend_calls"))):
        for name in ("b", "b.work"):
            shutil.copytree(tmp_path / name, tmp_path / older / name)
        work = work_dir_for(tmp_path / older / "b")
        (work / "run.json").write_text(json.dumps({k: v for k, v in state.items() if k not in dropped}))
        _strip_costs(work / "journal.jsonl")

    resumed = resume_reduction(tmp_path / "b")
    assert tuple(resumed.kept_nodes) == truth.nodes
    _runs_are_the_invocations(resumed.invocations, resumed.backend_calls)
    # the resumed search's candidates are compiled alone (a failure at compile): compiles, no runs
    assert resumed.invocations["target"] >= first.invocations["target"]
    assert resumed.backend_calls["target"]["compiles"] > before

    previous = resume_reduction(tmp_path / "previous" / "b")
    assert previous.kept_nodes == resumed.kept_nodes and previous.backend_calls == resumed.backend_calls
    oldest = resume_reduction(tmp_path / "oldest" / "b")
    assert oldest.kept_nodes == resumed.kept_nodes and oldest.invocations == resumed.invocations
    _runs_are_the_invocations(oldest.invocations, oldest.backend_calls)
    # the first session's compiles were not recorded: only this session's are known
    assert oldest.backend_calls["target"]["compiles"] == resumed.backend_calls["target"]["compiles"] - before


def _strip_costs(journal: Path) -> None:
    """Take the calls out of a journal's results, as a graphbisect that did not journal them wrote it."""
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    for entry in lines:
        if isinstance(entry.get("detail"), dict):
            assert entry["detail"].pop("cost", None) is not None or entry.get("invoked") is False
    journal.write_text("".join(json.dumps(entry) + "\n" for entry in lines))


def test_verify_counts_the_bundles_run_and_the_original_models_comparison(
        ort_reduction: tuple[ReduceResult, Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``verify`` of the bundle alone, then with ``--model``: each counts its own calls (it writes in a temporary
    folder of its own, so the shared bundle is read, never changed)."""
    reduced, folder, path, feeds = ort_reduction
    assert reduced.one_minimal
    capsys.readouterr()
    assert main(["verify", str(folder / "b"), "--json", str(tmp_path / "v.json")]) == 1
    verified = json.loads((tmp_path / "v.json").read_text())
    assert verified["outcome"] == "reproduces"
    assert verified["backend_calls"] == {"target": {"runs": 1, "compiles": 1, "compile_cache_hits": 0}}
    _runs_are_the_invocations(verified["invocations"], verified["backend_calls"])
    assert "invocations: target 1 (1 compile)" in capsys.readouterr().out
    # --model compares the original model too: the oracle's run and the target's (the plain model and its probe)
    assert main(["verify", str(folder / "b"), "--model", path, "--inputs", feeds,
                 "--json", str(tmp_path / "m.json")]) == 1
    both = json.loads((tmp_path / "m.json").read_text())
    _runs_are_the_invocations(both["invocations"], both["backend_calls"])
    assert both["invocations"]["oracle"] >= 1 and both["invocations"]["target"] >= 2
    assert all(calls["compiles"] >= 1 for calls in both["backend_calls"].values())
    assert f"invocations: {describe_calls(both['invocations'], both['backend_calls'])}" in capsys.readouterr().out


def _centering(folder: Path) -> tuple[str, str]:
    """x - GlobalAveragePool(x), then Relu: a float16 GlobalAveragePool of 128x128 values near 10 overflows on IREE."""
    f32, shape = onnx.TensorProto.FLOAT, [1, 2, 128, 128]
    nodes = [onnx.helper.make_node("GlobalAveragePool", ["x"], ["m"], name="gap"),
             onnx.helper.make_node("Sub", ["x", "m"], ["c"], name="center"),
             onnx.helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = onnx.helper.make_graph(nodes, "centering", [onnx.helper.make_tensor_value_info("x", f32, shape)],
                                   [onnx.helper.make_tensor_value_info("y", f32, shape)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    return _save(model, {"x": (np.random.default_rng(0).standard_normal(shape) + 10).astype(np.float32)}, folder)


@iree_installed
def test_precision_counts_a_compile_per_iree_candidate_and_verification_run(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, feeds = _centering(tmp_path)
    main(["precision", path, "--inputs", feeds, "--target", "iree", "-o", str(tmp_path / "out"),
          "--json", str(tmp_path / "p.json")])
    result = json.loads((tmp_path / "p.json").read_text())
    calls = result["backend_calls"]
    # search_tests counts tests, not backend calls; the checker's plain runs of the files written are its own
    assert set(calls) == {"oracle", "target", "verification", "audit oracle", "audit target"}
    _runs_are_the_invocations({role: result["invocations"][role] for role in calls}, calls)
    # every candidate, every verification run (the typed model's repair included) and every run of the checker
    # (no compile cache) is another module
    for role in ("target", "verification", "audit target"):
        assert calls[role]["compiles"] + calls[role]["compile_cache_hits"] >= calls[role]["runs"] > 0
    verification = calls["verification"]
    assert f"verification {verification['runs']} ({verification['compiles']} compiles)" in capsys.readouterr().out


def test_precision_workers_in_parallel_count_one_session_per_candidate() -> None:
    from graphbisect.examples.precision_models import cnn_inputs, residual_cnn
    from graphbisect.workflows.precision import find_precision

    result = find_precision(load_model(residual_cnn()), mode="int8", inputs=cnn_inputs(),
                            tolerance=Tolerance(atol=0.05, rtol=0.05), with_prefix=False, jobs=2)
    assert result.keep_fp32
    calls = result.backend_calls
    _runs_are_the_invocations({role: result.invocations[role] for role in calls}, calls)
    # two target workers: each candidate is another model file, so another session in whichever worker ran it
    assert calls["target"]["compiles"] >= calls["target"]["runs"] > 0
    assert calls["oracle"]["compiles"] >= 1 and calls["verification"]["compiles"] >= 1


def test_tactics_record_replay_and_isolate_count_their_builds(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("openvino")
    from graphbisect.tactics import load_record, save_record
    from tests.tactics.tactics_builders import save_cnn

    # A worker's first OpenVINO run compiles a probe model to check the device's precision, then the model; a
    # replay compiles the model, then again with the record's kernels pinned (the replay lost its count: 0)
    model = save_cnn(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["tactics", "record", str(model), "-o", str(a), "--json", str(tmp_path / "rec.json")]) == 0
    recorded = json.loads((tmp_path / "rec.json").read_text())
    assert recorded["backend_calls"] == {"target": {"runs": 1, "compiles": 2, "compile_cache_hits": 0}}
    _runs_are_the_invocations(recorded["invocations"], recorded["backend_calls"])
    assert "invocations: target 1 (2 compiles)" in capsys.readouterr().out
    rec = load_record(a)
    swap = "jit_gemm" if rec.choice_of("matmul1") != "jit_gemm" else "ref_any"
    save_record(rec.with_choices({"matmul1": swap}), b)
    main(["tactics", "replay", str(model), str(b), "--json", str(tmp_path / "rep.json")])
    replayed = json.loads((tmp_path / "rep.json").read_text())
    assert replayed["backend_calls"] == {"target": {"runs": 1, "compiles": 3, "compile_cache_hits": 0}}
    _runs_are_the_invocations(replayed["invocations"], replayed["backend_calls"])

    main(["tactics", "isolate", str(model), "--good", str(a), "--bad", str(b), "--oracle", "openvino",
          "--json", str(tmp_path / "iso.json")])
    isolated = json.loads((tmp_path / "iso.json").read_text())
    calls = isolated["backend_calls"]
    _runs_are_the_invocations(isolated["invocations"], calls)
    assert calls["oracle"] == {"runs": 1, "compiles": 2, "compile_cache_hits": 0}
    # after the probe, the bad record's build (plain, then pinned: it differs from the recorded kernels) and one
    # or two compiles per other record the search replays; a record built before runs its build again
    assert 1 + 2 <= calls["target"]["compiles"] <= 1 + 2 * calls["target"]["runs"]
    assert f"invocations: {describe_calls(isolated['invocations'], calls)}; " in capsys.readouterr().out


def test_triage_counts_every_steps_calls_per_model_and_in_sum(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHBISECT_CACHE", str(tmp_path / "cache"))  # this ORT's optimizer names not known yet
    for name, bug in (("ln", "layernorm_keepdims0"), ("healthy", None)):
        host = host_network(100, bug=bug, position="branch", seed=6)
        _save(host.model, host.inputs, tmp_path)
        (tmp_path / "m.onnx").rename(tmp_path / f"{name}.onnx")
        (tmp_path / "in.npz").rename(tmp_path / f"{name}.npz")
    capsys.readouterr()
    assert main(["triage", str(tmp_path), "-o", str(tmp_path / "out"), "-j", "1",
                 "--json", str(tmp_path / "s.json")]) == 1
    summary = json.loads((tmp_path / "s.json").read_text())
    models = {model["name"]: model for model in summary["models"]}
    failed, healthy = models["ln"], models["healthy"]
    # audit: the checker's plain runs of each model's verdict (workflows/triage_claims.py)
    assert set(failed["step_backend_calls"]) == {"compare", "passes", "reduce", "audit"}
    assert set(healthy["step_backend_calls"]) == {"compare", "audit"}
    total: dict[str, dict[str, int]] = {}
    for model in (failed, healthy):
        for step, calls in model["step_backend_calls"].items():
            _runs_are_the_invocations(model["step_invocations"][step], calls)
            assert all(cost["compiles"] >= 1 for cost in calls.values())  # each role built its model at least once
            for role, cost in calls.items():
                summed = total.setdefault(role, {"runs": 0, "compiles": 0, "compile_cache_hits": 0})
                total[role] = {kind: summed[kind] + n for kind, n in cost.items()}
    _runs_are_the_invocations(failed["invocations"], failed["backend_calls"])  # the reduction's
    assert failed["backend_calls"] == failed["step_backend_calls"]["reduce"]
    # the pass search lists the optimizer names (once per ORT version) by building ~400 sessions of a probe model:
    # not the target's compiles of this model (they read "target 4 (414 compiles)": issue 35 case 6)
    passes = failed["step_backend_calls"]["passes"]["target"]
    assert passes["compiles"] <= passes["runs"]
    assert summary["backend_calls"] == total  # the sum over models and steps
    out = capsys.readouterr().out
    assert f"invocations: {describe_calls({}, total)}" in out
    assert f"healthy: passed; invocations: {describe_calls({}, healthy['step_backend_calls']['compare'])}" in out
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


def test_the_report_facts_run_the_target_in_one_reconfigured_worker(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The facts run ONNX Runtime (reconfigurable: every option is a session setting) four times — its compiled
    model, opt_level=disable and basic, the passes fired at basic — in one worker, not in a new one each (a
    worker's start, ~0.17 s of CPU, cost more than the reduced model's run); the facts are the same."""
    from graphbisect.backends.process import BackendProcess
    from graphbisect.workflows import maintainer

    started: list[str] = []

    class Counted(BackendProcess):  # the real worker, counted
        def __init__(self, spec, **kwargs) -> None:  # type: ignore[no-untyped-def]
            started.append(str(spec))
            super().__init__(spec, **kwargs)

    monkeypatch.setattr(maintainer, "BackendProcess", Counted)
    host = host_network(150, bug="layernorm_keepdims0", position="main", seed=0)
    result = reduce_model(load_model(host.model), tmp_path / "bug", inputs=host.inputs,
                          options=ReduceOptions(oracle="onnxruntime:opt_level=disable"))
    assert result.report_calls["target"]["runs"] == 4
    assert [spec.split(":")[0] for spec in started] == ["reference", "onnxruntime"]  # one worker per role
    levels = json.loads((tmp_path / "bug" / "report.json").read_text())["optimization_levels"]
    assert levels["levels"] == {"disable": "passes", "basic": "fails the same way"}
    assert levels["fired_at_lowest"] == ["LayerNormFusionL1"]
