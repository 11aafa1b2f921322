"""graphbisect `reduce` against Polygraphy `debug reduce` (bisect, linear, bisect then linear), same models and bugs.

Every case is a :func:`graphbisect.examples.host_network` with a real ONNX Runtime bug and known ground
truth: the LayerNormFusion bug (``layernorm_keepdims0``) on the main path, on a parallel branch, masked by a
later node, or at two distant sites that are only together enough to flip the ``label`` output; and the
float64 ReLU→Clip fusion crash (``relu_clip_f64``) on the main path and on a branch. The target is ONNX
Runtime with all optimizations, the oracle ONNX Runtime with none (graphbisect's defaults).

* graphbisect: :func:`graphbisect.workflows.reduce.reduce_model` with default options;
* Polygraphy: its documented recipe (see ``_polygraphy.py``), with ``_pg_check.py`` as the ``--check``.

Columns: **target runs** (graphbisect: all target runs, including its baseline run(s) of the original model,
one layerwise-evidence run and three re-verifications; a candidate its build decides is compiled, not run: every
candidate of a crash at load, and a wrong result's candidates whose build compiled the failing region otherwise;
Polygraphy: every ``--check`` run during ``debug reduce``, not counting our one check of the folded model before
it), **compiles** (graphbisect: the target's builds behind those runs and the compile-only candidates),
**wall s** (graphbisect: load + reduce, including its oracle capture; Polygraphy: sanitize + golden values + merge +
reduce),
**start** (nodes the tool reduced: Polygraphy works on the constant-folded model), **final** (nodes in the
result), **1-min** (checked the same way for every tool by ``_minimality.py``: the result, mapped back to the
original model by node name, must fail with the original signature, and no single node may be removable),
**core** (the result keeps every node of :attr:`HostNetwork.core_nodes`, which every minimal reduction of
the *original* failure keeps), **extra** (result nodes outside the bug pattern and its support nodes).

Polygraphy's linear mode runs about two checks per node (~0.3 s each here: 1–2 minutes per 200-node case), so
from scratch it runs only on models of at most ``--linear-max-nodes`` nodes: none by default (to keep the
default run near five minutes), 200 with ``--full``; the rows it skips say so. Bisect then linear always runs.

Run: ``python benchmarks/reduce_bench.py [--quick | --full] [--cases main branch ...] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import add_size_args, describe_machine, print_table, write_json
from _minimality import Minimality, MinimalityChecker
from _polygraphy import PolygraphyPrep, PolygraphyRun, debug_reduce, prepare

from graphbisect.data import ActivationStore
from graphbisect.engine.cache import decode_key
from graphbisect.examples import HostNetwork, host_network
from graphbisect.model import load_model
from graphbisect.oracle.identity import Identity
from graphbisect.storage.values import load_values_npz
from graphbisect.strategies.subgraph import SubgraphSpace
from graphbisect.workflows.reduce import ReduceOptions, ReduceResult, reduce_model

CASES: dict[str, tuple[str, str]] = {
    "main": ("layernorm_keepdims0", "main"),
    "branch": ("layernorm_keepdims0", "branch"),
    "masked": ("layernorm_keepdims0", "masked"),
    "two-distant": ("layernorm_keepdims0", "two-distant"),
    "crash-main": ("relu_clip_f64", "main"),
    "crash-branch": ("relu_clip_f64", "branch"),
}
TOOLS = ("graphbisect", "pg-bisect", "pg-linear", "pg-bisect+linear")


@dataclass
class Row:
    """One (case, tool) line of the table."""

    case: str
    nodes: int
    tool: str
    start: int | None = None
    invocations: int | None = None
    wall_s: float | None = None
    kept: tuple[str, ...] | None = None
    minimality: Minimality | None = None
    contains_core: bool | None = None
    extra: int | None = None
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    compiles: int | None = None  # graphbisect: the target's builds (ONNX Runtime sessions) behind its runs
    runs_by_part: dict[str, int] | None = None  # graphbisect: see runs_by_part()

    def judge(self, host: HostNetwork, checker: MinimalityChecker) -> None:
        """Fill the ground-truth columns and the minimality check from ``kept``."""
        if self.kept is None:
            return
        self.contains_core = set(host.core_nodes) <= set(self.kept)
        self.extra = len(set(self.kept) - set(host.culprit_nodes) - set(host.support_nodes))
        self.minimality = checker.check(self.kept)
        found = self.minimality
        if found.removable:
            self.note = _join(self.note, f"removable: {found.removable}")
        elif found.reason:
            self.note = _join(self.note, found.reason)

    def cells(self) -> list[str]:
        def opt(value: object, fmt: str = "{}") -> str:
            return "-" if value is None else fmt.format(value)

        final = None if self.kept is None else len(self.kept)
        core = None if self.contains_core is None else "yes" if self.contains_core else "no"
        minimal = self.minimality.cell() if self.minimality else "-"
        parts = self.runs_by_part
        split = "-" if parts is None else f"{parts['outside']}+{parts['search']} ({parts['same_model']})"
        return [self.case, str(self.nodes), self.tool, opt(self.start), opt(self.invocations), split,
                "-" if parts is None else str(parts["floor"]), opt(self.compiles),
                opt(self.wall_s, "{:.1f}"), opt(final), minimal, opt(core), opt(self.extra), _short(self.note)]

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "nodes": self.nodes, "tool": self.tool, "start_nodes": self.start,
                "target_invocations": self.invocations, "target_compiles": self.compiles, "wall_s": self.wall_s,
                "final_nodes": None if self.kept is None else len(self.kept), "kept": self.kept,
                "minimality": self.minimality.to_json() if self.minimality else None,
                "contains_core": self.contains_core, "extra_nodes": self.extra, "note": self.note, **self.details}


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# ------------------------------------------------------------------------------------------------ tools


def run_graphbisect(host: HostNetwork, case: str, nodes: int, folder: Path) -> tuple[Row, ReduceResult]:
    """``reduce_model`` with default options (work folder kept: the minimality check reuses its store)."""
    started = time.perf_counter()
    model = load_model(host.model)
    result = reduce_model(model, folder / "bundle", inputs=host.inputs, options=ReduceOptions(keep_work=True))
    row = Row(case, nodes, "graphbisect", nodes, result.invocations["target"], time.perf_counter() - started,
              result.kept_nodes if result.failed else None)
    row.compiles = result.backend_calls.get("target", {}).get("compiles")
    row.runs_by_part = runs_by_part(result, model.node_names)
    row.details = {"runs_by_part": row.runs_by_part,
                   "oracle_invocations": result.invocations["oracle"], "claims_one_minimal": result.one_minimal,
                   "verified": result.verified, "notes": list(result.notes)}
    if not result.failed:
        row.note = "the original model did not fail"
    return row, result


def runs_by_part(result: ReduceResult, node_names: Sequence[str]) -> dict[str, int]:
    """Where graphbisect's target runs went, from its work folder: ``outside`` the search (the original's
    runs, the layerwise probe, the re-verifications), the ``search``'s, of which ``accept`` ran the result
    itself and ``proof`` its single-node removals; ``floor`` is what the guarantees cost this answer at
    least: ``outside`` + ``accept`` + ``proof`` (a 1-minimal claim rests on one test per removal: a run, or a build
    that compiled the failing region otherwise, which costs no run)."""
    state = json.loads((result.work_dir / "run.json").read_text())
    outside = state["calls_outside_searches"].get("target", {}).get("runs", 0)
    index = dict(zip(node_names, range(len(node_names)), strict=True))
    final = frozenset(index[name] for name in result.kept_nodes)
    search = accept = proof = 0
    for line in (result.work_dir / "journal.jsonl").read_text().splitlines()[1:]:
        entry = json.loads(line)
        if not entry.get("invoked") or not isinstance(entry.get("detail"), dict):
            continue
        runs = entry["detail"].get("cost", {}).get("runs", 0)
        keep = decode_key(entry["key"])
        search += runs
        accept += runs if keep == final else 0
        proof += runs if keep < final and len(final - keep) == 1 else 0
    return {"outside": outside, "search": search, "accept": accept, "proof": proof,
            "floor": outside + accept + proof, "same_model": repeated_models(result.work_dir)}


def repeated_models(work: Path) -> int:
    """How many of the search's run candidates were a model (sha256 of the candidate as run) an earlier one of
    the same reduction already was: the runs a cache by model content would have saved."""
    model, store = load_model(work / "model.onnx"), ActivationStore.open(work / "activations")
    feeds = load_values_npz(work / "inputs.npz")
    space = SubgraphSpace(model, lambda name: feeds[name] if name in feeds else store.get(name),
                          work / "digests", store=store)
    seen: set[str] = set()
    repeated = 0
    for line in (work / "journal.jsonl").read_text().splitlines()[1:]:
        entry = json.loads(line)
        if entry.get("invoked") and "outcome" in entry:
            digest = space.materialize(decode_key(entry["key"])).digest
            repeated += digest in seen
            seen.add(digest)
    return repeated


def polygraphy_row(case: str, nodes: int, prep: PolygraphyPrep, run: PolygraphyRun) -> Row:
    row = Row(case, nodes, f"pg-{run.mode}", prep.folded_nodes, run.invocations, prep.seconds + run.seconds,
              run.kept if run.ok else None, note=run.reason or "")
    row.details = {"prep_s": prep.seconds, "reduce_s": run.seconds,
                   "parts": [{"mode": p.mode, "invocations": p.invocations, "seconds": p.seconds,
                              "final_nodes": p.final_nodes, "reason": p.reason} for p in run.parts]}
    return row


def run_polygraphy(case: str, nodes: int, prep: PolygraphyPrep, tools: Sequence[str], args: argparse.Namespace
                   ) -> list[Row]:
    """The Polygraphy rows of one case, in ``TOOLS`` order."""
    if not prep.reproduces:
        reason = f"the check passes on the sanitized model ({prep.precheck_output[-80:]})"
        return [Row(case, nodes, tool, prep.folded_nodes, note=reason) for tool in tools if tool != "graphbisect"]
    rows, bisect = [], None
    if "pg-bisect" in tools or "pg-bisect+linear" in tools:
        bisect = debug_reduce(prep, "folded.onnx", "bisect", timeout=args.pg_timeout)
    if "pg-bisect" in tools:
        assert bisect is not None
        rows.append(polygraphy_row(case, nodes, prep, bisect))
    if "pg-linear" in tools:
        rows.append(linear_row(case, nodes, prep, args))
    if "pg-bisect+linear" in tools:
        assert bisect is not None
        rows.append(polygraphy_row(case, nodes, prep, bisect_then_linear(prep, bisect, args.pg_timeout)))
    return rows


def linear_row(case: str, nodes: int, prep: PolygraphyPrep, args: argparse.Namespace) -> Row:
    if nodes > args.linear_max_nodes:
        note = (f"not run: ~2 checks per node (~{2 * prep.folded_nodes} here); see --linear-max-nodes, --full")
        return Row(case, nodes, "pg-linear", prep.folded_nodes, note=note)
    return polygraphy_row(case, nodes, prep, debug_reduce(prep, "folded.onnx", "linear", timeout=args.pg_timeout))


def bisect_then_linear(prep: PolygraphyPrep, bisect: PolygraphyRun, timeout: float | None) -> PolygraphyRun:
    """``--mode linear`` on bisect's result, as Polygraphy's docs recommend; costs and time add up."""
    if not bisect.ok or bisect.output is None:
        return PolygraphyRun("bisect+linear", False, bisect.invocations, bisect.seconds,
                             reason="bisect failed (see pg-bisect)", parts=(bisect,))
    linear = debug_reduce(prep, bisect.output.name, "linear", timeout=timeout)
    reason = None if linear.ok else f"linear failed: {linear.reason}"
    return PolygraphyRun("bisect+linear", linear.ok, bisect.invocations + linear.invocations,
                         bisect.seconds + linear.seconds, linear.kept, reason, linear.output, (bisect, linear))


# ------------------------------------------------------------------------------------------------- cases


def run_case(case: str, nodes: int, tools: Sequence[str], root: Path, args: argparse.Namespace) -> list[Row]:
    """Every tool on one case, each result checked against the ground truth and for 1-minimality."""
    bug, position = CASES[case]
    host = host_network(nodes, bug=bug, position=position)
    folder = root / f"{case}-{nodes}"
    gb_row, result = run_graphbisect(host, case, nodes, folder / "graphbisect")
    rows = [gb_row] if "graphbisect" in tools else []
    if any(tool != "graphbisect" for tool in tools):  # `--tools graphbisect` needs no Polygraphy installed
        prep = prepare(host.model, host.inputs, host.kind, folder / "polygraphy")
        rows += run_polygraphy(case, nodes, prep, tools, args)
    report = json.loads((folder / "graphbisect" / "bundle" / "report.json").read_text())
    checker = MinimalityChecker(load_model(host.model), host.inputs, result.work_dir / "activations",
                                result.signature, folder / "check",
                                identity=Identity.from_json(report.get("identity")))
    try:
        for row in rows:
            row.judge(host, checker)
    finally:
        checker.close()
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


HEADER = ["case", "nodes", "tool", "start", "target runs", "outside+search", "floor", "compiles", "wall s", "final",
          "1-min", "core", "extra",
          "note"]
NOTES = (
    "target runs: graphbisect counts every target run (the original model: 1, or 4 agreeing runs of a crash; the "
    "layerwise probe; the search's candidates, except those only built: of a crash at load, or whose build "
    "compiled the failing region otherwise; 3 fresh re-verifications); Polygraphy counts its --check runs (each a "
    "build and a run).",
    "outside+search: graphbisect's target runs outside its search (the original's runs, the layerwise probe, "
    "the re-verifications) + the search's (in brackets: its runs of a model an earlier candidate already was, "
    "by sha256); floor: the fewest runs the guarantees allow this answer: the runs "
    "outside the search + the run that accepted the result + one per single-node removal its build did not decide "
    "(the 1-minimal proof).",
    "compiles: graphbisect's target builds (ONNX Runtime sessions) behind its runs and compile-only candidates.",
    "start: nodes the tool reduced (Polygraphy reduces the model after `surgeon sanitize --fold-constants`).",
    "1-min: checked for every tool with graphbisect's CandidateTester: the result fails with the original "
    "signature and no single node can be removed (oracle values fed at cuts); n/a: not applicable (see note).",
    "core: keeps every node each minimal reduction keeps; extra: kept nodes outside the bug pattern + support.",
    "fallback inference: the ONNX Runtime run (default session options: all optimizations) Polygraphy uses to "
    "compute the values of branches it freezes.",
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_args(parser)
    parser.add_argument("--sizes", type=int, nargs="+", help="host sizes (default 200 1000; --full adds 2000)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), help="default: all")
    parser.add_argument("--tools", nargs="+", choices=TOOLS, help="default: all")
    parser.add_argument("--linear-max-nodes", type=int, help="run Polygraphy linear from scratch only up to this "
                        "many nodes (default 0; 200 with --full)")
    parser.add_argument("--pg-timeout", type=float, default=1800.0, help="seconds per `debug reduce` (default 1800)")
    parser.add_argument("--keep", action="store_true", help="keep the work folders (printed)")
    args = parser.parse_args(argv)
    if args.linear_max_nodes is None:
        args.linear_max_nodes = 200 if args.full else 0
    return args


def plan(args: argparse.Namespace) -> tuple[list[int], list[str], list[str]]:
    """Sizes, cases and tools of this run."""
    sizes = args.sizes or ([200] if args.quick else [200, 1000, 2000] if args.full else [200, 1000])
    cases = args.cases or (["main", "branch", "crash-main"] if args.quick else list(CASES))
    tools = args.tools or [t for t in TOOLS if not (args.quick and t == "pg-linear")]
    return sizes, cases, tools


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes, cases, tools = plan(args)
    root = Path(tempfile.mkdtemp(prefix="reduce-bench-"))
    rows: list[Row] = []
    started = time.perf_counter()
    for nodes in sizes:
        for case in cases:
            rows += run_case(case, nodes, tools, root, args)
            print(f"[{time.perf_counter() - started:6.0f} s] {case}-{nodes} done", file=sys.stderr, flush=True)
    if args.keep:
        print(f"work folders kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    print(f"reduce: graphbisect vs polygraphy debug reduce ({describe_machine()})")
    print_table("Reduction of host networks with real ONNX Runtime bugs", HEADER, [r.cells() for r in rows],
                left=3, left_last=True, notes=NOTES)
    write_json(args.json, {"benchmark": "reduce", "sizes": sizes, "cases": cases, "tools": tools,
                           "linear_max_nodes": args.linear_max_nodes, "rows": [r.to_json() for r in rows],
                           "seconds": time.perf_counter() - started})
    return 0


if __name__ == "__main__":
    sys.exit(main())
