"""Reduced-precision lowering of ONNX models: FP16/BF16 Cast islands, INT8 QDQ, calibration.

Each module is one concept: :mod:`.modes` (modes and lowerable nodes), :mod:`.rewrite` (the shared graph
rewriter), :mod:`.casts` (FP16/BF16), :mod:`.calibration` and :mod:`.qdq` (INT8), :mod:`.lowering` (the
façade the precision search uses).

Example:
    >>> from graphbisect.precision import Lowering, PrecisionMode
    >>> lowered = Lowering(model, PrecisionMode.FP16).lower(keep_fp32=set())     # doctest: +SKIP
"""

from __future__ import annotations

from graphbisect.precision.calibration import Calibration, CalibrationMethod, entropy_threshold, weight_scales
from graphbisect.precision.casts import is_typed, lower_casts, round_to
from graphbisect.precision.lowering import Lowering
from graphbisect.precision.modes import DATA_MOVEMENT, FP16_TYPED_OPS, INT8_OPS, PrecisionMode, lowerable_nodes
from graphbisect.precision.qdq import lower_qdq, weight_axis

__all__ = [
    "DATA_MOVEMENT",
    "FP16_TYPED_OPS",
    "INT8_OPS",
    "Calibration",
    "CalibrationMethod",
    "Lowering",
    "PrecisionMode",
    "entropy_threshold",
    "is_typed",
    "lower_casts",
    "lower_qdq",
    "lowerable_nodes",
    "round_to",
    "weight_axis",
    "weight_scales",
]
