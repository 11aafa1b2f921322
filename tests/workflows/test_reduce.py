"""`reduce` end to end on real ONNX Runtime bugs embedded in host networks (ground truth from the builder)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphbisect.workflows.reduce as reduce_module
from graphbisect.cli.main import main
from graphbisect.compare import Tolerance
from graphbisect.data import ActivationStore
from graphbisect.engine import Outcome
from graphbisect.examples import host_network
from graphbisect.model import load_model
from graphbisect.oracle.identity import Identity, IdentityCheck
from graphbisect.oracle.signature import EXACT_VALUES, FLOAT_VALUES, FailureKind, Signature
from graphbisect.oracle.tester import CandidateTester, WorkerPool, model_digest
from graphbisect.storage.values import write_value
from graphbisect.strategies.subgraph import SubgraphSpace
from graphbisect.workflows.reduce import (
    CRASH_BASELINE_RUNS,
    VERIFY_RUNS,
    ReduceOptions,
    ReduceResult,
    reduce_model,
    work_dir_for,
)


def _reduce(host, out: Path, **options) -> ReduceResult:  # type: ignore[no-untyped-def]
    return reduce_model(load_model(host.model), out, inputs=host.inputs, options=ReduceOptions(**options))


def _assert_matches_ground_truth(result: ReduceResult, host) -> None:  # type: ignore[no-untyped-def]
    kept = set(result.kept_nodes)
    assert set(host.core_nodes) <= kept, f"missing culprit nodes: {set(host.core_nodes) - kept}"
    allowed = set(host.culprit_nodes) | set(host.support_nodes)
    assert kept <= allowed, f"kept host nodes that are not needed: {kept - allowed}"


def _search_runs(bundle: Path) -> int:
    """The search's target runs: its tests, less those answered from the cache or decided by a build alone."""
    search = json.loads((bundle / "report.json").read_text())["search"]
    return int(search["tests"] - search["cache_hits"] - search["built_only"])


def _repro(bundle: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(bundle / "repro.py")], capture_output=True, text=True, timeout=120,
                          cwd=bundle.parent, check=False)


@pytest.mark.parametrize("position", ["main", "branch", "masked"])
def test_layernorm_fusion_bug_reduces_to_its_core(position: str, tmp_path: Path) -> None:
    host = host_network(160, bug="layernorm_keepdims0", position=position, seed=1)
    result = _reduce(host, tmp_path / "bug")
    assert result.failed and result.signature.kind.value == "mismatch"
    assert result.one_minimal and result.verified and result.stop_reason is None
    _assert_matches_ground_truth(result, host)
    assert result.invocations["target"] < 60 and result.invocations["oracle"] == 2
    proc = _repro(tmp_path / "bug")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout
    report = json.loads((tmp_path / "bug" / "report.json").read_text())
    assert report["final_nodes"] == len(result.kept_nodes) and report["original_nodes"] == 160
    assert not work_dir_for(tmp_path / "bug").exists(), "a finished, verified run cleans up its work folder"


def test_fusion_bug_is_found_from_the_compiled_graph_in_few_runs(tmp_path: Path) -> None:
    """ORT's saved optimized graph shows which tensors the LayerNorm fusion swallowed: the probe exposes only
    the survivors (so the fusion, and its bug, stay), and the first hint is the whole fused pattern."""
    host = host_network(400, bug="layernorm_keepdims0", position="branch", seed=8)
    model = load_model(host.model)
    result = _reduce(host, tmp_path / "bug", keep_work=True)
    assert result.one_minimal
    _assert_matches_ground_truth(result, host)
    baseline = json.loads((work_dir_for(tmp_path / "bug") / "baseline.json").read_text())
    assert baseline["flaky"] is False and baseline["notes"] == [], "no probe masking"
    hints = [{model.node_names[i] for i in hint} for hint in baseline["hints"]]
    assert hints[0] == set(host.culprit_nodes)
    # Two runs before the search: the probe's own outputs were the flakiness re-run.
    assert result.invocations["target"] == 2 + _search_runs(tmp_path / "bug") + VERIFY_RUNS
    # Polygraphy's bisect needs about 2·log2(n) checks (and is not 1-minimal on a branch).
    assert result.invocations["target"] <= 2 * math.ceil(math.log2(400))


