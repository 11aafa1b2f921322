"""ONNX values in memory and on disk: every tensor element type, sequences and optionals.

In memory a value is what ONNX Runtime and ``onnx.reference`` take and give:

* a tensor is a numpy array; the element types numpy lacks (bfloat16, the float8 types, int4/uint4,
  int2/uint2, float4) are `ml_dtypes <https://github.com/jax-ml/ml_dtypes>`_ arrays, as in ``onnx`` itself,
  and strings are ``object`` arrays of ``str``;
* a sequence is a Python ``list`` of values; an empty optional is ``None`` (a present one is its value).

On disk every tensor is stored as numpy reads it without pickles and without ``ml_dtypes``: the types
numpy lacks as their raw bits (``uint16`` for bfloat16, one ``uint8`` per float8 or float4 element) or
their integer values (one ``int8``/``uint8`` per int4/int2 element), strings as a unicode array, and the
entry names the ONNX element type. An entry says where the raw array is: an ``offset`` in a run's packed
data file (the worker's output folders and the activation store, :mod:`graphbisect.storage.packfile`) or a
``file`` (a member of ``inputs.npz`` in work folders and bundles, described in its ``__values__.json``;
the per-tensor ``.npy`` files of stores written before the packed layout)::

    {"offset": 4096, "dtype": "<u2", "shape": [3, 4], "elem_type": 16, "onnx_type": "BFLOAT16"}
    {"file": "0.npy", "dtype": "<f4", "shape": [3, 4]}
    {"sequence": [{"offset": 4160, "dtype": "<f4", "shape": [2]}, ...]}
    {"optional": null}                                  # an empty optional

A plain tensor's entry is what it always was (``file``/``offset``, ``dtype``, ``shape``), so older stores
read as before, and a script that has only numpy (``repro.py``) decodes the rest from ``elem_type``.

This module imports only the standard library and numpy (``ml_dtypes`` lazily, to decode), so backend
workers under another interpreter can use it.

Example:
    >>> entry = storage_entry(np.array(["a", "bc"], dtype=object))
    >>> entry["onnx_type"], entry["dtype"]
    ('STRING', '<U2')
"""

from __future__ import annotations

import functools
import json
import math
import pickle
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from graphbisect.errors import GraphBisectError, InputError
from graphbisect.storage.npzguard import MEMBER_ERRORS, damaged_stream, member_unreadable, npz_refusal

__all__ = [
    "EXTENSION_TYPES",
    "ElemType",
    "NpzDamaged",
    "NpzRefused",
    "as_elem_type",
    "bit_identical",
    "comparable",
    "declared_dtypes",
    "decode_tensor",
    "dtype_elem_type",
    "elem_type_name",
    "elem_type_of",
    "encode_tensor",
    "entry_files",
    "entry_nbytes",
    "from_raw_bytes",
    "is_exact",
    "is_native",
    "load_npy",
    "load_values_npz",
    "numpy_dtype",
    "pack",
    "raw_bytes",
    "read_value",
    "save_values_npz",
    "storage_entry",
    "to_memory",
    "unpack",
    "write_value",
]

#: The member of an ``.npz`` that describes values a plain ``.npy`` cannot (absent when every value is plain).
NPZ_MANIFEST = "__values__.json"

STRING = 8


@dataclass(frozen=True)
class ElemType:
    """An ONNX element type that numpy lacks: its ``ml_dtypes`` name and how it is stored in a ``.npy``.

    ``bits``: the raw bits are stored (floats: every value, NaN payloads included, survives);
    otherwise the integer *values* are stored one per byte (int4/int2 have no portable bit layout in numpy).
    """

    code: int
    onnx_name: str
    ml_name: str
    storage: str
    bits: bool


