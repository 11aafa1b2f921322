"""`precision`: the fewest nodes that must stay FP32 so the lowered model meets the tolerance.

Steps and their backend runs:

1. **oracle** (1 run): the FP32 model with every intermediate exposed; final outputs are the expected
   values, intermediates the INT8 calibration data and the layerwise reference;
2. **baseline** (1 target run): all units in FP32 must meet the tolerance (else the target disagrees with
   the oracle without any lowering: use ``compare``/``reduce``), then everything lowered (1 run);
3. **evidence**: ``sensitivity=True`` → 2 runs per unit (ranked table, chart, priors); otherwise 1 probed
   run of the fully lowered model → layerwise error amplification → priors;
4. **search**: ProbDD with those priors and the 1-minimality sweep (where most units must stay FP32, ProbDD
   hands over to the sweep early: :data:`~graphbisect.strategies.precision.DENSE_AFTER`); which kept nodes
   break the tolerance alone (``|keep|`` runs, free with sensitivity; by default only when at most
   :data:`ALONE_AUTO_MAX` nodes are kept, see "Single-node checks"); Polygraphy's prefix answer (≈ log2 n runs);
5. **verification** in a fresh target worker: the model with the answer applied meets the tolerance; for
   FP16 the typed model written with it (real float16 kernels) is run there too and gets its own verdict,
   which the result's ``meets_tolerance`` requires (it is what a user deploys); when it misses, a bounded
   repair keeps more nodes in FP32 for it (:func:`_verify_typed`);
6. **artifacts** (``out_dir``): the verified mixed-precision model, for FP16 also the typed one, overrides
   in every supported format, the sensitivity chart.

**Single-node checks.** "Breaks the tolerance alone" is one more run per kept node (everything else FP32),
none of them shared with the search: for a few kept nodes it tells which are critical by themselves and
which are needed only together, but where int8 error is cumulative the answer is large (PP-OCRv4 rec: 153
nodes, 11 % of the target runs). So ``alone=None`` checks them only for at most :data:`ALONE_AUTO_MAX` kept
nodes, ``True`` always, ``False`` never; unchecked, ``PrecisionResult.alone`` is None and ``--json``
``breaks_alone`` is null (never an empty list, which would claim that none does), and ``alone_checked``
says why (``skipped_many``, ``skipped``, ``budget``, ``sensitivity``, ``checked``).

**Parallel candidates** (``jobs`` > 1): that many target workers (a
:class:`~graphbisect.oracle.tester.WorkerPool`) test candidates at once: ProbDD speculates along the chain
of removals it would try next and the sweep tests the next single removals, keeping the first that meets
the tolerance in the serial order, so the answer and its minimality are those of ``jobs=1`` (a few more
runs: those past an accepted removal; the threads share the main malloc arena, :mod:`graphbisect.engine.arena`,
else each candidate cost 20 ms more in page faults). It can only shorten the wall time where cores
are idle: on a shared 2-core machine it did not (PP-OCRv4 rec int8, benchmarks/README.md). Runtime pins
share one pin file and are refused with ``jobs`` > 1.

**Runtime pins.** When the target itself computes in reduced precision and its backend row documents a
``keep_fp32`` option — ``openvino:precision=bf16`` (or ``f16``) — nothing is emulated: every candidate is
the FP32 model, the target lowers it, and the keep-set is handed to it as ``keep_fp32=@FILE`` (rewritten
before each run), so OpenVINO's own per-node FP32 mechanism is what the search and the verification
measure. The mode must match the target's precision. The verification reports the pins the target did
not apply, or only to some of their kernels, and those its execution graph cannot confirm
(``runtime_pins_not_applied``, ``runtime_pins_partly_applied``, ``runtime_pins_unverified``). There is no
layerwise evidence run: exposing every intermediate changes what OpenVINO builds (fusions, output
conversions), so its errors say little about the builds searched (PP-OCRv4 rec at 5e-3/1e-2: 139 search
tests with its priors, 62 with uniform ones). Artifacts are the overrides, among them ``keep_fp32.txt`` for
``openvino:keep_fp32=@FILE`` (no Cast-island model: it would not be what was verified).

**Op-type pins.** A target whose ``keep_fp32`` names its own op types (registry ``pin_unit="op_type"``:
``paddle:precision=bf16``, Paddle's ``set_bfloat16_op``) runs its own model file (the original Paddle
program), and the units are the op types it computed in reduced precision in one fully lowered run (run
info ``keep_fp32.low_precision_op_types``; no such type: refused, "bf16 had no effect"). The fully lowered
and the all-FP32 runs are compared with each other too: identical outputs mean the reduced precision changed
nothing, which is refused rather than reported as a result. The answer is a set of op types, emitted as the
target's own configuration lines (Paddle: ``enable_mkldnn_bfloat16()`` + ``set_bfloat16_op({...})``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from graphbisect.artifacts.output_folder import check_output_folder, claim_output_folder
from graphbisect.artifacts.overrides import PrecisionOverrides, sensitivity_chart_svg, write_overrides
from graphbisect.backends import BackendProcess, BackendSpec, Capability, resolve
from graphbisect.backends.cost import CallTally, Cost
from graphbisect.backends.process import CompareTo
from graphbisect.backends.registry import DEFAULT_ORACLE, DEFAULT_TARGET
from graphbisect.checker.configurations import check_configurations
from graphbisect.compare import Tolerance
from graphbisect.data import (
    ActivationStore,
    ChosenDim,
    chosen_dims,
    dims_note,
    random_inputs,
    save_inputs,
    validate_inputs,
)
from graphbisect.data.inputs import available_memory
from graphbisect.engine import Budget, BudgetExhausted, Evaluator, Outcome, ProgressEvent
from graphbisect.errors import BackendError, InputError
from graphbisect.localize.layerwise import LayerwiseReport, analyze_layers
from graphbisect.model import Model
from graphbisect.model.io import save_proto
from graphbisect.model.normalize import elem_types
from graphbisect.oracle.as_built import capture_as_built
from graphbisect.oracle.tester import WorkerPool
from graphbisect.precision.calibration import Calibration, CalibrationMethod
from graphbisect.precision.lowering import Lowering
from graphbisect.precision.modes import INT8_OPS, PrecisionMode
from graphbisect.settings.options import INVOCATIONS, JOBS, cap_jobs, cap_jobs_to_memory, check_value
from graphbisect.storage.atomic import atomic_write_text
from graphbisect.storage.values import load_values_npz
from graphbisect.strategies.precision import (
    Measurement,
    ModelRunner,
    PrecisionTester,
    SensitivityRow,
    alone_breakers,
    layerwise_priors,
    prefix_answer,
    search_keep_fp32,
    sensitivity,
    sensitivity_priors,
)
from graphbisect.text.printable import shown
from graphbisect.workflows.compare import model_for_backend
from graphbisect.workflows.passes_claims import limits_of
from graphbisect.workflows.precision_claims import Answer, audited_fields, checked_beliefs, precision_claims
from graphbisect.workflows.scratch import work_folder

__all__ = ["ALONE_AUTO_MAX", "PrecisionResult", "check_precision", "find_precision", "runtime_pins_mode"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

ALONE_AUTO_MAX = 32
"""With ``alone=None``, the single-node checks run only when the answer keeps at most this many nodes (as
many runs): beyond that they are a large share of the search's cost (module docstring)."""


