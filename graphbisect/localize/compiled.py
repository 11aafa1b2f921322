"""What the target compiled: its nodes, the original ONNX nodes each one replaced, and the tensors that survive.

Exposing every intermediate tensor as an output changes what a target compiles: a fused intermediate may
not be a graph output, so the fusion is skipped and a bug inside it vanishes (*probe masking*). A target
that can describe the graph it actually runs tells graphbisect which original tensors still exist; probing
only those leaves the compiled graph as it is, and a diverging compiled node maps back to the original
nodes it stands for. One description, three sources, chosen by what the run reported (the option that
asks for it is the registry's ``compiled_option``, behind :attr:`Capability.COMPILED_GRAPH`):

* ONNX Runtime / onnxoptimizer (``save_optimized=1``, run info ``optimized_model``): the optimized ONNX
  model. A compiled node's outputs that keep an original name survive, and so do the tensors ONNX Runtime's
  NCHWc nodes compute under other names (:mod:`graphbisect.localize.optimized`); the original nodes it
  replaced are found by walking back from their producers through the vanished tensors (:func:`fused_region`).
* OpenVINO (``report_exec=1``, run info ``exec_graph``): one execution node per kernel with
  ``originalLayersNames``, mapped to ONNX node names as the tactic recorder does
  (:func:`graphbisect.tactics.openvino.onnx_node_of`).
* TensorRT (``report_layers=1``, run info ``layers``): the engine inspector's layers; with detailed
  profiling verbosity each layer's ``Metadata`` names the ONNX nodes it covers (``[ONNX Layer: NAME]``),
  and layer names join fused nodes with ``" + "``.
* Paddle Inference (``hooks=1``, run info ``hooked`` + ``model_file``): the optimized program's ops seen
  by the output hooks, aligned with the original program (:mod:`graphbisect.localize.paddle_hooks`); the
  run already returned their values (:attr:`CompiledGraph.values`).
* IREE (``report_dispatches=1``, run info ``dispatches``): the dumped executable sources, one per
  dispatch, with the ONNX node names their computing ops carry as locations
  (:func:`graphbisect.backends.iree.dispatch_nodes`).

Execution graphs do not name tensors, so for OpenVINO, TensorRT and IREE the surviving tensors are the
group's *boundary*: outputs of its original nodes read by a node outside the group, or graph outputs. Execution
nodes that cover the same ONNX node (a node decomposed into several kernels) are merged into one group.
Execution graphs also forget nodes: OpenVINO 2026.4's MVN fusion lists only the final ``Div`` of the
LayerNorm pattern it replaced in ``originalLayersNames``. An original node that no compiled node names and
whose outputs are all read by one group was computed inside it (fused or folded into it): it joins that
group and is listed in :attr:`CompiledGraph.inferred` and that node's :attr:`CompiledNode.inferred`, so
reports say which memberships were inferred rather than read from the backend.

Example:
    >>> from onnx import helper
    >>> nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Neg", ["a"], ["b"], name="n"),
    ...          helper.make_node("Abs", ["b"], ["y"], name="abs")]
    >>> graph = from_groups(nodes, ["y"], [("fused", "Fused", ["r", "n"]), ("abs", "Abs", ["abs"])], "example")
    >>> [(c.name, c.originals, c.outputs) for c in graph.nodes]
    [('fused', ('r', 'n'), ('b',)), ('abs', ('abs',), ('y',))]
    >>> sorted(graph.surviving)
    ['b', 'y']
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from graphbisect.localize.fusion import fused_region, surviving_tensors, vanished_tensors
from graphbisect.localize.optimized import OriginalGraph, optimized_tensors
from graphbisect.localize.runtime_precision import (
    lower_precision,
    node_precisions,
    optimized_precisions,
    precision_name,
)
from graphbisect.text.printable import plural

__all__ = [
    "CompiledGraph",
    "CompiledNode",
    "compiled_graph",
    "describes",
    "from_engine_layers",
    "from_exec_graph",
    "from_groups",
    "from_named_outputs",
    "from_optimized_model",
]

log = logging.getLogger(__name__)

_OV_NOT_KERNELS = frozenset({"Input", "Output", "Const", "Parameter", "Result"})
#: Compressed weight types of an OpenVINO FullyConnected (see :func:`from_exec_graph`).
_WEIGHT_TYPES = frozenset({"i8", "u8", "i4", "u4"})
#: Execution node types that copy or lay out data: their runtime precision is storage, not arithmetic.
_OV_STORAGE = frozenset({"Reorder", "Reshape", "Transpose", "Split", "Concatenation", "Gather", "StridedSlice",
                         "Broadcast", "Tile", "ShapeOf", "Convert"})
_TRT_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]]+)\]")


@dataclass(frozen=True)
class CompiledNode:
    """One node of the compiled graph and the original ONNX nodes it stands for."""

    name: str  # the backend's name: optimized node, execution node(s), engine layer
    kind: str  # its op type / layer type
    originals: tuple[str, ...]  # ONNX node names it covers, in topological order
    outputs: tuple[str, ...]  # original tensor names it produces (what the probe exposes)
    #: Those of ``originals`` the backend did not name: attributed to this node from the graph
    #: (:func:`_attribute_unclaimed`), an inference, not the backend's word.
    inferred: tuple[str, ...] = ()
    #: The element types the backend says it computed this node in (OpenVINO's ``runtimePrecision``, ONNX
    #: Runtime's quantized kernels, IREE's dispatch operands: :mod:`graphbisect.localize.runtime_precision`);
    #: () when it does not say.
    precision: tuple[str, ...] = ()
    #: The element types its original nodes compute in, in the model (:meth:`CompiledGraph.with_model`): a fact
    #: of the model, not of what the backend compiled, so not part of a compiled node's equality.
    model_precision: tuple[str, ...] = field(default=(), compare=False)

    def with_model_precision(self, model_precision: tuple[str, ...]) -> CompiledNode:
        """This node with :attr:`model_precision` set (``dataclasses.replace``, spelled out: ~3x faster, and
        :meth:`CompiledGraph.with_model` makes one per compiled node)."""
        return CompiledNode(self.name, self.kind, self.originals, self.outputs, self.inferred, self.precision,
                            model_precision)

    @property
    def fused(self) -> bool:
        """True when it replaced more than one original node."""
        return len(self.originals) > 1

    @property
    def lower_precision(self) -> tuple[str, ...]:
        """The types it ran in that are narrower than what the model computes there (an int8-weight MatMul that
        OpenVINO computes in i8: ``("i8",)``); () when none, or when either side is unknown.

        Example:
            >>> CompiledNode("fc", "FullyConnected", ("mm",), ("y",), precision=("i8",),
            ...              model_precision=("f32",)).lower_precision
            ('i8',)
        """
        return lower_precision(self.precision, self.model_precision)

    def precision_note(self) -> str:
        """``ran in i8 where the model computes f32``, or "" when it ran in the model's precision (or nobody said).

        Example:
            >>> CompiledNode("fc", "FullyConnected", ("mm",), ("y",), precision=("i8",),
            ...              model_precision=("f32", "i64")).precision_note()
            'ran in i8 where the model computes f32'
        """
        lower = self.lower_precision
        if not lower:
            return ""
        floats = [m for m in self.model_precision if m.startswith(("f", "bf"))]
        return f"ran in {'+'.join(lower)} where the model computes {'+'.join(floats or self.model_precision)}"

    def describe(self, limit: int = 4) -> str:
        """``Kind 'name'`` and, when fused, the original nodes it covers (the first ``limit``) and which of them
        were inferred (:meth:`inferred_note`).

        Example:
            >>> CompiledNode("mvn", "MVN", ("mean", "sub", "div"), ("y",), ("mean", "sub")).describe()
            "MVN 'mvn' ← 3 nodes: mean, sub, div (membership of mean, sub inferred from the graph)"
        """
        text = f"{self.kind} {self.name!r}"
        ran = self.precision_note()
        if not self.fused:
            return f"{text} ({ran})" if ran else text
        shown = ", ".join(self.originals[:limit]) + (", ..." if len(self.originals) > limit else "")
        notes = "; ".join(filter(None, (self.inferred_note(limit), ran)))
        return f"{text} ← {plural(len(self.originals), 'node')}: {shown}" + (f" ({notes})" if notes else "")

    def inferred_note(self, limit: int = 12) -> str:
        """``membership of a, b inferred from the graph`` (the first ``limit``), or "" when the backend named all."""
        if not self.inferred:
            return ""
        shown = ", ".join(self.inferred[:limit]) + (", ..." if len(self.inferred) > limit else "")
        return f"membership of {shown} inferred from the graph"

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "originals": list(self.originals),
                "outputs": list(self.outputs), "inferred": list(self.inferred), "precision": list(self.precision),
                "model_precision": list(self.model_precision), "lower_precision": list(self.lower_precision)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompiledNode:
        return cls(str(data["name"]), str(data["kind"]), tuple(data["originals"]), tuple(data["outputs"]),
                   tuple(data.get("inferred", ())), tuple(data.get("precision", ())),
                   tuple(data.get("model_precision", ())))


@dataclass(frozen=True)
class CompiledGraph:
    """The target's own description of what it compiled, mapped onto the original model."""

    source: str  # where the description came from, for reports ("optimized model", "execution graph", ...)
    nodes: tuple[CompiledNode, ...]
    unmapped: tuple[str, ...] = ()  # compiled nodes that stand for no original node (reorders, inserted casts)
    inferred: tuple[str, ...] = ()  # original nodes the description did not name, attributed to their consumer
    #: Original tensor → output key of the describing run that already holds its value (Paddle's output
    #: hooks): such a target needs no probe run.
    values: Mapping[str, str] = field(default_factory=dict)
    #: Whether :attr:`values` were matched to the original tensors by inference (Paddle's hooks: op order, type
    #: and shape, :mod:`graphbisect.localize.paddle_hooks`) rather than named by the target.
    aligned: bool = False

    @property
    def surviving(self) -> frozenset[str]:
        """The original tensors that still exist in the compiled graph: the only ones worth probing."""
        return frozenset(name for node in self.nodes for name in node.outputs)

    def by_original(self) -> dict[str, CompiledNode]:
        """Original node name → the compiled node that covers it (a copy: the caller may change it)."""
        return dict(self._by_original)

    @functools.cached_property
    def _by_original(self) -> dict[str, CompiledNode]:
        # made once per graph: compare asks for it per layerwise table and per region a failing node runs alone
        return {original: node for node in self.nodes for original in node.originals}

    def region(self, nodes: Sequence[onnx.NodeProto], index: int) -> frozenset[int]:
        """Indices of the original nodes compiled together with node ``index`` (itself alone when unknown)."""
        node = self._by_original.get(nodes[index].name)
        if node is None:
            return frozenset({index})
        wanted = set(node.originals)
        return frozenset(i for i, n in enumerate(nodes) if n.name in wanted) | {index}

    @property
    def lower_precision(self) -> tuple[CompiledNode, ...]:
        """The compiled nodes that ran in a narrower type than the model computes there."""
        return tuple(n for n in self.nodes if n.lower_precision)

    def summary(self) -> str:
        """One line of counts, the compiled nodes being all of the target's (the unmapped ones too, so the count is
        the saved optimized model's or the execution graph's).

        Example:
            >>> print(CompiledGraph("optimized model", (CompiledNode("q", "QuickGelu", ("sig", "mul"), ("y",)),),
            ...                     ("ReorderOutput",)).summary())  # doctest: +NORMALIZE_WHITESPACE
            optimized model: 2 compiled nodes, 1 of them fused (covering 2 original nodes), 1 with no original
            tensor of its own (layout, copies, a fusion's inner nodes), 1 surviving tensors
        """
        fused = [n for n in self.nodes if n.fused]
        covered = sum(len(n.originals) for n in fused)
        why = "layout, copies, a fusion's inner nodes" + (", ops of a loop body or branch, ops hooked more than once"
                                                          if self.aligned else "")
        unmapped = f", {len(self.unmapped)} with no original tensor of its own ({why})" if self.unmapped else ""
        text = (f"{self.source}: {len(self.nodes) + len(self.unmapped)} compiled nodes, {len(fused)} of them fused "
                f"(covering {covered} original nodes){unmapped}, {len(self.surviving)} surviving tensors")
        lower = self.lower_precision
        if lower:
            first = lower[0]
            text += (f"; {len(lower)} ran in a lower precision than the model, e.g. {first.kind} {first.name!r} "
                     f"{first.precision_note()}")
        return text

    def with_model(self, nodes: Sequence[onnx.NodeProto], type_of: Callable[[str], str | None],
                   constants: Collection[str] = ()) -> CompiledGraph:
        """This graph with each compiled node's :attr:`CompiledNode.model_precision`: what its original nodes
        compute in, in the model (``type_of``: a tensor's short element type name, None when unknown;
        ``constants``: tensors computed from no graph input, whose nodes are folded at build time,
        :func:`~graphbisect.localize.layerwise.constant_tensors`).

        Example:
            >>> from onnx import helper
            >>> nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
            >>> graph = CompiledGraph("execution graph", (CompiledNode("fc", "FullyConnected", ("mm",), ("y",),
            ...                                                           precision=("i8",)),))
            >>> graph.with_model(nodes, lambda name: "f32").nodes[0].precision_note()
            'ran in i8 where the model computes f32'
        """
        return self.with_node_precisions(node_precisions(nodes, type_of, constants))

    def with_node_precisions(self, precisions: Mapping[str, tuple[str, ...]]) -> CompiledGraph:
        """:meth:`with_model` from what each original node computes in alone
        (:func:`~graphbisect.localize.runtime_precision.node_precisions`, made once per model): a compiled
        node's model precision is the union of its originals', in their order."""
        annotated = []
        for node in self.nodes:
            found = [precisions[o] for o in node.originals if o in precisions]
            merged = found[0] if len(found) == 1 else tuple(dict.fromkeys(k for kinds in found for k in kinds))
            annotated.append(node.with_model_precision(merged))
        return dataclasses.replace(self, nodes=tuple(annotated))

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "nodes": [n.to_json() for n in self.nodes], "unmapped": list(self.unmapped),
                "inferred": list(self.inferred), "values": dict(self.values), "aligned": self.aligned}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompiledGraph:
        return cls(str(data["source"]), tuple(CompiledNode.from_json(n) for n in data["nodes"]),
                   tuple(data.get("unmapped", ())), tuple(data.get("inferred", ())), dict(data.get("values", {})),
                   bool(data.get("aligned", False)))


