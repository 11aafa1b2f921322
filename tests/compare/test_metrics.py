"""Comparators: the verdict must equal numpy.allclose, and statistics must not depend on chunking."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from graphbisect.compare import MismatchKind, Tolerance, compare_outputs, compare_tensors, metrics
from graphbisect.errors import InputError


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


@pytest.mark.parametrize("chunk", [None, 97])
def test_the_relative_error_is_measured_only_where_the_oracle_exceeds_atol(monkeypatch: pytest.MonkeyPatch,
                                                                          chunk: int | None) -> None:
    """ReLU activations are half exact zeros: there |t - o| / |o| means nothing (NaN when every error lies
    there). The largest ratio over the other elements, exactly, chunk by chunk too."""
    if chunk is not None:
        monkeypatch.setattr(metrics, "_CHUNK", chunk)
    rng = np.random.default_rng(5)
    oracle = np.maximum(rng.standard_normal(10_001), 0).astype(np.float32)
    oracle[::7] = 5e-5  # |o| <= atol, not zero
    target = oracle + rng.standard_normal(oracle.shape).astype(np.float32) * np.float32(1e-3)
    tol = Tolerance(atol=1e-4, rtol=1e-3)
    o, t = oracle.astype(np.float64), target.astype(np.float64)
    meaningful = np.abs(o) > 1e-4
    stats = compare_tensors("t", oracle, target, tol)
    assert stats.max_rel == float((np.abs(t - o)[meaningful] / np.abs(o)[meaningful]).max())
    only_where_meaningless = np.where(meaningful, oracle, target)
    assert math.isnan(compare_tensors("t", oracle, only_where_meaningless, tol).max_rel)
    assert compare_tensors("t", oracle, oracle.copy(), tol).max_rel == 0.0


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
    for dtype in (np.int64, np.uint64):  # as float64, 2**60 and 2**60 + 1 are one value
        huge = np.array([2**60, 7], dtype)
        s = compare_tensors("h", huge, huge + np.array([1, 0], dtype))
        assert not s.passed and s.mismatches == 1 and s.max_abs == 1.0
    extremes = np.array([np.iinfo(np.int64).min, 0], np.int64)
    s = compare_tensors("e", extremes, np.array([np.iinfo(np.int64).max, 0], np.int64))
    assert s.mismatches == 1 and s.max_abs == 2.0**64
    flags = np.array([True, False])
    assert not compare_tensors("b", flags, ~flags).passed
    assert compare_tensors("b", flags, flags.copy()).passed


def test_quantized_integers_compare_in_steps_and_other_integers_exactly() -> None:
    """Issue 26, item 2: a QuantizeLinear rounding a tie the other way is 1 LSB, within the default --int-atol 1;
    50 LSB scores 50; indices and shapes stay exact; a float on the grid (a DequantizeLinear's output) gets
    int_atol steps more atol. score <= 1 still means "within tolerance"."""
    q = np.array([-128, -3, 0, 7, 127], np.int8)
    tol = Tolerance(quantized={"q": 0.05, "dq": 0.05, "q16": 0.001})
    one = compare_tensors("q", q, q + np.array([0, 1, 0, -1, 0], np.int8), tol)
    assert one.passed and one.score == 1.0 and one.mismatches == 0 and one.max_abs == 1.0
    fifty = compare_tensors("q16", q.astype(np.int16), q.astype(np.int16) + np.int16(50), tol)
    assert not fifty.passed and fifty.score == 50.0 and fifty.mismatches == 5
    assert math.isinf(compare_tensors("idx", q, q + np.int8(1), tol).score)  # not quantized: exact
    assert math.isinf(compare_tensors("q", q, q + np.int8(1), Tolerance(int_atol=0, quantized={"q": 0.05})).score)
    assert compare_tensors("q", q, q - np.array([0, 2, 2, 0, 2], np.int8), Tolerance(int_atol=2,
                                                                                   quantized={"q": 0.05})).passed
    unknown_scale = Tolerance(quantized={"dq_u8": 0.0})  # DynamicQuantizeLinear: a quantized tensor all the same
    u8 = np.array([0, 3, 254], np.uint8)
    assert compare_tensors("dq_u8", u8, u8 + np.uint8(1), unknown_scale).passed
    grid = q.astype(np.float32) * np.float32(0.05)
    assert compare_tensors("dq", grid, grid + np.float32(0.05), tol).passed  # 1 step off
    assert not compare_tensors("dq", grid, grid + np.float32(0.5), tol).passed  # 10 steps off
    assert not compare_tensors("other", grid, grid + np.float32(0.05), tol).passed  # not on a grid
    assert Tolerance.from_json(tol.to_json()) == tol


@pytest.mark.parametrize("bad", [{"int_atol": -1.0}, {"int_atol": math.nan}, {"quantized": {"q": math.inf}}])
def test_integer_tolerances_are_checked(bad: dict) -> None:
    with pytest.raises(InputError):
        Tolerance(**bad)


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
    # one by one as JSON objects (reports), and all at once as the columns a worker sends (stats_columns)
    columns = metrics.stats_from_columns(json.loads(json.dumps(metrics.stats_columns(cases), allow_nan=False)))
    assert [s.name for s in columns] == [s.name for s in cases]
    for stats, sent in zip(cases, columns, strict=True):
        data = json.loads(json.dumps(stats.to_json()))
        for back in (metrics.TensorStats.from_json(data), sent):
            assert back.to_json() == stats.to_json(), stats.name
            assert back.kind is stats.kind and back.passed == stats.passed
            assert type(back.oracle_shape) is type(stats.oracle_shape)
            assert all(type(getattr(back, f)) is type(getattr(stats, f)) for f in ("numel", "max_abs", "score"))
    assert metrics.stats_from_columns(json.loads(json.dumps(metrics.stats_columns([])))) == []
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


def test_float64_values_whose_squares_overflow_keep_true_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sums of squares of values near 1e100 exceed float64: the cosine of two equal tensors came out 0 (a
    # mismatch under --min-cosine), and at 1e160 inf/inf gave NaN, which no --min-cosine ever failed.
    big = np.array([1e100, 2e100, 3e100])
    same = compare_tensors("x", big, big * (1 + 1e-12), Tolerance(min_cosine=0.999))
    assert same.passed and same.cosine == pytest.approx(1.0) and same.rel_l2 == pytest.approx(1e-12, rel=1e-3)
    huge = np.array([1e160, -1e160, 1.0])
    flipped = compare_tensors("x", huge, -huge, Tolerance(rtol=3.0, min_cosine=0.999))  # within rtol, opposite
    assert not flipped.passed and flipped.cosine == pytest.approx(-1.0) and flipped.rel_l2 == pytest.approx(2.0)
    # Chunk by chunk the sums overflow only when added up: the unit changes between chunks.
    many = np.full(4096, 1e153)
    whole = compare_tensors("x", many, many * (1 + 1e-9))
    monkeypatch.setattr(metrics, "_CHUNK", 7)
    chunked = compare_tensors("x", many, many * (1 + 1e-9))
    for stats in (whole, chunked):
        assert stats.cosine == pytest.approx(1.0) and stats.snr_db == pytest.approx(180, abs=0.1)
        assert stats.rel_l2 == pytest.approx(1e-9, rel=1e-6)
    flipped_first = many.copy()
    flipped_first[:7] *= -1  # one chunk differs, every later one is identical (summed by another path)
    assert compare_tensors("x", many, flipped_first).cosine == pytest.approx(1 - 14 / 4096)


def test_a_difference_past_float64_is_a_mismatch_at_any_tolerance() -> None:
    # t - o of two finite values can overflow to inf; inf <= rtol * |o| (also inf for rtol > 1) passed.
    oracle = np.array([1.7e308, -1.7e308, 1.0])
    with np.errstate(all="raise"):
        stats = compare_tensors("x", oracle, -oracle, Tolerance(rtol=3.0))
    assert not stats.passed and stats.mismatches == 2 and stats.score == math.inf
    assert stats.max_abs == math.inf and stats.snr_db == -math.inf and stats.max_rel == math.inf
    # beside an oracle value within atol whose target differs: the relative error is still the meaningful ones'
    tiny = compare_tensors("x", np.array([1.7e308, 0.0, 2.0]), np.array([-1.7e308, 1e-5, 3.0]), Tolerance())
    assert tiny.max_rel == math.inf and tiny.mismatches == 2
    assert compare_tensors("x", np.array([0.0, 2.0]), np.array([1e-5, 3.0]), Tolerance()).max_rel == 0.5


def _batch_cases(rng: np.random.Generator) -> list[tuple[str, object, object]]:
    """Pairs covering what compare_many batches and what it must leave alone, in a shuffled order."""
    cases: list[tuple[str, object, object]] = []
    for i in range(60):
        shape = [(4, 16), (8,), (2, 3, 5), (1,)][i % 4]
        dtype = np.float32 if i % 5 else np.float16
        o = (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 4)).astype(dtype)
        kind = i % 6
        if kind == 0:
            t = o.copy()  # bit-identical
        elif kind == 1:
            t = np.where(o == 0, o, o * dtype(1 + 1e-3)).astype(dtype)  # beyond rtol
        elif kind == 2:
            t = (o + rng.standard_normal(shape).astype(dtype) * dtype(1e-7)).astype(dtype)  # last bits
        elif kind == 3:
            o = np.zeros(shape, dtype)
            t = -o  # -0.0 against 0.0: different bytes, equal values
        elif kind == 4:
            o.flat[0] = 1e-6  # below atol: a relative error that means nothing
            t = o.copy()
            t.flat[0] = 3e-6
        else:
            t = o.copy()
            t.flat[-1] = [np.nan, np.inf, 1.0][i // 6 % 3]  # NaN/Inf: compared alone
        cases.append((f"t{i}", o, t))
    big = rng.standard_normal(metrics.BATCH_MAX_ELEMENTS + 1).astype(np.float32)
    cases += [("big1", big, big * np.float32(1.0001)), ("big2", big, big + np.float32(1e-6)),
              ("f64a", np.ones(4), np.full(4, 1.5)), ("f64b", np.ones(4), np.ones(4)),
              ("ints", np.arange(4), np.arange(4) + 1), ("ints2", np.arange(4), np.arange(4)),
              ("seq", [np.ones(3, np.float32)], [np.zeros(3, np.float32)]), ("none", None, None),
              ("shape", np.ones((2, 2), np.float32), np.ones(4, np.float32)),
              ("dtype", np.ones(4, np.float32), np.ones(4, np.float16)), ("empty", np.ones(0, np.float32),
                                                                          np.ones(0, np.float32))]
    order = rng.permutation(len(cases))
    return [cases[i] for i in order]


@pytest.mark.parametrize("tol", [Tolerance(), Tolerance(atol=0.0, rtol=1e-3), Tolerance(atol=1e-3, rtol=0.0),
                                 Tolerance(min_cosine=0.9999999, per_output={"t7": (0.5, 0.0), "t11": (0.0, 0.0)}),
                                 Tolerance(quantized={"t1": 1e-3, "t7": 0.5, "t13": 0.0, "ints": 0.1}, int_atol=2)])
def test_compare_many_equals_compare_values_bit_for_bit(tol: Tolerance) -> None:
    # The layerwise probe's statistics come from compare_many in the target's worker; they must be the
    # very numbers compare_values gives for each tensor alone (JSON compared: NaN as "nan", -0.0 kept).
    cases = _batch_cases(np.random.default_rng(7))
    many = metrics.compare_many(cases, tol)
    assert [s.name for s in many] == [name for name, _, _ in cases]
    alone = [metrics.compare_values(name, o, t, tol) for name, o, t in cases]
    assert [json.dumps(s.to_json()) for s in many] == [json.dumps(s.to_json()) for s in alone]
    assert {s.kind for s in many} >= {MismatchKind.OK, MismatchKind.MISMATCH, MismatchKind.NAN, MismatchKind.SHAPE,
                                      MismatchKind.DTYPE}


def test_compare_many_batches_small_tensors_of_one_shape_in_bounded_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    rows: list[int] = []
    original = metrics._compare_rows

    def counting(items, *args):  # type: ignore[no-untyped-def]
        rows.append(len(items))
        return original(items, *args)

    monkeypatch.setattr(metrics, "_compare_rows", counting)
    monkeypatch.setattr(metrics, "_BATCH_ELEMENTS", 64 * 10)
    o = np.random.default_rng(0).standard_normal((25, 64)).astype(np.float32)
    stats = metrics.compare_many([(f"x{i}", o[i], o[i] + np.float32(1e-3)) for i in range(25)])
    assert rows == [10, 10, 5]  # 25 same-shape tensors, at most 640 elements a batch
    assert [s.mismatches for s in stats] == [metrics.compare_tensors("x", o[i], o[i] + np.float32(1e-3)).mismatches
                                             for i in range(25)]