#: ONNX element type code → how it is held (the types numpy has natively are not listed).
EXTENSION_TYPES: dict[int, ElemType] = {t.code: t for t in (
    ElemType(16, "BFLOAT16", "bfloat16", "<u2", True),
    ElemType(17, "FLOAT8E4M3FN", "float8_e4m3fn", "|u1", True),
    ElemType(18, "FLOAT8E4M3FNUZ", "float8_e4m3fnuz", "|u1", True),
    ElemType(19, "FLOAT8E5M2", "float8_e5m2", "|u1", True),
    ElemType(20, "FLOAT8E5M2FNUZ", "float8_e5m2fnuz", "|u1", True),
    ElemType(21, "UINT4", "uint4", "|u1", False),
    ElemType(22, "INT4", "int4", "|i1", False),
    ElemType(23, "FLOAT4E2M1", "float4_e2m1fn", "|u1", True),
    ElemType(24, "FLOAT8E8M0", "float8_e8m0fnu", "|u1", True),
    ElemType(25, "UINT2", "uint2", "|u1", False),
    ElemType(26, "INT2", "int2", "|i1", False),
)}
_BY_ML_NAME = {t.ml_name: t for t in EXTENSION_TYPES.values()}
# onnx < 1.18 represents these types as structured dtypes with one named field (onnx._custom_element_types).
_BY_ONNX_FIELD = {"bfloat16": 16, "e4m3fn": 17, "e4m3fnuz": 18, "e5m2": 19, "e5m2fnuz": 20, "uint4": 21,
                  "int4": 22, "float4e2m1": 23, "int2": 26, "uint2": 25}
_NATIVE = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "object",
           9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128"}


def _ml_dtypes() -> Any:
    try:
        import ml_dtypes
    except ImportError as exc:
        raise GraphBisectError(
            "tensors of type bfloat16, float8, float4, int4 or int2 need the ml_dtypes package, which is not "
            "installed in this Python environment",
            hint="pip install ml_dtypes (onnx itself uses it)",
        ) from exc
    return ml_dtypes


def numpy_dtype(elem_type: int) -> np.dtype:
    """The in-memory dtype of ONNX element type ``elem_type`` (``ml_dtypes`` for the types numpy lacks).

    Example:
        >>> numpy_dtype(1), numpy_dtype(16).name, numpy_dtype(8)
        (dtype('float32'), 'bfloat16', dtype('O'))
    """
    if elem_type in _NATIVE:
        return np.dtype(_NATIVE[elem_type])
    ext = EXTENSION_TYPES.get(elem_type)
    if ext is None:
        raise KeyError(f"ONNX element type {elem_type} is not known to graphbisect")
    ml_dtypes = _ml_dtypes()
    if not hasattr(ml_dtypes, ext.ml_name):
        raise GraphBisectError(
            f"ONNX element type {ext.onnx_name} needs ml_dtypes.{ext.ml_name}, which ml_dtypes "
            f"{getattr(ml_dtypes, '__version__', '?')} lacks", hint="upgrade ml_dtypes")
    return np.dtype(getattr(ml_dtypes, ext.ml_name))


def _extension(dtype: np.dtype) -> ElemType | None:
    """The extension type an ``ml_dtypes`` dtype is (by name: float8_e5m2's kind is "f", the others' "V").

    numpy's own types (``isbuiltin == 1``) are answered at once: ``dtype.name`` is slow, and a layerwise
    comparison asks this for every tensor it compares."""
    if dtype.isbuiltin == 1:
        return None
    return _BY_ML_NAME.get(dtype.name) if dtype.names is None and dtype.kind in "Vf" else None


def declared_dtypes(proto: Any) -> dict[str, str]:
    """{input name: the dtype its value must have, as :func:`graphbisect.storage.npzguard.dtype_text` names it} for each
    tensor input the ONNX ``ModelProto`` declares with an element type graphbisect knows.

    Example:
        >>> from onnx import TensorProto, helper
        >>> x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])
        >>> declared_dtypes(helper.make_model(helper.make_graph([], "g", [x], [x])))
        {'x': 'bfloat16'}
    """
    found: dict[str, str] = {}
    for value in proto.graph.input:
        code = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        if code == STRING:
            found[value.name] = "string"
        elif code in _NATIVE:
            found[value.name] = np.dtype(_NATIVE[code]).name
        elif code in EXTENSION_TYPES:
            found[value.name] = EXTENSION_TYPES[code].ml_name
    return found


def elem_type_of(array: np.ndarray) -> int | None:
    """The ONNX element type an in-memory array holds (None for dtypes ONNX has no type for).

    Example:
        >>> elem_type_of(np.zeros(2, np.float32)), elem_type_of(np.array(["a"], dtype=object))
        (1, 8)
    """
    return dtype_elem_type(array.dtype)


