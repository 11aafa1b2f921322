"""Writers for `graphbisect compare` results: JSON, CSV and an HTML page with the per-node error chart.

The page carries what the terminal shows, in the same sentences (:mod:`.compare_text`), and every layer row
with its class: ``first``, ``fail`` (mismatch), ``floor`` (within the target's noise floor), ``constant`` and
``unobserved`` (fused away), each with its mark and a legend.
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from graphbisect.artifacts.charts import ErrorPoint, error_chart_svg
from graphbisect.artifacts.compare_text import (
    MARKS,
    compiled_as_cell,
    constants_note,
    dims_line,
    first_divergence_lines,
    floor_rows_note,
    num,
    ran_in_cell,
    root_cause_lines,
    row_mark,
    verdict_line,
)
from graphbisect.storage.atomic import atomic_write_text
from graphbisect.text.printable import plural

if TYPE_CHECKING:
    from graphbisect.workflows.compare import CompareResult

__all__ = ["CSV_COLUMNS", "chart_points", "render_html", "spreadsheet_text", "write_csv", "write_html",
           "write_json"]

CSV_COLUMNS = ("index", "op_type", "node", "tensor", "kind", "oracle_shape", "target_shape", "mismatches", "numel",
               "max_abs", "max_rel", "cosine", "snr_db", "score", "input_score", "amplification",
               "oracle_range", "target_range", "compiled_as", "floor", "at_floor")


def write_json(result: CompareResult, path: Path) -> None:
    atomic_write_text(path, json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n")


def write_csv(result: CompareResult, path: Path) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in result.layerwise.rows if result.layerwise else ():
        writer.writerow({k: _cell(k, v) for k, v in row.to_json().items()})
    atomic_write_text(path, buf.getvalue())


def _cell(column: str, value: object) -> object:
    """A CSV cell: shapes as ``1x3x224x224``, value ranges as ``[-2.5, 1.9]`` (not ``-2.5x1.9``: a shape);
    text is :func:`spreadsheet_text`."""
    if isinstance(value, dict) and column == "compiled_as":  # the compiled node: kind, name, originals
        covers = plural(len(value["originals"]), "node")
        return spreadsheet_text(f"{value['kind']} {value['name']} ({covers})" + _ran_in(value))
    if isinstance(value, str):
        return spreadsheet_text(value)
    if isinstance(value, list) and column.endswith("_range"):
        return "[" + ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in value) + "]"
    if isinstance(value, list):
        return "x".join(str(v) for v in value)
    return value


#: What makes a spreadsheet read a cell as a formula (OWASP, "CSV Injection"): =, +, -, @, tab, carriage return.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_text(text: str) -> str:
    """``text`` as a CSV cell no spreadsheet evaluates: one starting like a formula gets a leading ``'``, as
    OWASP recommends (a node named ``=HYPERLINK(...)`` reached a cell spreadsheets run, issue 36 item 6).
    Numbers are written as numbers, never through here.

    Example:
        >>> spreadsheet_text("=1+2"), spreadsheet_text("-x"), spreadsheet_text("conv/Relu")
        ("'=1+2", "'-x", 'conv/Relu')
    """
    return "'" + text if text.startswith(_FORMULA_START) else text


def _ran_in(compiled: dict[str, object]) -> str:
    """``; ran in i8, the model f32`` for a compiled node that ran in a lower precision than the model, else ""."""
    lower, model = compiled.get("lower_precision"), compiled.get("model_precision")
    if not lower or not isinstance(lower, list) or not isinstance(model, list):
        return ""
    return f"; ran in {'+'.join(map(str, lower))}, the model {'+'.join(map(str, model))}"


def chart_points(result: CompareResult) -> list[ErrorPoint]:
    """The chart's bars: every tensor the target exposed, the first divergence and the top 3 root causes
    highlighted (and labelled), those within the target's noise floor greyed."""
    layers = result.layerwise
    if layers is None:
        return []
    roots = {rc.tensor for rc in layers.root_causes[:3]}
    first = layers.first_divergence.tensor if layers.first_divergence else None
    return [
        ErrorPoint(i, f"{row.node} ({row.op_type})", row.stats.score,
                   "first" if row.tensor == first else "root" if row.tensor in roots else
                   "floor" if row.at_floor else None)
        for i, row in enumerate(r for r in layers.rows if r.compared)
    ]


