"""Writing models to disk: atomic saves, external data, and one weights file shared by many candidates.

Why a shared weights file: the reduce engine materializes hundreds of candidate models. Copying the
weights into each would cost the model's size per candidate; instead :func:`write_weights_file` writes
every initializer's bytes once, and :func:`strip_to_external` turns any candidate into a small graph
whose initializers point into that file by offset. A candidate saved next to the weights file costs only
its graph bytes, and every backend (ONNX Runtime, OpenVINO, TensorRT's parser) reads it as ordinary ONNX
external data.

Weights a model keeps on disk (source references, see :mod:`graphbisect.model.external`) are never read
into memory here: the user's data file is hard-linked beside the weights file, or its referenced ranges are
copied by the kernel.

Example:
    >>> refs = write_weights_file(model, workdir / "weights.bin")      # doctest: +SKIP
    >>> small = strip_to_external(candidate_proto, refs)                # doctest: +SKIP
    >>> save_proto(small, workdir / "candidate_17.onnx")                 # doctest: +SKIP
"""

from __future__ import annotations

import glob
import logging
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
from google.protobuf.message import Message

from graphbisect.errors import ModelError
from graphbisect.model.external import SourceRef, copy_source, has_sources, link_file, source_of
from graphbisect.storage.atomic import atomic_path


class HasProto(Protocol):
    """A loaded :class:`~graphbisect.model.graph.Model` as this module sees it (io sits below graph.py)."""

    @property
    def proto(self) -> onnx.ModelProto: ...

__all__ = [
    "INLINE_MAX_BYTES",
    "PROTOBUF_LIMIT",
    "ExternalRef",
    "WeightsPool",
    "copy_model",
    "remove_model",
    "save_proto",
    "strip_to_external",
    "tensor_raw_bytes",
    "write_weights_file",
]

logger = logging.getLogger(__name__)

#: Protobuf refuses to serialize messages of 2 GiB or more; keep a margin for the graph itself.
PROTOBUF_LIMIT = 2**31 - 2**24

#: Tensors at least this large start at a 64 KiB boundary so runtimes can memory-map them
#: (the allocation granularity on Windows; a multiple of the page size everywhere else).
_MMAP_THRESHOLD = 1 << 20
_MMAP_ALIGNMENT = 1 << 16
_SMALL_ALIGNMENT = 64

#: Initializers smaller than this stay inline (ONNX's own default threshold). Runtimes run shape
#: inference on the model as loaded and need small constants (a Reshape's shape) in it: ONNX Runtime
#: refuses "Cannot parse data from external tensors" otherwise. They cost next to nothing per candidate.
INLINE_MAX_BYTES = 1024

# ONNX element types whose numpy conversion (numpy_helper.to_array) yields exactly the ONNX byte layout.
_NUMPY_EXACT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.BOOL,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
        onnx.TensorProto.COMPLEX64,
        onnx.TensorProto.COMPLEX128,
    }
)


@dataclass(frozen=True)
class ExternalRef:
    """Where one tensor's bytes live in an external-data file.

    ``location`` is the file name relative to the folder of the model that references it (ONNX external
    data is always resolved relative to the model file).
    """

    location: str
    offset: int
    length: int


