"""graphbisect `reduce --target iree` against Polygraphy `debug reduce` with an IREE check, on real IREE bugs.

Cases (graphbisect/examples/iree_bugs.py, each a public IREE report embedded in a 20–25-node residual CNN):
``unique`` (iree-org/iree#24230, iree-compile SIGSEGV), ``maxunpool`` (nod-ai/AMD-SHARK-ModelDev#718, compile
error), ``gridsample`` (iree-org/iree#24378, wrong result). The target is IREE 3.13 on llvm-cpu (host CPU),
the oracle ONNX Runtime with optimizations disabled.

* graphbisect: :func:`graphbisect.workflows.reduce.reduce_model` with ``target="iree"``;
* Polygraphy: its documented recipe (``_polygraphy.py``) with ``_pg_check.py --target iree`` as the check; a
  compile failure counts only with the baseline's diagnostic (``--expect-message``, the op that failed), so
  neither tool may drift to another compiler error. ``bisect`` then ``linear`` on bisect's result.

Columns: **target runs** (graphbisect: every target invocation, baselines and re-verification included;
Polygraphy: every check run during ``debug reduce``; each is one IREE import + compile, about a second),
**wall s**, **start** (nodes each tool reduced), **final**, **kept** (the final nodes).

Run: ``python benchmarks/iree_bench.py [--cases unique maxunpool gridsample] [--json PATH]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import describe_machine, print_table, write_json
from _polygraphy import debug_reduce, prepare
from reduce_bench import bisect_then_linear

from graphbisect.examples.iree_bugs import IREE_BUGS, iree_bug_model
from graphbisect.model import load_model
from graphbisect.workflows.reduce import ReduceOptions, reduce_model

CASES = ("unique", "maxunpool", "gridsample")
#: The part of each compile failure's diagnostic that names the bug (what the Polygraphy check must see).
EXPECT_MESSAGE = {"unique": "iree-compile crashed (signal 11)", "maxunpool": "torch.aten.max_unpool2d"}


def run_case(case: str, root: Path, timeout: float) -> list[dict[str, Any]]:
    """One graphbisect row and one Polygraphy (bisect then linear) row for ``case``."""
    model, inputs, truth = iree_bug_model(case)
    nodes = len(model.graph.node)
    started = time.perf_counter()
    result = reduce_model(load_model(model), root / case / "bundle", inputs=inputs,
                          options=ReduceOptions(target="iree"))
    rows = [{"case": case, "upstream": truth.url, "tool": "graphbisect", "start": nodes,
             "target_runs": result.invocations["target"], "wall_s": time.perf_counter() - started,
             "final": len(result.kept_nodes), "kept": list(result.kept_nodes),
             "one_minimal": result.one_minimal, "signature": result.signature.describe()}]
    kind = "mismatch" if truth.kind == "mismatch" else "crash"
    check = ["--target", "iree"] + (["--expect-message", EXPECT_MESSAGE[case]] if case in EXPECT_MESSAGE else [])
    prep = prepare(model, inputs, kind, root / case / "polygraphy", check)
    if not prep.reproduces:
        rows.append({"case": case, "tool": "pg-bisect+linear", "start": prep.folded_nodes,
                     "note": f"the check passes on the sanitized model: {prep.precheck_output[-120:]}"})
        return rows
    run = bisect_then_linear(prep, debug_reduce(prep, "folded.onnx", "bisect", timeout=timeout), timeout)
    rows.append({"case": case, "upstream": truth.url, "tool": "pg-bisect+linear", "start": prep.folded_nodes,
                 "target_runs": run.invocations, "wall_s": prep.seconds + run.seconds,
                 "final": run.final_nodes, "kept": list(run.kept), "note": run.reason or ""})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--pg-timeout", type=float, default=900.0, help="seconds per Polygraphy run")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args(argv)
    unknown = [case for case in args.cases if case not in IREE_BUGS]
    if unknown:
        parser.error(f"unknown case {unknown[0]}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="iree-bench-") as tmp:
        for case in args.cases:
            rows += run_case(case, Path(tmp), args.pg_timeout)
    print_table(f"reduce --target iree vs polygraphy debug reduce ({describe_machine()})",
                ["case", "tool", "target runs", "wall s", "start", "final", "kept / note"],
                [[r["case"], r["tool"], r.get("target_runs", "—"), f"{r['wall_s']:.1f}" if "wall_s" in r else "—",
                  r["start"], r.get("final", "—"), ", ".join(r.get("kept", [])[:4]) or r.get("note", "")]
                 for r in rows], left_last=True)
    write_json(args.json, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
