"""Model inputs: load them from files, generate seeded random ones, validate and save them.

Supported input files (:data:`SUPPORTED_FORMATS`):

* ``.npz`` — one array per input name (``arr_0``, ``arr_1``... from ``np.savez(a, b)`` map positionally);
* ``.npy`` — one array, for single-input models;
* ``.pb`` — an ONNX ``TensorProto`` (single-input models, or named after an input), or a folder of
  ``input_0.pb``, ``input_1.pb``... as in ONNX's test data sets (names from the tensors, else positional);
* ``.json`` — Polygraphy's ``--save-inputs`` format (a list of feed dicts whose arrays are encoded as
  ``{"array": <base64 .npy>, "polygraphy_class": "ndarray"}``; the first feed dict is used), or a plain
  ``{"name": nested lists}`` object (values take the input's dtype; one it cannot hold is refused).

Random inputs (:func:`random_inputs`) are reproducible: each input's generator is seeded from ``seed``
and the input's name, so adding or removing another input never changes it.

**Dynamic dimensions are chosen visibly** (:func:`chosen_dims`, :class:`ChosenDim`): a batch-like dimension
nobody gave a size takes the smallest size above 1 that the model's shapes accept (onnx's strict shape
inference, :func:`~graphbisect.model.normalize.shape_conflicts`): 2, else a size the model declares elsewhere
(a keepdims=0 ``ReduceMean`` of ``[N, 16]`` subtracted from its input broadcasts only for N = 16), else 1.
Why not 1: a bug may need more than one row (that LayerNorm fusion computes the same at N = 1 and is wrong at
16), and a PASS at 1 read as "the model passes". Every verdict that passed on chosen sizes says so
(:func:`dims_note`), in ``compare``, ``reduce``, ``passes`` and ``precision`` alike.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import io
import json
import logging
import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from graphbisect.compare.nonfinite import warn_nonfinite_inputs
from graphbisect.data.protos import parse_value
from graphbisect.data.ranges import compared_values
from graphbisect.errors import InputError
from graphbisect.model.graph import Model, TensorType
from graphbisect.model.load import external_data_file
from graphbisect.model.normalize import shape_conflicts
from graphbisect.settings.options import SEED, check_value
from graphbisect.storage.atomic import atomic_path
from graphbisect.storage.npzguard import available_memory, size_text
from graphbisect.storage.values import (
    as_elem_type,
    comparable,
    is_exact,
    load_npy,
    load_values_npz,
    save_values_npz,
    to_memory,
)
from graphbisect.text.printable import plural

__all__ = [
    "SUPPORTED_FORMATS",
    "ChosenDim",
    "chosen_dims",
    "dims_note",
    "index_bounds",
    "load_inputs",
    "parse_shapes",
    "random_input_notes",
    "random_inputs",
    "save_inputs",
    "validate_inputs",
]

logger = logging.getLogger(__name__)

SUPPORTED_FORMATS = ".npz, .npy, .pb (ONNX TensorProto), a folder of input_N.pb, .json (Polygraphy or {name: lists})"

#: Integer inputs that are not recognized as indices are drawn from [0, _INT_HIGH).
_INT_HIGH = 10
_BATCH_LIKE = re.compile(r"^(n|b|bs|.*batch.*)$", re.IGNORECASE)
_PB_NAME = re.compile(r"^input_(\d+)\.pb$")
_POLYGRAPHY_MARKERS = ("polygraphy_class", "__polygraphy_encoded_ndarray")


# --- loading ---------------------------------------------------------------------------------------------


def load_inputs(path: str | Path, model: Model) -> dict[str, np.ndarray]:
    """Read the inputs stored at ``path`` for ``model``, validated and in the model's input order.

    Example:
        >>> inputs = load_inputs("inputs.npz", model)     # doctest: +SKIP
        >>> list(inputs) == list(model.input_names)        # doctest: +SKIP
        True
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"inputs file not found: {path}", hint=f"supported formats: {SUPPORTED_FORMATS}")
    reader = _reader_for(path)
    try:
        arrays = reader(path, model)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            f"cannot read inputs from {path}: {type(exc).__name__}: {exc}",
            hint=f"is it a valid {path.suffix or 'input'} file? supported formats: {SUPPORTED_FORMATS}",
        ) from exc
    logger.info("loaded %d input(s) from %s", len(arrays), path)
    return validate_inputs(model, arrays)


def _reader_for(path: Path) -> Any:
    if path.is_dir():
        return _read_pb_folder
    readers = {".npz": _read_npz, ".npy": _read_npy, ".pb": _read_pb_file, ".json": _read_json}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise InputError(
            f"{path}: unsupported inputs file type {path.suffix!r}", hint=f"supported formats: {SUPPORTED_FORMATS}"
        )
    return reader


def _read_npz(path: Path, model: Model) -> dict[str, Any]:
    # before anything is decompressed, each member against the input it names (graphbisect.storage.npzguard)
    arrays = load_values_npz(path, _declared(model))  # plain np.savez files, and graphbisect's own
    positional = [f"arr_{i}" for i in range(len(arrays))]
    if sorted(arrays) == sorted(positional) and not set(arrays) & set(model.input_names):
        return _positional(path, [arrays[key] for key in positional], model)
    return arrays


