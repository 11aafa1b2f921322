"""Real onnxruntime bug patterns and their healthy look-alikes, emitted into a graph under construction.

Every pattern is a function ``pattern(builder, x, **kw) -> output tensor name`` that appends nodes and
initializers to a :class:`GraphBuilder`. Patterns know nothing about the host around them, so the same
culprit can sit on a main path, a parallel branch or a probe tap (see :mod:`graphbisect.examples.hosts`).

Bugs (onnxruntime 1.31.1, CPU; both re-verified by ``tests/examples/test_examples.py``):

``layernorm_keepdims0``
    ReduceMean(keepdims=0) → Sub → Pow → ReduceMean(keepdims=0) → Add(eps) → Sqrt → Div → Mul(γ) → Add(β)
    on a square ``[N, N]`` tensor (onnxruntime issue 30513). Without optimizations the mean, shape
    ``[N]``, broadcasts along the *last* axis (row ``j``'s mean is subtracted from column ``j``); the
    fusions ignore ``keepdims`` and compute a true row-wise LayerNorm, so the result is silently wrong
    (max abs error ≈ 1–3 on standard-normal data). Two passes carry the bug, either one suffices:
    ``LayerNormFusionL1`` (``basic`` and up) needs all nine nodes and, if it is disabled or blocked,
    ``SimplifiedLayerNormFusion`` (``extended`` and up) fuses Pow…Mul(γ) into an RMSNorm that ignores
    keepdims as well. So the *core* that still fails on its own at ``opt_level=all`` is the six nodes
    Pow…Mul(γ) (a reducer that feeds the Sub output from the oracle legitimately ends there, and
    graphbisect's does), while at ``opt_level=basic`` it is the whole nine-node pattern.
    Exposing the Sqrt or Div output as a graph output blocks both fusions (a layerwise probe that marks
    every tensor sees no divergence at all); exposing the mean, the Sub or the Mul output blocks only the
    first.

``relu_clip_f64``
    Relu → Clip with float64 min/max initializers: ``FuseReluClip`` (``basic`` and up) fails session
    creation with "Unexpected data type for Clip 'min' input of 11". Embedded in a float network through
    Cast(DOUBLE) … Cast(FLOAT), the way exporters emit a double-precision island.

Look-alikes use the same op types and fuse as well, but correctly (ORT ``all`` vs ``disable`` max abs
error < 1e-4), so a reducer cannot find the culprit by op type: a real ``LayerNormalization`` node, the
keepdims=1 LayerNorm and RMSNorm decompositions (fused by the very same passes) and a float32 ReLU6.
Bugs and look-alikes share default node prefixes (``norm``, ``relu6``): names do not give culprits away.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

logger = logging.getLogger(__name__)

__all__ = [
    "BUGS",
    "LOOKALIKES",
    "OPENVINO_BUGS",
    "BugPattern",
    "BugSite",
    "GraphBuilder",
    "Lookalike",
    "if_rank2_condition",
    "layernorm_keepdims0",
    "layernorm_keepdims1",
    "layernorm_node",
    "norm_params",
    "pattern_model",
    "reduce_reshape_matmul",
    "relu_clip_f32",
    "relu_clip_f64",
    "rmsnorm_keepdims1",
]

OPSET = 17
"""Opset of every example model: the last one where ReduceMean takes ``axes`` as an attribute."""

IR_VERSION = 8
"""Set explicitly: onnx 1.23's ``make_model`` writes IR 14, which onnxruntime 1.31 rejects."""

LN_EPS = 1e-5


@dataclass(frozen=True)
class BugSite:
    """Ground truth for one embedded bug instance.

    ``nodes`` is the whole emitted pattern (what a good reduction keeps at most from this site);
    ``core`` the subset that still fails on its own at ``opt_level=all`` when its inputs are fed with
    oracle values (what every minimal reduction keeps); ``passes`` the onnxruntime optimizer names
    whose rewrite triggers the bug (any one of them suffices).
    """

    bug: str
    kind: str
    nodes: tuple[str, ...]
    core: tuple[str, ...]
    passes: tuple[str, ...]
    output: str


