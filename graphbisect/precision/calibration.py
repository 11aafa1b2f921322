"""INT8 calibration from the oracle's captured activations: per-tensor activation ranges, per-channel weights.

Activations are quantized per tensor to UINT8 with a zero point (asymmetric), the scheme ONNX Runtime's
x86 int8 kernels prefer (U8S8); weights per output channel to INT8, symmetric. The range of an activation
comes from the oracle's value of that tensor on the calibration inputs:

* ``minmax``: its minimum and maximum (always including 0, so 0 is exact);
* ``percentile``: the 0.01th and 99.99th percentiles (``percentile=`` to change), which clips outliers;
* ``entropy``: the clipping threshold that minimizes the KL divergence between the tensor's distribution
  and its quantized version (TensorRT's entropy calibration, also ONNX Runtime's ``CalibrationMethod.Entropy``),
  see :func:`entropy_threshold`.

**Entropy on an asymmetric UINT8 grid.** The KL search runs on the histogram of *magnitudes* ``|x|``
(2048 bins over ``[0, max|x|]``), so one outlier of either sign is a candidate for clipping. For each
candidate threshold ``t`` (a bin edge), the reference distribution P is the histogram up to ``t`` with every
value beyond ``t`` clipped into the last bin, and Q is the same histogram merged into the number of levels
UINT8 has over that span and expanded back (each level's count spread evenly over its non-empty bins):
128 levels per sign when the tensor has both signs (255 steps across ``[-t, t]``), 255 when it has one sign
(255 steps across ``[0, t]``, e.g. after a ReLU). The threshold with the smallest ``KL(P || Q)`` wins. It
maps to the activation range ``[max(min, -t), min(max, t)]`` (then widened to include 0): a side whose
values stay within ``t`` keeps its own extent, so the asymmetric grid spends no levels beyond the data,
and :meth:`Calibration.activation` turns the range into scale and zero point exactly as for ``minmax``.

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

__all__ = ["Calibration", "CalibrationMethod", "entropy_threshold", "weight_scales"]

logger = logging.getLogger(__name__)

_SAMPLE = 1 << 20  # elements a percentile or a histogram is computed on (a strided sample of larger tensors)
_ENTROPY_BINS = 2048  # TensorRT's histogram resolution


class CalibrationMethod(str, enum.Enum):
    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"

    @classmethod
    def parse(cls, text: str) -> CalibrationMethod:
        try:
            return cls(text.strip().lower())
        except ValueError as exc:
            raise InputError(f"unknown calibration method {text!r}",
                             hint="use calibration='minmax', 'percentile' or 'entropy'",
                             cli_hint="use --calibration minmax, percentile or entropy") from exc


def entropy_threshold(magnitudes: np.ndarray, levels: int, *, bins: int = _ENTROPY_BINS) -> float:
    """The clipping threshold for ``|x|`` values ``magnitudes`` that minimizes ``KL(P || Q)`` (see module docstring).

    ``levels`` is how many quantization levels the span ``[0, t]`` gets (128 for a two-signed tensor on a
    UINT8 grid, 255 for a one-signed one). All candidates are evaluated at once from cumulative sums of the
    histogram, O(bins · levels) work and no per-candidate Python loop.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> bulk = np.abs(rng.standard_normal(100_000))
        >>> t = entropy_threshold(np.concatenate([bulk, [60.0]]), levels=128)
        >>> 2.0 < t < 10.0   # the single outlier at 60 is clipped, the Gaussian bulk is kept
        True
    """
    values = np.asarray(magnitudes, dtype=np.float64).reshape(-1)
    peak = float(values.max()) if values.size else 0.0
    if not peak > 0.0:
        return 0.0
    if bins <= levels:
        return peak
    hist = np.histogram(values, bins=bins, range=(0.0, peak))[0].astype(np.float64)
    total = hist.sum()
    cum = np.concatenate([[0.0], np.cumsum(hist)])  # cum[i]: count in the first i bins
    nonempty = np.concatenate([[0], np.cumsum(hist > 0)])
    hlogh = np.concatenate([[0.0], np.cumsum(_xlogx(hist))])

    kept = np.arange(levels, bins + 1)  # candidate: keep the first i bins, threshold = edge i
    j = np.arange(levels)
    start = (j[None, :] * kept[:, None]) // levels
    end = ((j[None, :] + 1) * kept[:, None]) // levels
    group_sum = cum[end] - cum[start]
    group_nonempty = nonempty[end] - nonempty[start]
    with np.errstate(divide="ignore", invalid="ignore"):
        level_value = np.where(group_nonempty > 0, group_sum / np.maximum(group_nonempty, 1), 0.0)
        log_value = np.log(np.where(level_value > 0, level_value, 1.0))
        last_bin = hist[kept - 1]
        outliers = total - cum[kept]
        ref_last = last_bin + outliers
        # Σ_k p_k log p_k and Σ_k p_k log q_k in raw counts: bins before the last one, then the last bin
        # (which also holds the clipped outliers). Q of a non-empty bin is its level's value; the last
        # bin's Q is 0 when it is empty but receives outliers: KL is infinite, the candidate loses.
        p_log_p = hlogh[kept - 1] + _xlogx(ref_last)
        p_log_q = (group_sum * log_value).sum(axis=1) - last_bin * log_value[:, -1]
        q_last = np.where(last_bin > 0, level_value[:, -1], 0.0)
        p_log_q_last = np.where(ref_last > 0, ref_last * np.log(np.where(q_last > 0, q_last, np.nan)), 0.0)
        kl = (p_log_p - p_log_q - p_log_q_last) / total - np.log(total) + np.log(cum[kept])
    kl = np.where(np.isfinite(kl), kl, np.inf)
    best = int(kept[int(np.argmin(kl))])
    return peak * best / bins


def _xlogx(counts: np.ndarray) -> np.ndarray:
    """``c · log c`` element-wise, 0 where ``c`` is 0."""
    return np.where(counts > 0, counts * np.log(np.where(counts > 0, counts, 1.0)), 0.0)


def _entropy_range(flat: np.ndarray) -> tuple[float, float]:
    lo, hi = float(flat.min()), float(flat.max())
    one_signed = lo >= 0.0 or hi <= 0.0
    sample = flat[:: max(1, flat.size // _SAMPLE)]
    t = entropy_threshold(np.abs(sample), levels=255 if one_signed else 128)
    return max(lo, -t), min(hi, t)


def _range(values: np.ndarray, method: CalibrationMethod, percentile: float) -> tuple[float, float]:
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    flat = flat[np.isfinite(flat)] if flat.size else flat
    if flat.size == 0:
        return 0.0, 0.0
    if method is CalibrationMethod.PERCENTILE:
        sample = flat[:: max(1, flat.size // _SAMPLE)]
        lo, hi = np.percentile(sample, [100.0 - percentile, percentile])
        return float(lo), float(hi)
    if method is CalibrationMethod.ENTROPY:
        return _entropy_range(flat)
    return float(flat.min()), float(flat.max())


@dataclass(frozen=True)
class Calibration:
    """Per-tensor ranges of activations (name → (min, max)); immutable."""

    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    method: CalibrationMethod = CalibrationMethod.MINMAX

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, np.ndarray], names: Iterable[str] | None = None, *,
                     method: CalibrationMethod = CalibrationMethod.MINMAX, percentile: float = 99.99) -> Calibration:
        """Ranges of the float tensors among ``names`` (default: all) read from ``tensors`` (a dict or an
        ActivationStore).

        Only floating-point tensors have a range: int8 quantizes float32 activations, and strings, integers
        and booleans (a ``LabelEncoder``'s keys, token ids, masks) are left as they are. Casting them to float32
        raised on the first string (issue 35: a model with a string input exited 3).

        Example:
            >>> sorted(Calibration.from_tensors({"x": np.ones(3, np.float32), "s": np.array(["a"])}).ranges)
            ['x']
        """
        wanted = list(tensors) if names is None else [n for n in names if n in tensors]
        ranges: dict[str, tuple[float, float]] = {}
        for name in wanted:
            values = np.asarray(tensors[name])
            if values.dtype.kind != "f":
                logger.debug("not calibrating %r: %s values stay as they are", name, values.dtype)
                continue
            ranges[name] = _range(values, method, percentile)
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
