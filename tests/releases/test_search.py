"""The release bisection (graphbisect.releases.search) against every answer sequence, and the version index."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from graphbisect.errors import InputError
from graphbisect.releases.index import VersionRange, release_key, select_versions
from graphbisect.releases.search import Answer, find_change

CODE = {"N": Answer.NO, "Y": Answer.YES, "U": Answer.UNKNOWN}


def _search(answers: str):  # type: ignore[no-untyped-def]
    asked: list[int] = []

    def ask(i: int) -> Answer:
        asked.append(i)
        return CODE[answers[i]]

    found = find_change(len(answers), ask)
    assert len(asked) == len(set(asked)), f"{answers}: asked an element twice: {asked}"
    assert tuple(asked) == found.asked
    return found


def _sequences():  # type: ignore[no-untyped-def]
    """Every monotone NO…YES sequence of 1..9 elements with any elements replaced by UNKNOWN (up to 7), and
    random longer ones."""
    for n in range(1, 8):
        for change in range(n + 1):
            base = "N" * change + "Y" * (n - change)
            for mask in itertools.product((False, True), repeat=n):
                yield "".join("U" if m else c for c, m in zip(base, mask, strict=True))
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randrange(8, 80)
        change = rng.randrange(n + 1)
        yield "".join("U" if rng.random() < 0.2 else ("N" if i < change else "Y") for i in range(n))


def test_the_change_is_found_with_unknowns_stepped_around_and_the_bound_kept() -> None:
    """cargo-bisect-rustc's property: on every sequence the answer is right, each UNKNOWN between the two ends
    is named, and without unknowns at most ceil(log2 N) + 2 elements are asked (each unknown asked costs at most one
    more)."""
    for answers in _sequences():
        found = _search(answers)
        known = [i for i, c in enumerate(answers) if c != "U"]
        if not known:
            assert found.status == "untestable"
            continue
        if answers[known[-1]] == "N":
            assert (found.status, found.last_no) == ("newest-unchanged", known[-1]), answers
        elif answers[known[0]] == "Y":
            assert (found.status, found.first_yes) == ("oldest-changed", known[0]), answers
        else:
            lo, hi = found.last_no, found.first_yes
            assert found.status == "found" and lo is not None and hi is not None, answers
            assert answers[lo] == "N" and answers[hi] == "Y", answers
            assert all(answers[i] == "U" for i in range(lo + 1, hi)), answers
            assert found.unknown_between == tuple(range(lo + 1, hi)), answers
        # each skip may cost one replacement ("skips excepted"); without skips the bound is exact
        unknowns_asked = sum(answers[i] == "U" for i in found.asked)
        bound = math.ceil(math.log2(len(answers))) + 2
        assert len(found.asked) - unknowns_asked <= bound + unknowns_asked, answers
        if "U" not in answers:
            assert len(found.asked) <= bound, answers


def test_both_ends_are_asked_first() -> None:
    assert _search("NNNNNNNNYY").asked[:2] == (9, 0)
    everywhere = _search("YYYYYYYYYY")
    assert everywhere.status == "oldest-changed" and everywhere.asked == (9, 0)


def test_versions_are_ordered_by_release_number_and_selected_by_range() -> None:
    listed = ["1.9.0", "1.10.0", "1.10.0rc1", "1.17.3", "1.18", "1.22.1", "1.24.0.dev20251031003", "nightly"]
    assert select_versions(listed) == ["1.9.0", "1.10.0", "1.17.3", "1.18", "1.22.1"]
    assert select_versions(listed, VersionRange.parse("1.10..1.18.0")) == ["1.10.0", "1.17.3", "1.18"]
    assert select_versions(listed, VersionRange.parse("1.18.."), pre=True) == ["1.18", "1.22.1",
                                                                               "1.24.0.dev20251031003"]
    assert release_key("1.10.0rc1") < release_key("1.10.0") < release_key("1.10.0.post1")
    for bad in ("1.22.1", "1.22..1.20", "x..1.2"):
        with pytest.raises(InputError):
            VersionRange.parse(bad)
