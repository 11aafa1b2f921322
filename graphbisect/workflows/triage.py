"""`triage`: compare, reduce, ablate passes and bundle every model of a folder, then group them into distinct bugs.

Per model (one task, :func:`triage_one`, run by an :mod:`~graphbisect.executors` executor):

1. load (an unloadable model becomes an ``error`` row with the message and its hint);
2. compare target with oracle on the plain model (no layerwise probing: the verdict only). No failure:
   ``passed``;
3. where the target can ablate passes (:attr:`Capability.PASSES`), find the culprit passes
   (:func:`~graphbisect.workflows.passes.find_culprit_passes`);
4. where the target runs ONNX, reduce to a 1-minimal failing model and write the bundle to
   ``OUT_DIR/bundles/<name>/`` (under only the culprit passes when there are some); a failure the
   reduction's own run does not see again stays ``failed``, without a bundle, with a note saying so;
5. check the verdict (passed, or failed with its kind) with plain runs of the user's model file by the trusted
   checker (:mod:`~graphbisect.workflows.triage_claims`: one oracle and one target run, the ``audit`` step);
6. record the outcome in ``OUT_DIR/results/<name>.json`` (atomically: a model is finished when its record
   exists).

Then :func:`~graphbisect.triage.dedup.group_bugs` groups the failures into distinct bugs and
:mod:`~graphbisect.artifacts.triage_report` writes ``summary.{json,md,html}``.

Re-running on the same OUT_DIR skips every model whose record matches its file and the options
(:func:`model_identity`), and resumes from its ``<bundle>.work`` folder every reduction that was interrupted
(no record) or stopped by ``max_invocations`` before it was proven 1-minimal. Each task
is a pure function of its model, inputs and options, so the outcomes — and the summary — do not depend on
the executor or on the order tasks finish in.

Inputs: ``<name>.npz`` (or ``<name>.inputs.npz``) next to a model holds its inputs; otherwise seeded random
inputs are used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.backends import Capability, resolve
from graphbisect.backends.cost import CallTally
from graphbisect.backends.registry import BACKEND_SPEC
from graphbisect.compare import Tolerance
from graphbisect.errors import GraphBisectError, InputError
from graphbisect.executors import Executor, WorkerLostError, make_executor
from graphbisect.model import Model
from graphbisect.oracle.signature import Signature
from graphbisect.settings.options import INVOCATIONS, JOBS, SEED, TIMEOUT, check_fields, option
from graphbisect.storage.atomic import atomic_write_text
from graphbisect.storage.lockfile import folder_lock
from graphbisect.text.printable import plural
from graphbisect.triage.dedup import BugGroup, group_bugs, lacking, pattern_hash
from graphbisect.triage.outcome import ERROR, FAILED, PASSED, ModelOutcome, total_calls
from graphbisect.workflows.compare import DEFAULT_ORACLE, DEFAULT_TARGET
from graphbisect.workflows.triage_claims import (
    check_outcome,
    grouping_check,
    not_established,
    with_other_audits,
)

__all__ = ["ModelTask", "TriageOptions", "TriageResult", "discover_models", "model_identity", "triage",
           "triage_one"]

log = logging.getLogger(__name__)

_PADDLE_FILES = ("*.pdmodel", "*.pdiparams", "*.json")


@dataclass(frozen=True)
class TriageOptions:
    """What every model of a triage is checked with (the same for all of them)."""

    oracle: str = option(DEFAULT_ORACLE, BACKEND_SPEC)
    target: str = option(DEFAULT_TARGET, BACKEND_SPEC)
    tolerance: Tolerance = field(default_factory=Tolerance)
    passes: bool = True  # ablate passes where the target can
    seed: int = option(0, SEED)  # random inputs, for models without an inputs file
    # target workers evaluating one reduction's candidates (ReduceOptions.jobs)
    candidate_jobs: int = option(1, JOBS)
    max_invocations: int | None = option(None, INVOCATIONS)  # per model, per session (ReduceOptions.max_invocations)
    timeout: float | None = option(None, TIMEOUT)  # per backend invocation

    def __post_init__(self) -> None:
        check_fields(self)

    def identity(self) -> dict[str, Any]:
        """What changes the results (not parallelism, budget or timeouts)."""
        tol = self.tolerance
        return {"oracle": self.oracle, "target": self.target, "passes": self.passes, "seed": self.seed,
                "tolerance": [tol.atol, tol.rtol, tol.min_cosine, sorted(tol.per_output.items())]}


@dataclass(frozen=True)
class ModelTask:
    """One model to triage: plain, picklable data (it crosses process and Ray boundaries)."""

    name: str
    source: str
    out_dir: str
    options: TriageOptions
    inputs: str | None = None

    @property
    def bundle_dir(self) -> Path:
        return Path(self.out_dir) / "bundles" / self.name

    @property
    def work_dir(self) -> Path:
        return Path(self.out_dir) / "work" / self.name

    @property
    def record(self) -> Path:
        return Path(self.out_dir) / "results" / f"{self.name}.json"


@dataclass(frozen=True)
class TriageResult:
    """Every model's outcome (sorted by name), the distinct bugs, and where the summary went."""

    outcomes: tuple[ModelOutcome, ...]
    bugs: tuple[BugGroup, ...]
    summary: Mapping[str, Path]
    executor: str
    skipped: tuple[str, ...]  # finished in an earlier run, not run again
    seconds: float

    @property
    def backend_calls(self) -> dict[str, dict[str, int]]:
        """Every model's backend calls (each step's: compare, passes, reduce; a model finished by an earlier run
        as its record says), summed by role: {role: {"runs", "compiles", "compile_cache_hits"}}
        (:mod:`graphbisect.backends.cost`)."""
        return total_calls(self.outcomes).to_json()

    @property
    def invocations(self) -> dict[str, int]:
        """{role: runs}: :attr:`backend_calls`' runs."""
        return CallTally.from_json(self.backend_calls).runs()

    def to_json(self) -> dict[str, Any]:
        """The models' outcomes, the distinct bugs, and the run (summary.json holds the same facts)."""
        return {"outcomes": [o.to_json() for o in self.outcomes], "bugs": [b.to_json() for b in self.bugs],
                "summary": {k: str(v) for k, v in self.summary.items()}, "executor": self.executor,
                "skipped": list(self.skipped), "seconds": round(self.seconds, 3),
                "invocations": self.invocations, "backend_calls": self.backend_calls}

    def by_status(self, status: str) -> list[ModelOutcome]:
        return [o for o in self.outcomes if o.status == status]


