"""`passes`: name the optimization passes responsible for a failure, then (optionally) reduce under them.

Where the target can replay the graph it compiled (ONNX Runtime), the steps below run on the **region**
that diverges rather than on the whole model, and the answer is confirmed on the whole model
(:mod:`graphbisect.workflows.pass_region`, :func:`_on_region`); otherwise, or when that fails, on the whole
model. Candidates run one spec after another in one warm worker where the backend allows it
(:class:`~graphbisect.strategies.passes.SpecRunner`):

1. one oracle run: the expected outputs of every candidate;
2. the target as given, asked to report which passes fired (ORT ``report_passes=1``; Paddle and
   onnxoptimizer always report): the baseline signature and the fired list. A target that crashes before
   reporting (ORT's FuseReluClip on float64 fails session creation) is searched over every optimizer the
   installed ORT registers instead (its catalogue). For every backend the next run is the one that decides
   whether any set of passes explains the failure, every pass that could matter disabled, and the order is
   by cost: where the target reports what fired in the run itself, those passes; where the listing costs
   builds of its own (:attr:`~graphbisect.strategies.passes.PassControl.listing_builds`: IREE compiles the
   model once more per feature), the target runs plainly, then with every disable-able pass disabled
   (:func:`_decide_first`). When the failure stays, that is the answer; when it goes, that passing end and
   every disable-able pass are what the search runs over, and what fired is never listed (``source``
   :data:`NOT_NEEDED`): the listing costs a build per pass and more, the search about a build per halving;
3. the two ends (for a reported list): every fired, disable-able pass disabled must make the failure
   disappear (else it is not a pass bug, or a pass fired only once others were disabled: those are added
   and the end re-checked);
4. the minimal **disable-set** and the minimal **enable-set** (:mod:`graphbisect.strategies.passes`),
   and which culprits reproduce the failure alone (interactions: passes masking each other);
5. with a bundle folder: :func:`reduce_under_culprits` reduces the model with only the enable-set enabled,
   then records in the bundle a *control* spec (the culprits disabled too) that ``repro.py`` also runs, the
   optimized reduced model's nodes next to the reduced original (ORT/onnxoptimizer ``save_optimized=1``),
   and the pass findings in ``report.json``/``report.md``.

The searches keep a crash-safe journal in the work folder (scopes ``disable`` and ``enable``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphbisect.artifacts.bundle import BundleContent
from graphbisect.backends import BackendProcess, BackendSpec, Capability, RunResult, resolve
from graphbisect.backends.base import brief_spec
from graphbisect.backends.cost import CallTally, Cost
from graphbisect.backends.process import compile_cache
from graphbisect.backends.registry import BACKEND_SPEC
from graphbisect.checker.configurations import Configuration, check_configurations
from graphbisect.compare import Tolerance
from graphbisect.compare.quantization import with_quantization
from graphbisect.data import ChosenDim, dims_note, save_inputs, validate_inputs
from graphbisect.engine import Budget, Evaluator, Journal, Outcome, ProgressEvent, SearchAborted, SearchResult
from graphbisect.errors import GraphBisectError
from graphbisect.localize.compiled import compiled_graph
from graphbisect.model import Model
from graphbisect.model.io import remove_model, save_proto
from graphbisect.model.normalize import elem_types
from graphbisect.oracle.as_built import capture_as_built
from graphbisect.oracle.floor import NoiseFloor, floor_spec, measure_floor, no_floor
from graphbisect.oracle.identity import Identity, IdentityCheck
from graphbisect.oracle.signature import FailureKind, Signature
from graphbisect.oracle.tester import Judgement, judge
from graphbisect.settings.options import INVOCATIONS, TIMEOUT, check_fields, option
from graphbisect.storage.values import load_values_npz
from graphbisect.strategies.passes import (
    DISABLE,
    ENABLE,
    PassSpace,
    PassTester,
    SpecRunner,
    control_for,
    minimal_set,
    run_spec,
)
from graphbisect.text.shareable import shareable_text
from graphbisect.workflows.compare import DEFAULT_ORACLE, DEFAULT_TARGET, model_for_backend
from graphbisect.workflows.pass_region import Region, diverging_region, replay_model, replay_spec
from graphbisect.workflows.passes_claims import audited_fields, limits_of, passes_claims
from graphbisect.workflows.probe import compiled_of, describing_spec, discard_description, plan_probe
from graphbisect.workflows.scratch import own_folder

if TYPE_CHECKING:  # imported where a reduction runs (reduce_under_culprits), as the rest of passes needs none
    from graphbisect.workflows.reduce import ReduceOptions

__all__ = ["NOT_LISTED", "NOT_NEEDED", "PassesOptions", "PassesResult", "check_passes", "find_culprit_passes",
           "reduce_under_culprits"]

log = logging.getLogger(__name__)

_RULE_SET = re.compile(r"Level\d+_RuleBasedTransformer")

#: How often newly fired passes are added when disabling every fired pass does not remove the failure.
MAX_FIRED_ROUNDS = 3

#: ``PassesResult.source`` of a target that does not fail and whose fired passes were not asked for.
NOT_LISTED = "not listed"

#: ``PassesResult.source`` on a target whose listing costs builds of its own: which passes fired was not
#: measured. With every disable-able pass disabled the failure stays (that run is the answer), or it goes and
#: the search ran over every disable-able pass (cheaper than listing what fired).
NOT_NEEDED = "not needed"


@dataclass(frozen=True)
class PassesOptions:
    """What `graphbisect passes` compares and how."""

    oracle: str = option(DEFAULT_ORACLE, BACKEND_SPEC)
    target: str = option(DEFAULT_TARGET, BACKEND_SPEC)
    tolerance: Tolerance = field(default_factory=Tolerance)
    strict_band: bool = False
    timeout: float | None = option(None, TIMEOUT)
    max_invocations: int | None = option(None, INVOCATIONS)
    #: Search the passes on the region that diverges and confirm once on the whole model
    #: (:mod:`graphbisect.workflows.pass_region`); False searches the whole model, one build per candidate.
    region: bool = True

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class PassesResult:
    """What `graphbisect passes` found; ``to_json`` is the documented ``--json`` schema."""

    failed: bool
    signature: Signature
    target: str
    fired: tuple[str, ...] = ()  # as the target reported them (or its catalogue, see ``source``)
    searched: tuple[str, ...] = ()  # the units: fired and disable-able
    excluded: Mapping[str, str] = field(default_factory=dict)  # fired but never disabled, and why
    #: "reported", "catalogue" (the target crashed before reporting), :data:`NOT_LISTED` (the target does
    #: not fail and was not asked which passes fired: ``fired`` is empty because it is unknown, not because none did)
    #: or :data:`NOT_NEEDED` (listing what fired costs builds: ``fired`` is empty because it was not measured;
    #: ``searched`` holds every disable-able pass, disabled together when the failure stays, else searched)
    source: str = "reported"
    culprits: tuple[str, ...] = ()  # minimal disable-set
    required: tuple[str, ...] = ()  # minimal enable-set
    each_alone: tuple[str, ...] = ()  # culprits that reproduce the failure as the only enabled unit
    minimal: bool = False  # both sets proven 1-minimal
    culprit_target: str | None = None  # the target with only ``required`` enabled (of the units)
    fixed_target: str | None = None  # the target with ``culprits`` disabled: the workaround
    fixed_flags: str | None = None  # the same workaround as the backend's own setting (iree-compile flags)
    control_target: str | None = None  # ``culprit_target`` with the culprits disabled as well
    invocations: Mapping[str, int] = field(default_factory=dict)  # role -> runs
    #: role -> {"runs", "compiles", "compile_cache_hits"}: every backend call by kind, compiles included
    #: (:mod:`graphbisect.backends.cost`; IREE compiles once per feature to list what fired, when the answer
    #: needs that list)
    backend_calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    versions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # role -> RunResult.ran_with
    search: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: Where the search ran: ``{"searched_on": "region"|"whole model", ...}`` with, for a region, its nodes,
    #: the compiled node they became, target runs on the region and on the whole model, and what the
    #: whole-model confirmation verified.
    scope: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    #: the inputs' dynamic dims graphbisect sized (see :attr:`dims_note`)
    chosen_dims: tuple[ChosenDim, ...] = ()
    #: the trusted checker's verdict on each claim of this answer (:mod:`graphbisect.workflows.passes_claims`):
    #: ``{"holds", "claims": [{"id", "claim", "holds", "evidence"}], "runs", "calls", "seconds"}``; None: not checked
    audit: Mapping[str, Any] | None = None

    @property
    def dims_note(self) -> str | None:
        """What a verdict on sizes graphbisect chose must say (:func:`graphbisect.data.dims_note`), or None."""
        return dims_note(self.chosen_dims)

    def claim(self, claim_id: str) -> Mapping[str, Any] | None:
        """The checker's record of one claim (``audit``'s), or None when it was not checked."""
        claims = (self.audit or {}).get("claims") or ()
        return next((c for c in claims if c.get("id") == claim_id), None)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["chosen_dims"] = [dim.to_json() for dim in self.chosen_dims]
        data["dims_note"] = self.dims_note
        data["signature"] = self.signature.to_json()
        data["seconds"] = round(self.seconds, 3)
        data["excluded"] = dict(self.excluded)
        data["versions"] = {role: dict(facts) for role, facts in self.versions.items()}
        data["scope"] = dict(self.scope)
        return data


class _Session:
    """The state of one pass search: specs, files, expected values, run counts."""

    def __init__(self, model: Model, options: PassesOptions, workdir: Path,
                 on_stage: Callable[[str], None]) -> None:
        # quantized tensors compared in quantization steps, as compare and reduce compare them
        options = dataclasses.replace(options, tolerance=with_quantization(options.tolerance, model))
        self.model, self.options, self.work, self.stage = model, options, workdir, on_stage
        self.oracle_spec, self.oracle_info = resolve(options.oracle)
        self.target_spec, info = resolve(options.target)
        self.target_info = info
        #: the target's noise floor (:mod:`graphbisect.oracle.floor`), measured once the oracle has run
        self.floor: NoiseFloor | None = None
        #: the failure's identity on this model (the region's), when known: candidates failing otherwise are
        #: another failure (:mod:`graphbisect.oracle.identity`)
        self.identity: Identity | None = None
        if not info.has(Capability.PASSES):
            control_for(self.target_spec)  # raises with the list of backends that can ablate passes
        self.control = control_for(self.target_spec)
        self.invocations = {"oracle": 0, "target": 0}
        self.calls = CallTally({"oracle": Cost(), "target": Cost()})  # the same runs, and what they compiled
        self.ran_with: dict[str, dict[str, Any]] = {}  # role -> what its last worker measured
        self.notes: list[str] = []
        self.expected: dict[str, np.ndarray] = {}
        self.onnx_path = workdir / "model.onnx"
        self.inputs_path = workdir / "inputs.npz"
        self.runners = {role: SpecRunner(workdir / role, options.timeout) for role in ("oracle", "target")}
        self.scope: dict[str, Any] = {}  # where the search ran (PassesResult.scope)

    def prepare(self, inputs: Mapping[str, Any]) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        save_inputs(self.inputs_path, validate_inputs(self.model, inputs))
        self.model.save(self.onnx_path)

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()

    def run(self, spec: BackendSpec, role: str = "target", *, model: Path | None = None,
            outputs: Sequence[str] | None = None, output_dir: Path | None = None) -> RunResult:
        """One run of ``spec`` on the session's model (the Paddle model for Paddle Inference), or on ``model``;
        in the role's warm worker where the backend allows it (:class:`SpecRunner`)."""
        self.invocations[role] += 1
        path = model or model_for_backend(self.model, spec, self.onnx_path)
        run = self.runners[role].run(spec, path, self.inputs_path, outputs=outputs, output_dir=output_dir)
        self.calls.count(role, run)
        if run.ran_with:
            self.ran_with[role] = dict(run.ran_with)
        return run

    def capture(self, intermediates: Sequence[str] = ()) -> Mapping[str, Any] | None:
        """One oracle run on the model (exposing ``intermediates`` too): the expected outputs, and every value.

        An oracle that rewrites the graph (``computes_as_written`` is False) may build the probe differently
        from the model, so with ``intermediates`` it also runs the model as built, whose outputs are the
        expected ones (:func:`~graphbisect.oracle.as_built.capture_as_built`); when the capture's outputs differ
        from them beyond the tolerance, the captured values are not what the oracle computes on the model: None
        (no region is searched on them, with a note).
        """
        self.stage(f"running the oracle {self.oracle_spec}"
                   + (f" (capturing {len(intermediates)} tensors)" if intermediates else ""))
        model = self.onnx_path
        if intermediates:
            model = self.work / "probe-oracle.onnx"
            save_proto(self.model.with_outputs(list(intermediates)), model)

        def run(path: Path, output_dir: Path | None) -> RunResult:
            return self.run(self.oracle_spec, "oracle", model=None if path == self.onnx_path else path,
                            output_dir=output_dir)

        try:
            runs = capture_as_built(
                run, model, self.onnx_path, outputs=self.model.output_names, tolerance=self.options.tolerance,
                spec=self.oracle_spec,
                rewrites=bool(intermediates) and not self.oracle_info.computes_as_written(
                    self.oracle_spec, elem_types(self.model.proto)),
                capture_dir=self.work / "oracle-values", plain_dir=self.work / "oracle-plain",
                on_plain=lambda: self.stage(f"running the oracle {self.oracle_spec} on the model as built (it "
                                            "rewrites the graph)"))
        finally:
            if intermediates:
                remove_model(model)
        runs.require_ok(self.oracle_spec)
        self.expected = {name: np.array(value) for name, value in runs.expected(self.model.output_names).items()}
        if runs.difference is None or not runs.difference.differs:
            return runs.capture.outputs
        self.notes.append(f"{runs.difference.why(self.oracle_spec)}: the verdict is the model as built, and its "
                          "captured intermediates are not used")
        return None

    def signature(self, run: RunResult) -> Signature:
        return judge(run, self.expected.__getitem__, self.model.output_names, self.options.tolerance,
                     floor=self.floor).signature

    def identity_differs(self) -> Callable[[Judgement], str | None] | None:
        """Why a run of the session's model that fails like the baseline by kind has another identity (None:
        the same), or None when no identity is known (failures then match by kind)."""
        if self.identity is None:
            return None
        check = IdentityCheck(self.identity, self.model.nodes)
        constants = {t.name: t for t in self.model.proto.graph.initializer}

        def differs(verdict: Judgement) -> str | None:
            if verdict.comparison is None:
                return None
            compiled = compiled_graph(self.model.nodes, self.model.output_names, verdict.run.info,
                                      constants=constants) if verdict.run.ok else None
            return check.differs(verdict.failing, {s.name: s for s in verdict.comparison.outputs}, compiled)

        return differs

    def measure_floor(self, names: Sequence[str] = ()) -> None:
        """The target's noise floor on the model's outputs and ``names`` (captured by the oracle): a failure
        counts only above it, in every run of the search (:mod:`graphbisect.oracle.floor`)."""
        if self.floor is not None:
            return
        decided = floor_spec(self.target_spec, self.target_info, self.oracle_spec)
        if isinstance(decided, NoiseFloor) or not self.target_info.has(Capability.ONNX_INPUT):
            self.floor = decided if isinstance(decided, NoiseFloor) else \
                no_floor(f"not measured: {self.target_spec.name} runs its own model format")
        else:
            probe = self.work / "probe-floor.onnx"
            save_proto(self.model.with_outputs(list(names)), probe)
            self.stage(f"measuring the target's noise floor: {brief_spec(decided)} (its optimizations off)")
            self.invocations["target"] += 1
            try:
                self.floor = measure_floor(decided, probe, self.inputs_path, self.work / "oracle-values",
                                           self.options.tolerance, workdir=self.work / "floor",
                                           timeout=self.options.timeout)
            finally:
                remove_model(probe)
            self.calls.add("target", self.floor.cost)
        if self.floor.measured:
            self.notes.append(self.floor.describe())

    def reporting(self, spec: BackendSpec) -> BackendSpec:
        return spec.with_options(**dict(self.control.report_options))


