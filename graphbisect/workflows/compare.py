"""`compare`: run oracle and target on a model, give a verdict, then localize the divergence layer by layer.

Backend invocations are the cost, so the oracle runs once and the target at most twice, the oracle's run
at the same time as the target's first (one after the other when both would compute on one accelerator:
:func:`~graphbisect.backends.registry.shared_accelerator`). The target runs the plain model (the verdict
that matters, since exposing intermediates changes what a backend fuses) and then a probe model (skipped with
``layerwise=False`` or when a backend cannot). The oracle's one run is its probe, exposing every
intermediate tensor (its final outputs are its verdict when it computes the graph as written; one that
rewrites the graph also runs the plain model, whose outputs are its verdict: :func:`_plain_runs`);
without layerwise it runs the plain model. The target's probe exposes only the tensors that survive in the
graph it compiled when it can describe that graph (:mod:`graphbisect.workflows.probe`, the probe `reduce`
uses too), so a fusion bug stays visible and each compiled node maps back to the original nodes it
replaced; ``all_tensors=True`` probes every tensor of the target as well. Where the target can run the
optimized model its plain run saved (ONNX Runtime), that model with the surviving tensors exposed is the
probe — the same kernels, no second optimizing build — when its final outputs are bit-identical to the
plain run's; otherwise the probe model is built again, and ``target_probe`` says which ran and why.
The oracle's probed run writes straight into an :class:`~graphbisect.data.ActivationStore`, which the
reduce engine reuses to feed cut points; the target's worker compares its probe's tensors with that store
and returns only their statistics (``BackendProcess.run(compare_to=...)``), so the target's values are never
written to disk nor held by this process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import onnx

from graphbisect.backends import (
    BackendInfo,
    BackendProcess,
    BackendSpec,
    Capability,
    Phase,
    RunResult,
    RunStatus,
    resolve,
)
from graphbisect.backends.base import brief_spec
from graphbisect.backends.cost import CallTally, Cost
from graphbisect.backends.process import CompareTo, compile_cache, prestart
from graphbisect.backends.registry import DEFAULT_ORACLE, DEFAULT_TARGET, shared_accelerator
from graphbisect.compare import Comparison, TensorStats, Tolerance, compare_outputs
from graphbisect.compare.metrics import comparison_of
from graphbisect.compare.quantization import with_quantization
from graphbisect.data import (
    ActivationStore,
    ChosenDim,
    chosen_dims,
    dims_note,
    random_inputs,
    save_inputs,
    validate_inputs,
)
from graphbisect.errors import BackendError
from graphbisect.localize.compiled import CompiledGraph
from graphbisect.localize.layerwise import (
    LayerRow,
    LayerwiseReport,
    RootCause,
    TensorSource,
    analyze_layers,
    ranked_with,
    tensor_stats,
)
from graphbisect.model import Model
from graphbisect.model.graph import warn_unused_initializers
from graphbisect.model.normalize import elem_types, infer_types
from graphbisect.oracle.as_built import (
    CaptureDifference,
    OracleIncomplete,
    OracleRuns,
    capture_as_built,
    oracle_failed_hint,
    require_outputs,
)
from graphbisect.oracle.floor import NoiseFloor, floor_spec, measure_floor
from graphbisect.oracle.outcome import Outcome, OutcomeClass, classify_comparison, classify_failed_run
from graphbisect.oracle.signature import CHECK_REJECTED
from graphbisect.oracle.tester import OutputCheck, check_accepts
from graphbisect.storage.values import bit_identical
from graphbisect.text.printable import plural, shown
from graphbisect.workflows.alone import MAX_REGIONS, AloneCheck, run_alone
from graphbisect.workflows.probe import (
    ProbePlan,
    TargetProbe,
    compiled_of,
    describing_spec,
    discard_description,
    mapping_ahead,
    plan_probe,
    replay_model,
    replay_spec,
    unfed_inputs,
)
from graphbisect.workflows.scratch import work_folder

__all__ = ["DEFAULT_ORACLE", "DEFAULT_TARGET", "CompareResult", "OracleFailed", "compare_models",
           "model_for_backend"]

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class CompareResult:
    """Everything `graphbisect compare` found; ``to_json`` is the documented ``--json`` schema."""

    model: Model
    oracle: BackendSpec
    target: BackendSpec
    versions: Mapping[str, Mapping[str, object]]  # role -> RunResult.ran_with (library, version, interpreter)
    inputs_path: Path
    oracle_run: RunResult
    target_run: RunResult
    comparison: Comparison | None  # None when the target crashed
    layerwise: LayerwiseReport | None
    layerwise_note: str | None  # why layerwise data are missing or partial
    probe_masking: bool
    probed_comparison: Comparison | None
    invocations: Mapping[str, int]  # role -> runs
    seconds: float
    outcome: Outcome  # what the result means: pass, divergence, random-op, target-unsupported... (oracle/outcome.py)
    store_dir: Path | None = None
    #: role -> {"runs", "compiles", "compile_cache_hits"}: every backend call by kind, compiles included
    #: (:mod:`graphbisect.backends.cost`)
    backend_calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    extra: Mapping[str, object] = field(default_factory=dict)
    compiled: CompiledGraph | None = None  # what the target compiled, when it described it (the probe's basis)
    target_probe: TargetProbe | None = None  # what the target's layerwise probe ran (None: no probe)
    # how a rewriting oracle's capture differs from its run of the model as built (None: not measured)
    oracle_capture: CaptureDifference | None = None
    # the target's noise floor (None: not looked for, e.g. the target passed or nothing was captured)
    noise_floor: NoiseFloor | None = None
    # the tolerance compared with: the caller's, with the model's quantized tensors and their steps
    tolerance: Tolerance | None = None
    #: how failing nodes whose inputs the target did not expose were run alone (None: there were none)
    root_cause_check: AloneCheck | None = None
    #: the inputs' dynamic dims graphbisect sized (random inputs without a shape for them): the verdict
    #: holds for these sizes only (:attr:`dims_note`)
    chosen_dims: tuple[ChosenDim, ...] = ()
    #: the Python check's verdict on the outputs (``compare(check=...)``), which decides :attr:`passed`;
    #: None when the tolerance judged them
    check_passed: bool | None = None

    @property
    def dims_note(self) -> str | None:
        """What a verdict on sizes graphbisect chose must say (:func:`graphbisect.data.dims_note`), or None."""
        return dims_note(self.chosen_dims)

    @property
    def passed(self) -> bool:
        """The verdict: the target ran and its outputs are acceptable (within the tolerance, or accepted by
        the Python ``check`` when one judged them: :attr:`check_passed`)."""
        if not self.target_run.ok or self.comparison is None:
            return False
        return self.check_passed if self.check_passed is not None else self.comparison.passed

    # The --json fields that are not dataclass fields, as typed attributes (JSON: their ``to_json``).
    @property
    def verdict(self) -> str:
        """``"pass"`` or ``"fail"`` (:attr:`passed`)."""
        return "pass" if self.passed else "fail"

    @property
    def inputs(self) -> Path | None:
        """The inputs file used, when it outlives the run (a temporary work folder is gone by now)."""
        return self.inputs_path if self.inputs_path.is_file() else None

    @property
    def target_status(self) -> str:
        """The target's plain run in one line: ``ok``, or how it failed (:meth:`RunResult.describe`)."""
        return self.target_run.describe()

    @property
    def outputs(self) -> tuple[TensorStats, ...]:
        """How each model output compares (empty when the target crashed)."""
        return self.comparison.outputs if self.comparison is not None else ()

    @property
    def first_divergence(self) -> LayerRow | None:
        """The first tensor, in topological order, that fails above the noise floor (None: none, or no table)."""
        return self.layerwise.first_divergence if self.layerwise is not None else None

    @property
    def root_causes(self) -> tuple[RootCause, ...]:
        """The failing (compiled) nodes ranked by how much error they add, roots first."""
        return self.layerwise.root_causes if self.layerwise is not None else ()

    @property
    def layers(self) -> tuple[LayerRow, ...]:
        """Every row of the layerwise table (empty without one)."""
        return self.layerwise.rows if self.layerwise is not None else ()

    @property
    def compiled_graph(self) -> CompiledGraph | None:
        """What the target compiled, when it described it (the same as :attr:`compiled`)."""
        return self.compiled

    @property
    def judged_by(self) -> str:
        """What decided the verdict on a completed run: ``tolerance`` or ``python-check``."""
        return "tolerance" if self.check_passed is None else "python-check"

    def to_json(self) -> dict[str, object]:
        first = self.first_divergence
        compiled = self.compiled
        return {
            "verdict": self.verdict,
            "judged_by": self.judged_by,
            "check_passed": self.check_passed,
            "model": {"path": str(self.model.origin) if self.model.origin else None,
                      **({"converted": str(self.model.path)} if self.model.paddle_source and self.model.path else {}),
                      "fingerprint": self.model.fingerprint, "nodes": len(self.model.nodes)},
            "oracle": str(self.oracle),
            "target": str(self.target),
            "versions": {role: dict(facts) for role, facts in self.versions.items()},
            "inputs": None if self.inputs is None else str(self.inputs),
            "target_status": self.target_status,
            "outcome": self.outcome.to_json(),
            "outputs": [s.to_json() for s in self.outputs],
            "first_divergence": None if first is None else {
                "node": first.node, "op_type": first.op_type, "tensor": first.tensor,
                "index": first.index, "score": first.stats.to_json()["score"],
                "compiled_as": None if first.compiled_as is None else first.compiled_as.to_json(),
                # the target's value was matched to this tensor by inference (Paddle's hooks), not named by it
                "aligned": compiled is not None and compiled.aligned and first.tensor in compiled.values},
            "root_causes": [rc.to_json() for rc in self.root_causes],
            "layers": [row.to_json() for row in self.layers],
            "layerwise_note": self.layerwise_note,
            "probe_masking": self.probe_masking,
            "compiled_graph": None if compiled is None else {
                "source": compiled.source, "nodes": len(compiled.nodes),
                "fused": sum(n.fused for n in compiled.nodes), "surviving": len(compiled.surviving),
                "unmapped": len(compiled.unmapped),
                # the compiled nodes the target computed in a narrower type than the model (issue 26)
                "lower_precision": [{"name": n.name, "kind": n.kind, "originals": list(n.originals),
                                     "precision": list(n.precision), "model_precision": list(n.model_precision)}
                                    for n in compiled.lower_precision]},
            "target_probe": None if self.target_probe is None else self.target_probe.to_json(),
            "oracle_capture": None if self.oracle_capture is None else self.oracle_capture.to_json(),
            "noise_floor": None if self.noise_floor is None else self.noise_floor.to_json(),
            "tolerance": None if self.tolerance is None else {
                "atol": self.tolerance.atol, "rtol": self.tolerance.rtol, "min_cosine": self.tolerance.min_cosine,
                "int_atol": self.tolerance.int_atol, "quantized_tensors": len(self.tolerance.quantized)},
            "root_cause_check": None if self.root_cause_check is None else self.root_cause_check.to_json(),
            "chosen_dims": [dim.to_json() for dim in self.chosen_dims],
            "dims_note": self.dims_note,
            "invocations": dict(self.invocations),
            "backend_calls": {role: dict(calls) for role, calls in self.backend_calls.items()},
            "seconds": round(self.seconds, 3),
            **self.extra,  # e.g. the CLI's random_inputs notes and seed, or the user's --inputs file
        }


