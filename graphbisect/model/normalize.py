"""Normalization: turn any loaded ONNX model into the canonical form every other module relies on.

:func:`normalize_model` applies, in this order (each step is a small function that can be tested alone):

1. :func:`check_loadable` — the proto has a graph and a supported default-domain opset;
2. :func:`assign_node_names` — every node gets a unique, stable name;
3. :func:`check_single_assignment` — every tensor name is produced once (SSA);
4. :func:`topological_sort` — stable Kahn sort, counting tensors that subgraphs (If/Loop/Scan bodies)
   read from the outer scope as dependencies of the node that owns the subgraph;
5. :func:`lower_ir_version` — never above what the opsets (and data types) need, so older runtimes load it.

**Declarations stay exactly as the user wrote them.** The normalized proto's ``value_info``, graph input and
output types are the original's: shape information is something optimizers act on (ONNX Runtime's
LayerNormFusion fires on a positive ``axes`` only when the input's rank is known), so a model that gained
inferred shapes may fail where the user's does not, or the other way round. :func:`infer_types`
(``onnx.shape_inference``, non-strict, on a weight-free skeleton so it works for models over 2 GiB) is
therefore kept *beside* the proto: :class:`graphbisect.model.Model` holds its result as the types it
knows, and only derived models that need a type the user did not declare (a probe output, a cut point
fed as a graph input) use it.

:func:`fingerprint` hashes the result. Subgraphs are never modified (their nodes keep their names).
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence

import onnx

from graphbisect.errors import ModelError
from graphbisect.model.external import hash_source, source_of
from graphbisect.model.io import copy_model, tensor_raw_bytes

__all__ = [
    "DEFAULT_DOMAINS",
    "assign_node_names",
    "check_loadable",
    "check_single_assignment",
    "concrete_shapes",
    "default_opset",
    "fingerprint",
    "infer_types",
    "lower_ir_version",
    "minimum_ir_version",
    "node_dependencies",
    "normalize_model",
    "outer_scope_refs",
    "shape_conflicts",
    "subgraphs",
    "topological_sort",
]

logger = logging.getLogger(__name__)

DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})

#: Initializers larger than this are replaced by data-free stubs before shape inference.
_SKELETON_MAX_BYTES = 1 << 16

# Minimum IR version for element types (see onnx.proto): lowering must not go below these.
_IR_FOR_ELEM_TYPE = {
    **dict.fromkeys(range(17, 21), 9),  # float8 variants
    21: 10,  # UINT4
    22: 10,  # INT4
    23: 11,  # FLOAT4E2M1
    24: 12,  # FLOAT8E8M0
    25: 13,  # UINT2
    26: 13,  # INT2
    27: 14,  # FLOAT6E2M3
    28: 14,  # FLOAT6E3M2
}
_IR_FOR_LOCAL_FUNCTIONS = 8


def normalize_model(proto: onnx.ModelProto, *, copy: bool = True) -> onnx.ModelProto:
    """Return the normalized form of ``proto`` (a copy unless ``copy=False``).

    Raises :class:`ModelError` when the model cannot be normalized: no graph, unsupported opset, a tensor
    produced twice, a tensor nobody produces, or a cycle.

    Example:
        >>> normalized = normalize_model(onnx.load("model.onnx"))   # doctest: +SKIP
        >>> all(node.name for node in normalized.graph.node)          # doctest: +SKIP
        True
    """
    check_loadable(proto)
    if copy:
        proto = copy_model(proto)
    graph = proto.graph
    assign_node_names(graph)
    check_single_assignment(graph)
    topological_sort(graph)
    lower_ir_version(proto)
    return proto


# --- step 1: is this a model at all -------------------------------------------------------------


def default_opset(proto: onnx.ModelProto) -> int | None:
    """The opset version imported for the default ONNX domain, or ``None`` when none is."""
    versions = [op.version for op in proto.opset_import if op.domain in DEFAULT_DOMAINS]
    return max(versions) if versions else None


def check_loadable(proto: onnx.ModelProto) -> None:
    """Raise :class:`ModelError` unless ``proto`` has a graph and an opset this onnx knows."""
    graph = proto.graph
    if not proto.HasField("graph") or not (graph.node or graph.output):
        raise ModelError(
            "the model has no graph (no nodes and no outputs)",
            hint="the file is not an ONNX model or is truncated; re-export or re-download it",
        )
    opset = default_opset(proto)
    uses_default = any(node.domain in DEFAULT_DOMAINS for node in graph.node)
    if opset is None and uses_default:
        raise ModelError(
            "the model imports no opset for the default ONNX domain, but its graph uses ONNX operators",
            hint="the file may be truncated (opset_import is stored after the graph); re-export or re-download it",
        )
    known = onnx.defs.onnx_opset_version()
    if opset is not None and opset > known:
        raise ModelError(
            f"the model uses ONNX opset {opset}, but the installed onnx {onnx.__version__} knows opsets up to {known}",
            hint=f"upgrade onnx (pip install -U 'onnx<1.24'), or re-export the model with opset <= {known}",
        )


# --- subgraphs and outer-scope references --------------------------------------------------------


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held in ``node``'s attributes (If branches, Loop/Scan bodies), in attribute order."""
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            yield from attribute.graphs


