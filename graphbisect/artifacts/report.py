"""``report.md`` and ``report.json`` of a bug-report bundle: the same facts for people and for programs.

The markdown is what gets pasted into an issue tracker: a title with the failure signature, a summary table
(original vs final size, backend invocations, time, whether the result is 1-minimal), the kept nodes, the
failure itself (worst outputs or the crash message), how to reproduce, the backends and their versions, the
reduction journey chart and the environment. Every name that comes from the model is escaped: a tensor
called ``|`` or ``<script>`` renders as text, never as table structure or HTML.

Example:
    >>> data = report_data(content, files=[], comparison=None, environment={})   # doctest: +SKIP
    >>> text = render_markdown(content, comparison=None, environment={}, charts={})  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphbisect._version import __version__
from graphbisect.artifacts.environment import describe_ran_with, environment_summary
from graphbisect.artifacts.repro import JUDGE_PYTHON_CHECK, has_standalone_repro, judged_by, tactic_files
from graphbisect.backends.cost import describe_calls
from graphbisect.compare import Comparison, TensorStats, compare_outputs
from graphbisect.compare.metrics import decade
from graphbisect.oracle.outcome import headline as message_headline
from graphbisect.text.printable import plural
from graphbisect.text.shareable import file_name as path_name
from graphbisect.text.shareable import shareable_report, shareable_text

if TYPE_CHECKING:
    from graphbisect.artifacts.content import BundleContent

__all__ = ["headline", "jsonable", "md_cell", "md_code", "render_markdown", "report_data", "tolerance_json"]

#: Arrays longer than this are summarized, not listed, when a report value holds one.
_MAX_LISTED_ELEMENTS = 64


# ------------------------------------------------------------------------------------------------ JSON
def jsonable(value: Any) -> Any:
    """``value`` as strict JSON data: numpy scalars → numbers, paths → strings, NaN/Inf → strings, ...

    Example:
        >>> jsonable({"a": np.float32(1.5), "b": (1, float("inf")), "c": Path("x/y")})
        {'a': 1.5, 'b': [1, 'inf'], 'c': 'x/y'}
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, np.ndarray):
        if value.size <= _MAX_LISTED_ELEMENTS:
            return jsonable(value.tolist())
        return f"<array {value.dtype} {list(value.shape)}>"
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "to_json") and callable(value.to_json):
        return jsonable(value.to_json())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=str)
    if isinstance(value, Iterable):
        return [jsonable(v) for v in value]
    return str(value)


def tolerance_json(content: BundleContent) -> dict[str, Any]:
    tol = content.tolerance
    return {"atol": tol.atol, "rtol": tol.rtol, "min_cosine": tol.min_cosine,
            "per_output": {name: list(pair) for name, pair in tol.per_output.items()},
            "check_dtype": tol.check_dtype, "int_atol": tol.int_atol, "quantized": dict(tol.quantized)}


def report_data(content: BundleContent, *, files: Sequence[Mapping[str, Any]], comparison: Comparison | None,
                environment: Mapping[str, Any], model_fingerprint: str | None = None,
                charts: Sequence[str] = ()) -> dict[str, Any]:
    """The facts of ``report.json``: the run's report mapping (its paths shareable, :mod:`.shareable`) plus
    what the bundle itself knows."""
    report = jsonable(shareable_report(content.report))
    signature = content.signature
    original = report.get("original_model") if isinstance(report.get("original_model"), Mapping) else {}
    own = {
        "format": "graphbisect-bundle",
        "format_version": 1,
        "graphbisect_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "signature": {**signature.to_json(), "description": signature.describe(),
                      **({"matched_on": matched} if (matched := signature.matched_on()) else {})},
        "headline": headline(content),
        "oracle": str(content.oracle),
        "target": str(content.target),
        "tolerance": tolerance_json(content),
        "target_message": content.target_message,
        "original_fingerprint": original.get("fingerprint"),
        "model": _model_facts(content, model_fingerprint),
        "outputs": [s.to_json() for s in comparison.outputs] if comparison is not None else [],
        "charts": list(charts),
        "files": [dict(f) for f in files],
        "environment": _environment_brief(environment),
    }
    return {**report, **jsonable(own)}


