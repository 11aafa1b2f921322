"""The ONNX reference implementation (``onnx.reference.ReferenceEvaluator``) as a backend.

Slow but written from the specification in numpy: the default oracle. onnx is imported lazily, inside the
worker. Like every backend it is given a probe model when intermediates are wanted, but it can also return
any tensor the graph computes (the evaluator keeps them all), so ``outputs`` may name any produced tensor.

**Patched where the installed onnx is behind ONNX itself**, through the evaluator's own ``new_ops`` overrides
(never by changing onnx's modules), and said so in :meth:`Reference.patched` (every report's "ran with" line):

* ``Cast``/``CastLike`` to bfloat16 round to nearest even. onnx 1.17 and 1.18 truncate (keep the upper 16 bits);
  the operator text does not say (onnx/onnx#3876, #5004), but ONNX's own converter
  (``onnx.helper.float32_to_bfloat16``), onnx 1.19's reference (``astype(ml_dtypes.bfloat16)``) and its
  ``test_cast_FLOAT_to_BFLOAT16`` data, ONNX Runtime, OpenVINO and ml_dtypes all round. Unpatched, an oracle
  ``reference`` blamed ONNX Runtime for 3 of 4 elements of a plain float → bfloat16 cast.
  Applied only where a probe cast shows this onnx truncating (:mod:`graphbisect.backends.reference_casts`, a
  standalone module whose text ``repro.py``'s reference section embeds, so it runs what graphbisect ran).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from graphbisect.backends.reference_casts import bfloat16_bits, rounding_casts
from graphbisect.backends.worker import select_feeds
from graphbisect.errors import ModelError, SpecError
from graphbisect.storage.values import EXTENSION_TYPES, as_elem_type, elem_type_of, encode_tensor, to_memory

__all__ = ["Reference", "bfloat16_bits", "unpatched_differences"]

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
        self._overrides, self._patched = rounding_casts()
        self._evaluator: Any = None
        self._outputs: list[str] = []
        self._required: list[str] = []
        self._inputs: set[str] = set()
        self._declared: dict[str, int] = {}
        self._done, self._total, self._current = 0, 0, ""
        self._proto: Any = None
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._expected: dict[tuple[tuple[str, tuple[int, ...]], ...], str | None] = {}

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Build the evaluator; ``outputs`` may name any tensor of the main graph."""
        from onnx.reference import ReferenceEvaluator

        self._evaluator = None
        proto = self._onnx.load(model)  # loads external data relative to the model's folder
        evaluator = ReferenceEvaluator(proto, new_ops=list(self._overrides) or None)  # type: ignore[arg-type]
        requested = list(outputs) if outputs is not None else list(evaluator.output_names)
        _check_produced(model, proto.graph, requested)
        initializers = {init.name for init in proto.graph.initializer}
        self._inputs = set(evaluator.input_names)
        self._required = [name for name in evaluator.input_names if name not in initializers]
        self._evaluator, self._outputs = evaluator, requested
        self._proto, self._expected = proto, {}
        graph = proto.graph
        self._declared = {info.name: info.type.tensor_type.elem_type for info in (*graph.output, *graph.value_info)
                          if info.type.HasField("tensor_type")}
        self._count_nodes(evaluator)

    def _count_nodes(self, evaluator: Any) -> None:
        """Make each top-level node say when it starts and ends, for :meth:`progress` (a model of 1,500 nodes
        runs for minutes here). ``rt_nodes_`` is the evaluator's node list in every onnx release graphbisect
        supports; where it is not, there is no count, only the time."""
        nodes = list(getattr(evaluator, "rt_nodes_", None) or [])
        self._done, self._total, self._current = 0, len(nodes), ""
        for index, node in enumerate(nodes):
            proto = getattr(node, "onnx_node", None)
            label = f"{proto.op_type} {proto.name!r}" if proto is not None and proto.name else \
                getattr(proto, "op_type", type(node).__name__)
            with contextlib.suppress(AttributeError, TypeError):
                node.run = self._counted(node.run, index, label)

    def _counted(self, run: Any, index: int, label: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self._current = label
            outputs = run(*args, **kwargs)
            self._done = index + 1
            return outputs

        return counted

    def progress(self) -> tuple[int, int, str] | None:
        """``(nodes done, nodes, the node running)`` of the run going on, for the worker's progress events."""
        return (self._done, self._total, self._current) if self._total else None

    def expected(self) -> str | None:
        """How long the run going on takes at this machine's pace, where a Python-loop operator makes it long
        (:mod:`graphbisect.backends.reference_cost`); asked only once a run has lasted a progress period."""
        from graphbisect.backends.reference_cost import estimate

        key = tuple(sorted(self._shapes.items()))
        if key not in self._expected:
            try:
                cost = estimate(self._proto, self._shapes, min_steps=1) if self._proto is not None else None
            except Exception as exc:  # a foresight is a courtesy: asked once, never a reason to fail the run
                logger.debug("no estimate of this run: %s", exc)
                cost = None
            self._expected[key] = None if cost is None else cost.describe()
        return self._expected[key]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Evaluate; feeds the model does not declare are ignored, missing ones are an InputError."""
        feed = {name: self._native(value) for name, value in select_feeds(inputs, self._required, self._inputs).items()}
        self._shapes = {name: tuple(np.shape(value)) for name, value in feed.items() if not isinstance(value, list)}
        self._done, self._current = 0, ""
        values = self._evaluator.run(self._outputs, feed)
        # to_memory: sequences stay lists, onnx < 1.18's structured bfloat16/float8/int4 become ml_dtypes arrays;
        # as_elem_type: onnx 1.17 returns some int4 outputs as int8, bfloat16 as uint16 (the declared type says)
        return {name: self._typed(name, to_memory(value)) for name, value in zip(self._outputs, values, strict=True)}

    def _typed(self, name: str, value: Any) -> Any:
        code = self._declared.get(name)
        return as_elem_type(value, code) if code and isinstance(value, np.ndarray) else value

    def _native(self, value: Any) -> Any:
        """``value`` as this onnx release represents it: onnx < 1.18 has its own structured dtypes for
        bfloat16, float8 and int4 (``onnx._custom_element_types``) and rejects ``ml_dtypes`` arrays."""
        if isinstance(value, list):
            return [self._native(item) for item in value]
        code = elem_type_of(value) if isinstance(value, np.ndarray) else None
        if code not in EXTENSION_TYPES:
            return value
        custom = _custom_dtypes(self._onnx).get(code)
        return value if custom is None else encode_tensor(value)[0].view(custom)

    def info(self) -> dict[str, Any]:
        """The onnx version that evaluated the model."""
        return {"library": "onnx", "library_version": self._onnx.__version__}

    def patched(self) -> list[str]:
        """Where this worker's onnx.reference is patched to compute as ONNX does (see the module docstring)."""
        return list(self._patched)


def unpatched_differences(model: Any) -> list[str]:
    """The nodes of ``model`` (a ``ModelProto``, top-level graph) that a plain ``onnx.reference`` of this onnx
    computes otherwise than graphbisect's patched one: ``Cast`` to bfloat16 and every ``CastLike`` (its type
    comes from an input), when this onnx truncates; empty when it needs no patch. A standalone script that runs
    onnx.reference (``repro_min.py``) is not what graphbisect ran for these."""
    from onnx import TensorProto

    if not rounding_casts()[0]:
        return []
    return [node.name or node.op_type for node in model.graph.node if node.domain in ("", "ai.onnx") and (
        node.op_type == "CastLike" or (node.op_type == "Cast" and any(
            a.name == "to" and a.i == TensorProto.BFLOAT16 for a in node.attribute)))]


def _custom_dtypes(onnx: Any) -> dict[int, np.dtype]:
    """ONNX element type → onnx's own structured dtype, where this onnx has them and no ml_dtypes support."""
    try:
        import ml_dtypes

        onnx.helper.np_dtype_to_tensor_dtype(np.dtype(ml_dtypes.float8_e4m3fn))
        return {}  # onnx >= 1.18 takes ml_dtypes arrays
    except (ImportError, ValueError, KeyError, TypeError):
        pass
    try:
        from onnx import _custom_element_types as custom
    except ImportError:
        return {}
    names = {16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz",
             21: "uint4", 22: "int4"}
    return {code: np.dtype(getattr(custom, name)) for code, name in names.items() if hasattr(custom, name)}


def _check_produced(model: str, graph: Any, names: Sequence[str]) -> None:
    """Every requested tensor must exist in the top-level graph (an input, initializer or node output)."""
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    known.update(out for node in graph.node for out in node.output)
    absent = [name for name in names if name not in known]
    if absent:
        raise ModelError(f"{model}: no tensor named {', '.join(map(repr, absent[:5]))} in the main graph",
                         hint="request graph outputs or tensors produced by top-level nodes")
