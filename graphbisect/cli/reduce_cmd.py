"""`graphbisect reduce`: the smallest subgraph that still fails the same way, as a bug-report bundle."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphbisect.backends.cost import describe_calls
from graphbisect.cli.common import (
    add_model_arguments,
    chosen_for,
    count,
    executor,
    exit_code,
    load_feeds,
    load_model_arg,
    output_file,
    output_path,
    refuse_inside,
    regex,
    seconds,
    tolerance_from_args,
)
from graphbisect.cli.progress import ProgressLine
from graphbisect.cli.terminal import shown
from graphbisect.errors import InputError
from graphbisect.text.printable import plural

if TYPE_CHECKING:
    from graphbisect.workflows.reduce import ReduceOptions, ReduceResult

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("-o", "--output", type=output_path, metavar="DIR",
                        help="bundle folder to write (model.onnx, inputs, expected/actual outputs, repro.py, report)")
    parser.add_argument("--resume", type=Path, metavar="DIR",
                        help="resume the interrupted reduction that was writing DIR (skips finished invocations)")
    parser.add_argument("--json", type=output_file, metavar="PATH", help="write the result as JSON")
    parser.add_argument("--zip", action="store_true", help="also write DIR.zip")
    parser.add_argument("--force", action="store_true", help="replace a bundle of another model in DIR (a "
                        "bundle of the same model is replaced anyway; files that are not the bundle's never are)")
    parser.add_argument("--max-invocations", type=count(0), metavar="N",
                        help="stop the search after N candidate runs of the target (in this session; a resumed run "
                        "gets N more) and keep the best result so far")
    parser.add_argument("--deadline", type=seconds, metavar="SECONDS", help="stop searching after this many seconds")
    parser.add_argument("-j", "--jobs", type=count(1), default=1, help="evaluate candidates in N target workers "
                        "(same result as -j 1)")
    parser.add_argument("--executor", type=executor, metavar="local|ray[:ADDRESS]",
                        help="run the -j concurrent candidates as executor tasks: Ray on a cluster (ray:ADDRESS, e.g. "
                        "ray:auto; the -o folder must be on a filesystem every node mounts) or a local Ray instance "
                        "(ray); default: this machine's target workers. Same result either way")
    parser.add_argument("--fail-regex", type=regex, metavar="REGEX",
                        help="the failure is any run whose error message or log "
                        "matches REGEX (instead of comparing outputs)")
    parser.add_argument("--check", metavar="CMD", help="external check instead of --target (Polygraphy-style): a shell "
                        "command with {model} and {inputs} placeholders; a non-zero exit is the failure")
    parser.add_argument("--fail-code", type=exit_code, metavar="N",
                        help="with --check: only exit code N is the failure")
    parser.add_argument("--strict-band", action="store_true", help="also require the error's order of magnitude "
                        "to stay within one decade of the original's")
    parser.add_argument("--cut-as-initializers", action="store_true",
                        help="feed every cut tensor as an initializer instead of a graph input")
    parser.add_argument("--no-layerwise", action="store_true", help="do not use layerwise evidence to seed the search")
    parser.add_argument("--timeout", type=seconds, help="seconds one backend invocation may take (default 600)")
    parser.add_argument("--keep-work", action="store_true", help="keep DIR.work (activations, journal) afterwards")
    parser.add_argument("--passes", action="store_true", help="first find the culprit optimization passes of the "
                        "target (`graphbisect passes`), then reduce with only them enabled; repro.py also runs a "
                        "control with them disabled")


def _options(args: argparse.Namespace) -> ReduceOptions:
    from graphbisect.workflows.reduce import ReduceOptions

    return ReduceOptions(
        oracle=args.oracle, target=args.target, tolerance=tolerance_from_args(args), fail_regex=args.fail_regex,
        strict_band=args.strict_band, max_invocations=args.max_invocations, deadline_seconds=args.deadline,
        jobs=args.jobs, cut_as_initializers=args.cut_as_initializers, layerwise=not args.no_layerwise,
        timeout=args.timeout, keep_work=args.keep_work, check=args.check, fail_code=args.fail_code,
        executor=args.executor,
    )


def run(args: argparse.Namespace) -> int:
    from graphbisect.artifacts.bundle import check_destination
    from graphbisect.workflows.reduce import reduce_model, work_dir_for
    from graphbisect.workflows.workfolder import check_own

    for folder in filter(None, (args.output, args.resume)):
        refuse_inside({"--json": args.json}, folder, "the bundle folder")
        refuse_inside({"--json": args.json}, work_dir_for(folder), "the work folder")
    progress = ProgressLine()
    if args.resume is not None:
        return _resume(args, progress)
    if args.output is None:
        raise InputError("reduce needs an output folder", hint="add -o DIR (e.g. -o bug-report)")
    check_destination(args.output, force=args.force)  # before the pass search runs anything
    check_own(work_dir_for(args.output))
    if args.passes:
        return _with_passes(args, progress)
    model = load_model_arg(args)
    with _resume_line_on_interrupt(args.output, progress):
        result = reduce_model(model, args.output, inputs=load_feeds(args, model), options=_options(args),
                              zip_bundle=args.zip, on_progress=progress, on_stage=progress.stage, force=args.force,
                              chosen=chosen_for(args, model))
    progress.close()
    return _report(result, args)


@contextlib.contextmanager
def _resume_line_on_interrupt(output: Path, progress: ProgressLine) -> Iterator[None]:
    """Ctrl-C outside the search (capture, baseline, bundle): say how to continue, then stop (exit 130)."""
    try:
        yield
    except KeyboardInterrupt:
        progress.close()
        print(f"interrupted; resume: graphbisect reduce --resume {shlex.quote(str(output))}", file=sys.stderr)
        raise


def _with_passes(args: argparse.Namespace, progress: ProgressLine) -> int:
    from graphbisect.cli.passes_cmd import print_passes, run_passes
    from graphbisect.workflows.passes import reduce_under_culprits

    args.workdir = None
    model, feeds, found = run_passes(args, progress)
    progress.close()
    print_passes(found)
    if not found.culprits:
        print("no culprit passes: nothing to reduce under them (run `graphbisect reduce` without --passes)")
        return 1 if found.failed else 0
    result = reduce_under_culprits(model, args.output, found, inputs=feeds, reduce_options=_options(args),
                                   zip_bundle=args.zip, force=args.force, on_stage=progress.stage,
                                   on_progress=progress)
    progress.close()
    return _report(result, args)


def _resume(args: argparse.Namespace, progress: ProgressLine) -> int:
    from graphbisect.workflows.reduce import ReduceOptions, resume_reduction, work_dir_for
    from graphbisect.workflows.workfolder import check_own

    check_own(work_dir_for(args.resume))  # before its run.json is read: never through a link
    state_path = work_dir_for(args.resume) / "run.json"
    if state_path.exists():  # else resume_reduction says there is nothing to resume
        state = json.loads(state_path.read_text())
        _check_resume_arguments(args, state, ReduceOptions.from_json(state["options"]))
    # What the run computes comes from the recorded run; how it proceeds (budget, jobs, ...) from this command line.
    with _resume_line_on_interrupt(args.resume, progress):
        result = resume_reduction(args.resume, max_invocations=args.max_invocations, deadline_seconds=args.deadline,
                                  jobs=args.jobs, timeout=args.timeout, keep_work=args.keep_work,
                                  executor=args.executor, zip_bundle=args.zip, on_progress=progress,
                                  on_stage=progress.stage)
    progress.close()
    return _report(result, args)


#: Command-line arguments that define what a reduction computes → the ReduceOptions field they set.
_DEFINING = {"oracle": "oracle", "target": "target", "check": "target", "atol": "tolerance", "rtol": "tolerance",
             "min_cosine": "tolerance", "tol": "tolerance", "fail_regex": "fail_regex", "strict_band": "strict_band",
             "cut_as_initializers": "cut_as_initializers", "no_layerwise": "layerwise", "fail_code": "fail_code"}


def _check_resume_arguments(args: argparse.Namespace, state: dict[str, Any], recorded: ReduceOptions) -> None:
    """``--resume`` continues the recorded reduction: a model or option given that differs from it is refused
    (it used to be ignored silently, so the user believed a different run was resumed)."""
    from graphbisect.backends.registry import resolve

    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    default = vars(defaults.parse_args([]))
    given = [k for k in _DEFINING if getattr(args, k, None) != default.get(k)]
    cli = _options(args)

    def canonical(field: str, options: ReduceOptions) -> Any:
        value = getattr(options, field)
        if field in ("oracle", "target") and options.check is None:
            return str(resolve(value, require_available=False)[0])
        return (value, options.check) if field == "target" else value

    differ = [f"--{k.replace('_', '-')}" for k in given
              if canonical(_DEFINING[k], cli) != canonical(_DEFINING[k], recorded)]
    if args.model is not None or args.example:
        from graphbisect.cli.common import load_model_arg

        fingerprint = json.loads(state["fingerprint"])["model"]
        if load_model_arg(args).fingerprint != fingerprint:
            differ.insert(0, f"the model {args.model or '--example'}")
    if args.inputs is not None and not args.example and _inputs_differ(args):
        differ.append(f"--inputs {args.inputs}")  # it was ignored silently (issue 24)
    differ += [f"--{k}" for k, v in (("shape", args.shape), ("seed", args.seed)) if v]  # the inputs are recorded
    if differ:
        raise InputError(
            f"--resume {args.resume} continues the recorded reduction, but {', '.join(differ)} differ from it",
            hint="drop them to resume as recorded, or start a new reduction with another -o folder",
        )


def _inputs_differ(args: argparse.Namespace) -> bool:
    """Whether ``--inputs`` holds other values than the resumed run's recorded ``inputs.npz``."""
    from graphbisect.data import load_inputs, validate_inputs
    from graphbisect.model import load_model
    from graphbisect.storage.values import bit_identical, load_values_npz
    from graphbisect.workflows.reduce import work_dir_for

    work = work_dir_for(args.resume)
    model = load_model(work / "model.onnx")
    given = validate_inputs(model, load_inputs(args.inputs, model))
    recorded = load_values_npz(work / "inputs.npz")
    return set(given) != set(recorded) or not all(bit_identical(given[k], recorded[k]) for k in recorded)


