"""The passes strategy: which optimization passes stay enabled. Units are the passes that fired.

A candidate is a *backend spec*, not a model: the same model runs with some fired passes disabled. Two
questions, two unit spaces over the same list of fired, disable-able passes, both answered by the generic
engine (:func:`~graphbisect.engine.probdd`, which ends with a one-by-one sweep, so answers are 1-minimal):

* **minimal disable-set** (:data:`DISABLE`): ``keep`` = the passes disabled; a candidate is *interesting*
  when the failure disappears (the target agrees with the oracle). A *different* failure is UNRESOLVED.
  When two passes can each cause the failure (ORT's LayerNormFusionL1 and SimplifiedLayerNormFusion both
  mis-fuse a keepdims=0 LayerNorm), disabling one leaves the other, so the answer has both names.
* **minimal enable-set** (:data:`ENABLE`): ``keep`` = the passes left enabled, every other fired pass
  disabled; interesting when the failure reproduces with the baseline's signature. Here one of the two
  LayerNorm fusions suffices.

Both ends are known before the search: all fired passes disabled passes (checked first), none disabled is
the baseline failure; they are seeded into the evaluators, so one culprit among ``n`` fired passes costs
O(log n) target runs. Where listing what fired costs builds of its own (:attr:`PassControl.listing_builds`,
IREE), the run that decides the answer comes first, every disable-able pass disabled, and the units are
every disable-able pass: what fired is not listed.

**Backend knowledge** lives in :data:`PASS_CONTROLS`, one row per backend with the PASSES capability: the
option listing disabled passes, the options that make the runtime report fired passes, and the fired
passes that cannot be disabled. ONNX Runtime reports those itself (``fired_required``, e.g.
``InsertCastTransformer``); its ``disabled=`` names are validated by the runtime (ORT silently ignores
unknown ones). Paddle Inference needs a list: deleting its bookkeeping passes breaks the predictor instead
of switching an optimization off (verified on Paddle 3.3.1, conv/bn/linear net: deleting
``dead_code_elimination_pass`` → "Cannot find constant_folding@... in scope" at load, deleting
``replace_fetch_with_shadow_output_pass`` → "The variable named fetch_name_0 is not found" at run).

Example:
    >>> from graphbisect.backends import BackendSpec
    >>> space = PassSpace(BackendSpec.parse("ort:opt_level=all"), ["A", "B", "C"])
    >>> str(space.spec_disabling(frozenset({0, 2})))
    'onnxruntime:disabled=A;C,opt_level=all'
    >>> str(space.spec_enabling(frozenset({1})))
    'onnxruntime:disabled=A;C,opt_level=all'
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphbisect.backends import BackendProcess, BackendSpec, RunResult, get, resolve
from graphbisect.backends.iree import feature_flags
from graphbisect.compare import Tolerance
from graphbisect.engine import Evaluator, Outcome, SearchResult, TestResult, probdd
from graphbisect.errors import SpecError
from graphbisect.oracle.floor import NoiseFloor
from graphbisect.oracle.signature import Signature
from graphbisect.oracle.tester import Judgement, judge

__all__ = ["DISABLE", "ENABLE", "PASS_CONTROLS", "PassControl", "PassSpace", "PassTester", "SpecRunner",
           "control_for", "minimal_set", "run_spec"]

log = logging.getLogger(__name__)

DISABLE = "disable"  # keep = the passes disabled; interesting = the failure disappears
ENABLE = "enable"  # keep = the passes enabled; interesting = the failure reproduces


@dataclass(frozen=True)
class PassControl:
    """How one backend lists fired passes and disables them."""

    disable_option: str  # the spec option holding the ';'-separated disabled passes
    report_options: Mapping[str, str] = field(default_factory=dict)  # set to get info()["fired_passes"]
    not_disableable: Mapping[str, str] = field(default_factory=dict)  # pass -> why it is never disabled
    #: The backend's own setting that disables these passes, for a user outside graphbisect (IREE: the
    #: iree-compile flags); None when the spec option is that setting already.
    native: Callable[[Sequence[str]], str] | None = None
    #: Listing what fired costs builds of its own (IREE compiles the model once more per feature), where the
    #: other backends report it from the run itself. ``passes`` then decides first with every disable-able
    #: pass disabled (one build) and, when that removes the failure, searches every disable-able pass without
    #: listing what fired (a build per pass, more than the search over them costs).
    listing_builds: bool = False


PASS_CONTROLS: Mapping[str, PassControl] = {
    "onnxruntime": PassControl("disabled", {"report_passes": "1"}),
    "onnxoptimizer": PassControl("disabled"),
    "iree": PassControl("disabled", {"report_passes": "1"}, native=feature_flags,  # features: iree-compile flags
                        listing_builds=True),
    "paddle": PassControl("delete_pass", not_disableable={
        "dead_code_elimination_pass": "bookkeeping: deleting it breaks predictor creation "
        "(Cannot find constant_folding@... in scope)",
        "replace_fetch_with_shadow_output_pass": "bookkeeping: deleting it loses the outputs "
        "(fetch_name_0 is not found in the scope)",
        "remove_shadow_feed_pass": "bookkeeping: feeds and fetches",
        "add_shadow_output_after_dead_parameter_pass": "bookkeeping: feeds and fetches",
        "inplace_pass": "memory reuse, not a graph rewrite",
    }),
}


def control_for(spec: BackendSpec) -> PassControl:
    """The :class:`PassControl` of ``spec``'s backend; a :class:`SpecError` when it cannot ablate passes."""
    info = get(spec.name)
    control = PASS_CONTROLS.get(info.kin)
    if control is None:
        able = ", ".join(sorted(PASS_CONTROLS))
        raise SpecError(f"backend {info.name!r} cannot list or disable its optimization passes",
                        hint=f"pass ablation works with {able}, e.g. target='onnxruntime:opt_level=all'",
                        cli_hint=f"pass ablation works with {able}, e.g. --target onnxruntime:opt_level=all")
    return control


