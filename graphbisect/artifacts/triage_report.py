"""The triage summary: one row per distinct bug, the passed models and the errors, as JSON, Markdown and HTML.

``summary.json`` (``"format": "graphbisect-triage"``) holds ``bugs`` (each :meth:`BugGroup.to_json`:
key, count, signature, culprits, pattern, op_types, models, smallest, smallest_bundle, smallest_nodes),
``passed`` (names), ``errors`` (name, message, hint), ``models`` (every outcome), ``ran_with`` (per role,
the distinct library versions and interpreters the models' workers measured), ``backend_calls`` (every model's
steps' runs and compiles, summed by role: :func:`~graphbisect.triage.outcome.total_calls`) and the run's ``meta``.
``summary.md`` and ``summary.html`` show the same tables. All three are written atomically.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graphbisect.artifacts.environment import describe_ran_with
from graphbisect.oracle.outcome import headline
from graphbisect.oracle.signature import FailureKind
from graphbisect.storage.atomic import atomic_write_text
from graphbisect.text.printable import plural
from graphbisect.triage.dedup import BugGroup
from graphbisect.triage.outcome import ERROR, FAILED, PASSED, ModelOutcome, total_calls

__all__ = ["signature_cell", "summary_json", "write_triage_summary"]

log = logging.getLogger(__name__)

_RAISED = frozenset(kind.value for kind in FailureKind if kind.raised)


def summary_json(outcomes: Sequence[ModelOutcome], bugs: Sequence[BugGroup], meta: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """The ``summary.json`` document (see the module docstring)."""
    return {
        "format": "graphbisect-triage", "meta": dict(meta),
        "counts": {"models": len(outcomes), "failed": sum(o.status == FAILED for o in outcomes),
                   "passed": sum(o.status == PASSED for o in outcomes),
                   "errors": sum(o.status == ERROR for o in outcomes), "distinct_bugs": len(bugs)},
        "bugs": [b.to_json() for b in bugs],
        "passed": [o.name for o in outcomes if o.status == PASSED],
        "errors": [{"model": o.name, "message": o.message, "hint": o.hint} for o in outcomes if o.status == ERROR],
        "models": [o.to_json() for o in outcomes],
        "ran_with": _ran_with(outcomes),
        "backend_calls": total_calls(outcomes).to_json(),
    }


def _ran_with(outcomes: Sequence[ModelOutcome]) -> dict[str, list[str]]:
    """Per role, what the workers of every model measured (one entry unless the environment changed)."""
    found: dict[str, list[str]] = {}
    for outcome in outcomes:
        for role, facts in outcome.versions.items():
            text = describe_ran_with(facts)
            if text not in found.setdefault(role, []):
                found[role].append(text)
    return found


def write_triage_summary(out_dir: Path, outcomes: Sequence[ModelOutcome], bugs: Sequence[BugGroup],
                         meta: Mapping[str, Any]) -> dict[str, Path]:
    """Write ``summary.json``, ``summary.md`` and ``summary.html`` into ``out_dir``; returns their paths."""
    data = summary_json(outcomes, bugs, meta)
    paths = {"json": out_dir / "summary.json", "md": out_dir / "summary.md", "html": out_dir / "summary.html"}
    atomic_write_text(paths["json"], json.dumps(data, indent=2, allow_nan=False) + "\n")
    atomic_write_text(paths["md"], _markdown(data, out_dir))
    atomic_write_text(paths["html"], _html(data, out_dir))
    log.info("triage summary: %s", paths["md"])
    return paths


def signature_cell(sig: Mapping[str, Any], lacks: str | None = None) -> str:
    """A bug's signature in a table cell: its kind, what the target lacks (a refusal's group), and the informative
    part of its message (:func:`~graphbisect.oracle.outcome.headline`: the op and the reason, not OpenVINO's
    ``Exception from src/inference/src/cpp/core.cpp:84:`` that opens each of its messages).

    Example:
        >>> signature_cell({"kind": "unsupported", "detail": "RuntimeError: Exception from core.cpp: Check 'false' "
        ...                 "failed at unconverted_ops_report.cpp: FrontEnd API failed with OpConversionFailure: "
        ...                 "Model wasn't fully converted. Summary: -- No conversion rule found for operations: "
        ...                 "ai.onnx.ml.Scaler"}, "ai.onnx.ml")
        'unsupported: lacks ai.onnx.ml (no conversion rule found for ai.onnx.ml.Scaler)'
    """
    detail = str(sig.get("detail") or "")
    kind = f"{sig.get('kind', '?')}" + (f": lacks {lacks}" if lacks else "")
    if not detail:
        return kind
    text = headline(None, detail, limit=120) if sig.get("kind") in _RAISED else detail[:120]
    return f"{kind} ({text})"


def _relative(path: str | None, out_dir: Path) -> str:
    if not path:
        return "—"
    try:
        return str(Path(path).relative_to(out_dir))
    except ValueError:
        return path


def _bug_rows(data: Mapping[str, Any], out_dir: Path) -> list[list[str]]:
    return [[bug["key"], str(bug["count"]), signature_cell(bug["signature"], bug.get("lacks")),
             ", ".join(bug["culprits"]) or "—",
             " → ".join(bug["op_types"]) or "—", _relative(bug["smallest_bundle"], out_dir)
             + (f" ({plural(bug['smallest_nodes'], 'node')})" if bug["smallest_nodes"] is not None else ""),
             ", ".join(bug["models"]), _checked_cell(bug.get("checked") or {})] for bug in data["bugs"]]


def _checked_cell(checked: Mapping[str, Any]) -> str:
    """How many of a bug's models the checker's plain runs saw fail this way, and what grouped them."""
    if not checked:
        return "not checked"
    confirmed, others = len(checked.get("confirmed") or ()), checked.get("not_confirmed") or []
    return f"{confirmed} of {confirmed + len(others)} re-established by plain runs; grouped by {checked['grouped_by']}"


_BUG_HEADER = ["bug", "models", "signature", "culprit passes", "minimal pattern", "smallest bundle", "affects",
               "checked"]


def _markdown(data: Mapping[str, Any], out_dir: Path) -> str:
    c, meta = data["counts"], data["meta"]

    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"

    lines = ["# graphbisect triage", "",
             f"{plural(c['models'], 'model')}: **{plural(c['distinct_bugs'], 'distinct bug')}** in "
             f"{plural(c['failed'], 'failing model')}, {c['passed']} passed, {plural(c['errors'], 'error')}. "
             f"Target `{meta.get('target')}` vs oracle `{meta.get('oracle')}`, executor `{meta.get('executor')}`.", "",
             *(f"- {role} ran with {'; '.join(texts)}" for role, texts in data["ran_with"].items()), "",
             "## Bugs", "",
             row(_BUG_HEADER), row(["---"] * len(_BUG_HEADER))]
    lines += [row(cells) for cells in _bug_rows(data, out_dir)]
    lines += ["", "## Passed", "", ", ".join(data["passed"]) or "none", "", "## Errors", ""]
    lines += [f"- `{e['model']}`: {e['message']}" + (f" (hint: {e['hint']})" if e["hint"] else "")
              for e in data["errors"]] or ["none"]
    return "\n".join(lines) + "\n"


def _html(data: Mapping[str, Any], out_dir: Path) -> str:
    c = data["counts"]

    def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in r) + "</tr>" for r in rows)
        return f"<table><tr>{head}</tr>{body}</table>"

    errors = [[e["model"], str(e["message"]), str(e["hint"] or "")] for e in data["errors"]]
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'><title>graphbisect triage</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px;text-align:left;vertical-align:top}</style></head><body>",
        "<h1>graphbisect triage</h1>",
        f"<p>{plural(c['models'], 'model')}: <b>{plural(c['distinct_bugs'], 'distinct bug')}</b> in "
        f"{plural(c['failed'], 'failing model')}, {c['passed']} passed, {plural(c['errors'], 'error')}.</p>",
        *(f"<p>{html.escape(role)} ran with {html.escape('; '.join(texts))}</p>"
          for role, texts in data["ran_with"].items()),
        "<h2>Bugs</h2>", table(_BUG_HEADER, _bug_rows(data, out_dir)),
        "<h2>Passed</h2>", f"<p>{html.escape(', '.join(data['passed']) or 'none')}</p>",
        "<h2>Errors</h2>", table(["model", "message", "hint"], errors) if errors else "<p>none</p>",
        "</body></html>",
    ]) + "\n"
