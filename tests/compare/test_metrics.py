"""Comparators: the verdict must equal numpy.allclose, and statistics must not depend on chunking."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from graphbisect.compare import MismatchKind, Tolerance, compare_outputs, compare_tensors, metrics


@pytest.mark.parametrize("seed", range(20))
def test_verdict_equals_numpy_allclose(seed: int) -> None:
    rng = np.random.default_rng(seed)
    oracle = rng.standard_normal((7, 13)).astype(np.float32) * 10 ** rng.uniform(-3, 3)
    target = oracle + rng.standard_normal(oracle.shape).astype(np.float32) * 10 ** rng.uniform(-7, 0)
    tol = Tolerance(atol=1e-4, rtol=1e-3)
    stats = compare_tensors("t", oracle, target, tol)
    expected = np.allclose(target.astype(np.float64), oracle.astype(np.float64), rtol=1e-3, atol=1e-4)
    assert stats.passed == expected
    assert (stats.score <= 1.0) == expected
    close = np.isclose(target.astype(np.float64), oracle.astype(np.float64), rtol=1e-3, atol=1e-4)
    assert stats.mismatches == int((~close).sum())


def test_statistics_do_not_depend_on_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    oracle = rng.standard_normal(10_001).astype(np.float32)
    target = oracle + rng.standard_normal(oracle.shape).astype(np.float32) * 1e-2
    whole = compare_tensors("t", oracle, target)
    monkeypatch.setattr(metrics, "_CHUNK", 97)
    chunked = compare_tensors("t", oracle, target)
    for key in ("mismatches", "numel", "max_abs", "max_rel", "score", "oracle_range", "target_range"):
        assert getattr(whole, key) == getattr(chunked, key), key
    for key in ("cosine", "snr_db", "rel_l2", "mean_abs"):
        assert getattr(whole, key) == pytest.approx(getattr(chunked, key), rel=1e-9), key


def test_known_values() -> None:
    oracle = np.array([3.0, 4.0], np.float32)
    target = np.array([3.0, 5.0], np.float32)
    s = compare_tensors("t", oracle, target)
    assert s.kind is MismatchKind.MISMATCH
    assert s.max_abs == 1.0 and s.max_rel == pytest.approx(0.25)
    assert s.cosine == pytest.approx((9 + 20) / (5 * math.sqrt(34)))
    assert s.snr_db == pytest.approx(10 * math.log10(25 / 1))
    assert s.rel_l2 == pytest.approx(1 / 5)
    assert s.oracle_range == (3.0, 4.0) and s.target_range == (3.0, 5.0)


def test_nan_in_target_is_its_own_failure_kind() -> None:
    oracle = np.array([1.0, 2.0, np.nan], np.float32)
    same = compare_tensors("t", oracle, oracle.copy())
    assert same.passed, "NaN where the oracle also has NaN is a match"
    bad = compare_tensors("t", oracle, np.array([1.0, np.inf, np.nan], np.float32))
    assert bad.kind is MismatchKind.NAN and bad.target_nonfinite == 1
    oracle_nan = compare_tensors("t", oracle, np.array([1.0, 2.0, 0.0], np.float32))
    assert oracle_nan.kind is MismatchKind.MISMATCH and math.isinf(oracle_nan.score)


def test_structural_mismatches() -> None:
    a = np.zeros((2, 3), np.float32)
    assert compare_tensors("t", a, np.zeros((3, 2), np.float32)).kind is MismatchKind.SHAPE
    assert compare_tensors("t", a, a.astype(np.float16)).kind is MismatchKind.DTYPE
    assert compare_tensors("t", a, a.astype(np.float16), Tolerance(check_dtype=False)).passed
    assert compare_tensors("t", a, None).kind is MismatchKind.MISSING


def test_integers_and_bools_compare_exactly() -> None:
    big = np.array([10**9, 5], np.int64)
    assert not compare_tensors("i", big, big + 1, Tolerance(atol=10, rtol=1)).passed
    flags = np.array([True, False])
    assert not compare_tensors("b", flags, ~flags).passed
    assert compare_tensors("b", flags, flags.copy()).passed


def test_min_cosine_and_per_output_overrides() -> None:
    oracle = np.array([1.0, 0.0], np.float32)
    target = np.array([0.9, 0.1], np.float32)
    assert not compare_tensors("y", oracle, target, Tolerance(atol=1.0, min_cosine=0.999)).passed
    assert compare_tensors("y", oracle, target, Tolerance(atol=1.0, min_cosine=0.9)).passed
    tol = Tolerance(per_output={"loose": (0.5, 0.0)})
    result = compare_outputs({"loose": oracle, "strict": oracle}, {"loose": target, "strict": target}, tol)
    assert [s.passed for s in result.outputs] == [True, False]
    assert result.worst is not None and result.worst.name == "strict"


def test_worst_prefers_structural_failures_and_json_is_strict() -> None:
    oracle = {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)}
    target = {"a": np.full(3, 100.0, np.float32)}
    result = compare_outputs(oracle, target)
    assert not result.passed
    assert result.worst is not None and result.worst.kind is MismatchKind.MISSING
    text = json.dumps([s.to_json() for s in result.outputs], allow_nan=False)
    assert '"inf"' in text


def test_identical_fast_path_equals_the_general_path() -> None:
    rng = np.random.default_rng(3)
    oracle = rng.standard_normal(5000).astype(np.float32)
    oracle[[3, 70]] = [np.nan, np.inf]
    fast = compare_tensors("t", oracle, oracle.copy())
    acc = metrics._Accumulator(1e-4, 1e-3)
    acc.add(oracle.reshape(-1), oracle.copy().reshape(-1))
    assert fast.passed and fast.mismatches == acc.mismatches == 0
    assert fast.oracle_range == fast.target_range == (acc.o_min, acc.o_max)
    assert fast.cosine == pytest.approx(acc.cosine()) and fast.snr_db == acc.snr_db() == math.inf


def test_statistics_and_tolerances_cross_the_worker_boundary_exactly() -> None:
    """A target's worker measures the layerwise statistics and sends them as JSON: every kind, infinities,
    NaN, shapes, ranges and the tolerance must come back as they were (the table must not change)."""
    o = np.array([0.0, 1.0, 3.0, -2.5], np.float32)
    cases = [
        compare_tensors("ok", o, o.copy()),
        compare_tensors("mismatch", o, o + np.float32(0.25)),
        compare_tensors("nan", o, np.array([0.0, np.nan, np.inf, 1.0], np.float32)),
        compare_tensors("zero-oracle", np.zeros(3, np.float32), np.full(3, 1e-3, np.float32)),  # max_rel NaN
        compare_tensors("missing", o, None),
        compare_tensors("shape", o, o[:2]),
        compare_tensors("dtype", o, o.astype(np.float64)),
        compare_tensors("strings", np.array(["a", "b"], object), np.array(["a", "c"], object)),
        metrics.compare_values("seq", [o, o], [o, o * 2]),
    ]
    for stats in cases:
        data = json.loads(json.dumps(stats.to_json()))
        back = metrics.TensorStats.from_json(data)
        assert back.to_json() == stats.to_json(), stats.name
        assert back.kind is stats.kind and back.passed == stats.passed
        assert type(back.oracle_shape) is type(stats.oracle_shape)
    tol = Tolerance(atol=1e-5, rtol=0.0, min_cosine=0.99, per_output={"y": (0.5, 1e-2)}, check_dtype=False)
    assert Tolerance.from_json(json.loads(json.dumps(tol.to_json()))) == tol


def test_opposite_infinities_are_reported_without_a_numpy_warning() -> None:
    # fp16 overflow gives +inf and -inf in one tensor; their sum (the finiteness probe) is nan, which numpy
    # warned about in every precision search ("invalid value encountered in reduce").
    oracle = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    target = np.array([1.0, np.inf, -np.inf, 4.0], np.float32)
    with np.errstate(all="raise"):
        stats = compare_tensors("x", oracle, target, Tolerance(atol=1e-3, rtol=1e-3))
    assert not stats.passed
    assert stats.kind is MismatchKind.NAN