_STYLE = (
    "body{font-family:sans-serif;margin:1.5em;max-width:1360px;line-height:1.35}"
    "h1{font-size:1.5em}h1.verdict-fail{color:#a00}h1.verdict-pass{color:#070}h2{font-size:1.2em;margin-top:1.4em}"
    "table{border-collapse:collapse;font-size:12px;margin:.4em 0}"
    "td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}th{background:#f4f4f4}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}"
    "td.v{white-space:nowrap}td.name{overflow-wrap:anywhere;max-width:20em}code{overflow-wrap:anywhere}"
    ".first{background:#fbb;font-weight:bold}.fail{background:#fde}.floor{background:#eee;color:#555}"
    ".constant{background:#eef}.unobserved{color:#888;font-style:italic}"
    ".note{background:#ffd;padding:.5em 1em;border:1px solid #cc0}"
    "p.divergence{font-size:1.1em}svg{max-width:100%;height:auto}"
    "ul.marks{list-style:none;padding:0;font-size:12px}ul.marks li span{display:inline-block;min-width:4.5em;"
    "padding:0 .4em;margin-right:.5em;border:1px solid #ddd}"
)


def write_html(result: CompareResult, path: Path) -> None:
    """An HTML page with everything the terminal shows (:func:`graphbisect.cli.compare_cmd.print_result`,
    through the same sentences, :mod:`.compare_text`) and more: every layer row (mismatches, tensors within
    the noise floor, constants and tensors the target fused away, each with its class and mark), every
    original node a fusion replaced, every root cause, and the per-node error chart."""
    atomic_write_text(path, render_html(result))


def render_html(result: CompareResult) -> str:
    """The text of :func:`write_html`'s page."""
    verdict = verdict_line(result)
    parts = [
        "<!doctype html><html lang='en'><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>graphbisect compare: {_e(verdict.split('  (', 1)[0])}</title><style>{_STYLE}</style>",
        f"<h1 class='verdict-{'pass' if result.passed else 'fail'}'>{_e(verdict)}</h1>",
        _header(result),
    ]
    if dims_line(result):
        parts.append(f"<p class='note'>{_e(dims_line(result))}</p>")
    if not result.target_run.ok:
        parts.append(f"<p class='note'>TARGET FAILED: {_e(result.target_run.describe())}</p>")
    if result.comparison is not None:
        parts.append(_outputs_table(result))
    if result.layerwise_note:
        parts.append(f"<p class='note'>NOTE: {_e(result.layerwise_note)}</p>")
    if result.noise_floor is not None:
        parts.append(f"<p>{_e(result.noise_floor.describe())}</p>")
    if result.layerwise is not None:
        parts += [_first_divergence(result), _roots_table(result), "<h2>Error per tensor</h2>",
                  error_chart_svg(chart_points(result)), _layers(result)]
    return "\n".join(parts) + "\n"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _header(result: CompareResult) -> str:
    from graphbisect.artifacts.environment import describe_ran_with

    lines = [f"model <code>{_e(result.model.origin or 'ModelProto')}</code> "
             f"({plural(len(result.model.nodes), 'node')}, "
             f"<code>{_e(result.model.fingerprint[:12])}</code>)"]
    lines += [f"{role} <code>{_e(spec)}</code> [{_e(describe_ran_with(result.versions.get(role)))}]"
              for role, spec in (("oracle", result.oracle), ("target", result.target))]
    lines.append(f"target status: {_e(result.target_run.describe())}; backend runs: "
                 f"{_e(', '.join(f'{role} {n}' for role, n in result.invocations.items()))}")
    inputs = _inputs_line(result.extra)
    if inputs:
        lines.append(_e(inputs))
    return "<p>" + "<br>".join(lines) + "</p>"


def _inputs_line(extra: Mapping[str, object]) -> str | None:
    """How the inputs were made, as the CLI said it on stderr (random, with their seed and shapes) or the
    file given."""
    notes, shapes = extra.get("random_inputs"), extra.get("input_shapes")
    if isinstance(notes, Mapping):
        shown = shapes if isinstance(shapes, Mapping) else {}
        each = "; ".join(f"{name}: {how}, shape {'x'.join(map(str, shown.get(name) or [])) or 'scalar'}"
                         for name, how in notes.items())
        return f"random inputs (seed {extra.get('seed')}): {each}"
    return f"inputs {extra['inputs']}" if extra.get("inputs") else None


