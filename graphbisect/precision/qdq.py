"""INT8 lowering by QuantizeLinear/DequantizeLinear (QDQ) insertion, as ONNX Runtime's static quantizer does.

For every lowered node:

* each float **activation** input is read through ``QuantizeLinear → DequantizeLinear`` (UINT8, per-tensor
  scale and zero point from :class:`~graphbisect.precision.calibration.Calibration`), made once per tensor;
* the **weight** of Conv/ConvTranspose/MatMul/Gemm is stored as INT8 per output channel (symmetric) with a
  DequantizeLinear; a Conv/ConvTranspose/Gemm bias as INT32 with scale ``x_scale * w_scale`` (ONNX Runtime's
  quantizer does the same, and only with an INT32 bias does ORT fuse a Gemm into QGemm); other float
  initializers with more than one element as per-tensor INT8; scalars (epsilons, exponents) stay float;
* the output of Conv/ConvTranspose/MatMul/Gemm is quantized as well (its QDQ pair is part of the node), so
  ONNX Runtime (``opt_level`` extended or higher; verified: QLinearConv, QLinearAdd)
  fuses the ``DQ → op → Q`` groups into real int8 kernels:
  QLinearConv, QLinearMatMul, MatMulIntegerToFloat. Ops without an int8 kernel run in float32 between
  QDQ pairs, exactly as in a model produced by ``onnxruntime.quantization.quantize_static``.

A tensor without a calibrated range (e.g. only in a Paddle model's probe) stays float; the lowering logs it.

**A bias int32 cannot hold.** ``bias / (x_scale * w_scale)`` beyond ±(2³¹-1), less ORT's 0.01 % margin (a tiny
input range times tiny weights under a large bias: 8.3e9), would wrap to another value in the INT32 cast, with
only a numpy warning.
:func:`int32_bias_overflows` finds those nodes from the calibration before any candidate is made, and
:class:`~graphbisect.precision.lowering.Lowering` keeps them in float (not units, named with the reason);
:meth:`QdqConstants.bias` refuses to write one. (ONNX Runtime's ``quantize_static`` instead enlarges the weight
scale until the bias fits, a quantization the search never measured; the overrides therefore exclude these
nodes there too.)

**Cost per candidate.** A search lowers the same model hundreds of times with different node sets, and a
node's quantized constants do not depend on the set: :class:`QdqConstants` (one per
:class:`~graphbisect.precision.lowering.Lowering`) keeps each weight's INT8 tensor, scales and zero points,
each bias's INT32 tensor and each activation's scale and zero point as ready initializers, so a candidate
only copies them (PP-OCRv4 rec, 310 units: 27 → 20 ms of CPU per candidate; the target's own session
creation, ~240 ms, is what a candidate costs: see benchmarks/README.md).

Example:
    >>> proto = lower_qdq(model, lowered={0, 2}, calibration=cal)                  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from graphbisect.model import Model
from graphbisect.precision.calibration import Calibration, weight_scales
from graphbisect.precision.modes import WEIGHT_OPS
from graphbisect.precision.rewrite import GraphRewriter
from graphbisect.text.printable import shown

__all__ = ["QdqConstants", "bias_scale", "int32_bias_overflows", "lower_qdq", "weight_axis"]

logger = logging.getLogger(__name__)

_QUANTIZED_WEIGHTS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Mul"})
"""Ops whose float initializer inputs are quantized; elsewhere (Resize scales, Clip bounds, norm scales)
initializers are parameters that stay float."""

_DATA_INPUTS = {"Resize": 1, "Clip": 1, "LayerNormalization": 1, "InstanceNormalization": 1}
"""How many leading inputs of these ops are data (quantized); the rest stay float."""


_BIAS_OPS = frozenset({"Conv", "ConvTranspose", "Gemm"})
"""Ops whose third input, an initializer, is a bias quantized to INT32 (input 2, as ONNX Runtime's quantizer)."""

_INT32_MAX = float(np.iinfo(np.int32).max)
_BIAS_LIMIT = _INT32_MAX / 1.0001
"""The most steps an INT32 bias may take: int32's range less ONNX Runtime's margin (``quantize_static`` enlarges a
weight's scale beyond it, ``qdq_quantizer._adjust_weight_scale_for_int32_bias``), so every node the search quantizes
is quantized the same way by the overrides' ``quantize_static`` line, and every node it would rescale stays float."""


def _attr(node: onnx.NodeProto, name: str, default: float) -> float:
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else float(onnx.helper.get_attribute_value(found))


def bias_scale(node: onnx.NodeProto, act_scale: float, w_scales: np.ndarray, bias: np.ndarray) -> np.ndarray | None:
    """The INT32 scale of ``node``'s bias ``bias`` (``act_scale * w_scales``, float32), or None where it is not
    quantized to INT32: not a Conv/ConvTranspose/Gemm, a Gemm with ``beta`` other than 1, or a bias whose shape is
    not the weight scales' (a grouped ConvTranspose, a 2-D Gemm ``C``): that one is a per-tensor INT8 initializer.

    Example:
        >>> conv = onnx.helper.make_node("Conv", ["x", "w", "b"], ["y"])
        >>> bias_scale(conv, 0.5, np.array([0.1, 0.2], np.float32), np.zeros(2, np.float32))
        array([0.05, 0.1 ], dtype=float32)
    """
    if node.op_type not in _BIAS_OPS or (node.op_type == "Gemm" and _attr(node, "beta", 1.0) != 1.0):
        return None
    if w_scales.shape != bias.shape:
        return None
    return np.asarray(np.float32(act_scale) * w_scales, dtype=np.float32)


def _int32_bias(value: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``round(value / scale)`` computed in float64, as a float64 array (no cast: the caller checks the range)."""
    return np.round(np.asarray(value, dtype=np.float64) / np.asarray(scale, dtype=np.float64))


def int32_bias_overflows(model: Model, nodes: Collection[int], calibration: Calibration) -> dict[int, str]:
    """Of the node indices ``nodes``, those whose INT32 bias would overflow when lowered, with the reason.

    The bias is quantized exactly as :class:`_QdqLowering` does: at ``x_scale * w_scale`` (:func:`bias_scale`),
    ``x_scale`` the calibrated scale of input 0, ``w_scale`` the weight's (per channel).

    Example:
        >>> int32_bias_overflows(model, lowerable_nodes(model, PrecisionMode.INT8), cal)   # doctest: +SKIP
        {0: "bias 'conv.bias' is 8.3e+09 steps of its scale 3.1e-12 (input scale × weight scale) ..."}
    """
    weights = model.inline_initializers
    found: dict[int, str] = {}
    for index in nodes:
        node = model.nodes[index]
        if node.op_type not in _BIAS_OPS or len(node.input) < 3 or not node.input[2]:
            continue
        x, w, b = node.input[0], node.input[1], node.input[2]
        params = calibration.activation(x) if x not in weights else None
        if params is None or w not in weights or b not in weights:
            continue
        value, bias = numpy_helper.to_array(weights[w]), numpy_helper.to_array(weights[b])
        if value.ndim < 2:
            continue
        scale = bias_scale(node, params[0], weight_scales(value, weight_axis(node, value.ndim, model.opset)), bias)
        if scale is None:
            continue
        steps = np.abs(_int32_bias(bias, scale))
        worst = int(np.argmax(steps)) if steps.size else 0
        if steps.size and steps.reshape(-1)[worst] > _BIAS_LIMIT:
            at = float(np.asarray(scale).reshape(-1)[worst])
            found[index] = (f"its bias {shown(b)} is {steps.reshape(-1)[worst]:.3g} steps of its INT32 scale {at:.3g} "
                            f"(input scale {params[0]:.3g} × weight scale), beyond int32 (±{_INT32_MAX:.3g}): "
                            "an int8 kernel cannot add this bias")
    return found


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


_Constants = tuple[onnx.TensorProto, ...]


class QdqConstants:
    """The quantized initializers of one model and calibration, made once and shared by every candidate.

    Each entry is keyed by everything its value depends on (tensor name, axis, scale), so a candidate gets
    exactly the tensors it would compute itself; see the module docstring.
    """

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self._values: dict[str, np.ndarray | None] = {}
        self._activations: dict[str, tuple[float, int, _Constants] | None] = {}
        self._weights: dict[tuple[str, int | None], tuple[np.ndarray, _Constants]] = {}
        self._biases: dict[tuple[str, bytes], _Constants] = {}
        self._names: dict[str, int] = {}  # per tensor name, how many keys have derived tensors from it

    def _derived(self, name: str) -> str:
        """The base name of the tensors derived from ``name`` for a new key: ``name`` for its first key,
        ``name__k1``, ``name__k2``... for later ones (a weight two nodes read along other axes, a bias two
        Convs scale differently), so a name always carries one value: within a candidate (where a later key
        would otherwise take the first one's tensor) and in the weights file the candidates share
        (:class:`~graphbisect.model.io.WeightsPool`)."""
        seen = self._names.get(name, 0)
        self._names[name] = seen + 1
        return name if seen == 0 else f"{name}__k{seen}"

    def value(self, g: GraphRewriter, name: str) -> np.ndarray | None:
        """Initializer ``name``'s value (None for a computed tensor), read from the model once."""
        if name not in self._values:
            self._values[name] = g.weight(name)
        return self._values[name]

    def activation(self, name: str) -> tuple[float, int, _Constants] | None:
        """``(scale, zero point, [scale, zero point] initializers)`` of activation ``name``, None if uncalibrated."""
        if name not in self._activations:
            params = self.calibration.activation(name)
            self._activations[name] = None if params is None else (*params, (
                numpy_helper.from_array(np.float32(params[0]), name + "__scale"),
                numpy_helper.from_array(np.uint8(params[1]), name + "__zp")))
        return self._activations[name]

    def weight(self, name: str, value: np.ndarray, axis: int | None) -> tuple[np.ndarray, _Constants]:
        """Per-channel (``axis``) or per-tensor symmetric INT8 ``name``: its scales and [int8, scale, zero]."""
        key = (name, axis)
        if key not in self._weights:
            scales = weight_scales(value, axis)
            shape = [1] * value.ndim
            if axis is not None:
                shape[axis] = -1
            q = np.clip(np.round(value / scales.reshape(shape)), -127, 127).astype(np.int8)
            zero = np.zeros_like(scales, dtype=np.int8) if axis is not None else np.int8(0)
            base = self._derived(name)
            self._weights[key] = scales, (
                numpy_helper.from_array(q, base + "__int8"),
                numpy_helper.from_array(scales if axis is not None else np.float32(scales), base + "__wscale"),
                numpy_helper.from_array(np.asarray(zero), base + "__wzp"))
        return self._weights[key]

    def bias(self, name: str, value: np.ndarray, scale: np.ndarray) -> _Constants:
        """INT32 bias ``name`` at ``scale`` (input scale × weight scales): [int32, scale, zero].

        Raises ValueError for a bias beyond int32 at ``scale`` (never wrapped; such a node stays float, see
        :func:`int32_bias_overflows`)."""
        key = (name, scale.astype(np.float32).tobytes())
        if key not in self._biases:
            steps = _int32_bias(value, scale)
            if steps.size and float(np.abs(steps).max()) > _BIAS_LIMIT:
                raise ValueError(f"the INT32 bias {name!r} overflows ({float(np.abs(steps).max()):.3g} steps of its "
                                 "scale): its node should have been kept in float by int32_bias_overflows")
            base = self._derived(name)
            self._biases[key] = (
                numpy_helper.from_array(steps.astype(np.int32), base + "__int32"),
                numpy_helper.from_array(scale.astype(np.float32), base + "__bscale"),
                numpy_helper.from_array(np.zeros(scale.shape, dtype=np.int32), base + "__bzp"))
        return self._biases[key]


class _QdqLowering:
    def __init__(self, g: GraphRewriter, constants: QdqConstants) -> None:
        self.g, self.constants = g, constants
        self.opset = g.model.opset
        self.quantized_outputs: set[str] = set()

    def activation(self, name: str) -> tuple[str, float | None]:
        """The dequantized copy of activation ``name`` and its scale (``name`` itself when uncalibrated)."""
        params = self.constants.activation(name)
        if name in self.quantized_outputs and params is not None:
            return name, params[0]  # a lowered Conv/MatMul's output: already on the int8 grid
        if params is None:
            logger.info("no calibration range for %r; it stays float", name)
            return name, None
        scale, _zero, tensors = params
        out = name + "__dq"

        def make() -> None:
            s, z = (self.g.add_initializer(t) for t in tensors)
            self.g.node("QuantizeLinear", [name, s, z], [name + "__q"])
            self.g.node("DequantizeLinear", [name + "__q", s, z], [out])

        return self.g.once(out, make), scale

    def weight(self, node: onnx.NodeProto, name: str, value: np.ndarray) -> tuple[str, np.ndarray]:
        axis = weight_axis(node, value.ndim, self.opset)
        scales, tensors = self.constants.weight(name, value, axis)
        out = tensors[0].name.removesuffix("__int8") + "__dqw"  # per key, as the tensors are named
        attrs: dict[str, int] = {"axis": axis} if axis is not None else {}

        def make() -> None:
            w, s, z = (self.g.add_initializer(t) for t in tensors)
            self.g.node("DequantizeLinear", [w, s, z], [out], **attrs)  # type: ignore[arg-type]

        return self.g.once(out, make), scales

    def bias(self, name: str, value: np.ndarray, scale: np.ndarray) -> str:
        tensors = self.constants.bias(name, value, scale)
        out = tensors[0].name.removesuffix("__int32") + "__dqb"  # per key, as the tensors are named

        def make() -> None:
            b, s, z = (self.g.add_initializer(t) for t in tensors)
            self.g.node("DequantizeLinear", [b, s, z], [out], axis=0)

        return self.g.once(out, make)

    def lower(self, node: onnx.NodeProto) -> None:
        inputs = list(node.input)
        act_scale: float | None = None
        w_scales: np.ndarray | None = None
        for i, name in enumerate(node.input[: _DATA_INPUTS.get(node.op_type, len(node.input))]):
            if not self.g.is_float(name):
                continue
            value = self.constants.value(self.g, name)
            if value is not None and node.op_type not in _QUANTIZED_WEIGHTS:
                continue
            if value is None:
                inputs[i], scale = self.activation(name)
                act_scale = scale if i == 0 else act_scale
            elif node.op_type in WEIGHT_OPS and i == 1 and value.ndim >= 2:
                inputs[i], w_scales = self.weight(node, name, value)
            elif i == 2 and act_scale is not None and w_scales is not None \
                    and (b_scale := bias_scale(node, act_scale, w_scales, value)) is not None:
                inputs[i] = self.bias(name, value, b_scale)
            elif value.size > 1:
                inputs[i], _ = self.weight(node, name, value)  # per-tensor INT8 (ndim < 2 → no axis)
        if node.op_type not in WEIGHT_OPS:
            self.g.copy(node, inputs, list(node.output))
            return
        y = node.output[0]
        params = self.constants.activation(y)
        if params is None:
            self.g.copy(node, inputs, list(node.output))
            return
        self.g.copy(node, inputs, [y + "__fp32raw", *node.output[1:]])
        s, z = (self.g.add_initializer(t) for t in params[2])
        self.g.node("QuantizeLinear", [y + "__fp32raw", s, z], [y + "__q"])
        self.g.node("DequantizeLinear", [y + "__q", s, z], [y])
        self.quantized_outputs.add(y)


def lower_qdq(model: Model, lowered: Collection[int], calibration: Calibration | QdqConstants,
              expose: Sequence[str] = ()) -> onnx.ModelProto:
    """``model`` with the nodes at ``lowered`` quantized to INT8 by QDQ (see the module docstring).

    ``calibration``: the activation ranges, or a :class:`QdqConstants` made from them and shared by the
    calls that lower the same ``model`` (a search's candidates).
    """
    g = GraphRewriter(model, lowered, expose)
    constants = calibration if isinstance(calibration, QdqConstants) else QdqConstants(calibration)
    lowering = _QdqLowering(g, constants)
    for index, node in enumerate(model.nodes):
        if index in g.lowered:
            lowering.lower(node)
        else:
            g.copy(node, list(node.input), list(node.output))
    return g.finish()
