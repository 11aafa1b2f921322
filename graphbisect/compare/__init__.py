"""Comparators: per-tensor statistics, verdicts and scores (see :mod:`.metrics`)."""

from __future__ import annotations

from graphbisect.compare.metrics import (
    Comparison,
    MismatchKind,
    TensorStats,
    Tolerance,
    compare_outputs,
    compare_tensors,
    compare_values,
)

__all__ = ["Comparison", "MismatchKind", "TensorStats", "Tolerance", "compare_outputs", "compare_tensors",
           "compare_values"]
