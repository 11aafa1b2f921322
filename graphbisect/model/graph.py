"""The :class:`Model`: a normalized ONNX model plus the index every other module queries.

A ``Model`` is treated as immutable: its ``proto`` is normalized once (see :mod:`.normalize`) and never
modified afterwards; everything that derives a new model (:meth:`Model.with_outputs`, candidate builders)
returns a new ``ModelProto``.
"""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import onnx

from graphbisect.errors import GraphBisectError, ModelError
from graphbisect.model.external import inline_tensor, source_of
from graphbisect.model.fixed_values import fixed_tensors
from graphbisect.model.io import ExternalRef, copy_model, save_proto, strip_to_external
from graphbisect.model.normalize import default_opset, fingerprint, infer_types, node_dependencies, normalize_model
from graphbisect.storage.values import numpy_dtype
from graphbisect.text.printable import shown

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["MANY_UNUSED_INITIALIZERS", "Model", "TensorType", "warn_unused_initializers"]

logger = logging.getLogger(__name__)

Dim = int | str | None


@dataclass(frozen=True)
class TensorType:
    """Element type and shape of a tensor, as far as they are known.

    ``shape`` is ``None`` when even the rank is unknown; a dimension is an ``int`` (static), a ``str``
    (symbolic, e.g. ``"batch"``) or ``None`` (unknown).

    Example:
        >>> t = TensorType(onnx.TensorProto.FLOAT, ("batch", 3, 224, 224))
        >>> t.numpy_dtype, t.is_static, t.rank
        (dtype('float32'), False, 4)
    """

    elem_type: int
    shape: tuple[Dim, ...] | None

    @property
    def numpy_dtype(self) -> np.dtype:
        """The in-memory dtype of this element type: ``ml_dtypes`` for bfloat16, float8, int4...,
        ``object`` for strings (:func:`graphbisect.storage.values.numpy_dtype`); :class:`ModelError` when unknown."""
        try:
            return numpy_dtype(self.elem_type)
        except (KeyError, TypeError, ValueError, GraphBisectError) as exc:
            raise ModelError(
                f"ONNX element type {self.elem_type} has no numpy equivalent",
                hint="feed or compare this tensor through a Cast to a standard type",
            ) from exc

    @property
    def is_static(self) -> bool:
        """Whether every dimension is a known integer."""
        return self.shape is not None and all(isinstance(dim, int) for dim in self.shape)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def type_name(self) -> str:
        """The ONNX name of the element type, e.g. ``FLOAT``."""
        return onnx.TensorProto.DataType.Name(self.elem_type) if self.elem_type else "UNDEFINED"

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.type_name}[{dims}]"


def _type_from_value_info(value: onnx.ValueInfoProto) -> TensorType | None:
    if not value.type.HasField("tensor_type"):
        return None
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return TensorType(tensor_type.elem_type, None)
    dims: list[Dim] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return TensorType(tensor_type.elem_type, tuple(dims))


def _type_index(graph: onnx.GraphProto, inferred: Mapping[str, onnx.ValueInfoProto]) -> dict[str, TensorType]:
    """Every known tensor type: inferred ones, replaced by a declaration that says at least as much."""
    types: dict[str, TensorType] = {}
    for value in inferred.values():
        found = _type_from_value_info(value)
        if found is not None:
            types[value.name] = found
    for value in (*graph.value_info, *graph.input, *graph.output):
        found = _type_from_value_info(value)
        known = types.get(value.name)
        if found is not None and found.elem_type and (known is None or found.shape is not None or known.shape is None):
            types[value.name] = found
    for tensor in graph.initializer:  # an initializer's own dims are authoritative
        types[tensor.name] = TensorType(tensor.data_type, tuple(tensor.dims))
    return types


