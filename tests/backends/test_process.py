"""Worker isolation: reuse, crashes, signals, timeouts, logs, output files and foreign interpreters."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphbisect
from graphbisect.backends import BackendProcess, Phase, RunStatus
from graphbisect.backends.worker import save_npz
from graphbisect.data import ActivationStore
from graphbisect.data.store import StoredFeeds
from graphbisect.errors import BackendError, BackendUnavailableError, InputError, ModelError, SpecError


def test_one_worker_serves_many_invocations(ort: BackendProcess, models: dict[str, Path], x23: np.ndarray) -> None:
    first = ort.run(models["relu_add"], {"x": x23})
    pid = ort.pid
    second = ort.run(models["relu_add"], {"x": -x23})
    assert first.ok and second.ok
    assert ort.pid == pid
    assert ort.invocations >= 2
    np.testing.assert_array_equal(first.outputs["y"], np.maximum(x23, 0) + 1)
    np.testing.assert_array_equal(second.outputs["y"], np.maximum(-x23, 0) + 1)


def test_outputs_are_one_packed_file_with_a_manifest(ort: BackendProcess, models: dict[str, Path],
                                                     x23: np.ndarray, tmp_path: Path, odd_name: str) -> None:
    out = tmp_path / "store"
    result = ort.run(models["relu_add_probe"], {"x": x23}, [odd_name, "y"], output_dir=out)
    assert result.ok, result.describe()
    assert list(result.outputs) == [odd_name, "y"]
    assert not result.outputs[odd_name].flags.writeable  # read from the file (small: read, large: mapped)
    np.testing.assert_array_equal(result.outputs[odd_name], np.maximum(x23, 0))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["version"] == 2 and [t["name"] for t in manifest["tensors"]] == [odd_name, "y"]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "values.bin"]
    assert not (tmp_path / "block").exists()  # the '../block/relu:0' name never became a path


def test_rewriting_an_output_dir_never_changes_earlier_results_silently(
        ort: BackendProcess, models: dict[str, Path], x23: np.ndarray, tmp_path: Path) -> None:
    """Kept outputs are read lazily (one map per run, not a descriptor per tensor); a run whose data a later
    run replaced before it was first read is refused, not misread; one already read keeps its own values."""
    first = ort.run(models["relu_add"], {"x": x23}, output_dir=tmp_path)
    held = first.outputs["y"]  # read before the next run: its data file is mapped (its inode lives on)
    unread = ort.run(models["relu_add"], {"x": 2 * x23}, output_dir=tmp_path / "b")
    ort.run(models["relu_add"], {"x": 3 * x23}, output_dir=tmp_path / "b")
    second = ort.run(models["relu_add"], {"x": -x23}, output_dir=tmp_path)
    np.testing.assert_array_equal(held, np.maximum(x23, 0) + 1)
    np.testing.assert_array_equal(first.outputs["y"], np.maximum(x23, 0) + 1)
    np.testing.assert_array_equal(second.outputs["y"], np.maximum(-x23, 0) + 1)
    with pytest.raises(BackendError, match="overwritten by a later run"):
        unread.outputs["y"]


def test_probe_outputs_do_not_hold_a_file_descriptor_each(ort: BackendProcess, tmp_path: Path) -> None:
    """A probe run returns one tensor per node; 3,000 of them must fit under a 1,024-descriptor limit."""
    import resource

    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"t{i - 1}"], [f"t{i}"], name=f"r{i}") for i in range(3000)]
    outs = [helper.make_tensor_value_info(f"t{i}", TensorProto.FLOAT, [2, 3]) for i in range(3000)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], outs)
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        result = ort.run(path, {"x": np.ones((2, 3), np.float32)}, output_dir=tmp_path / "out")
        assert len(result.outputs) == 3000 and float(result.outputs["t2999"][0, 0]) == 1.0
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_thousands_of_feeds_travel_in_one_data_file_rewritten_in_place(ort: BackendProcess, tmp_path: Path) -> None:
    """A candidate of a large model is fed thousands of cut tensors: they reach the worker through one data
    file, rewritten by each run (no file per feed, no new file per run), and each run gets its own values."""
    count = 3000
    names = [f"cut/{i}:0" for i in range(count)]  # tensor names are never paths
    graph = helper.make_graph([helper.make_node("Concat", names, ["y"], axis=0)], "many",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in names],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [count])])
    path = tmp_path / "many.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    feeds = {name: np.array([i], np.float32) for i, name in enumerate(names)}
    first = ort.run(path, feeds)
    [data] = ort.workdir.glob("inputs-*/values.bin")
    inode = data.stat().st_ino
    second = ort.run(path, {name: -value for name, value in feeds.items()})
    assert first.ok and second.ok
    np.testing.assert_array_equal(first.outputs["y"], np.arange(count, dtype=np.float32))
    np.testing.assert_array_equal(second.outputs["y"], -np.arange(count, dtype=np.float32))
    assert data.stat().st_ino == inode and [p.name for p in data.parent.iterdir()] == ["values.bin"]
    assert not list(ort.workdir.glob("*.npz"))


def test_values_sent_with_a_model_that_fails_to_load_are_held_for_the_next_run(
        ort: BackendProcess, models: dict[str, Path], x23: np.ndarray, tmp_path: Path) -> None:
    """An unchanged read-only input is sent once: the worker holds it even when the run it came with ended
    at load (a crash result), so the next run that refers to it gets it."""
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    x = x23.copy()
    x.setflags(write=False)
    crashed = ort.run(broken, {"x": x})
    assert crashed.status is RunStatus.CRASH and crashed.phase is Phase.LOAD
    result = ort.run(models["relu_add"], {"x": x})
    assert result.ok, result.describe()
    np.testing.assert_array_equal(result.outputs["y"], np.maximum(x23, 0) + 1)


def test_an_input_that_cannot_be_passed_is_a_user_error_and_the_next_run_gets_its_values(
        ort: BackendProcess, models: dict[str, Path], x23: np.ndarray) -> None:
    x = x23.copy()
    x.setflags(write=False)  # held by the worker once sent
    with pytest.raises(InputError, match="'bad'"):
        ort.run(models["relu_add"], {"x": x, "bad": np.zeros(2, dtype="V4")})
    result = ort.run(models["relu_add"], {"x": x})
    assert result.ok, result.describe()
    np.testing.assert_array_equal(result.outputs["y"], np.maximum(x23, 0) + 1)


def test_inputs_may_be_an_npz_file(ort: BackendProcess, models: dict[str, Path], x23: np.ndarray,
                                   tmp_path: Path) -> None:
    path = save_npz(tmp_path / "in.npz", {"x": x23})
    result = ort.run(models["relu_add"], path)
    np.testing.assert_array_equal(result.outputs["y"], np.maximum(x23, 0) + 1)


def test_missing_files_are_user_errors(ort: BackendProcess, models: dict[str, Path], x23: np.ndarray,
                                       tmp_path: Path) -> None:
    with pytest.raises(ModelError):
        ort.run(tmp_path / "nope.onnx", {"x": x23})
    with pytest.raises(InputError):
        ort.run(models["relu_add"], tmp_path / "nope.npz")


def test_worker_killed_between_calls_is_replaced(models: dict[str, Path], x23: np.ndarray, tmp_path: Path) -> None:
    with BackendProcess("onnxruntime", workdir=tmp_path) as process:
        assert process.run(models["relu_add"], {"x": x23}).ok
        old = process.pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        result = process.run(models["relu_add"], {"x": x23})
        assert result.ok, result.describe()
        assert process.pid not in (None, old)


def test_worker_death_mid_run_is_a_crash_with_the_signal(command_spec: str, mode_file: Callable[[str], Path],
                                                         x23: np.ndarray, tmp_path: Path) -> None:
    with BackendProcess(command_spec, workdir=tmp_path) as process:
        started = time.monotonic()
        crash = process.run(mode_file("kill-worker"), {"x": x23})
        assert time.monotonic() - started < 15  # not held up by the orphaned child still sleeping
        assert (crash.status, crash.phase, crash.exit_code) == (RunStatus.CRASH, Phase.RUN, -signal.SIGSEGV)
        assert crash.error_type == "SIGSEGV"
        assert "SIGSEGV" in (crash.message or "")
        assert "stdout says kill-worker" in crash.log
        # the next call transparently gets a fresh worker
        after = process.run(mode_file("double"), {"x": x23})
        np.testing.assert_array_equal(after.outputs["y"], x23 * 2)


def test_hang_becomes_a_timeout_and_the_group_is_killed(command_spec: str, mode_file: Callable[[str], Path],
                                                        x23: np.ndarray, tmp_path: Path) -> None:
    with BackendProcess(command_spec + ",timeout=1", workdir=tmp_path) as process:
        assert process.timeout == 1.0
        process.validate()
        pid = process.pid
        assert pid is not None
        started = time.monotonic()
        result = process.run(mode_file("sleep"), {"x": x23})
        assert time.monotonic() - started < 10
        assert (result.status, result.phase) == (RunStatus.TIMEOUT, Phase.RUN)
        assert "1 s" in (result.message or "")
        assert _group_gone(pid)  # the sleeping child died with its worker
        assert process.run(mode_file("double"), {"x": x23}).ok


def _group_gone(pgid: int, seconds: float = 5.0) -> bool:
    """Whether process group ``pgid`` disappears (killed members linger until their parent reaps them)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_each_result_carries_its_own_log_slice(command_spec: str, mode_file: Callable[[str], Path],
                                               x23: np.ndarray, tmp_path: Path) -> None:
    with BackendProcess(command_spec, workdir=tmp_path) as process:
        first = process.run(mode_file("alpha"), {"x": x23})
        second = process.run(mode_file("beta"), {"x": x23})
    assert "stdout says alpha" in first.log and "stderr says alpha" in first.log
    assert "beta" in second.log and "alpha" not in second.log


