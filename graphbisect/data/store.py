"""The activation store: one ``.npy`` file per tensor in a folder, plus ``manifest.json``.

Why files and memory maps: the oracle's dump of every intermediate tensor of a large model does not fit
in RAM, and candidates only need a few of them at a time. :meth:`ActivationStore.get` returns a
read-only memory map, so reading a tensor costs only the pages actually touched (tensors up to 64 KiB are
simply read: a map costs more than the read). Files are named by a
counter (``t000012.npy``), never by tensor name (tensor names may hold ``/``, ``:`` or be very long); the
manifest maps names to files, dtypes and shapes and is rewritten atomically. Its format is the one the
backend worker writes next to its outputs, so a worker's output folder is a store as it stands::

    {"version": 1, "tensors": [{"name": "conv1/out", "file": "0.npy", "dtype": "<f4", "shape": [1, 8]}]}

This module imports only the standard library and numpy, so backend worker processes can use it too.

Example:
    >>> store = ActivationStore(tmp_path / "oracle")          # doctest: +SKIP
    >>> store.put("conv1/out:0", np.ones((1, 64, 112, 112), np.float32))   # doctest: +SKIP
    >>> ActivationStore.open(tmp_path / "oracle").get("conv1/out:0").shape  # doctest: +SKIP
    (1, 64, 112, 112)
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.atomic import atomic_path
from graphbisect.errors import GraphBisectError
from graphbisect.npyfile import load_memmap, read_npy
from graphbisect.values import elem_type_name, entry_files, entry_nbytes, read_value, write_value

__all__ = ["MANIFEST_NAME", "ActivationStore", "StoredTensor"]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
_VERSION = 1


@dataclass(frozen=True)
class StoredTensor:
    """One manifest entry: the file (relative to the store's folder), dtype and shape of a tensor.

    ``elem_type`` is the ONNX element type of a tensor numpy lacks (stored raw, :mod:`graphbisect.values`);
    ``layout`` is the whole entry of a sequence or an empty optional (``file`` is then its first file, or
    empty).
    """

    file: str
    dtype: str
    shape: tuple[int, ...]
    elem_type: int | None = None
    layout: Mapping[str, Any] | None = None

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> StoredTensor:
        """The manifest entry ``entry`` (with or without its ``name``)."""
        if "file" not in entry:
            layout = {k: v for k, v in entry.items() if k != "name"}
            files = entry_files(layout)
            return cls(files[0] if files else "", "", (), None, layout)
        return cls(str(entry["file"]), str(entry["dtype"]), tuple(int(d) for d in entry["shape"]),
                   int(entry["elem_type"]) if entry.get("elem_type") is not None else None)

    @property
    def files(self) -> list[str]:
        """Every file holding this value."""
        return entry_files(self.to_json())

    @property
    def nbytes(self) -> int:
        return entry_nbytes(self.to_json())

    def to_json(self) -> dict[str, Any]:
        if self.layout is not None:
            return dict(self.layout)
        entry: dict[str, Any] = {"file": self.file, "dtype": self.dtype, "shape": list(self.shape)}
        if self.elem_type is not None:
            entry["elem_type"] = self.elem_type
            entry["onnx_type"] = elem_type_name(self.elem_type)
        return entry


def _atomic_write(path: Path, write: Any) -> None:
    """Call ``write(handle)`` on a temporary file next to ``path``, then move it over ``path``."""
    with atomic_path(path) as tmp, tmp.open("wb") as handle:
        write(handle)


class ActivationStore:
    """A folder of tensors addressed by name; each is read back read-only (memory-mapped above 64 KiB).

    ``ActivationStore(directory)`` creates the folder if needed and reads an existing manifest.
    With ``autoflush=False`` the manifest is only written by :meth:`flush` (faster for thousands of puts).
    """

    def __init__(self, directory: str | Path, *, autoflush: bool = True) -> None:
        self.directory = Path(directory)
        self._folder = str(self.directory)
        self.autoflush = autoflush
        self.directory.mkdir(parents=True, exist_ok=True)
        self._entries: dict[str, StoredTensor] = {}
        manifest = self.directory / MANIFEST_NAME
        if manifest.exists():
            self._entries = _read_manifest(manifest)
        self._counter = len(self._entries)

    @classmethod
    def open(cls, directory: str | Path) -> ActivationStore:
        """Open an existing store (its ``manifest.json`` must exist)."""
        directory = Path(directory)
        if not (directory / MANIFEST_NAME).is_file():
            raise GraphBisectError(
                f"{directory} is not an activation store: {MANIFEST_NAME} is missing",
                hint="pass the folder written by graphbisect (or index .npy files with ActivationStore.adopt)",
            )
        return cls(directory)

    @classmethod
    def adopt(cls, directory: str | Path, files: Mapping[str, str | Path] | None = None) -> ActivationStore:
        """Index ``.npy`` files already in ``directory`` as a store, without copying them.

        Without ``files``, the folder's ``manifest.json`` is used as is: the backend worker writes
        its outputs (``0.npy``, ``1.npy``... plus a manifest in this same format), so its output folder
        *is* a store. With ``files`` (tensor name → file inside ``directory``; relative paths are taken
        relative to it), those files are indexed from their headers and added to the manifest.

        Example:
            >>> store = ActivationStore.adopt(run_dir)                            # doctest: +SKIP
            >>> store = ActivationStore.adopt(out_dir, {"logits": "out_0.npy"})   # doctest: +SKIP
        """
        if files is None:
            return cls.open(directory)
        store = cls(directory, autoflush=False)
        for name, file in files.items():
            store._adopt_one(name, Path(file))
        store.flush()
        store.autoflush = True
        return store

    def _adopt_one(self, name: str, file: Path) -> None:
        full = file if file.is_absolute() else self.directory / file
        try:
            relative = full.resolve().relative_to(self.directory.resolve())
        except ValueError as exc:
            raise GraphBisectError(
                f"cannot adopt {full} for tensor {name!r}: it is outside the store folder {self.directory}",
                hint="write the .npy files into the store's folder",
            ) from exc
        if not full.is_file():
            raise GraphBisectError(
                f"cannot adopt tensor {name!r}: {full} does not exist", hint="check the worker output"
            )
        array = load_memmap(full)
        self._entries[name] = StoredTensor(relative.as_posix(), array.dtype.str, tuple(array.shape))

    # --- writing ------------------------------------------------------------------------------------------

    def put(self, name: str, array: Any) -> None:
        """Store ``array`` (any ONNX value, :mod:`graphbisect.values`) under ``name``, atomically."""
        previous = self._entries.get(name)
        stem = previous.file.partition(".")[0] if previous and previous.file else self._new_stem()
        try:
            entry = write_value(array, stem, lambda file, raw: _atomic_write(
                self.directory / file, lambda handle: np.lib.format.write_array(handle, raw, allow_pickle=False)))
        except GraphBisectError as exc:
            raise GraphBisectError(f"tensor {name!r} cannot be stored: {exc.message}", hint=exc.hint) from exc
        self._entries[name] = StoredTensor.from_entry(entry)
        if self.autoflush:
            self.flush()

    def _new_stem(self) -> str:
        taken = {file.partition(".")[0] for entry in self._entries.values() for file in entry.files}
        while True:
            stem = f"t{self._counter:06d}"
            self._counter += 1
            if stem not in taken and not (self.directory / f"{stem}.npy").exists():
                return stem

    def flush(self) -> None:
        """Write ``manifest.json`` atomically."""
        document = {
            "version": _VERSION,
            "tensors": [{"name": name, **entry.to_json()} for name, entry in self._entries.items()],
        }
        data = json.dumps(document, indent=1).encode("utf-8")
        _atomic_write(self.directory / MANIFEST_NAME, lambda handle: handle.write(data))

    # --- reading ------------------------------------------------------------------------------------------

    def get(self, name: str) -> Any:
        """The tensor stored under ``name``, read-only: a memory map, or an in-memory array up to 64 KiB.

        Sequences are lists, empty optionals ``None``, types numpy lacks ``ml_dtypes`` arrays
        (:mod:`graphbisect.values`).
        """
        entry = self.info(name)
        if entry.layout is None and entry.elem_type is None:
            return read_npy(os.path.join(self._folder, entry.file), entry.dtype, entry.shape)
        return read_value(entry.to_json(), lambda item: read_npy(
            os.path.join(self._folder, str(item["file"])), str(item["dtype"]), tuple(item["shape"])))

    def path(self, name: str) -> Path:
        """The ``.npy`` file holding ``name`` (e.g. to hand to a worker process without reading it)."""
        return self.directory / self.info(name).file

    def info(self, name: str) -> StoredTensor:
        """The manifest entry of ``name``; raises ``KeyError`` naming close matches."""
        try:
            return self._entries[name]
        except KeyError as exc:
            close = difflib.get_close_matches(name, list(self._entries), n=3)
            suggestion = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise KeyError(f"tensor {name!r} is not in the activation store {self.directory}{suggestion}") from exc

    def names(self) -> list[str]:
        """Stored tensor names, in the order they were first stored."""
        return list(self._entries)

    @property
    def nbytes(self) -> int:
        """Total size of the stored tensors' data."""
        return sum(entry.nbytes for entry in self._entries.values())

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ActivationStore({str(self.directory)!r}, tensors={len(self)}, nbytes={self.nbytes})"


def _read_manifest(path: Path) -> dict[str, StoredTensor]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        entries = {entry["name"]: StoredTensor.from_entry(entry) for entry in document["tensors"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GraphBisectError(
            f"cannot read the activation store manifest {path}: {type(exc).__name__}: {exc}",
            hint="the store is corrupt; delete the folder and let graphbisect recompute it",
        ) from exc
    for name, entry in entries.items():
        if any(Path(file).is_absolute() or ".." in Path(file).parts for file in entry.files):
            raise GraphBisectError(
                f"activation store manifest {path}: tensor {name!r} points outside the store ({entry.file!r})",
                hint="the store is corrupt; delete the folder and let graphbisect recompute it",
            )
    return entries