@dataclass(frozen=True)
class PrecisionResult:
    """What `graphbisect precision` found; ``to_json`` is the documented ``--json`` schema."""

    mode: PrecisionMode
    units: tuple[str, ...]
    keep_fp32: tuple[str, ...]
    minimal: bool
    alone: tuple[str, ...] | None  # kept nodes that break the tolerance alone; None: not checked (alone_checked)
    prefix_keep_fp32: tuple[str, ...] | None
    sensitivity: tuple[SensitivityRow, ...]
    meets_tolerance: bool
    final_metrics: Mapping[str, float]
    all_lowered_meets: bool
    invocations: Mapping[str, int]
    lowering: str
    seconds: float
    files: tuple[Path, ...] = ()
    extra: Mapping[str, object] = field(default_factory=dict)
    tolerance: Tolerance = field(default_factory=lambda: Tolerance(atol=1e-2, rtol=1e-2))
    stop_reason: str | None = None  # why the search stopped before proving minimality (budget, deadline)
    #: the inputs' dynamic dims graphbisect sized (see :attr:`dims_note`)
    chosen_dims: tuple[ChosenDim, ...] = ()
    #: role -> {"runs", "compiles", "compile_cache_hits"}: the backend calls of :attr:`invocations`' roles
    #: (``oracle``, ``target``, ``verification``; ``search_tests`` counts tests, not calls) by kind
    #: (:mod:`graphbisect.backends.cost`)
    backend_calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: the trusted checker's verdict on each claim (:mod:`graphbisect.workflows.precision_claims`): ``{"holds",
    #: "claims": [{"id", "claim", "holds", "evidence"}], "runs", "calls", "seconds"}``; None: not checked
    audit: Mapping[str, Any] | None = None

    def claim(self, claim_id: str) -> Mapping[str, Any] | None:
        """The checker's record of one claim (``audit``'s), or None when it was not checked."""
        claims = (self.audit or {}).get("claims") or ()
        return next((c for c in claims if c.get("id") == claim_id), None)

    @property
    def dims_note(self) -> str | None:
        """What a verdict on sizes graphbisect chose must say (:func:`graphbisect.data.dims_note`), or None."""
        return dims_note(self.chosen_dims)

    # The --json fields named otherwise than their dataclass field, as typed attributes.
    @property
    def breaks_alone(self) -> tuple[str, ...] | None:
        """The kept nodes that break the tolerance alone (:attr:`alone`); None: not checked."""
        return self.alone

    @property
    def prefix_last_node(self) -> str | None:
        """The last node of the Polygraphy-style prefix answer (None: no prefix found or asked for)."""
        return self.prefix_keep_fp32[-1] if self.prefix_keep_fp32 else None

    @property
    def all_lowered_meets_tolerance(self) -> bool:
        """The fully lowered model meets the tolerance (:attr:`all_lowered_meets`): no node needs FP32."""
        return self.all_lowered_meets

    def to_json(self) -> dict[str, object]:
        tol = self.tolerance
        return {
            "mode": self.mode.value, "lowering": self.lowering, "units": len(self.units),
            "tolerance": {"atol": tol.atol, "rtol": tol.rtol, "min_cosine": tol.min_cosine,
                          "per_output": {name: list(pair) for name, pair in tol.per_output.items()}},
            "keep_fp32": list(self.keep_fp32), "minimal": self.minimal, "stop_reason": self.stop_reason,
            "breaks_alone": None if self.breaks_alone is None else list(self.breaks_alone),
            "prefix_keep_fp32": None if self.prefix_keep_fp32 is None else len(self.prefix_keep_fp32),
            "prefix_last_node": self.prefix_last_node,
            "all_lowered_meets_tolerance": self.all_lowered_meets_tolerance,
            "meets_tolerance": self.meets_tolerance,
            "final_metrics": {k: (v if np.isfinite(v) else str(v)) for k, v in self.final_metrics.items()},
            "sensitivity": [row.to_json() for row in self.sensitivity],
            "invocations": dict(self.invocations),
            "backend_calls": {role: dict(calls) for role, calls in self.backend_calls.items()},
            "seconds": round(self.seconds, 3), "files": [str(p) for p in self.files],
            "chosen_dims": [dim.to_json() for dim in self.chosen_dims], "dims_note": self.dims_note, **self.extra,
            "audit": None if self.audit is None else dict(self.audit),
        }


@dataclass
class _Session:
    model: Model
    workdir: Path
    inputs_path: Path
    expected: dict[str, np.ndarray]
    store: ActivationStore | None
    pin_file: Path | None = None  # runtime pins: the keep_fp32=@FILE the target reads
    run_model: Path | None = None  # a target that runs its own format (Paddle): the file it runs
    oracle_verdict: str = "capture"  # where ``expected`` comes from (``--json`` ``oracle_expected``, _capture)
    oracle: str = DEFAULT_ORACLE  # the oracle's spec, which the checker runs too


_PIN_OPTION = "keep_fp32"


def runtime_pins_mode(target: str) -> PrecisionMode | None:
    """The reduced precision ``target`` computes in *and can pin nodes out of*, else None (see module docs).

    That is a backend whose table row documents a ``keep_fp32`` option, with a ``precision=`` other than
    f32 in the spec.

    Example:
        >>> runtime_pins_mode("openvino:precision=bf16"), runtime_pins_mode("openvino"), runtime_pins_mode("ort")
        (<PrecisionMode.BF16: 'bf16'>, None, None)
    """
    spec, info = resolve(target, require_available=False)
    precision = spec.options.get("precision", "").strip().lower()
    if _PIN_OPTION not in info.options or precision in ("", "f32", "fp32", "float32"):
        return None
    return PrecisionMode.parse(precision)


