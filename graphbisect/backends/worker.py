"""The worker side of backend isolation: ``python -m graphbisect.backends.worker``.

One worker process serves one backend spec for many invocations (the backend library is imported once).
:class:`graphbisect.backends.process.BackendProcess` starts it, possibly under another Python interpreter,
so this module needs only the standard library and numpy.

Protocol (one JSON object per line, on two dedicated pipes whose descriptors are passed with
``--requests`` and ``--replies``; fd 1 and fd 2 belong to the backend and go to the log file):

* ``{"op": "init", "runtime": "module:Class", "options": {...}, "library": "onnxruntime",
  "distributions": [...]}`` → ``{"ok": true, "python": ..., "numpy": ..., "library_version": ..., ...}``:
  the versions are measured here, in the interpreter that runs the backend (``python=`` may name another).
  A later ``init`` replaces the runtime (other options, same process: a ``reconfigurable`` backend);
* ``{"op": "passes"}`` → ``{"ok": true, "passes": [...] | null, "cost": {...}}``: every optimization pass the
  runtime could run under its options (``registered_passes()``; null when the runtime cannot list them), for a
  target that crashes before it can report which passes fired;
* ``{"op": "validate"}`` → ``{"ok": true, "cost": {...}}``: asks the runtime to check its options before any
  run (runtimes may define ``validate()``, e.g. ONNX Runtime checks optimizer names). Both replies' ``cost``
  counts the builds they made (ONNX Runtime lists its optimizer names, once per version, by building
  sessions), as a ``run``'s does.
* ``{"op": "run", "model": path, "inputs": {...} | npz, "outputs": [names] | null, "output_dir": dir,
  "durable": bool}`` →
  events ``{"event": "start"}`` (request received), ``{"event": "loaded"}`` (session built), every
  :data:`PROGRESS_SECONDS` while it builds or runs ``{"event": "progress", "seconds": s, "phase": "load" | "run"}``
  with ``"done"``, ``"total"`` and ``"node"`` where the runtime counts its nodes (``progress()``: onnx.reference),
  and ``"expected"`` where it foresees the run's length (``expected()``: onnx.reference's Python loops),
  then ``{"event": "done", "status": "ok" | "crash", ...}``; a ``done`` reply's ``info`` holds ``load_seconds``,
  ``run_seconds`` and ``session_reused`` (true when the run used a session built before this request, by an
  earlier run of the same model file or a ``load``, false when it built one); a ``done`` reply (and a ``load``'s)
  holds ``"cost": {"compiles": n, "compile_cache_hits": m}``, the builds the request made
  (:mod:`graphbisect.backends.cost`), and ``"peak_memory"``: an upper bound of the resident bytes the worker and
  a child of it (a compiler it ran) held at once so far, or null where the platform does not say
  (:func:`peak_memory`). With
  ``"compare": {"store": dir, "tolerance": {...}, "keep": [names]}`` the outputs the oracle's activation store
  at ``dir`` holds are compared with it here (:func:`compare_to_store`) and come back as ``"stats"``
  (``{"fields", "columns"}``: :func:`~graphbisect.compare.metrics.stats_columns`) instead of files; only
  ``keep`` and the tensors the store lacks are written. ``inputs`` is what :class:`InputsWriter` sends (the
  values the worker does not hold yet, in one data file, and the ids of those it holds) or the path of an
  ``.npz``. ``durable`` (default false) fsyncs the outputs before the reply (:func:`write_outputs`).
* ``{"op": "load", "model": path, "outputs": [names] | null}`` → ``{"ok": true, "status": "ok", "info": {...}}``
  (the runtime's info after the build: what it compiled, where it describes that at build), or the ``crash``
  fields of a ``done`` reply: builds the session a ``run`` of the same model and outputs then uses without
  building it again (nothing runs: the host builds a session ahead while it works out the run).
* ``{"op": "exit"}`` → ``{"ok": true}``, then the worker exits.

A request that fails because of *our* or the user's mistake (a :class:`~graphbisect.errors.GraphBisectError`
raised by the runtime: bad option, missing input, tensor that is not an output) is answered with
``{"ok": false, "error": {...}}`` and re-raised by the host; a backend exception is a crash *result*.

Outputs are written into ``output_dir`` as one packed run (:mod:`graphbisect.storage.packfile`): ``values.bin``
(every tensor's raw bytes; tensor names never become paths) and its index ``manifest.json``, written last.
A new run replaces ``values.bin`` by rename, so memory maps of an earlier run stay valid. The ``done``
reply carries the index: ``"outputs"`` its tensor entries, ``"pack"`` the rest (data file, size, token)::

    {"outputs": [{"name": "conv1/out", "offset": 64, "dtype": "<f4", "shape": [1, 8]}],
     "pack": {"version": 2, "data": "values.bin", "size": 96, "token": "9f0c...", "tail_crc32": 1234}}
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import faulthandler
import hashlib
import importlib
import json
import logging
import os
import platform
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, overload

import numpy as np

from graphbisect.data.store import StoredFeeds
from graphbisect.errors import GraphBisectError, InputError, SpecError
from graphbisect.storage.gcpause import gc_paused
from graphbisect.storage.packfile import (
    COPY_MAX_BYTES,
    DATA_NAME,
    INDEX_NAME,
    INDEX_VERSION,
    SMALL_BYTES,
    PackedData,
    PackWriter,
    read_index,
)
from graphbisect.storage.values import (
    decode_tensor,
    encode_tensor,
    is_native,
    load_values_npz,
    save_values_npz,
)

__all__ = ["MANIFEST", "PROTOCOL_VERSION", "InputsReader", "InputsWriter", "close_names", "compare_to_store",
           "library_version", "load_npz", "main", "option_flag", "save_npz", "unknown_names_hint", "write_outputs"]

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
MANIFEST = INDEX_NAME
#: How often a run that is still going says so (a long onnx.reference run said nothing for 600 s); the environment
#: variable ``GRAPHBISECT_PROGRESS_SECONDS`` sets another period.
PROGRESS_SECONDS = 10.0


# --------------------------------------------------------------------------------------------- arrays
def save_npz(path: str | Path, arrays: Mapping[str, Any]) -> Path:
    """Write ``arrays`` (any ONNX values: see :mod:`graphbisect.storage.values`) to an ``.npz`` atomically, for any
    tensor names (``np.savez`` rejects ``file``).

    Example:
        >>> import tempfile, pathlib
        >>> p = save_npz(pathlib.Path(tempfile.mkdtemp()) / "x.npz", {"a/b": np.arange(3)})
        >>> load_npz(p)["a/b"].tolist()
        [0, 1, 2]
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        save_values_npz(tmp, arrays)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def load_npz(path: str | Path) -> dict[str, Any]:
    """Read every value of an ``.npz`` (no pickles) into a dict: arrays, sequences (lists), empty optionals."""
    return load_values_npz(path)


