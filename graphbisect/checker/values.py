"""The checker's own comparison of two runs' outputs under a bundle's tolerance.

Written apart from :mod:`graphbisect.compare` on purpose (the checker shares no code with what it checks):
the rule is the one every report states, ``|t - o| <= atol + rtol·|o|`` per element (``numpy.allclose``),
and a tensor's **score** is its worst element's error in tolerances, ``max |t - o| / (atol + rtol·|o|)``, so a
score of 40 is "40× over tolerance". NaN against NaN and an infinity against the same infinity agree; any other
non-finite value where the other side is finite is a ``nan`` difference. Integers, booleans and strings must be
equal (indices, labels, shapes: a score of infinity when they differ), except a tensor the tolerance lists as
quantized (``quantized``: name → its step): it may be ``int_atol`` steps off (its score is the worst difference
÷ ``int_atol``), and a float tensor on such a grid gets ``int_atol`` steps more absolute tolerance. A different
shape, or a different dtype where the tolerance checks dtypes, is a structural difference of infinite score.
``min_cosine`` fails a float tensor whose cosine similarity with the oracle's is lower.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphbisect.text.printable import shown

__all__ = ["Difference", "Limits", "bit_identical", "compare_outputs", "worst"]


@dataclass(frozen=True)
class Limits:
    """A bundle's tolerance as the checker reads it from ``report.json`` (the fields it implements)."""

    atol: float = 1e-4
    rtol: float = 1e-3
    int_atol: float = 1.0
    check_dtype: bool = True
    min_cosine: float | None = None
    per_output: Mapping[str, tuple[float, float]] | None = None
    #: tensors on a quantization grid: name -> its step
    quantized: Mapping[str, float] | None = None

    @classmethod
    def from_report(cls, data: Any) -> Limits:
        """From ``report.json``'s ``tolerance``; raises ``ValueError`` on a malformed one."""
        if not isinstance(data, Mapping):
            return cls()
        per = data.get("per_output") or {}
        cosine = data.get("min_cosine")
        return cls(atol=float(data.get("atol", 1e-4)), rtol=float(data.get("rtol", 1e-3)),
                   int_atol=float(data.get("int_atol", 1.0)), check_dtype=bool(data.get("check_dtype", True)),
                   min_cosine=None if cosine is None else float(cosine),
                   per_output={str(k): (float(v[0]), float(v[1])) for k, v in dict(per).items()},
                   quantized={str(k): float(v) for k, v in dict(data.get("quantized") or {}).items()})

    def of(self, name: str) -> tuple[float, float]:
        """A float tensor's (atol, rtol): its own, plus ``int_atol`` steps where it is on a quantization grid."""
        atol, rtol = (self.per_output or {}).get(name, (self.atol, self.rtol))
        return atol + self.int_atol * (self.quantized or {}).get(name, 0.0), rtol


@dataclass(frozen=True)
class Difference:
    """How one output of a run differs from the oracle's: ``kind`` is ``ok``, ``mismatch`` (values beyond
    tolerance), ``exact`` (integer, boolean or string values that differ), ``nan`` (non-finite where the oracle
    is finite) or ``structure`` (missing, another shape or dtype)."""

    name: str
    kind: str
    score: float
    mismatches: int = 0
    numel: int = 0

    @property
    def failed(self) -> bool:
        return self.kind != "ok"

    def describe(self) -> str:
        if not self.failed:
            return f"'{shown(self.name)}' within tolerance (score {self.score:.3g})"
        count = f", {self.mismatches}/{self.numel} elements" if self.numel else ""
        return f"'{shown(self.name)}' {self.kind} (score {self.score:.4g}{count})"


def compare_outputs(expected: Mapping[str, Any], actual: Mapping[str, Any], limits: Limits) -> list[Difference]:
    """Each of ``expected``'s outputs against ``actual``'s, in ``expected``'s order."""
    return [_compare(name, value, actual[name] if name in actual else _MISSING, limits)
            for name, value in expected.items()]


def worst(differences: list[Difference]) -> Difference | None:
    """The failing output with the highest score (None when none fails)."""
    failing = [d for d in differences if d.failed]
    return max(failing, key=lambda d: d.score) if failing else None


def bit_identical(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two runs' outputs are the same values bit for bit (NaN payloads aside)."""
    return a.keys() == b.keys() and all(_same_bits(a[k], b[k]) for k in a)


_MISSING = object()


def _same_bits(a: Any, b: Any) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(_same_bits, a, b))
    if a is None or b is None:
        return a is None and b is None
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.dtype.kind == "f":
        return bool(np.array_equal(x, y, equal_nan=True))
    if x.dtype.kind in "OUS":
        return bool((x == y).all()) if x.size else True
    return x.tobytes() == y.tobytes()


