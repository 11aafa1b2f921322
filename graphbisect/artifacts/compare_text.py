"""The sentences `graphbisect compare` says about a result, for the terminal and the HTML report alike.

The CLI prints them (:func:`graphbisect.cli.compare_cmd.print_result`) and :mod:`.compare_report` writes them
into the HTML page, so the page says what the terminal says — the first divergence with the compiled node and
the original nodes it replaced, each root cause with what it was compiled as, the notes — and cannot drift
from it (the HTML lacked the first-divergence sentence and the "compiled as" column while the terminal had
both). Plain text: each writer escapes for its medium.

Example:
    >>> compiled_as_cell(None)
    '- (not in compiled graph)'
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from graphbisect.backends.cost import describe_calls
from graphbisect.text.printable import plural, shown

if TYPE_CHECKING:
    from graphbisect.localize.compiled import CompiledNode
    from graphbisect.localize.layerwise import LayerRow, RootCause
    from graphbisect.workflows.compare import CompareResult

__all__ = ["MARKS", "ORIGINALS_SHOWN", "compiled_as_cell", "constants_note", "dims_line", "first_divergence_lines",
           "floor_rows_note", "num", "ran_in_cell", "root_cause_line", "root_cause_lines", "row_mark",
           "verdict_line"]

#: The layer table's marks (first column) and what each row is, as the terminal and the HTML legend say.
MARKS: tuple[tuple[str, str, str], ...] = (
    (">>", "first", "first divergence: the first tensor beyond the tolerance (above the target's noise floor)"),
    ("x", "fail", "mismatch: beyond the tolerance"),
    ("f", "floor", "beyond the tolerance but within the target's noise floor: kernel precision, not a divergence"),
    ("c", "constant", "a constant the target folded: differs as the target exposes it, not ranked as a cause"),
    ("-", "unobserved", "not observed: the target fused it away (or folded it), so it exposes no value to compare"),
)
#: Original nodes a first-divergence sentence names before ``...`` (a fusion can cover hundreds).
ORIGINALS_SHOWN = 12


def num(value: float) -> str:
    """A statistic as the tables show it; NaN (a relative error with no meaningful element) is ``-``.

    Example:
        >>> num(1234.5678), num(float("nan")), num(float("inf"))
        ('1.23e+03', '-', 'inf')
    """
    return f"{value:.3g}" if math.isfinite(value) else "-" if math.isnan(value) else str(value)


def compiled_as_cell(node: CompiledNode | None, width: int | None = None) -> str:
    """The layer table's "compiled as" cell: the compiled node, and how many original nodes it covers.

    ``width``: at most that many characters (the terminal's column), the kind shortened with ``…`` so that the
    count stays: cutting the cell's end cut the count off ("SkipSimplifiedLayerNormalizatio").

    Example:
        >>> from graphbisect.localize.compiled import CompiledNode
        >>> node = CompiledNode("n", "SkipSimplifiedLayerNormalization", ("a", "b", "c"), ("y",), inferred=("c",))
        >>> compiled_as_cell(node), compiled_as_cell(node, width=30)
        ('SkipSimplifiedLayerNormalization ×3 (1 inferred)', 'SkipSimplifie… ×3 (1 inferred)')
    """
    if node is None:
        return "- (not in compiled graph)"[:width]
    suffix = f" ×{len(node.originals)}" if node.fused else ""
    inferred = f" ({len(node.inferred)} inferred)" if node.fused and node.inferred else ""
    if width is not None and len(node.kind) + len(suffix) + len(inferred) > width:
        if width - len(suffix) - len(inferred) < 8:
            inferred = ""  # the count matters more than how many of its nodes were inferred
        room = width - len(suffix) - len(inferred)
        kind = node.kind if len(node.kind) <= room else node.kind[:max(room - 1, 1)] + "…"
        return (kind + suffix + inferred)[:width]
    return node.kind + suffix + inferred


def ran_in_cell(node: CompiledNode | None) -> str:
    """The layer table's "ran in" cell: the types the target computed the node in, ``i8<f32`` when narrower than
    the model's (the model's widest float after ``<``), ``-`` when it did not say."""
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


def row_mark(row: LayerRow, first: LayerRow | None) -> str:
    """The row's mark of :data:`MARKS` (``""`` for a tensor within the tolerance)."""
    s = row.stats
    if row is first:
        return ">>"
    if not row.compared:
        return "-"
    if row.constant and not s.passed:
        return "c"
    if row.at_floor:
        return "f"
    return "x" if not s.passed else ""