def _declared(model: Model) -> dict[str, tuple[int | None, ...] | None]:
    """{input name: its declared dims (None where dynamic), or None when its shape is not declared}, the
    positional names ``np.savez(path, a, b)`` writes (``arr_0``...) included."""
    declared: dict[str, tuple[int | None, ...] | None] = {}
    for index, name in enumerate(model.input_names):
        ttype = model.tensor_type(name)
        dims = None if ttype is None or ttype.shape is None else tuple(
            d if isinstance(d, int) and d >= 0 else None for d in ttype.shape)
        declared[name] = dims
        declared.setdefault(f"arr_{index}", dims)
    return declared


def check_allocation(nbytes: int, what: str, hint: str) -> None:
    """Raise :class:`InputError` before allocating ``nbytes`` when the machine does not have them
    (``what`` names the thing and its size): a ``MemoryError`` then was reported as a graphbisect bug."""
    available = available_memory()
    if nbytes > available:
        raise InputError(f"{what}, more than the {_bytes(available)} of memory available here", hint=hint)


#: Bytes for people (``2.0 GB``).
_bytes = size_text


def _read_npy(path: Path, model: Model) -> dict[str, np.ndarray]:
    if len(model.input_names) != 1:
        raise InputError(
            f"{path} holds one array, but the model has {plural(len(model.input_names), 'input')}: "
            f"{', '.join(model.input_names) or '(none)'}",
            hint="save the inputs together by name: np.savez('inputs.npz', **{name: array, ...})",
        )
    return {model.input_names[0]: load_npy(path)}


def _positional(path: Path, arrays: list[np.ndarray], model: Model) -> dict[str, np.ndarray]:
    if len(arrays) > len(model.input_names):
        raise InputError(
            f"{path} holds {len(arrays)} unnamed arrays, but the model has only "
            f"{plural(len(model.input_names), 'input')}: "
            f"{', '.join(model.input_names)}",
            hint="name the arrays after the model's inputs",
        )
    return dict(zip(model.input_names, arrays, strict=False))


def _input_type_proto(model: Model, name: str | None) -> onnx.TypeProto | None:
    for value in model.proto.graph.input:
        if value.name == name:
            return value.type
    return None


def _parse_proto(path: Path, model: Model, name: str | None) -> tuple[str, Any]:
    """Parse ``path`` as the proto the model input ``name`` declares: TensorProto, SequenceProto or OptionalProto."""
    declared = _input_type_proto(model, name)
    try:
        return parse_value(path.read_bytes(), declared, prepare=lambda tensor: _inline_external(tensor, path))
    except InputError:
        raise
    except Exception as exc:
        kind = declared.WhichOneof("value") if declared is not None else "tensor_type"
        proto = {"sequence_type": "SequenceProto", "optional_type": "OptionalProto"}.get(kind or "", "TensorProto")
        raise InputError(
            f"{path} is not an ONNX {proto} file for input {name!r} ({type(exc).__name__}: {exc})",
            hint="write it with onnx.numpy_helper.from_array(array, name).SerializeToString() (tensors), "
            "onnx.numpy_helper.from_list / from_optional (sequences, optionals)",
        ) from exc


