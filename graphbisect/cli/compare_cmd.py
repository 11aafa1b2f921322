"""`graphbisect compare`: verdict on the final outputs, then a layerwise table with the first divergence."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from graphbisect.cli.common import (
    add_model_arguments,
    count,
    feeds_for_api,
    load_feeds,
    load_model_arg,
    output_file,
    output_path,
    refuse_inside,
    refuse_same,
    tolerance_from_args,
)
from graphbisect.cli.terminal import shown

if TYPE_CHECKING:
    from graphbisect.localize.compiled import CompiledNode
    from graphbisect.localize.layerwise import LayerRow
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
    from graphbisect import api
    from graphbisect.artifacts.compare_report import write_csv, write_html, write_json

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
    result = api.compare(
        model, oracle=args.oracle, target=args.target, **feeds_for_api(args, feeds),
        tolerance=tolerance_from_args(args), workdir=args.workdir, layerwise=not args.no_layerwise,
        all_tensors=args.all_tensors,
        on_stage=lambda msg: print(f"… {msg}", file=sys.stderr),
    )
    result = dataclasses.replace(result, extra={**result.extra, **extra})
    print_result(result, rows=args.rows)
    for path, writer in ((args.json, write_json), (args.html, write_html), (args.csv, write_csv)):
        if path is not None:
            writer(result, path)
            print(f"wrote {path}")
    return 0 if result.passed else 1


def _num(value: float) -> str:
    """A statistic for the table; NaN (a relative error with no meaningful element) prints as ``-``."""
    return f"{value:.3g}" if math.isfinite(value) else "-" if math.isnan(value) else str(value)


def print_result(result: CompareResult, *, rows: int) -> None:
    from graphbisect.artifacts.environment import describe_ran_with

    print(f"model   {shown(result.model.origin)}  ({len(result.model.nodes)} nodes, {result.model.fingerprint[:12]})")
    for role, spec in (("oracle", result.oracle), ("target", result.target)):
        print(f"{role}  {spec}  [{describe_ran_with(result.versions.get(role))}]")
    if not result.target_run.ok:
        print(f"\nTARGET FAILED: {result.target_run.describe()}")
    if result.comparison is not None:
        print(f"\n{'output':<24} {'verdict':<9} {'mismatched':>14} {'max abs':>10} {'max rel':>10} {'cosine':>9}")
        for s in result.comparison.outputs:
            print(f"{shown(s.name)[:24]:<24} {s.kind.value:<9} {f'{s.mismatches}/{s.numel}':>14} {_num(s.max_abs):>10} "
                  f"{_num(s.max_rel):>10} {_num(s.cosine):>9}")
    if result.layerwise_note:
        print(f"\nNOTE: {result.layerwise_note}")
    if result.noise_floor is not None:
        print(f"\n{result.noise_floor.describe()}")
    if result.layerwise is not None:
        _print_layers(result, rows)
    verdict = "PASS: outputs match" if result.passed else f"FAIL: {result.outcome}"
    print(f"\n{verdict}  (invocations: {', '.join(f'{k} {v}' for k, v in result.invocations.items())}; "
          f"{result.seconds:.1f} s)")
    if result.passed and result.dims_note:
        print(f"NOTE: {result.dims_note}")


def _print_layers(result: CompareResult, rows: int) -> None:
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
          f"{'cosine':>8}  " + ("compiled as".ljust(30) + " " if compiled else "") + ("ran in".ljust(9) + " " if ran
                                                                                     else "")
          + "target [min, max] (oracle)")
    for r in table:
        s = r.stats
        mark = ">>" if r is first else ("c " if r.constant and not s.passed else "f " if r.at_floor
                                         else "x " if not s.passed else "  ")
        shape = "x".join(map(str, s.oracle_shape or ())) or "scalar"
        if s.oracle_shape != s.target_shape:
            shape += "!"
        rng = f"[{_num(s.target_range[0])}, {_num(s.target_range[1])}]" if s.target_range else "-"
        orng = f"[{_num(s.oracle_range[0])}, {_num(s.oracle_range[1])}]" if s.oracle_range else "-"
        print(f"{mark}{r.index:>3} {shown(r.op_type)[:14]:<14} {shown(r.node)[:28]:<28} {shape[:14]:<14} "
              f"{f'{s.mismatches}/{s.numel}':>13} {_num(s.max_abs):>9} {_num(s.max_rel):>9} {_num(s.cosine):>8}  "
              + (f"{shown(_compiled_as(r.compiled_as))[:30]:<30} " if compiled else "")
              + (f"{_ran_in(r.compiled_as)[:9]:<9} " if ran else "") + f"{rng} ({orng})")
    constants = layers.differing_constants
    if constants:
        print(f"\nc: {len(constants)} constant tensor(s) (computed from no input, folded by the target) differ as "
              "the target exposes them, e.g. an int64 INT64_MIN stored as INT32_MIN or an empty tensor as [1]; "
              "not ranked as causes (a wrongly folded constant shows at its consumer)")
    noise = [r for r in layers.rows if r.at_floor]
    if noise:
        print(f"\nf: {len(noise)} tensor(s) beyond the tolerance but within {_num(result.noise_floor.margin)}× the "
              "target's noise floor (its error with optimizations off): kernel precision, not divergences"
              if result.noise_floor is not None else "")
    if first is None:
        print("\nno intermediate tensor diverges" + (" above the target's noise floor" if noise else ""))
        return
    fused = first.compiled_as if first.compiled_as is not None and first.compiled_as.fused else None
    if fused is not None:
        print(f"\nfirst divergence: compiled node {shown(fused.kind)} {fused.name!r} → tensor {shown(first.tensor)}, "
              f"{_num(first.stats.score)}× tolerance")
        print(f"  it replaced {len(fused.originals)} original nodes: {', '.join(map(shown, fused.originals[:12]))}"
              + (", ..." if len(fused.originals) > 12 else "")
              + (f" ({fused.inferred_note()}: the target did not name them)" if fused.inferred else ""))
    else:
        print(f"\nfirst divergence: {shown(first.node)} ({shown(first.op_type)}) → tensor {shown(first.tensor)}, "
              f"{_num(first.stats.score)}× tolerance")
    _print_first_notes(result, first)
    if result.passed:
        print("no root causes: the outputs match, so these intermediate differences cause no failure")
        return
    print("root causes (error amplification, in tolerances):")
    for rc in layers.root_causes[:5]:
        fused_as = rc.compiled_as if rc.compiled_as is not None and rc.compiled_as.fused else None
        where = f"  compiled as {shown(fused_as.describe())}" if fused_as is not None else ""
        print(f"  {shown(rc.node)} ({shown(rc.op_type)}): {_num(rc.score)}  "
              f"[{rc.role}{_EVIDENCE.get(rc.evidence, '')}]{where}")
    if result.root_cause_check is not None:
        print(f"  ({result.root_cause_check.describe()})")


def _print_first_notes(result: CompareResult, first: LayerRow) -> None:
    """What the first divergence's line adds: its error in quantization steps, the narrower type it ran in."""
    if first.lsb is not None:
        print(f"  a quantized tensor: {_num(first.lsb)} quantization steps (LSB) off"
              + (f" (step {_num(first.step)})" if first.step else "")
              + (f", the tolerance {_num(result.tolerance.int_atol)} (--int-atol)" if result.tolerance else ""))
    if first.compiled_as is not None and first.compiled_as.lower_precision:
        print(f"  the target {first.compiled_as.precision_note()} (what it reports it ran: its own choice, not the "
              f"model's){_precision_hint(result, first.compiled_as)}")