#: The run-info keys that carry a description of what was compiled (see :func:`compiled_graph`).
_DESCRIPTIONS = ("optimized_model", "optimized_graph", "exec_graph", "layers", "hooked", "dispatches")


def describes(info: Mapping[str, Any]) -> bool:
    """Whether a run's ``info`` carries a description of what it compiled (cheap: no mapping)."""
    return any(key in info for key in _DESCRIPTIONS)


def compiled_graph(nodes: Sequence[onnx.NodeProto], graph_outputs: Collection[str],
                   info: Mapping[str, Any], *,
                   constants: Mapping[str, onnx.TensorProto] | None = None,
                   original: Callable[[], OriginalGraph] | None = None) -> CompiledGraph | None:
    """The compiled graph a run reported in its ``info`` (see the module docstring), or None when it reported none.

    ``nodes`` are the original model's nodes in topological order and ``graph_outputs`` its output names;
    ``constants``, its initializers (an optimized model's merged duplicates are then recognized); ``original``
    gives their :class:`~graphbisect.localize.optimized.OriginalGraph` (made once per model) when a saved
    optimized model is to be mapped.
    """
    optimized = info.get("optimized_model")
    if isinstance(optimized, str) and Path(optimized).exists():
        return from_optimized_model(nodes, optimized, constants=constants,
                                    original=original() if original is not None else None)
    inline = info.get("optimized_graph")  # the same, carried back by an executor task (its files stay there)
    if isinstance(inline, bytes):
        return from_optimized_model(nodes, onnx.load_from_string(inline), constants=constants,
                                    original=original() if original is not None else None)
    exec_graph = info.get("exec_graph")
    if isinstance(exec_graph, list):
        group = info.get("dynamic_quantization_group_size")
        if info.get("dynamic_quantization_cpu") is False:  # a CPU without VNNI: the group size quantizes nothing
            group = 0
        return from_exec_graph(nodes, graph_outputs, exec_graph, dynamic_quantization=group)
    layers = info.get("layers")
    if isinstance(layers, list):
        return from_engine_layers(nodes, graph_outputs, layers)
    hooked, program = info.get("hooked"), info.get("model_file")
    if isinstance(hooked, list) and isinstance(program, str):
        from graphbisect.localize.paddle_hooks import hooked_nodes
        from graphbisect.model.paddle import program_ops

        ops = program_ops(program, {name for node in nodes for name in node.output if name})
        if ops is None:
            log.warning("%s is not a PIR program: its hooked tensors cannot be mapped to ONNX names", program)
            return None
        named, values = hooked_nodes(ops, hooked)
        graph = from_named_outputs(nodes, named, "optimized program (output hooks)")
        return dataclasses.replace(graph, values=values, aligned=True)
    dispatches = info.get("dispatches")
    if isinstance(dispatches, Mapping):
        types = info.get("dispatch_types")
        return from_groups(nodes, graph_outputs, [(name, "dispatch", originals)  # copies/fills name no node
                                                  for name, originals in dispatches.items() if originals],
                           "IREE dispatches", precisions=types if isinstance(types, Mapping) else None)
    return None


