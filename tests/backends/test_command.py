"""The command backend: an external program that reads an inputs .npz and writes an outputs .npz."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from graphbisect.backends import BackendProcess, Phase, RunStatus
from graphbisect.backends.command import Command
from graphbisect.errors import SpecError

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
