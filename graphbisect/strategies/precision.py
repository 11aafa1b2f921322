"""The precision search: the fewest nodes that must stay FP32 for the lowered model to meet the tolerance.

Units are the lowerable nodes (:func:`graphbisect.precision.lowerable_nodes`, topological order); a keep-set
is the set of units *kept in FP32*, everything else is lowered. The test is inverted with respect to bug
reduction: a keep-set is **interesting (FAIL)** when the lowered model **meets** the tolerance, so the
engine's 1-minimal failing set is a 1-minimal FP32 set — removing any one node from it breaks the
tolerance. A run that crashes (some runtimes mis-fuse mixed-precision graphs) is UNRESOLVED, never accepted.

* :func:`search_keep_fp32`: ProbDD with per-node priors (from :func:`sensitivity`, or from the layerwise
  error amplification of one fully lowered run: :func:`layerwise_priors`), O(k log n) runs for k needed
  nodes, then the one-by-one sweep (1-minimality), told each removal's output error (:func:`error_margin`):
  int8 error is cumulative and cancels (on PP-OCRv4 rec, keeping in FP32 the 200 nodes that break it most
  when lowered alone still misses the tolerance 4.6-fold), so every removal re-opens others; removals that
  pushed the error past a whole tolerance wait for the sweep's closing round instead of being retried
  after each removal (:mod:`graphbisect.engine.search`);
* :func:`prefix_answer`: what ``polygraphy debug precision`` does — bisect the length of the topological
  prefix kept in FP32 (same evaluator, so cached runs are shared);
* :func:`sensitivity`: 2 runs per node (only it lowered; only it kept FP32), ranked;
* :func:`alone_breakers`: the nodes whose lowering alone breaks the tolerance, in ``|keep|`` runs
  (under monotonicity every such node is in the minimal set).

Example:
    >>> tester = PrecisionTester(lowering, proc, workdir, inputs_path, expected, tol)   # doctest: +SKIP
    >>> ev = Evaluator(tester, len(lowering.units), allow_empty=True)                  # doctest: +SKIP
    >>> sorted(lowering.names(search_keep_fp32(ev).keep))                               # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from graphbisect.backends import RunResult
from graphbisect.backends.process import CompareTo
from graphbisect.compare import Comparison, Tolerance, compare_outputs
from graphbisect.engine import Evaluator, Outcome, SearchResult, TestResult, bisect_prefix, probdd
from graphbisect.localize.layerwise import LayerwiseReport
from graphbisect.model.io import WeightsPool, remove_model, save_proto
from graphbisect.precision.lowering import Lowering
from graphbisect.storage.atomic import atomic_write_text

__all__ = [
    "DENSE_AFTER",
    "Measurement",
    "ModelRunner",
    "PrecisionTester",
    "SensitivityRow",
    "alone_breakers",
    "error_margin",
    "layerwise_priors",
    "prefix_answer",
    "search_keep_fp32",
    "sensitivity",
    "sensitivity_priors",
]

logger = logging.getLogger(__name__)


class ModelRunner(Protocol):
    """Runs a model file on the target: a :class:`~graphbisect.backends.BackendProcess`, or a
    :class:`~graphbisect.oracle.tester.WorkerPool` of them for candidates tested in parallel."""

    def run(self, model: str | Path, inputs: Path, *, compare_to: CompareTo | None = None) -> RunResult: ...


@dataclass(frozen=True)
class Measurement:
    """One run of a lowered model: the run and its comparison with the oracle's final outputs."""

    run: RunResult
    comparison: Comparison | None

    @property
    def meets(self) -> bool:
        return self.run.ok and self.comparison is not None and self.comparison.passed

    def metrics(self) -> dict[str, float]:
        """Worst output's ``score`` (in tolerances), ``cosine``, ``snr_db``, ``max_abs`` (inf when it crashed)."""
        worst = self.comparison.worst if self.comparison is not None else None
        if worst is None:
            return {"score": math.inf, "cosine": 0.0, "snr_db": -math.inf, "max_abs": math.inf}
        score = worst.score if not math.isnan(worst.score) else math.inf
        if worst.target_nonfinite:
            score = math.inf
        return {"score": score, "cosine": worst.cosine, "snr_db": worst.snr_db, "max_abs": worst.max_abs}