def find_culprit_passes(
    model: Model,
    *,
    inputs: Mapping[str, np.ndarray],
    options: PassesOptions | None = None,
    workdir: Path | None = None,
    on_stage: Callable[[str], None] | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    chosen: Sequence[ChosenDim] = (),
) -> PassesResult:
    """Find the minimal sets of the target's fired passes to disable (and to enable) for the failure.

    ``chosen``: the dynamic dims graphbisect sized when it drew ``inputs`` (:func:`graphbisect.data.chosen_dims`):
    a target that does not fail on them says so in its notes.

    Example:
        >>> r = find_culprit_passes(load_model("ln.onnx"), inputs=feeds)          # doctest: +SKIP
        >>> r.culprits, r.required                                                 # doctest: +SKIP
        (('LayerNormFusionL1', 'SimplifiedLayerNormFusion'), ('LayerNormFusionL1',))
    """
    options = options or PassesOptions()
    started = time.monotonic()
    holder: contextlib.ExitStack = contextlib.ExitStack()
    if workdir is None:
        workdir = Path(holder.enter_context(tempfile.TemporaryDirectory(prefix="graphbisect-passes-")))
    else:  # the user's folder: new, empty or graphbisect's, and locked for this run
        workdir = holder.enter_context(own_folder(Path(workdir), what="graphbisect passes",
                                                  protect=(model.path, model.paddle_source)))
    # a model compiled twice with the same options within the search compiles once (a compiler's cache)
    holder.enter_context(compile_cache(Path(workdir) / "compile-cache"))
    try:
        s = _Session(model, options, Path(workdir), on_stage or (lambda _msg: None))
    except BaseException:
        holder.close()
        raise
    try:
        s.prepare(inputs)
        result = _on_region(s, on_progress) if options.region else None
        if result is None:
            if not s.expected:
                s.capture()
            s.measure_floor()
            tried = dict(s.scope)  # a region that was searched but not confirmed stays on record
            s.notes.append("on the whole model runs match by kind: the failure's identity (where it first goes "
                           "wrong, what the target compiled there) is established only on a region")
            result = _search(s, on_progress)
            result = dataclasses.replace(result, scope={
                **tried, "searched_on": "whole model",
                "whole_model_target_runs": s.invocations["target"] - tried.get("region_target_runs", 0)})
        note = dims_note(chosen) if not result.failed else None
        result = dataclasses.replace(result, invocations=dict(s.invocations), backend_calls=s.calls.to_json(),
                                     notes=(*s.notes, *filter(None, [note])),
                                     versions=dict(s.ran_with), chosen_dims=tuple(chosen))
        return dataclasses.replace(_checked(s, result), seconds=time.monotonic() - started)
    finally:
        s.close()
        holder.close()


