"""FP16 / BF16 lowering as Cast islands.

For every lowered node:

* **typed** (FP16, ``typed=True``, op types in :data:`~graphbisect.precision.modes.FP16_TYPED_OPS`): its
  float inputs are
  read as FLOAT16 tensors (a ``Cast(to=FLOAT16)`` of a float32 tensor, made once per tensor; FP16 copies of
  weights; or the FLOAT16 output of a lowered producer, with no Cast in between), it computes in FLOAT16,
  and a ``Cast(to=FLOAT)`` gives its float32 value back to whoever needs it. This is the mixed-precision
  model one deploys (TensorRT strongly typed networks, GPUs). *ONNX Runtime's CPU provider has no FLOAT16
  kernels for these ops on x86* (verified on 1.31.1: Add, Mul, MatMul, Softmax, Pow, ReduceMean, Sqrt, Erf
  ...): it inserts its own ``InsertedPrecisionFreeCast`` nodes and computes in float32 between FLOAT16
  boundaries; at ``opt_level=all`` a fully FP16 transformer whose LayerNorm variance overflows FP16
  (3.7 off with rounding emulation) differs from FP32 by only 3e-3 (measured), i.e. ORT keeps most
  intermediate values in float32 (its inserted casts and fusions; the mechanism was not isolated). A search on that
  would
  measure almost nothing, so the precision search on CPU lowers by **emulation** (``typed=False``); the
  typed model is what :func:`lower_casts` emits for deployment (TensorRT, CUDA).
* **emulated** (every node when ``typed=False``, the search's default on CPU; BF16 always: ONNX Runtime
  CPU has no BFLOAT16 kernel for any of these ops and does not insert casts for them; FP16 ops outside the typed
  list): the node stays float32 and every float input
  and output is rounded through the low type (``Cast(to=low)`` then ``Cast(to=FLOAT)``; ONNX Runtime
  keeps these pairs at every optimization level, verified). This models FP16/BF16 *storage* of every
  tensor a lowered node reads or writes (overflow above 65504, underflow, 11- or 8-bit mantissa) with
  float32 arithmetic inside the node: emulation, and the report says so.

Example:
    >>> proto = lower_casts(model, lowered={4, 5}, mode=PrecisionMode.FP16)        # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import numpy as np
import onnx

from graphbisect.model import Model
from graphbisect.precision.modes import FP16_TYPED_OPS, PrecisionMode
from graphbisect.precision.rewrite import GraphRewriter

__all__ = ["is_typed", "lower_casts", "round_to"]

logger = logging.getLogger(__name__)

_FLOAT = onnx.TensorProto.FLOAT


def is_typed(op_type: str, mode: PrecisionMode, *, typed: bool = True) -> bool:
    """Whether ``mode`` retypes a node of ``op_type`` (True) or emulates it by rounding (False).

    ``typed=False`` emulates every node (what the search on a CPU target uses, see the module docstring).
    """
    return typed and mode is PrecisionMode.FP16 and op_type in FP16_TYPED_OPS


def round_to(array: np.ndarray, mode: PrecisionMode) -> np.ndarray:
    """``array`` (float32) rounded to FP16 or BF16 (round to nearest even) and back to float32.

    Example:
        >>> round_to(np.array([70000.0, 1.0001], np.float32), PrecisionMode.FP16)
        array([inf,  1.], dtype=float32)
    """
    array = np.asarray(array, dtype=np.float32)
    if mode is PrecisionMode.FP16:
        with np.errstate(over="ignore"):
            return array.astype(np.float16).astype(np.float32)
    bits = array.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    nan = np.isnan(array)
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(nan, array, out).astype(np.float32)


class _CastLowering:
    def __init__(self, g: GraphRewriter, mode: PrecisionMode, *, typed: bool) -> None:
        self.g, self.mode, self.low, self.typed_mode = g, mode, mode.low_type, typed
        self.suffix = f"__{mode.value}"

    def low_version(self, name: str) -> str:
        """The low-type tensor holding ``name``'s value."""
        low = name + self.suffix
        weight = self.g.weight(name)
        if weight is not None:
            data = weight.astype(np.float16) if self.mode is PrecisionMode.FP16 else None
            if data is not None:
                return self.g.constant(low, data)
        return self.g.once(low, lambda: self.g.node("Cast", [name], [low], to=self.low))

    def rounded(self, name: str) -> str:
        """A float32 tensor holding ``name``'s value rounded through the low type."""
        if self.g.produced_by_lowered(name):
            return name  # a lowered producer's float32 value is already rounded
        weight = self.g.weight(name)
        if weight is not None:
            return self.g.constant(name + self.suffix + "_r", round_to(weight, self.mode))
        out = name + self.suffix + "_r"
        return self.g.once(out, lambda: self.g.node("Cast", [self.low_version(name)], [out], to=_FLOAT))

    def typed(self, node: onnx.NodeProto) -> None:
        inputs = [self.low_version(x) if self.g.is_float(x) else x for x in node.input]
        outputs = [y + self.suffix if self.g.is_float(y) else y for y in node.output]
        self.g.copy(node, inputs, outputs)
        for y in node.output:
            if self.g.is_float(y) and (self.g.needs_fp32(y) or self.read_by_emulated(y)):
                self.g.node("Cast", [y + self.suffix], [y], to=_FLOAT)

    def read_by_emulated(self, name: str) -> bool:
        """Whether a lowered node that is emulated (not retyped: Resize, an op outside the typed list) reads
        ``name``: it reads the float32 value, which a typed producer writes only through its Cast back. Without
        it the typed model read a tensor nothing wrote (a Relu → Resize pair failed to load in ONNX Runtime
        while the emulated model the search measured ran; issue 26)."""
        nodes = self.g.model.nodes
        return any(user in self.g.lowered and not is_typed(nodes[user].op_type, self.mode, typed=self.typed_mode)
                   for user in self.g.model.consumers.get(name, ()))

    def emulated(self, node: onnx.NodeProto) -> None:
        inputs = [self.rounded(x) if self.g.is_float(x) else x for x in node.input]
        outputs = [y + "__fp32raw" if self.g.is_float(y) else y for y in node.output]
        self.g.copy(node, inputs, outputs)
        for y, raw in zip(node.output, outputs):
            if raw != y:
                self.g.node("Cast", [raw], [y + self.suffix], to=self.low)
                self.g.node("Cast", [y + self.suffix], [y], to=_FLOAT)

    def fp32(self, node: onnx.NodeProto) -> None:
        self.g.copy(node, list(node.input), list(node.output))


def lower_casts(model: Model, lowered: Collection[int], mode: PrecisionMode,
                expose: Sequence[str] = (), *, typed: bool = True) -> onnx.ModelProto:
    """``model`` with the nodes at ``lowered`` in FP16/BF16 (typed or emulated, see the module docstring).

    ``typed=False`` emulates every lowered node by rounding its inputs and outputs.
    """
    if mode is PrecisionMode.INT8:
        raise ValueError("lower_casts lowers to fp16/bf16; int8 is lower_qdq's")
    g = GraphRewriter(model, lowered, expose)
    lowering = _CastLowering(g, mode, typed=typed)
    for index, node in enumerate(model.nodes):
        if index not in g.lowered:
            lowering.fp32(node)
        elif is_typed(node.op_type, mode, typed=typed):
            lowering.typed(node)
        else:
            lowering.emulated(node)
    return g.finish()