def _compare(name: str, oracle: Any, target: Any, limits: Limits) -> Difference:
    if target is _MISSING:
        return Difference(name, "structure", math.inf)
    if isinstance(oracle, list) or isinstance(target, list):
        return _compare_sequence(name, oracle, target, limits)
    if oracle is None or target is None:
        return Difference(name, "ok" if oracle is None and target is None else "structure",
                          0.0 if oracle is None and target is None else math.inf)
    o, t = np.asarray(oracle), np.asarray(target)
    if o.shape != t.shape or (limits.check_dtype and o.dtype != t.dtype):
        return Difference(name, "structure", math.inf, numel=int(o.size))
    if o.dtype.kind in "OUSb" or t.dtype.kind in "OUSb":
        differ = int((o != t).sum()) if o.size else 0
        return Difference(name, "exact" if differ else "ok", math.inf if differ else 0.0, differ, int(o.size))
    if _integer(o.dtype) and _integer(t.dtype):
        gap = np.abs(o.astype(np.float64) - t.astype(np.float64))
        allowed = limits.int_atol if name in (limits.quantized or {}) else 0.0
        over = int((gap > allowed).sum())
        top = float(gap.max()) if gap.size else 0.0
        score = top / allowed if allowed > 0 else (math.inf if top > 0 else 0.0)
        return Difference(name, "exact" if over else "ok", score, over, int(o.size))
    return _compare_float(name, o, t, limits)


def _integer(dtype: np.dtype) -> bool:
    """numpy's integers, and the sub-byte ones ml_dtypes adds (int4, uint4, int2, uint2: numpy kind 'V')."""
    return dtype.kind in "iu" or dtype.name in ("int4", "uint4", "int2", "uint2")


#: Elements compared at a time: a float output is compared a slice at a time in float64, so the checker holds a
#: few times this many elements beside the two outputs, never several float64 copies of a large output.
_CHUNK = 1 << 18


def _compare_float(name: str, o: np.ndarray, t: np.ndarray, limits: Limits) -> Difference:
    atol, rtol = limits.of(name)
    nonfinite = over = 0
    score = dot = o_norm = t_norm = 0.0
    flat_o, flat_t = o.reshape(-1), t.reshape(-1)
    for start in range(0, flat_o.size, _CHUNK):
        oc = flat_o[start:start + _CHUNK].astype(np.float64)
        tc = flat_t[start:start + _CHUNK].astype(np.float64)
        o_fin, t_fin = np.isfinite(oc), np.isfinite(tc)
        same_special = ~o_fin & ~t_fin & ((np.isnan(oc) & np.isnan(tc)) | (oc == tc))
        nonfinite += int((~t_fin & o_fin).sum() + (~o_fin & ~same_special).sum())
        both = o_fin & t_fin
        ob, tb = oc[both], tc[both]
        gap = np.abs(ob - tb)
        bound = atol + rtol * np.abs(ob)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(gap == 0, 0.0, gap / bound)
        over += int((gap > bound).sum())
        score = max(score, float(ratio.max()) if ratio.size else 0.0)
        dot += float(np.dot(ob, tb))
        o_norm += float(np.dot(ob, ob))
        t_norm += float(np.dot(tb, tb))
    if nonfinite:
        return Difference(name, "nan", math.inf, nonfinite + over, int(o.size))
    if over:
        return Difference(name, "mismatch", score, over, int(o.size))
    if limits.min_cosine is not None and o.size:
        denominator = math.sqrt(o_norm) * math.sqrt(t_norm)
        cosine = dot / denominator if denominator else 1.0
        if cosine < limits.min_cosine:
            return Difference(name, "mismatch", score, 0, int(o.size))
    return Difference(name, "ok", score, 0, int(o.size))


def _compare_sequence(name: str, oracle: Any, target: Any, limits: Limits) -> Difference:
    if not (isinstance(oracle, list) and isinstance(target, list)) or len(oracle) != len(target):
        return Difference(name, "structure", math.inf)
    items = [_compare(f"{name}[{i}]", o, t, limits) for i, (o, t) in enumerate(zip(oracle, target))]
    bad = worst(items)
    return Difference(name, bad.kind, bad.score) if bad else Difference(name, "ok", max((d.score for d in items),
                                                                                          default=0.0))
