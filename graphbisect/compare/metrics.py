"""Comparators: oracle vs target tensors → a verdict and a score.

One pass over both tensors in fixed-size chunks computes every statistic, so comparing two memory-mapped
activations never copies them whole into RAM.

The **score** is the worst element's error measured in tolerances: ``max |t - o| / (atol + rtol·|o|)``.
``score <= 1`` is exactly ``numpy.allclose(t, o, rtol, atol)``; a score of 40 means "40 times over
tolerance". Because the rtol term follows each element's magnitude, a score keeps its meaning when the
comparison point moves from a final output to an intermediate tensor of another scale. ``rel_l2``
(‖t-o‖ / ‖o‖) is the scale-free error used to measure error amplification across nodes.

**Integers** compare exactly (indices, shapes, counts), except the *quantized* ones: a tensor on a
quantization grid (:mod:`graphbisect.compare.quantization` finds them and their step, the scale) is compared
in steps, ``int_atol`` of them allowed (default 1 LSB: a QuantizeLinear rounding a tie the other way is
rounding, 50 LSB is not), so its score is its worst error in LSB ÷ ``int_atol``; a float tensor on such a
grid (a DequantizeLinear's output) is allowed ``int_atol`` steps more absolute error.

``max_rel`` is ``max |t - o| / |o|`` over the elements where it means something: ``|o| > atol`` (below
that the absolute tolerance governs, and dividing by an oracle 0 gave "max rel 1e+300"). It is NaN
(shown ``-``) when the values differ only where the oracle is that small.
"""

from __future__ import annotations

import base64
import enum
import functools
import logging
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from graphbisect.compare.nonfinite import warn_masked_outputs
from graphbisect.errors import InputError
from graphbisect.storage.gcpause import gc_paused
from graphbisect.storage.values import comparable, is_exact
from graphbisect.text.printable import shown

__all__ = [
    "STATS_FIELDS",
    "Comparison",
    "MismatchKind",
    "TensorStats",
    "Tolerance",
    "check_tolerance_value",
    "compare_many",
    "compare_outputs",
    "compare_tensors",
    "compare_values",
    "comparison_of",
    "decade",
    "stats_columns",
    "stats_from_columns",
    "warn_vacuous_outputs",
]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 15  # elements per chunk: its float64 temporaries (256 KiB) stay in a core's cache (1 << 20: 1.6× slower)


class MismatchKind(str, enum.Enum):
    OK = "ok"
    MISMATCH = "mismatch"  # values differ beyond tolerance
    NAN = "nan"  # target has NaN/Inf where the oracle is finite: a failure of its own kind
    SHAPE = "shape"
    DTYPE = "dtype"
    MISSING = "missing"  # the target did not produce this tensor


