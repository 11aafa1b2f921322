"""Workers forked from a zygote (:mod:`graphbisect.backends.zygote`) are what a started worker is: a new
process in its own process group, in its own folder, with its own environment, that has imported nothing of its
backend before it was forked, and whose death by a signal is reported as that signal."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphbisect.backends import BackendProcess, RunStatus, zygote
from graphbisect.backends.process import compile_cache, prestart
from graphbisect.backends.registry import get, register_row, unregister_backend
from graphbisect.backends.zygote import ENV, FOLDER_PREFIX
from graphbisect.storage.tempfolders import alive, reclaim_abandoned

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")

# ONNX Runtime's runtime, saying where and how its worker runs; an input of -123 kills the worker by SIGSEGV.
PROBE = '''
import os, signal, sys
import numpy as np
from graphbisect.backends.onnxruntime import OnnxRuntime


class Probe(OnnxRuntime):
    def run(self, inputs):
        if float(next(iter(inputs.values())).flat[0]) == -123:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().run(inputs)

    def info(self):
        return {**super().info(), "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                "cwd": os.getcwd(), "cache": os.environ.get("GRAPHBISECT_COMPILE_CACHE"),
                "caller_cwd": os.environ.get("GRAPHBISECT_CALLER_CWD"), "wrapped": os.environ.get("GB_WRAPPED"),
                "test": os.environ.get("PYTEST_CURRENT_TEST"), "user_cache": os.environ.get("GRAPHBISECT_CACHE"),
                "pythonpath": os.environ.get("PYTHONPATH", ""), "draw": float(np.random.random())}
'''


def _probe_row(tmp_path: Path, source: str, row: str, name: str) -> Iterator[str]:
    """Backend ``name``: the registry's ``row`` run by the ``Probe`` class of ``source``, registered while used."""
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    register_row(dataclasses.replace(get(row), name=name, aliases=(), runtime=f"{script}:Probe"))
    try:
        yield name
    finally:
        unregister_backend(name)


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[str]:
    # ONNX Runtime's row (numpy needs no BLAS threads there), run by the probe class
    yield from _probe_row(tmp_path, PROBE, "ort", "probe")


# onnx.reference's runtime, saying where its worker runs, how many threads it has once a run is done and how many
# OpenBLAS computes with (its own count, read as threadpoolctl does; None where numpy has no OpenBLAS)
REFERENCE_PROBE = '''
import ctypes, os
from graphbisect.backends.reference import Reference


def blas_threads():
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "openblas" in path.rsplit("/", 1)[-1]:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            for name in ("openblas_get_num_threads", "openblas_get_num_threads64_",
                         "scipy_openblas_get_num_threads", "scipy_openblas_get_num_threads64_"):
                if hasattr(lib, name):
                    return getattr(lib, name)()
    return None


class Probe(Reference):
    def info(self):
        return {**super().info(), "pid": os.getpid(), "ppid": os.getppid(),
                "threads": len(os.listdir("/proc/self/task")), "blas_threads": blas_threads()}
'''


@pytest.fixture
def reference_probe(tmp_path: Path) -> Iterator[str]:
    # the reference row (numpy computes with its BLAS threads there), run by the probe class
    yield from _probe_row(tmp_path, REFERENCE_PROBE, "reference", "refprobe")


@pytest.fixture
def relu(tmp_path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph), path)
    return path


