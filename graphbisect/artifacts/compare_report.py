"""Writers for `graphbisect compare` results: JSON, CSV and an HTML page with the per-node error chart."""

from __future__ import annotations

import csv
import html
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

from graphbisect.artifacts.charts import ErrorPoint, error_chart_svg
from graphbisect.atomic import atomic_write_text

if TYPE_CHECKING:
    from graphbisect.workflows.compare import CompareResult

__all__ = ["CSV_COLUMNS", "write_csv", "write_html", "write_json"]

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
    """A CSV cell: shapes as ``1x3x224x224``, value ranges as ``[-2.5, 1.9]`` (not ``-2.5x1.9``: a shape)."""
    if isinstance(value, dict) and column == "compiled_as":  # the compiled node: kind, name, originals
        return f"{value['kind']} {value['name']} ({len(value['originals'])} nodes)" + _ran_in(value)
    if isinstance(value, list) and column.endswith("_range"):
        return "[" + ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in value) + "]"
    if isinstance(value, list):
        return "x".join(str(v) for v in value)
    return value


def _ran_in(compiled: dict[str, object]) -> str:
    """``; ran in i8, the model f32`` for a compiled node that ran in a lower precision than the model, else ""."""
    lower, model = compiled.get("lower_precision"), compiled.get("model_precision")
    if not lower or not isinstance(lower, list) or not isinstance(model, list):
        return ""
    return f"; ran in {'+'.join(map(str, lower))}, the model {'+'.join(map(str, model))}"


def chart_points(result: CompareResult) -> list[ErrorPoint]:
    layers = result.layerwise
    if layers is None:
        return []
    roots = {rc.tensor for rc in layers.root_causes[:3] if rc.is_root}
    first = layers.first_divergence.tensor if layers.first_divergence else None
    return [
        ErrorPoint(i, f"{row.node} ({row.op_type})", row.stats.score,
                   "first" if row.tensor == first else "root" if row.tensor in roots else None)
        for i, row in enumerate(r for r in layers.rows if r.compared)
    ]


def write_html(result: CompareResult, path: Path) -> None:
    data = result.to_json()
    verdict = str(data["verdict"]).upper()
    parts = [
        "<!doctype html><meta charset='utf-8'><title>graphbisect compare</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}td.l,th.l{text-align:left}"
        "tr.fail{background:#fde}tr.first{background:#fbb}tr.floor{background:#eee;color:#666}tr.unobserved{color:#999}"
        ".warn{background:#ffd;padding:1em;border:1px solid #cc0}"
        "</style>",
        f"<h1>graphbisect compare: {html.escape(verdict)}</h1>",
        f"<p>model <code>{html.escape(str(result.model.origin or 'ModelProto'))}</code> "
        f"({len(result.model.nodes)} nodes, fingerprint <code>{html.escape(result.model.fingerprint[:12])}</code>)"
        f"<br>oracle <code>{html.escape(str(result.oracle))}</code> vs target <code>{html.escape(str(result.target))}"
        f"</code><br>target status: {html.escape(result.target_run.describe())}; backend runs: "
        f"{html.escape(', '.join(f'{role} {n}' for role, n in result.invocations.items()))}</p>",
    ]
    if result.layerwise_note:
        parts.append(f"<p class='warn'>{html.escape(result.layerwise_note)}</p>")
    if result.noise_floor is not None:
        parts.append(f"<p>{html.escape(result.noise_floor.describe())}; grey rows are within it: kernel "
                     "precision, not divergences</p>")
    parts.append(_outputs_table(data))
    if result.layerwise is not None:
        parts.append(error_chart_svg(chart_points(result)))
        parts.append(_roots_table(data))
        parts.append(_layers_table(data))
    atomic_write_text(path, "\n".join(parts) + "\n")


def _table(headers: list[str], rows: list[list[object]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th class='l'>{html.escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f" class='{classes[i]}'" if classes and classes[i] else ""
        cells = "".join(f"<td class='l'>{html.escape(_fmt(v))}</td>" for v in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "x".join(str(v) for v in value) if all(isinstance(v, int) for v in value) else \
            " .. ".join(_fmt(v) for v in value)
    return "" if value is None else str(value)


def _outputs_table(data: dict[str, object]) -> str:
    outputs: list[dict[str, object]] = data["outputs"]  # type: ignore[assignment]
    rows = [[o["name"], o["kind"], f"{o['mismatches']}/{o['numel']}", o["max_abs"], o["max_rel"], o["cosine"]]
            for o in outputs]
    return "<h2>Outputs</h2>" + _table(["output", "verdict", "mismatched", "max abs", "max rel", "cosine"], rows)


def _roots_table(data: dict[str, object]) -> str:
    roots: list[dict[str, object]] = data["root_causes"]  # type: ignore[assignment]
    rows = [[r["node"], r["op_type"], r["tensor"], r["score"], r["input_score"], r["role"], r["evidence"]]
            for r in roots]
    check = data.get("root_cause_check")
    how = (f"<p>Inputs not exposed by the target: {len(check['confirmed'])} node(s) confirmed and "
           f"{len(check['received'])} cleared by running their compiled regions alone on the oracle's values "
           f"({check['target_runs']} target run).</p>" if isinstance(check, dict) else "")
    return "<h2>Root causes</h2>" + _table(["node", "op", "tensor", "amplification", "input score", "role", "evidence"],
                                           rows) + how


def _layers_table(data: dict[str, object]) -> str:
    layers: list[dict[str, object]] = data["layers"]  # type: ignore[assignment]
    first = data["first_divergence"]
    first_tensor = first["tensor"] if isinstance(first, dict) else None
    rows, classes = [], []
    for row in layers:
        rows.append([row["index"], row["op_type"], row["node"], row["tensor"], row["oracle_shape"], row["kind"],
                     f"{row['mismatches']}/{row['numel']}", row["max_abs"], row["max_rel"], row["cosine"],
                     row["target_range"], row["oracle_range"], _compiled_cell(row.get("compiled_as"))])
        classes.append("first" if row["tensor"] == first_tensor else "unobserved" if not row["observed"] else
                       "" if row["passed"] else "floor" if row.get("at_floor") else "fail")
    headers = ["#", "op", "node", "tensor", "shape", "verdict", "mismatched", "max abs", "max rel", "cosine",
               "target min..max", "oracle min..max", "compiled as"]
    return "<h2>Layers</h2>" + _table(headers, rows, classes)


def _compiled_cell(compiled: object) -> str:
    if not isinstance(compiled, dict):
        return ""
    return f"{compiled['kind']} {compiled['name']}" + _ran_in(compiled)
