"""`graphbisect triage`: compare, reduce, ablate passes and bundle every model of a folder; one row per bug."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphbisect.backends.cost import describe_calls
from graphbisect.backends.registry import DEFAULT_ORACLE, DEFAULT_TARGET
from graphbisect.cli.common import (
    backend_spec,
    count,
    executor,
    output_file,
    output_path,
    refuse_inside,
    seconds,
    seed,
    tolerance,
)
from graphbisect.cli.terminal import shown
from graphbisect.text.printable import plural
from graphbisect.triage.outcome import total_calls

if TYPE_CHECKING:
    from graphbisect.triage.outcome import ModelOutcome
    from graphbisect.workflows.triage import TriageResult

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input_dir", type=Path, metavar="INPUT_DIR",
                        help="folder of .onnx files and Paddle model folders (NAME.npz next to a model: its inputs)")
    parser.add_argument("-o", "--output", type=output_path, required=True, metavar="OUT_DIR",
                        help="where bundles/<name>/, results/ and summary.{md,json,html} go; re-running on the "
                        "same folder skips finished models and resumes interrupted ones")
    parser.add_argument("--oracle", default=DEFAULT_ORACLE, type=backend_spec, metavar="SPEC",
                        help=f"backend trusted to be right (default {DEFAULT_ORACLE})")
    parser.add_argument("--target", default=DEFAULT_TARGET, type=backend_spec, metavar="SPEC",
                        help=f"backend under test (default {DEFAULT_TARGET})")
    parser.add_argument("--executor", type=executor, default="local", metavar="local|ray[:ADDRESS]",
                        help="where models are triaged: local worker processes (default), a local Ray instance "
                        "(ray) or a Ray cluster (ray:ADDRESS, e.g. ray:auto); a lost worker's model is retried")
    parser.add_argument("-j", "--jobs", type=count(1), default=None,
                        help="models triaged at once (default: one per CPU; on a Ray cluster, its CPUs)")
    parser.add_argument("--candidate-jobs", type=count(1), default=1,
                        help="target workers evaluating one reduction's candidates (same result as 1)")
    parser.add_argument("--no-passes", action="store_true", help="do not search culprit optimization passes")
    parser.add_argument("--seed", type=seed, default=0, help="seed for random inputs (default 0)")
    parser.add_argument("--atol", type=tolerance, default=1e-4, help="absolute tolerance (default 1e-4)")
    parser.add_argument("--rtol", type=tolerance, default=1e-3, help="relative tolerance (default 1e-3)")
    parser.add_argument("--max-invocations", type=count(0), metavar="N", help="per model: stop each reduction's search "
                        "after N candidate runs (best result so far; a re-run resumes it)")
    parser.add_argument("--timeout", type=seconds, help="seconds one backend invocation may take (default 600)")
    parser.add_argument("--json", type=output_file, metavar="PATH", help="also write summary.json here")


def run(args: argparse.Namespace) -> int:
    from graphbisect.compare import Tolerance
    from graphbisect.executors import ExecutorSpec
    from graphbisect.workflows.triage import TriageOptions, triage

    ExecutorSpec.parse(args.executor)  # a usage error before any work
    refuse_inside({"--json": args.json}, args.output, "the triage folder")
    options = TriageOptions(oracle=args.oracle, target=args.target, tolerance=Tolerance(atol=args.atol, rtol=args.rtol),
                            passes=not args.no_passes, seed=args.seed, candidate_jobs=args.candidate_jobs,
                            max_invocations=args.max_invocations, timeout=args.timeout)
    result = triage(args.input_dir, args.output, options=options, executor=args.executor, jobs=args.jobs,
                    on_model=_print_outcome, on_stage=_print_stage)
    if args.json is not None:
        from graphbisect.storage.atomic import atomic_write_text

        atomic_write_text(args.json, json.dumps(json.loads(result.summary["json"].read_text()), indent=2) + "\n")
    return _report(result)


def _print_stage(line: str) -> None:
    print(f"… {line}", file=sys.stderr, flush=True)


def _print_outcome(outcome: ModelOutcome) -> None:
    calls = _model_calls(outcome)
    checked = _checked(outcome)
    if outcome.status == "failed":
        where = f"{plural(outcome.final_nodes or 0, 'node')} in {outcome.bundle}" if outcome.bundle else "no bundle"
        culprits = f", culprits {', '.join(outcome.culprits)}" if outcome.culprits else ""
        kind = outcome.signature.get("kind") if outcome.signature else "?"
        print(f"{shown(outcome.name)}: FAILED ({kind}{culprits}) → {where}{calls}{checked}", flush=True)
    elif outcome.status == "passed":
        print(f"{shown(outcome.name)}: passed{calls}{checked}", flush=True)
    else:
        print(f"{shown(outcome.name)}: ERROR {outcome.message}" + (f" (hint: {outcome.hint})" if outcome.hint else ""),
              flush=True)


def _checked(outcome: ModelOutcome) -> str:
    """'' where the checker's plain run re-established the verdict, else how it left it (:mod:`graphbisect.
    workflows.triage_claims`)."""
    from graphbisect.workflows.triage_claims import outcome_claim

    claim = outcome_claim(outcome)
    if claim is None:
        return "\n  the verdict is the search's: not checked by plain runs (recorded by an older triage)"
    if claim.get("holds") is True:
        return ""
    verdict = "DOES NOT HOLD" if claim.get("holds") is False else "not established"
    return f"\n  the checker: {verdict}: {claim.get('claim')} — {claim.get('evidence')}"


def _grouping(checked: Mapping[str, Any]) -> str:
    """What a bug's grouping rests on: the members' failures the checker re-established, the search's key."""
    if not checked:
        return "grouped by the search; not checked"
    confirmed = len(checked.get("confirmed") or ())
    others = checked.get("not_confirmed") or []
    failed = [str(m["model"]) for m in others if m.get("holds") is False]
    open_ = [str(m["model"]) for m in others if m.get("holds") is not False]
    text = f"checker: {confirmed} of {confirmed + len(others)} fail this way in a plain run"
    text += f"; DOES NOT HOLD for {', '.join(map(shown, failed))}" if failed else ""
    text += f"; not established for {', '.join(map(shown, open_))}" if open_ else ""
    bundles = {True: "every bundle audited, all claims holding", False: "a bundle's audit found a false claim",
               None: "bundles not all audited"}[checked.get("bundles_audited")]
    return f"{text}; grouped by {checked.get('grouped_by')} ({bundles})"


def _model_calls(outcome: ModelOutcome) -> str:
    """``; invocations: oracle 2 (2 compiles), target 9 (9 compiles)``: one model's steps summed ('' for none)."""
    total = total_calls([outcome])
    return f"; invocations: {total.describe()}" if total.runs() else ""


def _report(result: TriageResult) -> int:
    failed = result.by_status("failed")
    print(f"\n{plural(len(result.outcomes), 'model')} ({len(result.skipped)} finished earlier) on {result.executor} "
          f"in {result.seconds:.1f} s: {plural(len(result.bugs), 'distinct bug')} in "
          f"{plural(len(failed), 'failing model')}, {len(result.by_status('passed'))} passed, "
          f"{plural(len(result.by_status('error')), 'error')}")
    from graphbisect.artifacts.triage_report import signature_cell

    for bug in result.bugs:
        print(f"  bug {bug.key} ×{bug.count}: {signature_cell(bug.signature, bug.lacks)}"
              f"{' [' + ', '.join(bug.culprits) + ']' if bug.culprits else ''} "
              f"{' → '.join(bug.op_types)}; smallest: {bug.smallest_bundle}")
        print(f"    {_grouping(bug.checked)}")
    if failed:
        confirmed = sum((_claim_holds(o) is True) for o in failed)
        print(f"failures re-established by plain runs (the checker): {confirmed} of {len(failed)}; the grouping "
              "into distinct bugs is the search's")
    print(f"invocations: {describe_calls(result.invocations, result.backend_calls)}")
    print(f"summary: {result.summary['md']}")
    return 1 if failed else 0


def _claim_holds(outcome: ModelOutcome) -> bool | None:
    from graphbisect.workflows.triage_claims import outcome_claim

    claim = outcome_claim(outcome)
    return None if claim is None else claim.get("holds")