def model_for_backend(model: Model, spec: BackendSpec, onnx_path: Path) -> Path:
    """The file a backend runs: the ONNX model, or the original Paddle model for Paddle Inference."""
    _, info = resolve(spec, require_available=False)
    if info.has(Capability.ONNX_INPUT):
        return onnx_path
    if model.paddle_source is None:
        raise BackendError(
            f"backend {spec.name!r} runs only its own model format, and {model.path} is not a Paddle model",
            hint="give a Paddle inference model (folder or prefix with .json/.pdmodel + .pdiparams), "
            "or choose an ONNX backend such as onnxruntime",
        )
    return model.paddle_source


def compare_models(
    model: Model,
    *,
    oracle: BackendSpec | str = DEFAULT_ORACLE,
    target: BackendSpec | str = DEFAULT_TARGET,
    inputs: Mapping[str, np.ndarray] | None = None,
    tolerance: Tolerance | None = None,
    workdir: Path | None = None,
    layerwise: bool = True,
    all_tensors: bool = False,
    seed: int = 0,
    on_stage: Callable[[str], None] | None = None,
    workers: tuple[BackendProcess, BackendProcess] | None = None,
    chosen: Sequence[ChosenDim] = (),
    check: OutputCheck | None = None,
) -> CompareResult:
    """Compare ``target`` against ``oracle`` on ``model`` and localize the first divergence.

    ``workdir`` receives the normalized model, the inputs and the oracle's activation store; a temporary
    folder is used when it is None (and the store is then not kept). ``all_tensors`` probes every
    intermediate of the target even when it can describe what it compiled.
    ``workers``: running (oracle, target) workers to use, left open (comparing many models without starting
    workers per model); a target worker of :func:`describing_spec` gives the compiled-graph probe.
    ``chosen``: the dynamic dims graphbisect sized when it drew ``inputs`` (:func:`graphbisect.data.chosen_dims`;
    found here when ``inputs`` is None), which the result reports. ``check``: a Python callable
    ``check(outputs, expected) -> bool`` given the target's and the oracle's values of the model's outputs,
    which decides the verdict instead of the tolerance (as ``reduce``'s; the comparison and the layerwise table
    are still the tolerance's view).
    Raises :class:`OracleFailed` (with its :class:`Outcome`) when the oracle cannot run the model.
    """
    started = time.monotonic()
    oracle_spec, oracle_info = resolve(oracle)
    target_spec, target_info = resolve(target)
    if workers is None:  # the zygote our workers fork from imports while this process works (as the CLI has it)
        for spec in [oracle_spec, *([target_spec] if target_spec != oracle_spec else [])]:
            prestart(spec)
    warn_unused_initializers(model)  # before a build that may take minutes
    # quantized tensors are compared in quantization steps (compare/quantization.py)
    tol = with_quantization(tolerance or Tolerance(), model)
    stage = on_stage or (lambda _msg: None)
    with work_folder(workdir, "compare", protect=(model.path, model.paddle_source)) as (folder, kept), \
            compile_cache(folder / "compile-cache"):
        oracle_described, described = _describing_specs(oracle_spec, oracle_info, target_spec, target_info,
                                                        layerwise=layerwise, all_tensors=all_tensors, workers=workers)
        with contextlib.ExitStack() as stack:
            oracle_proc, target_proc = workers or (
                stack.enter_context(BackendProcess(oracle_described or oracle_spec, workdir=folder / "oracle")),
                stack.enter_context(BackendProcess(described or target_spec, workdir=folder / "target")))
            inputs_path = _write_inputs_and_model(model, folder, inputs, seed, starting=(oracle_proc, target_proc))
            found = _compare_in(model, folder, inputs_path, oracle_proc, target_proc, oracle_spec=oracle_spec,
                                oracle_info=oracle_info, target_spec=target_spec, target_info=target_info,
                                oracle_described=oracle_described is not None, described=described,
                                own_workers=workers is None, layerwise=layerwise, tol=tol, check=check, stage=stage)
        return replace(
            found, seconds=time.monotonic() - started,
            store_dir=folder / "activations" if kept and (folder / "activations").is_dir() else None,
            chosen_dims=tuple(chosen) if inputs is not None else chosen_dims(model))


def _during_target(model: Model, folder: Path, *, capturing: bool, described: BackendSpec | None
                   ) -> tuple[_Later, Callable[[], Path] | None]:
    """What this process does while the target builds (started by :func:`_plain_runs`), and the wait for the
    oracle's probe model among it (None: no capture).

    The target's worker starts first with nothing else on the CPU: the oracle's probe model (shape inference) is
    made once it has its run request, while the target builds (on 2 cores a probe model written while both
    workers start delays the target's build, which is the longer one on a model that it optimizes; and shape
    inference holds the interpreter's lock, so started before the request it held the request up).
    """
    during = _Later()
    probe_model = during.add(lambda: _write_capture_model(model, folder), "graphbisect-probe") if capturing else None
    if described is not None and "save_optimized" in described.options:
        # what mapping its saved optimized model needs of the model is made while the target builds, once the
        # probe model the oracle waits for is written (one thread at a time runs Python here)
        def ahead() -> None:
            if probe_model is not None:
                probe_model()
            mapping_ahead(model)

        during.add(ahead, "graphbisect-original")
    return during, probe_model


