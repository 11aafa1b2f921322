"""`reduce`: shrink a failing model to a 1-minimal subgraph that fails the same way, and bundle it.

Oracle discipline, in order:
1. one oracle run on the probe model captures every tensor into the activation store (expected values of
   every candidate, and the values fed at cut points); an oracle that rewrites the graph also runs the model
   as built, whose outputs are the verdict's (:meth:`_Run.verdict_values`; it stops the reduction when they
   differ from the capture's);
2. the target runs the **original** model (saving the graph it compiled, where it can): if it does not
   fail, stop (nothing to reduce); else its signature is the baseline;
3. where the target can expose intermediates, one probed target run gives layerwise evidence (hints and
   priors for the search). With the compiled graph known, the probe exposes only the tensors that survived
   optimization, so it compiles the same way and a fusion bug stays visible; its original outputs are then
   the flakiness re-run. When the probe masks the failure (or cannot be had), a plain second run checks
   flakiness. A crash's message may name where it happened (IREE's ``loc("...")``, ONNX Runtime's
   ``Name:'...'``): the nodes it names are the first candidate (:meth:`_Run._located`), which on a compile-bound
   target saves most builds (the IREE MaxUnpool diagnostic: 17 compiles → 8);
4. the search (:func:`graphbisect.strategies.subgraph.plan`) accepts only candidates whose signature
   matches the baseline;
5. the result is re-verified in a *fresh* target worker, and the oracle re-runs the final model to confirm
   its stored values (a non-deterministic oracle would make the artifact worthless).

**What backs a claim.** A target is called *flaky* only when the same model gave two different outcomes.
A baseline is the outcome of a majority of agreeing runs of the original: two for a wrong result (the
probe's outputs are the second), :data:`CRASH_BASELINE_RUNS` for a crash (the cheap, common flaky symptom:
two crashes agree by chance too often). When the runs of the original disagree, the target is reported flaky
at once and re-run to a majority (at most :data:`BASELINE_MAX_RUNS` runs; without one the reduction stops: no
failure to reduce; a majority that passes is "no failure"); the majority's signature is the baseline, and
every candidate must then fail that way in
``FLAKY_REPEATS + 1`` = 3 runs in a row before it is accepted; a target found flaky only when the result is
re-verified gets its search repeated that way (recorded in the work folder: a resumed run goes on with the
repeated search and reports the target flaky). A result is *verified* (and can be certified 1-minimal) only
when the final model fails like the baseline in every one of :data:`VERIFY_RUNS` fresh runs, on top of the
run that accepted it. When it does not, the report says why: the same model gave another outcome (flaky), or
the re-verified model differs from the one that failed (listed by :func:`graphbisect.model.diff.model_differences`).
A search that runs ``max_stall`` candidates (or twice its current size, if more) without one failing
stops and reports what it has (``stop_reason: no_progress``).

All state lives in a work folder (``<bundle>.work``): inputs, activation store, shared weights, journal and
baseline, so a run killed at any point resumes without repeating finished backend invocations.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.artifacts.bundle import BundleContent, check_destination, write_bundle
from graphbisect.artifacts.charts import size_journey_svg
from graphbisect.artifacts.report import md_cell
from graphbisect.backends import BackendProcess, BackendSpec, Capability, RunResult, resolve
from graphbisect.backends.base import brief_spec
from graphbisect.backends.cost import CallTally, Cost
from graphbisect.backends.process import CompareTo
from graphbisect.backends.registry import BACKEND_SPEC
from graphbisect.compare import Tolerance, compare_outputs
from graphbisect.compare.metrics import decade
from graphbisect.compare.quantization import with_quantization
from graphbisect.data import ActivationStore, ChosenDim, dims_note, save_inputs, validate_inputs
from graphbisect.data.inputs import available_memory
from graphbisect.data.store import MANIFEST_NAME
from graphbisect.engine import (
    Budget,
    Evaluator,
    Journal,
    Outcome,
    ProgressEvent,
    SearchAborted,
    SearchResult,
    StopReason,
)
from graphbisect.errors import GraphBisectError, InputError, ModelError
from graphbisect.executors import EXECUTOR
from graphbisect.executors.candidates import ExecutorPool
from graphbisect.localize.compiled import CompiledGraph
from graphbisect.localize.layerwise import LayerRow, analyze_layers
from graphbisect.model import Model
from graphbisect.model.diff import model_differences
from graphbisect.model.graph import warn_unused_initializers
from graphbisect.model.io import remove_model, save_proto
from graphbisect.model.normalize import elem_types
from graphbisect.oracle.as_built import (
    Runner,
    capture_as_built,
    capture_difference,
    require_as_built,
)
from graphbisect.oracle.floor import NoiseFloor, floor_spec, measure_floor, no_floor
from graphbisect.oracle.identity import Identity, IdentityCheck, level_variants, pass_of
from graphbisect.oracle.names import found_names
from graphbisect.oracle.signature import FailureKind, ModelNames, Signature, rooted_in_integers
from graphbisect.oracle.tester import (
    CandidateTester,
    Judgement,
    OutputCheck,
    TargetPool,
    WorkerPool,
    journal_cost,
    judge,
    model_digest,
)
from graphbisect.settings.options import (
    EXIT_CODE,
    INVOCATIONS,
    JOBS,
    TIMEOUT,
    cap_jobs,
    cap_jobs_to_memory,
    check_fields,
    option,
    pattern,
    seconds,
    whole,
)
from graphbisect.storage.atomic import atomic_write_text, not_regular
from graphbisect.storage.lockfile import folder_lock
from graphbisect.storage.packfile import TornRunError
from graphbisect.storage.values import load_values_npz
from graphbisect.strategies.subgraph import Candidate, SubgraphSpace, plan
from graphbisect.text.printable import plural
from graphbisect.workflows.compare import DEFAULT_ORACLE, DEFAULT_TARGET
from graphbisect.workflows.maintainer import MaintainerFacts, maintainer_facts
from graphbisect.workflows.probe import compiled_of, describing_spec, plan_probe
from graphbisect.workflows.workfolder import check_own, remove_own

__all__ = ["BASELINE_MAX_RUNS", "CRASH_BASELINE_RUNS", "FLAKY_REPEATS", "VERIFY_RUNS",
           "VERIFY_RUNS_NONDETERMINISTIC", "ReduceOptions", "ReduceResult", "reduce_model", "resume_reduction",
           "work_dir_for"]

log = logging.getLogger(__name__)

#: Fresh runs of the final model that must all fail like the baseline before a result is verified.
VERIFY_RUNS = 3
#: Fresh runs that must all fail like the baseline when the target's values vary between runs of one model.
VERIFY_RUNS_NONDETERMINISTIC = 7
#: Extra runs in which a candidate must fail like the baseline before it is accepted, on a flaky target.
FLAKY_REPEATS = 2
#: Runs of the original model, at most, to reach a majority when they disagree.
BASELINE_MAX_RUNS = 5
#: Runs of the original model that must all crash the same way before a crash is the baseline (a mismatch
#: needs 2): a flaky target crashing at rate p passes them with p**4, 2.6 % at 40 %, and a result is then
#: re-verified in VERIFY_RUNS more (p**7 in all, 0.16 %) before it is called "not flaky".
CRASH_BASELINE_RUNS = 4
#: The work folder's record that re-verification found the target flaky (see _Run.recorded_flakiness).
_FLAKY_FILE = "flaky.json"
#: The work folder's record of the target's noise floor (see _Run.noise_floor).
_FLOOR_FILE = "floor.json"
#: What a candidate's verdict means in this version (a work folder judged otherwise is not resumed): 2 = by
#: identity above the noise floor (issue 23), 1 (absent) = by failure kind.
_JUDGING = 2


@dataclass(frozen=True)
class ReduceOptions:
    oracle: str = option(DEFAULT_ORACLE, BACKEND_SPEC)
    target: str = option(DEFAULT_TARGET, BACKEND_SPEC)
    tolerance: Tolerance = field(default_factory=Tolerance)
    fail_regex: str | None = option(None, pattern.or_none("compare outputs"))
    strict_band: bool = False
    max_invocations: int | None = option(None, INVOCATIONS)
    deadline_seconds: float | None = option(None, seconds().or_none())
    jobs: int = option(1, JOBS)
    cut_as_initializers: bool = False
    layerwise: bool = True
    timeout: float | None = option(None, TIMEOUT)
    keep_work: bool = False
    check: str | None = None  # external check command (Polygraphy-style): its exit status is the verdict
    # with check: only this exit code is the failure
    fail_code: int | None = option(None, EXIT_CODE.or_none("any non-zero exit"))
    # candidate runs as tasks of this executor (local, ray[:ADDRESS]); None: own workers
    executor: str | None = option(None, EXECUTOR.or_none("this process's target workers"))
    # A Python check(outputs, expected) -> bool (True: acceptable) judging outputs instead of the tolerance;
    # recorded by name only, so a resumed run must be given it again.
    output_check: OutputCheck | None = field(default=None, compare=False)
    # stop after this many candidate runs in a row without a failure (see Budget)
    max_stall: int | None = option(48, whole(1).or_none())

    def __post_init__(self) -> None:
        check_fields(self)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        check = self.output_check
        data["output_check"] = None if check is None else getattr(check, "__qualname__", repr(check))
        data["tolerance"] = {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol,
                             "min_cosine": self.tolerance.min_cosine,
                             "per_output": {k: list(v) for k, v in self.tolerance.per_output.items()},
                             "int_atol": self.tolerance.int_atol}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReduceOptions:
        tol = data["tolerance"]
        tolerance = Tolerance(atol=tol["atol"], rtol=tol["rtol"], min_cosine=tol["min_cosine"],
                              per_output={k: (v[0], v[1]) for k, v in tol["per_output"].items()},
                              int_atol=float(tol.get("int_atol", 1.0)))
        return cls(**{**data, "tolerance": tolerance, "output_check": None})


#: Options that control how a run proceeds, not what it computes: a resumed run may change them.
_RUN_CONTROLS = frozenset({"max_invocations", "deadline_seconds", "jobs", "timeout", "keep_work", "executor",
                           "max_stall"})


@dataclass(frozen=True)
class ReduceResult:
    """What `graphbisect reduce` produced; ``to_json`` is the documented ``--json`` schema."""

    failed: bool  # False: the original model does not fail, nothing was reduced
    original_nodes: int
    final_nodes: int
    kept_nodes: tuple[str, ...]
    signature: Signature
    invocations: Mapping[str, int]  # role -> runs
    one_minimal: bool
    stop_reason: str | None
    verified: bool
    flaky: bool
    bundle: Path | None
    work_dir: Path
    seconds: float
    journey: tuple[tuple[int, int], ...] = ()
    notes: tuple[str, ...] = ()
    #: what the failure is beyond its kind (None: matched by kind), and the target's noise floor it is above
    identity: Identity | None = None
    noise_floor: NoiseFloor | None = None
    #: the inputs' dynamic dims graphbisect sized (see :attr:`dims_note`)
    chosen_dims: tuple[ChosenDim, ...] = ()
    #: Ctrl-C stopped part of the run (the search, the re-verification or the facts for maintainers): the
    #: bundle holds what was done, and the CLI exits 130 as for any Ctrl-C
    interrupted: bool = False
    #: role -> {"runs", "compiles", "compile_cache_hits"}: the reduction's backend calls by kind (the runs are
    #: :attr:`invocations`), compiles included (:mod:`graphbisect.backends.cost`), over resumed sessions too
    backend_calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: the same for the runs that measured the bundle's report facts (the report's ``report_runs``: the
    #: specification's word, the optimization levels, a control run), which :attr:`invocations` leaves out
    report_calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: the trusted checker's word on each claim of the bundle (:meth:`graphbisect.checker.Audit.to_json`): the
    #: report's ``audit``; None when the run was interrupted before it
    audit: Mapping[str, Any] | None = None

    @property
    def dims_note(self) -> str | None:
        """What a verdict on sizes graphbisect chose must say (:func:`graphbisect.data.dims_note`), or None."""
        return dims_note(self.chosen_dims)

    def to_json(self) -> dict[str, Any]:
        return {
            "failed": self.failed, "original_nodes": self.original_nodes, "final_nodes": self.final_nodes,
            "kept_nodes": list(self.kept_nodes), "signature": self.signature.to_json(),
            "invocations": dict(self.invocations), "one_minimal": self.one_minimal,
            "stop_reason": self.stop_reason, "verified": self.verified, "flaky": self.flaky,
            "bundle": str(self.bundle) if self.bundle else None, "work_dir": str(self.work_dir),
            "seconds": round(self.seconds, 3), "journey": [list(p) for p in self.journey], "notes": list(self.notes),
            "identity": None if self.identity is None else self.identity.to_json(),
            "noise_floor": None if self.noise_floor is None else self.noise_floor.to_json(),
            "chosen_dims": [dim.to_json() for dim in self.chosen_dims], "dims_note": self.dims_note,
            "interrupted": self.interrupted,
            "backend_calls": {role: dict(calls) for role, calls in self.backend_calls.items()},
            "report_calls": {role: dict(calls) for role, calls in self.report_calls.items()},
            "audit": None if self.audit is None else dict(self.audit),
        }


def work_dir_for(bundle_dir: Path) -> Path:
    """Where a reduction writing ``bundle_dir`` keeps its resumable state."""
    bundle_dir = Path(bundle_dir)
    return bundle_dir.with_name(bundle_dir.name + ".work")


class _Run:
    """The state of one reduction; methods are the workflow's steps in order."""

    def __init__(self, model: Model, options: ReduceOptions, bundle_dir: Path,
                 on_progress: Callable[[ProgressEvent], None] | None, on_stage: Callable[[str], None]) -> None:
        self.model, self.options, self.bundle_dir = model, options, Path(bundle_dir)
        self.work = work_dir_for(self.bundle_dir)
        self.on_progress, self.stage = on_progress, on_stage
        self.oracle_spec, self.oracle_info = resolve(options.oracle)
        target = BackendSpec("command", {"cmd": options.check, "shell": "1"}) if options.check else options.target
        self.target_spec, self.target_info = resolve(target)
        for role, info in (("oracle", self.oracle_info), ("target", self.target_info)):
            if not info.has(Capability.ONNX_INPUT):
                raise GraphBisectError(
                    f"the {role} backend {info.name!r} cannot run ONNX subgraphs, so it cannot drive a reduction",
                    hint="compare first (`graphbisect compare --target paddle ...`), then reduce the converted ONNX "
                    "model with an ONNX backend that shows the same failure",
                )
        self.tol = with_quantization(options.tolerance, model)  # quantized tensors compared in steps
        self.regex = re.compile(options.fail_regex) if options.fail_regex else None
        # The original's node and tensor names, taken out of every crash message of this reduction (the baseline's,
        # each candidate's, the re-verification's): one set, so a name is erased in all of them or in none.
        self.names = ModelNames(model.proto)
        #: the reduction's backend calls by role and kind (runs, compiles) but its searches'; recorded in run.json
        self.calls = CallTally({"oracle": Cost(), "target": Cost()})
        #: the searches' target calls, summed over the journal (every session's: :func:`journal_cost`)
        self.search_calls = Cost()
        self.ran_with: dict[str, dict[str, Any]] = {}  # role -> what its last worker measured (RunResult.ran_with)
        self.notes: list[str] = []
        self.started = time.monotonic()
        self.force = False  # replace a bundle of another model
        self.chosen: tuple[ChosenDim, ...] = ()  # the inputs' dynamic dims graphbisect sized (recorded in run.json)
        self._last_original: RunResult | None = None  # the last completed run of the original (floor_only)
        #: the most memory a target worker needed on the whole model (its runs of the original, measured by the
        #: worker: RunResult.peak_memory), which caps how many candidate workers run at once (-j)
        self.peak_memory: int | None = None
        self._messages: dict[Signature, str] = {}  # a crash of the original -> the message it gave (crash hints)
        self._pass_names: list[str] | None = None  # the target's disabled= names (_listed_passes)

    # --- state on disk -------------------------------------------------------------------------------
    def prepare(self, feeds: Mapping[str, np.ndarray] | None, *, resume: bool) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        state = self.work / "run.json"
        fingerprint = self.run_fingerprint()
        if resume and not state.exists():
            raise GraphBisectError(f"nothing to resume in {self.work}", hint="start the reduction without resume=True",
                                   cli_hint="start the reduction without --resume")
        if resume:
            recorded = json.loads(state.read_text())
            if json.loads(recorded["fingerprint"]).get("judging") != _JUDGING:
                raise GraphBisectError(
                    f"{self.work} was made by an earlier graphbisect, which judged candidates by the failure's "
                    "kind alone: its journal cannot be resumed by one that matches the failure's identity",
                    hint=f"remove {self.work} and run the reduction again without resume=True",
                    cli_hint=f"remove {self.work} and run the reduction again without --resume")
            if recorded["fingerprint"] != fingerprint:
                raise GraphBisectError(
                    f"{self.work} belongs to a different reduction (model or options changed)",
                    hint="resume with the same model and options, or remove the folder to start afresh",
                )
            self.calls, self.search_calls = _recorded_calls(recorded, self.calls)
            self.chosen = tuple(ChosenDim.from_json(d) for d in recorded.get("chosen_dims", ()))
        else:
            self._start_clean(state, fingerprint)
        self.save_state()  # first: from now on the folder is recognizably this run's
        if feeds is not None and not (resume and (self.work / "inputs.npz").exists()):
            save_inputs(self.work / "inputs.npz", validate_inputs(self.model, feeds))
        if not resume or not (self.work / "model.onnx").exists():
            self.model.save(self.work / "model.onnx")  # resume loads this copy: the user's file may move
        self.save_state()

    def _start_clean(self, state: Path, fingerprint: str) -> None:
        """A run without ``--resume`` uses nothing an earlier run left in the work folder (issue 24 case 4: a
        stopped run's ``model.onnx`` was run as the new model's and certified its bug). The folder's earlier
        content is removed after saying so; a folder graphbisect did not make (no ``run.json``) is refused, and
        so is one holding anything graphbisect did not write (:func:`~graphbisect.workflows.workfolder.check_own`,
        checked before the lock)."""
        left = sorted(p.name for p in self.work.iterdir() if p.name != "lock")
        if not left:
            return
        if not state.is_file():
            raise GraphBisectError(
                f"{self.work} holds files graphbisect did not write ({', '.join(left[:5])}"
                f"{' …' if len(left) > 5 else ''}): it is the work folder of a reduction writing {self.bundle_dir}",
                hint=f"move those files away, or choose another -o folder than {self.bundle_dir}")
        try:
            same = json.loads(state.read_text())["fingerprint"] == fingerprint
        except (OSError, ValueError, KeyError, TypeError):
            same = False
        what = "an interrupted run of this reduction" if same else "another reduction (another model or options)"
        message = (f"{self.work} holds the state of {what}; starting afresh without it "
                   f"(graphbisect reduce --resume {self.bundle_dir} continues an interrupted run instead)")
        log.info("%s", message)
        self.stage(message)
        remove_own(self.work, keep=frozenset({"lock"}))

    def run_fingerprint(self) -> str:
        """What makes two runs the same reduction (budget, parallelism and clean-up do not change the result)."""
        options = {k: v for k, v in self.options.to_json().items() if k not in _RUN_CONTROLS}
        return json.dumps({"model": self.model.fingerprint, "oracle": str(self.oracle_spec),
                           "target": str(self.target_spec), "options": options, "judging": _JUDGING},
                          sort_keys=True)

    def save_state(self) -> None:
        atomic_write_text(self.work / "run.json", json.dumps({
            "fingerprint": self.run_fingerprint(), "model": str(self.work / "model.onnx"),
            "source": str(self.model.path) if self.model.path else None,
            "bundle": str(self.bundle_dir), "options": self.options.to_json(), "invocations": self.invocations,
            "backend_calls": self.tally().to_json(), "calls_outside_searches": self.calls.to_json(),
            "chosen_dims": [dim.to_json() for dim in self.chosen],
        }, indent=2))

    # --- steps -----------------------------------------------------------------------------------------
    def capture(self) -> ActivationStore:
        """One oracle run on the probe model → the activation store (skipped when resuming, unless the
        store a resumed run finds is torn: then it is captured again, never read)."""
        store_dir = self.work / "activations"
        if (store_dir / MANIFEST_NAME).exists():
            try:
                return ActivationStore.adopt(store_dir)
            except TornRunError as exc:
                log.warning("the activation store of the resumed run is unusable (%s); capturing it again",
                            exc.message)
        names = [n for n in self.model.intermediate_names()]
        probe = self.work / "probe.onnx"
        save_proto(self.model.with_outputs(names), probe)
        self.stage(f"capturing {plural(len(names), 'tensor')} with the oracle {self.oracle_spec}")
        try:
            with BackendProcess(self.oracle_spec, workdir=self.work / "oracle", timeout=self.options.timeout) as proc:
                # the plain run shares the capture's worker: no second start
                runs = capture_as_built(self._oracle_runner(proc), probe, self.work / "model.onnx",
                                        outputs=self.model.output_names, rewrites=self.rewriting_oracle(),
                                        spec=self.oracle_spec,
                                        tolerance=self.tol, capture_dir=store_dir,
                                        plain_dir=self.work / "oracle-plain", on_plain=self._stage_plain)
        finally:
            remove_model(probe)  # also when the plain run raises: a model-sized file left in the work folder
        runs.require_ok(self.oracle_spec)
        return ActivationStore.adopt(store_dir)

    def noise_floor(self, store: ActivationStore) -> NoiseFloor:
        """The target's noise floor (:mod:`graphbisect.oracle.floor`): measured once, on every tensor of the
        capture's probe, and kept in the work folder. None is measured when no tolerance judges the runs."""
        path = self.work / _FLOOR_FILE
        if path.exists():
            return NoiseFloor.load(path)
        if self.options.check or self.regex or self.options.output_check:
            floor = no_floor("not measured: an external check, a --fail-regex or a Python check judges the runs")
        else:
            decided = floor_spec(self.target_spec, self.target_info, self.oracle_spec)
            floor = decided if isinstance(decided, NoiseFloor) else self._measure_floor(decided, store)
        floor.save(path)
        return floor

    def _measure_floor(self, spec: BackendSpec, store: ActivationStore) -> NoiseFloor:
        names = [n for n in self.model.intermediate_names() if n in store]
        probe = self.work / "probe-floor.onnx"
        save_proto(self.model.with_outputs(names), probe)
        self.stage(f"measuring the target's noise floor: {brief_spec(spec)} (its optimizations off) on "
                   f"{plural(len(names), 'tensor')}")
        floor: NoiseFloor | None = None
        try:
            floor = measure_floor(spec, probe, self.work / "inputs.npz", store.directory, self.tol,
                                  workdir=self.work / "floor", timeout=self.options.timeout)
            return floor
        finally:
            remove_model(probe)
            # a run that raised was still made; what it compiled died with its worker
            self.count("target", floor.cost if floor is not None else Cost(runs=1))

    def rewriting_oracle(self) -> bool:
        """Whether the oracle may compute the probe differently from the model (``computes_as_written``) and
        its values decide the verdict (not for an external check or a ``fail_regex``, which compare none)."""
        if self.options.check or self.options.fail_regex:
            return False
        return not self.oracle_info.computes_as_written(self.oracle_spec, elem_types(self.model.proto))

    def _oracle_runner(self, proc: BackendProcess) -> Runner:
        """One counted oracle run in ``proc`` on the work folder's inputs (:func:`capture_as_built`'s runner);
        its outputs (the capture, the plain run) are fsynced before the worker replies: --resume reads them."""
        def run(model: Path, output_dir: Path | None) -> RunResult:
            result = proc.run(model, self.work / "inputs.npz", output_dir=output_dir, durable=True)
            self.count("oracle", Cost.of_run(result), run=result)
            return result

        return run

    def _stage_plain(self) -> None:
        self.stage(f"running the oracle {self.oracle_spec} on the model as built (it rewrites the graph, so its "
                   "capture may not be its verdict)")

    def verdict_values(self, store: ActivationStore,
                       values: Callable[[str], np.ndarray]) -> Callable[[str], np.ndarray]:
        """The oracle's values the verdict on the original model is judged against.

        An oracle that computes the graph as written: its capture (``values``). One that rewrites it (ONNX
        Runtime above ``opt_level=disable``, OpenVINO) may build the probe differently from the model, as in
        ``compare`` (:meth:`~graphbisect.backends.registry.BackendInfo.computes_as_written`): its outputs on the
        model as built are the verdict's. Candidates are still judged against the capture (their cut feeds
        and expected values), which is sound only while the capture computes what the oracle computes on the
        model: when the two differ beyond tolerance the reduction stops and says so.
        """
        if not self.rewriting_oracle():
            return values
        plain_dir = self.work / "oracle-plain"
        if not (plain_dir / MANIFEST_NAME).exists():  # a resumed run captured before: the plain run only
            with BackendProcess(self.oracle_spec, workdir=self.work / "oracle", timeout=self.options.timeout) as proc:
                self._stage_plain()
                require_as_built(self._oracle_runner(proc)(self.work / "model.onnx", plain_dir), self.oracle_spec)
        plain = ActivationStore.adopt(plain_dir)
        outputs = self.model.output_names
        # measured on the two stores, so a resumed run decides as the first one did
        difference = capture_difference({name: values(name) for name in outputs},
                                        {name: plain.get(name) for name in outputs}, outputs, self.tol)
        if difference.differs:
            raise GraphBisectError(
                f"{difference.why(self.oracle_spec)}. The verdict is "
                "the model as built, but candidates are judged against the capture, so this oracle cannot drive a "
                "reduction of this model",
                hint=f"choose an oracle that computes the graph as written (oracle='reference', or "
                f"oracle='onnxruntime:opt_level=disable'); the difference is {self.oracle_spec}'s own rewrite: to "
                f"reduce it, make it the target (target='{self.oracle_spec}', oracle='reference')",
                cli_hint=f"choose an oracle that computes the graph as written (--oracle reference, or "
                f"--oracle onnxruntime:opt_level=disable); the difference is {self.oracle_spec}'s own rewrite: to "
                f"reduce it, make it the target (--target {self.oracle_spec} --oracle reference)")

        def value(name: str) -> np.ndarray:
            return plain.get(name) if name in outputs else values(name)

        return value

    def compared(self, outputs: Sequence[str]) -> Sequence[str]:
        """The target outputs to compare: none for an external check, whose exit status is the verdict."""
        return () if self.options.check else outputs

    @property
    def invocations(self) -> dict[str, int]:
        """{role: runs}: the result's ``invocations``."""
        return self.tally().runs()

    def tally(self) -> CallTally:
        """Every backend call of the reduction by role and kind: the result's ``backend_calls``."""
        tally = CallTally(self.calls.roles())
        tally.add("target", self.search_calls)
        return tally

    def count(self, role: str, cost: Cost, run: RunResult | None = None) -> None:
        """Count the backend calls ``cost`` of ``role`` made outside the searches (and remember what ran
        ``run``, for the report's versions); saved at once, so a resumed run goes on counting from here. A
        search's calls are in its journal instead, with the results they gave (:func:`journal_cost`)."""
        self.calls.add(role, cost)
        if run is not None and run.ran_with:
            self.ran_with[role] = dict(run.ran_with)
        self.save_state()

    def versions(self) -> dict[str, dict[str, Any] | None]:
        """What ran each role, as measured in its workers (None: no run of it in this session)."""
        return {role: self.ran_with.get(role) for role in ("oracle", "target")}

    def values(self, store: ActivationStore) -> Callable[[str], np.ndarray]:
        feeds = load_values_npz(self.work / "inputs.npz")

        def value(name: str) -> np.ndarray:
            return feeds[name] if name in feeds else store.get(name)

        return value

    def baseline(self, store: ActivationStore, values: Callable[[str], np.ndarray], floor: NoiseFloor) -> _Baseline:
        """The target on the original model: its signature, whether it is flaky, layerwise evidence and the
        failure's identity.

        Run 1 is the original model (saving the target's optimized graph where the backend can). Run 2 is
        the layerwise probe when evidence can be had, else the original again; the probe's own outputs
        are the original outputs, so when they fail exactly like run 1 the probe *is* the flakiness
        re-run. Only when they do not (flakiness, or probing masked the failure) does a plain re-run
        decide. Runs are judged above the target's noise ``floor``; an original that fails only within it
        is no failure to reduce (:meth:`floor_only`). Saved in the work folder, so a resumed run does not
        pay for any of it again.
        """
        path = self.work / "baseline.json"
        if path.exists():
            return self._saved_baseline(path)
        saving = self._saving_spec()
        first, compiled, ran = self._run_original(values, saving, "running the target on the original model", floor)
        notes: list[str] = []
        again: Signature | None = None
        if saving is not None and not ran:
            # The crash must not come from saving the optimized graph: a plain run decides, and when it
            # crashes the same way the saving run was its flakiness re-run.
            plain, _, _ = self._run_original(values, None, "running the target on the original model again", floor)
            again, first, compiled = (first if plain.matches(first) else None), plain, None
        hints: list[frozenset[int]] = []
        priors: dict[int, float] = {}
        identity: Identity | None = None
        root: LayerRow | None = None
        if first.failed and self._evidence_possible(first):
            probe_sig, hints, priors, notes, root = self._collect_evidence(store, values, compiled, floor)
            if root is not None and self.options.output_check is None:  # a check's verdict is not the tolerance's
                identity = Identity.of_row(root.node, root.tensor, root.stats.score, root.compiled_as,
                                           compiled.source if compiled is not None else None
                                           ).with_disable_names(self._pass_names)
            if probe_sig is not None and first.matches(probe_sig):
                again = probe_sig
        if first.kind.raised and not hints:
            hints = self._located(first)
        runs = self._repeated(first, again, values, floor)
        flaky = not all(_same(first, run) for run in runs)
        if flaky:
            first, note = self._majority(runs, values, floor)
            notes.append(note)
            self.stage(note)  # said at once: every result of this reduction rests on it
            identity = None  # the evidence came from one run of a target whose runs disagree
        first = self._as_asked(first, root, notes)
        self.notes.extend(notes)
        atomic_write_text(path, json.dumps({"signature": first.to_json(), "flaky": flaky, "notes": notes,
                                            "hints": [sorted(h) for h in hints], "priors": priors,
                                            "identity": None if identity is None else identity.to_json(),
                                            "peak_memory": self.peak_memory}))
        return _Baseline(first, flaky, hints, priors, identity)

    def _saved_baseline(self, path: Path) -> _Baseline:
        """The baseline an earlier run of this reduction saved at ``path`` (its notes join this run's)."""
        data = json.loads(path.read_text())
        self.notes.extend(data.get("notes", []))  # a work folder of an older version has no evidence here
        self.peak_memory = data.get("peak_memory")
        return _Baseline(Signature.from_json(data["signature"], names=self.names), bool(data["flaky"]),
                         [frozenset(h) for h in data.get("hints", [])],
                         {int(k): v for k, v in data.get("priors", {}).items()},
                         Identity.from_json(data.get("identity")))

    def _repeated(self, first: Signature, again: Signature | None, values: Callable[[str], np.ndarray],
                  floor: NoiseFloor) -> list[Signature]:
        """The baseline's runs that must agree: ``first`` and its re-run (``again``, a run already made that
        serves as one, else one more run when ``first`` failed); a crash takes :data:`CRASH_BASELINE_RUNS`."""
        if first.failed and again is None:
            again = self._run_original(values, None, "running the target on the original model again (flakiness)",
                                       floor)[0]
        runs = [first] if again is None else [first, again]
        if first.kind.raised and first.matches(runs[-1]):
            # A crash is the cheap, common symptom of a flaky target: two crashing runs agree by chance with
            # p**2 (16 % at a 40 % crash rate), so a crash baseline takes CRASH_BASELINE_RUNS agreeing runs.
            while len(runs) < CRASH_BASELINE_RUNS and all(first.matches(run) for run in runs):
                runs.append(self._run_original(
                    values, None, f"running the target on the original model again (a crash: run {len(runs) + 1} "
                    f"of {CRASH_BASELINE_RUNS} that must agree)", floor)[0])
        return runs

    def _as_asked(self, first: Signature, root: LayerRow | None, notes: list[str]) -> Signature:
        """The failure to reduce: none when it is not the ``--fail-code`` asked for; when the first divergence
        (``root``) is an integer tensor, a failure rooted there. Each change is added to ``notes``."""
        if self.options.fail_code is not None and first.failed and \
                f"exited with code {self.options.fail_code}" not in first.detail:
            notes.append(f"the check failed ({first.describe()}) but not with exit code "
                         f"{self.options.fail_code}; that is not the failure asked for")
            return Signature(FailureKind.NONE)
        rooted = rooted_in_integers(first, root.stats.oracle_dtype if root is not None else None)
        if rooted is not first:
            assert root is not None
            notes.append(f"the first divergence is the {root.stats.oracle_dtype} tensor {root.tensor!r} "
                         f"({root.node}): the float error at the outputs follows from it, so a candidate whose "
                         f"integer outputs differ fails the same way")
        return rooted

    def floor_only(self, values: Callable[[str], np.ndarray], floor: NoiseFloor) -> GraphBisectError | None:
        """The error to stop with when the original fails the tolerance only within the target's noise floor
        (None when it does not fail at all, or there is no floor): reducing kernel noise finds no bug."""
        if not floor.measured:
            return None
        run = self._last_original
        if run is None or not judge(run, values, self.compared(self.model.output_names), self.tol).signature.failed:
            return None
        worst = floor.above_tolerance(self.model.output_names) or floor.above_tolerance()
        where = ", ".join(f"{name!r} {score:.3g}×" for name, score in worst[:3])
        return GraphBisectError(
            f"the target fails the tolerance only within its own noise floor: with its optimizations off "
            f"({floor.spec}) it already errs as much ({where}), so the failure is the precision of its kernels "
            f"(e.g. TF32 matrix products on a GPU), not a transformation to reduce",
            hint="compare with a tolerance that fits the kernels (atol=, rtol=), or make the target compute in "
            "full precision (onnxruntime CUDA: cuda.use_tf32=0); to reduce a kernel you suspect, make the "
            f"floor the target: target='{floor.spec}'",
            cli_hint="compare with a tolerance that fits the kernels (--atol/--rtol), or make the target compute in "
            "full precision (onnxruntime CUDA: cuda.use_tf32=0); to reduce a kernel you suspect, make the "
            f"floor the target: --target {floor.spec}")

    def recorded_flakiness(self) -> list[str] | None:
        """The notes of an earlier session whose re-verification found the target flaky (None: none did).

        A resumed run goes on as that session did (a candidate accepted only after FLAKY_REPEATS more runs,
        in the journal scope ``flaky``) and reports the target flaky: without this record it replayed the
        single-run search, and fresh runs that happened to agree certified the result as 1-minimal and the
        target as not flaky.
        """
        path = self.work / _FLAKY_FILE
        return [str(note) for note in json.loads(path.read_text())["notes"]] if path.exists() else None

    def record_flakiness(self, notes: Sequence[str]) -> None:
        """Save what the re-verification found (see :meth:`recorded_flakiness`) before the search goes on."""
        atomic_write_text(self.work / _FLAKY_FILE, json.dumps({"notes": list(notes)}))

    def _majority(self, runs: list[Signature], values: Callable[[str], np.ndarray],
                  floor: NoiseFloor) -> tuple[Signature, str]:
        """Runs of the original disagree: run it again until one outcome has a majority of BASELINE_MAX_RUNS
        runs (2 of 3 agreeing runs of a flaky target decide too little); returns that outcome and a note, or
        raises when no outcome has a majority of the runs made.

        A death (crash, timeout) that other runs of the same model survive is the target's flakiness, never the
        baseline, however often it came (a 40 % crash is the majority of 5 runs a third of the time, and a
        search for it certifies nothing): the baseline is then the majority of the completed runs, at least
        two of them agreeing, and when they do not fail there is no failure to reduce, which is said."""
        def count(signature: Signature, among: Sequence[Signature] = runs) -> int:
            return sum(1 for other in among if _same(signature, other))

        def again(why: str) -> None:
            runs.append(self._run_original(values, None, f"running the target on the original model again "
                                                         f"(flaky: run {len(runs) + 1} {why})", floor)[0])

        while len(runs) < BASELINE_MAX_RUNS and max(count(s) for s in runs) * 2 <= BASELINE_MAX_RUNS:
            again("for a majority")

        def completed() -> list[Signature]:
            return [s for s in runs if not _dies(s)]

        survived = 0 < len(completed()) < len(runs)
        while survived and len(runs) < 2 * BASELINE_MAX_RUNS and max(count(s, completed()) for s in completed()) < 2:
            again("for two completed runs that agree")
        outcomes = dict.fromkeys(s.describe() for s in runs)
        tally = "; ".join(f"{d}: {sum(1 for s in runs if s.describe() == d)}" for d in outcomes)
        gave = f"flaky target: {len(runs)} runs of the same original model gave {len(outcomes)} different results"
        among = completed() if survived else runs
        chosen = sorted(among, key=lambda s: (-count(s, among), not s.failed))[0]
        hint = ("make the target deterministic (fixed seeds, one thread, an idle device), or reduce with a "
                "--check script that runs it several times and fails only when most runs fail")
        if survived:
            died = len(runs) - len(among)
            if count(chosen, among) < 2 or count(chosen, among) * 2 <= len(among) or not chosen.failed:
                raise GraphBisectError(
                    f"{gave} ({tally}): it died in {died} of {len(runs)} runs of the same model and completed in the "
                    "others, so the death is the target's flakiness, not a failure of this model to reduce (a "
                    "reduction would certify whichever part happened to die), and the completed runs show "
                    + ("no failure" if not chosen.failed and count(chosen, among) >= 2 else
                       "no failure that two of them agree on"),
                    hint=f"report the flaky crash with the runs above; {hint}")
            return chosen, (f"{gave} ({tally}); a death that other runs of the same model survive is flakiness, "
                            f"never the baseline: the completed runs' majority, {chosen.describe()}, is, and a "
                            f"candidate is accepted only when it fails that way in {FLAKY_REPEATS + 1} runs in a row")
        if count(chosen) * 2 <= len(runs):  # no outcome is the target's behaviour on this model
            raise GraphBisectError(
                f"{gave} ({tally}) and none has a majority: there is no failure to reduce that the next run "
                "would show again", hint=hint)
        if not chosen.failed:
            return chosen, (f"{gave} ({tally}); the majority does not fail, so there is no failure to reduce "
                            "(the target is flaky on this model)")
        return chosen, (f"{gave} ({tally}); the majority, {chosen.describe()}, is the baseline, and a candidate "
                        f"is accepted only when it fails that way in {FLAKY_REPEATS + 1} runs in a row")

    def _saving_spec(self) -> BackendSpec | None:
        """The target asked to describe what it compiled, when it can and the evidence would be used."""
        if self.options.check or not self.options.layerwise:
            return None
        return describing_spec(self.target_spec)

    def _run_original(self, values: Callable[[str], np.ndarray], spec: BackendSpec | None,
                      stage: str, floor: NoiseFloor) -> tuple[Signature, CompiledGraph | None, bool]:
        """One target run on the original model: its signature (above ``floor``), the graph it compiled if
        described, and whether the run completed (a crash or timeout does not)."""
        self.stage(stage)
        workdir = self.work / ("baseline-saving" if spec is not None else "baseline")
        with BackendProcess(spec or self.target_spec, workdir=workdir, timeout=self.options.timeout) as proc:
            run = proc.run(self.work / "model.onnx", self.work / "inputs.npz")
            compiled = compiled_of(self.model, run.info) if run.ok and spec is not None else None
            if compiled is not None:
                self._pass_names = self._listed_passes(proc, compiled)
        self.count("target", Cost.of_run(run), run=run)
        if run.peak_memory is not None:
            self.peak_memory = max(self.peak_memory or 0, run.peak_memory)
        if run.ok:  # the values stay mapped after the worker's folder is gone (POSIX)
            self._last_original = run
        signature = judge(run, values, self.compared(self.model.output_names), self.tol, self.regex,
                          check=self.options.output_check, floor=floor, names=self.names).signature
        if not run.ok and run.message:
            self._messages.setdefault(signature, run.message)
        if spec is not None:  # ORT wrote a copy of every weight beside the optimized graph: read, then gone
            shutil.rmtree(workdir, ignore_errors=True)
        return signature, compiled, run.ok

    def _listed_passes(self, proc: BackendProcess, compiled: CompiledGraph) -> list[str] | None:
        """The optimizer names the target's ``disabled=`` takes for the passes that made ``compiled``'s nodes
        (:func:`~graphbisect.oracle.identity.pass_of`, with their per-level variants), asked of its worker (no
        compile of the model; ORT checks those few names in a handful of probe sessions instead of listing its
        ~400-session catalogue), for the identity to name the pass that made its compiled node as the user can
        disable it; None where the target cannot ablate passes or list them."""
        if not resolve(self.target_spec, require_available=False)[1].has(Capability.PASSES):
            return None
        made = dict.fromkeys(p for p in (pass_of(node.name) for node in compiled.nodes) if p)
        if not made:
            return []
        try:
            return proc.registered_passes(among=[name for p in made for name in level_variants(p)])
        except GraphBisectError as exc:
            log.info("the target lists no optimizer names: %s", exc.message)
            return None

    def _located(self, crash: Signature) -> list[frozenset[int]]:
        """The nodes the message of ``crash`` names, by node or output name as a token (IREE's ``loc("...")``,
        ONNX Runtime's ``Name:'...'``), as the first candidate: one build or run to try, and when that part
        alone crashes the same way the search is left with its proof. Names that are plain words (``x``,
        ``MatMul``) or numbers are not taken for names; a message naming most of the model gives no hint."""
        message = self._messages.get(crash)
        if not message:
            return []
        producers: dict[str, int] = {}
        for index, node in enumerate(self.model.nodes):
            for name in (node.name, *node.output):
                if any(c.isalpha() for c in name) and not name.isalpha():
                    producers.setdefault(name, index)
        located = frozenset(producers[name] for name in found_names(message, producers))
        if not located or 2 * len(located) > len(self.model.nodes):  # no hint: the slice narrows it faster
            return []
        log.info("the crash message names %d node(s): tried first", len(located))
        return [located]

    def _evidence_possible(self, baseline: Signature) -> bool:
        return self.options.layerwise and self.target_info.has(Capability.INTERMEDIATES) and \
            baseline.kind in (FailureKind.MISMATCH, FailureKind.NAN)

    def _collect_evidence(self, store: ActivationStore, values: Callable[[str], np.ndarray],
                          compiled: CompiledGraph | None, floor: NoiseFloor,
                          ) -> tuple[Signature | None, list[frozenset[int]], dict[int, float], list[str],
                                     LayerRow | None]:
        """One probed target run: (its signature on the original outputs, hints, priors, notes, the first
        divergence above the noise floor: the failure's identity, with what the target compiled there).

        With the compiled graph known, the probe exposes only the tensors that survive in it, so it compiles
        to the same graph and a bug inside a fusion stays visible; each hint is then the original region a
        compiled node replaced (:mod:`graphbisect.workflows.probe`, the probe `compare` uses).
        """
        plan = plan_probe(self.model, compiled, among=store)
        probe = self.work / "probe-target.onnx"
        save_proto(self.model.with_outputs(list(plan.names)), probe)
        self.stage(f"collecting layerwise evidence from the target: {plan.describe()}")
        with BackendProcess(self.target_spec, workdir=self.work / "evidence", timeout=self.options.timeout) as proc:
            # Compared with the store in the target's worker: only the model's outputs come back as values.
            run = proc.run(probe, self.work / "inputs.npz",
                           compare_to=CompareTo(store.directory, self.tol, keep=tuple(self.model.output_names)))
        self.count("target", Cost.of_run(run))
        remove_model(probe)
        if not run.ok:
            return None, [], {}, [f"the target failed on the probed model ({run.describe()}); no layerwise hints "
                                  "and no identity (failures match by kind)"], None
        signature = judge(run, values, self.compared(self.model.output_names), self.tol, self.regex,
                          check=self.options.output_check, floor=floor, names=self.names).signature
        report = analyze_layers(self.model.nodes, store, run.outputs, self.tol, compiled=compiled, measured=run.stats,
                                outputs=self.model.output_names, floor=floor)
        if report.first_divergence is None:
            return signature, [], {}, ["probe masking: with the intermediates exposed the target agrees with "
                                       "the oracle; the search is structural, and failures match by kind"], None
        index = self.model.node_index

        def region(node: int) -> frozenset[int]:
            return compiled.region(self.model.nodes, node) if compiled is not None else frozenset({node})

        causes = [region(index(rc.node)) for rc in report.root_causes[:3]]
        hints = list(dict.fromkeys([*causes, region(report.first_divergence.index)]))
        priors: dict[int, float] = {}
        for rank, nodes in enumerate(causes):
            priors.update({node: max(priors.get(node, 0.0), 0.1 * (3 - rank)) for node in nodes})
        return signature, hints, priors, [], report.first_divergence

    def candidate_spec(self, identity: Identity | None) -> BackendSpec:
        """The spec candidates run with: the target's, describing what it compiled when the failure's identity
        names a compiled node (each candidate that fails like the baseline is then matched on it)."""
        if identity is not None and identity.compiled_kind is not None:
            return describing_spec(self.target_spec) or self.target_spec
        return self.target_spec

    def identity_check(self, identity: Identity | None) -> IdentityCheck | None:
        return None if identity is None else IdentityCheck(identity, self.model.nodes)

    def search(self, space: SubgraphSpace, base: _Baseline, floor: NoiseFloor, *, flaky: bool, scope: str = "",
               ) -> tuple[SearchResult, Evaluator, CandidateTester]:
        """The subgraph search; with ``flaky`` a candidate is accepted only after FLAKY_REPEATS more runs fail
        the same way. ``scope`` keeps its journal entries apart from another search's."""
        jobs, capped = (max(1, self.options.jobs), None) if self.options.executor else cap_jobs(self.options.jobs)
        memory: str | None = None
        if not self.options.executor:  # tasks elsewhere use that machine's memory
            jobs, memory = cap_jobs_to_memory(jobs, self.peak_memory, available_memory())
        for note in filter(None, (capped, memory)):
            if note not in self.notes:
                self.notes.append(note)
                self.stage(note)

        def pool_of(spec: BackendSpec, folder: str) -> TargetPool:
            if self.options.executor:
                return ExecutorPool.open(self.options.executor, spec, self.work / folder, jobs=jobs,
                                         timeout=self.options.timeout)
            return WorkerPool(spec, jobs, self.work / folder, timeout=self.options.timeout)

        pool = pool_of(self.target_spec, "target")
        # Workers start on their first run: none if unused. An executor's task carries what it compiled back
        # inline (its files stay where it ran), so candidates match the whole identity wherever they ran.
        describing = self.candidate_spec(base.identity)
        # a build that says what it compiled decides the candidates whose region it compiled otherwise (the run
        # that follows, where one does, uses that build: the same worker, or the same executor task)
        build_decides = self.target_info.described_at_build
        tester = CandidateTester(space, pool, base.signature, self.tol, fail_regex=self.regex,
                                 strict_band=base.strict_band(self.options.strict_band),
                                 compare=not self.options.check,
                                 check=self.options.output_check, repeats=FLAKY_REPEATS if flaky else 0,
                                 floor=floor, identity=self.identity_check(base.identity),
                                 describing=pool_of(describing, "target-describing")
                                 if describing != self.target_spec else None, names=self.names,
                                 build_decides=build_decides)
        journal = Journal.open(self.work / "journal.jsonl", fingerprint=self.model.fingerprint)
        # The budget is this session's: resuming with --max-invocations N buys N more candidate runs.
        budget = Budget(max_invocations=self.options.max_invocations, deadline_seconds=self.options.deadline_seconds,
                        max_stall=self.options.max_stall)
        evaluator = Evaluator(tester, space.size, journal=journal, scope=scope, budget=budget, jobs=jobs,
                              on_progress=self.on_progress)
        self.stage(f"reducing {plural(space.size, 'node')}" + (" (flaky target: a candidate must fail "
                                                     f"{FLAKY_REPEATS + 1} times in a row)" if flaky else ""))
        try:
            result = plan(evaluator, space, hints=base.hints, priors=base.priors)
        except SearchAborted as exc:
            for opened in filter(None, (pool, tester.describing)):
                opened.close()
            raise GraphBisectError(f"the reduction stopped: {exc.message}", hint=exc.hint) from exc
        finally:
            # every session's search calls, this one's included: the journal holds each with its result
            self.search_calls = journal_cost(journal.results(), compile_only=tester.compile_only)
            self.save_state()
            journal.close()  # a repeated search opens it again
        return result, evaluator, tester


