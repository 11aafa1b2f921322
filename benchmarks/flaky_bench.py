"""Flaky targets: does `reduce` ever certify a result whose failure does not repeat?

The target is ONNX Runtime at ``opt_level=all`` on a host network with a real bug (the keepdims=0
LayerNorm mis-fusion), wrapped by ``graphbisect/examples/flaky_target.py``, which at random either crashes
(``crash``) or adds noise to the outputs (``perturb``) at a given rate. Each trial reduces the host and
then asks the ground truth: a result is *certified* when the report says verified and 1-minimal; it is
*certified wrongly* when its bundle's model does not fail, deterministically, on plain ONNX Runtime
(``opt_level=all``, no faults) in every one of 5 runs. That count must be zero.

    python benchmarks/flaky_bench.py [--quick | --full] [--rates 0.1 0.3 0.5] [--modes perturb crash]
                                     [--trials N] [--nodes N] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks._common import add_size_args, print_table, write_json
from graphbisect.backends import BackendProcess
from graphbisect.compare import Tolerance
from graphbisect.examples import host_network
from graphbisect.examples.flaky_target import script_path
from graphbisect.model import load_model
from graphbisect.oracle.tester import judge
from graphbisect.workflows.reduce import ReduceOptions, reduce_model

TARGET = f"command:cmd=python {script_path()} {{model}} {{inputs}} {{outputs}}"
PLAIN = "onnxruntime:opt_level=all"
ORACLE = "onnxruntime:opt_level=disable"


def fails_deterministically(bundle: Path, runs: int = 5) -> bool:
    """Whether the bundle's model fails (mismatch) on the fault-free target in every one of ``runs`` runs."""
    with np.load(bundle / "inputs.npz") as data:
        feeds = {k: data[k] for k in data.files}
    with np.load(bundle / "oracle_outputs.npz") as data:
        expected = {k: data[k] for k in data.files}
    with tempfile.TemporaryDirectory() as tmp, BackendProcess(PLAIN, workdir=Path(tmp)) as proc:
        for _ in range(runs):
            run = proc.run(bundle / "model.onnx", feeds)
            if not judge(run, expected.__getitem__, list(expected), Tolerance()).signature.failed:
                return False
    return True


def trial(mode: str, rate: float, seed: int, nodes: int, root: Path) -> dict[str, Any]:
    """One reduction under the flaky target, judged against the ground truth."""
    host = host_network(nodes, bug="layernorm_keepdims0", position="main", seed=seed % 4)
    os.environ.update(FLAKY_MODE=mode, FLAKY_RATE=str(rate), FLAKY_SEED=str(seed),
                      FLAKY_COUNTER=str(root / f"counter-{mode}-{rate}-{seed}"))
    out = root / f"bundle-{mode}-{rate}-{seed}"
    result = reduce_model(load_model(host.model), out, inputs=host.inputs,
                          options=ReduceOptions(oracle=ORACLE, target=TARGET))
    certified = bool(result.failed and result.verified and result.one_minimal)
    truthful = result.failed and result.bundle is not None and fails_deterministically(out)
    return {"mode": mode, "rate": rate, "seed": seed, "failed": result.failed, "certified": certified,
            "wrong": certified and not truthful, "flaky": result.flaky, "nodes": result.final_nodes,
            "target_runs": result.invocations["target"], "core_kept": set(host.core_nodes) <= set(result.kept_nodes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_args(parser)
    parser.add_argument("--rates", type=float, nargs="+", default=None)
    parser.add_argument("--modes", nargs="+", default=["perturb", "crash"])
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=100)
    args = parser.parse_args()
    rates = args.rates or ([0.3] if args.quick else [0.1, 0.3, 0.5])
    trials = args.trials or (2 if args.quick else 10 if args.full else 5)
    results = []
    with tempfile.TemporaryDirectory(prefix="flaky-bench-") as tmp:
        for mode in args.modes:
            for rate in rates:
                for seed in range(trials):
                    results.append(trial(mode, rate, seed, args.nodes, Path(tmp)))
                    print(f"  {results[-1]}", flush=True)
    rows = []
    for mode in args.modes:
        for rate in rates:
            group = [r for r in results if r["mode"] == mode and r["rate"] == rate]
            rows.append([mode, rate, len(group), sum(r["flaky"] for r in group), sum(r["certified"] for r in group),
                         sum(r["wrong"] for r in group), sum(r["core_kept"] for r in group),
                         statistics.median(r["target_runs"] for r in group)])
    print_table(f"flaky targets: host of {args.nodes} nodes with the keepdims=0 LayerNorm bug",
                ["fault", "rate", "trials", "flaky found", "certified", "certified wrongly", "bug kept",
                 "median target runs"], rows,
                notes=["certified: verified and 1-minimal; wrongly: its model does not fail in 5 of 5 fault-free runs"])
    if args.json:
        write_json(args.json, {"results": results})


if __name__ == "__main__":
    main()
