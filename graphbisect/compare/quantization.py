"""Which tensors of a model are quantized, and their quantization step: integers compared in LSB, not exactly.

Integers compare exactly (:mod:`graphbisect.compare.metrics`), which is right for indices and shapes and wrong for
quantized activations (issue 26): OpenVINO's QuantizeLinear multiplies by the reciprocal of the scale, so a
value within an ulp of a rounding tie lands one step from ONNX's ``x / scale``. On an ORT-quantized QDQ
NudeNet, 7 of 307,200 values of the input QuantizeLinear differed by 1 and 850 of 1,024 rows scored ``inf``;
every root cause read ``inf`` and the real error could not be localized. A 1-LSB rounding difference is
small; 100 LSB is not.

So a tensor on a quantization grid has a **step** (its scale), found from the graph:

* a QuantizeLinear's output, with its ``y_scale``; its input (a float about to be rounded to that grid) when
  nothing else reads it;
* a DequantizeLinear's input, with its ``x_scale``; its output (float values on that grid);
* ONNX Runtime's quantized operators (``QLinearConv``, ``QLinearMatMul``, ``QLinearAdd``, ...): their
  quantized inputs and output, with the scales they take; ``DynamicQuantizeLinear``'s output (scale
  computed at run time: step 0, "quantized, scale unknown");
* the outputs of ops that only move or select values (Reshape, Transpose, MaxPool, Concat, Relu, Clip, ...)
  of tensors with a step, which keep their grid; and a float read only by such ops or QuantizeLinears.

:meth:`~graphbisect.compare.metrics.Tolerance.bounds` then compares an integer tensor with a step in steps,
``int_atol`` of them allowed (``--int-atol``, default 1: the score is LSB ÷ int_atol), and allows a float
tensor with a step ``int_atol`` steps more absolute error; other integers (indices, shapes, counts) stay exact.
A per-channel scale counts by its smallest step (never hides an error). Scales that are not constants of the
model (computed at run time) give step 0.

Example:
    >>> from onnx import helper, numpy_helper
    >>> nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
    ...          helper.make_node("Reshape", ["q", "shape"], ["r"]),
    ...          helper.make_node("DequantizeLinear", ["r", "s", "z"], ["y"]),
    ...          helper.make_node("ArgMax", ["y"], ["idx"])]
    >>> steps = quantization_steps(nodes, {"s": np.float32(0.05), "z": np.int8(0), "shape": np.array([-1])})
    >>> sorted((name, round(step, 3)) for name, step in steps.items())  # not "shape", not "idx"
    [('q', 0.05), ('r', 0.05), ('x', 0.05), ('y', 0.05)]
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphbisect.compare.metrics import Tolerance

if TYPE_CHECKING:
    from graphbisect.model import Model

__all__ = ["quantization_steps", "with_quantization"]

logger = logging.getLogger(__name__)

#: ONNX Runtime's quantized operators: (quantized input index, its scale's index) pairs, and the output's
#: scale index (None: the output is not quantized).
_QLINEAR: dict[str, tuple[tuple[tuple[int, int], ...], int | None]] = {
    "QLinearConv": (((0, 1), (3, 4)), 6), "QLinearMatMul": (((0, 1), (3, 4)), 6),
    "QLinearAdd": (((0, 1), (3, 4)), 6), "QLinearMul": (((0, 1), (3, 4)), 6),
    "QGemm": (((0, 1), (3, 4)), 7),
    "QLinearSigmoid": (((0, 1),), 3), "QLinearLeakyRelu": (((0, 1),), 3), "QLinearSoftmax": (((0, 1),), 3),
    "QLinearAveragePool": (((0, 1),), 3), "QLinearGlobalAveragePool": (((0, 1),), 3),
    "QLinearReduceMean": (((0, 1),), 3),
    "MatMulIntegerToFloat": (((0, 2), (1, 3)), None), "DynamicQuantizeMatMul": (((1, 2),), None),
}
#: Ops whose outputs hold (some of) their first input's values, on the same grid: the data input is 0.
_KEEPS_GRID = frozenset({
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "MaxPool", "GlobalMaxPool", "Slice",
    "Gather", "GatherElements", "GatherND", "Split", "Tile", "Expand", "DepthToSpace", "SpaceToDepth", "Relu",
    "Clip", "ReduceMax", "ReduceMin", "Resize", "Upsample", "Pad", "Dropout", "MaxRoiPool",
})
#: Ops whose every input is data on the same grid as the output.
_JOINS_GRID = frozenset({"Concat", "Max", "Min"})
_UNKNOWN = 0.0  # quantized, scale not a constant of the model


def quantization_steps(nodes: Sequence[onnx.NodeProto], constants: Mapping[str, Any]) -> dict[str, float]:
    """Tensor → its quantization step (see the module docstring); ``constants``: the model's constant values by
    name (arrays or TensorProtos: the scales are read from them; a scale not among them gives step 0).

    Subgraph bodies are not looked into: their tensors are not compared layer by layer.
    """
    steps: dict[str, float] = {}

    def mark(name: str, step: float) -> None:
        if name:
            steps[name] = _finest([step, steps[name]]) if name in steps else step

    for node in nodes:
        if node.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        op = node.op_type
        if op in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 1:
            step = _step(constants.get(node.input[1]))
            if op == "DequantizeLinear":  # a QuantizeLinear's float input: only when nothing else reads it
                mark(node.input[0], step)
            mark(node.output[0], step)
        elif op == "DynamicQuantizeLinear" and node.output:
            mark(node.output[0], _UNKNOWN)
        elif op in _QLINEAR:
            pairs, out_scale = _QLINEAR[op]
            for data, scale in pairs:
                if len(node.input) > scale:
                    mark(node.input[data], _step(constants.get(node.input[scale])))
            if out_scale is not None and len(node.input) > out_scale and node.output:
                mark(node.output[0], _step(constants.get(node.input[out_scale])))
    _spread(nodes, steps)
    return steps


def _spread(nodes: Sequence[onnx.NodeProto], steps: dict[str, float]) -> None:
    """Carry steps through the ops that keep a grid: forward to their outputs, and back to a tensor all of whose
    readers are such ops (or QuantizeLinears) with a step (repeated until nothing changes)."""
    if not steps:  # nothing to carry: each rule below starts from a tensor with a step
        return
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(node)
    for _ in range(len(nodes) + 1):  # a fixed point, long before this bound
        changed = False
        for node in nodes:
            data = _data_inputs(node)
            if not data or not node.output or not all(name in steps for name in data):
                continue
            step = _finest(steps[name] for name in data)
            for out in node.output:
                if out and out not in steps:
                    steps[out] = step
                    changed = True
        for name, users in readers.items():
            if name in steps or not users:
                continue
            found = [_reader_step(name, user, steps) for user in users]
            if all(step is not None for step in found):
                steps[name] = _finest(step for step in found if step is not None)
                changed = True
        if not changed:
            return


def _data_inputs(node: onnx.NodeProto) -> list[str]:
    if node.op_type in _KEEPS_GRID and node.domain in ("", "ai.onnx"):
        return [node.input[0]] if node.input and node.input[0] else []
    if node.op_type in _JOINS_GRID and node.domain in ("", "ai.onnx"):
        return [name for name in node.input if name]
    return []


def _reader_step(name: str, user: onnx.NodeProto, steps: Mapping[str, float]) -> float | None:
    """The step tensor ``name`` inherits from one reader: a QuantizeLinear's it is the input of, or the output's
    of a grid-keeping op it is the data of (never a shape, an index or a bound: those stay exact)."""
    if not user.output or user.output[0] not in steps:
        return None
    if user.op_type == "QuantizeLinear" and user.input[0] == name:
        return steps[user.output[0]]
    return steps[user.output[0]] if name in _data_inputs(user) else None


def _finest(steps: Iterable[float]) -> float:
    """The smallest known step (a known one beats an unknown 0)."""
    known = [step for step in steps if step > 0]
    return min(known) if known else _UNKNOWN


def _step(scale: Any) -> float:
    """A scale's step: its smallest positive finite value (a per-channel scale never hides an error), or 0."""
    if scale is None:
        return _UNKNOWN
    try:
        values = np.asarray(numpy_helper.to_array(scale) if isinstance(scale, onnx.TensorProto) else scale,
                            dtype=np.float64).reshape(-1)
    except (ValueError, TypeError, OSError) as exc:  # external data not loaded, a type numpy cannot read
        logger.debug("a quantization scale could not be read (%s): its step is unknown", exc)
        return _UNKNOWN
    values = values[np.isfinite(values) & (values > 0)]
    return float(values.min()) if values.size else _UNKNOWN