@dataclass(frozen=True)
class Tolerance:
    """Comparison thresholds (numpy.allclose semantics) with optional per-tensor overrides.

    ``int_atol``: how many quantization steps (LSB) a quantized tensor may be off; ``quantized``: tensor → its
    quantization step (the scale; 0 when the scale is not known), filled from the model by the workflows
    (:func:`graphbisect.compare.quantization.with_quantization`). See the module docstring.

    Example:
        >>> tol = Tolerance(atol=1e-4, rtol=1e-3, per_output={"logits": (1e-2, 0.0)})
        >>> tol.for_tensor("logits"), tol.for_tensor("other")
        ((0.01, 0.0), (0.0001, 0.001))
    """

    atol: float = 1e-4
    rtol: float = 1e-3
    min_cosine: float | None = None
    per_output: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    check_dtype: bool = True
    int_atol: float = 1.0
    quantized: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A NaN tolerance makes every comparison pass (NaN comparisons are False) and an infinite one
        # accepts any value: either would certify a failing model as passing.
        # The hints name arguments: this is what the API checks (the CLI's argument types check its flags first).
        check_tolerance_value("atol", self.atol)
        check_tolerance_value("rtol", self.rtol)
        for name, (atol, rtol) in self.per_output.items():
            check_tolerance_value(f"atol of {name!r}", atol, f"per_output={{{name!r}: (1e-4, 1e-3)}}")
            check_tolerance_value(f"rtol of {name!r}", rtol, f"per_output={{{name!r}: (1e-4, 1e-3)}}")
        check_tolerance_value("int_atol", self.int_atol, "int_atol=1")
        for name, step in self.quantized.items():
            check_tolerance_value(f"quantization step of {name!r}", step, f"quantized={{{name!r}: 0.1}}")
        if self.min_cosine is not None and not -1.0 <= self.min_cosine <= 1.0:
            raise InputError(f"min_cosine {self.min_cosine!r} is not a cosine similarity",
                             hint="give a number between -1 and 1, e.g. min_cosine=0.999")

    def for_tensor(self, name: str) -> tuple[float, float]:
        return self.per_output.get(name, (self.atol, self.rtol))

    def bounds(self, name: str, exact: bool = False) -> tuple[float, float]:
        """``(atol, rtol)`` tensor ``name`` is compared with: ``exact`` for integer or boolean values, which
        compare exactly unless quantized (then ``int_atol`` steps); a float on a quantization grid gets
        ``int_atol`` steps more atol (see the module docstring).

        Example:
            >>> tol = Tolerance(int_atol=2, quantized={"q": 0.25, "dq": 0.25})
            >>> tol.bounds("q", exact=True), tol.bounds("idx", exact=True), tol.bounds("dq"), tol.bounds("f")
            ((2, 0.0), (0.0, 0.0), (0.5001, 0.001), (0.0001, 0.001))
        """
        if exact:
            return (self.int_atol, 0.0) if name in self.quantized else (0.0, 0.0)
        bounds = self.per_output.get(name, (self.atol, self.rtol))
        step = self.quantized.get(name) if self.quantized else None
        return (bounds[0] + self.int_atol * step, bounds[1]) if step else bounds

    def restricted(self, names: Iterable[str]) -> Tolerance:
        """This tolerance with the quantization steps of ``names`` only (a bundle's outputs: what it compares).

        Example:
            >>> Tolerance(quantized={"a": 0.1, "b": 0.2}).restricted(["b", "c"]).quantized
            {'b': 0.2}
        """
        wanted = set(names)
        return replace(self, quantized={k: v for k, v in self.quantized.items() if k in wanted})

    def to_json(self) -> dict[str, Any]:
        """JSON form, e.g. for a backend worker that compares against the oracle (:meth:`from_json`)."""
        return {"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine,
                "per_output": {name: list(pair) for name, pair in self.per_output.items()},
                "check_dtype": self.check_dtype, "int_atol": self.int_atol, "quantized": dict(self.quantized)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tolerance:
        """The tolerance :meth:`to_json` wrote.

        Example:
            >>> tol = Tolerance(atol=1e-3, per_output={"y": (0.5, 0.0)}, int_atol=2, quantized={"q": 0.1})
            >>> Tolerance.from_json(tol.to_json()) == tol
            True
        """
        return cls(atol=float(data["atol"]), rtol=float(data["rtol"]), min_cosine=data.get("min_cosine"),
                   per_output={str(name): (float(pair[0]), float(pair[1]))
                               for name, pair in dict(data.get("per_output") or {}).items()},
                   check_dtype=bool(data.get("check_dtype", True)), int_atol=float(data.get("int_atol", 1.0)),
                   quantized={str(name): float(step) for name, step in dict(data.get("quantized") or {}).items()})


def check_tolerance_value(what: str, value: float, example: str = "atol=1e-4, rtol=1e-3") -> None:
    """Raise :class:`InputError` unless ``value`` is a finite number ≥ 0 (a usable atol or rtol); ``example``
    is written as the caller's front end spells it (arguments for the API, flags for the CLI).

    Example:
        >>> check_tolerance_value("atol", -1)
        Traceback (most recent call last):
        ...
        graphbisect.errors.InputError: atol -1 is not a tolerance: it must be a finite number >= 0
          hint: e.g. atol=1e-4, rtol=1e-3 (NaN or inf would make every comparison pass)
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise InputError(f"{what} {value!r} is not a tolerance: it must be a finite number >= 0",
                         hint=f"e.g. {example} (NaN or inf would make every comparison pass)")


@dataclass(frozen=True)
class TensorStats:
    """How one target tensor compares with the oracle's."""

    name: str
    kind: MismatchKind
    numel: int = 0
    mismatches: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    mean_abs: float = 0.0
    rel_l2: float = 0.0
    cosine: float = 1.0
    snr_db: float = math.inf
    score: float = 0.0
    target_nonfinite: int = 0
    both_nonfinite: int = 0  # elements NaN/Inf on both sides (they match, so they say nothing)
    oracle_shape: tuple[int, ...] | None = None
    target_shape: tuple[int, ...] | None = None
    oracle_dtype: str | None = None
    target_dtype: str | None = None
    oracle_range: tuple[float, float] | None = None
    target_range: tuple[float, float] | None = None

    @property
    def passed(self) -> bool:
        return self.kind is MismatchKind.OK

    @property
    def masked(self) -> bool:
        """Every element is NaN/Inf on both sides: a pass that compared nothing."""
        return self.numel > 0 and self.both_nonfinite >= self.numel

    def to_json(self) -> dict[str, object]:
        """JSON-ready dict (infinities as strings, so the output is strict JSON), keys :data:`STATS_FIELDS`."""
        return dict(zip(STATS_FIELDS, self.to_row(), strict=True))

    def to_row(self) -> list[object]:
        """The values of :meth:`to_json` in the order of :data:`STATS_FIELDS`: how a worker sends thousands
        of statistics (one JSON list each, not an object repeating twenty keys; :meth:`from_row`)."""
        number = _json_number  # spelled out, not a loop over getattr: a probe writes thousands of these
        return [self.name, self.passed, self.kind.value, number(self.numel), number(self.mismatches),
                number(self.max_abs), number(self.max_rel), number(self.mean_abs), number(self.rel_l2),
                number(self.cosine), number(self.snr_db), number(self.score), number(self.target_nonfinite),
                number(self.both_nonfinite), number(self.oracle_shape), number(self.target_shape),
                number(self.oracle_dtype), number(self.target_dtype), number(self.oracle_range),
                number(self.target_range)]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorStats:
        """The statistics :meth:`to_json` wrote, exactly (JSON floats round-trip; ``"inf"``/``"nan"`` too).

        Example:
            >>> s = compare_tensors("y", np.ones(2, np.float32), np.array([1.0, np.inf], np.float32))
            >>> TensorStats.from_json(s.to_json()) == s, s.score
            (True, inf)
        """
        return cls.from_row([data.get(key) for key in STATS_FIELDS])

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> TensorStats:
        """The statistics :meth:`to_row` wrote, exactly.

        Example:
            >>> import json
            >>> s = compare_tensors("y", np.ones(2, np.float32), np.array([1.0, np.inf], np.float32))
            >>> TensorStats.from_row(json.loads(json.dumps(s.to_row()))) == s
            True
        """
        (name, _passed, kind, numel, mismatches, max_abs, max_rel, mean_abs, rel_l2, cosine, snr_db, score,
         target_nonfinite, both_nonfinite, oracle_shape, target_shape, oracle_dtype, target_dtype, oracle_range,
         target_range) = row
        # float("inf"), float("nan") read the strings back
        return cls(str(name), MismatchKind(kind), numel=int(numel), mismatches=int(mismatches),
                   max_abs=float(max_abs), max_rel=float(max_rel), mean_abs=float(mean_abs), rel_l2=float(rel_l2),
                   cosine=float(cosine), snr_db=float(snr_db), score=float(score),
                   target_nonfinite=int(target_nonfinite), both_nonfinite=int(both_nonfinite),
                   oracle_shape=_pair(oracle_shape, int), target_shape=_pair(target_shape, int),
                   oracle_dtype=oracle_dtype, target_dtype=target_dtype,
                   oracle_range=_pair(oracle_range, float), target_range=_pair(target_range, float))


def _made(**fields: Any) -> TensorStats:
    """``TensorStats(**fields)`` of all its fields, made without the frozen dataclass's ``__init__``, which sets
    each of the 19 fields through ``object.__setattr__``: ~3x faster, for the thousands of statistics of a
    layerwise probe (made in the target's worker, and again in this process from the columns it sends).

    Example:
        >>> import dataclasses
        >>> fields = {f.name: f.default for f in dataclasses.fields(TensorStats) if f.name not in ("name", "kind")}
        >>> _made(name="y", kind=MismatchKind.OK, **fields) == TensorStats("y", MismatchKind.OK)
        True
    """
    stats = _new_object(TensorStats)
    stats.__dict__.update(fields)
    return stats


_new_object = object.__new__

#: The keys of :meth:`TensorStats.to_json`, in order: the columns of :meth:`TensorStats.to_row`.
STATS_FIELDS = ("name", "passed", "kind", "numel", "mismatches", "max_abs", "max_rel", "mean_abs", "rel_l2", "cosine",
                "snr_db", "score", "target_nonfinite", "both_nonfinite", "oracle_shape", "target_shape",
                "oracle_dtype", "target_dtype", "oracle_range", "target_range")


def _pair(value: Any, kind: type) -> Any:
    return None if value is None else tuple(map(kind, value))


#: The counts and the measures of :class:`TensorStats`, as :func:`stats_columns` sends them: one int64 and one
#: float64 column each, in this order.
_COUNTS = ("numel", "mismatches", "target_nonfinite", "both_nonfinite")
_MEASURES = ("max_abs", "max_rel", "mean_abs", "rel_l2", "cosine", "snr_db", "score")
_COUNTS_OF, _MEASURES_OF = operator.attrgetter(*_COUNTS), operator.attrgetter(*_MEASURES)


def stats_columns(stats: Sequence[TensorStats]) -> dict[str, Any]:
    """``stats`` as JSON-ready columns, read back exactly by :func:`stats_from_columns`: how a worker sends
    the thousands of statistics of a layerwise probe. Names and kinds are lists; the counts, the measures and
    the value ranges are the little-endian bytes of one int64 or float64 array each, in base64 (exact,
    infinities and NaN included, and ~5x faster to send and read back than a JSON list of numbers per tensor:
    :meth:`TensorStats.to_row`). What describes a row besides (both shapes and dtypes, which ranges it has) is
    listed once per distinct value, each row giving its index (``form``): a probe's tensors share a few.

    Example:
        >>> import json
        >>> s = compare_tensors("y", np.ones(2, np.float32), np.array([1.0, np.inf], np.float32))
        >>> stats_from_columns(json.loads(json.dumps(stats_columns([s, s])))) == [s, s]
        True
    """
    def packed(rows: list[Any], dtype: str) -> str:
        return base64.b64encode(np.array(rows, dtype).tobytes()).decode("ascii")

    absent = (math.inf, -math.inf)  # no range: _range's lo > hi, flagged in the form too
    forms: dict[tuple[Any, ...], int] = {}
    index = [forms.setdefault((s.oracle_shape, s.target_shape, s.oracle_dtype, s.target_dtype,
                               s.oracle_range is not None, s.target_range is not None), len(forms)) for s in stats]
    return {
        "count": len(stats), "name": [s.name for s in stats], "kind": [s.kind.value for s in stats],
        "counts": packed(list(map(_COUNTS_OF, stats)), "<i8"),
        "measures": packed(list(map(_MEASURES_OF, stats)), "<f8"),
        "ranges": packed([[*(s.oracle_range or absent), *(s.target_range or absent)] for s in stats], "<f8"),
        "forms": list(forms), "form": packed(index, "<i4"),
    }


@gc_paused()
def stats_from_columns(columns: Mapping[str, Any]) -> list[TensorStats]:
    """The statistics :func:`stats_columns` wrote, exactly, in their order."""
    count = int(columns["count"])

    def unpacked(key: str, dtype: str, width: int) -> list[Any]:
        values = np.frombuffer(base64.b64decode(columns[key]), dtype)
        return values.reshape(count, width).tolist() if count else []

    def shape(dims: list[int] | None) -> tuple[int, ...] | None:
        return None if dims is None else tuple(dims)

    kinds = {kind.value: kind for kind in MismatchKind}
    forms = [(shape(o_shape), shape(t_shape), o_dtype, t_dtype, bool(o_ranged), bool(t_ranged))
             for o_shape, t_shape, o_dtype, t_dtype, o_ranged, t_ranged in columns["forms"]]
    stats = []
    for name, kind, counts, measures, ranges, (form,) in zip(
            columns["name"], columns["kind"], unpacked("counts", "<i8", len(_COUNTS)),
            unpacked("measures", "<f8", len(_MEASURES)), unpacked("ranges", "<f8", 4), unpacked("form", "<i4", 1),
            strict=True):
        numel, mismatches, target_nonfinite, both_nonfinite = counts
        max_abs, max_rel, mean_abs, rel_l2, cosine, snr_db, score = measures
        oracle_shape, target_shape, oracle_dtype, target_dtype, oracle_ranged, target_ranged = forms[form]
        stats.append(_made(
            name=str(name), kind=kinds[kind], numel=numel, mismatches=mismatches, max_abs=max_abs, max_rel=max_rel,
            mean_abs=mean_abs, rel_l2=rel_l2, cosine=cosine, snr_db=snr_db, score=score,
            target_nonfinite=target_nonfinite, both_nonfinite=both_nonfinite, oracle_shape=oracle_shape,
            target_shape=target_shape, oracle_dtype=oracle_dtype, target_dtype=target_dtype,
            oracle_range=(ranges[0], ranges[1]) if oracle_ranged else None,
            target_range=(ranges[2], ranges[3]) if target_ranged else None))
    return stats


@dataclass(frozen=True)
class Comparison:
    """The verdict over a set of outputs: passed only if every compared tensor passed."""

    outputs: tuple[TensorStats, ...]

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.outputs)

    @property
    def failing(self) -> tuple[TensorStats, ...]:
        return tuple(s for s in self.outputs if not s.passed)

    @property
    def worst(self) -> TensorStats | None:
        """The failing output with the highest score (or the highest-scoring output if all pass)."""
        pool = self.failing or self.outputs
        return max(pool, key=_severity, default=None)


