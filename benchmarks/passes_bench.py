"""Pass ablation cost: target invocations to name the culprit passes, against one run per fired pass.

Real rows run `graphbisect passes` (:func:`graphbisect.workflows.passes.find_culprit_passes`) on the
example hosts with real onnxruntime bugs; the synthetic rows run the same engine search
(:func:`graphbisect.strategies.passes.minimal_set`, ProbDD) with a simulated single culprit among ``n``
passes, at several positions. "naive" is the manual approach the seed documents describe: disable one pass
at a time (``n`` runs, and it cannot find a culprit *pair* that masks each other at all). Invocations of
the real rows count every target run: the baseline (with pass reporting), the all-disabled end, and both
searches (disable-set and enable-set).

With ``--paddle``, one more real row: Paddle Inference (oneDNN) on MobileNetV2 against ONNX Runtime on its
conversion, at a tolerance between its default error and its error with ``depthwise_conv_onednn_pass`` deleted
(the set-up of tests/workflows/test_passes.py's non-monotone rounding test); its wall time is where starting a
worker per candidate shows (Paddle's import, ~0.65 s, against a predictor build and run of ~0.1 s).

    python benchmarks/passes_bench.py [--nodes 2000] [--no-real] [--paddle]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from graphbisect.compare import Tolerance
from graphbisect.engine import Evaluator, Outcome
from graphbisect.examples.hosts import host_inputs, host_network
from graphbisect.model import load_model
from graphbisect.strategies.passes import minimal_set
from graphbisect.workflows.passes import PassesOptions, find_culprit_passes


def real_rows(nodes: int) -> list[tuple[str, ...]]:
    """One row per (bug, optimization level) on a host of ``nodes`` nodes."""
    rows = []
    for bug, level in (("layernorm_keepdims0", "all"), ("layernorm_keepdims0", "basic"), ("relu_clip_f64", "all")):
        model = load_model(host_network(nodes, bug=bug).model)
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            r = find_culprit_passes(model, inputs=host_inputs(), workdir=Path(tmp),
                                    options=PassesOptions(target=f"onnxruntime:opt_level={level}"))
        units = len(r.searched)
        search = r.search.get("disable", {}).get("invocations", 0)
        rows.append((f"{bug} @ {level} ({nodes} nodes)", f"{units} {r.source}", ",".join(r.culprits),
                     ",".join(r.required), str(search), str(r.invocations.get("target", 0)), str(units),
                     f"{time.monotonic() - started:.1f}"))
    return rows


def paddle_row(work: Path) -> tuple[str, ...]:
    """`passes --target paddle` on MobileNetV2 at a tolerance its default build misses (see the module docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.paddle_models: the exported test nets
    from tests.paddle_models import mobilenet_v2_errors

    prefix, feeds, error = mobilenet_v2_errors(work)
    atol = float(np.sqrt(error("paddle") * error("paddle:delete_pass=depthwise_conv_onednn_pass")))
    started = time.monotonic()
    r = find_culprit_passes(load_model(prefix), inputs=feeds, workdir=work / "search", options=PassesOptions(
        target="paddle", oracle="onnxruntime:opt_level=disable", tolerance=Tolerance(atol=atol, rtol=0.0)))
    search = r.search.get("disable", {}).get("invocations", 0)
    return (f"paddle MobileNetV2, atol {atol:.2g}", f"{len(r.searched)} {r.source}", ",".join(r.culprits) or "none",
            ",".join(r.required) or "-", str(search), str(r.invocations.get("target", 0)), str(len(r.searched)),
            f"{time.monotonic() - started:.1f}")


def synthetic_rows(sizes: list[int]) -> list[tuple[str, ...]]:
    """A single culprit at 5 positions per size: disable-set search invocations (mean, max) vs n."""
    rows = []
    for n in sizes:
        costs = []
        for culprit in sorted({0, n // 3, n // 2, (2 * n) // 3, n - 1}):
            ev = Evaluator(lambda keep, c=culprit: Outcome.FAIL if c in keep else Outcome.PASS, n)
            ev.record(ev.universe, Outcome.FAIL)  # the all-disabled end, run before the search
            result = minimal_set(ev, phase="disable-set")
            assert result.keep == {culprit}
            costs.append(ev.stats().invocations)
        rows.append((f"synthetic, 1 culprit among {n}", f"{n}", "1", "-", f"{sum(costs) / len(costs):.1f} "
                     f"(max {max(costs)})", f"{max(costs) + 2}", str(n), f"log2 n = {math.log2(n):.1f}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--no-real", action="store_true", help="only the synthetic scaling rows")
    parser.add_argument("--paddle", action="store_true", help="also Paddle Inference on MobileNetV2")
    args = parser.parse_args()
    header = ("case", "units searched", "culprits", "required", "disable-set runs", "target runs in all",
              "naive runs", "seconds / note")
    rows = ([] if args.no_real else real_rows(args.nodes)) + synthetic_rows([8, 16, 32, 64, 128, 256, 1024])
    if args.paddle:
        with tempfile.TemporaryDirectory() as tmp:
            rows.insert(0, paddle_row(Path(tmp)))
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print(" | ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
