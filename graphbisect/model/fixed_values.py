"""Which tensors of a model hold the same value for every input: its compile-time constants.

A tensor is fixed when the model computes it from initializers, ``Constant`` nodes and the shapes of tensors
whose shapes are fully static (``Shape``, ``Size``), by deterministic standard ops (no ``Random*``, no subgraph).
A compiler folds such a tensor while building the model; so a reduction may feed it to a candidate as a
constant without fixing anything the original leaves open, whatever the tensor's own declaration says (an
exporter often declares a shape tensor ``[Concat_output_0_dim_0]``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import onnx

__all__ = ["fixed_tensors"]

_RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"})
_SHAPE_OF = frozenset({"Shape", "Size"})


def fixed_tensors(nodes: Iterable[onnx.NodeProto], initializers: Iterable[str],
                  declared: Callable[[str], onnx.ValueInfoProto | None]) -> frozenset[str]:
    """The node outputs among ``nodes`` (in topological order) that are fixed (module docstring).
    ``declared``: a tensor's type as the model knows it (its declaration, else shape inference's)."""
    fixed = set(initializers)
    found: set[str] = set()
    for node in nodes:
        if node.domain not in ("", "ai.onnx") or node.op_type in _RANDOM or _has_subgraph(node):
            continue
        if node.op_type in _SHAPE_OF:
            holds = bool(node.input) and _static(declared(node.input[0]))
        elif node.op_type == "Constant":
            holds = True
        else:
            holds = bool(node.input) and all(not name or name in fixed for name in node.input)
        if holds:
            outputs = [name for name in node.output if name]
            fixed.update(outputs)
            found.update(outputs)
    return frozenset(found)


def _static(info: onnx.ValueInfoProto | None) -> bool:
    """Whether a declaration gives a tensor a shape of fixed sizes only."""
    if info is None or not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
        return False
    return all(dim.HasField("dim_value") and dim.dim_value >= 0 for dim in info.type.tensor_type.shape.dim)


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attr in node.attribute)