def from_optimized_model(nodes: Sequence[onnx.NodeProto], optimized: str | Path | onnx.ModelProto, *,
                         constants: Mapping[str, onnx.TensorProto] | None = None,
                         original: OriginalGraph | None = None) -> CompiledGraph:
    """The compiled graph of a saved optimized ONNX model (ONNX Runtime, onnxoptimizer).

    Each optimized node covers the original nodes behind the tensor it computes up to the surviving tensors
    (:func:`fused_region`). Which tensor that is comes from :func:`~graphbisect.localize.optimized.optimized_tensors`:
    an output that keeps an original name, or, for ONNX Runtime's NCHWc nodes (blocked layout, outputs
    renamed ``reorder_token_N``), what the node computes: ``r11_nchwc`` in a ResNet block is a Conv that
    absorbed the ``Add`` after it (its fourth, ``Sum`` input) and the ``Relu`` after that (its
    ``activation``), so it computes ``Relu(r11 + r13)``, not ``r11``; a kept ``Concat`` is the original
    Concat with the same inputs. Layout nodes (``ReorderInput``/``ReorderOutput``) are unmapped: they
    compute nothing. ``constants`` (the original initializers) let tensors merged by common-subexpression
    elimination compare equal; ``original``, ``OriginalGraph(nodes, constants)`` if made already.
    """
    proto = optimized if isinstance(optimized, onnx.ModelProto) else \
        onnx.load(str(optimized), load_external_data=False)
    found = optimized_tensors(nodes, proto.graph, constants, original=original)
    survivors = surviving_tensors(proto) | found.held | {name for _, _, outputs in found.named for name in outputs}
    return from_named_outputs(nodes, found.named, "optimized model", survivors=survivors,
                              precisions=optimized_precisions(proto.graph))


