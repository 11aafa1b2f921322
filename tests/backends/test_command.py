"""The command backend: an external program that reads an inputs .npz and writes an outputs .npz."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from graphbisect.backends import BackendProcess, Phase, RunStatus
from graphbisect.backends.command import Command
from graphbisect.errors import SpecError
from graphbisect.storage.tempfolders import alive  # a zombie is dead: not reaped yet by whoever adopted it

Mode = Callable[[str], Path]


def test_program_outputs_come_back(command_spec: str, mode_file: Mode, x23: np.ndarray) -> None:
    with BackendProcess(command_spec) as process:
        result = process.run(mode_file("double"), {"x": x23, "file": x23})  # 'file' breaks np.savez(**kw)
    assert result.ok, result.describe()
    np.testing.assert_array_equal(result.outputs["y"], x23 * 2)
    assert "runner.py" in result.info["command"]
    assert result.ran_with == {}  # the worker only launched the program: no interpreter is claimed as what ran



def test_segfault_of_the_program_is_a_crash_signature(command_spec: str, mode_file: Mode, x23: np.ndarray) -> None:
    with BackendProcess(command_spec) as process:
        result = process.run(mode_file("segv"), {"x": x23})
        assert (result.status, result.phase) == (RunStatus.CRASH, Phase.RUN)
        assert result.exit_code == -signal.SIGSEGV
        assert result.error_type == "CommandFailed"
        assert "killed by signal SIGSEGV" in (result.message or "")
        assert process.run(mode_file("double"), {"x": x23}).ok  # the worker itself survived


def test_nonzero_exit_carries_the_stderr_tail(command_spec: str, mode_file: Mode, x23: np.ndarray) -> None:
    with BackendProcess(command_spec) as process:
        result = process.run(mode_file("exit3"), {"x": x23})
    assert (result.status, result.phase, result.exit_code) == (RunStatus.CRASH, Phase.RUN, 3)
    assert result.describe() == "crash at run: CommandFailed: command exited with code 3"
    assert "boom: the device is on fire" in (result.message or "")
    assert "boom" in result.log


@pytest.mark.parametrize(("mode", "needle"), [
    ("wrong-output", "no output named 'y' (it wrote: 'other')"),
    ("no-output", "wrote no outputs file"),
])
def test_missing_outputs_are_clear_crashes(command_spec: str, mode_file: Mode, x23: np.ndarray, mode: str,
                                           needle: str) -> None:
    with BackendProcess(command_spec) as process:
        result = process.run(mode_file(mode), {"x": x23}, ["y"])
    assert result.status is RunStatus.CRASH
    assert needle in (result.message or "")


def test_placeholders_are_substituted_as_single_arguments(tmp_path: Path) -> None:
    spaced = tmp_path / "with space"
    spaced.mkdir()
    argv = Command({"cmd": "prog --model={model} {inputs} {outputs}"}, str(spaced)).render(
        str(spaced / "m.onnx"), str(spaced / "in.npz"), str(spaced / "out.npz"))
    assert argv == ["prog", f"--model={spaced}/m.onnx", f"{spaced}/in.npz", f"{spaced}/out.npz"]
    line = Command({"cmd": "prog {model}", "shell": "1"}, str(spaced)).render(str(spaced / "m.onnx"), "", "")
    assert line == f"prog '{spaced}/m.onnx'"


def test_shell_mode_runs_through_the_shell(command_script: Path, mode_file: Mode, x23: np.ndarray,
                                           tmp_path: Path) -> None:
    spec = f"command:shell=1,cmd=cd / && {sys.executable} {command_script} {{model}} {{inputs}} {{outputs}}"
    with BackendProcess(spec, workdir=tmp_path / "work dir") as process:
        result = process.run(mode_file("double"), {"x": x23})
    assert result.ok, result.describe()


@pytest.mark.parametrize(("options", "needle"), [
    ({}, "needs cmd="),
    ({"cmd": "run {model} {weights}"}, "{weights}"),
    ({"cmd": "run 'unbalanced {model}"}, "cannot be parsed"),
])
def test_bad_templates_are_spec_errors(options: dict[str, str], needle: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        Command(options, str(tmp_path))
    assert needle in str(err.value)


# --- issue 24 case 7: the run ends when the program exits, whatever it leaves running -------------------
def test_a_descendant_holding_stderr_does_not_hold_the_run(command_script: Path, mode_file: Mode, x23: np.ndarray,
                                                           tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    # the shell leaves `sleep 60` running, with the program's stderr open, and records its pid
    spec = (f"command:shell=1,timeout=10,cmd=sleep 60 & echo $! > {pidfile}; "
            f"{sys.executable} {command_script} {{model}} {{inputs}} {{outputs}}")
    with BackendProcess(spec, workdir=tmp_path / "work") as process:
        started = time.monotonic()
        result = process.run(mode_file("double"), {"x": x23})
        took = time.monotonic() - started
    # It read stderr to its end, which the daemon held: "timeout after 10 s" for a 1 s run.
    assert result.ok, result.describe()
    assert took < 8, took
    daemon = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(daemon)  # killed with the program's process group


def test_a_timeout_kills_what_the_program_started(tmp_path: Path, mode_file: Mode, x23: np.ndarray) -> None:
    pidfile = tmp_path / "sleeper.pid"
    spec = f"command:shell=1,timeout=2,cmd=echo $$ > {pidfile}; sleep 60; true {{model}} {{inputs}} {{outputs}}"
    with BackendProcess(spec, workdir=tmp_path / "work") as process:
        result = process.run(mode_file("double"), {"x": x23})
    assert result.status is RunStatus.TIMEOUT
    shell = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while alive(shell) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(shell)  # the worker was killed, and the program's own process group with it


def test_a_gigabyte_of_stderr_is_not_held_in_memory(tmp_path: Path, mode_file: Mode, x23: np.ndarray) -> None:
    spec = "command:shell=1,cmd=head -c 300000000 /dev/zero >&2; exit 3; true {model} {inputs} {outputs}"
    with BackendProcess(spec, workdir=tmp_path / "work") as process:
        result = process.run(mode_file("double"), {"x": x23})
        worker_rss = _peak_rss_kib(process.pid)
    assert result.status is RunStatus.CRASH and result.exit_code == 3
    assert worker_rss < 200_000, worker_rss  # KiB: it read all 300 MB into memory, twice (bytes and text)
    assert len(result.message or "") < 10_000


def _peak_rss_kib(pid: int | None) -> int:
    assert pid is not None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_program_the_worker_ran_counts_in_its_peak_memory(command_spec: str, mode_file: Mode, x23: np.ndarray,
                                                            tmp_path: Path) -> None:
    """``peak_memory`` adds the largest child's peak to the worker's own: a ``command`` target's program (or a
    compiler a runtime runs) holding 512 MiB raises it by that much, which the worker's own memory does not show."""
    with BackendProcess(command_spec, workdir=tmp_path / "w") as proc:
        small = proc.run(mode_file("double"), {"x": x23})
        big = proc.run(mode_file("hold-512mib"), {"x": x23})
    assert small.ok and big.ok and small.peak_memory is not None and big.peak_memory is not None
    assert small.peak_memory < 512 * 2**20
    assert big.peak_memory - small.peak_memory >= 500 * 2**20


