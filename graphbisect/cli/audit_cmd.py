"""`graphbisect audit BUNDLE`: re-establish each claim of a bundle with plain runs (the trusted checker).

Each claim the bundle's report.json makes — the target fails on model.onnx, in the recorded way and as strongly;
``oracle_outputs.npz`` is what the oracle computes; 1-minimal; (not) flaky; the lowest failing optimization
level; the ONNX specification's word — is checked by :mod:`graphbisect.checker`, which shares no code with the
search that wrote the bundle, and printed as holds / DOES NOT HOLD / not established, with its evidence.

Exit codes: 0 = no claim is false (each holds, or is printed as not established), 1 = a claim does not hold,
2 = the bundle cannot be audited (unreadable or damaged, or it names a spec that is not known to be inert and
``--trust`` was not given: the trust rule of docs/security.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from graphbisect.checker import Audit, audit_bundle
from graphbisect.cli.common import output_file, refuse_inside
from graphbisect.cli.terminal import shown
from graphbisect.storage.atomic import atomic_write_text

__all__ = ["add_arguments", "run"]

_MARK = {True: "holds          ", False: "DOES NOT HOLD  ", None: "not established"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, help="bundle folder or .zip written by `graphbisect reduce`")
    parser.add_argument("--json", type=output_file, metavar="PATH",
                        help='write {"claims": [{"id", "claim", "holds": true|false|null, "evidence"}], ...}')
    parser.add_argument("--trust", action="store_true",
                        help="run the recorded oracle and target even when they set options not known to be inert "
                        "(a program, an interpreter, a file): a bundle is a download, read its report.json first")


def run(args: argparse.Namespace) -> int:
    refuse_inside({"--json": args.json}, Path(args.bundle) if Path(args.bundle).is_dir() else None, "the bundle")
    print(f"bundle    {shown(str(args.bundle))}")
    result = audit_bundle(args.bundle, trust=args.trust, progress=lambda text: print(f"… {text}", file=sys.stderr))
    _print(result)
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result.to_json(), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 1 if result.holds is False else 0


def _print(result: Audit) -> None:
    for claim in result.claims:
        print(f"{_MARK[claim.holds]}  {shown(claim.statement)}")
        print(f"{'':17}  {shown(claim.evidence)}")
    runs = ", ".join(f"{role} {c['runs']} ({c['compiles']} compile{'' if c['compiles'] == 1 else 's'})"
                     for role, c in result.calls.items())
    false = sum(c.holds is False for c in result.claims)
    unknown = sum(c.holds is None for c in result.claims)
    held = len(result.claims) - false - unknown
    print(f"\nplain runs: {runs}; {result.seconds:.1f} s")
    verdict = "AUDIT FAILED" if false else "AUDIT PASSED"
    print(f"{verdict}: {held} of {len(result.claims)} claims hold, {false} do not, {unknown} not established.")