def tensor_raw_bytes(tensor: onnx.TensorProto) -> bytes | None:
    """The tensor's data in ONNX's little-endian raw layout, or ``None`` when it cannot be stored raw.

    ``raw_data`` is used as is. Tensors stored in typed fields (``float_data``, ``int32_data``...) are
    converted for the element types numpy represents exactly; strings and exotic packed types
    (bfloat16, float8, int4 in typed fields) return ``None`` and stay inline in the model.
    """
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    if tensor.data_type not in _NUMPY_EXACT_TYPES:
        return None
    array = onnx.numpy_helper.to_array(tensor)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def _aligned(offset: int, size: int) -> int:
    alignment = _MMAP_ALIGNMENT if size >= _MMAP_THRESHOLD else _SMALL_ALIGNMENT
    return -(-offset // alignment) * alignment


def write_weights_file(
    model: HasProto | onnx.ModelProto, path: str | Path, *, min_bytes: int = INLINE_MAX_BYTES, inline: bool = True,
    link: bool = True,
) -> dict[str, ExternalRef]:
    """Write every initializer of ``model`` (a :class:`Model` or ``ModelProto``) once into ``path``; return
    where each one went.

    Offsets are aligned (64 bytes; 64 KiB for tensors of 1 MiB or more, so runtimes may memory-map
    them). Left out of the file and of the result, so they stay inline in the models that
    :func:`strip_to_external` produces: initializers under ``min_bytes`` (default 1 KiB: runtimes need
    small constants such as a Reshape's shape inside the model) and those that cannot be stored raw
    (strings, packed types kept in typed fields); with ``inline=False``, every initializer held in memory.
    The file is written atomically (with ``inline=False``, only when something must be copied into it).

    Initializers the model keeps on disk (:mod:`graphbisect.model.external`) are never read into memory:
    with ``link`` each data file they come from is hard-linked beside ``path`` as ``<path name>.<k>`` and
    referenced at its own offsets (nothing copied); where a link is impossible (another file system) their
    byte ranges are copied into ``path`` by the kernel.

    Example:
        >>> refs = write_weights_file(model, tmp_path / "weights.bin")    # doctest: +SKIP
        >>> refs["conv1.weight"]                                           # doctest: +SKIP
        ExternalRef(location='weights.bin', offset=0, length=37632)
    """
    path = Path(path)
    proto = model if isinstance(model, onnx.ModelProto) else model.proto
    initializers = proto.graph.initializer
    sources = {t.name: ref for t in initializers if (ref := source_of(t)) is not None}
    linked = _link_sources(list(sources.values()), path) if link else {}
    refs = {name: ExternalRef(linked[ref.file], ref.offset, ref.length)
            for name, ref in sources.items() if ref.file in linked}
    if not inline and len(refs) == len(sources):
        return refs
    offset = 0
    with atomic_path(path) as tmp, tmp.open("wb") as out:
        for tensor in initializers:
            ref = sources.get(tensor.name)
            if ref is not None:
                if tensor.name not in refs:
                    start = _aligned(offset, ref.length)
                    out.write(b"\0" * (start - offset))
                    out.flush()
                    copy_source(ref, out.fileno())  # by the kernel, at the descriptor's position
                    offset = out.seek(start + ref.length)  # re-synchronize the buffered writer
                    refs[tensor.name] = ExternalRef(path.name, start, ref.length)
                continue
            data = tensor_raw_bytes(tensor) if inline else None
            if data is None or len(data) < min_bytes:
                logger.debug("initializer %r stays inline", tensor.name)
                continue
            start = _aligned(offset, len(data))
            out.write(b"\0" * (start - offset))
            out.write(data)
            refs[tensor.name] = ExternalRef(path.name, start, len(data))
            offset = start + len(data)
    in_links = sum(1 for ref in refs.values() if ref.location != path.name)
    logger.info("wrote %d initializers (%d bytes) to %s; %d more referenced in %d hard-linked data file(s)",
                len(refs) - in_links, offset, path, in_links, len(linked))
    return refs


def _link_sources(sources: list[SourceRef], path: Path) -> dict[Path, str]:
    """Hard-link each data file that ``sources`` read beside ``path``; file → the link's name (in
    ``path``'s folder). Files that cannot be linked are left out. A name that is already some *other*
    source file is skipped, so a user's file is never replaced."""
    files = list(dict.fromkeys(ref.file for ref in sources))
    if not files:
        return {}
    path.parent.mkdir(parents=True, exist_ok=True)
    taken = {os.path.normcase(os.path.abspath(f)) for f in files}
    linked: dict[Path, str] = {}
    index = 0
    for file in files:
        while True:
            name = f"{path.name}.{index}"
            index += 1
            dest = path.parent / name
            if os.path.normcase(os.path.abspath(dest)) not in taken or _same_file(dest, file):
                break
        if link_file(file, dest):
            linked[file] = name
        else:
            break  # another file system: the other files will not link either
    return linked


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _copy_fields(source: Message, target: Message, skip: frozenset[str]) -> None:
    """Copy every set field of ``source`` into ``target`` except those named in ``skip``."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        if isinstance(value, Message):
            getattr(target, field.name).CopyFrom(value)
        elif isinstance(value, (str, bytes, int, float, bool)):
            setattr(target, field.name, value)
        else:  # repeated field (scalars or messages): extend copies the elements
            getattr(target, field.name).extend(value)


def copy_model(proto: onnx.ModelProto, *, initializers: bool = True, nodes: bool = True) -> onnx.ModelProto:
    """A deep copy of ``proto``; with ``initializers=False`` the graph's initializer list stays empty, with
    ``nodes=False`` its node list.

    Copying without initializers costs only the graph's size, which is what candidate builders need
    before they re-add initializers as external references (or the few a rewritten graph reads).
    """
    if initializers and nodes:
        copied = onnx.ModelProto()
        copied.CopyFrom(proto)
        return copied
    copied = onnx.ModelProto()
    _copy_fields(proto, copied, frozenset({"graph"}))
    skip = {"initializer"} if not initializers else set()
    _copy_fields(proto.graph, copied.graph, frozenset(skip | ({"node"} if not nodes else set())))
    return copied


def _external_stub(tensor: onnx.TensorProto, ref: ExternalRef, location: str) -> onnx.TensorProto:
    stub = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    if tensor.doc_string:
        stub.doc_string = tensor.doc_string
    stub.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", ref.offset), ("length", ref.length)):
        stub.external_data.add(key=key, value=str(value))
    return stub


def strip_to_external(
    proto: onnx.ModelProto, refs: Mapping[str, ExternalRef], location: str | None = None
) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers named in ``refs`` point into the shared weights file.

    No tensor data is copied for those initializers: the result holds only names, types, dims and
    offsets. ``location`` overrides each ref's file name (e.g. ``"../weights.bin"`` is *not* allowed by
    ONNX loaders; keep candidates in the weights file's folder). Initializers missing from ``refs`` are
    copied inline. ``proto`` is not modified.

    Example:
        >>> small = strip_to_external(model.proto, refs)            # doctest: +SKIP
        >>> small.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL   # doctest: +SKIP
        True
    """
    stripped = copy_model(proto, initializers=False)
    for tensor in proto.graph.initializer:
        ref = refs.get(tensor.name)
        if ref is None:
            stripped.graph.initializer.add().CopyFrom(tensor)
        else:
            stripped.graph.initializer.append(_external_stub(tensor, ref, location or ref.location))
    return stripped


class WeightsPool:
    """One weights file that a series of models derived from one model share, written as they need it.

    :func:`write_weights_file` suits candidates that only drop parts of one model (reduce: every weight is
    known at the start). A lowering *makes* weights too (a weight's INT8 copy and scales, its float16
    copy), one set per node it lowers, so which exist is known only as candidates come: :meth:`strip`
    appends each initializer the pool has not seen (by name, at least ``min_bytes``, raw-storable) and
    returns the candidate with every pooled initializer pointing into the file — a few hundred KB to save
    instead of the model's size (a 19 MB int8 CRNN: 44-68 ms of serializing and writing per candidate,
    and the target parses less).

    A name must always carry the same value (a lowering names each tensor it makes after everything the
    value depends on); a name seen again with another type or shape raises ``ValueError``. Candidates must
    be saved in ``folder`` (ONNX resolves external data relative to the model). Safe to share between
    threads (a worker pool's). The file is scratch: appended without fsync, removed by :meth:`close`.

    Example:
        >>> pool = WeightsPool(workdir)                                     # doctest: +SKIP
        >>> save_proto(pool.strip(candidate), workdir / "candidate.onnx")   # doctest: +SKIP
    """

    def __init__(self, folder: str | Path, *, min_bytes: int = INLINE_MAX_BYTES) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder, prefix="weights-", suffix=".bin")  # one per pool: never shared
        os.close(fd)
        self.path = Path(name)
        self.min_bytes = min_bytes
        self._size = 0
        self._refs: dict[str, tuple[ExternalRef, int, tuple[int, ...]]] = {}
        self._inline: set[str] = set()  # names that stay in the model (small, or not storable raw)
        self._lock = threading.Lock()

    def strip(self, proto: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``proto`` whose initializers the pool holds point into its file (new ones appended first);
        ``proto`` is not modified."""
        refs: dict[str, ExternalRef] = {}
        with self._lock:
            pending: list[tuple[int, bytes]] = []
            for tensor in proto.graph.initializer:
                name = tensor.name
                if name in self._inline:
                    continue
                known = self._refs.get(name)
                if known is None:
                    data = tensor_raw_bytes(tensor)
                    if data is None or len(data) < self.min_bytes:
                        self._inline.add(name)
                        continue
                    start = _aligned(self._size, len(data))
                    pending.append((start, data))
                    self._size = start + len(data)
                    known = self._refs[name] = (ExternalRef(self.path.name, start, len(data)), tensor.data_type,
                                                tuple(tensor.dims))
                elif (tensor.data_type, tuple(tensor.dims)) != known[1:]:
                    raise ValueError(f"weights pool {self.path}: initializer {name!r} came back with another type "
                                     f"or shape; a derived tensor's name must say what its value depends on")
                refs[name] = known[0]
            if pending:
                with self.path.open("r+b") as out:  # visible to the workers through the page cache: no fsync
                    for start, data in pending:
                        out.seek(start)
                        out.write(data)
        return strip_to_external(proto, refs)

    def close(self) -> None:
        """Remove the file (models saved against it can no longer be loaded)."""
        self.path.unlink(missing_ok=True)


def _inline_size(proto: onnx.ModelProto) -> int:
    """The serialized size; at least the protobuf limit when protobuf refuses to size it (protobuf ≥ 5's upb
    raises ``EncodeError`` from ``ByteSize()`` beyond 2 GiB instead of returning the size)."""
    try:
        return proto.ByteSize()
    except Exception as exc:  # google.protobuf.message.EncodeError; protobuf is not imported here
        logger.debug("ByteSize() failed (%s): treating the model as larger than 2 GiB", exc)
        return PROTOBUF_LIMIT


def _serialized(proto: onnx.ModelProto) -> bytes | None:
    """``proto``'s bytes when it fits one protobuf, else None (too large, or protobuf refused: the caller sizes
    it then). upb's ``ByteSize()`` serializes the message to size it, so this sizes and serializes at once (a
    5,000-node model: one pass instead of two); initializers' raw bytes past the limit skip the attempt."""
    if sum(len(tensor.raw_data) for tensor in proto.graph.initializer) >= PROTOBUF_LIMIT:
        return None
    try:
        data = proto.SerializeToString()
    except Exception as exc:  # google.protobuf.message.EncodeError beyond 2 GiB
        logger.debug("SerializeToString() failed (%s): sizing the model", exc)
        return None
    return data if len(data) < PROTOBUF_LIMIT else None


