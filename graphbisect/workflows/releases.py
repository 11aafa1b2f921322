"""`releases`: the first release of a backend package where a bundle's failure appears (``find="bad"``), or
the first where it is gone (``find="fixed"``).

The oracle stays fixed: the bundle's recorded expected outputs. Only the target moves: each release runs the
bundle's target (or ``target``) with ``python=`` that release's cached environment
(:mod:`graphbisect.releases.environments`), and is judged as ``verify`` judges it
(:func:`~graphbisect.workflows.verify.verify_bundle`): **bad** when the recorded failure reproduces (the same
identity, not merely the same kind), **good** when the target agrees with the oracle, and a **skip**, with its
reason, when the release cannot be installed, cannot run the model, or fails *differently* (another bug:
never counted as this one, the commonest way an automated bisection lands on the wrong release). The search
(:func:`~graphbisect.releases.search.find_change`) checks both ends first and steps around skips; the releases
its answer rests on are run ``repeat`` times and their verdict voted, a disagreement reported as flaky (and a
verdict the vote overturns searched again).

On a model (:func:`search_releases_model`) the reference a bundle carries is made once, the oracle's outputs and
the failure of a baseline release (:mod:`graphbisect.workflows.releases_model`), and each release is judged
against it the same way.

What a search of a bundle found is added to the bundle by its callers (the CLI, ``graphbisect.releases``):
:mod:`graphbisect.artifacts.releases_section`.

Where the target can say (ONNX Runtime), a found answer also says what changed between its two releases: the passes
that fired in one and not the other, and what each compiled the failing region as (:mod:`.releases_change`).

The packages, what each release's environment holds and which backend it runs:
:data:`~graphbisect.releases.packages.PACKAGES`.
"""

from __future__ import annotations

import logging
import math
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.artifacts.bundle import BundleError, LoadedBundle
from graphbisect.artifacts.repro import TACTICS_FILE
from graphbisect.backends import BackendSpec, registry
from graphbisect.backends.registry import DEFAULT_ORACLE
from graphbisect.checker.values import Limits
from graphbisect.compare import Tolerance
from graphbisect.errors import GraphBisectError, InputError
from graphbisect.model import Model
from graphbisect.releases.environments import Environment, prepare_environments
from graphbisect.releases.index import VersionRange, select_versions
from graphbisect.releases.packages import COMMAND, Recipe, recipe_of, release_versions
from graphbisect.releases.search import FOUND, NEWEST_UNCHANGED, OLDEST_CHANGED, Answer, Change, find_change
from graphbisect.text.printable import plural
from graphbisect.workflows.passes_claims import limits_of
from graphbisect.workflows.releases_change import ReleaseChange, release_change, reports_passes
from graphbisect.workflows.releases_claims import (
    ReleaseEvidence,
    audit_record,
    check_answer,
    confirmed_words,
    release_claims,
)
from graphbisect.workflows.releases_model import ModelReference, describe_reference, model_reference
from graphbisect.workflows.scratch import work_folder
from graphbisect.workflows.verify import DIFFERENT, FIXED, FIXED_REDUCED, REPRODUCES, Verification, verify_bundle

__all__ = ["BAD", "FINDS", "GOOD", "SKIP", "ReleaseRun", "ReleaseSearch", "search_releases", "search_releases_model"]

log = logging.getLogger(__name__)

GOOD, BAD, SKIP = "good", "bad", "skip"
#: What a search looks for: the first release where the failure appears, or the first where it is gone.
FINDS = ("bad", "fixed")


@dataclass(frozen=True)
class ReleaseRun:
    """One release's verdict: ``good``, ``bad`` or ``skip`` (with ``reason``; a ``bad`` one's says how it was matched
    where its release names the failure otherwise), from ``runs`` runs (``votes``:
    verdict -> runs; ``flaky`` when they disagree). ``observed``: the failure it showed (its identity), and
    ``magnitude``: the largest output mismatch in multiples of the tolerance (None without a comparison)."""

    version: str
    verdict: str
    reason: str | None = None
    observed: str | None = None
    magnitude: float | None = None
    library_version: str | None = None
    runs: int = 0
    votes: Mapping[str, int] = field(default_factory=dict)
    flaky: bool = False
    installed: bool = False
    install_seconds: float = 0.0
    run_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "observed": self.observed,
                "magnitude": self.magnitude, "library_version": self.library_version, "runs": self.runs,
                "votes": dict(self.votes), "flaky": self.flaky, "installed": self.installed,
                "install_seconds": round(self.install_seconds, 1), "run_seconds": round(self.run_seconds, 1)}


