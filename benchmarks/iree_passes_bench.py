"""`passes --target iree` against one plain `compare`, compiles counted, before/after in one run.

Two IREE bugs from ``graphbisect/examples/iree_bugs.py``, each embedded after the first of ``--blocks`` residual
blocks of a CNN (37 blocks: 156 nodes): ``gridsample`` (iree-org/iree#24378, a GridSample kernel that rounds
x.5 away from zero: a wrong result **no pass explains**) and ``f64-output`` (iree-org/iree#24180: the default
f64→f32 demotion leaves an undersized result buffer, **explained** by the ``demote-f64-to-f32`` feature).
Oracle ``onnx.reference``, target IREE on llvm-cpu (host CPU), the compile cache on (the default).

Each graphbisect tree given by ``--tree LABEL=PATH`` (default: this checkout as ``after``) runs, per case and
in turn (so a load change hits every tree alike): ``graphbisect compare`` (the reference time, layerwise probe
included, as a user runs it), then ``graphbisect passes``, both as the CLI in a fresh interpreter with that tree
first on ``PYTHONPATH``. Columns: the command's **wall** seconds; the target's **runs**, **compiles** and
**cached** compiles (``backend_calls`` in its ``--json``); **× compare** (passes wall over that tree's compare
wall on the same case); **CPU s** (user + system seconds of compare / passes and every process they waited
for: on a shared machine a command with more threads gets more of the cores, so wall times there favour the
parallel listing; CPU seconds do not) and **CPU ×**; the **answer** (the culprits, or "no set of passes explains
it") and where the fired list came from (``source``).

Before/after: ``git worktree add ../before COMMIT`` and
``python benchmarks/iree_passes_bench.py --tree before=../before --tree after=.``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from _common import add_size_args, describe_machine, print_table, write_json

from graphbisect.examples.iree_bugs import iree_bug_model

CASES = ("gridsample", "f64-output")


def _cli(tree: Path, args: Sequence[str], report: Path, timeout: float) -> tuple[float, float, dict[str, Any]]:
    """Run ``graphbisect ARGS --json REPORT`` with ``tree`` first on the path: its wall seconds, the CPU seconds
    of it and every process it waited for (workers, ``iree-compile``), and its JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    # run in the tree: ``python -m`` puts the working folder before PYTHONPATH
    done = subprocess.run([sys.executable, "-m", "graphbisect", *args, "--json", str(report)], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"graphbisect {args[0]} in {tree} exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(report.read_text())


def _answer(report: dict[str, Any]) -> str:
    if report.get("culprits"):
        return "disable " + ", ".join(report["culprits"])
    if any("no set of passes explains" in note for note in report.get("notes", [])):
        return "no set of passes explains it"
    return "none found"


def run_case(case: str, blocks: int, trees: dict[str, Path], root: Path, timeout: float) -> list[dict[str, Any]]:
    model, inputs, truth = iree_bug_model(case, blocks=blocks)
    path, feeds = root / f"{case}.onnx", root / f"{case}.npz"
    onnx.save(model, path)
    np.savez(feeds, **inputs)
    common = [str(path), "--inputs", str(feeds), "--target", "iree", "--oracle", "reference"]
    rows = []
    for label, tree in trees.items():
        compare_s, compare_cpu, _ = _cli(tree, ["compare", *common], root / f"{case}-{label}-compare.json", timeout)
        passes_s, passes_cpu, report = _cli(tree, ["passes", *common], root / f"{case}-{label}-passes.json", timeout)
        target = report["backend_calls"]["target"]
        rows.append({"case": case, "nodes": len(model.graph.node), "tree": label, "compare_s": compare_s,
                     "passes_s": passes_s, "ratio": passes_s / compare_s, "compare_cpu_s": compare_cpu,
                     "passes_cpu_s": passes_cpu, "cpu_ratio": passes_cpu / compare_cpu, "runs": target["runs"],
                     "compiles": target["compiles"], "cached": target["compile_cache_hits"],
                     "answer": _answer(report), "source": report["source"], "fired": report["fired"],
                     "truth": truth.url})
        print(f"{case} {label}: compare {compare_s:.1f} s, passes {passes_s:.1f} s", file=sys.stderr)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_args(parser)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--blocks", type=int, default=None, help="residual blocks of the host (37: 156 nodes)")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="a graphbisect checkout to time (repeatable; default: after=this checkout)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per command")
    args = parser.parse_args(argv)
    trees = {}
    for item in args.tree or [f"after={Path(__file__).resolve().parent.parent}"]:
        label, sep, where = item.partition("=")
        if not sep or not (Path(where) / "graphbisect" / "__init__.py").is_file():
            parser.error(f"--tree {item!r}: write LABEL=PATH, PATH a graphbisect checkout")
        trees[label] = Path(where).resolve()
    for label, tree in trees.items():  # each tree's own graphbisect runs, nothing else on the path
        found = subprocess.run([sys.executable, "-c", "import graphbisect; print(graphbisect.__file__)"], cwd=tree,
                               capture_output=True, text=True, check=True).stdout.strip()
        if Path(found).resolve().parent.parent != tree:
            parser.error(f"--tree {label}: python there imports {found}, not {tree}")
    blocks = args.blocks or (1 if args.quick else 37)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="iree-passes-bench-") as tmp:
        for case in args.cases:
            rows += run_case(case, blocks, trees, Path(tmp), args.timeout)
    print_table(f"passes --target iree --oracle reference vs one compare, {blocks} blocks ({describe_machine()})",
                ["case", "nodes", "tree", "compare s", "passes s", "× compare", "CPU s (c/p)", "CPU ×", "runs",
                 "compiles", "cached", "answer", "fired"],
                [[r["case"], r["nodes"], r["tree"], f"{r['compare_s']:.1f}", f"{r['passes_s']:.1f}",
                  f"{r['ratio']:.1f}", f"{r['compare_cpu_s']:.0f}/{r['passes_cpu_s']:.0f}", f"{r['cpu_ratio']:.1f}",
                  r["runs"], r["compiles"], r["cached"], r["answer"],
                  f"{', '.join(r['fired']) or '—'} ({r['source']})"] for r in rows], left=3, left_last=True)
    write_json(args.json, {"blocks": blocks, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
