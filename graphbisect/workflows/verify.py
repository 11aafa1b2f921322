"""`verify`: does a bundle's recorded failure still reproduce (here, or on another version of the target)?

Re-runs the target (the bundle's spec, or another one: e.g. a newer ONNX Runtime through ``python=``) on
``model.onnx`` + ``inputs.npz`` in a fresh isolated worker, compares with ``oracle_outputs.npz`` under the
bundle's tolerance, and compares the resulting failure signature with the recorded one.

A run is judged as the reduction judged it (:func:`~graphbisect.artifacts.repro.judged_by`): a bundle of an
external check (a ``command`` target without ``{outputs}``) by the exit status alone, nothing compared; a
bundle of a Python output check (``reduce(check=callable)``, which no bundle holds) by that callable when the
caller passes it again (``check=``), else a completed run is ``undecided``: the tolerance may accept what the
check rejected, so it must not call the bug fixed (nor reproduced).

A bundle is data (the trust rule), and so is every spec it records: the recorded target (which this re-runs)
and the recorded oracle (which :func:`recheck_original` runs on the user's model) run only when every option
of them is known to be inert (:func:`~graphbisect.backends.registry.untrusted_options`: no program,
interpreter, library or file it names), else only with ``trust``. One check decides for each of them,
wherever it is about to run: :func:`require_trust`. A spec the caller names is the caller's own choice.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from graphbisect.artifacts.bundle import BundleError, LoadedBundle
from graphbisect.artifacts.bundle_read import require_recorded_backend
from graphbisect.artifacts.repro import (
    JUDGE_EXIT_STATUS,
    JUDGE_PYTHON_CHECK,
    JUDGE_TOLERANCE,
    TACTICS_FILE,
    crash_key,
    death_exit_code,
    judged_by,
)
from graphbisect.backends import BackendProcess, BackendSpec, RunResult
from graphbisect.backends.cost import CallTally
from graphbisect.backends.inert import Untrusted
from graphbisect.backends.registry import untrusted_options
from graphbisect.compare import Comparison, TensorStats
from graphbisect.compare.nonfinite import warn_nonfinite_inputs
from graphbisect.errors import InputError
from graphbisect.localize.compiled import compiled_graph
from graphbisect.oracle.floor import NoiseFloor
from graphbisect.oracle.identity import IdentityCheck
from graphbisect.oracle.signature import FailureKind, ModelNames, Signature, without_status
from graphbisect.oracle.tester import Judgement, OutputCheck, judge
from graphbisect.workflows.probe import describing_spec
from graphbisect.workflows.verify_claims import check_verdict

__all__ = ["DIFFERENT", "FIXED", "FIXED_REDUCED", "RECORDED_ROLES", "REPRODUCES", "UNDECIDED", "Verification",
           "another_release", "recheck_original", "recorded_spec", "require_trust", "untrusted_target",
           "verify_bundle"]

REPRODUCES, FIXED, DIFFERENT = "reproduces", "fixed", "different"
#: The reduced model no longer fails, but nothing shows that the user's model is fixed: the bundle's failure was
#: matched by its kind alone (a reduction by kind may drift to another defect of the same kind, e.g. a sibling
#: fusion's), and the original was not re-checked (``--model``). Never "fixed" to a CI job (exit 4).
FIXED_REDUCED = "fixed-reduced"
#: The target ran, but the recorded failure is a Python check's verdict and no check was given to re-judge it; or
#: the checker's plain runs (:mod:`graphbisect.workflows.verify_claims`) did not confirm the search's verdict.
UNDECIDED = "undecided"


@dataclass(frozen=True)
class Verification:
    """The outcome of re-running a bundle's target."""

    outcome: str  # reproduces | fixed | fixed-reduced | different | undecided
    recorded: Signature
    observed: Signature
    target: BackendSpec
    run: RunResult
    comparison: Comparison | None
    note: str | None = None
    recorded_message: str | None = None  # the raw crash message in the bundle
    judged_by: str = JUDGE_TOLERANCE  # what judged a completed run (see graphbisect.artifacts.repro.judged_by)
    #: the model the bundle was reduced from, re-checked (``verify --model``): ``failed``, ``outcome``,
    #: ``first_divergence``; None when not asked
    original: Mapping[str, Any] | None = None
    #: role -> {"runs", "compiles", "compile_cache_hits"}: every backend call, compiles included
    #: (:mod:`graphbisect.backends.cost`): the target's run, and with ``original`` its comparison's runs
    backend_calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: the checker's record of the verdict (:mod:`graphbisect.workflows.verify_claims`): ``checked``, ``verdict``
    #: (the search's word), ``holds``, ``evidence`` or ``why_not``, ``runs`` (its plain runs); None: not asked
    audit: Mapping[str, Any] | None = None

    @property
    def invocations(self) -> dict[str, int]:
        """{role: runs} (:attr:`backend_calls`' runs)."""
        return CallTally.from_json(self.backend_calls).runs()

    # The --json fields that are the run's, as typed attributes.
    @property
    def message(self) -> str | None:
        """The run's error message (None when it completed)."""
        return self.run.message

    @property
    def library(self) -> dict[str, Any]:
        """The backend library and its version that ran (``library``, ``library_version``)."""
        return {k: v for k, v in {**self.run.info, **self.run.ran_with}.items() if k in ("library", "library_version")}

    @property
    def ran_with(self) -> Mapping[str, Any]:
        """What ran it, measured in the worker (another interpreter's under ``python=``): :attr:`RunResult.ran_with`."""
        return self.run.ran_with

    @property
    def outputs(self) -> tuple[TensorStats, ...]:
        """How each output compares with the bundle's expected values (empty when the run failed)."""
        return self.comparison.outputs if self.comparison is not None else ()

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "judged_by": self.judged_by,
            "recorded": self.recorded.to_json(),
            "observed": self.observed.to_json(),
            "target": str(self.target),
            "run": self.run.describe(),
            "message": self.message,
            "library": self.library,
            "ran_with": dict(self.ran_with),
            "outputs": [s.to_json() for s in self.outputs],
            "note": self.note,
            "original": None if self.original is None else dict(self.original),
            "invocations": self.invocations,
            "backend_calls": {role: dict(calls) for role, calls in self.backend_calls.items()},
            "audit": None if self.audit is None else dict(self.audit),
        }