def _checked(s: _Session, result: PassesResult) -> PassesResult:
    """``result`` with its claims as the trusted checker finds them: each claim's configurations run plainly on
    the whole model against one plain oracle run (:mod:`graphbisect.workflows.passes_claims`)."""

    def model_of(spec: str) -> Path:
        return model_for_backend(s.model, BackendSpec.parse(spec), s.onnx_path)

    # the failure's compiled identity, where the search matched by it (on a region it confirmed)
    compiled = result.scope.get("compiled_kind") if result.scope.get("searched_on") == "region" else None
    compiled_as = (str(compiled), result.scope.get("made_by")) if compiled else None
    return check_passes(result, oracle=str(s.oracle_spec), model_of=model_of, inputs=load_values_npz(s.inputs_path),
                        tolerance=s.options.tolerance, compiled_as=compiled_as, timeout=s.options.timeout,
                        workdir=s.work, stage=s.stage,
                        floor=(str(s.floor.spec), s.floor.margin) if s.floor is not None and s.floor.measured else None)


def check_passes(result: PassesResult, *, oracle: str, model_of: Callable[[str], Path], inputs: Mapping[str, Any],
                 tolerance: Tolerance, compiled_as: tuple[str, str | None] | None = None,
                 timeout: float | None = None, workdir: Path | None = None,
                 stage: Callable[[str], None] | None = None, floor: tuple[str, float] | None = None) -> PassesResult:
    """``result`` with its claims (:func:`~graphbisect.workflows.passes_claims.passes_claims`) checked by plain
    runs of ``oracle`` and the target on ``model_of(spec)`` with ``inputs``, under ``tolerance``; ``minimal`` only
    where they hold (:func:`~graphbisect.workflows.passes_claims.audited_fields`). ``floor``: ``(spec, margin)`` of
    the noise floor the search judged above, which the checker measures again.

    Example:
        >>> checked = check_passes(found, oracle="onnxruntime:opt_level=disable",                # doctest: +SKIP
        ...                        model_of=lambda spec: Path("model.onnx"), inputs=feeds, tolerance=Tolerance())
        >>> [(c["id"], c["holds"]) for c in checked.audit["claims"]]                            # doctest: +SKIP
        [('failure', True), ('workaround', True), ...]
    """
    claims = passes_claims(result.to_json(), model_of, compiled_as)
    if stage is not None:
        stage(f"checking the answer's {len(claims)} claims with plain runs (the checker)")
    audit = check_configurations(oracle, model_of(oracle), inputs, claims, limits_of(tolerance),
                                 reference=Configuration(result.target, model_of(result.target)),
                                 compiled_as=compiled_as, timeout=timeout, workdir=workdir, floor=floor)
    return dataclasses.replace(result, **audited_fields(result.to_json(), audit))