@dataclass(frozen=True)
class ReleaseSearch:
    """Where the failure (a bundle's, or a model's) appears (``find="bad"``: ``last_good``, ``first_bad``) or is gone
    (``find="fixed"``: ``last_bad``, ``first_fixed``) among ``versions`` (oldest first) of ``package``.

    ``status``: ``found``; ``present-in-oldest`` (the oldest testable release is already bad, or already fixed:
    nothing to bisect); ``absent-in-newest`` (the newest testable release is not bad, or not fixed); or
    ``untestable`` (every release was a skip). ``skipped_between``: releases between the two answers that were
    skips (the change may be in one of them). ``tested``: version -> :class:`ReleaseRun`, for every release
    run or skipped. ``installs``: environments installed by this search (0 when all were cached); ``runs``: the
    target's runs; ``releases_run``: the releases that ran (the search's cost).
    """

    package: str
    find: str
    target: str
    recorded: str
    versions: tuple[str, ...]
    status: str
    last_good: str | None
    first_bad: str | None
    last_bad: str | None
    first_fixed: str | None
    skipped_between: tuple[str, ...]
    tested: Mapping[str, ReleaseRun]
    installs: int
    runs: int
    releases_run: int
    python: str
    #: the oracle that ran on a model (once: ``oracle_runs``), or None: a bundle's recorded outputs
    oracle: str | None = None
    oracle_runs: int = 0
    #: what changed between the two releases found, where the target says (:mod:`.releases_change`)
    changed: ReleaseChange | None = None
    #: the checker's record of the answer's two claims (:mod:`.releases_claims`): None where nothing was found
    audit: Mapping[str, Any] | None = None

    @property
    def confirmed(self) -> bool:
        """Whether the answer's claims hold by the checker's plain runs (True where nothing was claimed)."""
        return confirmed_words(self.audit)[0]

    @property
    def refuted(self) -> bool:
        """Whether the checker's plain runs show a claim of the answer false (not merely not established)."""
        return any(c.get("holds") is False for c in (self.audit or {}).get("claims", ()))

    @property
    def found(self) -> bool:
        """Whether the release where it changed was found."""
        return self.status == "found"

    @property
    def bound(self) -> int:
        """``ceil(log2 N) + 2``: the most releases a search of N runs, skips and their replacements excepted."""
        return math.ceil(math.log2(max(len(self.versions), 1))) + 2

    @property
    def flaky(self) -> list[str]:
        """The releases whose runs disagreed."""
        return [version for version, run in self.tested.items() if run.flaky]

    @property
    def paragraph(self) -> str:
        """One paragraph ready to paste into an issue."""
        return _paragraph(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "package": self.package, "find": self.find, "target": self.target, "recorded": self.recorded,
            "python": self.python, "versions": list(self.versions), "status": self.status,
            "last_good": self.last_good, "first_bad": self.first_bad, "last_bad": self.last_bad,
            "first_fixed": self.first_fixed, "skipped_between": list(self.skipped_between),
            "tested": {version: run.to_json() for version, run in self.tested.items()},
            "oracle": self.oracle, "oracle_runs": self.oracle_runs,
            "changed": None if self.changed is None else self.changed.to_json(), "audit": self.audit,
            "installs": self.installs, "runs": self.runs, "releases_run": self.releases_run,
            "bound": self.bound, "flaky": self.flaky, "paragraph": self.paragraph,
        }


def search_releases(bundle: LoadedBundle, package: str, *, versions: Sequence[str] | None = None,
                    within: VersionRange | str | None = None, pre: bool = False,
                    target: BackendSpec | str | None = None, find: str = "bad", cache: Path | str | None = None,
                    jobs: int = 2, repeat: int = 3, trust: bool = False, installer: str = "auto",
                    on_progress: Callable[[str], None] | None = None) -> ReleaseSearch:
    """Search the releases of ``package`` for where ``bundle``'s failure appears (``find="bad"``) or is gone
    (``find="fixed"``).

    ``versions``: the releases to search (default: the package index's for this Python, final releases unless
    ``pre``), within ``within`` (``"A..B"``). ``target``: the spec each release runs (default the bundle's
    recorded one, held to the trust rule: its options other than ``python=``, which this replaces, must be
    inert, else ``trust``). Every environment is made ahead of the search, ``jobs`` at a time, in ``cache``
    (:func:`~graphbisect.releases.environments.cache_root`), by ``installer`` (``auto``: uv where it is there,
    else pip). Raises :class:`InputError` for an unknown
    package, a target of another backend, fewer than two releases, or an index that cannot be read.
    """
    say = _checked_arguments(find, repeat, jobs, on_progress)
    spec = _target(bundle, target, trust=trust)
    recipe = _recipe(spec, package)
    chosen, envs, installs = _environments(recipe, versions, within, pre=pre, cache=cache, jobs=jobs,
                                           installer=installer, say=say, use_host=not _is_command(spec))
    runner = _Runner(bundle, spec, envs, repeat=repeat, find=find, recipe=recipe, say=say)
    change = runner.search(chosen)
    evidence = ReleaseEvidence(str(bundle.oracle), bundle.model_path, bundle.inputs, bundle.report,
                               Limits.from_report(bundle.report.get("tolerance")))
    return _result(package, find, spec, _short(bundle.signature.describe()), chosen, change=change, runner=runner,
                   installs=installs, evidence=evidence, trust=trust)


