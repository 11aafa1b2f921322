"""The subgraph strategy: which nodes remain. Units are node indices in topological order.

Any subset of nodes is a valid candidate, because every tensor a kept node reads but no kept node
produces is **fed with the oracle's captured value** (DESIGN: "oracle values at cut points"): as a graph
input carried in the candidate's inputs, or — for small integer tensors such as shapes and indices, which
runtimes need as constants to fold shapes and match fusion patterns — as an initializer. The original's
own graph inputs stay graph inputs. The candidate's outputs are the tensors it produces that no kept node
reads (its frontier) plus any original output it produces; their expected values are the oracle's,
straight from the activation store, so testing a candidate costs one *target* invocation and no oracle run.

**Declarations survive.** Optimizers act on declared shapes (ONNX Runtime's LayerNormFusion with a positive
``axes`` fires only when the input's rank is known; an OpenVINO conversion may fail only on dynamic
dimensions), so a candidate carries what the user's model declares, exactly: its opset and domain imports,
functions, IR version, the declarations of its original graph inputs (dynamic dimensions stay dynamic; the
values fed are concrete) and outputs, and the ``value_info`` of every kept tensor. Nothing graphbisect
inferred is added to a tensor the model already has; only a cut point, which the original has no
declaration for as a graph input, is declared with the user's ``value_info`` when there is one, else with
the type inference found in the whole model (symbolic dimensions stay symbolic: what a runtime knows about
that tensor inside the original), never the concrete shape of one run. The whole node set therefore
materializes to the original model itself, and every candidate, declarations included, is exactly what
the target ran before it was accepted.

Weights are never copied per candidate: every initializer above 1 KiB lives once in ``weights.bin`` beside
the candidates, which reference it by offset (:func:`graphbisect.model.io.write_weights_file`).

The search plan (:func:`plan`) uses cheap structure before brute force:
1. hints from layerwise evidence (the first divergence and top root causes, each alone or, inside a fusion,
   with the original nodes the fused node replaced: :mod:`graphbisect.localize.fusion`);
2. prefix bisection: the shortest topological prefix that still fails ends at the culprit's last node;
3. suffix bisection inside it: the shortest slice that still fails starts at the culprit's first node;
4. the cone: the slice's nodes that the failing tensors depend on (drops interleaved parallel branches);
5. probabilistic delta debugging down to a 1-minimal set, with a final one-by-one sweep (a slice or hint of
   at most 12 nodes goes straight to the sweep, ends first: it is mostly needed already, and the sweep is
   the proof).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphbisect.data.protos import tensor_from_array
from graphbisect.engine import (
    BudgetExhausted,
    Evaluator,
    Outcome,
    SearchAborted,
    SearchResult,
    StopReason,
    bisect_prefix,
    probdd,
    sweep,
)
from graphbisect.model import Model
from graphbisect.model.io import ExternalRef, copy_model, strip_to_external, write_weights_file
from graphbisect.model.normalize import node_dependencies
from graphbisect.values import elem_type_of

__all__ = ["Candidate", "SubgraphSpace", "plan"]

log = logging.getLogger(__name__)

#: Start sets at most this large skip ProbDD and go straight to the one-by-one sweep.
_SWEEP_ONLY_MAX = 12

#: Boundary values up to this size are cached in memory per space (the rest stay memory-mapped in the store).
_CACHE_MAX_BYTES = 64 << 10
_CACHE_TOTAL_BYTES = 256 << 20

#: Cut tensors of these dtypes and at most this many elements become initializers, not graph inputs.
_CONST_KINDS = "biu"
_CONST_MAX_ELEMENTS = 4096


@dataclass(frozen=True)
class Candidate:
    """One materialized node subset: a valid model plus what to feed it and what to expect."""

    keep: frozenset[int]
    proto: onnx.ModelProto
    feeds: Mapping[str, Any] = field(repr=False)  # graph inputs (original inputs and cut tensors)
    outputs: tuple[str, ...] = ()

    @property
    def nodes(self) -> int:
        return len(self.keep)


class SubgraphSpace:
    """Materializes node subsets of ``model`` as standalone models fed from oracle values.

    ``values(name)`` returns the oracle's value of any tensor: a graph input or an intermediate (the
    activation store). ``workdir`` receives ``weights.bin`` once; candidates must be saved in ``workdir``
    too, since external-data locations may not leave a model's folder.
    """

    def __init__(self, model: Model, values: Callable[[str], Any], workdir: Path, *,
                 cut_as_initializers: bool = False) -> None:
        self.model = model
        self._values = values
        self._small: dict[str, np.ndarray] = {}
        self._small_bytes = 0
        self.workdir = Path(workdir)
        self.cut_as_initializers = cut_as_initializers
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.refs: dict[str, ExternalRef] = write_weights_file(model, self.workdir / "weights.bin")
        shared = strip_to_external(model.proto, self.refs)
        self._stubs = {t.name: t for t in shared.graph.initializer}  # small ones inline, large ones by offset
        self._inline = model.inline_initializers  # weights kept on disk are read only for inline_weights=True
        self._deps = [node_dependencies(node) for node in model.nodes]
        self._outputs = set(model.output_names)
        self._inputs = frozenset(model.input_names)
        graph = model.proto.graph
        self._value_info = {value.name: value for value in graph.value_info}  # the user's, never inferred
        self._init_inputs = {value.name: value for value in graph.input if value.name in model.initializer_names}
        self._shell = copy_model(model.proto, initializers=False)
        del self._shell.graph.node[:]
        del self._shell.graph.input[:]
        del self._shell.graph.output[:]
        del self._shell.graph.value_info[:]

    @property
    def size(self) -> int:
        return len(self.model.nodes)

    def values(self, name: str) -> Any:
        """The oracle's value of ``name``. Small values are kept: candidates reuse the same boundary tensors,
        and re-mapping a stored ``.npy`` (open, parse the header, map) was most of a candidate's build time.

        A value is any ONNX value (:mod:`graphbisect.values`): an array, a list (sequence) or None (an
        empty optional)."""
        cached = self._small.get(name)
        if cached is not None:
            return cached
        value = self._values(name)
        if not isinstance(value, np.ndarray):
            return value  # a sequence or an empty optional: small, read from the store each time
        if value.nbytes <= _CACHE_MAX_BYTES and self._small_bytes + value.nbytes <= _CACHE_TOTAL_BYTES:
            value = np.array(value)  # a private in-memory copy: no file stays mapped
            self._small[name] = value
            self._small_bytes += value.nbytes
        return value

    def boundary(self, keep: Iterable[int]) -> tuple[list[str], list[str], list[str]]:
        """(cut tensors to feed, initializers used, output tensors) of a node subset, in graph order."""
        order = sorted(keep)
        produced: set[str] = set()
        read: dict[str, None] = {}
        for index in order:
            read.update(dict.fromkeys(self._deps[index]))
            produced.update(name for name in self.model.nodes[index].output if name)
        cut = [name for name in read if name not in produced and name not in self._inline]
        inits = [name for name in read if name in self._inline and name not in produced]
        outputs = [name for index in order for name in self.model.nodes[index].output
                   if name and (name not in read or name in self._outputs)]
        return cut, inits, outputs

    def materialize(self, keep: Iterable[int], *, inline_weights: bool = False) -> Candidate:
        """Build the candidate model for ``keep``. Raises KeyError when a cut value is unknown."""
        keep = frozenset(keep)
        cut, inits, outputs = self.boundary(keep)
        proto = onnx.ModelProto()
        proto.CopyFrom(self._shell)
        graph = proto.graph
        graph.node.extend(self.model.nodes[i] for i in sorted(keep))
        source = self._inline if inline_weights else self._stubs
        graph.initializer.extend(source[name] for name in inits)
        feeds: dict[str, Any] = {}
        for name in cut:
            value = self.values(name)
            if self._as_constant(name, value):
                graph.initializer.append(tensor_from_array(value, name))
            else:
                graph.input.append(self._input_type(name, value))
                feeds[name] = value
        # An initializer the original also lists as a graph input can be overridden: runtimes do not fold it.
        graph.input.extend(self._init_inputs[name] for name in inits if name in self._init_inputs)
        graph.output.extend(self._output_type(name) for name in outputs)
        produced = {name for index in keep for name in self.model.nodes[index].output}
        graph.value_info.extend(value for name, value in self._value_info.items()
                                if name in produced and name not in outputs)
        return Candidate(keep, proto, feeds, tuple(outputs))

    def _as_constant(self, name: str, value: Any) -> bool:
        if not isinstance(value, np.ndarray):
            return False  # sequences and optionals can only be graph inputs
        if self.cut_as_initializers:
            return True
        if name in self._inputs:  # the original feeds it at run time: a constant would fold what it does not
            return False
        return value.dtype.kind in _CONST_KINDS and value.size <= _CONST_MAX_ELEMENTS

    def _input_type(self, name: str, value: Any) -> onnx.ValueInfoProto:
        """How a fed value is declared: the model's own type (module docstring) when the value fits it; a
        sequence or optional always as the model declares it (an empty one holds no element to type it by)."""
        known = self.model.boundary_type(name)
        if known is not None and (_fits(known, value) if isinstance(value, np.ndarray) else
                                  not known.type.HasField("tensor_type")):
            return known
        log.debug("no usable type for cut tensor %r; declaring only its element type", name)
        return helper.make_tensor_value_info(name, _elem_type(name, value), None)

    def _output_type(self, name: str) -> onnx.ValueInfoProto:
        known = self.model.boundary_type(name)
        if known is not None and (not known.type.HasField("tensor_type") or known.type.tensor_type.elem_type):
            return known
        return helper.make_tensor_value_info(name, _elem_type(name, self.values(name)), None)

    def cone(self, keep: Iterable[int], tensors: Iterable[str]) -> frozenset[int]:
        """The nodes of ``keep`` that the given tensors depend on (within ``keep``)."""
        keep = frozenset(keep)
        pending = [self.model.producer[t] for t in tensors if t in self.model.producer]
        cone: set[int] = set()
        while pending:
            index = pending.pop()
            if index in cone or index not in keep:
                continue
            cone.add(index)
            pending.extend(self.model.producer[t] for t in self._deps[index] if t in self.model.producer)
        return frozenset(cone)


def _elem_type(name: str, value: Any) -> int:
    """The ONNX element type of a tensor value (every type: ``ml_dtypes`` arrays, strings); KeyError otherwise."""
    code = elem_type_of(value) if isinstance(value, np.ndarray) else None
    if code is None:
        raise KeyError(f"the model declares no type for {name!r}, and its value ({type(value).__name__}) gives none")
    return code


def _fits(info: onnx.ValueInfoProto, value: np.ndarray) -> bool:
    """Whether a tensor declaration admits ``value``: same element type, and rank and static dimensions
    equal where it declares a shape (a wrong inferred type must not make a runtime refuse the feed)."""
    if not info.type.HasField("tensor_type"):
        return False
    tensor_type = info.type.tensor_type
    if elem_type_of(value) != tensor_type.elem_type:
        return False
    if not tensor_type.HasField("shape"):
        return True
    dims = tensor_type.shape.dim
    return len(dims) == value.ndim and all(
        not dim.HasField("dim_value") or dim.dim_value == size for dim, size in zip(dims, value.shape, strict=True))


def plan(evaluator: Evaluator, space: SubgraphSpace, *, hints: Sequence[frozenset[int]] = (),
         priors: Mapping[int, float] | None = None) -> SearchResult:
    """Run the subgraph search plan (module docstring) and return the engine's final result.

    The whole model as a candidate must fail; when its outputs differ from the original model's (a dangling
    intermediate becomes an output) that is checked with one invocation rather than assumed.
    """
    best = [frozenset(range(space.size))]
    evaluator.set_best(space.size, phase="hints", start=True)  # the progress bar's size before any search
    try:
        extra_outputs = space.boundary(best[0])[2] != list(space.model.output_names)
        if extra_outputs and evaluator.evaluate(best[0], phase="confirm").outcome is not Outcome.FAIL:
            raise SearchAborted("the whole model as a candidate does not fail like the original",
                                result=SearchResult(best[0], False, None, evaluator.stats(), ()),
                                hint="report this as a graphbisect bug, with the model")
        for hint in hints:  # evidence first: a one-node culprit needs one candidate
            if evaluator.evaluate(hint, phase="hints").outcome is Outcome.FAIL:
                log.info("layerwise hint reproduces the failure with %d node(s)", len(hint))
                best.append(hint)
                break
        else:
            best.append(_slice(evaluator, best[-1]))
            best.append(_cone(evaluator, space, best[-1]))
    except BudgetExhausted as exc:
        return SearchResult(best[-1], False, exc.reason, evaluator.stats(), ())
    except KeyboardInterrupt:  # Ctrl-C between the engine's searches: the run stops with its best-so-far
        evaluator.meter.interrupt()
        return SearchResult(best[-1], False, StopReason.INTERRUPTED, evaluator.stats(), ())
    if len(best[-1]) <= _SWEEP_ONLY_MAX:
        # A slice this small is usually minimal already: the proof (one run per node) is all that is left,
        # and ProbDD's group removals before its own closing sweep only add runs.
        return sweep(evaluator, best[-1], atoms=_outside_in(best[-1]), phase="sweep")
    return probdd(evaluator, best[-1], prior=dict(priors) if priors else None, phase="probdd")


def _outside_in(keep: frozenset[int]) -> list[frozenset[int]]:
    """Single nodes, last, first, second-to-last, second, ...: a region's removable nodes sit at its ends
    (a fused pattern's optional head and tail), and the sweep costs the tests up to its last removal plus
    one pass over the result, so trying the ends first makes it cheapest."""
    order = sorted(keep)
    result = []
    while order:
        result.append(frozenset({order.pop()}))
        if order:
            result.append(frozenset({order.pop(0)}))
    return result


def _slice(evaluator: Evaluator, keep: frozenset[int]) -> frozenset[int]:
    """The shortest topological slice that still fails: prefix bisection, then suffix bisection inside it."""
    order = sorted(keep)
    prefix = bisect_prefix(evaluator, order, phase="prefix")
    if prefix.found is None or prefix.stop_reason is not None:
        return keep
    head = order[: prefix.found]
    suffix = bisect_prefix(evaluator, list(reversed(head)), phase="suffix")
    if suffix.found is None or suffix.stop_reason is not None:
        return frozenset(head)
    return frozenset(head[len(head) - suffix.found:])


def _cone(evaluator: Evaluator, space: SubgraphSpace, keep: frozenset[int]) -> frozenset[int]:
    """Drop the slice's nodes that the failing tensors do not depend on (interleaved parallel branches)."""
    detail = evaluator.evaluate(keep, phase="cone").detail  # cached: the slice was just tested
    tensors = detail.get("failing", []) if isinstance(detail, dict) else []
    cone = space.cone(keep, tensors) if tensors else keep
    if cone and cone != keep and evaluator.evaluate(cone, phase="cone").outcome is Outcome.FAIL:
        return cone
    return keep
