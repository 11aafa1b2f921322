"""`verify`: does a bundle's recorded failure still reproduce (here, or on another version of the target)?

Re-runs the target (the bundle's spec, or another one: e.g. a newer ONNX Runtime through ``python=``) on
``model.onnx`` + ``inputs.npz`` in a fresh isolated worker, compares with ``oracle_outputs.npz`` under the
bundle's tolerance, and compares the resulting failure signature with the recorded one.

A run is judged as the reduction judged it (:func:`~graphbisect.artifacts.repro.judged_by`): a bundle of an
external check (a ``command`` target without ``{outputs}``) by the exit status alone, nothing compared; a
bundle of a Python output check (``reduce(check=callable)``, which no bundle holds) by that callable when the
caller passes it again (``check=``), else a completed run is ``undecided``: the tolerance may accept what the
check rejected, so it must not call the bug fixed (nor reproduced).
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from graphbisect.artifacts.bundle import BundleError, LoadedBundle
from graphbisect.artifacts.repro import (
    JUDGE_EXIT_STATUS,
    JUDGE_PYTHON_CHECK,
    JUDGE_TOLERANCE,
    crash_key,
    death_exit_code,
    judged_by,
)
from graphbisect.backends import BackendProcess, BackendSpec, RunResult
from graphbisect.compare import Comparison
from graphbisect.compare.nonfinite import warn_nonfinite_inputs
from graphbisect.errors import InputError
from graphbisect.oracle.signature import FailureKind, ModelNames, Signature
from graphbisect.oracle.tester import OutputCheck, judge

__all__ = ["DIFFERENT", "FIXED", "REPRODUCES", "UNDECIDED", "Verification", "runs_code", "verify_bundle"]

REPRODUCES, FIXED, DIFFERENT = "reproduces", "fixed", "different"
#: The target ran, but the recorded failure is a Python check's verdict and no check was given to re-judge it.
UNDECIDED = "undecided"


@dataclass(frozen=True)
class Verification:
    """The outcome of re-running a bundle's target."""

    outcome: str  # reproduces | fixed | different | undecided
    recorded: Signature
    observed: Signature
    target: BackendSpec
    run: RunResult
    comparison: Comparison | None
    note: str | None = None
    recorded_message: str | None = None  # the raw crash message in the bundle
    judged_by: str = JUDGE_TOLERANCE  # what judged a completed run (see graphbisect.artifacts.repro.judged_by)

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "judged_by": self.judged_by,
            "recorded": self.recorded.to_json(),
            "observed": self.observed.to_json(),
            "target": str(self.target),
            "run": self.run.describe(),
            "message": self.run.message,
            "library": {k: v for k, v in {**self.run.info, **self.run.ran_with}.items()
                        if k in ("library", "library_version")},
            "ran_with": dict(self.run.ran_with),  # measured in the worker (another interpreter's under python=)
            "outputs": [s.to_json() for s in self.comparison.outputs] if self.comparison is not None else [],
            "note": self.note,
        }


def verify_bundle(bundle: LoadedBundle, target: BackendSpec | str | None = None, *,
                  trust: bool = False, check: OutputCheck | None = None) -> Verification:
    """Re-run ``target`` (default: the recorded one) on the bundle and classify the result.

    The recorded target runs only with ``trust`` when it names a program or an interpreter: the bundle's
    author chose it (raises :class:`BundleError`). A ``target`` given here is the caller's own choice.
    ``check``: the Python output check the bundle was reduced with (``reduce(check=...)``), which judges a
    completed run as it did then; without it such a run is :data:`UNDECIDED`. Raises
    :class:`~graphbisect.errors.InputError` for a ``check`` on a bundle that no Python check judged.
    """
    spec = BackendSpec.parse(target) if isinstance(target, str) else (target or bundle.target)
    code = runs_code(spec)
    if target is None and code is not None and not trust:
        raise BundleError(
            f"the bundle's recorded target {spec} would run {code}, chosen by whoever wrote the bundle",
            hint="read the bundle's report.json; to run it anyway pass --trust, or name the target yourself "
            "with --target SPEC",
        )
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
    with tempfile.TemporaryDirectory(prefix="graphbisect-verify-") as workdir, \
            BackendProcess(spec, workdir=Path(workdir)) as backend:
        result = backend.run(bundle.model_path, bundle.inputs_path, outputs)
        verdict = judge(result, bundle.oracle_outputs.__getitem__, outputs, bundle.tolerance, regex, check=check,
                        names=names)
        # Copy what we need before the outputs' memory maps lose their folder.
        copied = {name: value.copy() for name, value in result.outputs.items()}
    result = dataclasses.replace(result, outputs=copied)
    if judged == JUDGE_PYTHON_CHECK and check is None and result.ok:
        return Verification(UNDECIDED, recorded, verdict.signature, backend.spec, result, verdict.comparison,
                            "the recorded failure is the verdict of a Python check (graphbisect.reduce(check=...)), "
                            "which a bundle cannot hold; the tolerance decides nothing here. Re-judge with "
                            "graphbisect.verify(BUNDLE, check=your_check)", bundle.target_message, judged)
    return dataclasses.replace(_classify(bundle, backend.spec, result, verdict.comparison, verdict.signature,
                                         recorded=recorded, names=names), judged_by=judged)


def runs_code(spec: BackendSpec) -> str | None:
    """What a spec runs beyond loading a model in a known library: a program or an interpreter, or None."""
    if spec.name == "command":
        return f"the program {spec.options.get('cmd', '')!r}"
    if "python" in spec.options:
        return f"the interpreter {spec.options['python']!r}"
    return None


def _classify(bundle: LoadedBundle, spec: BackendSpec, result: RunResult, comparison: Comparison | None,
              observed: Signature, *, recorded: Signature, names: Collection[str]) -> Verification:
    def verdict(outcome: str, note: str | None = None) -> Verification:
        return Verification(outcome, recorded, observed, spec, result, comparison, note, bundle.target_message)

    if recorded.matches(observed):
        return verdict(REPRODUCES)
    if _same_crash(bundle, recorded, observed, result, names):
        return verdict(REPRODUCES, "the crash message differs from the recorded one only in volatile details "
                       "(paths, line numbers, names)")
    if not observed.failed:
        return verdict(FIXED)
    return verdict(DIFFERENT, "the recorded failure is gone but the target fails differently: the bug may be "
                   "fixed while another one shows")


def _same_crash(bundle: LoadedBundle, recorded: Signature, observed: Signature, result: RunResult,
                names: Collection[str]) -> bool:
    """Same crash kind, and the recorded message's stable part is in the new one (see repro.crash_key)."""
    if recorded.kind is not observed.kind or not recorded.kind.raised:
        return False
    status = death_exit_code(recorded.detail, *_split(recorded.detail))
    if status is not None:  # a death or a command's exit status: the number, not a prefix ("code 1" of "13")
        return death_exit_code(observed.detail, result.error_type or "", result.message or "") == status
    expected = crash_key(bundle.target_message or recorded.detail, names)
    actual = crash_key(f"{result.error_type}: {result.message}", names)
    return bool(expected) and expected in actual


def _split(detail: str) -> tuple[str, str]:
    """A crash signature's ``"<ErrorType>: <message>"`` as (error type, message)."""
    error_type, _, message = detail.partition(": ")
    return error_type, message
