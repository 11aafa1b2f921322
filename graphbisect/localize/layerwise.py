"""Layerwise comparison: per-tensor statistics in topological order, first divergence, root causes.

The automatic version of MegEngine's divergence tree and Paddle's precision-debug table. Given the oracle's
and the target's values of every intermediate tensor, each node gets

* its output statistics (:class:`~graphbisect.compare.TensorStats`; the score is measured in tolerances),
* the worst score among its inputs (graph inputs and initializers are fed identically, so they score 0),
* an **amplification** = output score ÷ max(input score, 1): how much this node multiplied the error,
  in tolerance units. A node whose inputs all match and whose output fails is a *divergence root*, and its
  amplification is simply its output score.

The first divergence is the first failing tensor in topological order; root causes are failing nodes
ranked by amplification, roots (inputs within tolerance) first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx

from graphbisect.compare import MismatchKind, TensorStats, Tolerance, compare_tensors

__all__ = ["LayerRow", "LayerwiseReport", "RootCause", "TensorSource", "analyze_layers"]


class TensorSource(Protocol):
    """Tensors by name: a dict of arrays, or an :class:`~graphbisect.data.ActivationStore` (memory-mapped)."""

    def __contains__(self, name: object, /) -> bool: ...

    def __getitem__(self, name: str, /) -> np.ndarray: ...


@dataclass(frozen=True)
class LayerRow:
    """One row of the layerwise table: one output tensor of one node."""

    index: int  # node index in topological order
    node: str
    op_type: str
    tensor: str
    stats: TensorStats
    input_score: float
    amplification: float

    @property
    def compared(self) -> bool:
        """False when the target could not expose this tensor (e.g. it was fused away)."""
        return self.stats.kind is not MismatchKind.MISSING

    def to_json(self) -> dict[str, object]:
        stats = self.stats.to_json()
        stats.pop("name")
        return {"index": self.index, "node": self.node, "op_type": self.op_type, "tensor": self.tensor,
                "input_score": _finite(self.input_score), "amplification": _finite(self.amplification),
                **stats}


@dataclass(frozen=True)
class RootCause:
    node: str
    op_type: str
    tensor: str
    score: float  # amplification, in tolerance units
    output_score: float
    input_score: float
    is_root: bool  # inputs within tolerance: the error starts here

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "op_type": self.op_type, "tensor": self.tensor, "score": _finite(self.score),
                "output_score": _finite(self.output_score), "input_score": _finite(self.input_score),
                "is_root": self.is_root}


@dataclass(frozen=True)
class LayerwiseReport:
    rows: tuple[LayerRow, ...]
    first_divergence: LayerRow | None
    root_causes: tuple[RootCause, ...]

    @property
    def compared(self) -> int:
        return sum(row.compared for row in self.rows)


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else ("inf" if value > 0 else "nan" if math.isnan(value) else "-inf")


def analyze_layers(
    nodes: Sequence[onnx.NodeProto],
    oracle: TensorSource,
    target: TensorSource,
    tol: Tolerance | None = None,
    *,
    max_root_causes: int = 10,
    on_row: Callable[[LayerRow], None] | None = None,
) -> LayerwiseReport:
    """Compare every node output the oracle captured, in the given (topological) order.

    Tensors the oracle does not have (optional outputs, non-tensor values) are skipped; tensors the target
    lacks appear as rows of kind ``missing`` and never count as a divergence. ``on_row`` lets a caller
    stream rows (progress, a live table) while the comparison runs.

    Example:
        >>> from onnx import helper
        >>> nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Neg", ["a"], ["y"], name="n")]
        >>> o = {"a": np.ones(2, np.float32), "y": -np.ones(2, np.float32)}
        >>> t = {"a": np.ones(2, np.float32), "y": np.ones(2, np.float32)}
        >>> report = analyze_layers(nodes, o, t)
        >>> report.first_divergence.node, report.root_causes[0].node
        ('n', 'n')
    """
    tol = tol or Tolerance()
    scores: dict[str, float] = {}  # tensor → its score; absent = graph input / initializer / not compared
    rows: list[LayerRow] = []
    for index, node in enumerate(nodes):
        input_score = max((scores.get(name, 0.0) for name in node.input if name), default=0.0)
        for tensor in node.output:
            if not tensor or tensor not in oracle:
                continue
            stats = compare_tensors(tensor, oracle[tensor], target[tensor] if tensor in target else None, tol)
            if stats.kind is not MismatchKind.MISSING:
                scores[tensor] = stats.score
            amplification = stats.score / max(input_score, 1.0) if stats.kind is not MismatchKind.MISSING else 0.0
            row = LayerRow(index, node.name, node.op_type, tensor, stats, input_score, amplification)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    first = next((row for row in rows if row.compared and not row.stats.passed), None)
    return LayerwiseReport(tuple(rows), first, _rank_root_causes(rows, max_root_causes))


def _rank_root_causes(rows: Sequence[LayerRow], limit: int) -> tuple[RootCause, ...]:
    best: dict[str, LayerRow] = {}  # one entry per node: its worst output
    for row in rows:
        failing = row.compared and not row.stats.passed
        if failing and (row.node not in best or row.amplification > best[row.node].amplification):
            best[row.node] = row
    ranked = sorted(
        best.values(),
        # Roots first; among equals, higher amplification, then earlier in the graph.
        key=lambda r: (r.input_score > 1.0, -_sortable(r.amplification), r.index),
    )
    return tuple(
        RootCause(r.node, r.op_type, r.tensor, r.amplification, r.stats.score, r.input_score, r.input_score <= 1.0)
        for r in ranked[:limit]
    )


def _sortable(value: float) -> float:
    return 0.0 if math.isnan(value) else value