def test_candidate_that_cannot_show_the_failure_is_not_run(tmp_path: Path) -> None:
    """An integer flip cannot appear on float outputs (nor a float error on integer ones): no run is spent."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         helper.make_node("ArgMax", ["a"], ["label"], name="argmax", axis=1, keepdims=0)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [4])])
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    values = {"x": x, "a": np.maximum(x, 0), "label": np.maximum(x, 0).argmax(axis=1)}
    space = SubgraphSpace(model, values.__getitem__, tmp_path / "space")
    pool = WorkerPool("onnxruntime", 1, tmp_path / "pool")
    try:
        flip = CandidateTester(space, pool, Signature(FailureKind.MISMATCH, EXACT_VALUES), Tolerance())
        skipped = flip(frozenset({0}))
        assert skipped.outcome is Outcome.UNRESOLVED and not skipped.invoked and pool.invocations == 0
        assert flip(frozenset({0, 1})).invoked and pool.invocations == 1
        drift = CandidateTester(space, pool, Signature(FailureKind.MISMATCH, FLOAT_VALUES), Tolerance())
        assert not drift(frozenset({1})).invoked and drift(frozenset({0})).invoked and pool.invocations == 2
    finally:
        pool.close()


def test_two_distant_sites_are_both_kept(tmp_path: Path) -> None:
    host = host_network(300, bug="layernorm_keepdims0", position="two-distant", seed=2)
    result = _reduce(host, tmp_path / "bug")
    assert result.one_minimal
    _assert_matches_ground_truth(result, host)
    sites = {name.split("/")[1] for name in host.core_nodes}
    assert len(sites) >= 2 and sites <= {name.split("/")[1] for name in result.kept_nodes}
    # The layerwise hints (one per site) fail only together: joined to the output by the fewest nodes they are
    # one candidate near the answer (a search from the slice around both sites, most of the model, cost 3-4
    # times the floor: the original's runs, the probe and the re-verifications, the accepting run, one run per
    # single-node removal). That joined set is mostly needed, so it is swept one node at a time: the floor plus
    # the hint candidates and the nodes tried before the last removable one (44 runs for a floor of 31 here;
    # ProbDD's group removals before the same proof took 52).
    floor = 5 + 1 + len(result.kept_nodes)
    assert result.invocations["target"] <= 1.5 * floor, result.invocations


def test_crash_bug_reduces_to_relu_and_clip(tmp_path: Path) -> None:
    host = host_network(150, bug="relu_clip_f64", position="branch", seed=3)
    result = _reduce(host, tmp_path / "bug")
    assert result.signature.kind.value == "crash-load"
    assert "Unexpected data type for Clip" in result.signature.detail
    assert result.one_minimal
    _assert_matches_ground_truth(result, host)
    # The first run saved ORT's optimized graph and crashed; the plain second run crashing the same way
    # rules out the saving and is the first flakiness re-run; a crash baseline takes CRASH_BASELINE_RUNS
    # agreeing runs in all (issue 24 case 6: two crashes agree by chance on a flaky target). The failure is at
    # session creation, so every candidate and every re-verification only creates its session: a compile and
    # no run (issue 27: each was a run before).
    assert result.invocations["target"] == CRASH_BASELINE_RUNS
    assert result.backend_calls["target"] == {
        "runs": CRASH_BASELINE_RUNS, "compiles": CRASH_BASELINE_RUNS + _search_runs(tmp_path / "bug") + VERIFY_RUNS,
        "compile_cache_hits": 0}
    assert not result.flaky
    assert sorted(load_model(tmp_path / "bug" / "model.onnx").proto.graph.node[i].op_type
                  for i in range(len(result.kept_nodes))) == sorted(
        n.op_type for n in load_model(host.model).nodes if n.name in result.kept_nodes)
    assert _repro(tmp_path / "bug").returncode == 1


def test_result_is_one_minimal_checked_independently(tmp_path: Path) -> None:
    """Remove each kept node in turn and run the target afresh: every removal must make the recorded failure
    (its identity: the LayerNormalization that LayerNormFusion made) go away. By kind alone the 6-node core
    that SimplifiedLayerNormFusion mis-fuses would still fail: another failure, of a sibling pass."""
    host = host_network(150, bug="layernorm_keepdims0", position="branch", seed=4)
    model = load_model(host.model)
    result = _reduce(host, tmp_path / "bug", keep_work=True)
    identity = Identity.from_json(json.loads((tmp_path / "bug" / "report.json").read_text())["identity"])
    assert identity is not None and (identity.compiled_kind, identity.made_by) == ("LayerNormalization",
                                                                                   "LayerNormFusion")
    work = work_dir_for(tmp_path / "bug")
    store = ActivationStore.open(work / "activations")
    feeds = dict(np.load(work / "inputs.npz"))
    space = SubgraphSpace(model, lambda n: feeds[n] if n in feeds else store.get(n), tmp_path / "check")
    pool = WorkerPool("onnxruntime:opt_level=all,save_optimized=1", 1, tmp_path / "check")
    tester = CandidateTester(space, pool, result.signature, Tolerance(), identity=IdentityCheck(identity, model.nodes))
    by_kind = CandidateTester(space, pool, result.signature, Tolerance())
    keep = frozenset(model.node_index(n) for n in result.kept_nodes)
    try:
        assert tester(keep).outcome is Outcome.FAIL
        for index in keep:
            assert tester(keep - {index}).outcome is not Outcome.FAIL, model.node_names[index]
        # the mean is kept: without it the sibling pass's RMSNorm fusion fails, by kind the same
        mean = next(i for i in keep if model.nodes[i].op_type == "ReduceMean" and
                    model.nodes[i].output[0] in set(model.nodes[j].input[1] for j in keep
                                                    if model.nodes[j].op_type == "Sub"))
        assert by_kind(keep - {mean}).outcome is Outcome.FAIL
    finally:
        pool.close()
    # The exact model that failed is recorded (a re-verification is compared with it); the others, which no
    # search accepts, are not hashed.
    assert tester.tested == {keep: model_digest(space.materialize(keep).proto)}
    assert len(keep) == 9


def test_a_build_decides_the_removals_that_no_longer_fuse(tmp_path: Path) -> None:
    """ONNX Runtime says what it compiled once it has built a model (its saved optimized model), and without any
    one of the 9 nodes LayerNormFusion no longer makes the recorded LayerNormalization: each removal is decided by
    its build alone, not run (one compile each), and it is rejected exactly as its run is. The whole answer, which
    keeps the region whole, is still run, and fails."""
    host = host_network(150, bug="layernorm_keepdims0", position="main", seed=4)
    model = load_model(host.model)
    result = _reduce(host, tmp_path / "bug", keep_work=True)
    search = json.loads((tmp_path / "bug" / "report.json").read_text())["search"]
    assert result.one_minimal and len(result.kept_nodes) == 9 and search["built_only"] >= 9
    assert any("built and not run" in note for note in result.notes)
    identity = IdentityCheck(Identity.from_json(json.loads((tmp_path / "bug" / "report.json").read_text())["identity"]),
                             model.nodes)
    work = work_dir_for(tmp_path / "bug")
    store = ActivationStore.open(work / "activations")
    feeds = dict(np.load(work / "inputs.npz"))
    space = SubgraphSpace(model, lambda n: feeds[n] if n in feeds else store.get(n), tmp_path / "check")
    plain = WorkerPool("onnxruntime:opt_level=all", 1, tmp_path / "plain")
    describing = WorkerPool("onnxruntime:opt_level=all,save_optimized=1", 1, tmp_path / "describing")
    ran = WorkerPool("onnxruntime:opt_level=all,save_optimized=1", 1, tmp_path / "ran")
    built = CandidateTester(space, plain, result.signature, Tolerance(), identity=identity, describing=describing,
                            build_decides=True)
    every_run = CandidateTester(space, ran, result.signature, Tolerance(), identity=identity)
    keep = frozenset(model.node_index(n) for n in result.kept_nodes)
    try:
        for index in keep:
            decided = built(keep - {index})
            assert decided.outcome is Outcome.UNRESOLVED and decided.invoked, model.node_names[index]
            assert isinstance(decided.detail, dict) and "seen at build" in decided.detail["identity"]
            assert decided.detail["cost"]["runs"] == 0 and decided.detail["cost"]["compiles"] == 1
            assert every_run(keep - {index}).outcome is not Outcome.FAIL, model.node_names[index]
        assert (describing.cost.runs, describing.cost.compiles) == (0, 9)
        assert built.built_otherwise == 9
        assert built(keep).outcome is Outcome.FAIL and plain.cost.runs == 1
    finally:
        for pool in (plain, describing, ran):
            pool.close()


def test_no_failure_exits_0_and_writes_only_the_report(tmp_path: Path) -> None:
    host = host_network(120, bug=None, seed=5)
    path = tmp_path / "ok.onnx"
    onnx.save(host.model, path)
    np.savez(tmp_path / "in.npz", **host.inputs)
    out = tmp_path / "out"
    assert main(["reduce", str(path), "--inputs", str(tmp_path / "in.npz"), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    assert json.loads((out / "report.json").read_text())["failed"] is False
    assert not work_dir_for(out).exists()


def test_budget_stop_keeps_best_so_far_and_resume_finishes(tmp_path: Path) -> None:
    host = host_network(160, bug="layernorm_keepdims0", position="branch", seed=6)
    full = _reduce(host, tmp_path / "full")
    partial = _reduce(host, tmp_path / "bug", max_invocations=4)
    assert not partial.one_minimal and partial.stop_reason is not None
    assert partial.final_nodes >= full.final_nodes and (tmp_path / "bug" / "model.onnx").exists()
    assert main(["reduce", "--resume", str(tmp_path / "bug"), "--json", str(tmp_path / "r.json")]) == 1
    resumed = json.loads((tmp_path / "r.json").read_text())
    assert resumed["one_minimal"] and resumed["kept_nodes"] == list(full.kept_nodes)
    # Finished invocations are not repeated: only the interim result's verification is extra.
    assert resumed["invocations"]["target"] <= full.invocations["target"] + VERIFY_RUNS


def _as_per_tensor_layout(store_dir: Path) -> None:
    """Rewrite a store as graphbisect wrote it before the packed layout: <index>.npy files, manifest version 1."""
    store = ActivationStore.open(store_dir)
    entries = []
    for index, name in enumerate(store.names()):
        def write(file: str, raw: np.ndarray) -> dict[str, str]:
            np.save(store_dir / file, raw)
            return {"file": file}
        entries.append({"name": name, **write_value(store.get(name), str(index), write)})
    (store_dir / "values.bin").unlink()
    (store_dir / "manifest.json").write_text(json.dumps({"version": 1, "tensors": entries}))


def test_resume_of_a_work_folder_with_the_per_tensor_store_reads_it(tmp_path: Path) -> None:
    """A work folder from before the packed store (one .npy per tensor) resumes on its store: not captured again."""
    host = host_network(120, bug="layernorm_keepdims0", position="branch", seed=6)
    partial = _reduce(host, tmp_path / "bug", max_invocations=8)
    assert partial.stop_reason is not None
    store_dir = work_dir_for(tmp_path / "bug") / "activations"
    _as_per_tensor_layout(store_dir)
    assert main(["reduce", "--resume", str(tmp_path / "bug"), "--keep-work", "--json", str(tmp_path / "r.json")]) == 1
    resumed = json.loads((tmp_path / "r.json").read_text())
    assert resumed["one_minimal"] and set(host.core_nodes) <= set(resumed["kept_nodes"])
    # read, not captured again (a capture would have written the packed layout over it)
    assert not (store_dir / "values.bin").exists()
    assert json.loads((store_dir / "manifest.json").read_text())["version"] == 1


def test_resume_captures_a_torn_store_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A store whose data file was cut short is never read on resume: the oracle captures it again."""
    host = host_network(120, bug="layernorm_keepdims0", position="branch", seed=6)
    _reduce(host, tmp_path / "bug", max_invocations=8)
    store_dir = work_dir_for(tmp_path / "bug") / "activations"
    size = (store_dir / "values.bin").stat().st_size
    os.truncate(store_dir / "values.bin", size // 2)
    assert main(["reduce", "--resume", str(tmp_path / "bug"), "--keep-work", "--json", str(tmp_path / "r.json")]) == 1
    resumed = json.loads((tmp_path / "r.json").read_text())
    assert resumed["one_minimal"] and set(host.core_nodes) <= set(resumed["kept_nodes"])
    assert "values.bin is truncated" in caplog.text and "capturing it again" in caplog.text
    assert ActivationStore.open(store_dir).names() and (store_dir / "values.bin").stat().st_size == size


_FSYNC_SPY = """
import os
_fsync, _log = os.fsync, os.environ["GB_TEST_FSYNC_LOG"]

def fsync(fd):
    with open(_log, "a") as log:
        log.write(os.readlink(f"/proc/self/fd/{fd}") + "\\n")
    return _fsync(fd)

os.fsync = fsync
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names an fsynced descriptor through /proc")
def test_the_oracle_capture_that_resume_reads_reaches_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """The worker fsyncs the capture's data and index before it replies (a power failure could otherwise
    leave pages in the middle of the data unwritten, which the tail checksum does not see on resume); a
    candidate's outputs are not fsynced."""
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(_FSYNC_SPY)  # loaded by every worker process started below
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(spy), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("GB_TEST_FSYNC_LOG", str(tmp_path / "fsynced.txt"))
    host = host_network(120, bug="layernorm_keepdims0", position="branch", seed=6)
    partial = _reduce(host, tmp_path / "bug", max_invocations=4)
    assert partial.stop_reason is not None
    store_dir = (work_dir_for(tmp_path / "bug") / "activations").resolve()
    log = tmp_path / "fsynced.txt"
    fsynced = [Path(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert {path.name.split(".")[1] for path in fsynced if path.parent == store_dir} == {"values", "manifest"}
    assert all(path.parent == store_dir for path in fsynced), fsynced  # nothing else the workers wrote


_RUN_SPY = """
import importlib.abc, importlib.util, os, sys
_log = os.environ.get("GB_TEST_RUN_LOG")


def _patch(onnxruntime):
    _run = onnxruntime.InferenceSession.run

    def run(self, *args, **kwargs):
        if "--workdir" in sys.argv:  # a backend worker (started or forked): note where each run starts
            with open(_log, "a") as log:
                log.write(sys.argv[sys.argv.index("--workdir") + 1] + "\\n")
        return _run(self, *args, **kwargs)

    onnxruntime.InferenceSession.run = run


class _WhenImported(importlib.abc.MetaPathFinder):  # patch onnxruntime wherever it is imported, and only then
    def find_spec(self, name, path, target=None):
        if name != "onnxruntime":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _log:
    sys.meta_path.insert(0, _WhenImported())
"""


#: the work folders of a reduction's target and oracle workers (the report facts' are under ``facts``)
_TARGET_FOLDERS = ("baseline-saving", "evidence", "target", "target-describing", "verify-target")
_ORACLE_FOLDERS = ("oracle", "verify-oracle")


def test_kill_9_mid_run_then_resume_gives_the_same_result_and_counts_every_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resumed reduction's result, and its ``backend_calls`` counting the target runs of both sessions:
    the killed one's candidates included (they were lost: the search's calls were counted when it returned).
    The runs are counted independently by a spy in every worker; the candidate being tested when the kill
    came counts as one run whether or not it had reached ONNX Runtime."""
    host = host_network(160, bug="layernorm_keepdims0", position="main", seed=7)
    path = tmp_path / "m.onnx"
    onnx.save(host.model, path)
    np.savez(tmp_path / "in.npz", **host.inputs)
    expected = _reduce(host, tmp_path / "expected")
    spy, runs = tmp_path / "spy", tmp_path / "runs.txt"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(_RUN_SPY)  # loaded by every worker process started below
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(spy), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("GB_TEST_RUN_LOG", str(runs))
    out = tmp_path / "bug"
    journal = work_dir_for(out) / "journal.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "graphbisect", "reduce", str(path), "--inputs",
                             str(tmp_path / "in.npz"), "-o", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and len(journal.read_text().splitlines()) >= 12:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # what the killed session's candidates cost, as its journal holds it: the hint's run, then single removals
    # that their builds decided (a compile each, no run)
    costs = [json.loads(line)["detail"]["cost"] for line in journal.read_text().splitlines()[1:]
             if '"cost"' in line]
    assert main(["reduce", "--resume", str(out), "--json", str(tmp_path / "r.json")]) == 1
    resumed = json.loads((tmp_path / "r.json").read_text())
    assert resumed["kept_nodes"] == list(expected.kept_nodes) and resumed["one_minimal"]
    by_folder = Counter(Path(line).relative_to(work_dir_for(out)).parts[0] for line in runs.read_text().splitlines())
    # facts and the checker's audit: report_calls
    assert set(by_folder) <= {*_TARGET_FOLDERS, *_ORACLE_FOLDERS, "facts", "audit"}, by_folder
    # every run the spy saw in the checker's folder is counted (a model that fails to load is a run it never sees)
    assert 0 < by_folder["audit"] <= sum(c["runs"] for role, c in resumed["report_calls"].items()
                                         if role.startswith("audit "))
    target = sum(by_folder[folder] for folder in _TARGET_FOLDERS)
    assert {cost["runs"] for cost in costs} == {0, 1}  # the killed session had run candidates, and built others
    assert target <= resumed["backend_calls"]["target"]["runs"] <= target + 1
    assert resumed["backend_calls"]["oracle"]["runs"] == sum(by_folder[folder] for folder in _ORACLE_FOLDERS)


def test_parallel_jobs_give_the_same_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """... and run as many at once as the memory holds: each candidate worker may need what a target worker
    needed on the whole model (measured on the original's runs; here the machine is said to have 100 MiB
    free, less than two ONNX Runtime workers take)."""
    host = host_network(160, bug="layernorm_keepdims0", position="masked", seed=8)
    serial = _reduce(host, tmp_path / "j1")
    parallel = _reduce(host, tmp_path / "j2", jobs=2, keep_work=True)
    assert parallel.kept_nodes == serial.kept_nodes and parallel.one_minimal
    assert not any("GiB is available" in note for note in parallel.notes)
    monkeypatch.setattr(reduce_module, "available_memory", lambda: 100 * 2**20)  # the machine's, as if scarce
    scarce = _reduce(host, tmp_path / "j3", jobs=2, keep_work=True)
    assert scarce.kept_nodes == serial.kept_nodes and scarce.one_minimal
    assert any(note.startswith("-j 2 workers would need up to") and note.endswith("running 1")
               for note in scarce.notes), scarce.notes
    assert not (work_dir_for(tmp_path / "j3") / "target" / "worker-1").exists()  # one candidate worker ran
    assert (work_dir_for(tmp_path / "j2") / "target" / "worker-1").exists()


def test_external_check_command(tmp_path: Path) -> None:
    """Polygraphy-style --check: a script's exit code is the verdict (here: does ORT fail to build a session?)."""
    host = host_network(120, bug="relu_clip_f64", position="main", seed=9)
    path = tmp_path / "m.onnx"
    onnx.save(host.model, path)
    np.savez(tmp_path / "in.npz", **host.inputs)
    check = tmp_path / "check.py"
    check.write_text(
        "import sys, onnxruntime as ort\n"
        "try:\n    ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
        "except Exception:\n    sys.exit(3)\n")
    out = tmp_path / "bug"
    code = main(["reduce", str(path), "--inputs", str(tmp_path / "in.npz"), "-o", str(out), "--json",
                 str(tmp_path / "r.json"), "--check", f"{sys.executable} {check} {{model}} {{inputs}}",
                 "--fail-code", "3"])
    assert code == 1
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["signature"]["kind"] == "crash-run" and "code 3" in data["signature"]["detail"]
    assert set(host.core_nodes) <= set(data["kept_nodes"]) and data["one_minimal"]


def test_if_node_is_one_unit_and_outer_scope_inputs_are_fed(tmp_path: Path) -> None:
    """An If node whose branches read an outer tensor: removing the producer feeds that tensor as an input."""
    rng = np.random.default_rng(0)
    then_graph = helper.make_graph([helper.make_node("Mul", ["a", "a"], ["t"], name="then/Mul")], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, 4])])
    else_graph = helper.make_graph([helper.make_node("Neg", ["a"], ["e"], name="else/Neg")], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 4])])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="Relu"),
        helper.make_node("ReduceSum", ["x"], ["s"], name="ReduceSum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="Greater"),
        helper.make_node("If", ["cond"], ["branch"], name="If", then_branch=then_graph, else_branch=else_graph),
        helper.make_node("Relu", ["branch"], ["r2"], name="Relu2"),
        helper.make_node("Cast", ["r2"], ["d"], name="ToDouble", to=TensorProto.DOUBLE),
        helper.make_node("Relu", ["d"], ["dr"], name="ReluF64"),
        helper.make_node("Clip", ["dr", "lo", "hi"], ["dc"], name="ClipF64"),
        helper.make_node("Cast", ["dc"], ["y"], name="ToFloat", to=TensorProto.FLOAT),
    ]
    inits = [numpy_helper.from_array(np.float32(0.0), "zero"), numpy_helper.from_array(np.float64(0.0), "lo"),
             numpy_helper.from_array(np.float64(6.0), "hi")]
    graph = helper.make_graph(nodes, "if_host", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], inits)
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    feeds = {"x": rng.standard_normal((4, 4)).astype(np.float32)}
    result = reduce_model(model, tmp_path / "bug", inputs=feeds)
    assert set(result.kept_nodes) == {"ReluF64", "ClipF64"} and result.one_minimal
    # A candidate holding the If node alone is valid: its outer-scope input `a` becomes a graph input.
    a = np.maximum(feeds["x"], 0)
    cond = np.array(feeds["x"].sum() > 0)
    values = {"x": feeds["x"], "a": a, "cond": cond, "branch": a * a if cond else -a}
    space = SubgraphSpace(model, values.__getitem__, tmp_path / "space")
    candidate = space.materialize({model.node_index("If")})
    assert [i.name for i in candidate.proto.graph.input] == ["a"]
    assert "cond" in {t.name for t in candidate.proto.graph.initializer}  # a small bool cut tensor: a constant
    onnx.checker.check_model(candidate.proto, full_check=True)


