"""The element types a backend really computed a compiled node in, and whether they are narrower than the model's.

"OpenVINO runs f32, so comparisons are exact" is false for int8-weight models (issue 26): OpenVINO's CPU plugin
compiles ``MatMul(x, DequantizeLinear(w int8))`` into a FullyConnected that quantizes ``x`` to i8 at run time
(its execution graph says ``runtimePrecision i8``), and ONNX Runtime rewrites the same pair into a
``MatMulNBits`` with ``accuracy_level=4``, which does the same. A bundle that blames such a node at hundreds
of tolerances should say that the backend chose to compute it in i8 where the model computes f32.

Each backend's description gives its own words (:mod:`graphbisect.localize.compiled` reads them):

* OpenVINO: ``runtimePrecision`` of each arithmetic kernel of the execution graph (layout and copy kernels,
  whose precision is storage, are left out);
* ONNX Runtime: its quantized kernels (``QLinear*``, ``MatMulInteger``, ``DynamicQuantizeMatMul``, ...:
  their integer inputs), ``MatMulNBits`` by its ``accuracy_level`` (4: i8, 2: f16, 3: bf16), any other node
  the element type of its first input in the optimized model (an inserted fp16 ``Cast`` shows there);
* IREE: the operand element types of each dispatch's computing ops (:func:`graphbisect.backends.iree.dispatch_types`).

Names are short and shared: ``f64 f32 f16 bf16 i64 i32 i16 i8 u16 u8 i4 u4 bool``. A node ran in a **lower
precision** than the model when it computed in a narrower float than the widest float its original nodes
compute in, or in an integer of 16 bits or fewer narrower than any such integer the model computes in there
(a QDQ Conv that OpenVINO runs in u8 reads an i8 tensor in the model: the same width; a 32- or 64-bit
integer is index arithmetic, never quantized compute).

Example:
    >>> lower_precision(("i8",), ("f32",)), lower_precision(("i8", "f32"), ("i8", "f32"))
    (('i8',), ())
    >>> lower_precision(("f16",), ("f32", "i64")), lower_precision(("i32",), ("f32",))
    (('f16',), ())
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import onnx

__all__ = ["QUANTIZED_KERNELS", "element_name", "lower_precision", "model_precision", "node_precisions",
           "optimized_precisions", "precision_name"]

logger = logging.getLogger(__name__)

_ELEMENT_NAMES: dict[int, str] = {
    onnx.TensorProto.DOUBLE: "f64", onnx.TensorProto.FLOAT: "f32", onnx.TensorProto.FLOAT16: "f16",
    onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.INT64: "i64", onnx.TensorProto.INT32: "i32",
    onnx.TensorProto.INT16: "i16", onnx.TensorProto.INT8: "i8", onnx.TensorProto.UINT64: "u64",
    onnx.TensorProto.UINT32: "u32", onnx.TensorProto.UINT16: "u16", onnx.TensorProto.UINT8: "u8",
    onnx.TensorProto.BOOL: "bool", onnx.TensorProto.INT4: "i4", onnx.TensorProto.UINT4: "u4",
    onnx.TensorProto.FLOAT8E4M3FN: "f8e4m3", onnx.TensorProto.FLOAT8E5M2: "f8e5m2",
}
#: Other spellings of the same types: OpenVINO's (``boolean``), IREE's signless integers (``i1``), numpy's.
_ALIASES = {"boolean": "bool", "i1": "bool", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
            "float64": "f64", "fp32": "f32", "fp16": "f16", "int8": "i8", "uint8": "u8", "int16": "i16",
            "int32": "i32", "int64": "i64", "u1": "bool"}
_FLOAT_BITS = {"f64": 64, "f32": 32, "f16": 16, "bf16": 16, "f8e4m3": 8, "f8e5m2": 8}
_INT_BITS = {"i16": 16, "u16": 16, "i8": 8, "u8": 8, "i4": 4, "u4": 4}  # quantized compute; wider ones index
_SMALL_INTS = frozenset(_INT_BITS)

#: ONNX Runtime's kernels that compute in integers (contrib ops included): their precision is their integer inputs'.
QUANTIZED_KERNELS = frozenset({
    "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat", "QGemm", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
    "QLinearSoftmax", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat", "QLinearReduceMean",
    "QLinearWhere", "QAttention", "QEmbedLayerNormalization", "DynamicQuantizeLSTM", "QOrderedMatMul",
})
#: ``MatMulNBits``' ``accuracy_level``: the type it computes the activations in (1 and unset: f32).
_NBITS_ACCURACY = {2: "f16", 3: "bf16", 4: "i8"}
#: The input holding the output's zero point (its type is the output's) of ONNX Runtime's quantized kernels.
_OUTPUT_ZERO_POINT = {"QLinearConv": 7, "QLinearMatMul": 7, "QLinearAdd": 7, "QLinearMul": 7, "QGemm": 8,
                      "QLinearSigmoid": 4, "QLinearLeakyRelu": 4, "QLinearSoftmax": 4, "QLinearAveragePool": 4,
                      "QLinearGlobalAveragePool": 4}
_TYPE_MAKERS = {"Shape": "i64", "Size": "i64", "NonZero": "i64", "ArgMax": "i64", "ArgMin": "i64",
                "Equal": "bool", "Less": "bool", "Greater": "bool", "LessOrEqual": "bool", "GreaterOrEqual": "bool",
                "Not": "bool", "And": "bool", "Or": "bool", "Xor": "bool", "IsNaN": "bool", "IsInf": "bool",
                "MatMulInteger": "i32", "ConvInteger": "i32"}
#: Outputs whose type the op fixes whatever its inputs: DynamicQuantizeLinear's ``y_scale`` is float32 (its ``y`` and
#: ``y_zero_point`` are u8), the second outputs of TopK and MaxPool are int64 indices.
_FIXED_OUTPUT_TYPES = {("DynamicQuantizeLinear", 1): "f32", ("TopK", 1): "i64", ("MaxPool", 1): "i64"}
#: ONNX Runtime's kernels from integer inputs to a float output: the input whose type the output has (their scale).
_FLOAT_OUTPUT_LIKE = {"MatMulIntegerToFloat": 2, "QAttention": 2}


#: Every short name :func:`element_name` gives (what :func:`precision_name` accepts; asked per compiled node).
_SHORT_NAMES = frozenset(_ELEMENT_NAMES.values())


def element_name(elem_type: int) -> str | None:
    """The short name of an ONNX element type (None for one without a short name).

    Example:
        >>> element_name(onnx.TensorProto.FLOAT), element_name(onnx.TensorProto.UINT8)
        ('f32', 'u8')
    """
    return _ELEMENT_NAMES.get(elem_type)


def precision_name(text: str | None) -> str | None:
    """A backend's name of an element type as a short name; None for ``dynamic``, ``undefined``, unknown.

    Example:
        >>> precision_name("boolean"), precision_name("I8"), precision_name("dynamic")
        ('bool', 'i8', None)
    """
    if not text:
        return None
    name = text.strip().lower()
    name = _ALIASES.get(name, name)
    return name if name in _SHORT_NAMES else None


def lower_precision(ran: Iterable[str], model: Collection[str]) -> tuple[str, ...]:
    """The types of ``ran`` narrower than the widest float of ``model`` that ``model`` does not compute in
    itself (see the module docstring); () when ``model`` has no float or nothing is narrower."""
    widest = max((_FLOAT_BITS[m] for m in model if m in _FLOAT_BITS), default=0)
    if not widest:
        return ()
    # an integer is narrower only than the model's own integers there of more bits (or none): OpenVINO's u8
    # Convolution of a QDQ Conv whose model reads i8 computes at the model's width
    narrowest_int = min((_INT_BITS[m] for m in model if m in _INT_BITS), default=64)
    return tuple(dict.fromkeys(r for r in ran if r not in model
                               and ((r in _INT_BITS and _INT_BITS[r] < narrowest_int)
                                    or 0 < _FLOAT_BITS.get(r, 0) < widest)))


def model_precision(nodes: Sequence[onnx.NodeProto], type_of: Callable[[str], str | None],
                    constants: Collection[str] = ()) -> tuple[str, ...]:
    """The element types ``nodes`` compute in, in the model: their inputs' types (in first-seen order), leaving
    out the nodes that compute only constants (a weight's DequantizeLinear, folded at build time)."""
    found: dict[str, None] = {}
    for node in nodes:
        if node.output and all(out in constants for out in node.output if out):
            continue
        for name in node.input:
            if name and (kind := type_of(name)) is not None:
                found.setdefault(kind)
    return tuple(found)


def node_precisions(nodes: Sequence[onnx.NodeProto], type_of: Callable[[str], str | None],
                    constants: Collection[str] = ()) -> dict[str, tuple[str, ...]]:
    """Node name → :func:`model_precision` of that node alone. Of several nodes it is the union of theirs in
    their order (each node adds its inputs' types in first-seen order): what a compiled node's originals
    compute in is read from these without walking their inputs again (made once per model, ahead).

    Example:
        >>> from onnx import helper
        >>> nodes = [helper.make_node("Cast", ["x"], ["c"], name="cast", to=1),
        ...          helper.make_node("Add", ["c", "i"], ["y"], name="add")]
        >>> node_precisions(nodes, {"x": "f16", "c": "f32", "i": "i64"}.get)
        {'cast': ('f16',), 'add': ('f32', 'i64')}
    """
    return {node.name: model_precision((node,), type_of, constants) for node in nodes}


def optimized_precisions(graph: onnx.GraphProto) -> dict[str, tuple[str, ...]]:
    """Optimized node name → the types ONNX Runtime computes it in (see the module docstring).

    Types come from the optimized model's declarations and initializers, then node by node: a ``Cast``'s
    ``to``, a QuantizeLinear's zero point, a DequantizeLinear's scale, the ops that make indices or booleans,
    else the first input's type (the element type most ops keep); outputs whose type the op fixes have it
    (DynamicQuantizeLinear's scale is f32: the Mul of it by a weight scale computes in f32, not u8).

    Example:
        >>> from onnx import helper
        >>> g = helper.make_graph([helper.make_node("MatMulNBits", ["x", "w"], ["y"], name="mm", accuracy_level=4,
        ...                                         domain="com.microsoft")], "g",
        ...                       [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])], [])
        >>> optimized_precisions(g)
        {'mm': ('i8',)}
    """
    types: dict[str, str] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.HasField("tensor_type") and (kind := element_name(info.type.tensor_type.elem_type)):
            types[info.name] = kind
    for tensor in graph.initializer:
        if kind := element_name(tensor.data_type):
            types[tensor.name] = kind
    precisions: dict[str, tuple[str, ...]] = {}
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            inputs = [types[name] for name in node.input if name in types]
            level = next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)
            ran: tuple[str, ...] = (_NBITS_ACCURACY.get(level, inputs[0] if inputs else "f32"),)
        elif node.op_type in QUANTIZED_KERNELS:
            inputs = [types[name] for name in node.input if name in types]
            ran = tuple(dict.fromkeys(t for t in inputs if t in _SMALL_INTS)) or ("i8",)
        else:  # the first input's type
            first = node.input[0] if node.input else None
            ran = (types[first],) if first is not None and first in types else ()
        if node.name and ran:
            precisions[node.name] = ran
        made = _made_type(node, types)
        for at, out in enumerate(node.output):
            kind = _FIXED_OUTPUT_TYPES.get((node.op_type, at), made)
            if out and kind is not None:
                types.setdefault(out, kind)
    return precisions


def _made_type(node: onnx.NodeProto, types: Mapping[str, str]) -> str | None:
    """The element type of ``node``'s (first) outputs, as far as the optimized graph tells (see above)."""
    if node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return element_name(to) if to is not None else None
    if node.op_type in ("QuantizeLinear", "DynamicQuantizeLinear"):
        zero = node.input[2] if len(node.input) > 2 else ""
        return types.get(zero, "u8")
    if node.op_type == "DequantizeLinear":
        return types.get(node.input[1], "f32") if len(node.input) > 1 else "f32"
    if node.op_type in _TYPE_MAKERS:
        return _TYPE_MAKERS[node.op_type]
    if node.op_type in _FLOAT_OUTPUT_LIKE:
        index = _FLOAT_OUTPUT_LIKE[node.op_type]
        return types.get(node.input[index], "f32") if len(node.input) > index else "f32"
    if node.op_type in _OUTPUT_ZERO_POINT:
        index = _OUTPUT_ZERO_POINT[node.op_type]
        return types.get(node.input[index], "u8") if len(node.input) > index else "u8"
    return types.get(node.input[0]) if node.input else None
