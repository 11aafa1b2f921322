"""`graphbisect compare`: verdict on the final outputs, then a layerwise table with the first divergence."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from graphbisect.backends.base import brief_spec
from graphbisect.cli.common import (
    add_model_arguments,
    chosen_for,
    count,
    load_feeds,
    load_model_arg,
    output_file,
    output_path,
    refuse_inside,
    refuse_same,
    tolerance_from_args,
)
from graphbisect.cli.terminal import shown
from graphbisect.text.printable import plural

if TYPE_CHECKING:
    from graphbisect.workflows.compare import CompareResult

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--json", type=output_file, metavar="PATH", help="write the full result as JSON")
    parser.add_argument("--html", type=output_file, metavar="PATH",
                        help="write an HTML report with a per-node error chart")
    parser.add_argument("--csv", type=output_file, metavar="PATH", help="write the layerwise table as CSV")
    parser.add_argument("--no-layerwise", action="store_true", help="compare final outputs only (2 runs, not 4)")
    parser.add_argument("--all-tensors", action="store_true",
                        help="probe every intermediate tensor of the target, even when it can describe what it "
                        "compiled (default: only the tensors that survive its fusions, so fused nodes stay fused)")
    parser.add_argument("--workdir", type=output_path,
                        help="keep the normalized model, inputs and the oracle's "
                        "activation store here (default: a temporary folder)")
    parser.add_argument("--rows", type=count(0), default=30,
                        help="layer rows to print around the divergence (default 30; "
                        "0 = all)")


def run(args: argparse.Namespace) -> int:
    from graphbisect.backends.process import prestart

    for spec in dict.fromkeys((args.oracle, args.target)):  # their zygote imports while this process does
        prestart(spec)
    from graphbisect.artifacts.compare_report import write_csv, write_html, write_json
    from graphbisect.workflows.compare import compare_models

    outputs = {"--json": args.json, "--html": args.html, "--csv": args.csv}
    refuse_inside(outputs, args.workdir, "the work folder")
    refuse_same(outputs)
    model = load_model_arg(args)
    feeds = load_feeds(args, model)
    extra: dict[str, object] = {}
    if args.inputs is None:
        from graphbisect.data import parse_shapes, random_input_notes

        notes = random_input_notes(model, shapes=parse_shapes(args.shape))
        # the shapes that ran: a dynamic dim takes a size chosen here (or given with --shape)
        shapes = {name: [int(d) for d in getattr(value, "shape", ())] for name, value in feeds.items()}
        print(f"… random inputs (seed {args.seed}; pass real ones with --inputs):", file=sys.stderr)
        for name, how in notes.items():
            shape = "x".join(map(str, shapes.get(name, []))) or "scalar"
            print(f"    {name}: {how}, shape {shape}", file=sys.stderr)
        extra.update(random_inputs=notes, input_shapes=shapes, seed=args.seed)
    else:
        extra["inputs"] = str(Path(args.inputs).absolute())
    result = compare_models(
        model, oracle=args.oracle, target=args.target, inputs=feeds, chosen=chosen_for(args, model),
        tolerance=tolerance_from_args(args), workdir=args.workdir, layerwise=not args.no_layerwise,
        all_tensors=args.all_tensors, seed=args.seed,
        on_stage=lambda msg: print(f"… {msg}", file=sys.stderr),
    )
    result = dataclasses.replace(result, extra={**result.extra, **extra})
    print_result(result, rows=args.rows)
    for path, writer in ((args.json, write_json), (args.html, write_html), (args.csv, write_csv)):
        if path is not None:
            writer(result, path)
            print(f"wrote {path}")
    return 0 if result.passed else 1


def print_result(result: CompareResult, *, rows: int) -> None:
    from graphbisect.artifacts.compare_text import dims_line, num, verdict_line
    from graphbisect.artifacts.environment import describe_ran_with

    print(f"model   {shown(result.model.origin)}  ({plural(len(result.model.nodes), 'node')}, "
          f"{result.model.fingerprint[:12]})")
    for role, spec in (("oracle", result.oracle), ("target", result.target)):
        print(f"{role}  {brief_spec(spec)}  [{describe_ran_with(result.versions.get(role))}]")
    if not result.target_run.ok:
        print(f"\nTARGET FAILED: {result.target_run.describe()}")
    if result.comparison is not None:
        print(f"\n{'output':<24} {'verdict':<9} {'mismatched':>14} {'max abs':>10} {'max rel':>10} {'cosine':>9}")
        for s in result.comparison.outputs:
            print(f"{shown(s.name)[:24]:<24} {s.kind.value:<9} {f'{s.mismatches}/{s.numel}':>14} {num(s.max_abs):>10} "
                  f"{num(s.max_rel):>10} {num(s.cosine):>9}")
    if result.layerwise_note:
        print(f"\nNOTE: {result.layerwise_note}")
    if result.noise_floor is not None:
        print(f"\n{result.noise_floor.describe()}")
    if result.layerwise is not None:
        _print_layers(result, rows)
    print(f"\n{verdict_line(result)}")
    if dims_line(result):
        print(dims_line(result))


def _print_layers(result: CompareResult, rows: int) -> None:
    from graphbisect.artifacts.compare_text import (
        compiled_as_cell,
        constants_note,
        first_divergence_lines,
        floor_rows_note,
        num,
        ran_in_cell,
        root_cause_lines,
        row_mark,
    )

    layers = result.layerwise
    assert layers is not None
    table = [r for r in layers.rows if r.compared]
    first = layers.first_divergence
    start = 0
    if rows and len(table) > rows:
        at = table.index(first) if first is not None else 0
        start = max(0, min(at - rows // 3, len(table) - rows))
        table = table[start:start + rows]
    print(f"\nlayerwise ({layers.compared} tensors compared{', showing ' + str(len(table)) if rows else ''}):")
    if result.compiled is not None:
        print(f"target probed where its compiled graph keeps tensors: {result.compiled.summary()}")
    if result.target_probe is not None:
        print(f"target's values from {result.target_probe.describe()}")
    compiled = result.compiled is not None
    ran = compiled and any(n.precision for n in result.compiled.nodes)  # type: ignore[union-attr]
    print(f"{'#':>5} {'op':<14} {'node':<28} {'shape':<14} {'mismatched':>13} {'max abs':>9} {'max rel':>9} "
          f"{'cosine':>8}  " + ("compiled as".ljust(30) + " " if compiled else "")
          + ("ran in".ljust(9) + " " if ran else "") + "target [min, max] (oracle)")
    for r in table:
        s = r.stats
        shape = "x".join(map(str, s.oracle_shape or ())) or "scalar"
        if s.oracle_shape != s.target_shape:
            shape += "!"
        rng = f"[{num(s.target_range[0])}, {num(s.target_range[1])}]" if s.target_range else "-"
        orng = f"[{num(s.oracle_range[0])}, {num(s.oracle_range[1])}]" if s.oracle_range else "-"
        print(f"{row_mark(r, first):<2}{r.index:>3} {shown(r.op_type)[:14]:<14} {shown(r.node)[:28]:<28} "
              f"{shape[:14]:<14} {f'{s.mismatches}/{s.numel}':>13} {num(s.max_abs):>9} {num(s.max_rel):>9} "
              f"{num(s.cosine):>8}  " + (f"{shown(compiled_as_cell(r.compiled_as, width=30)):<30} " if compiled else "")
              + (f"{ran_in_cell(r.compiled_as)[:9]:<9} " if ran else "") + f"{rng} ({orng})")
    for note in (constants_note(result), floor_rows_note(result)):
        if note:
            print(f"\n{note}")
    lines = first_divergence_lines(result)
    print(f"\n{shown(lines[0])}")
    for line in lines[1:]:
        print(f"  {shown(line)}")
    for line in root_cause_lines(result):
        print(shown(line))