def from_named_outputs(nodes: Sequence[onnx.NodeProto], named: Iterable[tuple[str, str, Sequence[str]]],
                       source: str, *, survivors: Collection[str] | None = None,
                       precisions: Mapping[str, Sequence[str]] | None = None) -> CompiledGraph:
    """A compiled graph from ``(name, kind, original output tensors)`` per compiled node.

    Each compiled node covers the original nodes behind its outputs up to the surviving tensors (``survivors``:
    by default the named outputs; graph inputs and initializers always survive). A node with no outputs is
    listed as unmapped. ``precisions``: compiled node name → the element types it computed in.
    """
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    named = list(named)
    if survivors is None:
        survivors = {name for _, _, outputs in named for name in outputs}
    vanished = vanished_tensors(producer, survivors)
    groups: list[tuple[str, str, set[int], list[str] | None]] = []
    unmapped: list[str] = []
    for name, kind, outputs in named:
        known = [o for o in outputs if o in producer]
        if not known:
            unmapped.append(name)
            continue
        region: set[int] = set()
        for tensor in known:
            region |= fused_region(nodes, producer, producer[tensor], vanished=vanished)
        # Input-less nodes (Constant weights of a converted model) were folded, not computed by this node.
        if len(region) > 1:  # (a node alone stays itself)
            region = {i for i in region if nodes[i].input or nodes[i].op_type != "Constant"} or region
        groups.append((name, kind, region, known))
    return _assemble(nodes, source, groups, unmapped, boundary=(), precisions=precisions)


