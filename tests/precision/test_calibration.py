"""INT8 calibration: entropy (KL) thresholds against a direct computation, and what they do to real data shapes.

The quantizer here is the one ONNX Runtime runs for our QDQ pairs: UINT8, per tensor, scale and zero point
from :meth:`Calibration.activation`, round half to even, saturate.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphbisect.errors import InputError
from graphbisect.precision.calibration import Calibration, CalibrationMethod, entropy_threshold


def _kl_threshold_directly(magnitudes: np.ndarray, levels: int, bins: int) -> float:
    """TensorRT's entropy calibration written as a plain loop over candidate thresholds (the slow reference)."""
    peak = float(magnitudes.max())
    hist = np.histogram(magnitudes, bins=bins, range=(0.0, peak))[0].astype(np.float64)
    best_kl, best_i = np.inf, bins
    for i in range(levels, bins + 1):
        p = hist[:i].copy()
        p[i - 1] += hist[i:].sum()  # values beyond the threshold are clipped into the last bin
        q = np.zeros(i)
        for j in range(levels):  # merge the first i bins into `levels` levels, spread back over non-empty bins
            lo, hi = j * i // levels, (j + 1) * i // levels
            group = hist[lo:hi]
            if (group > 0).any():
                q[lo:hi] = np.where(group > 0, group.sum() / (group > 0).sum(), 0.0)
        p, q = p / p.sum(), q / q.sum()
        mask = p > 0
        kl = np.inf if (q[mask] == 0).any() else float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if kl < best_kl - 1e-12:
            best_kl, best_i = kl, i
    return peak * best_i / bins


def _fake_quant(x: np.ndarray, scale: float, zero: int) -> np.ndarray:
    q = np.clip(np.round(x / scale) + zero, 0, 255)
    return ((q - zero) * scale).astype(np.float32)


def _heavy_tailed(n: int = 200_000) -> np.ndarray:
    """A Laplace bulk (what most activations look like) plus a handful of large outliers of both signs."""
    rng = np.random.default_rng(7)
    return np.concatenate([rng.laplace(0.0, 1.0, n), [60.0, -45.0, 38.0, 52.0, -70.0]]).astype(np.float32)


@pytest.mark.parametrize("case", ["laplace", "laplace+outliers", "uniform", "relu", "spike"])
def test_vectorized_threshold_equals_the_direct_kl_search(case: str) -> None:
    rng = np.random.default_rng(3)
    values = {
        "laplace": rng.laplace(size=4000),
        "laplace+outliers": np.concatenate([rng.laplace(size=4000), [30.0, -25.0, 40.0]]),
        "uniform": rng.uniform(-2, 2, 4000),
        "relu": np.maximum(rng.standard_normal(4000), 0.0),
        "spike": np.concatenate([np.zeros(3000), rng.uniform(0, 1, 50), [9.0]]),
    }[case]
    magnitudes = np.abs(values)
    for levels in (8, 16):
        assert entropy_threshold(magnitudes, levels, bins=96) == pytest.approx(
            _kl_threshold_directly(magnitudes, levels, bins=96))


def test_entropy_clips_the_outliers_of_a_heavy_tailed_activation_and_quantizes_the_bulk_better() -> None:
    x = _heavy_tailed()
    minmax = Calibration.from_tensors({"x": x})
    entropy = Calibration.from_tensors({"x": x}, method=CalibrationMethod.ENTROPY)
    (e_lo, e_hi), (m_lo, m_hi) = entropy.ranges["x"], minmax.ranges["x"]
    assert (m_lo, m_hi) == (-70.0, 60.0)
    assert -20.0 < e_lo < -3.0 and 3.0 < e_hi < 20.0, entropy.ranges  # the outliers are clipped, both signs
    assert np.mean((x > e_lo) & (x < e_hi)) > 0.999  # ... and only the tail

    bulk = x[np.abs(x) <= np.quantile(np.abs(x), 0.999)]
    mse = {name: float(np.mean((_fake_quant(bulk, *cal.activation("x")) - bulk) ** 2))  # type: ignore[misc]
           for name, cal in (("minmax", minmax), ("entropy", entropy))}
    assert mse["entropy"] * 20 < mse["minmax"], mse  # measured: 37x smaller (the 5 clipped outliers pay for it)


def test_entropy_keeps_the_whole_range_of_a_distribution_without_tail() -> None:
    x = np.random.default_rng(0).uniform(-1.0, 3.0, 100_000).astype(np.float32)
    lo, hi = Calibration.from_tensors({"x": x}, method=CalibrationMethod.ENTROPY).ranges["x"]
    assert lo == pytest.approx(x.min(), rel=0.01) and hi == pytest.approx(x.max(), rel=0.01)


def test_entropy_on_a_one_signed_activation_keeps_zero_as_the_lower_end() -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([np.maximum(rng.laplace(size=100_000), 0.0), [80.0]]).astype(np.float32)
    cal = Calibration.from_tensors({"x": x}, method=CalibrationMethod.ENTROPY)
    lo, hi = cal.ranges["x"]
    assert lo == 0.0 and 3.0 < hi < 20.0
    assert cal.activation("x")[1] == 0  # zero point 0: all 255 steps on the positive side


def test_calibration_method_names() -> None:
    assert CalibrationMethod.parse(" Entropy ") is CalibrationMethod.ENTROPY
    with pytest.raises(InputError) as info:
        CalibrationMethod.parse("kl")
    assert "entropy" in (info.value.hint or "")


def test_only_float_tensors_are_calibrated_strings_integers_and_booleans_are_left_as_they_are() -> None:
    """Every tensor was cast to float32: a string tensor (a LabelEncoder's input) raised ValueError, exit 3
    (issue 35); integers and booleans got ranges no int8 lowering uses."""
    cal = Calibration.from_tensors({"text": np.array(["a", "b"]), "ids": np.arange(4, dtype=np.int64),
                                    "mask": np.array([True, False]), "x": np.linspace(-1, 3, 8, dtype=np.float32),
                                    "half": np.ones(3, np.float16)})
    assert sorted(cal.ranges) == ["half", "x"] and cal.ranges["x"] == (-1.0, 3.0)
    assert cal.activation("text") is None
