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

from typing import Any

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


def check_verdict(outcome: str, target: str, judged_by: str, bundle: LoadedBundle, *,
                  trust: bool = False) -> tuple[dict[str, Any], str | None]:
    """The checker's record (``audit``) of the verdict ``outcome`` that ``target`` was judged (by ``judged_by``)
    to show on ``bundle``, re-established with plain runs; and, where the checker finds it false, the note of an
    ``undecided`` verdict (None: the verdict stands, checked or said not checked)."""
    claim = verdict_claim(outcome, Configuration(target, bundle.model_path))
    why_not = (f"the bundle's failure is judged by {judged_by}, which the checker does not implement"
               if judged_by != JUDGE_TOLERANCE else
               "the verdict is undecided: it claims nothing" if claim is None else None)
    if why_not is not None or claim is None:
        return {"checked": False, "verdict": outcome, "holds": None, "why_not": why_not, "runs": {}}, None
    evidence = ReleaseEvidence(str(bundle.oracle), bundle.model_path, bundle.inputs, bundle.report,
                               Limits.from_report(bundle.report.get("tolerance")))
    audit = check_answer([claim], evidence, trust=trust)
    found = audit.claims[0]
    record: dict[str, Any] = {
        "checked": found.holds is not None, "verdict": outcome, "holds": found.holds, "claim": found.statement,
        "evidence": found.evidence, "why_not": None if found.holds is not None else found.evidence,
        "runs": audit.runs, "calls": {role: dict(c) for role, c in audit.calls.items()},
        "seconds": round(audit.seconds, 3),
        "note": "judged by the tolerance alone (the noise floor is not measured again)"}
    if found.holds is not False:
        return record, None
    return record, (f"the search said {outcome.upper()}, and the checker's plain runs do not confirm it: "
                    f"the claim \"{found.statement}\" does not hold ({found.evidence})")