def _report(result: ReduceResult, args: argparse.Namespace) -> int:
    from graphbisect.storage.atomic import atomic_write_text

    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n")
    if not result.failed:
        print(f"the original model does not fail ({result.signature.describe()}): nothing to reduce; "
              f"report: {result.bundle}")
        for note in result.notes:  # a flaky target's tally among them
            print(f"note: {note}")
        return 0
    # The original's outputs: the bundle's own (its title, report.md) may be off by another magnitude
    print(f"failure: {result.signature.describe()} (at the original model's outputs)")
    if result.identity is not None:
        print(f"identity: {shown(result.identity.describe())} (every candidate matched on it)")
    if result.noise_floor is not None and result.noise_floor.measured:
        print(result.noise_floor.describe(where="report.json"))
    kept = ", ".join(map(shown, result.kept_nodes[:12]))
    print(f"reduced {result.original_nodes} → {plural(result.final_nodes, 'node')}: {kept}"
          + (" …" if len(result.kept_nodes) > 12 else ""))
    facts = f"; report facts: {describe_calls({}, result.report_calls)}" if result.report_calls else ""
    print(f"invocations: {describe_calls(result.invocations, result.backend_calls)}{facts}; {result.seconds:.1f} s")
    if result.one_minimal:
        claim: Mapping[str, Any] = next(
            (c for c in (result.audit or {}).get("claims", []) if c.get("id") == "one_minimal"), {})
        otherwise = ", ".join(map(shown, claim.get("fail_otherwise") or ()))
        print("1-minimal: yes (every single removal tested by the search and run by the checker), re-verified in "
              "fresh workers" + (f"; for the recorded failure only: without {otherwise} the model still fails "
                                 "another way" if otherwise else ""))
    elif result.stop_reason:  # the search was stopped: resuming it can finish it
        print(f"1-minimal: NOT PROVEN ({result.stop_reason}); this is the best result so far. "
              f"Resume: graphbisect reduce --resume {shlex.quote(str(args.output or args.resume))}")
    else:  # the search finished: the notes say why its result is not proven minimal
        why = "re-verification failed" if not result.verified else "see the notes"
        print(f"1-minimal: NOT PROVEN ({why})")
    for note in result.notes:
        print(f"note: {note}")
    if result.audit is not None:
        claims = result.audit["claims"]
        held = sum(claim["holds"] is True for claim in claims)
        print(f"audit: {held} of {len(claims)} claims re-established with plain runs by the checker "
              "(report.md's Audit section; graphbisect audit BUNDLE re-runs it)")
    print(f"bundle: {result.bundle}  (reproduce: python {shlex.quote(str(Path(str(result.bundle)) / 'repro.py'))})")
    if result.interrupted:  # the bundle is written; the exit code says Ctrl-C, as everywhere else
        print("graphbisect: interrupted", file=sys.stderr)
        return 130
    return 1
