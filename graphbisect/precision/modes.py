"""Precision modes and which nodes each one can lower.

A node is *lowerable* (a unit of the precision search) when it computes on float32 values: at least one of
its inputs or outputs is a ``FLOAT`` tensor and its op type is arithmetic, not data movement. Data movement
(Reshape, Transpose, Concat, Gather, ...) is exact in any precision, so lowering it adds search units
without changing any value: the rounding happens where the next lowered node reads the tensor anyway.

INT8 lowers only the op types ONNX Runtime's static quantizer puts between QuantizeLinear/DequantizeLinear
(:data:`INT8_OPS`); the others (Pow, Sqrt, ReduceMean, Erf, Div, ...) stay float in every real int8
deployment, so they are not units there.

Example:
    >>> PrecisionMode.parse("fp16").low_type == onnx.TensorProto.FLOAT16
    True
"""

from __future__ import annotations

import enum
import logging

import onnx

from graphbisect.errors import InputError
from graphbisect.model import Model

__all__ = ["DATA_MOVEMENT", "FP16_TYPED_OPS", "INT8_OPS", "PrecisionMode", "lowerable_nodes"]

logger = logging.getLogger(__name__)

DATA_MOVEMENT = frozenset({
    "Shape", "Size", "Cast", "CastLike", "Constant", "ConstantOfShape", "Identity", "Reshape", "Transpose",
    "Squeeze", "Unsqueeze", "Flatten", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND",
    "Expand", "Tile", "Range", "NonZero", "If", "Loop", "Scan", "QuantizeLinear", "DequantizeLinear",
    "DynamicQuantizeLinear", "SpaceToDepth", "DepthToSpace", "Pad", "ScatterND", "ScatterElements", "Dropout",
    "TopK", "ArgMax", "ArgMin", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or",
    "NonMaxSuppression", "Trilu", "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike",
    "RandomUniformLike", "Multinomial", "Bernoulli", "OneHot", "Compress",
})
"""Op types that move or select values without arithmetic (or produce no float): never units."""

FP16_TYPED_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Erf", "Tanh", "Sigmoid", "Relu", "LeakyRelu",
    "Elu", "Selu", "PRelu", "Softmax", "LogSoftmax", "MatMul", "Gemm", "Conv", "ConvTranspose", "MaxPool",
    "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "InstanceNormalization",
    "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceSumSquare",
    "Neg", "Abs", "Reciprocal", "Min", "Max", "Clip", "HardSigmoid", "HardSwish", "Sum", "Mean", "Where",
    "Floor", "Ceil", "Round", "Sin", "Cos", "Softplus", "Softsign", "Gelu", "Mish",
})
"""Op types whose float inputs and outputs share one type constraint, so the whole node can be retyped to
FLOAT16. Others (Resize's float ``scales``, ops with a ``dtype`` attribute) are lowered by emulation."""

INT8_OPS = frozenset({
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Mul", "Relu", "Clip", "LeakyRelu", "Sigmoid",
    "HardSigmoid", "HardSwish", "Softmax", "MaxPool", "AveragePool", "GlobalAveragePool", "Resize",
    "LayerNormalization", "InstanceNormalization",
})
"""Op types ONNX Runtime's static QDQ quantizer quantizes (its QDQ registry, onnxruntime 1.31)."""

WEIGHT_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
"""Op types whose second input is a weight, quantized per channel, and whose output is quantized too
(so ONNX Runtime fuses them into QLinearConv / QLinearMatMul / MatMulIntegerToFloat)."""


class PrecisionMode(str, enum.Enum):
    """The reduced precision the non-pinned nodes run in."""

    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"

    @classmethod
    def parse(cls, text: str) -> PrecisionMode:
        """``fp16``/``f16``/``half``, ``bf16``, ``int8``/``i8`` (case-insensitive)."""
        aliases = {"f16": "fp16", "half": "fp16", "float16": "fp16", "bfloat16": "bf16", "i8": "int8"}
        key = aliases.get(text.strip().lower(), text.strip().lower())
        try:
            return cls(key)
        except ValueError as exc:
            raise InputError(f"unknown precision mode {text!r}", hint="use mode='fp16', 'bf16' or 'int8'",
                             cli_hint="use --mode fp16, bf16 or int8") from exc

    @property
    def low_type(self) -> int:
        """The ONNX element type values are rounded to (INT8 activations are UINT8, weights INT8)."""
        return {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16,
                "int8": onnx.TensorProto.INT8}[self.value]


def _is_float(model: Model, name: str) -> bool:
    found = model.tensor_type(name) if name else None
    return found is not None and found.elem_type == onnx.TensorProto.FLOAT


def lowerable_nodes(model: Model, mode: PrecisionMode) -> list[int]:
    """Indices (topological order) of the nodes ``mode`` can lower: the units of the precision search.

    Example:
        >>> lowerable_nodes(load_model("cnn.onnx"), PrecisionMode.INT8)[:3]    # doctest: +SKIP
        [0, 2, 3]
    """
    units = []
    for index, node in enumerate(model.nodes):
        if node.domain not in ("", "ai.onnx") or node.op_type in DATA_MOVEMENT:
            continue
        if mode is PrecisionMode.INT8 and node.op_type not in INT8_OPS:
            continue
        if any(_is_float(model, name) for name in (*node.input, *node.output)):
            units.append(index)
    logger.debug("%d of %d nodes are lowerable to %s", len(units), len(model.nodes), mode.value)
    return units