def _describing_specs(oracle_spec: BackendSpec, oracle_info: BackendInfo, target_spec: BackendSpec,
                      target_info: BackendInfo, *, layerwise: bool, all_tensors: bool,
                      workers: tuple[BackendProcess, BackendProcess] | None
                      ) -> tuple[BackendSpec | None, BackendSpec | None]:
    """(the oracle's, the target's) spec asked to describe what it compiles, None for one that runs as given.

    The target describes what it compiled on both its runs (the probe's description is not used); a backend
    that cannot run a probe model (Paddle) returns its compiled graph's tensors from the plain run. The caller's
    ``workers`` decide what they describe.
    """
    if workers is not None:
        return (workers[0].spec if workers[0].spec != oracle_spec else None,
                workers[1].spec if workers[1].spec != target_spec else None)
    described = describing_spec(target_spec) \
        if layerwise and (not all_tensors or not target_info.has(Capability.ONNX_INPUT)) else None
    oracle_described = describing_spec(oracle_spec) \
        if layerwise and not oracle_info.has(Capability.ONNX_INPUT) else None
    return oracle_described, described


def _compare_in(model: Model, folder: Path, inputs_path: Path, oracle_proc: BackendProcess,
                target_proc: BackendProcess, *, oracle_spec: BackendSpec, oracle_info: BackendInfo,
                target_spec: BackendSpec, target_info: BackendInfo, oracle_described: bool,
                described: BackendSpec | None, own_workers: bool, layerwise: bool, tol: Tolerance,
                check: OutputCheck | None, stage: Callable[[str], None]) -> CompareResult:
    """The comparison in started workers: the verdict's runs, then the localization; each worker of our own
    is closed once it has done its part. The caller fills in the time taken, the kept store and the dims."""
    cost_before = (oracle_proc.cost, target_proc.cost)
    capturing = layerwise and _probe_possible(oracle_info, target_info) and not oracle_described
    # The oracle's worker makes its runtime while the target's does (this process only waits meanwhile): its
    # capture then starts as soon as its probe model is written. Not where both use one GPU (run one at a time).
    oracle_ready = _in_background(oracle_proc.validate, "graphbisect-oracle-init") \
        if shared_accelerator(oracle_spec, target_spec) is None else (lambda: None)
    target_proc.validate()
    during, probe_model = _during_target(model, folder, capturing=capturing, described=described)

    def after_target(run: RunResult) -> _TargetEarly | None:
        return _TargetEarly.start(model, run, target_proc, replay=capturing, folder=folder) \
            if described is not None else None

    oracle_side, target_run, early = _plain_runs(model, folder, inputs_path, oracle_proc=oracle_proc,
                                                 target_proc=target_proc, oracle_spec=oracle_spec,
                                                 oracle_info=oracle_info, target_spec=target_spec,
                                                 oracle_described=oracle_described, probe_model=probe_model,
                                                 oracle_ready=oracle_ready, during_target=during.start,
                                                 tolerance=tol, stage=stage, after_target=after_target)
    # The oracle has done its part: its worker exits while the target works (less memory, and its
    # interpreter's teardown is off the critical path). A caller's workers stay open.
    oracle_closed = _in_background(oracle_proc.close) if own_workers else (lambda: None)
    comparison, check_passed = _verdict(model, oracle_side.run, target_run, tol, check)
    target = _Side(target_proc, target_info, target_run, None, spec=target_proc.spec)
    local = _localize(model, folder, inputs_path, oracle_side, target, comparison=comparison, early=early,
                      described=described is not None, enabled=layerwise, oracle_spec=oracle_spec,
                      target_spec=target_spec, tol=tol, stage=stage)
    # The target has done its part: its worker exits while the verdicts are put together.
    target_closed = _in_background(target_proc.close, "graphbisect-target") if own_workers else (lambda: None)
    note, masking = _layerwise_note(model, local, oracle_side, target_run, comparison=comparison, tol=tol)
    calls = CallTally({"oracle": oracle_proc.cost - cost_before[0],
                       "target": target_proc.cost - cost_before[1]
                       + (local.floor.cost if local.floor is not None else Cost())})
    oracle_closed()
    target_closed()
    return CompareResult(
        model=model, oracle=oracle_spec, target=target_spec, inputs_path=inputs_path,
        versions={"oracle": dict(oracle_side.run.ran_with), "target": dict(target_run.ran_with)},  # measured there
        oracle_run=oracle_side.run, target_run=target_run, comparison=comparison, layerwise=local.layers,
        layerwise_note=note, probe_masking=masking, probed_comparison=local.probed_comparison,
        invocations=calls.runs(), backend_calls=calls.to_json(), seconds=0.0,
        compiled=local.plan.compiled, target_probe=local.probed.probe,
        oracle_capture=oracle_side.as_built.difference if oracle_side.as_built is not None else None,
        outcome=_checked(classify_comparison(target_run, comparison, model.nodes, local.floor), check_passed),
        noise_floor=local.floor, tolerance=tol, root_cause_check=local.alone, check_passed=check_passed,
    )


@dataclass(frozen=True)
class _Localized:
    """What localizing the divergence found: the target's probe plan and what probing gave, the target's noise
    floor, the layerwise table with the outputs as probed and the uncertain root causes run alone, and what the
    table cannot show."""

    plan: ProbePlan
    probed: _Probed
    floor: NoiseFloor | None = None
    layers: LayerwiseReport | None = None
    probed_comparison: Comparison | None = None
    alone: AloneCheck | None = None
    note: str | None = None


def _localize(model: Model, folder: Path, inputs_path: Path, oracle: _Side, target: _Side, *,
              comparison: Comparison | None, early: _TargetEarly | None, described: bool, enabled: bool,
              oracle_spec: BackendSpec, target_spec: BackendSpec, tol: Tolerance, stage: Callable[[str], None]
              ) -> _Localized:
    """Probe the target, measure its noise floor when the outputs fail, and compare layer by layer."""
    spec, info = target_spec, target.info
    plan, probed = _plan_and_probe(model, folder, inputs_path, oracle, target, described=described, early=early,
                                   enabled=enabled, tol=tol, stage=stage)
    floor = None
    if oracle.store is not None and comparison is not None and not comparison.passed:
        floor = _noise_floor(model, folder, inputs_path, oracle.store, target_spec=spec, target_info=info,
                             oracle_spec=oracle_spec, tol=tol, stage=stage)
    if probed.oracle is None or (probed.target is None and probed.measured is None):
        return _Localized(plan, probed, floor, note=probed.note)
    layers, probed_comparison, alone = _layers(
        model, probed, plan.compiled, comparison, oracle, tol=tol, floor=floor, stage=stage,
        proc=target.proc, spec=spec, info=info, inputs_path=inputs_path, folder=folder)
    bodies = _unprobed_bodies(model)
    note = f"{probed.note}; {bodies}" if probed.note and bodies else probed.note or bodies
    return _Localized(plan, probed, floor, layers, probed_comparison, alone, note)


def _layerwise_note(model: Model, local: _Localized, oracle: _Side, target_run: RunResult, *,
                    comparison: Comparison | None, tol: Tolerance) -> tuple[str | None, bool]:
    """(the layerwise note, whether the probe masks the failure): the outputs as probed give the other verdict
    than the plain run's, which the note then says, unless the oracle's capture is what differs."""
    note = local.note
    plain_failed = comparison is None or not comparison.passed
    probed = local.probed_comparison
    masking = probed is not None and (not probed.passed) != plain_failed
    capture_note, the_oracles = _capture_note(model, oracle, target_run, probed, tol)
    masking = masking and not the_oracles  # the oracle's capture is no masking by the target's probe
    if masking:
        note = _masking_note(plain_failed, local.plan)
    if capture_note:
        note = capture_note if the_oracles else "; ".join(filter(None, (note, capture_note)))
    return note, masking


def _verdict(model: Model, oracle: RunResult, target: RunResult, tol: Tolerance, check: OutputCheck | None
             ) -> tuple[Comparison | None, bool | None]:
    """(the outputs compared within the tolerance, None when the target failed; the Python check's verdict on
    them, None without a check or a completed run)."""
    if not target.ok:
        return None, None
    comparison = compare_outputs(oracle.outputs, target.outputs, tol, model.output_names)
    if check is None:
        return comparison, None
    return comparison, check_accepts(check, target, oracle.outputs.__getitem__, model.output_names)


