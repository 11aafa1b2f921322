"""What `graphbisect triage` may say: each model's verdict re-established by the trusted checker, and what the
grouping into distinct bugs rests on.

The triage (:mod:`graphbisect.workflows.triage`) decides each model's verdict with ``compare`` and groups the
failures by the search's key (:func:`graphbisect.triage.dedup.bug_key`). What a user reads per model — passed, or
FAILED with a kind of failure — is a claim about two plain runs, so :func:`check_outcome` states it as a
configuration (the target on the user's model file) and
:func:`graphbisect.checker.configurations.check_configurations` runs it, and the oracle once, with the model's
inputs: ``passed`` holds when the plain run is within the tolerance, ``failed (KIND)`` when it fails as that kind
(``unsupported``: a crash at load or run; that its message is a refusal is the search's reading). One oracle and
one target run per model, counted as the model's ``audit`` step.

The other per-model claims come with their own checks: the culprit passes are the passes search's claims, checked
by its own plain runs (``passes_audit``: the holds of its ``audit``), and the bundle is audited by reduce before it
is written (``bundle_audit``). The grouping is the search's: :func:`grouping_check` says, per bug, whether each
member's failure of the group's kind was re-established by its plain run, and what else the group rests on (the
reduced pattern, the crash message or what the target lacks, and the culprits: the search's word, over bundles
reduce audited). Two groups are distinct bugs by the search's key; a plain run re-establishes it only where
their kinds differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from graphbisect.checker.configurations import (
    FAILS,
    KINDS,
    PASSES,
    Configuration,
    ConfigurationClaim,
    check_configurations,
)
from graphbisect.compare import Tolerance
from graphbisect.triage.dedup import BugGroup
from graphbisect.triage.outcome import FAILED, PASSED, ModelOutcome
from graphbisect.workflows.passes_claims import limits_of

__all__ = ["check_outcome", "grouping_check", "not_established", "outcome_claim", "status_claim",
           "with_other_audits"]


def status_claim(outcome: ModelOutcome, target: Configuration) -> ConfigurationClaim:
    """The verdict ``outcome`` states (passed, or failed with its kind) as ``target``'s plain run."""
    if outcome.status == PASSED:
        return ConfigurationClaim("status", f"{outcome.name} passes: the target agrees with the oracle",
                                  ((target, PASSES),), ("the target",))
    kind = str((outcome.signature or {}).get("kind", ""))
    checked = kind if kind in KINDS else None
    statement = f"{outcome.name} fails ({kind})" + ("" if checked else f": that it is {kind or 'this kind'} is not "
                                                    "checked, only that it fails")
    return ConfigurationClaim("status", statement, ((target, FAILS),), ("the target",), kind=checked)


def check_outcome(outcome: ModelOutcome, *, oracle: str, target: str, model_of: Callable[[str], Path],
                  inputs: Mapping[str, Any], tolerance: Tolerance, timeout: float | None = None,
                  workdir: Path | None = None) -> ModelOutcome:
    """``outcome`` (passed or failed) with its verdict checked by plain runs of ``oracle`` and ``target`` on
    ``model_of(spec)`` with ``inputs``: ``audit`` holds the checker's record (and the passes search's and the
    bundle's audit verdicts), its runs the ``audit`` step of ``step_backend_calls`` (roles ``audit oracle``,
    ``audit target``)."""
    if outcome.status not in (PASSED, FAILED):
        return outcome
    claim = status_claim(outcome, Configuration(target, model_of(target)))
    audit = check_configurations(oracle, model_of(oracle), inputs, [claim], limits_of(tolerance), timeout=timeout,
                                 workdir=workdir)
    record: dict[str, Any] = audit.to_json()
    del record["bundle"]
    calls = {f"audit {role}": {**c, "compile_cache_hits": 0} for role, c in audit.calls.items()}
    runs = {f"audit {role}": n for role, n in audit.runs.items()}
    return dataclasses.replace(outcome, audit={**(outcome.audit or {}), **record},
                               step_invocations={**outcome.step_invocations, "audit": runs},
                               step_backend_calls={**outcome.step_backend_calls, "audit": calls})


def not_established(outcome: ModelOutcome, why: str) -> ModelOutcome:
    """``outcome`` with its verdict recorded as not established by the checker, and why."""
    claim = status_claim(outcome, Configuration("reference", outcome.source))
    record = {"holds": None, "claims": [{"id": claim.id, "claim": claim.statement, "holds": None, "evidence": why}]}
    return dataclasses.replace(outcome, audit={**(outcome.audit or {}), **record})


def outcome_claim(outcome: ModelOutcome) -> Mapping[str, Any] | None:
    """The checker's record of ``outcome``'s verdict (None: not checked, e.g. a record of an older triage)."""
    claims = (outcome.audit or {}).get("claims") or ()
    return next((c for c in claims if c.get("id") == "status"), None)


def grouping_check(bug: BugGroup, outcomes: Sequence[ModelOutcome]) -> dict[str, Any]:
    """What ``bug``'s grouping rests on: ``failures`` (every member's failure of the group's kind re-established
    by its plain run: True, False when one does not hold, None when one was not established), the members
    ``confirmed`` and ``not_confirmed`` (with the checker's verdict), ``bundles_audited`` (every member's bundle
    audit holds; None: some bundle was not audited or not established) and ``grouped_by`` (the search's key)."""
    members = [o for o in outcomes if o.name in set(bug.models)]
    held = {o.name: (outcome_claim(o) or {}).get("holds") for o in members}
    failures = False if False in held.values() else True if all(v is True for v in held.values()) else None
    audits = [(o.audit or {}).get("bundle_audit") for o in members if o.bundle]
    bundles = None if not audits else False if False in audits else True if all(a is True for a in audits) else None
    kind = str(bug.signature.get("kind", ""))
    by = (f"what the target lacks ({bug.lacks})" if bug.lacks else "the reduced pattern" if bug.pattern and
          kind not in ("crash-load", "crash-run", "unsupported") else "the crash message" if bug.pattern is None
          else "the crash message and reduced pattern")
    return {"failures": failures, "confirmed": [n for n, v in held.items() if v is True],
            "not_confirmed": [{"model": n, "holds": v} for n, v in held.items() if v is not True],
            "bundles_audited": bundles,
            "grouped_by": f"the search: the same kind ({kind}), {by} and culprit passes"}


def with_other_audits(outcome: ModelOutcome, passes_audit: Mapping[str, Any] | None,
                      bundle_audit: Mapping[str, Any] | None) -> ModelOutcome:
    """``outcome`` with the passes search's and the bundle's audit verdicts beside the checker's record."""
    record = dict(outcome.audit or {})
    if passes_audit is not None:
        record["passes_audit"] = passes_audit.get("holds")
    if bundle_audit is not None:
        record["bundle_audit"] = bundle_audit.get("holds")
    return dataclasses.replace(outcome, audit=record or None)