def _pinned_target(target: str, mode: PrecisionMode, pin_file: Path) -> str:
    spec = BackendSpec.parse(target)
    if _PIN_OPTION in spec.options:
        raise InputError(f"the target {target} already sets {_PIN_OPTION}=",
                         hint="`graphbisect precision` chooses the FP32 nodes itself: leave keep_fp32 out of target=",
                         cli_hint="`graphbisect precision` chooses the FP32 nodes itself: leave keep_fp32 out of "
                         "--target")
    runtime_mode = runtime_pins_mode(target)
    if runtime_mode is not mode:
        raise InputError(f"mode {mode.value} does not match the target's own precision "
                         f"({runtime_mode.value if runtime_mode else 'f32'}) in {target}",
                         hint=f"use mode='{runtime_mode.value}' with this target, or a target without precision="
                         if runtime_mode else "use a target that computes in full precision",
                         cli_hint=f"use --mode {runtime_mode.value} with this target, or a target without "
                         "precision=" if runtime_mode else None)
    if "," in str(pin_file):
        raise InputError(f"the work folder {pin_file.parent} contains ',', which a backend spec cannot hold",
                         hint="choose another workdir=", cli_hint="choose another --workdir")
    return str(spec.with_options(**{_PIN_OPTION: f"@{pin_file}"}))


def _refuse_unpinnable(target: str, mode: PrecisionMode) -> None:
    """A target that runs only its own model format cannot run the rewritten ONNX candidates: it must lower
    by itself, with FP32 pins (``precision=`` and a documented ``keep_fp32``)."""
    spec, info = resolve(target, require_available=False)
    if info.has(Capability.ONNX_INPUT) or runtime_pins_mode(target) is not None:
        return
    pinnable = _PIN_OPTION in info.options and "precision" in info.options
    example = str(BackendSpec(spec.name, {k: v for k, v in spec.options.items() if k != "bf16"})
                  .with_options(precision=mode.value))
    raise InputError(f"the target {target} runs only its own model format, not the ONNX candidates an emulated "
                     f"{mode.value} search makes",
                     hint=f"search on its own {mode.value} with FP32 pins: target='{example}'" if pinnable
                     else "this backend cannot keep parts of the model in FP32: choose an ONNX target",
                     cli_hint=f"search on its own {mode.value} with FP32 pins: --target {example}" if pinnable
                     else None)


def _capture(model: Model, oracle: str, feeds: Mapping[str, np.ndarray], workdir: Path,
             tol: Tolerance) -> tuple[_Session, Cost]:
    inputs_path = save_inputs(workdir / "inputs.npz", feeds)
    spec, info = resolve(oracle)
    if not info.has(Capability.ONNX_INPUT):
        raise BackendError(f"the precision oracle must run ONNX models; {spec.name!r} does not",
                           hint="use oracle='onnxruntime:opt_level=disable' or oracle='reference'",
                           cli_hint="use --oracle onnxruntime:opt_level=disable or --oracle reference")
    names = model.intermediate_names() if info.has(Capability.INTERMEDIATES) else list(model.output_names)
    probe = workdir / "probe.onnx"
    save_proto(model.with_outputs(names), probe)
    captures = len(names) > len(model.output_names)
    as_written = info.computes_as_written(spec, elem_types(model.proto))
    plain_path = model.save(workdir / "oracle-model.onnx") if captures and not as_written else probe
    with BackendProcess(spec, workdir=workdir / "oracle") as proc:
        # An oracle that rewrites the graph may build the probe otherwise than the model: the expected outputs
        # are its run of the model as built; the capture still gives the calibration ranges and the layerwise
        # evidence.
        runs = capture_as_built(lambda path, out: proc.run(path, inputs_path, output_dir=out), probe, plain_path,
                                outputs=model.output_names, rewrites=plain_path != probe, tolerance=tol, spec=spec,
                                capture_dir=workdir / "activations", plain_dir=workdir / "oracle-plain")
        runs.require_ok(spec, "the FP32 model")
        store = ActivationStore.adopt(workdir / "activations") if captures else None
        expected = {name: np.asarray(value) for name, value in runs.expected(model.output_names).items()}
        verdict = "capture"
        if runs.difference is not None:
            # "differ" within the search's tolerance: a fused kernel's last bits are no different computation
            verdict = "model as built" + (" (its capture's outputs differ)" if runs.differs else "")
            if runs.differs:
                log.warning("%s; the expected outputs are its run of the model as built", runs.difference.why(spec))
        session = _Session(model, workdir, Path(inputs_path), expected, store, oracle_verdict=verdict, oracle=oracle)
        return session, proc.cost


def _typed_target(target: str) -> bool:
    """A target that runs the model's own FP16 types (``tensorrt:typed=1``): candidates are the typed mixed
    model, not the CPU emulation.

    >>> _typed_target("tensorrt:typed=1"), _typed_target("onnxruntime")
    (True, False)
    """
    return BackendSpec.parse(target).options.get("typed", "0").strip().lower() in ("1", "true", "yes", "on")


def _lowering(session: _Session, mode: PrecisionMode, method: CalibrationMethod, *, typed: bool = False) -> Lowering:
    if mode is not PrecisionMode.INT8:
        return Lowering(session.model, mode, typed=typed)
    feeds = load_values_npz(session.inputs_path)
    if session.store is None and set(session.model.intermediate_names()) - set(session.model.output_names):
        raise InputError("int8 calibration needs the oracle's intermediate tensors",
                         hint="use an oracle that exposes intermediates (onnxruntime, reference)")
    # inputs and outputs, then the capture (none for a model without intermediates) a window at a time: its pages
    # are let go after each (a detector's is ~1 GiB)
    ranges = dict(Calibration.from_tensors({**feeds, **session.expected}, method=method).ranges)
    if session.store is not None:
        store = session.store
        for window in store.windows(store.names()):
            ranges.update(Calibration.from_tensors({name: store[name] for name in window}, method=method).ranges)
    return Lowering(session.model, mode, Calibration(ranges, method))


def find_precision(
    model: Model,
    *,
    mode: PrecisionMode | str = PrecisionMode.FP16,
    oracle: str = DEFAULT_ORACLE,
    target: str = DEFAULT_TARGET,
    inputs: Mapping[str, np.ndarray] | None = None,
    tolerance: Tolerance | None = None,
    workdir: Path | None = None,
    out_dir: Path | None = None,
    with_sensitivity: bool = False,
    with_prefix: bool = True,
    calibration: CalibrationMethod | str = CalibrationMethod.MINMAX,
    max_invocations: int | None = None,
    seed: int = 0,
    on_stage: Callable[[str], None] | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    alone: bool | None = None,
    jobs: int = 1,
    chosen: Sequence[ChosenDim] = (),
) -> PrecisionResult:
    """Find a 1-minimal set of nodes to keep in FP32 with the rest in ``mode`` (see the module docstring).

    ``alone``: check which kept nodes break the tolerance alone (one run each): None only when at most
    :data:`ALONE_AUTO_MAX` are kept, True always, False never ("Single-node checks" in the module docstring).
    ``jobs``: target workers testing candidates at once ("Parallel candidates" in the module docstring).
    ``chosen``: the dynamic dims graphbisect sized when it drew ``inputs`` (:func:`graphbisect.data.chosen_dims`;
    found here when ``inputs`` is None), which the result reports.
    """
    found = _find_precision(model, mode=mode, oracle=oracle, target=target, inputs=inputs, tolerance=tolerance,
                            workdir=workdir, out_dir=out_dir, with_sensitivity=with_sensitivity,
                            with_prefix=with_prefix, calibration=calibration, max_invocations=max_invocations,
                            seed=seed, on_stage=on_stage, on_progress=on_progress, alone=alone, jobs=jobs)
    return dataclasses.replace(found, chosen_dims=tuple(chosen) if inputs is not None else chosen_dims(model))


