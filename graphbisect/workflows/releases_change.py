"""What changed between the two releases a release search found, where the target can say: for ONNX Runtime, the
passes that fired on the failing model in one release and not in the other, and what each compiled the failing
region as.

Both releases run the reference's model once more, asked to report the passes that fired (``report_passes=1``:
every graph transformer that modified the graph, the rewrite rules among them isolated) and to save the graph
they optimized (``save_optimized=1``). Pass names are compared as optimizers (:func:`~graphbisect.oracle.identity.
optimizer_of`): ``LayerNormFusion`` in 1.17.3 and ``LayerNormFusionL1`` in 1.20.1 are one optimizer registered
under another name, not a change. The failing region is the reference's identity's (the original nodes the
failure's compiled node covers; where the reference has no identity, every fused node); a release that names no
pass in its compiled node says only its kind. A release that cannot build the model (the failure is a crash at
load, or a refusal) fires nothing to compare: said instead.

Two runs (one per release) beside the search's; a target that reports neither (no ``report_passes`` option) is
not asked, and nothing is said.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from graphbisect.artifacts.bundle import LoadedBundle
from graphbisect.backends import BackendProcess, BackendSpec, resolve
from graphbisect.errors import GraphBisectError
from graphbisect.localize.compiled import CompiledGraph, compiled_graph
from graphbisect.oracle.identity import IdentityCheck, optimizer_of, pass_of
from graphbisect.oracle.signature import normalize_message

__all__ = ["ReleaseBuild", "ReleaseChange", "build_of", "release_change", "reports_passes"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReleaseBuild:
    """What one release made of the model: the passes that fired (None: it did not say, or could not build),
    what it compiled the failing region as, or why it could not build the model."""

    version: str
    fired: tuple[str, ...] | None = None
    region: tuple[str, ...] = ()
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "fired": None if self.fired is None else list(self.fired),
                "region": list(self.region), "error": self.error}


@dataclass(frozen=True)
class ReleaseChange:
    """Between ``older`` and ``newer`` (the search's two releases): the passes that fired in one and not in the
    other, compared as optimizers, and each one's failing region."""

    older: ReleaseBuild
    newer: ReleaseBuild
    only_newer: tuple[str, ...] = ()
    only_older: tuple[str, ...] = ()
    runs: int = 2
    notes: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        """One or two sentences for the report and the paragraph."""
        old, new = self.older, self.newer
        broken = [b for b in (old, new) if b.fired is None]
        if broken:
            return " ".join(f"{b.version} cannot build the model, so it has no passes to compare ("
                            f"{b.error or 'it reported none'})." for b in broken)
        text = (f"Passes that fired in {new.version} and not in {old.version}: "
                f"{', '.join(self.only_newer) or 'none'}; in {old.version} and not in {new.version}: "
                f"{', '.join(self.only_older) or 'none'} (compared as optimizers: a level suffix such as L1 is "
                "no change).")
        if old.region or new.region:
            text += (f" At the failing region {old.version} compiled {'; '.join(old.region) or 'nothing it named'}, "
                     f"{new.version} compiled {'; '.join(new.region) or 'nothing it named'}.")
        return text

    def to_json(self) -> dict[str, Any]:
        return {"older": self.older.to_json(), "newer": self.newer.to_json(), "only_newer": list(self.only_newer),
                "only_older": list(self.only_older), "runs": self.runs, "describe": self.describe()}


def reports_passes(spec: BackendSpec) -> bool:
    """Whether ``spec``'s backend can report the passes that fired and save what it compiled."""
    _, info = resolve(spec, require_available=False)
    return "report_passes" in info.options and "save_optimized" in info.options


def release_change(reference: LoadedBundle, older: tuple[str, BackendSpec],
                   newer: tuple[str, BackendSpec]) -> ReleaseChange:
    """Build ``reference``'s model on the two releases (each a version and the spec that runs it there) and say what
    changed between them (module docstring)."""
    builds = [build_of(reference, version, spec) for version, spec in (older, newer)]
    old, new = builds
    only_newer, only_older = _difference(new.fired or (), old.fired or ()), _difference(old.fired or (),
                                                                                        new.fired or ())
    return ReleaseChange(old, new, only_newer, only_older)


def build_of(reference: LoadedBundle, version: str, spec: BackendSpec) -> ReleaseBuild:
    """One release's build of ``reference``'s model, asked for its fired passes and optimized graph."""
    asking = spec.with_options(report_passes="1", save_optimized="1")
    outputs = list(reference.oracle_outputs)
    try:
        with tempfile.TemporaryDirectory(prefix="graphbisect-release-change-") as workdir, \
                BackendProcess(asking, workdir=Path(workdir)) as backend:
            result = backend.run(reference.model_path, reference.inputs_path, outputs)
            if not result.ok and result.message is not None and not result.info.get("fired_passes"):
                return ReleaseBuild(version, error=_short(f"{result.error_type}: "
                                                          f"{normalize_message(result.message)}"))
            fired = result.info.get("fired_passes")
            proto = onnx.load(str(reference.model_path), load_external_data=False)
            compiled = compiled_graph(proto.graph.node, outputs, result.info,
                                      constants={t.name: t for t in proto.graph.initializer})
            region = _region(reference, compiled)
    except GraphBisectError as exc:
        return ReleaseBuild(version, error=exc.message)
    return ReleaseBuild(version, tuple(str(p) for p in fired) if isinstance(fired, list) else None, region)


def _region(reference: LoadedBundle, compiled: CompiledGraph | None) -> tuple[str, ...]:
    """What ``compiled`` made of the failing region: its nodes covering the identity's region (every fused node
    without an identity), as ``Kind made by Pass`` or ``Kind (named by no pass)``."""
    if compiled is None:
        return ()
    check = IdentityCheck.of_bundle(reference.report.get("identity"))
    nodes = check.covering(compiled) if check is not None else [n for n in compiled.nodes if n.fused]
    return tuple(dict.fromkeys(
        f"{node.kind} made by {pass_of(node.name)}" if pass_of(node.name) else f"{node.kind} (named by no pass)"
        for node in nodes))


def _difference(these: Sequence[str], those: Sequence[str]) -> tuple[str, ...]:
    """The names of ``these`` whose optimizer is not among ``those``'s, in order."""
    others = {optimizer_of(name) for name in those}
    return tuple(dict.fromkeys(name for name in these if optimizer_of(name) not in others))


def _short(text: str, limit: int = 160) -> str:
    """``text`` on one line: its start and its end (where a crash says why), at most about ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else f"{line[:limit // 2].rstrip()} … {line[-limit // 2:].lstrip()}"