def with_quantization(tolerance: Tolerance, model: Model) -> Tolerance:
    """``tolerance`` with the quantization steps of ``model``'s tensors (:func:`quantization_steps`), unless it has
    its own already (a caller's choice) or the model has none.

    Example:
        >>> from graphbisect.examples.quantized import qdq_model
        >>> from graphbisect.model import load_model
        >>> tol = with_quantization(Tolerance(), load_model(qdq_model()[0]))
        >>> tol.bounds("x_q", exact=True), round(tol.quantized["fc"], 6), "idx" in tol.quantized
        ((1.0, 0.0), 0.001, False)
    """
    if tolerance.quantized:
        return tolerance
    steps = quantization_steps(model.nodes, _constants(model.proto.graph, model.nodes))
    if not steps:
        return tolerance
    logger.info("%d quantized tensors: integers compared in steps (%g allowed)", len(steps), tolerance.int_atol)
    return dataclasses.replace(tolerance, quantized={k: v for k, v in steps.items() if math.isfinite(v)})


def _constants(graph: onnx.GraphProto, nodes: Iterable[onnx.NodeProto]) -> dict[str, Any]:
    """The graph's initializers and Constant node values that hold data here (small ones: scales)."""
    found: dict[str, Any] = {t.name: t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL}
    for node in nodes:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                         None)
            if value is not None:
                found[node.output[0]] = value
            else:
                scalar = next((a.f for a in node.attribute if a.name == "value_float"), None)
                if scalar is not None:
                    found[node.output[0]] = np.float32(scalar)
    return found
