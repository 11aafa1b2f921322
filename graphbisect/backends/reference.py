"""The ONNX reference implementation (``onnx.reference.ReferenceEvaluator``) as a backend.

Slow but written from the specification in numpy: the default oracle. onnx is imported lazily, inside the
worker. Like every backend it is given a probe model when intermediates are wanted, but it can also return
any tensor the graph computes (the evaluator keeps them all), so ``outputs`` may name any produced tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from graphbisect.backends.worker import select_feeds
from graphbisect.errors import ModelError, SpecError
from graphbisect.values import to_memory

__all__ = ["Reference"]

logger = logging.getLogger(__name__)


class Reference:
    """``onnx.reference.ReferenceEvaluator`` behind the :class:`~graphbisect.backends.base.Runtime` protocol.

    Example:
        >>> rt = Reference({}, "/tmp")                  # doctest: +SKIP
        >>> rt.load("model.onnx", None)                 # doctest: +SKIP
        >>> rt.run({"x": x})["y"]                       # doctest: +SKIP
    """

    def __init__(self, options: Mapping[str, str], workdir: str) -> None:
        if options:
            raise SpecError(f"the reference backend has no option {', '.join(sorted(options))}",
                            hint="write just `reference`")
        import onnx

        self._onnx: Any = onnx
        self._evaluator: Any = None
        self._outputs: list[str] = []
        self._required: list[str] = []
        self._inputs: set[str] = set()

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Build the evaluator; ``outputs`` may name any tensor of the main graph."""
        from onnx.reference import ReferenceEvaluator

        self._evaluator = None
        proto = self._onnx.load(model)  # loads external data relative to the model's folder
        evaluator = ReferenceEvaluator(proto)
        requested = list(outputs) if outputs is not None else list(evaluator.output_names)
        _check_produced(model, proto.graph, requested)
        initializers = {init.name for init in proto.graph.initializer}
        self._inputs = set(evaluator.input_names)
        self._required = [name for name in evaluator.input_names if name not in initializers]
        self._evaluator, self._outputs = evaluator, requested

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Evaluate; feeds the model does not declare are ignored, missing ones are an InputError."""
        feed = select_feeds(inputs, self._required, self._inputs)
        values = self._evaluator.run(self._outputs, feed)
        # to_memory: sequences stay lists, onnx < 1.18's structured bfloat16/float8/int4 become ml_dtypes arrays
        return {name: to_memory(value) for name, value in zip(self._outputs, values, strict=True)}

    def info(self) -> dict[str, Any]:
        """The onnx version that evaluated the model."""
        return {"library": "onnx", "library_version": self._onnx.__version__}


def _check_produced(model: str, graph: Any, names: Sequence[str]) -> None:
    """Every requested tensor must exist in the top-level graph (an input, initializer or node output)."""
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    known.update(out for node in graph.node for out in node.output)
    absent = [name for name in names if name not in known]
    if absent:
        raise ModelError(f"{model}: no tensor named {', '.join(map(repr, absent[:5]))} in the main graph",
                         hint="request graph outputs or tensors produced by top-level nodes")
