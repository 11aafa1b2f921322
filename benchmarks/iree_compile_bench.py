"""A compile-bound reduction: a real IREE compile failure in a ≥ 150-node model, with compiles counted.

Cases (``graphbisect/examples/iree_bugs.py``, each a public IREE 3.13 report embedded after the first of
``--blocks`` residual blocks of a CNN: 36 blocks → 154–157 nodes): ``maxunpool`` (nod-ai/AMD-SHARK-ModelDev#718,
``torch.aten.max_unpool2d`` has no lowering: an ``iree-compile`` diagnostic) and ``unique`` (iree-org/iree#24230,
``iree-compile`` SIGSEGV). Nothing is injected into IREE: the compiler really rejects or crashes on the model.
``yolov8n`` (with ``--yolov8n PATH``) is a whole real model: Ultralytics YOLOv8n exported with dynamic batch,
height and width (``make_yolov8n.py``, 321 nodes), which IREE 3.13 fails to compile
(``'iree_codegen.workgroup_count_hint' op failed to resolve workgroup count hint``, issue 27); it is run at
1x3x640x640 with uniform [0, 1) inputs (seed 0).
Target IREE on llvm-cpu (host CPU), oracle ONNX Runtime with optimizations disabled.

Rows, one invocation, per case (**before/after in one run**):

* ``graphbisect before``: ``GRAPHBISECT_COMPILE_ONLY=off`` (each candidate compiled *and run*, as before
  issue 27) and ``GRAPHBISECT_COMPILE_CACHE=off``;
* ``graphbisect``: candidates of a failure at compile are compiled alone (the default), no compile cache;
* ``graphbisect +cache``: the same with the IREE compile cache on (a fresh folder per case);
* ``pg bisect+linear``: ``polygraphy debug reduce`` (bisect, then linear on bisect's result, its documented
  recipe) with ``_pg_check.py --target iree --expect-message`` as the check (the baseline's diagnostic).

Columns: **start/final** nodes; **target runs** (graphbisect: runs of a compiled model, baseline and
re-verification included; Polygraphy: check calls, each an import + ``iree-compile`` + run); **compiles** (the
target's ``iree-compile`` invocations, from reduce's ``backend_calls``; Polygraphy: one per check); **cached**
(compiles served by the compile cache); **facts** (backend runs of the report's facts for maintainers, every
role: ``report_runs``, apart); **wall s** (the whole command); **1-min** (graphbisect: its own certified claim;
Polygraphy: an independent single-node-removal sweep with graphbisect's tester on IREE, ``_minimality.py``);
**same error** (the final model file each tool wrote, compiled again: does it fail with the original model's
diagnostic, names removed).

``--passes`` also times ``passes --target iree`` once on the ``f64-output`` host at the same size (the issue's
goal: ≤ 60 s on a 155-node model), with its runs, compiles and cache hits; ``--only-passes`` times just that
(``--blocks 37``: 156 nodes).

Run: ``python benchmarks/iree_compile_bench.py [--quick] [--cases maxunpool unique yolov8n] [--blocks 36]
[--yolov8n PATH] [--configs before compile-only cache] [--no-polygraphy] [--passes | --only-passes] [--json PATH]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from _common import add_size_args, describe_machine, print_table, write_json
from _minimality import MinimalityChecker
from _polygraphy import debug_reduce, prepare
from reduce_bench import bisect_then_linear

from graphbisect.backends import BackendProcess
from graphbisect.backends.iree import CACHE_ENV
from graphbisect.backends.process import compile_cache
from graphbisect.examples.iree_bugs import iree_bug_model
from graphbisect.model import load_model
from graphbisect.oracle.signature import ModelNames, Signature, signature_of
from graphbisect.oracle.tester import COMPILE_ONLY_ENV
from graphbisect.workflows.passes import PassesOptions, find_culprit_passes
from graphbisect.workflows.reduce import ReduceOptions, ReduceResult, reduce_model, work_dir_for

CASES = ("maxunpool", "unique", "yolov8n")
#: The part of each diagnostic that names the bug (what the Polygraphy check must see).
EXPECT_MESSAGE = {"unique": "iree-compile crashed (signal 11)", "maxunpool": "torch.aten.max_unpool2d",
                  "yolov8n": "failed to resolve workgroup count hint"}
#: row label -> (GRAPHBISECT_COMPILE_ONLY, compile cache on)
CONFIGS = {"before": ("off", False), "compile-only": ("", False), "cache": ("", True)}
LABELS = {"before": "graphbisect before", "compile-only": "graphbisect", "cache": "graphbisect +cache"}


@contextlib.contextmanager
def environment(changes: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``changes`` (an empty value removes the variable), restored after."""
    saved = {key: os.environ.get(key) for key in changes}
    try:
        for key, value in changes.items():
            if value:
                os.environ[key] = value
            else:
                os.environ.pop(key, None)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def same_error(path: Path, baseline: Signature, names: ModelNames, workdir: Path) -> str:
    """``yes`` when the model file at ``path`` fails to compile with ``baseline``'s diagnostic, else what it gives."""
    with environment({CACHE_ENV: "off"}), BackendProcess("iree", workdir=workdir) as proc:
        built = proc.compile(path)
    found = signature_of(built, None, names=names)
    return "yes" if baseline.matches(found) else f"no: {found.describe()[:60]}"