def test_constructor_timeout_applies_without_spec_option(command_spec: str) -> None:
    with BackendProcess(command_spec, timeout=7) as process:
        assert process.timeout == 7.0
        workdir = process.workdir
        assert workdir.is_dir()
    assert not workdir.exists()  # the temporary workdir is removed on close


def test_closed_process_refuses_work(command_spec: str, mode_file: Callable[[str], Path], x23: np.ndarray) -> None:
    process = BackendProcess(command_spec)
    process.run(mode_file("double"), {"x": x23})
    pid = process.pid
    process.close()
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(BackendError, match="closed"):
        process.run(mode_file("double"), {"x": x23})


# A runtime that says, when it is freed, that it was: a worker's exit must leave that to the operating system.
_FREED_RUNTIME = '''
import pathlib

import onnxruntime as ort


class FreedRuntime:
    capabilities = ("onnx-input",)
    options = {}

    def __init__(self, options, workdir):
        self.marker = pathlib.Path(workdir) / "runtime-freed"
        self.session = None

    def load(self, model, outputs):
        self.session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    def run(self, inputs):
        return dict(zip([o.name for o in self.session.get_outputs()], self.session.run(None, dict(inputs))))

    def info(self):
        return {}

    def __del__(self):
        self.marker.write_text("freed")
'''


