"""Tactic records, diffs and the isolation search (no backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphbisect.engine import Evaluator, Outcome
from graphbisect.errors import InputError
from graphbisect.strategies import get_strategy
from graphbisect.strategies.tactics import TacticSpace, isolate
from graphbisect.tactics import TacticChoice, TacticRecord, compose, diff_records, load_record, save_record, unapplied


def _record(n: int = 6) -> TacticRecord:
    return TacticRecord("openvino", "2026.4", "CPU", tuple(TacticChoice(f"n{i}", "a", layer=f"L{i}") for i in range(n)))


def test_record_round_trips_through_json(tmp_path: Path) -> None:
    rec = _record().with_choices({"n2": "ref_any"})
    assert load_record(save_record(rec, tmp_path / "r.json")) == rec


def test_load_rejects_other_files(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"format": "other"}')
    with pytest.raises(InputError, match="not a tactic record"):
        load_record(tmp_path / "x.json")
    with pytest.raises(InputError, match="does not exist"):
        load_record(tmp_path / "missing.json")


def test_diff_compose_and_unapplied() -> None:
    good = _record()
    bad = good.with_choices({"n1": "b", "n3": "c"})
    diff = diff_records(good, bad)
    assert [(c.node, c.good, c.bad) for c in diff.changed] == [("n1", "a", "b"), ("n3", "a", "c")]
    assert compose(good, bad, ["n3"]).choice_of("n3") == "c"
    assert compose(good, bad, ["n3"]).choice_of("n1") == "a"
    assert [(n.node, n.requested, n.used) for n in unapplied(bad, good)] == [("n1", "b", "a"), ("n3", "c", "a")]
    assert diff_records(good, good.restricted(["n0"])).only_a == ("n1", "n2", "n3", "n4", "n5")


@pytest.mark.parametrize("culprits", [{"n2"}, {"n1", "n4"}])
def test_isolate_finds_every_independent_culprit(culprits: set[str]) -> None:
    good = _record(8)
    bad = good.with_choices({f"n{i}": "b" for i in range(8)})
    space = TacticSpace.between(good, bad)

    def test(keep: frozenset[int]) -> Outcome:
        rec = space.record_for(keep)
        return Outcome.FAIL if any(rec.choice_of(n) == "b" for n in culprits) else Outcome.PASS

    result = isolate(space, Evaluator(test, space.size, allow_empty=True))
    assert {c.node for c in result.culprits} == culprits
    assert result.confirmed and result.minimal


def test_isolate_needs_both_nodes_of_an_interaction() -> None:
    good = _record(8)
    bad = good.with_choices({f"n{i}": "b" for i in range(8)})
    space = TacticSpace.between(good, bad)

    def test(keep: frozenset[int]) -> Outcome:
        rec = space.record_for(keep)
        return Outcome.FAIL if rec.choice_of("n2") == rec.choice_of("n6") == "b" else Outcome.PASS

    result = isolate(space, Evaluator(test, space.size, allow_empty=True))
    assert [sorted(c.node for c in g) for g in result.groups] == [["n2", "n6"]]


def test_isolate_reports_a_bad_build_that_does_not_replay() -> None:
    space = TacticSpace.between(_record(), _record().with_choices({"n0": "b"}))
    result = isolate(space, Evaluator(lambda keep: Outcome.PASS, space.size, allow_empty=True))
    assert not result.culprits and "do not fail" in result.verdict
    assert "took effect" in result.verdict  # the replay said nothing was refused


def test_a_replay_that_could_not_force_the_bad_choices_is_not_called_flaky() -> None:
    """The bad build's choices replayed without failing because the backend ignored some of them: that says
    nothing of flakiness, and the verdict said "(flaky backend?)"."""
    from graphbisect.engine import TestResult
    from graphbisect.tactics.diff import NotApplied

    space = TacticSpace.between(_record(), _record().with_choices({"n0": "b"}))
    refused = TestResult(Outcome.PASS, detail={"not_applied": (NotApplied("n0", "b", "a"),)})
    result = isolate(space, Evaluator(lambda keep: refused, space.size, allow_empty=True))
    assert not result.culprits and "could not be forced (n0)" in result.verdict and "flaky" not in result.verdict


def test_identical_records_are_an_input_error() -> None:
    with pytest.raises(InputError):
        TacticSpace.between(_record(), _record())


def test_strategy_row() -> None:
    row = get_strategy("tactics")
    assert row.command == "tactics" and row.units == "(node, kernel choice) pairs"