def _model_facts(content: BundleContent, fingerprint: str | None) -> dict[str, Any]:
    graph = content.model.graph
    initializers = {init.name for init in graph.initializer}
    return {
        "file": "model.onnx",
        "fingerprint": fingerprint,
        "nodes": len(graph.node),
        "inputs": [i.name for i in graph.input if i.name not in initializers],
        "outputs": [o.name for o in graph.output],
        "ir_version": content.model.ir_version,
        "opsets": {imp.domain or "ai.onnx": imp.version for imp in content.model.opset_import},
    }


def _environment_brief(env: Mapping[str, Any]) -> dict[str, Any]:
    return {"python": (env.get("python") or {}).get("version"), "packages": env.get("packages") or {},
            "gpus": env.get("gpus") or [], "backends": env.get("backends") or {}}


# -------------------------------------------------------------------------------------------- markdown
def md_cell(value: object) -> str:
    """Text safe inside a markdown table cell: no HTML, no table structure, markdown syntax neutralized.

    ``<``/``>`` become entities (so a name like ``<script>`` is text); ``&`` stays readable unless it would
    start an entity. Newlines become ``↵``.

    Example:
        >>> md_cell("a|b\\n<c>*d* & e")
        'a&#124;b↵&lt;c&gt;\\\\*d\\\\* & e'
    """
    text = re.sub(r"([\\`*_\[\]#~])", r"\\\1", str(value))  # markdown syntax first: entities below use '#'
    text = re.sub(r"&(?=#?\w+;)", "&amp;", text).replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"\r\n|\r|\n", "↵", text.replace("|", "&#124;"))


def md_code(value: object, *, in_table: bool = False) -> str:
    """An inline code span for a name or spec: shown verbatim (no HTML, no markdown), whatever it contains.

    The fence is longer than any run of backticks inside; newlines become ``↵``; in a table cell ``|`` is
    escaped (GitHub tables split cells on it even inside code spans).

    Example:
        >>> md_code("a`b"), md_code("x|y", in_table=True)
        ('``a`b``', '`x\\\\|y`')
    """
    text = re.sub(r"\r\n|\r|\n", "↵", str(value))
    if in_table:
        text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell_code(value: object) -> str:
    return md_code(value, in_table=True)


def _fenced(text: str, info: str = "text") -> str:
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else "-" if math.isnan(value) else str(value)
    return str(value)


