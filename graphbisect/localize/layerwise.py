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

**Constants are never causes.** A tensor computed from no graph input (a ``Constant``, or a node reading
only such tensors) is folded by the target at build time; exposing it shows how the target *stores* it,
not a computation: OpenVINO returns an int64 Slice end of INT64_MIN as INT32_MIN (its CPU plugin keeps
i64 constants as i32, the same "slice from the start" meaning) and an empty float constant as ``[1]``,
which scored "inf×" and topped the root causes of models that pass (Silero VAD). Their rows are kept and
flagged ``constant``, but they are never the first divergence or a root cause, and their score does not
count as an input error of their consumers: if a wrongly folded constant matters, its consumer diverges.
A constant that is itself a graph output (``outputs``) has no consumer: it is compared like any tensor, since
its value is the model's result (else a FAIL on it read "no intermediate tensor diverges").

With the target's :class:`~graphbisect.localize.compiled.CompiledGraph`, each row also says what the target
compiled its node as, a node's inputs are those of the compiled node it belongs to (a fused node reads
the tensors its group reads, not the vanished ones inside it), and root causes are ranked per compiled
node: the fused node, reported with the original nodes it replaced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx

from graphbisect.compare import MismatchKind, TensorStats, Tolerance, compare_tensors, compare_values
from graphbisect.data.store import ActivationStore
from graphbisect.localize.compiled import CompiledGraph, CompiledNode
from graphbisect.oracle.floor import NoiseFloor

#: The ``kind`` of a layerwise row whose tensor the target did not expose (JSON, CSV, HTML).
NOT_OBSERVED = "not-observed"

__all__ = ["NOT_OBSERVED", "LayerRow", "LayerwiseReport", "RootCause", "TensorSource", "analyze_layers",
           "constant_tensors", "tensor_stats"]


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
    compiled_as: CompiledNode | None = None  # the target's compiled node covering this node, when known
    constant: bool = False  # computed from no graph input: folded at build time, never a cause (see above)
    #: the target's noise floor here (its error with optimizations off, in tolerances), when measured
    floor: float | None = None
    #: fails the tolerance, but within the noise floor's margin: kernel precision, never a divergence
    at_floor: bool = False
    #: its quantization step when it is quantized (compared in steps: :meth:`Tolerance.bounds`; 0: scale unknown)
    step: float | None = None

    @property
    def lsb(self) -> float | None:
        """Its worst error in quantization steps (LSB): an integer's own difference, a float's ÷ its step; None
        when it is not quantized (or its scale is unknown and it is a float).

        Example:
            >>> from graphbisect.compare import compare_tensors
            >>> s = compare_tensors("q", np.zeros(2, np.int8), np.array([0, 3], np.int8))
            >>> LayerRow(0, "q", "QuantizeLinear", "q", s, 0.0, 0.0, step=0.05).lsb
            3.0
        """
        if self.step is None or not self.compared:
            return None
        integer = (self.stats.oracle_dtype or "").startswith(("int", "uint"))
        return self.stats.max_abs if integer else self.stats.max_abs / self.step if self.step > 0 else None

    @property
    def compared(self) -> bool:
        """False when the target could not expose this tensor (e.g. it was fused away)."""
        return self.stats.kind is not MismatchKind.MISSING

    def to_json(self) -> dict[str, object]:
        """The row as JSON. A tensor the target did not expose (fused away, folded) was **not observed**: its
        ``kind`` is ``not-observed`` and ``passed``, ``score`` and ``amplification`` are null — never a failure
        (a passing run's fused-away tensors read as 1,350 failed rows of ``score: inf`` before)."""
        stats = self.stats.to_json()
        stats.pop("name")
        observed = self.compared
        if not observed:
            stats.update(kind=NOT_OBSERVED, passed=None, score=None)
        return {"index": self.index, "node": self.node, "op_type": self.op_type, "tensor": self.tensor,
                "observed": observed, "input_score": _finite(self.input_score),
                "amplification": _finite(self.amplification) if observed else None,
                "compiled_as": None if self.compiled_as is None else self.compiled_as.to_json(),
                "constant": self.constant, "floor": None if self.floor is None else _finite(self.floor),
                "at_floor": self.at_floor, "quantization_step": self.step,
                "lsb": None if self.lsb is None else _finite(self.lsb), **stats}


