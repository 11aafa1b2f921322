"""Root causes behind fusions: the failing nodes whose inputs the target did not expose, each run alone.

A node reading a tensor the target fused away or eliminated has no measured input error, so the layerwise
table cannot say whether its error starts inside it or reached it from upstream
(:mod:`graphbisect.localize.layerwise`: such a node is never a root on the table alone). One more target
run settles it for all of them at once: their compiled regions (the original nodes their compiled node
replaced), each fed with the oracle's values at its own inputs, in one model
(:meth:`~graphbisect.strategies.subgraph.SubgraphSpace.materialize_apart`), compared with the oracle's values
of their outputs in the target's worker. A region that fails alone is a root (``confirmed``): the error starts
inside it; one that passes only received its error (``received``). This is the evidence ``reduce``'s search
gathers by running candidates, at the cost of one run.

Why one run of disjoint regions and not one per candidate: compare's target runs are few (the plain run,
the probe, perhaps a noise floor), and after a first divergence most fused nodes downstream fail and read
unexposed tensors. Why a cap (:data:`MAX_REGIONS`): the candidates come in rank order, and the model of
hundreds of regions would approach the whole model's build time for nodes ranked far below the first.
Those beyond it stay ``unconfirmed``, and the check says how many.

Example:
    >>> stats, check = run_alone(model, report, compiled=compiled, store=store, inputs_path=inputs, proc=proc,
    ...                          tol=tol, floor=None, workdir=tmp)                              # doctest: +SKIP
    >>> check.confirmed, check.received                                                          # doctest: +SKIP
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from graphbisect.backends import BackendProcess
from graphbisect.backends.process import CompareTo
from graphbisect.compare import TensorStats, Tolerance
from graphbisect.data.store import ActivationStore
from graphbisect.localize.compiled import CompiledGraph
from graphbisect.localize.layerwise import LayerRow, LayerwiseReport
from graphbisect.model import Model
from graphbisect.model.io import remove_model
from graphbisect.oracle.floor import NoiseFloor
from graphbisect.storage.values import load_values_npz
from graphbisect.text.printable import plural
from graphbisect.workflows.probe import discard_description

__all__ = ["MAX_REGIONS", "AloneCheck", "run_alone"]

log = logging.getLogger(__name__)

#: At most this many uncertain candidates (in rank order) are run alone; the others stay ``unconfirmed``.
MAX_REGIONS = 32


@dataclass(frozen=True)
class AloneCheck:
    """How the root causes whose inputs the target did not expose were checked (``--json``
    ``root_cause_check``): which were run alone on the oracle's values, in how many target runs, and with
    what result. Node names are the original nodes whose tensor was compared (a fused node's last one)."""

    spec: str  # the target spec that ran them
    target_runs: int  # 0 (nothing run: see ``note``) or 1
    regions: int  # regions in the one model
    nodes: int  # original nodes in them
    confirmed: tuple[str, ...] = ()  # failed alone: the error starts inside (a root)
    received: tuple[str, ...] = ()  # passed alone: the error came from upstream
    unconfirmed: tuple[str, ...] = ()  # not settled: beyond MAX_REGIONS, a control-flow region, or the run failed
    note: str | None = None  # why some or all were not run

    def describe(self) -> str:
        """One line for the CLI.

        Example:
            >>> AloneCheck("ort", 1, 2, 10, ("a",), ("b",)).describe().split(": ")[1]
            '1 confirmed as root (the error starts inside), 1 received its error'
        """
        run = len(self.confirmed) + len(self.received)
        text = (f"{plural(run, 'failing node')} whose inputs the target did not expose (or that compute exactly on "
                f"inputs already off) {'was' if run == 1 else 'were'} run alone on the oracle's values "
                f"({plural(self.regions, 'region')}, {plural(self.nodes, 'node')}, "
                f"{plural(self.target_runs, 'target run')}): {len(self.confirmed)} confirmed as root (the error "
                "starts inside), "
                f"{len(self.received)} received its error")
        if self.unconfirmed:
            text += f"; {len(self.unconfirmed)} not settled (never ranked as roots)"
        if self.note:
            text += f" — {self.note}"
        return text

    def to_json(self) -> dict[str, object]:
        return {"how": "each region (the original nodes of the compiled node) run alone on the target, fed with "
                       "the oracle's values at its inputs, all regions in one model",
                "spec": self.spec, "target_runs": self.target_runs, "regions": self.regions, "nodes": self.nodes,
                "confirmed": list(self.confirmed), "received": list(self.received),
                "unconfirmed": list(self.unconfirmed), "note": self.note}


def run_alone(model: Model, report: LayerwiseReport, *, compiled: CompiledGraph | None, store: ActivationStore,
              inputs_path: Path, proc: BackendProcess, tol: Tolerance, floor: NoiseFloor | None, workdir: Path,
              limit: int = MAX_REGIONS) -> tuple[dict[str, TensorStats], AloneCheck]:
    """Run ``report.uncertain``'s regions alone on ``proc`` (the target's worker) in one model; return the
    statistics of each candidate's tensor there (``analyze_layers(..., alone=)``) and what was done.

    ``floor`` is not applied here: :func:`~graphbisect.localize.layerwise.analyze_layers` judges the
    statistics against it, as it judges the table's rows."""
    from graphbisect.strategies.subgraph import SubgraphSpace

    rows = list(report.uncertain)
    chosen: list[tuple[LayerRow, frozenset[int]]] = []
    skipped: list[str] = []
    for row in rows[:limit]:
        region = compiled.region(model.nodes, row.index) if compiled is not None else frozenset({row.index})
        if any(_has_body(model.nodes[i]) for i in region):
            skipped.append(row.node)  # a body's outer-scope reads cannot be fed apart
        else:
            chosen.append((row, region))
    beyond = [row.node for row in rows[limit:]]
    note = f"{len(beyond)} beyond the first {limit} were not run" if beyond else None
    if not chosen:
        return {}, AloneCheck(str(proc.spec), 0, 0, 0, unconfirmed=tuple(skipped + beyond), note=note)
    feeds = load_values_npz(inputs_path)

    def value(name: str) -> np.ndarray:
        return feeds[name] if name in feeds else store.get(name)

    space = SubgraphSpace(model, value, workdir, store=store, declare_ahead=False)  # one candidate: a few cut points
    path = workdir / "alone.onnx"
    try:
        candidate = space.materialize_apart([region for _, region in chosen])
        candidate.save(path, durable=False)
        wanted = [row.tensor for row, _ in chosen]
        run = proc.run(path, dict(candidate.feeds), list(candidate.outputs), compare_to=CompareTo(store.directory, tol))
    finally:
        remove_model(path)
    nodes = sum(len(region) for _, region in chosen)
    if not run.ok:
        discard_description(run.info)
        why = f"the target failed on the model of the regions alone ({run.describe()})"
        return {}, AloneCheck(str(proc.spec), 1, len(chosen), nodes,
                              unconfirmed=tuple([row.node for row, _ in chosen] + skipped + beyond),
                              note="; ".join(filter(None, (why, note))))
    discard_description(run.info)
    stats = {name: run.stats[name] for name in wanted if name in run.stats}
    confirmed, received, unsettled = [], [], []
    for row, _ in chosen:
        found = stats.get(row.tensor)
        if found is None:
            unsettled.append(row.node)
        elif found.passed or (floor is not None and floor.at_floor(found)):
            received.append(row.node)
        else:
            confirmed.append(row.node)
    log.info("ran %d regions alone (%d nodes): %d confirmed, %d received", len(chosen), nodes, len(confirmed),
             len(received))
    return stats, AloneCheck(str(proc.spec), 1, len(chosen), nodes, tuple(confirmed), tuple(received),
                             tuple(unsettled + skipped + beyond), note)


def _has_body(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