def reduce_model(
    model: Model | str | Path,
    bundle_dir: Path,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    options: ReduceOptions | None = None,
    resume: bool = False,
    zip_bundle: bool = False,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
    amend: Callable[[BundleContent], BundleContent] | None = None,
    force: bool = False,
    chosen: Sequence[ChosenDim] = (),
) -> ReduceResult:
    """Reduce ``model`` to a minimal subgraph that fails the same way and write the bundle to ``bundle_dir``.

    ``model`` is a loaded :class:`Model` or a path (loaded here); ``inputs`` may be None only when resuming
    (the first run saved them). ``amend`` lets a calling workflow add
    what it knows to the bundle (a control spec, report facts, sections) before it is written atomically.
    ``force`` replaces a bundle of another model in ``bundle_dir``. ``chosen``: the dynamic dims graphbisect
    sized when it drew ``inputs`` (:func:`graphbisect.data.chosen_dims`): a model that does not fail on them
    says so in its notes (recorded, so a resumed run keeps them). Before any backend runs, ``bundle_dir`` is
    checked (writable; new, empty or a previous bundle) and its work folder locked: a second reduction
    writing the same place stops at once. See the module docstring.
    """
    options = options or ReduceOptions()
    if not isinstance(model, Model):
        from graphbisect.model import load_model

        model = load_model(model)
    if inputs is None and not resume:
        raise InputError("reduce_model needs the model's inputs (only a resumed run has them saved)",
                         hint="pass inputs=, e.g. graphbisect.data.random_inputs(model), or use graphbisect.reduce, "
                         "which draws seeded random inputs when none are given")
    if not model.nodes:
        raise ModelError(f"{model.origin or 'the model'} has no nodes: there is nothing to reduce",
                         hint="a graph whose outputs are its inputs is already minimal: report it as it is "
                         "(`graphbisect compare` shows the verdict)")
    warn_unused_initializers(model)  # before a build that may take minutes
    r = _Run(model, options, bundle_dir, on_progress, on_stage or (lambda _msg: None))
    r.force = force
    r.chosen = tuple(chosen)
    check_destination(r.bundle_dir, fingerprint=model.fingerprint, force=force)
    zip_path = r.bundle_dir.with_name(r.bundle_dir.name + ".zip")
    problem = not_regular(zip_path) if zip_bundle else None
    if problem is not None:  # known now: not after the whole run
        raise InputError(f"cannot write the bundle's zip {zip_path}: {problem}",
                         hint=f"move {zip_path} away, or drop zip=True",
                         cli_hint=f"move {zip_path} away, or drop --zip")
    check_own(r.work)  # never through a link, never over a file of the user's (issue 36)
    fresh = not r.work.exists()
    try:
        with folder_lock(r.work, what=f"a reduction writing {r.bundle_dir}"):
            return _reduce(r, inputs, resume=resume, zip_bundle=zip_bundle, amend=amend)
    except GraphBisectError:
        # Nothing to resume from (no candidate was tried): leave no work folder behind.
        if fresh and not resume and not (r.work / "journal.jsonl").exists():
            remove_own(r.work)
        raise


