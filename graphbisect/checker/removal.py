"""Single-node removals of a bundle's model, built by the checker itself.

Removing node ``n`` keeps every other node; a tensor ``n`` produced that a kept node reads becomes a graph
input, fed with the oracle's value of it; the outputs are the bundle's outputs still produced, plus each tensor a
kept node produces that only ``n`` read (what ``n`` consumed now leaves the graph). Every new input and output
is declared with the type and shape of the oracle's value, so the candidate is a valid model whatever type
inference knows (``ai.onnx.ml``, ``com.microsoft``, string tensors). The oracle's values of the intermediates
come from :func:`exposed`, a copy of the model that outputs them too; the checker compares that run's own
outputs with a plain run's before it trusts them (exposing a tensor can change what a runtime computes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

__all__ = ["Removal", "declare", "exposed", "produced_names", "reads", "removal"]

# numpy dtype -> ONNX element type, for the values the checker declares (bfloat16 and the like come back from
# the runtimes as ml_dtypes arrays, whose names match)
_ELEM = {
    "float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE, "float16": onnx.TensorProto.FLOAT16,
    "bfloat16": onnx.TensorProto.BFLOAT16, "int8": onnx.TensorProto.INT8, "uint8": onnx.TensorProto.UINT8,
    "int16": onnx.TensorProto.INT16, "uint16": onnx.TensorProto.UINT16, "int32": onnx.TensorProto.INT32,
    "uint32": onnx.TensorProto.UINT32, "int64": onnx.TensorProto.INT64, "uint64": onnx.TensorProto.UINT64,
    "bool": onnx.TensorProto.BOOL,
}


@dataclass(frozen=True)
class Removal:
    """The model without one node, with what it needs fed."""

    node: str  # the removed node's name (its index when it has none)
    model: onnx.ModelProto | None  # None: nothing is left to compare (every output was the node's)
    feeds: Mapping[str, Any]  # every graph input's value
    why_not: str | None = None  # why it could not be built (a value the checker cannot declare)


def reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor ``node`` reads: its inputs and the outer names its subgraphs use."""
    names = [name for name in node.input if name]
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            names.extend(_outer_names(graph))
    return list(dict.fromkeys(names))


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    inner = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    used: list[str] = []
    for node in graph.node:
        used.extend(name for name in reads(node) if name not in inner)
        inner.update(node.output)
    return used


def exposed(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also outputs ``names`` (declared without a type: the runtime's own)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {value.name for value in copy.graph.output}
    copy.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names if name not in present)
    return copy


def removal(model: onnx.ModelProto, index: int, inputs: Mapping[str, Any], values: Mapping[str, Any]) -> Removal:
    """``model`` without node ``index``. ``inputs``: the model's graph inputs; ``values``: the oracle's value of
    every tensor a node produces."""
    graph = model.graph
    gone = graph.node[index]
    label = gone.name or f"#{index}"
    kept = [node for i, node in enumerate(graph.node) if i != index]
    read_by_kept = {name for node in kept for name in reads(node)}
    produced = {name for node in kept for name in node.output if name}
    fed = [name for name in gone.output if name and name in read_by_kept]
    outputs = [value for value in graph.output if value.name in produced]
    frontier = [name for name in reads(gone) if name in produced and name not in read_by_kept
                and name not in {value.name for value in outputs}]
    if not outputs and not frontier:
        return Removal(label, None, {})
    try:
        new_inputs = [declare(name, values[name]) for name in fed]
        new_outputs = [declare(name, values[name]) for name in frontier]
    except (KeyError, TypeError) as exc:
        return Removal(label, None, {}, f"no declarable oracle value for {exc}")
    initializers = [t for t in graph.initializer if t.name in read_by_kept]
    own_inputs = [value for value in graph.input if value.name in read_by_kept
                  and value.name not in {t.name for t in initializers}]
    new_graph = helper.make_graph(kept, graph.name, [*own_inputs, *new_inputs], [*outputs, *new_outputs],
                                  initializer=initializers,
                                  value_info=[v for v in graph.value_info if v.name not in fed])
    new_graph.sparse_initializer.extend(t for t in graph.sparse_initializer if t.values.name in read_by_kept)
    candidate = onnx.ModelProto()
    candidate.CopyFrom(model)
    candidate.graph.CopyFrom(new_graph)
    feeds = {value.name: inputs[value.name] for value in own_inputs if value.name in inputs}
    feeds.update({name: values[name] for name in fed})
    return Removal(label, candidate, feeds)


def produced_names(model: onnx.ModelProto) -> list[str]:
    """Every tensor a node of ``model`` produces that is no graph output, in node order."""
    outputs = {value.name for value in model.graph.output}
    return [name for node in model.graph.node for name in node.output if name and name not in outputs]


def declare(name: str, value: Any) -> onnx.ValueInfoProto:
    """A graph input or output ``name`` typed and shaped as ``value``; raises TypeError when it cannot be."""
    if isinstance(value, list) or value is None:
        raise TypeError(f"'{name}' (a sequence or optional)")
    array = np.asarray(value)
    if array.dtype.kind in "OUS":
        return helper.make_tensor_value_info(name, onnx.TensorProto.STRING, list(array.shape))
    elem = _ELEM.get(array.dtype.name)
    if elem is None:
        raise TypeError(f"'{name}' ({array.dtype.name})")
    return helper.make_tensor_value_info(name, elem, list(array.shape))

