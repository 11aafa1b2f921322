"""The activation store: a run's tensors in one packed data file, memory-mapped, plus an index written last.

Why one data file and a memory map: the oracle's dump of every intermediate tensor of a large model does
not fit in RAM, candidates only need a few of them at a time, and a file per tensor made a 50,000-node run
~99,000 files (22 s just to delete). The layout is :mod:`graphbisect.storage.packfile`'s, the one the backend
worker writes its outputs in, so a worker's output folder *is* a store as it stands::

    values.bin      every tensor's raw bytes (small ones packed, those above 64 KiB page-aligned)
    manifest.json   {"version": 2, "data": "values.bin", "size": ..., "token": ..., "tail_crc32": ...,
                     "tensors": [{"name": "conv1/out", "offset": 64, "dtype": "<f4", "shape": [1, 8]}]}

:meth:`ActivationStore.get` returns tensors above 64 KiB as read-only views of one map of the data file
(only the pages touched are read) and smaller ones copied into memory. A store whose data and index do not
belong together (a run killed mid-write, a truncated or replaced file) is refused with
:class:`~graphbisect.storage.packfile.TornRunError`, never misread.

Stores written by graphbisect before the packed layout (one ``.npy`` file per tensor, manifest version 1)
are still read, so ``--resume`` of an older work folder works; they are not added to.

This module imports only the standard library, numpy and graphbisect modules that do, so backend worker
processes can use it too (``ActivationStore.open(folder).get(name)``).

Example:
    >>> store = ActivationStore(tmp_path / "oracle")          # doctest: +SKIP
    >>> store.put("conv1/out:0", np.ones((1, 64, 112, 112), np.float32))   # doctest: +SKIP
    >>> ActivationStore.open(tmp_path / "oracle").get("conv1/out:0").shape  # doctest: +SKIP
    (1, 64, 112, 112)
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.errors import GraphBisectError
from graphbisect.storage.npyfile import load_memmap, read_npy
from graphbisect.storage.packfile import (
    DATA_NAME,
    INDEX_NAME,
    LEGACY_VERSION,
    PackedData,
    PackWriter,
    read_index,
)
from graphbisect.storage.values import elem_type_name, entry_files, entry_nbytes, is_native, read_value

__all__ = ["MANIFEST_NAME", "ActivationStore", "StoredFeeds", "StoredTensor"]

logger = logging.getLogger(__name__)

MANIFEST_NAME = INDEX_NAME
#: The most stored bytes :meth:`ActivationStore.windows` keeps resident at a time.
WINDOW_BYTES = 64 << 20


@dataclass(frozen=True)
class StoredTensor:
    """One index entry: where a tensor's bytes are (``file`` relative to the store's folder, and ``offset``
    in it; ``offset`` is None for a version 1 store's ``.npy`` file), its stored dtype and shape.

    ``elem_type`` is the ONNX element type of a tensor numpy lacks (stored raw, :mod:`graphbisect.storage.values`);
    ``layout`` is the whole entry of a sequence or an empty optional (``file`` is then the file holding its
    first item, or empty).
    """

    file: str
    dtype: str
    shape: tuple[int, ...]
    elem_type: int | None = None
    layout: Mapping[str, Any] | None = None
    offset: int | None = None

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> StoredTensor:
        """The index entry ``entry`` (with or without its ``name``)."""
        if "sequence" in entry or "optional" in entry:
            layout = {k: v for k, v in entry.items() if k != "name"}
            files = entry_files(layout)
            return cls(files[0] if files else DATA_NAME if entry_nbytes(layout) else "", "", (), None, layout)
        elem_type = int(entry["elem_type"]) if entry.get("elem_type") is not None else None
        offset = int(entry["offset"]) if "offset" in entry else None
        return cls(str(entry.get("file", DATA_NAME)), str(entry["dtype"]), tuple(int(d) for d in entry["shape"]),
                   elem_type, None, offset)

    @property
    def files(self) -> list[str]:
        """Every file holding this value."""
        return entry_files(self.to_json()) or ([self.file] if self.file else [])

    @property
    def nbytes(self) -> int:
        return entry_nbytes(self.to_json())

    def to_json(self) -> dict[str, Any]:
        if self.layout is not None:
            return dict(self.layout)
        where: dict[str, Any] = {"offset": self.offset} if self.offset is not None else {"file": self.file}
        entry: dict[str, Any] = {**where, "dtype": self.dtype, "shape": list(self.shape)}
        if self.elem_type is not None:
            entry["elem_type"] = self.elem_type
            entry["onnx_type"] = elem_type_name(self.elem_type)
        return entry


class ActivationStore:
    """Tensors addressed by name, in one packed data file; each is read back read-only (views of a memory
    map above 64 KiB).

    ``ActivationStore(directory)`` creates the folder if needed and reads an existing index (raising
    :class:`~graphbisect.storage.packfile.TornRunError` for a torn one). :meth:`put` appends to the data file; the
    index is written by :meth:`flush`, after every put unless ``autoflush=False`` (faster for thousands of
    puts). :meth:`close` (or a ``with`` block) flushes and closes the data file.
    """

    def __init__(self, directory: str | Path, *, autoflush: bool = True) -> None:
        self.directory = Path(directory)
        self._folder = str(self.directory)
        self.autoflush = autoflush
        self.directory.mkdir(parents=True, exist_ok=True)
        self._entries: dict[str, Mapping[str, Any]] = {}
        self._index: Mapping[str, Any] | None = read_index(self.directory)
        self._legacy = self._index is not None and self._index["version"] == LEGACY_VERSION
        self._writer: PackWriter | None = None
        self._data: PackedData | None = None
        self._dirty = False
        if self._index is not None:
            self._entries = _entries(self.directory / MANIFEST_NAME, self._index, legacy=self._legacy)
            if not self._legacy:
                self._data = PackedData(self.directory / DATA_NAME, str(self._index["token"]),
                                        size=int(self._index["size"]))

    @classmethod
    def open(cls, directory: str | Path) -> ActivationStore:
        """Open an existing store (its ``manifest.json`` must exist and match its data)."""
        directory = Path(directory)
        if not (directory / MANIFEST_NAME).is_file() and not (directory / DATA_NAME).exists():
            raise GraphBisectError(
                f"{directory} is not an activation store: {MANIFEST_NAME} is missing",
                hint="pass the folder written by graphbisect (a worker's output folder or a store's)",
            )
        return cls(directory)

    @classmethod
    def adopt(cls, directory: str | Path, files: Mapping[str, str | Path] | None = None) -> ActivationStore:
        """The store in ``directory``, optionally adding ``.npy`` files to it.

        Without ``files``, the folder is opened as it is: the backend worker writes its outputs in the
        store's layout, so its output folder *is* a store (no copy). With ``files`` (tensor name → ``.npy``
        file inside ``directory``; relative paths are taken relative to it), those arrays are copied into
        the store's data file (a store is one data file; the ``.npy`` files may be deleted afterwards).

        Example:
            >>> store = ActivationStore.adopt(run_dir)                            # doctest: +SKIP
            >>> store = ActivationStore.adopt(out_dir, {"logits": "out_0.npy"})   # doctest: +SKIP
        """
        if files is None:
            return cls.open(directory)
        store = cls(directory, autoflush=False)
        for name, file in files.items():
            store.put(name, store._adoptable(name, Path(file)))
        store.flush()
        store.autoflush = True
        return store

    def _adoptable(self, name: str, file: Path) -> Any:
        full = file if file.is_absolute() else self.directory / file
        try:
            full.resolve().relative_to(self.directory.resolve())
        except ValueError as exc:
            raise GraphBisectError(
                f"cannot adopt {full} for tensor {name!r}: it is outside the store folder {self.directory}",
                hint="write the .npy files into the store's folder",
            ) from exc
        if not full.is_file():
            raise GraphBisectError(
                f"cannot adopt tensor {name!r}: {full} does not exist", hint="check the worker output"
            )
        return load_memmap(full)

    # --- writing ------------------------------------------------------------------------------------------

    def put(self, name: str, array: Any) -> None:
        """Store ``array`` (any ONNX value, :mod:`graphbisect.storage.values`) under ``name``, replacing an earlier
        value of that name (whose maps stay valid: its bytes are never overwritten)."""
        writer = self._open_writer()
        try:
            entry = writer.add(array)
        except GraphBisectError as exc:
            raise GraphBisectError(f"tensor {name!r} cannot be stored: {exc.message}", hint=exc.hint) from exc
        self._entries[name] = {"name": name, **entry}
        self._dirty = True
        if self.autoflush:
            self.flush()

    def _open_writer(self) -> PackWriter:
        if self._legacy:
            raise GraphBisectError(
                f"{self.directory} is an activation store of an older graphbisect (one .npy file per tensor, "
                f"{MANIFEST_NAME} version {LEGACY_VERSION}): it is read, not added to",
                hint="write new tensors to a new folder, or delete this one and let graphbisect recompute it",
            )
        if self._writer is None:
            self._writer = (PackWriter.append(self.directory, self._index) if self._index is not None
                            else PackWriter(self.directory))
            self._data = self._writer.data
        return self._writer

    def flush(self) -> None:
        """Write the index (``manifest.json``) atomically, after the data it describes."""
        if self._legacy or (self._index is not None and not self._dirty):
            return
        writer = self._open_writer()
        self._index = writer.publish(list(self._entries.values()))
        self._dirty = False

    def close(self) -> None:
        """Flush and close the data file (reading stays possible; a later put opens it again)."""
        if self._writer is not None:
            self.flush()
            self._writer.close()
            self._writer = None
            assert self._index is not None  # flush published it
            # the writer's view flushes its (now closed) file before mapping: read the published file instead
            self._data = PackedData(self.directory / DATA_NAME, str(self._index["token"]),
                                    size=int(self._index["size"]))

    def __enter__(self) -> ActivationStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- reading ------------------------------------------------------------------------------------------

    def release(self) -> None:
        """Let go of the data file's pages this process has read (:meth:`PackedData.release
        <graphbisect.storage.packfile.PackedData.release>`); what was read stays readable."""
        if self._data is not None:
            self._data.release()

    def windows(self, names: Iterable[str], *, count: int = 4096, nbytes: int = WINDOW_BYTES
                ) -> Iterator[list[str]]:
        """``names`` in order, in runs of at most ``count`` tensors and (past a run's first tensor) ``nbytes`` of
        stored data; the pages a run read are let go (:meth:`release`) once the caller asks for the next. For a
        pass over a capture larger than the memory it should hold (a 1,500-node detector's is ~1 GiB): its
        resident part stays one window."""
        window: list[str] = []
        held = 0
        for name in names:
            size = self.tensor_nbytes(name)
            if window and (len(window) >= count or held + size > nbytes):
                yield window
                self.release()
                window, held = [], 0
            window.append(name)
            held += size
        if window:
            yield window
            self.release()

    def get(self, name: str) -> Any:
        """The tensor stored under ``name``, read-only: a view of the data file's memory map, or an
        in-memory array up to 64 KiB.

        Sequences are lists, empty optionals ``None``, types numpy lacks ``ml_dtypes`` arrays
        (:mod:`graphbisect.storage.values`).
        """
        entry = self._entries.get(name)
        if entry is None:
            self.info(name)  # raises, naming close matches
            raise AssertionError("unreachable")
        if self._data is not None:
            return self._data.value(entry)
        if "file" in entry and "elem_type" not in entry:
            return read_npy(os.path.join(self._folder, entry["file"]), entry["dtype"], tuple(entry["shape"]))
        return read_value(entry, lambda item: read_npy(
            os.path.join(self._folder, str(item["file"])), str(item["dtype"]), tuple(item["shape"])))

    def get_many(self, names: Sequence[str]) -> list[Any]:
        """:meth:`get` of each of ``names``, in order, read-only; the tensors stored as themselves are views of
        the data file's map, checked at once (:meth:`PackedData.views
        <graphbisect.storage.packfile.PackedData.views>`: ~1 µs a tensor where :meth:`get` costs ~9 µs, which a
        worker comparing thousands of probed tensors with the store paid before its reply)."""
        data = self._data
        if data is None or any(name not in self._entries for name in names):
            return [self.get(name) for name in names]  # a version 1 store; or an unknown name, which get names
        entries = [self._entries[name] for name in names]
        plain = [_plain(entry) for entry in entries]
        views = iter(data.views([entry for entry, stored in zip(entries, plain, strict=True) if stored]))
        return [next(views) if stored else data.value(entry) for entry, stored in zip(entries, plain, strict=True)]

    def path(self, name: str) -> Path:
        """The file holding ``name``: the data file (``info(name).offset`` says where in it), or the
        ``.npy`` file of a version 1 store."""
        return self.directory / self.info(name).file

    def info(self, name: str) -> StoredTensor:
        """The index entry of ``name``; raises ``KeyError`` naming close matches."""
        try:
            return StoredTensor.from_entry(self._entries[name])
        except KeyError as exc:
            close = difflib.get_close_matches(name, list(self._entries), n=3)
            suggestion = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise KeyError(f"tensor {name!r} is not in the activation store {self.directory}{suggestion}") from exc

    def describe(self, name: str) -> tuple[np.dtype, tuple[int, ...]] | None:
        """(dtype, shape) of the tensor ``get(name)`` returns, from the index alone (no value read), for a
        tensor of a packed store stored as itself (a numpy type ONNX has natively,
        :func:`graphbisect.storage.values.is_native`); None otherwise (a name not stored, a sequence, an optional, a
        type numpy lacks, a version 1 store)."""
        entry = self._entries.get(name)
        if entry is None or self._data is None or "offset" not in entry or "elem_type" in entry:
            return None
        dtype = _dtype(str(entry["dtype"]))
        return (dtype, tuple(map(int, entry["shape"]))) if is_native(dtype) else None

    def reference(self) -> dict[str, Any] | None:
        """What identifies this store's published data, for another process to read tensors from it by name
        (:class:`graphbisect.backends.worker.InputsReader`): ``folder`` (absolute), and the index's ``token``,
        ``size`` and ``tail_crc32``, which the reader checks against the index it reads, exactly as
        :func:`~graphbisect.storage.packfile.read_index` checks a store here. None for a version 1 store or one with
        values not yet published (:meth:`flush`)."""
        if self._legacy or self._index is None or self._dirty:
            return None
        index = self._index
        return {"folder": str(self.directory.absolute()), "token": str(index["token"]), "size": int(index["size"]),
                "tail_crc32": int(index["tail_crc32"])}

    def names(self) -> list[str]:
        """Stored tensor names, in the order they were first stored."""
        return list(self._entries)

    def tensor_nbytes(self, name: str) -> int:
        """Size of the data stored under ``name`` (from the index: nothing is read)."""
        return entry_nbytes(self._entries[name])

    @property
    def nbytes(self) -> int:
        """Total size of the stored tensors' data."""
        return sum(entry_nbytes(entry) for entry in self._entries.values())

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


class StoredFeeds(Mapping[str, Any]):
    """A model's feeds, some of them tensors of an activation store that are read only when asked for.

    ``order``: every feed's name, in order; ``held``: the values in hand (the others are ``store``'s tensors
    of the same name, read by ``read(name)``: the oracle's values as the caller reads them, a cache
    maybe). Why: a candidate of a large model is fed thousands of cut tensors, and a backend worker can
    read them from the store itself (:class:`graphbisect.backends.worker.InputsWriter` names them in the
    request), so neither a read here nor a copy to the worker is needed. As a mapping it is the plain feeds:
    ``dict(feeds)`` reads every value.
    """

    def __init__(self, order: Sequence[str], held: Mapping[str, Any], store: ActivationStore,
                 read: Callable[[str], Any]) -> None:
        self.order = order
        self.held = held
        self.store = store
        self._read = read
        self._names: frozenset[str] | None = None

    def stored(self) -> list[str]:
        """The names read from the store, in order."""
        return [name for name in self.order if name not in self.held]

    def __getitem__(self, name: str) -> Any:
        if name in self.held:
            return self.held[name]
        if self._names is None:
            self._names = frozenset(self.order)
        if name not in self._names:
            raise KeyError(name)
        return self._read(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)

    def __repr__(self) -> str:
        return f"StoredFeeds({len(self.order)} feeds, {len(self.order) - len(self.held)} in {self.store.directory})"


@functools.lru_cache(maxsize=256)
def _dtype(name: str) -> np.dtype:
    return np.dtype(name)


def _entries(path: Path, index: Mapping[str, Any], *, legacy: bool) -> dict[str, Mapping[str, Any]]:
    """The tensor entries of ``index`` (with their ``name``) by name, checked (a version 1 store's files must lie
    inside it)."""
    try:
        entries: dict[str, Mapping[str, Any]] = {str(entry["name"]): entry for entry in index["tensors"]}
        described = [StoredTensor.from_entry(entry) for entry in entries.values()] if legacy else []
    except (ValueError, KeyError, TypeError) as exc:
        raise GraphBisectError(
            f"cannot read the activation store manifest {path}: {type(exc).__name__}: {exc}",
            hint=f"the store is corrupt; delete {path.parent} and let graphbisect recompute it",
        ) from exc
    for name, entry in zip(entries, described):
        if any(Path(file).is_absolute() or ".." in Path(file).parts for file in entry.files):
            raise GraphBisectError(
                f"activation store manifest {path}: tensor {name!r} points outside the store ({entry.file!r})",
                hint=f"the store is corrupt; delete {path.parent} and let graphbisect recompute it",
            )
    return entries


def _plain(entry: Mapping[str, Any]) -> bool:
    """Whether ``entry`` is a tensor stored as itself in the data file (not a sequence, an optional or a type
    numpy lacks)."""
    return "offset" in entry and "elem_type" not in entry