# --- venv= and package=: the program run with an environment first, its library's release measured there ------
def test_venv_runs_the_environments_python_and_package_measures_its_release(
        models: dict[str, Path], x23: np.ndarray, ort_release_pythons: dict[str, Path], tmp_path: Path) -> None:
    """``python`` in the command line is the environment's (ONNX Runtime 1.20.1 here, 1.32 in this interpreter),
    and ``package=`` reports the release that environment's interpreter has, measured there, as what ran."""
    from tests.ort_releases import write_ort_runner

    venv = ort_release_pythons["1.20.1"].parent.parent
    runner = write_ort_runner(tmp_path)
    spec = f"command:cmd=python {runner} {{model}} {{inputs}} {{outputs}},venv={venv},package=onnxruntime"
    with BackendProcess(spec, workdir=tmp_path / "work") as process:
        result = process.run(models["relu_add"], {"x": x23})
    assert result.ok, result.describe()
    np.testing.assert_allclose(result.outputs["y"], np.maximum(x23, 0) + 1)
    assert f"run.py: onnxruntime 1.20.1 under {venv}/bin/python" in result.log  # what the program imported
    ran = result.ran_with
    assert (ran["library"], ran["library_version"]) == ("onnxruntime", "1.20.1")
    assert ran["python"].startswith(str(venv)) and ran["numpy"].startswith("1.")  # the env's numpy<2
    assert str(venv) in ran["library_path"]
    assert result.info["venv"] == str(venv)
    # the same program without venv=: this interpreter's python on PATH is not asked for, nothing is claimed
    plain = f"command:cmd={sys.executable} {runner} {{model}} {{inputs}} {{outputs}}"
    with BackendProcess(plain, workdir=tmp_path / "plain") as process:
        here = process.run(models["relu_add"], {"x": x23})
    assert here.ok and here.ran_with == {} and "run.py: onnxruntime 1.20.1" not in here.log


@pytest.mark.parametrize(("options", "needle"), [
    ({"venv": "/nonexistent/env"}, "is not an environment (it has no bin/ folder)"),
    ({"package": "onnx runtime"}, "is not a distribution's name"),
    ({"package": "onnxruntime", "venv": "."}, "its PATH has none"),
])
def test_a_venv_or_package_that_cannot_be_used_is_a_spec_error(options: dict[str, str], needle: str,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # an environment with no python, and nothing else on PATH
    monkeypatch.setenv("GRAPHBISECT_CALLER_CWD", str(tmp_path))
    with pytest.raises(SpecError) as err:
        Command({"cmd": "run {model} {inputs} {outputs}", **options}, str(tmp_path))
    assert needle in str(err.value)


def test_a_recorded_venv_needs_trust_and_package_does_not_add_to_it() -> None:
    from graphbisect.backends.registry import untrusted_options

    found = {u.option: u.describe() for u in untrusted_options(
        "command:cmd=python run.py {model} {inputs} {outputs},venv=/opt/env,package=onnxruntime")}
    assert set(found) == {"cmd", "venv"}
    assert "is the environment whose programs the command runs" in found["venv"]
