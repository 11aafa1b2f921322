"""What a backend worker costs to start: forked from a zygote (the default on Linux) or started as a new interpreter.

Every ``BackendProcess`` starts a worker on its first call; a reduction starts about nine (oracle, target pool,
evidence, describing, fresh re-verifications, report facts), the test suite about 2,000. For each backend that
is installed and each start mode (``GRAPHBISECT_WORKER_START``: ``fork``, the default, or ``exec``), this runs
``--repeats`` times: a new ``BackendProcess`` runs a 1-node model once and closes. Columns:

* **first result s**: from the ``BackendProcess`` call to the first run's result (start, import of the backend
  library, ``init``, ``validate``, session, run), median;
* **worker CPU s**: the worker's own user + system CPU at that point (``/proc/PID/stat``), median: a forked
  worker's excludes what its zygote imported once (the zygote's start is the first row's extra);
* **forked**: how many of the workers a zygote forked (the rest were started as new interpreters: a zygote
  with a thread other than numpy's idle OpenBLAS pool, which it stops, never forks);
* then ``graphbisect reduce --example`` end to end in both modes (the CLI as a user runs it, median wall).

Run: ``python benchmarks/worker_start_bench.py [--repeats N] [--backends onnxruntime reference ...]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from _common import describe_machine, median, print_table
from onnx import TensorProto, helper

from graphbisect.backends import BackendProcess
from graphbisect.backends.registry import resolve
from graphbisect.backends.zygote import ENV

BACKENDS = ("onnxruntime", "reference", "openvino", "iree", "onnxoptimizer")
_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds) of a process, from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


def _relu(folder: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = folder / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _starts(spec: str, model: Path, folder: Path, repeats: int) -> tuple[list[float], list[float], int]:
    walls, cpus, forked = [], [], 0
    x = {"x": np.array([[-1.0, 0.0, 2.0, 3.0]], np.float32)}
    for i in range(repeats):
        started = time.perf_counter()
        with BackendProcess(spec, workdir=folder / f"{spec}-{i}") as proc:
            result = proc.run(model, x)
            walls.append(time.perf_counter() - started)
            assert result.ok, result.describe()
            assert proc.pid is not None
            parent, cpu = _stat(proc.pid)
            cpus.append(cpu)
            forked += parent != os.getpid()
    return walls, cpus, forked


def _example(mode: str, folder: Path, repeats: int) -> float:
    walls = []
    for i in range(repeats):
        out = folder / f"example-{mode}-{i}"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "graphbisect", "reduce", "--example", "-o", str(out)],
                       env={**os.environ, ENV: mode}, capture_output=True, check=False, timeout=600)
        walls.append(time.perf_counter() - started)
    return median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="worker-start-") as tmp:
        folder = Path(tmp)
        model = _relu(folder)
        for name in args.backends:
            if not resolve(name)[1].availability(version=False).available:
                continue
            for mode in ("fork", "exec"):
                os.environ[ENV] = mode
                walls, cpus, forked = _starts(name, model, folder / mode, args.repeats)
                rows.append([name, mode, f"{median(walls):.3f}", f"{max(walls[0] - median(walls), 0):.3f}",
                             f"{median(cpus):.3f}", f"{forked}/{args.repeats}"])
        os.environ.pop(ENV, None)
        print_table(f"Worker start, {args.repeats} workers per row ({describe_machine()})",
                    ["backend", "mode", "first result s", "first worker extra s", "worker CPU s", "forked"], rows,
                    left=2, notes=["first worker extra: the first start's time above the median (a fork's includes"
                                   " starting its zygote)"])
        examples = [[mode, f"{_example(mode, folder, 3):.2f}"] for mode in ("fork", "exec")]
        print_table("graphbisect reduce --example, median wall of 3", ["mode", "wall s"], examples)


if __name__ == "__main__":
    main()
