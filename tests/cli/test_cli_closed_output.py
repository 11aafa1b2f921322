"""A reader that goes away (``graphbisect ... | head -1``) ends the command quietly, for every command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphbisect.cli.main import EXIT_OUTPUT_CLOSED


def _run_with_closed_stdout(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the CLI with a stdout pipe whose reading end is closed before it starts: every write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        return subprocess.run([sys.executable, "-m", "graphbisect", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=cwd, env=env, timeout=300, check=False)
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("closed")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "m.onnx")
    np.savez(folder / "in.npz", x=np.arange(6, dtype=np.float32).reshape(2, 3) - 3)
    return folder


@pytest.mark.parametrize("args", [
    ["backends"],
    ["compare", "m.onnx", "--inputs", "in.npz", "--target", "reference"],
], ids=["backends", "compare"])
def test_closed_stdout_is_a_quiet_exit_141_not_an_internal_error(args: list[str], small_model: Path) -> None:
    proc = _run_with_closed_stdout(args, small_model)
    assert proc.returncode == EXIT_OUTPUT_CLOSED == 141, proc.stderr
    assert "internal error" not in proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def test_a_broken_pipe_to_anything_else_is_still_reported() -> None:
    """Only the CLI's own streams end quietly: a pipe to a backend worker that breaks is a bug to report."""
    from graphbisect.cli.main import closed_output
    from graphbisect.cli.terminal import OutputClosed

    assert closed_output(BrokenPipeError(32, "Broken pipe")) is None
    wrapped = RuntimeError("search aborted")
    wrapped.__cause__ = OutputClosed(sys.stderr)
    assert isinstance(closed_output(wrapped), OutputClosed)