def from_exec_graph(nodes: Sequence[onnx.NodeProto], graph_outputs: Collection[str],
                    exec_graph: Iterable[Mapping[str, Any]], *, dynamic_quantization: int | None = None,
                    ) -> CompiledGraph:
    """The compiled graph of an OpenVINO execution graph (``openvino:report_exec=1``).

    Execution node names map to ONNX nodes as the tactic recorder maps them
    (:func:`~graphbisect.tactics.openvino.onnx_node_of`), including the ``.N`` renames of a graph output
    computed in another type than declared: an int64 output's Eltwise ``s.0`` and its Convert back
    ``s.0.0`` both stand for the node producing ``s``. Unmapped, that node would be attributed to the node
    reading ``s`` as if fused into it (:func:`_attribute_unclaimed`), a fusion OpenVINO never made.

    Each kernel's ``runtimePrecision`` is what its node computed in, with one exception: OpenVINO 2026.4
    reports ``i8`` for a FullyConnected with int8 weights whether it quantizes the activations too (the
    CPU default, ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` 32: hundreds of tolerances off on an int8-weight
    MiniLM) or decompresses the weights and computes in its output's precision (group size 0: within
    tolerance), with the very same execution graph. So with ``dynamic_quantization`` 0 (the compiled
    model's group size, run info ``dynamic_quantization_group_size``) such a kernel computed in its
    ``outputPrecisions``; so it did on a CPU without VNNI whatever the group size (run info
    ``dynamic_quantization_cpu`` False, which :func:`compiled_graph` passes on as group size 0).
    """
    from graphbisect.tactics.openvino import NodeNames, onnx_node_of

    names = NodeNames(frozenset(n.name for n in nodes),
                      {out: n.name for n in nodes for out in n.output if out})
    index = {n.name: i for i, n in enumerate(nodes)}
    groups: list[tuple[str, str, set[int], list[str] | None]] = []
    unmapped: list[str] = []
    precisions: dict[str, list[str]] = {}
    for layer in exec_graph:
        if layer.get("layer_type") in _OV_NOT_KERNELS:
            continue
        own = str(layer.get("name", ""))
        mapped = {onnx_node_of(o, names) for o in [own, *layer.get("original_layers", ())]}
        region = {index[m] for m in mapped if m is not None}
        if not region:
            unmapped.append(own)
            continue
        groups.append((own, str(layer.get("layer_type") or "?"), region, None))
        ran = precision_name(layer.get("runtime_precision"))
        if dynamic_quantization == 0 and layer.get("layer_type") == "FullyConnected" and ran in _WEIGHT_TYPES:
            ran = precision_name(str(layer.get("output_precisions") or "").split(",")[0]) or ran
        if ran is not None and layer.get("layer_type") not in _OV_STORAGE:  # a copy's precision is storage
            precisions.setdefault(own, []).append(ran)
    return _assemble(nodes, "execution graph", groups, unmapped, boundary=graph_outputs, precisions=precisions)