def write_outputs(outputs: Mapping[str, Any], names: Sequence[str], output_dir: Path, *,
                  durable: bool = False) -> dict[str, Any]:
    """Write ``names`` from ``outputs`` into ``output_dir`` as one packed run (:mod:`graphbisect.storage.packfile`):
    ``values.bin`` plus its index ``manifest.json``, written last. Return the index document.

    ``durable`` fsyncs the data and the index before returning: for a run a later session reads back (the
    oracle's capture that ``reduce --resume`` adopts), where a power failure could otherwise leave pages
    in the middle of the data unwritten under an index that the tail checksum does not catch. Scratch
    outputs, read at once or deleted with their session, skip it.

    Types numpy lacks are stored raw with their ONNX element type (:mod:`graphbisect.storage.values`). A value that
    cannot be stored is a ``TypeError`` naming the output (a crash of the run, not of graphbisect).
    """
    entries: list[dict[str, Any]] = []
    small: list[np.ndarray] = []  # small tensors stored as themselves: written at once, at the end (add_small),
    rows: list[dict[str, Any]] = []  # the entries whose offsets they fill in
    with PackWriter(output_dir, durable=durable) as writer:
        for name in names:
            value = outputs[name]
            if isinstance(value, np.ndarray) and value.nbytes <= SMALL_BYTES and is_native(value.dtype):
                small.append(value)
                rows.append({"name": name, "offset": 0, "dtype": value.dtype.str, "shape": list(value.shape)})
                entries.append(rows[-1])
                continue
            try:
                entry = writer.add(value)
            except GraphBisectError as exc:
                raise TypeError(f"output {name!r}: {exc.message}") from exc
            entries.append({"name": name, **entry})
        for row, offset in zip(rows, writer.add_small(small), strict=True):
            row["offset"] = offset
        return writer.publish(entries)


#: The inputs data file is started afresh once it is this large (the worker drops the values it holds then).
INPUTS_RESTART_BYTES = 256 << 20


