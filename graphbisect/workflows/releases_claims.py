"""What `graphbisect releases` may say: its answer's two claims, re-established by the trusted checker.

The release search (:mod:`graphbisect.workflows.releases`) decides each release with ``verify``'s machinery, a
vote over repeated runs and its own bookkeeping. Its answer rests on two claims, and only those are stated as
facts once :func:`graphbisect.checker.configurations.check_configurations` has run each once plainly, against
one plain run of the oracle on the same model:

=================  ===========================================================  =========================
claim              configuration                                                verdict
=================  ===========================================================  =========================
``first_bad``      the target at the first bad release (``python=`` its env)    fails the same way as
                                                                                the recorded failure
``last_good``      the target at the last good release                          passes
``last_bad``       (``--find fixed``) the target at the last bad release        fails the same way
``first_fixed``    (``--find fixed``) the target at the first fixed release     passes
=================  ===========================================================  =========================

"The recorded failure" is the bundle's ``report.json`` (or, on a model, the baseline release's failure written
the same way), judged by the checker's own rule, not by the search's signature. That is two target runs and
one oracle run per answer. The oracle is the bundle's recorded one, held to the trust rule (``--trust``), or
the model's ``--oracle``. A release's noise floor is not measured again: the checker judges by the tolerance
alone and its evidence says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphbisect.backends.registry import untrusted_options
from graphbisect.checker.audit import Audit, Claim
from graphbisect.checker.configurations import FAILS_SAME, PASSES, Configuration, ConfigurationClaim
from graphbisect.checker.values import Limits

__all__ = ["ReleaseEvidence", "audit_record", "check_answer", "confirmed_words", "release_claims"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ReleaseEvidence:
    """What the checker is given of a search: the ``oracle`` spec and the ``model`` file both run, the ``inputs``,
    the failure as a ``report.json`` records it (``recorded``; None: none of this model's), and the ``limits``."""

    oracle: str
    model: Path
    inputs: Mapping[str, Any]
    recorded: Mapping[str, Any] | None
    limits: Limits


def release_claims(package: str, find: str, older: str, newer: str, *, spec_of: Callable[[str], str],
                   model: Path) -> list[ConfigurationClaim]:
    """The two claims of an answer (``older`` the last good or last bad release, ``newer`` the first bad or first
    fixed), as configurations for the checker. ``spec_of(version)``: the target spec that release runs."""
    def at(version: str) -> Configuration:
        return Configuration(spec_of(version), model)

    if find == "bad":
        return [ConfigurationClaim("first_bad", f"{package} {newer} fails the same way as the recorded failure",
                                   ((at(newer), FAILS_SAME),), (newer,)),
                ConfigurationClaim("last_good", f"{package} {older} does not fail", ((at(older), PASSES),), (older,))]
    return [ConfigurationClaim("last_bad", f"{package} {older} fails the same way as the recorded failure",
                               ((at(older), FAILS_SAME),), (older,)),
            ConfigurationClaim("first_fixed", f"{package} {newer} does not fail", ((at(newer), PASSES),), (newer,))]


def check_answer(claims: list[ConfigurationClaim], evidence: ReleaseEvidence, *, trust: bool = False,
                 workdir: Path | None = None, say: Callable[[str], None] | None = None) -> Audit:
    """``claims`` checked with plain runs: the oracle once on its model, each release's target once. An oracle
    the trust rule does not let run (a bundle's recorded one, without ``trust``) runs nothing: every claim is
    then not established, and says why."""
    from graphbisect.checker.configurations import check_configurations

    oracle, recorded = evidence.oracle, evidence.recorded
    untrusted = untrusted_options(oracle)
    if untrusted and not trust:
        why = (f"the recorded oracle {oracle} sets options not known to be inert "
               f"({'; '.join(u.describe() for u in untrusted)}): not run without --trust")
        return Audit(str(evidence.model), tuple(Claim(c.id, c.statement, None, why) for c in claims), {}, 0.0)
    identity = (recorded or {}).get("identity") or {}
    compiled = identity.get("compiled_kind") if isinstance(identity, Mapping) else None
    compiled_as = (str(compiled), identity.get("made_by")) if compiled else None
    if say is not None:
        say(f"checking the answer's {len(claims)} claims with plain runs (the checker): the oracle {oracle} once, "
            "each release's target once")
    return check_configurations(oracle, evidence.model, evidence.inputs, claims, evidence.limits,
                                compiled_as=compiled_as, workdir=workdir, recorded=recorded)


def audit_record(audit: Audit) -> dict[str, Any]:
    """The checker's record for ``--json`` ``audit`` and a bundle's Releases section."""
    record: dict[str, Any] = audit.to_json()
    del record["bundle"]
    record["note"] = "each release judged by the tolerance alone (its noise floor is not measured again)"
    return record


def confirmed_words(audit: Mapping[str, Any] | None) -> tuple[bool, str]:
    """Whether every claim of an answer holds, and the sentence that says what the checker found (empty when no
    check ran)."""
    if not audit:
        return True, ""
    claims = list(audit.get("claims") or [])
    held = all(c.get("holds") is True for c in claims) and bool(claims)
    runs = audit.get("runs") or {}
    cost = f"{runs.get('target', 0)} target and {runs.get('oracle', 0)} oracle plain runs"
    if held:
        return True, f"The checker re-established both with {cost}: " + "; ".join(
            f"{c['claim']} ({_short(c['evidence'])})" for c in claims) + "."
    parts = [f"{c['claim']}: " + {True: "holds", False: "DOES NOT HOLD", None: "not established"}[c.get("holds")]
             + f" ({_short(c['evidence'])})" for c in claims]
    return False, f"NOT confirmed by the checker's {cost}: " + "; ".join(parts) + "."


def _short(text: str, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"

