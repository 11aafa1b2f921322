"""The machine's problems are said as the machine's (issue 36 item 8): a folder name that is not UTF-8 and a
process out of memory ended in "the oracle … failed … choose another oracle"; a thread that could not start
under ``ulimit -v`` was "a graphbisect bug"; ONNX Runtime wrote ``~/.cache/Microsoft/…`` at import.

Real processes, real ONNX Runtime, a real address-space limit (``RLIMIT_AS``); each test failed before the fix.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.cli.main import environment_error, main

_ROOT = str(Path(__file__).resolve().parents[1])


def _relu(folder: Path) -> Path:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [vi("x", TensorProto.FLOAT, [1, 4])], [vi("y", TensorProto.FLOAT, [1, 4])])
    path = folder / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _graphbisect(args: list[str], env: dict[str, str] | None = None, limit: int | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m graphbisect ARGS`` in a child (with an address-space limit of ``limit`` bytes)."""
    def limited() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    environment = {**os.environ, "PYTHONPATH": _ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-m", "graphbisect", *args], capture_output=True, text=True, check=False,
                          env=environment, preexec_fn=limited, cwd=cwd, timeout=300)


def test_a_work_folder_whose_name_is_not_utf8_is_refused_as_the_path(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    model = _relu(tmp_path)
    workdir = Path(os.fsdecode(bytes(tmp_path) + b"/work\xff"))
    # ONNX Runtime refused the model's path (a TypeError): "the oracle … failed … choose another oracle"
    assert main(["compare", str(model), "--no-layerwise", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "not valid UTF-8" in err and "work\\xff" in err and "choose another oracle" not in err


def test_a_temporary_folder_whose_name_is_not_utf8_is_refused_as_the_path(tmp_path: Path) -> None:
    model = _relu(tmp_path)
    tmp = bytes(tmp_path) + b"/tmp\xff"
    os.mkdir(tmp)
    done = _graphbisect(["compare", str(model), "--no-layerwise"], env={"TMPDIR": os.fsdecode(tmp)})
    assert done.returncode == 2, done.stderr
    assert "not valid UTF-8" in done.stderr and "TMPDIR" in done.stderr
    assert "choose another oracle" not in done.stderr and "Traceback" not in done.stderr


def test_an_oracle_out_of_memory_under_ulimit_says_to_raise_the_limit(tmp_path: Path) -> None:
    # Expand to 2^30 float32 (4 GiB) under a 2 GiB address-space limit: ONNX Runtime cannot allocate it
    vi = helper.make_tensor_value_info
    shape = numpy_helper.from_array(np.array([1, 1 << 30], np.int64), "big_shape")
    graph = helper.make_graph([helper.make_node("Expand", ["x", "big_shape"], ["big"], name="expand"),
                               helper.make_node("ReduceMax", ["big"], ["y"], name="reduce", keepdims=1)], "g",
                              [vi("x", TensorProto.FLOAT, [1, 1])], [vi("y", TensorProto.FLOAT, [1, 1])],
                              initializer=[shape])
    model = tmp_path / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    done = _graphbisect(["compare", str(model), "--no-layerwise"], limit=2 << 30)
    assert done.returncode == 2, done.stderr
    # it said "choose another oracle" (and that the seeded random inputs may be at fault)
    assert "ran out of memory" in done.stderr and "ulimit -v 2097152" in done.stderr, done.stderr
    assert "choose another oracle" not in done.stderr


def test_a_thread_that_cannot_start_is_the_machines_error() -> None:
    # under ulimit -v a thread's stack cannot be mapped: "internal error: RuntimeError … graphbisect bug", exit 3
    found = environment_error(RuntimeError("can't start new thread"))
    assert found is not None and found[0].startswith("out of memory") and "memory" in found[1]


def test_onnx_runtime_writes_nothing_into_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    model = _relu(tmp_path)
    env = {"HOME": str(home)}
    env_without = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "ORT_DISABLE_TELEMETRY")}
    done = subprocess.run([sys.executable, "-m", "graphbisect", "compare", str(model), "--no-layerwise"],
                          capture_output=True, text=True, check=False, cwd=tmp_path, timeout=300,
                          env={**env_without, "PYTHONPATH": _ROOT, **env})
    assert done.returncode == 0, done.stderr
    # ORT 1.32's telemetry wrote .cache/Microsoft/DeveloperTools/.onnxruntime/{deviceid,onnxruntime.db}
    assert [str(p.relative_to(home)) for p in home.rglob("*")] == []
