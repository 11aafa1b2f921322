"""Reduce a failing model in CI and attach the bug-report bundle.

A CI job that tests a model on a new runtime build runs this script: when the target disagrees with the
oracle (or crashes), it reduces the model to a minimal failing subgraph and writes ``OUT.zip`` for the CI
system to keep as an artifact; the exit status fails the job. Example (GitHub Actions):

    - run: python examples/reduce_in_ci.py model.onnx --target 'onnxruntime:opt_level=all' -o bug-report
    - if: failure()
      uses: actions/upload-artifact@v4
      with: {name: bug-report, path: bug-report.zip}

Without a model it uses graphbisect's bundled example (a 200-node network with a real ONNX Runtime bug).
"""

from __future__ import annotations

import argparse
import sys

import graphbisect as gb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="ONNX file or Paddle model folder (default: the bundled example)")
    parser.add_argument("--target", default="onnxruntime:opt_level=all", help="the runtime under test")
    parser.add_argument("--oracle", default="onnxruntime:opt_level=disable", help="the runtime trusted to be right")
    parser.add_argument("-o", "--output", default="bug-report", help="bundle folder; OUTPUT.zip is the artifact")
    parser.add_argument("--max-invocations", type=int, default=200, help="bound the CI time spent reducing")
    args = parser.parse_args()
    if args.model is None:
        from graphbisect.examples.bundled import example_model_path

        args.model = example_model_path()

    # 1. The cheap check every CI run pays: two runs, outputs only.
    found = gb.compare(args.model, oracle=args.oracle, target=args.target, layerwise=False)
    if found.passed:
        print(f"{args.target} agrees with {args.oracle}: nothing to report")
        return 0

    # 2. It fails: reduce it. The budget keeps the job bounded; the best result so far is bundled anyway,
    #    and `graphbisect reduce --resume OUTPUT` continues it later.
    try:
        bug = gb.reduce(args.model, args.output, oracle=args.oracle, target=args.target,
                        max_invocations=args.max_invocations, zip=True, force=True)
    except gb.GraphBisectError as err:  # every error says what is wrong and how to fix it
        print(f"could not reduce: {err}", file=sys.stderr)
        return 2
    print(f"{bug.signature.describe()}: {bug.original_nodes} -> {bug.final_nodes} nodes "
          f"({', '.join(bug.kept_nodes[:8])}), 1-minimal: {bug.one_minimal}")
    print(f"attach {bug.bundle}.zip (report.md, repro.py, repro_min.py inside)")
    return 1  # fail the job: the bug is real and reproduced


if __name__ == "__main__":
    sys.exit(main())