#: How a root cause's evidence reads beside its role (nothing for inputs measured).
_EVIDENCE = {"confirmed": "; inputs not exposed, fails alone on the oracle's inputs",
             "received": "; inputs not exposed, passes alone on the oracle's inputs",
             "unconfirmed": "; inputs not exposed, not run alone"}


def _ran_in(node: CompiledNode | None) -> str:
    """The table's "ran in" cell: the types the target computed the node in, ``i8<f32`` when narrower than the
    model's (the model's widest float after ``<``), ``-`` when it did not say."""
    if node is None or not node.precision:
        return "-"
    lower = node.lower_precision
    if not lower:
        return "+".join(node.precision)
    floats = [m for m in node.model_precision if m.startswith(("f", "bf"))]
    return f"{'+'.join(lower)}<{floats[0] if floats else '?'}"


def _precision_hint(result: CompareResult, node: CompiledNode) -> str:
    """How to run the node in the model's precision, where graphbisect knows the backend's setting."""
    if result.target.name in ("openvino", "ov") and "FullyConnected" in node.kind:
        return ("; OpenVINO quantizes the activations of int8-weight layers dynamically: compare with "
                "openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0")
    if result.target.name in ("onnxruntime", "ort") and "MatMulNBits" in node.kind:
        return ("; ONNX Runtime's MatMulNBits with accuracy_level=4 quantizes its activations: compare with "
                "onnxruntime:config=session.qdq_matmulnbits_accuracy_level=0")
    return ""


def _compiled_as(node: CompiledNode | None) -> str:
    """The table's "compiled as" cell: the compiled node, and how many original nodes it covers."""
    if node is None:
        return "- (not in compiled graph)"
    if not node.fused:
        return node.kind
    return f"{node.kind} ×{len(node.originals)}" + (f" ({len(node.inferred)} inferred)" if node.inferred else "")
