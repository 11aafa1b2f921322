"""One façade over the lowerings: which nodes are units, and the model with a given set kept in FP32.

Three mechanisms: INT8 by QDQ (:mod:`.qdq`), FP16/BF16 by Cast islands (:mod:`.casts`), and
**runtime pins** (``runtime_pins=True``): the target itself runs in reduced precision (e.g.
``openvino:precision=bf16``) and keeps the named nodes in FP32 with its own mechanism; the model is then
the FP32 model unchanged, and what changes per keep-set is the list of node names the runtime is given
(:meth:`Lowering.pinned`). A runtime that pins per *op type* of its own program (Paddle's
``set_bfloat16_op``) gives ``op_types``: the units are then those types, not ONNX nodes.

Example:
    >>> low = Lowering(model, PrecisionMode.FP16)                                # doctest: +SKIP
    >>> proto = low.lower(keep_fp32={low.units[3]})                              # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import onnx

from graphbisect.errors import InputError
from graphbisect.model import Model
from graphbisect.precision.calibration import Calibration
from graphbisect.precision.casts import is_typed, lower_casts
from graphbisect.precision.modes import PrecisionMode, lowerable_nodes
from graphbisect.precision.qdq import QdqConstants, int32_bias_overflows, lower_qdq

__all__ = ["Lowering"]

logger = logging.getLogger(__name__)


class Lowering:
    """Lowers ``model`` to ``mode`` except for the nodes kept in FP32.

    ``typed``: FP16 nodes are retyped (the deployable mixed model) instead of emulated by rounding (what
    the search measures on CPU; see :mod:`graphbisect.precision.casts`). ``runtime_pins``: the model is
    not rewritten; the target lowers it and pins :meth:`pinned` (see the module docstring); with
    ``op_types`` (runtime pins only) the units are the target's op types, not nodes.

    Attributes:
        units: indices (topological order) of the lowerable nodes; a search's unit ``i`` is ``units[i]``
            (with ``op_types``: ``0..len(op_types)-1``, unit ``i`` is ``op_types[i]``).
        float_nodes: node name → why, for the nodes ``mode`` could lower but this lowering keeps in float
            whatever the keep-set (INT8: a bias int32 cannot hold at the calibrated scales,
            :func:`~graphbisect.precision.qdq.int32_bias_overflows`); they are not units.
    """

    def __init__(self, model: Model, mode: PrecisionMode, calibration: Calibration | None = None, *,
                 typed: bool = False, runtime_pins: bool = False, op_types: Sequence[str] | None = None) -> None:
        if op_types is not None and not runtime_pins:
            raise ValueError("op-type units exist only for runtime pins (the target lowers by type)")
        if mode is PrecisionMode.INT8 and calibration is None and not runtime_pins:
            raise InputError("int8 lowering needs a calibration (activation ranges)",
                             hint="build one with Calibration.from_tensors(oracle activations)")
        self.model, self.mode, self.calibration, self.typed = model, mode, calibration, typed
        self.runtime_pins = runtime_pins
        self.op_types: tuple[str, ...] | None = tuple(op_types) if op_types is not None else None
        units = range(len(self.op_types)) if self.op_types is not None else lowerable_nodes(model, mode)
        self.float_nodes: dict[str, str] = {}
        if mode is PrecisionMode.INT8 and calibration is not None and not runtime_pins:
            overflows = int32_bias_overflows(model, units, calibration)
            self.float_nodes = {model.node_names[index]: why for index, why in overflows.items()}
            for name, why in self.float_nodes.items():
                logger.info("int8 keeps %r in float: %s", name, why)
            units = [index for index in units if index not in overflows]
        self.units: tuple[int, ...] = tuple(units)
        self._qdq = QdqConstants(calibration) if calibration is not None else None  # shared by every candidate

    def names(self, units: Collection[int]) -> list[str]:
        """Node names of search units ``units`` (in topological order; with ``op_types``: the types)."""
        if self.op_types is not None:
            return [self.op_types[u] for u in sorted(units)]
        return [self.model.node_names[self.units[u]] for u in sorted(units)]

    def op_type(self, unit: int) -> str:
        """The op type of unit ``unit`` (the ONNX node's, or the target's op type itself)."""
        if self.op_types is not None:
            return self.op_types[unit]
        return self.model.nodes[self.units[unit]].op_type

    def lower(self, keep_fp32: Collection[int], expose: Sequence[str] = ()) -> onnx.ModelProto:
        """The model with every unit lowered except ``keep_fp32`` (unit numbers, not node indices)."""
        if self.runtime_pins:
            return self.model.with_outputs(list(expose))  # the target lowers; see pinned()
        kept = set(keep_fp32)  # once: in the condition it was built again for every unit
        lowered = {node for u, node in enumerate(self.units) if u not in kept}
        if self.mode is PrecisionMode.INT8:
            assert self._qdq is not None
            return lower_qdq(self.model, lowered, self._qdq, expose)
        return lower_casts(self.model, lowered, self.mode, expose, typed=self.typed)

    def pinned(self, keep_fp32: Collection[int]) -> list[str]:
        """With ``runtime_pins``: the node names the target must keep in FP32 (those of ``keep_fp32``)."""
        return self.names(keep_fp32)

    def how(self, unit: int) -> str:
        """How unit ``unit`` is lowered: ``qdq`` (int8), ``typed`` (FP16 node), ``emulated`` (rounding) or
        ``runtime`` (by the target, pinned by name)."""
        if self.runtime_pins:
            return "runtime"
        if self.mode is PrecisionMode.INT8:
            return "qdq"
        op_type = self.op_type(unit)
        return "typed" if is_typed(op_type, self.mode, typed=self.typed) else "emulated"