class PassSpace:
    """Units = ``passes`` (fired, disable-able); candidates = specs of ``base`` with some of them disabled.

    Passes that ``base`` already disables stay disabled in every candidate.
    """

    def __init__(self, base: BackendSpec, passes: Sequence[str]) -> None:
        self.base = resolve(base, require_available=False)[0]  # aliases resolved: ort -> onnxruntime
        self.control = control_for(self.base)
        self.passes = list(dict.fromkeys(passes))
        self.always = base.option_list(self.control.disable_option)

    @property
    def size(self) -> int:
        return len(self.passes)

    def names(self, keep: frozenset[int]) -> list[str]:
        """The pass names of ``keep``, in fired order."""
        return [self.passes[i] for i in sorted(keep)]

    def spec_with_disabled(self, names: Sequence[str]) -> BackendSpec:
        """``base`` with ``names`` disabled too (no report options: candidates run plain)."""
        disabled = list(dict.fromkeys([*self.always, *names]))
        return self.base.with_options(**{self.control.disable_option: ";".join(disabled) or None})

    def spec_disabling(self, keep: frozenset[int]) -> BackendSpec:
        """The candidate of the disable-set search: the passes in ``keep`` disabled."""
        return self.spec_with_disabled(self.names(keep))

    def spec_enabling(self, keep: frozenset[int]) -> BackendSpec:
        """The candidate of the enable-set search: every unit except ``keep`` disabled."""
        return self.spec_disabling(frozenset(range(self.size)) - keep)


class PassTester:
    """The engine's test function for one of the two searches (``mode`` :data:`DISABLE` or :data:`ENABLE`).

    One target run per candidate (a spec is a session configuration; :class:`SpecRunner` keeps one warm
    worker where the backend allows it), judged against the oracle's outputs with the reduce workflow's
    :func:`~graphbisect.oracle.tester.judge`.
    """

    def __init__(self, space: PassSpace, mode: str, run: Callable[[BackendSpec], RunResult], *,
                 expected: Callable[[str], np.ndarray], outputs: Sequence[str], baseline: Signature,
                 tol: Tolerance, strict_band: bool = False, floor: NoiseFloor | None = None,
                 identity: Callable[[Judgement], str | None] | None = None, describe: bool = False) -> None:
        """``floor``: the target's noise floor. ``identity``: why a run failing like the baseline by kind is
        another failure (None: the same); with ``describe`` candidates run describing what they compiled, which
        ``identity`` reads (a sibling pass making another fused node is then another failure)."""
        if mode not in (DISABLE, ENABLE):
            raise ValueError(f"mode must be {DISABLE!r} or {ENABLE!r}, got {mode!r}")
        self.space, self.mode, self.run = space, mode, run
        self.expected, self.outputs, self.baseline, self.tol = expected, outputs, baseline, tol
        self.strict_band, self.floor, self.identity, self.describe = strict_band, floor, identity, describe

    def spec(self, keep: frozenset[int]) -> BackendSpec:
        return self.space.spec_disabling(keep) if self.mode == DISABLE else self.space.spec_enabling(keep)

    def __call__(self, keep: frozenset[int]) -> TestResult:
        spec = self.spec(keep)
        option = get(spec.name).compiled_option if self.describe else None
        result = self.run(spec.with_options(**{option[0]: option[1]}) if option else spec)
        verdict = judge(result, self.expected, self.outputs, self.tol, floor=self.floor)
        signature = verdict.signature
        other = self.identity(verdict) if self.identity is not None and \
            self.baseline.matches(signature, strict_band=self.strict_band) else None
        outcome = self.outcome_of(signature, other_identity=other is not None)
        log.debug("%s %s -> %s (%s%s)", self.mode, self.space.names(keep), outcome.value, signature.describe(),
                  f"; another identity: {other}" if other else "")
        detail: dict[str, object] = {"signature": signature.to_json()}
        if other:
            detail["identity"] = other
        return TestResult(outcome, invoked=True, detail=detail)

    def outcome_of(self, signature: Signature, *, other_identity: bool = False) -> Outcome:
        """What a run with ``signature`` means for this search (to seed a known end without running it);
        ``other_identity``: it fails like the baseline by kind, but is another failure."""
        same = self.baseline.matches(signature, strict_band=self.strict_band) and not other_identity
        if self.mode == DISABLE:
            return Outcome.FAIL if not signature.failed else Outcome.PASS if same else Outcome.UNRESOLVED
        return Outcome.FAIL if same else Outcome.UNRESOLVED if signature.failed else Outcome.PASS


