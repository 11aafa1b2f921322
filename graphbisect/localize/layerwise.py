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

**A node is never blamed for error it received.** A tensor the target does not expose (fused away,
eliminated) has no score of its own; it carries, as an estimate, the error that entered the unexposed
nodes computing it (their inputs' worst score, transitively). A node reading such a tensor has that
estimate in its ``input_score`` and the tensor in ``hidden_inputs``: its inputs were not measured, so it
is a root only when a run of it alone (its compiled region fed with the oracle's values,
``alone``) shows that the error starts inside it. Before, an unexposed input counted as exact: the
bundled example's correct LayerNorm after a fused-away Reshape ranked second as a "root" (927), with
error of 1,229× tolerance already upstream. Each :class:`RootCause` says what its place rests on
(``evidence``): ``measured``, ``confirmed`` / ``received`` (run alone), or ``unconfirmed``.
"""

from __future__ import annotations

import dataclasses
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
from graphbisect.storage.gcpause import gc_paused

#: The ``kind`` of a layerwise row whose tensor the target did not expose (JSON, CSV, HTML).
NOT_OBSERVED = "not-observed"

__all__ = ["CONFIRMED", "EVIDENCE", "MEASURED", "NOT_OBSERVED", "RECEIVED", "UNCONFIRMED", "LayerRow",
           "LayerwiseReport", "RootCause", "TensorSource", "analyze_layers", "constant_tensors", "ranked_with",
           "tensor_stats"]


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
    #: inputs (of its compiled node) the target did not expose: ``input_score`` counts the error estimated to
    #: reach them (see the module docstring), and only a run alone can make this node a root
    hidden_inputs: tuple[str, ...] = ()

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
    def passes_on(self) -> bool:
        """An exact tensor (integer or boolean, not quantized) that differs while an input its node reads already
        differs, within the tolerance: an exact op maps equal inputs to equal outputs, so the input's difference
        alone shows as its "inf×" (a MatMulInteger reading a 1-LSB rounding flip), and whether the node adds an
        error of its own only a run of it alone on the oracle's inputs says (ONNX Runtime's u8×s8 MatMulInteger
        saturates on AVX2 without VNNI: that one does). Like a node whose inputs were not exposed, it is never a
        root on this run's word.

        Example:
            >>> from graphbisect.compare import compare_tensors
            >>> s = compare_tensors("y", np.zeros(2, np.int32), np.array([0, 5], np.int32))
            >>> LayerRow(0, "mm", "MatMulInteger", "y", s, 0.5, math.nan).passes_on
            True
            >>> LayerRow(0, "mm", "MatMulInteger", "y", s, 0.0, math.inf).passes_on
            False
        """
        if not self.compared or self.stats.passed:  # most rows: decided before the dtype's name is read
            return False
        exact = (self.stats.oracle_dtype or "").startswith(("int", "uint", "bool"))
        return exact and self.step is None and 0.0 < self.input_score <= 1.0

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
                "lsb": None if self.lsb is None else _finite(self.lsb), "hidden_inputs": list(self.hidden_inputs),
                **stats}


#: What a root cause's place rests on (:attr:`RootCause.evidence`).
MEASURED = "measured"  # every input was exposed and compared: the amplification is measured
CONFIRMED = "confirmed"  # inputs not exposed; run alone on the oracle's values it fails: the error starts inside
RECEIVED = "received"  # inputs not exposed; run alone on the oracle's values it passes: its error came to it
UNCONFIRMED = "unconfirmed"  # inputs not exposed and not run alone: never a root, amplification estimated
EVIDENCE = (MEASURED, CONFIRMED, RECEIVED, UNCONFIRMED)


@dataclass(frozen=True)
class RootCause:
    """A failing (compiled) node, ranked by how much error it adds (see the module docstring)."""

    node: str
    op_type: str
    tensor: str
    #: amplification in tolerance units (output ÷ max(input, 1)); for a root confirmed by a run alone, the
    #: error it makes on the oracle's inputs
    score: float
    output_score: float
    input_score: float  # measured, or estimated where ``hidden_inputs`` (see the module docstring)
    is_root: bool  # the error starts here: inputs measured within tolerance, or confirmed by a run alone
    compiled_as: CompiledNode | None = None  # the compiled node (and the original nodes it replaced)
    evidence: str = MEASURED  # one of EVIDENCE: what ``is_root`` and ``score`` rest on
    hidden_inputs: tuple[str, ...] = ()  # inputs the target did not expose
    alone_score: float | None = None  # its output's error when run alone on the oracle's inputs, if it was

    @property
    def role(self) -> str:
        """``root`` (the error starts here), ``amplifies`` (it multiplies the error it reads), ``carries`` (it
        fails on inputs that already fail, without multiplying the error: amplification at most 1, or unknown
        when input and output are both off by infinitely many tolerances) or ``uncertain`` (its inputs were not
        exposed, the error estimated to reach them is within tolerance, and it was not run alone: the error
        starts in it or in the unexposed nodes before it).

        Example:
            >>> RootCause("n", "Neg", "y", math.nan, math.inf, math.inf, False).role
            'carries'
            >>> RootCause("n", "Neg", "y", 9.0, 9.0, 0.0, False, evidence=UNCONFIRMED, hidden_inputs=("a",)).role
            'uncertain'
        """
        if self.is_root:
            return "root"
        if self.evidence == UNCONFIRMED and self.input_score <= 1.0:
            return "uncertain"
        return "amplifies" if self.score > 1.0 else "carries"  # NaN > 1.0 is False

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "op_type": self.op_type, "tensor": self.tensor, "score": _finite(self.score),
                "output_score": _finite(self.output_score), "input_score": _finite(self.input_score),
                "is_root": self.is_root, "role": self.role, "evidence": self.evidence,
                "hidden_inputs": list(self.hidden_inputs),
                "alone_score": None if self.alone_score is None else _finite(self.alone_score),
                "compiled_as": None if self.compiled_as is None else self.compiled_as.to_json()}


@dataclass(frozen=True)
class LayerwiseReport:
    """The layerwise table: every row, the first divergence and the ranked root causes."""

    rows: tuple[LayerRow, ...]
    first_divergence: LayerRow | None
    root_causes: tuple[RootCause, ...]
    #: failing (compiled) nodes whose inputs the target did not expose and that no run alone judged yet: the
    #: best row of each, in rank order (what :func:`analyze_layers`' ``alone`` can settle)
    uncertain: tuple[LayerRow, ...] = ()

    @property
    def compared(self) -> int:
        return sum(row.compared for row in self.rows)

    @property
    def differing_constants(self) -> tuple[LayerRow, ...]:
        """Constant tensors whose exposed values differ (shown, never ranked: see the module docstring)."""
        return tuple(row for row in self.rows if row.constant and row.compared and not row.stats.passed)


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else ("inf" if value > 0 else "nan" if math.isnan(value) else "-inf")


@gc_paused()
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
    alone: Mapping[str, TensorStats] | None = None,
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
    ``alone``: for rows whose inputs the target did not expose (``hidden_inputs``), the statistics of their
    tensor when their compiled region ran alone on the oracle's values, by tensor name: a failure there makes
    the node a root (``confirmed``), a pass clears it (``received``); without it such a node is never a root
    (``unconfirmed``), and it is listed in :attr:`LayerwiseReport.uncertain`.

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
    rows = _layer_rows(nodes, oracle, target, tol, on_row=on_row, compiled=compiled, measured=measured,
                       first_only=first_only, outputs=outputs, floor=floor)
    first = next((row for row in rows if _diverges(row)), None)
    causes, uncertain = _rank_root_causes(rows, max_root_causes, alone or {}, floor)
    return LayerwiseReport(tuple(rows), first, causes, uncertain)


def ranked_with(report: LayerwiseReport, alone: Mapping[str, TensorStats], floor: NoiseFloor | None = None, *,
                max_root_causes: int = 10) -> LayerwiseReport:
    """``report`` (of :func:`analyze_layers` without ``alone``, with this ``floor``) as :func:`analyze_layers`
    gives it with ``alone``: the rows and the first divergence do not depend on it, only the root causes and
    the uncertain rows, which are ranked again. The table is not made twice (thousands of rows)."""
    causes, uncertain = _rank_root_causes(report.rows, max_root_causes, alone, floor)
    return dataclasses.replace(report, root_causes=causes, uncertain=uncertain)


def _layer_rows(nodes: Sequence[onnx.NodeProto], oracle: TensorSource, target: TensorSource | None,
                tol: Tolerance, *, on_row: Callable[[LayerRow], None] | None, compiled: CompiledGraph | None,
                measured: Mapping[str, TensorStats] | None, first_only: bool, outputs: Collection[str],
                floor: NoiseFloor | None) -> list[LayerRow]:
    """The table of :func:`analyze_layers`: a row per captured node output, each with the worst error among
    the inputs its node (or compiled group) reads and how much it amplifies it."""
    scores: dict[str, float] = {}  # tensor → its score; absent = graph input / initializer / not compared
    rows: list[LayerRow] = []
    groups = compiled.by_original() if compiled is not None else {}
    reads = _group_inputs(nodes, groups)
    # A constant that is a graph output has no consumer to show a wrong fold: its own row is the failure.
    constants = constant_tensors(nodes).difference(outputs)
    carried: dict[str, float] = {}  # a tensor the target did not expose → the error estimated to reach it
    for index, node in enumerate(nodes):
        group = groups.get(node.name)
        inputs = reads.get(group.name, node.input) if group is not None else node.input
        input_score, hidden = _input_error(inputs, scores, carried)
        for tensor in node.output:
            if not tensor or tensor not in oracle:
                continue
            stats = tensor_stats(tensor, oracle, target, tol, measured)
            constant = tensor in constants
            noise = floor is not None and floor.at_floor(stats)
            if stats.kind is not MismatchKind.MISSING and not constant and not noise:
                scores[tensor] = stats.score
            elif stats.kind is MismatchKind.MISSING and not constant:
                carried[tensor] = 0.0 if node.op_type in _SHAPE_ONLY else input_score
            amplification = stats.score / max(input_score, 1.0) if stats.kind is not MismatchKind.MISSING else 0.0
            row = LayerRow(index, node.name, node.op_type, tensor, stats, input_score, amplification, group,
                           constant, floor.scores.get(tensor) if floor is not None and floor.measured else None,
                           noise, tol.quantized.get(tensor) if tol.quantized else None, hidden)
            if row.passes_on:  # its "inf×" measures the difference it read, not one it made: unknown
                row = dataclasses.replace(row, amplification=math.nan)
            rows.append(row)
            if on_row is not None:
                on_row(row)
        if first_only and rows and _diverges(rows[-1]):
            break
    return rows


def _input_error(inputs: Sequence[str], scores: Mapping[str, float], carried: Mapping[str, float]
                 ) -> tuple[float, tuple[str, ...]]:
    """(the worst error among ``inputs``: measured, or estimated for those the target did not expose; the
    latter). Graph inputs, initializers, constants and tensors at the noise floor count as exact."""
    worst = 0.0
    hidden: list[str] = []
    for name in inputs:
        if not name:
            continue
        if name in scores:
            worst = max(worst, scores[name])
        elif name in carried:
            worst = max(worst, carried[name])
            hidden.append(name)
    return worst, tuple(dict.fromkeys(hidden))


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


#: Ops whose output depends on their input's shape only: an unexposed output of one carries no value error.
_SHAPE_ONLY = frozenset({"Shape", "Size"})

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
    """Compiled node name → the tensors its original nodes read that none of them produces, for the compiled
    nodes of more than one original node (one node's are its inputs: no node reads its own output)."""
    members: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        compiled = groups.get(node.name)
        if compiled is not None and len(compiled.originals) > 1:
            members.setdefault(compiled.name, []).append(node)
    reads: dict[str, list[str]] = {}
    for name, group in members.items():
        produced = {out for node in group for out in node.output}
        reads[name] = list(dict.fromkeys(i for node in group for i in node.input if i and i not in produced))
    return reads


def _rank_root_causes(rows: Sequence[LayerRow], limit: int, alone: Mapping[str, TensorStats],
                      floor: NoiseFloor | None) -> tuple[tuple[RootCause, ...], tuple[LayerRow, ...]]:
    """(the root causes, best first; the uncertain rows: hidden inputs, not run alone, in rank order)."""
    best: dict[str, LayerRow] = {}  # one entry per node (per compiled node, when known): its worst output
    for row in rows:
        failing = _diverges(row)
        key = row.compiled_as.name if row.compiled_as is not None else row.node
        if failing and (key not in best or row.amplification > best[key].amplification):
            best[key] = row
    causes = [_cause(row, alone.get(row.tensor) if row.hidden_inputs or row.passes_on else None, floor)
              for row in best.values()]
    # Roots first (the error starts there: the largest error made first); among the others, higher
    # amplification, then earlier in the graph.
    ranked = sorted(zip(causes, best.values(), strict=True),
                    key=lambda pair: (not pair[0].is_root, -_sortable(pair[0].score), pair[1].index))
    uncertain = tuple(row for cause, row in ranked if cause.evidence == UNCONFIRMED)
    return tuple(cause for cause, _ in ranked[:limit]), uncertain


def _cause(row: LayerRow, alone: TensorStats | None, floor: NoiseFloor | None) -> RootCause:
    """The row as a root cause: its inputs measured, or hidden (or an exact output passing on an accepted input
    difference, :attr:`LayerRow.passes_on`: whether it adds an error of its own is not in this run) and settled
    by its run alone (``alone``) or not."""
    if not row.hidden_inputs and not row.passes_on:
        evidence, is_root, score = MEASURED, row.input_score <= 1.0, row.amplification
    elif alone is None or alone.kind is MismatchKind.MISSING:
        evidence, is_root, score = UNCONFIRMED, False, row.amplification
    elif not alone.passed and not (floor is not None and floor.at_floor(alone)):
        evidence, is_root, score = CONFIRMED, True, alone.score
    else:
        evidence, is_root, score = RECEIVED, False, row.amplification
    return RootCause(row.node, row.op_type, row.tensor, score, row.stats.score, row.input_score, is_root,
                     row.compiled_as, evidence, row.hidden_inputs,
                     None if alone is None or alone.kind is MismatchKind.MISSING else alone.score)


def _sortable(value: float) -> float:
    return 0.0 if math.isnan(value) else value
