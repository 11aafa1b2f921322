"""What `graphbisect verify` may say: its verdict, re-established by the trusted checker.

``verify`` decides with the search's own machinery (the failure signature, its identity, the recorded oracle
outputs). Its word is printed as a fact only once
:func:`graphbisect.checker.configurations.check_configurations` has run the target once plainly on the bundle's
model, against one plain run of the bundle's recorded oracle on the same model (not the recorded outputs), and
found the verdict's claim:

=====================  ============================================================================
verdict                claim on the bundle's model
=====================  ============================================================================
``reproduces``         the target fails the same way as the recorded failure (``report.json``, judged
                       by the checker's own rule, as ``graphbisect releases`` does)
``fixed``,             the target passes (within the tolerance)
``fixed-reduced``
``different``          the target fails, and not the same way as the recorded failure
=====================  ============================================================================

A claim the checker finds false makes the verdict ``undecided`` (the search's word and the checker's evidence
are both kept); where the checker cannot run (the recorded oracle is untrusted without ``trust``, a bundle judged
by a command's exit status or a Python check, a verdict that is already ``undecided``) the verdict stays and the
record says why it was not checked. The noise floor is not measured again: the checker judges by the tolerance.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from graphbisect.artifacts.bundle import LoadedBundle
from graphbisect.artifacts.repro import JUDGE_TOLERANCE
from graphbisect.checker.configurations import (
    FAILS,
    FAILS_SAME,
    NOT_SAME,
    PASSES,
    Configuration,
    ConfigurationClaim,
)
from graphbisect.checker.values import Limits
from graphbisect.workflows.releases_claims import ReleaseEvidence, check_answer

if TYPE_CHECKING:
    from graphbisect.workflows.verify import Verification

__all__ = ["check_verdict", "verdict_claim"]

#: The verdicts the checker re-establishes, and what the target's plain run must show for each.
_SHOWS = {"reproduces": ((FAILS_SAME,), "fails the same way as the recorded failure"),
          "fixed": ((PASSES,), "passes"), "fixed-reduced": ((PASSES,), "passes"),
          "different": ((FAILS, NOT_SAME), "fails, and not the same way as the recorded failure")}


def verdict_claim(outcome: str, configuration: Configuration) -> ConfigurationClaim | None:
    """The claim ``outcome`` makes of ``configuration`` (the target on the bundle's model); None for a verdict
    that claims nothing (``undecided``)."""
    if outcome not in _SHOWS:
        return None
    verdicts, words = _SHOWS[outcome]
    return ConfigurationClaim(outcome, f"{configuration.spec} {words} on the bundle's model",
                              tuple((configuration, v) for v in verdicts), tuple(f"the target ({v})" for v in verdicts))


def check_verdict(verification: Verification, bundle: LoadedBundle, *, trust: bool = False) -> Verification:
    """``verification`` with the checker's record (``audit``): its verdict re-established with plain runs, made
    ``undecided`` where the checker finds it false, kept (and said not checked) where the checker cannot run."""
    said = verification.outcome
    claim = verdict_claim(said, Configuration(str(verification.target), bundle.model_path))
    why_not = (f"the bundle's failure is judged by {verification.judged_by}, which the checker does not implement"
               if verification.judged_by != JUDGE_TOLERANCE else
               "the verdict is undecided: it claims nothing" if claim is None else None)
    if why_not is not None or claim is None:
        return dataclasses.replace(verification, audit={"checked": False, "verdict": said, "holds": None,
                                                        "why_not": why_not, "runs": {}})
    evidence = ReleaseEvidence(str(bundle.oracle), bundle.model_path, bundle.inputs, bundle.report,
                               Limits.from_report(bundle.report.get("tolerance")))
    audit = check_answer([claim], evidence, trust=trust)
    found = audit.claims[0]
    record: dict[str, Any] = {
        "checked": found.holds is not None, "verdict": said, "holds": found.holds, "claim": found.statement,
        "evidence": found.evidence, "why_not": None if found.holds is not None else found.evidence,
        "runs": audit.runs, "calls": {role: dict(c) for role, c in audit.calls.items()},
        "seconds": round(audit.seconds, 3),
        "note": "judged by the tolerance alone (the noise floor is not measured again)"}
    if found.holds is not False:
        return dataclasses.replace(verification, audit=record)
    note = (f"the search said {said.upper()}, and the checker's plain runs do not confirm it: "
            f"the claim \"{found.statement}\" does not hold ({found.evidence})")
    return dataclasses.replace(verification, outcome="undecided", audit=record,
                               note=note if verification.note is None else f"{note}. The search's note: "
                               f"{verification.note}")
