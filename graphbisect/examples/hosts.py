"""Realistic host networks of 100 to 50,000+ nodes with real onnxruntime bugs embedded, plus ground truth.

A host is a small pre-norm residual network: input ``x: float32[1, 4, 16]`` (4 tokens × 16 channels),
output ``y: float32[1, 4, 8]``, built from a repeating cycle of blocks: attention (a three-output Split,
Reshape/Transpose heads, Softmax), an MLP with the Erf GELU, a ShuffleNet channel shuffle through a shape
computed at run time (Shape → Gather → Unsqueeze → Concat → Reshape), an RMSNorm + Split/Concat two-branch
block, side branches that fork from the stream and merge three blocks later, a group-wise LayerNorm skip
(``[1, 4, 16]`` viewed as ``[8, 8]``: four tokens × two groups of eight channels), a ReLU6 and a softmax
gate. Constants are deduplicated, and weights are shared across blocks in a pool of 16 (ALBERT-style), so a
50,000-node host is ~6 MB and builds in about a second. The node count is exact.

Why the stream holds an error at any depth: every block adds a bounded update through its own LayerScale
(per-channel, random signs), so the stream grows like sqrt(depth) instead of drifting, and an error
injected anywhere reaches ``y`` diluted by ~1/sqrt(depth), as in real pre-norm networks.

Why this host makes a fair test: it is full of *look-alikes* that fuse correctly in onnxruntime — real
``LayerNormalization`` nodes, keepdims=1 LayerNorm decompositions with exactly the bug's structure (the
group-norm block is the ``main`` site with ``keepdims=1``), RMSNorms fused by the second culprit pass,
float32 ReLU6 — so a reducer that keeps "the LayerNorm-looking nodes" or "the nodes a fusion touched" keeps
far too much. Sites are named like every other block (``/blk17/norm/Sub``), so names give nothing away.

Positions (each site's depth is a fraction of the node budget); errors are max abs ``all`` vs ``disable``
at ``y``, onnxruntime 1.31.1, over the 150–50,000-node hosts and input seeds we measured:

``main`` (45 %)
    A group-wise LayerNorm skip on the residual stream itself (the look-alike with keepdims=0). Error
    0.4–1.4 up to 2,000 nodes, ≈ 0.1 at 50,000.
``branch`` (55 %)
    On a side branch (Reshape → MatMul → pattern → Tanh → Reshape) that rejoins the stream three blocks
    later: not on the path a layer-by-layer walk from ``x`` to ``y`` follows. Error 0.1–0.35, 0.02–0.03 at
    50,000.
``masked`` (50 %)
    The site feeds ReLU, a 0/1 padding mask that keeps token 0 only (16 of 64 values) and a 0.05
    LayerScale before it rejoins the stream. ReLU and the mask zero most of the local error (≈ 2 at the
    site); what survives reaches ``y`` attenuated 20–1000×: 0.008–0.06, 1.5e-3–3e-3 at 50,000, cosine
    similarity > 0.9998. The failure still shows at the output with an absolute tolerance of 1e-4, but it
    is small and comes from a few values: a cosine-only comparison passes it, a per-tensor error ranking
    sees a huge error at the site and small ones after it, and a reduced model cut below the mask fails
    with a *much larger* error than the full model, so a failure signature that pins the error band too
    tightly rejects the correct reduction. We chose attenuation over complete masking because a bug that
    never reaches an output is not a failure anyone reports.
``two-distant`` (15 % and 85 %)
    Two LayerNorm sites that are *both* needed. Each sits on a tap (LayerNormalization → Reshape
    ``[8, 8]`` → ×0.01 + a learned ``[8, 8]`` bias table → pattern) read out into a two-class decision head,
    ``label = ArgMax(...)``, an extra ``int64[1]`` output. The readouts are calibrated against an exact
    numpy model of the oracle and of both fusions, so each miscompiled site moves the decision logit by
    +1 (whether fused whole by LayerNormFusionL1 or, once a reducer cut its Sub, by
    SimplifiedLayerNormFusion) and the threshold sits at 1.5; the input-dependent part moves the logit by
    < 0.15. One site alone never flips ``label``, both always do (checked on 45 inputs per size), and
    ``y`` is unaffected. Why a decision head: an integer output is compared exactly, so "both needed" holds
    for every tolerance, and "two miscompiled layers flip a classification that one does not" is how such
    bugs look in practice. Honest limit: with oracle values fed at cut points, each site's own output
    *is* wrong, so "both needed" holds for the failure at ``label`` (the original signature), not for "any
    mismatch anywhere"; a minimal failing model also keeps the readout path
    (:attr:`HostNetwork.support_nodes`). Crash bugs are refused here: each crash site fails session
    creation on its own.

Crash sites (``relu_clip_f64``; OpenVINO's ``reduce_reshape_matmul`` and ``if_rank2_condition`` from
:data:`~graphbisect.examples.patterns.OPENVINO_BUGS`, ``main`` and ``masked`` only: they take the stream's
``[1, 4, 16]``) put the pattern after a MatMul (``main``, ``masked``) or after the side branch's LayerNorm
(``branch``); the position changes only where the culprit sits, since session creation fails before any value
exists.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphbisect.examples.patterns import (
    BUGS,
    LN_EPS,
    OPENVINO_BUGS,
    BugSite,
    GraphBuilder,
    layernorm_keepdims1,
    layernorm_node,
    norm_params,
    relu_clip_f32,
    rmsnorm_keepdims1,
)

logger = logging.getLogger(__name__)

__all__ = [
    "INPUT_SHAPE",
    "POSITIONS",
    "HostNetwork",
    "ground_truth",
    "host_inputs",
    "host_network",
    "package_host",
]

TOKENS, CHANNELS, SIDE, HEADS, OUT_CHANNELS = 4, 16, 8, 2, 8
"""Residual stream ``[1, TOKENS, CHANNELS]``; LN sites see it as ``[SIDE, SIDE]`` (4·16 = 8·8)."""

INPUT_SHAPE = (1, TOKENS, CHANNELS)
OUTPUT_SHAPE = (1, TOKENS, OUT_CHANNELS)
POSITIONS = ("main", "branch", "masked", "two-distant")
WEIGHT_POOL = 16
MIN_NODES = 100
METADATA_KEY = "graphbisect.ground_truth"

_SITE_DEPTH = {"main": (0.45,), "branch": (0.55,), "masked": (0.5,), "two-distant": (0.15, 0.85)}
_TAP_GAIN = 0.01
_DECISION_MARGIN = 0.5
_HEAD_SWING = 0.25
_GROUP_GAIN = 0.5
_PATTERNS = {**BUGS, **OPENVINO_BUGS}
"""Every pattern a host embeds: onnxruntime's bugs and OpenVINO's (crashes, on ``[1, 4, 16]``)."""


@dataclass(frozen=True)
class HostNetwork:
    """A host model plus the ground truth a reducer is judged against.

    ``culprit_nodes``: every node of the bug patterns that cause :attr:`kind` (a correct reduction keeps
    nothing outside ``culprit_nodes`` + ``support_nodes``). ``core_nodes``: the part every minimal
    reduction keeps (see :class:`~graphbisect.examples.patterns.BugSite`). ``support_nodes``: nodes
    outside the patterns that a minimal failing model still needs (the two-distant readout path).
    ``requires_all_sites``: False means any single site of kind :attr:`kind` fails on its own.
    """

    model: onnx.ModelProto
    kind: str
    position: str
    sites: tuple[BugSite, ...]
    culprit_nodes: tuple[str, ...]
    core_nodes: tuple[str, ...]
    support_nodes: tuple[str, ...]
    requires_all_sites: bool
    inputs: Mapping[str, np.ndarray] = field(repr=False)


@dataclass
class _Stream:
    """Mutable state while a host is emitted: the residual tensor and work scheduled for later."""

    b: GraphBuilder
    h: str
    block: int = 0
    pending: list[tuple[int, str, float]] = field(default_factory=list)  # (merge after block, tensor, gain)
    readouts: list[str] = field(default_factory=list)
    offsets: list[float] = field(default_factory=list)
    support: list[str] = field(default_factory=list)
    sites_emitted: int = 0


# ---------------------------------------------------------------------------------------------- weights


def _weight(st: _Stream, role: str, shape: tuple[int, ...], gain: float = 0.5) -> str:
    """A pooled weight: block ``i`` shares it with block ``i ± WEIGHT_POOL`` of the same role."""
    slot = st.block % WEIGHT_POOL
    rng = st.b.rng

    def make() -> np.ndarray:
        return (rng.standard_normal(shape) * gain / np.sqrt(shape[0])).astype(np.float32)

    return st.b.shared(("w", role, slot), make, f"shared{slot}.{role}.weight")


def _bias(st: _Stream, role: str, width: int) -> str:
    slot = st.block % WEIGHT_POOL
    rng = st.b.rng
    return st.b.shared(("b", role, slot), lambda: (0.02 * rng.standard_normal(width)).astype(np.float32),
                       f"shared{slot}.{role}.bias")


def _to_square(st: _Stream, x: str) -> str:
    return st.b.op("Reshape", [x, st.b.ints([SIDE, SIDE])])


def _to_stream(st: _Stream, x: str) -> str:
    return st.b.op("Reshape", [x, st.b.ints(list(INPUT_SHAPE))])


def _layer_scale(b: GraphBuilder, gain: float) -> str:
    """A learned per-channel LayerScale (CaiT) of magnitude ``gain`` with random signs, one per use.

    Signs that differ from block to block keep shared weights and biases from pushing the stream the same
    way every cycle: updates add up like a random walk, so the stream grows like sqrt(depth) and an
    error injected anywhere still reaches the output of a 50,000-node host.
    """
    signs = b.rng.choice(np.array([-1.0, 1.0]), CHANNELS)
    scale = gain * signs * (1.0 + 0.1 * b.rng.standard_normal(CHANNELS))
    return b.const(scale.astype(np.float32), "layer_scale")


def _residual(st: _Stream, update: str, gain: float = 0.1) -> None:
    st.h = st.b.op("Add", [st.h, st.b.op("Mul", [update, _layer_scale(st.b, gain)])])


# ----------------------------------------------------------------------------------------------- blocks


def _attention(st: _Stream) -> None:
    """Pre-norm self-attention: Split into q/k/v (a three-output node), two heads, Softmax."""
    b = st.b
    a = layernorm_node(b, st.h, gamma_seed=st.block, width=CHANNELS)
    qkv = b.op("MatMul", [a, _weight(st, "qkv", (CHANNELS, 3 * CHANNELS))])
    q, k, v = b.op_multi("Split", [qkv, b.ints([CHANNELS] * 3)], 3, axis=-1)
    heads = b.ints([1, TOKENS, HEADS, CHANNELS // HEADS])
    q = b.op("Transpose", [b.op("Reshape", [q, heads])], perm=[0, 2, 1, 3])
    k = b.op("Transpose", [b.op("Reshape", [k, heads])], perm=[0, 2, 3, 1])
    v = b.op("Transpose", [b.op("Reshape", [v, heads])], perm=[0, 2, 1, 3])
    scores = b.op("Mul", [b.op("MatMul", [q, k]), b.scalar(1.0 / np.sqrt(CHANNELS // HEADS))])
    ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    ctx = _to_stream(st, b.op("Transpose", [ctx], perm=[0, 2, 1, 3]))
    out = b.op("MatMul", [ctx, _weight(st, "proj", (CHANNELS, CHANNELS))])
    _residual(st, b.op("Add", [out, _bias(st, "proj", CHANNELS)]))


def _mlp(st: _Stream) -> None:
    """Pre-norm MLP with the Erf GELU decomposition exporters emit (ORT fuses it into Gelu/BiasGelu)."""
    b = st.b
    a = layernorm_node(b, st.h, gamma_seed=st.block, width=CHANNELS)
    up = b.op("Add", [b.op("MatMul", [a, _weight(st, "fc1", (CHANNELS, 2 * CHANNELS))]),
                      _bias(st, "fc1", 2 * CHANNELS)])
    erf = b.op("Erf", [b.op("Div", [up, b.scalar(float(np.sqrt(2.0)))])])
    gelu = b.op("Mul", [b.op("Mul", [up, b.op("Add", [erf, b.scalar(1.0)])]), b.scalar(0.5)])
    down = b.op("MatMul", [gelu, _weight(st, "fc2", (2 * CHANNELS, CHANNELS))])
    _residual(st, b.op("Add", [down, _bias(st, "fc2", CHANNELS)]))


def _channel_shuffle(st: _Stream) -> None:
    """ShuffleNet channel shuffle through a shape computed at run time (Shape → Gather → Unsqueeze → Concat).

    Exporters emit views this way when a dimension is dynamic; the integer tensors give reducers
    something that must never be fed as float activations. A permutation keeps the stream's scale.
    """
    b = st.b
    shape = b.op("Shape", [st.h])
    dims = [b.op("Unsqueeze", [b.op("Gather", [shape, b.index(i)], axis=0), b.ints([0])]) for i in (0, 1)]
    grouped = b.op("Reshape", [st.h, b.op("Concat", [*dims, b.ints([2, SIDE])], axis=0)])
    st.h = b.op("Reshape", [b.op("Transpose", [grouped], perm=[0, 1, 3, 2]), shape])


def _split_branches(st: _Stream) -> None:
    """RMSNorm pre-norm, then split channels into a ReLU branch and a SiLU branch and concatenate them."""
    b = st.b
    normed = rmsnorm_keepdims1(b, st.h, gamma_seed=st.block, width=CHANNELS)
    left, right = b.op_multi("Split", [normed, b.ints([SIDE, SIDE])], 2, axis=-1)
    left = b.op("Relu", [b.op("MatMul", [left, _weight(st, "split", (SIDE, SIDE), gain=1.0)])])
    right = b.op("Mul", [right, b.op("Sigmoid", [right])])
    mixed = b.op("MatMul", [b.op("Concat", [left, right], axis=-1), _weight(st, "mix", (CHANNELS, CHANNELS))])
    _residual(st, mixed)


def _side_branch(st: _Stream) -> None:
    """Fork a grouped side branch now; it merges back three blocks later (see :func:`_merge_due`)."""
    b = st.b
    side = b.op("MatMul", [_to_square(st, st.h), _weight(st, "side", (SIDE, SIDE), gain=1.0)])
    side = b.op("Tanh", [layernorm_node(b, side, gamma_seed=st.block, width=SIDE)])
    st.pending.append((st.block + 3, _to_stream(st, side), 0.1))


def _group_norm(st: _Stream) -> None:
    """Healthy twin of the ``main`` site: a group-wise LayerNorm skip with keepdims=1 (fused correctly)."""
    normed = layernorm_keepdims1(st.b, _to_square(st, st.h), gamma_seed=st.block, width=SIDE)
    _residual(st, _to_stream(st, normed), gain=_GROUP_GAIN)


def _relu6(st: _Stream) -> None:
    b = st.b
    act = relu_clip_f32(b, b.op("MatMul", [st.h, _weight(st, "relu6", (CHANNELS, CHANNELS))]))
    _residual(st, act, gain=0.1)


def _softmax_gate(st: _Stream) -> None:
    """Gate tanh(h) by a softmax over tokens (Transpose → Softmax → Transpose); bounded update."""
    b = st.b
    gate = b.op("Softmax", [b.op("Transpose", [st.h], perm=[0, 2, 1])], axis=-1)
    gated = b.op("Mul", [b.op("Tanh", [st.h]), b.op("Transpose", [gate], perm=[0, 2, 1])])
    _residual(st, gated, gain=0.1)


BlockFn = Callable[[_Stream], None]

_BLOCKS: dict[str, BlockFn] = {
    "attention": _attention, "mlp": _mlp, "shape": _channel_shuffle, "split": _split_branches,
    "side": _side_branch, "groupnorm": _group_norm, "relu6": _relu6, "softmax_gate": _softmax_gate,
}
# Every update is bounded (pre-norm or saturating), so the residual stream grows like sqrt(depth) and an
# error injected anywhere survives to the output diluted by 1/sqrt(depth), as in real pre-norm networks.
_CYCLE = ("attention", "mlp", "shape", "split", "side", "groupnorm", "relu6", "attention", "softmax_gate",
          "mlp")


def _merge_due(st: _Stream, *, force: bool = False) -> None:
    for item in [p for p in st.pending if force or p[0] <= st.block]:
        st.pending.remove(item)
        _residual(st, item[1], item[2])


# ------------------------------------------------------------------------------------------------ sites


def _emit_bug(st: _Stream, bug: str, x: str, index: int) -> str:
    """Emit the pattern for ``bug`` on ``x`` (``[8, 8]`` for LayerNorm, ``[1, 4, 16]`` for crashes)."""
    if _PATTERNS[bug].needs_square:
        return _PATTERNS[bug].emit(st.b, x, gamma_seed=1000 + index, width=SIDE)
    return _PATTERNS[bug].emit(st.b, x)


def _site_main(st: _Stream, bug: str, index: int) -> None:
    """On the stream: the group-norm skip with the bug (its healthy twin is :func:`_group_norm`)."""
    if _PATTERNS[bug].needs_square:
        _residual(st, _to_stream(st, _emit_bug(st, bug, _to_square(st, st.h), index)), gain=_GROUP_GAIN)
        return
    pre = st.b.op("MatMul", [st.h, _weight(st, "island", (CHANNELS, CHANNELS))])
    _residual(st, _emit_bug(st, bug, pre, index), gain=0.1)


def _site_branch(st: _Stream, bug: str, index: int) -> None:
    """Inside a side branch that merges three blocks later (its healthy twin is :func:`_side_branch`)."""
    b = st.b
    side = b.op("MatMul", [_to_square(st, st.h), _weight(st, "side", (SIDE, SIDE), gain=1.0)])
    if _PATTERNS[bug].needs_square:
        side = b.op("Tanh", [_emit_bug(st, bug, side, index)])
    else:
        side = _emit_bug(st, bug, layernorm_node(b, side, gamma_seed=st.block, width=SIDE), index)
    st.pending.append((st.block + 3, _to_stream(st, side), 0.25))


def _site_masked(st: _Stream, bug: str, index: int) -> None:
    """ReLU, a token-0 padding mask and a 0.05 LayerScale between the site and the stream."""
    b = st.b
    if _PATTERNS[bug].needs_square:
        mask = np.zeros((SIDE, SIDE), np.float32)
        mask[:2] = 1.0  # rows 0 and 1 = token 0, both channel groups
        out = b.op("Relu", [_emit_bug(st, bug, _to_square(st, st.h), index)])
        out = _to_stream(st, b.op("Mul", [out, b.const(mask, "padding_mask")]))
    else:
        mask = np.zeros((TOKENS, CHANNELS), np.float32)
        mask[0] = 1.0
        pre = b.op("MatMul", [st.h, _weight(st, "island", (CHANNELS, CHANNELS))])
        out = b.op("Mul", [_emit_bug(st, bug, pre, index), b.const(mask, "padding_mask")])
    _residual(st, out, gain=0.05)


def _site_tap(st: _Stream, bug: str, index: int) -> None:
    """Two-distant tap: LayerNorm'd features ×0.01 + a bias table → pattern → calibrated readout."""
    b = st.b
    table = _bias_table(index)
    feats = _to_square(st, layernorm_node(b, st.h, gamma_seed=st.block, width=CHANNELS))
    u = b.op("Add", [b.op("Mul", [feats, b.scalar(_TAP_GAIN)]), b.const(table, "bias_table")])
    out = _emit_bug(st, bug, u, index)
    readout, offset = _calibrate(table, *norm_params(SIDE, 1000 + index))
    start = b.mark()
    with b.scope("readout"):
        weighted = b.op("Mul", [out, b.const(readout, "weight")])
        st.readouts.append(b.op("ReduceSum", [weighted, b.ints([0, 1])], keepdims=1))
    st.offsets.append(offset)
    st.support.extend(b.names_since(start))


