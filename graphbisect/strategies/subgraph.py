"""The subgraph strategy: which nodes remain. Units are node indices in topological order.

Any subset of nodes is a valid candidate, because every tensor a kept node reads but no kept node
produces is **fed with the oracle's captured value** (DESIGN: "oracle values at cut points"): as a graph
input carried in the candidate's inputs, or — for small integer tensors such as shapes and indices, which
runtimes need as constants to fold shapes and match fusion patterns — as an initializer, unless the original
gives them a dynamic dimension (a constant would fix it to the captured run's size). The original's own graph
inputs stay graph inputs. The candidate's outputs are any original output it produces plus the
tensors it produces that no kept node reads (its frontier) — but never a tensor that no node of the original
reads either (an LSTM's unused ``Y_h``): the original does not expose it, and exposing it changes what a
compiler makes of its node (IREE 3.13 miscompiles a BiLSTM fed by a Gather with dynamic dimensions only
while ``Y_h``/``Y_c`` are not outputs). Their expected values are the oracle's, straight from the activation
store, so testing a candidate costs one *target* invocation and no oracle run.

**Declarations survive.** Optimizers act on declared shapes (ONNX Runtime's LayerNormFusion with a positive
``axes`` fires only when the input's rank is known; an OpenVINO conversion may fail only on dynamic
dimensions), so a candidate carries what the user's model declares, exactly: its opset and domain imports,
functions, IR version, the declarations of its original graph inputs (dynamic dimensions stay dynamic; the
values fed are concrete) and outputs, and the ``value_info`` of every kept tensor. Nothing graphbisect
inferred is added to a tensor the model already has; only a cut point, which the original has no
declaration for as a graph input, is declared with the user's ``value_info`` when there is one, else with
the type inference found in the whole model (symbolic dimensions stay symbolic: what a runtime knows about
that tensor inside the original), never the concrete shape of one run.

**Every candidate is a valid model, whatever its tensors' types.** onnx's shape inference leaves the outputs
of many operators untyped or typed without a shape (``ai.onnx.ml``'s Scaler, Normalizer and Imputer, every
``com.microsoft`` operator, and what follows them: an SVMClassifier's labels, a LabelEncoder's strings), and
``onnx.checker`` refuses a graph input or output without both. Such a cut point or frontier output is
declared from the oracle's captured value: its element type (strings and every other type; a sequence as a
sequence of its elements' type) where nothing declares one, and its **rank** where nothing declares a
shape, each dimension unknown. Not its sizes: nothing the original declares or onnx infers fixes them,
and a concrete size is the shape of one run, which a compiler may specialize on (a runtime's own shape
propagation may know more inside the original, but what it knows cannot be read from the model). The rank
is the least the format requires (a declaration without a shape is refused), and a tensor's rank does not
change between runs in practice. The original's own graph inputs, and its outputs as outputs, keep the
user's declaration as written (the whole model stays the original; one without a shape makes the whole
model fail the checker, which then vetoes no candidate). Only a value that cannot be typed (an empty
sequence, an empty optional) leaves a tensor undeclarable: its candidate is not built, and reduce counts
such a removal as untested, never as proof that a node is needed. Inputs, initializers and outputs the
original has keep its order. The whole node set therefore materializes to the original model itself,
byte for byte (when every input and initializer is read), and every candidate, declarations included, is
exactly what the target ran before it was accepted.

Weights are never copied per candidate: every initializer above 1 KiB lives once in ``weights.bin`` beside
the candidates, which reference it by offset (:func:`graphbisect.model.io.write_weights_file`).

The search plan (:func:`plan`) uses cheap structure before brute force:
1. hints from layerwise evidence (the first divergence and top root causes, each alone or, inside a fusion,
   with the original nodes the fused node replaced: :mod:`graphbisect.localize.fusion`); when none fails
   alone, all of them together joined to the outputs they reach by shortest paths (:func:`_bridged`: two
   distant sites that flip an output only together, 103 runs → 52 on ``reduce_bench.py``'s two-distant case;
   such a joined set goes straight to the sweep in topological order, 52 → 44: step 5);
2. prefix bisection: the shortest topological prefix that still fails ends at the culprit's last node;
3. suffix bisection inside it: the shortest slice that still fails starts at the culprit's first node;
4. the cone: the slice's nodes that the failing tensors depend on (drops interleaved parallel branches);
5. probabilistic delta debugging down to a 1-minimal set, with a final one-by-one sweep. A slice or hint of
   at most 12 nodes goes straight to the sweep, ends first: it is mostly needed already, and the sweep is
   the proof. So does the joined hint of step 1, whatever its size: each of its nodes is in a region the
   target compiled as one kernel (whose pattern needs most of its nodes) or on the one path that carries a
   site's error to an output (cut, the output gets the oracle's value), so most are needed, and where an
   atom is needed with probability above ~0.38 one-by-one removal beats removing groups
   (:data:`graphbisect.engine.probdd.UNGAR`). In topological order a site's upstream nodes, the ones its
   region may not need, are tried first: on the two-distant case ProbDD spent 20 runs finding the two
   removable nodes the sweep finds in 13.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import helper

from graphbisect.data.protos import tensor_from_array
from graphbisect.data.store import ActivationStore, StoredFeeds
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
from graphbisect.model.normalize import node_dependencies, subgraphs
from graphbisect.model.wire import GRAPH_FIELDS, GraphLayout, entry, entry_payload
from graphbisect.storage.atomic import atomic_path
from graphbisect.storage.values import dtype_elem_type

__all__ = ["Candidate", "SubgraphSpace", "check_file", "plan"]

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
    """One materialized node subset: a valid model plus what to feed it and what to expect.

    The model is its serialized bytes (``data``, what :meth:`save` writes); ``proto`` parses them on first
    use. A candidate built with the weights inline holds a ``ModelProto`` instead (its bytes may pass
    protobuf's 2 GiB limit), and ``data`` serializes it on first use.
    """

    keep: frozenset[int]
    feeds: Mapping[str, Any] = field(repr=False)  # graph inputs (original inputs and cut tensors)
    outputs: tuple[str, ...] = ()
    #: ONNX element type of each output (0: untyped, or not a tensor)
    output_types: tuple[int, ...] = ()
    wire: bytes | None = field(default=None, repr=False)
    built: onnx.ModelProto | None = field(default=None, repr=False)
    #: ids of the cut tensors and of the outputs in the space that made the candidate (for its ``check``)
    ids: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def nodes(self) -> int:
        return len(self.keep)

    @functools.cached_property
    def proto(self) -> onnx.ModelProto:
        """The candidate as a ``ModelProto`` (parsed from ``data`` once; do not modify it)."""
        if self.built is not None:
            return self.built
        return onnx.ModelProto.FromString(self.data)

    @functools.cached_property
    def data(self) -> bytes:
        """The serialized model: exactly ``proto.SerializeToString()``."""
        if self.wire is not None:
            return self.wire
        assert self.built is not None
        return self.built.SerializeToString()

    @functools.cached_property
    def digest(self) -> str:
        """sha256 (hex) of the model's serialization: equal digests, equal models
        (:func:`graphbisect.oracle.tester.model_digest` of ``proto``)."""
        return hashlib.sha256(self.data).hexdigest()

    def save(self, path: Path, *, durable: bool = True) -> Path:
        """Write the model to ``path`` atomically (``durable=False``: no fsync, for a scratch file). Its
        initializers reference ``weights.bin`` by relative location: save it in the space's ``workdir``."""
        with atomic_path(path, durable=durable) as tmp:
            tmp.write_bytes(self.data)
        return path


class SubgraphSpace:
    """Materializes node subsets of ``model`` as standalone models fed from oracle values.

    ``values(name)`` returns the oracle's value of any tensor: a graph input or an intermediate (the
    activation store). ``workdir`` receives ``weights.bin`` once; candidates must be saved in ``workdir``
    too, since external-data locations may not leave a model's folder.

    Cost: a candidate is assembled from pieces serialized once per space (:mod:`graphbisect.model.wire`):
    each node, each ``value_info``, each initializer stub, and — the first time a tensor is a cut point or
    an output — its declaration or constant. Its boundary is computed with numpy over tensor ids. So a
    candidate costs a join of bytes proportional to its size, not a copy of every kept node into a new
    ``ModelProto`` and a serialization of it.
    """

    def __init__(self, model: Model, values: Callable[[str], Any], workdir: Path, *,
                 cut_as_initializers: bool = False, store: ActivationStore | None = None,
                 declare_ahead: bool = True) -> None:
        """``store``: the activation store ``values`` reads the intermediates from (graph inputs aside), when
        there is one: a cut point it describes is declared from its index (dtype and shape, no value read:
        :meth:`_stored_piece`), and a candidate's feeds name those tensors in it (:class:`StoredFeeds`) instead
        of holding their values, so a backend worker reads them from the store itself. ``declare_ahead``: every
        such declaration is made here, once per search (:meth:`_declare_stored`: a search's candidates then
        touch thousands of cut points at the cost of numpy gathers); False makes each the first time a
        candidate cuts there, for a space that builds one or two candidates (``compare`` running failing
        regions alone: a few of thousands). ``declare_seconds``: what those declarations have cost so far."""
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
        self._init_inputs = {value.name: value for value in graph.input if value.name in model.initializer_names}
        shell = copy_model(model.proto, initializers=False)
        self._layout = GraphLayout(shell)
        self._index = _TensorIndex(model, self._deps, self._inline)
        self._node_pieces = _objects(entry(_NODE, node.SerializeToString()) for node in model.nodes)
        # The user's value_info (never inferred), by tensor id in the model's order; unknown tensors are left
        # out (no candidate produces them).
        value_info = {value.name: value for value in graph.value_info}
        known = [name for name in value_info if name in self._index.ids]
        self._vi_ids = np.array([self._index.ids[name] for name in known], dtype=np.int64)
        self._vi_pieces = _objects(entry(_VALUE_INFO, value_info[name].SerializeToString()) for name in known)
        index = self._index
        self._names = _objects(index.names)
        self._init_pieces = _objects(entry(_INITIALIZER, self._stubs[name].SerializeToString())
                                     if name in self._stubs else b"" for name in index.names)
        self._init_inputs_of = np.array([name in self._init_inputs for name in index.names], dtype=bool)
        self._init_input_pieces = _objects(entry(_INPUT, self._init_inputs[name].SerializeToString())
                                           if name in self._init_inputs else b"" for name in index.names)
        self._cut = _Pieces(len(index.names))  # a cut tensor's declaration (graph input) or constant
        self._out = _Pieces(len(index.names))  # an output's declaration
        self._checker = _PieceChecker(model)
        self._lock = threading.Lock()  # guards making pieces and checking them
        self.store = store if store is not None and store.reference() is not None else None
        #: per tensor id: its cut declaration was made from the store's index, its value is read from the store
        self._stored = np.zeros(len(index.names), dtype=bool)
        #: seconds the declarations from the store's index took: here with ``declare_ahead``, else the first
        #: touches of cut points and outputs in :meth:`materialize`
        self.declare_seconds = 0.0
        self._on_touch = self.store is not None and not declare_ahead
        if self.store is not None and declare_ahead:
            started = time.perf_counter()
            self._declare_stored(self.store)
            self.declare_seconds = time.perf_counter() - started

    @property
    def size(self) -> int:
        return len(self.model.nodes)

    def values(self, name: str) -> Any:
        """The oracle's value of ``name``. Small values are kept: candidates reuse the same boundary tensors,
        and re-mapping a stored ``.npy`` (open, parse the header, map) was most of a candidate's build time.

        A value is any ONNX value (:mod:`graphbisect.storage.values`): an array, a list (sequence) or None (an
        empty optional)."""
        cached = self._small.get(name)
        if cached is not None:
            return cached
        value = self._values(name)
        if not isinstance(value, np.ndarray):
            return value  # a sequence or an empty optional: small, read from the store each time
        if value.nbytes <= _CACHE_MAX_BYTES and self._small_bytes + value.nbytes <= _CACHE_TOTAL_BYTES:
            if value.flags.writeable or not value.flags.owndata or isinstance(value, np.memmap):
                value = np.array(value)  # a private in-memory copy (the store's small reads are already)
                value.setflags(write=False)  # shared by every candidate (and held by the worker: InputsWriter)
            self._small[name] = value
            self._small_bytes += value.nbytes
        return value

    def boundary(self, keep: Iterable[int]) -> tuple[list[str], list[str], list[str]]:
        """(cut tensors to feed, initializers used, output tensors) of a node subset, in the orders
        :meth:`materialize` writes them."""
        found = self._index.boundary(keep)
        return self._names[found.cut].tolist(), self._names[found.inits].tolist(), self._names[found.outputs].tolist()

    def materialize(self, keep: Iterable[int], *, inline_weights: bool = False) -> Candidate:
        """Build the candidate model for ``keep``. Raises KeyError when a cut value is unknown.

        The model (module docstring): the kept nodes in order; initializers read (weights.bin stubs), in the
        original's order, then small integer cut tensors as constants; graph inputs: the original's own that
        the nodes read — its inputs and the initializers it also lists as inputs (runtimes do not fold those,
        so they stay overridable) — in its order, then the other cut tensors in order of first read; outputs:
        the original outputs produced, in its order, then the frontier (tensors no kept node reads but some
        node of the original does) in node order; ``value_info``: the user's, of kept non-output tensors.
        """
        keep = frozenset(keep)
        found = self._index.boundary(keep)
        cut, inits, outputs = found.cut, found.inits, found.outputs
        if not (self._cut.made[cut].all() and self._out.made[outputs].all()):
            with self._lock:  # the engine may evaluate candidates in threads (jobs > 1)
                started = time.perf_counter()
                new = cut[~self._cut.made[cut]]  # first time a cut point: its declaration or constant
                if new.size:
                    self._cut.fill(new, [self._stored_piece(i) or self._cut_piece(i) for i in new.tolist()])
                new = outputs[~self._out.made[outputs]]
                if new.size:
                    self._out.fill(new, [_Made(self._output_type(self._names[i], self._stored_rank(self._names[i])),
                                               _OUTPUT) for i in new.tolist()])
                if self._on_touch:
                    self.declare_seconds += time.perf_counter() - started
        constant = self._cut.constant[cut]
        fed = cut[~constant]
        names = self._names[fed].tolist()
        feeds: Mapping[str, Any]
        if self.store is not None:
            stored = self._stored[fed]
            held = fed[~stored]
            feeds = StoredFeeds(names, self._feeds(held, self._names[held].tolist()), self.store, self.values)
        else:
            feeds = self._feeds(fed, names)
        data = self._layout.assemble(
            node=self._node_pieces[found.nodes].tolist(),
            initializer=[*self._init_pieces[inits].tolist(), *self._cut.data[cut[constant]].tolist()],
            input=self._input_pieces(fed, inits),
            output=self._out.data[outputs].tolist(),
            value_info=self._vi_pieces[found.produced[self._vi_ids] & ~found.output_mask[self._vi_ids]].tolist())
        output_names = tuple(self._names[outputs].tolist())
        types = tuple(self._out.elem_type[outputs].tolist())
        if not inline_weights:
            return Candidate(keep, feeds, output_names, types, wire=data, ids=(cut, outputs))
        # For a bundle: the weights inline. Built as a ModelProto (with large weights its bytes may pass
        # protobuf's 2 GiB limit; bundles are saved with external data then), the stubs replaced in place.
        proto = onnx.ModelProto.FromString(data)
        for tensor in proto.graph.initializer:
            if tensor.name in self._stubs and tensor.data_location == onnx.TensorProto.EXTERNAL:
                tensor.CopyFrom(self._inline[tensor.name])
        return Candidate(keep, feeds, output_names, types, built=proto, ids=(cut, outputs))

    def materialize_apart(self, regions: Sequence[Iterable[int]]) -> Candidate:
        """One model holding each of ``regions`` (disjoint node sets) *apart*: every region reads the oracle's
        values at its own cut points, also where another region computes that tensor, so the regions' outputs
        say what each computes on exact inputs, in one target run.

        Each region is materialized alone (:meth:`materialize`) and the models are joined: a cut tensor that
        another region produces is renamed in the reading region to ``<name>::oracle`` (fed, or a constant,
        with the oracle's value), so the two never connect; weights, imports and declarations are shared. The
        outputs are every region's outputs, under their own names. Raises KeyError as :meth:`materialize`.

        Example:
            >>> both = space.materialize_apart([{0, 1}, {2}])  # node 2 reads node 1's output, fed  # doctest: +SKIP
        """
        parts = [self.materialize(region) for region in regions]
        produced = {name for part in parts for node in part.proto.graph.node for name in node.output if name}
        merged = copy_model(parts[0].proto, initializers=False, nodes=False) if parts else onnx.ModelProto()
        graph = merged.graph
        del graph.input[:], graph.output[:], graph.value_info[:]
        feeds: dict[str, Any] = {}
        seen: dict[str, set[str]] = {"input": set(), "initializer": set(), "output": set(), "value_info": set()}
        outputs: list[str] = []
        types: list[int] = []

        def add(field_name: str, item: Any) -> None:
            if item.name not in seen[field_name]:
                seen[field_name].add(item.name)
                getattr(graph, field_name).add().CopyFrom(item)

        for part in parts:
            proto = part.proto.graph
            fed = {v.name for v in proto.input} | {t.name for t in proto.initializer}
            renamed = {name: f"{name}::oracle" for name in fed & produced}
            for node in proto.node:
                copy = graph.node.add()
                copy.CopyFrom(node)
                copy.input[:] = [renamed.get(name, name) for name in node.input]
            for value in proto.input:
                add("input", _renamed(value, renamed.get(value.name)))
                if value.name in part.feeds:
                    feeds[renamed.get(value.name, value.name)] = part.feeds[value.name]
            for tensor in proto.initializer:
                add("initializer", _renamed(tensor, renamed.get(tensor.name)))
            for value in proto.value_info:
                add("value_info", value)
            for value, elem_type in zip(proto.output, part.output_types, strict=True):
                if value.name not in seen["output"]:
                    outputs.append(value.name)
                    types.append(elem_type)
                add("output", value)
        keep = frozenset(i for part in parts for i in part.keep)
        return Candidate(keep, feeds, tuple(outputs), tuple(types), built=merged)

    def _input_pieces(self, fed: np.ndarray, inits: np.ndarray) -> list[bytes]:
        """The graph input entries of a candidate feeding ``fed`` and reading ``inits`` (ids, in the boundary's
        order): the original's own graph inputs — fed ones and initializers it also lists as inputs (runtimes
        do not fold those, so they stay overridable) — in its order, then the cut tensors."""
        overridable = inits[self._init_inputs_of[inits]]
        if not overridable.size:
            return self._cut.data[fed].tolist()  # the boundary puts the original's inputs first, in its order
        rank = self._index.input_rank
        own = np.concatenate([fed[rank[fed] >= 0], overridable])
        own = own[np.argsort(rank[own], kind="stable")]
        pieces = np.where(self._init_inputs_of[own], self._init_input_pieces[own], self._cut.data[own])
        return [*pieces.tolist(), *self._cut.data[fed[rank[fed] < 0]].tolist()]

    def _feeds(self, fed: np.ndarray, names: list[str]) -> dict[str, Any]:
        """The values of the cut tensors ``fed`` (ids) named ``names``: kept with their declaration, or read."""
        values = self._cut.value[fed].tolist()  # small values are kept with their declaration
        if self._cut.has_value[fed].all():
            return dict(zip(names, values, strict=True))
        return {name: value if kept else self.values(name)
                for name, value, kept in zip(names, values, self._cut.has_value[fed].tolist(), strict=True)}

    def _declare_stored(self, store: ActivationStore) -> None:
        """Make the piece of every tensor that ``store`` holds as a plain tensor and that can be a cut point —
        its declaration as a graph input from the index alone (:meth:`_stored_piece`), or its constant (a small
        integer tensor: read, :meth:`_cut_piece`) — and every output declaration that needs no value; check
        them all once. A first touch of thousands of new cut points then costs numpy gathers, not a store read,
        a declaration and a checker call each. Graph inputs (fed by the user, not the store), sequences, types
        numpy lacks and ``cut_as_initializers`` are left to the first touch."""
        names = self._names.tolist()
        if not self.cut_as_initializers:
            ids = [index for index in np.flatnonzero(~self._index.is_init).tolist()
                   if names[index] not in self._inputs and store.describe(names[index]) is not None]
            if ids:
                cut = np.array(ids, dtype=np.int64)
                self._cut.fill(cut, [self._stored_piece(i) or self._cut_piece(i) for i in ids])
                if self._checker.piecewise:
                    self._cut.refused(cut, self._checker)
        ids, made = [], []
        for index in np.flatnonzero(self._index.written).tolist():
            name = names[index]
            known = self.model.boundary_type(name)
            if known is None or (known.type.HasField("tensor_type") and not known.type.tensor_type.elem_type):
                continue  # typed by its value, on first touch
            described = store.describe(name)
            if name in self._outputs or _has_shape(known) or described is not None:
                ids.append(index)
                rank = len(described[1]) if described is not None else None  # from the index: no value read
                made.append(_Made(self._output_type(name, rank), _OUTPUT))
        if ids:
            out = np.array(ids, dtype=np.int64)
            self._out.fill(out, made)
            if self._checker.piecewise:
                self._out.refused(out, self._checker)
        log.debug("declared %d stored cut points and %d outputs from the store's index", self._stored.sum(), len(ids))

    def _stored_piece(self, index: int) -> _Made | None:
        """The declaration of cut point ``index`` as a graph input from the store's index alone (no value read),
        its value then read from the store by the worker (:class:`StoredFeeds`); None where :meth:`_cut_piece`
        makes the piece from the value: no store, ``cut_as_initializers``, the original's own graph inputs (fed
        by the user, not the store), a tensor the store does not hold as a plain tensor (sequences, types numpy
        lacks), and a small integer constant (its value is the piece). The declaration is the one
        :meth:`_cut_piece` would make from the value (:meth:`_declared_type` of its dtype and shape)."""
        if self.store is None or self.cut_as_initializers or self._index.is_init[index]:
            return None
        name = self._names[index]
        described = self.store.describe(name) if name not in self._inputs else None
        if described is None:
            return None
        dtype, shape = described
        if self._small_constant(name, dtype, math.prod(shape)):
            return None
        self._stored[index] = True
        return _Made(self._declared_type(name, dtype, shape), _INPUT)

    def _stored_rank(self, name: str) -> int | None:
        """The rank of ``name``'s value from the store's index (None: no store, or it holds no plain tensor of
        that name), so that declaring an output the model gives no shape reads no value (:meth:`_output_type`)."""
        described = self.store.describe(name) if self.store is not None else None
        return len(described[1]) if described is not None else None

    def check(self, candidate: Candidate, path: Path) -> str | None:
        """What ``onnx.checker.check_model`` says about a candidate saved at ``path`` (its first line), None
        when it passes — **given that the whole model passes it** (:class:`CandidateTester` checks that once).

        Then only the pieces a candidate adds are unchecked: the declarations of its cut tensors and outputs
        and its constant cut tensors; each is checked once, with the checker's own ``check_value_info`` /
        ``check_tensor`` in the model's context, and its verdict kept. The rest the checker looks at is the
        whole model's own bytes (nodes, ``value_info``, initializer stubs, imports, functions) or holds by
        construction (topological order, single assignment, unique names). Where that argument has a gap,
        the file is checked whole: IR version ≤ 3 (initializers must also be graph inputs), and models
        with subgraphs (a name scope that depends on node order) or sparse initializers."""
        if not self._checker.piecewise or candidate.ids is None:
            return check_file(path)
        cut, outputs = candidate.ids
        constant = self._cut.constant[cut]
        with self._lock:
            # In the checker's order: graph inputs, outputs, then initializers.
            return (self._cut.refused(cut[~constant], self._checker) or self._out.refused(outputs, self._checker)
                    or self._cut.refused(cut[constant], self._checker))

    def _cut_piece(self, index: int) -> _Made:
        name = self._names[index]
        value = self.values(name)
        if self._as_constant(name, value):
            return _Made(tensor_from_array(value, name), _INITIALIZER, constant=True)
        # A value the cache keeps is kept with its declaration too; a larger one is read per candidate.
        return _Made(self._input_type(name, value), _INPUT, value=value if name in self._small else _NO_VALUE)

    def _as_constant(self, name: str, value: Any) -> bool:
        if not isinstance(value, np.ndarray):
            return False  # sequences and optionals can only be graph inputs
        if self.cut_as_initializers:
            return True
        if name in self._inputs:  # the original feeds it at run time: a constant would fold what it does not
            return False
        return self._small_constant(name, value.dtype, value.size)

    def _small_constant(self, name: str, dtype: np.dtype, size: int) -> bool:
        """Whether a cut tensor of ``dtype`` and ``size`` elements is fed as a constant: a small integer or
        boolean tensor (shapes, axes, indices: runtimes need them constant to fold shapes and match fusion
        patterns) whose shape the original knows as fixed, or whose value it does (computed from constants and
        static shapes alone: a compiler folds it, whatever its declaration says; OpenVINO fails to compile a
        Reshape whose shape, declared ``[Concat_dim_0]``, is computed so, and compiles it fed at run time). Where
        the original gives it a dynamic dimension (token ids of ``[batch, seq]``), a constant would fix that
        dimension to the captured run's size, so it is a graph input declared with the original's dimensions
        (IREE 3.13 miscompiles a BiLSTM's embedding only with them dynamic)."""
        return dtype.kind in _CONST_KINDS and size <= _CONST_MAX_ELEMENTS and \
            (not _has_dynamic_dim(self.model.boundary_type(name)) or name in self.model.fixed_tensors)

    def _input_type(self, name: str, value: Any) -> onnx.ValueInfoProto:
        """How a fed value is declared: the model's own type (module docstring) when the value fits it; a
        sequence or optional as the model declares it, else by its elements' type (an empty one holds no
        element to type it by: KeyError)."""
        if isinstance(value, np.ndarray):
            return self._declared_type(name, value.dtype, value.shape)
        known = self.model.boundary_type(name)
        if known is not None and not known.type.HasField("tensor_type"):
            return known
        log.debug("no usable type for cut value %r; declaring it by its elements' type", name)
        return _value_type(name, value)

    def _declared_type(self, name: str, dtype: np.dtype, shape: Sequence[int]) -> onnx.ValueInfoProto:
        """How a fed tensor of ``dtype`` and ``shape`` is declared (:meth:`_input_type`): the model's type when
        it fits, given the value's rank where it declares no shape (the original's own graph inputs aside: they
        stay as the user wrote them); else the value's element type and rank (module docstring)."""
        known = self.model.boundary_type(name)
        if known is not None and _fits(known, dtype, shape):
            return known if name in self._inputs else _with_rank(known, len(shape))
        log.debug("no usable type for cut tensor %r; declaring its element type and rank", name)
        code = dtype_elem_type(dtype)
        if code is None:
            raise KeyError(f"the model declares no type for {name!r}, and its value ({dtype}) gives none")
        return helper.make_tensor_value_info(name, code, [None] * len(shape))

    def _output_type(self, name: str, rank: int | None = None) -> onnx.ValueInfoProto:
        """How an output is declared: the model's type (its own outputs' exactly as the user wrote them), given
        the value's rank where it declares no shape; else the captured value's type (module docstring).
        ``rank``: the value's, when known without reading it (the store's index)."""
        known = self.model.boundary_type(name)
        if known is not None and (not known.type.HasField("tensor_type") or known.type.tensor_type.elem_type):
            if name in self._outputs or _has_shape(known):
                return known
            if rank is None:
                value = self.values(name)
                if not isinstance(value, np.ndarray):
                    return known  # declared a tensor, captured otherwise: the declaration stands, as before
                rank = value.ndim
            return _with_rank(known, rank)
        return _value_type(name, self.values(name))

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


_NODE, _INITIALIZER, _INPUT, _OUTPUT, _VALUE_INFO = (GRAPH_FIELDS[name] for name in
                                                      ("node", "initializer", "input", "output", "value_info"))


_NO_VALUE = object()


class _Made(NamedTuple):
    """A piece as first made: the message, the graph field it goes to, and for a cut point whether it is a
    constant (its message a ``TensorProto``; every other piece's is a ``ValueInfoProto``) and the small value
    kept with it (``_NO_VALUE``: none kept). A tuple: a first touch of a large model makes thousands (a frozen
    dataclass's ``__init__`` cost ~1.5 µs each)."""

    message: onnx.ValueInfoProto | onnx.TensorProto
    number: int
    constant: bool = False
    value: Any = _NO_VALUE


class _Pieces:
    """Per tensor id, made on first use: a cut point's declaration or constant, or an output's declaration —
    the message, its graph entry's bytes, and the checker's verdict on it (checked on first need)."""

    def __init__(self, size: int) -> None:
        self.made = np.zeros(size, dtype=bool)
        self.data = np.empty(size, dtype=object)  # the field entry (bytes)
        self.constant = np.zeros(size, dtype=bool)  # an initializer (a cut point's constant), not a declaration
        self.value = np.empty(size, dtype=object)  # a small fed value kept with its declaration
        self.has_value = np.zeros(size, dtype=bool)
        self.elem_type = np.zeros(size, dtype=np.int64)  # a declaration's tensor element type (0: none)
        self._state = np.zeros(size, dtype=np.int8)  # 0 not checked, 1 passes, 2 refused
        self._verdicts: dict[int, str] = {}

    def fill(self, ids: np.ndarray, made: Sequence[_Made]) -> None:
        """Record the pieces ``made`` for tensors ``ids`` (one numpy assignment per column)."""
        self.data[ids] = _objects(entry(m.number, m.message.SerializeToString()) for m in made)
        self.constant[ids] = [m.constant for m in made]
        self.elem_type[ids] = [m.message.type.tensor_type.elem_type if isinstance(m.message, onnx.ValueInfoProto)
                               else 0 for m in made]  # 0 as well when not a tensor type
        kept = np.array([m.value is not _NO_VALUE for m in made], dtype=bool)
        if kept.any():
            self.value[ids[kept]] = _objects(m.value for m in made if m.value is not _NO_VALUE)
            self.has_value[ids[kept]] = True
        self.made[ids] = True

    def refused(self, ids: np.ndarray, checker: _PieceChecker) -> str | None:
        """The checker's message on the first of ``ids`` it refuses; None when it refuses none."""
        for index in ids[self._state[ids] == 0].tolist():
            # the message is checked from its entry's bytes (a constant is a TensorProto, the rest declarations)
            verdict = checker.verdict(entry_payload(self.data[index]), bool(self.constant[index]))
            if verdict is not None:
                self._verdicts[index] = verdict
            self._state[index] = 1 if verdict is None else 2
        bad = ids[self._state[ids] == 2]
        return self._verdicts[int(bad[0])] if bad.size else None


class _PieceChecker:
    """``onnx.checker``'s verdict on single pieces, in the model's context (see :meth:`SubgraphSpace.check`)."""

    def __init__(self, model: Model) -> None:
        graph = model.proto.graph
        self.piecewise = (model.ir_version >= 4 and not graph.sparse_initializer
                          and not any(True for node in model.nodes for _ in subgraphs(node)))
        self._context = onnx.checker.C.CheckerContext()
        self._context.ir_version = model.ir_version
        self._context.opset_imports = {imp.domain: imp.version for imp in model.proto.opset_import}

    def verdict(self, payload: bytes, tensor: bool) -> str | None:
        """The verdict on a serialized ``TensorProto`` (``tensor``) or ``ValueInfoProto``: what
        ``onnx.checker.check_tensor`` / ``check_value_info`` do, on the bytes the piece was serialized to once
        (they would serialize the message again)."""
        try:
            (onnx.checker.C.check_tensor if tensor else onnx.checker.C.check_value_info)(payload, self._context)
        except onnx.checker.ValidationError as exc:
            return str(exc).splitlines()[0]
        return None


@dataclass(frozen=True)
class _Boundary:
    """A node subset's boundary as tensor ids (see :meth:`_TensorIndex.boundary`)."""

    nodes: np.ndarray  # kept node indices, ascending
    cut: np.ndarray  # tensors read, not produced, not initializers: the original's inputs in its order, then
    #                  the others in order of first read
    inits: np.ndarray  # initializers read, in the original's order
    outputs: np.ndarray  # original outputs produced, in the original's order, then the frontier in node order:
    #                      tensors produced that no kept node reads but a node of the original does
    produced: np.ndarray  # bool per tensor id
    output_mask: np.ndarray  # bool per tensor id


class _TensorIndex:
    """Every tensor a node reads or writes, by id, with what each node reads and writes as flat id arrays,
    so a subset's boundary is a few numpy operations rather than Python loops over its nodes."""

    def __init__(self, model: Model, deps: Sequence[Sequence[str]], inline: Container[str]) -> None:
        ids: dict[str, int] = {}
        reads: list[int] = []
        read_nodes: list[int] = []
        writes: list[int] = []
        write_nodes: list[int] = []
        for index, (node, read) in enumerate(zip(model.nodes, deps, strict=True)):
            for name in read:
                reads.append(ids.setdefault(name, len(ids)))
                read_nodes.append(index)
            for name in node.output:
                if name:
                    writes.append(ids.setdefault(name, len(ids)))
                    write_nodes.append(index)
        self.ids = ids
        self.names = list(ids)
        self._size = len(model.nodes)
        self._reads, self._read_nodes = np.array(reads, dtype=np.int64), np.array(read_nodes, dtype=np.int64)
        self._writes, self._write_nodes = np.array(writes, dtype=np.int64), np.array(write_nodes, dtype=np.int64)
        self.is_init = np.array([name in inline for name in self.names], dtype=bool)
        self.written = np.zeros(len(self.names), dtype=bool)  # produced by a node
        self.written[self._writes] = True
        outputs = set(model.output_names)
        self._is_output = np.array([name in outputs for name in self.names], dtype=bool)
        #: the original's outputs that a node reads or writes, in the order the original lists them
        self._output_ids = np.array([ids[name] for name in model.output_names if name in ids], dtype=np.int64)
        # A frontier tensor becomes an output; one that no node of the original reads (an LSTM's unused Y_h) and
        # that is no original output never does: the original does not have it as an output either, and
        # exposing it can change what a compiler makes of the node (IREE's BiLSTM, see the module docstring).
        read_any = np.zeros(len(self.names), dtype=bool)
        read_any[self._reads] = True
        self._exposable = read_any & ~self._is_output
        # Graph inputs and initializers come in the original's order, so the whole node set is the original.
        graph = model.proto.graph
        self.input_rank = _ranks(ids, (value.name for value in graph.input))
        self._init_rank = _ranks(ids, (tensor.name for tensor in graph.initializer))

    def boundary(self, keep: Iterable[int]) -> _Boundary:
        """The boundary of ``keep`` (node indices), in the orders :meth:`SubgraphSpace.materialize` writes."""
        items = keep if isinstance(keep, (set, frozenset)) else set(keep)
        nodes = np.fromiter(items, dtype=np.int64, count=len(items))
        nodes.sort()
        if nodes.size and (nodes[0] < 0 or nodes[-1] >= self._size):
            raise IndexError(f"node index out of range 0..{self._size - 1}: {nodes[0] if nodes[0] < 0 else nodes[-1]}")
        mask = np.zeros(self._size, dtype=bool)
        mask[nodes] = True
        reads = self._reads[mask[self._read_nodes]]
        written = self._writes[mask[self._write_nodes]]
        produced = np.zeros(len(self.names), dtype=bool)
        produced[written] = True
        read = np.zeros(len(self.names), dtype=bool)
        read[reads] = True
        outside = reads[~produced[reads]]  # reads of tensors the subset does not produce, with repeats
        _, first = np.unique(outside, return_index=True)
        fresh = outside[np.sort(first)]
        is_init = self.is_init[fresh]
        cut, inits = fresh[~is_init], fresh[is_init]
        own = self.input_rank[cut] >= 0  # the original's graph inputs first, in its order
        if own.any():
            cut = np.concatenate([_by_rank(cut[own], self.input_rank), cut[~own]])
        inits = _by_rank(inits, self._init_rank)
        frontier = written[~read[written] & self._exposable[written]]
        outputs = np.concatenate([self._output_ids[produced[self._output_ids]], frontier])
        output_mask = np.zeros(len(self.names), dtype=bool)
        output_mask[outputs] = True
        return _Boundary(nodes, cut, inits, outputs, produced, output_mask)


def _ranks(ids: Mapping[str, int], names: Iterable[str]) -> np.ndarray:
    """Per tensor id, its position among ``names`` (-1: not among them)."""
    rank = np.full(len(ids), -1, dtype=np.int64)
    for position, name in enumerate(names):
        index = ids.get(name)
        if index is not None and rank[index] < 0:
            rank[index] = position
    return rank


def _by_rank(items: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """``items`` (tensor ids) sorted by ``rank``."""
    return items[np.argsort(rank[items], kind="stable")] if items.size > 1 else items


def _renamed(item: Any, name: str | None) -> Any:
    """A graph input or initializer under another ``name`` (a copy), or ``item`` itself when ``name`` is None."""
    if name is None:
        return item
    copy = type(item)()
    copy.CopyFrom(item)
    copy.name = name
    return copy


def _objects(items: Iterable[Any]) -> np.ndarray:
    """A 1-D object array of ``items`` (numpy gathers it by an index array without a Python loop)."""
    listed = list(items)
    array = np.empty(len(listed), dtype=object)
    array[:] = listed
    return array


def check_file(path: Path) -> str | None:
    """``onnx.checker.check_model`` on a saved model: the first line of what it refuses, None when it passes.

    Checked from its file, so external weights resolve against the model's folder.
    """
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        return str(exc).splitlines()[0]
    return None


def _value_type(name: str, value: Any) -> onnx.ValueInfoProto:
    """A declaration of ``name`` from its captured value alone (module docstring): a tensor (every element type:
    ``ml_dtypes`` arrays, strings) by its element type and rank, each dimension unknown; a non-empty sequence of
    tensors of one element type as a sequence of them (of their rank when they share one). KeyError for what
    gives no type (an empty sequence or optional, a type ONNX lacks).

    Example:
        >>> print(helper.printable_value_info(_value_type("words", np.array([["a", "b"]], dtype=object))))
        %words[STRING, ?x?]
    """
    if isinstance(value, np.ndarray):
        code = dtype_elem_type(value.dtype)
        if code is not None:
            return helper.make_tensor_value_info(name, code, [None] * value.ndim)
    elif isinstance(value, list) and value and all(isinstance(item, np.ndarray) for item in value):
        codes = {dtype_elem_type(item.dtype) for item in value}
        ranks = {item.ndim for item in value}
        code = codes.pop() if len(codes) == 1 else None
        if code is not None:
            element = helper.make_tensor_type_proto(code, [None] * ranks.pop() if len(ranks) == 1 else None)
            return helper.make_value_info(name, helper.make_sequence_type_proto(element))
    raise KeyError(f"the model declares no type for {name!r}, and its value ({_kind(value)}) gives none")


def _kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return str(value.dtype)
    if isinstance(value, list):
        return "an empty sequence" if not value else "a sequence of " + ", ".join(sorted({_kind(v) for v in value}))
    return "an empty optional" if value is None else type(value).__name__


def _has_shape(info: onnx.ValueInfoProto) -> bool:
    """Whether a declaration is complete as a graph input or output for ``onnx.checker``: not a tensor type, or
    one with a shape (of any rank, dimensions known or not)."""
    return not info.type.HasField("tensor_type") or info.type.tensor_type.HasField("shape")


def _with_rank(info: onnx.ValueInfoProto, rank: int) -> onnx.ValueInfoProto:
    """``info`` itself when it has a shape (:func:`_has_shape`), else a copy declaring ``rank`` unknown dimensions
    (module docstring: the rank of the captured value, never its sizes)."""
    if _has_shape(info):
        return info
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(info)
    shape = copy.type.tensor_type.shape
    shape.SetInParent()  # a scalar's: present and empty
    for _ in range(rank):
        shape.dim.add()
    return copy


def _has_dynamic_dim(info: onnx.ValueInfoProto | None) -> bool:
    """Whether a tensor declaration has a dimension that is not a fixed size: symbolic, unknown or negative
    (a declaration without a shape has none: nothing is known to be dynamic)."""
    if info is None or not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
        return False
    return any(dim.dim_value < 0 or not dim.HasField("dim_value") for dim in info.type.tensor_type.shape.dim)


def _fits(info: onnx.ValueInfoProto, dtype: np.dtype, shape: Sequence[int]) -> bool:
    """Whether a tensor declaration admits a value of ``dtype`` and ``shape``: same element type, and rank
    and static dimensions equal where it declares a shape (a wrong inferred type must not make a runtime
    refuse the feed). A negative ``dim_value`` is a dynamic dimension, as converters write them (PP-OCR's
    ``x: [-1, 3, ?, ?]``) and runtimes read them."""
    if not info.type.HasField("tensor_type"):
        return False
    tensor_type = info.type.tensor_type
    if dtype_elem_type(dtype) != tensor_type.elem_type:
        return False
    if not tensor_type.HasField("shape"):
        return True
    dims = tensor_type.shape.dim
    if len(dims) != len(shape):
        return False
    for dim, size in zip(dims, shape, strict=True):  # a loop, dim_value first: thousands per search
        if dim.dim_value != size and dim.dim_value >= 0 and dim.HasField("dim_value"):  # unset, it reads 0
            return False
    return True


def plan(evaluator: Evaluator, space: SubgraphSpace, *, hints: Sequence[frozenset[int]] = (),
         priors: Mapping[int, float] | None = None) -> SearchResult:
    """Run the subgraph search plan (module docstring) and return the engine's final result.

    The whole model as a candidate must fail. It is the original model, unless the original lists an output
    that no node produces (a graph input or initializer passed through, which a candidate does not output):
    then that is checked with one invocation rather than assumed.
    """
    best = [frozenset(range(space.size))]
    dense = False  # the start set is known to be mostly needed: the sweep alone (module docstring, step 5)
    try:
        evaluator.set_best(space.size, phase="hints", start=True)  # the progress bar's size before any search
        extra_outputs = space.boundary(best[0])[2] != list(space.model.output_names)
        if extra_outputs and evaluator.evaluate(best[0], phase="confirm").outcome is not Outcome.FAIL:
            raise SearchAborted("the whole model as a candidate does not fail like the original",
                                result=SearchResult(best[0], False, None, evaluator.stats(), ()),
                                hint="report this as a graphbisect bug, with the model")
        for hint in hints:  # evidence first: a one-node culprit needs one candidate
            if evaluator.evaluate(hint, phase="hints").outcome is Outcome.FAIL:
                log.info("layerwise hint reproduces the failure with %d node(s)", len(hint))
                best.append(hint)
                evaluator.set_best(len(hint), phase="hints")
                break
        else:
            bridged = _bridged(space.model, hints)
            if bridged is not None and bridged not in hints and \
                    evaluator.evaluate(bridged, phase="hints").outcome is Outcome.FAIL:
                log.info("the layerwise hints reproduce the failure together with %d node(s)", len(bridged))
                best.append(bridged)
                evaluator.set_best(len(bridged), phase="hints")
                dense = True
            else:
                best.append(_slice(evaluator, best[-1]))
                best.append(_cone(evaluator, space, best[-1]))
                evaluator.set_best(len(best[-1]), phase="cone")
    except BudgetExhausted as exc:
        return SearchResult(best[-1], False, exc.reason, evaluator.stats(), tuple(evaluator.journey),
                            trail=tuple(evaluator.trail))
    except KeyboardInterrupt:  # Ctrl-C between the engine's searches: the run stops with its best-so-far
        evaluator.meter.interrupt()
        return SearchResult(best[-1], False, StopReason.INTERRUPTED, evaluator.stats(), tuple(evaluator.journey),
                            trail=tuple(evaluator.trail))
    if dense:
        result = sweep(evaluator, best[-1], phase="sweep")  # atoms in topological order: upstream nodes first
    elif len(best[-1]) <= _SWEEP_ONLY_MAX:
        # A slice this small is usually minimal already: the proof (one run per node) is all that is left,
        # and ProbDD's group removals before its own closing sweep only add runs.
        result = sweep(evaluator, best[-1], atoms=_outside_in(best[-1]), phase="sweep")
    else:
        result = probdd(evaluator, best[-1], prior=dict(priors) if priors else None, phase="probdd")
    # the journey of the whole plan (its hints, slice and cone too), not only of its last search's steps
    return dataclasses.replace(result, history=tuple(evaluator.journey), trail=tuple(evaluator.trail))


def _bridged(model: Model, hints: Sequence[frozenset[int]]) -> frozenset[int] | None:
    """Every hint together, joined to the model's outputs by the fewest nodes: for each hint and each output it
    reaches, one shortest path of nodes from the hint to the output's producer (None: no hint reaches an output).

    Hints that fail only together (two distant sites that flip an output only jointly) fail no candidate of
    their own; the slice around both is most of the model, while the sites and the shortest ways from them to
    the output they flip are often the whole failure: one candidate instead of a search from the slice."""
    producer = {name: index for index, node in enumerate(model.nodes) for name in node.output}
    targets = {producer[name] for name in model.output_names if name in producer}
    joined: set[int] = set().union(*hints)
    reached = False
    for hint in hints:
        parent: dict[int, int] = {}
        queue, seen = sorted(hint), set(hint)
        for index in queue:  # breadth first: the queue grows while it is walked
            if index in targets:
                reached = True
                step = index
                while step not in hint:
                    joined.add(step)
                    step = parent[step]
            for name in model.nodes[index].output:
                for reader in model.consumers.get(name, ()):
                    if reader not in seen:
                        seen.add(reader)
                        parent[reader] = index
                        queue.append(reader)
    return frozenset(joined) if reached else None


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
        return prefix.keep  # stopped (budget): the smallest failing prefix so far, as the journey shows it
    head = order[: prefix.found]
    suffix = bisect_prefix(evaluator, list(reversed(head)), phase="suffix")
    if suffix.found is None or suffix.stop_reason is not None:
        return suffix.keep
    return frozenset(head[len(head) - suffix.found:])


def _cone(evaluator: Evaluator, space: SubgraphSpace, keep: frozenset[int]) -> frozenset[int]:
    """Drop the slice's nodes that the failing tensors do not depend on (interleaved parallel branches)."""
    detail = evaluator.evaluate(keep, phase="cone").detail  # cached: the slice was just tested
    tensors = detail.get("failing", []) if isinstance(detail, dict) else []
    cone = space.cone(keep, tensors) if tensors else keep
    if cone and cone != keep and evaluator.evaluate(cone, phase="cone").outcome is Outcome.FAIL:
        return cone
    return keep
