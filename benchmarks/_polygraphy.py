"""Polygraphy's documented accuracy-debugging recipe for ``debug reduce``, driven for ``reduce_bench.py``.

The recipe ("Reducing Failing ONNX Models", Polygraphy's ``examples/cli/debug/02_reducing_failing_onnx_models``
and ``how-to/use_debug_reduce_effectively.md``):

1. ``polygraphy surgeon sanitize model.onnx -o folded.onnx --fold-constants`` (the hosts compute shapes at run
   time: Shape → Gather → Concat → Reshape);
2. golden values of *every* tensor from the trusted backend, and the inputs; the recipe uses
   ``polygraphy run --onnxrt --onnx-outputs mark all --save-outputs``, but our oracle is ONNX Runtime with
   optimizations **disabled**, which ``polygraphy run`` cannot configure, so we mark all outputs with
   Polygraphy's own ``modify_outputs(MARK_ALL)``, run ONNX Runtime (``ORT_DISABLE_ALL``) ourselves and save
   Polygraphy's formats with its API (``RunResults.save``, ``save_json``);
3. ``polygraphy data merge inputs.json layerwise_golden.json -o layerwise_inputs.json`` (``data to-input`` in
   older Polygraphy: 0.53 renamed it);
4. ``polygraphy debug reduce folded.onnx -o reduced.onnx --mode bisect|linear --load-inputs layerwise_inputs.json
   --check <check>``, where ``<check>`` is ``_pg_check.py`` (the target, ORT ``ORT_ENABLE_ALL``, against the
   golden values; one line per run in a counter file); "bisect then linear" reduces bisect's output again
   with ``--mode linear``, as the docs recommend.

Before reducing, the check runs once on ``folded.onnx`` (not counted): if the folded model no longer fails,
Polygraphy has nothing to reduce.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from graphbisect.oracle.signature import normalize_message

__all__ = ["PolygraphyPrep", "PolygraphyRun", "debug_reduce", "prepare"]

POLYGRAPHY = str(Path(sys.executable).with_name("polygraphy"))
CHECK_SCRIPT = Path(__file__).resolve().with_name("_pg_check.py")


@dataclass(frozen=True)
class PolygraphyPrep:
    """The files steps 1–3 produced in ``folder``, and what they cost."""

    folder: Path
    kind: str  # "mismatch" or "crash": what the check looks for
    folded_nodes: int
    seconds: float
    reproduces: bool  # the check fails on folded.onnx
    precheck_output: str = ""
    check_args: tuple[str, ...] = ()  # extra options of the check (e.g. --target iree)


@dataclass(frozen=True)
class PolygraphyRun:
    """One ``polygraphy debug reduce`` run (or a chain of them)."""

    mode: str
    ok: bool
    invocations: int
    seconds: float
    kept: tuple[str, ...] = ()
    reason: str | None = None
    output: Path | None = None
    parts: tuple[PolygraphyRun, ...] = field(default=())

    @property
    def final_nodes(self) -> int | None:
        return len(self.kept) if self.ok else None


def _polygraphy(args: Sequence[str], folder: Path) -> None:
    subprocess.run([POLYGRAPHY, *args, "-q"], cwd=folder, check=True, capture_output=True, text=True)


def _golden(folder: Path, inputs: Mapping[str, np.ndarray]) -> None:
    """Step 2: every tensor of folded.onnx from ONNX Runtime with optimizations disabled, in Polygraphy JSON."""
    import onnxruntime as ort
    from polygraphy import constants
    from polygraphy.backend.onnx import modify_outputs
    from polygraphy.comparator import RunResults
    from polygraphy.json import save_json
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR  # the benchmark prints its own table

    probe = modify_outputs(onnx.load(folder / "folded.onnx"), outputs=constants.MARK_ALL)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_outputs()]
    results = RunResults()
    results.add([dict(zip(names, session.run(names, dict(inputs))))], runner_name="onnxrt-oracle")
    results.save(str(folder / "layerwise_golden.json"))
    save_json([dict(inputs)], str(folder / "inputs.json"), description="inputs")


def check_command(kind: str, model: str, counter: str, extra: Sequence[str] = ()) -> list[str]:
    """The ``--check`` command line that looks for a ``kind`` failure of ``model`` (relative to the folder)."""
    return [sys.executable, str(CHECK_SCRIPT), model, "--inputs", "layerwise_inputs.json", "--golden",
            "layerwise_golden.json", "--counter", counter, "--expect", kind, *extra]


def prepare(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray], kind: str, folder: Path,
            check_args: Sequence[str] = ()) -> PolygraphyPrep:
    """Steps 1–3 in ``folder``, then the (uncounted) check on the folded model (``check_args``: its options)."""
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    onnx.save(model, folder / "model.onnx")
    _polygraphy(["surgeon", "sanitize", "model.onnx", "-o", "folded.onnx", "--fold-constants"], folder)
    _golden(folder, inputs)
    _polygraphy(["data", "merge", "inputs.json", "layerwise_golden.json", "-o", "layerwise_inputs.json"], folder)
    seconds = time.perf_counter() - started
    folded = len(onnx.load(folder / "folded.onnx").graph.node)
    done = subprocess.run(check_command(kind, "folded.onnx", "precheck.count", check_args), cwd=folder,
                          capture_output=True, text=True, check=False)
    return PolygraphyPrep(folder, kind, folded, seconds, done.returncode != 0, done.stdout.strip()[-300:],
                          tuple(check_args))


def _count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def debug_reduce(prep: PolygraphyPrep, source: str, mode: str, *, timeout: float | None) -> PolygraphyRun:
    """Step 4: ``polygraphy debug reduce source --mode mode`` in ``prep.folder``, with a wall-clock limit."""
    stem = f"{Path(source).stem}-{mode}"
    counter, output, log = prep.folder / f"{stem}.count", prep.folder / f"{stem}.onnx", prep.folder / f"{stem}.log"
    counter.unlink(missing_ok=True)
    command = [POLYGRAPHY, "debug", "reduce", source, "-o", output.name, f"--mode={mode}", "--load-inputs",
               "layerwise_inputs.json", "--check",
               *check_command(prep.kind, "polygraphy_debug.onnx", counter.name, prep.check_args)]
    started = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.Popen(command, cwd=prep.folder, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this call started: polygraphy and its check
            proc.wait()
            code = None
    seconds, runs = time.perf_counter() - started, _count(counter)
    if code is None:
        return PolygraphyRun(mode, False, runs, seconds, reason=f"timeout: stopped after {timeout:.0f} s")
    if code != 0 or not output.exists():
        return PolygraphyRun(mode, False, runs, seconds, reason=failure_reason(log.read_text()))
    kept = tuple(node.name for node in onnx.load(output).graph.node)
    return PolygraphyRun(mode, True, runs, seconds, kept, output=output)


_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Fail)\b:?\s*(.*)$")


def failure_reason(log: str) -> str:
    """A one-line reason from a failed Polygraphy run's log: where it failed and the end of the exception."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    error = next((line for line in reversed(lines) if _EXCEPTION.match(line)), lines[-1] if lines else "no output")
    where = "fallback inference crashed" if "fallback_inference" in log else "debug reduce failed"
    message = normalize_message(error)
    return f"{where}: {'…' if len(message) > 50 else ''}{message[-50:]}"
