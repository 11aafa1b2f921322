"""A wrong result's identity: where it first goes wrong, what the target made there, and how strongly.

Matching a failure by its kind ("some value beyond tolerance") lets a reduction settle on whichever failure
survives the cuts (issue 23): TF32 noise in one MatMul instead of a mis-fused LayerNorm, the sibling pass
``SimplifiedLayerNormFusion`` instead of ``LayerNormFusion`` (the 6-node core of the same pattern, which a fix
of the pass the user hit leaves failing), a renamed node. The identity of a wrong result is

* **where**: the first divergent tensor above the target's noise floor (:mod:`graphbisect.oracle.floor`) in
  the baseline's layerwise evidence, its node, and the original nodes the target compiled together with it
  (the *region*);
* **what made it**, where the target describes what it compiled (:mod:`graphbisect.localize.compiled`): the
  compiled node's kind (``LayerNormalization``) and the pass that made it where the backend names it (ONNX
  Runtime names a fused node ``<node>/<Pass>/``: ``LayerNormFusion``);
* **how strongly**: the band of the error there, ``floor(log10(score))`` in tolerances.

A candidate (or a bundle's re-run) has the same identity when every tensor it fails on above the floor lies at
or after the region (nothing goes wrong before or beside it), the region's tensor, when the candidate exposes
it, fails in the same band (±1), and, where the identity names a compiled node, the candidate's compiled graph
has a node of that kind, made by the same pass, covering some of the region (:meth:`IdentityCheck.differs`).
Two pass names are the same pass when they name the same optimizer (:func:`same_optimizer`: equal once the
level suffix a release registers it under is dropped, ``LayerNormFusionL1`` = ``LayerNormFusion``).
Where the target exposes nothing (a ``command``, a probe that masks the failure) no identity is recorded and
failures match by kind, as the report says.

**Across releases** of the target (a bundle re-run on another version: ``verify``, ``graphbisect releases``)
the names a release gives its nodes change while the bug stays: ONNX Runtime 1.17 names its fused LayerNorm
``LayerNormalization`` where 1.20 names it ``<node>/LayerNormFusion/``. The pass is then compared only where
both releases name one; where either names none, what it made must instead cover exactly the recorded region
(the same original nodes, as far as the model still holds them), beside the same kind, place and strength
(``across_releases``). A sibling fusion (another kind, or another set of nodes) stays another failure.

Example:
    >>> ident = Identity("/n/Div", "/n/Div_out", 3, ("/n/Sub", "/n/Div"), "LayerNormalization",
    ...                  "/n/Mul/LayerNormFusion/", "LayerNormFusion", "optimized model")
    >>> for part in ident.describe().split(", "): print(part)
    first divergence at '/n/Div_out' (node '/n/Div')
    ~1e3× tolerance
    compiled as LayerNormalization made by LayerNormFusion
    covering 2 nodes
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import onnx

from graphbisect.compare import TensorStats
from graphbisect.compare.metrics import decade
from graphbisect.localize.compiled import CompiledGraph, CompiledNode

__all__ = ["Identity", "IdentityCheck", "band_of", "disable_names", "level_variants", "optimizer_of", "pass_of",
           "same_optimizer"]

#: ONNX Runtime's name for a node a pass made: ``<base node>/<PassName>/``, maybe ``_token_N`` after it.
_MADE_BY = re.compile(r"/([A-Za-z_][\w.]*)/(?:_token_\d+)?$")


def pass_of(compiled_name: str) -> str | None:
    """The pass a compiled node's name says made it (ONNX Runtime's fusions), or None.

    Example:
        >>> pass_of("/blk10/norm/Mul/LayerNormFusion/"), pass_of("/blk3/Mul/QuickGeluFusion/_token_2")
        ('LayerNormFusion', 'QuickGeluFusion')
        >>> pass_of("/blk0/ln/LayerNormalization") is None, pass_of("Gelu_token_48") is None
        (True, True)
    """
    found = _MADE_BY.search(compiled_name)
    return found.group(1) if found else None


def disable_names(made_by: str, names: Iterable[str]) -> tuple[str, ...]:
    """The optimizer names among ``names`` (the target's, as its ``disabled=`` takes them) that are the pass
    ``made_by`` (:func:`pass_of`) names: the name itself, or its per-level variants. A compiled node's name
    says ``LayerNormFusion`` where ONNX Runtime 1.31+ registers the pass at two levels, ``LayerNormFusionL1`` and
    ``LayerNormFusionL2``, and refuses ``disabled=LayerNormFusion``.

    Example:
        >>> disable_names("LayerNormFusion", ["GeluFusionL1", "LayerNormFusionL1", "LayerNormFusionL2"])
        ('LayerNormFusionL1', 'LayerNormFusionL2')
        >>> disable_names("QuickGeluFusion", ["QuickGeluFusion"]), disable_names("Mystery", ["QuickGeluFusion"])
        (('QuickGeluFusion',), ())
    """
    names = list(names)
    if made_by in names:
        return (made_by,)
    return tuple(n for n in names if re.fullmatch(re.escape(made_by) + r"L\d+", n))


#: The per-level variants :func:`level_variants` names (ONNX Runtime registers an optimizer at levels 1-4).
MAX_LEVEL = 9


def level_variants(made_by: str) -> tuple[str, ...]:
    """The names :func:`disable_names` may find for ``made_by``: itself and its per-level variants up to
    :data:`MAX_LEVEL`, to ask a target which of them it takes without listing every optimizer it has.

    Example:
        >>> level_variants("LayerNormFusion")[:3]
        ('LayerNormFusion', 'LayerNormFusionL1', 'LayerNormFusionL2')
    """
    return (made_by, *(f"{made_by}L{level}" for level in range(1, MAX_LEVEL + 1)))


_LEVEL = re.compile(r"(?<=[a-z])L\d+$")


def optimizer_of(pass_name: str) -> str:
    """The optimizer a pass name is registered for, without the level suffix a release appends when it registers
    one optimizer at several levels (ONNX Runtime 1.20+: ``LayerNormFusionL1``, ``LayerNormFusionL2``).

    Example:
        >>> optimizer_of("LayerNormFusionL1"), optimizer_of("LayerNormFusion"), optimizer_of("ConvAddFusion")
        ('LayerNormFusion', 'LayerNormFusion', 'ConvAddFusion')
    """
    return _LEVEL.sub("", pass_name)


def same_optimizer(a: str | None, b: str | None) -> bool:
    """Whether two pass names (either None: not named) name the same optimizer (:func:`optimizer_of`).

    Example:
        >>> same_optimizer("LayerNormFusionL1", "LayerNormFusion"), same_optimizer("LayerNormFusion",
        ...                                                                        "SimplifiedLayerNormFusion")
        (True, False)
    """
    if a is None or b is None:
        return a is b
    return optimizer_of(a) == optimizer_of(b)


def band_of(score: float) -> int | None:
    """An error's order of magnitude in tolerances (:func:`graphbisect.compare.metrics.decade`)."""
    return decade(score)


@dataclass(frozen=True)
class Identity:
    """What a wrong result is (see the module docstring)."""

    node: str  # the original node whose output first diverges above the floor
    tensor: str  # that output
    band: int | None  # floor(log10(score)) there
    region: tuple[str, ...]  # original nodes compiled together with it (the node alone when not known)
    compiled_kind: str | None = None  # what the target compiled the region as, when it said
    compiled_name: str | None = None
    made_by: str | None = None  # the pass that made it, when the target names it
    source: str = "layerwise"  # where the compiled description came from, or "layerwise" (oracle-side only)
    #: what the target says it computed the compiled node in, when narrower than the model's ("ran in i8 where
    #: the model computes f32": issue 26); shown, never matched (a fix may change the kernel's precision)
    ran_in: str | None = None
    #: the target's optimizer names for ``made_by``, as its ``disabled=`` takes them (:func:`disable_names`); None
    #: when the target was not asked (it lists none), () when it has none of that name
    disable: tuple[str, ...] | None = None

    def describe(self) -> str:
        strength = f", ~1e{self.band}× tolerance" if self.band is not None else ""
        text = f"first divergence at {self.tensor!r} (node {self.node!r}){strength}"
        if self.compiled_kind is not None:
            text += f", compiled as {self.compiled_kind}"
            if self.made_by:
                text += f" made by {self.made_by}" + self._disable_text()
            if len(self.region) > 1:
                text += f", covering {len(self.region)} nodes"
            if self.ran_in:
                text += f", {self.ran_in}"
        return text

    def _disable_text(self) -> str:
        """How the target's ``disabled=`` names the pass, where that is not ``made_by`` itself: the name a
        compiled node carries is no option a user can pass (ORT 1.32 refuses ``disabled=LayerNormFusion``)."""
        if self.disable is None or self.disable == (self.made_by,):
            return ""
        if not self.disable:
            return " (a name in the compiled node, not one the target's disabled= takes)"
        return f" (disabled={';'.join(self.disable)})"

    def to_json(self) -> dict[str, Any]:
        record = {"node": self.node, "tensor": self.tensor, "band": self.band, "region": list(self.region),
                  "compiled_kind": self.compiled_kind, "compiled_name": self.compiled_name, "made_by": self.made_by,
                  "source": self.source, "ran_in": self.ran_in}
        return record if self.disable is None else {**record, "disable": list(self.disable)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Identity | None:
        """The identity ``to_json`` wrote (also inside a bundle's record); None for none, or a record of a
        failure matched by kind."""
        if not data or "node" not in data or data.get("matched_by", "identity") != "identity":
            return None
        band = data.get("band")
        disable = data.get("disable")
        return cls(str(data["node"]), str(data["tensor"]), int(band) if isinstance(band, (int, float)) else None,
                   tuple(str(n) for n in data.get("region", ())), data.get("compiled_kind"),
                   data.get("compiled_name"), data.get("made_by"), str(data.get("source", "layerwise")),
                   data.get("ran_in"), tuple(str(n) for n in disable) if isinstance(disable, list) else None)

    def with_disable_names(self, names: Iterable[str] | None) -> Identity:
        """This identity with the target's ``disabled=`` names of ``made_by`` (:func:`disable_names`), from the
        optimizer names the target lists (``names``; None: it lists none, and nothing is said)."""
        if not self.made_by or names is None:
            return replace(self, disable=None)
        return replace(self, disable=disable_names(self.made_by, names))

    @classmethod
    def of_row(cls, node: str, tensor: str, score: float, compiled: Any | None, source: str | None) -> Identity:
        """The identity of a first divergence row (its compiled node, a
        :class:`~graphbisect.localize.compiled.CompiledNode`, when the target described one)."""
        if compiled is None:
            return cls(node, tensor, band_of(score), (node,))
        note = compiled.precision_note() if hasattr(compiled, "precision_note") else ""
        return cls(node, tensor, band_of(score), tuple(compiled.originals), compiled.kind, compiled.name,
                   pass_of(compiled.name), source or "compiled graph", note or None)


class IdentityCheck:
    """Whether runs of models made of ``nodes`` (the original's, or a subset) fail with ``identity``.

    ``nodes`` are the original model's nodes in topological order; the tensors at or after the region are
    computed once (a candidate's nodes are a subset, so being after the region in the original graph is what
    counts: a kept node between two cut points still reads what the region wrote, through the oracle's value).
    """

    def __init__(self, identity: Identity, nodes: Sequence[onnx.NodeProto] = (), *,
                 after: Iterable[str] | None = None) -> None:
        """``after``: the tensors at or after the region, when recorded (a bundle's ``identity.after``: in the
        reduced model a kept node past a cut point no longer reads the region), instead of ``nodes``."""
        self.identity = identity
        if after is not None:
            self.after = frozenset(after)
            return
        region = set(identity.region) | {identity.node}
        reached: set[str] = set()  # tensors written at or after the region
        for node in nodes:  # topological order: one forward pass is the closure
            if node.name in region or any(name in reached for name in node.input if name):
                reached.update(name for name in node.output if name)
        self.after = frozenset(reached)

    @classmethod
    def of_bundle(cls, record: Mapping[str, Any] | None) -> IdentityCheck | None:
        """The check a bundle's ``report.json`` ``identity`` records (None: its failure matches by kind)."""
        if not record or record.get("matched_by") != "identity":
            return None
        identity = Identity.from_json(record)
        return None if identity is None else cls(identity, after=record.get("after", ()))

    def differs(self, failing: Iterable[TensorStats], compared: Mapping[str, TensorStats],
                compiled: CompiledGraph | None = None, *, across_releases: bool = False) -> str | None:
        """Why a run whose above-floor failures are ``failing`` (``compared``: every output's statistics by name)
        is not this failure, or None when it is. ``compiled``: what the target compiled for that run;
        ``across_releases``: that run is of another release of the target than the recorded one (its names
        may differ: see the module docstring)."""
        return self.place_differs(failing, compared) or self.compiled_differs(compiled,
                                                                              across_releases=across_releases)

    def place_differs(self, failing: Iterable[TensorStats], compared: Mapping[str, TensorStats]) -> str | None:
        """Why a run's values fail otherwise than this failure (where it first goes wrong, how strongly), or None:
        the part of :meth:`differs` a run's output values decide."""
        ident = self.identity
        failing = list(failing)
        elsewhere = [s.name for s in failing if s.name not in self.after]
        if elsewhere:
            return (f"it goes wrong at {elsewhere[0]!r}, which does not depend on the recorded first divergence "
                    f"{ident.tensor!r}")
        if not failing:
            return "nothing fails above the noise floor"
        anchor = compared.get(ident.tensor)
        if anchor is not None and ident.band is not None:
            if anchor.passed or anchor not in failing:
                return f"{ident.tensor!r}, where the recorded failure starts, does not fail here"
            band = band_of(anchor.score)
            if band is not None and abs(band - ident.band) > 1:
                return f"{ident.tensor!r} is off by ~1e{band}× tolerance, not ~1e{ident.band}×"
        return None

    def compiled_differs(self, compiled: CompiledGraph | None, *, across_releases: bool = False) -> str | None:
        """Why what the target says it compiled for a run (``compiled``) is not what this identity recorded, or
        None when it is, or when either says nothing: the part of :meth:`differs` a description decides.
        ``across_releases``: the run is of another release, whose node names may not name the pass (module
        docstring): a node of the kind that names none (or matched against an identity that names none) is this
        failure when it covers exactly the recorded region."""
        ident = self.identity
        if ident.compiled_kind is None or compiled is None:
            return None
        covering = self.covering(compiled)
        if any(node.kind == ident.compiled_kind and same_optimizer(pass_of(node.name), ident.made_by)
               for node in covering):
            return None
        if across_releases and self.unnamed_match(compiled) is not None:
            return None
        made = ", ".join(dict.fromkeys(
            f"{node.kind}" + (f" made by {pass_of(node.name)}" if pass_of(node.name) else "") + (
                f" covering {len(node.originals)} nodes" if across_releases and node.kind == ident.compiled_kind
                else "") for node in covering))
        wanted = ident.compiled_kind + (f" made by {ident.made_by}" if ident.made_by else "")
        if across_releases and ident.made_by:
            wanted += f" (or, named by no pass, covering exactly the {len(self.region_in(compiled))} region nodes)"
        return f"the target compiled the region as {made or 'nothing it named'}, not {wanted}"

    def unnamed_match(self, compiled: CompiledGraph) -> CompiledNode | None:
        """The node of ``compiled`` that is this identity's across releases although the pass cannot be
        compared (one side names none): of the recorded kind, covering exactly the recorded region as far as
        ``compiled`` holds it (:meth:`region_in`). None when there is none."""
        ident = self.identity
        region = self.region_in(compiled)
        for node in self.covering(compiled):
            named = pass_of(node.name)
            if node.kind == ident.compiled_kind and (named is None or ident.made_by is None) and \
                    ident.node in node.originals and frozenset(node.originals) == region:
                return node
        return None

    def region_in(self, compiled: CompiledGraph) -> frozenset[str]:
        """The recorded region's nodes that ``compiled`` covers at all (a bundle's model may hold fewer of them
        than the model the identity was recorded on)."""
        known = compiled.by_original()
        return frozenset(n for n in (*self.identity.region, self.identity.node) if n in known)

    def release_note(self, compiled: CompiledGraph | None) -> str | None:
        """How a run of another release matched this identity where the names differ (None: by the same
        names, or not matched): said with the verdict, so a reader sees what the match rests on."""
        ident = self.identity
        if ident.compiled_kind is None or compiled is None:
            return None
        covering = self.covering(compiled)
        for node in covering:
            named = pass_of(node.name)
            if node.kind == ident.compiled_kind and named == ident.made_by:
                return None
        for node in covering:
            named = pass_of(node.name)
            if node.kind == ident.compiled_kind and named and ident.made_by and same_optimizer(named, ident.made_by):
                return (f"its {node.kind} is made by {named}, the recorded {ident.made_by} under this release's "
                        "name of the same optimizer")
        unnamed = self.unnamed_match(compiled)
        if unnamed is None:
            return None
        who = "this release names no pass in" if pass_of(unnamed.name) is None else \
            "the bundle's release named no pass in"
        return (f"{who} its {unnamed.kind} ({unnamed.name!r}); the same kind covering exactly the recorded "
                f"{len(unnamed.originals)} nodes, failing at the same place and strength")

    def covering(self, compiled: CompiledGraph) -> list[CompiledNode]:
        """The compiled nodes of ``compiled`` that cover some of the region, the one covering the identity's node
        first."""
        region = set(self.identity.region) | {self.identity.node}
        covering = [node for node in compiled.nodes if region.intersection(node.originals)]
        return sorted(covering, key=lambda node: self.identity.node not in node.originals)

    def as_compiled(self, compiled: CompiledGraph | None) -> Identity:
        """This identity with what ``compiled`` (a run of another model holding the region) compiled the identity's
        node as, instead of what the original model compiled it as; without a compiled kind when ``compiled``
        says nothing of it. The place, region and strength stay: they are what the runs' values decide."""
        ident = self.identity
        node = next(iter(self.covering(compiled)), None) if compiled is not None else None
        if node is None:
            return replace(ident, compiled_kind=None, compiled_name=None, made_by=None, ran_in=None, disable=None)
        note = node.precision_note()
        made_by = pass_of(node.name)
        return replace(ident, compiled_kind=node.kind, compiled_name=node.name, made_by=made_by,
                       ran_in=note or None, disable=ident.disable if made_by == ident.made_by else None)