def _find_precision(
    model: Model,
    *,
    mode: PrecisionMode | str,
    oracle: str,
    target: str,
    inputs: Mapping[str, np.ndarray] | None,
    tolerance: Tolerance | None,
    workdir: Path | None,
    out_dir: Path | None,
    with_sensitivity: bool,
    with_prefix: bool,
    calibration: CalibrationMethod | str,
    max_invocations: int | None,
    seed: int,
    on_stage: Callable[[str], None] | None,
    on_progress: Callable[[ProgressEvent], None] | None,
    alone: bool | None,
    jobs: int,
) -> PrecisionResult:
    """:func:`find_precision` without the dims it reports."""
    started = time.monotonic()
    stage = on_stage or (lambda _msg: None)
    mode, method, jobs = _checked_options(target, mode, calibration, out_dir=out_dir,
                                          max_invocations=max_invocations, jobs=jobs, stage=stage)
    tol = tolerance or Tolerance(atol=1e-2, rtol=1e-2)
    with work_folder(workdir, "precision", protect=(model.path, model.paddle_source)) as (folder, _kept):
        feeds = validate_inputs(model, inputs) if inputs is not None else random_inputs(model, seed=seed)
        stage(f"capturing the FP32 oracle's activations ({oracle})")
        session, oracle_runs = _capture(model, oracle, feeds, folder, tol)
        lowering: Lowering | None
        if runtime_pins_mode(target) is not None:
            target, lowering = _runtime_pins(session, target, mode)
        else:
            lowering = _lowering(session, mode, method, typed=_typed_target(target))
        if lowering is not None:
            _check_lowerable(lowering, mode, stage)
        return _search(session, lowering, target, tol, started=started, oracle_runs=oracle_runs,
                       out_dir=out_dir, with_sensitivity=with_sensitivity, with_prefix=with_prefix,
                       max_invocations=max_invocations, stage=stage, on_progress=on_progress, mode=mode,
                       alone=alone, jobs=jobs)


def _checked_options(target: str, mode: PrecisionMode | str, calibration: CalibrationMethod | str, *,
                     out_dir: Path | None, max_invocations: int | None, jobs: int, stage: Callable[[str], None]
                     ) -> tuple[PrecisionMode, CalibrationMethod, int]:
    """The options checked before the oracle's run: (the mode, the calibration method, the target workers
    to use: ``jobs`` capped to the CPUs)."""
    check_value("find_precision", "max_invocations", max_invocations, INVOCATIONS)
    check_value("find_precision", "jobs", jobs, JOBS)
    mode = mode if isinstance(mode, PrecisionMode) else PrecisionMode.parse(mode)
    method = calibration if isinstance(calibration, CalibrationMethod) else CalibrationMethod.parse(calibration)
    _refuse_unpinnable(target, mode)
    if out_dir is not None:  # new, empty or an earlier precision run's: never the user's files (issue 36)
        check_output_folder(out_dir, **_OUTPUT_RULE)
    if jobs > 1 and runtime_pins_mode(target) is not None:
        raise InputError(f"{jobs} jobs with {target}: the target reads its FP32 pins from one file, so its "
                         "candidates cannot run at once", hint="leave jobs= out (1) with a target that pins "
                         "nodes itself", cli_hint="leave --jobs out (1) with a target that pins nodes itself")
    jobs, capped = cap_jobs(jobs, "--jobs")  # as reduce: more workers than CPUs only share them
    if capped is not None:
        stage(capped)
    return mode, method, jobs


def _runtime_pins(session: _Session, target: str, mode: PrecisionMode) -> tuple[str, Lowering | None]:
    """A target that lowers by itself, reading its FP32 pins from a file in the work folder: (its spec naming
    that file, the lowering: None for op-type pins, whose units the target reports)."""
    session.pin_file = session.workdir / "keep_fp32.txt"
    target = _pinned_target(target, mode, session.pin_file)
    session.pin_file.write_text("", encoding="utf-8")  # the spec is checked before the first run
    spec, info = resolve(target, require_available=False)
    model = session.model
    if not info.has(Capability.ONNX_INPUT):
        session.run_model = Path(model_for_backend(model, spec, Path(model.path or "")))
    if info.pin_unit == "op_type":
        return target, None
    return target, Lowering(model, mode, runtime_pins=True)


def _check_lowerable(lowering: Lowering, mode: PrecisionMode, stage: Callable[[str], None]) -> None:
    """Refuse a model with no node to lower; say which nodes int8 keeps in float, unsearched."""
    if not lowering.units:
        kept = "".join(f"; {shown(name)} stays float: {why}" for name, why in lowering.float_nodes.items())
        raise InputError(f"the model has no node that {mode.value} can lower{kept}",
                         hint="only float32 arithmetic nodes are lowered; data movement stays as is")
    for name, why in lowering.float_nodes.items():
        stage(f"int8 keeps {shown(name)} in float (not searched): {why}")


