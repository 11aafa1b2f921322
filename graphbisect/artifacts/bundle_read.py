"""Reading a bundle's files back: the folder or ``.zip`` checked and read, not interpreted.

What both a reader of claims and the checker need (:mod:`graphbisect.checker` reads bundles through this
module alone): a zip extracted safely (member count, paths, layout, space, methods), the sha256 of every file
report.json lists, the report's shape, values held to the shapes model.onnx declares before anything is
decompressed, external data refused outside the bundle. It interprets nothing: the failure signature and the
tolerance are read by :func:`graphbisect.artifacts.bundle.load_bundle`, on top of this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx

from graphbisect.artifacts.report_schema import report_problem
from graphbisect.artifacts.repro_backends._common import TACTICS_FILE
from graphbisect.backends.base import BackendSpec
from graphbisect.backends.registry import require_backend
from graphbisect.errors import GraphBisectError
from graphbisect.model.load import external_data_file, external_tensors, file_kind
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

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "BundleError", "RecordedBundle", "read_bundle",
           "read_json", "recorded_origin", "require_recorded_backend"]

BUNDLE_FORMAT = "graphbisect-bundle"
BUNDLE_VERSION = 1
_Bundle = TypeVar("_Bundle", bound="RecordedBundle")


class BundleError(GraphBisectError):
    """A bundle cannot be written where asked, or a folder/zip is not a readable bundle."""


def read_json(path: Path) -> Any:
    """The JSON value in the file ``path``. Raises ``ValueError`` for text that is not JSON, not UTF-8, or
    nested too deeply to read (``[[[...`` 200,000 deep raised ``RecursionError``: "a graphbisect bug", issue 36
    item 7), ``OSError`` when it cannot be read."""
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise ValueError(f"{path.name} is nested too deeply to be read as JSON") from exc


@dataclass
class RecordedBundle:
    """A bundle's files read back from a folder or a ``.zip`` (extracted to a temporary folder until :meth:`close`),
    checked (integrity, limits, layout) and not interpreted: no failure signature, no tolerance."""

    path: Path  # the bundle folder (inside the extraction folder for a zip)
    source: Path  # what was given: the folder or the zip
    report: dict[str, Any]
    oracle: BackendSpec
    target: BackendSpec
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

    def __enter__(self: _Bundle) -> _Bundle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_bundle(path: Path) -> RecordedBundle:
    """Read the files of a bundle folder, a bundle ``.zip``, or ``DIR`` when only ``DIR.zip`` exists.

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


def _load_zip(archive: Path) -> RecordedBundle:
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


def _read(folder: Path, source: Path, cleanup: Any) -> RecordedBundle:
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
        return RecordedBundle(
            path=folder, source=source, report=report,
            oracle=BackendSpec.parse(report["oracle"]),
            target=_own_tactics(BackendSpec.parse(report["target"]), folder),
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
        extent = _extent_problem(tensor, file)
        if extent:
            raise BundleError(f"bundle {source} is damaged: model.onnx reads the external data of tensor "
                              f"{tensor.name!r} from {location!r} {extent}",
                              hint="download or copy the bundle again, or re-create it with `graphbisect reduce`")
    inputs, outputs = model_declared(proto, path)  # inferred in a child: a download may crash it
    return _Declared(inputs=inputs, outputs=outputs, types=declared_dtypes(proto))


def _extent_problem(tensor: onnx.TensorProto, file: Path) -> str | None:
    """What is wrong with where ``tensor``'s external data lies in ``file`` (a regular file): an ``offset`` or
    ``length`` that is no whole number, negative, or beyond the file's end (ONNX's loader seeks there: a negative
    offset is an OSError, a length beyond the end a short read); None when it lies inside."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    try:
        offset = int(entries.get("offset") or 0)
        length = int(entries["length"]) if entries.get("length") else 0
    except ValueError:
        return f"at offset {entries.get('offset')!r} and length {entries.get('length')!r}, which are no whole numbers"
    size = file.stat().st_size
    if offset < 0 or length < 0 or offset + length > size:
        return f"at bytes {offset} to {offset + length}, outside its {size} bytes"
    return None


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
