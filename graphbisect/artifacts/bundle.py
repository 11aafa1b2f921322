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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from graphbisect.artifacts.bundle_read import (
    BUNDLE_FORMAT,
    BundleError,
    RecordedBundle,
    read_bundle,
    read_json,
)
from graphbisect.artifacts.charts import size_journey_svg
from graphbisect.artifacts.content import BundleContent
from graphbisect.artifacts.environment import backend_facts, collect_environment
from graphbisect.artifacts.report import jsonable, render_markdown, report_data
from graphbisect.artifacts.repro import CONTROL_TACTICS_FILE, TACTICS_FILE, render_repro, repro_config, tactic_files
from graphbisect.backends.worker import save_npz
from graphbisect.compare import Comparison, Tolerance, compare_outputs
from graphbisect.errors import ModelError
from graphbisect.oracle.signature import Signature
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
    "write_bundle",
]

logger = logging.getLogger(__name__)

#: The files every bundle has (charts come on top).
BUNDLE_FILES = ("model.onnx", "inputs.npz", "oracle_outputs.npz", "target_outputs.npz", "repro.py",
                "repro_config.json", "report.md", "report.json", "environment.json")


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
                hint="choose another output folder, or pass force=True to replace that bundle",
                cli_hint="choose another -o folder, or pass --force to replace that bundle",
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
@dataclass(kw_only=True)
class LoadedBundle(RecordedBundle):
    """A bundle read back (:func:`~graphbisect.artifacts.bundle_read.read_bundle`) with what graphbisect's
    workflows interpret in it: the tolerance its verdict was judged under and the failure's signature."""

    tolerance: Tolerance
    signature: Signature


def load_bundle(path: Path) -> LoadedBundle:
    """Read a bundle folder, a bundle ``.zip``, or ``DIR`` when only ``DIR.zip`` exists, and its tolerance and
    failure signature. Raises :class:`BundleError` when ``path`` is not a readable graphbisect bundle."""
    files = read_bundle(path)
    try:
        tolerance = _tolerance(files.report.get("tolerance") or {})
        signature = Signature.from_json(files.report["signature"], files.report.get("target_message"))
    except (KeyError, TypeError, ValueError) as exc:
        files.close()
        raise BundleError(f"bundle {files.source} is damaged: {type(exc).__name__}: {exc}",
                          hint="re-create it with `graphbisect reduce`") from exc
    fields = {item.name: getattr(files, item.name) for item in dataclasses.fields(RecordedBundle)}
    return LoadedBundle(**fields, tolerance=tolerance, signature=signature)


def _tolerance(data: Mapping[str, Any]) -> Tolerance:
    default = Tolerance()
    per_output = {str(k): (float(v[0]), float(v[1])) for k, v in (data.get("per_output") or {}).items()}
    min_cosine = data.get("min_cosine")
    return Tolerance(atol=float(data.get("atol", default.atol)), rtol=float(data.get("rtol", default.rtol)),
                     min_cosine=float(min_cosine) if min_cosine is not None else None, per_output=per_output,
                     check_dtype=bool(data.get("check_dtype", True)),
                     int_atol=float(data.get("int_atol", default.int_atol)),
                     quantized={str(k): float(v) for k, v in (data.get("quantized") or {}).items()})
