"""Quantized models on which OpenVINO computes otherwise than the ONNX graph says, with ground truth.

Both are small stand-ins of real third-party models (issue 26), verified on OpenVINO 2026.4.1 (CPU plugin,
AVX-512 VNNI) against ONNX Runtime 1.32 at ``opt_level=disable``:

:func:`int8_weight_model`
    An int8-weight MiniLM layer: ``x[1,16,384] @ DequantizeLinear(w int8, per-channel scale)``. OpenVINO
    compiles the pair into one FullyConnected with i8 weights and, by default, quantizes its *activations*
    to i8 at run time too (``DYNAMIC_QUANTIZATION_GROUP_SIZE``, default 32): the execution graph says
    ``runtimePrecision i8`` and the output is ~240 tolerances off (the MiniLM's bundle said 254×).
    ``openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0`` computes it in f32, within tolerance.
:func:`qdq_model`
    A QDQ network (QuantizeLinear/DequantizeLinear around a Conv, int8) beside a weight-only-int8 MatMul
    whose output is quantized to int16 (an A16W8 head). OpenVINO's low-precision pipeline multiplies by
    the reciprocal of the input scale, so inputs within an ulp of a rounding tie quantize 1 LSB apart
    from ONNX's ``x / scale`` (hundreds of values of ``x_q``, and of ``c1_q`` after the Conv): rounding,
    not a divergence. Its dynamic quantization of the MatMul (the *planted* error, :data:`QDQ_PLANTED`:
    a real backend behaviour, not a modified model) puts ``fc_q`` ~45 LSB off. With
    ``DYNAMIC_QUANTIZATION_GROUP_SIZE=0`` only the 1-LSB rounding remains.

Example:
    >>> model, inputs = qdq_model()
    >>> [n.name for n in model.graph.node if n.op_type == "MatMul"], sorted(inputs)
    (['fc'], ['t', 'x'])
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["QDQ_PLANTED", "int8_weight_model", "qdq_model"]

logger = logging.getLogger(__name__)

#: The node of :func:`qdq_model` whose output OpenVINO's dynamic quantization puts tens of LSB off.
QDQ_PLANTED = "fc"


def int8_weight_model(tokens: int = 16, width: int = 384, seed: int = 0) -> tuple[onnx.ModelProto,
                                                                                   dict[str, np.ndarray]]:
    """``y = x @ DequantizeLinear(w_q, w_scale, axis=1)``, int8 weights with a scale per output channel, and
    inputs ``x`` uniform in [-1, 1) (see the module docstring).

    Example:
        >>> model, inputs = int8_weight_model()
        >>> [n.op_type for n in model.graph.node], inputs["x"].shape
        (['DequantizeLinear', 'MatMul'], (1, 16, 384))
    """
    rng = np.random.default_rng(seed)
    weights = rng.integers(-127, 128, size=(width, width), dtype=np.int8)
    scales = (rng.random(width) * 0.01 + 0.001).astype(np.float32)
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_scale"], ["w"], name="dq_w", axis=1),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes, "int8_weight_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, width])],
        [numpy_helper.from_array(weights, "w_q"), numpy_helper.from_array(scales, "w_scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    inputs = {"x": np.random.default_rng(seed + 1).uniform(-1, 1, (1, tokens, width)).astype(np.float32)}
    return model, inputs


def qdq_model(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The QDQ network of the module docstring and its inputs: ``x`` on rounding ties of the input scale
    (``(k + 0.5) · 0.05``), ``t`` uniform in [-1, 1).

    Tensors: ``x → x_q → x_dq → conv1 (c1) → c1_q → y1`` (int8, QDQ weights) and
    ``t → fc (MatMul by DequantizeLinear(int8)) → fc_q (int16) → y2``.
    """
    rng = np.random.default_rng(seed)
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: np.ndarray | np.generic) -> str:
        initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def q(out: str, x: str, scale: str, zero: str) -> None:
        nodes.append(helper.make_node("QuantizeLinear", [x, scale, zero], [out], name=out))

    def dq(out: str, x: str, scale: str, zero: str) -> None:
        nodes.append(helper.make_node("DequantizeLinear", [x, scale, zero], [out], name=out))

    channels, size, hidden, tokens = 32, 16, 64, 16
    const("zp8", np.array(0, np.int8))
    const("s_x", np.float32(0.05))
    const("s_c1", np.float32(0.05))
    q("x_q", "x", "s_x", "zp8")
    dq("x_dq", "x_q", "s_x", "zp8")
    const("w1_q", rng.integers(-20, 21, (hidden, channels, 1, 1), dtype=np.int8))
    const("w1_s", np.float32(0.01))
    dq("w1", "w1_q", "w1_s", "zp8")
    nodes.append(helper.make_node("Conv", ["x_dq", "w1"], ["c1"], name="conv1"))
    q("c1_q", "c1", "s_c1", "zp8")
    dq("y1", "c1_q", "s_c1", "zp8")
    const("w2_q", rng.integers(-127, 128, (hidden, hidden), dtype=np.int8))
    const("w2_s", np.float32(0.01))
    dq("w2", "w2_q", "w2_s", "zp8")
    nodes.append(helper.make_node("MatMul", ["t", "w2"], ["fc"], name=QDQ_PLANTED))
    const("zp16", np.array(0, np.int16))
    const("s_fc", np.float32(0.001))
    q("fc_q", "fc", "s_fc", "zp16")
    dq("y2", "fc_q", "s_fc", "zp16")
    graph = helper.make_graph(
        nodes, "qdq_with_int16_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size]),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, tokens, hidden])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1, hidden, size, size]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, tokens, hidden])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    draw = np.random.default_rng(seed + 5)
    inputs = {"x": ((draw.integers(-100, 100, (1, channels, size, size)) + 0.5) * 0.05).astype(np.float32),
              "t": draw.uniform(-1, 1, (1, tokens, hidden)).astype(np.float32)}
    return model, inputs
