"""Precision search cost: target runs used vs units n and needed nodes k, against naive one-run-per-node
sensitivity and against Polygraphy-style prefix bisection (``polygraphy debug precision``).

Cases: the residual CNN (fp16, int8) and the sensitive transformer (fp16) with 1, 2 and 4 layers; k grows
with the number of layers given large residual activations in every layer's final LayerNorm.

    python benchmarks/precision_bench.py            # quick
    python benchmarks/precision_bench.py --json r.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from graphbisect.compare import Tolerance
from graphbisect.examples import transformer_inputs
from graphbisect.examples.precision_models import cnn_inputs, residual_cnn, sensitive_transformer
from graphbisect.model import load_model
from graphbisect.workflows.precision import find_precision

TOL = Tolerance(atol=0.05, rtol=0.05)


def _cases(full: bool) -> list[tuple[str, object, dict, str]]:
    layers = (1, 2, 4, 8) if full else (1, 2, 4)
    cases = [("cnn", residual_cnn(), cnn_inputs(), "fp16"), ("cnn", residual_cnn(), cnn_inputs(), "int8")]
    for n in layers:
        cases.append((f"transformer-{n}L", sensitive_transformer(n), transformer_inputs(), "fp16"))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="more sizes")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args()
    rows = []
    for name, proto, feeds, mode in _cases(args.full):
        result = find_precision(load_model(proto), mode=mode, inputs=feeds, tolerance=TOL)
        n, k = len(result.units), len(result.keep_fp32)
        prefix = len(result.prefix_keep_fp32) if result.prefix_keep_fp32 is not None else 0
        rows.append({"case": name, "mode": mode, "n": n, "k": k, "search_tests": result.invocations["search_tests"],
                     "target_runs": result.invocations["target"], "naive_sensitivity_runs": n,
                     "prefix_size": prefix, "verified": result.meets_tolerance, "minimal": result.minimal})
    header = ("case", "mode", "n", "k", "search_tests", "target_runs", "naive_sensitivity_runs", "prefix_size",
              "verified", "minimal")
    print("  ".join(f"{h:>22}" if i == 0 else f"{h:>12}" for i, h in enumerate(header)))
    for row in rows:
        print("  ".join(f"{row[h]!s:>22}" if i == 0 else f"{row[h]!s:>12}" for i, h in enumerate(header)))
    print("\nsearch_tests: candidates the search evaluated (incl. baseline, all-lowered, prefix bisection and the "
          "single-node checks); target_runs adds the layerwise evidence run.\nnaive sensitivity = n runs "
          "(one per node, lowered alone) and finds only nodes that break the tolerance alone; prefix_size = "
          "nodes Polygraphy's prefix bisection keeps in FP32.")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