def save_proto(proto: onnx.ModelProto, path: str | Path, *, durable: bool = True, link: bool = True) -> Path:
    """Save ``proto`` to ``path`` atomically; returns ``path``.

    A model too large for one protobuf (≥ 2 GiB) is saved with its initializers in ``<name>.data``
    next to it (also written atomically, before the model that references it). Initializers kept on disk
    (:mod:`graphbisect.model.external`: a loaded model's large external weights) are referenced from files
    beside ``path``, hard links to the user's data files where possible (``<name>.data.<k>``), else copied
    into ``<name>.data`` by the kernel; never read into memory. ``proto`` is not modified.
    ``durable=False`` skips the fsync (see :func:`graphbisect.storage.atomic.atomic_path`), for scratch models.
    ``link=False`` always copies: for a deliverable the user keeps, a hard link would share the user's
    weights file with it, and a tool that later rewrites the deliverable's data in place (``onnx.save`` with
    the same ``location`` appends to it) would modify the user's file.
    """
    path = Path(path)
    sourced = has_sources(proto)
    data = None if sourced else _serialized(proto)  # sized by serializing: ByteSize() serializes too
    if data is None:
        too_large = _inline_size(proto) >= PROTOBUF_LIMIT
        if too_large or sourced:
            return _save_with_external_data(proto, path, inline=too_large, link=link)
        try:
            data = proto.SerializeToString()
        except Exception as exc:
            raise ModelError(f"cannot serialize the model for {path}: {exc}", hint="report this as a bug") from exc
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_bytes(data)
    return path


def remove_model(path: str | Path) -> None:
    """Delete a model written by :func:`save_proto` and the data files it put beside it
    (``<name>.data``, ``<name>.data.<k>``); missing files are fine."""
    path = Path(path)
    path.unlink(missing_ok=True)
    for side in path.parent.glob(f"{glob.escape(path.name)}.data*"):
        side.unlink(missing_ok=True)


def _save_with_external_data(proto: onnx.ModelProto, path: Path, *, inline: bool = True, link: bool = True) -> Path:
    data_path = path.with_name(path.name + ".data")
    if inline:
        logger.info("model is larger than 2 GiB: saving its initializers to %s", data_path)
    refs = write_weights_file(proto, data_path, inline=inline, link=link)
    stripped = strip_to_external(proto, refs)
    with atomic_path(path) as tmp:
        tmp.write_bytes(stripped.SerializeToString())
    return path