class InputsWriter:
    """The host's half of handing a run's inputs to one worker process (the worker's is :class:`InputsReader`).

    Why not an ``.npz``: a candidate of a large model is fed thousands of cut tensors, and a zip member per
    tensor (a local header, an ``.npy`` header to format and parse, a central directory entry) cost about
    70 µs to write and 150 µs to read each: 0.2 s for 1,000 feeds, per candidate. Here the values go to one
    data file (:meth:`PackWriter.scratch`: appended to, never renamed) in a folder of this writer's own
    under ``parent`` (made on first use; :meth:`discard` removes it), whose index travels with the request;
    and a value is written **once**: a feed that is the very object sent before under the same name,
    read-only and owning its memory (nothing can change it: the activation store's reads and the subgraph
    space's cached values are such), is sent as a reference to what the worker already holds.
    Candidates of one reduction share most of their cut tensors, so most feeds cost a name and a number.

    The worker holds those values (up to 64 KiB each) until the data file passes
    :data:`INPUTS_RESTART_BYTES`, when both sides start afresh; a new worker process (``pid``) starts
    afresh too. Not thread-safe: one writer per worker, as ``BackendProcess`` serializes its calls.
    """

    def __init__(self, parent: Path, *, restart_bytes: int = INPUTS_RESTART_BYTES) -> None:
        self.parent = Path(parent).absolute()
        self.folder: Path | None = None
        self.restart_bytes = restart_bytes
        self._writer: PackWriter | None = None
        self._pid: int | None = None
        self._held: dict[str, tuple[Any, int | str]] = {}  # name -> (the value object, its id) the worker holds
        self._next = 0

    def write(self, inputs: Mapping[str, Any], pid: int) -> dict[str, Any]:
        """Write what ``inputs`` adds for the worker process ``pid``; return the request's ``inputs`` entry:
        ``{"folder", "token", "size", "tensors": {...}, "new": [[id, name, entry, hold], ...], "feeds": [id,
        ...]}``: the new plain tensors as columns (``ids``, ``names``, ``offsets``, ``dtypes``, ``shapes``,
        ``hold``: thousands of them are a few JSON lists, not thousands of objects to encode and parse), the
        other new values (sequences, optionals, types numpy lacks) as entries, then the ids of every input in
        the order of ``inputs`` (a held id stands for its name and value). Feeds that name an activation
        store's tensors (:class:`~graphbisect.data.store.StoredFeeds` of a published store) go as their names
        in ``feeds`` and the store's reference as ``"store"`` (:meth:`ActivationStore.reference`): the worker
        reads them itself (:class:`InputsReader`). A value that cannot be stored is an :class:`InputError`
        naming it."""
        writer = self._writer
        if writer is None or pid != self._pid or writer.size > self.restart_bytes:
            writer = self._restart(pid)
        columns: dict[str, list[Any]] = {key: [] for key in _COLUMNS}
        ids, names, offsets, dtypes, shapes, holds = (columns[key] for key in _COLUMNS)
        new: list[list[Any]] = []
        feeds: list[int | str] = []
        small: list[np.ndarray] = []  # small tensors stored as themselves: written at once, at the end,
        rows: list[int] = []  # into these rows of the columns
        pairs, store = _pairs(inputs)
        for name, value in pairs:
            held = (value, name) if value is _STORED else self._held.get(name)  # a stored tensor: by its name
            if held is not None and held[0] is value:
                feeds.append(held[1])
                continue
            ident, self._next = self._next, self._next + 1
            feeds.append(ident)
            plain = isinstance(value, np.ndarray) and value.nbytes <= SMALL_BYTES and is_native(value.dtype)
            hold = _unchangeable(value) and value.nbytes <= SMALL_BYTES
            if hold:
                self._held[name] = (value, ident)
            else:
                self._held.pop(name, None)
            if plain:  # its offset is filled in below
                small.append(value)
                rows.append(len(ids))
                offset, dtype, shape = 0, value.dtype.str, list(value.shape)
            else:
                try:
                    entry = writer.add(value)
                except GraphBisectError as exc:
                    self.close()  # what this call recorded as held never reaches the worker: start afresh
                    raise InputError(f"input {name!r} cannot be passed to the backend worker: {exc.message}",
                                     hint=exc.hint) from exc
                if entry.keys() != _PLAIN:
                    new.append([ident, name, entry, hold])
                    continue
                offset, dtype, shape = entry["offset"], entry["dtype"], entry["shape"]
            ids.append(ident)
            names.append(name)
            offsets.append(offset)
            dtypes.append(dtype)
            shapes.append(shape)
            holds.append(hold)
        for row, offset in zip(rows, writer.add_small(small), strict=True):
            offsets[row] = offset
        writer.flush()
        return {"folder": str(writer.folder), "token": writer.token, "size": writer.size, "tensors": columns,
                "new": new, "feeds": feeds, **({"store": store} if store is not None else {})}

    def _restart(self, pid: int) -> PackWriter:
        self.close()
        if self.folder is None:  # its own: two writers under one parent never rewrite each other's file
            self.parent.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix="inputs-", dir=self.parent))
        data = self.folder / DATA_NAME
        if data.exists() and data.stat().st_size > self.restart_bytes:
            data.unlink()  # rewritten in place, never truncated: a file one large run grew would stay that large
        writer = self._writer = PackWriter.scratch(self.folder)
        self._pid = pid
        self._held.clear()
        return writer

    def close(self) -> None:
        """Close the data file (a later :meth:`write` starts afresh)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def discard(self) -> None:
        """Close the data file and remove this writer's folder."""
        self.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def _pairs(inputs: Mapping[str, Any]) -> tuple[Iterable[tuple[str, Any]], dict[str, Any] | None]:
    """``inputs``' (name, value) pairs, ``_STORED`` for a value the worker reads from an activation store
    itself, and that store's reference (None: every value is sent)."""
    store = inputs.store.reference() if isinstance(inputs, StoredFeeds) else None
    if store is None:
        return inputs.items(), None
    assert isinstance(inputs, StoredFeeds)
    held = inputs.held
    return ((name, held.get(name, _STORED)) for name in inputs.order), store


_COLUMNS = ("ids", "names", "offsets", "dtypes", "shapes", "hold")
#: A feed of :class:`StoredFeeds` that the worker reads from the store (not in the writer's hands).
_STORED = object()
#: The keys of a plain tensor's entry (numpy holds its type; :mod:`graphbisect.storage.values`).
_PLAIN = {"offset", "dtype", "shape"}


def _unchangeable(value: Any) -> bool:
    """Whether no one can change ``value`` without making it writable again: a read-only array that owns
    its memory (a read-only view's base may still be written through)."""
    return isinstance(value, np.ndarray) and not value.flags.writeable and value.flags.owndata