class PrecisionTester:
    """The engine's test: lower all units but ``keep``, run the target, compare final outputs.

    With a runtime-pins lowering (``lowering.runtime_pins``), ``pin_file`` is the file the target's spec
    names (``openvino:keep_fp32=@FILE``): each measurement writes the keep-set's node names there before
    the run, and the candidate model's path (one per keep-set) makes the worker load it afresh.
    ``run_model``: the file the target runs instead of the candidate ONNX model, for a target that runs
    its own format (the original Paddle program; runtime pins only, the model is never rewritten then, and
    the runtime's ``load_key`` makes the worker reload when the pins change). Measurements may run in
    parallel threads (``proc`` a worker pool) when the lowering rewrites the model (one file per keep-set);
    runtime pins share the one pin file, so they must not.

    Candidates share one weights file (``share_weights``, :class:`~graphbisect.model.io.WeightsPool`): each
    is saved as its graph, its large initializers read from that file by ONNX external data. A tester whose
    one model is what a user gets (a verification) passes False and runs the model as it is delivered,
    its weights inline.
    """

    def __init__(self, lowering: Lowering, proc: ModelRunner, workdir: Path, inputs: Path, *,
                 expected: Mapping[str, np.ndarray], tol: Tolerance, pin_file: Path | None = None,
                 run_model: Path | None = None, share_weights: bool = True) -> None:
        if lowering.runtime_pins and pin_file is None:
            raise ValueError("a runtime-pins lowering needs the pin_file its target reads")
        if run_model is not None and not lowering.runtime_pins:
            raise ValueError("only a runtime-pins lowering runs the target's own model file")
        self.lowering, self.proc, self.workdir, self.inputs = lowering, proc, workdir, inputs
        self.expected, self.tol, self.pin_file, self.run_model = expected, tol, pin_file, run_model
        #: the largest peak memory a target worker reported for a measurement (``RunResult.peak_memory``)
        self.peak_memory: int | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        self._pool = WeightsPool(workdir) if share_weights and run_model is None else None

    def measure(self, keep: frozenset[int], expose: Sequence[str] = (), *,
                compare_to: CompareTo | None = None) -> Measurement:
        """Run the model with ``keep`` in FP32 (``expose``: also return these float32 intermediates; with
        ``compare_to`` their statistics against the oracle's store instead, measured by the target's worker:
        a probe of every tensor of a large model never holds them all in this process)."""
        digest = hashlib.sha1(",".join(map(str, sorted(keep))).encode()).hexdigest()[:16]
        path = self.workdir / f"lowered-{digest}{'-probe' if expose else ''}.onnx"
        if self.pin_file is not None:
            atomic_write_text(self.pin_file, "".join(f"{name}\n" for name in self.lowering.pinned(keep)))
        if self.run_model is not None:
            run = self.proc.run(self.run_model, self.inputs)
        else:
            proto = self.lowering.lower(keep, expose)
            if self._pool is not None:
                proto = self._pool.strip(proto)
            save_proto(proto, path, durable=False)  # deleted after its run: no fsync
            try:
                run = self.proc.run(path, self.inputs, **({"compare_to": compare_to} if compare_to else {}))
            finally:
                remove_model(path)
        if run.peak_memory is not None:
            self.peak_memory = max(self.peak_memory or 0, run.peak_memory)
        names = list(self.expected)
        comparison = compare_outputs(self.expected, run.outputs, self.tol, names) if run.ok else None
        return Measurement(run, comparison)

    def close(self) -> None:
        """Remove the candidates' shared weights file (the tester can measure no more)."""
        if self._pool is not None:
            self._pool.close()

    def __call__(self, keep: frozenset[int]) -> TestResult:
        found = self.measure(keep)
        if not found.run.ok:
            logger.info("lowered model with %d FP32 nodes does not run: %s", len(keep), found.run.describe())
            return TestResult(Outcome.UNRESOLVED, detail=found.run.describe())
        return TestResult(Outcome.FAIL if found.meets else Outcome.PASS, detail=found.metrics()["score"])


DENSE_AFTER = 32
"""ProbDD's tests after which the search estimates how many units must stay in FP32 and, when most must,
leaves them to the one-by-one sweep (:mod:`graphbisect.engine.probdd`, "Dense answers"): int8 error is
cumulative, so an answer can be most of the model (the 502-unit CRNN keeps ~two thirds). Reduce's answers are a
few nodes; it does not check."""