def _severity(stats: TensorStats) -> tuple[int, float]:
    # Structural failures (missing, shape, dtype, NaN) outrank any finite score.
    rank = {MismatchKind.OK: 0, MismatchKind.MISMATCH: 1, MismatchKind.NAN: 2, MismatchKind.DTYPE: 3,
            MismatchKind.SHAPE: 4, MismatchKind.MISSING: 5}[stats.kind]
    return rank, stats.score


def _json_number(value: object) -> object:
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, tuple):
        return [_json_number(v) for v in value]
    return value


#: The units of _Accumulator's sums of products: values scaled by 2**-exp, exp a multiple of _EXP_STEP up to
#: _MAX_EXP (the largest float64, ~2**1024, scaled by 2**-768 squares to 2**512: room for any element count).
_EXP_STEP, _MAX_EXP = 256, 768


class _Accumulator:
    """Running sums over chunks; the final stats never depend on the chunk size."""

    def __init__(self, atol: float, rtol: float) -> None:
        self.atol, self.rtol = atol, rtol
        self.mismatches = self.nonfinite = self.numel = self.both_nonfinite = 0
        self.max_abs = self.max_rel = self.score = 0.0
        self.rel_undefined = False  # some error lies only where |oracle| <= atol (no meaningful relative error)
        self.sum_abs = self.err_sq = self.dot = self.o_sq = self.t_sq = 0.0
        self.exp = 0  # err_sq, dot, o_sq and t_sq are sums of products of values scaled by 2**-exp (_add_product)
        self.o_min = self.t_min = math.inf
        self.o_max = self.t_max = -math.inf

    def add(self, o: np.ndarray, t: np.ndarray) -> None:
        # 64-bit integers above 2**53 collide as float64 (3**39 and 3**39 - 11 are one double): their error is
        # measured on the integers themselves, before widening, or distinct values would compare equal.
        distance = _integer_distance(o, t)
        o, t = _wide(o), _wide(t)
        self.numel += o.size
        if o.size == 0:
            return
        if distance is not None:  # integers are always finite
            self._add_finite(o, t, distance)
            self._add_range(o, "o")
            self._add_range(t, "t")
            return
        if o.dtype.kind != "c" and t.dtype.kind != "c":
            # The ranges are needed anyway, and NaN or an infinity makes one end non-finite: the common all-finite
            # case is told apart without another pass (or a mask).
            ends = (float(o.min()), float(o.max()), float(t.min()), float(t.max()))
            if all(math.isfinite(end) for end in ends):
                self._add_finite(o, t)
                self.o_min, self.o_max = min(self.o_min, ends[0]), max(self.o_max, ends[1])
                self.t_min, self.t_max = min(self.t_min, ends[2]), max(self.t_max, ends[3])
                return
        # A float64 sum of float values is finite exactly when every value is (no float32/16 value can overflow
        # it): the complex case's one pass per tensor instead of two masks.
        elif _finite_sum(o) and _finite_sum(t):
            self._add_finite(o, t)
            self._add_range(o, "o")
            self._add_range(t, "t")
            return
        o_fin, t_fin = np.isfinite(o), np.isfinite(t)
        self._add_with_nonfinite(o, t, o_fin, t_fin)
        self._add_range(o[o_fin], "o")
        self._add_range(t[t_fin], "t")

    def add_identical(self, o: np.ndarray) -> None:
        """A chunk where the target equals the oracle bit for bit: no error, only ranges and norms."""
        self.numel += o.size
        if o.size == 0:
            return
        o = _wide(o)
        if not _finite_sum(o):
            finite = np.isfinite(o)
            self.both_nonfinite += int(o.size - np.count_nonzero(finite))
            o = o[finite]
        norm = _dot(o, o)
        if self.exp == 0 and math.isfinite(self.o_sq + self.t_sq + 2 * norm) and math.isfinite(self.dot + norm):
            self.o_sq += norm
            self.t_sq += norm
            self.dot += norm
        else:
            self._add_norms(o, o)
        self._add_range(o, "o")
        self._add_range(o, "t")

    def _add_finite(self, o: np.ndarray, t: np.ndarray, diff: np.ndarray | None = None) -> None:
        """The common case: every value finite, so no masking is needed; ``diff``: ``|t - o|`` when measured
        already (:func:`_integer_distance`)."""
        if diff is None:
            diff = np.subtract(t, o)
            diff = np.abs(diff, out=diff) if diff.dtype.kind == "f" else np.abs(diff)  # complex: |t - o|, a float
        magnitude = np.abs(o)
        allowed = magnitude * self.rtol
        allowed += self.atol
        self._add_errors(diff, magnitude, allowed)
        self._add_norms(o, t)

    def _add_with_nonfinite(self, o: np.ndarray, t: np.ndarray, o_fin: np.ndarray, t_fin: np.ndarray) -> None:
        # Target NaN/Inf where the oracle is finite is the NaN kind; equal non-finite values match.
        self.nonfinite += int((~t_fin & o_fin).sum())
        both = o_fin & t_fin
        same_nonfinite = ~o_fin & ~t_fin & ((o == t) | (np.isnan(o) & np.isnan(t)))
        self.both_nonfinite += int(np.count_nonzero(same_nonfinite))
        unmatched = ~both & ~same_nonfinite
        ob, tb = np.where(both, o, 0.0), np.where(both, t, 0.0)
        diff = np.abs(tb - ob)
        magnitude = np.abs(ob)
        self._add_errors(diff, magnitude, self.atol + self.rtol * magnitude)
        self.mismatches += int(unmatched.sum())
        if unmatched.any():
            self.score = math.inf
        self._add_norms(ob, tb)

    def _add_errors(self, diff: np.ndarray, magnitude: np.ndarray, allowed: np.ndarray) -> None:
        """Error statistics of one chunk; ``magnitude`` (|oracle|) is consumed as scratch space."""
        chunk_max = float(diff.max())
        if chunk_max == 0.0:
            return  # identical values: no error, and every statistic below would add 0
        overflowed = math.isinf(chunk_max)  # t - o beyond float64 for finite values: past any tolerance
        beyond = (diff > allowed) | np.isinf(diff) if overflowed else diff > allowed
        self.mismatches += int(np.count_nonzero(beyond))
        self.max_abs = max(self.max_abs, chunk_max)
        self.sum_abs += float(diff.sum())
        self._add_product("err_sq", diff, diff)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            self._add_relative(diff, magnitude)
            # Where diff is 0 both ratios are 0 (0/positive), so no mask is needed except for allowed == 0.
            if self.atol > 0:
                np.divide(diff, allowed, out=allowed)
                ratio = allowed
            else:
                ratio = np.where(allowed > 0, diff / allowed, np.where(diff > 0, math.inf, 0.0))
        self.score = math.inf if overflowed else max(self.score, float(ratio.max()))

    def _add_relative(self, diff: np.ndarray, magnitude: np.ndarray) -> None:
        """The relative error of one chunk where ``|oracle| > atol`` (``max_rel``), and whether some error lies
        where it is not (``rel_undefined``); ``magnitude`` is consumed as scratch space.

        By ufuncs masked with ``where=``, not by selecting elements (numpy's masked indexing cost ~4× the
        arithmetic), and unmasked where every element is meaningful (most chunks): the ratios are ``diff /
        magnitude`` where meaningful, the largest of them is the chunk's; an infinite ``diff`` (``t - o`` beyond
        float64) gives an infinite ratio. Against the 0/1 weight it replaces (two float ``count_nonzero`` and four
        more passes a chunk): PP-OCRv4 det's 44 M activations compare in 0.385 s instead of 0.41 s.
        """
        meaningful = magnitude > max(self.atol, np.finfo(np.float64).tiny)
        if meaningful.all():
            self.max_rel = max(self.max_rel, float(np.divide(diff, magnitude, out=magnitude).max()))
            return
        if not self.rel_undefined and bool(np.greater(diff > 0.0, meaningful).any()):  # an error, not meaningful
            self.rel_undefined = True
        if meaningful.any():
            np.divide(diff, magnitude, out=magnitude, where=meaningful)
            self.max_rel = max(self.max_rel, float(np.max(magnitude, where=meaningful, initial=0.0)))

    def _add_norms(self, o: np.ndarray, t: np.ndarray) -> None:
        """Add ``<o, t>``, ``<o, o>`` and ``<t, t>`` (one inline check in the common case: no overflow)."""
        dot, o_sq, t_sq = self.dot + _dot(o, t), self.o_sq + _dot(o, o), self.t_sq + _dot(t, t)
        if self.exp == 0 and math.isfinite(o_sq + t_sq) and math.isfinite(dot):
            self.dot, self.o_sq, self.t_sq = dot, o_sq, t_sq
            return
        self._add_product("dot", o, t)
        self._add_product("o_sq", o, o)
        self._add_product("t_sq", t, t)

    def _add_product(self, field: str, a: np.ndarray, b: np.ndarray) -> None:
        """Add ``<a, b>`` to the running sum ``field``, in the unit all four sums share.

        float64 values above ~1e154 have squares (or sums of squares) beyond float64: an inf sum made the
        cosine of two equal tensors of values near 1e100 0 ("mismatch" under --min-cosine) and inf/inf NaN.
        On overflow every sum moves to a coarser unit (values scaled by a power of two, exact) and the
        chunk is summed again; ratios (cosine, relative L2, SNR) do not depend on the unit.
        """
        while True:
            scale = 2.0 ** -self.exp
            value = _dot(a, b) if self.exp == 0 else _dot(a * scale, b * scale)
            total = getattr(self, field) + value
            if math.isfinite(total) or self.exp >= _MAX_EXP:  # an inf difference (t - o overflowed) stays inf
                setattr(self, field, total)
                return
            factor = 2.0 ** (-2 * _EXP_STEP)
            self.err_sq, self.dot = self.err_sq * factor, self.dot * factor
            self.o_sq, self.t_sq = self.o_sq * factor, self.t_sq * factor
            self.exp += _EXP_STEP

    def _add_range(self, finite: np.ndarray, which: str) -> None:
        if finite.dtype.kind == "c":
            finite = np.abs(finite)  # a complex tensor's range is that of its elements' magnitudes
        if finite.size:
            setattr(self, f"{which}_min", min(getattr(self, f"{which}_min"), float(finite.min())))
            setattr(self, f"{which}_max", max(getattr(self, f"{which}_max"), float(finite.max())))

    def cosine(self) -> float:
        if self.o_sq == 0.0 and self.t_sq == 0.0:
            return 1.0
        if self.o_sq == 0.0 or self.t_sq == 0.0:
            return 0.0
        return max(-1.0, min(1.0, self.dot / (math.sqrt(self.o_sq) * math.sqrt(self.t_sq))))  # rounding past ±1

    def snr_db(self) -> float:
        if self.err_sq == 0.0:
            return math.inf
        if self.o_sq == 0.0 or math.isinf(self.err_sq):
            return -math.inf
        return 10.0 * math.log10(self.o_sq / self.err_sq)

    def rel_l2(self) -> float:
        if self.err_sq == 0.0:
            return 0.0
        return math.sqrt(self.err_sq) / math.sqrt(self.o_sq) if self.o_sq > 0 else math.inf