def _search(session: _Session, lowering: Lowering | None, target: str, tol: Tolerance, *, started: float,
            oracle_runs: Cost, out_dir: Path | None, with_sensitivity: bool, with_prefix: bool,
            max_invocations: int | None, stage: Callable[[str], None],
            on_progress: Callable[[ProgressEvent], None] | None = None,
            mode: PrecisionMode | None = None, alone: bool | None = None, jobs: int = 1) -> PrecisionResult:
    """The search; ``lowering`` None: op-type pins, whose units the target reports (see the module docs)."""
    workers = (contextlib.closing(WorkerPool(target, jobs, session.workdir / "target")) if jobs > 1
               else BackendProcess(target, workdir=session.workdir / "target"))
    with workers as proc, contextlib.ExitStack() as cleanup:
        known: dict[frozenset[int], Measurement] = {}
        if lowering is None:
            assert mode is not None
            stage(f"asking the target which op types it computes in {mode.value}")
            lowering, known = _discover_op_types(session, mode, proc, target, tol)
        n = len(lowering.units)
        tester = cleanup.enter_context(contextlib.closing(  # closed: its candidates' weights file is scratch
            PrecisionTester(lowering, proc, session.workdir / "candidates", session.inputs_path,
                            expected=session.expected, tol=tol, pin_file=session.pin_file,
                            run_model=session.run_model)))
        ev = Evaluator(tester, n, allow_empty=True, budget=Budget(max_invocations=max_invocations),
                       on_progress=on_progress, jobs=jobs)
        for keep, measured in known.items():  # runs the discovery made already
            ev.record(keep, Outcome.FAIL if measured.meets else Outcome.PASS)
        all_lowered = _ends(ev, tester, lowering, target, max_invocations=max_invocations, stage=stage)
        rows, prior = _evidence(session, lowering, tester, tol, with_sensitivity=with_sensitivity,
                                all_lowered=all_lowered, stage=stage)
        stage(f"searching the fewest {_unit_word(lowering)} to keep in FP32")
        result = search_keep_fp32(ev, prior)
        # After the search, what the budget leaves: the answer is kept whatever the extras could not finish.
        breakers, alone_checked = _alone(ev, result.keep, rows, alone, stage)
        prefix = (_within_budget(lambda: prefix_answer(ev), stage, "Polygraphy's prefix answer")
                  if with_prefix and not all_lowered and lowering.op_types is None else None)
        search_runs = proc.cost
    stage("verifying the answer in a fresh target worker")
    verified, metrics, verify_runs, verify_info, typed, typed_keep = _verify(session, lowering, target, tol,
                                                                             result.keep)
    files = _write_artifacts(out_dir, lowering, result.keep, rows, typed_keep) if out_dir is not None else ()
    calls = CallTally({"oracle": oracle_runs, "target": search_runs, "verification": verify_runs})
    extra: dict[str, object] = {"tests_by_phase": {name: c.tests for name, c in ev.stats().phases},
                                "alone_checked": alone_checked, "oracle_expected": session.oracle_verdict,
                                "answer_meets": verified, **_model_notes(lowering, typed),
                                **_pin_notes(lowering, target, result.keep, verify_info)}
    found = PrecisionResult(
        mode=lowering.mode, units=tuple(lowering.names(range(n))), keep_fp32=tuple(lowering.names(result.keep)),
        minimal=result.minimal, alone=None if breakers is None else tuple(lowering.names(breakers)),
        prefix_keep_fp32=None if prefix is None or prefix.found is None else tuple(lowering.names(range(prefix.found))),
        # the typed model is what a user deploys: the run meets the tolerance only when it does too
        sensitivity=tuple(rows), meets_tolerance=verified and (typed is None or bool(typed["meets"])),
        final_metrics=metrics, all_lowered_meets=all_lowered,
        invocations={**calls.runs(), "search_tests": ev.stats().tests}, backend_calls=calls.to_json(),
        lowering=_describe_lowering(lowering), seconds=time.monotonic() - started, files=tuple(files), extra=extra,
        tolerance=tol, stop_reason=None if result.stop_reason is None else result.stop_reason.value,
    )
    return dataclasses.replace(
        _checked(session, found, lowering, target, result.keep, tol=tol, stage=stage, out_dir=out_dir,
                 verified=verified, typed_keep=typed_keep if typed is not None else None,
                 typed_meets=None if typed is None else bool(typed["meets"]),
                 alone=None if breakers is None else frozenset(breakers),
                 prefix=None if prefix is None else prefix.found), seconds=time.monotonic() - started)


def _checked(session: _Session, found: PrecisionResult, lowering: Lowering, target: str, keep: frozenset[int], *,
             tol: Tolerance, stage: Callable[[str], None], **facts: Any) -> PrecisionResult:
    """``found`` as the trusted checker finds it (:mod:`graphbisect.workflows.precision_claims`), running the
    written artifacts, the FP32 model (the oracle's) and the rest saved to a scratch folder; ``facts``: the
    :class:`~graphbisect.workflows.precision_claims.Answer` fields the search decided."""
    scratch = session.workdir / "checker"
    scratch.mkdir(parents=True, exist_ok=True)
    answer = Answer(lowering, keep, target, fp32_model=session.model.save(scratch / "fp32.onnx"), scratch=scratch,
                    run_model=session.run_model, **facts)
    return check_precision(found, answer, oracle=session.oracle, inputs=load_values_npz(session.inputs_path),
                           tolerance=tol, stage=stage)


def check_precision(result: PrecisionResult, answer: Answer, *, oracle: str, inputs: Mapping[str, Any],
                    tolerance: Tolerance, stage: Callable[[str], None] | None = None) -> PrecisionResult:
    """``result`` with its claims (:func:`~graphbisect.workflows.precision_claims.precision_claims`) checked by
    plain runs: ``oracle`` on ``answer.fp32_model``, the target on each file, compared under ``tolerance``;
    ``meets_tolerance`` and ``minimal`` only where they hold
    (:func:`~graphbisect.workflows.precision_claims.audited_fields`).

    Example:
        >>> checked = check_precision(found, answer, oracle="onnxruntime:opt_level=disable",     # doctest: +SKIP
        ...                           inputs=feeds, tolerance=Tolerance(atol=1e-2, rtol=1e-2))
        >>> [(c["id"], c["holds"]) for c in checked.audit["claims"]]                           # doctest: +SKIP
        [('verified', True), ('one_minimal', True)]
    """
    claims = precision_claims(answer, minimal=result.minimal)
    if stage is not None:
        runs = sum(len(c.configurations) for c in claims)
        stage(f"checking the answer's {len(claims)} claims with {runs + 1} plain runs (the checker)")
    audit = check_configurations(oracle, answer.fp32_model, inputs, claims, limits_of(tolerance),
                                 workdir=answer.scratch)
    beliefs = checked_beliefs(audit, claims, result.alone, result.prefix_keep_fp32)
    return dataclasses.replace(result, **audited_fields(result.to_json(), audit),
                               **{**beliefs, "extra": {**result.extra, **beliefs["extra"]}})


def _unit_word(lowering: Lowering) -> str:
    return "op types" if lowering.op_types is not None else "nodes"


def _ends(ev: Evaluator, tester: PrecisionTester, lowering: Lowering, target: str, *, max_invocations: int | None,
          stage: Callable[[str], None]) -> bool:
    """Check both ends of the search: the all-FP32 model must meet the tolerance (else refused, with why); return
    whether the fully lowered model meets it too. Sizes the target workers once the first run measured one."""
    stage(f"checking the FP32 baseline and the fully lowered model ({len(lowering.units)} lowerable "
          f"{_unit_word(lowering)})")
    try:
        if ev.evaluate(ev.universe, phase="baseline").outcome is not Outcome.FAIL:
            raise _baseline_error(target, lowering, tester, ev.universe)
        # The all-FP32 model's run measured what a target worker needs; the candidates run in parallel
        # only from the next test on (each is the model with fewer nodes in FP32), so -j is sized now.
        ev.jobs, memory = cap_jobs_to_memory(ev.jobs, tester.peak_memory, available_memory(), "--jobs")
        if memory is not None:
            stage(memory)
        return ev.evaluate(frozenset(), phase="all-lowered").outcome is Outcome.FAIL
    except BudgetExhausted as exc:
        raise InputError(f"a budget of {max_invocations} invocations ends before the search starts: the FP32 "
                         "baseline and the fully lowered model take 2 target runs",
                         hint="give at least 3 (each search step is one more run)") from exc


