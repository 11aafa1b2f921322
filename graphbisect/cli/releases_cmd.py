"""`graphbisect releases MODEL-or-BUNDLE --package onnxruntime`: the first release where a failure appears
(``--find bad``, the default) or is gone (``--find fixed``).

Each release runs the target in its own cached virtual environment (``python=``) against a fixed oracle, and is
judged as ``verify`` judges a bundle: bad when the failure reproduces with the same identity, good when the target
agrees with the oracle, a skip with its reason when the release cannot be installed, cannot run the model, or
fails differently. On a bundle the oracle is its recorded outputs and the failure its recorded one; on a model
``--oracle`` runs once and the failure is the baseline release's (the newest that installs, the oldest with
``--find fixed``) or ``--bundle``'s. On a bundle, what was found is added to its report.md and report.json
(beside a .zip: :mod:`graphbisect.artifacts.releases_section`). Both ends are checked first; the search steps
around skips and runs at most ceil(log2 N) + 2 releases (skips excepted); the releases the answer rests on are
run ``--repeat`` times and voted.

Exit codes: 0 = found (the last good and first bad release, or the last bad and first fixed), 1 = none found:
the failure is present in every release tested (or, with ``--find fixed``, already gone in the oldest), absent
in the newest (not fixed in any), or every release was a skip; 2 = usage or input (no such package here, fewer
than two releases, the index cannot be read, the bundle is unusable or its recorded target needs ``--trust``,
the oracle cannot run the model).

The packages (``--package``), what each release's environment holds and the backend it runs:
:data:`graphbisect.releases.packages.PACKAGES`. Any package, one of those or not, with a ``command:`` target: the
program runs with each release's environment first on its ``PATH`` (``venv=``), and the release it held is
measured there (``package=``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from graphbisect.artifacts.bundle import load_bundle, names_bundle
from graphbisect.artifacts.releases_section import add_releases_section
from graphbisect.backends.registry import DEFAULT_ORACLE
from graphbisect.cli.common import backend_spec, count, output_file, output_path, refuse_inside, tolerance
from graphbisect.compare import Tolerance
from graphbisect.releases.environments import INSTALLERS, cache_root
from graphbisect.releases.packages import PACKAGES
from graphbisect.storage.atomic import atomic_write_text
from graphbisect.workflows.releases import FINDS, SKIP, ReleaseSearch, search_releases, search_releases_model

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, metavar="MODEL-or-BUNDLE",
                        help="a bundle folder or .zip written by `graphbisect reduce` (its recorded outputs are the "
                        "oracle), or an ONNX model (--oracle runs on it once)")
    parser.add_argument("--package", required=True, metavar="PACKAGE",
                        help="the package whose releases to search: " + "; ".join(
                            f"{r.package}: {r.summary}, target {r.target}" for r in PACKAGES.values())
                        + "; any other package with a --target command:... program, run with each release's "
                        "environment first on its PATH (python and the package's scripts are that release's)")
    parser.add_argument("--range", dest="within", metavar="A..B",
                        help="the releases from A to B, both included; either end may be left out (default: every "
                        "release the package index has for this Python and platform)")
    parser.add_argument("--versions", metavar="A,B,C",
                        help="search exactly these releases instead of asking the package index (offline with "
                        "cached environments; a release that has no wheel here is a skip)")
    parser.add_argument("--pre", action="store_true", help="include pre-releases and development releases")
    parser.add_argument("--find", choices=FINDS, default="bad",
                        help="bad: the first release where the failure appears (default); fixed: the first where "
                        "it is gone")
    parser.add_argument("--target", type=backend_spec, metavar="SPEC",
                        help="the spec each release runs, python= set to that release's environment (a command: "
                        "target: venv= that environment, package= the release measured there) (default: the "
                        "bundle's recorded target; with a model the package's, e.g. onnxruntime:opt_level=all)")
    parser.add_argument("--repeat", type=count(1), default=3,
                        help="runs of each release the answer rests on, voted (default 3; 1: no vote)")
    parser.add_argument("--jobs", type=count(1), default=2, help="environments installed at once (default 2)")
    parser.add_argument("--installer", choices=INSTALLERS, default="auto",
                        help="what installs the environments: uv (pip install 'graphbisect[releases]'), pip, or auto: "
                        "uv where it is there, else pip (default)")
    parser.add_argument("--cache", type=output_path, metavar="DIR",
                        help=f"where release environments are kept (default {cache_root()})")
    parser.add_argument("--json", type=output_file, metavar="PATH", help="write the search as JSON")
    parser.add_argument("--no-section", action="store_true",
                        help="do not add the Releases section to the bundle's report.md and report.json (a .zip "
                        "bundle: NAME.releases.md and NAME.releases.json beside it)")
    model = parser.add_argument_group("with a MODEL")
    model.add_argument("--oracle", type=backend_spec, metavar="SPEC", default=DEFAULT_ORACLE,
                       help=f"the backend trusted to be right, this interpreter's, run once (default {DEFAULT_ORACLE})")
    model.add_argument("--bundle", type=Path, metavar="BUNDLE",
                       help="search for this bundle's failure (its signature and identity) on the model, instead of "
                       "the baseline release's (the newest that installs; the oldest with --find fixed)")
    model.add_argument("--inputs", type=Path, metavar="FILE",
                       help="model inputs (.npz, .npy, .pb, JSON); default: seeded random inputs")
    model.add_argument("--seed", type=count(0), default=0, help="seed for random inputs (default 0)")
    model.add_argument("--atol", type=tolerance, default=1e-4, help="absolute tolerance (default 1e-4)")
    model.add_argument("--rtol", type=tolerance, default=1e-3, help="relative tolerance (default 1e-3)")
    model.add_argument("--workdir", type=output_path, metavar="DIR",
                       help="keep the normalized model, inputs and the oracle's activations here")
    parser.add_argument("--trust", action="store_true",
                        help="run the bundle's recorded target even when it sets options not known to be inert "
                        "(its python= is always replaced)")


def run(args: argparse.Namespace) -> int:
    source = Path(args.source)
    refuse_inside({"--json": args.json}, source if source.is_dir() else None, "the bundle")
    versions = [v.strip() for v in args.versions.split(",") if v.strip()] if args.versions else None
    common = {"versions": versions, "within": args.within, "pre": args.pre, "find": args.find, "cache": args.cache,
              "jobs": args.jobs, "repeat": args.repeat, "installer": args.installer, "on_progress": print}
    if names_bundle(source):
        with load_bundle(source) as bundle:
            print(f"bundle    {source}")
            print(f"recorded  {bundle.signature.describe()}")
            print(f"oracle    {bundle.oracle}   (its recorded outputs; not run)")
            result = search_releases(bundle, args.package, target=args.target, trust=args.trust, **common)
        _print(result)
        if not args.no_section:
            _add_section(source, result)
    else:
        result = _on_model(args, source, common)
        _print(result)
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result.to_json(), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if result.found and not result.refuted else 1  # an answer the checker refutes is none found


def _add_section(source: Path, result: ReleaseSearch) -> None:
    try:
        written = add_releases_section(source, result.to_json())
    except OSError as exc:  # the answer is printed: a read-only bundle loses only its copy of it
        print(f"warning: could not add the Releases section to {source}: {exc}", file=sys.stderr)
        return
    where = "the bundle's" if source.is_dir() else "beside the .zip, which is left as it is:"
    print(f"added the Releases section to {where} {' and '.join(str(path) for path in written)}")


def _on_model(args: argparse.Namespace, source: Path, common: dict[str, Any]) -> ReleaseSearch:
    from graphbisect.data import load_inputs
    from graphbisect.model import load_model

    model = load_model(source)
    inputs = load_inputs(args.inputs, model) if args.inputs is not None else None
    tol = Tolerance(atol=args.atol, rtol=args.rtol)
    print(f"model     {source}  ({len(model.nodes)} nodes)")
    print(f"oracle    {args.oracle}   (this interpreter's; runs once)")
    print(f"inputs    {args.inputs or f'seeded random (seed {args.seed})'}")
    if args.bundle is None:
        return search_releases_model(model, args.package, oracle=args.oracle, target=args.target, inputs=inputs,
                                     seed=args.seed, tolerance=tol, workdir=args.workdir, **common)
    with load_bundle(args.bundle) as bundle:
        print(f"failure   {bundle.signature.describe()}   (the bundle's)")
        return search_releases_model(model, args.package, oracle=args.oracle, target=args.target, inputs=inputs,
                                     seed=args.seed, tolerance=tol, bundle=bundle, workdir=args.workdir, **common)


def _print(r: ReleaseSearch) -> None:
    print(f"\n{'release':<10} {'verdict':<7} {'runs':>4}  observed")
    for version in r.versions:
        tested = r.tested.get(version)
        if tested is None:
            print(f"{version:<10} {'-':<7} {'':>4}  not run")
            continue
        magnitude = f", {tested.magnitude:.3g}× tolerance" if tested.magnitude is not None and tested.observed else ""
        what = tested.reason if tested.verdict == SKIP else (tested.observed or "passes") + magnitude + (
            f"; {tested.reason}" if tested.reason else "")
        flaky = f" (flaky: {', '.join(f'{n} {v}' for v, n in tested.votes.items())})" if tested.flaky else ""
        print(f"{version:<10} {tested.verdict:<7} {tested.runs:>4}  {what}{flaky}")
    if r.found:
        pair = (("last good", r.last_good), ("first bad", r.first_bad)) if r.find == "bad" else \
            (("last bad", r.last_bad), ("first fixed", r.first_fixed))
        print("\n" + "   ".join(f"{name}: {version}" for name, version in pair)
              + ("" if r.confirmed else "   (NOT confirmed by the checker: see below)"))
        for claim in (r.audit or {}).get("claims") or []:
            verdict = {True: "holds", False: "DOES NOT HOLD", None: "not established"}[claim["holds"]]
            print(f"checker: {claim['claim']}: {verdict} ({claim['evidence']})")
        if r.changed is not None:
            print(f"what changed: {r.changed.describe()}")
    else:
        print(f"\nNOT FOUND ({r.status})")
    print(f"installs: {r.installs}   releases run: {r.releases_run} of {len(r.versions)} "
          f"(bound ceil(log2 N)+2 = {r.bound}, skips excepted)   runs: {r.runs}")
    print(f"\n{r.paragraph}")
