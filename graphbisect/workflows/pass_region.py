"""Where a pass bug lives: the small region of the model that the pass search runs on instead of the whole.

A pass search asks the target one question per candidate — "does it still fail with these passes
disabled?" — and on a large model each answer is a whole session build (ONNX Runtime at ``opt_level=all``:
~22 s at 50,000 nodes). The passes act on a few nodes, so the search asks the question of those nodes:

1. the target runs the whole model once, describing what it compiled (``save_optimized=1``,
   :mod:`graphbisect.workflows.probe`): the baseline failure and the compiled graph;
2. the oracle runs the whole model once, exposing the tensors that survive in the compiled graph;
3. the target's *own optimized model* is replayed with its optimizations off
   (:data:`~graphbisect.workflows.probe.REPLAY_OPTIONS`, the replay `compare`'s probe uses too):
   the same kernels on the same fused graph, so exposing every surviving tensor changes nothing, at the
   cost of a session without optimizations (a few seconds at 50,000 nodes, not another optimized build);
4. the first surviving tensor that diverges (:func:`~graphbisect.localize.layerwise.analyze_layers`) names
   the compiled node that computed it, and :meth:`~graphbisect.localize.compiled.CompiledGraph.region` the
   original nodes it replaced: the **region**, materialized as a standalone model fed with the oracle's
   values at its inputs (:class:`~graphbisect.strategies.subgraph.SubgraphSpace`).

The caller (:func:`graphbisect.workflows.passes.find_culprit_passes`) searches the passes on the region and
confirms the answer once on the whole model; anything this module cannot establish is a ``None`` with the
reason, and the search runs on the whole model as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphbisect.compare import Tolerance
from graphbisect.localize.compiled import CompiledGraph
from graphbisect.localize.layerwise import TensorSource, analyze_layers
from graphbisect.model import Model, load_model
from graphbisect.oracle.floor import NoiseFloor
from graphbisect.oracle.identity import Identity
from graphbisect.strategies.subgraph import SubgraphSpace
from graphbisect.workflows.probe import REPLAY_OPTIONS, replay_model, replay_spec

__all__ = ["REPLAY_OPTIONS", "Region", "diverging_region", "replay_model", "replay_spec"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Region:
    """The original nodes one diverging compiled node replaced, as a standalone model."""

    nodes: frozenset[int]  # indices into the whole model's nodes
    model: Model  # the region with its weights inline
    feeds: Mapping[str, Any]  # its graph inputs: the model's own inputs and the oracle's values at cut points
    expected: Mapping[str, Any]  # the oracle's values of its outputs
    compiled_as: str  # the compiled node, described
    identity: Identity | None = None  # the failure's identity: the region's first divergence and compiled node

    def names(self, whole: Model) -> list[str]:
        return [whole.nodes[i].name for i in sorted(self.nodes)]


def diverging_region(model: Model, compiled: CompiledGraph, oracle: TensorSource, target: TensorSource, *,
                     values: Callable[[str], Any], workdir: Path, tol: Tolerance,
                     floor: NoiseFloor | None = None) -> Region | str:
    """The region of the first surviving tensor that diverges (above the target's noise ``floor``), or why
    there is none.

    ``oracle``/``target`` hold the surviving tensors of both sides; ``values(name)`` is the oracle's value of
    any tensor the region may read (graph inputs included); ``workdir`` receives the region's weights file.
    """
    report = analyze_layers(model.nodes, oracle, target, tol, compiled=compiled, first_only=True,
                            outputs=model.output_names, floor=floor)
    first = report.first_divergence
    if first is None:
        return "no surviving tensor of the replayed optimized model diverges from the oracle"
    nodes = compiled.region(model.nodes, first.index)
    group = compiled.by_original().get(model.nodes[first.index].name)
    described = group.describe() if group is not None else f"{first.op_type} {first.node!r}"
    space = SubgraphSpace(model, values, workdir)
    try:
        candidate = space.materialize(nodes, inline_weights=True)
        expected = {name: values(name) for name in candidate.outputs}
    except KeyError as exc:
        return f"the oracle did not capture {exc} that the region {described} reads"
    region = load_model(candidate.proto)
    log.info("pass search region: %d nodes, compiled as %s", len(nodes), described)
    identity = Identity.of_row(first.node, first.tensor, first.stats.score, group, compiled.source)
    return Region(nodes, region, dict(candidate.feeds), expected, described, identity)