_SITES: dict[str, Callable[[_Stream, str, int], None]] = {
    "main": _site_main, "branch": _site_branch, "masked": _site_masked, "two-distant": _site_tap,
}


def _bias_table(index: int) -> np.ndarray:
    """A learned ``[8, 8]`` bias with distinct row offsets: it dominates the tap, so the error is known."""
    rng = np.random.default_rng(7919 + index)
    rows = np.linspace(-2.0, 2.0, SIDE)[rng.permutation(SIDE)]
    return (rng.standard_normal((SIDE, SIDE)) + rows[:, None]).astype(np.float32)


def _ln_oracle(u: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """The pattern as written (keepdims=0: row j's statistics applied to column j), i.e. opt_level=disable."""
    centered = u - u.mean(-1)
    return centered / np.sqrt((centered**2).mean(-1) + LN_EPS) * gamma + beta


def _ln_fused(u: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """What LayerNormFusionL1 computes: a true row-wise LayerNorm."""
    centered = u - u.mean(-1, keepdims=True)
    return centered / np.sqrt((centered**2).mean(-1, keepdims=True) + LN_EPS) * gamma + beta


def _ln_core(u: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """What SimplifiedLayerNormFusion computes on the oracle's Sub output (the reduced-site variant)."""
    centered = u - u.mean(-1)
    return centered / np.sqrt((centered**2).mean(-1, keepdims=True) + LN_EPS) * gamma + beta


def _calibrate(table: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, float]:
    """Readout ``R`` with ⟨R, fused − oracle⟩ = ⟨R, core − oracle⟩ = 1, and the oracle readout ⟨R, oracle⟩.

    Both fused variants count, so a reducer that trims a site down to its core still flips the decision
    only together with the other site.
    """
    args = (table.astype(np.float64), gamma.astype(np.float64), beta.astype(np.float64))
    oracle = _ln_oracle(*args)
    errors = np.stack([(_ln_fused(*args) - oracle).ravel(), (_ln_core(*args) - oracle).ravel()])
    coeffs = np.linalg.solve(errors @ errors.T, np.ones(2))
    readout = (coeffs @ errors).reshape(SIDE, SIDE)
    return readout.astype(np.float32), float((readout * oracle).sum())


# ------------------------------------------------------------------------------------------ stem & head


def _stem(st: _Stream) -> None:
    b = st.b
    with b.scope("embed"):
        rng = b.rng
        proj = b.const((rng.standard_normal((CHANNELS, CHANNELS)) / np.sqrt(CHANNELS)).astype(np.float32),
                       "weight")
        pos = b.const((0.1 * rng.standard_normal((TOKENS, CHANNELS))).astype(np.float32), "position")
        st.h = b.op("Add", [b.op("MatMul", [st.h, proj]), pos])


def _head(st: _Stream) -> str:
    b = st.b
    with b.scope("head"):
        a = layernorm_node(b, st.h, gamma_seed=99991, width=CHANNELS)
        w = (b.rng.standard_normal((CHANNELS, OUT_CHANNELS)) / np.sqrt(CHANNELS)).astype(np.float32)
        return b.op("Add", [b.op("MatMul", [a, b.const(w, "weight")]),
                            b.const(np.zeros(OUT_CHANNELS, np.float32), "bias")], output="y")


def _decision(st: _Stream, y: str) -> None:
    """label = ArgMax over two classes of ``±(0.25·tanh(mean y) + Σ readouts − threshold)``."""
    b = st.b
    with b.scope("decision"):
        swing = b.op("Mul", [b.op("Tanh", [b.op("ReduceMean", [y], axes=[1, 2], keepdims=0)]),
                             b.scalar(_HEAD_SWING)])
        start = b.mark()
        total = st.readouts[0]
        for extra in st.readouts[1:]:
            total = b.op("Add", [total, extra])
        total = b.op("Add", [total, swing])
        threshold = sum(st.offsets) + len(st.readouts) - _DECISION_MARGIN
        logit = b.op("Add", [total, b.const(np.array([-threshold], np.float32), "threshold")])
        logits = b.op("Mul", [logit, b.const(np.array([-1.0, 1.0], np.float32), "classes")])
        b.op("ArgMax", [logits], output="label", axis=-1, keepdims=0)
        st.support.extend(b.names_since(start))


# ------------------------------------------------------------------------------------------------ build


@functools.cache
def _cost(name: str, bug: str = "") -> int:
    """Nodes one block or site emits, measured by emitting it into a scratch builder."""
    st = _Stream(GraphBuilder(), "h")
    if bug:
        _SITES[name](st, bug, 0)
    else:
        _BLOCKS[name](st)
    return len(st.b.nodes) + 2 * len(st.pending)


def _normalize_bugs(bug: str | Sequence[str] | None, position: str) -> list[str]:
    if position not in POSITIONS:
        raise ValueError(f"unknown position {position!r}; choose one of {', '.join(POSITIONS)}")
    bugs = [] if bug is None else [bug] if isinstance(bug, str) else list(bug)
    unknown = [name for name in bugs if name not in _PATTERNS]
    if unknown:
        raise ValueError(f"unknown bug {unknown[0]!r}; known bugs: {', '.join(_PATTERNS)}")
    if position == "branch" and any(name in OPENVINO_BUGS for name in bugs):
        raise ValueError("OpenVINO's patterns take the stream's [1, 4, 16], and a branch site is [8, 8]: use "
                         "position='main' or 'masked'")
    if position == "two-distant":
        if len(bugs) == 1:
            bugs *= 2
        if len(bugs) < 2 or any(_PATTERNS[name].kind != "mismatch" for name in bugs):
            raise ValueError(
                "position='two-distant' needs two or more mismatch bugs (e.g. bug='layernorm_keepdims0'): "
                "a crash site fails session creation on its own, so two crash sites are never jointly needed")
    return bugs


def _schedule(bugs: list[str], position: str, num_nodes: int) -> list[tuple[int, str]]:
    """(node count at which to emit, bug) for each site, spread evenly when there are several."""
    depths = _SITE_DEPTH[position]
    if len(bugs) != len(depths):
        depths = tuple(np.linspace(0.2, 0.8, len(bugs))) if len(bugs) > 1 else depths[: len(bugs)]
    return [(int(d * num_nodes), name) for d, name in zip(depths, bugs, strict=True)]


def _emit_site(st: _Stream, position: str, bug: str) -> None:
    """Emit a site as block ``blk{i}`` like any other, so node names do not give the culprit away."""
    with st.b.scope(f"blk{st.block}"):
        _SITES[position](st, bug, st.sites_emitted)
    st.sites_emitted += 1
    st.block += 1
    _merge_due(st)


def _emit_body(st: _Stream, num_nodes: int, sites: list[tuple[int, str]], position: str, tail: int) -> None:
    """Blocks in :data:`_CYCLE` order, sites when their depth is reached, then padding to ``num_nodes``."""
    remaining = sum(_cost(position, bug) for _, bug in sites)
    while True:
        if sites and len(st.b.nodes) >= sites[0][0]:
            remaining -= _cost(position, sites[0][1])
            _emit_site(st, position, sites.pop(0)[1])
            continue
        name = _CYCLE[st.block % len(_CYCLE)]
        if len(st.b.nodes) + _cost(name) + remaining + tail + 2 * len(st.pending) > num_nodes:
            break
        with st.b.scope(f"blk{st.block}"):
            _BLOCKS[name](st)
        st.block += 1
        _merge_due(st)
    for _, bug in sites:
        _emit_site(st, position, bug)
    _merge_due(st, force=True)
    while len(st.b.nodes) + tail < num_nodes:
        with st.b.scope(f"pad{len(st.b.nodes)}"):
            st.h = st.b.op("Mul", [st.h, st.b.scalar(0.999)], hint="LayerScale")


def host_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """The deterministic input of every host: ``x``, standard normal, float32, shape ``[1, 4, 16]``."""
    return {"x": np.random.default_rng(seed).standard_normal(INPUT_SHAPE).astype(np.float32)}


def host_network(num_nodes: int, *, bug: str | Sequence[str] | None = None, position: str = "main",
                 seed: int = 0) -> HostNetwork:
    """Build a host of exactly ``num_nodes`` nodes with ``bug`` (a name of :data:`BUGS` or ``OPENVINO_BUGS``, or
    several) embedded.

    ``position`` is one of :data:`POSITIONS` (see the module docstring for what each one tests). Several
    bugs outside ``two-distant`` become independent sites spread over 20–80 % of the depth; each one
    fails on its own (a crash wins over a mismatch, since the session never gets to run). The same
    arguments always give the same bytes.

    >>> host = host_network(200, bug="layernorm_keepdims0", position="branch")
    >>> len(host.model.graph.node), host.kind, len(host.culprit_nodes)
    (200, 'mismatch', 9)
    """
    if num_nodes < MIN_NODES:
        raise ValueError(f"num_nodes={num_nodes} is too small for a host network; use at least {MIN_NODES}")
    bugs = _normalize_bugs(bug, position)
    st = _Stream(GraphBuilder(seed=seed), "x")
    tail = 3 + (len(bugs) + 6 if position == "two-distant" else 0)
    _stem(st)
    _emit_body(st, num_nodes, _schedule(bugs, position, num_nodes), position, tail)
    y = _head(st)
    if position == "two-distant" and bugs:
        _decision(st, y)
    return _finish(st, bugs, position, seed)


def _finish(st: _Stream, bugs: list[str], position: str, seed: int) -> HostNetwork:
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(OUTPUT_SHAPE))]
    if st.readouts:
        outputs.append(helper.make_tensor_value_info("label", TensorProto.INT64, [1]))
    doc = f"graphbisect example host: bug={bugs or None}, position={position}, seed={seed}"
    model = st.b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, list(INPUT_SHAPE))], outputs,
                       graph_name="host", doc=doc)
    return package_host(model, st.b.sites, position=position, support=st.support, seed=seed)


