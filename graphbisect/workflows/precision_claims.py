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
==================  =============================================================  ===============================

Runs: one oracle run, one target run per file (``1 + typed + |keep_fp32|``), one target worker per spec.
:func:`audited_fields` then says only what holds: ``meets_tolerance`` and ``minimal`` are true only when the checker
confirms them; ``breaks_alone`` and the prefix answer stay the search's word (``--json`` ``audit`` lists what
was checked).
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

__all__ = ["MAX_KEPT", "Answer", "audited_fields", "claim_lines", "precision_claims"]

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
                     f"{'op types' if answer.lowering.op_types is not None else 'nodes'} lowered too, the model "
                     "misses the tolerance")
        if len(answer.keep) > MAX_KEPT:
            claims.append(ConfigurationClaim("one_minimal", statement, ()))
        else:
            names = answer.lowering.names(sorted(answer.keep))
            claims.append(ConfigurationClaim(
                "one_minimal", statement,
                tuple((answer.configuration(answer.keep - {u}, f"without-{u}"), FAILS) for u in sorted(answer.keep)),
                tuple(f"{name} lowered" for name in names)))
    return claims


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


def claim_lines(audit: Mapping[str, Any] | None) -> Sequence[str]:
    """``  holds: …`` / ``  DOES NOT HOLD: … — evidence`` / ``  not established: … — evidence`` per claim."""
    lines = []
    for claim in (audit or {}).get("claims") or ():
        verdict = {True: "holds", False: "DOES NOT HOLD", None: "not established"}[claim.get("holds")]
        evidence = "" if claim.get("holds") is True else f" — {claim.get('evidence')}"
        lines.append(f"  {verdict}: {claim.get('claim')}{evidence}")
    return lines