def first_divergence_lines(result: CompareResult, *, originals: int | None = ORIGINALS_SHOWN) -> list[str]:
    """The first divergence: the compiled node and the original nodes it replaced when the target fused it,
    else the original node; or that no tensor diverges. ``originals``: how many to name (None: all)."""
    layers = result.layerwise
    if layers is None:
        return []
    first = layers.first_divergence
    if first is None:
        noise = any(r.at_floor for r in layers.rows)
        return ["no intermediate tensor diverges" + (" above the target's noise floor" if noise else "")]
    fused = first.compiled_as if first.compiled_as is not None and first.compiled_as.fused else None
    if fused is None:
        lines = [f"first divergence: {first.node} ({first.op_type}) → tensor {first.tensor}, "
                 f"{num(first.stats.score)}× tolerance"]
    else:
        listed = fused.originals if originals is None else fused.originals[:originals]
        lines = [f"first divergence: compiled node {fused.kind} {fused.name!r} → tensor {first.tensor}, "
                 f"{num(first.stats.score)}× tolerance",
                 f"it replaced {len(fused.originals)} original nodes: {', '.join(listed)}"
                 + (", ..." if len(listed) < len(fused.originals) else "")
                 + (f" ({fused.inferred_note()}: the target did not name them)" if fused.inferred else "")]
    aligned = result.compiled is not None and result.compiled.aligned and first.tensor in result.compiled.values
    if aligned and result.passed:
        lines.append("the outputs match, and the target names no tensor of the model: its value here was matched to "
                     "this tensor by inference (op order, type and shape), so the alignment may be wrong, not the "
                     "target")
    if first.passes_on:
        lines.append(f"an exact tensor whose node reads an input already off ({num(first.input_score)}× tolerance, "
                     "accepted): an exact op passes any difference on, so whether the error starts here or before "
                     "it only a run of it alone says (its root-cause evidence below)")
    if first.lsb is not None:
        lines.append(f"a quantized tensor: {num(first.lsb)} quantization steps (LSB) off"
                     + (f" (step {num(first.step)})" if first.step else "")
                     + (f", the tolerance {num(result.tolerance.int_atol)} (--int-atol)" if result.tolerance else ""))
    if first.compiled_as is not None and first.compiled_as.lower_precision:
        lines.append(f"the target {first.compiled_as.precision_note()} (what it reports it ran: its own choice, not "
                     f"the model's){_precision_hint(result, first.compiled_as)}")
    return lines


#: How a root cause's evidence reads beside its role (nothing for inputs measured).
_EVIDENCE = {"confirmed": "; inputs not exposed, fails alone on the oracle's inputs",
             "received": "; inputs not exposed, passes alone on the oracle's inputs",
             "unconfirmed": "; inputs not exposed, not run alone"}


def root_cause_line(rc: RootCause) -> str:
    """One root cause: node, amplification, role (and what it rests on when its inputs were not exposed) and,
    when fused, what the target compiled it as."""
    where = f"  compiled as {rc.compiled_as.describe()}" if rc.compiled_as is not None and rc.compiled_as.fused \
        else ""
    evidence = _EVIDENCE.get(rc.evidence, "")
    if evidence and not rc.hidden_inputs:  # an exact output reading an accepted difference (LayerRow.passes_on)
        evidence = evidence.replace("inputs not exposed", "exact, its inputs already off (accepted)")
    return f"{rc.node} ({rc.op_type}): {num(rc.score)}  [{rc.role}{evidence}]{where}"


def root_cause_lines(result: CompareResult, *, limit: int | None = 5) -> list[str]:
    """The root causes under their heading (the first ``limit``; None: all) and how the uncertain ones were run
    alone; for a passing run, that there are none. Empty without a divergence."""
    layers = result.layerwise
    if layers is None or layers.first_divergence is None:
        return []
    if result.passed:
        return ["no root causes: the outputs match, so these intermediate differences cause no failure"]
    roots = layers.root_causes if limit is None else layers.root_causes[:limit]
    lines = ["root causes (error amplification, in tolerances):", *(f"  {root_cause_line(rc)}" for rc in roots)]
    if result.root_cause_check is not None:
        lines.append(f"  ({result.root_cause_check.describe()})")
    return lines


def constants_note(result: CompareResult) -> str | None:
    """What the ``c`` rows are, when there are any."""
    constants = result.layerwise.differing_constants if result.layerwise is not None else ()
    if not constants:
        return None
    return (f"c: {plural(len(constants), 'constant tensor')} (computed from no input, folded by the target) differ as "
            "the target exposes them, e.g. an int64 INT64_MIN stored as INT32_MIN or an empty tensor as [1]; "
            "not ranked as causes (a wrongly folded constant shows at its consumer)")


def floor_rows_note(result: CompareResult) -> str | None:
    """What the ``f`` rows are, when there are any and a floor was measured."""
    noise = [r for r in result.layerwise.rows if r.at_floor] if result.layerwise is not None else []
    if not noise or result.noise_floor is None:
        return None
    return (f"f: {plural(len(noise), 'tensor')} beyond the tolerance but within {num(result.noise_floor.margin)}× the "
            "target's noise floor (its error with optimizations off): kernel precision, not divergences")


def verdict_line(result: CompareResult) -> str:
    """The result in one line: PASS, or FAIL with the outcome, the backend runs and the time."""
    verdict = "PASS: outputs match" if result.passed else f"FAIL: {shown(str(result.outcome))}"  # one line
    return (f"{verdict}  (invocations: {describe_calls(result.invocations, result.backend_calls)}; "
            f"{result.seconds:.1f} s)")


def dims_line(result: CompareResult) -> str | None:
    """For a pass on dynamic dims graphbisect sized: that the verdict holds for those sizes only."""
    return f"NOTE: {result.dims_note}" if result.passed and result.dims_note else None
