"""The bug-report bundle: one folder (and optionally a ``.zip``) that a runtime engineer can act on alone.

Layout::

    model.onnx              the reduced failing model, weights inline
    inputs.npz              a value for every graph input (original inputs and cut tensors from the oracle)
    oracle_outputs.npz      the expected outputs
    target_outputs.npz      what the target produced (not written when it crashed: there is nothing)
    repro.py                standalone reproduction: numpy + the target's library (see :mod:`.repro`)
    repro_config.json       the data repro.py reads (names and options are data, never code)
    tactics.json            the target's tactic record (``openvino:tactics=``), restricted to model.onnx's nodes
    report.md, report.json  the same facts for people and for programs (see :mod:`.report`)
    environment.json        Python, OS, CPU, GPU, library versions (see :mod:`.environment`)
    *.svg                   charts referenced from report.md

**Atomic, and the user's files are never touched.** The bundle is built in a hidden temporary sibling
folder; a new destination is that folder renamed into place, so a reader (or a crash half-way) never sees
a half-written bundle. Into an existing folder — empty, or holding an earlier bundle of the same model
plus whatever the user added (notes, subfolders) — only the bundle's own files are moved, each atomically,
``report.json`` last; files the earlier bundle listed and this one lacks (an old chart) are removed only
when they are files graphbisect writes into bundles and still hold the listed bytes; nothing else is
deleted. A folder holding other files but no bundle is refused, and so is a bundle of *another* model
unless ``force=True`` (``reduce --force``).

Example:
    >>> path = write_bundle(content, Path("graphbisect-out/bundle"), zip=True)   # doctest: +SKIP
    >>> loaded = load_bundle(path)                                                 # doctest: +SKIP
    >>> loaded.signature.kind                                                      # doctest: +SKIP
    <FailureKind.MISMATCH: 'mismatch'>
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from graphbisect.artifacts.charts import size_journey_svg
from graphbisect.artifacts.content import BundleContent
from graphbisect.artifacts.environment import backend_facts, collect_environment
from graphbisect.artifacts.report import jsonable, render_markdown, report_data
from graphbisect.artifacts.report_schema import report_problem
from graphbisect.artifacts.repro import CONTROL_TACTICS_FILE, TACTICS_FILE, render_repro, repro_config, tactic_files
from graphbisect.backends import BackendSpec
from graphbisect.backends.registry import require_backend
from graphbisect.backends.worker import save_npz
from graphbisect.compare import Comparison, Tolerance, compare_outputs
from graphbisect.errors import GraphBisectError, ModelError
from graphbisect.model.load import external_data_file, external_tensors, file_kind
from graphbisect.oracle.signature import Signature
from graphbisect.storage.npzguard import (
    MAX_BUNDLE_MEMBERS,
    MEMBER_ERRORS,
    damaged_stream,
    member_unreadable,
    model_declared,
    type_problem,
    zip_member_count,
)
from graphbisect.storage.values import NpzDamaged, NpzRefused, declared_dtypes, load_values_npz
from graphbisect.tactics.record import load_record, save_record

__all__ = [
    "BUNDLE_FORMAT",
    "BundleContent",
    "BundleError",
    "LoadedBundle",
    "check_destination",
    "is_bundle",
    "load_bundle",
    "read_json",
    "recorded_origin",
    "require_recorded_backend",
    "write_bundle",
]

logger = logging.getLogger(__name__)

BUNDLE_FORMAT = "graphbisect-bundle"
BUNDLE_VERSION = 1
#: The files every bundle has (charts come on top).
BUNDLE_FILES = ("model.onnx", "inputs.npz", "oracle_outputs.npz", "target_outputs.npz", "repro.py",
                "repro_config.json", "report.md", "report.json", "environment.json")


class BundleError(GraphBisectError):
    """A bundle cannot be written where asked, or a folder/zip is not a readable bundle."""


# ----------------------------------------------------------------------------------------------- write
def write_bundle(content: BundleContent, out_dir: Path, *, zip: bool = False, force: bool = False) -> Path:
    """Write the bundle folder ``out_dir`` atomically (and ``<out_dir>.zip`` beside it with ``zip``).

    Returns ``out_dir``. Raises :class:`BundleError` when ``out_dir`` is a non-empty folder that is not a
    bundle (or a file) or, without ``force``, a bundle of another model,
    :class:`~graphbisect.errors.SpecError` for a Paddle target (a bundle holds an ONNX model), and
    :class:`~graphbisect.errors.ModelError` for a model whose weights are not inline. A target backend
    without a ``repro.py`` section still gets its bundle, with a ``repro.py`` that points to ``graphbisect verify``.
    """
    out_dir = Path(out_dir).absolute()
    check_destination(out_dir, fingerprint=_original_fingerprint(content.report), force=force)
    _check_model(content.model)
    script = render_repro(content)  # before any file is written: a Paddle target fails here
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _fill(staging, content, script)
        _install(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if zip:
        _write_zip(out_dir)
    logger.info("wrote bundle %s%s", out_dir, " (+ .zip)" if zip else "")
    return out_dir


def is_bundle(path: Path) -> bool:
    """Whether ``path`` is a folder holding a graphbisect bundle (its report.json says so)."""
    try:
        data = read_json(Path(path) / "report.json")
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == BUNDLE_FORMAT


def names_bundle(path: Path) -> bool:
    """Whether :func:`load_bundle` would read ``path`` as a bundle rather than it being something else (a model):
    a bundle folder, a ``.zip`` (a model file is never one), or ``DIR`` when only ``DIR.zip`` exists."""
    path = Path(path)
    if path.is_dir():
        return is_bundle(path)
    if path.is_file():
        return zipfile.is_zipfile(path)
    named = path.absolute()
    return bool(named.name) and named.with_name(named.name + ".zip").is_file()


def read_json(path: Path) -> Any:
    """The JSON value in the file ``path``. Raises ``ValueError`` for text that is not JSON, not UTF-8, or
    nested too deeply to read (``[[[...`` 200,000 deep raised ``RecursionError``: "a graphbisect bug", issue 36
    item 7), ``OSError`` when it cannot be read."""
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise ValueError(f"{path.name} is nested too deeply to be read as JSON") from exc


def check_destination(out_dir: Path, *, fingerprint: str | None = None, force: bool = False) -> None:
    """Raise :class:`BundleError` unless a bundle of the model ``fingerprint`` may be written to ``out_dir``.

    Called before a reduction runs anything (so a bad ``-o`` costs nothing) and again when the bundle is
    written. ``out_dir`` may be missing, an empty folder, or a folder holding a previous graphbisect
    result — then only the bundle's files are replaced, and a bundle of another model (another
    ``fingerprint``) only with ``force``. Its parent folder must be writable (checked by a probe file).
    """
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir() or out_dir.is_symlink():
            raise BundleError(f"cannot write a bundle to {out_dir}: it exists and is not a folder",
                              hint="choose another output path, or remove that file")
        if any(out_dir.iterdir()) and _previous_result(out_dir) is None:
            raise BundleError(
                f"cannot write a bundle to {out_dir}: the folder exists, is not empty and is not a graphbisect "
                "bundle",
                hint="choose a new or empty folder (a previous bundle there would be replaced; other files never are)",
            )
        previous = (_previous_result(out_dir) or {}).get("original_fingerprint")
        if fingerprint and previous and previous != fingerprint and not force:
            raise BundleError(
                f"{out_dir} holds the bundle of another model (fingerprint {str(previous)[:12]}…, this model's "
                f"is {fingerprint[:12]}…); writing would replace it",
                hint="choose another -o folder, or pass --force to replace that bundle",
            )
    _check_writable(out_dir.parent)


def _check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".graphbisect-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise BundleError(f"cannot write a bundle into {folder}: {exc.strerror or exc}",
                          hint="choose a folder you can write to") from exc


def _previous_result(folder: Path) -> dict[str, Any] | None:
    """The report.json of a previous bundle, or of ``reduce``'s no-failure report, in ``folder``; else None."""
    try:
        data = read_json(folder / "report.json")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get("format") in (BUNDLE_FORMAT, "graphbisect-report") or data.get("failed") is False:
        return data
    return None


def _original_fingerprint(report: Mapping[str, Any]) -> str | None:
    original = report.get("original_model")
    value = original.get("fingerprint") if isinstance(original, Mapping) else None
    return str(value) if value else None


def _check_model(model: onnx.ModelProto) -> None:
    external = [init.name for init in model.graph.initializer
                if init.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise ModelError(
            f"the bundle model has external-data initializers ({', '.join(map(repr, external[:3]))}...)",
            hint="inline the weights before writing a bundle (onnx.load_external_data_for_model, or "
            "materialize the final candidate without the shared weights file)",
        )


def _ran_with(content: BundleContent) -> dict[str, dict[str, Any]]:
    """Each role's spec and what its worker measured (the report's ``versions``), for environment.json."""
    versions = content.report.get("versions")
    versions = versions if isinstance(versions, Mapping) else {}
    specs = {"oracle": content.oracle, "target": content.target,
             **({"control": content.control} if content.control is not None else {})}
    return {role: backend_facts(spec, versions[role] if isinstance(versions.get(role), Mapping) else None)
            for role, spec in specs.items()}


def _fill(folder: Path, content: BundleContent, script: str) -> None:
    """Write every file of the bundle into ``folder`` (the staging folder)."""
    model_bytes = content.model.SerializeToString()
    (folder / "model.onnx").write_bytes(model_bytes)
    save_npz(folder / "inputs.npz", content.inputs)
    save_npz(folder / "oracle_outputs.npz", content.oracle_outputs)
    if content.target_outputs:  # a crash produced nothing: no empty file that reads like "no outputs"
        save_npz(folder / "target_outputs.npz", content.target_outputs)
    (folder / "repro.py").write_text(script, encoding="utf-8")
    for name, text in content.files.items():
        if Path(name).name != name or name in BUNDLE_FILES:
            raise BundleError(f"extra bundle file {name!r} is not a plain new file name", hint="use a bare file name")
        (folder / name).write_text(text, encoding="utf-8")
    _write_json(folder / "repro_config.json", repro_config(content))
    _write_tactics(folder, content)
    environment = collect_environment(_ran_with(content))
    _write_json(folder / "environment.json", environment)
    charts = _write_charts(folder, content)
    comparison = _comparison(content)
    (folder / "report.md").write_text(
        render_markdown(content, comparison=comparison, environment=environment, charts=charts), encoding="utf-8")
    files = _file_list(folder)
    data = report_data(content, files=files, comparison=comparison, environment=environment,
                       model_fingerprint=hashlib.sha256(model_bytes).hexdigest(), charts=list(charts.values()))
    _write_json(folder / "report.json", data)
    _share(folder)


def _write_tactics(folder: Path, content: BundleContent) -> None:
    """Copy the tactic records of ``tactics=`` specs, restricted to the nodes the bundle model has."""
    nodes = [node.name for node in content.model.graph.node]
    for name, source in tactic_files(content).items():
        save_record(load_record(source).restricted(nodes), folder / name)


def _share(folder: Path) -> None:
    """Make the bundle readable by others (mkdtemp/mkstemp made the folder and the .npz files private)."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o755 if path.name == "repro.py" else 0o644)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(jsonable(data), indent=1, ensure_ascii=True, allow_nan=False) + "\n", encoding="utf-8")


def _comparison(content: BundleContent) -> Comparison | None:
    if not content.target_outputs:
        return None
    return compare_outputs(content.oracle_outputs, content.target_outputs, content.tolerance)


def _write_charts(folder: Path, content: BundleContent) -> dict[str, str]:
    """Save the charts as SVG files; returns chart name → file name (a journey chart is drawn if none given)."""
    charts = dict(content.charts)
    journey = content.report.get("journey")
    if "journey" not in charts and isinstance(journey, (list, tuple)) and journey:
        trail = content.report.get("trail")
        charts["journey"] = size_journey_svg([(int(x), int(y)) for x, y in journey],
                                             [(int(x), int(y), bool(f)) for x, y, f in trail]
                                             if isinstance(trail, (list, tuple)) else ())
    files: dict[str, str] = {}
    for name, svg in charts.items():
        stem = re.sub(r"[^\w.\-]+", "_", name).strip("._") or "chart"
        file_name = f"{stem}.svg"
        while file_name in files.values() or file_name in BUNDLE_FILES:
            file_name = f"{stem}_{len(files)}.svg"
        (folder / file_name).write_text(svg, encoding="utf-8")
        files[name] = file_name
    return files


def _file_list(folder: Path) -> list[dict[str, Any]]:
    """Name, size and sha256 of every file written so far (report.json lists all but itself)."""
    entries = []
    for path in sorted(folder.iterdir()):
        if path.is_file():
            entries.append({"name": path.name, "bytes": path.stat().st_size,
                            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    entries.append({"name": "report.json"})
    return entries


def _install(staging: Path, out_dir: Path) -> None:
    """Move the finished staging folder's files to ``out_dir`` (see the module docstring).

    A new ``out_dir`` is the staging folder renamed. Into an existing one, each file is renamed over its
    namesake (atomic per file), ``report.json`` last, so the folder is a complete bundle again only when
    every file is in place; files of the previous bundle that this one lacks are removed. Anything the
    previous ``report.json`` does not list (the user's notes and folders) is left alone.
    """
    if not out_dir.exists():
        os.rename(staging, out_dir)
        return
    previous = {str(f.get("name")): f for f in (_previous_result(out_dir) or {}).get("files") or []
                if isinstance(f, dict)}
    new = sorted((p.name for p in staging.iterdir()), key=lambda name: name == "report.json")
    for name in new:
        os.replace(staging / name, out_dir / name)
    for name in set(previous) - set(new):
        if _still_ours(out_dir, name, previous[name]):
            (out_dir / name).unlink()
    shutil.rmtree(staging, ignore_errors=True)


def _still_ours(folder: Path, name: str, listed: Mapping[str, Any]) -> bool:
    """Whether the earlier bundle's file ``name`` may be removed: the list in its report.json is no proof
    that graphbisect wrote a file (a copied or edited report.json listed the user's ``NOTES.md``, which was
    deleted: issue 24), so it must also be a kind of file graphbisect writes into a bundle (by its name) and
    still hold the bytes the list records."""
    path = folder / name
    if Path(name).name != name or not _bundle_file_name(name) or path.is_symlink() or not path.is_file():
        return False
    try:
        same_size = path.stat().st_size == int(listed.get("bytes", -1))
        return same_size and hashlib.sha256(path.read_bytes()).hexdigest() == listed.get("sha256")
    except (OSError, ValueError, TypeError):
        return False


def _bundle_file_name(name: str) -> bool:
    """Whether graphbisect writes files of this name into bundles (the fixed files, tactic records, the
    maintainer facts' scripts, charts)."""
    return name in BUNDLE_FILES or name in (TACTICS_FILE, CONTROL_TACTICS_FILE, "repro_min.py") or \
        name.endswith(".svg")


def _write_zip(out_dir: Path) -> Path:
    """``<out_dir>.zip`` beside the folder, written atomically; members are ``<name>/<file>``.

    Only the bundle's own files (those report.json lists, and report.json): the zip is what people share,
    and the user's notes kept in the folder are not theirs to share.
    """
    target = out_dir.with_name(out_dir.name + ".zip")
    names = sorted({str(f.get("name")) for f in (_previous_result(out_dir) or {}).get("files") or []
                    if isinstance(f, dict)} | {"report.json"})
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=out_dir.parent)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            for name in names:
                path = out_dir / name
                if Path(name).name == name and path.is_file() and not path.is_symlink():
                    zf.write(path, f"{out_dir.name}/{name}")
        Path(tmp).chmod(0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


# ------------------------------------------------------------------------------------------------ load
@dataclass
class LoadedBundle:
    """A bundle read back from a folder or a ``.zip`` (extracted to a temporary folder until :meth:`close`)."""

    path: Path  # the bundle folder (inside the extraction folder for a zip)
    source: Path  # what was given: the folder or the zip
    report: dict[str, Any]
    oracle: BackendSpec
    target: BackendSpec
    tolerance: Tolerance
    signature: Signature
    target_message: str | None
    inputs: dict[str, np.ndarray]
    oracle_outputs: dict[str, np.ndarray]
    target_outputs: dict[str, np.ndarray]
    environment: dict[str, Any]
    _cleanup: Any = field(default=None, repr=False)

    @property
    def model_path(self) -> Path:
        return self.path / "model.onnx"

    @property
    def inputs_path(self) -> Path:
        return self.path / "inputs.npz"

    def close(self) -> None:
        """Remove the extraction folder of a zipped bundle (nothing for a folder)."""
        if self._cleanup is not None:
            self._cleanup()

    def __enter__(self) -> LoadedBundle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def load_bundle(path: Path) -> LoadedBundle:
    """Read a bundle folder, a bundle ``.zip``, or ``DIR`` when only ``DIR.zip`` exists.

    Raises :class:`BundleError` when ``path`` is not a readable graphbisect bundle.
    """
    source = Path(path)
    if source.is_dir():
        return _read(source, source, None)
    if source.is_file() and zipfile.is_zipfile(source):
        return _load_zip(source)
    named = source.absolute()  # `.` and `..` have no name of their own
    zipped = named.with_name(named.name + ".zip") if named.name else None
    if not source.exists() and zipped is not None and zipped.is_file():
        return _load_zip(zipped)
    raise BundleError(f"{source} is not a bundle folder or zip",
                      hint="pass the folder (or .zip) that `graphbisect reduce` wrote")


def _load_zip(archive: Path) -> LoadedBundle:
    extract = tempfile.TemporaryDirectory(prefix="graphbisect-bundle-")  # removed at close() or collection
    try:
        root = _extract(archive, Path(extract.name))
        loaded = _read(root, archive, extract.cleanup)
    except BaseException:
        extract.cleanup()
        raise
    return loaded


def _extract(archive: Path, dest: Path) -> Path:
    """Extract ``archive`` safely (no absolute paths, no ``..``, at most :data:`MAX_BUNDLE_MEMBERS` members) and
    return the folder with report.json."""
    count = zip_member_count(archive, MAX_BUNDLE_MEMBERS)  # before listing them: 100,000 took 117 s (issue 36)
    if count is not None and count > MAX_BUNDLE_MEMBERS:
        raise BundleError(f"{archive} holds more than {MAX_BUNDLE_MEMBERS} members; a bundle is a dozen files",
                          hint="this zip was not written by `graphbisect reduce --zip`: do not extract it blindly")
    try:
        with zipfile.ZipFile(archive) as zf:
            _check_space(archive, zf.infolist(), dest)
            _check_layout(archive, zf.infolist())
            for member in zf.infolist():
                parts = Path(member.filename).parts
                if member.filename.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                    raise BundleError(f"{archive}: unsafe member path {member.filename!r}",
                                      hint="this zip was not written by graphbisect")
                _check_readable(archive, member)
                zf.extract(member, dest)
    except OSError as exc:  # a corrupt member: CRC, a deflate, bzip2 or lzma stream, truncation
        if not damaged_stream(exc):
            raise
        raise BundleError(f"{archive} is not a readable zip file: {exc}",
                          hint="download or copy the bundle again, or extract it yourself and pass the folder") \
            from exc
    except MEMBER_ERRORS as exc:
        raise BundleError(f"{archive} is not a readable zip file: {type(exc).__name__}: {exc}",
                          hint="download or copy the bundle again, or extract it yourself and pass the folder") \
            from exc
    candidates = [p.parent for p in (*dest.glob("report.json"), *dest.glob("*/report.json"))]
    if not candidates:
        raise BundleError(f"{archive} holds no report.json", hint="pass a zip written by `graphbisect reduce --zip`")
    return candidates[0]


def _check_readable(archive: Path, member: zipfile.ZipInfo) -> None:
    """Refuse a member zipfile cannot extract: encrypted, or compressed with another method (93, Zstandard):
    they raised RuntimeError / NotImplementedError, reported as "a graphbisect bug" (issue 36 item 7)."""
    problem = member_unreadable(member)
    if problem is not None:
        raise BundleError(f"{archive}: {problem}",
                          hint="graphbisect writes bundles unencrypted and deflated: extract it with a tool that "
                          "reads it (with its password) and pass the folder")


def _check_layout(archive: Path, members: list[zipfile.ZipInfo]) -> None:
    """Refuse a zip that names one path twice, or as a file and as a folder (``model.onnx`` and ``model.onnx/``:
    a FileExistsError extracting it, "a graphbisect bug", issue 36), before extracting any: which of two entries
    a reader takes is the reader's choice, so what ran would not be what another tool shows."""
    files: dict[tuple[str, ...], str] = {}
    folders: set[tuple[str, ...]] = set()
    for member in members:
        # the path zipfile extracts it to: empty, "." and ".." parts dropped
        parts = tuple(part for part in member.filename.split("/") if part not in ("", ".", ".."))
        folders.update(parts[:end] for end in range(1, len(parts)))
        if member.is_dir():
            folders.add(parts)
        elif parts in files:
            raise BundleError(f"{archive} holds {member.filename!r} twice", hint=_LAYOUT_HINT)
        else:
            files[parts] = member.filename
    for parts, name in files.items():
        if parts in folders:
            raise BundleError(f"{archive} holds {name!r} both as a file and as a folder", hint=_LAYOUT_HINT)


_LAYOUT_HINT = ("graphbisect writes each file of a bundle once: this zip was not written by `graphbisect reduce "
                "--zip`; ask its sender for the bundle again, or extract it yourself and pass the folder")


def _check_space(archive: Path, members: list[zipfile.ZipInfo], dest: Path) -> None:
    """Refuse a zip whose members would not fit in the extraction folder's free space, before extracting any
    (a 200 MB member and an 8 MB TMPDIR ended in "internal error: No space left on device", issue 24)."""
    needed = sum(member.file_size for member in members)
    free = shutil.disk_usage(dest).free
    if needed > free:
        raise BundleError(
            f"{archive} holds {needed} bytes when extracted, more than the {free} bytes free in {dest.parent}",
            hint="free space there, point TMPDIR at a larger file system, or extract the zip yourself and pass "
            "the folder")


#: The files whose bytes a bundle must record (report.json ``files``): what a verdict is computed from.
_HASHED = ("model.onnx", "inputs.npz", "oracle_outputs.npz")


def _read(folder: Path, source: Path, cleanup: Any) -> LoadedBundle:
    try:
        report = read_json(folder / "report.json")
    except (OSError, ValueError) as exc:
        report = None
        if (folder / "report.json").is_file():
            raise BundleError(f"bundle {source} is damaged: its report.json cannot be read: {exc}",
                              hint="download or copy the bundle again, or re-create it with `graphbisect reduce`") \
                from exc
    if not isinstance(report, dict) or report.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{source} is not a graphbisect bundle (no report.json of format {BUNDLE_FORMAT!r})",
                          hint="pass the folder (or .zip) that `graphbisect reduce` wrote")
    _check_format_version(report, source)  # first: a newer format's fields may have other shapes
    problem = report_problem(report)
    if problem is not None:  # a field of another shape was an AttributeError in a reader: exit 3 (issue 36)
        raise BundleError(f"bundle {source} is damaged: report.json {problem}",
                          hint="download or copy the bundle again, or re-create it with `graphbisect reduce`")
    missing = [name for name in ("model.onnx", "inputs.npz", "oracle_outputs.npz") if not (folder / name).is_file()]
    if missing:
        raise BundleError(f"bundle {source} lacks {', '.join(missing)}", hint="the bundle is incomplete: re-create it")
    _check_integrity(folder, source, report)
    declared = _declared(folder, source, report)
    try:
        inputs = _values(folder / "inputs.npz", declared.inputs, source)
        problem = type_problem(inputs, declared.types)
        if problem is not None:  # fed as they were, bytes for a double input were exit 3 in audit (issue 36)
            raise BundleError(f"bundle {source} is damaged: its inputs do not match the types model.onnx declares: "
                              f"inputs.npz: {problem}",
                              hint="download or copy the bundle again, or re-create it with `graphbisect reduce`")
        return LoadedBundle(
            path=folder, source=source, report=report,
            oracle=BackendSpec.parse(report["oracle"]),
            target=_own_tactics(BackendSpec.parse(report["target"]), folder),
            tolerance=_tolerance(report.get("tolerance") or {}),
            signature=Signature.from_json(report["signature"], report.get("target_message")),
            target_message=report.get("target_message"),
            inputs=inputs,
            oracle_outputs=_values(folder / "oracle_outputs.npz", declared.outputs, source),
            target_outputs=_optional_npz(folder / "target_outputs.npz", declared.any_shape_outputs, source),
            environment=_optional_json(folder / "environment.json"),
            _cleanup=cleanup,
        )
    except (KeyError, TypeError, ValueError, OSError) as exc:
        raise BundleError(f"bundle {source} is damaged: {type(exc).__name__}: {exc}",
                          hint="re-create it with `graphbisect reduce`") from exc


def _check_format_version(report: Mapping[str, Any], source: Path) -> None:
    """Refuse a bundle of a newer format than this graphbisect reads (format_version 999 verified silently)."""
    version = report.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > BUNDLE_VERSION:
        from graphbisect._version import __version__

        raise BundleError(
            f"bundle {source} has format version {version}, newer than this graphbisect {__version__} reads "
            f"(up to {BUNDLE_VERSION}): what it records may mean something else here",
            hint="upgrade graphbisect (pip install -U graphbisect), or verify it with the version that wrote it "
            f"(report.json: graphbisect_version {str(report.get('graphbisect_version'))[:40]!r})")


#: What to do with a bundle that would read data from outside itself, or more than its model declares.
_UNSAFE_HINT = ("graphbisect did not write this bundle so (its model carries its weights inline, its values have "
                "the model's shapes); do not run it: ask its sender for the bundle again, or re-create it with "
                "`graphbisect reduce`")


@dataclass(frozen=True)
class _Declared:
    """What a bundle's model.onnx declares: {input or output name: dims (None where dynamic) or None}, and
    {input name: the dtype of its value} (:func:`~graphbisect.storage.values.declared_dtypes`)."""

    inputs: dict[str, Any]
    outputs: dict[str, Any]
    types: dict[str, str]

    @property
    def any_shape_outputs(self) -> dict[str, Any]:
        """The outputs, of any shape: the target's own outputs may have a wrong shape (its bug)."""
        return dict.fromkeys(self.outputs)


def _declared(folder: Path, source: Path, report: Mapping[str, Any]) -> _Declared:
    """The inputs and outputs model.onnx declares, after checking its external data: a bundle carries its
    weights inline, so a reference outside the bundle (refused by every library, and then reported as "a
    different failure, the bug may be fixed") makes it unsafe, one to a file report.json does not hash damaged."""
    path = folder / "model.onnx"
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise BundleError(f"bundle {source} is damaged: model.onnx is not a readable ONNX model: "
                          f"{type(exc).__name__}: {exc}",
                          hint="download or copy the bundle again, or re-create it with `graphbisect reduce`") from exc
    hashed = {str(entry.get("name")) for entry in report.get("files") or []
              if isinstance(entry, Mapping) and "sha256" in entry}
    for tensor in external_tensors(proto):
        try:
            file = external_data_file(tensor, path, error=BundleError)
        except BundleError as exc:
            raise BundleError(f"unsafe bundle {source}: {exc.message}", hint=_UNSAFE_HINT) from exc
        kind = file_kind(file)
        location = file.relative_to(folder).as_posix()
        if kind is not None and kind != "missing":
            raise BundleError(f"unsafe bundle {source}: model.onnx reads the external data of tensor "
                              f"{tensor.name!r} from {location!r}, which is {kind}, not a file", hint=_UNSAFE_HINT)
        if location not in hashed:
            raise BundleError(
                f"bundle {source} is damaged: model.onnx reads the external data of tensor {tensor.name!r} from "
                f"{location!r}, {'which is missing' if kind else 'whose bytes its report.json does not record'}",
                hint="download or copy the bundle again, or re-create it with `graphbisect reduce`")
    inputs, outputs = model_declared(proto, path)  # inferred in a child: a download may crash it
    return _Declared(inputs=inputs, outputs=outputs, types=declared_dtypes(proto))


def _check_integrity(folder: Path, source: Path, report: Mapping[str, Any]) -> None:
    """Every file report.json lists with a sha256 must be there with those bytes; else the bundle is damaged.

    A damaged bundle (truncated download, edited outputs) must not be re-run and reported as "a different
    failure, the bug may be fixed": its verdict would be about other data than the reporter's.
    """
    damaged: list[str] = []
    listed = {str(entry.get("name")) for entry in report.get("files") or []
              if isinstance(entry, Mapping) and "sha256" in entry}
    unlisted = [name for name in _HASHED if name not in listed]
    if unlisted:  # a deleted list is no "old bundle": nothing would check an edited model (issue 24)
        raise BundleError(
            f"bundle {source} is damaged: its report.json records no sha256 of {', '.join(unlisted)}, so what "
            "would run cannot be checked against what the reporter ran",
            hint="download or copy the bundle again, or re-create it with `graphbisect reduce`")
    for entry in report.get("files") or []:
        if not isinstance(entry, Mapping) or "sha256" not in entry:
            continue  # report.json itself, or a bundle of a version that recorded no hashes
        name = str(entry.get("name"))
        path = folder / name
        if Path(name).name != name or not path.is_file() or path.is_symlink():
            damaged.append(f"{name} is missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            damaged.append(f"{name} differs from the recorded sha256")
    if damaged:
        raise BundleError(f"bundle {source} is damaged: {'; '.join(damaged)}",
                          hint="download or copy the bundle again, or re-create it with `graphbisect reduce`")


def _own_tactics(target: BackendSpec, folder: Path) -> BackendSpec:
    """The target spec with ``tactics=`` pointing at the bundle's own record (the recorded path may be gone)."""
    record = folder / TACTICS_FILE
    if not target.options.get("tactics") or not record.is_file():
        return target
    return dataclasses.replace(target, options={**target.options, "tactics": str(record)})


def _tolerance(data: Mapping[str, Any]) -> Tolerance:
    default = Tolerance()
    per_output = {str(k): (float(v[0]), float(v[1])) for k, v in (data.get("per_output") or {}).items()}
    min_cosine = data.get("min_cosine")
    return Tolerance(atol=float(data.get("atol", default.atol)), rtol=float(data.get("rtol", default.rtol)),
                     min_cosine=float(min_cosine) if min_cosine is not None else None, per_output=per_output,
                     check_dtype=bool(data.get("check_dtype", True)),
                     int_atol=float(data.get("int_atol", default.int_atol)),
                     quantized={str(k): float(v) for k, v in (data.get("quantized") or {}).items()})


def _optional_npz(path: Path, declared: Mapping[str, Any], source: Path) -> dict[str, np.ndarray]:
    return _values(path, declared, source) if path.is_file() else {}


def _values(path: Path, declared: Mapping[str, Any], source: Path) -> dict[str, Any]:
    """The values of the bundle's ``.npz`` ``path``, refused before any is decompressed when a member is larger
    than the value model.onnx declares (a 2 MB deflate bomb was decompressed to 2.1 GB, then run and called
    "a different failure, the bug may be fixed": issue 36), or all of them more than the memory available."""
    try:
        return load_values_npz(path, declared)
    except NpzRefused as exc:
        raise BundleError(f"unsafe bundle {source}: {exc.message}", hint=_UNSAFE_HINT) from exc
    except NpzDamaged as exc:  # encrypted, another method, a wrong CRC: exit 3 before (issue 36, the fuzzer)
        raise BundleError(f"bundle {source} is damaged: {exc.message}",
                          hint="download or copy the bundle again, or re-create it with `graphbisect reduce`") from exc


def _optional_json(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        data = read_json(path)
        if isinstance(data, dict):
            return data
    return {}


def recorded_origin(folder: Path) -> Mapping[str, Any] | None:
    """The custom backend's origin a bundle recorded (``repro_config.json`` ``custom_backend``), or None (absent,
    unreadable, not a record): how to register it, for repro.py, verify and the checker."""
    try:
        with (folder / "repro_config.json").open(encoding="utf-8") as handle:
            config = json.loads(handle.read(1 << 20))
    except (OSError, ValueError, RecursionError):  # nested 200,000 deep: not a record either
        return None
    origin = config.get("custom_backend") if isinstance(config, Mapping) else None
    return origin if isinstance(origin, Mapping) else None


def require_recorded_backend(spec: BackendSpec, folder: Path, shown: Path | str) -> None:
    """Raise :class:`SpecError` when the backend of a bundle's recorded ``spec`` is not in this process's table,
    with how to register it where the bundle (``folder``, given as ``shown``) recorded a custom backend's origin
    (:func:`~graphbisect.backends.registry.require_backend`)."""
    require_backend(spec, recorded_origin(folder), str(shown))