# ------------------------------------------------------------------------------------------------ discovery
def discover_models(input_dir: Path) -> list[tuple[str, Path, Path | None]]:
    """``(name, model path, inputs path or None)`` for every ONNX file and Paddle model folder in ``input_dir``.

    Sorted by name. Entries that are neither a model nor a model's inputs (notes, ``model.ONNX``, a broken link,
    a folder without a model) are not triaged, with a warning naming them; a ``.onnx`` file that does not load
    is still listed, so it gets an error row.
    """
    input_dir = Path(input_dir)
    if not input_dir.is_dir():
        raise InputError(f"{input_dir} is not a folder", hint="pass a folder of .onnx files or Paddle model folders")
    found = []
    skipped = []
    for path in sorted(input_dir.iterdir()):
        if path.is_file() and path.suffix == ".onnx":
            found.append((path.stem, path, _inputs_for(path)))
        elif path.is_dir() and any(any(path.glob(p)) for p in _PADDLE_FILES[:2]):
            found.append((path.name, path, _inputs_for(path)))
        else:
            skipped.append(path)
    paired = {inputs for _, _, inputs in found if inputs is not None}
    paired |= {data for _, path, _ in found if path.is_file() for data in _external_data_files(path)}
    unused = [path.name for path in skipped if path not in paired]
    if unused:  # said, not skipped silently (issue 24): a model.ONNX, a broken link, a folder without a model
        log.warning("triage: %d entr%s of %s %s not a model and not a model's inputs, so not triaged: %s%s "
                    "(models are *.onnx files and Paddle model folders; inputs NAME.npz or NAME.inputs.npz)",
                    len(unused), "y" if len(unused) == 1 else "ies", input_dir, "is" if len(unused) == 1 else "are",
                    ", ".join(repr(name) for name in unused[:10]), " …" if len(unused) > 10 else "")
    if not found:
        raise InputError(f"no model in {input_dir}",
                         hint="triage reads every *.onnx file and every Paddle model folder (with .pdmodel/.json "
                         "and .pdiparams) directly inside INPUT_DIR")
    return found