@pytest.mark.openvino
def test_openvino_execution_graph_hints_the_mis_fused_mvn(tmp_path: Path) -> None:
    """The target describes its compiled graph to reduce too: OpenVINO's execution graph names the MVN it
    made of the bundled example's keepdims=0 LayerNorm, whose region is the first hint. Without the
    description (probe of every tensor, hints of single nodes) the same result took 25 target runs.
    The MVN is the failure's identity: the mean and its Sub stay (the 5 nodes Pow…Div also fail, by kind,
    but OpenVINO does not compile them as that MVN: another failure)."""
    pytest.importorskip("openvino")
    from graphbisect.examples.bundled import example_inputs_path, example_model_path

    feeds = dict(np.load(example_inputs_path()))
    result = reduce_model(load_model(example_model_path()), tmp_path / "bug", inputs=feeds,
                          options=ReduceOptions(target="openvino", keep_work=True))
    assert result.failed and result.verified
    assert result.kept_nodes == ("/blk10/norm/ReduceMean", "/blk10/norm/Sub", "/blk10/norm/Pow",
                                 "/blk10/norm/ReduceMean_1", "/blk10/norm/Add", "/blk10/norm/Sqrt", "/blk10/norm/Div")
    report = json.loads((tmp_path / "bug" / "report.json").read_text())
    identity = report["identity"]
    assert identity["compiled_kind"] == "MVN" and identity["matched_by"] == "identity"
    # OpenVINO's execution graph is read when the model is compiled, and a run reports that one: each single
    # removal is decided by its build (no MVN made of the region), 6 runs in all (13 before, 25 without hints);
    # a run of each, judged as the search judged runs, is rejected too
    assert result.one_minimal and report["search"]["built_only"] >= 7 and result.invocations["target"] <= 6
    model = load_model(example_model_path())
    work = work_dir_for(tmp_path / "bug")
    store = ActivationStore.open(work / "activations")
    space = SubgraphSpace(model, lambda n: feeds[n] if n in feeds else store.get(n), tmp_path / "check")
    pool = WorkerPool("openvino:report_exec=1", 1, tmp_path / "ran")
    every_run = CandidateTester(space, pool, result.signature, Tolerance(),
                                identity=IdentityCheck(Identity.from_json(identity), model.nodes))
    keep = frozenset(model.node_index(n) for n in result.kept_nodes)
    try:
        assert all(every_run(keep - {i}).outcome is not Outcome.FAIL for i in keep)
        assert every_run(keep).outcome is Outcome.FAIL and pool.cost.runs == 8
    finally:
        pool.close()
