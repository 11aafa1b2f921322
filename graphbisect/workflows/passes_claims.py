"""What `graphbisect passes` may say: its answer's claims, re-established by the trusted checker.

The pass search (:mod:`graphbisect.workflows.passes`) decides on probed runs, region replays, a warm worker and
an outcome cache. Its answer is a few configurations of the target — the target as given, the workaround
(culprits disabled), the culprit spec (only the enable-set enabled) and their single-pass neighbours — and
:func:`passes_claims` writes each claim the command prints as those configurations with the verdict the search
claims for them; :func:`graphbisect.checker.configurations.check_configurations` runs each once plainly, on the
whole model, against one plain oracle run. :func:`audited_fields` then states only what holds: ``minimal`` is true
only when both minimality claims hold, and every claim that does not hold (or could not be run) gets a note.

The claims and their configurations (``T`` the target as given, ``F`` the workaround, ``C`` the culprit spec):

======================  ==========================================================  ===========================
claim                   configurations                                              verdict
======================  ==========================================================  ===========================
``failure``             ``T``                                                       fails
``identity``            ``T`` (where the search knows what it compiled the region)  fails as compiled so
``workaround``          ``F``                                                       passes
``disable_minimal``     ``F`` with one culprit enabled again, for each culprit      fails
``reproduces``          ``C``                                                       fails the same way as ``T``
``enable_minimal``      ``C`` with one required pass disabled too, for each         does not fail the same way
``alone``               each "reproduces on its own" pass as the only one enabled   fails the same way as ``T``
``unexplained``         ``T`` with every searched pass disabled                     fails
``no_failure``          ``T`` (a target that does not fail)                         passes
======================  ==========================================================  ===========================

The configurations are run distinct (``F`` minus its only culprit is ``T``): about ``2 + |culprits| +
|required|`` target runs and one oracle run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from graphbisect.backends import BackendSpec
from graphbisect.checker.audit import Audit
from graphbisect.checker.configurations import (
    FAILS,
    FAILS_SAME,
    NOT_SAME,
    PASSES,
    Configuration,
    ConfigurationClaim,
)
from graphbisect.checker.values import Limits
from graphbisect.compare import Tolerance
from graphbisect.strategies.passes import control_for

__all__ = ["MINIMALITY", "audited_fields", "limits_of", "passes_claims", "with_disabled"]

#: The claims ``minimal`` rests on: both sets do what they are said to (the workaround passes, the culprit spec
#: fails the same way) and each of their passes is needed; any that does not hold withdraws it.
MINIMALITY = ("workaround", "disable_minimal", "reproduces", "enable_minimal")


def limits_of(tol: Tolerance) -> Limits:
    """The checker's reading of a search's tolerance (the fields a bundle's ``report.json`` writes)."""
    return Limits.from_report({"atol": tol.atol, "rtol": tol.rtol, "min_cosine": tol.min_cosine,
                               "per_output": {name: list(pair) for name, pair in tol.per_output.items()},
                               "check_dtype": tol.check_dtype, "int_atol": tol.int_atol,
                               "quantized": dict(tol.quantized)})


def _disabled(spec_text: str) -> tuple[BackendSpec, str, list[str]]:
    spec = BackendSpec.parse(spec_text)
    option = control_for(spec).disable_option
    return spec, option, spec.option_list(option)


def with_disabled(spec_text: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()) -> str:
    """``spec_text`` with the passes ``add`` disabled too and ``remove`` no longer disabled.

    Example:
        >>> with_disabled("onnxruntime:opt_level=all,disabled=A;B", remove=["A"], add=["C"])
        'onnxruntime:disabled=B;C,opt_level=all'
    """
    spec, option, names = _disabled(spec_text)
    kept = [n for n in dict.fromkeys([*names, *add]) if n not in set(remove)]
    return str(spec.with_options(**{option: ";".join(kept) or None}))


def passes_claims(data: Mapping[str, Any], model_of: Callable[[str], Path],
                  compiled_as: tuple[str, str | None] | None = None) -> list[ConfigurationClaim]:
    """The claims an answer states — its ``--json`` ``data`` (``PassesResult.to_json()``), what a user reads — as
    configurations for the checker. ``model_of(spec)``: the file a spec runs (the ONNX model, or the Paddle model
    for Paddle Inference). ``compiled_as``: what the search matched the failure by (the compiled node's kind, the
    pass that made it), where it did."""

    def config(spec: str) -> Configuration:
        return Configuration(spec, model_of(spec))

    target = str(data["target"])
    given = config(target)
    if not data["failed"]:
        return [ConfigurationClaim("no_failure", f"the target {target} does not fail", ((given, PASSES),),
                                   ("the target as given",))]
    kind = data["signature"]["kind"]
    claims = [ConfigurationClaim("failure", f"the target {target} fails ({kind})", ((given, FAILS),),
                                 ("the target as given",))]
    if compiled_as is not None:
        compiled, made_by = compiled_as
        made = f" made by {made_by}" if made_by else ""
        claims.append(ConfigurationClaim("identity", f"the target compiles the failing region as {compiled}{made}",
                                         ((given, FAILS_SAME),), ("the target as given",)))
    culprits, required, alone = list(data["culprits"]), list(data["required"]), list(data["each_alone"])
    fixed, culprit, searched = data["fixed_target"], data["culprit_target"], list(data["searched"])
    if not culprits or fixed is None or culprit is None:
        if searched and data["source"] != "not listed":
            every = config(with_disabled(target, add=searched))
            claims.append(ConfigurationClaim(
                "unexplained", f"with all {len(searched)} searched passes disabled the target still fails: no set "
                "of passes explains the failure", ((every, FAILS),), ("every searched pass disabled",)))
        return claims
    claims.append(ConfigurationClaim("workaround", f"with {', '.join(culprits)} disabled the failure disappears",
                                     ((config(fixed), PASSES),), (f"the workaround {fixed}",)))
    if data["minimal"]:
        claims.append(ConfigurationClaim(
            "disable_minimal", "each culprit is needed: with any one of them enabled again the target still fails",
            tuple((config(with_disabled(fixed, remove=[c])), FAILS) for c in culprits),
            tuple(f"{c} enabled again" for c in culprits)))
    claims.append(ConfigurationClaim(
        "reproduces", f"with only {', '.join(required)} enabled (of the passes searched) the target fails the same "
        "way", ((config(culprit), FAILS_SAME),), (f"only {', '.join(required)} enabled",)))
    if data["minimal"]:
        claims.append(ConfigurationClaim(
            "enable_minimal", "each required pass is needed: with any one of them disabled too the failure "
            "disappears or changes", tuple((config(with_disabled(culprit, add=[r])), NOT_SAME) for r in required),
            tuple(f"{r} disabled too" for r in required)))
    if alone:
        everything = [*_disabled(culprit)[2], *required]
        claims.append(ConfigurationClaim(
            "alone", f"{', '.join(alone)} reproduce{'s' if len(alone) == 1 else ''} the failure as the only pass "
            "enabled (of those searched)",
            tuple((config(with_disabled(culprit, add=everything, remove=[c])), FAILS_SAME) for c in alone),
            tuple(f"only {c} enabled" for c in alone)))
    return claims


def audited_fields(data: Mapping[str, Any], audit: Audit) -> dict[str, Any]:
    """The fields of an answer (its ``--json`` ``data``) as the checker found it: ``minimal`` only when its claims
    hold (a note says why not), the checker's record as ``audit``, its runs counted in ``invocations`` and
    ``backend_calls`` as ``audit oracle`` / ``audit target``."""
    held = {claim.id: claim for claim in audit.claims}
    doubted = [held[i] for i in MINIMALITY if i in held and held[i].holds is not True]
    notes = list(data["notes"])
    if data["minimal"] and doubted:
        notes.extend(f"not claimed 1-minimal: {c.statement} — the checker: {c.verdict} ({c.evidence})" for c in doubted)
    record: dict[str, Any] = audit.to_json()
    del record["bundle"]
    runs = {f"audit {role}": n for role, n in audit.runs.items()}
    calls = {f"audit {role}": {**c, "compile_cache_hits": 0} for role, c in audit.calls.items()}
    return {"minimal": bool(data["minimal"]) and not doubted, "notes": tuple(notes), "audit": record,
            "invocations": {**data["invocations"], **runs}, "backend_calls": {**data["backend_calls"], **calls}}