class Model:
    """A normalized ONNX model with its graph index. Build one with :func:`graphbisect.model.load_model`.

    Attributes:
        proto: the normalized ``ModelProto`` (do not modify it).
        path: the ONNX file it came from (for a Paddle model, the converted ONNX file in the cache), or None.
        paddle_source: the Paddle program file (``.json``/``.pdmodel``) it was converted from, or None.
        origin: the file the user gave (``paddle_source``, else ``path``): what messages and reports name, never
            graphbisect's cache.
        fingerprint: sha256 (hex) of the normalized model.
        nodes: the graph's nodes in topological order; ``node_names`` their unique names.
        producer: tensor name → index of the node producing it (graph inputs/initializers are absent).
        consumers: tensor name → indices of the nodes reading it, including nodes whose subgraphs
            (If/Loop/Scan bodies) read it from the outer scope.
        external_bytes: bytes of the weights kept on disk (large external-data initializers of a loaded
            file, see :mod:`graphbisect.model.external`): ``proto`` holds only references to them.

    Example:
        >>> model = load_model("resnet50.onnx")                          # doctest: +SKIP
        >>> model.nodes[model.producer["conv1_out"]].op_type            # doctest: +SKIP
        'Conv'
    """

    def __init__(
        self,
        proto: onnx.ModelProto,
        *,
        path: str | Path | None = None,
        paddle_source: str | Path | None = None,
        normalized: bool = False,
    ) -> None:
        """Normalize a copy of ``proto`` (``normalized=True``: ``proto`` already is, take it as is)."""
        self.proto: onnx.ModelProto = proto if normalized else normalize_model(proto)
        self.path: Path | None = Path(path) if path is not None else None
        self.paddle_source: Path | None = Path(paddle_source) if paddle_source is not None else None
        #: the file the user gave, what reports name: the Paddle program, else the ONNX file (None: in memory)
        self.origin: Path | None = self.paddle_source or self.path
        graph = self.proto.graph
        self.nodes: tuple[onnx.NodeProto, ...] = tuple(graph.node)
        self.node_names: tuple[str, ...] = tuple(node.name for node in self.nodes)
        self._node_index = {name: i for i, name in enumerate(self.node_names)}
        self.producer: Mapping[str, int] = MappingProxyType(
            {name: i for i, node in enumerate(self.nodes) for name in node.output if name}
        )
        self.initializer_names: frozenset[str] = frozenset(t.name for t in graph.initializer) | frozenset(
            s.values.name for s in graph.sparse_initializer
        )
        self.input_names: tuple[str, ...] = tuple(
            value.name for value in graph.input if value.name not in self.initializer_names
        )
        self.output_names: tuple[str, ...] = tuple(value.name for value in graph.output)
        self.external_bytes: int = sum(ref.length for t in graph.initializer if (ref := source_of(t)) is not None)
        self._graph_inputs = frozenset(value.name for value in graph.input)
        # What the user's model declares (value_info, graph inputs and outputs), exactly: candidates and
        # bundles carry these and nothing graphbisect inferred (see graphbisect.model.normalize).
        self._declared: dict[str, onnx.ValueInfoProto] = {
            value.name: value for value in (*graph.value_info, *graph.input, *graph.output)
            if value.type.ByteSize() > 0
        }
        # A graph input's type is what the model declares for it (inference adds nothing to an input), so the
        # inputs' types are known without inference: checking or drawing inputs does not wait for it. Inputs
        # that are also outputs, initializers or value_info entries are left to the full index.
        others = self.initializer_names | {v.name for v in (*graph.value_info, *graph.output)}
        self._input_types: dict[str, TensorType] = {
            value.name: found for value in graph.input
            if value.name not in others and (found := _type_from_value_info(value)) is not None and found.elem_type
        }

    # What follows is computed on first use, not by the constructor: a command starts its backend workers
    # right after loading the model, and their interpreters' start then overlaps this work (onnx's shape
    # inference alone: 0.02-0.05 s at 5,000 nodes on a 2-core AMD EPYC). Each is computed once; the proto never
    # changes.

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 (hex) of the normalized model (:func:`~graphbisect.model.normalize.fingerprint`)."""
        return fingerprint(self.proto)

    @functools.cached_property
    def consumers(self) -> Mapping[str, tuple[int, ...]]:
        """Tensor name → indices of the nodes reading it (outer-scope reads of subgraphs included)."""
        consumers: dict[str, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for name in node_dependencies(node):
                consumers.setdefault(name, []).append(index)
        return MappingProxyType({name: tuple(indices) for name, indices in consumers.items()})

    @functools.cached_property
    def unused_initializers(self) -> int:
        """How many initializers no node reads (graph outputs aside): ONNX Runtime builds a model with many of
        them slowly (:func:`warn_unused_initializers`). Counted from :attr:`consumers`, without a copy."""
        read, outputs = self.consumers, set(self.output_names)
        return sum(1 for name in self.initializer_names if name not in read and name not in outputs)

    @functools.cached_property
    def _inferred(self) -> dict[str, onnx.ValueInfoProto]:
        return infer_types(self.proto)

    @functools.cached_property
    def _types(self) -> dict[str, TensorType]:
        return _type_index(self.proto.graph, self._inferred)

    # --- facts ---------------------------------------------------------------------------------------

    @property
    def opset(self) -> int:
        """The default-domain (``ai.onnx``) opset version; 0 when the model imports none."""
        return default_opset(self.proto) or 0

    @property
    def ir_version(self) -> int:
        return self.proto.ir_version

    def __repr__(self) -> str:
        source = self.path.name if self.path else "<proto>"
        return (
            f"Model({source}, nodes={len(self.nodes)}, opset={self.opset}, ir={self.ir_version}, "
            f"fingerprint={self.fingerprint[:16]})"
        )

    def __len__(self) -> int:
        return len(self.nodes)

    def node_index(self, name: str) -> int:
        """Index of the node called ``name``; raises :class:`ModelError` with close matches otherwise."""
        try:
            return self._node_index[name]
        except KeyError as exc:
            raise ModelError(f"no node named {name!r} in the model", hint=_close_hint(name, self.node_names)) from exc

    def tensor_type(self, name: str) -> TensorType | None:
        """Element type and shape of tensor ``name``; ``None`` when unknown or not a plain tensor."""
        found = self._input_types.get(name)
        return found if found is not None else self._types.get(name)

    def declared(self, name: str) -> onnx.ValueInfoProto | None:
        """The user's own declaration of tensor ``name`` (its ``value_info``, graph input or graph output
        entry, exactly as written), or None when the model declares nothing for it. Never an inferred type.
        """
        return self._declared.get(name)

    def boundary_type(self, name: str) -> onnx.ValueInfoProto | None:
        """The type to declare ``name`` with where a derived model makes it a new graph input or output:
        the user's declaration when there is one, else what shape inference found on the whole model
        (symbolic dimensions stay symbolic: as much as a runtime knows about the tensor inside the
        original model, never the concrete shape of one run), else None."""
        return self._declared.get(name) or self._inferred.get(name)

    @functools.cached_property
    def fixed_tensors(self) -> frozenset[str]:
        """Node outputs that hold the same value for every input (:mod:`.fixed_values`): computed from
        initializers, constants and fully static shapes alone, what a compiler folds."""
        return fixed_tensors(self.nodes, self.initializer_names, self.boundary_type)

    def has_tensor(self, name: str) -> bool:
        """Whether ``name`` is a graph input, an initializer or a node output."""
        return name in self.producer or name in self.initializer_names or name in self._graph_inputs

    def intermediate_names(self) -> list[str]:
        """Every non-empty node output, in topological order — graph outputs included.

        This is the set of tensors a layerwise comparison probes; filter out ``output_names`` when
        only the hidden ones are wanted.
        """
        return [name for node in self.nodes for name in node.output if name]

    @functools.cached_property
    def inline_initializers(self) -> Mapping[str, onnx.TensorProto]:
        """Initializer name → the initializer *with its data*: one kept on disk is read when looked up
        (each time: no weight is cached), so only the weights actually used are ever in memory. The index
        itself is built once per model (precision lowers a candidate through it per run).

        Example:
            >>> bundle_weights = [model.inline_initializers[name] for name in used]   # doctest: +SKIP
        """
        return _InlineInitializers(self.proto.graph)

    # --- derived models --------------------------------------------------------------------------------

    def with_outputs(
        self, names: Sequence[str], *, weights: Mapping[str, ExternalRef] | None = None
    ) -> onnx.ModelProto:
        """A probe model: the same graph with the tensors ``names`` added as graph outputs.

        Existing outputs stay first and in order; names already outputs are not repeated. Each added
        output is declared as every derived model declares a new output (:meth:`boundary_type`: the user's
        declaration, else the inferred type; an initializer by its dims); when nothing is known it carries no
        type (ONNX Runtime, OpenVINO and onnx.reference then use the type the node produces). With ``weights`` (from
        :func:`~graphbisect.model.io.write_weights_file`) the initializers reference that file instead
        of being copied — save the result next to it.

        Example:
            >>> probe = model.with_outputs(model.intermediate_names())     # doctest: +SKIP
        """
        missing = [name for name in names if not self.has_tensor(name)]
        if missing:
            raise ModelError(
                f"cannot expose {missing[0]!r} as an output: no such tensor in the model",
                hint=_close_hint(missing[0], list(self.producer)),
            )
        probe = copy_model(self.proto) if weights is None else strip_to_external(self.proto, weights)
        present = set(self.output_names)
        outputs = probe.graph.output
        for name in dict.fromkeys(names):
            if name in present:
                continue
            declared = self.boundary_type(name)  # what every derived model declares it with
            if declared is not None and (not declared.type.HasField("tensor_type")
                                         or declared.type.tensor_type.elem_type):
                outputs.append(declared)
                continue
            found = self._types.get(name)  # an initializer's own dims
            if found is None or not found.elem_type:
                logger.debug("tensor %r has no inferred type; exposing it untyped", name)
                outputs.add(name=name)
            else:  # what onnx.helper.make_tensor_value_info makes, from one TypeProto per distinct type
                outputs.add(name=name).type.CopyFrom(_type_proto(found))
        return probe

    def to_networkx(self) -> nx.DiGraph:
        """A ``networkx.DiGraph`` over node indices; edges carry the tensors that connect them.

        Node attributes: ``name``, ``op_type``. Edge attribute ``tensors``: list of tensor names
        (outer-scope reads of subgraphs included).
        """
        import networkx as nx  # ~75 ms to import, and only this method needs it

        graph = nx.DiGraph()
        for index, node in enumerate(self.nodes):
            graph.add_node(index, name=node.name, op_type=node.op_type)
        for tensor, users in self.consumers.items():
            source = self.producer.get(tensor)
            if source is None:
                continue
            for user in users:
                if graph.has_edge(source, user):
                    graph.edges[source, user]["tensors"].append(tensor)
                else:
                    graph.add_edge(source, user, tensors=[tensor])
        return graph

    def save(self, path: str | Path) -> Path:
        """Save the normalized model atomically (with ``<name>.data`` external data when over 2 GiB; weights
        kept on disk are hard-linked or copied beside it, see :func:`~graphbisect.model.io.save_proto`)."""
        return save_proto(self.proto, path)


#: Unused initializers from which a model is slow to build: ONNX Runtime 1.32 took 0.1 s at 1,000, 2 s at
#: 10,000, 21 s at 30,000, over two minutes at 100,000 and over five at 1e6 (the time grows with their square).
MANY_UNUSED_INITIALIZERS = 10_000


def warn_unused_initializers(model: Model) -> str | None:
    """Warn, before anything is built, when ``model`` has :data:`MANY_UNUSED_INITIALIZERS` or more initializers
    that no node reads, with what to do: strip them, and bound each build. Returns the warning (None: none).

    A model with 1e6 of them built for over five minutes with no hint (issue 36).
    """
    if len(model.initializer_names) < MANY_UNUSED_INITIALIZERS:  # too few to be many unused: no index made
        return None
    count = model.unused_initializers
    if count < MANY_UNUSED_INITIALIZERS:
        return None
    message = (f"{shown(model.origin or 'the model')} has {count:,} initializers that no node reads: ONNX Runtime "
               "takes minutes to build a model with that many (the time grows with their square), and graphbisect "
               "builds it several times. Strip them first, e.g. with onnxoptimizer's eliminate_unused_initializer "
               "pass or onnx-graphsurgeon's graph.cleanup(); a build is bounded by --timeout SECONDS (reduce, "
               "passes, triage) or a backend spec's timeout=SECONDS, 600 s by default")
    logger.warning("%s", message)
    return message


@functools.lru_cache(maxsize=1024)
def _type_proto(found: TensorType) -> onnx.TypeProto:
    """The tensor ``TypeProto`` of ``found`` (shared: callers copy it)."""
    return onnx.helper.make_tensor_type_proto(found.elem_type, None if found.shape is None else list(found.shape))


class _InlineInitializers(Mapping[str, onnx.TensorProto]):
    """The initializers of a graph by name, read from disk on lookup when kept there."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._tensors = {tensor.name: tensor for tensor in graph.initializer}

    def __getitem__(self, name: str) -> onnx.TensorProto:
        return inline_tensor(self._tensors[name])

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def _close_hint(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=3)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    shown = ", ".join(repr(c) for c in list(choices)[:5])
    return f"names are case-sensitive; the model has {len(choices)}, e.g. {shown}"