@dataclass(frozen=True)
class RootCause:
    node: str
    op_type: str
    tensor: str
    score: float  # amplification, in tolerance units
    output_score: float
    input_score: float
    is_root: bool  # inputs within tolerance: the error starts here
    compiled_as: CompiledNode | None = None  # the compiled node (and the original nodes it replaced)

    @property
    def role(self) -> str:
        """``root`` (its inputs match: the error starts here), ``amplifies`` (it multiplies the error it reads)
        or ``carries`` (it fails on inputs that already fail, without multiplying the error: amplification at
        most 1, or unknown when input and output are both off by infinitely many tolerances).

        Example:
            >>> RootCause("n", "Neg", "y", math.nan, math.inf, math.inf, False).role
            'carries'
        """
        if self.is_root:
            return "root"
        return "amplifies" if self.score > 1.0 else "carries"  # NaN > 1.0 is False

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "op_type": self.op_type, "tensor": self.tensor, "score": _finite(self.score),
                "output_score": _finite(self.output_score), "input_score": _finite(self.input_score),
                "is_root": self.is_root, "role": self.role,
                "compiled_as": None if self.compiled_as is None else self.compiled_as.to_json()}


@dataclass(frozen=True)
class LayerwiseReport:
    rows: tuple[LayerRow, ...]
    first_divergence: LayerRow | None
    root_causes: tuple[RootCause, ...]

    @property
    def compared(self) -> int:
        return sum(row.compared for row in self.rows)

    @property
    def differing_constants(self) -> tuple[LayerRow, ...]:
        """Constant tensors whose exposed values differ (shown, never ranked: see the module docstring)."""
        return tuple(row for row in self.rows if row.constant and row.compared and not row.stats.passed)


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else ("inf" if value > 0 else "nan" if math.isnan(value) else "-inf")