def graphbisect_row(case: str, config: str, model: onnx.ModelProto, inputs: Mapping[str, Any], root: Path
                    ) -> tuple[dict[str, Any], ReduceResult]:
    only, cached = CONFIGS[config]
    folder = root / case / config
    # the cache is this run's own folder (compile_cache): a folder named by the environment is never used
    own = compile_cache(folder / "compile-cache") if cached else contextlib.nullcontext()
    started = time.perf_counter()
    with environment({COMPILE_ONLY_ENV: only, CACHE_ENV: "" if cached else "off"}), own:
        result = reduce_model(load_model(model), folder / "bundle", inputs=inputs,
                              options=ReduceOptions(target="iree", keep_work=True))
    wall = time.perf_counter() - started
    report = json.loads((folder / "bundle" / "report.json").read_text())
    target = result.backend_calls["target"]
    names = ModelNames(model)
    return {"case": case, "tool": LABELS[config], "start": len(model.graph.node), "final": result.final_nodes,
            "kept": list(result.kept_nodes), "target_runs": target["runs"], "compiles": target["compiles"],
            "cached": target["compile_cache_hits"], "facts": sum((report.get("report_runs") or {}).values()),
            "wall_s": wall, "one_minimal": "yes" if result.one_minimal else "no",
            "same_error": same_error(folder / "bundle" / "model.onnx", result.signature, names, folder / "check"),
            "signature": result.signature.describe()}, result


def polygraphy_row(case: str, model: onnx.ModelProto, inputs: Mapping[str, Any], root: Path, *,
                   result: ReduceResult, timeout: float) -> dict[str, Any]:
    """Polygraphy's bisect then linear, its final model checked like graphbisect's."""
    folder = root / case / "polygraphy"
    check = ["--target", "iree", "--expect-message", EXPECT_MESSAGE[case]]
    prep = prepare(model, inputs, "crash", folder, check)
    row: dict[str, Any] = {"case": case, "tool": "pg bisect+linear", "start": prep.folded_nodes}
    if not prep.reproduces:
        return {**row, "note": f"the check passes on the sanitized model: {prep.precheck_output[-120:]}"}
    run = bisect_then_linear(prep, debug_reduce(prep, "folded.onnx", "bisect", timeout=timeout), timeout)
    row.update(target_runs=run.invocations, compiles=run.invocations, cached="—", facts="—",
               wall_s=prep.seconds + run.seconds)
    if not run.ok or run.output is None:
        return {**row, "note": run.reason or "failed"}
    names = ModelNames(model)
    checker = MinimalityChecker(load_model(model), inputs, work_dir_for(root / case / "compile-only" / "bundle")
                                / "activations", result.signature, folder / "minimality", target="iree")
    try:
        minimal = checker.check(run.kept)
    finally:
        checker.close()
    return {**row, "final": run.final_nodes, "kept": list(run.kept), "one_minimal": minimal.cell(),
            "same_error": same_error(run.output, result.signature, names, folder / "check"),
            "minimality": minimal.to_json()}