def render_markdown(content: BundleContent, *, comparison: Comparison | None, environment: Mapping[str, Any],
                    charts: Mapping[str, str]) -> str:
    """The text of ``report.md``; ``charts`` maps chart names to their file names in the bundle.

    Every fact once: each role's versions are in the backends table (not again under the environment), and
    the paths of the run's facts are shareable (:mod:`.shareable`).
    """
    content = dataclasses.replace(content, report=shareable_report(content.report))
    sections = [
        _title(content),
        _summary(content),
        _kept_nodes(content),
        _failure(content, comparison),
        _reproduce(content),
        _backends(content),
        _journey(content, charts),
        *(f"## {title}\n\n{text.strip()}" for title, text in content.sections.items()),
        _environment(environment),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _shown(spec: object) -> str:
    """A spec (or a text naming one) as report.md shows it: its files by name (:func:`shareable_text`);
    report.json and repro_config.json keep it exact, for ``verify`` to replay."""
    return shareable_text(str(spec))


def _title(content: BundleContent) -> str:
    lines = [f"# {md_cell(_shown(content.target))}: {md_cell(headline(content))}", ""]
    what = {"crash-load": "crashes on `model.onnx`", "crash-run": "crashes on `model.onnx`",
            "timeout": "times out on `model.onnx`",
            "unsupported": "refuses `model.onnx` as unsupported (an op, a type or an opset it lacks)"}.get(
        content.signature.kind.value, f"disagrees with the oracle {md_code(_shown(content.oracle))} on `model.onnx`")
    lines.append(f"The target {md_code(_shown(content.target))} {what}, a model of "
                 f"{plural(len(content.model.graph.node), 'node')} reduced by graphbisect {__version__}.")
    return "\n".join(lines)


_HEADLINE_CHARS = 110


def headline(content: BundleContent) -> str:
    """A short human title for the failure, e.g. ``wrong values on output 'y' (error ~1e3× tolerance)``: the
    magnitude of this bundle's own worst output, its nearest power of ten (:func:`~graphbisect.compare.metrics.
    decade`; none where that score is not finite, as for integers that differ).

    Crash messages are long (ONNX Runtime prefixes the C++ signature), and what matters is at their end, so
    a long first line is shortened from the left; the line is the informative one
    (:func:`~graphbisect.oracle.outcome.headline`: a refusal's op and reason, not a source location).
    """
    sig = content.signature
    kind = sig.kind.value
    if sig.kind.raised:
        where = {"crash-load": "crash at load (session/engine creation)", "crash-run": "crash at run",
                 "unsupported": "unsupported"}[kind]
        # the informative part (OpenVINO opens every message with "Exception from src/.../core.cpp:84:"); a
        # refusal's starts with the op it lacks, so it is cut at the right
        refusal = kind == "unsupported"
        text = message_headline(None, content.target_message or sig.detail,
                                limit=_HEADLINE_CHARS if refusal else 10_000)
        if len(text) > _HEADLINE_CHARS and not refusal:
            text = "…" + text[-_HEADLINE_CHARS:].lstrip()
        return f"{where}: {text}"
    worst = _comparison_worst(content)
    name = f" on output {worst.name!r}" if worst is not None else ""
    if kind == "mismatch":  # the magnitude this bundle's model fails by (the exact score is in its table)
        band = decade(worst.score) if worst is not None else sig.band  # none for an infinite score
        return f"wrong values{name}" + (f" (error ~1e{band}× tolerance)" if band is not None else "")
    if kind == "nan":
        return f"NaN/Inf{name} where the oracle is finite"
    if kind == "structure":
        return f"{sig.detail} mismatch{name}"
    return sig.describe()


def _comparison_worst(content: BundleContent) -> TensorStats | None:
    if not content.target_outputs:
        return None
    worst = compare_outputs(content.oracle_outputs, content.target_outputs, content.tolerance).worst
    return worst if worst is not None and not worst.passed else None


def _summary(content: BundleContent) -> str:
    report = content.report
    original = report.get("original_model") if isinstance(report.get("original_model"), Mapping) else {}
    rows: list[tuple[str, str]] = []
    if original:
        fingerprint = str(original.get("fingerprint") or "")[:16]
        path = original.get("path")
        where = _cell_code(path) if path else "an in-memory ModelProto"
        rows.append(("Original model", f"{where}, {original.get('nodes', '?')} nodes"
                     + (f", fingerprint {_cell_code(fingerprint)}" if fingerprint else "")))
    final = report.get("final_nodes", len(content.model.graph.node))
    rows.append(("Reduced model", f"`model.onnx`, {final} nodes"))
    runs = _invocations(report)
    if runs:
        rows.append(("Backend invocations", runs))
    if isinstance(report.get("seconds"), (int, float)):
        rows.append(("Time", f"{report['seconds']:.1f} s"))
    if "one_minimal" in report:
        rows.append(("1-minimal", _minimality(report)))
    for key, label in (("verified", "Verified on the final model"), ("flaky", "Flaky target")):
        if isinstance(report.get(key), bool):
            rows.append((label, "yes" if report[key] else "no"))
    rows.append(("Failure", md_cell(content.signature.describe())))
    identity = report.get("identity")
    if isinstance(identity, Mapping) and identity.get("describe"):
        how = ("every run of the search, the re-verification, `verify` and `repro.py` match it"
               if identity.get("matched_by") == "identity" else "runs match by the failure's kind")
        rows.append(("Identity", f"{md_cell(identity['describe'])} ({how})"))
    floor = report.get("noise_floor")
    if isinstance(floor, Mapping) and floor.get("note"):
        rows.append(("Noise floor", md_cell(_shown(
            f"{floor['spec']}: a value counts as wrong only beyond {floor.get('margin', 10):g}× its error there"
            if floor.get("measured") else floor["note"]))))
    text = "## Summary\n\n" + _table(["", ""], rows)
    notes = report.get("notes")
    if isinstance(notes, (list, tuple)) and notes:
        text += "\n\nNotes:\n\n" + "\n".join(f"- {md_cell(note)}" for note in notes)
    return text


def _invocations(report: Mapping[str, Any]) -> str:
    """Every backend run the bundle cost, in one cell, each count with what it was for (the reduction alone
    under-stated the cost; the facts' runs in a row of their own read as unexplained)."""
    passes: Mapping[str, Any] = report["passes"] if isinstance(report.get("passes"), Mapping) else {}
    parts = []
    for counts, calls, purpose in (
            (passes.get("invocations"), passes.get("backend_calls"), "the pass search"),
            (report.get("invocations"), report.get("backend_calls"), "the reduction"),
            (report.get("report_runs"), report.get("report_calls"), "measuring the sections below")):
        if isinstance(calls, Mapping) and calls:  # with what the runs compiled (graphbisect.backends.cost)
            parts.append(f"{md_cell(_described_calls(calls))} for {purpose}")
        elif isinstance(counts, Mapping) and counts:
            parts.append(", ".join(f"{md_cell(k)} {md_cell(v)}" for k, v in counts.items()) + f" for {purpose}")
    return "; ".join(parts)


def _described_calls(calls: Mapping[str, Any]) -> str:
    """``target 14 (14 compiles)``: a report's ``backend_calls``, or its raw text when a hand-edited report
    holds something else there."""
    try:
        return describe_calls({}, calls)
    except (AttributeError, TypeError, ValueError):
        return str(dict(calls))


def _minimality(report: Mapping[str, Any]) -> str:
    """The 1-minimal row, as the checker measured it: removing a kept node may leave the model failing another
    way (the example's LayerNorm without its ReduceMean, Sub or Add_1 still fails, through a sibling pass), so
    "makes the failure disappear" is said of the recorded failure, with the removals that still fail named."""
    if report.get("one_minimal"):
        otherwise = _fail_otherwise(report)
        if not otherwise:
            return "yes (removing any one kept node makes the recorded failure disappear)"
        return (f"yes, for the recorded failure (its identity): removing any one kept node makes it disappear, but "
                f"the model still fails another way without {', '.join(_cell_code(n) for n in otherwise)}")
    reason = report.get("stop_reason")
    return "no" + (f" (stopped: {md_cell(reason)})" if reason else "")


def _fail_otherwise(report: Mapping[str, Any]) -> list[str]:
    """The kept nodes whose removal the checker saw still fail, another way (its 1-minimal claim's record)."""
    audit = report.get("audit")
    claims = audit.get("claims") if isinstance(audit, Mapping) else None
    for claim in claims if isinstance(claims, list) else ():
        if isinstance(claim, Mapping) and claim.get("id") == "one_minimal" and claim.get("holds") is True:
            names = claim.get("fail_otherwise")
            return [str(n) for n in names] if isinstance(names, list) else []
    return []


def _kept_nodes(content: BundleContent) -> str:
    rows = [
        (i, _cell_code(node.name), md_cell(node.op_type if not node.domain else f"{node.domain}::{node.op_type}"),
         ", ".join(_cell_code(x) for x in node.input if x) or "-",
         ", ".join(_cell_code(x) for x in node.output) or "-")
        for i, node in enumerate(content.model.graph.node)
    ]
    graph = content.model.graph
    initializers = {init.name for init in graph.initializer}
    fed = [md_code(i.name) for i in graph.input if i.name not in initializers]
    text = "## Kept nodes\n\n" + _table(["#", "Node", "Op type", "Inputs", "Outputs"], rows)
    if fed:
        text += ("\n\nGraph inputs (original inputs, and cut tensors fed with the oracle's values): "
                 + ", ".join(fed) + ".")
    return text


def _failure(content: BundleContent, comparison: Comparison | None) -> str:
    lines = ["## Failure", "", f"Signature: **{md_cell(content.signature.kind.value)}**"
             + (f" — {md_cell(content.signature.detail)}" if content.signature.detail else "")]
    matched = content.signature.matched_on()
    if matched:
        lines += ["", f"A candidate failed the same way when it matched on {md_cell(matched)}."]
    if content.target_message:
        lines += ["", "The target raised:", "", _fenced(content.target_message)]
    if comparison is not None:
        lines += ["", _outputs_table(comparison.outputs), "", _tolerance_line(content)]
        worst = comparison.worst
        if worst is not None and not worst.passed:
            lines += ["", f"Worst output: {md_code(worst.name)} — {_worst_text(worst)}."]
    return "\n".join(lines)


def _outputs_table(outputs: Sequence[TensorStats]) -> str:
    rows = []
    for s in outputs:
        target_range = f"[{_num(s.target_range[0])}, {_num(s.target_range[1])}]" if s.target_range else "-"
        oracle_range = f"[{_num(s.oracle_range[0])}, {_num(s.oracle_range[1])}]" if s.oracle_range else "-"
        rows.append((_cell_code(s.name), s.kind.value, f"{s.mismatches}/{s.numel}", _num(s.max_abs), _num(s.max_rel),
                     _num(s.cosine), _num(s.score), target_range, oracle_range))
    return _table(["Output", "Verdict", "Mismatched", "Max abs", "Max rel", "Cosine", "Score (× tol)",
                   "Target range", "Oracle range"], rows)


def _tolerance_line(content: BundleContent) -> str:
    tol = content.tolerance
    text = f"Tolerance: atol {tol.atol:g}, rtol {tol.rtol:g} (numpy.allclose per element)"
    if tol.min_cosine is not None:
        text += f", cosine ≥ {tol.min_cosine:g}"
    if tol.per_output:
        text += "; per output: " + ", ".join(f"{md_code(k)} {a:g}/{r:g}" for k, (a, r) in tol.per_output.items())
    if tol.quantized:
        text += (f"; quantized outputs ({', '.join(md_code(k) for k in tol.quantized)}) in quantization steps, "
                 f"{tol.int_atol:g} allowed")
    return text + "."


def _worst_text(stats: TensorStats) -> str:
    if stats.kind.value in ("shape", "dtype"):
        what = stats.kind.value
        return (f"{what} differs: target {getattr(stats, 'target_' + what)}, "
                f"oracle {getattr(stats, 'oracle_' + what)}")
    if stats.kind.value == "missing":
        return "the target did not produce it"
    text = f"{stats.mismatches} of {stats.numel} elements beyond tolerance, max abs error {_num(stats.max_abs)}, " \
           f"{_num(stats.score)}× tolerance, cosine {_num(stats.cosine)}"
    if stats.target_nonfinite:
        text += f", {stats.target_nonfinite} NaN/Inf where the oracle is finite"
    return text


_PYTHON_CHECK_NOTE = (
    "The failure is the verdict of a Python output check (`graphbisect.reduce(check=...)`), which this bundle "
    "cannot hold: `repro.py` and `graphbisect verify` run the target and show its comparison by the tolerance, "
    "but a run that completes is UNDECIDED (exit 2), never fixed or reproduced by the tolerance; "
    "`graphbisect.verify(DIR, check=your_check)` judges it with the check.")


def _reproduce(content: BundleContent) -> str:
    python = content.target.options.get("python")
    interpreter = path_name(python) if python else "python"
    how = (f"Needs only numpy and the target's library. `repro.py` runs {md_code(_shown(content.target))} with the "
           "same options on `model.onnx` and `inputs.npz` and compares with `oracle_outputs.npz`"
           + (" (with the kernel choices of `tactics.json`)" if tactic_files(content) else "") + ":"
           if has_standalone_repro(content.target) else
           f"There is no standalone script for {md_code(content.target.name)}: `repro.py` only says so (exit 2); "
           "`graphbisect verify .` replays the bundle:")
    lines = [
        "## Reproduce",
        "",
        how,
        "",
        _fenced(f"{interpreter} repro.py          # exit 1 while the bug reproduces, 0 once fixed, 2 cannot run\n"
                "graphbisect verify .        # the same check through graphbisect's isolated backends\n"
                "graphbisect verify . --target 'onnxruntime:python=/path/to/other/python'   # another version",
                "sh"),
        "",
        *([_PYTHON_CHECK_NOTE, ""] if judged_by(content.signature, content.target) == JUDGE_PYTHON_CHECK else []),
        "Files: `model.onnx` (the reduced model, weights inline), `inputs.npz` (every graph input), "
        "`oracle_outputs.npz` (expected), "
        + ("`target_outputs.npz` (what the target produced), " if content.target_outputs else "")
        + ("`repro_min.py` (the model built inline, oracle and target, one assertion), " if "repro_min.py" in
           content.files else "")
        + "`repro.py` + "
        "`repro_config.json`, `report.json` (these facts as JSON), `environment.json`.",
    ]
    return "\n".join(lines)


def _backends(content: BundleContent) -> str:
    """Each role's spec and what ran it, as its worker measured it (another interpreter's under python=)."""
    versions = content.report.get("versions")
    versions = versions if isinstance(versions, Mapping) else {}
    specs = {"oracle": content.oracle, "target": content.target,
             **({"control": content.control} if content.control is not None else {})}
    rows = [(md_cell(role.capitalize()), _cell_code(_shown(spec)), md_cell(_ran(versions.get(role))))
            for role, spec in specs.items()]
    rows += [(md_cell(k), "", md_cell(_ran(v))) for k, v in versions.items() if k not in specs]
    return "## Backends and versions\n\n" + _table(["Role", "Spec", "Ran with (measured in its worker)"], rows)


def _ran(value: object) -> str:
    if value is None:
        return describe_ran_with(None)  # not measured: an external program, or no run of it
    return describe_ran_with(value) if isinstance(value, Mapping) else _flat(value)


def _flat(value: object) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_flat(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_flat(v) for v in value)
    return str(value)


def _journey(content: BundleContent, charts: Mapping[str, str]) -> str:
    lines = []
    for name, file_name in charts.items():
        lines += [f"![{md_cell(name)}]({file_name})", ""]
    for key in ("strategies", "strategy_stats", "search"):
        stats = content.report.get(key)
        if isinstance(stats, Mapping) and stats:
            lines += [_strategy_table(stats), ""]
    if not lines:
        return ""
    return "## Reduction journey\n\n" + "\n".join(lines).rstrip()


def _strategy_table(stats: Mapping[str, Any]) -> str:
    columns: list[str] = []
    for value in stats.values():
        if isinstance(value, Mapping):
            columns += [str(k) for k in value if str(k) not in columns]
    if not columns:
        return _table(["Statistic", "Value"], [(md_cell(k), md_cell(_flat(v))) for k, v in stats.items()])
    rows = [(md_cell(name), *(md_cell(_flat(value.get(c, "-"))) if isinstance(value, Mapping) else md_cell(value)
                              for c in columns)) for name, value in stats.items()]
    return _table(["Strategy", *(md_cell(c) for c in columns)], rows)


def _environment(environment: Mapping[str, Any]) -> str:
    rows = [(md_cell(k), md_cell(v)) for k, v in environment_summary(environment, backends=False)]
    if not rows:
        return ""
    return "## Environment\n\n" + _table(["", ""], rows) + "\n\nDetails in `environment.json`."