def _evidence(session: _Session, lowering: Lowering, tester: PrecisionTester, tol: Tolerance, *,
              with_sensitivity: bool, all_lowered: bool, stage: Callable[[str], None]
              ) -> tuple[list[SensitivityRow], dict[int, float] | None]:
    """(the sensitivity table, empty unless asked for; the search's priors, None: uniform)."""
    n = len(lowering.units)
    if with_sensitivity:
        stage(f"sensitivity: 2 runs per node for {n} nodes")
        rows = sensitivity(tester, n)
        return rows, sensitivity_priors(rows, n)
    if not all_lowered and not lowering.runtime_pins:
        return [], _evidence_priors(session, lowering, tester, tol)
    return [], None


def _pin_notes(lowering: Lowering, target: str, keep: frozenset[int], verify_info: Mapping[str, Any]
               ) -> dict[str, object]:
    """``--json`` fields of runtime pins: the pins the verified run did not apply (or not all of), or could
    not confirm; with op-type pins, what it computed in reduced precision and the target's configuration."""
    if not lowering.runtime_pins:
        return {}
    pins = verify_info.get(_PIN_OPTION) or {}
    notes: dict[str, object] = {
        "target": target, "runtime_pins_not_applied": list(pins.get("not_applied", [])),
        "runtime_pins_partly_applied": list(pins.get("partly_applied", [])),
        "runtime_pins_unverified": list(pins.get("unverified", []))}
    if lowering.op_types is not None:  # what the verified run computed in reduced precision, and its config
        keep_types = tuple(lowering.names(keep))
        lowered_types = tuple(lowering.names(set(range(len(lowering.units))) - keep))
        notes.update(unit="op_type", low_precision_op_types=list(pins.get("low_precision_op_types", [])),
                     paddle_config=PrecisionOverrides(lowering.mode.value, keep_types, keep_types, lowered_types,
                                                      unit="paddle_op_type").paddle_cpu_bf16())
    return notes


def _model_notes(lowering: Lowering, typed: dict[str, Any] | None) -> dict[str, object]:
    """``--json`` fields about the models run: ``typed_model`` (the typed FP16 model's verdict) and
    ``int8_float_nodes`` (nodes no keep-set lowers, a bias beyond int32, in every run: never searched)."""
    notes: dict[str, object] = {}
    if typed is not None:
        notes["typed_model"] = typed
    if lowering.float_nodes:
        notes["int8_float_nodes"] = [{"node": name, "why": why} for name, why in lowering.float_nodes.items()]
    return notes


def _discover_op_types(session: _Session, mode: PrecisionMode, proc: ModelRunner, target: str,
                       tol: Tolerance) -> tuple[Lowering, dict[frozenset[int], Measurement]]:
    """Op-type pins: the op types ``target`` computes in ``mode`` with nothing kept, as units; refused when
    there are none or when the fully lowered outputs equal the all-FP32 ones ("had no effect").

    Returns the lowering and the two measurements made (all lowered, all FP32), for the search's cache.
    """
    assert session.pin_file is not None
    probe = Lowering(session.model, mode, runtime_pins=True, op_types=())
    tester = PrecisionTester(probe, proc, session.workdir / "candidates", session.inputs_path,
                             expected=session.expected, tol=tol, pin_file=session.pin_file,
                             run_model=session.run_model)
    lowered = tester.measure(frozenset())
    if not lowered.run.ok:
        raise BackendError(f"the target {target} does not run the model in {mode.value}: {lowered.run.describe()}",
                           hint="run `graphbisect compare` with this target to see the failure")
    facts = lowered.run.info.get(_PIN_OPTION) or {}
    types = [str(t) for t in facts.get("low_precision_op_types", [])]
    if not types:
        ran = ", ".join(map(str, facts.get("op_types", []))) or "none reported"
        raise BackendError(f"{mode.value} had no effect: the target {target} computed no op in {mode.value} "
                           f"(op types it ran: {ran})",
                           hint=f"this build or model has no {mode.value} kernels for its ops; there is nothing "
                           "to keep in FP32")
    lowering = Lowering(session.model, mode, runtime_pins=True, op_types=types)
    tester.lowering = lowering
    universe = frozenset(range(len(types)))
    full = tester.measure(universe)
    ignored = (full.run.info.get(_PIN_OPTION) or {}).get("not_applied") or []
    if ignored:
        why = (full.run.info.get(_PIN_OPTION) or {}).get("why")
        raise BackendError(f"the target {target} ignores its FP32 pins here: with every op type kept in FP32 it "
                           f"still computed {', '.join(map(str, ignored))} in {mode.value}",
                           hint=str(why) if why else "this target cannot keep op types in FP32 for this model")
    if full.run.ok and all(np.array_equal(np.asarray(lowered.run.outputs[name]), np.asarray(full.run.outputs[name]))
                           for name in session.expected):
        raise BackendError(f"{mode.value} had no effect: with {', '.join(types)} in {mode.value} the target's "
                           f"outputs are bit-identical to its FP32 outputs", hint="there is nothing to keep in FP32")
    log.info("the target computes %d op type(s) in %s: %s", len(types), mode.value, ", ".join(types))
    return lowering, {frozenset(): lowered, universe: full}


def _alone(ev: Evaluator, keep: frozenset[int], rows: list[SensitivityRow], wanted: bool | None,
           stage: Callable[[str], None]) -> tuple[list[int] | None, str]:
    """The kept units that break the tolerance alone (None: not checked) and how that was decided:
    ``sensitivity`` (free), ``checked``, ``skipped`` (``wanted`` False), ``skipped_many`` (``wanted`` None and
    more than :data:`ALONE_AUTO_MAX` kept), ``budget`` (the budget ran out during the checks)."""
    if rows:
        return [r.unit for r in rows if r.breaks_alone], "sensitivity"
    if wanted is False:
        return None, "skipped"
    if wanted is None and len(keep) > ALONE_AUTO_MAX:
        stage(f"not checking which of the {len(keep)} kept nodes break the tolerance alone "
              f"(more than {ALONE_AUTO_MAX}; --alone checks them, one run each)")
        return None, "skipped_many"
    found = _within_budget(lambda: alone_breakers(ev, keep), stage, "which kept nodes break alone")
    return found, "checked" if found is not None else "budget"