def _on_region(s: _Session, on_progress: Callable[[ProgressEvent], None] | None) -> PassesResult | None:
    """The search on the diverging region, confirmed on the whole model (:mod:`~graphbisect.workflows.pass_region`).

    None (with a note saying why) when the region cannot be had or the answer does not hold on the whole
    model: the caller then searches the whole model. A whole model that does not fail is answered here.
    """
    describing, replay = describing_spec(s.target_spec), replay_spec(s.target_spec)
    if describing is None or replay is None or s.model.paddle_source is not None:
        s.notes.append(f"the target {s.target_spec} cannot replay the graph it compiled: the passes are searched "
                       "on the whole model")
        return None
    s.stage(f"running the target {s.target_spec} on the whole model (saving the graph it compiled)")
    run = s.run(describing)
    compiled = compiled_of(s.model, run.info) if run.ok else None
    plan = plan_probe(s.model, compiled)
    oracle = s.capture(plan.names if compiled is not None else ())
    s.measure_floor(plan.names if compiled is not None else ())
    baseline = s.signature(run)
    if not baseline.failed:
        discard_description(run.info)
        # This run saved the compiled graph but did not list the passes that fired.
        return PassesResult(False, baseline, str(s.target_spec), source=NOT_LISTED,
                            scope={"searched_on": "whole model", "whole_model_target_runs": 1})
    if oracle is None:
        discard_description(run.info)
    region = _region(s, run, compiled, oracle, replay=replay, baseline=baseline) if oracle is not None else \
        "the oracle's captured intermediates are not what it computes on the model"
    if isinstance(region, str):
        s.notes.append(f"no region to search the passes on ({region}): searching the whole model")
        return None
    found = _search_region(s, region, on_progress)
    if not (found.failed and found.culprits and found.fixed_target):
        s.notes.append(f"the region ({region.compiled_as}) "
                       + ("does not fail on its own" if not found.failed else "names no culprit passes")
                       + ": searching the whole model")
        return None
    return _confirmed_on_whole_model(s, region, found, baseline)


def _search_region(s: _Session, region: Region, on_progress: Callable[[ProgressEvent], None] | None
                   ) -> PassesResult:
    """The pass search on ``region``, in a session of its own with the whole model's warm target worker and
    noise floor; its runs, notes and where it ran are added to ``s``."""
    sub = _Session(region.model, s.options, s.work / "region", s.stage)
    sub.runners = s.runners  # the same warm target worker
    sub.floor = s.floor  # the region's tensors are the model's: the same floor
    sub.identity = region.identity
    try:
        sub.prepare(region.feeds)
        sub.expected = {name: np.asarray(value) for name, value in region.expected.items()}
        found = _search(sub, on_progress)
    finally:
        s.invocations["target"] += sub.invocations["target"]
        s.calls.add("target", sub.calls.get("target"))
        s.ran_with.update(sub.ran_with)
    s.notes.extend(f"on the region: {note}" for note in sub.notes)
    s.scope.update(region_nodes=region.names(s.model), compiled_as=region.compiled_as,
                   region_target_runs=sub.invocations["target"])
    if region.identity is not None and region.identity.compiled_kind:  # what the checker matches the failure by
        s.scope.update(compiled_kind=region.identity.compiled_kind, made_by=region.identity.made_by)
    return found


def _confirmed_on_whole_model(s: _Session, region: Region, found: PassesResult, baseline: Signature
                              ) -> PassesResult | None:
    """The region's answer ``found`` when it holds on the whole model: disabling its culprits removes the
    failure, and enabling only its required passes reproduces it (``baseline``); None, with a note, otherwise."""
    scope = s.scope
    region_runs = scope["region_target_runs"]
    s.stage(f"confirming on the whole model: {', '.join(found.culprits)} disabled")
    confirm = s.signature(s.run(BackendSpec.parse(found.fixed_target or "")))
    scope.update(whole_model_target_runs=s.invocations["target"] - region_runs, confirmed=not confirm.failed)
    if confirm.failed:
        s.notes.append(f"the culprits found on the region ({', '.join(found.culprits)}) do not fix the whole model "
                       f"({confirm.describe()}): searching the whole model")
        return None
    only = _only_required(s, found)
    s.stage(f"confirming on the whole model: only {', '.join(found.required)} enabled")
    alone = s.signature(s.run(BackendSpec.parse(only.culprit_target or "")))
    scope.update(whole_model_target_runs=s.invocations["target"] - region_runs,
                 required_reproduces=baseline.matches(alone, strict_band=s.options.strict_band))
    if not scope["required_reproduces"]:
        s.notes.append(f"with only {', '.join(found.required)} enabled the whole model does not fail like the "
                       f"target ({alone.describe()}): searching the whole model")
        return None
    s.notes.append(f"searched on the {len(region.nodes)}-node region {region.compiled_as}; on the whole model, "
                   f"disabling {', '.join(found.culprits)} removes the failure and enabling only "
                   f"{', '.join(found.required)} reproduces it (that each culprit is needed, and that the "
                   "enable-set is minimal, were established on the region)")
    return dataclasses.replace(only, signature=baseline, scope={"searched_on": "region", **scope})


def _only_required(s: _Session, found: PassesResult) -> PassesResult:
    """``found`` with its culprit and control targets disabling every pass the target registers but the
    enable-set (culprits too, for the control), not just those fired on the region: the whole model runs
    other passes elsewhere, which would stay enabled in the reduction under the culprits otherwise."""
    names = s.runners["target"].registered_passes(s.target_spec)
    if not names:
        return found
    rest = [n for n in names if n not in found.searched and not _RULE_SET.fullmatch(n)]
    space = PassSpace(s.target_spec, [*found.searched, *rest])
    return dataclasses.replace(
        found, culprit_target=str(space.spec_with_disabled([n for n in space.passes if n not in found.required])),
        control_target=str(space.spec_with_disabled(space.passes)))


