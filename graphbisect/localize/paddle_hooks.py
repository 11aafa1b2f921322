"""Paddle Inference's hooked tensors, mapped to the tensors of the ONNX model paddle2onnx made.

Paddle's output hooks (``paddle:hooks=1``) see the ops of the *optimized* program as they run, under op
labels (``onednn_op.fused_conv2d:0``) and variable names that exist nowhere else. The converted ONNX
model was made from the *original* program, whose ops :func:`graphbisect.model.paddle.program_ops` lists
with the ONNX tensor of each output. Neither Paddle nor paddle2onnx records which original ops an
optimized op replaced, so this module **aligns** the two op sequences, both in program order:

* each executed op has an *anchor* type: its own name without the dialect and a ``fused_`` prefix
  (``fused_conv2d`` → ``conv2d``; ``fc`` → ``matmul``; a conv also anchors on ``depthwise_conv2d``), looked
  for among the original ops near the last match that no hooked tensor claimed yet (ops in between were
  folded or never ran: shape ops, bias reshapes; Paddle may also run independent ops in another order);
* an ``fc`` anchors only on a matmul by a weight, a ``matmul``/``fused_matmul`` only on one of two
  activations (attention has many same-shaped tensors);
* a fused op covers the chain of original ops that are each the only reader of the previous one's output
  (conv → bias add → batch norm → relu; matmul → transpose → reshape), up to an op that one of the next
  few executed ops stands for;
* the mapped tensor is the output of the last op of that chain whose static shape (``-1`` dynamic) agrees
  with the hooked tensor's shape; an anchor whose chain never agrees is skipped, and a hooked tensor with
  no agreeing anchor stays unmapped;
* a constant (an op computed from weights and constants only, a ``full``) anchors only where no other
  constant of its type and shape is a candidate: Paddle folds some constants into their readers and keeps
  others, so the order does not say which one ran.

Ops Paddle inserts (``quantize``, layout transforms) anchor nowhere and are reported as unmapped, never
guessed. So is every op that stands for no one tensor of the ONNX model's main graph (all that
:func:`~graphbisect.model.paddle.program_ops` lists): an op of another block than the program's (a ``while``
body, an ``if`` branch: its ``block`` is not 0, or unknown) and an op hooked more than once under its key
(``times`` above 1: a loop body's op once per iteration, an op with several outputs once per output). Paddle
numbers ops per block, so a loop body's ``pd_op.embedding:0`` has the label of the program's first op; aligned
by type and shape, a greedy decoder's body, sharing the prompt's embedding, landed on the prompt's tensors.
Such ops take no part in the alignment: they neither anchor nor end a fused op's chain.

The result (:func:`hooked_nodes`) is what :func:`~graphbisect.localize.compiled.compiled_graph` makes a
compiled graph of (one compiled node per mapped hooked op, covering the ONNX nodes between its inputs and its
mapped tensor), and the hooked key of each ONNX tensor.

Example:
    >>> from graphbisect.model.paddle import PaddleOp
    >>> ops = [PaddleOp(1, "conv2d", (1,), (2,), ("c",), ((-1, 8),)),
    ...        PaddleOp(2, "relu", (2,), (3,), ("r",), ((-1, 8),)),
    ...        PaddleOp(3, "mean", (3,), (4,), ("m",), ((-1,),))]
    >>> hooked = [{"key": "h/0", "op": "onednn_op.fused_conv2d", "shape": [2, 8]},
    ...           {"key": "h/1", "op": "onednn_op.mean", "shape": [2]}]
    >>> [(a.key, a.tensor, a.covers) for a in align(ops, hooked)]
    [('h/0', 'r', (1, 2)), ('h/1', 'm', (3,))]

    The same op run by a loop body, twice, before the program's own (the body's key holds no value):

    >>> body = [{"key": "h/1@block1", "op": "onednn_op.mean", "shape": [2], "block": 1, "times": 2}] * 2
    >>> [(a.key, a.tensor) for a in align(ops, [hooked[0], *body, hooked[1]])]
    [('h/0', 'r'), ('h/1', 'm')]
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphbisect.model.paddle import PaddleOp

__all__ = ["Alignment", "align", "hooked_nodes"]

log = logging.getLogger(__name__)

#: Executed op name (dialect and ``fused_`` stripped) → original op names it may stand for.
_ANCHORS: Mapping[str, frozenset[str]] = {
    "conv2d": frozenset({"conv2d", "depthwise_conv2d"}),
    "depthwise_conv2d": frozenset({"depthwise_conv2d", "conv2d"}),
    "fc": frozenset({"matmul"}),
    "elementwise_add": frozenset({"add"}),
    "elementwise_mul": frozenset({"multiply"}),
    "elementwise_sub": frozenset({"subtract"}),
    "elementwise_div": frozenset({"divide"}),
    "softmax_mask": frozenset({"softmax"}),
}
#: How far ahead of the last mapped op an anchor may be (ops between were folded or did not run).
_WINDOW = 16
#: Original ops that a fused op absorbs whenever their other operand is a weight (bias, scale, batch norm).
_FOLDABLE = frozenset({"add", "subtract", "multiply", "divide", "scale", "batch_norm", "batch_norm_"})
#: How many of the next executed ops end a fused op's chain.
_HORIZON = 4


@dataclass(frozen=True)
class Alignment:
    """One hooked tensor mapped to an ONNX tensor."""

    key: str  # the run's output key (``paddle-hook/<op label>``)
    op: str  # the executed op (``onednn_op.fused_conv2d``)
    tensor: str  # the ONNX tensor it equals
    covers: tuple[int, ...]  # program indices of the original ops it computed


def _names(op_label: str) -> frozenset[str]:
    name = op_label.rpartition(":")[0] if ":" in op_label.rpartition(".")[2] else op_label
    name = name.rpartition(".")[2].removeprefix("fused_")
    return _ANCHORS.get(name, frozenset({name, name.rstrip("_")}))


def _fused(op_label: str) -> bool:
    name = op_label.rpartition(".")[2]
    return name.startswith("fused_") or name == "fc"


def _shape_ok(static: tuple[int, ...] | None, actual: Sequence[int]) -> bool:
    if static is None:
        return False
    return len(static) == len(actual) and all(s in (-1, a) for s, a in zip(static, actual, strict=True))


def align(ops: Sequence[PaddleOp], hooked: Sequence[Mapping[str, Any]]) -> list[Alignment]:
    """Map hooked tensors (``info()["hooked"]``, execution order) onto ``ops`` (see the module docstring)."""
    readers: dict[int, list[int]] = {}
    for j, op in enumerate(ops):
        for vid in op.inputs:
            readers.setdefault(vid, []).append(j)
    constant = _constant_values(ops)
    claimed: set[int] = set()
    result: list[Alignment] = []
    pos = 0
    keys = Counter(str(e["key"]) for e in hooked)
    hooked = [entry for entry in hooked if _in_main_graph(entry, keys)]
    for h, entry in enumerate(hooked):
        label, shape = str(entry["op"]), entry["shape"]
        wanted = _names(label)
        # Ops the next executed ops stand for end a fused op's chain (they ran on their own).
        following = frozenset().union(*(_names(str(e["op"])) for e in hooked[h + 1 : h + 1 + _HORIZON]))
        # Paddle may run independent ops in another order (attention's V projection after Q·Kᵀ): look a
        # little behind the last match too, among the ops no hooked tensor claimed yet.
        window = range(max(0, pos - _WINDOW), min(len(ops), pos + _WINDOW))
        anchors = [j for j in window if j not in claimed and ops[j].op in wanted and _operands_fit(label, ops[j])]
        for anchor in anchors:
            if _ambiguous_constant(ops, anchor, anchors, constant, shape):
                log.debug("hooked %s %s: several constants of the program fit it", label, shape)
                break
            chain = _chain(ops, readers, anchor, following, constant=constant) if _fused(label) else [anchor]
            fits = [k for k, j in enumerate(chain) if ops[j].onnx_names[:1] != (None,) and ops[j].shapes
                    and _shape_ok(ops[j].shapes[0], shape)]
            if not fits:
                continue
            chain = chain[: fits[-1] + 1]
            tensor = ops[chain[-1]].onnx_names[0]
            assert tensor is not None
            result.append(Alignment(str(entry["key"]), label, tensor, tuple(ops[j].index for j in chain)))
            claimed.update(chain)
            pos = max(pos, chain[-1] + 1)
            break
        else:
            log.debug("hooked %s %s not mapped to the converted model", label, shape)
    return result


def _in_main_graph(entry: Mapping[str, Any], keys: Counter[str]) -> bool:
    """Whether the hooked ``entry`` may stand for one tensor of the main graph: an op of the program's own block
    (``block`` 0; a run that does not say is taken as one block) whose key holds one tensor of this run
    (``times``; ``keys``: how often each key is listed)."""
    times = max(int(entry.get("times", 1)), keys[str(entry["key"])])
    if entry.get("block", 0) == 0 and times == 1:
        return True
    block = entry.get("block", 0)
    why = f"ran {times} times" if block == 0 else "ran in a block the run could not tell" if block is None \
        else "ran in another block (a loop body or branch)"
    log.debug("hooked %s %s: no one tensor of the converted model's graph stands for it", entry["key"], why)
    return False


def _operands_fit(op_label: str, op: PaddleOp) -> bool:
    """An ``fc`` multiplies by a weight; a (fused) ``matmul`` of the CPU program multiplies two activations
    (Paddle turns weight matmuls into ``fc``): shapes alone confuse them in attention, where
    ``seq × head_dim`` tensors are everywhere."""
    name = op_label.rpartition(".")[2]
    if name == "fc":
        return bool(op.weights)
    if name in ("matmul", "fused_matmul") and op.op == "matmul":
        return not op.weights
    return True


def _ambiguous_constant(ops: Sequence[PaddleOp], anchor: int, anchors: Sequence[int], constant: frozenset[int],
                        shape: Sequence[int]) -> bool:
    """Whether ``anchor`` computes a constant (a ``full``) and another of ``anchors`` computes one that fits the
    hooked ``shape`` too: Paddle folds some constants into their readers and keeps others, so which one ran is not
    told by the order (a decoder's loop counter ``full`` [0] was aligned with an ``argmax``'s axis ``full`` [-1])."""
    def fits_constant(j: int) -> bool:
        return bool(ops[j].outputs) and ops[j].outputs[0] in constant and bool(ops[j].shapes) \
            and _shape_ok(ops[j].shapes[0], shape)

    return fits_constant(anchor) and any(fits_constant(j) for j in anchors if j != anchor)


def _constant_values(ops: Sequence[PaddleOp]) -> frozenset[int]:
    """Values computed from weights and constants only (a reshaped bias, a ``full`` scale)."""
    constant: set[int] = set()
    for op in ops:
        if all(i in op.weights or i in constant for i in op.inputs):
            constant.update(op.outputs)
    return frozenset(constant)


def _chain(ops: Sequence[PaddleOp], readers: Mapping[int, list[int]], anchor: int, following: frozenset[str], *,
           constant: frozenset[int], limit: int = 6) -> list[int]:
    """``anchor`` and the ops after it that are the only reader of the previous one's first output, up to
    ``limit`` ops; an op that one of the next executed ops stands for ends it, unless it is an elementwise
    op or batch norm with a weight or constant operand (a bias add: always folded into the fused op)."""
    chain = [anchor]
    while len(chain) < limit and ops[chain[-1]].outputs:
        nexts = readers.get(ops[chain[-1]].outputs[0], [])
        if len(nexts) != 1:
            break
        step = ops[nexts[0]]
        with_constant = step.op in _FOLDABLE and any(i in step.weights or i in constant for i in step.inputs)
        if step.op in following and not with_constant:
            break
        chain.append(nexts[0])
    return chain


def hooked_nodes(ops: Sequence[PaddleOp], hooked: Sequence[Mapping[str, Any]]
                 ) -> tuple[list[tuple[str, str, list[str]]], dict[str, str]]:
    """The optimized program's ops as compiled nodes of the ONNX model — (kernel label, op type, the ONNX tensors
    it computes), for :func:`~graphbisect.localize.compiled.from_named_outputs` — and ONNX tensor → hooked key."""
    aligned = align(ops, hooked)
    mapped = {a.key for a in aligned}

    def label(key: str) -> str:
        return key.rpartition("/")[2]  # "onednn_op.fused_conv2d:0"

    named = [(label(a.key), a.op.rpartition(".")[2], [a.tensor]) for a in aligned]
    unmapped = {str(e["key"]): str(e["op"]) for e in hooked if e["key"] not in mapped}  # one per op, not per run
    named += [(label(key), op.rpartition(".")[2], []) for key, op in unmapped.items()]
    return named, {a.tensor: a.key for a in aligned}