def verify_bundle(bundle: LoadedBundle, target: BackendSpec | str | None = None, *,
                  trust: bool = False, check: OutputCheck | None = None, checked: bool = True) -> Verification:
    """Re-run ``target`` (default: the recorded one) on the bundle and classify the result.

    The recorded target runs only with ``trust`` when an option of it is not known to be inert (a program,
    an interpreter, a session config key or compiler flag that names a file: :func:`require_trust`): the
    bundle's author chose it (raises :class:`BundleError` naming each one). A ``target`` given here is the
    caller's own choice.
    ``check``: the Python output check the bundle was reduced with (``reduce(check=...)``), which judges a
    completed run as it did then; without it such a run is :data:`UNDECIDED`. Raises
    :class:`~graphbisect.errors.InputError` for a ``check`` on a bundle that no Python check judged.
    The verdict is then re-established by the checker (:func:`~graphbisect.workflows.verify_claims.check_verdict`:
    :attr:`Verification.audit`), and is :data:`UNDECIDED` where the checker finds it false. ``checked=False``: not
    (a search that runs verify's rules on its candidates — a release, a pass set — and has the checker
    re-establish only the answer it states).
    """
    spec = BackendSpec.parse(target) if isinstance(target, str) else (target or bundle.target)
    require_trust(bundle, ["target"] if target is None else [], trust=trust)
    # The bundle model's names leave every crash message compared here, the recorded one too (a bundle written
    # before names were taken out still has them in its signature).
    names = ModelNames(onnx.load(str(bundle.model_path), load_external_data=False))
    recorded = bundle.signature.without_names(names)
    judged = judged_by(recorded, spec)
    if check is not None and judged != JUDGE_PYTHON_CHECK:
        raise InputError(f"this bundle's failure ({recorded.describe()}) was not judged by a Python check, so a "
                         "check cannot re-judge it", hint="verify it without check=")
    warn_nonfinite_inputs(bundle.inputs)
    regex = re.compile(recorded.detail) if recorded.kind is FailureKind.REGEX else None
    # an external check's exit status is the verdict: nothing to compare (the reduction compared nothing)
    outputs = [] if judged == JUDGE_EXIT_STATUS else list(bundle.oracle_outputs)
    floor = NoiseFloor.from_json(bundle.report["noise_floor"]) if bundle.report.get("noise_floor") else None
    identity = IdentityCheck.of_bundle(bundle.report.get("identity"))
    describes = identity is not None and identity.identity.compiled_kind is not None
    run_spec = (describing_spec(spec) or spec) if describes else spec
    with tempfile.TemporaryDirectory(prefix="graphbisect-verify-") as workdir, \
            BackendProcess(run_spec, workdir=Path(workdir)) as backend:
        result = backend.run(bundle.model_path, bundle.inputs_path, outputs)
        verdict = judge(result, bundle.oracle_outputs.__getitem__, outputs, bundle.tolerance, regex, check=check,
                        floor=floor, names=names)
        releases = another_release(bundle, result)
        other, how = _other_identity(bundle, identity, verdict, across_releases=releases is not None) \
            if recorded.matches(verdict.signature) else (None, None)
        # Copy what we need before the outputs' memory maps lose their folder.
        copied = {name: value.copy() for name, value in result.outputs.items()}
        calls = {"target": backend.cost.to_json()}
    result = dataclasses.replace(result, outputs=copied)
    if judged == JUDGE_PYTHON_CHECK and check is None and result.ok:
        return _checked(Verification(UNDECIDED, recorded, verdict.signature, spec, result, verdict.comparison,
                            "the recorded failure is the verdict of a Python check (graphbisect.reduce(check=...)), "
                            "which a bundle cannot hold; the tolerance decides nothing here. Re-judge with "
                            "graphbisect.verify(BUNDLE, check=your_check)", bundle.target_message, judged,
                            backend_calls=calls), bundle, trust=trust, checked=checked)
    decided = dataclasses.replace(_classify(bundle, spec, result, verdict.comparison, verdict.signature,
                                            recorded=recorded, names=names, other_identity=other, releases=releases,
                                            same_note=how), judged_by=judged, backend_calls=calls)
    return _checked(decided, bundle, trust=trust, checked=checked)