def _inline_external(tensor: onnx.TensorProto, path: Path) -> None:
    """Read the external data of a tensor stored in ``path`` into it."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        # Resolved beside the .pb file (not the working folder), never through a link leaving it.
        file = external_data_file(tensor, path, error=InputError)
        if not file.is_file():
            raise InputError(f"{path}: external data of tensor {tensor.name!r} is missing: expected {file}",
                             hint="keep the data file next to the .pb file")
        onnx.external_data_helper.load_external_data_for_tensor(tensor, str(path.parent))
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def _read_pb_file(path: Path, model: Model) -> dict[str, Any]:
    only = model.input_names[0] if len(model.input_names) == 1 else None
    name, value = _parse_proto(path, model, only)
    if name in model.input_names or only is None:
        return {name or "<unnamed tensor>": value}
    return {only: value}


def _read_pb_folder(path: Path, model: Model) -> dict[str, Any]:
    numbered = sorted((int(match.group(1)), file) for file in path.iterdir() if (match := _PB_NAME.match(file.name)))
    if not numbered and not model.input_names:
        return {}  # a model without inputs: ONNX's test data sets for it have no input files
    if not numbered:
        raise InputError(
            f"{path} is a folder without input_0.pb, input_1.pb, ... files",
            hint=f"pass a folder in ONNX test-data layout or a file; supported formats: {SUPPORTED_FORMATS}",
        )
    arrays: dict[str, Any] = {}
    for number, file in numbered:
        positional = model.input_names[number] if number < len(model.input_names) else None
        stored_name, value = _parse_proto(file, model, positional)
        if stored_name in model.input_names and stored_name != positional:
            stored_name, value = _parse_proto(file, model, stored_name)  # named after another input: its type
        if stored_name in model.input_names:
            name = stored_name
        elif positional is not None:
            name = positional
        else:
            raise InputError(
                f"{file}: tensor {stored_name!r} matches no input and the model has only "
                f"{plural(len(model.input_names), 'input')}: {', '.join(model.input_names)}",
                hint="name the tensors after the model's inputs or remove the extra files",
            )
        arrays[name] = value
    return arrays


def _read_json(path: Path, model: Model) -> dict[str, np.ndarray]:
    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):  # 1e999 parsed as inf: a value the user never wrote (issue 24)
            raise InputError(f"{path}: the number {text} is beyond the range of a float64 (it would become "
                             f"{value})", hint="write a number a float64 holds, or save the exact arrays in an .npz")
        return value

    try:
        document = json.loads(path.read_text(encoding="utf-8"), parse_float=finite)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(
            f"{path} is not valid JSON: {exc}", hint="expected Polygraphy's --save-inputs JSON or {name: lists}"
        ) from exc
    if isinstance(document, list):
        if not document or not isinstance(document[0], dict):
            raise InputError(
                f"{path}: expected a list of feed dicts (Polygraphy --save-inputs), got {_json_kind(document)}",
                hint="write [{'input_name': array, ...}] or {'input_name': nested lists}",
            )
        if len(document) > 1:
            logger.warning("%s holds %d feed dicts; using the first", path, len(document))
        document = document[0]
    if not isinstance(document, dict):
        raise InputError(f"{path}: expected a JSON object of inputs, got {_json_kind(document)}")
    return {name: _decode_json_value(path, name, value, model.tensor_type(name)) for name, value in document.items()}


def _json_kind(value: Any) -> str:
    return f"a JSON {type(value).__name__}" if value else "an empty document"


def _decode_json_value(path: Path, name: str, value: Any, ttype: TensorType | None) -> np.ndarray:
    if (
        isinstance(value, dict)
        and "values" in value
        and value.get("polygraphy_class") in ("LazyArray", "LazyNumpyArray")
    ):
        return _decode_json_value(path, name, value["values"], ttype)
    if isinstance(value, dict) and "array" in value:
        return _decode_polygraphy_array(path, name, value["array"])
    if isinstance(value, (list, int, float, bool)):
        return _json_array(path, name, value, ttype)
    raise InputError(
        f"{path}: value of input {name!r} is neither an encoded array nor nested lists",
        hint="write {'name': [[...]]} or save with Polygraphy (polygraphy run --save-inputs)",
    )


def _json_array(path: Path, name: str, value: Any, ttype: TensorType | None) -> np.ndarray:
    """JSON numbers (nested lists) as an array of the input's type, refused where converting changes them.

    JSON has no integer widths, bool-from-int rule or float16, so the values take the input's type; a value that
    type cannot hold (1.7 or 300 for an integer input, 2 for a bool one, 1e6 for float16) was truncated, wrapped,
    read as True or made infinite without a word, and the run fed the model numbers the user never wrote.
    Rounding a decimal to the nearest float is no change: that is the float the text denotes.
    """
    dtype = _dtype_or_none(ttype)
    written = np.asarray(value)
    if dtype is None or dtype.kind == "c" or written.dtype.kind not in "biuf":
        return np.asarray(value, dtype=dtype)  # strings, nulls, integers beyond uint64: numpy's conversion
    with np.errstate(all="ignore"):  # an overflowing or NaN cast is found below, from its result
        try:
            converted = np.asarray(value, dtype=dtype)  # a Python int converts exactly, also beyond 2**53
        except OverflowError:  # a Python int out of the type's range: numpy refuses to wrap it; find it below
            converted = written.astype(dtype)
    exact = np.asarray(value, dtype=object)  # the numbers as written: Python ints, floats and bools
    if is_exact(converted):  # integers and bools: the value itself must survive (1 == 1.0 == True)
        changed = np.asarray(comparable(converted).astype(object) != exact, dtype=bool)
    else:  # floats: rounding is the conversion; becoming inf or NaN is not
        changed = np.isfinite(written.astype(np.float64)) & ~np.isfinite(comparable(converted).astype(np.float64))
    if changed.any():
        where = tuple(int(i) for i in np.argwhere(changed)[0])
        raise InputError(
            f"{path}: input {name!r} ({ttype}) cannot hold the value {exact[where]} at index {list(where)} "
            f"({int(changed.sum())} such value(s)): as {dtype} it would become {converted[where]}",
            hint=f"write values that {dtype} holds, or save the exact arrays: np.savez('inputs.npz', {name}=array)",
        )
    return converted


def _decode_polygraphy_array(path: Path, name: str, encoded: str) -> np.ndarray:
    """Polygraphy encodes arrays as base64 of an ``.npy`` file (older versions: latin-1 text, or ``.npz``)."""
    try:
        data = base64.b64decode(encoded.encode(), validate=True)
    except (binascii.Error, ValueError):
        data = encoded.encode("latin-1")
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:
        raise InputError(
            f"{path}: cannot decode the array of input {name!r} ({type(exc).__name__}: {exc})",
            hint="re-save the inputs with polygraphy run --save-inputs, or as .npz",
        ) from exc
    if isinstance(loaded, np.ndarray):
        return loaded
    with loaded:
        return loaded[loaded.files[0]]


def _dtype_or_none(ttype: TensorType | None) -> np.dtype | None:
    if ttype is None or not ttype.elem_type:
        return None
    try:
        return ttype.numpy_dtype
    except Exception:
        return None


# --- shapes --------------------------------------------------------------------------------------------


def parse_shapes(specs: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``NAME:DIMxDIM...`` strings (``,`` also separates dims; ``NAME:`` is a scalar).

    The name is everything before the *last* ``:``, so TensorFlow-style names like ``input:0`` work.

    Example:
        >>> parse_shapes(["x:1x3x224x224", "y:4", "input:0:[2,8]"])
        {'x': (1, 3, 224, 224), 'y': (4,), 'input:0': (2, 8)}
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, shape = _parse_one_shape(spec)
        if name in shapes:
            raise InputError(f"shape of {name!r} given twice: {spec!r}", hint="give each input's shape once")
        shapes[name] = shape
    return shapes


def _parse_one_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    hint = "write NAME:DIMxDIMx..., e.g. --shape input:1x3x224x224 (a scalar: --shape input:)"
    name, sep, dims_text = spec.strip().rpartition(":")
    if not sep or not name:
        raise InputError(f"bad shape {spec!r}: expected NAME:DIMS", hint=hint)
    dims_text = dims_text.strip().strip("[]()").strip()
    if not dims_text:
        return name, ()
    dims = []
    for part in re.split(r"\s*[x,]\s*", dims_text):
        if not part.isdigit():
            raise InputError(f"bad shape {spec!r}: dimension {part!r} is not a non-negative integer", hint=hint)
        dims.append(int(part))
    return name, tuple(dims)


# --- random inputs -----------------------------------------------------------------------------------------


def random_inputs(
    model: Model, *, shapes: Mapping[str, Iterable[int]] | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Seeded random inputs for ``model``, in its input order.

    Values: floats uniform in [-1, 1); bools 0/1; integers the model compares with constants (``Equal``,
    also after Reshape/Gather/Expand...: a sample rate, a one-hot code, see :mod:`graphbisect.data.ranges`)
    drawn from those constants' values; integers used as indices (Gather, GatherElements,
    GatherND, Scatter*, OneHot, EmbedLayerNormalization, also through Cast/Reshape/Unsqueeze...) in
    [0, size of the indexed axis); uint8 in [0, 256); int8 in [-128, 128); other integers in [0, 10).
    :func:`random_input_notes` says which rule each input followed.
    Shapes: ``shapes[name]`` when given; otherwise static dims, then symbolic dims bound by another
    input's given shape, then, for dim 0 and batch-like symbols (``batch``, ``N``, ``bs``), a size chosen to
    exercise the graph (:func:`chosen_dims`: 2 or a size the model declares elsewhere, where its shapes accept
    it; else 1). Any other dynamic dim raises :class:`InputError` asking for ``--shape``.

    Example:
        >>> inputs = random_inputs(model, shapes={"x": (1, 3, 224, 224)}, seed=0)   # doctest: +SKIP
    """
    check_value("random_inputs", "seed", seed, SEED)  # numpy takes seeds >= 0
    given = _given(shapes)
    _check_shape_names(model, given)
    shapes_of, _ = _shapes_and_choices(model, given)
    bounds = index_bounds(model)
    compared = compared_values(model)
    result: dict[str, np.ndarray] = {}
    # numpy draws in 8 bytes per element (16 for complex) before converting: checked before any is drawn
    drawn = {name: math.prod(shape) * (16 if np.dtype(_input_type(model, name).numpy_dtype).kind == "c" else 8)
             for name, shape in shapes_of.items()}
    biggest = max(drawn, key=drawn.__getitem__, default=None)
    if biggest is not None:
        check_allocation(sum(drawn.values()) + drawn[biggest],
                         f"random inputs of these shapes need {_bytes(sum(drawn.values()) + drawn[biggest])} "
                         f"({biggest!r}: {'x'.join(map(str, shapes_of[biggest])) or 'scalar'})",
                         "give smaller shapes (--shape NAME:DIMS) or your own inputs (--inputs FILE)")
    for name in model.input_names:
        ttype = _input_type(model, name)
        shape = shapes_of[name]
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        dtype = np.dtype(ttype.numpy_dtype)
        values = _fitting(compared.get(name), dtype)
        if values is not None:
            result[name] = rng.choice(values, size=shape).astype(dtype)
        else:
            result[name] = _random_array(rng, name, dtype, shape, bounds.get(name))
    return result