def package_host(model: onnx.ModelProto, sites: Sequence[BugSite], *, position: str,
                 support: Sequence[str] = (), seed: int = 0) -> HostNetwork:
    """Derive the ground truth from ``sites``, store it in ``model.metadata_props`` and wrap both.

    The failure kind is a crash if any site crashes (the session never gets to run), else a mismatch if
    any site mismatches; the culprit nodes are those of the sites of that kind.
    """
    kinds = {site.kind for site in sites}
    kind = "crash" if "crash" in kinds else "mismatch" if kinds else "none"
    causing = [site for site in sites if site.kind == kind]
    culprit = tuple(name for site in causing for name in site.nodes)
    core = tuple(name for site in causing for name in site.core)
    requires_all = position == "two-distant"
    truth = {"kind": kind, "bugs": [site.bug for site in sites], "position": position,
             "culprit_nodes": list(culprit), "core_nodes": list(core), "support_nodes": list(support),
             "requires_all_sites": requires_all, "passes": sorted({p for site in causing for p in site.passes})}
    helper.set_model_props(model, {METADATA_KEY: json.dumps(truth, sort_keys=True)})
    return HostNetwork(model, kind, position, tuple(sites), culprit, core, tuple(support), requires_all,
                       host_inputs(seed))


def ground_truth(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The ground truth :func:`host_network` stored in ``metadata_props``, or None for other models."""
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            return dict(json.loads(prop.value))
    return None
