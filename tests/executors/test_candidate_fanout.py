"""One reduction's candidate runs as executor tasks: the same result and the same runs as its own workers."""

from __future__ import annotations

import json
from pathlib import Path

from graphbisect.examples import host_network
from graphbisect.model import load_model
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