@dataclass(frozen=True)
class ChosenDim:
    """A dynamic dimension of a graph input that graphbisect gave a size (no ``--shape``, no inputs file).

    ``shape``: the input's whole shape as drawn (what ``--shape`` would give); ``how``: why this size.
    """

    input: str
    axis: int
    symbol: str | None  # its dim_param; None when unnamed
    size: int
    how: str
    shape: tuple[int, ...] = ()

    def describe(self) -> str:
        """``x[0] (N) = 16: ...``.

        Example:
            >>> ChosenDim("x", 0, "N", 2, "the smallest size above 1 its shapes accept").describe()
            'x[0] (N) = 2: the smallest size above 1 its shapes accept'
        """
        return f"{self.input}[{self.axis}]{f' ({self.symbol})' if self.symbol else ''} = {self.size}: {self.how}"

    def to_json(self) -> dict[str, object]:
        return {"input": self.input, "axis": self.axis, "symbol": self.symbol, "size": self.size, "how": self.how,
                "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChosenDim:
        return cls(str(data["input"]), int(data["axis"]), None if data["symbol"] is None else str(data["symbol"]),
                   int(data["size"]), str(data["how"]), tuple(int(d) for d in data.get("shape") or ()))


def chosen_dims(model: Model, *, shapes: Mapping[str, Iterable[int]] | None = None) -> tuple[ChosenDim, ...]:
    """The dynamic dimensions :func:`random_inputs` gives a size to (those neither ``shapes`` nor a symbol bound
    by it fix), and which sizes and why: the smallest size above 1 that onnx's strict shape inference accepts
    (:func:`~graphbisect.model.normalize.shape_conflicts`, compared with the conflicts at 1, so nodes that fail
    inference at any size do not decide) among 2 and the static sizes the model's inputs and outputs declare,
    else 1. One decision per symbol (inputs sharing it agree). Computed once per model and ``shapes``.

    Example:
        >>> [d.describe() for d in chosen_dims(load_model("dyn.onnx"))]     # doctest: +SKIP
        ['x[0] (N) = 16: its shapes refuse 2 and accept 16, a size the model declares elsewhere']
    """
    given = _given(shapes)
    _check_shape_names(model, given)
    return _shapes_and_choices(model, given)[1]


def dims_note(chosen: Sequence[ChosenDim]) -> str | None:
    """The sentence every verdict that passed on chosen sizes carries (None when nothing was chosen).

    Example:
        >>> dims_note([ChosenDim("x", 0, "N", 2, "the smallest size above 1 its shapes accept", (2, 16))])[:60]
        'dynamic dims were sized by graphbisect, not by you: x[0] (N)'
    """
    if not chosen:
        return None
    shapes = {d.input: d.shape for d in chosen}
    flags = " ".join(f"--shape {name}:{'x'.join(map(str, shape)) or ''}" for name, shape in shapes.items())
    return ("dynamic dims were sized by graphbisect, not by you: " + "; ".join(d.describe() for d in chosen)
            + f". This verdict holds for these sizes only; to test the sizes you run, give them: {flags} "
            "(shapes= in the Python API)")

def random_input_notes(model: Model, *, shapes: Mapping[str, Iterable[int]] | None = None) -> dict[str, str]:
    """How :func:`random_inputs` draws each input, for the user (which inputs are random, and from what), and
    which of its dynamic dims graphbisect sized (``shapes``: the sizes given, as to :func:`random_inputs`).

    Example:
        >>> random_input_notes(model)       # doctest: +SKIP
        {'input': 'float32 uniform in [-1, 1)', 'sr': 'int64, one of the values it is compared with: 16000'}
    """
    chosen: dict[str, list[ChosenDim]] = {}
    try:
        for dim in chosen_dims(model, shapes=shapes):
            chosen.setdefault(dim.input, []).append(dim)
    except InputError:  # a dim only the user can size: random_inputs says so; the notes say how values are drawn
        pass
    bounds = index_bounds(model)
    compared = compared_values(model)
    notes: dict[str, str] = {}
    for name in model.input_names:
        dtype = np.dtype(_input_type(model, name).numpy_dtype)
        values = _fitting(compared.get(name), dtype)
        if values is not None:
            shown = ", ".join(map(str, values[:8])) + (f", ... ({values.size} values)" if values.size > 8 else "")
            notes[name] = f"{dtype}, one of the values it is compared with: {shown}"
        elif dtype == np.bool_:
            notes[name] = "bool 0/1"
        elif dtype.kind in "iu":
            low, high = _int_range(dtype, bounds.get(name))
            why = ("an index" if name in bounds else "its dtype's range" if dtype in (np.uint8, np.int8)
                   else "no range visible in the model")
            notes[name] = f"{dtype} in [{low}, {high}): {why}"
        else:
            notes[name] = f"{dtype} uniform in [-1, 1)"
        for dim in chosen.get(name, []):
            notes[name] += (f"; dynamic dim {dim.axis}{f' ({dim.symbol})' if dim.symbol else ''} sized {dim.size} "
                            "by graphbisect (--shape to choose)")
    return notes


def _fitting(values: np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    """``values`` that ``dtype`` can hold (None when none, or for non-integer inputs)."""
    if values is None or dtype.kind not in "iu":
        return None
    info = np.iinfo(dtype)
    kept = values[(values >= info.min) & (values <= info.max)]
    return kept if kept.size else None


def _check_shape_names(model: Model, given: Mapping[str, tuple[int, ...]]) -> None:
    for name, shape in given.items():
        if name not in model.input_names:
            raise InputError(f"a shape is given for {name!r}, which is not a model input", hint=_name_hint(name, model))
        ttype = model.tensor_type(name)
        if ttype is not None and ttype.shape is not None:
            _check_shape(name, shape, ttype, "the given shape")


def _given(shapes: Mapping[str, Iterable[int]] | None) -> dict[str, tuple[int, ...]]:
    return {name: tuple(int(d) for d in dims) for name, dims in (shapes or {}).items()}


#: Static sizes (besides 2) a chosen dim may take, smallest first: at most this many, none above _MAX_HINT.
_HINTS = 6
_MAX_HINT = 4096
#: (model fingerprint, given shapes) → the shapes drawn and the dims chosen: shape inference runs once per model.
_CHOICES: dict[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]],
               tuple[dict[str, tuple[int, ...]], tuple[ChosenDim, ...]]] = {}