def test_a_worker_ends_without_freeing_its_runtime(models: dict[str, Path], x23: np.ndarray, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Freeing a runtime piece by piece is work the operating system does at once when the process ends: a
    # 5,000-node ONNX Runtime session took ~0.06 s to free, between the reply to "exit" and the exit that
    # closing the worker waits for (every compare, every reduce candidate's worker).
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "freed_runtime.py").write_text(_FREED_RUNTIME)
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    graphbisect.register_backend(importlib.import_module("freed_runtime").FreedRuntime, name="freed")
    try:
        with BackendProcess("freed", workdir=tmp_path / "work") as process:
            assert process.run(models["relu_add"], {"x": x23}).ok
            pid = process.pid
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # it has ended
        assert not list((tmp_path / "work").rglob("runtime-freed"))
    finally:
        graphbisect.unregister_backend("freed")


def test_host_options_do_not_reach_the_runtime(models: dict[str, Path], x23: np.ndarray) -> None:
    # OnnxRuntime rejects unknown options, so this fails unless python= and timeout= are stripped.
    with BackendProcess(f"onnxruntime:python={sys.executable},timeout=60") as process:
        assert process.run(models["relu_add"], {"x": x23}).ok
        assert process.worker_info["python"] == sys.executable


def test_missing_interpreter_is_a_spec_error(tmp_path: Path) -> None:
    with BackendProcess(f"onnxruntime:python={tmp_path}/no-python") as process, \
            pytest.raises(SpecError, match="python="):
        process.validate()


def _foreign_python(tmp_path: Path, packages: list[str]) -> Path:
    """A fresh venv that sees only ``packages`` of this environment (and not graphbisect)."""
    import venv

    venv.create(tmp_path / "venv", with_pip=False)
    shared = tmp_path / "shared"
    shared.mkdir()
    site = Path(np.__file__).parents[1]
    for name in packages:
        for entry in site.glob(f"{name}*"):
            if entry.name in (name, f"{name}.libs"):
                (shared / entry.name).symlink_to(entry)
    (site_packages,) = (tmp_path / "venv" / "lib").glob("python*/site-packages")
    (site_packages / "shared.pth").write_text(str(shared) + "\n")
    return tmp_path / "venv" / "bin" / "python"