class InputsReader:
    """The worker's half of the inputs handoff (see :class:`InputsWriter`): the values of one request, in
    memory and writable as ``np.load`` gives them (a runtime may write into its inputs, never into the
    values held for later requests)."""

    def __init__(self) -> None:
        self._data: PackedData | None = None
        self._held: dict[int, tuple[str, Any]] = {}  # id -> (name, value) of the values held for later requests
        self._store: _StoreView | None = None  # the activation store the requests name tensors of

    def read(self, inputs: str | Mapping[str, Any]) -> dict[str, Any]:
        """The inputs of a request: an :class:`InputsWriter` entry, or the path of an ``.npz``."""
        if isinstance(inputs, str):
            return load_npz(inputs)
        token = str(inputs["token"])
        if self._data is None or self._data.token != token:  # the host started afresh
            self._data = PackedData(Path(str(inputs["folder"])) / DATA_NAME, token)
            self._held.clear()
        data = self._data
        data.size = int(inputs["size"])
        fresh: dict[int, tuple[str, Any]] = {}
        tensors = inputs.get("tensors") or {key: () for key in _COLUMNS}
        for ident, name, offset, dtype, shape, hold in zip(*(tensors[key] for key in _COLUMNS), strict=True):
            value = data.tensor(offset, dtype, shape, copy_max=COPY_MAX_BYTES)
            (self._held if hold else fresh)[ident] = (name, value)
        for ident, name, entry, hold in inputs["new"]:
            (self._held if hold else fresh)[ident] = (str(name), data.value(entry, mapped=False))
        result: dict[str, Any] = {}
        stored: list[str] = []
        for ident in inputs["feeds"]:
            if isinstance(ident, str):  # a tensor of the request's activation store, by name
                stored.append(ident)
                result[ident] = None  # its place in the order
                continue
            if ident in fresh:
                name, value = fresh.pop(ident)
                result[name] = _writable(value)
                continue
            try:
                name, value = self._held[ident]
            except KeyError as exc:
                raise InputError(f"a run request refers to input value {ident}, which this worker does not hold",
                                 hint="report this as a graphbisect bug (the host and worker disagree)") from exc
            result[name] = np.array(value)  # a copy: the held value stays as sent
        if stored:
            if "store" not in inputs:
                raise InputError("a run request names stored inputs but no activation store",
                                 hint="report this as a graphbisect bug (the host and worker disagree)")
            view = self._store_view(inputs["store"])
            result.update(zip(stored, view.read(stored), strict=True))
        return result

    def _store_view(self, reference: Mapping[str, Any]) -> _StoreView:
        if self._store is None or self._store.reference != reference:
            self._store = _StoreView(reference)
        return self._store


class _StoreView:
    """An activation store as a worker reads feeds from it (:class:`InputsReader`): opened once per store, its
    index checked exactly as the host checks it (:func:`~graphbisect.storage.packfile.read_index`: the data file's
    header, size and tail checksum) and equal to what the host read (``reference``:
    :meth:`ActivationStore.reference`), so a torn, replaced or changed store is refused, never misread."""

    def __init__(self, reference: Mapping[str, Any]) -> None:
        self.reference = dict(reference)
        folder = Path(str(reference["folder"]))
        index = read_index(folder)  # raises TornRunError for a torn store
        if index is None:
            raise InputError(f"a run request names tensors of the activation store {folder}, which holds no "
                             f"{INDEX_NAME}", hint="the store was deleted while the search ran; run again")
        found = {key: index.get(key) for key in ("token", "size", "tail_crc32")}
        expected = {key: reference[key] for key in found}
        if index.get("version") != INDEX_VERSION or found != expected:
            raise InputError(f"the activation store {folder} is not the one the host read ({found} in its index, "
                             f"{expected} sent): it was replaced or added to since",
                             hint="a store must not change while a search reads it; run again")
        self.entries: dict[str, Mapping[str, Any]] = {str(entry["name"]): entry for entry in index["tensors"]}
        self.data = PackedData(folder / str(index.get("data", DATA_NAME)), str(index["token"]),
                               size=int(index["size"]))
        # Every tensor stored as itself, as a view of the map, made once (thousands of first feeds then cost
        # a lookup and a copy each); the pages are read only when a view is copied.
        plain = [entry for entry in self.entries.values() if "offset" in entry and "elem_type" not in entry]
        self._views = dict(zip((str(entry["name"]) for entry in plain), self.data.views(plain), strict=True))

    def read(self, names: Sequence[str]) -> list[Any]:
        """The values stored under ``names``, in memory and writable (copies: the store is read-only)."""
        views = self._views
        try:
            return [np.array(views[name]) if name in views else self._other(self.entries[name]) for name in names]
        except KeyError as exc:
            raise InputError(f"a run request names input {exc} of the activation store {self.data.path.parent}, "
                             "which does not hold it",
                             hint="report this as a graphbisect bug (the host and worker disagree)") from exc

    def _other(self, entry: Mapping[str, Any]) -> Any:
        """A sequence, an optional or a type numpy lacks, read for one request."""
        return _writable(self.data.value(entry, mapped=False))


def _writable(value: Any) -> Any:
    """``value`` (read-only, as packed data is read) made writable: copies in place, maps copied."""
    if isinstance(value, list):
        return [_writable(item) for item in value]
    if not isinstance(value, np.ndarray) or value.flags.writeable:
        return value
    if value.flags.owndata:
        value.setflags(write=True)
        return value
    return np.array(value)


@gc_paused()
def compare_to_store(outputs: Mapping[str, Any], names: Sequence[str], store_dir: str | Path,
                     tolerance: Mapping[str, Any]) -> dict[str, Any]:
    """The statistics of each of ``names`` that the activation store at ``store_dir`` holds, ``outputs[name]``
    compared with the stored (oracle's) value under ``tolerance`` (``Tolerance.to_json``), as
    ``{"fields": STATS_FIELDS, "columns": stats_columns(...)}`` in the order of ``names`` (columns, the numbers
    as packed arrays: thousands of them are sent and read back faster than a JSON object or list per tensor).

    Why here: a layerwise probe returns thousands of tensors; comparing them in the worker, one stored
    tensor memory-mapped at a time, replaces writing each to a file and reading it back in the host.

    Example:
        >>> import tempfile, pathlib
        >>> from graphbisect.compare import Tolerance
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = write_outputs({"y": np.zeros(2, np.float32)}, ["y"], folder)
        >>> compare_to_store({"y": np.ones(2, np.float32)}, ["y"], folder, Tolerance().to_json())["columns"]["kind"]
        ['mismatch']
    """
    from graphbisect.compare.metrics import (  # numpy only, like this module
        STATS_FIELDS,
        TensorStats,
        Tolerance,
        compare_many,
        stats_columns,
    )
    from graphbisect.data.store import ActivationStore

    store = ActivationStore.open(store_dir)
    tol = Tolerance.from_json(tolerance)
    stored = [name for name in names if name in store]
    stats: list[TensorStats] = []
    # Small tensors are compared many at a time (compare_many: the same statistics, bit for bit), a window
    # of names at a time so that the stored values read for it stay few: the window's pages of the store are
    # let go before the next (a 1,500-node detector's capture is ~1 GiB, which stayed resident beside the
    # run's own outputs).
    for window in store.windows(stored, count=COMPARE_WINDOW):
        items = [(name, value, _as_stored(outputs[name])) for name, value in zip(window, store.get_many(window),
                                                                                  strict=True)]
        stats.extend(compare_many(items, tol))
    return {"fields": list(STATS_FIELDS), "columns": stats_columns(stats)}