def search_releases_model(model: Model | Path | str, package: str, *, oracle: BackendSpec | str = DEFAULT_ORACLE,
                          target: BackendSpec | str | None = None, inputs: Mapping[str, np.ndarray] | None = None,
                          seed: int = 0, tolerance: Tolerance | None = None, bundle: LoadedBundle | None = None,
                          versions: Sequence[str] | None = None, within: VersionRange | str | None = None,
                          pre: bool = False, find: str = "bad", cache: Path | str | None = None, jobs: int = 2,
                          repeat: int = 3, workdir: Path | None = None, installer: str = "auto",
                          on_progress: Callable[[str], None] | None = None) -> ReleaseSearch:
    """:func:`search_releases` on a model: ``oracle`` (this interpreter's, fixed) runs once on ``model`` and its
    outputs are every release's expectation; ``target`` (default the package's: ``onnxruntime:opt_level=all``,
    ``openvino``, ``reference`` for ``onnx``...) moves, ``python=``
    each release's environment. The failure searched for is the baseline release's (the newest that installs
    with ``find="bad"``, the oldest with ``find="fixed"``), or ``bundle``'s: see
    :mod:`graphbisect.workflows.releases_model`. ``inputs``: the model's (default: seeded random ones, ``seed``);
    ``workdir``: where the normalized model, the inputs and the oracle's activations are kept (default: a
    temporary folder). Raises :class:`InputError` as :func:`search_releases` does, and
    :class:`~graphbisect.workflows.compare.OracleFailed` when the oracle cannot run the model."""
    from graphbisect.model import load_model

    say = _checked_arguments(find, repeat, jobs, on_progress)
    spec = _replaced(BackendSpec.parse(target or recipe_of(package).target) if not isinstance(target, BackendSpec)
                     else target)
    recipe = _recipe(spec, package)
    oracle_spec = BackendSpec.parse(oracle) if isinstance(oracle, str) else oracle
    loaded = model if isinstance(model, Model) else load_model(Path(model))
    chosen, envs, installs = _environments(recipe, versions, within, pre=pre, cache=cache, jobs=jobs,
                                           installer=installer, say=say, use_host=not _is_command(spec))
    usable = [v for v in chosen if envs[v].usable]
    if not usable:
        runner = _Runner(None, spec, envs, repeat=repeat, find=find, recipe=recipe, say=say)
        return _result(package, find, spec, "nothing: no release could be installed", chosen,
                       change=runner.search(chosen), runner=runner, installs=installs, oracle=str(oracle_spec))
    with work_folder(workdir, "releases", protect=(loaded.path, loaded.origin)) as (folder, _):
        say(f"the reference: the oracle {oracle_spec} and a baseline release of {package} on "
            f"{loaded.origin or loaded.path}" + (f"; the failure is {bundle.source}'s" if bundle is not None else ""))
        baseline, ref, cannot = _reference(loaded, usable[::-1] if find == "bad" else usable, envs, folder, say=say,
                                           oracle=oracle_spec, target=spec, recipe=recipe, inputs=inputs, seed=seed,
                                           tolerance=tolerance, bundle=bundle)
        runner = _Runner(None if ref is None else ref.bundle, spec, envs, repeat=repeat, find=find, recipe=recipe,
                         say=say)
        runner.tested.update(cannot)
        runner.runs += len(cannot)
        if ref is None:  # no release could run the target: every one is a skip
            return _result(package, find, spec, "nothing: no release could run the target", chosen,
                           change=runner.search(chosen), runner=runner, installs=installs, oracle=str(oracle_spec))
        runner.runs += ref.target_runs
        if bundle is None:  # the baseline's run is the failure: bad by definition (its repeats are voted)
            runner.tested[baseline] = _baseline_run(baseline, ref, envs[baseline])
        change = runner.search(chosen)
        # the failure another bundle records is of another model: none of this model's for the checker to match
        evidence = ReleaseEvidence(str(oracle_spec), ref.bundle.model_path, ref.bundle.inputs,
                                   ref.bundle.report if bundle is None else None, limits_of(ref.bundle.tolerance))
        # inside the work folder: what changed between the two releases found is asked of the reference's model,
        # and the checker runs it
        return _result(package, find, spec, _short(describe_reference(ref) if ref.failed or bundle is not None
                                                   else "no failure on the baseline release " + baseline, 400),
                       chosen, change=change, runner=runner, installs=installs, oracle=str(oracle_spec),
                       oracle_runs=ref.oracle_runs, evidence=evidence, trust=True)


