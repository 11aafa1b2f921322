"""The Ray executor on a real local cluster (a head and a worker node on loopback), and triage on it.

The cluster is the test's own: its own temp dir, ports, HOME and authentication token, so nothing a user's
or another job's Ray left (``~/.ray/auth_token``, ``RAY_*`` variables) reaches it, and its teardown stops the
processes it started and no others (``ray stop`` stops every Ray process of the user on the machine).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from graphbisect.executors import WorkerLostError, make_executor
from graphbisect.workflows.triage import TriageResult, triage
from tests.executors.test_candidate_fanout import assert_same_candidates, reduce_host
from tests.workflows.test_triage import dedup_view

ray = pytest.importorskip("ray")
if TYPE_CHECKING:
    import psutil
else:  # Ray's own copy (ray/thirdparty_files) once ray is imported, if not installed
    psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.ray

#: Carried by every process the cluster starts (they inherit it): with the ``ray start`` sessions, how
#: teardown tells the cluster's processes from everyone else's.
_MARKER = "GRAPHBISECT_TEST_RAY_CLUSTER"
_START_S, _GRACE_S = 120.0, 15.0


def _ray_cli() -> str:
    found = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if found is None:
        pytest.skip("the ray command is not installed next to this Python")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnCluster:
    """A head and a worker node, one CPU each, on 127.0.0.1, started by this test and stopped by it.

    Each node is a ``ray start --block`` in a session of its own. ``env`` is the environment its processes
    (and a driver of it) run in: ``base_env`` without its ``RAY_*`` variables, HOME a fresh folder (no
    ``~/.ray`` of anyone's), token authentication with a token of its own (Ray would otherwise turn it on
    for the head alone when it finds ``~/.ray/auth_token``, and the worker node could not join).
    """

    def __init__(self, base_env: Mapping[str, str]) -> None:
        self.cli = _ray_cli()
        # Short: Ray's Unix sockets live under it (a socket path is at most 107 characters)
        self.root = Path(tempfile.mkdtemp(prefix="gb-ray-"))
        self.token = self.root / "auth_token"
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)
        (self.root / "home").mkdir()
        self.env = {k: v for k, v in base_env.items() if not k.startswith("RAY_")}
        if site.ENABLE_USER_SITE:  # HOME moves; the user's site-packages stay where they were
            self.env.setdefault("PYTHONUSERBASE", site.getuserbase())
        self.env.update({"HOME": str(self.root / "home"), _MARKER: secrets.token_hex(8),
                         "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                         "RAY_AUTH_TOKEN_PATH": str(self.token)})
        self.address = f"127.0.0.1:{_free_port()}"
        self.leaders: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        head = ["--head", f"--port={self.address.split(':')[1]}", "--include-dashboard=false",
                f"--dashboard-port={_free_port()}"]
        if importlib.util.find_spec("grpc") is not None:  # Ray Client's server (port 10001 unless told)
            head.append(f"--ray-client-server-port={_free_port()}")  # Ray refuses the flag without grpc
        self._node("head", head)
        self._node("worker", [f"--address={self.address}"])

    def _node(self, name: str, args: list[str]) -> None:
        log = self.root / f"{name}.log"
        ports = {flag: _free_port() for flag in ("node-manager", "object-manager", "metrics-export",
                                                   "dashboard-agent-listen", "dashboard-agent-grpc",
                                                   "runtime-env-agent")}
        command = [self.cli, "start", "--block", *args, "--node-ip-address=127.0.0.1", "--num-cpus=1",
                   "--disable-usage-stats", f"--temp-dir={self.root / 'ray'}",
                   *(f"--{flag}-port={port}" for flag, port in ports.items())]
        with log.open("wb") as out:
            leader = subprocess.Popen(command, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self.leaders.append(leader)
        deadline = time.monotonic() + _START_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if _exited(leader.pid) or time.monotonic() > deadline:  # not reaped: see processes()
                how = "exited" if _exited(leader.pid) else "did not start in time"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
                raise RuntimeError(f"`ray start` of the {name} node {how}; its output ended:\n{tail}")
            time.sleep(0.2)

    def processes(self) -> list[psutil.Process]:
        """This cluster's processes but the ``ray start`` ones: those in a node's session (the ``ray start``
        is its leader; a leader not yet reaped, running or not, keeps its id theirs alone), and any carrying
        this cluster's marker (Ray's agents and workers retitle themselves, which hides their environment)."""
        sessions = {leader.pid for leader in self.leaders if leader.returncode is None}
        own, uid = [], os.getuid()
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if proc.pid in sessions or proc.uids().real != uid:
                    continue
                if os.getsid(proc.pid) in sessions or proc.environ().get(_MARKER) == self.env[_MARKER]:
                    own.append(proc)
        return own

    def stop(self) -> None:
        """Stop the processes this cluster started, and no others: SIGTERM to each node's ``ray start``
        (which stops its node), then SIGTERM and, after a grace period, SIGKILL to whatever of the cluster
        is left; the ``ray start`` processes are reaped last, so their session ids stay theirs till then."""
        for leader in self.leaders:
            if leader.returncode is None:
                leader.terminate()
        deadline = time.monotonic() + _GRACE_S
        for leader in self.leaders:
            while leader.returncode is None and not _exited(leader.pid):
                if time.monotonic() > deadline:
                    leader.kill()
                    break
                time.sleep(0.1)
        left = self.processes()
        for proc in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.terminate()
        _, alive = psutil.wait_procs(left, timeout=_GRACE_S)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)
        for leader in self.leaders:
            leader.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _exited(pid: int) -> bool:
    """Whether a child process has ended, without reaping it."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _reset_ray_auth() -> None:
    """Ray caches its authentication mode and token per process: have this one read them again."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]
    except ImportError:  # a Ray without token authentication
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def test_joining_a_ray_cluster_that_is_not_there_is_the_environments_error(tmp_path: Path) -> None:
    """`--executor ray:auto` (the README's) with no cluster running: exit 2 with the fix, not an internal error.
    ray:auto joins any Ray it finds on the machine (a gcs_server process), so this runs before this module's own
    cluster starts, and is skipped where another job's Ray runs."""
    from ray._private.services import find_gcs_addresses

    from tests.cli.test_papercuts import _relu_model

    if find_gcs_addresses():
        pytest.skip("a Ray cluster of another job runs on this machine: ray:auto would join it")
    (tmp_path / "models").mkdir()
    _relu_model(tmp_path / "models")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(tmp_path / "ray")}
    done = subprocess.run([sys.executable, "-m", "graphbisect", "triage", str(tmp_path / "models"), "-o",
                           str(tmp_path / "out"), "--executor", "ray:auto"], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    # It was "internal error: ConnectionError: Could not find any running Ray instance ... this is a graphbisect
    # bug: please report it" and exit 3.
    assert done.returncode == 2, done.stderr
    assert "error: no Ray cluster to join at auto: Could not find any running Ray instance" in done.stderr
    assert "hint: start one (ray start --head), or use --executor ray for a local instance" in done.stderr
    assert "graphbisect bug" not in done.stderr


def test_a_ray_address_where_nothing_listens_is_refused_at_once(tmp_path: Path) -> None:
    """`--executor ray:HOST:PORT` with a mistyped port: exit 2 naming the address and the fix. ray.init retried
    it for over two minutes, printing only its own connection warnings."""
    from tests.cli.test_papercuts import _relu_model

    (tmp_path / "models").mkdir()
    _relu_model(tmp_path / "models")
    address = f"127.0.0.1:{_free_port()}"  # bound, then closed: nothing listens there
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(tmp_path / "ray")}
    done = subprocess.run([sys.executable, "-m", "graphbisect", "triage", str(tmp_path / "models"), "-o",
                           str(tmp_path / "out"), "--executor", f"ray:{address}"], env=env, capture_output=True,
                          text=True, timeout=90, check=False)
    assert done.returncode == 2, done.stderr
    assert f"error: no Ray cluster to join at {address}: no connection to {address} (Connection refused)" \
        in done.stderr
    assert "--executor ray for a local instance" in done.stderr and "graphbisect bug" not in done.stderr


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """This module's :class:`OwnCluster`, this process its driver (with its token); stopped afterwards."""
    own, env = OwnCluster(os.environ), pytest.MonkeyPatch()
    try:
        own.start()
        env.setenv("RAY_AUTH_MODE", "token")
        env.setenv("RAY_AUTH_TOKEN_PATH", str(own.token))
        env.delenv("RAY_AUTH_TOKEN", raising=False)
        _reset_ray_auth()
        yield own.address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        env.undo()
        _reset_ray_auth()
        own.stop()


