"""The target's noise floor: the error it makes with its optimizations off, so a failure counts only above it.

A GPU target differs from a CPU oracle everywhere: ONNX Runtime's CUDA execution provider computes MatMul and
Conv in TF32 by default, so every matrix product is ~1e-3 off, often a few tolerances. That error is not the
user's bug (the optimizations the user suspects are not involved) and it is everywhere, so a reduction that
accepts "some output beyond tolerance" shrinks a mis-fused LayerNorm at 1e3× tolerance into one TF32 MatMul at
2× (issue 23). Paddle Inference's precision guide starts the same way: turn every optimization off on the same
hardware, and what still differs is the kernels' precision.

The floor is measured once per model: the target's own spec at the lowest of its backend's ``opt_levels``
(:func:`floor_spec`), run on the probe model (every intermediate exposed: at that level nothing is fused, so
exposing tensors changes nothing), its tensors compared with the oracle's activation store in the worker.
Each tensor's **floor** is that run's score there (in tolerances). A tensor of the target fails only when its
error is beyond the tolerance *and* beyond :data:`FLOOR_MARGIN` times its floor (:meth:`NoiseFloor.exceeds`):
an order of magnitude, the granularity of a failure's band. Only precision is a floor: at :data:`FLOOR_CAP`
tolerances or more (an integer that differs, a NaN) the kernels compute wrong with every optimization off, a
kernel bug that every command still reports (and reduces). Candidates are fed the oracle's values at their
cut points, so their error at a tensor is at most what the whole model's floor run accumulated there: the
whole-model floor is a safe (generous) bound on a candidate's noise.

No floor is measured (every failure counts, as before) when the backend has no optimization levels
(OpenVINO, IREE, a ``command``), when the target already runs at its lowest level (then its kernels *are* what
is tested), or when the floor spec is the oracle's own spec (the floor is then zero by construction).

Example:
    >>> floor = NoiseFloor("ort:opt_level=disable", {"mm": 2.1}, "measured")
    >>> floor.threshold("mm"), floor.threshold("other")
    (21.0, 1.0)
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from graphbisect.backends import BackendInfo, BackendSpec
from graphbisect.backends.base import brief_spec
from graphbisect.backends.cost import Cost
from graphbisect.compare import MismatchKind, TensorStats, Tolerance
from graphbisect.text.printable import plural

__all__ = ["FLOOR_CAP", "FLOOR_MARGIN", "NoiseFloor", "floor_spec", "measure_floor", "no_floor"]

log = logging.getLogger(__name__)

#: How far above its floor a tensor's error must be to count as a failure: an order of magnitude.
FLOOR_MARGIN = 10.0
#: The largest floor that is precision: an error of this many tolerances or more with every optimization off
#: (an integer that differs is infinitely many) is a kernel computing wrong, not rounding otherwise, and the
#: floor does not hide it. TF32 against FP32 is a few tolerances at the default rtol.
FLOOR_CAP = 100.0


@dataclass(frozen=True)
class NoiseFloor:
    """The target's error with its optimizations off, per tensor, in tolerances (see the module docstring)."""

    spec: str | None  # what was run for it (None: nothing was run)
    scores: Mapping[str, float] = field(default_factory=dict)  # tensor -> floor score; absent: 0 or not measured
    note: str = ""  # how it was obtained, or why there is none
    measured: bool = False  # a floor run's scores (False: no floor, or zero by construction)
    margin: float = FLOOR_MARGIN
    #: what measuring it cost (its run and what that compiled; nothing when no run was made): not saved
    cost: Cost = field(default=Cost(), compare=False)

    def exceeds(self, stats: TensorStats) -> bool:
        """Whether a failing tensor fails above the floor. Only value mismatches beyond the tolerance have a
        floor: a NaN, a shape, a type or a missing output is never kernel precision, and neither is a failure
        of the cosine bound alone (``min_cosine``, score within the tolerance), whose floor is not measured."""
        if stats.passed:
            return False
        if stats.kind is not MismatchKind.MISMATCH or not stats.score > 1.0:
            return True
        return stats.score > self.threshold(stats.name)

    def threshold(self, name: str) -> float:
        """The score above which ``name``'s error counts as a failure: the tolerance (1), or ``margin`` × its
        floor when that is higher and the floor is precision (at most :data:`FLOOR_CAP`)."""
        floor = self.scores.get(name, 0.0)
        return max(1.0, self.margin * floor) if floor < FLOOR_CAP else 1.0

    def at_floor(self, stats: TensorStats) -> bool:
        """A failing value mismatch that is within the floor's margin: kernel precision, not a divergence."""
        return not stats.passed and not self.exceeds(stats)

    def above_tolerance(self, names: Iterable[str] | None = None) -> list[tuple[str, float]]:
        """(tensor, floor) for the floor's own failures beyond the tolerance, worst first (of ``names``)."""
        chosen = self.scores if names is None else {n: self.scores[n] for n in names if n in self.scores}
        return sorted(((n, s) for n, s in chosen.items() if 1.0 < s < FLOOR_CAP), key=lambda item: -item[1])

    def for_tensors(self, names: Iterable[str]) -> NoiseFloor:
        """The floor of ``names`` only (what a bundle records for its outputs)."""
        return NoiseFloor(self.spec, {n: self.scores[n] for n in names if n in self.scores}, self.note,
                          self.measured, self.margin)

    def describe(self, where: str | None = None) -> str:
        """One line for terminals and reports; its spec as :func:`~graphbisect.backends.base.brief_spec` shows
        it (``where``: where the full spec is, said when the line leaves passes out).

        Example:
            >>> NoiseFloor("ort:disabled=A;B;C;D;E,opt_level=disable", {"y": 0.5}, "", measured=True).describe()
            'noise floor (ort:disabled=<5 passes>,opt_level=disable): within the tolerance at every tensor'
        """
        if not self.measured:
            return f"noise floor: {self.note}"
        spec = brief_spec(self.spec or "")
        if where and spec != self.spec:
            spec += f"; the full spec: {where}"
        worst = self.above_tolerance()
        if not worst:
            return f"noise floor ({spec}): within the tolerance at every tensor"
        name, score = worst[0]
        return (f"noise floor ({spec}): {plural(len(worst), 'tensor')} beyond the tolerance with the "
                f"optimizations off, worst {name!r} at {score:.3g}× (kernel precision); a failure counts only above "
                f"{self.margin:g}× its floor")

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "measured": self.measured, "note": self.note, "margin": self.margin,
                "scores": {name: (score if math.isfinite(score) else "inf") for name, score in self.scores.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NoiseFloor:
        scores = {str(k): float(v) for k, v in dict(data.get("scores", {})).items()}
        return cls(data.get("spec"), scores, str(data.get("note", "")), bool(data.get("measured", False)),
                   float(data.get("margin", FLOOR_MARGIN)))

    def save(self, path: Path) -> None:
        from graphbisect.storage.atomic import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: Path) -> NoiseFloor:
        return cls.from_json(json.loads(Path(path).read_text()))

    @classmethod
    def of_run(cls, spec: BackendSpec, stats: Iterable[TensorStats]) -> NoiseFloor:
        """The floor a run of ``spec`` measured (its tensors' statistics against the oracle's store)."""
        scores = {s.name: s.score for s in stats if s.kind in (MismatchKind.OK, MismatchKind.MISMATCH)}
        return cls(str(spec), scores, f"measured: {spec} on every tensor", measured=True)


