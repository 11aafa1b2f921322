"""Weights that stay on disk: a model's large external-data initializers are never read into the main process.

:func:`~graphbisect.model.load_model` keeps every top-level initializer of at least :data:`LAZY_MIN_BYTES`
that a model stores as ONNX external data as a **source reference**: a stub (name, type, dims, no data)
whose external-data ``location`` is the *absolute* path of the user's file, with ``offset`` and
``length``. Everything that needs the bytes reads them from there, once, in bounded chunks:

* :func:`~graphbisect.model.normalize.fingerprint` hashes them (:func:`hash_source`), so a model hashes the
  same with inline or external weights, wherever it was loaded from;
* :func:`~graphbisect.model.io.write_weights_file` and :func:`~graphbisect.model.io.save_proto` hard-link the
  user's file next to the model they write (:func:`link_file`: no byte is copied, and the user's file is
  not modified) or, across file systems, copy just the referenced ranges in the kernel (:func:`copy_source`);
* a bundle, which must carry its weights inline, reads only the few it uses (:func:`inline_tensor`).

Why absolute locations: a probe or candidate derived from the model may be saved into any folder, and
ONNX resolves external data relative to the file that references it. An absolute location is valid
nowhere (ONNX Runtime and ``onnx.checker`` refuse it), so a derived model that was not saved through
:func:`~graphbisect.model.io.save_proto`, which relocates the references, fails loudly instead of reading
a same-named file of another layout.

Smaller external tensors are read at load time, as before: constants that shape inference and runtimes
need as values (shapes, axes, indices) are small, and they cost little memory.

Example:
    >>> source_of(onnx.TensorProto(name="w")) is None
    True
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx

from graphbisect.errors import ModelError

__all__ = [
    "LAZY_MIN_BYTES",
    "SourceRef",
    "copy_source",
    "has_sources",
    "hash_source",
    "inline_tensor",
    "link_file",
    "make_source_stub",
    "read_source",
    "source_of",
]

logger = logging.getLogger(__name__)

#: External initializers at least this large stay on disk (the size up to which shape inference keeps
#: an initializer's values, see :mod:`graphbisect.model.normalize`); smaller ones are read at load time.
LAZY_MIN_BYTES = 1 << 16

#: Bytes per read or kernel copy: bounds the memory any copy, hash or fallback needs.
_CHUNK = 16 << 20

# copy_file_range / sendfile failures that mean "not between these files": fall back to read + write.
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP,
                             errno.EBADF, errno.EPERM})


@dataclass(frozen=True)
class SourceRef:
    """Where the bytes of a source reference live: ``length`` bytes at ``offset`` of ``file`` (absolute)."""

    file: Path
    offset: int
    length: int


def source_of(tensor: onnx.TensorProto) -> SourceRef | None:
    """The source reference of ``tensor``, or ``None`` when it holds its data (or relative external data).

    Example:
        >>> t = onnx.TensorProto(name="w", data_type=1, dims=[4])
        >>> make_source_stub(t, Path("/data/w.bin"), 0, 16)
        >>> source_of(t)
        SourceRef(file=PosixPath('/data/w.bin'), offset=0, length=16)
    """
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    if not os.path.isabs(location) or "length" not in info:
        return None
    return SourceRef(Path(location), int(info.get("offset", 0)), int(info["length"]))


def has_sources(proto: onnx.ModelProto) -> bool:
    """Whether any top-level initializer of ``proto`` is a source reference (it must be saved with
    :func:`~graphbisect.model.io.save_proto`, which relocates it)."""
    return any(source_of(tensor) is not None for tensor in proto.graph.initializer
               if tensor.data_location == onnx.TensorProto.EXTERNAL)


def make_source_stub(tensor: onnx.TensorProto, file: Path, offset: int, length: int) -> None:
    """Turn ``tensor`` (in place) into a source reference to ``length`` bytes at ``offset`` of ``file``."""
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", os.path.abspath(file)), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))


def _ended_early(ref: SourceRef) -> ModelError:
    return ModelError(
        f"external data file {ref.file} ended early: expected {ref.length} bytes at offset {ref.offset}",
        hint="the file changed or was truncated after the model was loaded; load the model again",
    )


def read_source(ref: SourceRef) -> bytes:
    """The bytes of ``ref`` (only for the few weights a bundle carries inline)."""
    with open(ref.file, "rb", buffering=0) as handle:
        data = os.pread(handle.fileno(), ref.length, ref.offset) if ref.length else b""
    if len(data) != ref.length:
        raise _ended_early(ref)
    return data


def inline_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """``tensor`` itself when it holds its data, else a copy holding the bytes of its source reference."""
    ref = source_of(tensor)
    if ref is None:
        return tensor
    inline = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    if tensor.doc_string:
        inline.doc_string = tensor.doc_string
    inline.raw_data = read_source(ref)
    return inline


def hash_source(digest: hashlib._Hash, ref: SourceRef) -> None:
    """Feed the bytes of ``ref`` to ``digest`` in chunks of at most 16 MiB."""
    buffer = bytearray(min(_CHUNK, max(ref.length, 1)))
    view = memoryview(buffer)
    with open(ref.file, "rb", buffering=0) as handle:
        handle.seek(ref.offset)
        remaining = ref.length
        while remaining:
            got = handle.readinto(view[: min(remaining, len(buffer))])
            if not got:
                raise _ended_early(ref)
            digest.update(view[:got])
            remaining -= got


def copy_source(ref: SourceRef, out: int) -> None:
    """Append the bytes of ``ref`` to the file open on descriptor ``out`` (at its current position).

    The kernel copies them (``copy_file_range``, which shares extents on file systems that can; else
    ``sendfile``); only where neither works do they pass through a 16 MiB buffer here.
    """
    with open(ref.file, "rb", buffering=0) as handle:
        source = handle.fileno()
        done = _kernel_copy(source, out, ref)
        remaining = ref.length - done
        while remaining:
            chunk = os.pread(source, min(remaining, _CHUNK), ref.offset + ref.length - remaining)
            if not chunk:
                raise _ended_early(ref)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
            remaining -= len(chunk)


def _kernel_copy(source: int, out: int, ref: SourceRef) -> int:
    """Copy as much of ``ref`` as the kernel will; returns the bytes copied (the rest is up to the caller)."""
    done = 0
    for name in ("copy_file_range", "sendfile"):
        if not hasattr(os, name):
            continue
        try:
            while done < ref.length:
                count = min(ref.length - done, 1 << 30)
                if name == "copy_file_range":
                    copied = os.copy_file_range(source, out, count, ref.offset + done)
                else:
                    copied = os.sendfile(out, source, ref.offset + done, count)
                if copied == 0:
                    raise _ended_early(ref)
                done += copied
            return done
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY:
                raise
            logger.debug("%s not usable for %s (%s); trying the next way", name, ref.file, exc)
    return done


def link_file(source: Path, dest: Path) -> bool:
    """Make ``dest`` a hard link to ``source`` (replacing ``dest`` atomically); ``False`` when the file
    system cannot (another device, no permission, no hard links).

    The user's file is not modified: graphbisect writes every file through a temporary name and a rename,
    so a link in a work folder is replaced, never written through. Symbolic links are followed.
    """
    try:
        if dest.exists() and os.path.samefile(source, dest):
            return True
    except OSError:
        pass
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".link", dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        tmp.unlink()
        os.link(source, tmp)
        os.replace(tmp, dest)
        return True
    except OSError as exc:
        logger.debug("cannot hard-link %s to %s (%s): copying instead", source, dest, exc)
        return False
    finally:
        tmp.unlink(missing_ok=True)
