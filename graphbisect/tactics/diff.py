"""Differences between tactic records: which nodes got another implementation, and did a replay take effect.

Example:
    >>> from graphbisect.tactics.record import TacticChoice, TacticRecord
    >>> a = TacticRecord("openvino", None, None, (TacticChoice("c0", "brgconv_avx512"), TacticChoice("s", "jit")))
    >>> b = a.with_choices({"c0": "ref_any"})
    >>> [(c.node, c.good, c.bad) for c in diff_records(a, b).changed]
    [('c0', 'brgconv_avx512', 'ref_any')]
    >>> compose(a, b, ["c0"]).choice_of("c0")
    'ref_any'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from graphbisect.tactics.record import TacticRecord

__all__ = ["ChoiceChange", "NotApplied", "RecordDiff", "compose", "diff_records", "unapplied"]


@dataclass(frozen=True)
class ChoiceChange:
    """One node whose implementation differs: ``good`` in the first record, ``bad`` in the second."""

    node: str
    good: str
    bad: str

    def to_json(self) -> dict[str, str]:
        return {"node": self.node, "good_choice": self.good, "bad_choice": self.bad}


@dataclass(frozen=True)
class RecordDiff:
    """What differs between two records (``a`` = good, ``b`` = bad by convention)."""

    changed: tuple[ChoiceChange, ...]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not (self.changed or self.only_a or self.only_b)

    def to_json(self) -> dict[str, object]:
        return {"changed": [c.to_json() for c in self.changed], "only_a": list(self.only_a),
                "only_b": list(self.only_b)}


def diff_records(a: TacticRecord, b: TacticRecord) -> RecordDiff:
    """Nodes whose choice differs (in ``b``'s order), and nodes present in only one record."""
    da, db = a.as_dict(), b.as_dict()
    changed = tuple(ChoiceChange(node, da[node].choice, c.choice)
                    for node, c in db.items() if node in da and da[node].choice != c.choice)
    return RecordDiff(changed, tuple(n for n in da if n not in db), tuple(n for n in db if n not in da))


def compose(good: TacticRecord, bad: TacticRecord, nodes: Iterable[str]) -> TacticRecord:
    """``good`` with the choices of ``bad`` for ``nodes``: the candidate build of a tactic bisection."""
    chosen = bad.as_dict()
    return good.with_choices({n: chosen[n].choice for n in nodes if n in chosen})


@dataclass(frozen=True)
class NotApplied:
    """A requested choice the backend silently replaced by another."""

    node: str
    requested: str
    used: str

    def to_json(self) -> dict[str, str]:
        return {"node": self.node, "requested": self.requested, "used": self.used}


def unapplied(requested: TacticRecord, actual: TacticRecord) -> tuple[NotApplied, ...]:
    """Requested choices the build did not honour, with what it used instead.

    A node the build computed inside another node's kernel (listed in that choice's ``fused``) did not get
    its own kernel either: it is reported with that kernel, e.g. ``brgconv_avx512 (fused into conv0)``. A
    node missing from ``actual`` altogether (not in a reduced model, or no kernel at all) is not reported.

    Example:
        >>> from graphbisect.tactics.record import TacticChoice, TacticRecord
        >>> built = TacticRecord("openvino", None, None, (TacticChoice("conv0", "jit_avx512", fused=("relu0",)),))
        >>> asked = built.with_choices({"conv0": "ref_any", "relu0": "ref_any", "gone": "ref_any"})
        >>> [(n.node, n.used) for n in unapplied(asked, built)]
        [('conv0', 'jit_avx512'), ('relu0', 'jit_avx512 (fused into conv0)')]
    """
    got = actual.as_dict()
    # a record of another build can give a node its own kernel where this build fused it into a neighbour's
    host = {node: c for c in actual.choices for node in c.fused if node not in got}
    out: list[NotApplied] = []
    for c in requested.choices:
        if c.node in got and got[c.node].choice != c.choice:
            out.append(NotApplied(c.node, c.choice, got[c.node].choice))
        elif c.node not in got and c.node in host:
            out.append(NotApplied(c.node, c.choice, f"{host[c.node].choice} (fused into {host[c.node].node})"))
    return tuple(out)