def _checked(verification: Verification, bundle: LoadedBundle, *, trust: bool, checked: bool = True
             ) -> Verification:
    """``verification`` with the checker's record (``audit``); :data:`UNDECIDED`, with the search's word and the
    checker's evidence in its note, where the checker's plain runs find the verdict false. ``checked=False``: as
    it is (no ``audit``)."""
    if not checked:
        return verification
    record, refuted = check_verdict(verification.outcome, str(verification.target), verification.judged_by, bundle,
                                    trust=trust)
    if refuted is None:
        return dataclasses.replace(verification, audit=record)
    note = refuted if verification.note is None else f"{refuted}. The search's note: {verification.note}"
    return dataclasses.replace(verification, outcome=UNDECIDED, note=note, audit=record)


def another_release(bundle: LoadedBundle, result: RunResult) -> str | None:
    """``"1.22.1 → 1.32.0"`` when ``result`` ran another release of the target's library than the bundle
    records, else None (the same, or either unknown). On another release the names a failure shows may change
    while the failure stays (a fused node's name, an error type): it is then matched by what stays
    (:mod:`graphbisect.oracle.identity`, :func:`~graphbisect.oracle.signature.without_status`)."""
    ran = {**result.info, **result.ran_with}
    library, version = ran.get("library"), ran.get("library_version")
    recorded = _recorded_library_version(bundle.report, str(library) if library else None)
    if version is None or recorded is None or str(version) == recorded:
        return None
    return f"{recorded} → {version}"


def _recorded_library_version(report: Mapping[str, Any], library: str | None) -> str | None:
    """The version of ``library`` the bundle's target ran (``report.json`` ``versions.target``), or None."""
    versions = report.get("versions")
    target = versions.get("target") if isinstance(versions, Mapping) else None
    if not isinstance(target, Mapping) or not isinstance(target.get("library_version"), str):
        return None
    if library is not None and target.get("library") not in (None, library):
        return None
    return str(target["library_version"])