def _reduce(r: _Run, inputs: Mapping[str, np.ndarray] | None, *, resume: bool, zip_bundle: bool,
            amend: Callable[[BundleContent], BundleContent] | None) -> ReduceResult:
    """The steps of :func:`reduce_model`, under its lock."""
    options = r.options
    r.prepare(inputs, resume=resume)
    store = r.capture()
    values = r.values(store)
    floor = r.noise_floor(store)
    verdict_values = r.verdict_values(store, values)
    base = r.baseline(store, verdict_values, floor)
    baseline, flaky = base.signature, base.flaky
    if not baseline.failed:
        only_noise = r.floor_only(verdict_values, floor)
        if only_noise is not None:
            raise only_noise
        return _no_failure(r, baseline, flaky)
    if baseline.kind is FailureKind.UNSUPPORTED:
        r.notes.append(f"the target refuses the model as unsupported ({baseline.detail}): a feature it lacks (an "
                       "op, a type or an opset), not a crash nor a wrong result; the result is the smallest model "
                       "it refuses with the same message, a case for a feature request")
    space = SubgraphSpace(r.model, values, r.work / "candidates", cut_as_initializers=options.cut_as_initializers,
                          store=store)
    earlier = r.recorded_flakiness()
    if earlier is not None:  # a resumed run whose target turned out flaky before: go on with the repeated search
        r.notes.extend(earlier)
        flaky = True
    result, evaluator, tester, verification = _search_and_verify(r, space, base, floor, values, flaky=flaky,
                                                                 scope="flaky" if earlier is not None else "")
    if verification.flaky and not flaky:
        # The search accepted candidates on single runs of a target that turned out flaky: the steps the
        # result rests on may be random failures. Search again, each step re-checked.
        repeated = (f"the search is repeated accepting only candidates that fail {FLAKY_REPEATS + 1} times in "
                    "a row, since the target turned out flaky")
        r.record_flakiness([note for note in (verification.why, repeated) if note])
        if result.stop_reason is None:
            r.notes.append(repeated)
            flaky = True
            result, evaluator, tester, verification = _search_and_verify(r, space, base, floor, values,
                                                                         flaky=True, scope="flaky")
    if result.minimal and (flaky or verification.flaky):
        result = _minimality_on_flaky(r, evaluator, result)
    if result.minimal:
        result = _minimality_untested(r, evaluator, result)
    stats = evaluator.stats()
    # built_only: tests decided by a build without a run (CandidateTester.build_decides)
    search_stats = {"tests": stats.tests, "cache_hits": stats.cache_hits, "built_only": tester.built_otherwise}
    return _finish(r, space, result, search_stats, base=base, floor=floor,
                   flaky=flaky or verification.flaky, verification=verification, zip_bundle=zip_bundle, amend=amend)