def _reference(model: Model, candidates: Sequence[str], envs: Mapping[str, Environment], folder: Path, *,
               say: Callable[[str], None], oracle: BackendSpec, target: BackendSpec, recipe: Recipe, **options: Any
               ) -> tuple[str, ModelReference | None, dict[str, ReleaseRun]]:
    """The reference made on the first of ``candidates`` (the baseline) whose target can run, and the releases
    before it that cannot (a skip each, with why: an OpenVINO release older than graphbisect's backend needs; an
    environment whose measured release is another than asked).
    The target's worker is started and checked before the oracle runs, so a release that cannot start it costs
    no oracle run. :class:`~graphbisect.workflows.compare.OracleFailed` is raised, never taken for a release's
    skip."""
    from graphbisect.workflows.compare import OracleFailed

    cannot: dict[str, ReleaseRun] = {}
    for version in candidates:
        start = time.monotonic()
        try:
            ref = model_reference(model, oracle=oracle, target=_in_environment(target, envs[version], recipe),
                                  workdir=folder / f"reference-{version}", **options)
            _check_release(version, ref.baseline.versions.get("target", {}), recipe, target)
        except OracleFailed:
            raise
        except GraphBisectError as exc:
            cannot[version] = ReleaseRun(version, SKIP, f"cannot run: {_short(exc.message, 400)}", runs=1,
                                         installed=envs[version].installed, install_seconds=envs[version].seconds,
                                         run_seconds=time.monotonic() - start)
            say(f"  {version}: skip ({cannot[version].reason})")
            continue
        seconds = time.monotonic() - start
        say(f"  {version} (the baseline): {describe_reference(ref) if ref.failed else 'passes'} "
            f"[{seconds:.1f} s, oracle {ref.oracle_runs} run, target {ref.target_runs}]")
        return version, ref, cannot
    return "", None, cannot


def _checked_arguments(find: str, repeat: int, jobs: int,
                       on_progress: Callable[[str], None] | None) -> Callable[[str], None]:
    """``on_progress`` (else the log), once ``find``, ``repeat`` and ``jobs`` are known to be usable."""
    if find not in FINDS:
        raise InputError(f"find={find!r}: look for {' or '.join(FINDS)}", hint="find='bad' or find='fixed'",
                         cli_hint="--find bad or --find fixed")
    if repeat < 1 or jobs < 1:
        raise InputError("repeat and jobs count runs: at least 1", hint="repeat=3, jobs=2",
                         cli_hint="--repeat 3, --jobs 2")
    return on_progress or (lambda line: log.info("%s", line))


def _is_command(spec: BackendSpec) -> bool:
    """Whether ``spec`` is a ``command:`` target (any package's releases run it)."""
    return registry.get(spec.name).name == COMMAND


def _recipe(spec: BackendSpec, package: str) -> Recipe:
    """How to install ``package``'s releases for ``spec``: the table's recipe, whose backend ``spec`` must be
    unless it is a ``command:`` target, which any package's releases run (their environment first on its
    ``PATH``); else :class:`InputError`."""
    command = _is_command(spec)
    recipe = recipe_of(package, command=command)
    if not command and registry.get(spec.name).name not in recipe.backends:
        raise InputError(f"the target {spec} is not run by {package}", hint=f"target= one of "
                         f"{', '.join(recipe.backends)} (or a command: program), or package= the package of "
                         f"{spec.name}", cli_hint=f"--target one of {', '.join(recipe.backends)} (or a command: "
                         f"program), or --package the package of {spec.name}")
    return recipe


def _replaced(spec: BackendSpec) -> BackendSpec:
    """``spec`` without what each release sets: ``python=``, and a ``command:`` target's ``venv=`` and
    ``package=``."""
    spec = spec.with_options(python=None)
    return spec.with_options(venv=None, package=None) if _is_command(spec) else spec