X = {"x": np.array([[-1.0, 0.0, 2.0, 3.0]], np.float32)}


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_workers_are_forked_fresh_each_in_its_own_group_folder_and_environment(
        probe: str, relu: Path, tmp_path: Path) -> None:
    infos = []
    for name in ("a", "b"):
        with compile_cache(tmp_path / f"cache-{name}"), \
                BackendProcess(probe, workdir=tmp_path / name) as proc:
            result = proc.run(relu, X)
            assert result.ok, result.describe()
            np.testing.assert_array_equal(result.outputs["y"], np.maximum(X["x"], 0))
            infos.append(result.info)
            zygote = result.info["ppid"]
            assert zygote != os.getpid()  # forked by a zygote, not started by this process
            assert "onnxruntime" not in _maps(zygote)  # which never loaded the backend library: the worker did
            assert "onnxruntime" in _maps(result.info["pid"])
    a, b = infos
    assert a["ppid"] == b["ppid"] and a["pid"] != b["pid"]  # one zygote, two workers
    for info, name in zip(infos, ("a", "b")):
        assert info["pgid"] == info["pid"]  # its own group: killing it stops only this worker and its children
        assert info["cwd"] == str(tmp_path / name)
        assert info["cache"] == str(tmp_path / f"cache-{name}")  # its own environment, not the zygote's
        assert info["caller_cwd"] == os.getcwd()


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_a_wrapper_interpreter_s_environment_reaches_the_worker(
        probe: str, relu: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    """``python=`` may name a script that sets variables and execs the interpreter (a venv or GPU library
    wrapper). A started worker runs through it; a forked one must have what it set too. Forked workers used to
    get the host's environment: a variable the wrapper set (read by its sitecustomize at run time) was missing."""
    site = tmp_path / "site"
    site.mkdir()
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nGB_WRAPPED=yes PYTHONPATH='{site}'${{PYTHONPATH:+:$PYTHONPATH}} "
                       f"exec '{sys.executable}' \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv(ENV, start)
    with BackendProcess(f"{probe}:python={wrapper}", workdir=tmp_path / "w") as proc:
        result = proc.run(relu, X)
    assert result.ok, result.describe()
    assert (result.info["ppid"] != os.getpid()) == (start == "fork")
    assert result.info["wrapped"] == "yes"
    entries = result.info["pythonpath"].split(os.pathsep)
    assert entries[0] == str(site) and entries[1] == str(tmp_path / "w" / "pythonpath")  # the worker's own link


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_graphbisect_s_own_variables_are_never_inherited_by_its_workers(
        probe: str, relu: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    """GRAPHBISECT_COMPILE_CACHE and GRAPHBISECT_CALLER_CWD are what the host sets for its workers. Inherited
    from the user's environment they used to win: a cache folder holding planted modules and compile errors
    was used by every worker (issue 36), and a command ran in another folder. Only ``off`` is read there."""
    monkeypatch.setenv(ENV, start)
    monkeypatch.setenv("GRAPHBISECT_COMPILE_CACHE", str(tmp_path / "planted"))
    monkeypatch.setenv("GRAPHBISECT_CALLER_CWD", str(tmp_path / "elsewhere"))
    with BackendProcess(probe, workdir=tmp_path / "none") as proc:  # no cache of this run's own: none
        info = proc.run(relu, X).info
    assert (info["cache"], info["caller_cwd"]) == (None, os.getcwd())
    with compile_cache(tmp_path / "own"), BackendProcess(probe, workdir=tmp_path / "own-w") as proc:
        assert proc.run(relu, X).info["cache"] == str(tmp_path / "own")  # the run's own, not the inherited one
    monkeypatch.setenv("GRAPHBISECT_COMPILE_CACHE", "off")  # the one value read from the environment
    with compile_cache(tmp_path / "own"), BackendProcess(probe, workdir=tmp_path / "off-w") as proc:
        assert proc.run(relu, X).info["cache"] is None
    assert not (tmp_path / "planted").exists()


def test_per_run_variables_reach_each_worker_from_one_zygote(
        probe: str, relu: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest sets PYTEST_CURRENT_TEST anew for each phase of each test. In a zygote's key, graphbisect called from
    a test suite (a CI harness's, or ours: ~900 zygotes, ~0.5 CPU-s each) started a zygote per test phase; so did
    each GRAPHBISECT_CACHE a test or a user set for one run. Each worker must still see its own values, as a
    started worker would, and one that does not set a variable must not see another's."""
    infos, names = [], ("first", "second", "third")
    for name in names:
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"tests/test_x.py::{name} (call)")
        if name == "third":
            monkeypatch.delenv("GRAPHBISECT_CACHE", raising=False)
        else:
            monkeypatch.setenv("GRAPHBISECT_CACHE", str(tmp_path / f"cache-{name}"))
        with BackendProcess(probe, workdir=tmp_path / name) as proc:
            infos.append(proc.run(relu, X).info)
    assert len({info["ppid"] for info in infos}) == 1 and infos[0]["ppid"] != os.getpid()  # forked by one zygote
    assert [info["test"] for info in infos] == [f"tests/test_x.py::{name} (call)" for name in names]
    assert [info["user_cache"] for info in infos] == [str(tmp_path / "cache-first"), str(tmp_path / "cache-second"),
                                                      None]


def test_forked_workers_do_not_share_numpy_s_random_draws(probe: str, relu: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's global generator is seeded when numpy.random is imported and is not reseeded at fork: where
    the zygote has imported it (here its sitecustomize does), forked workers drew the same numbers, where
    started ones each draw their own."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import numpy.random\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    draws = []
    for name in ("a", "b"):
        with BackendProcess(probe, workdir=tmp_path / name) as proc:
            info = proc.run(relu, X).info
            assert info["ppid"] != os.getpid()  # forked
            draws.append(info["draw"])
    assert draws[0] != draws[1]


def test_a_reference_worker_is_forked_with_the_blas_threads_and_outputs_of_a_started_one(
        reference_probe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's OpenBLAS starts its thread pool at import where numpy may compute with several threads (a
    reference worker): the zygote of such workers had a thread and never forked, and each worker started as a
    new interpreter (~0.8 s of CPU, most of it importing onnx's operators and ml_dtypes). Forked, a worker has
    the BLAS threads a started one has (OpenBLAS's pool, started again at its first threaded call) and computes
    the same bits."""
    rng = np.random.default_rng(0)
    weights = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [256, 256], rng.standard_normal(256 * 256))
               for i in range(4)]
    nodes = [helper.make_node("MatMul", [f"t{i}", f"w{i}"], [f"t{i + 1}"]) for i in range(4)]
    nodes.append(helper.make_node("Cast", ["t4"], ["b"], to=TensorProto.BFLOAT16))
    graph = helper.make_graph(nodes, "matmuls", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [256, 256])],
                              [helper.make_tensor_value_info("t4", TensorProto.FLOAT, [256, 256]),
                               helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [256, 256])], weights)
    model = tmp_path / "matmuls.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    feed = {"t0": rng.standard_normal((256, 256)).astype(np.float32)}
    runs = {}
    for start in ("fork", "exec"):
        monkeypatch.setenv(ENV, start)
        with BackendProcess(reference_probe, workdir=tmp_path / start) as proc:
            result = proc.run(model, feed)
            assert result.ok, result.describe()
            runs[start] = (result.info, {name: np.asarray(result.outputs[name]).tobytes() for name in ("t4", "b")})
            if start == "fork":
                assert result.info["ppid"] != os.getpid()  # forked, from a zygote ...
                assert "_ml_dtypes_ext" in _maps(result.info["ppid"])  # ... that imported onnx's operators
    (forked, forked_outputs), (started, started_outputs) = runs["fork"], runs["exec"]
    assert started["ppid"] == os.getpid()
    assert forked["blas_threads"] == started["blas_threads"]  # what OpenBLAS computes with
    assert forked["threads"] == started["threads"]  # OpenBLAS's pool included, after four threaded MatMuls
    assert forked_outputs == started_outputs


def test_a_forked_worker_killed_by_a_signal_is_a_crash_with_that_signal(probe: str, relu: Path,
                                                                        tmp_path: Path) -> None:
    with BackendProcess(probe, workdir=tmp_path / "w") as proc:
        first = proc.run(relu, X)
        assert first.info["ppid"] != os.getpid()
        crash = proc.run(relu, {"x": np.full((1, 4), -123, np.float32)})
        assert (crash.status, crash.exit_code, crash.error_type) == (RunStatus.CRASH, -signal.SIGSEGV, "SIGSEGV")
        again = proc.run(relu, X)  # a new worker, forked again
        assert again.ok and again.info["pid"] != first.info["pid"]


def test_worker_start_exec_starts_a_new_interpreter(probe: str, relu: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "exec")
    with BackendProcess(probe, workdir=tmp_path / "w") as proc:
        assert proc.run(relu, X).info["ppid"] == os.getpid()


def test_a_zygote_started_ahead_is_the_one_the_first_worker_is_forked_from(
        probe: str, relu: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command starts its workers' zygote before its own imports (``prestart``): the worker it starts later
    is forked from that zygote, not from a second one started then (which would cost the time saved)."""
    monkeypatch.setenv("GB_AHEAD", str(tmp_path))  # an environment no other zygote of this process has
    prestart(probe)
    deadline = time.monotonic() + 60
    while not (ahead := [z for key, z in zygote._zygotes.items() if ("GB_AHEAD", str(tmp_path)) in key[2]]):
        assert time.monotonic() < deadline, "the zygote started ahead never registered"
        time.sleep(0.05)
    assert ahead[0] is not None and ahead[0].ready
    with BackendProcess(probe, workdir=tmp_path / "w") as proc:
        result = proc.run(relu, X)
    assert result.ok, result.describe()
    assert result.info["ppid"] == ahead[0].proc.pid


def test_a_zygote_that_has_a_thread_never_forks(probe: str, relu: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread a library started at import would be missing in a forked child (with any lock it held):
    such an environment's workers are started as new interpreters."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    with BackendProcess(probe, workdir=tmp_path / "w") as proc:
        result = proc.run(relu, X)
        assert result.ok and result.info["ppid"] == os.getpid()


def test_a_worker_outlives_its_killed_zygote_and_is_stopped_and_replaced(
        probe: str, relu: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "temp"  # where this test's own zygote (a variable no other test sets) keeps its folder
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("GB_TEST_OWN_ZYGOTE", str(tmp_path))
    with BackendProcess(probe, workdir=tmp_path / "w") as proc:
        first = proc.run(relu, X)
        os.kill(first.info["ppid"], signal.SIGKILL)
        assert proc.run(relu, X).info["pid"] == first.info["pid"]  # the worker serves on
    deadline = time.monotonic() + 30  # SIGKILL lands when the kernel next runs it: late on a loaded machine
    while alive(first.info["ppid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(first.info["pid"])  # and was stopped, though no zygote could say how it ended
    (left,) = list(temp.glob(f"{FOLDER_PREFIX}*"))  # the killed zygote could not remove its folder ...
    assert reclaim_abandoned(temp) == [left]  # ... which names it as owner: the next workflow removes it
    with BackendProcess(probe, workdir=tmp_path / "w2") as proc:  # a new zygote
        second = proc.run(relu, X)
        assert second.ok and second.info["ppid"] not in (first.info["ppid"], os.getpid())


def test_the_zygote_and_its_workers_end_with_the_process_that_started_them(probe: str, relu: Path,
                                                                          tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import dataclasses, json, numpy as np
        from graphbisect.backends import BackendProcess
        from graphbisect.backends.registry import get, register_row
        register_row(dataclasses.replace(get("ort"), name="probe", aliases=(), runtime="{tmp_path}/probe.py:Probe"))
        proc = BackendProcess("probe", workdir="{tmp_path}/w")
        info = proc.run("{relu}", {{"x": np.ones((1, 4), np.float32)}}).info
        print(json.dumps([info["pid"], info["ppid"]]), flush=True)
    """)  # exits without closing anything
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    pids = [int(p) for p in done.stdout.strip().splitlines()[-1].strip("[]").split(",")]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


def test_two_threads_waiting_for_one_killed_worker_both_get_its_status(tmp_path: Path) -> None:
    """A signal unwinds the main thread, which kills a worker a background run is waiting on; that run finds the
    worker dead and kills it too. Both wait for its exit, which the zygote reports once: the second waited for
    ever (a compare hung for minutes after SIGTERM, in a full suite run). Popen's wait is thread-safe; so is a
    forked worker's."""
    import threading

    with BackendProcess("onnxruntime", workdir=tmp_path / "w") as process:
        process.validate()
        worker = process._state.worker
        assert worker is not None and isinstance(worker.proc, zygote.ForkedProcess), "not forked from a zygote"
        barrier, got = threading.Barrier(3), []

        def wait() -> None:
            barrier.wait()
            got.append(worker.proc.wait(timeout=20))

        threads = [threading.Thread(target=wait) for _ in range(2)]
        for thread in threads:
            thread.start()
        barrier.wait()
        time.sleep(0.2)  # both are waiting for the report now
        os.killpg(worker.pid, signal.SIGKILL)
        for thread in threads:
            thread.join(timeout=30)
        assert got == [-signal.SIGKILL, -signal.SIGKILL], got
