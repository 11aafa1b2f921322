"""`graphbisect passes`: which optimization passes cause the failure (and, with -o, the model reduced under them)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from graphbisect.backends.cost import describe_calls
from graphbisect.cli.common import (
    add_model_arguments,
    chosen_for,
    count,
    load_feeds,
    load_model_arg,
    output_file,
    output_path,
    refuse_inside,
    seconds,
    tolerance_from_args,
)
from graphbisect.cli.progress import ProgressLine

if TYPE_CHECKING:
    from graphbisect.workflows.passes import PassesOptions, PassesResult

__all__ = ["add_arguments", "print_passes", "run", "run_passes"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("-o", "--output", type=output_path, metavar="DIR",
                        help="also reduce the model with only the culprit passes enabled and write the bundle to DIR "
                        "(its repro.py also runs a control with the culprits disabled)")
    parser.add_argument("--json", type=output_file, metavar="PATH",
                        help="write fired, culprits (minimal disable-set), required (minimal enable-set), invocations")
    parser.add_argument("--max-invocations", type=count(0), metavar="N", help="stop each search after N target runs")
    parser.add_argument("--strict-band", action="store_true",
                        help="the failure must keep the error's order of magnitude within one decade")
    parser.add_argument("--timeout", type=seconds, help="seconds one backend invocation may take (default 600)")
    parser.add_argument("--workdir", type=output_path, metavar="DIR",
                        help="keep the pass search's files (model, inputs, journal, worker logs) in DIR")


def passes_options(args: argparse.Namespace) -> PassesOptions:
    """The pass-search options of a `passes` or `reduce --passes` command line."""
    from graphbisect.workflows.passes import PassesOptions

    return PassesOptions(oracle=args.oracle, target=args.target, tolerance=tolerance_from_args(args),
                         strict_band=args.strict_band, timeout=args.timeout,
                         max_invocations=getattr(args, "max_invocations", None))


def run_passes(args: argparse.Namespace, progress: ProgressLine) -> tuple[Any, dict[str, Any], PassesResult]:
    """Load the model and inputs of ``args`` and run the pass search; returns (model, feeds, result)."""
    from graphbisect.workflows.passes import find_culprit_passes

    model = load_model_arg(args)
    feeds = load_feeds(args, model)
    result = find_culprit_passes(model, inputs=feeds, options=passes_options(args),
                                 workdir=getattr(args, "workdir", None), on_stage=progress.stage,
                                 on_progress=progress, chosen=chosen_for(args, model))
    return model, feeds, result


def _checked(result: PassesResult, claim_id: str) -> str:
    """`` — the checker: does not hold`` (or ``not established``) after a line stating claim ``claim_id``; ``""``
    when it holds or was not checked."""
    claim = result.claim(claim_id)
    if claim is None or claim.get("holds") is True:
        return ""
    return "  — the checker: " + ("DOES NOT HOLD" if claim.get("holds") is False else "not established")


def print_passes(result: PassesResult) -> None:
    """The pass findings, for people: each statement as the trusted checker found it (``result.audit``)."""
    from graphbisect.artifacts.environment import describe_ran_with
    from graphbisect.workflows.passes import NOT_LISTED, NOT_NEEDED
    from graphbisect.workflows.passes_claims import MINIMALITY

    print(f"failure: {result.signature.describe()}  (target {result.target})"
          + _checked(result, "failure" if result.failed else "no_failure"))
    for role, facts in result.versions.items():
        print(f"{role} ran with {describe_ran_with(facts)}")
    scope = result.scope
    on_region = scope.get("searched_on") == "region"
    if on_region:
        print(f"searched on a {len(scope['region_nodes'])}-node region ({scope['compiled_as']}), confirmed on the "
              f"whole model: {scope['whole_model_target_runs']} whole-model target runs, "
              f"{scope['region_target_runs']} on the region")
    if result.source == NOT_LISTED:
        print("fired passes: not listed (the target does not fail, so no pass was searched)")
    elif result.source == NOT_NEEDED and result.fixed_target:
        print(f"fired passes: not listed (a build per pass: the search ran over all {len(result.searched)} "
              "disable-able passes)")
    elif result.source == NOT_NEEDED:
        print(f"fired passes: not listed (not needed: with all {len(result.searched)} disable-able passes disabled "
              "the failure stays)" + _checked(result, "unexplained"))
    else:
        print(f"fired passes ({len(result.fired)}, {result.source}{' on the region' if on_region else ''}): "
              + ", ".join(result.fired[:20]) + (" …" if len(result.fired) > 20 else ""))
    for name, why in result.excluded.items():
        print(f"  never disabled: {name} ({why})")
    if result.culprits:
        print(f"culprits (minimal set to disable): {', '.join(result.culprits)}" + _checked(result, "disable_minimal"))
        print(f"required (minimal set to enable):  {', '.join(result.required)}"
              + (_checked(result, "reproduces") or _checked(result, "enable_minimal")))
        alone = ", ".join(result.each_alone) or "none"
        print(f"reproduce the failure on their own: {alone}" + _checked(result, "alone"))
        if len(result.culprits) > 1:
            print("  interaction: these passes mask each other; disabling only some of them leaves the failure")
        workaround = _checked(result, "workaround")
        print(f"workaround{' (NOT confirmed)' if workaround else ''}: --target '{result.fixed_target}'{workaround}")
        if result.fixed_flags:
            print(f"  outside graphbisect: {result.fixed_flags}")
        withdrawn = any((claim := result.claim(i)) is not None and claim.get("holds") is not True
                        for i in MINIMALITY)
        print("minimal: " + ("yes (1-minimal, both sets)" if result.minimal else
                             "not claimed: the checker does not confirm it" if withdrawn else "NOT PROVEN (see notes)"))
    elif result.failed and result.searched and result.source != NOT_NEEDED:
        print(f"no set of passes explains the failure (all {len(result.searched)} searched passes disabled, it "
              "stays)" + _checked(result, "unexplained"))
    _print_audit(result)
    print("invocations: " + describe_calls(result.invocations, result.backend_calls)
          + f"; {result.seconds:.1f} s")
    for note in result.notes:
        print(f"note: {note}")


def _print_audit(result: PassesResult) -> None:
    """The checker's verdict on each claim above, with the evidence of those that do not hold."""
    audit = result.audit
    if audit is None:
        return
    runs = ", ".join(f"{role} {n}" for role, n in (audit.get("runs") or {}).items())
    print(f"checked ({runs} plain runs, a checker that shares no code with the search):")
    for claim in audit.get("claims") or ():
        verdict = {True: "holds", False: "DOES NOT HOLD", None: "not established"}[claim.get("holds")]
        evidence = "" if claim.get("holds") is True else f" — {claim.get('evidence')}"
        print(f"  {verdict}: {claim.get('claim')}{evidence}")


