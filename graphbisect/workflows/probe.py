"""The compiled-graph probe that `compare` and `reduce` share: which target tensors to expose, and why.

A target with :attr:`Capability.COMPILED_GRAPH` is run with its registry row's ``compiled_option``
(``save_optimized=1``, ``report_exec=1``, ``report_layers=1``); the run's info then describes the graph it
compiled (:mod:`graphbisect.localize.compiled`). The layerwise probe exposes only the tensors that survive
in that graph, so the target compiles the probe the way it compiled the model and a bug inside a fusion
stays visible; each diverging compiled node maps back to the original nodes it replaced. Without a
description (or with ``all_tensors``) the probe exposes every intermediate, as before.

Where the backend can run its own saved optimized model (:data:`REPLAY_OPTIONS`: ONNX Runtime at
``opt_level=disable``), the probe need not be compiled again: :func:`replay_model` adds the surviving
tensors as outputs of the optimized model the plain run saved, and running that at ``opt_level=disable``
executes the same fused kernels without a second optimizing build. `compare` trusts such a replay only
when its final outputs are bit-identical to the plain run's (:class:`TargetProbe` says which probe ran).

Example:
    >>> from graphbisect.backends import BackendSpec
    >>> str(describing_spec(BackendSpec.parse("ort:opt_level=all")))
    'ort:opt_level=all,save_optimized=1'
    >>> describing_spec(BackendSpec.parse("reference")) is None
    True
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import onnx

from graphbisect.backends import BackendSpec, Capability, resolve
from graphbisect.localize.compiled import CompiledGraph, compiled_graph
from graphbisect.localize.layerwise import constant_tensors
from graphbisect.localize.optimized import OriginalGraph
from graphbisect.localize.runtime_precision import element_name, node_precisions
from graphbisect.model import Model
from graphbisect.model.normalize import subgraphs
from graphbisect.storage.gcpause import gc_paused

__all__ = ["REPLAY_OPTIONS", "ProbePlan", "TargetProbe", "compiled_of", "describing_spec", "discard_description",
           "mapping_ahead", "original_graph", "plan_probe", "replay_model", "replay_spec", "unfed_inputs"]

log = logging.getLogger(__name__)


def describing_spec(spec: BackendSpec) -> BackendSpec | None:
    """``spec`` asked to describe what it compiles, or None when its backend cannot."""
    _, info = resolve(spec, require_available=False)
    if not info.has(Capability.COMPILED_GRAPH) or info.compiled_option is None:
        return None
    key, value = info.compiled_option
    return spec.with_options(**{key: value})


@dataclass(frozen=True)
class ProbePlan:
    """The tensors a layerwise probe of the target exposes, and the compiled graph they come from."""

    names: tuple[str, ...]  # intermediates to expose, topological order (graph outputs excluded)
    compiled: CompiledGraph | None  # None: the target did not describe its graph, every tensor is probed
    vanished: frozenset[str]  # intermediates the compiled graph no longer has

    def describe(self) -> str:
        if self.compiled is None:
            return f"every intermediate tensor ({len(self.names)})"
        return (f"the {len(self.names)} tensors that survive in the target's {self.compiled.source} "
                f"({len(self.vanished)} fused away)")


@gc_paused()
def compiled_of(model: Model, info: Mapping[str, Any]) -> CompiledGraph | None:
    """The compiled graph a run of a :func:`describing_spec` target reported on ``model``, or None."""
    compiled = compiled_graph(model.nodes, model.output_names, info, constants=_constants(model),
                              original=lambda: original_graph(model))
    if compiled is not None:
        if any(node.precision for node in compiled.nodes):  # what the model computes there, beside it
            compiled = compiled.with_node_precisions(_node_precisions(model))
        if log.isEnabledFor(logging.INFO):  # ~15 ms at 5,000 nodes, for a line seen with --verbose
            log.info("%s", compiled.summary())
    return compiled


def element_types(model: Model) -> Callable[[str], str | None]:
    """A tensor's element type in ``model`` as a short name (``f32``, ``i8``; None when unknown), for
    :meth:`~graphbisect.localize.compiled.CompiledGraph.with_model`."""
    stored = {t.name: t.data_type for t in model.proto.graph.initializer}

    def type_of(name: str) -> str | None:
        found = model.tensor_type(name)
        return element_name(found.elem_type if found is not None else stored.get(name, 0))

    return type_of


_T = TypeVar("_T")
_AHEAD: weakref.WeakKeyDictionary[Model, dict[str, Any]] = weakref.WeakKeyDictionary()
_AHEAD_LOCK = threading.RLock()  # a make() that needs another of the same model does not wait for itself


def _made_once(model: Model, what: str, make: Callable[[], _T]) -> _T:
    """``make()``, made once per model and kept while the model lives (also when compare's early thread is
    still making it): what mapping a compiled graph needs of the model alone."""
    with _AHEAD_LOCK:
        made = _AHEAD.setdefault(model, {})
        if what not in made:
            made[what] = make()
        return cast(_T, made[what])


def original_graph(model: Model) -> OriginalGraph:
    """What mapping a saved optimized model of ``model`` needs of it: :func:`compiled_of` uses it, and
    `compare` has it made during the target's plain run (:func:`mapping_ahead`)."""
    return _made_once(model, "original", lambda: OriginalGraph(model.nodes, _constants(model)))


