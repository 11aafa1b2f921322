"""INT8 lowering by QuantizeLinear/DequantizeLinear (QDQ) insertion, as ONNX Runtime's static quantizer does.

For every lowered node:

* each float **activation** input is read through ``QuantizeLinear → DequantizeLinear`` (UINT8, per-tensor
  scale and zero point from :class:`~graphbisect.precision.calibration.Calibration`), made once per tensor;
* the **weight** of Conv/ConvTranspose/MatMul/Gemm is stored as INT8 per output channel (symmetric) with a
  DequantizeLinear; a Conv bias as INT32 with scale ``x_scale * w_scale``; other float initializers with
  more than one element as per-tensor INT8; scalars (epsilons, exponents) stay float;
* the output of Conv/ConvTranspose/MatMul/Gemm is quantized as well (its QDQ pair is part of the node), so
  ONNX Runtime (``opt_level`` extended or higher; verified: QLinearConv, QLinearAdd)
  fuses the ``DQ → op → Q`` groups into real int8 kernels:
  QLinearConv, QLinearMatMul, MatMulIntegerToFloat. Ops without an int8 kernel run in float32 between
  QDQ pairs, exactly as in a model produced by ``onnxruntime.quantization.quantize_static``.

A tensor without a calibrated range (e.g. only in a Paddle model's probe) stays float; the lowering logs it.

Example:
    >>> proto = lower_qdq(model, lowered={0, 2}, calibration=cal)                  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import numpy as np
import onnx

from graphbisect.model import Model
from graphbisect.precision.calibration import Calibration, weight_scales
from graphbisect.precision.modes import WEIGHT_OPS
from graphbisect.precision.rewrite import GraphRewriter

__all__ = ["lower_qdq", "weight_axis"]

logger = logging.getLogger(__name__)

_QUANTIZED_WEIGHTS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Mul"})
"""Ops whose float initializer inputs are quantized; elsewhere (Resize scales, Clip bounds, norm scales)
initializers are parameters that stay float."""

_DATA_INPUTS = {"Resize": 1, "Clip": 1, "LayerNormalization": 1, "InstanceNormalization": 1}
"""How many leading inputs of these ops are data (quantized); the rest stay float."""


def weight_axis(node: onnx.NodeProto, rank: int, opset: int) -> int | None:
    """The output-channel axis of ``node``'s weight (None: per tensor, e.g. before opset 13)."""
    if opset < 13 or rank < 2:
        return None
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return rank - 1 if rank == 2 else None  # MatMul [K, N]: per column


class _QdqLowering:
    def __init__(self, g: GraphRewriter, calibration: Calibration) -> None:
        self.g, self.cal = g, calibration
        self.opset = g.model.opset
        self.quantized_outputs: set[str] = set()

    def activation(self, name: str) -> tuple[str, float | None]:
        """The dequantized copy of activation ``name`` and its scale (``name`` itself when uncalibrated)."""
        params = self.cal.activation(name)
        if name in self.quantized_outputs and params is not None:
            return name, params[0]  # a lowered Conv/MatMul's output: already on the int8 grid
        if params is None:
            logger.info("no calibration range for %r; it stays float", name)
            return name, None
        scale, zero = params
        out = name + "__dq"

        def make() -> None:
            s = self.g.constant(name + "__scale", np.float32(scale))
            z = self.g.constant(name + "__zp", np.uint8(zero))
            self.g.node("QuantizeLinear", [name, s, z], [name + "__q"])
            self.g.node("DequantizeLinear", [name + "__q", s, z], [out])

        return self.g.once(out, make), scale

    def weight(self, node: onnx.NodeProto, name: str, value: np.ndarray) -> tuple[str, np.ndarray]:
        axis = weight_axis(node, value.ndim, self.opset)
        scales = weight_scales(value, axis)
        shape = [1] * value.ndim
        if axis is not None:
            shape[axis] = -1
        q = np.clip(np.round(value / scales.reshape(shape)), -127, 127).astype(np.int8)
        out = name + "__dqw"
        attrs: dict[str, int] = {"axis": axis} if axis is not None else {}

        def make() -> None:
            w = self.g.constant(name + "__int8", q)
            s = self.g.constant(name + "__wscale", scales if axis is not None else np.float32(scales))
            zero = np.zeros_like(scales, dtype=np.int8) if axis is not None else np.int8(0)
            z = self.g.constant(name + "__wzp", zero)
            self.g.node("DequantizeLinear", [w, s, z], [out], **attrs)  # type: ignore[arg-type]

        return self.g.once(out, make), scales

    def bias(self, name: str, value: np.ndarray, scale: np.ndarray) -> str:
        q = np.round(value / scale).astype(np.int32)
        out = name + "__dqb"

        def make() -> None:
            b = self.g.constant(name + "__int32", q)
            s = self.g.constant(name + "__bscale", scale.astype(np.float32))
            z = self.g.constant(name + "__bzp", np.zeros(scale.shape, dtype=np.int32))
            self.g.node("DequantizeLinear", [b, s, z], [out], axis=0)

        return self.g.once(out, make)

    def lower(self, node: onnx.NodeProto) -> None:
        inputs = list(node.input)
        act_scale: float | None = None
        w_scales: np.ndarray | None = None
        for i, name in enumerate(node.input[: _DATA_INPUTS.get(node.op_type, len(node.input))]):
            if not self.g.is_float(name):
                continue
            value = self.g.weight(name)
            if value is not None and node.op_type not in _QUANTIZED_WEIGHTS:
                continue
            if value is None:
                inputs[i], scale = self.activation(name)
                act_scale = scale if i == 0 else act_scale
            elif node.op_type in WEIGHT_OPS and i == 1 and value.ndim >= 2:
                inputs[i], w_scales = self.weight(node, name, value)
            elif node.op_type == "Conv" and i == 2 and act_scale is not None and w_scales is not None \
                    and w_scales.shape == value.shape:
                inputs[i] = self.bias(name, value, act_scale * w_scales)
            elif value.size > 1:
                inputs[i], _ = self.weight(node, name, value)  # per-tensor INT8 (ndim < 2 → no axis)
        if node.op_type not in WEIGHT_OPS:
            self.g.copy(node, inputs, list(node.output))
            return
        y = node.output[0]
        params = self.cal.activation(y)
        if params is None:
            self.g.copy(node, inputs, list(node.output))
            return
        self.g.copy(node, inputs, [y + "__fp32raw", *node.output[1:]])
        s = self.g.constant(y + "__scale", np.float32(params[0]))
        z = self.g.constant(y + "__zp", np.uint8(params[1]))
        self.g.node("QuantizeLinear", [y + "__fp32raw", s, z], [y + "__q"])
        self.g.node("DequantizeLinear", [y + "__q", s, z], [y])
        self.quantized_outputs.add(y)


def lower_qdq(model: Model, lowered: Collection[int], calibration: Calibration,
              expose: Sequence[str] = ()) -> onnx.ModelProto:
    """``model`` with the nodes at ``lowered`` quantized to INT8 by QDQ (see the module docstring)."""
    g = GraphRewriter(model, lowered, expose)
    lowering = _QdqLowering(g, calibration)
    for index, node in enumerate(model.nodes):
        if index in g.lowered:
            lowering.lower(node)
        else:
            g.copy(node, list(node.input), list(node.output))
    return g.finish()