def run(args: argparse.Namespace) -> int:
    from graphbisect.storage.atomic import atomic_write_text
    from graphbisect.workflows.reduce import work_dir_for

    refuse_inside({"--json": args.json}, args.output, "the bundle folder")
    refuse_inside({"--json": args.json}, args.output and work_dir_for(args.output), "the work folder")
    refuse_inside({"--json": args.json}, args.workdir, "the work folder")
    if args.output is not None:  # the reduction's work folder, known before the pass search runs
        from graphbisect.workflows.workfolder import check_own

        check_own(work_dir_for(args.output))
    progress = ProgressLine(label="passes")
    model, feeds, result = run_passes(args, progress)
    progress.close()
    print_passes(result)
    data: dict[str, Any] = result.to_json()
    if args.output is not None and result.culprits:
        from graphbisect.workflows.passes import reduce_under_culprits
        from graphbisect.workflows.reduce import ReduceOptions

        options = ReduceOptions(oracle=args.oracle, tolerance=tolerance_from_args(args), timeout=args.timeout,
                                strict_band=args.strict_band)
        reduced = reduce_under_culprits(model, args.output, result, inputs=feeds, reduce_options=options,
                                        on_stage=progress.stage, on_progress=progress)
        progress.close()
        data["reduce"] = reduced.to_json()
        print(f"reduced {reduced.original_nodes} → {reduced.final_nodes} nodes under the culprit passes; "
              f"bundle: {reduced.bundle}  (python {reduced.bundle}/repro.py also runs the control)")
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(data, indent=2, allow_nan=False) + "\n")
    return 1 if result.failed else 0