def _minimality_on_flaky(r: _Run, evaluator: Evaluator, result: SearchResult) -> SearchResult:
    """On a flaky target only a *pass* proves a node needed: a removal rejected because the candidate failed
    differently or did not fail again may be a random fault. 1-minimality is claimed only when every
    single-node removal of the result passed."""
    unproven = [u for u in sorted(result.keep)
                if (found := evaluator.cache.get(result.keep - {u})) is None or found.outcome is not Outcome.PASS]
    if not unproven:
        return result
    names = ", ".join(r.model.node_names[u] for u in unproven[:8]) + (" …" if len(unproven) > 8 else "")
    r.notes.append(f"1-minimality is not claimed on a flaky target: removing {len(unproven)} of the "
                   f"{len(result.keep)} nodes gave a different or an unrepeated failure rather than a pass, which "
                   f"does not prove them needed ({names})")
    return replace(result, minimal=False)


#: How :class:`CandidateTester` details a candidate it could not build (invoked=False): its model is refused by
#: ``onnx.checker``, or a value it must be fed is unknown. Its removal tested nothing.
_UNBUILT = ("invalid model: ", "no oracle value for cut tensor ")


def _minimality_untested(r: _Run, evaluator: Evaluator, result: SearchResult) -> SearchResult:
    """A single-node removal whose candidate could not be built (an invalid model, a cut value missing) was not
    tested: the engine treats it as "the failure disappears", but nothing ran. 1-minimality is claimed only when
    no removal of the result is such; otherwise it is not established, and a note says which and why (issue 35:
    3 nodes called 1-minimal where the one in the middle alone fails, its neighbours' removals never built)."""
    untested: dict[int, str] = {}
    for unit in sorted(result.keep):
        found = evaluator.cache.get(result.keep - {unit})
        if found is not None and found.outcome is Outcome.UNRESOLVED and not found.invoked and \
                isinstance(found.detail, str) and found.detail.startswith(_UNBUILT):
            untested[unit] = found.detail
    if not untested:
        return result
    names = ", ".join(r.model.node_names[u] for u in list(untested)[:8]) + (" …" if len(untested) > 8 else "")
    reasons = list(dict.fromkeys(untested.values()))
    r.notes.append(f"1-minimality is not established: the removal of {len(untested)} of the {len(result.keep)} "
                   f"nodes ({names}) was not tested, as its candidate could not be built ({reasons[0]}"
                   + (f"; and {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else "")
                   + "): they may not be needed")
    return replace(result, minimal=False)


def _search_and_verify(r: _Run, space: SubgraphSpace, base: _Baseline, floor: NoiseFloor,
                       values: Callable[[str], np.ndarray], *, flaky: bool, scope: str = "",
                       ) -> tuple[SearchResult, Evaluator, CandidateTester, _Verification]:
    """One search (:meth:`_Run.search`) and the re-verification of its result."""
    result, evaluator, tester = r.search(space, base, floor, flaky=flaky, scope=scope)
    for pool in filter(None, (tester.pool, tester.describing)):
        pool.close()  # its calls are counted from the journal (_Run.search)
    if tester.other_identity:
        r.notes.append(f"{plural(tester.other_identity, 'candidate')} failed with the baseline's kind but another "
                       "identity (e.g. a sibling pass fusing the same nodes otherwise): not accepted")
    if tester.built_otherwise:
        r.notes.append(f"{plural(tester.built_otherwise, 'candidate')} compiled the failing region otherwise, as "
                       "their builds showed (e.g. a part of the fused nodes, which the pass no longer fuses): they "
                       "cannot fail the same way, so they were built and not run")
    if tester.unrepeated:
        r.notes.append(f"{plural(tester.unrepeated, 'candidate')} failed like the baseline once and not when re-run: "
                       "not accepted")
    if result.stop_reason is StopReason.NO_PROGRESS:
        stall = evaluator.meter.stall_limit()
        r.notes.append(f"no progress: no candidate failed in the last {stall} target runs, so the search stopped "
                       f"at {len(result.keep)} of {space.size} nodes"
                       + (" (no candidate smaller than the whole model ever failed: the failure may need the "
                          "whole model, or depend on something candidates do not carry)"
                          if len(result.keep) == space.size else ""))
    if result.stop_reason is StopReason.INTERRUPTED:  # Ctrl-C: stop now, keep the best result, no more runs
        r.notes.append("interrupted (Ctrl-C): the best result so far, not re-verified; --resume continues")
        verification = _Verification(False, {}, None)
    else:
        try:
            verification = _verify(r, space, result.keep, base, floor, values=values, tester=tester)
        except KeyboardInterrupt:  # Ctrl-C while re-verifying: the search's result is kept, as during the search
            r.notes.append("interrupted (Ctrl-C) while re-verifying: the search's result, not re-verified; "
                           "--resume re-verifies it")
            result = replace(result, stop_reason=StopReason.INTERRUPTED)
            verification = _Verification(False, {}, None)
    return result, evaluator, tester, verification


def resume_reduction(
    bundle_dir: Path,
    *,
    max_invocations: int | None = None,
    deadline_seconds: float | None = None,
    jobs: int = 1,
    timeout: float | None = None,
    keep_work: bool = False,
    executor: str | None = None,
    output_check: OutputCheck | None = None,
    zip_bundle: bool = False,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> ReduceResult:
    """Continue the interrupted reduction that was writing ``bundle_dir`` (``graphbisect reduce --resume``).

    What it computes (model, inputs, oracle, target, tolerance) is the recorded run's; how it proceeds (budget,
    jobs, timeout, clean-up) is given here. A run judged by a Python ``output_check`` needs it again.
    """
    from graphbisect.model import load_model

    check_own(work_dir_for(bundle_dir))  # its state is read only from a folder of graphbisect's own
    state_path = work_dir_for(bundle_dir) / "run.json"
    if not state_path.exists():
        raise InputError(f"nothing to resume: {state_path} does not exist",
                         hint="pass the -o folder of an interrupted `graphbisect reduce` run")
    state = json.loads(state_path.read_text())
    recorded = ReduceOptions.from_json(state["options"])
    options = replace(recorded, max_invocations=max_invocations, deadline_seconds=deadline_seconds, jobs=jobs,
                      timeout=timeout, keep_work=keep_work, executor=executor, output_check=output_check)
    # The copy prepare() saved, found from the folder given now (run.json's path is relative to where the run
    # started, and the folders may have moved since).
    model = load_model(work_dir_for(bundle_dir) / "model.onnx")
    recorded_model = json.loads(state["fingerprint"]).get("model")
    if recorded_model and model.fingerprint != recorded_model:
        # Checked first: the bundle's fingerprint check would call this "the bundle of another model" and
        # suggest --force, and going on would mix the journal and activations of the recorded model with this one.
        raise ModelError(
            f"{model.origin} changed since the reduction recorded it (content fingerprint "
            f"{model.fingerprint[:12]}…, recorded {recorded_model[:12]}…): its journal and activations belong "
            "to the recorded model, so the reduction cannot resume",
            hint=f"restore that file, or start afresh from your model: graphbisect reduce MODEL -o {bundle_dir} "
            f"(after removing {work_dir_for(bundle_dir)})")
    return reduce_model(model, bundle_dir, options=options, resume=True, zip_bundle=zip_bundle,
                        on_progress=on_progress, on_stage=on_stage)


@dataclass(frozen=True)
class _Baseline:
    signature: Signature
    flaky: bool
    hints: list[frozenset[int]]  # node sets to try first (layerwise evidence)
    priors: dict[int, float]  # node → prior probability of being needed (ProbDD)
    identity: Identity | None = None  # where it first goes wrong (None: matched by kind alone)

    def strict_band(self, asked: bool) -> bool:
        """Whether candidates must keep the failure's magnitude (its band within a decade): when asked, and
        always for a wrong result matched by kind alone, since nothing else then tells the recorded failure from
        a weaker sibling (TF32 rounding at 1.64× where the bug is 7,393×: issue 35, case 3)."""
        return asked or (self.identity is None and self.signature.band is not None)


@dataclass(frozen=True)
class _Verification:
    ok: bool  # the target fails the same way in every fresh run and the oracle reproduces its values
    target_outputs: dict[str, np.ndarray]
    message: str | None  # the target's crash message, if it crashed
    flaky: bool = False  # the same model gave two different outcomes
    why: str | None = None  # why the target's fresh runs did not all fail like the baseline (a note)
    #: the identity as the final model's runs describe what the target compiled, when not as recorded
    identity: Identity | None = None


def _verify(r: _Run, space: SubgraphSpace, keep: frozenset[int], base: _Baseline, floor: NoiseFloor, *,
            values: Callable[[str], np.ndarray], tester: CandidateTester) -> _Verification:
    """Re-run the final model in fresh workers, VERIFY_RUNS times: the target must fail the same way every
    time (the same kind, above the noise floor, with the same identity), the oracle must agree with its
    stored values. When the target does not, say why. A failure at compile is re-verified as the search
    tested it, by building the model (:attr:`CandidateTester.compile_only`); a build that succeeds is then run
    (on that build), so a model that does not fail as it should is reported with what its run gave."""
    baseline = base.signature
    candidate = space.materialize(keep)
    path = space.workdir / "final.onnx"
    save_proto(candidate.proto, path)
    r.stage(f"re-verifying the result in fresh workers ({VERIFY_RUNS} runs)")
    runs, matching, by_kind, seen, varying = _target_runs(r, path, candidate, base, floor, values=values,
                                                          tester=tester)
    if seen.others:
        r.notes.append(f"re-verification: {plural(len(seen.others), 'run')} failed with another identity: "
                       f"{seen.others[0]}")
    target_ok = all(matching)
    identity = _identity_described(r, tester, seen.described) if target_ok else None
    flaky, why = False, None
    if not target_ok:
        flaky, why = _why_not_verified(r, space, keep, candidate.proto, tester=tester, baseline=baseline, runs=runs,
                                       by_kind=by_kind, described_only=bool(seen.others) and not seen.placed)
        r.notes.append(why)
    elif varying:
        r.notes.append(f"the target's output values differ between runs of the same model (non-deterministic); "
                       f"all {len(runs)} re-verification runs failed like the baseline")
    with BackendProcess(r.oracle_spec, workdir=r.work / "verify-oracle", timeout=r.options.timeout) as proc:
        oracle_run = proc.run(path, dict(candidate.feeds))
    r.count("oracle", Cost.of_run(oracle_run), run=oracle_run)
    oracle_ok = not judge(oracle_run, values, candidate.outputs, r.tol).signature.failed
    if not oracle_ok:
        why = ("it rewrites the graph, so it may build the final model differently from the capture, or it is "
               "non-deterministic") if r.rewriting_oracle() else "the oracle may be non-deterministic"
        r.notes.append("the oracle does not reproduce its own captured values on the final model "
                       f"({oracle_run.describe()}); {why}")
    run = next((run for (run, _), ok in zip(runs, matching, strict=True) if ok), runs[0][0])
    outputs = {k: np.asarray(v) for k, v in run.outputs.items()} if run.ok else {}
    message = None if run.ok else f"{run.error_type or ''}: {run.message or ''}".strip(": ")
    said = [line.strip() for line in (message or "").splitlines()[1:] if line.strip()]
    if r.options.check and said:  # the exit status is the verdict; what the check printed says what it saw
        r.notes.append(f"the check's last stderr line: {said[-1]}")
    return _Verification(target_ok and oracle_ok, outputs, message, flaky, why, identity)


def _target_runs(r: _Run, path: Path, candidate: Candidate, base: _Baseline, floor: NoiseFloor, *,
                 values: Callable[[str], np.ndarray], tester: CandidateTester
                 ) -> tuple[list[tuple[RunResult, Signature]], list[bool], list[bool], _IdentitySeen, bool]:
    """The target's re-verification runs of the final model at ``path`` in a fresh worker: (each run with its
    signature, whether each failed like the baseline with its identity, whether each failed like it by kind,
    the identities seen, whether the values varied between runs: then more runs were needed to agree)."""
    baseline = base.signature
    runs: list[tuple[RunResult, Signature]] = []
    matching: list[bool] = []
    by_kind: list[bool] = []  # the run failed like the baseline by kind (its values)
    seen = _IdentitySeen(tester)

    def verify_run(proc: BackendProcess) -> None:
        run = _verify_attempt(r, proc, path, candidate.feeds, compile_only=tester.compile_only)
        verdict = judge(run, values, r.compared(candidate.outputs), r.tol, r.regex, check=r.options.output_check,
                        floor=floor, names=r.names)
        same = baseline.matches(verdict.signature, strict_band=base.strict_band(r.options.strict_band))
        by_kind.append(same)
        runs.append((run, verdict.signature))
        matching.append(same and seen.same(verdict, candidate))

    with BackendProcess(r.candidate_spec(base.identity), workdir=r.work / "verify-target",
                        timeout=r.options.timeout) as proc:
        for _ in range(VERIFY_RUNS):
            verify_run(proc)
        varying = all(matching) and _values_vary([run for run, _ in runs])
        # Values that change between runs of one model: a random fault may be what failed, so a claim needs
        # VERIFY_RUNS_NONDETERMINISTIC agreeing runs (a fault at rate p passes them all with p**7).
        while varying and len(runs) < VERIFY_RUNS_NONDETERMINISTIC and all(matching):
            verify_run(proc)
    return runs, matching, by_kind, seen, varying


@dataclass
class _IdentitySeen:
    """The identity of the re-verification runs that failed like the baseline by kind.

    What a target compiles a region as depends on the model around it (OpenVINO 2026.4 compiles a PRelu fed by a
    MatMul as an ``Eltwise``, and the same node alone as a Snippets ``Subgraph``): a run whose values fail as
    recorded (the place, the strength) is the same failure whatever kind of kernel it says it compiled there,
    which the bundle then records (:func:`_identity_described`). Another pass making the region (ONNX Runtime
    names it) is another failure: a sibling fusion, which a fix of the recorded one leaves failing."""

    tester: CandidateTester
    others: list[str] = field(default_factory=list)  # why a run of the baseline's kind had another identity
    placed: list[str] = field(default_factory=list)  # those of them its values decide
    #: (why what it compiled is not as recorded, or None; what it compiled) per run whose values fail as recorded
    described: list[tuple[str | None, CompiledGraph]] = field(default_factory=list)

    def same(self, verdict: Judgement, candidate: Candidate) -> bool:
        """Whether a run that failed like the baseline by kind has its identity."""
        place, made, compiled = self.tester.identity_parts(verdict, candidate)
        if place is not None:
            self.placed.append(place)
            self.others.append(place)
            return False
        if compiled is None:
            return True
        self.described.append((made, compiled))
        assert self.tester.identity is not None
        if made is not None and self.tester.identity.as_compiled(compiled).made_by != \
                self.tester.identity.identity.made_by:
            self.others.append(made)
            return False
        return True


def _identity_described(r: _Run, tester: CandidateTester,
                        described: Sequence[tuple[str | None, CompiledGraph]]) -> Identity | None:
    """The identity as the final model's re-verification runs describe it, when their descriptions are not the
    recorded one (None: they are, or nothing was described). Every run failed as recorded by its values (the
    place, the strength, the pass): what the target compiled the region as is then what the final model compiles
    it as, which the bundle records, or, when its runs describe it differently, left out of the identity. Both
    are said in a note. Never flakiness: that is only output values differing between runs of one model."""
    if tester.identity is None or not any(made is not None for made, _ in described):
        return None
    recorded = tester.identity.identity
    seen = [tester.identity.as_compiled(compiled) for _, compiled in described]
    kinds = list(dict.fromkeys(_compiled_text(i) for i in seen))
    if len(kinds) == 1:
        r.notes.append(f"the reduced model compiles the region as {kinds[0]} where the original compiled it as "
                       f"{_compiled_text(recorded)} (what the target compiles a node as depends on the nodes around "
                       f"it): the same failure by where it goes wrong and how strongly, in all {len(described)} "
                       "re-verification runs; the bundle records what its own model compiles")
        return seen[0]
    r.notes.append(f"what the target says it compiled the region as changes between runs of the same model "
                   f"({'; '.join(kinds)}): it is left out of the bundle's identity, which is matched by where it goes "
                   "wrong and how strongly")
    return replace(recorded, compiled_kind=None, compiled_name=None, made_by=None, ran_in=None)


def _compiled_text(identity: Identity) -> str:
    if identity.compiled_kind is None:
        return "nothing it named"
    return identity.compiled_kind + (f" made by {identity.made_by}" if identity.made_by else "")


def _verify_attempt(r: _Run, proc: BackendProcess, path: Path, feeds: Mapping[str, np.ndarray], *,
                    compile_only: bool) -> RunResult:
    """One counted re-verification call: a build alone for a failure at compile (a run after it only when it
    builds: what the model then does is what the note reports), else a run."""
    if compile_only:
        built = proc.compile(path)
        r.count("target", Cost(0, built.compiles, built.compile_cache_hits), run=built)
        if not built.ok:
            return built
    run = proc.run(path, dict(feeds))
    r.count("target", Cost.of_run(run), run=run)
    return run


def _why_not_verified(r: _Run, space: SubgraphSpace, keep: frozenset[int], verified: Any, *,
                      tester: CandidateTester, baseline: Signature, runs: list[tuple[Any, Signature]],
                      by_kind: Sequence[bool] = (), described_only: bool = False) -> tuple[bool, str]:
    """(flaky, the reason) for a final model that did not fail like the baseline in every fresh run: the
    model that failed (the accepted candidate, or the original itself) is compared with the one re-run.

    Flaky only from output values that differ: when every run failed like the baseline by kind (``by_kind``),
    with the same values bit for bit, and its identity differed only by what the target says it compiled
    (``described_only``: another pass made the region), the values agree with what the search accepted: the
    model is another failure, which the search's run did not describe, not a flaky target."""
    outcomes = "; ".join(sig.describe() for _, sig in runs)
    gave = f"{len(runs)} fresh runs of the final model gave: {outcomes}"
    if described_only and by_kind and all(by_kind) and not _values_vary([run for run, _ in runs]):
        return False, (f"NOT re-verified: {gave}, the same values bit for bit, failing as recorded but compiled "
                       "by another pass than the original's: another failure, which the search's run of it did not "
                       "describe; the target is not flaky")
    if keep == frozenset(range(space.size)) and keep not in tester.tested:
        tested, what = r.model.proto, "the original model, which failed at baseline"
        differences = model_differences(tested, verified)
    else:
        what = "the candidate accepted by the search"
        same = tester.tested.get(keep) in (None, model_digest(verified))  # None: accepted in an earlier session
        differences = [] if same else ["the serialized models differ"]
    if differences:
        return False, (f"NOT re-verified: {gave}, instead of {baseline.describe()}. The re-verified model is not "
                       f"{what}: {'; '.join(differences)}. Report this as a graphbisect bug")
    return True, (f"NOT re-verified, flaky target: the same model as {what} failed with {baseline.describe()} "
                  f"before, and {gave}")


def _values_vary(runs: list[Any]) -> bool:
    """Whether completed runs of one model returned different values (bit for bit)."""
    done = [run.outputs for run in runs if run.ok]
    return any(set(a) != set(done[0]) or any(not np.array_equal(np.asarray(a[k]), np.asarray(done[0][k]),
                                                                  equal_nan=_floating(a[k])) for k in a)
               for a in done[1:])


def _floating(value: Any) -> bool:
    return np.asarray(value).dtype.kind in "fc"


def _dies(signature: Signature) -> bool:
    """Whether a run died: raised, crashed or timed out, with no outputs to compare."""
    return signature.kind.raised or signature.kind is FailureKind.TIMEOUT


def _same(a: Signature, b: Signature) -> bool:
    """One outcome, for counting votes: the same failure, or both no failure."""
    return a.matches(b) or (not a.failed and not b.failed)


def _finish(r: _Run, space: SubgraphSpace, result: SearchResult, search_stats: Mapping[str, int], *,
            base: _Baseline, floor: NoiseFloor, flaky: bool, verification: _Verification, zip_bundle: bool,
            amend: Callable[[BundleContent], BundleContent] | None) -> ReduceResult:
    """The search's result as a bundle: its report, the maintainer facts, the checker's word on it (unless
    interrupted), written; the work folder removed when nothing in it is needed to resume."""
    baseline = base.signature
    candidate = space.materialize(result.keep, inline_weights=True)
    names = tuple(r.model.node_names[i] for i in sorted(result.keep))
    stop = result.stop_reason.value if result.stop_reason is not None else None
    verified = verification.ok
    one_minimal = result.minimal and verified
    journey = ((0, len(r.model.nodes)), *((int(a), int(b)) for a, b in result.history if b < len(r.model.nodes)))
    trail = [[int(runs), int(size), bool(failed)] for runs, size, failed in result.trail]  # every candidate run
    report = {
        "original_model": {"path": str(r.model.origin) if r.model.origin else None,
                           **({"converted": str(r.model.path)} if r.model.paddle_source and r.model.path else {}),
                           "fingerprint": r.model.fingerprint, "nodes": len(r.model.nodes)},
        "original_nodes": len(r.model.nodes), "final_nodes": len(result.keep),
        "kept_nodes": [{"name": n, "op_type": r.model.nodes[i].op_type} for n, i in zip(names, sorted(result.keep))],
        "invocations": dict(r.invocations), "backend_calls": r.tally().to_json(),
        "seconds": round(time.monotonic() - r.started, 3),
        "journey": [list(p) for p in journey], "trail": trail, "one_minimal": one_minimal, "stop_reason": stop,
        "verified": verified, "flaky": flaky, "notes": list(r.notes),
        "search": dict(search_stats),
        "versions": r.versions(),
        "identity": _identity_record(r, base, candidate.outputs, verification.identity),
        "noise_floor": floor.for_tensors(candidate.outputs).to_json(),
    }
    content, facts = _content(r, space, result, candidate, report, baseline=baseline, verification=verification,
                              journey=journey, amend=amend)
    finished = one_minimal  # the search is over: nothing in its work folder is needed to resume it
    if result.stop_reason is not StopReason.INTERRUPTED and not facts.facts.get("interrupted"):
        content = _checked(r, content)
        one_minimal, verified, flaky = (bool(content.report["one_minimal"]), bool(content.report["verified"]),
                                        bool(content.report["flaky"]))
    bundle = write_bundle(content, r.bundle_dir, zip=zip_bundle, force=r.force)
    if finished and not r.options.keep_work:
        remove_own(r.work)
    return ReduceResult(
        failed=True, original_nodes=len(r.model.nodes), final_nodes=len(result.keep), kept_nodes=names,
        signature=baseline, invocations=dict(r.invocations), one_minimal=one_minimal, stop_reason=stop,
        verified=verified, flaky=flaky, bundle=bundle, work_dir=r.work, seconds=time.monotonic() - r.started,
        journey=journey, notes=tuple(r.notes), identity=base.identity, noise_floor=floor, chosen_dims=r.chosen,
        interrupted=result.stop_reason is StopReason.INTERRUPTED or bool(facts.facts.get("interrupted")),
        backend_calls=r.tally().to_json(), report_calls=_report_calls(content.report),
        audit=content.report.get("audit"),
    )


def _content(r: _Run, space: SubgraphSpace, result: SearchResult, candidate: Candidate, report: dict[str, Any], *,
             baseline: Signature, verification: _Verification, journey: Sequence[tuple[int, int]],
             amend: Callable[[BundleContent], BundleContent] | None) -> tuple[BundleContent, MaintainerFacts]:
    """The bundle of the final model: ``report`` completed with the facts measured for maintainers (none after a
    Ctrl-C, which promised no more backend runs), and those facts."""
    oracle_outputs = {name: np.asarray(space.values(name)) for name in candidate.outputs}
    if result.stop_reason is StopReason.INTERRUPTED:  # Ctrl-C promised no more backend runs
        facts = MaintainerFacts()
    else:
        facts = maintainer_facts(
            model=candidate.proto, run_model=space.workdir / "final.onnx", feeds=candidate.feeds,
            expected=oracle_outputs, target_outputs=verification.target_outputs, oracle=r.oracle_spec,
            target=r.target_spec, tolerance=r.tol, signature=baseline, workdir=r.work / "facts",
            timeout=r.options.timeout, stage=r.stage, fail_regex=r.regex, check=r.options.output_check,
            names=r.names, floor=NoiseFloor.from_json(report["noise_floor"]) if report.get("noise_floor") else None)
    if facts.facts.get("interrupted"):  # said where the user looks, not only in report.json (issue 24)
        r.notes.append("interrupted (Ctrl-C) while measuring the facts for maintainers: the result is re-verified "
                       "and bundled, but the report lacks what was not measured (the specification's word, the "
                       "lowest failing optimization level, repro_min.py)")
        report["notes"] = list(r.notes)
    # the time the user waited, as the CLI prints it: the maintainer facts' runs included
    report.update(facts.facts, report_runs=facts.runs, report_calls=facts.calls.to_json(),
                  seconds=round(time.monotonic() - r.started, 3))
    content = BundleContent(
        model=candidate.proto, inputs=dict(candidate.feeds), oracle_outputs=oracle_outputs,
        target_outputs=verification.target_outputs, oracle=r.oracle_spec, target=r.target_spec,
        tolerance=r.tol.restricted(candidate.outputs), target_message=verification.message, report=report,
        signature=_own_band(baseline, oracle_outputs, verification.target_outputs, r.tol.restricted(candidate.outputs)),
        charts={"journey": size_journey_svg(journey, result.trail)}, sections=facts.sections, files=facts.files,
    )
    return (amend(content) if amend is not None else content), facts


def _own_band(signature: Signature, expected: Mapping[str, Any], actual: Mapping[str, Any],
              tolerance: Tolerance) -> Signature:
    """The baseline's signature with the magnitude the bundle's own model fails by: the band was measured on the
    original's outputs, and a bundle that says "~1e3×" over its own table's 7,393× says something false."""
    if signature.band is None or not actual:
        return signature
    worst = compare_outputs(expected, actual, tolerance).worst
    return replace(signature, band=decade(worst.score)) if worst is not None and not worst.passed else signature


#: The claims a bundle withdraws (1-minimal; verified: the failure, its identity, the expected outputs) or corrects
#: (flaky) when the checker does not re-establish them; any other claim it finds false stays, with a note.
WITHDRAWN_CLAIMS = frozenset({"one_minimal", "expected_outputs", "failure", "identity", "flaky"})


def _checked(r: _Run, content: BundleContent) -> BundleContent:
    """``content`` with its claims as the trusted checker finds them (:mod:`graphbisect.checker`): the bundle
    is written once into the work folder and audited with plain runs; a claim the checker does not re-establish
    is withdrawn (1-minimal, verified) or corrected from what it measured (flaky), with a note saying why, and
    the audit is kept in ``report.json`` (``audit``) and as the report's "Audit" section."""
    from graphbisect.checker import audit_bundle

    r.stage("auditing the bundle's claims with plain runs (graphbisect audit)")
    draft = write_bundle(content, r.work / "audited", force=True)
    # the user's own specs, which this run has been running
    folder = r.work / "audit"
    folder.mkdir(exist_ok=True)
    audit = audit_bundle(draft, trust=True, workdir=folder, check=r.options.output_check)
    shutil.rmtree(draft, ignore_errors=True)
    report = dict(content.report)
    held = {claim.id: claim for claim in audit.claims}
    notes = list(report.get("notes") or [])
    for key, ids in (("one_minimal", ("one_minimal",)), ("verified", ("expected_outputs", "failure", "identity"))):
        doubted = [held[i] for i in ids if i in held and held[i].holds is not True]
        if report.get(key) and doubted:
            report[key] = False
            notes.extend(f"not claimed: {c.statement} — the checker: {c.verdict} ({c.evidence})" for c in doubted)
    flaky = held.get("flaky")
    if flaky is not None and flaky.holds is False:  # "not flaky", and the checker's fresh runs differed
        report["flaky"] = True
        notes.append(f"flaky: yes, as the checker measured ({flaky.evidence})")
    for claim in audit.claims:
        if claim.id not in WITHDRAWN_CLAIMS and claim.holds is False:
            notes.append(f"the checker does not confirm: {claim.statement} ({claim.evidence})")
    r.notes[:] = notes
    record = audit.to_json()
    del record["bundle"]  # the draft's folder, in the reporter's work folder: not the bundle's business
    calls = {**(report.get("report_calls") or {}),
             **{f"audit {role}": {**c, "compile_cache_hits": 0} for role, c in audit.calls.items()}}
    report.update(notes=notes, audit=record, report_calls=calls,
                  report_runs={role: int(c["runs"]) for role, c in calls.items()})
    # statements and evidence carry the model's node and tensor names: made safe for a table cell
    section = "\n".join(f"| {md_cell(c.statement)} | {c.verdict} | {md_cell(c.evidence)} |" for c in audit.claims)
    runs = ", ".join(f"{role} {count}" for role, count in audit.runs.items())
    sections = {**content.sections, "Audit": (
        "Each claim of this report re-established by `graphbisect audit` (a checker that shares no code with the "
        f"search), with plain runs ({runs}):\n\n| Claim | Checker | Evidence |\n|---|---|---|\n{section}\n")}
    return replace(content, report=report, sections=sections)


def _recorded_calls(state: Mapping[str, Any], fresh: CallTally) -> tuple[CallTally, Cost]:
    """The backend calls a resumed run's state file recorded: (those outside the searches, the searches'
    as last summed from the journal, which the next search sums again).

    A state file written before the searches' calls were journaled has them in its total, and its journal
    has no costs (:func:`journal_cost` counts those as none): the total is taken as outside the searches. One
    written before compiles were counted has only the runs (``invocations``), whose compiles are then
    unknown (counted as none)."""
    calls, outside = state.get("backend_calls"), state.get("calls_outside_searches")
    if isinstance(calls, Mapping) and isinstance(outside, Mapping):
        rest = CallTally.from_json(outside)
        return rest, CallTally.from_json(calls).get("target") - rest.get("target")
    if isinstance(calls, Mapping):
        return CallTally.from_json(calls), Cost()
    runs = state.get("invocations")
    if isinstance(runs, Mapping):
        return CallTally({**fresh.roles(), **{str(role): Cost(runs=int(n)) for role, n in runs.items()}}), Cost()
    return fresh, Cost()


def _report_calls(report: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The bundle's report-fact calls (``report_calls``, as a calling workflow's ``amend`` left them)."""
    calls = report.get("report_calls")
    return CallTally.from_json(calls).to_json() if isinstance(calls, Mapping) else {}


def _identity_record(r: _Run, base: _Baseline, outputs: Sequence[str], final: Identity | None = None,
                     ) -> dict[str, Any]:
    """What the bundle's failure is and how it was matched (report.json ``identity``; verify and repro.py
    match on it): the identity (``final``: as the final model's runs described it, when not as recorded), or
    the kind alone and why."""
    identity, signature = final or base.identity, base.signature
    if identity is None:
        why = ("a crash is matched by its normalized message" if signature.kind.raised else
               "a Python check judges the outputs, and where it first goes wrong is the tolerance's view"
               if r.options.output_check is not None else
               "layerwise localization was turned off (--no-layerwise), so nothing says where it first goes wrong"
               if not r.options.layerwise and signature.kind in (FailureKind.MISMATCH, FailureKind.NAN) else
               "no layerwise evidence of where it first goes wrong (the target exposes no intermediates, the probe "
               "masked the failure, or the target is flaky)"
               if signature.kind in (FailureKind.MISMATCH, FailureKind.NAN) else
               "the failure is the check's or the regex's verdict")
        return {"matched_by": "kind", "describe": f"{signature.describe()} (matched by kind: {why})"}
    check = r.identity_check(identity)
    assert check is not None
    return {"matched_by": "identity", **identity.to_json(), "describe": identity.describe(),
            "after": [name for name in outputs if name in check.after]}


def _no_failure(r: _Run, baseline: Signature, flaky: bool) -> ReduceResult:
    """The original model does not fail: write only the report, exit 0."""
    note = dims_note(r.chosen)
    if note:
        r.notes.append(note)
    report = {"format": "graphbisect-report", "failed": False, "original_nodes": len(r.model.nodes),
              "invocations": dict(r.invocations), "backend_calls": r.tally().to_json(),
              "oracle": str(r.oracle_spec), "target": str(r.target_spec),
              "versions": r.versions(), "flaky": flaky,
              "message": "the target agrees with the oracle on the original model: nothing to reduce",
              "chosen_dims": [dim.to_json() for dim in r.chosen], "notes": list(r.notes)}
    atomic_write_text(r.bundle_dir / "report.json", json.dumps(report, indent=2, allow_nan=False))
    remove_own(r.work)
    return ReduceResult(
        failed=False, original_nodes=len(r.model.nodes), final_nodes=len(r.model.nodes), kept_nodes=(),
        signature=baseline, invocations=dict(r.invocations), one_minimal=False, stop_reason=None, verified=False,
        flaky=flaky, bundle=r.bundle_dir / "report.json", work_dir=r.work, seconds=time.monotonic() - r.started,
        notes=tuple(r.notes), chosen_dims=r.chosen, backend_calls=r.tally().to_json(),
    )