#: Tensors whose stored values :func:`compare_to_store` reads at one time (and at most
#: :data:`~graphbisect.data.store.WINDOW_BYTES` of them).
COMPARE_WINDOW = 4096


def _as_stored(value: Any) -> Any:
    """``value`` as its output file reads back (:func:`write_outputs`): what the host compared before the
    worker did, e.g. a string tensor of ``bytes`` read as ``str`` objects."""
    if value is None or isinstance(value, (list, tuple)):
        return value if value is None else [_as_stored(item) for item in value]
    array = np.asarray(value)
    if is_native(array.dtype):
        return array  # stored as it is (the general path below returns it too, slower)
    return decode_tensor(*encode_tensor(array))


# ------------------------------------------------------------------------------------ runtime helpers
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@overload
def option_flag(options: Mapping[str, str], key: str, default: bool = False) -> bool: ...


@overload
def option_flag(options: Mapping[str, str], key: str, default: None) -> bool | None: ...


def option_flag(options: Mapping[str, str], key: str, default: bool | None = False) -> bool | None:
    """A boolean spec option (``1/0``, ``true/false``, ``yes/no``, ``on/off``); ``default`` when absent.

    Pass ``default=None`` to tell "not given" (keep the library's own default) from "off".

    Example:
        >>> option_flag({"shell": "1"}, "shell"), option_flag({}, "shell"), option_flag({}, "fp16", None)
        (True, False, None)
    """
    text = options.get(key)
    if text is None:
        return default
    if text.strip().lower() in _TRUE | _FALSE:
        return text.strip().lower() in _TRUE
    raise SpecError(f"option {key}={text!r} is not a boolean", hint=f"write {key}=1 or {key}=0")


def option_int(options: Mapping[str, str], key: str, low: int, high: int | None = None) -> int | None:
    """An integer spec option within ``[low, high]`` (None when absent).

    Example:
        >>> option_int({"threads": "4"}, "threads", 1), option_int({}, "threads", 1)
        (4, None)
    """
    value = options.get(key)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise SpecError(f"option {key}={value!r} is not an integer", hint=f"write e.g. {key}={low}") from exc
    if number < low or (high is not None and number > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise SpecError(f"option {key}={number} is out of range", hint=f"use a value in {bound}")
    return number


def unknown_names_hint(unknown: Sequence[str], known: Sequence[str], listing: str) -> str:
    """The hint for pass names ``backend`` does not have: the closest valid names for each (a name it is
    part of, then :func:`difflib.get_close_matches`), and the command that lists them all (``listing``);
    never the whole list, which for ONNX Runtime is some 70 names on one line.

    Example:
        >>> unknown_names_hint(["eliminate_identiy"], ["eliminate_identity", "nop"], "`lister`")
        "for 'eliminate_identiy' did you mean eliminate_identity?; `lister` lists all 2"
    """
    return "; ".join([*(close_names(name, known) for name in unknown), f"{listing} lists all {len(set(known))}"])


def close_names(name: str, known: Sequence[str]) -> str:
    """``for 'X' did you mean A or B?``: the names ``name`` is part of, then :func:`difflib.get_close_matches`.

    Example:
        >>> close_names("LayerNormFuson", ["LayerNormFusionL1", "GeluFusionL1"])
        "for 'LayerNormFuson' did you mean LayerNormFusionL1?"
    """
    close = [k for k in known if k.lower().startswith(name.lower()) or name.lower() in k.lower()]
    close += [k for k in difflib.get_close_matches(name, known, n=3, cutoff=0.6) if k not in close]
    return f"for {name!r} did you mean {' or '.join(close[:5])}?" if close else f"{name!r} has no close match"


def select_feeds(inputs: Mapping[str, np.ndarray], required: Sequence[str],
                 accepted: Collection[str]) -> dict[str, np.ndarray]:
    """The feeds a model declares (others are ignored); a missing required one is an :class:`InputError`.

    Example:
        >>> sorted(select_feeds({"x": np.zeros(1), "extra": np.zeros(1)}, ["x"], {"x"}))
        ['x']
    """
    missing = [name for name in required if name not in inputs]
    if missing:
        raise InputError(f"no value for model input {', '.join(map(repr, missing))}",
                         hint=f"the model needs inputs {', '.join(required)}")
    return {name: value for name, value in inputs.items() if name in accepted}


# ------------------------------------------------------------------------------------------ messages
def describe_exception(exc: BaseException) -> dict[str, Any]:
    """The JSON form of an exception: class name, message, hint and exit code where it has them."""
    message = exc.message if isinstance(exc, GraphBisectError) else str(exc)
    return {
        "type": type(exc).__name__,
        "message": message,
        "hint": getattr(exc, "hint", None),
        "exit_code": getattr(exc, "exit_code", None),
        "usage": isinstance(exc, GraphBisectError),
    }


class _Channel:
    """JSON lines in from the host, JSON lines out to it."""

    def __init__(self, requests_fd: int, replies_fd: int) -> None:
        for fd in (requests_fd, replies_fd):  # children of the backend must not hold the host's pipes open
            os.set_inheritable(fd, False)
        self._in: IO[bytes] = os.fdopen(requests_fd, "rb")
        self._out: IO[bytes] = os.fdopen(replies_fd, "wb")
        self._lock = threading.Lock()  # the progress thread writes too

    def receive(self) -> dict[str, Any] | None:
        line = self._in.readline()
        return json.loads(line) if line else None

    def send(self, message: Mapping[str, Any]) -> None:
        with self._lock:
            self._out.write(json.dumps(message).encode("utf-8") + b"\n")
            self._out.flush()


class _Progress:
    """While a run request is served: every ``period`` seconds a ``progress`` event with the time so far, the
    phase, the runtime's own count where it keeps one (``progress() -> (done, total, node)``) and its foresight
    of the run's length where it has one (``expected() -> str | None``). Stopped (and
    joined) before the request's reply, so no event follows a ``done``."""

    def __init__(self, channel: _Channel, runtime: Any, period: float) -> None:
        self.channel, self.runtime, self.period = channel, runtime, period
        self.phase = "load"
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="graphbisect-progress", daemon=True)

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            event: dict[str, Any] = {"event": "progress", "seconds": round(time.monotonic() - self._started, 1),
                                     "phase": self.phase}
            counted = getattr(self.runtime, "progress", None)
            expected = getattr(self.runtime, "expected", None)
            with contextlib.suppress(Exception):  # a count is a courtesy: never a reason to fail the run
                found = counted() if counted is not None and self.phase == "run" else None
                if found is not None:
                    event["done"], event["total"], event["node"] = int(found[0]), int(found[1]), str(found[2])
                foreseen = expected() if expected is not None and self.phase == "run" else None
                if foreseen:
                    event["expected"] = str(foreseen)
            if self._stop.is_set():
                return
            self.channel.send(event)