class GraphBuilder:
    """Append-only ONNX graph under construction with unique, exporter-style names.

    Node names follow the PyTorch exporter (``/blk3/mlp/MatMul``, then ``_1``, ``_2`` on reuse) and output
    tensors append ``_output_0``, so reports on the examples read like reports on real exports.
    Initializers are named with dots (``blk3.mlp.weight``). :meth:`shared` deduplicates constants the way
    exporters do, which gives host networks realistic initializers consumed by many nodes.

    >>> b = GraphBuilder()
    >>> with b.scope("blk0"):
    ...     y = b.op("Relu", ["x"])
    >>> y
    '/blk0/Relu_output_0'
    """

    def __init__(self, *, seed: int = 0) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.sites: list[BugSite] = []
        self.rng = np.random.default_rng(seed)
        self._scope: list[str] = []
        self._counts: dict[str, int] = {}
        self._shared: dict[object, str] = {}

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix every node and initializer created inside the block with ``name``."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def unique(self, base: str) -> str:
        """Return ``base`` if unused, else ``base_1``, ``base_2``, ... (each name is handed out once)."""
        count = self._counts.get(base, 0)
        name = base if count == 0 else f"{base}_{count}"
        while name in self._counts:
            count += 1
            name = f"{base}_{count}"
        self._counts[base] = count + 1
        self._counts.setdefault(name, 1)
        return name

    def node_name(self, hint: str) -> str:
        """A unique node name in the current scope (``/blk3/gate/then/Relu``), for nodes made by hand: the
        nodes of an ``If`` branch, which :meth:`op` does not build."""
        return self._node_name(hint)

    def _node_name(self, hint: str) -> str:
        return self.unique("/" + "/".join([*self._scope, hint]))

    def _init_name(self, hint: str) -> str:
        return self.unique(".".join([*self._scope, hint]))

    def op(self, op_type: str, inputs: Sequence[str], *, hint: str | None = None,
           output: str | None = None, **attrs: Any) -> str:
        """Append one single-output node and return its output tensor name."""
        return self.op_multi(op_type, inputs, 1, hint=hint, outputs=None if output is None else [output],
                             **attrs)[0]

    def op_multi(self, op_type: str, inputs: Sequence[str], num_outputs: int, *, hint: str | None = None,
                 outputs: Sequence[str] | None = None, **attrs: Any) -> list[str]:
        """Append one node with ``num_outputs`` outputs (e.g. Split) and return their names."""
        name = self._node_name(hint or op_type)
        outs = list(outputs) if outputs is not None else [f"{name}_output_{i}" for i in range(num_outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs

    def const(self, value: np.ndarray, hint: str) -> str:
        """Add an initializer holding ``value`` (copied) and return its name."""
        name = self._init_name(hint)
        self.initializers.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name

    def shared(self, key: object, make: Callable[[], np.ndarray], hint: str) -> str:
        """Return the initializer registered under ``key``, creating it (unscoped) on first use."""
        if key not in self._shared:
            name = self.unique(hint)
            self.initializers.append(numpy_helper.from_array(np.array(make(), order="C"), name))
            self._shared[key] = name
        return self._shared[key]

    def scalar(self, value: float, dtype: type = np.float32) -> str:
        """A shared 0-d constant, the way exporters dedupe ``2.0`` or ``1e-5`` across a whole model."""
        key = ("scalar", np.dtype(dtype).name, float(value))
        return self.shared(key, lambda: np.array(value, dtype=dtype), f"const_{np.dtype(dtype).name}_{value:g}")

    def ints(self, values: Sequence[int]) -> str:
        """A shared 1-d int64 constant (shapes, split sizes, axes)."""
        key = ("ints", tuple(values))
        label = "_".join(str(v).replace("-", "m") for v in values)
        return self.shared(key, lambda: np.array(values, dtype=np.int64), f"const_i64_{label}")

    def index(self, value: int) -> str:
        """A shared 0-d int64 constant (a Gather index)."""
        return self.shared(("index", value), lambda: np.array(value, np.int64), f"const_index_{value}")

    def mark(self) -> int:
        """Position to pass to :meth:`names_since`."""
        return len(self.nodes)

    def names_since(self, mark: int) -> tuple[str, ...]:
        """Names of the nodes appended since :meth:`mark` returned ``mark``."""
        return tuple(node.name for node in self.nodes[mark:])

    def model(self, inputs: Sequence[onnx.ValueInfoProto], outputs: Sequence[onnx.ValueInfoProto], *,
              graph_name: str, doc: str = "") -> onnx.ModelProto:
        """Wrap everything appended so far into a model (opset 17, IR 8, fixed producer)."""
        graph = helper.make_graph(self.nodes, graph_name, list(inputs), list(outputs), self.initializers,
                                  doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=IR_VERSION, producer_name="graphbisect.examples",
                                  producer_version="1")
        return model


def norm_params(width: int, gamma_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """γ ≈ 1 and β ≈ 0 with a little spread: what trained LayerNorm parameters look like."""
    rng = np.random.default_rng(gamma_seed)
    gamma = (1.0 + 0.1 * rng.standard_normal(width)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(width)).astype(np.float32)
    return gamma, beta


def _decomposed_layernorm(b: GraphBuilder, x: str, *, keepdims: int, width: int, gamma_seed: int,
                          ) -> tuple[str, list[str]]:
    """The nine-node LayerNorm older PyTorch exports emit; returns (output, names of Pow…Mul(γ))."""
    gamma, beta = norm_params(width, gamma_seed)
    mean = b.op("ReduceMean", [x], axes=[-1], keepdims=keepdims)
    centered = b.op("Sub", [x, mean])
    start = b.mark()
    squared = b.op("Pow", [centered, b.scalar(2.0)])
    var = b.op("ReduceMean", [squared], axes=[-1], keepdims=keepdims)
    std = b.op("Sqrt", [b.op("Add", [var, b.scalar(LN_EPS)])])
    normed = b.op("Div", [centered, std])
    scaled = b.op("Mul", [normed, b.const(gamma, "weight")])
    core = list(b.names_since(start))
    return b.op("Add", [scaled, b.const(beta, "bias")]), core


def layernorm_keepdims0(b: GraphBuilder, x: str, *, gamma_seed: int = 0, width: int = 8,
                        prefix: str = "norm") -> str:
    """Emit the LayerNormFusion keepdims=0 bug on ``x`` of shape ``[width, width]``; return its output.

    Why it is realistic: exporters and hand-written graph surgery drop ``keepdims`` when they know the
    reduced axis is the last one, and square activations (``[tokens*groups, channels]`` after a group
    reshape, attention maps) make the broken broadcast type-check. The result is a model that runs
    everywhere and is wrong only where LayerNormFusion fires.
    """
    with b.scope(prefix):
        start = b.mark()
        out, core = _decomposed_layernorm(b, x, keepdims=0, width=width, gamma_seed=gamma_seed)
        b.sites.append(BugSite("layernorm_keepdims0", "mismatch", b.names_since(start), tuple(core),
                               ("LayerNormFusionL1", "SimplifiedLayerNormFusion"), out))
    return out


def relu_clip_f64(b: GraphBuilder, x: str, *, lo: float = 0.0, hi: float = 6.0,
                  prefix: str = "relu6") -> str:
    """Emit Cast(DOUBLE) → Relu → Clip(float64 min/max) → Cast(FLOAT) on float32 ``x``; return the output.

    Why it is realistic: a ReLU6 exported inside a double-precision island (numerically sensitive
    post-processing, or a tracer that saw float64 Python scalars) gives Clip float64 min/max
    initializers; FuseReluClip only handles float/float16 and fails the whole session. The Casts are
    glue: the core a reducer must keep is Relu and Clip.
    """
    with b.scope(prefix):
        start = b.mark()
        as_double = b.op("Cast", [x], to=TensorProto.DOUBLE)
        core_start = b.mark()
        relu = b.op("Relu", [as_double])
        clipped = b.op("Clip", [relu, b.scalar(lo, np.float64), b.scalar(hi, np.float64)])
        core = b.names_since(core_start)
        out = b.op("Cast", [clipped], to=TensorProto.FLOAT)
        b.sites.append(BugSite("relu_clip_f64", "crash", b.names_since(start), core, ("FuseReluClip",), out))
    return out


def layernorm_keepdims1(b: GraphBuilder, x: str, *, gamma_seed: int = 0, width: int = 8,
                        prefix: str = "norm") -> str:
    """Healthy look-alike: the same nine nodes with keepdims=1, fused correctly by LayerNormFusionL1."""
    with b.scope(prefix):
        return _decomposed_layernorm(b, x, keepdims=1, width=width, gamma_seed=gamma_seed)[0]


def layernorm_node(b: GraphBuilder, x: str, *, gamma_seed: int = 0, width: int = 8,
                   prefix: str = "ln") -> str:
    """Healthy look-alike: a real ``LayerNormalization`` node (opset 17) over the last axis."""
    gamma, beta = norm_params(width, gamma_seed)
    with b.scope(prefix):
        return b.op("LayerNormalization", [x, b.const(gamma, "weight"), b.const(beta, "bias")],
                    axis=-1, epsilon=LN_EPS)


def rmsnorm_keepdims1(b: GraphBuilder, x: str, *, gamma_seed: int = 0, width: int = 8,
                      prefix: str = "rms_norm") -> str:
    """Healthy look-alike: keepdims=1 RMSNorm (Pow…Mul), fused correctly by SimplifiedLayerNormFusion."""
    gamma, _ = norm_params(width, gamma_seed)
    with b.scope(prefix):
        squared = b.op("Pow", [x, b.scalar(2.0)])
        var = b.op("ReduceMean", [squared], axes=[-1], keepdims=1)
        std = b.op("Sqrt", [b.op("Add", [var, b.scalar(LN_EPS)])])
        return b.op("Mul", [b.op("Div", [x, std]), b.const(gamma, "weight")])


def relu_clip_f32(b: GraphBuilder, x: str, *, lo: float = 0.0, hi: float = 6.0,
                  prefix: str = "relu6") -> str:
    """Healthy look-alike: float32 ReLU6 (Relu → Clip), which FuseReluClip fuses correctly."""
    with b.scope(prefix):
        relu = b.op("Relu", [x])
        return b.op("Clip", [relu, b.scalar(lo), b.scalar(hi)])


def reduce_reshape_matmul(b: GraphBuilder, x: str, *, op: str = "ReduceMean", tokens: int = 4, channels: int = 16,
                          prefix: str = "pool") -> str:
    """Emit ``op`` (axes=[0], keepdims=0) → Reshape ``[1, tokens·channels]`` → MatMul → Reshape ``[1, 1,
    channels]`` on ``x`` of shape ``[1, tokens, channels]``; return the output (it broadcasts over the tokens).

    An OpenVINO bug (2026.4.1, CPU): compiling it fails with a MatMul validation error ("Incompatible MatMul
    matrix dimension. First input dimension=16 ... doesn't match the second input dimension=64"): the flattening
    Reshape is dropped, as if a keepdims=0 Reduce followed by a Reshape were one Reduce, and the MatMul gets the
    ``[tokens, channels]`` mean. ``op`` is ``ReduceMean`` or ``ReduceSum``. The core is the Reduce, the Reshape
    and the MatMul; the trailing Reshape is glue, and without it the MatMul's output becomes a graph output,
    which OpenVINO names after that output in its message ("opset1::MatMul y (...)").
    """
    with b.scope(prefix):
        start = b.mark()
        # ReduceMean takes its axes as an attribute up to opset 17, ReduceSum as an input from opset 13
        pooled = b.op(op, [x], axes=[0], keepdims=0) if op == "ReduceMean" else \
            b.op(op, [x, b.ints([0])], keepdims=0)
        flat = b.op("Reshape", [pooled, b.ints([1, tokens * channels])])
        weight = (b.rng.standard_normal((tokens * channels, channels)) / np.sqrt(tokens * channels)).astype(np.float32)
        projected = b.op("MatMul", [flat, b.const(weight, "weight")])
        core = b.names_since(start)
        out = b.op("Reshape", [projected, b.ints([1, 1, channels])])
        b.sites.append(BugSite("reduce_reshape_matmul", "crash", b.names_since(start), core, (), out))
    return out


def if_rank2_condition(b: GraphBuilder, x: str, *, prefix: str = "gate") -> str:
    """Emit a data-dependent ``If`` on ``x`` (rank 3, float) whose condition has shape ``[1, 1]``; return its
    output (``x`` through Relu or Sigmoid, the branches read ``x`` from the outer scope).

    ONNX asks for a single-element condition, which ONNX Runtime and onnx.reference take; OpenVINO (2026.4.1)
    refuses to convert it ("Rank of If condition input must be equal to 0 or 1"), naming the node by a number
    it counts per process (``If_17``, ``If_5381``), as it did on openwakeword's ``hey_jarvis``. The core is the
    ``If`` alone: fed a ``[1, 1]`` condition it fails the same way.
    """
    with b.scope(prefix):
        start = b.mark()
        score = b.op("ReduceMax", [b.op("ReduceMean", [x], axes=[2], keepdims=0)], axes=[1], keepdims=1)
        cond = b.op("Greater", [score, b.scalar(0.0)])
        branches = {}
        for branch, op_type in (("then", "Relu"), ("else", "Sigmoid")):
            name = b.node_name(f"{branch}/{op_type}")
            node = helper.make_node(op_type, [x], [f"{name}_output_0"], name=name)
            branches[f"{branch}_branch"] = helper.make_graph(
                [node], f"{branch}_branch", [],
                [helper.make_tensor_value_info(f"{name}_output_0", TensorProto.FLOAT, None)])
        out = b.op("If", [cond], **branches)
        b.sites.append(BugSite("if_rank2_condition", "crash", b.names_since(start), b.names_since(start)[-1:], (),
                               out))
    return out


PatternFn = Callable[..., str]


@dataclass(frozen=True)
class BugPattern:
    """One row of :data:`BUGS`: a real onnxruntime bug and how to emit it."""

    name: str
    kind: str
    emit: PatternFn
    needs_square: bool
    reference: str


@dataclass(frozen=True)
class Lookalike:
    """One row of :data:`LOOKALIKES`: a healthy pattern that resembles a bug and must pass."""

    name: str
    emit: PatternFn
    resembles: str
    normalizer: bool


BUGS: dict[str, BugPattern] = {
    "layernorm_keepdims0": BugPattern("layernorm_keepdims0", "mismatch", layernorm_keepdims0, True,
                                      "https://github.com/microsoft/onnxruntime/issues/30513"),
    "relu_clip_f64": BugPattern("relu_clip_f64", "crash", relu_clip_f64, False,
                                "onnxruntime/core/optimizer/relu_clip_fusion.cc (float64 Clip min/max)"),
}
"""The bug table: name → pattern. Hosts, the bundled example and the tests all read it."""

OPENVINO_BUGS: dict[str, BugPattern] = {
    "reduce_reshape_matmul": BugPattern(
        "reduce_reshape_matmul", "crash", reduce_reshape_matmul, False,
        "OpenVINO 2026.4.1 CPU: keepdims=0 Reduce → Reshape → MatMul fails MatMul validation at compile time"),
    "if_rank2_condition": BugPattern(
        "if_rank2_condition", "crash", if_rank2_condition, False,
        "OpenVINO 2026.4.1: an If whose condition has shape [1, 1] is not converted (openwakeword's hey_jarvis)"),
}
"""OpenVINO bugs (crashes at compile time on inputs ``[1, tokens, channels]``), which hosts embed like
:data:`BUGS` (``host_network(352, bug="reduce_reshape_matmul")``); onnxruntime runs them correctly, so they are
not in :data:`BUGS`, whose rows the tests check against onnxruntime."""

LOOKALIKES: dict[str, Lookalike] = {
    "layernorm_node": Lookalike("layernorm_node", layernorm_node, "layernorm_keepdims0", True),
    "layernorm_keepdims1": Lookalike("layernorm_keepdims1", layernorm_keepdims1, "layernorm_keepdims0", True),
    "rmsnorm_keepdims1": Lookalike("rmsnorm_keepdims1", rmsnorm_keepdims1, "layernorm_keepdims0", True),
    "relu_clip_f32": Lookalike("relu_clip_f32", relu_clip_f32, "relu_clip_f64", False),
}


def pattern_model(name: str, *, width: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A standalone model ``x[width, width] → pattern → y`` for a name from :data:`BUGS` or :data:`LOOKALIKES`.

    >>> model = pattern_model("layernorm_keepdims0")
    >>> [n.op_type for n in model.graph.node][:2]
    ['ReduceMean', 'Sub']
    """
    row: BugPattern | Lookalike | None = BUGS.get(name) or LOOKALIKES.get(name)
    if row is None:
        known = ", ".join([*BUGS, *LOOKALIKES])
        raise ValueError(f"unknown pattern {name!r}; known patterns: {known}")
    normalizer = row.needs_square if isinstance(row, BugPattern) else row.normalizer
    b = GraphBuilder(seed=seed)
    kwargs: dict[str, Any] = {"gamma_seed": seed, "width": width} if normalizer else {}
    _rename_output(b, row.emit(b, "x", **kwargs), "y")
    shape = [width, width]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    return b.model([x_info], [y_info], graph_name=name, doc=(row.emit.__doc__ or "").split("\n")[0])


def _rename_output(b: GraphBuilder, old: str, new: str) -> None:
    """Give the tensor ``old`` (produced, not yet consumed) the graph-output name ``new``."""
    for node in b.nodes:
        if old in node.output:
            node.output[list(node.output).index(old)] = new
    b.sites[:] = [dataclasses.replace(s, output=new) if s.output == old else s for s in b.sites]