def from_engine_layers(nodes: Sequence[onnx.NodeProto], graph_outputs: Collection[str],
                       layers: Iterable[Mapping[str, Any] | str]) -> CompiledGraph:
    """The compiled graph of a TensorRT engine inspector's layer list (``tensorrt:report_layers=1``).

    Each layer's ONNX nodes come from its ``Metadata`` (``[ONNX Layer: NAME]``, detailed verbosity), or,
    without metadata, from its name (fused layers join node names with ``" + "``).
    """
    index = {n.name: i for i, n in enumerate(nodes)}
    groups: list[tuple[str, str, set[int], list[str] | None]] = []
    unmapped: list[str] = []
    for layer in layers:
        entry = {"Name": layer} if isinstance(layer, str) else layer
        name = str(entry.get("Name", ""))
        found = _TRT_ONNX_LAYER.findall(str(entry.get("Metadata", "")))
        if not found:
            found = [part.strip() for part in re.split(r" \+ |[(),]", name) if part.strip()]
        region = {index[f] for f in found if f in index}
        if not region:
            unmapped.append(name)
            continue
        groups.append((name, str(entry.get("LayerType", "layer")), region, None))
    return _assemble(nodes, "engine layers", groups, unmapped, boundary=graph_outputs)


def from_groups(nodes: Sequence[onnx.NodeProto], graph_outputs: Collection[str],
                groups: Iterable[tuple[str, str, Iterable[str]]], source: str, *,
                precisions: Mapping[str, Sequence[str]] | None = None) -> CompiledGraph:
    """A compiled graph from ``(name, kind, original node names)`` groups; outputs are the groups' boundaries.
    ``precisions``: group name → the element types it computed in."""
    index = {n.name: i for i, n in enumerate(nodes)}
    return _assemble(nodes, source, [(name, kind, {index[o] for o in originals if o in index}, None)
                                     for name, kind, originals in groups], [], boundary=graph_outputs,
                     precisions=precisions)


