"""The Ray executor on a real local cluster (a head and a worker node on loopback), and triage on it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphbisect.executors import WorkerLostError, make_executor
from graphbisect.workflows.triage import TriageResult, triage
from tests.executors.test_candidate_fanout import reduce_host
from tests.workflows.test_triage import dedup_view

ray = pytest.importorskip("ray")
# One Ray cluster at a time: `ray stop --force` stops every Ray process of the user, so every test that
# starts one is in this file (pytest-xdist's --dist loadfile gives a file's tests one worker).
pytestmark = pytest.mark.ray


def _ray_cli() -> str:
    found = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if found is None:
        pytest.skip("the ray command is not installed next to this Python")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``ray start --head`` plus one worker node, one CPU each, on 127.0.0.1; stopped afterwards."""
    cli, address = _ray_cli(), f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run([cli, "start", "--head", f"--port={address.split(':')[1]}", "--include-dashboard=false",
                        *common], check=True, env=env, capture_output=True, timeout=120)
        subprocess.run([cli, "start", f"--address={address}", *common], check=True, env=env,
                       capture_output=True, timeout=120)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        subprocess.run([cli, "stop", "--force"], check=False, env=env, capture_output=True, timeout=120)


def test_tasks_and_lost_worker_on_ray(cluster: str, tmp_path: Path) -> None:
    marker = str(tmp_path / "marker")

    def die_once(path: str) -> str:  # pickled by value: Ray workers need not import this test module
        import os as _os
        from pathlib import Path as _Path

        if not _Path(path).exists():
            _Path(path).touch()
            _os._exit(9)
        return "second attempt"

    def die_always() -> None:
        import os as _os

        _os._exit(9)

    if ray.is_initialized():
        ray.shutdown()
    handlers = [signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)]
    with make_executor(f"ray:{cluster}") as ex:
        # Joining Ray leaves the process's signals as they were: SIGTERM still ends it (Ray's own handler
        # raised SystemExit inside whatever ran, and pytest under `timeout` ran on)
        assert [signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)] == handlers
        assert ex.workers == 2 and ex.name == f"ray:{cluster}"
        assert ex.submit(die_once, marker).result(timeout=120) == "second attempt"
        with pytest.raises(WorkerLostError):
            ex.submit(die_always).result(timeout=120)


def test_candidates_fan_out_over_ray(cluster: str, tmp_path: Path) -> None:
    """One reduction whose candidate runs are Ray tasks on the two-node cluster: the same result and runs."""
    own = reduce_host(tmp_path / "own")
    fanned = reduce_host(tmp_path / "ray", executor=f"ray:{cluster}")
    assert fanned.one_minimal and fanned.kept_nodes == own.kept_nodes
    assert fanned.invocations == own.invocations


def test_triage_on_ray_matches_local(cluster: str, triage_input: Path, local_triage: TriageResult,
                                     tmp_path: Path) -> None:
    result = triage(triage_input, tmp_path / "out", executor=f"ray:{cluster}")
    assert result.executor == f"ray:{cluster}"
    assert dedup_view(result) == dedup_view(local_triage)
    assert len(result.bugs) == 2 and result.bugs[0].models == ("ln_branch", "ln_main")