def _other_identity(bundle: LoadedBundle, identity: IdentityCheck | None, verdict: Judgement, *,
                    across_releases: bool = False) -> tuple[str | None, str | None]:
    """(why a run failing like the bundle by kind is another failure, how it matched on another release where the
    names differ): (None, None) for the same failure by the same names, or no identity recorded."""
    if identity is None or verdict.comparison is None:
        return None, None
    compiled = None
    if identity.identity.compiled_kind is not None and verdict.run.ok:
        proto = onnx.load(str(bundle.model_path), load_external_data=False)
        compiled = compiled_graph(proto.graph.node, list(bundle.oracle_outputs), verdict.run.info,
                                  constants={t.name: t for t in proto.graph.initializer})
    differs = identity.differs(verdict.failing, {s.name: s for s in verdict.comparison.outputs}, compiled,
                               across_releases=across_releases)
    return differs, None if differs is not None else identity.release_note(compiled)


def recheck_original(verification: Verification, bundle: LoadedBundle, model: Path, *,
                     inputs: Mapping[str, Any] | None = None, seed: int = 0, oracle: BackendSpec | str | None = None,
                     trust: bool = False) -> Verification:
    """``verification`` with the model the bundle was reduced from re-checked on the same target, oracle and
    tolerance (``graphbisect verify --model``): a fixed bundle does not mean a fixed model (the same defect may
    reach it through a sibling pass, or another site fail). ``inputs``: the model's inputs (default: the seeded
    random inputs `reduce` draws without ``--inputs``).

    The oracle runs here (the bundle's check compared its recorded outputs): ``oracle``, the caller's own
    choice, else the bundle's recorded one, which runs only with ``trust`` when an option of it is not known to
    be inert (:func:`require_trust`; raises :class:`BundleError` naming each one). The target is
    ``verification``'s, which :func:`verify_bundle` already held to the rule.
    """
    from graphbisect.model import load_model
    from graphbisect.workflows.compare import compare_models

    require_trust(bundle, ["oracle"] if oracle is None else [], trust=trust)
    oracle_spec = BackendSpec.parse(oracle) if isinstance(oracle, str) else (oracle or bundle.oracle)
    loaded = load_model(model)
    recorded = bundle.report.get("original_model") or {}
    same = recorded.get("fingerprint") in (None, loaded.fingerprint)
    result = compare_models(loaded, oracle=oracle_spec, target=verification.target, inputs=inputs,
                            tolerance=bundle.tolerance, seed=seed)
    first = result.layerwise.first_divergence if result.layerwise is not None else None
    original = {
        "model": str(model), "oracle": str(oracle_spec), "failed": not result.passed, "outcome": str(result.outcome),
        "recorded_model": same,
        "first_divergence": None if first is None else {
            "node": first.node, "tensor": first.tensor, "score": first.stats.score,
            "compiled_as": None if first.compiled_as is None else first.compiled_as.describe()},
        "noise_floor": None if result.noise_floor is None else result.noise_floor.describe(),
    }
    calls = CallTally.from_json(verification.backend_calls)
    calls.merge(CallTally.from_json(result.backend_calls))  # the comparison's oracle and target runs
    outcome, note = verification.outcome, verification.note
    if outcome in (FIXED, FIXED_REDUCED):
        note = None  # their notes advise re-checking the original (recheck_note, _fix_not_shown): done now
        if outcome == FIXED_REDUCED and same and result.passed:  # the user's own model shows it: fixed
            outcome = FIXED
        elif outcome == FIXED_REDUCED and not same:
            note = (f"{model} is not the model this bundle was reduced from (another fingerprint): its run shows "
                    "nothing about that model; re-check with the original")
    audit = verification.audit if verification.audit is None else {
        **verification.audit, "original": "not checked by the checker: the original's verdict is this comparison's"}
    return dataclasses.replace(verification, outcome=outcome, note=note, original=original,
                               backend_calls=calls.to_json(), audit=audit)