def _checked(outcome: Outcome, check_passed: bool | None) -> Outcome:
    """The outcome when a Python check judged the outputs: its verdict, whatever the tolerance says."""
    if check_passed is None:
        return outcome
    if not check_passed:
        return Outcome(OutcomeClass.DIVERGENCE, CHECK_REJECTED)
    beyond = "" if outcome.cls is OutcomeClass.PASS else f" (the tolerance says {outcome})"
    return Outcome(OutcomeClass.PASS, f"the Python check accepted the outputs{beyond}")


def _layers(model: Model, probed: _Probed, compiled: CompiledGraph | None, comparison: Comparison | None,
            oracle: _Side, *, tol: Tolerance, floor: NoiseFloor | None, stage: Callable[[str], None],
            proc: BackendProcess, spec: BackendSpec, info: BackendInfo, inputs_path: Path, folder: Path,
            ) -> tuple[LayerwiseReport, Comparison, AloneCheck | None]:
    """The layerwise table, the outputs as probed, and how uncertain root causes were run alone (if they were)."""
    assert probed.oracle is not None  # the caller checked
    stage("comparing layer by layer")
    probed_comparison = _probed_comparison(model, probed, tol)
    layer_report = analyze_layers(model.nodes, probed.oracle, probed.target, tol, compiled=compiled,
                                  measured=probed.measured, outputs=model.output_names, floor=floor)
    alone = None
    if comparison is not None and comparison.passed:
        # the outputs match: no intermediate difference causes a failure ("Unsqueeze_5: 1 [carries]"
        # listed for a passing model was noise); the rows and the first divergence still show them
        layer_report = replace(layer_report, root_causes=())
    elif layer_report.uncertain:
        layer_report, alone = _settle_uncertain(
            model, layer_report, compiled=compiled, oracle=oracle, proc=proc, spec=spec, info=info,
            inputs_path=inputs_path, folder=folder, tol=tol, floor=floor, stage=stage)
    return layer_report, probed_comparison, alone


def _settle_uncertain(model: Model, report: LayerwiseReport, *, compiled: CompiledGraph | None, oracle: _Side,
                      proc: BackendProcess, spec: BackendSpec, info: BackendInfo, inputs_path: Path, folder: Path,
                      tol: Tolerance, floor: NoiseFloor | None, stage: Callable[[str], None]
                      ) -> tuple[LayerwiseReport, AloneCheck]:
    """The failing nodes whose inputs the target did not expose, run alone on the oracle's values in one more
    target run (:mod:`graphbisect.workflows.alone`), and the table ranked again with what that showed."""
    uncertain = [row.node for row in report.uncertain]
    if oracle.store is None or not _probeable(info):
        why = ("the oracle's values come from its hooks, not a store" if oracle.store is None
               else "the target runs only its own model format")
        return report, AloneCheck(str(spec), 0, 0, 0, unconfirmed=tuple(uncertain),
                                  note=f"not run alone: {why}")
    stage(f"running {plural(min(len(uncertain), MAX_REGIONS), 'failing node')} whose inputs the target did not expose "
          "(or that compute exactly on inputs already off) "
          "alone on the oracle's values (one target run)")
    described = proc.spec
    plain = described != spec and proc.can_reconfigure(spec)
    if plain:
        proc.reconfigure(spec)  # no saved optimized model needed for this run
    try:
        stats, check = run_alone(model, report, compiled=compiled, store=oracle.store, inputs_path=inputs_path,
                                 proc=proc, tol=tol, floor=floor, workdir=folder / "alone")
    finally:
        if plain:
            proc.reconfigure(described)
    return ranked_with(report, stats, floor), check


def _noise_floor(model: Model, folder: Path, inputs_path: Path, store: ActivationStore, *, target_spec: BackendSpec,
                 target_info: BackendInfo, oracle_spec: BackendSpec, tol: Tolerance,
                 stage: Callable[[str], None]) -> NoiseFloor:
    """The target's noise floor on every captured tensor (:mod:`graphbisect.oracle.floor`): one run of the
    target with its optimizations off, when that is not the oracle itself."""
    decided = floor_spec(target_spec, target_info, oracle_spec)
    if isinstance(decided, NoiseFloor):
        return decided
    names = [n for n in _every_intermediate(model) if n in store]
    probe = folder / "probe-floor.onnx"
    _save_proto(model.with_outputs(names), probe)
    stage(f"measuring the target's noise floor: {brief_spec(decided)} (its optimizations off) on "
          f"{plural(len(names), 'tensor')}")
    try:
        return measure_floor(decided, probe, inputs_path, store.directory, tol, workdir=folder / "floor")
    finally:
        probe.unlink(missing_ok=True)


def _write_inputs_and_model(model: Model, folder: Path, inputs: Mapping[str, np.ndarray] | None, seed: int, *,
                            starting: Sequence[BackendProcess]) -> Path:
    """Write the model and the run's inputs (given or seeded random) into ``folder``; return the inputs' path.

    The ``starting`` workers are started first: their interpreters and imports overlap this writing and the
    model's type inference, which checking or drawing the inputs is the first to need.
    """
    for proc in starting:
        proc.start()
    model.save(folder / "model.onnx")
    feeds = validate_inputs(model, inputs) if inputs is not None else random_inputs(model, seed=seed)
    inputs_path = folder / "inputs.npz"
    save_inputs(inputs_path, feeds)
    return inputs_path


def _unprobed_bodies(model: Model) -> str | None:
    """What the layerwise table cannot show: the nodes inside If/Loop/Scan bodies (only the control-flow
    node's own outputs are probed: a body's tensors are not graph tensors a backend can expose)."""
    holders: list[str] = []
    inside = 0
    for node in model.nodes:
        bodies = [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]
        if bodies:
            holders.append(f"{node.op_type} {shown(node.name)}")
            inside += sum(_body_nodes(g) for g in bodies)
    if not holders:
        return None
    return (f"the bodies of {len(holders)} control-flow node(s) ({', '.join(holders[:3])}"
            f"{', ...' if len(holders) > 3 else ''}; {inside} nodes inside) are not probed: the table shows "
            "only their outputs, so a divergence inside a body shows at the If/Loop/Scan node")


def _body_nodes(graph: onnx.GraphProto) -> int:
    count = 0
    for node in graph.node:
        count += 1
        for a in node.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                count += _body_nodes(g)
    return count


@dataclass(frozen=True)
class _Probed:
    oracle: TensorSource | None = None
    target: Mapping[str, np.ndarray] | None = None  # the target's values, or None with `measured`
    measured: Mapping[str, TensorStats] | None = None  # the target's statistics, measured in its worker
    note: str | None = None
    probe: TargetProbe | None = None  # what the target ran for them


@dataclass(frozen=True)
class _Side:
    """One backend of the comparison: its worker, table row, plain run and its compiled graph if described.

    ``store``: the oracle's activation store when its run captured every intermediate; ``probe_failure``: the
    capture run, when it failed and the plain model was run instead; ``as_built``: the oracle's capture and,
    when it rewrites the graph, its run of the model as built with how their outputs differ.
    """

    proc: BackendProcess
    info: BackendInfo
    run: RunResult
    compiled: CompiledGraph | None
    store: ActivationStore | None = None
    probe_failure: RunResult | None = None
    as_built: OracleRuns | None = None
    spec: BackendSpec | None = None  # what its plain run ran under (its worker may serve a replay meanwhile)

    @property
    def built(self) -> BackendSpec:
        return self.spec or self.proc.spec


def _probeable(info: BackendInfo) -> bool:
    return info.has(Capability.INTERMEDIATES) and info.has(Capability.ONNX_INPUT)


def _probe_possible(oracle: BackendInfo, target: BackendInfo) -> bool:
    """Whether the oracle's every intermediate may be needed: it can expose them, and the target can expose
    its own or return its compiled graph's tensors from the plain run (Paddle's hooks)."""
    return _probeable(oracle) and (_probeable(target) or target.has(Capability.COMPILED_GRAPH))


def _every_intermediate(model: Model) -> list[str]:
    outputs = set(model.output_names)
    return [n for n in model.intermediate_names() if n not in outputs]