def _assemble(nodes: Sequence[onnx.NodeProto], source: str,
              groups: list[tuple[str, str, set[int], list[str] | None]], unmapped: list[str], *,
              boundary: Collection[str], precisions: Mapping[str, Sequence[str]] | None = None) -> CompiledGraph:
    """Merge groups that share an original node, then name each group's outputs.

    A group's outputs are those the backend named, or (None) its boundary: the tensors its nodes produce
    that a node outside it reads or that are graph outputs (``boundary``). A merged node computed in the
    element types of its groups (``precisions``, by group name), each once.
    """
    inferred = _attribute_unclaimed(nodes, groups) if any(g[3] is None for g in groups) else []
    readers: dict[str, set[int]] = {}
    if any(groups[g][3] is None for g in range(len(groups))):  # only boundaries need them
        for i, node in enumerate(nodes):
            for name in node.input:
                readers.setdefault(name, set()).add(i)
    result: list[tuple[int, CompiledNode]] = []
    taken: set[str] = set()
    guessed = set(inferred)
    node_names = [node.name for node in nodes]  # read once: a protobuf field costs a call each time
    precisions = precisions or {}
    for members in _merged(groups):
        if len(members) == 1:  # most compiled nodes: one group, nothing to merge
            names, kinds = [groups[members[0]][0]], [groups[members[0]][1]]
            region, named = groups[members[0]][2], [groups[members[0]][3]]
        else:
            names = list(dict.fromkeys(groups[g][0] for g in members))
            kinds = list(dict.fromkeys(groups[g][1] for g in members))
            region, named = set().union(*(groups[g][2] for g in members)), [groups[g][3] for g in members]
        ordered = sorted(region)
        if None not in named:
            outputs = tuple(dict.fromkeys(o for n in named for o in n or ()) if len(named) > 1
                            else dict.fromkeys(named[0] or ()))
        else:
            outputs = tuple(o for i in ordered for o in nodes[i].output
                            if o and (o in boundary or readers.get(o, set()) - region))
        name = names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1} more)"
        while name in taken:
            name += "'"
        taken.add(name)
        ran = [p for g in members for p in precisions.get(groups[g][0], ()) if precision_name(p) is not None]
        result.append((max(region), CompiledNode(
            name, kinds[0] if len(kinds) == 1 else "+".join(kinds), tuple([node_names[i] for i in ordered]), outputs,
            tuple([node_names[i] for i in ordered if i in guessed]) if guessed else (),
            tuple([precision_name(p) or p for p in dict.fromkeys(ran)]) if ran else ())))
    result.sort(key=lambda item: item[0])
    return CompiledGraph(source, tuple(node for _, node in result), tuple(unmapped),
                         tuple(nodes[i].name for i in sorted(inferred)))


def _merged(groups: Sequence[tuple[str, str, set[int], list[str] | None]]) -> list[list[int]]:
    """The groups that share an original node, transitively, as lists of group indices (union-find), each
    list in group order, the lists in the order of their first group."""
    parent = list(range(len(groups)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for g, (_, _, region, _) in enumerate(groups):
        for node in region:
            if node in owner:
                parent[find(g)] = find(owner[node])
            else:
                owner[node] = g
    merged: dict[int, list[int]] = {}
    for g in range(len(groups)):
        merged.setdefault(find(g), []).append(g)
    return list(merged.values())


def _attribute_unclaimed(nodes: Sequence[onnx.NodeProto],
                         groups: list[tuple[str, str, set[int], list[str] | None]]) -> list[int]:
    """Add each original node no group names to the one group that reads all its outputs (in reverse
    topological order, so chains join too); returns the nodes added."""
    owner = {i: g for g, group in enumerate(groups) for i in group[2]}
    readers: dict[str, set[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, set()).add(i)
    added: list[int] = []
    for i in range(len(nodes) - 1, -1, -1):
        if i in owner:
            continue
        consumers = {r for out in nodes[i].output if out for r in readers.get(out, ())}
        owners = {owner.get(r) for r in consumers}
        if len(owners) == 1 and (g := next(iter(owners))) is not None:
            groups[g][2].add(i)
            owner[i] = g
            added.append(i)
    return added