def measure_floor(spec: BackendSpec, probe: Path, inputs: Path, store: Path, tolerance: Tolerance, *,
                  workdir: Path, timeout: float | None = None) -> NoiseFloor:
    """One run of ``spec`` (a :func:`floor_spec`) on ``probe`` (the model with the tensors to measure exposed),
    its tensors compared with the oracle's activation store ``store`` in its worker. A failed run measures
    nothing (no floor, saying why): every failure then counts, as without a floor."""
    from graphbisect.backends.process import BackendProcess, CompareTo

    with BackendProcess(spec, workdir=workdir, timeout=timeout) as proc:
        run = proc.run(probe, inputs, compare_to=CompareTo(store, tolerance))
    if not run.ok:
        return replace(no_floor(f"not measured: {spec} failed on the model ({run.describe()})"), cost=proc.cost)
    return replace(NoiseFloor.of_run(spec, run.stats.values()), cost=proc.cost)


def no_floor(note: str) -> NoiseFloor:
    """No floor: every failure beyond the tolerance counts (``note`` says why)."""
    return NoiseFloor(None, {}, note)


def floor_spec(target: BackendSpec, info: BackendInfo, oracle: BackendSpec) -> BackendSpec | NoiseFloor:
    """The spec whose run is ``target``'s noise floor, or the :class:`NoiseFloor` decided without a run.

    Example:
        >>> from graphbisect.backends import resolve
        >>> t, info = resolve("ort:opt_level=all,providers=CUDAExecutionProvider", require_available=False)
        >>> str(floor_spec(t, info, BackendSpec.parse("onnxruntime:opt_level=disable")))
        'onnxruntime:providers=CUDAExecutionProvider,opt_level=disable'
        >>> t, info = resolve("ort:opt_level=all", require_available=False)
        >>> floor_spec(t, info, BackendSpec.parse("onnxruntime:opt_level=disable")).note
        'zero: with its optimizations off the target is the oracle (onnxruntime:opt_level=disable)'
    """
    if not info.opt_levels:
        return no_floor(f"not measured: {info.name} has no optimization levels to turn off")
    lowest = info.opt_levels[0]
    if target.options.get("opt_level") == lowest:
        return no_floor(f"none: the target runs with its optimizations off (opt_level={lowest}), so its kernels "
                        "are what is tested")
    options = {k: v for k, v in target.options.items()
               if k != "opt_level" and (info.compiled_option is None or k != info.compiled_option[0])
               and k not in _NOT_COMPUTING}
    spec = BackendSpec(info.name, {**options, "opt_level": lowest})
    if spec.name == oracle.name and dict(spec.options) == {k: v for k, v in oracle.options.items()
                                                          if k not in _NOT_COMPUTING}:
        return NoiseFloor(None, {}, f"zero: with its optimizations off the target is the oracle ({oracle})")
    return spec


#: Options that change what a run reports, not what it computes.
_NOT_COMPUTING = frozenset({"report_passes", "save_optimized", "report_exec", "report_layers", "report_dispatches",
                            "timeout"})