def _in_environment(spec: BackendSpec, env: Environment, recipe: Recipe) -> BackendSpec:
    """``spec`` run by ``env``: its interpreter (``python=``; this one's: ``spec`` itself), or for a ``command:``
    target the environment first on the program's ``PATH`` (``venv=``) and the release measured there
    (``package=``: the command backend reports the version that environment's ``python`` has)."""
    if _is_command(spec):
        assert env.folder is not None, "a command: target's releases each have an environment (use_host=False)"
        return spec.with_options(venv=str(env.folder), package=recipe.distributions[0])
    return spec if env.python is None else spec.with_options(python=str(env.python))


def _check_release(version: str, ran: Mapping[str, Any], recipe: Recipe, spec: BackendSpec) -> None:
    """Raise :class:`InputError` when what ran (``ran_with``, as the worker measured it) is another release than
    ``version``, or, for a ``command:`` target, was not measured (nothing would say which release ran)."""
    why = _another_release(version, ran.get("library_version"), recipe, spec)
    if why is not None:
        raise InputError(why, hint="delete that release's environment from the cache and run again")


def _another_release(version: str, library: Any, recipe: Recipe, spec: BackendSpec) -> str | None:
    """Why a run measured as ``library`` is not a run of ``version`` (None: it is, or a built-in backend's worker
    did not say)."""
    if library is None:
        return (f"cannot tell which release of {recipe.distributions[0]} ran: its environment's python did not "
                "report one" if _is_command(spec) else None)
    if not recipe.reports(version, str(library)):
        return f"its environment runs {library}, not {version}"
    return None


def _baseline_run(version: str, ref: ModelReference, env: Environment) -> ReleaseRun:
    """The baseline release's verdict from the comparison that made the reference: bad when it failed."""
    compared = ref.baseline
    magnitude = _magnitude(s.score for s in compared.outputs)
    library = compared.versions.get("target", {}).get("library_version")
    return ReleaseRun(version, BAD if ref.failed else GOOD, None,
                      _short(ref.bundle.signature.describe()) if ref.failed else None,
                      magnitude, None if library is None else str(library),
                      runs=1, installed=env.installed, install_seconds=env.seconds,
                      run_seconds=ref.baseline.seconds)


def _environments(recipe: Recipe, versions: Sequence[str] | None, within: VersionRange | str | None, *, pre: bool,
                  cache: Path | str | None, jobs: int, installer: str, say: Callable[[str], None],
                  use_host: bool = True) -> tuple[list[str], dict[str, Environment], int]:
    """The releases searched (oldest first), their environments (``use_host``: the release installed in this
    interpreter runs here), and how many were installed now."""
    package = recipe.package
    window = within if isinstance(within, VersionRange) else VersionRange.parse(within)
    listed = list(versions) if versions is not None else release_versions(recipe, pre=pre)
    chosen = select_versions(listed, window, pre=pre or versions is not None)
    if len(chosen) < 2:
        raise InputError(f"{plural(len(chosen), 'release')} of {package} in {window or 'the index'} "
                         f"({', '.join(chosen) or 'none'}): a search needs two",
                         hint="widen within=, or name the releases with versions=['A', 'B', 'C']",
                         cli_hint="widen --range, or name the releases with --versions A,B,C")
    say(f"{len(chosen)} releases of {package} ({chosen[0]} … {chosen[-1]}); environments in "
        f"{cache or 'the cache'}, {jobs} at a time")
    start = time.monotonic()

    def ready(env: Environment) -> None:
        what = (f"cannot install: {env.error}" if env.error else
                f"installed in {env.seconds:.1f} s ({env.installer})" if env.installed
                else "this interpreter" if env.python is None else "cached")
        say(f"  {package} {env.version}: {what}")

    envs = prepare_environments(recipe, chosen, cache=cache, jobs=jobs, installer=installer, use_host=use_host,
                                on_ready=ready)
    installs = sum(env.installed for env in envs.values())
    say(f"environments ready in {time.monotonic() - start:.1f} s ({installs} installed)")
    return chosen, envs, installs


def _target(bundle: LoadedBundle, target: BackendSpec | str | None, *, trust: bool) -> BackendSpec:
    """The spec every release runs, without ``python=``. The recorded one is held to the trust rule."""
    if target is not None:
        return _replaced(BackendSpec.parse(target) if isinstance(target, str) else target)
    spec = _replaced(bundle.target)
    from graphbisect.backends.registry import untrusted_options

    untrusted = untrusted_options(spec, own_files=[str(bundle.path / TACTICS_FILE)])
    if untrusted and not trust:
        raise BundleError(f"the bundle's recorded target {spec} sets options not known to be inert (they may run a "
                          "program, load a library or write a file):" + "".join(f"\n    {u.describe()}"
                                                                              for u in untrusted),
                          hint="read the bundle's report.json; to run it anyway pass --trust, or name the target "
                          "yourself with --target SPEC")
    return spec