def _defined_names(graph: onnx.GraphProto) -> set[str]:
    names = {value.name for value in graph.input}
    names.update(tensor.name for tensor in graph.initializer)
    names.update(sparse.values.name for sparse in graph.sparse_initializer)
    for node in graph.node:
        names.update(node.output)
    return names


def outer_scope_refs(graph: onnx.GraphProto) -> list[str]:
    """Tensor names that ``graph`` (or graphs nested in it) reads but does not define, in first-use order.

    These are the outer-scope tensors a subgraph captures: removing their producer breaks the subgraph.
    """
    defined = _defined_names(graph)
    refs: dict[str, None] = {}
    for node in graph.node:
        for name in node_dependencies(node):
            if name not in defined:
                refs[name] = None
    for value in graph.output:  # a body may output an outer tensor directly
        if value.name not in defined:
            refs[value.name] = None
    return list(refs)


def node_dependencies(node: onnx.NodeProto) -> list[str]:
    """Every tensor ``node`` reads: its non-empty inputs, then the outer-scope tensors its subgraphs read."""
    names = dict.fromkeys(node.input)  # the repeated field read at once: ~2x faster than a generator over it
    names.pop("", None)  # an omitted optional input
    if node.attribute:  # most nodes of most models hold no graph; none without attributes does
        for graph in subgraphs(node):
            names.update(dict.fromkeys(outer_scope_refs(graph)))
    return list(names)


# --- steps 2-4: names, single assignment, order ----------------------------------------------------


def assign_node_names(graph: onnx.GraphProto) -> int:
    """Name every node of ``graph`` uniquely and stably, in place; returns how many were (re)named.

    A node keeps its name when it is non-empty and unique; otherwise it becomes ``<op_type>_<index>``
    (``index`` = its position in the graph as loaded), with ``_1``, ``_2``... appended on collision.
    Subgraph nodes are left alone.

    Example:
        >>> g = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [], [])
        >>> assign_node_names(g), g.node[0].name
        (1, 'Relu_0')
    """
    counts = Counter(node.name for node in graph.node if node.name)
    taken = {name for name, count in counts.items() if count == 1}
    renamed = 0
    for index, node in enumerate(graph.node):
        if node.name and counts[node.name] == 1:
            continue
        base = candidate = f"{node.op_type}_{index}"
        suffix = 0
        while candidate in taken:
            suffix += 1
            candidate = f"{base}_{suffix}"
        node.name = candidate
        taken.add(candidate)
        renamed += 1
    if renamed:
        logger.debug("named %d of %d nodes (empty or duplicate names)", renamed, len(graph.node))
    return renamed


