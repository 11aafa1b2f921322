"""The graph rewriter every lowering shares: new nodes and weights in topological order, tensors renamed once.

A lowering walks the model's nodes in order and, for each lowered node, asks for *versions* of its input
tensors (the FP16 copy, the QDQ'd copy, ...). Each version is made once, right before its first reader,
and shared by every later reader, so a chain of lowered nodes carries one low-precision tensor instead of
a Cast pair per edge. A tensor keeps its original name for its float32 value, so graph outputs, exposed
intermediates and the nodes kept in FP32 read what they always read.

Example:
    >>> g = GraphRewriter(model, lowered={3, 4})                          # doctest: +SKIP
    >>> g.once("x__fp16", lambda: g.node("Cast", ["x"], ["x__fp16"], to=10))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphbisect.model import Model
from graphbisect.model.io import copy_model

__all__ = ["GraphRewriter"]

logger = logging.getLogger(__name__)


class GraphRewriter:
    """Builds the lowered copy of ``model`` (see the module docstring).

    Args:
        model: the normalized FP32 model.
        lowered: indices of the nodes to lower.
        expose: tensors to add as FP32 graph outputs (a probe of the lowered model).
    """

    def __init__(self, model: Model, lowered: Collection[int], expose: Sequence[str] = ()) -> None:
        self.model = model
        self.lowered = frozenset(lowered)
        self.expose = tuple(dict.fromkeys(n for n in expose if n not in set(model.output_names)))
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.made: set[str] = set()
        self._weights = model.inline_initializers  # weights kept on disk are read when a lowered node needs one
        self._wanted_fp32 = set(model.output_names) | set(self.expose)

    # -- facts ---------------------------------------------------------------------------------------

    def is_float(self, name: str) -> bool:
        """Whether ``name`` is a float32 tensor (by the normalized model's inferred types)."""
        found = self.model.tensor_type(name) if name else None
        return found is not None and found.elem_type == onnx.TensorProto.FLOAT

    def weight(self, name: str) -> np.ndarray | None:
        """The value of initializer ``name``, or None for a computed tensor or a graph input."""
        return numpy_helper.to_array(self._weights[name]) if name in self._weights else None

    def produced_by_lowered(self, name: str) -> bool:
        return self.model.producer.get(name, -1) in self.lowered

    def needs_fp32(self, name: str) -> bool:
        """Whether someone reads the float32 value of ``name``: an output, an exposed tensor, an FP32 node."""
        if name in self._wanted_fp32:
            return True
        return any(user not in self.lowered for user in self.model.consumers.get(name, ()))

    # -- building ------------------------------------------------------------------------------------

    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], *, name: str | None = None,
             **attrs: Any) -> None:
        """Append a node (named after its first output unless ``name`` is given)."""
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=name or f"{outputs[0]}/{op_type}",
                                           **attrs))
        self.made.update(outputs)

    def constant(self, name: str, array: np.ndarray) -> str:
        """Add initializer ``name`` (once) and return its name."""
        if name not in self.initializers:
            self.initializers[name] = numpy_helper.from_array(np.asarray(array), name)
        return name

    def add_initializer(self, tensor: onnx.TensorProto) -> str:
        """Add a ready initializer (once, by its name; shared with other candidates, never modified) and
        return its name."""
        self.initializers.setdefault(tensor.name, tensor)
        return tensor.name

    def once(self, name: str, make: Callable[[], None]) -> str:
        """Run ``make`` (which defines tensor ``name``) unless ``name`` was made already; return ``name``."""
        if name not in self.made and name not in self.initializers:
            make()
            self.made.add(name)
        return name

    def copy(self, node: onnx.NodeProto, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        """Append a copy of ``node`` reading ``inputs`` and writing ``outputs``.

        A node that reads and writes what it always did is appended as it is (never modified here):
        :meth:`finish` copies every node into the new graph anyway, so cloning it first would copy it twice.
        """
        if list(node.input) == list(inputs) and list(node.output) == list(outputs):
            self.nodes.append(node)
            self.made.update(outputs)
            return
        clone = onnx.NodeProto()
        clone.CopyFrom(node)
        del clone.input[:]
        clone.input.extend(inputs)
        del clone.output[:]
        clone.output.extend(outputs)
        self.nodes.append(clone)
        self.made.update(outputs)

    def finish(self) -> onnx.ModelProto:
        """The lowered model: new nodes, original weights still read plus new ones, FP32 outputs."""
        proto = copy_model(self.model.proto, initializers=False, nodes=False)  # not the weights: only those read
        graph = proto.graph
        graph.node.extend(self.nodes)
        read = {name for node in self.nodes for name in node.input} | set(self.model.output_names)
        graph.initializer.extend(t for t in self.model.proto.graph.initializer if t.name in read)
        graph.initializer.extend(t for name, t in self.initializers.items() if name in read)
        # Declarations as every derived model carries them (strategies.subgraph): the user's value_info of the
        # tensors this graph still computes under their own name — with their own type: a lowered node writes
        # its low-precision copy under a new name and its float32 value back under the original one —, and
        # exposed tensors declared by Model.boundary_type. Optimizers act on declared shapes, so dropping them
        # changed what the target ran even with every node kept in FP32. New tensors are left to inference.
        exposed = set(self.expose)
        declared = [v for v in graph.value_info if v.name in self.made and v.name not in exposed]
        del graph.value_info[:]
        graph.value_info.extend(declared)
        for name in self.expose:
            graph.output.append(self._declaration(name))
        return proto

    def _declaration(self, name: str) -> onnx.ValueInfoProto:
        """How an exposed float32 tensor is declared as a graph output."""
        known = self.model.boundary_type(name)
        if known is not None and known.type.HasField("tensor_type") and known.type.tensor_type.elem_type:
            return known
        found = self.model.tensor_type(name)
        return helper.make_tensor_value_info(name, found.elem_type if found is not None else onnx.TensorProto.FLOAT,
                                             None)