def _within_budget(step: Callable[[], _T], stage: Callable[[str], None], what: str) -> _T | None:
    """``step()``, or None when the search budget ran out during it (said on the stage line)."""
    try:
        return step()
    except BudgetExhausted as exc:
        stage(f"budget exhausted ({exc.reason.value}): skipped {what}")
        return None


def _baseline_error(target: str, lowering: Lowering, tester: PrecisionTester, universe: frozenset[int]) -> BackendError:
    """Why the all-FP32 baseline fails; with runtime pins, the pins the target did not apply are the usual cause."""
    message = f"the target {target} does not meet the tolerance even with every node in FP32"
    first = "the target disagrees with the oracle without any lowering: run "
    hint = first + "graphbisect.compare() / graphbisect.reduce() first, or loosen atol=/rtol="
    cli_hint = first + "`graphbisect compare` / `graphbisect reduce` first, or loosen --atol/--rtol"
    if lowering.runtime_pins:
        pins = tester.measure(universe).run.info.get(_PIN_OPTION) or {}
        dropped = sorted({*pins.get("not_applied", []), *pins.get("partly_applied", [])})
        if dropped:
            what = "op type(s)" if lowering.op_types is not None else "node(s)"
            message += (f": it computed {len(dropped)} pinned {what} in {lowering.mode.value} anyway, all or partly "
                        f"({', '.join(dropped[:5])}{' ...' if len(dropped) > 5 else ''})")
            why = pins.get("why")  # the runtime's own explanation, where it has one (Paddle PIR programs)
            dropping = ("OpenVINO drops the pin of ops its CPU plugin rewrites itself (MatMul + bias Add -> "
                        "FullyConnected, attention -> ScaledDotProductAttention), so these nodes cannot be kept in "
                        "FP32 there: loosen ")
            emulate = "search by emulation on an f32 target"
            hint = str(why) if why else f"{dropping}atol=/rtol=, or {emulate} (target='openvino')"
            cli_hint = str(why) if why else f"{dropping}--atol/--rtol, or {emulate} (--target openvino)"
    return BackendError(message, hint=hint, cli_hint=cli_hint)


def _evidence_priors(session: _Session, lowering: Lowering, tester: PrecisionTester,
                     tol: Tolerance) -> dict[int, float] | None:
    """Priors from one probed run of the fully lowered model (layerwise amplification)."""
    report = _layerwise(session, tester, frozenset(), tol, what="the probed lowered model",
                        otherwise="no layerwise priors")
    return None if report is None else layerwise_priors(report, lowering)


def _layerwise(session: _Session, tester: PrecisionTester, keep: frozenset[int], tol: Tolerance, *, what: str,
               otherwise: str) -> LayerwiseReport | None:
    """The model with ``keep`` in FP32 (``tester``'s lowering) with every captured tensor exposed, compared
    layer by layer with the oracle's capture; None without a capture or when it does not run. The target's
    worker compares each tensor with the store and sends only statistics: a 1,500-node detector at 800×608
    exposes ~1 GiB, which this process held twice (the lowered run's values beside the mapped capture)."""
    if session.store is None:
        return None
    names = [n for n in session.model.intermediate_names() if n in session.store]
    outputs = tuple(session.model.output_names)
    probed = tester.measure(keep, expose=names, compare_to=CompareTo(session.store.directory, tol, keep=outputs))
    if not probed.run.ok:
        log.info("%s does not run (%s): %s", what, probed.run.describe(), otherwise)
        return None
    return analyze_layers(session.model.nodes, session.store, probed.run.outputs, tol, outputs=outputs,
                          measured=probed.run.stats)


_REPAIR_ROUNDS = 3
"""At most this many nodes are added to the typed model's FP32 set when it misses the tolerance (one probed and
one plain run each), see :func:`_verify_typed`."""


def _verify(session: _Session, lowering: Lowering, target: str, tol: Tolerance, keep: frozenset[int]
            ) -> tuple[bool, dict[str, float], Cost, dict[str, Any], dict[str, Any] | None, frozenset[int]]:
    """The answer run in a fresh target worker; for FP16, the typed model written beside it run there too.

    The search measures the emulated lowering (rounding through Casts); ``mixed_precision_typed.onnx`` is
    what a user deploys, with real float16 kernels that may round differently, so it gets its own verdict
    (the fifth item, see :func:`_verify_typed`) instead of borrowing it; the last item is the keep-set the
    typed model is written with.
    """
    with BackendProcess(target, workdir=session.workdir / "verify") as proc:
        measured = PrecisionTester(lowering, proc, session.workdir / "verify-candidates", session.inputs_path,
                                   expected=session.expected, tol=tol, pin_file=session.pin_file,
                                   run_model=session.run_model, share_weights=False).measure(keep)
        typed_verdict: dict[str, Any] | None = None
        typed_keep = keep
        if _writes_typed(lowering):
            typed_verdict, typed_keep = _verify_typed(session, lowering, proc, tol, keep)
            typed_verdict["target"] = target
            if not typed_verdict["meets"] and "error" not in typed_verdict:
                typed_verdict.update(_typed_unoptimized(session, lowering, proc, target, tol=tol, keep=typed_keep))
        return measured.meets, measured.metrics(), proc.cost, dict(measured.run.info), typed_verdict, typed_keep


def _typed_unoptimized(session: _Session, lowering: Lowering, proc: BackendProcess, target: str, *,
                       tol: Tolerance, keep: frozenset[int]) -> dict[str, Any]:
    """The typed model that misses the tolerance, run once more with the target's optimizations off (the lowest
    of its row's ``opt_levels``, in the same worker where the backend switches options there): ``{"unoptimized":
    {"opt_level", "meets", "score"}}``, or nothing where it cannot be run so.

    Why: a graph optimization may be what breaks a float16 model, not a kernel. On the 1,493-node PicoDet,
    ONNX Runtime's ConvBNFusion folds each BatchNormalization into float16 Conv weights: the typed model scores
    1.82 tolerances at ``opt_level=all`` and 0.30 at ``disable``. The repair cannot see it (its probe exposes the
    Conv outputs, which prevents the fusion); `graphbisect passes` on the typed model (oracle: the target at
    ``disable``) at the search's tolerance named ConvBNFusion there.
    """
    spec = BackendSpec.parse(target)
    _, info = resolve(spec, require_available=False)
    levels = list(info.opt_levels)
    current = spec.options.get("opt_level", levels[-1] if levels else "")
    if not levels or current not in levels or current == levels[0]:
        return {}
    lowest = spec.with_options(opt_level=levels[0])
    if not proc.can_reconfigure(lowest):
        return {}
    typed = Lowering(lowering.model, lowering.mode, typed=True)
    proc.reconfigure(lowest)
    try:
        found = PrecisionTester(typed, proc, session.workdir / "verify-typed-unoptimized", session.inputs_path,
                                expected=session.expected, tol=tol, share_weights=False).measure(keep)
    finally:
        proc.reconfigure(spec)
    if not found.run.ok:
        return {}
    score = found.metrics()["score"]
    return {"unoptimized": {"opt_level": levels[0], "meets": found.meets,
                            "score": score if np.isfinite(score) else str(score)}}


