"""`graphbisect precision`: the fewest nodes that must stay FP32 under fp16/bf16/int8, with sensitivity ranking."""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING

from graphbisect.backends import BackendSpec
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
    tolerance_from_args,
)
from graphbisect.cli.progress import ProgressLine
from graphbisect.cli.terminal import shown
from graphbisect.storage.atomic import atomic_write_text
from graphbisect.text.printable import plural

if TYPE_CHECKING:
    from graphbisect.workflows.precision import PrecisionResult

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # reduced precision is judged at a few-percent tolerance
    add_model_arguments(parser, atol=1e-2, rtol=1e-2, example="precision")
    parser.add_argument("--mode", default="fp16", choices=["fp16", "bf16", "int8"],
                        help="precision the other nodes run in (default fp16): int8 by QDQ (real int8 kernels on "
                        "ONNX Runtime), fp16/bf16 emulated by Cast islands, or, with a target that computes in it "
                        "itself (--target openvino:precision=bf16), by the target with per-node FP32 pins, or per op "
                        "type on Paddle Inference (PADDLE_DIR --target paddle:precision=bf16)")
    parser.add_argument("--sensitivity", action="store_true",
                        help="also measure every node alone (2 runs per node): ranked table, chart, priors")
    parser.add_argument("--calibration", default="minmax", choices=["minmax", "percentile", "entropy"],
                        help="int8 activation ranges from the oracle's tensors: minmax (default), percentile "
                        "(99.99th) or entropy (the KL-divergence-optimal clipping threshold, as TensorRT)")
    checks = parser.add_mutually_exclusive_group()
    checks.add_argument("--alone", dest="alone", action="store_const", const=True, default=None,
                        help="check every kept node alone (everything else FP32: one run each) to mark those that "
                        "break the tolerance by themselves (default: only when at most 32 are kept)")
    checks.add_argument("--no-alone", dest="alone", action="store_const", const=False,
                        help="never check kept nodes alone")
    parser.add_argument("--no-prefix", action="store_true",
                        help="skip Polygraphy's prefix answer (about log2(n) runs)")
    parser.add_argument("--max-invocations", type=count(0), default=None, metavar="N", help="target run budget")
    parser.add_argument("-j", "--jobs", type=count(1), default=1, metavar="N",
                        help="test candidates in N target workers at once (same answer, more CPU; for idle "
                        "cores; not with a target that pins nodes itself)")
    parser.add_argument("--json", type=output_file, metavar="PATH", help="write the result as JSON")
    parser.add_argument("-o", "--output", type=output_path, metavar="DIR",
                        help="write the mixed-precision model(s), overrides and the sensitivity chart here")
    parser.add_argument("--workdir", type=output_path,
                        help="keep intermediate files here (default: a temporary folder)")
    parser.add_argument("--rows", type=count(0), default=20, help="sensitivity rows to print (default 20)")


def run(args: argparse.Namespace) -> int:
    """Exit 0 when the verified answer meets the tolerance (for FP16, the typed model to deploy too), else 1."""
    from graphbisect.workflows.precision import find_precision

    refuse_inside({"--json": args.json}, args.output, "the output folder")
    refuse_inside({"--json": args.json}, args.workdir, "the work folder")
    model = load_model_arg(args)
    feeds = load_feeds(args, model)
    progress = ProgressLine(label="precision", unit="nodes in FP32")
    try:
        result = find_precision(
            model, mode=args.mode, oracle=args.oracle, target=args.target, inputs=feeds,
            chosen=chosen_for(args, model), tolerance=tolerance_from_args(args), workdir=args.workdir,
            out_dir=args.output, with_sensitivity=args.sensitivity, with_prefix=not args.no_prefix,
            calibration=args.calibration, max_invocations=args.max_invocations, seed=args.seed,
            on_stage=progress.stage, on_progress=progress, alone=args.alone, jobs=args.jobs,
        )
    finally:
        progress.close()
    print_result(result, rows=args.rows, data=_data_flags(args))
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    for path in result.files:
        print(f"wrote {path}")
    return 0 if result.meets_tolerance else 1


