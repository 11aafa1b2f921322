"""What a run of ``onnx.reference`` will cost, known before it runs: the operators it computes in Python loops.

Most of onnx.reference is numpy on whole tensors (its Conv is im2col and a matrix product; pooling loops over
output positions at a few µs each). ``Resize`` is not: for every output element it interpolates along the last
axis once for every index of the other input axes (``_interpolate_nd_with_x`` recurses through the whole input
for each output element), a Python call of ~20 µs each on a 2-core x86 machine. YOLOv8n's first upsample
(1×256×20×20 → 1×256×40×40) is 409,600 outputs × 5,120 such calls: 2.1 billion steps, about half a day,
where ONNX Runtime takes a millisecond. A spec check or an oracle run of such a model never ends in useful
time.

:func:`estimate` counts those steps per node at the given input shapes (shape inference with the inputs'
concrete dims, :func:`graphbisect.model.normalize.concrete_shapes`: large weights are not copied) and multiplies
them by this machine's pace, measured once per process on a small ``Resize`` (the fastest of three runs in CPU
time, ~0.3 s). Measured against onnx.reference's own runs of 7–40 s (nearest and linear, 2 to 16 channels): the
estimate was 0.97–1.17× the time taken, so a caller that stops a run at a limit can skip one estimated at three
times the limit and lose nothing (a margin for a CPU that runs faster later than when it was paced).

Example:
    >>> cost = estimate(onnx.load("yolo_piece.onnx"), {"x": (1, 256, 20, 20)})   # doctest: +SKIP
    >>> cost.describe()                                                           # doctest: +SKIP
    "about 13 h at this machine's pace (Resize '/model.10/Resize' interpolates 2.1e+09 times in Python, ...)"
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphbisect.model.normalize import concrete_shapes

__all__ = ["ReferenceCost", "estimate"]

logger = logging.getLogger(__name__)

#: Below this many Python-loop steps in a node, it is not slow: no pace is measured, no estimate made.
MIN_STEPS = 200_000


@dataclass(frozen=True)
class ReferenceCost:
    """onnx.reference's estimated time on a model: its costliest loop-bound node and the total."""

    seconds: float  #: every counted node's steps at the measured pace
    node: str  #: the costliest node (its name, or its op type where it has none)
    op_type: str
    steps: int  #: that node's Python-loop steps
    step_seconds: float  #: this machine's measured seconds per step of ``op_type``

    def describe(self) -> str:
        """``about 13 h at this machine's pace (Resize '/up' interpolates 2.1e+09 times in Python, 22 µs each)``"""
        return (f"about {_duration(self.seconds)} at this machine's pace ({self.op_type} {self.node!r} "
                f"{_VERBS.get(self.op_type, 'loops')} {self.steps:.2g} times in Python, "
                f"{self.step_seconds * 1e6:.0f} µs each)")

    def to_json(self) -> dict[str, object]:
        return {"seconds": round(self.seconds, 1), "node": self.node, "op_type": self.op_type,
                "steps": self.steps, "step_seconds": self.step_seconds}


def estimate(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]], *,
             min_steps: int | None = None) -> ReferenceCost | None:
    """onnx.reference's time on ``model`` at ``input_shapes`` (graph input → its concrete dims), estimated;
    None when no node is loop-bound beyond ``min_steps`` (default :data:`MIN_STEPS`) steps or its shapes cannot
    be inferred."""
    least = MIN_STEPS if min_steps is None else min_steps
    if not any(node.op_type in STEPS for node in model.graph.node):
        return None
    shapes = concrete_shapes(model, input_shapes)
    counted = []
    for node in model.graph.node:
        count = STEPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        steps = count(node, shapes) if count is not None else None
        if steps is not None and steps >= max(least, 1):
            counted.append((steps, node))
    if not counted:
        return None
    seconds = sum(steps * _pace(node.op_type) for steps, node in counted)
    steps, worst = max(counted, key=lambda pair: pair[0] * _pace(pair[1].op_type))
    return ReferenceCost(seconds, worst.name or worst.op_type, worst.op_type, steps, _pace(worst.op_type))


def _resize_steps(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """Output elements × the input's indices before its last resized axis (see the module docs); with
    ``axes`` (opset 18), once per index of the other axes."""
    x, y = shapes.get(node.input[0]), shapes.get(node.output[0])
    if x is None or y is None or len(x) != len(y) or not x:
        return None
    axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
    resized = sorted(a % len(x) for a in axes) if axes else list(range(len(x)))
    others = math.prod(x[a] for a in range(len(x)) if a not in resized)
    return others * math.prod(y[a] for a in resized) * max(1, math.prod(x[a] for a in resized[:-1]))


#: op type → its Python-loop steps at the inferred shapes (None: unknown). The operators not here run as
#: numpy on whole tensors, or loop once per output element, measured here (onnx 1.17): MaxPool and AveragePool
#: 6–7 µs, ConvTranspose 2 µs, RoiAlign 5 µs, GridSample 7 µs (nearest) to 75–140 µs (linear, growing with
#: the input) per output element. A GridSample of a million outputs takes minutes and is not foreseen yet.
STEPS: dict[str, Callable[[onnx.NodeProto, Mapping[str, tuple[int, ...]]], int | None]] = {"Resize": _resize_steps}
_VERBS = {"Resize": "interpolates"}


@functools.cache
def _pace(op_type: str) -> float:
    """Seconds per step of ``op_type`` in this process's onnx.reference: the fastest of three runs of a small
    model (its thread's CPU time), divided by its steps."""
    model, feeds = _PACE_MODELS[op_type]()
    shapes = {name: value.shape for name, value in feeds.items()}
    steps = STEPS[op_type](model.graph.node[0], concrete_shapes(model, shapes))
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model)
    fastest = math.inf
    for _ in range(3):  # CPU time of this thread: a run beside another thread or process is not slower here
        started = time.thread_time()
        evaluator.run(None, feeds)
        fastest = min(fastest, time.thread_time() - started)
    assert steps
    return fastest / steps


def _resize_pace_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """1×2×6×6 → 1×2×12×12, linear: 288 outputs × 12 steps each."""
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")], "pace",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, {"x": np.linspace(0, 1, 72, dtype=np.float32).reshape(1, 2, 6, 6)}


_PACE_MODELS: dict[str, Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]] = {
    "Resize": _resize_pace_model}


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"