def test_the_cluster_is_the_tests_own(tmp_path: Path) -> None:
    """Issue 36: another job's ``~/.ray/auth_token`` in HOME turned token authentication on for the head
    alone, so the worker node could not join (``ray start --address`` exited 1), and teardown's
    ``ray stop --force`` stopped every Ray process of the user. The cluster starts beside such a token, a
    driver of it sees both nodes, and stopping it ends its own processes and leaves a Ray-looking one
    (``ray stop`` stops any ``default_worker.py``) it did not start running."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    foreign = tmp_path / "default_worker.py"
    foreign.write_text("import time\ntime.sleep(600)\n")
    bystander = subprocess.Popen([sys.executable, str(foreign)])
    try:
        own = OwnCluster({**os.environ, "HOME": str(home)})
        try:
            own.start()
            script = f"import ray; ray.init(address={own.address!r}); print(int(ray.cluster_resources()['CPU']))"
            driver = subprocess.run([sys.executable, "-c", script], check=False, env=own.env, capture_output=True,
                                    text=True, timeout=_START_S)
            assert driver.stdout.split()[-1:] == ["2"], driver.stderr[-4000:]
            started = own.processes()
            assert {proc.name() for proc in started} >= {"raylet", "gcs_server"}
        finally:
            own.stop()
        assert not [proc for proc in [*started, *own.leaders] if
                    (proc.is_running() if isinstance(proc, psutil.Process) else proc.poll() is None)]
        assert bystander.poll() is None, "stopping the cluster stopped a process it did not start"
        assert sorted(p.name for p in (home / ".ray").iterdir()) == ["auth_token"]
    finally:
        bystander.kill()
        bystander.wait()


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
    assert_same_candidates(fanned, own, tmp_path / "ray", tmp_path / "own")


def test_triage_on_ray_matches_local(cluster: str, triage_input: Path, local_triage: TriageResult,
                                     tmp_path: Path) -> None:
    result = triage(triage_input, tmp_path / "out", executor=f"ray:{cluster}")
    assert result.executor == f"ray:{cluster}"
    assert dedup_view(result) == dedup_view(local_triage)
    assert len(result.bugs) == 2 and result.bugs[0].models == ("ln_branch", "ln_main")