def _region(s: _Session, run: RunResult, compiled: Any, oracle: Mapping[str, Any], *, replay: BackendSpec,
            baseline: Signature) -> Region | str:
    """The diverging region of the whole model's failing run, or why there is none."""
    try:
        if not run.ok or compiled is None:
            return f"the target {'did not describe what it compiled' if run.ok else 'crashed: ' + run.describe()}"
        if baseline.kind not in (FailureKind.MISMATCH, FailureKind.NAN):
            return f"the failure is a {baseline.kind.value}, not a value that diverges"
        optimized = Path(str(run.info.get("optimized_model")))
        names = [name for name in plan_probe(s.model, compiled).names if name in oracle]
        replayed_path = optimized.with_name("replay.onnx")
        exposed = replay_model(optimized, s.model, names, replayed_path)
        s.stage(f"replaying the target's optimized model with {len(exposed)} surviving tensors exposed")
        replayed = s.run(replay, model=replayed_path, outputs=[*s.model.output_names, *exposed],
                         output_dir=s.work / "replay-values")  # read once, by the comparison
        if not replayed.ok:
            return f"the replay of the optimized model failed: {replayed.describe()}"
        if not baseline.matches(s.signature(replayed)):
            return "the replayed optimized model does not fail like the target"
        feeds = load_values_npz(s.inputs_path)

        def values(name: str) -> Any:
            return feeds[name] if name in feeds else oracle[name]

        return diverging_region(s.model, compiled, oracle, replayed.outputs, values=values,
                                workdir=s.work / "region-weights", tol=s.options.tolerance, floor=s.floor)
    finally:
        if isinstance(run.info.get("optimized_model"), str):
            Path(run.info["optimized_model"]).with_name("replay.onnx").unlink(missing_ok=True)
        discard_description(run.info)


def _search(s: _Session, on_progress: Callable[[ProgressEvent], None] | None) -> PassesResult:
    costly = s.control.listing_builds  # listing what fired costs builds: it waits until it is needed
    s.stage(f"running the target {s.target_spec}" + ("" if costly else " and listing the passes that fired"))
    baseline_run = s.run(s.target_spec if costly else s.reporting(s.target_spec))
    baseline = s.signature(baseline_run)
    if not baseline.failed:  # what fired was asked for: say so even though nothing is searched
        fired = None if costly else _reported(baseline_run)
        return PassesResult(False, baseline, str(s.target_spec), fired=tuple(fired or ()),
                            source="reported" if fired is not None else NOT_LISTED)
    decided = _decide_first(s, baseline) if costly else None
    if isinstance(decided, PassesResult):
        return decided
    fired, excluded, source, units, end = _units(s, baseline, baseline_run, decided)
    common = {"failed": True, "signature": baseline, "target": str(s.target_spec), "fired": tuple(fired),
              "excluded": excluded, "source": source}
    if end is None:
        return PassesResult(**common, searched=tuple(units))  # type: ignore[arg-type]
    space = PassSpace(s.target_spec, units)
    culprits, required, alone, stats = _minimal_sets(s, space, baseline, end, on_progress)
    every = frozenset(range(space.size))
    return PassesResult(
        **common, searched=tuple(units),  # type: ignore[arg-type]
        culprits=tuple(space.names(culprits.keep)), required=tuple(space.names(required.keep)),
        each_alone=tuple(alone), minimal=culprits.minimal and required.minimal,
        culprit_target=str(space.spec_enabling(required.keep)),
        fixed_target=str(space.spec_disabling(culprits.keep)),
        fixed_flags=s.control.native(space.names(culprits.keep)) if s.control.native else None,
        control_target=str(space.spec_disabling(every)), search=stats,
    )


def _units(s: _Session, baseline: Signature, baseline_run: RunResult, decided: tuple[list[str], Signature] | None
           ) -> tuple[list[str], dict[str, str], str, list[str], Signature | None]:
    """What the search runs over: the fired passes (``fired``, ``excluded`` never disabled, ``source``), the
    units, and the end with every unit disabled (None: it does not remove the failure).

    Where every disable-able pass was measured to remove the failure (``decided``, :func:`_decide_first`, on a
    target whose listing costs builds), those are the units and what fired is not listed: the listing costs a
    build per pass and more, the search over all of them about a build per halving. Otherwise the fired passes
    (from the baseline's own report where the target gives one, else listed now) with the end confirmed.
    """
    if decided is not None:
        s.notes.append(f"which passes fired was not listed (a build per pass, where the search over all "
                       f"{len(decided[0])} "
                       "disable-able passes costs about a build per halving): the search ran over every "
                       "disable-able pass")
        return [], {}, NOT_NEEDED, decided[0], decided[1]
    if s.control.listing_builds:
        s.stage(f"running the target {s.target_spec} and listing the passes that fired")
        baseline_run = s.run(s.reporting(s.target_spec))  # its own build is the baseline's: a cache hit
    fired, excluded, source = _fired(s, baseline_run)
    units, end = _confirm_ends(s, baseline, [name for name in fired if name not in excluded], excluded)
    return fired, excluded, source, units, end


def _decide_first(s: _Session, baseline: Signature) -> PassesResult | tuple[list[str], Signature] | None:
    """The run that decides the answer, before any listing of what fired: every disable-able pass disabled.

    The failure stays (the same failure): the answer, "no set of passes explains it", without the listing
    (``source`` :data:`NOT_NEEDED`). It goes: every disable-able pass and that passing end, which the search
    falls back on when the fired passes alone do not remove it. None: undecided (the target cannot list the
    passes it registers, or fails another way with them all disabled): the fired passes are listed and searched.
    """
    names = s.runners["target"].registered_passes(s.target_spec)
    if names is None:
        return None
    already = set(s.target_spec.option_list(s.control.disable_option))
    every = [name for name in names if name not in s.control.not_disableable and name not in already
             and not _RULE_SET.fullmatch(name)]
    space = PassSpace(s.target_spec, every)
    s.stage(f"disabling every one of the {space.size} disable-able passes (does any set of passes explain it?)")
    end = s.signature(s.run(space.spec_disabling(frozenset(range(space.size)))))
    if not end.failed:
        return space.passes, end
    if not baseline.matches(end, strict_band=s.options.strict_band):
        s.notes.append(f"with every disable-able pass disabled the target fails differently ({end.describe()}): "
                       "the passes that fired are listed and searched")
        return None
    _unexplained(s, f"every disable-able pass ({space.size})", "the failure stays")
    s.notes.append("which passes fired was not listed: not needed for this answer (listing them costs "
                   f"{s.target_spec.name} builds of their own)")
    return PassesResult(True, baseline, str(s.target_spec), searched=tuple(space.passes), source=NOT_NEEDED)


def _unexplained(s: _Session, disabled: str, why: str) -> None:
    s.notes.append(f"with {disabled} disabled {why}: no set of passes explains the failure "
                   "(a kernel bug, or a pass that cannot be disabled); reduce the model instead")