def minimal_set(evaluator: Evaluator, *, phase: str, hints: Sequence[frozenset[int]] = ()) -> SearchResult:
    """A 1-minimal interesting keep-set, starting from all units (which must be interesting), or from the first
    of ``hints`` that is interesting (tried first, in order).

    ProbDD with the engine's default prior ``1/n``: a single culprit among ``n`` costs O(log n) tests.
    """
    return probdd(evaluator, phase=phase, hints=hints)


def workdir_spec_name(spec: BackendSpec) -> str:
    """A short, file-name-safe label of a spec (for worker folders)."""
    import hashlib

    return hashlib.sha1(str(spec).encode()).hexdigest()[:12]


def run_spec(spec: BackendSpec, model: Path, inputs: Path, workdir: Path, timeout: float | None) -> RunResult:
    """Run ``spec`` once on ``model`` in a fresh worker (closed afterwards)."""
    with BackendProcess(spec, workdir=workdir / workdir_spec_name(spec), timeout=timeout) as proc:
        return proc.run(model, inputs)


class SpecRunner:
    """Runs one spec after another — the pass search's candidates — in one warm worker where it can.

    A backend whose registry row is ``reconfigurable`` (ONNX Runtime: every option is a session setting), or a
    spec that differs only in the row's ``reconfigurable_options`` (Paddle: ``delete_pass``), keeps its worker
    and re-creates only the runtime for the next spec
    (:meth:`~graphbisect.backends.process.BackendProcess.reconfigure`); any other spec, or another
    interpreter, gets a fresh worker, as :func:`run_spec`. A crashed worker is replaced by the
    process itself. Starting a worker (Python, numpy, the backend library) cost more than running a small
    region model.
    """

    def __init__(self, workdir: Path, timeout: float | None) -> None:
        self.workdir, self.timeout = Path(workdir), timeout
        self._proc: BackendProcess | None = None
        self.started = 0  # workers started, for the record

    def run(self, spec: BackendSpec, model: Path, inputs: Path, *, outputs: Sequence[str] | None = None,
            output_dir: Path | None = None) -> RunResult:
        """Run ``spec`` on ``model`` (see :meth:`BackendProcess.run` for ``outputs`` and ``output_dir``)."""
        proc = self._proc
        if proc is not None and proc.can_reconfigure(spec):
            proc.reconfigure(spec)
        else:
            self.close()
            proc = self._proc = BackendProcess(spec, workdir=self.workdir / workdir_spec_name(spec),
                                               timeout=self.timeout)
            self.started += 1
        return proc.run(model, inputs, outputs, output_dir=output_dir)

    def registered_passes(self, spec: BackendSpec) -> list[str] | None:
        """Every pass ``spec``'s backend registers (its worker's library), or None when it cannot list them."""
        proc = self._proc
        if proc is not None and proc.can_reconfigure(spec):
            proc.reconfigure(spec)
            return proc.registered_passes()
        with BackendProcess(spec, workdir=self.workdir / "catalogue", timeout=self.timeout) as fresh:
            return fresh.registered_passes()

    def close(self) -> None:
        if self._proc is not None:
            self._proc.close()
            self._proc = None
