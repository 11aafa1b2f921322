"""`precision`: the fewest nodes that must stay FP32 so the lowered model meets the tolerance.

Steps and their backend runs:

1. **oracle** (1 run): the FP32 model with every intermediate exposed; final outputs are the expected
   values, intermediates the INT8 calibration data and the layerwise reference;
2. **baseline** (1 target run): all units in FP32 must meet the tolerance (else the target disagrees with
   the oracle without any lowering: use ``compare``/``reduce``), then everything lowered (1 run);
3. **evidence**: ``sensitivity=True`` → 2 runs per unit (ranked table, chart, priors); otherwise 1 probed
   run of the fully lowered model → layerwise error amplification → priors;
4. **search**: ProbDD with those priors and the 1-minimality sweep; the single nodes that break the
   tolerance alone (``|keep|`` runs, free with sensitivity); Polygraphy's prefix answer (≈ log2 n runs);
5. **verification** in a fresh target worker: the model with the answer applied meets the tolerance;
6. **artifacts** (``out_dir``): the verified mixed-precision model, for FP16 also the typed one, overrides
   in every supported format, the sensitivity chart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphbisect.artifacts.overrides import PrecisionOverrides, sensitivity_chart_svg, write_overrides
from graphbisect.atomic import atomic_write_text
from graphbisect.backends import BackendProcess, Capability, resolve
from graphbisect.backends.registry import DEFAULT_ORACLE, DEFAULT_TARGET
from graphbisect.compare import Tolerance
from graphbisect.data import ActivationStore, random_inputs, save_inputs, validate_inputs
from graphbisect.engine import Budget, Evaluator, Outcome
from graphbisect.errors import BackendError, InputError
from graphbisect.localize.layerwise import analyze_layers
from graphbisect.model import Model
from graphbisect.model.io import save_proto
from graphbisect.precision import Calibration, CalibrationMethod, Lowering, PrecisionMode
from graphbisect.strategies.precision import (
    PrecisionTester,
    SensitivityRow,
    alone_breakers,
    layerwise_priors,
    prefix_answer,
    search_keep_fp32,
    sensitivity,
    sensitivity_priors,
)
from graphbisect.workflows.scratch import work_folder

__all__ = ["PrecisionResult", "find_precision"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrecisionResult:
    """What `graphbisect precision` found; ``to_json`` is the documented ``--json`` schema."""

    mode: PrecisionMode
    units: tuple[str, ...]
    keep_fp32: tuple[str, ...]
    minimal: bool
    alone: tuple[str, ...]
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

    def to_json(self) -> dict[str, object]:
        return {
            "mode": self.mode.value, "lowering": self.lowering, "units": len(self.units),
            "keep_fp32": list(self.keep_fp32), "minimal": self.minimal, "breaks_alone": list(self.alone),
            "prefix_keep_fp32": None if self.prefix_keep_fp32 is None else len(self.prefix_keep_fp32),
            "prefix_last_node": self.prefix_keep_fp32[-1] if self.prefix_keep_fp32 else None,
            "all_lowered_meets_tolerance": self.all_lowered_meets,
            "meets_tolerance": self.meets_tolerance,
            "final_metrics": {k: (v if np.isfinite(v) else str(v)) for k, v in self.final_metrics.items()},
            "sensitivity": [row.to_json() for row in self.sensitivity],
            "invocations": dict(self.invocations), "seconds": round(self.seconds, 3),
            "files": [str(p) for p in self.files], **self.extra,
        }


@dataclass
class _Session:
    model: Model
    workdir: Path
    inputs_path: Path
    expected: dict[str, np.ndarray]
    store: ActivationStore | None


def _capture(model: Model, oracle: str, feeds: Mapping[str, np.ndarray], workdir: Path) -> tuple[_Session, int]:
    inputs_path = save_inputs(workdir / "inputs.npz", feeds)
    spec, info = resolve(oracle)
    if not info.has(Capability.ONNX_INPUT):
        raise BackendError(f"the precision oracle must run ONNX models; {spec.name!r} does not",
                           hint="use --oracle onnxruntime:opt_level=disable or --oracle reference")
    names = model.intermediate_names() if info.has(Capability.INTERMEDIATES) else list(model.output_names)
    probe = workdir / "probe.onnx"
    save_proto(model.with_outputs(names), probe)
    with BackendProcess(spec, workdir=workdir / "oracle") as proc:
        run = proc.run(probe, inputs_path, output_dir=workdir / "activations")
        if not run.ok:
            raise BackendError(f"the oracle {spec} failed on the FP32 model: {run.describe()}",
                               hint="choose another oracle, e.g. --oracle reference")
        store = ActivationStore.adopt(workdir / "activations") if len(names) > len(model.output_names) else None
        expected = {name: np.asarray(run.outputs[name]) for name in model.output_names}
        return _Session(model, workdir, Path(inputs_path), expected, store), proc.invocations


def _lowering(session: _Session, mode: PrecisionMode, method: CalibrationMethod) -> Lowering:
    if mode is not PrecisionMode.INT8:
        return Lowering(session.model, mode)
    feeds = dict(np.load(session.inputs_path))
    if session.store is None:
        raise InputError("int8 calibration needs the oracle's intermediate tensors",
                         hint="use an oracle that exposes intermediates (onnxruntime, reference)")
    tensors = {**feeds, **{name: session.store[name] for name in session.store.names()}}
    return Lowering(session.model, mode, Calibration.from_tensors(tensors, method=method))


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
) -> PrecisionResult:
    """Find a 1-minimal set of nodes to keep in FP32 with the rest in ``mode`` (see the module docstring)."""
    started = time.monotonic()
    mode = mode if isinstance(mode, PrecisionMode) else PrecisionMode.parse(mode)
    method = calibration if isinstance(calibration, CalibrationMethod) else CalibrationMethod.parse(calibration)
    stage = on_stage or (lambda _msg: None)
    with work_folder(workdir, "precision") as (folder, _kept):
        feeds = validate_inputs(model, inputs) if inputs is not None else random_inputs(model, seed=seed)
        stage(f"capturing the FP32 oracle's activations ({oracle})")
        session, oracle_runs = _capture(model, oracle, feeds, folder)
        lowering = _lowering(session, mode, method)
        if not lowering.units:
            raise InputError(f"the model has no node that {mode.value} can lower",
                             hint="only float32 arithmetic nodes are lowered; data movement stays as is")
        tol = tolerance or Tolerance(atol=1e-2, rtol=1e-2)
        return _search(session, lowering, target, tol, started=started, oracle_runs=oracle_runs,
                       out_dir=out_dir, with_sensitivity=with_sensitivity, with_prefix=with_prefix,
                       max_invocations=max_invocations, stage=stage)


def _search(session: _Session, lowering: Lowering, target: str, tol: Tolerance, *, started: float,
            oracle_runs: int, out_dir: Path | None, with_sensitivity: bool, with_prefix: bool,
            max_invocations: int | None, stage: Callable[[str], None]) -> PrecisionResult:
    n = len(lowering.units)
    with BackendProcess(target, workdir=session.workdir / "target") as proc:
        tester = PrecisionTester(lowering, proc, session.workdir / "candidates", session.inputs_path,
                                 expected=session.expected, tol=tol)
        ev = Evaluator(tester, n, allow_empty=True, budget=Budget(max_invocations=max_invocations))
        stage(f"checking the FP32 baseline and the fully lowered model ({n} lowerable nodes)")
        if ev.evaluate(ev.universe, phase="baseline").outcome is not Outcome.FAIL:
            raise BackendError(
                f"the target {target} does not meet the tolerance even with every node in FP32",
                hint="the target disagrees with the oracle without any lowering: run `graphbisect compare` / "
                "`graphbisect reduce` first, or loosen --atol/--rtol")
        all_lowered = ev.evaluate(frozenset(), phase="all-lowered").outcome is Outcome.FAIL
        rows: list[SensitivityRow] = []
        prior: dict[int, float] | None = None
        if with_sensitivity:
            stage(f"sensitivity: 2 runs per node for {n} nodes")
            rows = sensitivity(tester, n)
            prior = sensitivity_priors(rows, n)
        elif not all_lowered:
            prior = _evidence_priors(session, lowering, tester, tol)
        stage("searching the fewest nodes to keep in FP32")
        result = search_keep_fp32(ev, prior)
        alone = [r.unit for r in rows if r.breaks_alone] if rows else alone_breakers(ev, result.keep)
        prefix = prefix_answer(ev) if with_prefix and not all_lowered else None
        search_runs = proc.invocations
    stage("verifying the answer in a fresh target worker")
    verified, metrics, verify_runs = _verify(session, lowering, target, tol, result.keep)
    files = _write_artifacts(out_dir, lowering, result.keep, rows) if out_dir is not None else ()
    return PrecisionResult(
        mode=lowering.mode, units=tuple(lowering.names(range(n))), keep_fp32=tuple(lowering.names(result.keep)),
        minimal=result.minimal, alone=tuple(lowering.names(alone)),
        prefix_keep_fp32=None if prefix is None or prefix.found is None else tuple(lowering.names(range(prefix.found))),
        sensitivity=tuple(rows), meets_tolerance=verified, final_metrics=metrics, all_lowered_meets=all_lowered,
        invocations={"oracle": oracle_runs, "target": search_runs, "verification": verify_runs,
                     "search_tests": ev.stats().tests},
        lowering=_describe_lowering(lowering), seconds=time.monotonic() - started, files=tuple(files),
    )


def _evidence_priors(session: _Session, lowering: Lowering, tester: PrecisionTester,
                     tol: Tolerance) -> dict[int, float] | None:
    """Priors from one probed run of the fully lowered model (layerwise amplification)."""
    if session.store is None:
        return None
    names = [n for n in session.model.intermediate_names() if n in session.store]
    measured = tester.measure(frozenset(), expose=names)
    if not measured.run.ok:
        log.info("the probed lowered model does not run (%s); no layerwise priors", measured.run.describe())
        return None
    report = analyze_layers(session.model.nodes, session.store, measured.run.outputs, tol)
    return layerwise_priors(report, lowering)


def _verify(session: _Session, lowering: Lowering, target: str, tol: Tolerance,
            keep: frozenset[int]) -> tuple[bool, dict[str, float], int]:
    with BackendProcess(target, workdir=session.workdir / "verify") as proc:
        measured = PrecisionTester(lowering, proc, session.workdir / "verify-candidates", session.inputs_path,
                                   expected=session.expected, tol=tol).measure(keep)
        return measured.meets, measured.metrics(), proc.invocations


def _write_artifacts(out_dir: Path, lowering: Lowering, keep: frozenset[int], rows: list[SensitivityRow]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    model = lowering.model
    keep_names = lowering.names(keep)
    overrides = PrecisionOverrides(
        lowering.mode.value, tuple(keep_names),
        tuple(sorted({model.nodes[lowering.units[u]].op_type for u in keep})),
        tuple(lowering.names(set(range(len(lowering.units))) - keep)))
    files = write_overrides(overrides, out_dir)
    files.append(save_proto(lowering.lower(keep), out_dir / "mixed_precision.onnx"))
    if lowering.mode is PrecisionMode.FP16:
        typed = Lowering(model, lowering.mode, typed=True)
        files.append(save_proto(typed.lower(keep), out_dir / "mixed_precision_typed.onnx"))
    if rows:
        chart = out_dir / "sensitivity.svg"
        by_unit = sorted(rows, key=lambda r: r.unit)
        atomic_write_text(chart, sensitivity_chart_svg([(r.unit, r.node, r.score, r.breaks_alone) for r in by_unit],
                                                       lowering.mode.value))
        files.append(chart)
    return files


def _describe_lowering(lowering: Lowering) -> str:
    if lowering.mode is PrecisionMode.INT8:
        method = lowering.calibration.method.value if lowering.calibration else "?"
        return f"int8 QDQ (uint8 per-tensor activations, int8 per-channel weights, {method} calibration)"
    return (f"{lowering.mode.value} emulated: inputs and outputs of lowered nodes rounded through "
            f"{lowering.mode.value} (Cast pairs), float32 arithmetic inside the node")