def _graph_level_names(graph: onnx.GraphProto) -> dict[str, str]:
    """Tensor names defined by the graph itself (inputs, initializers) → what defines them."""
    owners: dict[str, str] = {}
    for kind, names in (
        ("initializer", [t.name for t in graph.initializer]),
        ("sparse initializer", [s.values.name for s in graph.sparse_initializer]),
    ):
        for name in names:
            if name in owners:
                raise ModelError(f"{kind} {name!r} is defined twice", hint="tensor names must be unique")
            owners[name] = kind
    seen_inputs: set[str] = set()
    for value in graph.input:
        if value.name in seen_inputs:
            raise ModelError(f"graph input {value.name!r} is listed twice", hint="tensor names must be unique")
        seen_inputs.add(value.name)
        owners.setdefault(value.name, "graph input")
    return owners


def check_single_assignment(graph: onnx.GraphProto) -> None:
    """Raise :class:`ModelError` when a tensor name is produced twice (by two nodes, or a node and an input)."""
    owners = _graph_level_names(graph)
    producers: dict[str, str] = {}
    for node in graph.node:
        for name in filter(None, node.output):
            if name in producers:
                raise ModelError(
                    f"tensor {name!r} is produced by two nodes: {producers[name]!r} and {node.name!r}",
                    hint="ONNX graphs must be in SSA form; fix the exporter or rename one of the outputs",
                )
            if name in owners:
                raise ModelError(
                    f"tensor {name!r} is both a {owners[name]} and an output of node {node.name!r}",
                    hint="ONNX graphs must be in SSA form; fix the exporter or rename the node output",
                )
            producers[name] = node.name


def _dependency_lists(graph: onnx.GraphProto) -> list[list[int]]:
    """For each node, the indices of the nodes producing what it reads (raises on unknown tensors)."""
    available = set(_graph_level_names(graph))
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output if name}
    deps: list[list[int]] = []
    for node in graph.node:
        node_deps = []
        for name in node_dependencies(node):
            if name in producer:
                node_deps.append(producer[name])
            elif name not in available:
                raise ModelError(
                    f"node {node.name!r} ({node.op_type}) reads tensor {name!r}, which is neither produced by "
                    "a node nor a graph input or initializer",
                    hint="the model is corrupt or truncated; check it with onnx.checker.check_model",
                )
        deps.append(node_deps)
    for value in graph.output:
        if value.name not in producer and value.name not in available:
            raise ModelError(
                f"graph output {value.name!r} is produced by no node and is not a graph input or initializer",
                hint="the model is corrupt or truncated; check it with onnx.checker.check_model",
            )
    return deps


def _find_cycle(remaining: set[int], deps: list[list[int]]) -> list[int]:
    """Walk dependencies inside ``remaining`` (every member has one there) until a node repeats."""
    path: list[int] = []
    position: dict[int, int] = {}
    current = min(remaining)
    while current not in position:
        position[current] = len(path)
        path.append(current)
        current = next(d for d in deps[current] if d in remaining)
    return path[position[current] :]