def _progress_seconds() -> float:
    try:
        return max(float(os.environ.get("GRAPHBISECT_PROGRESS_SECONDS", PROGRESS_SECONDS)), 0.05)
    except ValueError:
        return PROGRESS_SECONDS


def _flush_stdio() -> None:
    """Flush Python's and C's stdio buffers so what the backend printed reaches the log now."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):  # C stdio is fully buffered when fd 1 is a file
        import ctypes

        ctypes.CDLL(None).fflush(None)


#: Model files up to this size are hashed to decide whether a loaded session can be reused.
HASH_LIMIT = 64 * 1024 * 1024


def _file_key(model: str) -> tuple[Any, ...]:
    """Identity of a model file: a session is reused only while the file is the very same one.

    Inode and mtime catch atomic replacements; the content hash catches a same-size rewrite in place within
    the file system's timestamp granularity.
    """
    try:
        st = os.stat(model)
    except OSError:
        return (model,)
    key: tuple[Any, ...] = (os.path.realpath(model), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if os.path.isfile(model) and st.st_size <= HASH_LIMIT:
        with open(model, "rb") as fh:
            key += (hashlib.blake2b(fh.read(), digest_size=16).hexdigest(),)
    return key


# ----------------------------------------------------------------------------------------------- server
class _Server:
    """Holds the runtime and answers requests until ``exit`` or end of input."""

    def __init__(self, channel: _Channel, workdir: Path) -> None:
        self.channel = channel
        self.workdir = workdir
        self.runtime: Any = None
        self.loaded: tuple[Any, ...] | None = None
        self.builds = 0  # runtime.load calls: the compiles of a runtime that does not count its own (cost())
        self.inputs = InputsReader()

    def serve(self) -> int:
        while (request := self.channel.receive()) is not None:
            op = str(request.get("op"))
            if op == "exit":
                self.channel.send({"ok": True})
                return 0
            handler = {"init": self.init, "validate": self.validate, "run": self.run, "load": self.load,
                       "passes": self.passes}.get(op)
            try:
                if handler is None:
                    raise ValueError(f"unknown request {op!r}")
                reply = handler(request)
            except Exception as exc:
                traceback.print_exc()
                reply = {"ok": False, "event": "done", "error": describe_exception(exc)}
            _flush_stdio()
            self.channel.send(reply)
        return 0

    def init(self, request: Mapping[str, Any]) -> dict[str, Any]:
        from graphbisect.backends.registry import import_runtime

        runtime_class = import_runtime(request["runtime"], request.get("path", ()))
        self.runtime = self.loaded = None  # a repeated init (other options) drops the session built before
        self.runtime = runtime_class(dict(request.get("options", {})), str(self.workdir))
        patched = getattr(self.runtime, "patched", None)
        changes = list(patched()) if patched is not None else []
        measured = getattr(self.runtime, "measured", None)  # an external program's interpreter (command: package=)
        program = dict(measured()) if measured is not None else {}
        return {
            **({"patched": changes} if changes else {}),
            **({"measured": program} if program else {}),
            "ok": True,
            "protocol": PROTOCOL_VERSION,
            "pid": os.getpid(),
            "python": sys.executable,
            "python_version": platform.python_version(),
            "numpy": np.__version__,
            "package": str(Path(__file__).absolute().parents[1]),
            **library_version(request.get("library"), request.get("distributions") or ()),
        }

    def validate(self, request: Mapping[str, Any]) -> dict[str, Any]:
        before = self._counts()
        check = getattr(self.runtime, "validate", None)
        if check is not None:
            check()  # ONNX Runtime may build sessions of a probe model to list its optimizer names
        return {"ok": True, "cost": self._spent(before)}

    def passes(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Every pass the runtime registers, or (``among``) those of the given names it registers: the runtime's
        ``known_passes`` where it can tell without listing them all (ONNX Runtime), else its list filtered."""
        before = self._counts()
        among = request.get("among")
        known = getattr(self.runtime, "known_passes", None)
        registered = getattr(self.runtime, "registered_passes", None)
        if among is not None and known is not None:
            passes: list[str] | None = list(known(list(among)))
        else:
            passes = list(registered()) if registered is not None else None
            if among is not None and passes is not None:
                passes = [name for name in passes if name in set(among)]
        return {"ok": True, "passes": passes, "cost": self._spent(before)}

    def run(self, request: Mapping[str, Any]) -> dict[str, Any]:
        before = self._counts()
        reply = self._run(request)
        reply["cost"] = self._spent(before)
        reply["peak_memory"] = peak_memory()
        return reply

    def _run(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.channel.send({"event": "start"})
        # First: the host counts on this worker holding what the request sends, whatever happens next (a
        # model that fails to load is a result, and the next request refers to these values).
        inputs = self.inputs.read(request["inputs"])
        model, outputs = str(request["model"]), request.get("outputs")
        with _Progress(self.channel, self.runtime, _progress_seconds()) as progress:
            started = time.perf_counter()
            before = self.loaded
            crash = self._load(model, outputs)
            if crash:
                return crash
            # _load keeps the very same key object only when it skipped the build: a caller that counts builds
            # (`tactics isolate --builds N`) must know whether this run built its session or ran an earlier one.
            reused = before is not None and self.loaded is before
            loaded = time.perf_counter()
            self.channel.send({"event": "loaded"})
            progress.phase = "run"
            result = self._execute(inputs, outputs, Path(request["output_dir"]), request.get("compare"),
                                   durable=bool(request.get("durable")))
        timing = {"load_seconds": loaded - started, "run_seconds": time.perf_counter() - loaded,
                  "session_reused": reused}
        result.setdefault("info", {}).update(timing)
        return result

    def load(self, request: Mapping[str, Any]) -> dict[str, Any]:
        before = self._counts()
        crash = self._load(str(request["model"]), request.get("outputs"))
        # a build's info: what it compiled, where the runtime says so at build (BackendInfo.described_at_build)
        built = crash or {"status": "ok", "info": _jsonable(self.runtime.info())}
        return {"ok": True, **built, "cost": self._spent(before), "peak_memory": peak_memory()}

    def _counts(self) -> tuple[int, Mapping[str, Any] | None]:
        """The builds this worker asked for, and the runtime's own count where it keeps one (``cost()``)."""
        counted = getattr(self.runtime, "cost", None)
        with contextlib.suppress(Exception):  # a count is a courtesy: never a reason to fail the run
            return self.builds, dict(counted()) if counted is not None else None
        return self.builds, None

    def _spent(self, before: tuple[int, Mapping[str, Any] | None]) -> dict[str, int]:
        """What a request compiled: the runtime's count where it keeps one, else one compile per build."""
        builds, counted = self._counts()
        if counted is None or before[1] is None:
            return {"compiles": builds - before[0], "compile_cache_hits": 0}
        return {key: int(counted.get(key, 0)) - int(before[1].get(key, 0))
                for key in ("compiles", "compile_cache_hits")}

    def _load(self, model: str, outputs: Sequence[str] | None) -> dict[str, Any] | None:
        # A runtime whose build depends on more than the model file (a pin file it reads at load) says so.
        load_key = getattr(self.runtime, "load_key", None)
        key = (_file_key(model), tuple(outputs) if outputs is not None else None,
               load_key() if load_key is not None else None)
        if key == self.loaded:
            return None
        self.loaded = None
        self.builds += 1
        try:
            self.runtime.load(model, list(outputs) if outputs is not None else None)
        except GraphBisectError:
            raise
        except Exception as exc:
            return _crash("load", exc)
        self.loaded = key
        return None

    def _execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
                 output_dir: Path, compare: Mapping[str, Any] | None = None, *, durable: bool = False
                 ) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        try:
            produced = self.runtime.run(inputs)
            names = list(outputs) if outputs is not None else list(produced)
            missing = [name for name in names if name not in produced]
            if missing:
                raise KeyError(f"the backend returned no value for {', '.join(map(repr, missing))}")
            if compare is not None:
                stats = _compared(produced, names, compare)
                keep = set(compare.get("keep") or ())
                compared = set(stats["columns"]["name"])
                names = [name for name in names if name in keep or name not in compared]
            index = write_outputs(produced, names, output_dir, durable=durable)
        except GraphBisectError:
            self.loaded = None
            raise
        except Exception as exc:
            self.loaded = None  # rebuild the session next time: a failed run may have left it broken
            crash = _crash("run", exc)
            with contextlib.suppress(Exception):  # what the load learned (fired passes) survives a run crash
                crash["info"] = {**_jsonable(self.runtime.info()), **crash.get("info", {})}
            return crash
        pack = {key: value for key, value in index.items() if key != "tensors"}
        return {"event": "done", "status": "ok", "outputs": index["tensors"], "pack": pack,
                "info": _jsonable(self.runtime.info()), **({"stats": stats} if compare is not None else {})}