def _plain_runs(model: Model, folder: Path, inputs_path: Path, *, oracle_proc: BackendProcess,
                target_proc: BackendProcess, oracle_spec: BackendSpec, oracle_info: BackendInfo,
                target_spec: BackendSpec, oracle_described: bool, probe_model: Callable[[], Path] | None,
                tolerance: Tolerance, oracle_ready: Callable[[], None], during_target: Callable[[], None],
                stage: Callable[[str], None], after_target: Callable[[RunResult], _TargetEarly | None]
                ) -> tuple[_Side, RunResult, _TargetEarly | None]:
    """The verdict's runs: the oracle's and the target's, at the same time (each in its own worker) unless
    both use one accelerator (:func:`~graphbisect.backends.registry.shared_accelerator`: a TensorRT target and
    a CUDA-provider oracle on GPU 0), which runs the oracle first.

    With ``probe_model`` (which waits for it: :func:`_write_capture_model`) the oracle's run is its capture: the
    probe model exposing every intermediate, written as the activation store. When the oracle computes the graph as
    written (``reference``, ONNX Runtime at ``opt_level=disable``: :meth:`BackendInfo.computes_as_written`),
    exposing tensors cannot change what it computes, so the capture's final outputs are its verdict too and the
    oracle runs once. An oracle that rewrites the graph (ONNX Runtime at ``all``, OpenVINO) may build the probe
    differently from the model, so its verdict comes from a plain run of the model, after the capture in the same
    worker (:func:`~graphbisect.oracle.as_built.capture_as_built`, which measures how the two differ). When the
    capture fails, the plain model decides whether the oracle can run it at all. ``after_target`` starts what
    the target's run allows while the oracle's run goes on (:class:`_TargetEarly`); it is finished on an error.
    ``during_target`` starts what this process does while the target builds (the probe model among it), once
    the target's worker has its request (at once when the oracle runs first); ``oracle_ready`` waits for the
    oracle's worker to have made its runtime (begun by the caller, while the target's did).
    """
    onnx_path = folder / "model.onnx"
    oracle_model = model_for_backend(model, oracle_spec, onnx_path)
    target_model = model_for_backend(model, target_spec, onnx_path)
    store_dir = folder / "activations"
    if probe_model is not None:
        stage(f"running target {target_spec}, and oracle {oracle_spec} capturing "
              f"{len(_every_intermediate(model))} intermediate tensors")

        def oracle_job() -> OracleRuns:
            oracle_ready()
            return capture_as_built(lambda path, out: oracle_proc.run(path, inputs_path, output_dir=out),
                                    probe_model(),
                                    oracle_model, outputs=model.output_names, tolerance=tolerance, spec=oracle_spec,
                                    rewrites=not oracle_info.computes_as_written(oracle_spec, elem_types(model.proto)),
                                    capture_dir=store_dir)
    else:
        stage(f"running oracle {oracle_spec} and target {target_spec}")

        def oracle_job() -> OracleRuns:
            oracle_ready()
            return OracleRuns(oracle_proc.run(oracle_model, inputs_path))
    shared = shared_accelerator(oracle_spec, target_spec)
    if shared is not None:  # two runs on one GPU at once would distort each other's timings and memory
        stage(f"running oracle {oracle_spec}, then target {target_spec}: both run on {shared}")
        during_target()  # the oracle's run, first, waits for the probe model
    oracle_result = _in_background(oracle_job) if shared is None else _at_once(oracle_job)
    target_run = _target_run(target_proc, target_model, inputs_path, during_target)
    early = after_target(target_run)
    try:
        oracle_side = _oracle_side(model, oracle_result, oracle_proc, oracle_info, plain_model=oracle_model,
                                   inputs_path=inputs_path, spec=oracle_spec, described=oracle_described,
                                   store_dir=store_dir if probe_model is not None else None)
    except BaseException as exc:
        if early is not None and isinstance(exc, Exception):  # its worker serves its plain spec again (a signal
            early.finish()  # ends the run: its workers are killed, and nothing waits for a build ahead)
        raise
    return oracle_side, target_run, early


def _target_run(proc: BackendProcess, model: Path, inputs_path: Path, during: Callable[[], None]) -> RunResult:
    """The target's plain run, ``during`` started once its worker has the request (or the request failed:
    the oracle's run may wait for what ``during`` makes)."""
    try:
        return proc.run(model, inputs_path, sent=during)
    finally:
        during()


def _write_capture_model(model: Model, folder: Path) -> Path:
    """Write the oracle's probe model, exposing every intermediate, into ``folder``; return its path."""
    path = folder / "probe.onnx"
    _save_proto(model.with_outputs(_every_intermediate(model)), path)
    return path


def _oracle_side(model: Model, result: Callable[[], OracleRuns], proc: BackendProcess, info: BackendInfo, *,
                 plain_model: Path, inputs_path: Path, spec: BackendSpec, described: bool,
                 store_dir: Path | None) -> _Side:
    """The oracle's side once its runs are done: the verdict's run, the activation store its capture wrote into
    ``store_dir`` (None: it did not capture), or its plain run when the capture failed."""
    try:
        runs = result()
    except OracleIncomplete as exc:
        raise _incomplete(exc) from exc
    oracle_run = runs.verdict
    store = probe_failure = as_built = None
    if store_dir is not None:
        if runs.capture.ok:
            store = ActivationStore.adopt(store_dir)  # index the worker's files as the activation store, no copy
            as_built = runs
        else:
            probe_failure, oracle_run = runs.capture, proc.run(plain_model, inputs_path)
    _require_oracle_ok(oracle_run, spec, model.output_names)
    compiled = compiled_of(model, oracle_run.info) if described else None
    return _Side(proc, info, oracle_run, compiled, store, probe_failure, as_built)


_T = TypeVar("_T")