def passes_row(blocks: int, root: Path) -> dict[str, Any]:
    """``passes --target iree`` once on the f64-output host of the same size (compile cache on, as by default)."""
    model, inputs, truth = iree_bug_model("f64-output", blocks=blocks)
    started = time.perf_counter()
    result = find_culprit_passes(load_model(model), inputs=inputs, workdir=root / "passes",
                                 options=PassesOptions(target="iree"))
    target = result.backend_calls["target"]
    return {"nodes": len(model.graph.node), "culprits": list(result.culprits), "expected": "demote-f64-to-f32",
            "target_runs": target["runs"], "compiles": target["compiles"], "cached": target["compile_cache_hits"],
            "wall_s": time.perf_counter() - started, "truth": truth.url}


def _yolov8n(path: Path) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The exported model and its input at 1x3x640x640 (its dims are dynamic: batch, height, width)."""
    model = onnx.load(str(path))
    (name,) = [i.name for i in model.graph.input]
    return model, {name: np.random.default_rng(0).random((1, 3, 640, 640), dtype=np.float32)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_args(parser)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=None)
    parser.add_argument("--blocks", type=int, default=None, help="residual blocks of the host (36: ≥ 150 nodes)")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--no-polygraphy", action="store_true", help="graphbisect's rows only")
    parser.add_argument("--passes", action="store_true", help="also time passes --target iree once")
    parser.add_argument("--only-passes", action="store_true", help="time passes --target iree once, nothing else")
    parser.add_argument("--pg-timeout", type=float, default=1800.0, help="seconds per Polygraphy run")
    parser.add_argument("--yolov8n", type=Path, help="YOLOv8n with dynamic dims, from make_yolov8n.py (case yolov8n)")
    args = parser.parse_args(argv)
    default = [c for c in CASES if c != "yolov8n" or args.yolov8n is not None]
    cases = [] if args.only_passes else args.cases or (["maxunpool"] if args.quick else default)
    if "yolov8n" in cases and args.yolov8n is None:
        parser.error("case yolov8n needs --yolov8n PATH (made by benchmarks/make_yolov8n.py)")
    blocks = args.blocks or (3 if args.quick else 36)
    if "compile-only" not in args.configs and not args.no_polygraphy:
        parser.error("Polygraphy's 1-minimality check reads the activations of the compile-only row: keep it")
    rows: list[dict[str, Any]] = []
    passes: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="iree-compile-bench-") as tmp:
        root = Path(tmp)
        for case in cases:
            model, inputs = _yolov8n(args.yolov8n) if case == "yolov8n" else iree_bug_model(case, blocks=blocks)[:2]
            results = {}
            for config in args.configs:
                row, results[config] = graphbisect_row(case, config, model, inputs, root)
                rows.append(row)
                print(f"{case} {row['tool']}: {row['wall_s']:.1f} s", file=sys.stderr)
            kept = {tuple(result.kept_nodes) for result in results.values()}
            if len(kept) > 1:
                print(f"WARNING {case}: the configurations kept different nodes: {kept}", file=sys.stderr)
            if not args.no_polygraphy:
                rows.append(polygraphy_row(case, model, inputs, root, result=results["compile-only"],
                                           timeout=args.pg_timeout))
        if args.passes or args.only_passes:
            passes = passes_row(blocks, root)
    if rows:
        print_table(f"reduce --target iree, a real compile failure, {blocks} blocks ({describe_machine()})",
                    ["case", "tool", "start", "final", "target runs", "compiles", "cached", "facts", "wall s", "1-min",
                     "same error"],
                    [[r["case"], r["tool"], r["start"], r.get("final", "—"), r.get("target_runs", "—"),
                      r.get("compiles", "—"), r.get("cached", "—"), r.get("facts", "—"),
                      f"{r['wall_s']:.1f}" if "wall_s" in r else "—", r.get("one_minimal", "—"),
                      r.get("same_error", r.get("note", ""))] for r in rows], left=2, left_last=True,
                    notes=["kept: " + "; ".join(f"{r['case']} {r['tool']}: {', '.join(r.get('kept', [])[:4])}"
                                                for r in rows if r.get("kept"))])
    if passes is not None:
        print_table(f"passes --target iree once (compile cache on; {describe_machine()})",
                    ["nodes", "culprits", "target runs", "compiles", "cached", "wall s"],
                    [[passes["nodes"], ", ".join(passes["culprits"]) or "—", passes["target_runs"],
                      passes["compiles"], passes["cached"], f"{passes['wall_s']:.1f}"]])
    write_json(args.json, {"blocks": blocks, "rows": rows, "passes": passes})
    return 0


if __name__ == "__main__":
    sys.exit(main())