def _shapes_and_choices(model: Model, given: Mapping[str, tuple[int, ...]]
                        ) -> tuple[dict[str, tuple[int, ...]], tuple[ChosenDim, ...]]:
    """Every input's shape (given, static, bound, or chosen) and the dims chosen (see :func:`chosen_dims`)."""
    key = (model.fingerprint, tuple(sorted(given.items())))
    if key not in _CHOICES:
        if len(_CHOICES) > 64:
            _CHOICES.clear()
        _CHOICES[key] = _choose_dims(model, given)
    drawn, chosen = _CHOICES[key]
    return dict(drawn), chosen


def _choose_dims(model: Model, given: Mapping[str, tuple[int, ...]]
                 ) -> tuple[dict[str, tuple[int, ...]], tuple[ChosenDim, ...]]:
    bindings = _bind_symbols(model, given)
    pending: dict[str, list[tuple[str, int, str | None]]] = {}  # key (symbol, or input[axis]) → its dims
    for name in model.input_names:
        if name not in given:
            for axis, symbol in _choosable(name, _input_type(model, name), bindings):
                pending.setdefault(symbol or f"{name}[{axis}]", []).append((name, axis, symbol))
    sizes = {key: 1 for key in pending}
    how = {key: "" for key in pending}
    if pending:
        _decide(model, given, bindings, pending=pending, sizes=sizes, how=how)
    drawn = {name: given[name] if name in given else _with_unnamed(
                 _resolve_shape(name, _input_type(model, name), {**bindings, **_sized(pending, sizes)}),
                 name, pending, sizes)
             for name in model.input_names}
    chosen = tuple(ChosenDim(name, axis, symbol, sizes[key], how[key], drawn[name])
                   for key, dims in pending.items() for name, axis, symbol in dims)
    return drawn, chosen