class _Runner:
    """Runs releases for the search: one verdict per release, cached; the decisive ones confirmed by a vote."""

    def __init__(self, bundle: LoadedBundle | None, spec: BackendSpec, envs: Mapping[str, Environment], *,
                 repeat: int, find: str, recipe: Recipe, say: Callable[[str], None]) -> None:
        """``bundle``: the reference each release is judged against (None only when no release can run)."""
        self.bundle, self.spec, self.envs, self.repeat, self.find, self.say = bundle, spec, envs, repeat, find, say
        self.recipe = recipe
        self.tested: dict[str, ReleaseRun] = {}
        self.confirmed: set[str] = set()
        self.runs = 0

    def search(self, versions: Sequence[str]) -> Change:
        while True:
            change = find_change(len(versions), lambda i: self.answer(versions[i]))
            decisive = [versions[i] for i in (change.last_no, change.first_yes) if i is not None]
            overturned = [v for v in decisive if v not in self.confirmed and self.confirm(v)]
            if not overturned:
                return change
            self.say(f"the vote overturned {', '.join(overturned)}: searching again")

    def what_changed(self, older: str, newer: str) -> ReleaseChange | None:
        """What changed between the two releases found (:mod:`.releases_change`), where the target can say."""
        if self.bundle is None or not reports_passes(self.spec):
            return None
        self.say(f"what changed between {older} and {newer}: their passes and optimized graphs")
        change = release_change(self.bundle, (older, _in_environment(self.spec, self.envs[older], self.recipe)),
                                (newer, _in_environment(self.spec, self.envs[newer], self.recipe)))
        self.runs += change.runs
        self.say(f"  {change.describe()}")
        return change

    def check(self, package: str, older: str, newer: str, evidence: ReleaseEvidence, *,
              trust: bool) -> dict[str, Any]:
        """The answer's two claims re-established by the checker (:mod:`.releases_claims`), as its record."""
        claims = release_claims(package, self.find, older, newer, model=evidence.model,
                                spec_of=lambda v: str(_in_environment(self.spec, self.envs[v], self.recipe)))
        audit = check_answer(claims, evidence, trust=trust, say=self.say)
        for claim in audit.claims:
            self.say(f"  {claim.statement}: {claim.verdict} ({_short(claim.evidence, 300)})")
        return audit_record(audit)

    def answer(self, version: str) -> Answer:
        if version not in self.tested:
            self.tested[version] = self.run(version)
        verdict = self.tested[version].verdict
        if verdict == SKIP:
            return Answer.UNKNOWN
        changed = BAD if self.find == "bad" else GOOD
        return Answer.YES if verdict == changed else Answer.NO

    def confirm(self, version: str) -> bool:
        """Run ``version`` until it has ``repeat`` runs and vote; True when the vote overturns its verdict."""
        self.confirmed.add(version)
        first = self.tested[version]
        if self.repeat <= 1 or first.runs == 0:  # nothing ran (cannot install): nothing to repeat
            return False
        results = [first, *(self.run(version) for _ in range(self.repeat - 1))]
        votes = Counter(r.verdict for r in results)
        verdict, count = votes.most_common(1)[0]
        flaky = len(votes) > 1
        chosen = next(r for r in results if r.verdict == verdict)
        reason = chosen.reason
        if count * 2 <= len(results):
            verdict, reason = SKIP, f"flaky: no majority in {len(results)} runs ({_votes(votes)})"
        elif flaky:
            self.say(f"  {version} is flaky: {_votes(votes)}; the vote says {verdict}")
        self.tested[version] = ReleaseRun(
            version, verdict, reason, chosen.observed, chosen.magnitude, chosen.library_version,
            runs=len(results), votes=dict(votes), flaky=flaky, installed=first.installed,
            install_seconds=first.install_seconds, run_seconds=sum(r.run_seconds for r in results))
        return verdict != first.verdict

    def run(self, version: str) -> ReleaseRun:
        env = self.envs[version]
        if not env.usable:
            run = ReleaseRun(version, SKIP, f"cannot install: {env.error}", install_seconds=env.seconds)
            self.say(f"  {version}: skip ({run.reason})")
            return run
        spec = _in_environment(self.spec, env, self.recipe)
        start = time.monotonic()
        self.runs += 1
        assert self.bundle is not None, "a release that installs is judged against a reference"
        try:
            verification = verify_bundle(self.bundle, spec, checked=False)  # the answer is checked (releases_claims)
        except GraphBisectError as exc:
            run = ReleaseRun(version, SKIP, f"cannot run: {exc.message}", runs=1, installed=env.installed,
                             install_seconds=env.seconds, run_seconds=time.monotonic() - start)
        else:
            run = _judged(version, verification, env, time.monotonic() - start, recipe=self.recipe, spec=self.spec)
        self.say(f"  {version}: {run.verdict}" + (f" ({run.reason})" if run.reason else "")
                 + (f", {run.observed}" if run.observed and run.verdict == BAD else "")
                 + f" [{run.run_seconds:.1f} s]")
        return run