def _stable_order(graph: onnx.GraphProto) -> list[int]:
    """Kahn's algorithm preferring the lowest original index: a valid order is kept as is."""
    deps = _dependency_lists(graph)
    users: list[list[int]] = [[] for _ in deps]
    pending = [0] * len(deps)
    for index, node_deps in enumerate(deps):
        for dep in set(node_deps):
            users[dep].append(index)
            pending[index] += 1
    ready = [index for index, count in enumerate(pending) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users[index]:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(deps):
        cycle = _find_cycle(set(range(len(deps))) - set(order), deps)
        names = " <- ".join(repr(graph.node[i].name) for i in [*cycle, cycle[0]])
        raise ModelError(
            f"the graph has a cycle: {names}",
            hint="ONNX graphs must be acyclic; loops belong in a Loop node's body",
        )
    return order


def topological_sort(graph: onnx.GraphProto) -> bool:
    """Sort ``graph.node`` topologically in place (stable); returns whether the order changed."""
    order = _stable_order(graph)
    if order == list(range(len(order))):
        return False
    nodes = list(graph.node)
    graph.ClearField("node")
    graph.node.extend(nodes[i] for i in order)
    logger.info("graph was not topologically sorted; reordered %d nodes", len(order))
    return True


# --- step 5: IR version ---------------------------------------------------------------------------------


def elem_types(proto: onnx.ModelProto) -> Iterable[int]:
    """Every element type ``proto``'s main graph declares or makes: initializers, declared values, tensor
    attributes, and the ``to``/``output_dtype`` of casting nodes (with repeats)."""
    graph = proto.graph
    yield from (tensor.data_type for tensor in graph.initializer)
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type"):
            yield value.type.tensor_type.elem_type
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t.data_type
            elif attribute.name in ("to", "output_dtype") and attribute.type == onnx.AttributeProto.INT:
                yield attribute.i


def minimum_ir_version(proto: onnx.ModelProto) -> int:
    """The lowest IR version that can hold ``proto``: what its opsets need, raised by the data types
    (float8 needs 9, int4 needs 10, ...) and model-local functions (8) it uses."""
    try:
        needed = onnx.helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True)
    except Exception as exc:  # an opset unknown to this onnx: keep the model's own version
        logger.debug("cannot compute the minimum IR version: %s", exc)
        return proto.ir_version
    if proto.functions:
        needed = max(needed, _IR_FOR_LOCAL_FUNCTIONS)
    for elem_type in elem_types(proto):
        needed = max(needed, _IR_FOR_ELEM_TYPE.get(elem_type, 0))
    return needed


def lower_ir_version(proto: onnx.ModelProto) -> bool:
    """Lower ``proto.ir_version`` in place to :func:`minimum_ir_version` (never raise it).

    Why: onnx 1.23 writes IR 14 by default, which ONNX Runtime 1.31 (max 13) and older runtimes refuse,
    although nothing in the model needs it. Returns whether the version changed.
    """
    needed = minimum_ir_version(proto)
    if proto.ir_version <= needed:
        return False
    logger.info("lowering IR version %d to %d (what the model's opsets need)", proto.ir_version, needed)
    proto.ir_version = needed
    return True


# --- step 6: types and shapes -------------------------------------------------------------------------


def _tensor_nbytes(tensor: onnx.TensorProto) -> int:
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return _SKELETON_MAX_BYTES + 1  # no data here: never copied into the skeleton, never read
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    return tensor.ByteSize()