@functools.lru_cache(maxsize=256)
def dtype_elem_type(dtype: np.dtype) -> int | None:
    """:func:`elem_type_of` of an array of ``dtype``, remembered per dtype: it compares ``dtype`` with every
    native type's (several µs), and every value written to a store, an output run or a feed asks it."""
    ext = _extension(dtype)
    if ext is not None:
        return ext.code
    if dtype.names and len(dtype.names) == 1 and dtype.names[0] in _BY_ONNX_FIELD:
        return _BY_ONNX_FIELD[dtype.names[0]]
    if dtype.kind in "OUS":
        return STRING
    for code, name in _NATIVE.items():
        if code != STRING and dtype == np.dtype(name):
            return code
    return None


@functools.lru_cache(maxsize=256)
def is_native(dtype: np.dtype) -> bool:
    """Whether a tensor of ``dtype`` is stored as itself (:func:`encode_tensor` returns it unchanged, with
    no element type to record): a numpy type ONNX has natively, strings excepted.

    Example:
        >>> is_native(np.dtype(np.float32)), is_native(numpy_dtype(17)), is_native(np.dtype(object))
        (True, False, False)
    """
    code = dtype_elem_type(dtype)
    return code is not None and code != STRING and code not in EXTENSION_TYPES and dtype.names is None


def encode_tensor(array: np.ndarray) -> tuple[np.ndarray, int | None]:
    """``array`` as something ``np.save`` writes without pickles, plus the ONNX element type to record
    (None when the stored array *is* the value: every type numpy has natively, strings excepted).

    Example:
        >>> raw, code = encode_tensor(np.zeros(2, numpy_dtype(17)))
        >>> raw.dtype, code
        (dtype('uint8'), 17)
    """
    array = np.asarray(array)
    code = elem_type_of(array)
    if code == STRING:
        if array.dtype.kind == "S":  # bytes: as UTF-8 (astype(str) reads ASCII: a UnicodeDecodeError, exit 3)
            try:
                return np.char.decode(array, "utf-8"), STRING
            except UnicodeDecodeError as exc:
                raise GraphBisectError(f"a string tensor holds bytes that are not UTF-8: {exc}",
                                       hint="give str elements, or bytes in UTF-8") from exc
        try:
            return array.astype(np.str_), STRING
        except (TypeError, ValueError) as exc:
            raise GraphBisectError("a string tensor holds values that are not strings",
                                   hint="give str (or bytes) elements") from exc
    ext = EXTENSION_TYPES.get(code) if code is not None else None
    if ext is None:
        if array.dtype.kind == "O":
            raise GraphBisectError(f"cannot store an object array of {type(array.flat[0]).__name__}"
                                   if array.size else "cannot store an empty object array without a type",
                                   hint="give numeric, boolean or string tensors")
        return array, None
    if array.dtype.names:  # onnx < 1.18's structured form: the field holds the bits or the values
        return np.asarray(array, order="C").view(np.dtype(ext.storage)), code
    if ext.bits:
        return np.asarray(array, order="C").view(np.dtype(ext.storage)), code
    return array.astype(np.dtype(ext.storage)), code


def decode_tensor(raw: np.ndarray, elem_type: int | None) -> np.ndarray:
    """The in-memory tensor that ``raw`` (as stored by :func:`encode_tensor`) holds."""
    if elem_type is None:
        return raw
    if elem_type == STRING:
        return raw.astype(object)
    ext = EXTENSION_TYPES.get(elem_type)
    if ext is None:
        return raw
    dtype = numpy_dtype(elem_type)
    if ext.bits:
        return raw.view(dtype)
    return raw.astype(dtype)


def sub_byte_bits(ext: ElemType) -> int:
    """Bits per element of a packed type (4 for int4/uint4/float4, 2 for int2/uint2), 0 when not packed."""
    return 4 if ext.code in (21, 22, 23) else 2 if ext.code in (25, 26) else 0


