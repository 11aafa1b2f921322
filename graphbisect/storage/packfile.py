"""A folder of values as one packed data file plus its index, written last: how a run's tensors lie on disk.

Why one file: a probe run writes one tensor per node. As one ``.npy`` file each, a 50,000-node run made
~99,000 files (a 4 KiB block for 64 bytes of data: 2.6 MiB of values took 21 MiB) and ``rmtree`` alone
took 22 s. Packed, a run is two files however many tensors it holds::

    values.bin      a 64-byte header (magic, run token), then every tensor's raw bytes, C order: tensors up
                    to 64 KiB packed at 64-byte boundaries, larger ones at 4 KiB (page) boundaries
    manifest.json   the index, written last:
                    {"version": 2, "data": "values.bin", "size": 9216, "token": "9f0c...", "tail_crc32": 1234,
                     "tensors": [{"name": "conv1/out", "offset": 64, "dtype": "<f4", "shape": [1, 8]}, ...]}

Tensor entries are :mod:`graphbisect.storage.values` entries with an ``offset`` into the data file where the
per-tensor layout had a ``file``; sequences, empty optionals and the types numpy lacks are described the
same way. Reading maps the data file once (one descriptor per run, not one per tensor): tensors above
64 KiB come back as read-only views of that map (zero copy: only touched pages are read), smaller ones are
copied out of it.

Crash safety. A new run writes its data to a temporary file, renames it to ``values.bin``, then writes the
index atomically, so a worker killed mid-write leaves no index (the folder is then no store: "the run did
not finish"). Its temporary file is removed when the next run into the folder starts
(:func:`remove_abandoned`: only a file that starts with the header and whose writer's lock the kernel
released, so never a live writer's, even another run's in the same folder). Opening checks that the index
matches its data: the data file exists, is at least ``size`` bytes long, starts with the index's ``token``
(a later run's data under an earlier run's index is refused), and the CRC-32 of the last 4 KiB before
``size`` matches (a tail that never reached the disk reads as zeros). Each read checks that the tensor lies
within ``size``. Not detected: bytes changed in the middle of the data by something other than graphbisect
(there is no checksum per tensor; a run is read far more often than it is written).

Appending (:class:`PackWriter` on a published folder) writes after the end of the data and publishes a
new index, so maps of the earlier tensors stay valid; a replaced tensor's old bytes stay until the folder
is deleted.

This module imports only the standard library, numpy and graphbisect modules that do, so backend workers
under another interpreter use it to write their outputs.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> writer = PackWriter(folder)
    >>> entry = writer.add(np.arange(3, dtype=np.float32))
    >>> index = writer.publish([{"name": "x", **entry}]); writer.close()
    >>> pack = PackReader.open(folder)
    >>> pack.value("x").tolist(), sorted(p.name for p in folder.iterdir())
    ([0.0, 1.0, 2.0], ['manifest.json', 'values.bin'])
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import mmap
import os
import tempfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from graphbisect.errors import GraphBisectError
from graphbisect.storage.atomic import atomic_path
from graphbisect.storage.lockfile import try_lock
from graphbisect.storage.values import read_value, write_value

__all__ = ["DATA_NAME", "INDEX_NAME", "INDEX_VERSION", "PackReader", "PackWriter", "PackedData", "StaleDataError",
           "TornRunError", "read_index", "remove_abandoned"]

logger = logging.getLogger(__name__)

DATA_NAME = "values.bin"
#: The index keeps the name of the per-tensor layout's manifest; its ``version`` tells the layouts apart.
INDEX_NAME = "manifest.json"
INDEX_VERSION = 2
#: Version 1: one ``.npy`` file per tensor (graphbisect before the packed layout); still read.
LEGACY_VERSION = 1

_MAGIC = b"\x93GBPACK\x02"
#: A new run's data file until its first publish: ``.values.bin.<random>.tmp``.
_TMP_PREFIX, _TMP_SUFFIX = f".{DATA_NAME}.", ".tmp"
HEADER_BYTES = 64
#: Tensors up to this size are packed at :data:`_SMALL_ALIGN` and read into memory; larger ones are
#: page-aligned and memory-mapped.
SMALL_BYTES = 64 << 10
_SMALL_ALIGN = 64
_ZEROS = bytes(_SMALL_ALIGN)
_PAGE_ALIGN = 4096
#: Bytes at the end of the data whose CRC-32 the index holds.
_TAIL_BYTES = 4096
#: Values read with ``mapped=False`` stay mapped above this size (their file may be deleted; maps survive).
COPY_MAX_BYTES = 64 << 20

_FIX = "delete {folder} and run again (graphbisect recomputes it)"


class TornRunError(GraphBisectError):
    """A folder's data and index do not belong together: the run that wrote it did not finish, or the files
    were damaged or replaced since."""


class StaleDataError(TornRunError):
    """The data file was replaced by a later run into the same folder after this index was read."""


# ------------------------------------------------------------------------------------------------- writing
class PackWriter:
    """Appends values to a folder's data file; :meth:`publish` makes them readable by writing the index.

    ``PackWriter(folder)`` starts a new run: it removes the folder's index (an earlier run's data stays
    readable through open maps) and writes a temporary file until the first :meth:`publish` renames it to
    ``values.bin``; :meth:`append` continues a published run. ``durable`` fsyncs the data
    and the index on publish (worth it for stores a later session resumes from, not for scratch outputs).
    """

    def __init__(self, folder: str | Path, *, durable: bool = True) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.durable = durable
        self.token = os.urandom(16).hex()
        (self.folder / INDEX_NAME).unlink(missing_ok=True)  # the folder holds this run or, if it dies, nothing
        remove_abandoned(self.folder)
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=self.folder)
        # Locked before the header is written (unbuffered), and held until the file is closed: a temporary file
        # that starts with the header and whose lock is free is a dead writer's (remove_abandoned). Where the
        # file system refuses locks, a later run cannot take one either, so it never removes this file.
        with contextlib.suppress(OSError):
            try_lock(fd, wait=True)
        os.write(fd, (_MAGIC + bytes.fromhex(self.token)).ljust(HEADER_BYTES, b"\0"))
        self._handle: IO[bytes] = os.fdopen(fd, "wb")
        self._pending: Path | None = Path(tmp)  # renamed to DATA_NAME on the first publish
        self.size = HEADER_BYTES
        self.data = PackedData(self._pending, self.token, writer=self)

    @classmethod
    def append(cls, folder: str | Path, index: Mapping[str, Any], *, durable: bool = True) -> PackWriter:
        """A writer that adds to the published data of ``folder``, whose (checked) index is ``index``."""
        writer = cls.__new__(cls)
        writer.folder = Path(folder)
        writer.durable = durable
        writer.token = str(index["token"])
        path = writer.folder / DATA_NAME
        writer._handle = open(path, "a+b")  # noqa: SIM115 - held until close()
        writer._pending = None
        writer.size = writer._handle.seek(0, os.SEEK_END)  # after any unpublished tail of a torn append
        writer.data = PackedData(path, writer.token, writer=writer)
        return writer

    @classmethod
    def scratch(cls, folder: str | Path) -> PackWriter:
        """A writer that rewrites ``folder``'s data file in place, for a handoff to another process whose
        index travels with the request instead of as a file (never :meth:`publish`): a backend
        run's inputs. No temporary file, rename or index file and no truncation (the index bounds what is
        read; a new token in the header makes a reader of the previous content fail, not misread): creating
        and renaming files cost ~1 ms each here, more than the values of a small candidate.

        Only for a file one writer rewrites and one reader reads after each write, never while it writes.
        """
        writer = cls.__new__(cls)
        writer.folder = Path(folder)
        writer.folder.mkdir(parents=True, exist_ok=True)
        writer.durable = False
        writer.token = os.urandom(16).hex()
        path = writer.folder / DATA_NAME
        writer._handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+b")
        writer._pending = None
        writer._handle.write((_MAGIC + bytes.fromhex(writer.token)).ljust(HEADER_BYTES, b"\0"))
        writer.size = HEADER_BYTES
        writer.data = PackedData(path, writer.token, writer=writer)
        return writer

    @property
    def path(self) -> Path:
        """The data file being written (a temporary name until the first :meth:`publish`)."""
        return self._pending or self.folder / DATA_NAME

    def add(self, value: Any) -> dict[str, Any]:
        """Append ``value`` (tensor, sequence or ``None``: :mod:`graphbisect.storage.values`); return its entry."""
        return write_value(value, "", self._write)

    def _write(self, _name: str, raw: np.ndarray) -> dict[str, Any]:
        if raw.dtype.kind == "V" or raw.dtype.hasobject:  # a dtype string could not describe it
            raise GraphBisectError(f"a {raw.dtype} array is no ONNX tensor",
                                   hint="give numeric, boolean or string tensors")
        nbytes = raw.nbytes
        offset = _align(self.size, _PAGE_ALIGN if nbytes > SMALL_BYTES else _SMALL_ALIGN)
        if offset > self.size:
            self._handle.write(bytes(offset - self.size))
        if nbytes:  # straight from the array's memory (or its memory map): no copy of a large tensor
            self._handle.write(np.ascontiguousarray(raw).reshape(-1).view(np.uint8).data)
        self.size = offset + nbytes
        return {"offset": offset}

    def add_small(self, arrays: Sequence[np.ndarray]) -> list[int]:
        """Append tensors of at most :data:`SMALL_BYTES` each that are stored as themselves (a numpy type
        ONNX has natively: :func:`graphbisect.storage.values.is_native`; checked by the caller), in one write;
        return their offsets. The bytes are what :meth:`add` writes for each, one after another; a handoff
        of thousands of new cut tensors costs a few µs less per tensor than :meth:`add` each.
        """
        parts: list[bytes] = []
        offsets: list[int] = []
        size = self.size
        for array in arrays:
            offset = _align(size, _SMALL_ALIGN)
            if offset > size:
                parts.append(_ZEROS[:offset - size])
            parts.append(array.tobytes())  # C order, as add() writes it
            offsets.append(offset)
            size = offset + array.nbytes
        self._handle.write(b"".join(parts))
        self.size = size
        return offsets

    def flush(self) -> None:
        """Hand buffered bytes to the operating system, so this process can read them back."""
        self._handle.flush()

    def publish(self, tensors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Write the index of ``tensors`` (entries with their ``name``), last; return the index document."""
        self._handle.flush()
        if self.durable:
            os.fsync(self._handle.fileno())
        document = self._document(tensors)
        index_path = self.folder / INDEX_NAME
        if self._pending is not None:
            index_path.unlink(missing_ok=True)  # an earlier run's index never describes this data
            os.chmod(self._pending, 0o644)
            os.replace(self._pending, self.folder / DATA_NAME)
            self._pending = None
            self.data.path = self.folder / DATA_NAME
        text = json.dumps(document, separators=(",", ":")).encode("utf-8")  # 52,000 entries: parsed per open
        with atomic_path(index_path, durable=self.durable) as tmp:
            tmp.write_bytes(text)
        return document

    def _document(self, tensors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        tail = os.pread(self._handle.fileno(), min(_TAIL_BYTES, self.size), max(0, self.size - _TAIL_BYTES))
        return {"version": INDEX_VERSION, "data": DATA_NAME, "size": self.size, "token": self.token,
                "tail_crc32": zlib.crc32(tail), "tensors": list(tensors)}

    def close(self) -> None:
        """Close the data file; an unpublished one is removed (it has no index, so nothing could read it)."""
        self._handle.close()
        if self._pending is not None:
            self._pending.unlink(missing_ok=True)
            self._pending = None

    def __enter__(self) -> PackWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def remove_abandoned(folder: Path) -> list[Path]:
    """Remove the temporary data files in ``folder`` whose writers died before their first publish (a
    killed run's; a writer that ends normally removes its own); return them. Called when a new run starts.

    Only files provably such are removed: named as :class:`PackWriter` names them, starting with its header
    and with their lock free. A writer locks its file (:func:`graphbisect.storage.lockfile.try_lock`) before it writes
    the header, and the kernel releases the lock only when the writer's process ends, however it ends; so a
    live writer's file, in this process or another run's writing the same folder at the same time, is left
    alone, and so is a file that has no header yet (one whose writer has not locked it yet, or died in that
    instant: it is empty). Where there is no ``flock`` (Windows), nothing is removed.
    """
    removed: list[Path] = []
    try:
        names = [entry.name for entry in os.scandir(folder)
                 if entry.name.startswith(_TMP_PREFIX) and entry.name.endswith(_TMP_SUFFIX)]
    except OSError:
        return removed
    for name in names:
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # published or removed by its writer meanwhile
            continue
        try:
            if not try_lock(fd) or os.pread(fd, len(_MAGIC), 0) != _MAGIC:
                continue
            if os.stat(path).st_ino != os.fstat(fd).st_ino:  # the name is another file's by now
                continue
            path.unlink()
            removed.append(path)
        except OSError as exc:
            logger.debug("left %s: %s", path, exc)
        finally:
            os.close(fd)
    if removed:
        logger.info("removed %d data file(s) of runs killed before they finished in %s: %s", len(removed), folder,
                    ", ".join(p.name for p in removed))
    return removed


@functools.lru_cache(maxsize=256)
def _dtype(name: str) -> np.dtype:
    """``np.dtype(name)``, remembered (parsing the string is most of a small tensor's read)."""
    return np.dtype(name)


def _align(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


# ------------------------------------------------------------------------------------------------- reading
class PackedData:
    """The data file of one run, memory-mapped once on first use; reads tensors by their entries.

    ``token`` is the run's: a data file that does not start with it (replaced by a later run) is refused
    with :class:`StaleDataError`. ``writer``: the :class:`PackWriter` still appending to it (its buffer is
    flushed before a read, and the map grows with the file).
    """

    def __init__(self, path: Path, token: str, *, size: int | None = None, writer: PackWriter | None = None) -> None:
        self.path = path
        self.token = token
        self.size = size
        self._writer = writer
        self._map: np.memmap | None = None
        #: the same map as a plain array: slicing a ``np.memmap`` runs its Python ``__array_finalize__``
        #: (~5 µs, most of a small read), so small tensors are copied out of this view instead
        self._plain: np.ndarray | None = None

    def _base(self, end: int) -> np.ndarray:
        if self._map is not None and end <= self._map.size:
            return self._map
        if self._writer is not None:
            self._writer.flush()
        try:
            base = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise TornRunError(f"cannot read the data file {self.path}: {type(exc).__name__}: {exc}",
                               hint=_FIX.format(folder=self.path.parent)) from exc
        if bytes(base[len(_MAGIC):len(_MAGIC) + 16]) != bytes.fromhex(self.token):
            raise StaleDataError(
                f"{self.path} is no longer the data of the run whose index was read: a later run replaced it",
                hint="give each run its own folder, or read its values before running again into the folder")
        if end > base.size:
            raise TornRunError(f"{self.path} ends at byte {base.size} but a tensor in its index ends at {end}",
                               hint=_FIX.format(folder=self.path.parent))
        self._map, self._plain = base, base.view(np.ndarray)
        return base

    def release(self) -> None:
        """Let go of the pages of the map this process has read (``MADV_DONTNEED``): views stay valid and read
        the file again when touched. For a reader that passes over more data than it should keep resident
        (a comparison of every tensor of a large model, a window at a time); a no-op where not supported."""
        handle = getattr(self._map, "_mmap", None)
        advise = getattr(handle, "madvise", None)
        if advise is not None and hasattr(mmap, "MADV_DONTNEED"):
            with contextlib.suppress(OSError, ValueError):
                advise(mmap.MADV_DONTNEED)

    def array(self, entry: Mapping[str, Any], *, copy_max: int = SMALL_BYTES) -> np.ndarray:
        """The raw tensor ``entry`` (``offset``, ``dtype``, ``shape``) describes, read-only: copied into
        memory up to ``copy_max`` bytes, a view of the map above."""
        return self.tensor(int(entry["offset"]), str(entry["dtype"]), entry["shape"], copy_max=copy_max)

    def tensor(self, offset: int, dtype_name: str, dims: Sequence[int], *, copy_max: int = SMALL_BYTES
               ) -> np.ndarray:
        """:meth:`array` of an entry given as its three fields (a reader of many entries needs no dict each)."""
        dtype = _dtype(dtype_name)
        shape = tuple(map(int, dims))
        nbytes = dtype.itemsize * math.prod(shape)
        end = offset + nbytes
        if offset < HEADER_BYTES or (self.size is not None and end > self.size):
            raise TornRunError(f"the index of {self.path} places a tensor at bytes {offset}..{end}, outside the "
                               f"data ({self.size} bytes)", hint=_FIX.format(folder=self.path.parent))
        if nbytes == 0:
            empty = np.empty(shape, dtype)
            empty.setflags(write=False)
            return empty
        base = self._base(end)
        if nbytes > copy_max:
            return base[offset:end].view(dtype).reshape(shape)  # a np.memmap: mapped, not loaded
        assert self._plain is not None
        array = self._plain[offset:end].view(dtype).reshape(shape).copy()
        array.setflags(write=False)
        return array

    def views(self, entries: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
        """The raw tensors of many plain entries (``offset``, ``dtype``, ``shape``) as read-only views of
        the map, checked at once: what :meth:`array` does per entry costs ~4 µs, most of it per-call checks
        and a copy; a backend worker fed thousands of cut tensors from a store reads them here at ~1 µs each.
        The views keep the map (and the file's pages) alive: copy what must outlive it."""
        if not entries:
            return []
        where = []  # (offset, end, dtype, shape) of each, in one pass
        for entry in entries:
            dtype, shape, offset = _dtype(entry["dtype"]), tuple(entry["shape"]), entry["offset"]
            where.append((offset, offset + dtype.itemsize * math.prod(shape), dtype, shape))
        low, high = min(w[0] for w in where), max(w[1] for w in where)
        if low < HEADER_BYTES or (self.size is not None and high > self.size):
            raise TornRunError(f"the index of {self.path} places a tensor at bytes {low}..{high}, outside the "
                               f"data ({self.size} bytes)", hint=_FIX.format(folder=self.path.parent))
        self._base(high)
        plain = self._plain
        assert plain is not None
        return [plain[offset:end].view(dtype).reshape(shape) for offset, end, dtype, shape in where]

    def value(self, entry: Mapping[str, Any], *, mapped: bool = True) -> Any:
        """The value ``entry`` describes (:func:`graphbisect.storage.values.read_value`). ``mapped=False`` copies
        values up to 64 MiB into memory (the file may then go away)."""
        copy_max = SMALL_BYTES if mapped else COPY_MAX_BYTES
        return read_value(entry, lambda item: self.array(item, copy_max=copy_max))


class PackReader(Mapping[str, Any]):
    """A published folder: its index (checked against the data when opened) and its values by name.

    Reading a value maps the data file (once); a mapping of names to values, lazily read.
    """

    def __init__(self, folder: Path, index: Mapping[str, Any]) -> None:
        self.folder = Path(folder)
        self.index = index
        self.entries: dict[str, Mapping[str, Any]] = {str(e["name"]): e for e in index["tensors"]}
        self.data = PackedData(self.folder / str(index.get("data", DATA_NAME)), str(index["token"]),
                               size=int(index["size"]))

    @classmethod
    def open(cls, folder: str | Path) -> PackReader:
        """Open a published folder (version 2 index), or raise :class:`TornRunError` saying what is wrong."""
        folder = Path(folder)
        index = read_index(folder)
        if index is None:
            raise TornRunError(f"{folder} holds no {INDEX_NAME}", hint=_FIX.format(folder=folder))
        if index["version"] != INDEX_VERSION:
            raise GraphBisectError(f"{folder / INDEX_NAME} is version {index['version']}, not the packed layout "
                                   f"(version {INDEX_VERSION})", hint="read it with graphbisect.data.ActivationStore")
        return cls(folder, index)

    def value(self, name: str, *, mapped: bool = True) -> Any:
        """The value stored under ``name`` (see :meth:`PackedData.value`)."""
        return self.data.value(self.entries[name], mapped=mapped)

    def __getitem__(self, name: str) -> Any:
        return self.value(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries


def read_index(folder: str | Path) -> dict[str, Any] | None:
    """The index of ``folder``, checked against its data file; ``None`` when the folder has neither.

    A version 1 manifest (one ``.npy`` per tensor) is returned as it is, for the caller's legacy reader.
    Raises :class:`TornRunError` naming the file when the data has no index (the run did not finish), the
    index has no data, or they do not match; :class:`GraphBisectError` for an unreadable or newer index.
    """
    folder = Path(folder)
    index_path = folder / INDEX_NAME
    data_path = folder / DATA_NAME
    fix = _FIX.format(folder=folder)
    if not index_path.is_file():
        if data_path.exists():
            raise TornRunError(f"{data_path} has no index ({INDEX_NAME}): the run that wrote it did not finish "
                               "(killed mid-write?)", hint=fix)
        return None
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        version = int(index["version"])
        if version == LEGACY_VERSION:
            return dict(index)
        size, token, crc = int(index["size"]), str(index["token"]), int(index["tail_crc32"])
        if not isinstance(index["tensors"], list):
            raise TypeError("'tensors' is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GraphBisectError(f"cannot read the store manifest {index_path}: {type(exc).__name__}: {exc}",
                               hint=f"the folder is damaged; {fix}") from exc
    if version > INDEX_VERSION:
        raise GraphBisectError(f"{index_path} is version {version}, written by a newer graphbisect",
                               hint="read it with that version, or delete the folder and run again")
    data_name = str(index.get("data", DATA_NAME))
    if Path(data_name).name != data_name:
        raise GraphBisectError(f"{index_path} names a data file outside its folder ({data_name!r})", hint=fix)
    data_path = folder / data_name
    try:
        with open(data_path, "rb") as handle:
            actual = handle.seek(0, os.SEEK_END)
            handle.seek(0)
            header = handle.read(len(_MAGIC) + 16)
            handle.seek(max(0, size - _TAIL_BYTES))
            tail = handle.read(min(_TAIL_BYTES, size))
    except OSError as exc:
        raise TornRunError(f"the index {index_path} has no data: cannot read {data_path}: {exc}", hint=fix) from exc
    if actual < size:
        raise TornRunError(f"{data_path} is truncated: {actual} bytes, its index says {size}", hint=fix)
    if header[:len(_MAGIC)] != _MAGIC:
        raise TornRunError(f"{data_path} is not a graphbisect data file (bad header)", hint=fix)
    if header[len(_MAGIC):] != bytes.fromhex(token):
        raise TornRunError(f"{data_path} and its index {index_path} come from different runs "
                           "(a run into this folder did not finish)", hint=fix)
    if zlib.crc32(tail) != crc:
        raise TornRunError(f"the end of {data_path} does not match its index (checksum): the data did not all "
                           "reach the disk", hint=fix)
    return dict(index)