def _node_precisions(model: Model) -> dict[str, tuple[str, ...]]:
    """What each node of ``model`` computes in alone (:func:`node_precisions`), constants' nodes left out."""
    return _made_once(model, "precisions", lambda: node_precisions(
        model.nodes, element_types(model), constant_tensors(model.nodes, given=model.initializer_names)))


@gc_paused()
def mapping_ahead(model: Model) -> None:
    """Make what :func:`compiled_of` needs of ``model`` alone, ahead of the target's description: its
    :func:`original_graph` and what each of its nodes computes in."""
    original_graph(model)
    _node_precisions(model)


def _constants(model: Model) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.proto.graph.initializer}


def plan_probe(model: Model, compiled: CompiledGraph | None, *, among: Collection[str] | None = None) -> ProbePlan:
    """The target's probe: the intermediates that survive in ``compiled`` (every one when it is None).

    ``among`` restricts the candidates (e.g. to the tensors the oracle captured).
    """
    outputs = set(model.output_names)
    names = [n for n in model.intermediate_names() if n not in outputs and (among is None or n in among)]
    if compiled is None:
        return ProbePlan(tuple(names), None, frozenset())
    surviving = compiled.surviving
    return ProbePlan(tuple(n for n in names if n in surviving), compiled,
                     frozenset(n for n in names if n not in surviving))


def discard_description(info: Mapping[str, Any]) -> None:
    """Delete a saved optimized model and the external-data files it references, once read.

    ONNX Runtime writes every weight beside the optimized graph (``save_optimized=1``): on a large model
    that is a second copy of its weights, which nothing needs after :func:`compiled_of`.
    """
    saved = info.get("optimized_model")
    if not isinstance(saved, str) or not Path(saved).is_file():
        return
    path = Path(saved)
    locations: set[str] = set()
    with contextlib.suppress(Exception):  # an unreadable file is still removed below
        proto = onnx.load(str(path), load_external_data=False)
        for tensor in proto.graph.initializer:
            locations.update(e.value for e in tensor.external_data if e.key == "location")
    for location in locations:
        target = (path.parent / location).resolve()
        if target.parent == path.parent.resolve():  # only files ORT wrote beside the model
            target.unlink(missing_ok=True)
    path.unlink(missing_ok=True)


#: Backends whose saved optimized model (``info["optimized_model"]``) runs on the same backend with these
#: options (``None`` removes one) and computes what the optimized build computed: ONNX Runtime loads its own
#: optimized model with graph optimizations off — the offline-optimization workflow ORT documents.
REPLAY_OPTIONS: Mapping[str, Mapping[str, str | None]] = {
    "onnxruntime": {"opt_level": "disable", "disabled": None, "save_optimized": None, "report_passes": None},
}


def replay_spec(spec: BackendSpec) -> BackendSpec | None:
    """The spec that replays ``spec``'s saved optimized model, or None when its backend has no such replay.

    Example:
        >>> str(replay_spec(BackendSpec.parse("ort:opt_level=all,disabled=GeluFusionL2")))
        'onnxruntime:opt_level=disable'
    """
    canonical, info = resolve(spec, require_available=False)
    options = REPLAY_OPTIONS.get(info.kin)
    return canonical.with_options(**options) if options is not None else None


