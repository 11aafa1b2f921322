"""One reduction's candidate runs as executor tasks: the same result and the same runs as its own workers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphbisect.backends.cost import Cost
from graphbisect.examples import host_network
from graphbisect.executors.candidates import ExecutorPool
from graphbisect.model import load_model
from graphbisect.oracle.identity import Identity, IdentityCheck
from graphbisect.oracle.tester import BUILT_ONLY, BUILT_OTHERWISE
from graphbisect.workflows.reduce import CRASH_BASELINE_RUNS, ReduceOptions, ReduceResult, reduce_model


def reduce_host(out: Path, **options: object) -> ReduceResult:
    host = host_network(160, bug="layernorm_keepdims0", position="branch", seed=11)
    return reduce_model(load_model(host.model), out, inputs=host.inputs,
                        options=ReduceOptions(jobs=2, **options))  # type: ignore[arg-type]


def assert_same_candidates(fanned: ReduceResult, own: ReduceResult, fanned_bundle: Path, own_bundle: Path) -> None:
    """The same search, runs and builds: a candidate the reduction's own workers decided by its build alone (the
    region compiled otherwise) is decided so by an executor's task too, which runs the others on that build."""
    searches = [json.loads((bundle / "report.json").read_text())["search"] for bundle in (fanned_bundle, own_bundle)]
    assert searches[0] == searches[1] and searches[0]["built_only"] > 0
    assert fanned.invocations == own.invocations
    assert fanned.backend_calls["target"] == own.backend_calls["target"]


def test_local_executor_gives_the_same_reduction(tmp_path: Path) -> None:
    own = reduce_host(tmp_path / "own")
    fanned = reduce_host(tmp_path / "local", executor="local")
    assert fanned.one_minimal and fanned.kept_nodes == own.kept_nodes
    assert_same_candidates(fanned, own, tmp_path / "local", tmp_path / "own")
    assert (tmp_path / "local" / "repro.py").exists()


def test_a_failure_at_compile_builds_its_candidates_alone_as_tasks_too(tmp_path: Path) -> None:
    """ONNX Runtime rejects a float64 Clip when it creates the session: the executor's tasks build candidates
    without running them, as the reduction's own workers do (issue 27), with the same result and counts."""
    host = host_network(150, bug="relu_clip_f64", position="main", seed=2)

    def reduce(out: Path, **options: object) -> ReduceResult:
        return reduce_model(load_model(host.model), out, inputs=host.inputs,
                            options=ReduceOptions(jobs=2, **options))  # type: ignore[arg-type]

    own, fanned = reduce(tmp_path / "own"), reduce(tmp_path / "local", executor="local")
    assert fanned.one_minimal and fanned.kept_nodes == own.kept_nodes
    assert fanned.invocations == own.invocations == {"oracle": own.invocations["oracle"],
                                                     "target": CRASH_BASELINE_RUNS}
    assert fanned.backend_calls == own.backend_calls
    assert own.backend_calls["target"]["compiles"] > 2 * CRASH_BASELINE_RUNS


def test_a_task_whose_build_crashes_comes_back_as_that_build(tmp_path: Path) -> None:
    """A candidate's task builds first where its build may decide it: one whose build fails comes back as that
    build (the crash at load a run would report), counted as a compile and no run, as on the reduction's own
    workers; the candidate is then judged as that crash."""
    model = helper.make_model(helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], name="bad")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "candidate.onnx"
    onnx.save(model, path)
    identity = IdentityCheck(Identity("bad", "y", 3, ("bad",), "LayerNormalization", "n/LayerNormFusion/",
                                      "LayerNormFusion", "optimized model"), after=())
    pool = ExecutorPool.open("local", "onnxruntime:opt_level=all,save_optimized=1", tmp_path / "scratch", jobs=1)
    try:
        with pool.acquire() as runner:
            built = runner.run_built_first(path, {"x": np.zeros(2, np.float32)}, ["y"], identity)
        assert not built.ok and built.phase == "load" and "NoSuchOp" in built.message
        assert built.info[BUILT_ONLY] and BUILT_OTHERWISE not in built.info
        assert pool.invocations == 0 and pool.cost == Cost(0, 1)
    finally:
        pool.close()