def _fired(s: _Session, run: RunResult) -> tuple[list[str], dict[str, str], str]:
    """Fired passes, those never disabled (with the reason), and where the list came from."""
    excluded = {name: f"the backend runs it whatever the options say ({s.target_spec.name} fired_required)"
                for name in run.info.get("fired_required", [])}
    reported = _reported(run)
    fired, source = (reported, "reported") if reported is not None else (_catalogue(s, run), "catalogue")
    excluded.update({name: why for name, why in s.control.not_disableable.items() if name in fired})
    if source == "catalogue":  # a rule set stands for all its rules, which are units of their own
        excluded.update({name: "a set of rewrite rules, searched rule by rule" for name in fired
                         if _RULE_SET.fullmatch(name)})
    if excluded:
        s.notes.append("fired passes never disabled: " + "; ".join(f"{k} ({v})" for k, v in excluded.items()))
    already = set(s.target_spec.option_list(s.control.disable_option))
    return [name for name in fired if name not in already], excluded, source


def _reported(run: RunResult) -> list[str] | None:
    """The passes the target says fired, or None when it did not say or cannot know (Paddle with its glog INFO
    lines hidden ran passes but printed none of their matches: ``fired_passes_known`` false; an empty list
    would claim that none fired)."""
    if "fired_passes" not in run.info or not run.info.get("fired_passes_known", True):
        return None
    return [str(name) for name in run.info["fired_passes"]]


def _catalogue(s: _Session, run: RunResult) -> list[str]:
    """Every pass the target could run, for a target that failed before it could report what fired (or ran
    passes but could not tell which fired).

    Asked of a target worker, so a ``python=`` target lists the passes of *its* library version.
    """
    why = f"failed ({run.describe()}) before reporting" if not run.ok else "could not tell"
    with BackendProcess(s.target_spec, workdir=s.work / "catalogue", timeout=s.options.timeout) as proc:
        names = proc.registered_passes()
    if names is None:
        raise GraphBisectError(
            f"the target {s.target_spec} {why} which passes fired, "
            "and it cannot list the passes it registers",
            hint="run it once where it does not crash, or search with a backend that lists its passes "
            "(onnxruntime, onnxoptimizer)")
    s.notes.append(f"the target {why} which passes fired: the search space is every pass it registers "
                   f"({len(names)})")
    return names


def _the_fired(units: Sequence[str]) -> str:
    """``the fired pass`` or ``all N fired passes``."""
    return "the fired pass" if len(units) == 1 else f"all {len(units)} fired passes"


def _confirm_ends(s: _Session, baseline: Signature, units: list[str], excluded: Mapping[str, str]
                  ) -> tuple[list[str], Signature | None]:
    """Disable every unit: the failure must go away. Returns the (maybe extended) units and that end's signature.

    A pass that fires only once others are disabled is added and the end re-checked (up to
    :data:`MAX_FIRED_ROUNDS` times). ``None``: disabling every fired pass does not remove the failure.
    """
    for _ in range(MAX_FIRED_ROUNDS):
        space = PassSpace(s.target_spec, units)
        s.stage(f"disabling {_the_fired(units)} (the failure must disappear)")
        disabling = space.spec_disabling(frozenset(range(space.size)))
        end = s.signature(s.run(disabling))
        if not end.failed:
            return units, end
        if not baseline.matches(end):
            break
        # Only now ask what fired with these disabled: a listing costs builds (IREE compiles the model once per
        # feature: on a 152-node host this listing was 15 of the search's 36 compile requests), and an end that passes
        # does not need it.
        s.stage(f"listing the passes that fire with {'it' if len(units) == 1 else f'those {len(units)}'} disabled")
        listed = s.run(s.reporting(disabling))
        new = [str(n) for n in listed.info.get("fired_passes", []) if n not in units and n not in excluded]
        if not new:
            break
        s.notes.append(f"with the fired passes disabled, {', '.join(new)} fired too: added to the search")
        units = units + new
    why = ("the failure stays" if baseline.matches(end) else f"the target fails differently ({end.describe()})")
    _unexplained(s, "every fired, disable-able pass", why)
    return units, None


def _minimal_sets(s: _Session, space: PassSpace, baseline: Signature, end: Signature,
                  on_progress: Callable[[ProgressEvent], None] | None
                  ) -> tuple[SearchResult, SearchResult, list[str], dict[str, dict[str, int]]]:
    every = frozenset(range(space.size))
    fingerprint = _fingerprint(s, space)
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
    journal = Journal.open(s.work / f"journal-{digest}.jsonl", fingerprint=fingerprint, fsync=False)
    budget = Budget(max_invocations=s.options.max_invocations)
    testers = {mode: PassTester(space, mode, s.run, expected=s.expected.__getitem__,
                                outputs=s.model.output_names, baseline=baseline, tol=s.options.tolerance,
                                strict_band=s.options.strict_band, floor=s.floor, identity=s.identity_differs(),
                                describe=s.identity is not None and s.identity.compiled_kind is not None)
               for mode in (DISABLE, ENABLE)}
    evs = {mode: Evaluator(t, space.size, journal=journal, scope=mode, budget=budget, on_progress=on_progress)
           for mode, t in testers.items()}
    evs[DISABLE].record(every, testers[DISABLE].outcome_of(end))  # the confirmed end
    evs[ENABLE].record(every, testers[ENABLE].outcome_of(baseline))  # the baseline
    try:
        s.stage(f"searching the minimal set of passes to disable among {space.size}")
        culprits = minimal_set(evs[DISABLE], phase="disable-set")
        s.stage(f"searching the minimal set of passes to enable among {space.size}")
        # The disable-set is where the enable-set is most likely found: tried first (one run), a single culprit's
        # enable-set is then that run alone, not a second search over every unit.
        required = minimal_set(evs[ENABLE], phase="enable-set", hints=[culprits.keep])
        alone = [space.passes[i] for i in sorted(culprits.keep)
                 if evs[ENABLE].evaluate({i}, phase="alone").outcome is Outcome.FAIL]
    except SearchAborted as exc:
        raise GraphBisectError(f"the pass search stopped: {exc.message}", hint=exc.hint) from exc
    finally:
        journal.close()
    stats = {mode: {"tests": ev.stats().tests, "invocations": ev.stats().invocations,
                    "cache_hits": ev.stats().cache_hits} for mode, ev in evs.items()}
    for result, what in ((culprits, "disable-set"), (required, "enable-set")):
        if not result.minimal:
            s.notes.append(f"the {what} is not proven minimal ({result.stop_reason})")
    return culprits, required, alone, stats


def _fingerprint(s: _Session, space: PassSpace) -> str:
    return json.dumps({"model": s.model.fingerprint, "oracle": str(s.oracle_spec), "target": str(s.target_spec),
                       "units": space.passes, "tolerance": repr(s.options.tolerance),
                       "floor": None if s.floor is None else s.floor.to_json()}, sort_keys=True)