#: The roles of the specs a bundle records (``report.json``) that ``verify`` may run: the target (re-run on the
#: bundle) and the oracle (run on the user's model by :func:`recheck_original`). A bundle records no other spec
#: that graphbisect runs: the control of the passes section (``passes.bundle_control``) is a fact of the report,
#: and the control ``repro.py`` runs is in ``repro_config.json``, which ``repro.py`` holds to the same rules.
RECORDED_ROLES = ("target", "oracle")


def recorded_spec(bundle: LoadedBundle, role: str) -> BackendSpec:
    """The spec ``bundle`` records for ``role`` (one of :data:`RECORDED_ROLES`)."""
    if role not in RECORDED_ROLES:
        raise ValueError(f"a bundle records no spec that runs as {role!r} (roles: {', '.join(RECORDED_ROLES)})")
    spec: BackendSpec = getattr(bundle, role)
    return spec


def require_trust(bundle: LoadedBundle, roles: Iterable[str], *, trust: bool = False) -> dict[str, list[Untrusted]]:
    """The trust rule for every spec a bundle supplies, one check wherever a recorded spec is about to run.

    ``roles``: the roles (:data:`RECORDED_ROLES`) whose recorded spec is about to run; a spec the caller names
    instead is the caller's own choice, so leave its role out. Returns role -> the options of its recorded spec
    that are not known to be inert (:func:`~graphbisect.backends.registry.untrusted_options`; the bundle's own
    tactic record is inert), roles with none left out: what runs on the caller's word with ``trust``, to warn
    of. Without ``trust`` raises :class:`BundleError` naming each, before anything runs.
    """
    for role in dict.fromkeys(roles):  # a custom backend this process lacks: say how to register it (exit 2)
        require_recorded_backend(recorded_spec(bundle, role), bundle.path, bundle.source)
    own_files = [str(bundle.path / TACTICS_FILE)]
    found = {role: untrusted for role in dict.fromkeys(roles)
             if (untrusted := untrusted_options(recorded_spec(bundle, role), own_files=own_files))}
    if found and not trust:
        listed = "".join(f"\n  recorded {role} {recorded_spec(bundle, role)}:" + "".join(
            f"\n    {u.describe()}" for u in untrusted) for role, untrusted in found.items())
        names = " and ".join(found)
        yourself = " and ".join(_NAME_IT[role] for role in found)
        raise BundleError(
            f"the bundle's recorded {names} {'sets' if len(found) == 1 else 'set'} options not known to be inert "
            f"(they may run a program, load a library or write a file), chosen by whoever wrote the bundle:{listed}",
            hint=f"read the bundle's report.json; to run it anyway pass --trust (trust=True), or name the "
            f"{names} yourself with {yourself}",
        )
    return found


#: How a caller names the spec of a role instead of the recorded one.
_NAME_IT = {"target": "--target SPEC", "oracle": "--oracle SPEC"}


def untrusted_target(bundle: LoadedBundle) -> list[Untrusted]:
    """The options of the bundle's recorded target that are not known to be inert (:func:`require_trust`'s
    rule for the target)."""
    return require_trust(bundle, ["target"], trust=True).get("target", [])


def _classify(bundle: LoadedBundle, spec: BackendSpec, result: RunResult, comparison: Comparison | None,
              observed: Signature, *, recorded: Signature, names: Collection[str],
              other_identity: str | None = None, releases: str | None = None,
              same_note: str | None = None) -> Verification:
    def verdict(outcome: str, note: str | None = None) -> Verification:
        return Verification(outcome, recorded, observed, spec, result, comparison, note, bundle.target_message)

    if other_identity is not None:
        return verdict(DIFFERENT, f"the same kind of failure, but not the recorded one ({_identity_text(bundle)}): "
                       f"{other_identity}. The recorded bug may be fixed while another one shows")
    if recorded.matches(observed):
        return verdict(REPRODUCES, None if same_note is None else f"on another release ({releases}): {same_note}")
    if _same_crash(bundle, recorded, observed, result, names):
        return verdict(REPRODUCES, "the crash message differs from the recorded one only in volatile details "
                       "(paths, line numbers, names)")
    if releases is not None and _same_crash(bundle, recorded, observed, result, names, statuses=False):
        return verdict(REPRODUCES, f"on another release ({releases}) the same crash is raised as "
                       f"{result.error_type or 'another error'} where the bundle records "
                       f"{_split(recorded.detail)[0]}: the message is the same without the error type and status")
    if not observed.failed:
        unshown = _fix_not_shown(bundle.report, recorded)
        if unshown is not None:
            return verdict(FIXED_REDUCED, unshown)
        return verdict(FIXED, recheck_note(bundle.report))
    return verdict(DIFFERENT, "the recorded failure is gone but the target fails differently: the bug may be "
                   "fixed while another one shows")


