"""The ``--check`` command that ``reduce_bench.py`` gives ``polygraphy debug reduce``.

It plays the part of Polygraphy's documented accuracy check (``polygraphy run polygraphy_debug.onnx --onnxrt
--load-inputs layerwise_inputs.json --load-outputs layerwise_golden.json``) with the one thing that command
cannot configure: the **target** is ONNX Runtime with ``ORT_ENABLE_ALL`` and the golden values come from the
**oracle** (ONNX Runtime with optimizations disabled), exactly as in graphbisect's default backends.

Each call appends one line to ``--counter`` (so the benchmark counts target invocations), runs the model, and
exits 1 when it sees the expected failure:

* ``--expect mismatch``: an output of the subgraph differs from its golden value beyond ``--atol``/``--rtol``
  (``numpy.isclose`` semantics, the same default tolerances as graphbisect; integer outputs exactly);
* ``--expect crash``: session creation or the run raises.

Any other outcome exits 0 ("good"), so Polygraphy, like graphbisect, never accepts a *different* failure
(a mismatch case whose subgraph crashes is not the same bug). Inputs missing from the layerwise inputs file
are an error (exit 2), which Polygraphy also counts as "bad", as ``polygraphy run`` would.

``--target iree`` runs IREE instead (graphbisect's own import/compile/run functions), and ``--expect-message``
makes a crash count only with the same diagnostic, so Polygraphy does not drift from one compiler error to
another either.

Run: ``python benchmarks/_pg_check.py MODEL --inputs L.json --golden G.json --counter C --expect mismatch``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--inputs", type=Path, required=True, help="Polygraphy feed-dict JSON (layerwise)")
    parser.add_argument("--golden", type=Path, required=True, help="Polygraphy RunResults JSON (layerwise)")
    parser.add_argument("--counter", type=Path, required=True, help="a line is appended per invocation")
    parser.add_argument("--expect", choices=("mismatch", "crash"), required=True)
    parser.add_argument("--target", choices=("onnxruntime", "iree"), default="onnxruntime",
                        help="onnxruntime (ORT_ENABLE_ALL) or iree (graphbisect's IREE pipeline, llvm-cpu, host CPU)")
    parser.add_argument("--expect-message", default=None,
                        help="a crash counts only when its message contains this text (the same diagnostic)")
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--rtol", type=float, default=1e-3)
    return parser.parse_args(argv)


def load_polygraphy_data(inputs: Path, golden: Path) -> tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]:
    """The first feed dict of ``inputs`` and the first iteration of the only runner in ``golden``."""
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    feeds = load_json(str(inputs), description="layerwise inputs")[0]
    results = RunResults.load(str(golden))
    _, iterations = next(iter(results.items()))
    return feeds, iterations[0]


def run_target(model: Path, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """ONNX Runtime, CPU, all optimizations: (outputs, None), or (None, error) when it raises."""
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        names = [value.name for value in session.get_inputs()]
        missing = [name for name in names if name not in feeds]
        if missing:
            print(f"no layerwise value for graph input {missing[0]!r}", file=sys.stderr)
            raise SystemExit(2)
        output_names = [value.name for value in session.get_outputs()]
        values = session.run(output_names, {name: np.asarray(feeds[name]) for name in names})
    except (RuntimeError, ValueError, ort.capi.onnxruntime_pybind11_state.Fail) as exc:  # type: ignore[attr-defined]
        return None, f"{type(exc).__name__}: {exc}"
    return dict(zip(output_names, values)), None


def run_iree(model: Path, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """IREE: ONNX import, iree-compile for llvm-cpu, iree.runtime; (outputs, None) or (None, error)."""
    import tempfile

    from graphbisect.backends.iree import compile_command, compile_vmfb, import_onnx, load_module, run_module

    with tempfile.TemporaryDirectory(prefix="pg-iree-") as tmp:
        try:
            entry, inputs, outputs = import_onnx(model, Path(tmp) / "m.mlir")
            compile_vmfb(compile_command(Path(tmp) / "m.mlir", Path(tmp) / "m.vmfb"))
            missing = [name for name, _ in inputs if name not in feeds]
            if missing:
                print(f"no layerwise value for graph input {missing[0]!r}", file=sys.stderr)
                raise SystemExit(2)
            _context, function = load_module(Path(tmp) / "m.vmfb", entry)
            names = [name for name, _ in inputs]
            return run_module(function, {n: np.asarray(feeds[n]) for n in names}, names, outputs), None
        except Exception as exc:  # import, compile or run failure: the target crashed
            return None, f"{type(exc).__name__}: {exc}"


def mismatching(outputs: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray], atol: float,
                rtol: float) -> list[str]:
    """Names of the outputs (among those with a golden value) that differ beyond tolerance."""
    bad = []
    for name, value in outputs.items():
        if name not in golden:
            continue
        expected, actual = np.asarray(golden[name]), np.asarray(value)
        if expected.shape != actual.shape:
            bad.append(name)
        elif expected.dtype.kind in "biu":
            bad += [] if np.array_equal(expected, actual) else [name]
        elif not np.allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=False):
            bad.append(name)
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    """Count the invocation, run the target, exit 1 on the expected failure and 0 otherwise."""
    args = parse_args(argv)
    with args.counter.open("a") as handle:
        handle.write(f"{args.model}\n")
    feeds, golden = load_polygraphy_data(args.inputs, args.golden)
    outputs, error = (run_iree if args.target == "iree" else run_target)(args.model, feeds)
    if error is not None:
        print(f"target crashed: {error.splitlines()[0] if error else error}")
        same = args.expect_message is None or args.expect_message in error
        return 1 if args.expect == "crash" and same else 0
    assert outputs is not None
    bad = mismatching(outputs, golden, args.atol, args.rtol)
    print(f"mismatching outputs: {bad}" if bad else "outputs match")
    return 1 if bad and args.expect == "mismatch" else 0


if __name__ == "__main__":
    sys.exit(main())