def test_foreign_interpreter_imports_graphbisect_from_the_workdir(models: dict[str, Path], x23: np.ndarray,
                                                                  tmp_path: Path) -> None:
    python = _foreign_python(tmp_path, ["numpy", "onnxruntime"])
    with BackendProcess(f"onnxruntime:python={python}", workdir=tmp_path / "work") as process:
        result = process.run(models["relu_add"], {"x": x23})
        assert result.ok, result.describe()
        assert process.worker_info["python"] == str(python)
        # this graphbisect, through a link (the foreign venv has none): the workdir's, or a zygote's
        package = Path(process.worker_info["package"])
        assert package.resolve() == Path(graphbisect.__file__).resolve().parent
        assert package.parent.name == "pythonpath" and not package.is_relative_to(tmp_path / "venv")


def test_foreign_interpreter_without_the_library_is_unavailable(models: dict[str, Path], x23: np.ndarray,
                                                                tmp_path: Path) -> None:
    python = _foreign_python(tmp_path, ["numpy"])
    with BackendProcess(f"onnxruntime:python={python}") as process, \
            pytest.raises(BackendUnavailableError, match="onnxruntime"):
        process.run(models["relu_add"], {"x": x23})


def test_a_model_rewritten_in_place_is_reloaded(ort: BackendProcess, models: dict[str, Path], x23: np.ndarray,
                                                tmp_path: Path) -> None:
    """The worker reuses a loaded session only for the very same file content."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(models["relu_add"])
    path = tmp_path / "model.onnx"
    results = []
    for bias in (1.0, 2.0):  # same size, same inode, possibly the same mtime
        proto.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full((2, 3), bias, np.float32), "one"))
        with open(path, "wb") as fh:
            fh.write(proto.SerializeToString())
        results.append(ort.run(path, {"x": x23}).outputs["y"])
    np.testing.assert_array_equal(results[1] - results[0], np.ones((2, 3), np.float32))


def test_a_session_built_ahead_serves_the_run_of_the_same_model_and_outputs(
        models: dict[str, Path], x23: np.ndarray, odd_name: str, tmp_path: Path) -> None:
    """load() builds without running (no invocation); the run of the same file and outputs then uses that
    session: ORT writes its optimized model only when it builds one, so the file must not come back."""
    with BackendProcess("ort:opt_level=all,save_optimized=1", workdir=tmp_path / "w") as proc:
        assert proc.load(models["relu_add_probe"], ["y", odd_name])
        assert proc.invocations == 0
        saved = tmp_path / "w" / "optimized.onnx"
        assert saved.is_file()
        saved.unlink()
        result = proc.run(models["relu_add_probe"], {"x": x23}, ["y", odd_name])
        assert result.ok and proc.invocations == 1
        assert not saved.exists()  # not built again
        np.testing.assert_array_equal(result.outputs[odd_name], np.maximum(x23, 0))
        proc.run(models["relu_add_probe"], {"x": x23}, ["y"])  # other outputs: another session
        assert saved.is_file()


def test_a_failed_build_ahead_is_no_result_and_the_run_reports_it(ort: BackendProcess, models: dict[str, Path],
                                                                 x23: np.ndarray, tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    before = ort.invocations
    assert ort.load(broken) is False
    assert ort.invocations == before
    crashed = ort.run(broken, {"x": x23})
    assert crashed.status is RunStatus.CRASH and crashed.phase is Phase.LOAD
    assert ort.run(models["relu_add"], {"x": x23}).ok


def test_user_errors_are_not_counted_as_invocations(ort: BackendProcess, x23: np.ndarray, tmp_path: Path) -> None:
    before = ort.invocations
    with pytest.raises(ModelError):
        ort.run(tmp_path / "missing.onnx", {"x": x23})
    assert ort.invocations == before


def test_interpreter_without_numpy_fails_with_its_log(models: dict[str, Path], x23: np.ndarray,
                                                      tmp_path: Path) -> None:
    python = _foreign_python(tmp_path, [])
    with BackendProcess(f"onnxruntime:python={python}") as process, \
            pytest.raises(BackendError, match="No module named 'numpy'") as err:
        process.run(models["relu_add"], {"x": x23})
    assert "numpy" in (err.value.hint or "")


def test_results_say_what_ran_them_also_when_the_backend_crashed(models: dict[str, Path], x23: np.ndarray) -> None:
    """Measured in the worker (RunResult.ran_with): a crash at load has no runtime info, but a version."""
    import onnxruntime

    with BackendProcess("onnxruntime:opt_level=all") as process:
        crash = process.run(models["relu_clip64"], {"x": np.array([-1.0, 0.5, 3.0, 9.0])})
        ok = process.run(models["relu_add"], {"x": x23})
    assert crash.status is RunStatus.CRASH and "library_version" not in crash.info
    for result in (crash, ok):
        assert result.ran_with["library_version"] == onnxruntime.__version__
        assert result.ran_with["python"] == sys.executable and result.ran_with["numpy"] == np.__version__


def test_a_reconfigured_worker_applies_the_new_options_in_the_same_process(tmp_path: Path) -> None:
    """The pass search's warm worker: same process, new runtime options, the session built again for them
    (the LayerNorm keepdims=0 bug is there at opt_level=all and gone with its two fusions disabled)."""
    from graphbisect.examples import pattern_model

    model = tmp_path / "ln.onnx"
    onnx.save(pattern_model("layernorm_keepdims0"), str(model))
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)}
    with BackendProcess("onnxruntime:opt_level=disable", workdir=tmp_path / "oracle") as oracle:
        expected = np.asarray(oracle.run(model, feeds).outputs["y"])
    with BackendProcess("onnxruntime:opt_level=all", workdir=tmp_path / "target") as proc:
        fused = np.asarray(proc.run(model, feeds).outputs["y"])
        pid = proc.pid
        proc.reconfigure("ort:opt_level=all,disabled=LayerNormFusionL1;SimplifiedLayerNormFusion")
        fixed = proc.run(model, feeds)  # the same model file: only the options changed
        assert proc.pid == pid and fixed.info["disabled"] == ["LayerNormFusionL1", "SimplifiedLayerNormFusion"]
        proc.reconfigure("onnxruntime:disabled=NoSuchPass")
        with pytest.raises(SpecError, match="NoSuchPass"):  # validated like a new worker's options
            proc.run(model, feeds)
    assert np.max(np.abs(fused - expected)) > 0.1
    np.testing.assert_allclose(np.asarray(fixed.outputs["y"]), expected, rtol=1e-4, atol=1e-4)


def test_only_a_reconfigurable_backend_under_the_same_interpreter_is_reconfigured(tmp_path: Path) -> None:
    with BackendProcess("onnxruntime", workdir=tmp_path) as proc:
        assert proc.can_reconfigure("ort:opt_level=basic")
        assert not proc.can_reconfigure(f"onnxruntime:python={sys.executable}")
        assert not proc.can_reconfigure("reference")
        with pytest.raises(SpecError, match="cannot serve"):
            proc.reconfigure("reference")
    with BackendProcess("reference", workdir=tmp_path / "ref") as ref:
        assert not ref.can_reconfigure("reference")  # its row does not say it keeps no process-wide state


def test_start_launches_the_worker_before_the_first_call_which_then_uses_it(models: dict[str, Path],
                                                                          x23: np.ndarray, tmp_path: Path) -> None:
    # compare starts both workers first, so their imports overlap its own writing of models and inputs
    proc = BackendProcess("onnxruntime", workdir=tmp_path)
    try:
        proc.start()
        pid = proc.pid
        assert pid is not None and proc.invocations == 0
        proc.start()  # a no-op while it runs
        assert proc.pid == pid
        result = proc.run(models["relu_add"], {"x": x23})
        assert result.ok and proc.pid == pid
    finally:
        proc.close()
    with pytest.raises(BackendError, match="closed"):
        proc.start()


def _environment(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().partition("=")[::2] for entry in entries if entry)


@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="reads the worker's environment in /proc")
def test_a_worker_whose_backend_computes_on_its_own_threads_gets_one_blas_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An idle OpenBLAS thread spins after numpy's import: ONNX Runtime's worker does not need one (its numpy
    # only moves and compares values); the reference backend computes with numpy's BLAS and keeps its threads,
    # and a value the user set is kept.
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with BackendProcess("onnxruntime", workdir=tmp_path / "ort") as ort, \
            BackendProcess("reference", workdir=tmp_path / "ref") as ref:
        ort.validate()
        ref.validate()
        assert ort.pid is not None and ref.pid is not None
        assert _environment(ort.pid).get("OPENBLAS_NUM_THREADS") == "1"
        assert "OPENBLAS_NUM_THREADS" not in _environment(ref.pid)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    with BackendProcess("onnxruntime", workdir=tmp_path / "ort3") as ort:
        ort.validate()
        assert ort.pid is not None
        assert _environment(ort.pid).get("OPENBLAS_NUM_THREADS") == "3"


def test_cut_tensors_of_the_store_are_read_by_the_worker_and_a_changed_store_is_refused(tmp_path: Path) -> None:
    """Feeds that name the oracle's store (``StoredFeeds``, as candidates of a reduction have them) are read
    by the worker from the store itself: nothing of theirs goes into the inputs data file, the run gets the
    stored values; a store that is not the one the host read when the worker opens it is refused (a user
    error naming it), never misread."""
    count = 2000
    names = [f"cut/{i}:0" for i in range(count)]
    graph = helper.make_graph([helper.make_node("Concat", names, ["y"], axis=0)], "many",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in names],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [count])])
    path = tmp_path / "many.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    store = ActivationStore(tmp_path / "acts", autoflush=False)
    for i, name in enumerate(names[1:], start=1):
        store.put(name, np.array([i], np.float32))
    store.flush()
    host = ActivationStore.open(store.directory)  # the search's view of the store
    feeds = StoredFeeds(names, {names[0]: np.array([-1], np.float32)}, host, host.get)
    with BackendProcess("onnxruntime", workdir=tmp_path / "worker") as ort:
        for _ in range(2):
            result = ort.run(path, feeds)
            assert result.ok, result.describe()
            np.testing.assert_array_equal(result.outputs["y"], [-1, *range(1, count)])
        [data] = ort.workdir.glob("inputs-*/values.bin")
        assert data.stat().st_size <= 256  # the header and the value in hand (the stored ones: 8 KiB more)
        store.put(names[1], np.array([42], np.float32))  # the store changes under the search
        store.flush()
        result = ort.run(path, feeds)  # this worker checked the store when it opened it: it reads what the
        assert result.ok and result.outputs["y"][1] == 1  # host's index says (bytes are never overwritten)
    with BackendProcess("onnxruntime", workdir=tmp_path / "other") as ort:
        with pytest.raises(InputError, match="not the one the host read"):
            ort.run(path, feeds)  # a worker that opens it now finds another index: refused
        result = ort.run(path, dict(feeds))  # the values themselves, as the host reads them
        assert result.ok and result.outputs["y"][1] == 1


def test_a_run_says_the_most_memory_its_worker_needed(tmp_path: Path) -> None:
    """``peak_memory`` is measured by the worker: a model whose intermediate takes 256 MiB raises it by at least
    that much over a small model's (what ``reduce -j`` sizes its candidate workers by). A worker of its own: the
    peak is the most so far, which another test's runs would set."""
    def model(name: str, width: int) -> Path:
        graph = helper.make_graph(
            [helper.make_node("Expand", ["x", "shape"], ["big"]), helper.make_node("ReduceSum", ["big"], ["y"])],
            name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
            [onnx.numpy_helper.from_array(np.array([width], np.int64), "shape")])
        path = tmp_path / f"{name}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
        return path

    x = {"x": np.ones(1, np.float32)}
    with BackendProcess("onnxruntime", workdir=tmp_path / "worker") as ort:
        small = ort.run(model("small", 1024), x)
        big = ort.run(model("big", 64 * 2**20), x)  # 64 Mi float32 values: 256 MiB
    assert small.ok and big.ok and small.peak_memory is not None and big.peak_memory is not None
    assert 10 * 2**20 < small.peak_memory < 2**30
    assert big.peak_memory - small.peak_memory >= 256 * 2**20


def test_replies_are_split_into_lines_however_the_pipe_cuts_them() -> None:
    """A worker's reply of megabytes arrives in 64 KiB reads, several small ones may arrive in one: each line
    comes out whole, once, in order (the host's reading is linear in the reply's size: process._Lines)."""
    from graphbisect.backends.process import _Lines

    big = json.dumps({"columns": {"name": [f"tensor_{i}" for i in range(400_000)]}}).encode()  # ~6 MB
    stream = b"".join(message + b"\n" for message in (b'{"event": "start"}', b'{"event": "loaded"}', big, b"{}"))
    rng = np.random.default_rng(0)
    for cuts in (np.arange(1 << 16, len(stream), 1 << 16), np.sort(rng.integers(0, len(stream), 200)), [3, 4]):
        lines, found = _Lines(), []
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            lines.add(stream[start:end])
            while (line := lines.pop()) is not None:
                found.append(line)
        assert found == [b'{"event": "start"}', b'{"event": "loaded"}', big, b"{}"]
        assert lines.pop() is None
