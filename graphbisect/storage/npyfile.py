"""Reading ``.npy`` files whose dtype and shape are already known (from a manifest), fast and read-only.

Used by the activation store to read stores of the per-tensor layout graphbisect wrote before the packed
one (manifest version 1, :mod:`graphbisect.storage.packfile`), and to adopt ``.npy`` files; imports only numpy.

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(path, np.arange(3.0))
    >>> read_npy(path, "<f8", (3,))
    array([0., 1., 2.])
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

__all__ = ["load_memmap", "read_npy"]


def load_memmap(file: str | Path) -> np.ndarray:
    try:
        return np.load(file, mmap_mode="r", allow_pickle=False)
    except ValueError:  # numpy cannot memory-map an empty array; it is tiny anyway
        array = np.load(file, allow_pickle=False)
        array.setflags(write=False)
        return array


#: Tensors up to this size are read into memory; larger ones are memory-mapped.
_READ_MAX_BYTES = 64 << 10
_NPY_MAGIC = b"\x93NUMPY"


def read_npy(file: str | Path, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """``file`` read back as a read-only array, given the ``dtype`` (``np.dtype.str``) and ``shape`` it should hold.

    Why not ``np.load``: at 50,000 tensors its per-file cost (two opens, the header parsed with
    ``ast.literal_eval``, a memory map even for 64 bytes) was most of the time spent reading a store. The
    header is still checked against the manifest (dtype, C order, shape); anything unexpected goes through
    ``np.load``.
    """
    with open(file, "rb") as handle:
        head = handle.read(4096)
        if not head.startswith(_NPY_MAGIC) or len(head) < 10:
            return load_memmap(file)
        major = head[6]
        start = 12 if major >= 2 else 10
        length = int.from_bytes(head[8:start], "little")
        header = head[start:start + length]
        offset = start + length
        if len(header) != length or not _header_matches(header, dtype, shape):
            return load_memmap(file)
        nbytes = np.dtype(dtype).itemsize * math.prod(shape)
        if nbytes > _READ_MAX_BYTES:
            return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=shape)
        data = head[offset:offset + nbytes]
        if len(data) < nbytes:
            handle.seek(offset)
            data = handle.read(nbytes)
    if len(data) != nbytes:
        return load_memmap(file)  # truncated: let numpy say so
    return np.frombuffer(data, dtype=dtype).reshape(shape)  # read-only: backed by bytes


def _header_matches(header: bytes, dtype: str, shape: tuple[int, ...]) -> bool:
    text = header.decode("latin1")
    return (f"'descr': '{dtype}'" in text and "'fortran_order': False" in text
            and f"'shape': {tuple(shape)!r}" in text)
