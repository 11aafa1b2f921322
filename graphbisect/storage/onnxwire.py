"""The outputs a serialized ONNX model declares, read from its bytes without ``onnx`` or ``protobuf``.

Why: a ``command`` target's worker holds the program's outputs file to the shapes the model declares
(:mod:`graphbisect.storage.npzguard`) before reading it, and it imports neither ``onnx`` nor ``protobuf`` (40 MB more
in every such worker, which a child program's memory bound then counts: ``backends/worker.py``
``peak_memory``). Protobuf's wire format lets a reader step over every field it does not need by its
length, so the graph's nodes and initializers (a 2 GB model's weights) are never parsed or copied: reading
the outputs of any model is a walk over its top-level fields. The field numbers are ONNX's
(``onnx/onnx.proto``; ``tests/storage/test_onnxwire.py`` checks them against ``onnx``'s own descriptors).

Example:
    >>> import tempfile, onnx
    >>> from onnx import helper
    >>> x, y = (helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["n", 4]) for n in "xy")
    >>> path = tempfile.mktemp(suffix=".onnx")
    >>> onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])), path)
    >>> declared_outputs(path)
    {'y': (None, 4)}
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

__all__ = ["FIELDS", "declared_outputs"]

#: (message, field) -> field number, as ``onnx.proto`` numbers them.
FIELDS = {("ModelProto", "graph"): 7, ("GraphProto", "output"): 12, ("ValueInfoProto", "name"): 1,
          ("ValueInfoProto", "type"): 2, ("TypeProto", "tensor_type"): 1, ("TypeProto.Tensor", "shape"): 2,
          ("TensorShapeProto", "dim"): 1, ("TensorShapeProto.Dimension", "dim_value"): 1}

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


def declared_outputs(path: str | os.PathLike[str]) -> dict[str, tuple[int | None, ...] | None]:
    """{output name: the dims the model file ``path`` declares (None where dynamic), or None when it declares no
    tensor shape}. Raises ``ValueError`` for a file that is not a serialized model (``OSError`` when unreadable).
    """
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise ValueError(f"{path} is empty")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                return dict(_output(data, start, end)
                            for graph_start, graph_end in _fields(data, 0, len(data), FIELDS["ModelProto", "graph"])
                            for start, end in _fields(data, graph_start, graph_end, FIELDS["GraphProto", "output"]))
            except IndexError as exc:  # a varint running past the end
                raise ValueError(f"{path} is not a serialized ONNX model: it ends inside a field") from exc


def _output(data: mmap.mmap, start: int, end: int) -> tuple[str, tuple[int | None, ...] | None]:
    """(name, dims) of the ``ValueInfoProto`` at ``data[start:end]``."""
    names = [data[s:e] for s, e in _fields(data, start, end, FIELDS["ValueInfoProto", "name"])]
    name = names[-1].decode("utf-8", errors="surrogateescape") if names else ""
    dims: tuple[int | None, ...] | None = None
    for type_start, type_end in _fields(data, start, end, FIELDS["ValueInfoProto", "type"]):
        for tensor_start, tensor_end in _fields(data, type_start, type_end, FIELDS["TypeProto", "tensor_type"]):
            for shape_start, shape_end in _fields(data, tensor_start, tensor_end, FIELDS["TypeProto.Tensor", "shape"]):
                dims = tuple(_dim(data, s, e) for s, e in _fields(data, shape_start, shape_end,
                                                                  FIELDS["TensorShapeProto", "dim"]))
    return name, dims


def _dim(data: mmap.mmap, start: int, end: int) -> int | None:
    """A ``Dimension``'s ``dim_value`` (None for a ``dim_param``, an unset or a negative one)."""
    value = None
    at = start
    while at < end:
        key, at = _varint(data, at)
        if key == FIELDS["TensorShapeProto.Dimension", "dim_value"] << 3 | _VARINT:
            value, at = _varint(data, at)
            value = None if value >= 1 << 63 else value  # an int64 below zero: not a size
        else:
            at = _skip(data, key, at)
    return value


def _varint(data: mmap.mmap, at: int) -> tuple[int, int]:
    """The varint at ``data[at]`` and the offset after it."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError(f"a varint longer than 10 bytes at offset {at}")


def _skip(data: mmap.mmap, key: int, at: int) -> int:
    """The offset after the value of the field ``key`` that starts at ``at``."""
    wire = key & 7
    if wire == _VARINT:
        return _varint(data, at)[1]
    if wire in (_FIXED64, _FIXED32):
        return at + (8 if wire == _FIXED64 else 4)
    if wire == _LENGTH_DELIMITED:
        length, at = _varint(data, at)
        return at + length
    raise ValueError(f"wire type {wire} at offset {at}: not a protobuf message")


def _fields(data: mmap.mmap, start: int, end: int, number: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each length-delimited entry of field ``number`` in the message ``data[start:end]``;
    every other field is stepped over by its length, never parsed."""
    at = start
    while at < end:
        key, at = _varint(data, at)
        if key >> 3 == number and key & 7 == _LENGTH_DELIMITED:
            length, at = _varint(data, at)
            if at + length > end:
                raise ValueError(f"a field of {length} bytes at offset {at} runs past the end of its message")
            yield at, at + length
            at += length
        else:
            at = _skip(data, key, at)
    if at != end:
        raise ValueError("a field runs past the end of its message: truncated")