def _num(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else str(value)


def _data_flags(args: argparse.Namespace) -> list[str] | None:
    """The flags that give another command this run's inputs (None: the bundled example's, in memory only)."""
    if getattr(args, "example_inputs", None) is not None:
        return None
    if args.inputs is not None:
        return ["--inputs", str(args.inputs)]
    return [*(["--seed", str(args.seed)] if args.seed else []), *(f"--shape={shape}" for shape in args.shape or ())]


def print_result(result: PrecisionResult, *, rows: int, data: list[str] | None = None) -> None:
    """The run's report: the units searched, the sensitivity table (its first ``rows``; 0: all), the FP32 set,
    what the lowering and the target's pins did, and the verdict (``data``: the flags that give another command
    this run's inputs, :func:`_data_flags`)."""
    print(f"mode    {result.mode.value}: {result.lowering}")
    op_types = result.extra.get("unit") == "op_type"
    if op_types:
        print(f"units   {len(result.units)} op types the target computed in {result.mode.value}: "
              f"{', '.join(result.units)}")
    else:
        print(f"units   {len(result.units)} lowerable nodes")
    if result.sensitivity:
        print(f"\n{'node':<44} {'op':<12} {'score':>9} {'cosine':>9} {'snr dB':>8}  kept-alone score")
        for row in result.sensitivity[: rows or None]:
            mark = "x " if row.breaks_alone else "  "
            print(f"{mark}{shown(row.node)[:42]:<42} {shown(row.op_type)[:12]:<12} {_num(row.score):>9} "
                  f"{_num(row.lowered['cosine']):>9} {_num(row.lowered['snr_db']):>8}  {_num(row.kept['score'])}")
    if result.all_lowered_meets:
        searched = " searched" if result.extra.get("int8_float_nodes") else ""  # the others stayed float
        print(f"\nthe fully lowered model meets the tolerance: no{searched} node needs FP32")
    print(f"tolerance atol {result.tolerance.atol:g}, rtol {result.tolerance.rtol:g}")
    if str(result.extra.get("oracle_expected", "")).endswith("differ)"):
        print("note: the oracle computes the model differently when its intermediates are exposed; the expected "
              "outputs are its run of the model as built (an oracle that computes the graph as written, e.g. "
              "--oracle reference, avoids this)")
    _print_keep(result, op_types=op_types)
    _print_not_searched(result)
    _print_pins(result, op_types=op_types)
    _print_verdict(result, data=data)


def _print_keep(result: PrecisionResult, *, op_types: bool) -> None:
    """The FP32 set, each member marked when it breaks the tolerance alone, or why that was not checked."""
    from graphbisect.workflows.precision import ALONE_AUTO_MAX

    stopped = f": the search stopped early ({result.stop_reason})" if result.stop_reason else ""
    one = result.claim("one_minimal")  # the checker's: 1-minimal only where it holds
    minimal = ", 1-minimal" if result.minimal else \
        f", 1-minimal {_not_held(one)}" if one is not None else ", NOT proven minimal"
    print(f"\nkeep in FP32 ({len(result.keep_fp32)}{' op types' if op_types else ''}{minimal}{stopped}):")
    breakers = set(result.alone or ())  # the checker's: each run alone
    for name in result.keep_fp32:
        print(f"  {shown(name)}{'   (breaks the tolerance alone)' if name in breakers else ''}")
    search = result.extra.get("alone_search")
    if isinstance(search, dict):  # the search's word, where the checker's plain runs did not find it
        said = ", ".join(map(shown, search.get("breaks_alone") or ())) or "none"
        verdict = "does NOT hold (the checker)" if search.get("holds") is False else "not established by the checker"
        print(f"the search found these to break the tolerance alone: {said} — {verdict}"
              + ("; marked above: the checker's runs" if result.alone is not None else ""))
    elif result.alone is None and result.keep_fp32:
        why = {"budget": "the run budget ended first", "skipped": "--no-alone",
               "skipped_many": f"{len(result.keep_fp32)} kept; by default only up to {ALONE_AUTO_MAX}, "
                               "--alone checks them"}
        print(f"which of them break the tolerance alone: not checked "
              f"({why.get(str(result.extra.get('alone_checked')), 'not run')})")


def _print_not_searched(result: PrecisionResult) -> None:
    """The nodes the int8 lowering keeps in float in every run, and Polygraphy's prefix answer."""
    floats = result.extra.get("int8_float_nodes")
    if isinstance(floats, list) and floats:
        print(f"kept in float by the int8 lowering in every run, not searched ({len(floats)}; the overrides "
              "exclude them from quantization too):")
        for entry in floats:
            print(f"  {shown(str(entry['node']))}: {entry['why']}")
    if result.prefix_keep_fp32 is not None:  # the checker's: the prefix meets the tolerance, one node less not
        print(f"Polygraphy-style prefix answer: the first {len(result.prefix_keep_fp32)} nodes in FP32")
    search = result.extra.get("prefix_search")
    if isinstance(search, dict):
        verdict = "does NOT hold (the checker)" if search.get("holds") is False else "not established by the checker"
        print(f"Polygraphy-style prefix answer (the search's): the first {search.get('prefix_keep_fp32')} nodes in "
              f"FP32 — {verdict}")


def _print_pins(result: PrecisionResult, *, op_types: bool) -> None:
    """With runtime pins: those the target did not apply (or only partly, or left no trace of); with op-type
    pins, what the verified run computed in reduced precision and the target's configuration."""
    for key, what in (("runtime_pins_not_applied", f"ran in {result.mode.value} anyway"),
                      ("runtime_pins_partly_applied", f"ran partly in {result.mode.value} (fused into a neighbour)"),
                      ("runtime_pins_unverified", "left no trace in the execution graph")):
        names = result.extra.get(key)
        if isinstance(names, list) and names:
            more = " ..." if len(names) > 5 else ""
            print(f"{plural(len(names), 'pinned node')} {what}: {', '.join(map(shown, names[:5]))}{more}")
    if op_types:
        low = result.extra.get("low_precision_op_types")
        if isinstance(low, list):
            print(f"the verified run computed in {result.mode.value}: {', '.join(map(str, low)) or 'no op type'}")
        print(f"Paddle Inference config:\n{result.extra.get('paddle_config', '')}")


def _print_verdict(result: PrecisionResult, *, data: list[str] | None) -> None:
    """Whether the model with the overrides meets the tolerance (the typed model's own verdict beside it), and
    what the run cost."""
    _print_verdicts(result, data)
    calls = {role: n for role, n in result.invocations.items() if role in result.backend_calls} or \
        dict(result.invocations)  # search_tests counts the search's tests, not backend calls
    tests = result.invocations.get("search_tests")
    print(f"invocations: {describe_calls(calls, result.backend_calls)}"
          + (f"; {tests} search tests" if tests is not None else "") + f"; {result.seconds:.1f} s")
    if result.meets_tolerance and result.dims_note:
        print(f"note: {result.dims_note}")


def _print_verdicts(result: PrecisionResult, data: list[str] | None) -> None:
    """Whether the answer (and, for FP16, the typed model) meets the tolerance: the search's word where the
    checker's plain run of the file confirms it, else how the checker left it; then the checker's claims."""
    typed = result.extra.get("typed_model")
    emulated_meets = result.extra.get("answer_meets")  # the search's verdict on the answer (not the typed model)
    if not isinstance(emulated_meets, bool):
        emulated_meets = result.meets_tolerance or (isinstance(typed, dict) and not typed["meets"])
    checked = result.claim("verified")
    if checked is not None and checked.get("holds") is not True:  # the checker's plain run does not confirm it
        print(f"\nNOT verified: {checked.get('claim')}: {_not_held(checked)} ({checked.get('evidence')})")
    else:
        verdict = "meets the tolerance" if emulated_meets else "DOES NOT meet the tolerance"
        print(f"\n{'verified' if emulated_meets else 'NOT verified'}: the model with these overrides {verdict} "
              f"(score {_num(result.final_metrics['score'])}, cosine {_num(result.final_metrics['cosine'])})")
    if isinstance(typed, dict):
        typed_claim = result.claim("typed")
        if typed_claim is not None and typed_claim.get("holds") is not True:
            print(f"NOT verified: {typed_claim.get('claim')}: {_not_held(typed_claim)} "
                  f"({typed_claim.get('evidence')})")
        else:
            _print_typed(typed, result.mode.value, str(typed.get("target", "TARGET")), data=data)
    _print_audit(result)


def _not_held(claim: Mapping[str, object] | None) -> str:
    """How the checker left a claim it did not confirm."""
    holds = None if claim is None else claim.get("holds")
    return "does NOT hold (the checker)" if holds is False else "not established by the checker"


def _print_audit(result: PrecisionResult) -> None:
    """The checker's verdict on each claim, with the evidence of those that do not hold."""
    from graphbisect.workflows.precision_claims import claim_lines

    if result.audit is None:
        return
    runs = ", ".join(f"{role} {n}" for role, n in (result.audit.get("runs") or {}).items())
    print(f"checked ({runs} plain runs of the files written, a checker that shares no code with the search):")
    for line in claim_lines(result.audit):
        print(line)


def _print_typed(typed: dict[str, object], mode: str, target: str, *, data: list[str] | None = None) -> None:
    """The typed model's own verdict (``typed_model``, see ``workflows/precision._verify_typed``), and what to do
    when it misses the tolerance: the word "verified" only for a typed model measured to meet it."""
    what = "mixed_precision_typed.onnx (float16 types, the model to deploy)"
    added = [str(n) for n in typed.get("added_fp32", []) or []]  # type: ignore[attr-defined]
    how = (f"failed to run on the target: {typed['error']}" if "error" in typed else
           f"{'meets' if typed['meets'] else 'DOES NOT meet'} the tolerance on the target "
           f"(score {_num(float(str(typed['score'])))})")
    if typed["meets"]:
        more = (f" with {plural(len(added), 'more node')} in FP32 than the search's answer: "
                f"{', '.join(map(shown, added))} "
                f"(the search emulates {mode} storage with float32 arithmetic inside each node; the target's "
                "float16 kernels computed differently; the overrides and mixed_precision.onnx carry the search's "
                "answer: keep these nodes in FP32 there too)") if added else ""
        print(f"verified: {what} {how}{more}")
        return
    tried = (f"; keeping {', '.join(map(shown, added))} in FP32 as well did not bring it within the tolerance"
             if added else "")
    print(f"NOT verified: {what} {how}{tried}")
    plain = typed.get("unoptimized")
    if isinstance(plain, dict) and plain.get("meets"):
        level = plain["opt_level"]
        unoptimized = BackendSpec.parse(target).with_options(opt_level=str(level))
        print(f"  with the target's optimizations off (opt_level={level}) it meets the tolerance (score "
              f"{_num(float(str(plain['score'])))}): the target's optimizations break it, not its plain float16 "
              "kernels")
        command = shlex.join(["graphbisect", "passes", "mixed_precision_typed.onnx", "--oracle", str(unoptimized),
                              "--target", target, *(data or [])])
        print(f"what to do: deploy the typed model on {unoptimized} (measured above to meet the tolerance), or "
              f"look for the pass: `{command}` (in the output folder"
              f"{'' if data is not None else ', with the same inputs'}) lists the passes that change its values "
              "between the two builds, at that command's own tight default tolerance, so it may also name passes "
              "whose effect alone is within yours")
        return
    print(f"what to do: do not deploy the typed model as it is: `graphbisect compare mixed_precision_typed.onnx "
          f"--target {target}` shows where the target's float16 kernels diverge (those nodes must stay in FP32 as "
          f"well); the overrides were verified only by emulation ({mode} storage, float32 arithmetic inside each "
          "node), which is what mixed_precision.onnx runs")