# ------------------------------------------------------------------------------------ combined with reduce
def reduce_under_culprits(model: Model, bundle_dir: Path, passes: PassesResult, *,
                          inputs: Mapping[str, np.ndarray], reduce_options: Any = None, resume: bool = False,
                          zip_bundle: bool = False, force: bool = False, on_stage: Callable[[str], None] | None = None,
                          on_progress: Callable[[ProgressEvent], None] | None = None) -> Any:
    """Reduce ``model`` with only the culprit passes enabled and add the control run to the bundle.

    ``reduce_options`` is a :class:`~graphbisect.workflows.reduce.ReduceOptions` (its target is replaced by
    ``passes.culprit_target``); ``resume`` continues an interrupted run (see ``reduce_model``); ``zip_bundle``
    also writes ``DIR.zip``; ``force`` replaces a bundle of another model. Returns the
    :class:`~graphbisect.workflows.reduce.ReduceResult`.
    """
    from graphbisect.workflows.reduce import ReduceOptions, reduce_model

    if passes.culprit_target is None or passes.control_target is None:
        raise GraphBisectError("no culprit passes to reduce under", hint="see the notes of the pass search")
    _, info = resolve(passes.culprit_target)
    if not info.has(Capability.ONNX_INPUT):
        raise GraphBisectError(f"the target {info.name!r} runs only its own model format, so the model cannot "
                               "be reduced under its culprit passes",
                               hint="the pass findings stand; reduce the converted ONNX model with an ONNX backend")
    base = reduce_options or ReduceOptions()
    options = dataclasses.replace(base, target=passes.culprit_target)
    stage = on_stage or (lambda _msg: None)
    return reduce_model(model, bundle_dir, inputs=inputs, options=options, resume=resume, on_stage=stage,
                        on_progress=on_progress, zip_bundle=zip_bundle, force=force, chosen=passes.chosen_dims,
                        amend=lambda content: _with_control(content, passes, options, stage))


def _with_control(content: BundleContent, passes: PassesResult, options: ReduceOptions,
                  stage: Callable[[str], None]) -> BundleContent:
    """The bundle content plus the control run (culprit passes disabled) and the before/after-the-pass view,
    with the shortest target and control specs that were measured to do their part on the reduced model.

    The reduction ran under the culprit spec (every pass the target registers disabled but the enable-set:
    ~70 names on ONNX Runtime), which the whole model needs; on the reduced model the user's own target and
    its workaround (the culprits disabled) usually do as well, and a maintainer reads those. Each short form
    is tried, never assumed (:func:`_shortest_target`, :func:`_control`); the report lists what was measured.

    The control is judged as the reduction judged (its ``fail_regex``, its Python check, its noise floor): by
    the tolerance alone, a control whose outputs matched "passed" while it still printed the regex's line.
    """
    culprit = BackendSpec.parse(str(passes.culprit_target))
    with tempfile.TemporaryDirectory(prefix="graphbisect-control-") as tmp:
        folder = Path(tmp)
        model_path, inputs_path = folder / "model.onnx", folder / "inputs.npz"
        save_proto(content.model, model_path)
        save_inputs(inputs_path, content.inputs)
        # the runs below are report facts: counted with the reduction's (report_calls, report_runs)
        runs = _report_calls(content.report)
        measured: list[dict[str, str]] = []
        floor = content.report.get("noise_floor")  # the culprit spec's, which a short target's may replace
        content = _shortest_target(content, passes, options=options, folder=folder, runs=runs, measured=measured,
                                   stage=stage)
        control, run, control_sig = _control(content, passes, options=options, folder=folder, runs=runs,
                                             measured=measured, stage=stage)
        optimized = _optimized_nodes(culprit, model_path, inputs_path, folder, options.timeout, runs=runs)
    facts = {**passes.to_json(), "control_verdict": control_sig.describe(), "control_passes": not control_sig.failed,
             "bundle_target": str(content.target), "bundle_control": str(control), "measured_specs": measured,
             "culprit_floor": floor,
             "reduced_nodes": [f"{n.op_type} {n.name}" for n in content.model.graph.node],
             "optimized_nodes": optimized}
    versions = content.report.get("versions")
    versions = {**(versions if isinstance(versions, Mapping) else {}), "control": dict(run.ran_with) or None}
    return dataclasses.replace(content, control=control,
                               report={**content.report, "versions": versions, "passes": facts,
                                       "report_runs": runs.runs(), "report_calls": runs.to_json()},
                               sections={**content.sections, "Optimization passes": passes_markdown(facts)})


def _report_calls(report: Mapping[str, Any]) -> CallTally:
    """The report facts' backend calls so far: ``report_calls``, or (a report without compiles) its runs."""
    calls, runs = report.get("report_calls"), report.get("report_runs")
    if isinstance(calls, Mapping):
        return CallTally.from_json(calls)
    return CallTally({role: Cost(runs=int(n)) for role, n in runs.items()} if isinstance(runs, Mapping) else {})


def _shortest_target(content: BundleContent, passes: PassesResult, *, options: ReduceOptions, folder: Path,
                     runs: CallTally, measured: list[dict[str, str]],
                     stage: Callable[[str], None]) -> BundleContent:
    """``content`` with the user's own target (``passes.target``) when it fails on the reduced model as the
    reduction's failure, by ``graphbisect verify``'s rules (its identity included); its facts (the compiled
    model, the optimization levels, ``repro_min.py``...) measured again with it, its outputs the bundle's."""
    from graphbisect.workflows.maintainer import maintainer_facts
    from graphbisect.workflows.verify import REPRODUCES

    short = BackendSpec.parse(passes.target)
    if str(short) == str(content.target):
        return content
    stage(f"trying the short target {short} on the reduced model")
    verdict = _verify_here(content, folder, short)
    runs.merge(CallTally.from_json(verdict.backend_calls))
    measured.append({"role": "target", "spec": str(short), "outcome": verdict.outcome,
                     **({"note": verdict.note} if verdict.note else {})})
    if verdict.outcome != REPRODUCES:
        return content
    regex = re.compile(options.fail_regex) if options.fail_regex else None
    outputs = {name: np.asarray(value) for name, value in verdict.run.outputs.items()}
    facts = maintainer_facts(
        model=content.model, run_model=folder / "model.onnx", feeds=content.inputs, expected=content.oracle_outputs,
        target_outputs=outputs, oracle=content.oracle, target=short, tolerance=content.tolerance,
        signature=content.signature, workdir=folder / "facts", timeout=options.timeout, stage=stage,
        fail_regex=regex, check=options.output_check)
    runs.merge(facts.calls)
    report = {**content.report, **facts.facts, "noise_floor": _floor_record(content, short)}
    files = {name: text for name, text in content.files.items() if name != "repro_min.py"}
    message = None if verdict.run.ok else \
        f"{verdict.run.error_type or ''}: {verdict.run.message or ''}".strip(": ")
    return dataclasses.replace(content, target=short, target_outputs=outputs if verdict.run.ok else {},
                               target_message=message, report=report, files={**files, **facts.files},
                               sections={**content.sections, **facts.sections})