def _table(headers: Sequence[str], rows: Sequence[Sequence[tuple[str, object]]],
           classes: Sequence[str] = ()) -> str:
    """A table; each cell is (its class: ``n`` numbers, ``name`` long names, ``v`` a verdict, ``""``; its value)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f" class='{classes[i]}'" if i < len(classes) and classes[i] else ""
        cells = "".join(f"<td class='{kind}'>{_e(value)}</td>" if kind else f"<td>{_e(value)}</td>"
                        for kind, value in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _outputs_table(result: CompareResult) -> str:
    assert result.comparison is not None
    rows = [[("name", s.name), ("", s.kind.value), ("n", f"{s.mismatches}/{s.numel}"), ("n", num(s.max_abs)),
             ("n", num(s.max_rel)), ("n", num(s.cosine))] for s in result.comparison.outputs]
    classes = ["" if s.passed else "fail" for s in result.comparison.outputs]
    return "<h2>Outputs</h2>" + _table(["output", "verdict", "mismatched", "max abs", "max rel", "cosine"], rows,
                                       classes)


def _first_divergence(result: CompareResult) -> str:
    first, *rest = first_divergence_lines(result, originals=None)
    return (f"<h2>First divergence</h2><p class='divergence' id='first-divergence'>{_e(first)}</p>"
            + "".join(f"<p>{_e(line)}</p>" for line in rest))


def _roots_table(result: CompareResult) -> str:
    layers = result.layerwise
    assert layers is not None
    if not layers.root_causes:
        lines = root_cause_lines(result)  # for a passing run: that there are none
        return "".join(f"<p>{_e(line)}</p>" for line in lines)
    rows = [[("name", rc.node), ("", rc.op_type), ("name", rc.tensor), ("n", num(rc.score)),
             ("n", num(rc.input_score)), ("", rc.role), ("", rc.evidence),
             ("name", rc.compiled_as.describe() if rc.compiled_as is not None else "-")]
            for rc in layers.root_causes]
    check = result.root_cause_check
    how = f"<p>({_e(check.describe())})</p>" if check is not None else ""  # as the terminal says it
    return ("<h2>Root causes</h2><p>root causes (error amplification, in tolerances): a root's inputs match, so "
            "the error starts there; the terminal lists the first 5. Evidence: <em>measured</em>, every input "
            "exposed and compared; <em>confirmed</em>/<em>received</em>, inputs not exposed, so its compiled region "
            "was run alone on the oracle's values and failed/passed; <em>unconfirmed</em>, not run alone</p>"
            + _table(["node", "op", "tensor", "amplification", "input score", "role", "evidence", "compiled as"], rows)
            + how)


def _layers(result: CompareResult) -> str:
    layers = result.layerwise
    assert layers is not None
    first = layers.first_divergence
    unobserved = len(layers.rows) - layers.compared
    lines = [f"layerwise ({layers.compared} tensors compared):"]
    if unobserved:
        lines.append(f"{plural(unobserved, 'tensor')} not observed: the target fused them away or folded them, so it "
                     "exposes no value to compare (grey italic rows, never counted as mismatches)")
    if result.compiled is not None:
        lines.append(f"target probed where its compiled graph keeps tensors: {result.compiled.summary()}")
    if result.target_probe is not None:
        lines.append(f"target's values from {result.target_probe.describe()}")
    compiled = result.compiled is not None
    ran = result.compiled is not None and any(n.precision for n in result.compiled.nodes)
    rows, classes = [], []
    for r in layers.rows:
        s = r.stats
        mark = row_mark(r, first)
        shape = "x".join(map(str, s.oracle_shape or ())) or "scalar"
        shape += "!" if r.compared and s.oracle_shape != s.target_shape else ""
        observed = r.compared
        cells: list[tuple[str, object]] = [
            ("", mark), ("n", r.index), ("", r.op_type), ("name", r.node), ("name", r.tensor), ("", shape),
            ("v", s.kind.value if observed else "not observed"),
            ("n", f"{s.mismatches}/{s.numel}" if observed else ""), ("n", num(s.max_abs) if observed else ""),
            ("n", num(s.max_rel) if observed else ""), ("n", num(s.cosine) if observed else "")]
        if compiled:
            cells.append(("name", compiled_as_cell(r.compiled_as)))
        if ran:
            cells.append(("", ran_in_cell(r.compiled_as)))
        cells += [("n", _range(s.target_range) if observed else ""), ("n", _range(s.oracle_range))]
        rows.append(cells)
        classes.append(next((cls for m, cls, _ in MARKS if m == mark), ""))
    headers = ["", "#", "op", "node", "tensor", "shape", "verdict", "mismatched", "max abs", "max rel", "cosine",
               *(["compiled as"] if compiled else []), *(["ran in"] if ran else []), "target [min, max]",
               "oracle [min, max]"]
    legend = "".join(f"<li><span class='{cls}'>{_e(mark)}</span> {_e(meaning)}</li>" for mark, cls, meaning in MARKS)
    notes = "".join(f"<p>{_e(note)}</p>" for note in (constants_note(result), floor_rows_note(result)) if note)
    return ("<h2>Layers</h2>" + "".join(f"<p>{_e(line)}</p>" for line in lines)
            + f"<ul class='marks'>{legend}</ul>"
            + _table(headers, rows, classes) + notes)


def _range(value: Sequence[float] | None) -> str:
    return f"[{num(value[0])}, {num(value[1])}]" if value else "-"