def pack(array: np.ndarray) -> np.ndarray:
    """The packed bytes (``uint8``, first element in the lowest bits) of a 4- or 2-bit tensor, as ONNX
    and ONNX Runtime hold them.

    Example:
        >>> pack(decode_tensor(np.array([1, -2, 3], np.int8), 22)).tolist()
        [225, 3]
    """
    code = elem_type_of(array)
    ext = EXTENSION_TYPES[code] if code is not None else None
    width = sub_byte_bits(ext) if ext is not None else 0
    if not width:
        raise ValueError(f"{array.dtype} is not a packed type")
    raw, _ = encode_tensor(array)
    per_byte = 8 // width
    bits = raw.reshape(-1).view(np.uint8) & ((1 << width) - 1)
    padded = np.zeros(-(-bits.size // per_byte) * per_byte, np.uint8)
    padded[:bits.size] = bits
    lanes = padded.reshape(-1, per_byte)
    packed = np.zeros(lanes.shape[0], np.uint8)
    for lane in range(per_byte):
        packed |= lanes[:, lane] << np.uint8(lane * width)
    return packed


def unpack(packed: np.ndarray, elem_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor of ONNX type ``elem_type`` and ``shape`` whose packed bytes are ``packed`` (see :func:`pack`)."""
    ext = EXTENSION_TYPES[elem_type]
    width = sub_byte_bits(ext)
    count = int(np.prod(shape, dtype=np.int64))
    data = np.asarray(packed, dtype=np.uint8).reshape(-1)
    lanes = [(data >> np.uint8(lane * width)) & np.uint8((1 << width) - 1) for lane in range(8 // width)]
    bits = np.stack(lanes, axis=-1).reshape(-1)[:count]
    if ext.bits:
        return bits.view(numpy_dtype(elem_type)).reshape(shape)
    values = bits.astype(np.int8)
    if np.dtype(ext.storage).kind == "i":  # sign-extend
        values = (values ^ (1 << (width - 1))) - (1 << (width - 1))
    return values.astype(numpy_dtype(elem_type)).reshape(shape)


def raw_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes (``uint8``, 1-d) of a tensor of a type numpy lacks as ONNX, ONNX Runtime and OpenVINO hold it
    in memory: the raw bits, the 4- and 2-bit types packed (:func:`pack`).

    Example:
        >>> raw_bytes(np.array([1.0], numpy_dtype(16))).tolist()   # bfloat16 1.0 is 0x3f80, little-endian
        [128, 63]
    """
    code = elem_type_of(array)
    ext = EXTENSION_TYPES.get(code) if code is not None else None
    if ext is None:
        raise ValueError(f"{array.dtype} is not a type numpy lacks")
    if sub_byte_bits(ext):
        return pack(array)
    return np.ascontiguousarray(encode_tensor(array)[0]).reshape(-1).view(np.uint8)


def from_raw_bytes(data: np.ndarray, elem_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor of ONNX type ``elem_type`` and ``shape`` held in ``data`` (bytes as :func:`raw_bytes` gives)."""
    ext = EXTENSION_TYPES[elem_type]
    data = np.asarray(data).reshape(-1).view(np.uint8)
    if sub_byte_bits(ext):
        return unpack(data, elem_type, shape)
    return decode_tensor(data.view(np.dtype(ext.storage)).reshape(shape), elem_type)


def to_memory(value: Any) -> Any:
    """``value`` in graphbisect's in-memory form: onnx < 1.18's structured dtypes become ``ml_dtypes``.

    Backends call this on what their library returns; lists (sequences) and ``None`` (empty optionals)
    are kept.
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [to_memory(item) for item in value]
    array = np.asarray(value)
    if array.dtype.names:
        raw, code = encode_tensor(array)
        return decode_tensor(raw, code)
    return array


def as_elem_type(array: np.ndarray, elem_type: int) -> np.ndarray:
    """``array`` read as ONNX type ``elem_type`` where its storage shows it holds that type; else unchanged
    (a caller's dtype check then names the mismatch).

    Read as the type: onnx < 1.18's structured dtypes; unicode/bytes arrays for strings; ``np.save``'s
    ``V1``/``V2`` form of an ``ml_dtypes`` array; the storage integer of bfloat16/float8 (raw bits: onnx
    1.17 holds bfloat16 as ``uint16`` and its node tests store bfloat16 inputs as UINT16 tensors); integer
    values for int4/int2 (onnx 1.17's reference returns QuantizeLinear's int4 output as ``int8``).

    Example:
        >>> as_elem_type(np.array([16256], np.uint16), 16).tolist()
        [1.0]
    """
    if elem_type == STRING:
        return array.astype(object) if array.dtype.kind in "US" else array
    if elem_type_of(array) == elem_type:
        return array
    if array.dtype.names:
        return np.asarray(to_memory(array))
    ext = EXTENSION_TYPES.get(elem_type)
    if ext is None:
        return array
    storage = np.dtype(ext.storage)
    if array.dtype.kind == "V" and array.dtype.itemsize == storage.itemsize:
        return array.view(numpy_dtype(elem_type))
    if ext.bits and array.dtype == storage:
        return decode_tensor(array, elem_type)
    if not ext.bits and array.dtype.kind in "iu":
        return decode_tensor(array.astype(storage), elem_type)
    return array


def is_exact(array: np.ndarray) -> bool:
    """Whether values of this dtype compare exactly (integers of any width, bool, strings)."""
    dtype = array.dtype
    if dtype.kind in "biuOUS":
        return True
    ext = _extension(dtype)
    return ext is not None and not ext.bits


def comparable(array: np.ndarray) -> np.ndarray:
    """A numpy-native view of ``array`` for arithmetic comparison: extension floats → float32, int4 → int8.
    Strings and numpy's own types (complex too: compared per complex element) are returned as they are."""
    dtype = array.dtype
    ext = _extension(dtype)
    if ext is not None:
        return array.astype(np.float32 if ext.bits else np.int16)
    return array


# ------------------------------------------------------------------------------------------ entries
ArrayWriter = Callable[[str, np.ndarray], Mapping[str, Any]]
ArrayReader = Callable[[Mapping[str, Any]], np.ndarray]


def elem_type_name(code: int) -> str:
    """The ONNX name of a stored element type: ``STRING`` or one of :data:`EXTENSION_TYPES`."""
    return "STRING" if code == STRING else EXTENSION_TYPES[code].onnx_name


def storage_entry(array: np.ndarray, file: str = "") -> dict[str, Any]:
    """The manifest entry describing ``array`` stored in ``file`` (see the module docstring)."""
    return write_value(array, file.removesuffix(".npy"), lambda name, _raw: {"file": name})


def write_value(value: Any, stem: str, write: ArrayWriter) -> dict[str, Any]:
    """Write ``value`` (tensor, list, None) through ``write(file, raw_array)``; return its manifest entry.

    ``write`` returns where the array went: ``{"file": file}`` for a member of an ``.npz``, ``{"offset": n}``
    in a packed data file (:mod:`graphbisect.storage.packfile`). Files are named ``<stem>.npy``, sequence items
    ``<stem>.<i>.npy`` (recursively).
    """
    if value is None:
        return {"optional": None}
    if isinstance(value, (list, tuple)):
        return {"sequence": [write_value(item, f"{stem}.{i}", write) for i, item in enumerate(value)]}
    raw, code = encode_tensor(np.asarray(value))
    where = write(f"{stem}.npy", np.asarray(raw, order="C"))
    entry: dict[str, Any] = {**where, "dtype": raw.dtype.str, "shape": list(raw.shape)}
    if code is not None:
        entry["elem_type"] = code
        entry["onnx_type"] = elem_type_name(code)
    return entry


def read_value(entry: Mapping[str, Any], read: ArrayReader) -> Any:
    """The value a manifest entry describes; ``read(tensor_entry)`` returns the stored raw array."""
    if "sequence" in entry:
        return [read_value(item, read) for item in entry["sequence"]]
    if "optional" in entry:
        inner = entry["optional"]
        return None if inner is None else read_value(inner, read)
    raw = read(entry)
    return decode_tensor(raw, entry.get("elem_type"))


def entry_files(entry: Mapping[str, Any]) -> list[str]:
    """Every file a manifest entry's value is stored in (none for a packed entry, which has an ``offset``)."""
    if "sequence" in entry:
        return [file for item in entry["sequence"] for file in entry_files(item)]
    if "optional" in entry:
        return [] if entry["optional"] is None else entry_files(entry["optional"])
    return [str(entry["file"])] if "file" in entry else []


def entry_nbytes(entry: Mapping[str, Any]) -> int:
    """Bytes of data a manifest entry's value holds on disk."""
    if "sequence" in entry:
        return sum(entry_nbytes(item) for item in entry["sequence"])
    if "optional" in entry:
        return 0 if entry["optional"] is None else entry_nbytes(entry["optional"])
    return _itemsize(entry["dtype"]) * math.prod(int(dim) for dim in entry["shape"])


@functools.lru_cache(maxsize=256)
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def bit_identical(a: Any, b: Any) -> bool:
    """Whether two values (tensors, sequences as lists, ``None`` for an empty optional) are the same bit for
    bit: same kind, dtype, shape and bytes — NaN payloads and the sign of zero included (string tensors by
    value). Two runs of the same kernels on the same machine return bit-identical values.

    Example:
        >>> bit_identical(np.float32([0.0, 1.0]), np.float32([-0.0, 1.0])), bit_identical([np.ones(2)], [np.ones(2)])
        (False, True)
    """
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) \
            and all(bit_identical(x, y) for x, y in zip(a, b, strict=True))
    x, y = np.asarray(a), np.asarray(b)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if x.dtype.kind in "OUS":
        return bool(np.array_equal(x, y))
    return x.tobytes() == y.tobytes()


# ---------------------------------------------------------------------------------------------- npz
def save_values_npz(path: str | Path, values: Mapping[str, Any]) -> Path:
    """Write ``values`` to an ``.npz`` (not atomically: callers write to a temporary path).

    Plain tensors are members ``<name>.npy`` exactly as ``np.savez`` writes them; the rest are stored raw
    and described in the member ``__values__.json`` (see the module docstring), written only when needed.
    """
    path = Path(path)
    entries: dict[str, Any] = {}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        def write(file: str, array: np.ndarray) -> dict[str, Any]:
            with archive.open(file, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
            return {"file": file}

        for index, (name, value) in enumerate(values.items()):
            if isinstance(value, (list, tuple)) or value is None:
                entries[name] = write_value(value, f"__value_{index}", write)
            else:
                array = np.asarray(value)
                entry = write_value(array, name, write)
                if "elem_type" in entry:
                    entries[name] = entry
        if entries:
            archive.writestr(NPZ_MANIFEST, json.dumps({"version": 1, "values": entries}, indent=1))
    return path


class _StringsUnpickler(pickle.Unpickler):
    """Unpickles numpy's object arrays and nothing else: the only globals are those an ``ndarray`` pickle names,
    so a pickle of anything else (code to run) is refused before it runs; the items are checked after."""

    _ARRAY = frozenset({("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
                        ("numpy", "ndarray"), ("numpy", "dtype")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ARRAY:
            raise pickle.UnpicklingError(f"{module}.{name}")
        return super().find_class(module, name)


_SAVE_STRINGS = "save strings as a string array, not objects: np.savez('inputs.npz', name=np.array(values, dtype=str))"


def _object_strings(stream: IO[bytes], what: str) -> np.ndarray:
    """The object array of ``str`` an ``.npy`` ``stream`` holds (a pickle, as ``np.save`` writes one); anything else
    is refused with :data:`_SAVE_STRINGS`, never unpickled beyond an array's own parts."""
    version = np.lib.format.read_magic(stream)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    header(stream)
    try:
        array = _StringsUnpickler(stream).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise InputError(f"{what} is a pickled object array that is not an array of strings ({exc})",
                         hint=_SAVE_STRINGS) from exc
    kinds = sorted({type(item).__name__ for item in np.asarray(array, dtype=object).flat} - {"str"})
    if not isinstance(array, np.ndarray) or array.dtype != object or kinds:
        raise InputError(f"{what} is an object array holding {', '.join(kinds) or type(array).__name__}, not only "
                         "strings", hint=_SAVE_STRINGS)
    return array


def load_npy(path: str | Path) -> np.ndarray:
    """One ``.npy`` array, no pickles but an object array of ``str`` (:func:`load_values_npz`)."""
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" not in str(exc):
            raise
    with open(path, "rb") as stream:
        return _object_strings(stream, str(path))


def load_values_npz(path: str | Path, declared: Mapping[str, Sequence[int | None] | None] | None = None,
                    ) -> dict[str, Any]:
    """Read every value of an ``.npz`` written by :func:`save_values_npz` (or ``np.savez``), no pickles: an object
    array of ``str`` (``np.array(["a", "b"], dtype=object)``, as pandas and tokenizers give strings) is read by
    an unpickler that knows only an array's parts, and any other object array is refused saying how to save it.

    Limits first (:func:`graphbisect.storage.npzguard.npz_refusal`): before anything is decompressed, the members'
    number, their ``.npy`` headers against ``declared`` (value name -> the model's dims, None where dynamic;
    pass it where the model is known) and their total against the memory available; raises
    :class:`~graphbisect.errors.InputError` (:class:`NpzRefused`) naming the file and the member.
    """
    refusal = npz_refusal(path, declared)
    if refusal is not None:
        raise NpzRefused(f"{path}: {refusal} (refused before decompressing it)",
                         hint="pass values of the shapes the model declares; a file sent by someone else may be "
                         "a decompression bomb")
    reading = "its zip directory"
    try:
        with np.load(path, allow_pickle=False) as loaded:
            for info in loaded.zip.infolist():  # encrypted, another method: said before reading any
                if (problem := member_unreadable(info)) is not None:
                    raise NpzDamaged(f"{path}: {problem}", hint=_DAMAGED_HINT)
            data = _StringMembers(loaded, str(path))
            described: dict[str, Any] = {}
            if NPZ_MANIFEST in data.files:
                reading = f"member {NPZ_MANIFEST!r}"
                described = _manifest_values(json.loads(data[NPZ_MANIFEST]), path)
            members = {f"{key}.npy": key for key in data.files}
            hidden = {file for entry in described.values() for file in entry_files(entry)}

            def member(key: str) -> Any:
                nonlocal reading
                reading = f"member {key + '.npy'!r}"
                return data[key]

            def read(entry: Mapping[str, Any]) -> np.ndarray:
                return np.asarray(member(members[str(entry["file"])]))

            result: dict[str, Any] = {}
            for key in data.files:
                if key == NPZ_MANIFEST or (f"{key}.npy" in hidden and key not in described):
                    continue
                result[key] = read_value(described[key], read) if key in described else member(key)
            for name, entry in described.items():
                if name not in result:
                    result[name] = read_value(entry, read)
            return result
    except (*MEMBER_ERRORS, OSError) as exc:  # a wrong CRC, a cut stream: a BadZipFile was "a graphbisect bug"
        if not damaged_stream(exc):
            raise
        raise NpzDamaged(f"{path}: {reading} cannot be read: {type(exc).__name__}: {exc}",
                         hint=_DAMAGED_HINT) from exc


def _manifest_values(manifest: Any, path: object) -> dict[str, Any]:
    """The ``values`` object of an ``.npz``'s manifest: value name -> its entry (a JSON object); raises
    :class:`NpzDamaged` for any other shape (a number there was "a graphbisect bug": the bundle fuzzer)."""
    values = manifest.get("values") if isinstance(manifest, dict) else None
    if not isinstance(values, dict) or not all(isinstance(entry, dict) for entry in values.values()):
        raise NpzDamaged(f"{path}: member {NPZ_MANIFEST!r} is not graphbisect's manifest (an object whose 'values' "
                         "maps each value's name to an object)", hint=_DAMAGED_HINT)
    return values


_DAMAGED_HINT = "the file is damaged: copy it again, or write it again (numpy.savez)"


class NpzRefused(InputError):
    """An ``.npz`` refused before it is read: too many members, a member larger than the value it names may be,
    or more than the memory available (:mod:`graphbisect.storage.npzguard`)."""


class NpzDamaged(InputError):
    """An ``.npz`` whose member cannot be read: encrypted, compressed with a method zipfile does not read, a
    wrong CRC or a cut stream (:data:`graphbisect.storage.npzguard.MEMBER_ERRORS`)."""


class _StringMembers:
    """An open ``.npz`` whose object-array members are read by :func:`_object_strings`."""

    def __init__(self, data: Any, path: str) -> None:
        self.data, self.path, self.files = data, path, data.files

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def __getitem__(self, key: str) -> Any:
        try:
            return self.data[key]
        except ValueError as exc:
            if "allow_pickle" not in str(exc):
                raise
        with self.data.zip.open(f"{key}.npy") as stream:
            return _object_strings(stream, f"{key!r} in {self.path}")
