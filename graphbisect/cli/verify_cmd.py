"""`graphbisect verify DIR`: does the bundle's failure still reproduce (here, or on another version)?

Re-runs the target (the bundle's spec, or ``--target``: e.g. a newer ONNX Runtime through ``python=``) on
``model.onnx`` + ``inputs.npz`` in a fresh isolated worker, compares with ``oracle_outputs.npz`` under the
bundle's tolerance, and compares the resulting failure signature with the recorded one.

Exit codes: 1 = the recorded failure reproduces (or a *different* failure appeared, which is printed loudly),
0 = fixed (the target agrees with the oracle, and that shows the user's model fixed: the bundle is the whole
model, its failure's identity was re-established through the reduction, or ``--model`` re-checked the original
and it passes), 4 = fixed on the reduced model, not shown for the original (the bundle's failure was matched by
its kind alone, which may have drifted to another defect of the same kind: re-check with ``--model ORIGINAL``),
2 = the bundle or the spec is unusable — a bundle whose files
do not match the sha256 its report.json records is *damaged*, and a recorded spec that is about to run (the
target; with ``--model`` the oracle) and sets an option not known to be inert (a program, an interpreter, a
session config key or compiler flag naming a file) runs only with ``--trust`` (the trust rule, see
docs/security.md; ``--target``/``--oracle`` name your own instead) — and 2 when
the target ran but the recorded failure is the verdict of a Python output check (``graphbisect.reduce(check=
callable)``), which a bundle cannot hold and a command line cannot pass: *undecided*, never "fixed" by the
tolerance; ``graphbisect.verify(BUNDLE, check=...)`` re-judges it. The verdict is re-established by the checker
(:mod:`graphbisect.workflows.verify_claims`; the ``checker:`` line): one it finds false is *undecided* (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graphbisect.artifacts.bundle import load_bundle
from graphbisect.artifacts.environment import describe_ran_with
from graphbisect.artifacts.repro import JUDGE_EXIT_STATUS, JUDGE_PYTHON_CHECK
from graphbisect.backends.base import brief_spec, cause_line
from graphbisect.backends.cost import describe_calls
from graphbisect.cli.common import backend_spec, output_file, refuse_inside, seed
from graphbisect.errors import InputError
from graphbisect.oracle.signature import Signature
from graphbisect.storage.atomic import atomic_write_text
from graphbisect.workflows.verify import (
    FIXED,
    FIXED_REDUCED,
    REPRODUCES,
    UNDECIDED,
    Verification,
    recheck_original,
    require_trust,
    verify_bundle,
)

__all__ = ["Verification", "add_arguments", "run", "verify_bundle"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, help="bundle folder or .zip written by `graphbisect reduce`")
    parser.add_argument("--target", type=backend_spec, metavar="SPEC",
                        help="run this target instead of the recorded one, e.g. "
                        "'onnxruntime:opt_level=all,python=/opt/ort-nightly/bin/python' to check another version")
    parser.add_argument("--json", type=output_file, metavar="PATH", help="write the verdict as JSON")
    parser.add_argument("--model", type=Path, metavar="ORIGINAL",
                        help="also re-check the model the bundle was reduced from, on the same target, oracle and "
                        "tolerance: a fixed bundle is not a fixed model (exit 1 while it fails). The oracle runs "
                        "on it: the recorded one (held to the trust rule, as the target is), or --oracle")
    parser.add_argument("--oracle", type=backend_spec, metavar="SPEC",
                        help="with --model: run this oracle on ORIGINAL instead of the recorded one, e.g. "
                        "'onnxruntime:opt_level=disable' (the bundle itself is compared with its recorded oracle "
                        "outputs: no oracle runs on it)")
    parser.add_argument("--inputs", type=Path, metavar="FILE",
                        help="with --model: its inputs (default: the seeded random inputs reduce draws)")
    parser.add_argument("--seed", type=seed, default=0, help="with --model: seed of its random inputs (default 0)")
    parser.add_argument("--trust", action="store_true",
                        help="run the bundle's recorded specs (the target; with --model the oracle) even when they "
                        "set options not known to be inert: a program (command:), an interpreter (python=), a "
                        "session config key or compiler flag that names a file... (a bundle is a download: read "
                        "its report.json first)")


def run(args: argparse.Namespace) -> int:
    refuse_inside({"--json": args.json}, Path(args.bundle) if Path(args.bundle).is_dir() else None, "the bundle")
    if args.oracle is not None and args.model is None:
        raise InputError("--oracle names the oracle that runs on --model ORIGINAL; without --model no oracle runs "
                         "(the bundle is compared with its recorded oracle outputs)",
                         hint="add --model ORIGINAL.onnx, or leave out --oracle")
    with load_bundle(args.bundle) as bundle:
        # Every recorded spec that will run, checked before anything runs (a spec named here is the user's own).
        recorded = [role for role, named, runs in (("target", args.target, True),
                                                   ("oracle", args.oracle, args.model is not None))
                    if runs and named is None]
        trusted = require_trust(bundle, recorded, trust=args.trust)
        print(f"bundle    {args.bundle}")
        # what runs: the bundle is compared with the oracle's recorded outputs; --model runs an oracle on ORIGINAL
        runs = f"runs on {args.model}" if args.model is not None and args.oracle is None else "not run"
        print(f"oracle    {bundle.oracle}   (its recorded outputs; {runs})")
        if args.model is not None and args.oracle is not None:
            print(f"          on {args.model} runs {args.oracle} (--oracle)")
        print(f"target    {brief_spec(args.target or bundle.target, where=None if args.target else 'report.json')}")
        for role, untrusted in trusted.items():
            for option in untrusted:
                print(f"warning: --trust: running the recorded {role}'s {option.describe()}, named by the bundle",
                      file=sys.stderr)
        verification = verify_bundle(bundle, args.target, trust=args.trust)
        if args.model is not None:
            from graphbisect.data import load_inputs
            from graphbisect.model import load_model

            feeds = load_inputs(args.inputs, load_model(args.model)) if args.inputs is not None else None
            verification = recheck_original(verification, bundle, args.model, inputs=feeds, seed=args.seed,
                                             oracle=args.oracle, trust=args.trust)
    _print(verification)
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(verification.to_json(), indent=1) + "\n")
        print(f"wrote {args.json}")
    if verification.original is not None and verification.original["failed"]:
        return 1  # the user's model still fails, whatever the bundle does
    return {FIXED: 0, FIXED_REDUCED: 4, UNDECIDED: 2}.get(verification.outcome, 1)


_FIXED_BY = {JUDGE_EXIT_STATUS: "no longer fails: the check command exits 0",
             JUDGE_PYTHON_CHECK: "no longer fails: the Python check accepts its outputs"}


def _signature_line(signature: Signature, message: str | None) -> str:
    """``crash-load: Fail: <the raw message's cause>``, or the signature's own description."""
    cause = cause_line(message)
    if signature.kind.raised and cause:
        return f"{signature.kind.value}: {cause}"
    return signature.describe()


def _print(v: Verification) -> None:
    if v.run.ran_with:  # measured in the worker, also when the run crashed
        print(f"ran with  {describe_ran_with(v.run.ran_with)}")
    print(f"recorded  {_signature_line(v.recorded, v.recorded_message)}")
    observed_message = None if v.run.ok else f"{v.run.error_type or 'error'}: {v.run.message or ''}"
    observed = _signature_line(v.observed, observed_message)
    if v.outcome == UNDECIDED:
        observed = f"completed; by the tolerance (not the recorded judge): {observed}"
    print(f"observed  {observed}")
    if v.comparison is not None:
        for s in v.comparison.outputs:
            print(f"  {s.kind.value:<9} {json.dumps(s.name)}: {s.mismatches}/{s.numel} mismatched, "
                  f"max abs {s.max_abs:.4g}, {s.score:.3g}× tolerance")
    target = brief_spec(v.target)
    if v.outcome == REPRODUCES:
        print(f"\nREPRODUCES: the recorded failure still happens on {target}.")
    elif v.outcome == FIXED:
        print(f"\nFIXED: {target} {_FIXED_BY.get(v.judged_by, 'now agrees with the oracle')}.")
    elif v.outcome == FIXED_REDUCED:
        print(f"\nFIXED ON THE REDUCED MODEL ONLY: {target} {_FIXED_BY.get(v.judged_by, 'agrees with the oracle')} "
              "on this bundle; not shown for the original (exit 4, see the note).")
    elif v.outcome == UNDECIDED and v.audit is not None and v.audit.get("holds") is False:
        print(f"\nUNDECIDED: the search said {str(v.audit['verdict']).upper()} on {target}; the checker's plain "
              "runs do not confirm it (see the note).")
    elif v.outcome == UNDECIDED:
        print(f"\nUNDECIDED: {target} ran; the tolerance's comparison above decides nothing (see the note).")
    else:
        print(f"\n*** DIFFERENT FAILURE on {target}: recorded {v.recorded.describe()}, "
              f"now {v.observed.describe()} ***")
    if v.note:
        print(f"note: {v.note}")
    if v.original is not None:
        o = v.original
        first = o["first_divergence"]
        where = "" if first is None else f"; first divergence at {first['tensor']}" + (
            f", compiled as {first['compiled_as']}" if first["compiled_as"] else "")
        print(f"\noriginal model {o['model']}: " + (f"STILL FAILS ({o['outcome']}{where})" if o["failed"] else
                                                    "passes on this target"))
        if not o["recorded_model"]:
            print("  (not the model this bundle records: its content fingerprint differs)")
    print(f"invocations: {describe_calls(v.invocations, v.backend_calls)}")
    if v.audit is not None:
        print(_audit_line(v.audit))


def _audit_line(audit: Mapping[str, Any]) -> str:
    """The checker's line: what it re-established with how many plain runs, or why it did not."""
    runs = audit.get("runs") or {}
    cost = f"{runs.get('target', 0)} target and {runs.get('oracle', 0)} oracle plain runs"
    if audit.get("holds") is True:
        line = f"checker: confirmed with {cost}: {audit['claim']} ({audit['evidence']})"
    elif audit.get("holds") is False:
        line = f"checker: NOT confirmed with {cost}: \"{audit['claim']}\" does not hold ({audit['evidence']})"
    else:
        line = f"checker: {str(audit.get('verdict')).upper()} not checked by the checker: {audit.get('why_not')}"
    return line + (f"\n  {audit['original']}" if audit.get("original") else "")