def _choosable(name: str, ttype: TensorType, bindings: Mapping[str, int]) -> list[tuple[int, str | None]]:
    """The dynamic dims of input ``name`` that graphbisect sizes: dim 0 and batch-like symbols, unbound."""
    found: list[tuple[int, str | None]] = []
    for axis, dim in enumerate(ttype.shape or ()):
        if (isinstance(dim, int) and dim >= 0) or (isinstance(dim, str) and dim in bindings):
            continue
        if axis == 0 or (isinstance(dim, str) and _BATCH_LIKE.match(dim)):
            found.append((axis, dim if isinstance(dim, str) and dim else None))
    return found


def _sized(pending: Mapping[str, list[tuple[str, int, str | None]]], sizes: Mapping[str, int]) -> dict[str, int]:
    """Symbol → size of the named pending dims (unnamed ones are sized by :func:`_with_unnamed`)."""
    return {symbol: sizes[key] for key, dims in pending.items() for _, _, symbol in dims if symbol}


def _decide(model: Model, given: Mapping[str, tuple[int, ...]], bindings: Mapping[str, int], *,
            pending: Mapping[str, list[tuple[str, int, str | None]]], sizes: dict[str, int],
            how: dict[str, str]) -> None:
    """Size each pending key: 2 when the shapes accept it, else the first accepted hint, else 1 (in place)."""

    def conflicts(trial: Mapping[str, int]) -> frozenset[str] | None:
        shapes = {name: given[name] if name in given else _with_unnamed(
                      _resolve_shape(name, _input_type(model, name), {**bindings, **_sized(pending, trial)}),
                      name, pending, trial)
                  for name in model.input_names}
        return shape_conflicts(model.proto, shapes)

    at_two = conflicts({key: 2 for key in pending})
    if at_two == frozenset():  # the common case: one inference, every dim at 2
        for key in pending:
            sizes[key], how[key] = 2, "the smallest size above 1; the model's shapes accept it"
        return
    baseline = conflicts(sizes)
    hints = _size_hints(model)
    for key in pending:
        if baseline is None:
            how[key] = "1: onnx shape inference cannot check this model's shapes at another size"
            continue
        refused: list[int] = []
        for size in (2, *hints):
            found = conflicts({**sizes, key: size})
            if found is not None and found <= baseline:
                sizes[key] = size
                how[key] = ("the smallest size above 1; the model's shapes accept it" if size == 2 else
                            f"the model's shapes refuse {_listed(refused)} and accept {size}, a size it "
                            "declares elsewhere")
                break
            refused.append(size)
        else:
            how[key] = f"1: the model's shapes refuse {_listed(refused)} (onnx shape inference)"


def _with_unnamed(shape: tuple[int, ...], name: str, pending: Mapping[str, list[tuple[str, int, str | None]]],
                  sizes: Mapping[str, int]) -> tuple[int, ...]:
    """``shape`` with the unnamed pending dims of input ``name`` at their trial sizes."""
    dims = list(shape)
    for key, entries in pending.items():
        for entry_name, axis, symbol in entries:
            if entry_name == name and symbol is None:
                dims[axis] = sizes[key]
    return tuple(dims)


def _size_hints(model: Model) -> tuple[int, ...]:
    """Static sizes above 2 that the model's graph inputs and outputs declare, smallest first (at most _HINTS)."""
    found: set[int] = set()
    for name in (*model.input_names, *model.output_names):
        ttype = model.tensor_type(name)
        if ttype is not None:
            found.update(d for d in (ttype.shape or ()) if isinstance(d, int) and 2 < d <= _MAX_HINT)
    return tuple(sorted(found))[:_HINTS]


def _listed(sizes: Sequence[int]) -> str:
    return ", ".join(map(str, sizes)) or "every size tried"


