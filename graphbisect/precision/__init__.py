"""Reduced-precision lowering of ONNX models: FP16/BF16 Cast islands, INT8 QDQ, calibration.

Each module is one concept: :mod:`.modes` (modes and lowerable nodes), :mod:`.rewrite` (the shared graph
rewriter), :mod:`.casts` (FP16/BF16), :mod:`.calibration` and :mod:`.qdq` (INT8), :mod:`.lowering` (the
façade the precision search uses). Import from those modules: this package imports nothing, so that
``import graphbisect`` (which every backend worker does, maybe under an interpreter without onnx) stays
light, and ``graphbisect.precision`` the *function* of the public API is not shadowed by this package.

Example:
    >>> from graphbisect.precision.lowering import Lowering
    >>> from graphbisect.precision.modes import PrecisionMode
    >>> lowered = Lowering(model, PrecisionMode.FP16).lower(keep_fp32=set())     # doctest: +SKIP
"""

from __future__ import annotations

__all__: list[str] = []