def _identity_text(bundle: LoadedBundle) -> str:
    record = bundle.report.get("identity") or {}
    return str(record.get("describe") or bundle.signature.describe())


def _fix_not_shown(report: Mapping[str, Any], recorded: Signature) -> str | None:
    """Why the reduced model's passing run does not show the user's model fixed (None: it does).

    It does when the bundle is the whole model, or when its failure carries an identity that every run of the
    reduction re-established (where it first goes wrong and what made it, or a crash's normalized message) and
    the checker (``report.json`` ``audit``) did not find that identity false. A failure matched by its kind alone
    does not: the reduction may have kept another defect of the same kind (a sibling pass's fusion) and
    dropped the user's."""
    original, final = report.get("original_nodes"), report.get("final_nodes")
    if not isinstance(original, int) or not isinstance(final, int) or original <= final:
        return None  # not reduced: the bundle's model is the user's
    identity = report.get("identity")
    by_identity = isinstance(identity, Mapping) and identity.get("matched_by") == "identity"
    audit = report.get("audit")
    claims = audit.get("claims") if isinstance(audit, Mapping) else None
    refuted = any(isinstance(c, Mapping) and c.get("id") == "identity" and c.get("holds") is False
                  for c in claims or ())
    if (by_identity or recorded.kind.raised) and not refuted:
        return None
    how = (str(identity.get("describe")) if isinstance(identity, Mapping) and identity.get("describe")
           else "the failure's kind")
    why = "the checker found the recorded identity false" if refuted else f"its failure was matched by kind: {how}"
    return (f"fixed on the reduced model, not shown for the original: this bundle is {final} of the {original} "
            f"nodes of the model it was reduced from, and {why}. The same kind of failure on a part of the model "
            "may be another defect than the user's; re-check the original: graphbisect verify BUNDLE --model "
            "ORIGINAL.onnx (exit 0 only when it passes)")


def recheck_note(report: Mapping[str, Any]) -> str | None:
    """What a FIXED bundle reduced from a larger model says: its model is a part of the user's, which other
    parts may still make fail (the same defect reached through a sibling pass, another site)."""
    original, final = report.get("original_nodes"), report.get("final_nodes")
    if not isinstance(original, int) or not isinstance(final, int) or original <= final:
        return None
    return (f"this bundle is {final} of the {original} nodes of the model it was reduced from: re-check that model, "
            "which may still fail another way (graphbisect verify BUNDLE --model ORIGINAL.onnx)")


def _same_crash(bundle: LoadedBundle, recorded: Signature, observed: Signature, result: RunResult,
                names: Collection[str], *, statuses: bool = True) -> bool:
    """Same crash kind, and the recorded message's stable part is in the new one (see repro.crash_key); without
    ``statuses``, both without their error type and status codes (:func:`without_status`: another release)."""
    if recorded.kind is not observed.kind or not recorded.kind.raised:
        return False
    status = death_exit_code(recorded.detail, *_split(recorded.detail))
    if status is not None:  # a death or a command's exit status: the number, not a prefix ("code 1" of "13")
        return death_exit_code(observed.detail, result.error_type or "", result.message or "") == status
    expected = crash_key(bundle.target_message or recorded.detail, names)
    actual = crash_key(f"{result.error_type}: {result.message}", names)
    if not statuses:
        expected, actual = without_status(expected), without_status(actual)
    return bool(expected) and expected in actual


def _split(detail: str) -> tuple[str, str]:
    """A crash signature's ``"<ErrorType>: <message>"`` as (error type, message)."""
    error_type, _, message = detail.partition(": ")
    return error_type, message