def _verify_typed(session: _Session, lowering: Lowering, proc: ModelRunner, tol: Tolerance,
                  keep: frozenset[int]) -> tuple[dict[str, Any], frozenset[int]]:
    """The typed FP16 model with ``keep`` in FP32, run on the target; when it misses the tolerance, a repair.

    The emulation keeps float32 arithmetic inside each lowered node; a target with float16 kernels (IREE on
    CPU, GPUs) computes inside the node in float16, where a reduction's running sum can overflow although its
    result would not (a GlobalAveragePool over 128×128 values near 10: emulated within 1e-2, typed ``inf`` on
    IREE). The repair, at most :data:`_REPAIR_ROUNDS` rounds of two runs: the typed model with every
    intermediate exposed, compared layer by layer with the oracle's capture; the lowered node that amplifies
    the error most (:func:`~graphbisect.strategies.precision.layerwise_priors`) joins the FP32 set, and the
    typed model is run again. The verdict (``meets``, the metrics or the ``error`` it failed to run with,
    ``keep_fp32``, ``added_fp32``, ``repair_rounds``) is always that of the last typed model run, which is the
    one written.
    """
    typed = Lowering(lowering.model, lowering.mode, typed=True)
    tester = PrecisionTester(typed, proc, session.workdir / "verify-typed", session.inputs_path,
                             expected=session.expected, tol=tol, share_weights=False)  # the model as delivered
    found = tester.measure(keep)
    added: list[int] = []
    while not found.meets and found.run.ok and len(added) < _REPAIR_ROUNDS:
        unit = _most_amplifying(session, typed, tester, tol, keep | set(added))
        if unit is None:
            break
        added.append(unit)
        found = tester.measure(keep | set(added))
    final = keep | set(added)
    verdict: dict[str, Any] = (
        {"meets": found.meets, **{k: (v if np.isfinite(v) else str(v)) for k, v in found.metrics().items()}}
        if found.run.ok else {"meets": False, "error": found.run.describe()})
    verdict.update(keep_fp32=typed.names(final), added_fp32=[typed.names([u])[0] for u in added],
                   repair_rounds=len(added))
    return verdict, final


def _most_amplifying(session: _Session, typed: Lowering, tester: PrecisionTester, tol: Tolerance,
                     keep: frozenset[int]) -> int | None:
    """The lowered unit of the typed model whose output error grows most over its inputs' (None: no evidence)."""
    report = _layerwise(session, tester, keep, tol, what="the probed typed model", otherwise="no repair")
    if report is None:
        return None
    priors = {u: p for u, p in layerwise_priors(report, typed).items() if u not in keep}
    return max(priors, key=lambda u: (priors[u], -u)) if priors else None


#: ``-o``'s output rule (:mod:`graphbisect.artifacts.output_folder`): the mark of a precision run's folder.
_OUTPUT_RULE = {"mark": ".graphbisect-precision", "command": "precision",
                "writes": "overrides.json, snippets.py, keep_fp32.txt, trtexec.txt, mixed_precision*.onnx"}


def _writes_typed(lowering: Lowering) -> bool:
    """Whether the artifacts include the typed FP16 model (``mixed_precision_typed.onnx``)."""
    return lowering.mode is PrecisionMode.FP16 and not lowering.runtime_pins and lowering.op_types is None


def _write_artifacts(out_dir: Path, lowering: Lowering, keep: frozenset[int], rows: list[SensitivityRow],
                     typed_keep: frozenset[int]) -> list[Path]:
    """The overrides and ``mixed_precision.onnx`` with ``keep`` in FP32, the typed model with ``typed_keep`` (what
    its verification ran, :func:`_verify_typed`), the sensitivity chart."""
    claim_output_folder(out_dir, **_OUTPUT_RULE)  # again: the folder may have changed while the search ran
    model = lowering.model
    keep_names = lowering.names(keep)
    overrides = PrecisionOverrides(
        lowering.mode.value, tuple(keep_names), tuple(sorted({lowering.op_type(u) for u in keep})),
        tuple(lowering.names(set(range(len(lowering.units))) - keep)),
        unit="paddle_op_type" if lowering.op_types is not None else "node",
        float_nodes=tuple(lowering.float_nodes),
        calibration=lowering.calibration.method.value if lowering.calibration is not None else "minmax",
        int8_op_types=tuple(sorted(INT8_OPS)))
    files = write_overrides(overrides, out_dir)
    if not lowering.runtime_pins:
        files.append(save_proto(lowering.lower(keep), out_dir / "mixed_precision.onnx", link=False))
    if _writes_typed(lowering):
        typed = Lowering(model, lowering.mode, typed=True)
        files.append(save_proto(typed.lower(typed_keep), out_dir / "mixed_precision_typed.onnx", link=False))
    if rows:
        chart = out_dir / "sensitivity.svg"
        by_unit = sorted(rows, key=lambda r: r.unit)
        atomic_write_text(chart, sensitivity_chart_svg([(r.unit, r.node, r.score, r.breaks_alone) for r in by_unit],
                                                       lowering.mode.value))
        files.append(chart)
    return files


def _describe_lowering(lowering: Lowering) -> str:
    if lowering.op_types is not None:
        return (f"{lowering.mode.value} on the target itself; FP32 kept per op type by the target (Paddle: "
                "set_bfloat16_op with every other type, checked by a dtype output hook)")
    if lowering.runtime_pins:
        return (f"{lowering.mode.value} on the target itself; FP32 nodes pinned by the target "
                "(OpenVINO: DisablePrecisionConversion, checked against its execution graph)")
    if lowering.mode is PrecisionMode.INT8:
        method = lowering.calibration.method.value if lowering.calibration else "?"
        return (f"int8 QDQ (uint8 per-tensor activations, int8 per-channel weights, int32 biases, {method} "
                "calibration)")
    if lowering.typed and lowering.mode is PrecisionMode.FP16:
        return "fp16 typed: lowered nodes compute in float16 between Cast nodes (the target runs the types as given)"
    return (f"{lowering.mode.value} emulated: inputs and outputs of lowered nodes rounded through "
            f"{lowering.mode.value} (Cast pairs), float32 arithmetic inside the node")