def _external_data_files(path: Path) -> set[Path]:
    """The files beside the ONNX model ``path`` that hold its external data (its weights are part of it: said not
    to be triaged, ``model.onnx.data`` read as a stray entry); none when it cannot be parsed (it gets an error row)."""
    import onnx

    from graphbisect.model.load import external_tensors

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a model: load_model says why, in its row
        return set()
    locations = {e.value for t in external_tensors(proto) for e in t.external_data if e.key == "location"}
    return {path.parent / location for location in locations}


def _inputs_for(path: Path) -> Path | None:
    stem = path.with_suffix("") if path.is_file() else path
    for candidate in (Path(f"{stem}.npz"), Path(f"{stem}.inputs.npz")):
        if candidate.is_file():
            return candidate
    return None


def model_identity(source: Path, inputs: Path | None, options: TriageOptions) -> str:
    """What a finished record must match to be reused: the model's files (name, size, mtime) and the options.

    Size and modification time, not content: hashing a model with gigabytes of external weights on every
    re-run would cost more than the skip saves.
    """
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    if source.is_file():
        files += sorted(p for p in source.parent.iterdir() if p.is_file() and p.suffix in (".data", ".bin"))
    if inputs is not None:
        files.append(inputs)
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    text = json.dumps({"files": stats, "options": options.identity()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# ------------------------------------------------------------------------------------------------ one model
def triage_one(task: ModelTask) -> ModelOutcome:
    """Triage one model (steps in the module docstring) and record the outcome. Never raises for the model's
    own problems: they become an ``error`` outcome."""
    started = time.monotonic()
    identity = model_identity(Path(task.source), Path(task.inputs) if task.inputs else None, task.options)
    _forget_stale_work(task, identity)
    base = ModelOutcome(name=task.name, source=task.source, status=ERROR, identity=identity)
    try:
        outcome = _triage_model(task, base)
    except GraphBisectError as exc:
        log.info("%s: %s", task.name, exc.message)
        outcome = dataclasses.replace(base, message=exc.message, hint=exc.hint)
    except Exception as exc:  # a graphbisect bug must not end the whole batch; it is reported per model
        log.exception("triage of %s failed unexpectedly", task.name)
        outcome = dataclasses.replace(base, message=f"{type(exc).__name__}: {exc}",
                                      hint="this is a graphbisect bug: please report it with the model")
    outcome = dataclasses.replace(outcome, seconds=time.monotonic() - started)
    shutil.rmtree(task.work_dir, ignore_errors=True)  # an interrupted task never gets here: its journals stay
    task.record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(task.record, json.dumps(outcome.to_json(), indent=2, allow_nan=False) + "\n")
    return outcome


def _forget_stale_work(task: ModelTask, identity: str) -> None:
    """Remove the work of an earlier run on another version of the model or other options."""
    from graphbisect.workflows.reduce import work_dir_for

    marker = task.work_dir / "identity.txt"
    if marker.exists() and marker.read_text().strip() != identity:
        log.info("%s changed since the last run: starting it afresh", task.name)
        shutil.rmtree(task.work_dir, ignore_errors=True)
        shutil.rmtree(work_dir_for(task.bundle_dir), ignore_errors=True)
    task.work_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, identity + "\n")


def _triage_model(task: ModelTask, base: ModelOutcome) -> ModelOutcome:
    from graphbisect.model import load_model

    phases: dict[str, float] = {}
    with _timed(phases, "load"):
        model = load_model(Path(task.source))
        feeds = _feeds(task, model)
    base = dataclasses.replace(base, original_nodes=len(model.nodes))
    runs: dict[str, Mapping[str, int]] = {}
    calls: dict[str, Mapping[str, Mapping[str, int]]] = {}  # the same steps' runs with what they compiled
    with _timed(phases, "compare"):
        verdict, calls["compare"], versions = _compare(task, model, feeds)
    runs["compare"] = CallTally.from_json(calls["compare"]).runs()
    base = dataclasses.replace(base, versions=versions)
    if verdict is None:
        passed = dataclasses.replace(base, status=PASSED, phases=phases, step_invocations=runs,
                                     step_backend_calls=calls)
        checked = _checked(task, model, feeds, passed, phases)
        shutil.rmtree(task.work_dir, ignore_errors=True)
        return checked
    with _timed(phases, "passes"):
        found = _passes(task, model, feeds)
    if found is not None:
        runs["passes"] = dict(found.invocations)
        calls["passes"] = dict(found.backend_calls)
    outcome = dataclasses.replace(base, status=FAILED, signature=verdict, lacks=lacking(verdict),
                                  notes=found.notes if found else ())
    if found is not None and found.failed:
        outcome = dataclasses.replace(outcome, culprits=found.culprits, required=found.required)
    outcome = with_other_audits(outcome, found.audit if found is not None else None, None)
    with _timed(phases, "reduce"):
        outcome = _reduce(task, model, feeds, found, outcome)
    if outcome.invocations:
        runs["reduce"] = dict(outcome.invocations)
        calls["reduce"] = dict(outcome.backend_calls)
    outcome = dataclasses.replace(outcome, phases=phases, step_invocations=runs, step_backend_calls=calls)
    return _checked(task, model, feeds, outcome, phases)


def _checked(task: ModelTask, model: Model, feeds: Mapping[str, np.ndarray], outcome: ModelOutcome,
             phases: dict[str, float]) -> ModelOutcome:
    """``outcome``'s verdict checked by plain runs of the user's model file (:mod:`.triage_claims`)."""
    from graphbisect.backends import BackendSpec
    from graphbisect.workflows.compare import model_for_backend

    o = task.options
    folder = task.work_dir / "checker"
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(task.source)
    onnx_path = source if source.is_file() and source.suffix == ".onnx" else model.save(folder / "model.onnx")

    def model_of(spec: str) -> Path:
        return model_for_backend(model, BackendSpec.parse(spec), onnx_path)

    with _timed(phases, "audit"):
        try:
            return check_outcome(outcome, oracle=o.oracle, target=o.target, model_of=model_of, inputs=feeds,
                                 tolerance=o.tolerance, timeout=o.timeout, workdir=folder)
        except GraphBisectError as exc:  # the verdict stands as the search's, said not to be established
            log.info("%s: the checker could not run: %s", task.name, exc.message)
            return not_established(outcome, f"the checker could not run: {exc.message}")


@contextlib.contextmanager
def _timed(phases: dict[str, float], step: str) -> Iterator[None]:
    """Record the seconds the block took as ``phases[step]`` (also when it raises)."""
    started = time.monotonic()
    try:
        yield
    finally:
        phases[step] = time.monotonic() - started


def _feeds(task: ModelTask, model: Model) -> dict[str, np.ndarray]:
    from graphbisect.data import load_inputs, random_inputs

    if task.inputs is not None:
        return load_inputs(Path(task.inputs), model)
    return random_inputs(model, seed=task.options.seed)


def _compare(task: ModelTask, model: Model, feeds: Mapping[str, np.ndarray]
             ) -> tuple[dict[str, Any] | None, dict[str, Mapping[str, int]], dict[str, dict[str, Any]]]:
    """The verdict on the plain model: the failure's signature, or None when the target agrees with the oracle;
    the backend calls it took (``backend_calls``); and what ran each role (measured in its worker)."""
    from graphbisect.oracle.signature import ModelNames, signature_of
    from graphbisect.workflows.compare import compare_models

    o = task.options
    result = compare_models(model, oracle=o.oracle, target=o.target, inputs=feeds, tolerance=o.tolerance,
                            workdir=task.work_dir / "compare", layerwise=False)
    shutil.rmtree(task.work_dir / "compare", ignore_errors=True)
    runs = dict(result.backend_calls)
    versions = {role: dict(facts) for role, facts in result.versions.items()}
    if result.passed:
        return None, runs, versions
    # the model's names leave a crash's message: two models failing in the same op the same way are one bug
    signature = signature_of(result.target_run, result.comparison, names=ModelNames(model.proto))
    return signature.to_json(), runs, versions


def _passes(task: ModelTask, model: Model, feeds: Mapping[str, np.ndarray]) -> Any:
    """The culprit-pass search (a ``PassesResult``), or None where the target cannot ablate passes."""
    from graphbisect.workflows.passes import PassesOptions, find_culprit_passes

    o = task.options
    _, info = resolve(o.target)
    if not (o.passes and info.has(Capability.PASSES)):
        return None
    options = PassesOptions(oracle=o.oracle, target=o.target, tolerance=o.tolerance, timeout=o.timeout)
    try:
        return find_culprit_passes(model, inputs=feeds, options=options, workdir=task.work_dir / "passes")
    except GraphBisectError as exc:  # e.g. a crash before the target could report: reduce without passes
        log.info("%s: no pass ablation: %s", task.name, exc.message)
        return None


def _reduce(task: ModelTask, model: Model, feeds: Mapping[str, np.ndarray], found: Any,
            outcome: ModelOutcome) -> ModelOutcome:
    """Reduce and bundle (where the target runs ONNX); fills the pattern, sizes and bundle of ``outcome``."""
    from graphbisect.workflows.passes import reduce_under_culprits
    from graphbisect.workflows.reduce import ReduceOptions, reduce_model, work_dir_for

    o = task.options
    _, info = resolve(o.target)
    if not info.has(Capability.ONNX_INPUT):
        return dataclasses.replace(outcome, notes=(*outcome.notes, f"the target {o.target} runs only its own "
                                                   "model format: no reduction, no bundle"))
    options = ReduceOptions(oracle=o.oracle, target=o.target, tolerance=o.tolerance, jobs=o.candidate_jobs,
                            max_invocations=o.max_invocations, timeout=o.timeout)
    resume = (work_dir_for(task.bundle_dir) / "run.json").exists()
    if found is not None and found.culprits:
        result = reduce_under_culprits(model, task.bundle_dir, found, inputs=feeds, reduce_options=options,
                                       resume=resume)
    else:
        result = reduce_model(model, task.bundle_dir, inputs=feeds, options=options, resume=resume)
    shutil.rmtree(task.work_dir, ignore_errors=True)
    if not result.failed:
        # The comparison saw the target fail on this very model, so it stays a failure (calling it passed
        # would contradict a measured run); what is unknown is why it did not fail again.
        seen = Signature.from_json(dict(outcome.signature)).describe() if outcome.signature else "a failure"
        return dataclasses.replace(outcome, invocations=dict(result.invocations),
                                   backend_calls=dict(result.backend_calls), notes=(
            *outcome.notes, f"the comparison saw the target fail ({seen}) but the reduction's run of the same model "
            f"did not ({result.signature.describe()}): the failure does not reproduce reliably (a flaky target or "
            "oracle); no bundle"))
    pattern, op_types, domains = _pattern(Path(result.bundle) / "model.onnx")
    outcome = with_other_audits(outcome, None, result.audit)
    return dataclasses.replace(outcome, pattern=pattern, op_types=op_types, lacks=lacking(outcome.signature, domains),
                               final_nodes=result.final_nodes,
                               one_minimal=result.one_minimal, bundle=str(result.bundle),
                               invocations=dict(result.invocations), backend_calls=dict(result.backend_calls),
                               notes=(*outcome.notes, *result.notes))


def _pattern(path: Path) -> tuple[str, tuple[str, ...], frozenset[str]]:
    """The reduced model's pattern hash, its op types in order and its nodes' domains."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return (pattern_hash(proto), tuple(node.op_type for node in proto.graph.node),
            frozenset(node.domain for node in proto.graph.node))


# ------------------------------------------------------------------------------------------------ the batch
def triage(
    input_dir: Path,
    out_dir: Path,
    *,
    options: TriageOptions | None = None,
    executor: Executor | str = "local",
    jobs: int | None = None,
    on_model: Callable[[ModelOutcome], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> TriageResult:
    """Triage every model in ``input_dir`` into ``out_dir`` and write the deduplicated summary.

    ``executor`` is an :class:`~graphbisect.executors.Executor` (kept open) or a spec (``local``, ``ray``,
    ``ray:ADDRESS``: made with ``jobs`` workers and closed afterwards). ``on_model`` is called with each
    outcome as it arrives (finished models from an earlier run first). ``on_stage`` gets a line at once (what
    is triaged, and how), then one every :data:`HEARTBEAT_SECONDS` while no model ends: a model takes tens of
    seconds, and the CLI printed nothing until the first one ended.

    Example:
        >>> r = triage(Path("failing/"), Path("triage-out"), executor="local", jobs=4)   # doctest: +SKIP
        >>> [(b.count, b.culprits) for b in r.bugs]                                       # doctest: +SKIP
        [(2, ('LayerNormFusionL1', 'SimplifiedLayerNormFusion')), (1, ('FuseReluClip',))]
    """
    started = time.monotonic()
    options = options or TriageOptions()
    out_dir = Path(out_dir).resolve()
    _claim(out_dir)
    with folder_lock(out_dir, what=f"a triage writing {out_dir}",
                     hint="wait for it to finish, or choose another -o folder"):
        return _triage(input_dir, out_dir, options, executor=executor, jobs=jobs, on_model=on_model,
                       on_stage=on_stage or (lambda _line: None), started=started)


#: Marks a triage output folder: a later triage into it goes on (skipping recorded models).
TRIAGE_MARK = ".graphbisect-triage"


def _claim(out_dir: Path) -> None:
    """Make ``out_dir`` a triage folder: it must be new, empty or an earlier triage's (marked, a summary.json
    of graphbisect's, or the ``results/`` of an interrupted run); a folder of other files is refused before
    anything runs: summary.md, summary.json, ... would replace the user's (issue 24)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"the triage output {out_dir} exists and is not a folder", hint="choose a new or empty folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in out_dir.iterdir())
    if names and not (TRIAGE_MARK in names or _summary_format(out_dir) == "graphbisect-triage"
                      or any((out_dir / "results").glob("*.json"))):
        raise InputError(
            f"the triage output folder {out_dir} holds files that are not an earlier triage's "
            f"({', '.join(names[:5])}{' …' if len(names) > 5 else ''}): summary.md, summary.json, bundles/ ... "
            "would replace them", hint="choose a new or empty folder (an earlier triage's folder goes on where it "
            "stopped)")
    mark = out_dir / TRIAGE_MARK
    if not mark.exists():
        mark.write_text("a graphbisect triage folder: a later triage goes on here\n", encoding="utf-8")


def _summary_format(out_dir: Path) -> object:
    try:
        data = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("format") if isinstance(data, dict) else None


def _triage(input_dir: Path, out_dir: Path, options: TriageOptions, *, executor: Executor | str, jobs: int | None,
            on_model: Callable[[ModelOutcome], None] | None, on_stage: Callable[[str], None],
            started: float) -> TriageResult:
    """The body of :func:`triage`, under its lock."""
    from graphbisect.artifacts.triage_report import write_triage_summary

    tasks = [ModelTask(name, str(path), str(out_dir), options, str(inp) if inp else None)
             for name, path, inp in discover_models(Path(input_dir))]
    finished, todo = _split_finished(tasks)
    report = on_model or (lambda _o: None)
    for outcome in finished:
        report(outcome)
    if todo:
        on_stage(f"triaging {plural(len(todo), 'model')} of {input_dir}"
                 + (f" ({len(finished)} more finished earlier)" if finished else "")
                 + f" on {executor if isinstance(executor, str) else executor.name}: each is compared, its passes "
                 "searched, then reduced to a bundle; a line per model as it ends")
    owned = isinstance(executor, str)
    ex = make_executor(executor, jobs=jobs, gpus_per_task=_gpus(options)) if isinstance(executor, str) else executor
    try:
        fresh = _run_all(ex, todo, report, on_stage)
    finally:
        if owned:
            ex.close()
    _remove_if_empty(out_dir / "work")
    outcomes = tuple(sorted([*finished, *fresh], key=lambda o: o.name))
    bugs = tuple(dataclasses.replace(bug, checked=grouping_check(bug, outcomes)) for bug in group_bugs(outcomes))
    seconds = time.monotonic() - started
    meta = {"input_dir": str(input_dir), "oracle": options.oracle, "target": options.target,
            "executor": ex.name, "workers": ex.workers, "skipped": [o.name for o in finished],
            "seconds": round(seconds, 3)}
    summary = write_triage_summary(out_dir, outcomes, bugs, meta)
    return TriageResult(outcomes, bugs, summary, ex.name, tuple(o.name for o in finished), seconds)


def _remove_if_empty(folder: Path) -> None:
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def _gpus(options: TriageOptions) -> float:
    _, info = resolve(options.target, require_available=False)
    return 1.0 if info.has(Capability.NEEDS_GPU) else 0.0


def _split_finished(tasks: Sequence[ModelTask]) -> tuple[list[ModelOutcome], list[ModelTask]]:
    """Outcomes recorded by an earlier run for the same model file and options, and the tasks still to run."""
    finished, todo = [], []
    for task in tasks:
        record = _read_record(task)
        inputs = Path(task.inputs) if task.inputs else None
        same = record is not None and record.identity == model_identity(Path(task.source), inputs, task.options)
        if same and record is not None and not _unfinished(record, task):
            log.info("%s: finished in an earlier run, skipped", task.name)
            finished.append(record)
        else:
            todo.append(task)
    return finished, todo


def _unfinished(record: ModelOutcome, task: ModelTask) -> bool:
    """A reduction stopped before it was proven 1-minimal (budget, deadline) whose work folder is still there."""
    from graphbisect.workflows.reduce import work_dir_for

    return record.status == FAILED and not record.one_minimal and work_dir_for(task.bundle_dir).exists()


def _read_record(task: ModelTask) -> ModelOutcome | None:
    if not task.record.exists():
        return None
    try:
        return ModelOutcome.from_json(json.loads(task.record.read_text()))
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring the unreadable record %s: %s", task.record, exc)
        return None


#: Seconds without a model ending after which :func:`triage` says it is still at work.
HEARTBEAT_SECONDS = 30.0


def _run_all(ex: Executor, tasks: Sequence[ModelTask], report: Callable[[ModelOutcome], None],
             on_stage: Callable[[str], None]) -> list[ModelOutcome]:
    futures: dict[Future[ModelOutcome], ModelTask] = {ex.submit(triage_one, task): task for task in tasks}
    outcomes: list[ModelOutcome] = []
    pending = set(futures)
    started = time.monotonic()
    while pending:
        done, pending = wait(pending, timeout=HEARTBEAT_SECONDS, return_when=FIRST_COMPLETED)
        if not done:
            on_stage(f"{len(outcomes)} of {plural(len(futures), 'model')} done after "
                     f"{time.monotonic() - started:.0f} s; {len(pending)} still being triaged")
        for future in done:
            outcome = _collect(future, futures[future])
            report(outcome)
            outcomes.append(outcome)
    return outcomes


def _collect(future: Future[ModelOutcome], task: ModelTask) -> ModelOutcome:
    """A task's outcome; a worker lost on every attempt gives an error row that is *not* recorded (re-run it)."""
    try:
        return future.result()
    except WorkerLostError as exc:
        log.warning("%s: %s", task.name, exc.message)
        return ModelOutcome(name=task.name, source=task.source, status=ERROR, message=exc.message, hint=exc.hint)
