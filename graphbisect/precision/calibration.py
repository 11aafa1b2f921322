"""INT8 calibration from the oracle's captured activations: per-tensor activation ranges, per-channel weights.

Activations are quantized per tensor to UINT8 with a zero point (asymmetric), the scheme ONNX Runtime's
x86 int8 kernels prefer (U8S8); weights per output channel to INT8, symmetric. The range of an activation
comes from the oracle's value of that tensor on the calibration inputs:

* ``minmax``: its minimum and maximum (always including 0, so 0 is exact);
* ``percentile``: the 0.01th and 99.99th percentiles (``percentile=`` to change), which clips outliers.

Entropy (KL) calibration is not implemented.

Example:
    >>> cal = Calibration.from_tensors({"x": np.linspace(-1, 3, 256, dtype=np.float32)})
    >>> scale, zero_point = cal.activation("x")
    >>> round(scale, 5), zero_point
    (0.01569, 64)
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from graphbisect.errors import InputError

__all__ = ["Calibration", "CalibrationMethod", "weight_scales"]

logger = logging.getLogger(__name__)

_SAMPLE = 1 << 20  # elements a percentile is computed on (a strided sample of larger tensors)


class CalibrationMethod(str, enum.Enum):
    MINMAX = "minmax"
    PERCENTILE = "percentile"

    @classmethod
    def parse(cls, text: str) -> CalibrationMethod:
        try:
            return cls(text.strip().lower())
        except ValueError as exc:
            raise InputError(f"unknown calibration method {text!r}",
                             hint="use --calibration minmax or percentile (entropy is not implemented)") from exc


def _range(values: np.ndarray, method: CalibrationMethod, percentile: float) -> tuple[float, float]:
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    flat = flat[np.isfinite(flat)] if flat.size else flat
    if flat.size == 0:
        return 0.0, 0.0
    if method is CalibrationMethod.PERCENTILE:
        sample = flat[:: max(1, flat.size // _SAMPLE)]
        lo, hi = np.percentile(sample, [100.0 - percentile, percentile])
        return float(lo), float(hi)
    return float(flat.min()), float(flat.max())


@dataclass(frozen=True)
class Calibration:
    """Per-tensor ranges of activations (name → (min, max)); immutable."""

    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    method: CalibrationMethod = CalibrationMethod.MINMAX

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, np.ndarray], names: Iterable[str] | None = None, *,
                     method: CalibrationMethod = CalibrationMethod.MINMAX, percentile: float = 99.99) -> Calibration:
        """Ranges of ``names`` (default: all) read from ``tensors`` (a dict or an ActivationStore)."""
        wanted = list(tensors) if names is None else [n for n in names if n in tensors]
        ranges = {name: _range(tensors[name], method, percentile) for name in wanted}
        logger.debug("calibrated %d activations (%s)", len(ranges), method.value)
        return cls(ranges, method)

    def activation(self, name: str) -> tuple[float, int] | None:
        """``(scale, zero_point)`` of UINT8 activation ``name``, or None when it was not calibrated."""
        found = self.ranges.get(name)
        if found is None:
            return None
        lo, hi = min(found[0], 0.0), max(found[1], 0.0)
        scale = (hi - lo) / 255.0
        if not np.isfinite(scale) or scale <= 0:
            return 1.0, 0
        return float(scale), int(np.clip(round(-lo / scale), 0, 255))


def weight_scales(weight: np.ndarray, axis: int | None) -> np.ndarray:
    """Symmetric INT8 scales of ``weight``: one per slice along ``axis`` (None: one for the tensor).

    Example:
        >>> weight_scales(np.array([[1.0, -2.0], [0.5, 0.25]], np.float32), axis=0)
        array([0.01574803, 0.00393701], dtype=float32)
    """
    values = np.abs(np.asarray(weight, dtype=np.float32))
    if axis is None:
        peak = np.asarray(values.max() if values.size else 0.0)
    else:
        other = tuple(i for i in range(values.ndim) if i != axis)
        peak = values.max(axis=other) if other else values
    scales = np.where(peak > 0, peak / 127.0, 1.0)
    return np.asarray(scales, dtype=np.float32)