def replay_model(optimized: Path, model: Model, names: Sequence[str], destination: Path) -> list[str]:
    """Save the optimized model with ``names`` (original tensors it still has) as extra graph outputs.

    ``destination`` must be in the optimized model's folder (its weights are external data beside it).
    Outputs are declared with their element type only: a layout-transforming backend may store a surviving
    tensor in another shape. A tensor ONNX Runtime's NCHWc transformer keeps only in its blocked layout is
    not exposed (not in the returned list; the saved model has no tensor of that name). Graph inputs no
    node reads and the model does not have are dropped: ORT keeps every input of a model that lists its
    initializers as inputs (IR < 4), also those whose initializer it folded away; such an input changes
    nothing but would have to be fed.
    Returns the names exposed.
    """
    proto = onnx.load(str(optimized), load_external_data=False)
    read = _read_names(proto.graph)
    kept = [value for value in proto.graph.input if value.name in read or value.name in model.input_names]
    if len(kept) < len(proto.graph.input):
        del proto.graph.input[:]
        proto.graph.input.extend(kept)
    produced = {name for node in proto.graph.node for name in node.output if name}
    present = {value.name for value in proto.graph.output}
    exposed = []
    for name in names:
        declared = model.boundary_type(name)
        if name not in produced or name in present or declared is None or not declared.type.HasField("tensor_type"):
            continue
        proto.graph.output.add(name=name).type.tensor_type.elem_type = declared.type.tensor_type.elem_type
        exposed.append(name)
    # The bytes onnx.save writes: its weights already reference the file beside it (onnx.save would only walk
    # every tensor to find none to write out, ~15 ms at 5,000 nodes).
    destination.write_bytes(proto.SerializeToString())
    return exposed


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a node of ``graph`` reads, in its subgraphs (If/Loop/Scan bodies) too."""
    names: set[str] = set()
    for node in graph.node:
        names.update(node.input)
        for body in subgraphs(node):
            names |= _read_names(body)
    return names


def unfed_inputs(replay: Path, model: Model) -> list[str]:
    """Graph inputs of a replay model (:func:`replay_model`) that neither ``model``'s inputs nor its own
    initializers give: a value nobody has. (The inputs ORT keeps for initializers it folded away are read by
    no node, and :func:`replay_model` drops them.)
    """
    proto = onnx.load(str(replay), load_external_data=False)
    given = set(model.input_names) | {t.name for t in proto.graph.initializer} | \
        {t.values.name for t in proto.graph.sparse_initializer}
    return [value.name for value in proto.graph.input if value.name not in given]


@dataclass(frozen=True)
class TargetProbe:
    """What the target's layerwise probe ran, for the report (`compare`'s JSON ``target_probe``).

    ``ran``: ``"replay"`` (the optimized model its plain run saved, with the surviving tensors exposed, run
    under ``spec`` — the same kernels as the verdict's build, checked by final outputs bit-identical to the
    plain run's), ``"probe model"`` (the model with the tensors exposed, built again by the target under
    ``spec``) or ``"plain run"`` (the values its plain run returned: Paddle's hooks). ``fallback``: why the
    replay of a backend that has one (:data:`REPLAY_OPTIONS`) was not used; the probe model ran instead.
    """

    ran: str
    spec: str
    exposed: int
    fallback: str | None = None

    def describe(self) -> str:
        if self.ran == "replay":
            return (f"a replay of the optimized model its plain run saved ({self.spec}, {self.exposed} tensors "
                    "exposed; its final outputs are bit-identical to the plain run's)")
        if self.ran == "plain run":
            return f"its plain run ({self.spec}: {self.exposed} tensors its output hooks returned)"
        text = f"a probe model it built ({self.spec}, {self.exposed} tensors exposed)"
        return f"{text}; the replay of its optimized model was not used: {self.fallback}" if self.fallback else text

    def to_json(self) -> dict[str, object]:
        return {"ran": self.ran, "spec": self.spec, "exposed": self.exposed, "fallback": self.fallback}
