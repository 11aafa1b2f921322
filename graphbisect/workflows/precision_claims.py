"""What `graphbisect precision` may say: its answer's claims, re-established by the trusted checker.

The search (:mod:`graphbisect.workflows.precision`) measures candidates in shared workers, from shared weight
files, through an outcome cache. What a user gets is files: ``mixed_precision.onnx`` (or, where the target
lowers by itself, the FP32 model with ``keep_fp32.txt`` as its ``keep_fp32=@FILE``), and for FP16
``mixed_precision_typed.onnx``. :func:`precision_claims` states each claim the command prints as plain runs of
those files — the files written to ``-o``, or the same models saved to the work folder without it — and
:func:`graphbisect.checker.configurations.check_configurations` runs them against one plain oracle run of the
FP32 model:

==================  =============================================================  ===============================
claim               configuration                                                  verdict
==================  =============================================================  ===============================
``verified``        the answer (``mixed_precision.onnx`` / the FP32 model pinned)   meets the tolerance (or, where
                                                                                   the search says it does not,
                                                                                   misses it)
``typed``           ``mixed_precision_typed.onnx`` (FP16)                          as the search says
``one_minimal``     the answer with each kept node lowered too (at most             misses the tolerance
                    :data:`MAX_KEPT` of them)
``breaks_alone``    each node the search found to break the tolerance alone,        misses the tolerance
                    lowered alone (every other node in FP32)
``only_together``   each other kept node lowered alone                              meets the tolerance
``prefix``          Polygraphy's prefix answer: the first ``k`` nodes in FP32, the   meets the tolerance; with
                    rest lowered; and the first ``k - 1``                            ``k - 1``: misses it
==================  =============================================================  ===============================

Runs: one oracle run, one target run per file (``1 + typed + |keep_fp32|``), one per node checked alone (about
``|keep_fp32|`` more, only where the search checked them: ``alone_checked``), two for the prefix answer; one
target worker per spec. :func:`audited_fields` then says only what holds: ``meets_tolerance`` and ``minimal`` are
true only when the checker confirms them; :func:`checked_beliefs` makes ``breaks_alone`` the nodes the checker saw
break the tolerance alone and keeps the prefix answer only where it holds, the search's word beside them
(``alone_search``, ``prefix_search``) where it differs (``--json`` ``audit`` lists what was checked).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphbisect.backends import BackendSpec
from graphbisect.checker.audit import Audit
from graphbisect.checker.configurations import FAILS, PASSES, Configuration, ConfigurationClaim
from graphbisect.model.io import save_proto
from graphbisect.precision.lowering import Lowering
from graphbisect.storage.atomic import atomic_write_text

__all__ = ["MAX_KEPT", "Answer", "audited_fields", "checked_beliefs", "claim_lines", "precision_claims"]

#: Answers keeping more nodes than this are not checked for 1-minimality: the claim is then not established, and
#: ``minimal`` not claimed. One target run per kept node, fewer than the search's own closing sweep made (it tried
#: each kept node once more on the final set): int8 on PP-OCRv4 rec keeps 153 in 1,259 search runs.
MAX_KEPT = 512


@dataclass(frozen=True)
class Answer:
    """What the search answered, as the files to run: ``lowering`` and the keep-sets, the target spec, the FP32
    model (what the oracle runs, and what a runtime-pins target runs), where the written files are (``out_dir``,
    None: not written) and a scratch folder for the models the checker runs that are not written."""

    lowering: Lowering
    keep: frozenset[int]
    target: str
    fp32_model: Path
    scratch: Path
    out_dir: Path | None = None
    verified: bool = True  # the search's verdict on the answer
    typed_keep: frozenset[int] | None = None  # FP16: the typed model's keep-set; None: no typed model
    typed_meets: bool | None = None
    run_model: Path | None = None  # a target that runs its own format (Paddle): the file it runs
    alone: frozenset[int] | None = None  # the units the search found to break the tolerance alone; None: unchecked
    prefix: int | None = None  # Polygraphy's prefix answer: the first ``prefix`` units in FP32; None: none

    def configuration(self, keep: frozenset[int], name: str, *, typed: bool = False) -> Configuration:
        """The file (and spec) a user runs for ``keep``: the written artifact ``name`` where ``out_dir`` holds it,
        else that model saved to the scratch folder."""
        lowering = Lowering(self.lowering.model, self.lowering.mode, typed=True) if typed else self.lowering
        if lowering.runtime_pins:  # the FP32 model (or the target's own), the pins as the target reads them
            pins = self.out_dir / "keep_fp32.txt" if self.out_dir is not None else None
            if name != "answer" or pins is None or not pins.is_file() or "," in str(pins):  # "," ends a spec option
                pins = self.scratch / f"{name}.keep_fp32.txt"
                atomic_write_text(pins, "".join(f"{n}\n" for n in lowering.pinned(keep)))
            spec = BackendSpec.parse(self.target).with_options(keep_fp32=f"@{pins}")
            return Configuration(str(spec), self.run_model or self.fp32_model)
        file = {"answer": "mixed_precision.onnx", "typed": "mixed_precision_typed.onnx"}.get(name)
        if self.out_dir is not None and file is not None and (self.out_dir / file).is_file():
            return Configuration(self.target, self.out_dir / file)
        path = self.scratch / f"{name}.onnx"
        save_proto(lowering.lower(keep), path, link=False)
        return Configuration(self.target, path)


def precision_claims(answer: Answer, *, minimal: bool) -> list[ConfigurationClaim]:
    """The claims an answer states (``minimal``: the search says 1-minimal), as the files a user runs and the
    verdict the search claims for each."""
    answer.scratch.mkdir(parents=True, exist_ok=True)
    what = "the model with these overrides" + (
        " (the FP32 model, the target pinning keep_fp32.txt)" if answer.lowering.runtime_pins else "")
    claims = [ConfigurationClaim(
        "verified", f"{what} {'meets' if answer.verified else 'misses'} the tolerance on {answer.target}",
        ((answer.configuration(answer.keep, "answer"), PASSES if answer.verified else FAILS),),
        ("the answer",))]
    if answer.typed_keep is not None:
        claims.append(ConfigurationClaim(
            "typed", f"mixed_precision_typed.onnx {'meets' if answer.typed_meets else 'misses'} the tolerance",
            ((answer.configuration(answer.typed_keep, "typed", typed=True), PASSES if answer.typed_meets else FAILS),),
            ("the typed model",)))
    if minimal and answer.keep:
        statement = (f"1-minimal: with any one of the {len(answer.keep)} kept "
                     f"{_unit_word(answer.lowering)} lowered too, the model "
                     "misses the tolerance")
        if len(answer.keep) > MAX_KEPT:
            claims.append(ConfigurationClaim("one_minimal", statement, ()))
        else:
            names = answer.lowering.names(sorted(answer.keep))
            claims.append(ConfigurationClaim(
                "one_minimal", statement,
                tuple((answer.configuration(answer.keep - {u}, f"without-{u}"), FAILS) for u in sorted(answer.keep)),
                tuple(f"{name} lowered" for name in names)))
    return [*claims, *_alone_claims(answer), *_prefix_claims(answer)]


#: How a node checked alone is labelled in the evidence (its name, then this).
_ALONE = " lowered alone"


def _alone_claims(answer: Answer) -> list[ConfigurationClaim]:
    """``breaks_alone`` and ``only_together``: each node the search checked alone, lowered alone (every other
    node in FP32): those it found to break the tolerance miss it, the other kept nodes meet it."""
    if answer.alone is None:
        return []
    every = frozenset(range(len(answer.lowering.units)))
    word = _unit_word(answer.lowering)
    claims = []
    for claim_id, units, verdict, statement in (
            ("breaks_alone", sorted(answer.alone), FAILS, "each of the {n} {word} found to break the tolerance alone "
             "misses it with only that one lowered (every other in FP32)"),
            ("only_together", sorted(answer.keep - answer.alone), PASSES, "each of the other {n} kept {word} meets "
             "the tolerance with only that one lowered: they are needed together")):
        if not units:
            continue
        text = statement.format(n=len(units), word=word)
        if len(units) > MAX_KEPT:
            claims.append(ConfigurationClaim(claim_id, text, ()))
            continue
        claims.append(ConfigurationClaim(
            claim_id, text, tuple((answer.configuration(every - {u}, f"alone-{u}"), verdict) for u in units),
            tuple(f"{name}{_ALONE}" for name in answer.lowering.names(units))))
    return claims


def _prefix_claims(answer: Answer) -> list[ConfigurationClaim]:
    """``prefix``: with the first ``k`` nodes in FP32 (the rest lowered) the model meets the tolerance, and with
    the first ``k - 1`` it does not (the bisection's boundary; shorter prefixes are not run)."""
    k = answer.prefix
    if k is None:
        return []
    configurations = [(answer.configuration(frozenset(range(k)), "prefix"), PASSES)]
    labels = [f"the first {k} in FP32"]
    if k > 0:
        configurations.append((answer.configuration(frozenset(range(k - 1)), "prefix-short"), FAILS))
        labels.append(f"the first {k - 1} in FP32")
    statement = (f"Polygraphy-style prefix answer: with the first {k} nodes in FP32 (the rest lowered) the model "
                 "meets the tolerance" + (f", with the first {k - 1} it does not" if k > 0 else ""))
    return [ConfigurationClaim("prefix", statement, tuple(configurations), tuple(labels))]


def _unit_word(lowering: Lowering) -> str:
    return "op types" if lowering.op_types is not None else "nodes"


def audited_fields(data: Mapping[str, Any], audit: Audit) -> dict[str, Any]:
    """The fields of an answer (its ``--json`` ``data``) as the checker found it: ``meets_tolerance`` only where
    the answer (and the typed model) is confirmed to meet the tolerance, ``minimal`` only where 1-minimality
    holds; the checker's record as ``audit``, its runs counted as ``audit oracle`` / ``audit target``."""
    held = {claim.id: claim for claim in audit.claims}
    meets = bool(data["meets_tolerance"]) and all(held[i].holds is True for i in ("verified", "typed") if i in held)
    one = held.get("one_minimal")
    record: dict[str, Any] = audit.to_json()
    del record["bundle"]
    kept = len(data["keep_fp32"])
    if one is not None and one.holds is None and kept > MAX_KEPT:
        one = dataclasses.replace(one, evidence=f"{kept} kept: the checker lowers each kept one only in answers "
                                  f"keeping at most {MAX_KEPT}")
        record["claims"] = [one.to_json() if c["id"] == "one_minimal" else c for c in record["claims"]]
    minimal = bool(data["minimal"]) and (one is None or one.holds is True)
    runs = {f"audit {role}": n for role, n in audit.runs.items()}
    calls = {f"audit {role}": {**c, "compile_cache_hits": 0} for role, c in audit.calls.items()}
    return {"meets_tolerance": meets, "minimal": minimal, "audit": record,
            "invocations": {**data["invocations"], **runs}, "backend_calls": {**data["backend_calls"], **calls}}


def checked_beliefs(audit: Audit, claims: Sequence[ConfigurationClaim], alone: Sequence[str] | None,
                    prefix: Sequence[str] | None) -> dict[str, Any]:
    """The single-node and prefix answers as the checker found them (``alone``: the search's ``breaks_alone``,
    ``prefix``: its ``prefix_keep_fp32``), as :class:`~graphbisect.workflows.precision.PrecisionResult` fields:
    ``alone`` the nodes whose plain run alone missed the tolerance (None where the search did not check them or
    the checker could not decide), ``prefix_keep_fp32`` only where the prefix claim holds; ``extra`` fields
    ``alone_search`` / ``prefix_search`` keep the search's word, marked with the checker's verdict, where it is
    not what the checker found."""
    held = {claim.id: claim for claim in audit.claims}
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    tested = [(c, held[c.id]) for c in claims if c.id in ("breaks_alone", "only_together") and c.id in held]
    if alone is not None and tested:
        decided = all(found.holds is not None for _, found in tested)
        broke = [label[: -len(_ALONE)] for claim, found in tested
                 for label, shown, (_, verdict) in zip(claim.labels, found.each, claim.configurations)
                 if shown is (verdict == FAILS)]  # a FAILS verdict shown, or a PASSES verdict not shown
        fields["alone"] = tuple(broke) if decided else None
        if not decided or set(broke) != set(alone):
            extra["alone_search"] = {"breaks_alone": list(alone),
                                     "holds": False if any(f.holds is False for _, f in tested) else None}
    found = held.get("prefix")
    if prefix is not None and found is not None and found.holds is not True:
        fields["prefix_keep_fp32"] = None
        extra["prefix_search"] = {"prefix_keep_fp32": len(prefix), "prefix_last_node": prefix[-1] if prefix else None,
                                  "holds": found.holds, "evidence": found.evidence}
    return {**fields, "extra": extra}


def claim_lines(audit: Mapping[str, Any] | None) -> Sequence[str]:
    """``  holds: …`` / ``  DOES NOT HOLD: … — evidence`` / ``  not established: … — evidence`` per claim."""
    lines = []
    for claim in (audit or {}).get("claims") or ():
        verdict = {True: "holds", False: "DOES NOT HOLD", None: "not established"}[claim.get("holds")]
        evidence = "" if claim.get("holds") is True else f" — {claim.get('evidence')}"
        lines.append(f"  {verdict}: {claim.get('claim')}{evidence}")
    return lines