def _in_background(job: Callable[[], _T], name: str = "graphbisect-oracle") -> Callable[[], _T]:
    """Start ``job`` in a daemon thread; the returned function waits for its result (or raises its error).

    A daemon thread, so an interrupted compare does not wait at exit for a run whose worker is being killed.
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = job()
        except BaseException as exc:  # handed to the waiting caller
            box["error"] = exc

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()

    def wait() -> _T:
        thread.join()
        if "error" in box:
            raise box["error"]
        return cast(_T, box["result"])

    return wait


class _Later:
    """Background jobs (:func:`_in_background`) started together when :meth:`start` is first called; the
    function :meth:`add` returns waits for its job to be started and done."""

    def __init__(self) -> None:
        self._jobs: list[tuple[Callable[[], Any], str, dict[str, Callable[[], Any]]]] = []
        self._started = threading.Event()
        self._lock = threading.Lock()

    def add(self, job: Callable[[], _T], name: str) -> Callable[[], _T]:
        box: dict[str, Callable[[], Any]] = {}
        self._jobs.append((job, name, box))

        def wait() -> _T:
            self._started.wait()
            return cast(_T, box["wait"]())

        return wait

    def start(self) -> None:
        with self._lock:
            if not self._started.is_set():
                for job, name, box in self._jobs:
                    box["wait"] = _in_background(job, name)
                self._started.set()


def _at_once(job: Callable[[], _T]) -> Callable[[], _T]:
    """Run ``job`` now; the returned function gives its result (:func:`_in_background`'s interface)."""
    result = job()
    return lambda: result


def _hooked_values(model: Model, side: _Side) -> dict[str, np.ndarray] | None:
    """The values a backend's plain run already returned for its compiled graph's tensors (Paddle's hooks).

    paddle2onnx gives a 0-D tensor of the program the shape [1] (a ``sum`` becomes ReduceSum → Reshape): a hooked
    0-D value of a tensor the model declares or infers as [1] is read as [1], the same value (compared as it is, it
    was a shape mismatch, "inf×", on a PASS)."""
    if side.compiled is None or not side.compiled.values or not side.run.ok:
        return None
    outputs = side.run.outputs
    values = {tensor: outputs[key] for tensor, key in side.compiled.values.items() if key in outputs}
    scalars = [tensor for tensor, value in values.items() if np.ndim(value) == 0]
    if scalars:
        types = infer_types(model.proto)
        for tensor in scalars:
            dims = list(types[tensor].type.tensor_type.shape.dim) if tensor in types else []
            if len(dims) == 1 and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
                values[tensor] = np.reshape(values[tensor], (1,))
    values.update({name: outputs[name] for name in model.output_names if name in outputs})
    return values


def _plan_and_probe(model: Model, workdir: Path, inputs_path: Path, oracle: _Side, target: _Side, *,
                    described: bool, early: _TargetEarly | None, enabled: bool, tol: Tolerance,
                    stage: Callable[[str], None]) -> tuple[ProbePlan, _Probed]:
    """The target's probe plan (from the compiled graph its plain run described) and what probing gave.

    The replay's session is built by the target's worker while this process maps the compiled graph
    (:class:`_ReplayAhead`), both started by ``early`` during the oracle's run where it is given; the saved
    optimized model is deleted once the probe has run.
    """
    run = target.run
    ahead = early.ahead if early is not None else None
    prepared = _probe_ahead(early)  # the target's worker is this thread's once that is built
    if ahead is not None and (not enabled or oracle.store is None):
        ahead.finish()  # no probe will run it
        ahead = None
    if early is None and enabled and described and run.ok and oracle.store is not None:
        ahead = _ReplayAhead.start(model, [n for n in _every_intermediate(model) if n in oracle.store],
                                   target.proc, run)
    try:
        compiled = early.compiled() if early is not None else compiled_of(model, run.info) if described and run.ok \
            else None
        plan = plan_probe(model, compiled)
        probed = _probe(model, workdir, inputs_path, oracle, replace(target, compiled=plan.compiled),
                        plan=plan, enabled=enabled, tol=tol, stage=stage, ahead=ahead, prepared=prepared)
    finally:
        if ahead is not None:
            ahead.finish()
        discard_description(run.info)  # the replay, if any, has run it
    return plan, probed


def _probe_ahead(early: _TargetEarly | None) -> _ProbeAhead | None:
    """The probe model built ahead (:class:`_ProbeAhead`) once it is, or None; one that failed is built again
    by its run, which reports what happens (the mapping's own error is raised where it is used)."""
    try:
        return early.probe() if early is not None else None
    except Exception:
        log.debug("building the probe model ahead failed", exc_info=True)
        return None


def _probe(model: Model, workdir: Path, inputs_path: Path, oracle: _Side, target: _Side, *, plan: ProbePlan,
           enabled: bool, tol: Tolerance, stage: Callable[[str], None], ahead: _ReplayAhead | None = None,
           prepared: _ProbeAhead | None = None) -> _Probed:
    """The oracle's and the target's intermediate values (the target's as statistics where it can).

    A backend whose plain run returned its compiled graph's tensors (Paddle's output hooks) is not run
    again. Otherwise the oracle's values are the activation store its run captured (:func:`_plain_runs`),
    and the target runs a probe exposing ``plan.names`` (among the tensors the oracle has); its worker
    compares them with the store and returns only their statistics. ``ahead``: the replay whose session
    the target's worker may be building already (:class:`_ReplayAhead`).
    """
    if not enabled:
        return _Probed(note="layerwise comparison was not requested")
    oracle_values: TensorSource | None = _hooked_values(model, oracle)
    target_values: Mapping[str, np.ndarray] | None = _hooked_values(model, target)
    refused = _without_intermediates(oracle, oracle_values, target, target_values)
    if refused is not None:
        return refused
    if oracle_values is None:
        if oracle.store is None:
            failure = oracle.probe_failure.describe() if oracle.probe_failure is not None else "not run"
            return _Probed(note=f"the oracle failed on the probe model ({failure}); only final outputs were compared")
        oracle_values = oracle.store
    if target_values is not None:
        return _Probed(oracle=oracle_values, target=target_values,
                       probe=TargetProbe("plain run", str(target.built), len(target_values)))
    if not target.run.ok and target.run.phase is Phase.LOAD:
        # the probe model is the model with more outputs: a build that crashed (or hung) on the model costs as
        # much again on the probe (a compile of minutes for IREE), and most often fails the same way
        return _Probed(note=f"the target failed to build the model ({target.run.describe(200)}), "
                       "so its probe model was not built; only the oracle's intermediates were captured")
    names = [n for n in plan.names if n in oracle_values]
    fallback = None
    if plan.compiled is not None and oracle.store is not None and replay_spec(target.built) is not None:
        replayed = _replay(model, inputs_path, oracle.store, target, names, plan=plan, tol=tol, stage=stage,
                           ahead=ahead)
        if isinstance(replayed, _Probed):
            return replayed
        fallback = replayed
        log.info("the target's probe model is built again: the replay of its optimized model was not used: %s",
                    fallback)
    if ahead is not None:
        ahead.finish()  # the target's worker serves the plain spec again
    return _probe_model(model, workdir, inputs_path, oracle, target, oracle_values=oracle_values, names=names,
                        plan=plan, fallback=fallback, tol=tol, stage=stage, prepared=prepared)


def _without_intermediates(oracle: _Side, oracle_values: TensorSource | None, target: _Side,
                           target_values: Mapping[str, np.ndarray] | None) -> _Probed | None:
    """Why there is no layerwise table when a backend whose plain run returned no intermediate tensors cannot
    expose them either; None when both sides can give theirs."""
    for role, side, values in (("oracle", oracle, oracle_values), ("target", target, target_values)):
        if values is None and not _probeable(side.info):
            why = ("it described what it compiled, but graphbisect could not map that to the ONNX model "
                   "(the log says why)"
                   if side.info.has(Capability.COMPILED_GRAPH) and side.run.ok else "it cannot expose them")
            return _Probed(note=f"the {role} backend {side.info.name!r} gave no intermediate tensors: {why}; "
                           "only final outputs were compared")
    return None


def _probe_model(model: Model, workdir: Path, inputs_path: Path, oracle: _Side, target: _Side, *,
                 oracle_values: TensorSource, names: list[str], plan: ProbePlan, fallback: str | None,
                 tol: Tolerance, stage: Callable[[str], None], prepared: _ProbeAhead | None = None) -> _Probed:
    """The target's run of the probe model exposing ``names``: its worker compares them with the oracle's store
    and returns their statistics (or writes its values, when the oracle's came from hooks). ``fallback``: why
    the replay of its optimized model was not used instead (None: none was tried). ``prepared``: the probe
    model written (and built) ahead, run when it exposes exactly ``names``."""
    probe = TargetProbe("probe model", str(target.proc.spec), len(names), fallback)
    probe_path = workdir / "probe.onnx"
    failed_build = None
    if prepared is not None and list(prepared.names) == names:
        target_probe = prepared.path
        # a crash at load is what its run would report: not built again; a timeout, met beside the oracle's
        # capture, may be that contention's: built again by the run
        failed_build = prepared.built if prepared.built.status is RunStatus.CRASH else None
    elif names == _every_intermediate(model) and probe_path.exists():
        target_probe = probe_path  # the oracle's probe model: every intermediate
    else:
        target_probe = _write_target_probe(model, workdir, names)
    stage(f"running the target with {plan.describe()} exposed" if len(names) == len(plan.names)
          else f"running the target with {plural(len(names), 'tensor')} exposed")
    if failed_build is not None:
        target_run = failed_build
    elif oracle.store is not None:
        target_run = target.proc.run(target_probe, inputs_path, compare_to=CompareTo(oracle.store.directory, tol))
    else:  # the oracle's values came from its hooks: no store for the worker to read
        target_run = target.proc.run(target_probe, inputs_path, output_dir=workdir / "target-activations")
    discard_description(target_run.info)
    if not target_run.ok and not target.run.ok:
        return _Probed(note=f"the target failed on the probe model too ({target_run.describe()}); "
                       "only the oracle's intermediates were captured")
    if not target_run.ok:
        return _Probed(note=f"the target failed on the probe model ({target_run.describe()}) although the "
                       "plain model ran: the model with its intermediates exposed as outputs does not run there; "
                       "use `graphbisect reduce` to localize without probing")
    if oracle.store is not None:
        return _Probed(oracle=oracle_values, target=target_run.outputs, measured=target_run.stats, probe=probe)
    return _Probed(oracle=oracle_values, target=target_run.outputs, probe=probe)


def _write_target_probe(model: Model, folder: Path, names: Sequence[str]) -> Path:
    """Write the target's probe model, ``model`` exposing ``names``, into ``folder``; return its path."""
    path = folder / "probe-target.onnx"
    _save_proto(model.with_outputs(names), path)
    return path


def _replay(model: Model, inputs_path: Path, store: ActivationStore, target: _Side, names: list[str], *,
            plan: ProbePlan, tol: Tolerance, stage: Callable[[str], None], ahead: _ReplayAhead | None = None
            ) -> _Probed | str:
    """The target's probe as a replay of the optimized model its plain run saved, or why there is none.

    The replay (:func:`~graphbisect.workflows.probe.replay_model`, run under
    :func:`~graphbisect.workflows.probe.replay_spec` in the target's worker) executes the kernels the plain
    run built without building them again; exposing the surviving tensors then changes nothing the
    optimizer could see. It stands for the plain build only when it computes what that build computed: its
    final outputs must be bit-identical to the plain run's (same kernels, same machine, same threads). A
    replay that cannot expose every planned tensor, fails, or differs is not used: the caller builds the
    probe model instead, as before. ``ahead``'s replay (built while the compiled graph was mapped) is run
    when it exposes exactly the tensors this one exposes, and is otherwise written again for them.
    """
    built = target.built
    spec = replay_spec(built)
    saved = target.run.info.get("optimized_model")
    if ahead is not None and ahead.finished:  # put away already (_ProbeAhead): written again for ``names``
        ahead = None
    if spec is None or not target.proc.can_reconfigure(spec):
        return f"the worker of {built} cannot run {spec}"
    if not isinstance(saved, str) or not Path(saved).is_file():
        return "the target's plain run saved no optimized model"
    replay_path = Path(saved).with_name("replay.onnx")
    try:
        exposed = _write_replay(model, Path(saved), replay_path, names, ahead)
        if isinstance(exposed, str):
            return exposed
        stage(f"running the target's own optimized model ({spec}) with {plan.describe()} exposed")
        target.proc.reconfigure(spec)
        try:
            run = target.proc.run(replay_path, inputs_path, [*model.output_names, *exposed],
                                  compare_to=CompareTo(store.directory, tol, keep=tuple(model.output_names)))
        finally:
            target.proc.reconfigure(built)
    finally:
        replay_path.unlink(missing_ok=True)
    if not run.ok:
        return f"the replay failed ({run.describe()})"
    differ = [name for name in model.output_names
              if name not in run.outputs or not bit_identical(target.run.outputs[name], run.outputs[name])]
    if differ:
        return (f"its final output(s) {', '.join(differ[:3])} are not bit-identical to the plain run's, so it "
                "may not compute what the plain build computed")
    return _Probed(oracle=store, target=run.outputs, measured=run.stats,
                   probe=TargetProbe("replay", str(spec), len(exposed)))


def _write_replay(model: Model, saved: Path, replay_path: Path, names: list[str], ahead: _ReplayAhead | None
                  ) -> list[str] | str:
    """Write the replay of ``saved`` exposing ``names`` at ``replay_path`` (or keep ``ahead``'s when it exposes
    the same); return what it exposes, or why it cannot stand for the plain build's probe."""
    if ahead is not None:  # written for every captured tensor the optimized model computes: ``names`` too
        exposed = ahead.exposure(names)
        prebuilt = ahead.wait() and exposed == ahead.exposed
    else:
        try:
            exposed = replay_model(saved, model, names, replay_path)
        except Exception as exc:  # e.g. an optimized model onnx cannot read: the probe model is built instead
            log.info("cannot write the replay of %s", saved, exc_info=True)
            return f"its saved optimized model could not be read or rewritten ({type(exc).__name__}: {exc})"
        prebuilt = False
    found = set(exposed)
    missing = [name for name in names if name not in found]
    if missing:
        return _not_exposed(model, missing)
    if ahead is not None and not prebuilt:  # the replay of exactly these tensors (ahead's checked its inputs)
        replay_model(saved, model, names, replay_path)
    unfed = unfed_inputs(replay_path, model) if ahead is None else []
    if unfed:
        return f"the optimized model it saved reads {len(unfed)} input(s) the model lacks ({_listed(unfed)})"
    return exposed


def _not_exposed(model: Model, missing: list[str]) -> str:
    """Why the replay cannot expose the planned tensors ``missing``."""
    untyped = [name for name in missing if not _typed(model, name)]
    if untyped:
        return (f"{plural(len(untyped), 'surviving tensor')} {'has' if len(untyped) == 1 else 'have'} "
                f"no type onnx could infer ({_listed(untyped)}): "
                "the replay declares each tensor it exposes with the model's element type, so that ORT "
                "refuses one its optimized graph computes in another")
    return (f"{plural(len(missing), 'surviving tensor')} ({_listed(missing)}) "
            f"{'is not a tensor' if len(missing) == 1 else 'are not tensors'} of the optimized "
            "model it saved (e.g. kept only in ONNX Runtime's blocked NCHWc layout)")


class _ReplayAhead:
    """The target's replay (:func:`_replay`) written, and its session built by the target's worker, while this
    process maps the compiled graph (``compiled_of``: ~0.27 s at 5,000 nodes on a 2-core AMD EPYC) that decides
    what it exposes.

    It exposes every intermediate the oracle captured that the optimized model computes under its own name,
    which is exactly what the replay exposes whenever no planned tensor vanished into another name or a
    merged one (a fused LayerNorm keeps its last node's name). :func:`_replay` runs it only then and otherwise
    writes the replay of its own tensors, as it would have without this; the build here is no invocation
    (:meth:`BackendProcess.load`), so the count of target runs does not change either way.
    """

    def __init__(self, proc: BackendProcess, built: BackendSpec, path: Path, exposed: list[str],
                 loaded: Callable[[], bool]) -> None:
        self.proc, self.built, self.path, self.exposed = proc, built, path, exposed
        self._loaded = loaded
        self._finished = False

    @classmethod
    def start(cls, model: Model, names: Sequence[str], proc: BackendProcess, plain: RunResult
              ) -> _ReplayAhead | None:
        """Write the replay of ``plain``'s saved optimized model exposing ``names`` (every intermediate the
        oracle captures, or will capture) and have ``proc`` build it in the background; None where
        :func:`_replay` would not run one anyway (it then says why)."""
        built, saved = proc.spec, plain.info.get("optimized_model")
        spec = replay_spec(built)
        if spec is None or not proc.can_reconfigure(spec) or not isinstance(saved, str) or not Path(saved).is_file():
            return None
        path = Path(saved).with_name("replay.onnx")
        written: list[list[str]] = []  # the outputs, once the file is written
        ready = threading.Event()

        def load() -> bool:
            proc.reconfigure(spec)
            proc.validate()  # the worker's runtime for the replay is made while the file is written
            ready.wait()
            return bool(written) and proc.load(path, written[0])

        loaded = _in_background(load, "graphbisect-replay")
        exposed: list[str] = []
        try:
            exposed = replay_model(Path(saved), model, list(names), path)
            if not unfed_inputs(path, model):  # else _replay writes it again, and says why
                written.append([*model.output_names, *exposed])
        except Exception:  # _replay tries again, and says why
            log.debug("cannot write the replay of %s ahead", saved, exc_info=True)
        finally:
            ready.set()
        ahead = cls(proc, built, path, exposed, loaded)
        if not written:
            ahead.finish()  # nothing to build: the worker serves the plain spec again
            return None
        return ahead

    def exposure(self, names: Sequence[str]) -> list[str]:
        """What :func:`~graphbisect.workflows.probe.replay_model` exposes of ``names`` (all among those this
        replay was written for): the ones it exposed, in the order of ``names``."""
        exposed = set(self.exposed)
        return [name for name in names if name in exposed]

    def wait(self) -> bool:
        """Wait for the worker's build; whether it built the session."""
        return self._loaded()

    @property
    def finished(self) -> bool:
        """Whether the worker is back on the plain spec and the file removed (:meth:`finish`)."""
        return self._finished

    def finish(self) -> None:
        """Wait for the build, put the worker back on the plain spec and remove the file (once)."""
        if self._finished:
            return
        self._finished = True
        try:
            self.wait()
        except Exception:  # the replay was not used, or its own run reported what went wrong
            log.debug("building the replay ahead failed", exc_info=True)
        finally:
            self.proc.reconfigure(self.built)
            self.path.unlink(missing_ok=True)


class _TargetEarly:
    """What the target's plain run lets this process start while the oracle's run goes on (on a large model
    its capture of every tensor ends last): the mapping of the compiled graph the target described
    (:func:`~graphbisect.workflows.probe.compiled_of`, in a thread), the replay written and built ahead
    (:class:`_ReplayAhead`) and, where the replay cannot stand for the probe, the probe model (:class:`_ProbeAhead`).
    None changes what is found: the mapping is the same function of the same run, and the replay or the probe
    model is run only when it exposes exactly the tensors the probe plans."""

    def __init__(self, compiled: Callable[[], CompiledGraph | None], ahead: _ReplayAhead | None,
                 probe: Callable[[], _ProbeAhead | None] = lambda: None) -> None:
        self.compiled, self.ahead, self.probe = compiled, ahead, probe

    @classmethod
    def start(cls, model: Model, run: RunResult, proc: BackendProcess, *, replay: bool, folder: Path
              ) -> _TargetEarly:
        """Start mapping ``run``'s compiled graph and, with ``replay`` (the oracle captures), writing and building
        its replay exposing every intermediate (what the capture will hold) where the target has one, and its
        probe model where the replay cannot stand for the probe or there is none (:class:`_ProbeAhead`)."""
        if not run.ok:
            return cls(lambda: None, None)
        # the replay first: its file is what the target's worker waits for, the mapping only this process
        ahead = _ReplayAhead.start(model, _every_intermediate(model), proc, run) if replay else None
        compiled = _in_background(lambda: compiled_of(model, run.info), "graphbisect-mapping")
        if not replay or not _probeable(proc.backend):  # no probe model will run (no capture, or Paddle's hooks)
            return cls(compiled, ahead)
        return cls(compiled, ahead, _ProbeAhead.start(model, folder, proc, compiled, ahead))

    def finish(self) -> None:
        """Put the target's worker back on its plain spec (the mapping's thread needs nothing). Only a replay
        built ahead moved it off that spec: without one, a probe model still building is not waited for (an
        error is not held up by a compile of minutes; the caller's worker takes its next request after it)."""
        if self.ahead is None:
            return
        with contextlib.suppress(Exception):  # the probe's job finishes the replay first where it builds
            self.probe()
        self.ahead.finish()


class _ProbeAhead:
    """The target's probe model written, and built by the target's worker, while the oracle still captures,
    wherever the probe will be that model: a target without a replay of what it compiled (OpenVINO, IREE,
    TensorRT, onnxoptimizer) and ONNX Runtime where the replay cannot stand for the probe (its NCHWc Conv keeps
    a surviving tensor only in its blocked layout, under no original name, on a conv net on x86). Built after
    the capture it was more time after it on an 860-node OCR model: ~0.1 s with ONNX Runtime, ~0.2 s with
    OpenVINO against a ``reference`` oracle (whose capture ends long after the target's run).

    Written for the tensors the plan probes as the capture will hold them (every intermediate the oracle
    computes); :func:`_probe_model` runs it only when it probes exactly those, and otherwise writes its own, as
    it would have without this. The build is a compile, no invocation (:meth:`BackendProcess.compile`), and the
    run that follows uses it: the counts are those of a probe built later. A build that crashed is the probe's
    result as it is (the crash at load its run would have reported), not built a second time; one that timed
    out (beside the capture, whose load may be the cause) is built again by the run.
    Nothing is built where the target's plain run returned its compiled graph's tensors (Paddle's hooks).
    """

    def __init__(self, path: Path, names: tuple[str, ...], built: RunResult) -> None:
        self.path, self.names, self.built = path, names, built

    @staticmethod
    def start(model: Model, folder: Path, proc: BackendProcess, compiled: Callable[[], CompiledGraph | None],
              replay: _ReplayAhead | None) -> Callable[[], _ProbeAhead | None]:
        """Once ``compiled`` is mapped, build the probe model in the background unless ``replay`` (built
        ahead for every intermediate) exposes every tensor the plan probes; the returned function waits for it."""

        def job() -> _ProbeAhead | None:
            graph = compiled()
            if graph is None or graph.values:
                return None  # no plan, or the plain run's hooks gave the tensors: no probe runs
            names = plan_probe(model, graph).names
            if replay is not None and not set(names) - set(replay.exposed):
                return None  # the replay runs
            if replay is not None:
                replay.finish()  # the worker serves the plain spec again
            path = _write_target_probe(model, folder, names)
            return _ProbeAhead(path, names, proc.compile(path))

        return _in_background(job, "graphbisect-probe-ahead")


def _typed(model: Model, name: str) -> bool:
    declared = model.boundary_type(name)
    return declared is not None and declared.type.HasField("tensor_type") and bool(declared.type.tensor_type.elem_type)


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _probed_comparison(model: Model, probed: _Probed, tol: Tolerance) -> Comparison:
    """The verdict of the target's probe on the model's outputs (plain vs probed: probe masking)."""
    oracle = probed.oracle
    assert oracle is not None
    return comparison_of((tensor_stats(name, oracle, probed.target, tol, probed.measured)
                          for name in model.output_names), tol)


def _capture_note(model: Model, oracle: _Side, target_run: RunResult, probed: Comparison | None,
                  tol: Tolerance) -> tuple[str | None, bool]:
    """(what the layerwise table's oracle column is when the oracle's capture computes otherwise than the
    oracle as built, else None; whether that capture is what flips the probed verdict).

    The verdict compares the target's plain run with the oracle's plain run; the layerwise table (and its
    verdict on the outputs) compares the target's probe with the oracle's capture. Judging the target's plain
    outputs against the capture changes one side at a time: when that already gives the probed verdict, the
    flip is the oracle's capture, not the target's probe.
    """
    runs = oracle.as_built
    if runs is None or runs.difference is None or not runs.differs:
        return None, False
    text = (f"ORACLE CAPTURE DIFFERS: {runs.difference.why(oracle.proc.spec)}, so the layerwise table compares "
            "the target with a build of the oracle that is not the one the verdict used")
    if probed is None or not target_run.ok:
        return text, False
    against_capture = compare_outputs(runs.capture.outputs, target_run.outputs, tol, model.output_names).passed
    if against_capture != probed.passed:
        return text, False
    spec, verb = oracle.proc.spec, "passes" if probed.passed else "fails"
    return (f"{text}. It is the oracle's capture, not the target's probe, that {verb} "
            f"where the model {'fails' if probed.passed else 'passes'} as built: the target's plain outputs "
            f"{'pass' if against_capture else 'fail'} against the capture too. To look at the oracle's own rewrite, "
            f"make it the target (--target {spec} --oracle reference)"), True


def _masking_note(plain_failed: bool, plan: ProbePlan) -> str:
    if plan.compiled is not None:
        return (f"PROBE MASKING: the model {'fails' if plain_failed else 'passes'} as built but "
                f"{'passes' if plain_failed else 'fails'} even when only {plan.describe()} are exposed: the "
                "target compiles the probe differently from the model, so the layerwise table describes "
                "another build. Run `graphbisect reduce` to find the failing subgraph structurally.")
    if plain_failed:
        return ("PROBE MASKING: the model fails as built, but passes once every intermediate is exposed — "
                "exposing tensors prevented the fusion or optimization that causes the bug, so the layerwise "
                "table cannot show it. Run `graphbisect reduce` to find the failing subgraph structurally.")
    return ("PROBE MASKING: the model passes as built but fails once intermediates are exposed; the "
            "layerwise table describes the probed build, not the one users run.")


class OracleFailed(BackendError):
    """The oracle could not run the model, so nothing was compared; ``outcome`` says how it failed
    (``oracle-unsupported``, ``oracle-crash``, ``oracle-timeout``)."""

    def __init__(self, message: str, *, hint: str | None = None, outcome: Outcome) -> None:
        super().__init__(message, hint=hint)
        self.outcome = outcome


def _require_oracle_ok(run: RunResult, spec: BackendSpec, outputs: Sequence[str]) -> None:
    if not run.ok:
        outcome = classify_failed_run(run, "oracle")
        raise OracleFailed(
            f"the oracle {spec} failed on this model ({outcome.cls.value}): {run.describe()}",
            outcome=outcome,
            hint=oracle_failed_hint(spec, run),
        )
    try:
        require_outputs(run, outputs, spec)
    except OracleIncomplete as exc:
        raise _incomplete(exc) from exc


def _incomplete(exc: OracleIncomplete) -> OracleFailed:
    """An oracle run without some graph outputs, as compare's error: a failure of the oracle at run."""
    return OracleFailed(exc.message, hint=exc.hint, outcome=Outcome(OutcomeClass.ORACLE_CRASH, exc.message))


def _save_proto(proto: object, path: Path) -> None:
    from graphbisect.model.io import save_proto

    save_proto(proto, path)  # type: ignore[arg-type]