def _bind_symbols(model: Model, given: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Symbolic dim name → size, from the shapes the user gave (so other inputs sharing it agree)."""
    bindings: dict[str, int] = {}
    for name, shape in given.items():
        ttype = model.tensor_type(name)
        if ttype is None or ttype.shape is None:
            continue
        for dim, size in zip(ttype.shape, shape, strict=False):
            if isinstance(dim, str) and dim:
                bindings.setdefault(dim, size)
    return bindings


def _input_type(model: Model, name: str) -> TensorType:
    ttype = model.tensor_type(name)
    if ttype is None or not ttype.elem_type:
        raise InputError(
            f"input {name!r} declares no tensor type, so graphbisect cannot generate it",
            hint="pass the inputs (inputs={name: array}, or the path of an .npz)",
            cli_hint="pass the inputs from a file (--inputs inputs.npz)",
        )
    return ttype


def _resolve_shape(name: str, ttype: TensorType, bindings: dict[str, int]) -> tuple[int, ...]:
    if ttype.shape is None:
        raise InputError(
            f"input {name!r} has an unknown rank, so graphbisect cannot guess its shape",
            hint=f"give it: shapes={{{name!r}: (1, 3, 224, 224)}} (your real dims)",
            cli_hint=f"give it: --shape {name}:1x3x224x224 (your real dims)",
        )
    dims: list[int] = []
    for axis, dim in enumerate(ttype.shape):
        if isinstance(dim, int) and dim >= 0:
            dims.append(dim)
        elif isinstance(dim, str) and dim in bindings:
            dims.append(bindings[dim])
        elif axis == 0 or (isinstance(dim, str) and _BATCH_LIKE.match(dim)):
            dims.append(1)  # an unnamed dim graphbisect sizes (:func:`_choose_dims`) gets its size afterwards
        else:
            raise InputError(
                f"input {name!r} ({ttype}) has dynamic dimension {axis} ({dim or 'unnamed'}) that graphbisect "
                "cannot guess",
                hint=f"give its shape: shapes={{{name!r}: ({_shape_template(ttype.shape, ', ')})}} (replace each ? "
                "by a size)",  # never rank 1: a dynamic axis 0 is sized 1
                cli_hint=f"give its shape: --shape {name}:{_shape_template(ttype.shape)} (replace each ? by a size)",
            )
    return tuple(dims)


def _shape_template(shape: tuple[int | str | None, ...], separator: str = "x") -> str:
    return separator.join(str(d) if isinstance(d, int) and d >= 0 else "?" for d in shape)


def _random_array(
    rng: np.random.Generator, name: str, dtype: np.dtype, shape: tuple[int, ...], bound: int | None
) -> np.ndarray:
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        low, high = _int_range(dtype, bound)
        return rng.integers(low, high, size=shape, dtype=np.int64).astype(dtype)
    if dtype.kind == "c":
        return (rng.uniform(-1, 1, size=shape) + 1j * rng.uniform(-1, 1, size=shape)).astype(dtype)
    if dtype.kind in "fV":  # V: ml_dtypes extension floats (bfloat16, float8)
        return rng.uniform(-1, 1, size=shape).astype(np.float32).astype(dtype)
    raise InputError(
        f"input {name!r} has dtype {dtype}, for which graphbisect cannot generate random values",
        hint="pass the inputs (inputs={name: array}, or the path of an .npz)",
        cli_hint="pass the inputs from a file (--inputs inputs.npz)",
    )


def _int_range(dtype: np.dtype, bound: int | None) -> tuple[int, int]:
    if bound is not None:
        return 0, max(bound, 1)
    if dtype == np.uint8:
        return 0, 256
    if dtype == np.int8:
        return -128, 128
    return 0, _INT_HIGH


# --- index-like inputs -------------------------------------------------------------------------------------

# Ops that pass index values through unchanged (only their first input is followed).
_TRANSPARENT_OPS = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand"})


def index_bounds(model: Model) -> dict[str, int]:
    """Graph input name → exclusive upper bound for inputs used as indices (into a known-size axis).

    An input counts when it reaches the index operand of Gather, GatherElements, GatherND, ScatterND,
    ScatterElements, Scatter, OneHot or EmbedLayerNormalization directly or through shape-only ops
    (Cast, Reshape, Unsqueeze, Squeeze, Flatten, Expand, Identity). With several uses, the smallest
    bound wins.
    """
    bounds: dict[str, int] = {}
    for name in model.input_names:
        found = [b for b in (_bound_of_use(model, i, t) for t, i in _index_uses(model, name)) if b]
        if found:
            bounds[name] = min(found)
            logger.debug("input %r is used as an index: values drawn from [0, %d)", name, bounds[name])
    return bounds


def _index_uses(model: Model, name: str) -> list[tuple[str, int]]:
    """(tensor, consumer node index) pairs reachable from ``name`` through transparent ops."""
    uses: list[tuple[str, int]] = []
    frontier, seen = [name], {name}
    while frontier:
        tensor = frontier.pop()
        for index in model.consumers.get(tensor, ()):
            node = model.nodes[index]
            uses.append((tensor, index))
            if node.op_type in _TRANSPARENT_OPS and node.input and node.input[0] == tensor:
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        frontier.append(out)
    return uses


def _bound_of_use(model: Model, index: int, tensor: str) -> int | None:
    node = model.nodes[index]
    inputs = list(node.input)
    op = node.op_type
    if op in ("Gather", "GatherElements", "ScatterElements", "Scatter") and inputs[1:2] == [tensor]:
        return _axis_size(model, inputs[0], _int_attr(node, "axis", 0))
    if op in ("GatherND", "ScatterND") and inputs[1:2] == [tensor]:
        return _min_trailing_size(model, inputs[0], _int_attr(node, "batch_dims", 0))
    if op == "OneHot" and inputs[:1] == [tensor] and len(inputs) > 1:
        return _constant_int(model, inputs[1])
    if op == "EmbedLayerNormalization":
        table = {0: 2, 1: 4}  # input_ids -> word_embedding, segment_ids -> segment_embedding
        for position, table_position in table.items():
            if inputs[position : position + 1] == [tensor] and len(inputs) > table_position:
                return _axis_size(model, inputs[table_position], 0)
    return None


def _int_attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return default


def _axis_size(model: Model, tensor: str, axis: int) -> int | None:
    ttype = model.tensor_type(tensor)
    if ttype is None or ttype.shape is None or not -len(ttype.shape) <= axis < len(ttype.shape):
        return None
    size = ttype.shape[axis]
    return size if isinstance(size, int) and size > 0 else None


def _min_trailing_size(model: Model, tensor: str, batch_dims: int) -> int | None:
    ttype = model.tensor_type(tensor)
    if ttype is None or ttype.shape is None:
        return None
    sizes = [d for d in ttype.shape[batch_dims:] if isinstance(d, int) and d > 0]
    return min(sizes) if sizes else None


def _constant_int(model: Model, tensor: str) -> int | None:
    for initializer in model.proto.graph.initializer:
        if initializer.name == tensor:
            if initializer.data_location == onnx.TensorProto.EXTERNAL:
                return None  # kept on disk (graphbisect.model.external): large, so not a size
            values = onnx.numpy_helper.to_array(initializer).reshape(-1)
            return int(values[0]) if values.size == 1 and values[0] > 0 else None
    return None


# --- validation and saving ---------------------------------------------------------------------------------


def _name_hint(name: str, model: Model) -> str:
    close = difflib.get_close_matches(name, list(model.input_names), n=3)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return f"the model's inputs are: {', '.join(model.input_names) or '(none)'}"


def validate_inputs(model: Model, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Check names, dtypes (exact), ranks and static dims; return the values in the model's input order.

    Values are arrays (``ml_dtypes`` arrays for bfloat16, float8, int4..., ``object`` arrays of ``str``
    for strings), lists for sequence inputs and ``None`` for an empty optional (:mod:`graphbisect.storage.values`).
    An array holding the raw elements of a type numpy lacks (``np.save`` writes ``ml_dtypes`` arrays as
    ``V2``/``V1``) or a unicode/bytes array for a string input is read as the model's type.

    Example:
        >>> validate_inputs(model, {"x": np.zeros((1, 3), np.float64)})   # doctest: +SKIP
        InputError: input 'x' has dtype float64, but the model expects float32 (FLOAT[1x3])
          hint: convert it: array.astype(np.float32)
    """
    for name in inputs:
        if name not in model.input_names:
            raise InputError(f"{name!r} is not an input of the model", hint=_name_hint(name, model))
    arrays: dict[str, Any] = {}
    for name in model.input_names:
        if name not in inputs:
            given = ", ".join(inputs) or "none"
            raise InputError(
                f"missing input {name!r} ({model.tensor_type(name) or 'untyped'}); given: {given}",
                hint="add it to the inputs, or leave inputs= out to generate random inputs",
                cli_hint="add it to the inputs file, or omit --inputs to generate random inputs",
            )
        ttype = model.tensor_type(name)
        value = inputs[name]
        if ttype is None and (value is None or isinstance(value, (list, tuple))):
            arrays[name] = to_memory(value)  # a sequence or an optional input
            continue
        arrays[name] = np.asarray(value)
        if ttype is not None and ttype.elem_type:
            arrays[name] = _as_declared_type(arrays[name], ttype)
            _check_dtype(name, arrays[name], ttype)
            _check_shape(name, arrays[name].shape, ttype, "the given array")
    warn_nonfinite_inputs(arrays)  # legal, but a NaN input can make both backends "agree" on NaN
    return arrays


def _as_declared_type(array: np.ndarray, ttype: TensorType) -> np.ndarray:
    """``array`` read as the declared type where its storage says it is one (see ``values.as_elem_type``)."""
    converted = as_elem_type(array, ttype.elem_type)
    if converted.dtype != array.dtype:
        logger.debug("read %s array as %s", array.dtype, ttype.type_name)
    return converted


def _check_dtype(name: str, array: np.ndarray, ttype: TensorType) -> None:
    expected = _dtype_or_none(ttype)
    if expected is not None and array.dtype != expected:
        native = expected.kind in "biufc" and hasattr(np, expected.name)
        cast = ("array.astype(object)" if expected.kind == "O" else f"array.astype(np.{expected.name})" if native
                else f"array.astype(ml_dtypes.{expected.name})")
        raise InputError(
            f"input {name!r} has dtype {array.dtype}, but the model expects {expected} ({ttype})",
            hint=f"convert it: {cast}",
        )


def _check_shape(name: str, shape: tuple[int, ...], ttype: TensorType, what: str) -> None:
    if ttype.shape is None:
        return
    if len(shape) != len(ttype.shape):
        raise InputError(
            f"input {name!r}: {what} has rank {len(shape)} (shape {list(shape)}), but the model expects rank "
            f"{len(ttype.shape)} ({ttype})",
            hint=f"reshape it to {_shape_template(ttype.shape)}",
        )
    for axis, (size, dim) in enumerate(zip(shape, ttype.shape, strict=True)):
        if isinstance(dim, int) and dim >= 0 and size != dim:
            raise InputError(
                f"input {name!r}: {what} has size {size} on axis {axis} (shape {list(shape)}), but the model "
                f"fixes it to {dim} ({ttype})",
                hint=f"give an array of shape {_shape_template(ttype.shape)}",
            )


def save_inputs(path: str | Path, inputs: Mapping[str, Any]) -> Path:
    """Save ``inputs`` as an ``.npz`` file, atomically; returns ``path``.

    Written entry by entry (any input name works, including ``file``), readable with ``np.load``; values a
    plain ``.npy`` cannot hold (strings, bfloat16, float8, int4, sequences, optionals) are stored raw and
    described in the archive's ``__values__.json`` (:mod:`graphbisect.storage.values`).
    """
    path = Path(path)
    with atomic_path(path) as tmp:
        save_values_npz(tmp, inputs)
    return path