def _integer_distance(o: np.ndarray, t: np.ndarray) -> np.ndarray | None:
    """``|t - o|`` as float64, computed exactly, for two 64-bit integer arrays of one type; None otherwise.

    Nonzero wherever the integers differ, which their float64 values need not be above 2**53. The difference
    is taken modulo 2**64 on the unsigned bits of the larger minus the smaller: the true distance lies in
    [0, 2**64), so it is exact even from INT64_MIN to INT64_MAX.

    >>> big = np.array([3**39, 5], np.int64)
    >>> _integer_distance(big, big - np.array([11, 0], np.int64)).tolist()
    [11.0, 0.0]
    """
    if o.dtype != t.dtype or o.dtype.kind not in "iu" or o.dtype.itemsize < 8:
        return None
    bits = np.dtype(f"u{o.dtype.itemsize}")
    distance = np.maximum(o, t).view(bits) - np.minimum(o, t).view(bits)
    return distance.astype(np.float64)


def _wide(values: np.ndarray) -> np.ndarray:
    """``values`` as float64, or complex128 for complex ones (never dropping an imaginary part)."""
    return values.astype(np.complex128 if values.dtype.kind == "c" else np.float64, copy=False)


def _finite_sum(values: np.ndarray) -> bool:
    """Whether the sum of ``values`` (float64 or complex128) is finite: exactly when every value is.

    inf + -inf is nan by design here (a non-finite value found), not a warning for the user.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        total = values.sum()
    return math.isfinite(total.real) and math.isfinite(total.imag)


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """Re <a, b>: the dot product of real tensors, and of complex ones as vectors of (real, imag) pairs.

    Summed by numpy's own loop (``einsum``), not by BLAS (``np.dot``/``np.vdot``): a multi-threaded BLAS
    (OpenBLAS, numpy's default) splits a dot product of more than a few thousand elements over its threads,
    which then busy-wait for the next call. Between comparisons that spinning burns a core the target's
    worker needs: on PP-OCRv4 rec int8 (one 53,000-element output per candidate) it was 70 of the ~100 ms of
    this process's CPU per candidate (benchmarks/README.md, issue 14).

    >>> _dot(np.array([1.0, 2.0]), np.array([3.0, 4.0])), _dot(np.array([1 + 2j]), np.array([3 + 4j]))
    (11.0, 11.0)
    """
    if a.dtype.kind == "c" or b.dtype.kind == "c":
        return _dot(a.real, b.real) + _dot(np.imag(a), np.imag(b))
    return float(np.einsum("i,i->", a.reshape(-1), b.reshape(-1)))


@functools.lru_cache(maxsize=256)
def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, remembered: numpy computes it in Python (~8 µs), once per tensor compared."""
    return str(dtype)


def _range(lo: float, hi: float) -> tuple[float, float] | None:
    return None if lo > hi else (lo, hi)


def compare_tensors(name: str, oracle: Any, target: Any,
                    tol: Tolerance | None = None) -> TensorStats:
    """Compare one target tensor with the oracle's.

    Example:
        >>> o = np.array([1.0, 2.0, 3.0], np.float32)
        >>> s = compare_tensors("y", o, o + np.float32(0.5))
        >>> s.kind.value, s.mismatches, round(s.max_abs, 3)
        ('mismatch', 3, 0.5)
        >>> compare_tensors("y", o, o.copy()).passed
        True
    """
    tol = tol or Tolerance()
    if target is None or oracle is None:
        return TensorStats(name, MismatchKind.MISSING, score=math.inf, oracle_shape=_length(oracle))
    o, t = np.asarray(oracle), np.asarray(target)
    shapes = {"oracle_shape": tuple(o.shape), "target_shape": tuple(t.shape),
              "oracle_dtype": _dtype_name(o.dtype), "target_dtype": _dtype_name(t.dtype)}
    if o.shape != t.shape:
        return TensorStats(name, MismatchKind.SHAPE, numel=int(o.size), mismatches=int(o.size),
                           score=math.inf, **shapes)  # type: ignore[arg-type]
    if tol.check_dtype and o.dtype != t.dtype:
        return TensorStats(name, MismatchKind.DTYPE, numel=int(o.size), score=math.inf,
                           **shapes)  # type: ignore[arg-type]
    if o.dtype.kind in "OUS" or t.dtype.kind in "OUS":
        return _compare_strings(name, o, t, shapes)
    # integers of every width (int4 too) and booleans are exact, unless quantized: then in steps (Tolerance.bounds)
    atol, rtol = tol.bounds(name, exact=is_exact(o) and is_exact(t))
    # bfloat16/float8 (ml_dtypes) compare as float32; complex stays complex: one element is one complex number,
    # |t - o| <= atol + rtol * |o| on its modulus (numpy.allclose), and counts and indices are per element
    same_dtype = o.dtype == t.dtype
    # (a complex tensor against a real one, check_dtype=False: only the real side is made comparable)
    o, t = (x if x.dtype.kind == "c" else comparable(x) for x in (o, t))
    acc = _Accumulator(atol, rtol)
    flat_o, flat_t = o.reshape(-1), t.reshape(-1)
    for start in range(0, max(flat_o.size, 1), _CHUNK):
        chunk_o, chunk_t = flat_o[start:start + _CHUNK], flat_t[start:start + _CHUNK]
        # Bit-identical chunks are the norm when comparing two builds of one runtime: one cheap pass.
        if same_dtype and chunk_o.tobytes() == chunk_t.tobytes():
            acc.add_identical(chunk_o)
        else:
            with np.errstate(over="ignore"):  # t - o past float64 is counted as a mismatch, not a warning
                acc.add(chunk_o, chunk_t)
    return _stats(name, acc, tol, shapes)


def _stats(name: str, acc: _Accumulator, tol: Tolerance, shapes: Mapping[str, object]) -> TensorStats:
    """The statistics of one tensor from its accumulated sums."""
    cosine = acc.cosine()
    if acc.nonfinite:
        kind = MismatchKind.NAN
    elif acc.mismatches or (tol.min_cosine is not None and cosine < tol.min_cosine):
        kind = MismatchKind.MISMATCH
    else:
        kind = MismatchKind.OK
    max_rel = math.nan if acc.rel_undefined and acc.max_rel == 0.0 else acc.max_rel
    return TensorStats(
        name, kind, numel=acc.numel, mismatches=acc.mismatches, max_abs=acc.max_abs, max_rel=max_rel,
        mean_abs=acc.sum_abs / acc.numel if acc.numel else 0.0, rel_l2=acc.rel_l2(), cosine=cosine,
        snr_db=acc.snr_db(), score=acc.score, target_nonfinite=acc.nonfinite, both_nonfinite=acc.both_nonfinite,
        oracle_range=_range(acc.o_min, acc.o_max), target_range=_range(acc.t_min, acc.t_max),
        **shapes,  # type: ignore[arg-type]
    )


#: Tensors of at most this many elements may be compared in one batch (:func:`compare_many`): up to numpy's
#: iterator buffer size, a row of a batched ``einsum`` is summed exactly as the tensor alone is (above it
#: the buffered rows are summed in another order, and the last bits of a dot product can differ).
BATCH_MAX_ELEMENTS = 8192
#: The element types a batch compares: every value of float16/float32 is a float64 and a sum of at most
#: ``BATCH_MAX_ELEMENTS`` of them cannot overflow, so "the sum is finite" is "every value is".
_BATCH_TYPES = (np.float16, np.float32)
#: Elements of one batch (a few MB of float64 temporaries, like ``_CHUNK``).
_BATCH_ELEMENTS = 1 << 18


@gc_paused()
def compare_many(items: Iterable[tuple[str, Any, Any]], tol: Tolerance | None = None) -> list[TensorStats]:
    """:func:`compare_values` of each ``(name, oracle, target)``, in order, with the very same results.

    Why: a layerwise probe compares thousands of small tensors, where numpy's per-call overhead, not the
    arithmetic, is the cost (~60 µs a tensor). Finite float16/float32 tensors of one shape, type and
    tolerance, up to :data:`BATCH_MAX_ELEMENTS` elements, are stacked and reduced row by row: every
    statistic is computed with the same numpy operation on the same values as :func:`compare_tensors`
    does (sums and dot products on a contiguous row of that size add in the same order), so each row's
    statistics are bit-identical to comparing the tensor alone. Anything else (other types, a NaN or Inf,
    larger tensors, sequences) is compared alone.

    Example:
        >>> o = np.zeros((3, 4), np.float32)
        >>> [s.kind.value for s in compare_many([("a", o[0], o[0]), ("b", o[1], o[1] + 1), ("c", [o], [o])])]
        ['ok', 'mismatch', 'ok']
    """
    tol = tol or Tolerance()
    items = list(items)
    results: list[TensorStats | None] = [None] * len(items)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, (name, oracle, target) in enumerate(items):
        if _batchable(oracle, target):
            groups.setdefault((oracle.shape, oracle.dtype, tol.bounds(name)), []).append(index)
        else:
            results[index] = compare_values(name, oracle, target, tol)
    for (shape, _dtype, (atol, rtol)), members in groups.items():
        if len(members) == 1:
            index = members[0]
            results[index] = compare_values(*items[index], tol)
            continue
        rows = max(1, _BATCH_ELEMENTS // math.prod(shape))  # bounds the temporaries, as _CHUNK does
        for start in range(0, len(members), rows):
            batch = members[start:start + rows]
            for index, stats in zip(batch, _compare_rows([items[i] for i in batch], atol, rtol, tol), strict=True):
                results[index] = stats
    return [s for s in results if s is not None]


def _batchable(oracle: Any, target: Any) -> bool:
    return (isinstance(oracle, np.ndarray) and isinstance(target, np.ndarray) and oracle.dtype == target.dtype
            and oracle.dtype.type in _BATCH_TYPES and oracle.shape == target.shape
            and 0 < oracle.size <= BATCH_MAX_ELEMENTS)


def _compare_rows(items: list[tuple[str, Any, Any]], atol: float, rtol: float, tol: Tolerance) -> list[TensorStats]:
    """:func:`compare_tensors` of same-shape, same-type float tensors, as the rows of one array each side:
    the operations of ``_Accumulator.add`` (its finite case) and ``add_identical``, one numpy call per
    statistic for all rows (:func:`_row_statistics`), and the final measures of ``_Accumulator`` and
    :func:`_stats` (cosine, relative L2, SNR, the kind) by the same float64 operations on each row's values
    (:func:`_row_measures`): no accumulator per row."""
    raw_o = np.stack([np.asarray(o).reshape(-1) for _, o, _ in items])
    raw_t = np.stack([np.asarray(t).reshape(-1) for _, _, t in items])
    bits = np.dtype(f"u{raw_o.dtype.itemsize}")
    identical = (raw_o.view(bits) == raw_t.view(bits)).all(axis=1)  # what compare_tensors' tobytes() tells
    o = _wide(raw_o)
    finite = (np.isfinite(o).all(axis=1) & np.isfinite(_wide(raw_t)).all(axis=1)).tolist()
    numel = int(raw_o.shape[1])
    rows = _row_measures(_rows_by_kind(o, raw_t, identical, atol, rtol), numel, tol)
    dtype = _dtype_name(raw_o.dtype)
    shape = tuple(np.shape(items[0][1]))
    kinds = (MismatchKind.OK, MismatchKind.MISMATCH)
    stats = []
    for (name, oracle, target), row_finite, measured in zip(items, finite, rows, strict=True):
        if not row_finite:  # NaN/Inf: the masked path, as compare_tensors takes it
            stats.append(compare_values(name, oracle, target, tol))
            continue
        (mismatched, mismatches, max_abs, max_rel, mean_abs, rel_l2, cosine, snr_db, score,
         o_min, o_max, t_min, t_max) = measured
        stats.append(_made(
            name=name, kind=kinds[mismatched], numel=numel, mismatches=mismatches, max_abs=max_abs, max_rel=max_rel,
            mean_abs=mean_abs, rel_l2=rel_l2, cosine=cosine, snr_db=snr_db, score=score, target_nonfinite=0,
            both_nonfinite=0, oracle_shape=shape, target_shape=shape, oracle_dtype=dtype, target_dtype=dtype,
            oracle_range=(o_min, o_max), target_range=(t_min, t_max)))
    return stats


def _rows_by_kind(o: np.ndarray, raw_t: np.ndarray, identical: np.ndarray, atol: float, rtol: float
                  ) -> dict[str, np.ndarray]:
    """:func:`_row_statistics` of every row, each statistic an array over the rows: of the rows that differ
    as it computes them, of the identical ones what ``add_identical`` adds (``o_sq``, also as ``t_sq`` and
    ``dot``, and the oracle's range as both ranges; the errors 0). A row's values are those of the same numpy
    operation on the same contiguous row, whichever rows are reduced with it."""
    same, differ = np.flatnonzero(identical), np.flatnonzero(~identical)
    found: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
    if len(same):
        kept = o if len(same) == len(o) else o[same]
        norm, low, high = np.einsum("ij,ij->i", kept, kept), kept.min(axis=1), kept.max(axis=1)
        found.append((same, {"o_sq": norm, "t_sq": norm, "dot": norm, "o_min": low, "o_max": high,
                             "t_min": low, "t_max": high}))
    if len(differ):
        whole = len(differ) == len(o)
        found.append((differ, _row_statistics(o if whole else o[differ], _wide(raw_t if whole else raw_t[differ]),
                                              atol, rtol)))
    columns: dict[str, np.ndarray] = {}
    for indices, statistics in found:
        for key, values in statistics.items():
            column = columns.setdefault(key, np.zeros(len(o), values.dtype))
            column[indices] = values
    for key in ("mismatches", "max_abs", "sum_abs", "err_sq", "max_rel", "rel_undefined", "score"):
        columns.setdefault(key, np.zeros(len(o), bool if key == "rel_undefined" else np.float64))
    return columns


def _row_measures(rows: Mapping[str, np.ndarray], numel: int, tol: Tolerance) -> list[tuple[Any, ...]]:
    """Per row: (mismatched, mismatches, max_abs, max_rel, mean_abs, rel_l2, cosine, snr_db, score, o_min,
    o_max, t_min, t_max), each what :func:`_stats` makes of an ``_Accumulator`` holding that row's statistics
    (:func:`_rows_by_kind`): the same IEEE operations (``+ - * / sqrt`` in numpy and in Python round alike),
    and the logarithm of the SNR by :func:`math.log10`, as ``_Accumulator.snr_db`` takes it."""
    o_sq, t_sq, dot, err_sq = rows["o_sq"], rows["t_sq"], rows["dot"], rows["err_sq"]
    with np.errstate(divide="ignore", invalid="ignore"):
        root_o = np.sqrt(o_sq)
        cosine = np.where((o_sq == 0.0) & (t_sq == 0.0), 1.0,
                          np.where((o_sq == 0.0) | (t_sq == 0.0), 0.0,
                                   np.clip(dot / (root_o * np.sqrt(t_sq)), -1.0, 1.0)))  # rounding past ±1
        rel_l2 = np.where(err_sq == 0.0, 0.0, np.where(o_sq > 0, np.sqrt(err_sq) / root_o, math.inf))
        ratio = o_sq / err_sq
    snr = [math.inf if e == 0.0 else -math.inf if q == 0.0 or math.isinf(e) else 10.0 * math.log10(r)
           for q, e, r in zip(o_sq.tolist(), err_sq.tolist(), ratio.tolist(), strict=True)]
    mismatches = rows["mismatches"]
    mismatched = mismatches > 0
    if tol.min_cosine is not None:
        mismatched |= cosine < tol.min_cosine
    max_rel = rows["max_rel"]
    max_rel = np.where(rows["rel_undefined"] & (max_rel == 0.0), math.nan, max_rel)
    return list(zip(mismatched.astype(np.int8).tolist(), mismatches.astype(np.int64).tolist(),
                    rows["max_abs"].tolist(), max_rel.tolist(), (rows["sum_abs"] / numel).tolist(),
                    rel_l2.tolist(), cosine.tolist(), snr, rows["score"].tolist(), rows["o_min"].tolist(),
                    rows["o_max"].tolist(), rows["t_min"].tolist(), rows["t_max"].tolist(), strict=True))


def _row_statistics(o: np.ndarray, t: np.ndarray, atol: float, rtol: float) -> dict[str, np.ndarray]:
    """Per row of float64 ``o`` and ``t`` (finite rows; others are compared alone): what ``_add_finite``,
    ``_add_errors`` and ``_add_range`` compute for one tensor, by the same numpy operations."""
    diff = np.subtract(t, o)
    diff = np.abs(diff, out=diff)
    magnitude = np.abs(o)
    allowed = magnitude * rtol
    allowed += atol
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        meaningful = magnitude > max(atol, np.finfo(np.float64).tiny)
        ratio = diff / allowed if atol > 0 else np.where(allowed > 0, diff / allowed, np.where(diff > 0, math.inf, 0.0))
        return {
            "max_abs": diff.max(axis=1), "mismatches": np.count_nonzero(diff > allowed, axis=1),
            "sum_abs": diff.sum(axis=1), "err_sq": np.einsum("ij,ij->i", diff, diff),
            "max_rel": np.where(meaningful, diff / magnitude, 0.0).max(axis=1),
            "rel_undefined": ((diff > 0.0) & ~meaningful).any(axis=1), "score": ratio.max(axis=1),
            "dot": np.einsum("ij,ij->i", o, t), "o_sq": np.einsum("ij,ij->i", o, o),
            "t_sq": np.einsum("ij,ij->i", t, t),
            "o_min": o.min(axis=1), "o_max": o.max(axis=1), "t_min": t.min(axis=1), "t_max": t.max(axis=1),
        }


def _compare_strings(name: str, o: np.ndarray, t: np.ndarray, shapes: Mapping[str, object]) -> TensorStats:
    """String tensors compare exactly, element by element."""
    differ = int(np.count_nonzero(o.astype(object) != t.astype(object)))
    return TensorStats(name, MismatchKind.MISMATCH if differ else MismatchKind.OK, numel=int(o.size),
                       mismatches=differ, score=math.inf if differ else 0.0, **shapes)  # type: ignore[arg-type]


def compare_values(name: str, oracle: Any, target: Any, tol: Tolerance | None = None) -> TensorStats:
    """Compare any ONNX values (:mod:`graphbisect.storage.values`): tensors, sequences (lists, item by item, folded
    into one row) and optionals (``None`` is an empty optional: it equals only another empty one).

    Example:
        >>> compare_values("s", [np.zeros(2), np.ones(1)], [np.zeros(2), np.ones(1)]).passed
        True
        >>> compare_values("s", [np.zeros(2)], [np.zeros(2), np.ones(1)]).kind.value
        'shape'
    """
    if isinstance(oracle, (list, tuple)) or isinstance(target, (list, tuple)):
        if not (isinstance(oracle, (list, tuple)) and isinstance(target, (list, tuple))) \
                or len(oracle) != len(target):
            return TensorStats(name, MismatchKind.SHAPE, score=math.inf, oracle_shape=_length(oracle),
                               target_shape=_length(target))
        items = [compare_values(f"{name}[{i}]", o, t, tol) for i, (o, t) in enumerate(zip(oracle, target,
                                                                                            strict=True))]
        return _fold(name, items, len(oracle))
    if oracle is None or target is None:
        if oracle is None and target is None:
            return TensorStats(name, MismatchKind.OK)
        return TensorStats(name, MismatchKind.SHAPE, score=math.inf,
                           oracle_shape=None if oracle is None else tuple(np.shape(oracle)),
                           target_shape=None if target is None else tuple(np.shape(target)))
    return compare_tensors(name, oracle, target, tol)


def _length(value: Any) -> tuple[int, ...] | None:
    return (len(value),) if isinstance(value, (list, tuple)) else None if value is None else tuple(np.shape(value))


def _fold(name: str, items: list[TensorStats], length: int) -> TensorStats:
    """One row for a sequence: its worst item's kind and score, counts summed, errors maximized."""
    if not items:
        return TensorStats(name, MismatchKind.OK, oracle_shape=(0,), target_shape=(0,))
    worst = max(items, key=_severity)
    return TensorStats(
        name, worst.kind, numel=sum(s.numel for s in items), mismatches=sum(s.mismatches for s in items),
        max_abs=max(s.max_abs for s in items), max_rel=max(s.max_rel for s in items),
        mean_abs=worst.mean_abs, rel_l2=max(s.rel_l2 for s in items), cosine=min(s.cosine for s in items),
        snr_db=min(s.snr_db for s in items), score=worst.score,
        target_nonfinite=sum(s.target_nonfinite for s in items), oracle_shape=(length,), target_shape=(length,),
        oracle_dtype=_sequence_of(worst.oracle_dtype), target_dtype=_sequence_of(worst.target_dtype),
        oracle_range=_span(s.oracle_range for s in items), target_range=_span(s.target_range for s in items))


def _sequence_of(dtype: str | None) -> str:
    return f"sequence({dtype})" if dtype else "sequence"


def _span(ranges: Iterable[tuple[float, float] | None]) -> tuple[float, float] | None:
    known = [r for r in ranges if r is not None]
    return (min(r[0] for r in known), max(r[1] for r in known)) if known else None


def compare_outputs(oracle: Mapping[str, Any], target: Mapping[str, Any],
                    tol: Tolerance | None = None, names: Iterable[str] | None = None) -> Comparison:
    """Compare the named values (default: every oracle value) of two runs; a name absent from a run is
    ``missing`` (a value of ``None`` is an empty optional).

    Example:
        >>> a = {"y": np.zeros(3, np.float32)}
        >>> compare_outputs(a, {"y": np.full(3, np.nan, np.float32)}).worst.kind.value
        'nan'
    """
    keys = list(oracle) if names is None else list(names)
    return comparison_of((compare_values(k, oracle[k], target[k], tol) if k in oracle and k in target
                          else compare_tensors(k, oracle.get(k) if k in oracle else None, None, tol) for k in keys),
                         tol)


def comparison_of(stats: Iterable[TensorStats], tol: Tolerance | None = None) -> Comparison:
    """The verdict over statistics already measured (e.g. by a backend worker against the oracle's store,
    ``compare_to_store``), with the warnings :func:`compare_outputs` gives.

    Example:
        >>> comparison_of([compare_tensors("y", np.zeros(2), np.ones(2))]).passed
        False
    """
    comparison = Comparison(tuple(stats))
    warn_masked_outputs(comparison.outputs)
    warn_vacuous_outputs(comparison.outputs, tol or Tolerance())
    return comparison


_vacuous_warned: set[str] = set()


def warn_vacuous_outputs(stats: Iterable[TensorStats], tol: Tolerance) -> list[str]:
    """Warn (once per process and message) about float outputs whose every oracle value lies within the
    absolute tolerance of 0: the check then only asks the target for values near 0, so almost anything
    passes (a random-weight model with outputs around 1e-7 passes at atol 1e-4 whatever it computes).
    Returns the warnings."""
    messages: list[str] = []
    for s in stats:
        atol, _rtol = tol.for_tensor(s.name)
        exact = s.oracle_dtype is not None and (s.oracle_dtype == "bool" or s.oracle_dtype.startswith(("int", "uint")))
        if atol <= 0 or exact or s.oracle_range is None or not s.numel:
            continue
        largest = max(abs(s.oracle_range[0]), abs(s.oracle_range[1]))
        if largest <= atol:
            messages.append(
                f"output {s.name!r}: every oracle value is within atol of 0 (largest |value| {largest:.3g} <= atol "
                f"{atol:g}), so the check passes almost whatever the target computes there; lower --atol "
                f"(or --tol {shown(s.name)}:ATOL) below the output's scale, or use real inputs and weights")
    for message in messages:
        if message not in _vacuous_warned:
            _vacuous_warned.add(message)
            logger.warning(message)
    return messages


def decade(score: float) -> int | None:
    """A score's order of magnitude in tolerances, the nearest power of ten (``~1eN×``): 7,393 → 4, 977 → 3,
    1.64 → 0; None when the score is not finite and positive. Every "error ~1eN× tolerance" graphbisect prints,
    and a failure signature's ``band``, is this (it was the power of ten below, which called 7,393 "~1e3×")."""
    return math.floor(math.log10(score) + 0.5) if math.isfinite(score) and score > 0 else None