def _judged(version: str, v: Verification, env: Environment, seconds: float, *, recipe: Recipe,
            spec: BackendSpec) -> ReleaseRun:
    """A release's verdict from ``verify``'s outcome: a skip when its worker reports another release than
    ``version`` (as ``recipe``'s library writes its version), or, for a ``command:`` target, none."""
    library = v.library.get("library_version")
    magnitude = _magnitude(s.score for s in v.outputs)
    common = {"observed": _short(v.observed.describe()) if v.observed.failed else None,
              "magnitude": magnitude, "library_version": library,
              "runs": 1, "installed": env.installed, "install_seconds": env.seconds, "run_seconds": seconds}
    another = _another_release(version, library, recipe, spec)
    if another is not None:
        return ReleaseRun(version, SKIP, another, **common)  # type: ignore[arg-type]
    if v.outcome == REPRODUCES:  # the note says how, where the release names the failure otherwise
        return ReleaseRun(version, BAD, v.note, **common)  # type: ignore[arg-type]
    if v.outcome in (FIXED, FIXED_REDUCED):
        return ReleaseRun(version, GOOD, None, **common)  # type: ignore[arg-type]
    why = v.note or v.outcome
    if v.outcome == DIFFERENT:  # verify's note says how (another identity: which pass, which node)
        why = f"fails differently: {_short(v.observed.describe())}" + (f"; {_short(v.note, 400)}" if v.note else "")
    return ReleaseRun(version, SKIP, why, **common)  # type: ignore[arg-type]


def _magnitude(scores: Iterable[float]) -> float | None:
    """The largest output mismatch in multiples of the tolerance; None without one, or where it is not a number
    (an output of another shape scores infinity: there is no magnitude to say, and JSON has no infinity)."""
    largest = max((float(score) for score in scores), default=None)
    return largest if largest is not None and math.isfinite(largest) else None


