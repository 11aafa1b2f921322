"""The values a model itself says an integer input takes, for random inputs that exercise the model.

Drawn blindly, an integer input is a number in [0, 10): Silero VAD's sample rate ``sr`` (compared with
the constant 16000 to pick a branch) became 0, and Magika's ``bytes`` (one-hot encoded by comparing with
the constants 0..256) never went above 9. When the model compares the input's values — directly or after
value-preserving ops such as Reshape, Gather, Expand, Cast — with a constant (``Equal``), the constant's
values are the ones that mean something, and random values are drawn from them.

Example:
    >>> compared_values(model)            # doctest: +SKIP
    {'sr': array([16000])}
"""

from __future__ import annotations

import logging

import numpy as np
import onnx

from graphbisect.model.graph import Model

__all__ = ["compared_values"]

logger = logging.getLogger(__name__)

# Ops whose output values are some of their first input's values (shape and selection only).
_VALUE_PRESERVING = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Gather",
                               "Slice", "Transpose", "Tile", "Concat"})
_COMPARISONS = frozenset({"Equal"})
_MAX_VALUES = 1 << 16  # a larger constant is data, not a set of meaningful values


def compared_values(model: Model) -> dict[str, np.ndarray]:
    """Integer graph input → the sorted distinct values of the constants it is compared with (``Equal``)."""
    found: dict[str, np.ndarray] = {}
    for name in model.input_names:
        ttype = model.tensor_type(name)
        if ttype is None or not ttype.elem_type or np.dtype(ttype.numpy_dtype).kind not in "iu":
            continue
        sets = [values for values in (_constant_of(model, other) for other in _compared_with(model, name))
                if values is not None]
        if sets:
            found[name] = np.unique(np.concatenate(sets))
            logger.debug("input %r is compared with constants: values drawn from %s", name, found[name][:8])
    return found


def _compared_with(model: Model, name: str) -> list[str]:
    """The other operands of the comparisons ``name``'s values reach through value-preserving ops."""
    others: list[str] = []
    frontier, seen = [name], {name}
    while frontier:
        tensor = frontier.pop()
        for index in model.consumers.get(tensor, ()):
            node = model.nodes[index]
            if node.op_type in _COMPARISONS:
                others.extend(other for other in node.input if other and other != tensor)
            elif node.op_type in _VALUE_PRESERVING and (node.input[:1] == [tensor] or node.op_type == "Concat"):
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        frontier.append(out)
    return others


def _constant_of(model: Model, tensor: str) -> np.ndarray | None:
    """The integer values of ``tensor`` when it is a constant (through shape-only ops), else None."""
    for _ in range(16):  # a chain of Expand/Reshape/Cast back to the constant
        value = _literal(model, tensor)
        if value is not None:
            values = value.reshape(-1)
            if values.dtype.kind not in "iu" or not 0 < values.size <= _MAX_VALUES:
                return None
            return values.astype(np.int64)
        producer = model.producer.get(tensor)
        if producer is None:
            return None
        node = model.nodes[producer]
        if node.op_type not in _VALUE_PRESERVING or node.op_type == "Concat" or not node.input:
            return None
        tensor = node.input[0]
    return None


def _literal(model: Model, tensor: str) -> np.ndarray | None:
    for initializer in model.proto.graph.initializer:
        if initializer.name == tensor:
            if initializer.data_location == onnx.TensorProto.EXTERNAL:
                return None
            return np.asarray(onnx.numpy_helper.to_array(initializer))
    producer = model.producer.get(tensor)
    if producer is not None and model.nodes[producer].op_type == "Constant":
        for attribute in model.nodes[producer].attribute:
            if attribute.name == "value":
                return np.asarray(onnx.numpy_helper.to_array(attribute.t))
    return None
