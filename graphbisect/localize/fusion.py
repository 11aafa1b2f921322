"""What the target's optimized graph says about the original one: which tensors it fused away.

A backend that can save the graph it actually runs (ONNX Runtime and onnxoptimizer, ``save_optimized=1``)
shows which of the original model's tensors no longer exist: the intermediates inside a fusion (a
LayerNorm pattern becomes one ``LayerNormalization`` node whose output keeps the last node's name),
nodes that were eliminated, tensors that were renamed. That is layerwise evidence that survives
*probe masking*: exposing every intermediate as an output stops most fusions (a fused intermediate may
not be a graph output), so a bug inside a fusion vanishes from the probed run. Exposing only the tensors
that **survive** optimization leaves the compiled graph alone, and the first divergent tensor is then the
output of the fused node; :func:`fused_region` maps it back to the original nodes that the fused node
replaced, which is the hint the reducer tries first.

Example:
    >>> from onnx import helper
    >>> nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Neg", ["a"], ["b"], name="n"),
    ...          helper.make_node("Abs", ["b"], ["y"], name="abs")]
    >>> fused_region(nodes, {"a": 0, "b": 1, "y": 2}, 1, vanished={"a"})
    frozenset({0, 1})
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

import onnx

__all__ = ["fused_region", "surviving_tensors", "vanished_tensors"]


def surviving_tensors(optimized: str | Path | onnx.ModelProto) -> frozenset[str]:
    """Every tensor name the optimized model still has: graph inputs, initializers and node outputs."""
    proto = optimized if isinstance(optimized, onnx.ModelProto) else \
        onnx.load(str(optimized), load_external_data=False)
    graph = proto.graph
    return frozenset({v.name for v in graph.input} | {t.name for t in graph.initializer}
                     | {o for node in graph.node for o in node.output if o})


def vanished_tensors(intermediates: Iterable[str], survivors: Collection[str]) -> frozenset[str]:
    """The original intermediates that the optimized graph no longer has (fused, eliminated or renamed)."""
    return frozenset(name for name in intermediates if name not in survivors)


def fused_region(nodes: Sequence[onnx.NodeProto], producer: Mapping[str, int], index: int, *,
                 vanished: Collection[str]) -> frozenset[int]:
    """Node ``index`` and every node it reaches backwards through vanished tensors.

    With ``index`` the producer of a fused node's output, this is the original pattern the fused node
    replaced: walking back stops at tensors that survive (the fused node's inputs), which were computed
    outside the fusion.
    """
    region = {index}
    pending = [index]
    while pending:
        for name in nodes[pending.pop()].input:
            source = producer.get(name) if name in vanished else None
            if source is not None and source not in region:
                region.add(source)
                pending.append(source)
    return frozenset(region)