def _compared(produced: Mapping[str, Any], names: Sequence[str], compare: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`compare_to_store` for a run request; its failure is graphbisect's, never a backend crash."""
    try:
        return compare_to_store(produced, names, compare["store"], compare["tolerance"])
    except GraphBisectError:
        raise
    except Exception as exc:
        raise GraphBisectError(f"comparing the outputs with the oracle's activation store {compare['store']} "
                               f"failed: {type(exc).__name__}: {exc}",
                               hint="the store may be damaged; delete it and run again") from exc


def library_version(name: str | None, distributions: Sequence[str]) -> dict[str, Any]:
    """The backend library's version and location *as this interpreter imports it*.

    The imported module's ``__version__`` is what ran; the installed distribution's metadata is the fallback
    for modules without one. Empty when the backend needs no library (``command``).

    Example:
        >>> library_version("numpy", ["numpy"])["library_version"] == np.__version__
        True
    """
    if not name:
        return {}
    module = sys.modules.get(name) or importlib.import_module(name)  # the runtime imports it anyway
    version = getattr(module, "__version__", None)
    for dist in distributions:
        if isinstance(version, str):
            break
        from importlib import metadata  # here: only for a module without __version__ (~30 ms of imports)

        with contextlib.suppress(metadata.PackageNotFoundError):
            version = metadata.version(dist)
    location = getattr(module, "__file__", None)
    return {"library": name, "library_version": version if isinstance(version, str) else None,
            "library_path": str(Path(location).parent) if location else None}


def _crash(phase: str, exc: BaseException) -> dict[str, Any]:
    traceback.print_exc()
    error = describe_exception(exc)
    crash = {"event": "done", "status": "crash", "phase": phase, "error_type": error["type"],
             "message": error["message"], "exit_code": error["exit_code"]}
    if isinstance(error["hint"], str) and error["hint"]:  # a backend error that says what would run the model
        crash["info"] = {"error_hint": error["hint"]}
    return crash


def _jsonable(info: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(dict(info), default=str))


def _redirect_output(log: str | None) -> None:
    """Send fd 1 and fd 2 (C++ prints included) to the log file."""
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def _parse_args(argv: Iterable[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m graphbisect.backends.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, required=True, help="file descriptor to read requests from")
    parser.add_argument("--replies", type=int, required=True, help="file descriptor to write replies to")
    parser.add_argument("--workdir", required=True, help="folder for the runtime's files")
    parser.add_argument("--log", help="append fd 1 and fd 2 to this file")
    parser.add_argument("--log-level", default="WARNING", help="level of graphbisect's own log messages")
    return parser.parse_args(list(argv) if argv is not None else None)


def peak_memory() -> int | None:
    """An upper bound of the most resident memory this worker and a child of it (a compiler the runtime ran:
    ``iree-compile``; a ``command`` target's program) held at once so far, in bytes: this process's high-water
    mark plus its largest waited-for child's. Linux counts a child's from the worker's own memory when it was
    started, so the child's share is at least that (an overestimate by up to the worker's own: the bound errs on
    the side of fewer parallel workers). This process's own is its ``VmHWM`` where ``/proc`` has it: its
    ``ru_maxrss`` also counts the process that started it (a test runner of gigabytes). None where
    ``resource`` is missing (Windows)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                own = int(line.split()[1]) * 1024
                break
    return int(own + children)


def _end_with_host(requests_fd: int, workdir: Path) -> None:
    """End this worker, and what it started, as soon as its host is gone, even in the middle of a build.

    The host holds the only write end of the request pipe, so the pipe hangs up when the host ends, whatever
    ends it (``SIGKILL``, a second Ctrl-C, the OOM killer, ``timeout -s KILL``). A worker building a model
    reads no request for minutes (ONNX Runtime took over 5 minutes on a model with 1e6 unused initializers)
    and used to build on, orphaned, with its gigabytes (issue 36). A daemon thread waits for the hang-up
    (``poll`` reads nothing from the pipe) and kills the programs the worker recorded
    (:mod:`~graphbisect.backends.children`) and the worker's own process group, when it leads one (as
    every worker the host starts does); else the worker alone."""
    from graphbisect.backends.children import kill_recorded_groups

    def watch() -> None:
        poller = select.poll()
        poller.register(requests_fd, select.POLLHUP | select.POLLERR)
        while True:
            with contextlib.suppress(InterruptedError):
                if any(event & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
                       for _, event in poller.poll()):
                    break
        kill_recorded_groups(workdir)
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os._exit(128 + signal.SIGKILL)

    if hasattr(select, "poll"):  # POSIX
        threading.Thread(target=watch, name="graphbisect-host-watch", daemon=True).start()


def main(argv: Iterable[str] | None = None) -> int:
    """Entry point of the worker process."""
    return _server(argv).serve()


def _server(argv: Iterable[str] | None) -> _Server:
    """The worker's server on the pipes ``argv`` names, its output and logging set up."""
    args = _parse_args(argv)
    _redirect_output(args.log)
    faulthandler.enable()  # a segfault prints the Python stack to the log
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    _end_with_host(args.requests, Path(args.workdir))
    return _Server(_Channel(args.requests, args.replies), Path(args.workdir))


def serve_and_exit(argv: Iterable[str] | None = None) -> NoReturn:
    """Serve as :func:`main` does and end the process with its code (``python -m`` and a forked worker alike)."""
    server = _server(argv)
    code = server.serve()
    # Every reply is sent and every output file written: the host asked for the exit or closed the pipe.
    # Skip the interpreter's teardown (freeing each runtime, session and module one by one: ~0.07 s of CPU
    # and ~0.1 s the host waits for at each close), which the operating system does at once. ``server`` is
    # still referenced here, so its runtime is not freed either: a 5,000-node ONNX Runtime session took
    # ~0.06 s to free, between the exit's reply and the exit the host waits for.
    _flush_stdio()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    serve_and_exit()