def search_keep_fp32(ev: Evaluator, prior: Mapping[int, float] | None = None) -> SearchResult:
    """A 1-minimal set of units to keep in FP32 (``ev`` must test keep-sets with :class:`PrecisionTester`).

    The caller has checked that the all-FP32 set meets the tolerance. The empty set is tried first: when
    everything can be lowered the answer is empty, at the cost of one run.
    """
    if ev.evaluate(frozenset(), phase="all-lowered").outcome is Outcome.FAIL:
        return probdd(ev, start=frozenset(), phase="probdd")
    return probdd(ev, prior=prior, phase="probdd", margin=error_margin, dense_after=DENSE_AFTER)


def error_margin(result: TestResult) -> float | None:
    """How far a keep-set's lowered model was from meeting the tolerance (its worst output's error in
    tolerances, 1 being the limit; inf when it did not run): :class:`PrecisionTester`'s ``detail``."""
    return float(result.detail) if isinstance(result.detail, (int, float)) else None


def prefix_answer(ev: Evaluator) -> SearchResult:
    """Polygraphy's answer: the shortest topological prefix of units kept in FP32 that meets the tolerance.

    ``polygraphy debug precision --mode bisect --direction forward`` marks layers in FP32 from the start of
    the network and bisects how many; this does the same over our units with the same evaluator.
    """
    return bisect_prefix(ev, phase="prefix")


def alone_breakers(ev: Evaluator, keep: frozenset[int]) -> list[int]:
    """Units of ``keep`` whose lowering *alone* (all else FP32) breaks the tolerance; ``len(keep)`` runs."""
    universe = ev.universe
    return [u for u in sorted(keep) if ev.evaluate(universe - {u}, phase="alone").outcome is not Outcome.FAIL]


@dataclass(frozen=True)
class SensitivityRow:
    """A node's effect on the final outputs: only it lowered (``lowered``), only it kept FP32 (``kept``)."""

    unit: int
    node: str
    op_type: str
    lowered: Mapping[str, float]
    kept: Mapping[str, float]
    breaks_alone: bool

    @property
    def score(self) -> float:
        """Worst output error (in tolerances) with only this node lowered: the ranking key."""
        return self.lowered["score"]

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "op_type": self.op_type, "score": _finite(self.score),
                "breaks_alone": self.breaks_alone,
                "lowered_alone": {k: _finite(v) for k, v in self.lowered.items()},
                "kept_alone": {k: _finite(v) for k, v in self.kept.items()}}


def sensitivity(tester: PrecisionTester, n: int, *,
                on_row: Callable[[int], None] | None = None) -> list[SensitivityRow]:
    """Per-unit sensitivity, ranked by score (highest first): 2 runs per unit."""
    universe = frozenset(range(n))
    low = tester.lowering
    rows = []
    for u in range(n):
        alone = tester.measure(universe - {u})
        kept = tester.measure(frozenset({u}))
        rows.append(SensitivityRow(u, low.names([u])[0], low.op_type(u), alone.metrics(), kept.metrics(),
                                   not alone.meets))
        if on_row is not None:
            on_row(u)
    return sorted(rows, key=lambda r: (-_sortable(r.score), r.unit))


def sensitivity_priors(rows: Sequence[SensitivityRow], n: int) -> dict[int, float]:
    """ProbDD priors from sensitivity: 0.9 for nodes that break the tolerance alone, else ∝ their score."""
    floor = 1.0 / max(n, 1)
    return {r.unit: 0.9 if r.breaks_alone else min(0.5, max(floor, _sortable(r.score) / 2)) for r in rows}


def layerwise_priors(report: LayerwiseReport, lowering: Lowering) -> dict[int, float]:
    """ProbDD priors from one fully lowered run's layerwise report: error amplification per node.

    A node whose output leaves the tolerance while its inputs are within it (a divergence root), or that
    multiplies the error, is likely needed in FP32; the prior grows with log10 of the amplification.
    """
    unit_of = {lowering.model.node_names[node]: u for u, node in enumerate(lowering.units)}
    priors: dict[int, float] = {}
    for row in report.rows:
        u = unit_of.get(row.node)
        if u is None or not row.compared or row.stats.passed:
            continue
        amp = math.inf if (row.stats.target_nonfinite and row.input_score <= 1.0) else _sortable(row.amplification)
        if amp <= 1.0:
            continue
        p = 0.9 if math.isinf(amp) else min(0.9, 0.1 + 0.2 * math.log10(amp))
        priors[u] = max(priors.get(u, 0.0), p)
    logger.info("layerwise evidence gives priors to %d of %d units", len(priors), len(lowering.units))
    return priors


def _sortable(value: float) -> float:
    return math.inf if math.isnan(value) else value


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else ("inf" if value > 0 else "nan" if math.isnan(value) else "-inf")
