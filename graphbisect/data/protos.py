"""ONNX protos ↔ in-memory values, for every element type, sequences and optionals.

``onnx.numpy_helper`` answers differently per onnx release for the types numpy lacks (onnx 1.17 returns
bfloat16 as plain ``uint16``, float8 and int4 as structured dtypes; onnx ≥ 1.18 returns ``ml_dtypes``
arrays), so every conversion goes through here and yields graphbisect's in-memory form
(:mod:`graphbisect.storage.values`): ``ml_dtypes`` arrays, ``object`` arrays of ``str``, lists for sequences,
``None`` for an empty optional.

Example:
    >>> t = onnx.helper.make_tensor("x", onnx.TensorProto.BFLOAT16, [2], [1.5, -2.0])
    >>> array_from_tensor(t).dtype.name
    'bfloat16'
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphbisect.errors import InputError
from graphbisect.storage.values import (
    EXTENSION_TYPES,
    decode_tensor,
    elem_type_of,
    encode_tensor,
    pack,
    sub_byte_bits,
    unpack,
)

__all__ = ["array_from_tensor", "parse_value", "tensor_from_array", "value_from_proto"]

logger = logging.getLogger(__name__)


def array_from_tensor(tensor: onnx.TensorProto) -> np.ndarray:
    """The in-memory array of ``tensor`` (its data must be inline).

    For the types numpy lacks, the stored bits are read here and typed with ``ml_dtypes``: onnx 1.17's
    ``to_array`` reads a BFLOAT16 tensor's ``raw_data`` as zeros and returns it untyped.
    """
    ext = EXTENSION_TYPES.get(tensor.data_type)
    if ext is None:
        return numpy_helper.to_array(tensor)
    shape = tuple(tensor.dims)
    if tensor.HasField("raw_data"):
        stored = np.frombuffer(tensor.raw_data, dtype=np.uint8)
        if not sub_byte_bits(ext):
            stored = stored.view(np.dtype(ext.storage))
    else:  # int32_data: one element's bits per entry, or one packed byte per entry
        stored = np.asarray(tensor.int32_data, dtype=np.int64).astype(np.uint8 if sub_byte_bits(ext) else
                                                                        np.dtype(ext.storage).newbyteorder("="))
    if sub_byte_bits(ext):
        return unpack(stored, ext.code, shape)
    return decode_tensor(np.asarray(stored.astype(np.dtype(ext.storage).newbyteorder("=")), order="C"), ext.code
                         ).reshape(shape)


def tensor_from_array(array: np.ndarray, name: str) -> onnx.TensorProto:
    """A ``TensorProto`` named ``name`` holding ``array`` (any in-memory type, ``ml_dtypes`` included)."""
    array = np.asarray(array)
    code = elem_type_of(array)
    ext = EXTENSION_TYPES.get(code) if code is not None else None
    if ext is None:
        return numpy_helper.from_array(np.asarray(array, order="C"), name)  # 0-d stays 0-d
    if not sub_byte_bits(ext):
        raw, _ = encode_tensor(array)
        return onnx.helper.make_tensor(name, ext.code, list(array.shape), raw.tobytes(), raw=True)
    tensor = onnx.TensorProto(name=name, data_type=ext.code, dims=list(array.shape))
    tensor.raw_data = pack(array).tobytes()  # 4-bit and 2-bit types: packed, first element in the low bits
    return tensor


def value_from_proto(proto: onnx.TensorProto | onnx.SequenceProto | onnx.OptionalProto,
                     prepare: Callable[[onnx.TensorProto], None] | None = None) -> Any:
    """The in-memory value of a tensor, sequence or optional proto; ``prepare`` is called on every tensor
    first (e.g. to read its external data)."""
    if isinstance(proto, onnx.TensorProto):
        if prepare is not None:
            prepare(proto)
        return array_from_tensor(proto)
    if isinstance(proto, onnx.SequenceProto):
        kinds: dict[int, Any] = {onnx.SequenceProto.TENSOR: proto.tensor_values,
                                 onnx.SequenceProto.SEQUENCE: proto.sequence_values,
                                 onnx.SequenceProto.OPTIONAL: proto.optional_values}
        items = kinds.get(int(proto.elem_type))
        if items is None:
            raise InputError(f"sequence {proto.name!r} holds elements of kind {proto.elem_type} (maps or "
                             "sparse tensors), which graphbisect cannot feed", hint="use tensor sequences")
        return [value_from_proto(item, prepare) for item in items]
    if proto.elem_type == onnx.OptionalProto.TENSOR:
        return value_from_proto(proto.tensor_value, prepare)
    if proto.elem_type == onnx.OptionalProto.SEQUENCE:
        return value_from_proto(proto.sequence_value, prepare)
    if proto.elem_type == onnx.OptionalProto.OPTIONAL:
        return value_from_proto(proto.optional_value, prepare)
    return None  # UNDEFINED: an empty optional


_PROTO_OF_KIND = {"tensor_type": onnx.TensorProto, "sequence_type": onnx.SequenceProto,
                  "optional_type": onnx.OptionalProto}


def parse_value(data: bytes, type_proto: onnx.TypeProto | None,
                prepare: Callable[[onnx.TensorProto], None] | None = None) -> tuple[str, Any]:
    """Parse serialized ``data`` as the proto the declared ``type_proto`` calls for; return (name, value).

    Without a declared type a ``TensorProto`` is assumed. A tensor proto's field numbers overlap a
    sequence's, so parsing by the declared kind is what keeps a SequenceProto from reading as a garbled tensor.
    """
    kind = type_proto.WhichOneof("value") if type_proto is not None else None
    proto_class = _PROTO_OF_KIND.get(kind or "tensor_type")
    if proto_class is None:
        raise InputError(f"graphbisect cannot feed inputs of ONNX type {kind!r} (maps, sparse tensors)",
                         hint="feed tensors, sequences or optionals")
    proto = proto_class()
    proto.ParseFromString(data)
    return proto.name, value_from_proto(proto, prepare)
