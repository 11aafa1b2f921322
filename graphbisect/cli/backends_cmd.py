"""`graphbisect backends`: the backend table with availability, versions, capabilities and options."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from graphbisect.backends.base import Capability
from graphbisect.backends.registry import HOST_OPTIONS, Availability, BackendInfo, all_backends, resolve
from graphbisect.errors import SpecError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--options", action="store_true", help="also list every backend's spec options")
    parser.add_argument("--python", metavar="PATH",
                        help="show what this interpreter (as a spec's python= names it) can run, with its versions")
    parser.add_argument("--passes", metavar="SPEC",
                        help="list the optimization passes SPEC's backend can switch off (the names disabled= "
                             "takes), one a line, e.g. --passes onnxruntime")


def run(args: argparse.Namespace) -> int:
    from graphbisect.backends.process import availability_under

    if args.passes:
        return _list_passes(args.passes)

    # Every library is imported in a child process (this one's interpreter, or --python's): the version shown
    # is its __version__, from the files `import` loads, whichever distribution installed them. That takes
    # tens of seconds (TensorRT, Paddle, OpenVINO): say so at once, not after a silence.
    print(f"importing every backend's library under {args.python or sys.executable} (some take seconds) ...",
          file=sys.stderr, flush=True)
    measured = availability_under(args.python)
    rows: list[dict[str, Any]] = []
    for info in all_backends():
        avail = _under(info, measured, args.python or sys.executable, foreign=bool(args.python))
        rows.append({
            "name": info.name, "aliases": list(info.aliases), "available": avail.available,
            "version": avail.version, "reason": avail.reason, "location": avail.location,
            "distribution": avail.distribution, "installed": list(avail.installed), "note": avail.note,
            "summary": info.summary,
            "capabilities": sorted(c.value for c in info.capabilities),
            "options": dict(info.options), "scoped_options": dict(info.scoped_options), "extra": info.extra,
        })
    if args.json:
        print(json.dumps({"backends": rows, "host_options": dict(HOST_OPTIONS),
                          "python": args.python or sys.executable}, indent=2))
        return 0
    print(f"under {args.python or sys.executable}:")
    width = max(len(r["name"]) for r in rows)
    for row in rows:
        state = f"yes  {_imported(row)}" if row["available"] else "no   " + (row["reason"] or "")
        print(f"{row['name']:<{width}}  {state}")
        if row["note"]:
            print(f"{'':<{width}}  note: {row['note']}")
        print(f"{'':<{width}}  {row['summary']}")
        print(f"{'':<{width}}  capabilities: {', '.join(row['capabilities'])}")
        if args.options:
            for key, text in [*row["options"].items(), *row["scoped_options"].items()]:
                print(f"{'':<{width}}    {key}: {text}")
    if args.options:
        print("options every backend accepts:")
        for key, text in HOST_OPTIONS.items():
            print(f"  {key}: {text}")
    print("\nspec syntax: NAME[:key=value,...]  lists inside a value use ';', e.g.\n"
          "  onnxruntime:opt_level=all,disabled=LayerNormFusionL1;SimplifiedLayerNormFusion\n"
          "ONNX Runtime provider options: <ep>.<key>=<value> for a provider of providers=, e.g.\n"
          "  onnxruntime:providers=CUDAExecutionProvider,cuda.use_tf32=0")
    return 0


def _list_passes(text: str) -> int:
    """Print the passes ``text``'s backend lists under that spec (its worker's library: ``python=`` counts)."""
    from graphbisect.backends.process import BackendProcess

    resolve(text, require_available=False)  # a misspelled name or option is refused before any worker starts
    print(f"starting a worker for {text} ...", file=sys.stderr, flush=True)
    with BackendProcess(text) as process:
        names = process.registered_passes()
    if names is None:
        raise SpecError(f"backend {process.backend.name!r} cannot list its passes",
                        hint="`graphbisect backends` shows the backends that can: capability passes")
    print("\n".join(names))
    return 0


def _imported(row: Mapping[str, Any]) -> str:
    """``1.31.1 (onnxruntime-gpu, /venv/.../onnxruntime)``: the version ``import`` gives, whose files, where."""
    where = ", ".join(str(row[key]) for key in ("distribution", "location") if row.get(key))
    return f"{row['version'] or ''}" + (f" ({where})" if where else "")


def _under(info: BackendInfo, measured: Mapping[str, Availability], python: str, *, foreign: bool) -> Availability:
    """``info``'s availability as measured under ``python`` (under another interpreter: only the backends that
    can run there)."""
    if foreign and not info.has(Capability.FOREIGN_PYTHON):
        return Availability(False, None, "cannot run under another interpreter (python=)")
    return measured.get(info.name) or Availability(False, None, f"not registered under {python}")