def _floor_record(content: BundleContent, short: BackendSpec) -> Any:
    """The noise floor for ``short``: zero by construction where its optimizations off are the oracle (as
    for the user's ONNX Runtime target), else the floor the reduction measured (optimizations off, which
    the culprit spec's disabled passes do not change)."""
    _, info = resolve(short, require_available=False)
    floor = floor_spec(short, info, content.oracle)
    return floor.for_tensors(list(content.oracle_outputs)).to_json() if isinstance(floor, NoiseFloor) \
        else content.report.get("noise_floor")


def _control(content: BundleContent, passes: PassesResult, *, options: ReduceOptions, folder: Path,
             runs: CallTally, measured: list[dict[str, str]],
             stage: Callable[[str], None]) -> tuple[BackendSpec, RunResult, Signature]:
    """The shortest control that passes on the reduced model: the workaround (the user's target with the
    culprits disabled) when the bundle's target is the user's, else (or when it fails) every pass disabled."""
    candidates = [passes.control_target]
    if str(content.target) == passes.target and passes.fixed_target:
        candidates.insert(0, passes.fixed_target)
    regex = re.compile(options.fail_regex) if options.fail_regex else None
    for spec_text in candidates:
        control = BackendSpec.parse(str(spec_text))
        named = str(control) if spec_text == passes.fixed_target else "with every registered pass disabled"
        stage(f"running the control (culprit passes disabled) {named} on the reduced model")
        run = run_spec(control, folder / "model.onnx", folder / "inputs.npz", folder, options.timeout)
        runs.count("control", run)
        floor = content.report.get("noise_floor")
        signature = judge(run, content.oracle_outputs.__getitem__, list(content.oracle_outputs), content.tolerance,
                          regex, check=options.output_check,
                          floor=NoiseFloor.from_json(floor) if isinstance(floor, Mapping) else None).signature
        measured.append({"role": "control", "spec": str(control),
                         "outcome": "passes" if not signature.failed else signature.describe()})
        if not signature.failed:
            break
    return control, run, signature


def _verify_here(content: BundleContent, folder: Path, spec: BackendSpec) -> Any:
    """``graphbisect verify``'s verdict of ``spec`` on the bundle ``content`` will be (its model.onnx and
    inputs.npz already in ``folder``): the same run and rules, identity and noise floor included."""
    from graphbisect.artifacts.bundle import LoadedBundle
    from graphbisect.artifacts.report import jsonable
    from graphbisect.workflows.verify import verify_bundle

    bundle = LoadedBundle(path=folder, source=folder, report=jsonable(dict(content.report)), oracle=content.oracle,
                          target=content.target, tolerance=content.tolerance, signature=content.signature,
                          target_message=content.target_message, inputs=dict(content.inputs),
                          oracle_outputs=dict(content.oracle_outputs), target_outputs=dict(content.target_outputs),
                          environment={})
    return verify_bundle(bundle, spec, checked=False)  # passes' claims are checked (passes_claims)


def _optimized_nodes(spec: BackendSpec, model: Path, inputs: Path, workdir: Path,
                     timeout: float | None, *, runs: CallTally) -> list[str] | None:
    """The nodes of the model as the target optimized it (``save_optimized=1``), or None when unsupported;
    its run is counted in ``runs`` (the report's ``report_calls``) as the target's."""
    from graphbisect.backends import registry

    if "save_optimized" not in registry.get(spec.name).options:
        return None
    run = run_spec(spec.with_options(save_optimized="1"), model, inputs, workdir, timeout)
    runs.count("target", run)
    path = run.info.get("optimized_model")
    if not path or not Path(path).exists():
        return None
    return [f"{n.op_type} {n.name}" for n in _load_nodes(Path(path))]


def _load_nodes(path: Path) -> Sequence[Any]:
    import onnx

    return list(onnx.load(str(path), load_external_data=False).graph.node)


def passes_markdown(facts: Mapping[str, Any]) -> str:
    """The report.md section on the culprit passes, the specs measured on the reduced model (target and
    control: which the bundle runs, and why), and the region before/after the pass."""
    fired = f"- fired ({len(facts['fired'])}): {', '.join(f'`{n}`' for n in facts['fired'])}" \
        if facts.get("source") != NOT_NEEDED else \
        f"- fired: not listed (a build per pass); searched: all {len(facts.get('searched') or ())} disable-able passes"
    lines = [fired,
             f"- **disable-set** (disabling these makes the failure disappear): "
             f"{', '.join(f'`{n}`' for n in facts['culprits'])}",
             f"- **enable-set** (enabled alone, they reproduce it): {', '.join(f'`{n}`' for n in facts['required'])}",
             f"- reproduce alone: {', '.join(f'`{n}`' for n in facts['each_alone']) or 'none'}"]
    for name, why in facts.get("excluded", {}).items():
        lines.append(f"- never disabled: `{name}` ({why})")
    audit = facts.get("audit")
    if isinstance(audit, Mapping):  # the trusted checker's plain runs on the whole model (passes_claims)
        runs = ", ".join(f"{role} {n}" for role, n in (audit.get("runs") or {}).items())
        lines += ["", f"Checked on the whole model with plain runs ({runs}) by the checker:", ""]
        lines += [f"- {({True: 'holds', False: 'DOES NOT HOLD', None: 'not established'})[c.get('holds')]}: "
                  f"{c.get('claim')}" for c in audit.get("claims") or ()]
    culprit = str(facts.get("culprit_target") or "")
    lines += ["", "The reduction ran under the culprit spec, the target with every pass it registers disabled but "
              f"the enable-set ({culprit.count(';') + 1 if culprit else 0} passes disabled; the spec is "
              "`passes.culprit_target` in report.json), so that no other pass could fail elsewhere in the whole "
              "model. Measured on the reduced model:", ""]
    for entry in facts.get("measured_specs") or ():
        role, spec = entry["role"], entry["spec"]
        chosen = spec == facts.get(f"bundle_{role}")
        what = {"reproduces": "fails the same way (identity included, as `graphbisect verify` judges)"}.get(
            entry["outcome"], entry["outcome"]) + (f" ({entry['note']})" if entry.get("note") else "")
        lines.append(f"- {role} `{shareable_text(spec)}`: {what}" + (f" — the bundle's {role}" if chosen else ""))
    if not any(entry["spec"] == facts.get("bundle_target") for entry in facts.get("measured_specs") or ()):
        lines.append("- target: the culprit spec (the reduction's own, re-verified) — the bundle's target")
    lines += ["", "Reduced model (before the pass):", "", "```text", *facts["reduced_nodes"], "```"]
    if facts.get("optimized_nodes") is not None:
        lines += ["", "As the target optimized it (after the pass):", "", "```text", *facts["optimized_nodes"], "```"]
    return "\n".join(lines) + "\n"
