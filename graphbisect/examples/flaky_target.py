"""A flaky target for tests and benchmarks: ONNX Runtime (``opt_level=all``, real bugs included) that, at
random, crashes or perturbs its outputs — the way a GPU race, an uninitialized buffer or an overloaded
device makes a real target fail only sometimes.

Run by the ``command`` backend, with only numpy and onnxruntime (it imports nothing from graphbisect)::

    command:cmd=python /path/to/flaky_target.py {model} {inputs} {outputs}

Environment: ``FLAKY_RATE`` (probability of a fault per run, default 0.3), ``FLAKY_MODE`` (``perturb``:
add noise to every float output; ``crash``: exit 3 without outputs), ``FLAKY_SEED`` and ``FLAKY_COUNTER``
(a file counting the runs: the n-th run's fault is drawn from ``(seed, n)``, so a test replays exactly).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np

__all__ = ["main", "script_path"]


def script_path() -> Path:
    """This file, for ``command:cmd=python PATH {model} {inputs} {outputs}``."""
    return Path(__file__).resolve()


def _draw() -> bool:
    counter = Path(os.environ.get("FLAKY_COUNTER", "flaky-counter.txt"))
    count = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(count + 1))
    rng = random.Random(f"{os.environ.get('FLAKY_SEED', '0')}:{count}")
    return rng.random() < float(os.environ.get("FLAKY_RATE", "0.3"))


def main(argv: list[str]) -> int:
    """Run ``MODEL`` on ``INPUTS`` (.npz) with ONNX Runtime and write ``OUTPUTS`` (.npz), faults included."""
    import onnxruntime as ort

    model, inputs, outputs = argv
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    with np.load(inputs) as data:
        feeds = {name: data[name] for name in data.files}
    names = [o.name for o in session.get_outputs()]
    values = dict(zip(names, session.run(None, feeds), strict=True))
    if _draw():
        if os.environ.get("FLAKY_MODE", "perturb") == "crash":
            sys.stderr.write("flaky_target: injected crash\n")
            return 3
        noise = np.random.default_rng()
        values = {k: v + noise.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else v
                  for k, v in values.items()}
    np.savez(outputs, **values)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