def _short(text: str, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters (a crash message can fill a screen): its start and its
    end, where a crash message says why (ONNX Runtime puts a C++ signature between them).

    Example:
        >>> _short("Fail: Load model failed: model.cc Model::Model(" + "x" * 300 + ") Unsupported IR version: 10", 80)
        'Fail: Load model failed: model.cc Model … xxxxxxxxxx) Unsupported IR version: 10'
    """
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    tail = (limit - 3) // 2
    return f"{line[:limit - 3 - tail].rstrip()} … {line[-tail:].lstrip()}"


def _votes(votes: Mapping[str, int]) -> str:
    return ", ".join(f"{count} {verdict}" for verdict, count in sorted(votes.items()))


_STATUS = {FOUND: "found", OLDEST_CHANGED: "present-in-oldest", NEWEST_UNCHANGED: "absent-in-newest"}


def _result(package: str, find: str, spec: BackendSpec, recorded: str, versions: Sequence[str], *,
            change: Change, runner: _Runner, installs: int, oracle: str | None = None,
            oracle_runs: int = 0, evidence: ReleaseEvidence | None = None, trust: bool = False) -> ReleaseSearch:
    def at(index: int | None) -> str | None:
        return None if index is None else versions[index]

    # only a found change has a last good and a first bad: the oldest of all-bad releases is not the first bad one
    before, after = (at(change.last_no), at(change.first_yes)) if change.status == FOUND else (None, None)
    if find == "bad":
        last_good, first_bad, last_bad, first_fixed = before, after, None, None
    else:
        last_good, first_bad, last_bad, first_fixed = None, None, before, after
    tested = {v: runner.tested[v] for v in versions if v in runner.tested}
    changed = runner.what_changed(before, after) if before is not None and after is not None else None
    audit = runner.check(package, before, after, evidence, trust=trust) \
        if before is not None and after is not None and evidence is not None else None
    return ReleaseSearch(
        package=package, find=find, target=str(spec), recorded=recorded,
        versions=tuple(versions), status=_STATUS.get(change.status, "untestable"), last_good=last_good,
        first_bad=first_bad, last_bad=last_bad, first_fixed=first_fixed,
        skipped_between=tuple(versions[i] for i in change.unknown_between), tested=tested, installs=installs,
        runs=runner.runs, releases_run=sum(1 for run in tested.values() if run.runs > 0),
        python=f"Python {sys.version_info.major}.{sys.version_info.minor}, {platform.system()} {platform.machine()}",
        oracle=oracle, oracle_runs=oracle_runs, changed=changed, audit=audit)


def _paragraph(r: ReleaseSearch) -> str:
    return _paragraph_of(r) + _measured_words(r)


def _measured_words(r: ReleaseSearch) -> str:
    """For a ``command:`` target, which release each run measured in its environment (empty otherwise)."""
    if not _is_command(BackendSpec.parse(r.target)):
        return ""
    measured = {v: run.library_version for v, run in r.tested.items() if run.library_version is not None}
    asked = [v for v, library in measured.items() if v == library.split("+", 1)[0]]
    other = [f"the environment of {v} held {library} (a skip)" for v, library in measured.items() if v not in asked]
    return (" The command ran with each release's environment first on its PATH; the release there was measured by "
            "that environment's python (importlib.metadata), not assumed: "
            + "; ".join([f"{r.package} {', '.join(asked)} as asked"] * bool(asked) + other or ["none measured"])
            + ".")


def _paragraph_of(r: ReleaseSearch) -> str:
    span = f"{r.package} {r.versions[0]} to {r.versions[-1]} ({plural(len(r.versions), 'release')}, {r.python})"
    skips = [v for v, run in r.tested.items() if run.verdict == SKIP]
    cost = (f"{r.releases_run} releases run ({r.runs} runs), {len(skips)} skipped"
            + (f" ({', '.join(skips)})" if skips else "") + f"; found with graphbisect releases on target {r.target}"
            + (f" against the oracle {r.oracle} (run once)" if r.oracle else ""))
    failure = f"The failure ({r.recorded})"
    if r.found:
        new, old = (r.first_bad, r.last_good) if r.find == "bad" else (r.first_fixed, r.last_bad)
        bad = r.tested[new if r.find == "bad" else old]  # type: ignore[index]
        how = f" (max {bad.magnitude:.3g}× the tolerance)" if bad.magnitude is not None else ""
        verb = "first appears in" if r.find == "bad" else "is fixed in"
        where = f"{failure} {verb} {r.package} {new}: {old} is the last {'good' if r.find == 'bad' else 'bad'} " \
                f"release, {new} the first {'bad' if r.find == 'bad' else 'fixed'}; the bad one fails the same " \
                f"way{how}."
        held, checked = confirmed_words(r.audit)
        if not held:  # the search's answer, not a fact: the checker's plain runs say which claim fails
            where = f"The search names {r.package} {new} as the first {'bad' if r.find == 'bad' else 'fixed'} " \
                    f"release and {old} as the last {'good' if r.find == 'bad' else 'bad'} for the" + failure[3:] + "."
        where += f" {checked}" if checked else ""
        if r.skipped_between:
            where += f" Releases between them could not be tested ({', '.join(r.skipped_between)}): the change " \
                     "may be in one of them."
        if r.changed is not None:
            where += f" {r.changed.describe()}"
        return f"{where} Searched {span}: {cost}."
    if r.status == "present-in-oldest":
        oldest = next(v for v, run in r.tested.items() if run.verdict != SKIP)
        text = (f"{failure} is present in every release tested, from the oldest testable, {oldest}, to the newest: "
                "no release in the range is good, so there is nothing to bisect; the regression is older than "
                "the range" if r.find == "bad" else
                f"{failure} is already gone in the oldest testable release, {oldest}: nothing to bisect (the fix "
                "is older than the range)")
        return f"{text}. Searched {span}: {cost}."
    if r.status == "absent-in-newest":
        newest = next(v for v, run in reversed(list(r.tested.items())) if run.verdict != SKIP)
        text = (f"{failure} does not reproduce on the newest testable release, {newest}: nothing to bisect for "
                "the first bad release (look with --find fixed, or check the bundle's target)" if r.find == "bad"
                else f"{failure} is not fixed in any release tested: the newest testable, {newest}, still fails "
                "the same way")
        return f"{text}. Searched {span}: {cost}."
    return f"No release could be tested: every one was a skip. Searched {span}: {cost}."