def _skeleton(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose large initializers carry dims and type but no data (for shape inference)."""
    skeleton = copy_model(proto, initializers=False)
    for tensor in proto.graph.initializer:
        if _tensor_nbytes(tensor) <= _SKELETON_MAX_BYTES:
            skeleton.graph.initializer.add().CopyFrom(tensor)
        else:
            skeleton.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    return skeleton


def _skeleton_at(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """:func:`_skeleton` with the graph inputs ``shapes`` names given those concrete dims."""
    skeleton = _skeleton(proto)
    for value in skeleton.graph.input:
        if value.name in shapes and value.type.HasField("tensor_type"):
            shape = value.type.tensor_type.shape
            shape.ClearField("dim")
            for size in shapes[value.name]:
                shape.dim.add().dim_value = int(size)
    return skeleton


def _run_shape_inference(skeleton: onnx.ModelProto) -> onnx.ModelProto | None:
    for data_prop in (True, False):
        try:
            return onnx.shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False, data_prop=data_prop)
        except Exception as exc:
            logger.warning(
                "onnx shape inference failed%s (%s: %s)",
                " with data propagation" if data_prop else "; using the types the model declares",
                type(exc).__name__,
                exc,
            )
    return None


def infer_types(proto: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """The types ``onnx.shape_inference`` finds for ``proto``'s tensors (value_info and graph outputs), by
    name; ``proto`` itself is not modified (its declarations stay the user's, see the module docstring).

    Non-strict: a node whose inference fails just leaves its outputs out. When the whole inference raises,
    the result is empty and the reason is logged.
    """
    inferred = _run_shape_inference(_skeleton(proto))
    if inferred is None:
        return {}
    found = {value.name: value for value in inferred.graph.value_info if value.type.ByteSize() > 0}
    found.update((value.name, value) for value in inferred.graph.output if value.type.ByteSize() > 0)
    return found


def concrete_shapes(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape that onnx's shape inference finds fully known when the graph inputs ``shapes``
    names have those dims (initializers' shapes included); ``proto`` is not modified, and its large
    initializers are not copied (:func:`_skeleton`). Empty when inference fails.

    Example:
        >>> concrete_shapes(proto, {"x": (1, 3, 640, 640)})["/model.10/Resize_output_0"]   # doctest: +SKIP
        (1, 256, 40, 40)
    """
    skeleton = _skeleton_at(proto, shapes)
    del skeleton.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # onnx raises InferenceError, ValidationError or a RuntimeError of its C++ side
        logger.debug("no concrete shapes: %s: %s", type(exc).__name__, exc)
        return {}
    found = {tensor.name: tuple(tensor.dims) for tensor in proto.graph.initializer}
    for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape") and \
                all(dim.HasField("dim_value") for dim in tensor.shape.dim):
            found[value.name] = tuple(dim.dim_value for dim in tensor.shape.dim)
    return found


_INFERENCE_ERROR = re.compile(r"\(op_type:([^,]*), node name: ([^)]*)\)")


def shape_conflicts(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> frozenset[str] | None:
    """The nodes whose shapes onnx's strict shape inference refuses when the graph inputs ``shapes`` names
    have those concrete shapes (``op_type:node name`` each; empty: every node accepts them), or None when
    inference fails otherwise (a crash, a message it cannot attribute to nodes).

    Why: a dynamic dimension may only take sizes the rest of the graph agrees with (``Sub`` of ``[N, 16]`` and
    a keepdims=0 ``[N]`` broadcasts only for N in {1, 16}); comparing the conflicts of two choices tells the
    sizes a model accepts even when some nodes (custom domains) fail inference whatever the size.

    Example:
        >>> shape_conflicts(proto, {"x": (16, 16)}), shape_conflicts(proto, {"x": (2, 16)})   # doctest: +SKIP
        (frozenset(), frozenset({'Sub:/norm/Sub', 'Pow:/norm/Pow'}))
    """
    skeleton = _skeleton_at(proto, shapes)
    try:
        onnx.shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=True, data_prop=True)
    except Exception as exc:  # onnx raises InferenceError, ValidationError or a RuntimeError of its C++ side
        found = frozenset(f"{op}:{name}" for op, name in _INFERENCE_ERROR.findall(str(exc)))
        return found or None
    return frozenset()


# --- fingerprint ---------------------------------------------------------------------------------------


def fingerprint(proto: onnx.ModelProto) -> str:
    """sha256 (hex) of ``proto``: its deterministic serialization without initializers, then each
    initializer's name, type, dims and raw bytes (so models over the 2 GiB protobuf limit hash too, and an
    initializer hashes the same whether stored in ``raw_data``, typed fields or external data; weights kept
    on disk are read in 16 MiB chunks, never whole).

    Example:
        >>> len(fingerprint(onnx.ModelProto()))
        64
    """
    digest = hashlib.sha256()
    digest.update(copy_model(proto, initializers=False).SerializeToString(deterministic=True))
    for tensor in proto.graph.initializer:
        source = source_of(tensor)
        if source is not None:
            header = f"{tensor.name}\0{tensor.data_type}\0{list(tensor.dims)}\0{source.length}\0"
            digest.update(header.encode("utf-8"))
            hash_source(digest, source)
            continue
        raw = tensor_raw_bytes(tensor)
        data = raw if raw is not None else tensor.SerializeToString(deterministic=True)
        header = f"{tensor.name}\0{tensor.data_type}\0{list(tensor.dims)}\0{len(data)}\0"
        digest.update(header.encode("utf-8"))
        digest.update(data)
    return digest.hexdigest()
