"""`graphbisect tactics record|replay|diff|isolate`: per-node kernel choices of a target backend.

Exit codes: ``record`` 0; ``replay`` 1 when a forced choice did not take effect; ``diff`` 1 when the
records differ; ``isolate`` 1 when culprit choices were found; 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from graphbisect.backends.cost import describe_calls
from graphbisect.cli.common import (
    EXAMPLES,
    backend_spec,
    count,
    load_model_arg,
    output_file,
    output_path,
    seed,
    tolerance,
)
from graphbisect.cli.terminal import shown
from graphbisect.storage.atomic import atomic_write_text
from graphbisect.text.printable import plural

__all__ = ["add_arguments", "run"]

_DEFAULT_TARGET = "openvino"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tactics_command", metavar="ACTION", required=True)
    record = sub.add_parser("record", help="build the model once and write its tactic record")
    _model_args(record)
    record.add_argument("-o", "--output", type=output_file, required=True, help="record file to write (JSON)")
    replay = sub.add_parser("replay", help="build with a record forced and check every choice took effect")
    _model_args(replay)
    replay.add_argument("record", type=Path, help="tactic record to force")
    diff = sub.add_parser("diff", help="nodes whose kernel choice differs between two records")
    diff.add_argument("a", type=Path, help="first (good) record")
    diff.add_argument("b", type=Path, help="second (bad) record")
    diff.add_argument("--json", type=output_file, metavar="PATH", help="write the diff as JSON")
    isolate = sub.add_parser("isolate", help="the fewest (node, choice) pairs that make a good build bad, "
                             "confirmed by replay")
    _model_args(isolate)
    isolate.add_argument("--good", type=Path, help="record of a good build")
    isolate.add_argument("--bad", type=Path, help="record of a bad build")
    isolate.add_argument("--builds", type=count(0), default=0,
                         help="instead of records: build N times (each compiled anew, nothing pinned unless --perturb) "
                         "and sort the builds by the oracle's verdict")
    isolate.add_argument("--perturb", default="", metavar="IMPL;IMPL",
                         help="with --builds: ask for these implementations on a random half of the nodes "
                         "in every build after the first (e.g. ref_any)")
    isolate.add_argument("--oracle", default=None, type=backend_spec, metavar="SPEC",
                         help="judge builds against this backend; default: the good build's own outputs")
    isolate.add_argument("--max-invocations", type=count(0), default=None, help="backend invocation budget")


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="ONNX model; or --example")
    parser.add_argument("--example", action="store_const", const="bug", default=None,
                        help=f"use {EXAMPLES['bug']} instead of MODEL")
    parser.add_argument("--target", default=_DEFAULT_TARGET, type=backend_spec, metavar="SPEC",
                        help=f"backend with the tactics capability (default {_DEFAULT_TARGET})")
    parser.add_argument("--inputs", type=Path, metavar="FILE", help="model inputs (default: seeded random)")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                        help="shape for an input with dynamic dims (repeatable)")
    parser.add_argument("--seed", type=seed, default=0, help="seed for random inputs (default 0)")
    parser.add_argument("--atol", type=tolerance, default=None,
                        help="absolute tolerance (default: 1e-4 with --oracle, else 0: bit-exact)")
    parser.add_argument("--rtol", type=tolerance, default=None,
                        help="relative tolerance (default: 1e-3 with --oracle, else 0: bit-exact)")
    parser.add_argument("--workdir", type=output_path, default=None, help="keep the builds' files here")
    parser.add_argument("--json", type=output_file, metavar="PATH", help="write the result as JSON")


def run(args: argparse.Namespace) -> int:
    handler = {"record": _record, "replay": _replay, "diff": _diff, "isolate": _isolate}[args.tactics_command]
    return handler(args)


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    from graphbisect.data import load_inputs, parse_shapes, random_inputs

    model = load_model_arg(args)  # the model, or --example's (with its inputs)
    feeds = load_inputs(args.inputs, model) if args.inputs else random_inputs(
        model, shapes=parse_shapes(args.shape), seed=args.seed)
    return model, feeds


def _tolerance(args: argparse.Namespace, oracle: str | None) -> Any:
    from graphbisect.compare import Tolerance

    default_atol, default_rtol = (1e-4, 1e-3) if oracle else (0.0, 0.0)
    atol = default_atol if args.atol is None else args.atol
    rtol = default_rtol if args.rtol is None else args.rtol
    return Tolerance(atol=atol, rtol=rtol)


def _write_json(path: Path | None, data: object) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def _record(args: argparse.Namespace) -> int:
    from graphbisect.tactics import save_record
    from graphbisect.workflows.tactics import record_tactics

    model, feeds = _load(args)
    result = record_tactics(model, args.target, inputs=feeds, workdir=args.workdir)
    save_record(result.record, args.output)
    rec = result.record
    print(f"recorded {len(rec.choices)} kernel choices of {rec.backend} {rec.version} on {rec.device} -> {args.output}")
    for choice in rec.choices:
        print(f"  {shown(choice.node):40s} {choice.choice:24s} {choice.layer_type or ''}")
    print(f"invocations: {describe_calls(result.invocations, result.backend_calls)}")
    _write_json(args.json, {"record": str(args.output), "choices": len(rec.choices),
                            "invocations": result.invocations, "backend_calls": result.backend_calls})
    return 0


def _replay(args: argparse.Namespace) -> int:
    from graphbisect.tactics import load_record
    from graphbisect.workflows.tactics import replay_tactics

    model, feeds = _load(args)
    result = replay_tactics(model, args.target, load_record(args.record), inputs=feeds, workdir=args.workdir)
    # a record of another model (the whole one, replayed on a reduction) names nodes this one lacks: those
    # are skipped, and counting them said more choices were replayed than were asked of this build
    names = {node.name for node in model.nodes}
    count = sum(1 for choice in result.requested.choices if choice.node in names)
    skipped = len(result.requested.choices) - count
    if skipped:
        print(f"{plural(skipped, 'choice')} of the record name nodes this model does not have: not replayed")
    if not result.run.ok:
        print(f"replaying {plural(count, 'choice')}: the build {result.run.describe()}")
    elif result.not_applied:
        missed = len(result.not_applied)
        print(f"replayed {plural(count, 'choice')}: the build ran, but {plural(missed, 'choice')} "
              f"{'was' if missed == 1 else 'were'} NOT APPLIED "
              "(the backend silently used another kernel):")
    else:
        print(f"replayed {plural(count, 'choice')}: every choice took effect")
    for item in result.not_applied:
        print(f"  NOT APPLIED {shown(item.node)}: asked for {item.requested}, the backend used {item.used}")
    print(f"invocations: {describe_calls(result.invocations, result.backend_calls)}")
    _write_json(args.json, result.to_json())
    return 1 if result.not_applied else 0


def _diff(args: argparse.Namespace) -> int:
    from graphbisect.tactics import diff_records, load_record

    diff = diff_records(load_record(args.a), load_record(args.b))
    for change in diff.changed:
        print(f"  {shown(change.node):40s} {change.good:24s} -> {change.bad}")
    for node in diff.only_a:
        print(f"  {shown(node):40s} only in {args.a}")
    for node in diff.only_b:
        print(f"  {shown(node):40s} only in {args.b}")
    print(f"{plural(len(diff.changed), 'node')} with another kernel")
    _write_json(args.json, diff.to_json())
    return 0 if diff.empty else 1


def _isolate(args: argparse.Namespace) -> int:
    from graphbisect.errors import InputError
    from graphbisect.tactics import load_record
    from graphbisect.workflows.tactics import isolate_tactics

    if (args.good is None) != (args.bad is None):
        raise InputError("give both --good and --bad, or neither (with --builds N)",
                         hint="e.g. --good a.json --bad b.json")
    model, feeds = _load(args)
    result = isolate_tactics(
        model, args.target, good=load_record(args.good) if args.good else None,
        bad=load_record(args.bad) if args.bad else None, builds=args.builds,
        perturb=[p for p in args.perturb.split(";") if p], oracle=args.oracle,
        tolerance=_tolerance(args, args.oracle), inputs=feeds, workdir=args.workdir,
        max_invocations=args.max_invocations,
    )
    data = result.to_json()
    print(f"{plural(result.differing, 'differing choice')}; {result.isolation.verdict}", file=sys.stdout)
    not_applied = {n.node: n.used for group in result.not_applied.values() for n in group}
    for culprit in result.isolation.culprits:
        used = not_applied.get(culprit.node)
        fallback = f" (not applied: the backend used {used})" if used else ""
        print(f"  CULPRIT {shown(culprit.node)}: {culprit.good} (good) -> {culprit.bad} (bad){fallback}")
    print(f"invocations: {describe_calls(result.invocations, result.backend_calls)}; {result.seconds:.1f} s")
    _write_json(args.json, data)
    return 1 if result.found else 0
