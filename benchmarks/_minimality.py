"""An independent 1-minimality check of any tool's reduced model, with graphbisect's own candidate tester.

A reduction is **1-minimal** when removing any single node of it loses the failure. To judge every tool the
same way, a result is mapped back (by node name) to a node subset of the original model, and the subset and
each subset with one node removed are tested with :class:`graphbisect.oracle.tester.CandidateTester`:
tensors the subset reads but does not produce are fed with the oracle's captured values, and a candidate
"still fails" only with the *same signature* as the original model (same failure kind; for a crash, the same
normalized message) and, given the failure's identity (graphbisect's bundle records it: where it first goes
wrong, what the target compiled there), the same identity: a sibling pass mis-fusing the same nodes into
another node is another failure. Polygraphy's reduced models cut the graph the same way (graph inputs fed
with layerwise oracle values, or branches frozen to oracle constants), so the question asked is the same for all.

The sweep stops at the first removable node: one is enough to say "not 1-minimal".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphbisect.backends import BackendSpec
from graphbisect.compare import Tolerance
from graphbisect.data import ActivationStore
from graphbisect.engine import Outcome
from graphbisect.model import Model
from graphbisect.oracle.identity import Identity, IdentityCheck
from graphbisect.oracle.signature import Signature
from graphbisect.oracle.tester import CandidateTester, WorkerPool
from graphbisect.strategies.subgraph import SubgraphSpace
from graphbisect.workflows.compare import DEFAULT_TARGET
from graphbisect.workflows.probe import describing_spec

__all__ = ["Minimality", "MinimalityChecker"]


@dataclass(frozen=True)
class Minimality:
    """The verdict on one reduced node set."""

    fails: bool | None  # the set itself fails the same way (None: could not be mapped to the model)
    minimal: bool | None  # None when it does not fail or could not be checked
    removable: str | None = None  # a node whose removal keeps the failure
    runs: int = 0  # target calls the check took (builds alone for a failure at compile)
    reason: str | None = None

    def cell(self) -> str:
        """What the table shows."""
        if self.minimal is True:
            return "yes"
        if self.minimal is False:
            return "no"
        return "n/a"

    def to_json(self) -> dict[str, object]:
        return {"fails": self.fails, "minimal": self.minimal, "removable": self.removable, "runs": self.runs,
                "reason": self.reason}


class MinimalityChecker:
    """Single-node-removal sweeps over node subsets of ``model`` (see the module docstring).

    ``store_dir`` is an oracle activation store of ``model`` (e.g. a reduction's ``<bundle>.work/activations``)
    and ``baseline`` the original model's failure signature.
    """

    def __init__(self, model: Model, inputs: Mapping[str, np.ndarray], store_dir: Path, baseline: Signature,
                 workdir: Path, *, tolerance: Tolerance | None = None, identity: Identity | None = None,
                 target: str = DEFAULT_TARGET) -> None:
        store = ActivationStore.open(store_dir)
        feeds = dict(inputs)

        def value(name: str) -> np.ndarray:
            return feeds[name] if name in feeds else store.get(name)

        self.model, self.baseline = model, baseline
        self.space = SubgraphSpace(model, value, workdir / "candidates")
        target_spec = BackendSpec.parse(target)
        if identity is not None and identity.compiled_kind is not None:  # candidates say what they compiled
            target_spec = describing_spec(target_spec) or target_spec
        self.pool = WorkerPool(target_spec, 1, workdir / "target")
        self.tester = CandidateTester(self.space, self.pool, baseline, tolerance or Tolerance(),
                                      identity=None if identity is None else IdentityCheck(identity, model.nodes))

    def close(self) -> None:
        self.pool.close()

    def _calls(self) -> int:
        """Target calls so far: runs, or builds where a failure at compile is tested by building alone."""
        cost = self.pool.cost
        return cost.compiles + cost.compile_cache_hits if self.tester.compile_only else cost.runs

    def check(self, names: Sequence[str]) -> Minimality:
        """Is the node set called ``names`` failing, and 1-minimal?"""
        index = dict(zip(self.model.node_names, range(len(self.model.nodes)), strict=True))
        unknown = [name for name in names if name not in index]
        if unknown:
            return Minimality(None, None, reason=f"{len(unknown)} node(s) not in the original model, "
                              f"e.g. {unknown[0]!r}")
        keep = frozenset(index[name] for name in names)
        start = self._calls()
        result = self.tester(keep)
        if result.outcome is not Outcome.FAIL:
            return Minimality(False, None, runs=self._calls() - start,
                              reason=f"fails differently: {_describe(result.detail)} (original: "
                              f"{_describe(self.baseline)})")
        for node in sorted(keep):
            if len(keep) > 1 and self.tester(keep - {node}).outcome is Outcome.FAIL:
                return Minimality(True, False, self.model.node_names[node], self._calls() - start)
        return Minimality(True, True, runs=self._calls() - start)


def _describe(detail: object) -> str:
    """A signature (or a tester result's detail holding one) in a few words: its detail, else its kind."""
    if isinstance(detail, dict) and "signature" in detail:
        detail = Signature.from_json(detail["signature"])
    if isinstance(detail, Signature):
        return detail.detail or detail.kind.value if detail.failed else "passes"
    return str(detail)
