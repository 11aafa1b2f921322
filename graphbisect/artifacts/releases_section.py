"""The "Releases" section of a bundle: what ``graphbisect releases`` found on it, for whoever reads the bundle next.

The section goes at the end of ``report.md``, between two marker comments naming the search's ``--find``
(``<!-- graphbisect releases find=bad -->`` … ``<!-- /graphbisect releases find=bad -->``), and into
``report.json`` as ``releases.<find>`` (the search's ``--json`` object). Nothing else of either file changes, but
the ``report.md`` entry of ``report.json``'s ``files`` (its ``bytes`` and ``sha256``: a bundle whose files differ
from the recorded hashes is damaged). A second search with the same ``--find`` replaces its own section; one
with the other ``--find`` adds a second one.

Each file is replaced atomically (written beside it and renamed over it), ``report.md`` first, then
``report.json``; when the second cannot be written the first is put back, so the bundle stays readable.

A bundle given as a ``.zip`` is left as it is (it is what the reporter sent, and an archive cannot be changed in
place atomically): the section is written beside it instead, ``NAME.releases.md`` and ``NAME.releases.json``
for ``NAME.zip``, the JSON naming the archive and its sha256.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graphbisect.storage.atomic import atomic_write_text

__all__ = ["add_releases_section", "section_markdown"]

log = logging.getLogger(__name__)


def section_markdown(search: Mapping[str, Any]) -> str:
    """The section for one search (its ``--json`` object, ``ReleaseSearch.to_json()``), markers included.

    Example:
        >>> text = section_markdown({"package": "onnxruntime", "find": "bad", "target": "onnxruntime:opt_level=all",
        ...     "status": "found", "last_good": "1.20.1", "first_bad": "1.21.0", "versions": ["1.20.1", "1.21.0"],
        ...     "tested": {"1.20.1": {"verdict": "good", "runs": 3}, "1.21.0": {"verdict": "bad", "runs": 3,
        ...     "observed": "mismatch | float"}}, "installs": 0, "runs": 6, "releases_run": 2, "bound": 3,
        ...     "paragraph": "The failure first appears in onnxruntime 1.21.0."})
        >>> print(text.splitlines()[1]); print(text.splitlines()[8])
        ## Releases (first bad)
        | 1.21.0 | bad | 3 | mismatch \\| float |
    """
    find = str(search.get("find", "bad"))
    lines = [_mark(find), f"## Releases ({'first bad' if find == 'bad' else 'first fixed'})", "",
             f"`graphbisect releases --package {search.get('package')} --find {find}`, target "
             f"`{search.get('target')}`, oracle "
             + (f"`{search['oracle']}` (run once on the model)" if search.get("oracle")
                else "the bundle's recorded outputs") + ".", "",
             "| release | verdict | runs | observed or reason |", "|---|---|---|---|"]
    tested = search.get("tested") or {}
    for version in search.get("versions") or []:
        run = tested.get(version)
        if run is None:
            lines.append(f"| {version} | - | | not run |")
            continue
        what = run.get("reason") if run.get("verdict") == "skip" else "; ".join(
            filter(None, [run.get("observed") or "passes", run.get("reason")]))
        lines.append(f"| {version} | {run.get('verdict')} | {run.get('runs', 0)} | {_cell(what or '')} |")
    lines.append("")
    if search.get("status") == "found":
        pair = (("last good", "last_good"), ("first bad", "first_bad")) if find == "bad" else \
            (("last bad", "last_bad"), ("first fixed", "first_fixed"))
        claims = (search.get("audit") or {}).get("claims") or []
        held = all(c.get("holds") is True for c in claims)
        lines.append("**" + ", ".join(f"{name} {search.get(key)}" for name, key in pair) + "**"
                     + ("" if held else " — the search's answer, NOT confirmed by the checker"))
        if claims:
            lines += ["", "Checked by plain runs (the checker, `graphbisect/checker/`):", ""]
            lines += [f"- {c.get('claim')}: " + {True: "holds", False: "**DOES NOT HOLD**"}.get(
                c.get("holds"), "not established") + f" ({_cell(str(c.get('evidence')))})" for c in claims]
        changed = search.get("changed")
        if isinstance(changed, dict) and changed.get("describe"):
            lines += ["", f"What changed: {changed['describe']}"]
    else:
        lines.append(f"**Not found ({search.get('status')})**")
    lines += ["", f"Installs: {search.get('installs')}; releases run: {search.get('releases_run')} of "
              f"{len(search.get('versions') or [])} (bound ceil(log2 N) + 2 = {search.get('bound')}, skips "
              f"excepted); runs: {search.get('runs')}.", "", "Ready to paste:", "",
              f"> {search.get('paragraph', '')}", "", _mark(find, end=True)]
    return "\n".join(lines) + "\n"


def add_releases_section(source: Path, search: Mapping[str, Any]) -> list[Path]:
    """Add ``search``'s section to the bundle at ``source`` (a folder, or a ``.zip``: beside it; ``DIR`` when only
    ``DIR.zip`` exists) and return the files written. Raises ``OSError`` when they cannot be written."""
    source = Path(source)
    if source.is_dir():
        return _into_folder(source, search)
    archive = source if source.is_file() else source.absolute().with_name(source.absolute().name + ".zip")
    return _beside(archive, search)


def _into_folder(folder: Path, search: Mapping[str, Any]) -> list[Path]:
    md_path, json_path = folder / "report.md", folder / "report.json"
    old_md = md_path.read_text(encoding="utf-8")
    report = json.loads(json_path.read_text(encoding="utf-8"))
    new_md = _with_section(old_md, search)
    report["releases"] = {**(report.get("releases") or {}), str(search.get("find", "bad")): dict(search)}
    data = new_md.encode("utf-8")
    for entry in report.get("files") or []:
        if isinstance(entry, dict) and entry.get("name") == "report.md" and "sha256" in entry:
            entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    atomic_write_text(md_path, new_md)
    try:
        atomic_write_text(json_path, _json_text(report))
    except BaseException:
        atomic_write_text(md_path, old_md)  # report.json still records the old report.md's hash
        raise
    log.info("added the Releases section to %s and %s", md_path, json_path)
    return [md_path, json_path]


def _beside(archive: Path, search: Mapping[str, Any]) -> list[Path]:
    stem = archive.name[:-len(".zip")] if archive.name.endswith(".zip") else archive.name
    md_path, json_path = archive.with_name(f"{stem}.releases.md"), archive.with_name(f"{stem}.releases.json")
    old = md_path.read_text(encoding="utf-8") if md_path.is_file() else \
        f"# Releases of the bundle {archive.name}\n\nWritten beside the archive, which is left as it was sent.\n"
    try:
        recorded = json.loads(json_path.read_text(encoding="utf-8")) if json_path.is_file() else {}
    except ValueError:
        recorded = {}
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    releases = recorded.get("releases") if isinstance(recorded, dict) and recorded.get("sha256") == digest else None
    atomic_write_text(md_path, _with_section(old, search))
    atomic_write_text(json_path, _json_text({"bundle": archive.name, "sha256": digest, "releases": {
        **(releases if isinstance(releases, dict) else {}), str(search.get("find", "bad")): dict(search)}}))
    return [md_path, json_path]


def _with_section(text: str, search: Mapping[str, Any]) -> str:
    """``text`` with the search's section in place of its previous one (same ``find``), else appended."""
    find = str(search.get("find", "bad"))
    section = section_markdown(search)
    block = re.compile(re.escape(_mark(find)) + r".*?" + re.escape(_mark(find, end=True)) + r"\n?", re.DOTALL)
    if block.search(text):
        return block.sub(lambda _: section, text, count=1)
    return text.rstrip("\n") + "\n\n" + section


def _mark(find: str, *, end: bool = False) -> str:
    return f"<!-- {'/' if end else ''}graphbisect releases find={find} -->"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _json_text(data: Any) -> str:
    """As the bundle writes report.json (indent 1, ASCII)."""
    return json.dumps(data, indent=1, ensure_ascii=True, allow_nan=False) + "\n"