def analyze_layers(
    nodes: Sequence[onnx.NodeProto],
    oracle: TensorSource,
    target: TensorSource | None,
    tol: Tolerance | None = None,
    *,
    max_root_causes: int = 10,
    on_row: Callable[[LayerRow], None] | None = None,
    compiled: CompiledGraph | None = None,
    measured: Mapping[str, TensorStats] | None = None,
    first_only: bool = False,
    outputs: Collection[str] = (),
    floor: NoiseFloor | None = None,
) -> LayerwiseReport:
    """Compare every node output the oracle captured, in the given (topological) order.

    Tensors the oracle does not have (optional outputs, non-tensor values) are skipped; tensors the target
    lacks appear as rows of kind ``missing`` and never count as a divergence. ``on_row`` lets a caller
    stream rows (progress, a live table) while the comparison runs. ``compiled`` is the target's compiled
    graph (see the module docstring). ``measured``: statistics already measured against ``oracle`` (by the
    target's worker, :attr:`~graphbisect.backends.RunResult.stats`), used instead of comparing values;
    ``target`` may then be None. ``first_only`` stops at the first divergence (the pass search needs no
    more: its rows end there and root causes are ranked among them). ``outputs``: the graph's outputs
    (a constant among them is not exempt; see the module docstring). ``floor``: the target's noise floor
    (:mod:`graphbisect.oracle.floor`); a tensor failing within its margin is flagged ``at_floor`` (kernel
    precision), and is neither the first divergence nor a root cause nor an input error of its consumers.

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
    groups = compiled.by_original() if compiled is not None else {}
    reads = _group_inputs(nodes, groups)
    # A constant that is a graph output has no consumer to show a wrong fold: its own row is the failure.
    constants = constant_tensors(nodes).difference(outputs)
    for index, node in enumerate(nodes):
        group = groups.get(node.name)
        inputs = reads[group.name] if group is not None else node.input
        input_score = max((scores.get(name, 0.0) for name in inputs if name), default=0.0)
        for tensor in node.output:
            if not tensor or tensor not in oracle:
                continue
            stats = tensor_stats(tensor, oracle, target, tol, measured)
            constant = tensor in constants
            noise = floor is not None and floor.at_floor(stats)
            if stats.kind is not MismatchKind.MISSING and not constant and not noise:
                scores[tensor] = stats.score
            amplification = stats.score / max(input_score, 1.0) if stats.kind is not MismatchKind.MISSING else 0.0
            row = LayerRow(index, node.name, node.op_type, tensor, stats, input_score, amplification, group,
                           constant, floor.scores.get(tensor) if floor is not None and floor.measured else None,
                           noise, tol.quantized.get(tensor) if tol.quantized else None)
            rows.append(row)
            if on_row is not None:
                on_row(row)
        if first_only and rows and _diverges(rows[-1]):
            break
    first = next((row for row in rows if _diverges(row)), None)
    return LayerwiseReport(tuple(rows), first, _rank_root_causes(rows, max_root_causes))


def tensor_stats(name: str, oracle: TensorSource, target: TensorSource | None, tol: Tolerance,
                 measured: Mapping[str, TensorStats] | None = None) -> TensorStats:
    """How the target's ``name`` compares with the oracle's: measured already (``measured``, by the target's
    worker), compared from both values, or ``missing`` when the target (or the oracle) lacks it.

    Example:
        >>> tensor_stats("y", {"y": np.zeros(2)}, {}, Tolerance()).kind.value
        'missing'
    """
    if measured is not None and name in measured:
        return measured[name]
    if name in oracle and target is not None and name in target:
        return compare_values(name, oracle[name], target[name], tol)
    described = oracle.describe(name) if isinstance(oracle, ActivationStore) else None
    if described is not None:  # a stored plain tensor: its shape is in the store's index, no value is read
        return TensorStats(name, MismatchKind.MISSING, score=math.inf, oracle_shape=described[1])
    return compare_tensors(name, oracle[name] if name in oracle else None, None, tol)


_NOT_CONSTANT = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                           "Bernoulli"})


def constant_tensors(nodes: Sequence[onnx.NodeProto], given: Collection[str] = ()) -> set[str]:
    """The outputs of nodes that read no graph input: nodes without inputs (``Constant``) and, transitively,
    nodes that read only such outputs (a ``Cast`` or ``Concat`` of constants). Tensors no node produces
    (graph inputs, and initializers too: this sees only nodes) are not constant here unless ``given`` (e.g. the
    initializers, to find a weight's DequantizeLinear); random ops never are. ``given`` is not in the result.

    Example:
        >>> from onnx import helper
        >>> nodes = [helper.make_node("Constant", [], ["c"]), helper.make_node("Neg", ["c"], ["n"]),
        ...          helper.make_node("Add", ["x", "n"], ["y"])]
        >>> sorted(constant_tensors(nodes))
        ['c', 'n']
    """
    constant: set[str] = set(given)
    for node in nodes:  # topological order
        if node.op_type in _NOT_CONSTANT or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                for a in node.attribute):
            continue
        if all(name in constant for name in node.input if name):
            constant.update(name for name in node.output if name)
    return constant.difference(given)


def _diverges(row: LayerRow) -> bool:
    return row.compared and not row.stats.passed and not row.constant and not row.at_floor


def _group_inputs(nodes: Sequence[onnx.NodeProto], groups: dict[str, CompiledNode]) -> dict[str, list[str]]:
    """Compiled node name → the tensors its original nodes read that none of them produces."""
    members: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        if node.name in groups:
            members.setdefault(groups[node.name].name, []).append(node)
    reads: dict[str, list[str]] = {}
    for name, group in members.items():
        produced = {out for node in group for out in node.output}
        reads[name] = list(dict.fromkeys(i for node in group for i in node.input if i and i not in produced))
    return reads


def _rank_root_causes(rows: Sequence[LayerRow], limit: int) -> tuple[RootCause, ...]:
    best: dict[str, LayerRow] = {}  # one entry per node (per compiled node, when known): its worst output
    for row in rows:
        failing = _diverges(row)
        key = row.compiled_as.name if row.compiled_as is not None else row.node
        if failing and (key not in best or row.amplification > best[key].amplification):
            best[key] = row
    ranked = sorted(
        best.values(),
        # Roots first; among equals, higher amplification, then earlier in the graph.
        key=lambda r: (r.input_score > 1.0, -_sortable(r.amplification), r.index),
    )
    return tuple(
        RootCause(r.node, r.op_type, r.tensor, r.amplification, r.stats.score, r.input_score, r.input_score <= 1.0,
                  r.compiled_as)
        for r in ranked[:limit]
    )


def _sortable(value: float) -> float:
    return 0.0 if math.isnan(value) else value
