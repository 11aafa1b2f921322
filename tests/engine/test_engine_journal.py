"""The crash-safe journal: replay, killed candidates, aborted tests, fingerprints, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from engine_helpers import Recorder

from graphbisect.engine import (
    KILLED_DETAIL,
    Evaluator,
    Journal,
    JournalError,
    Outcome,
    StopReason,
    TestResult,
    ddmin,
    encode_key,
    probdd,
)


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_entries_are_pessimistic_then_real(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path, fingerprint="fp") as journal:
        ddmin(Evaluator(Recorder({2}), 8, journal=journal))
    entries = lines(path)
    assert entries[0] == {"graphbisect_journal": 1, "fingerprint": "fp"}
    body = entries[1:]
    assert len(body) % 2 == 0 and body
    for running, done in zip(body[::2], body[1::2], strict=True):
        assert running["state"] == "running" and done["key"] == running["key"] and "outcome" in done


def test_resume_after_simulated_kill_skips_the_killer_and_repeats_nothing(tmp_path: Path) -> None:
    """The brief's scenario, written by hand: finished entries plus one dangling "running" entry."""
    path = tmp_path / "j.jsonl"
    first = Recorder({100, 101})
    with Journal.open(path, fingerprint="fp") as journal:
        full = ddmin(Evaluator(first, 256, journal=journal))
    entries = lines(path)
    # Cut the journal right after the 6th test started: as if the backend segfaulted and took us down.
    cut = 1 + 2 * 5 + 1
    assert entries[cut - 1]["state"] == "running"
    killer = str(entries[cut - 1]["key"])
    path.write_text("".join(json.dumps(e) + "\n" for e in entries[:cut]))
    finished = {str(e["key"]) for e in entries[1:cut] if "outcome" in e}

    second = Recorder({100, 101})
    with Journal.open(path, fingerprint="fp") as journal:
        assert journal.killed == (("", killer),)
        assert journal.completed()[killer] == TestResult(Outcome.UNRESOLVED, True, KILLED_DETAIL)
        ev = Evaluator(second, 256, journal=journal)
        resumed = ddmin(ev)
    tested = {encode_key(k) for k in second.calls}
    assert killer not in tested, "the candidate that killed the previous run is never tried again"
    assert not tested & finished, "finished invocations are not repeated"
    assert resumed.stats.replayed >= 6  # 5 finished tests and the killer, answered from the journal
    assert resumed.keep == full.keep == {100, 101} and resumed.minimal
    # The verdict on the killer is journaled too, so a third run does not see a dangling entry.
    with Journal.open(path, fingerprint="fp") as journal:
        assert journal.killed == ()


def test_resume_after_a_real_crash_of_the_process(tmp_path: Path) -> None:
    """A child process dies with os._exit (like a segfault or kill -9) in the middle of a test."""
    path = tmp_path / "j.jsonl"
    script = textwrap.dedent(
        f"""
        import os
        from graphbisect.engine import Evaluator, Journal, Outcome, probdd
        calls = 0
        def test(keep):
            global calls
            calls += 1
            if calls == 9:
                os._exit(139)
            return Outcome.FAIL if {{3, 77}} <= keep else Outcome.PASS
        probdd(Evaluator(test, 128, journal=Journal.open({str(path)!r}, fingerprint="model-sha")))
        """
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert child.returncode == 139, child.stderr
    entries = lines(path)
    assert entries[-1]["state"] == "running" and sum("outcome" in e for e in entries) == 8

    test = Recorder({3, 77})
    with Journal.open(path, fingerprint="model-sha") as journal:
        result = probdd(Evaluator(test, 128, journal=journal))
    assert encode_key(test.calls[0]) != entries[-1]["key"]
    assert {encode_key(k) for k in test.calls}.isdisjoint(str(e["key"]) for e in entries[1:])
    assert result.keep == {3, 77} and result.minimal and result.stats.replayed >= 8


def test_ctrl_c_marks_the_test_aborted_and_resume_retries_it(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    calls: list[frozenset[int]] = []

    def test(keep: frozenset[int]) -> Outcome:
        calls.append(keep)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return Outcome.FAIL if 9 in keep else Outcome.PASS

    with Journal.open(path) as journal:
        stopped = ddmin(Evaluator(test, 32, journal=journal))
    assert stopped.stop_reason is StopReason.INTERRUPTED
    assert lines(path)[-1] == {"key": encode_key(calls[3]), "state": "aborted"}
    second = Recorder({9})
    with Journal.open(path) as journal:
        assert journal.killed == ()
        result = ddmin(Evaluator(second, 32, journal=journal))
    assert second.calls[0] == calls[3], "the interrupted candidate is simply tested again"
    assert result.keep == {9}


def test_fingerprint_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    Journal.open(path, fingerprint="model-A").close()
    with pytest.raises(JournalError, match=r"fingerprint 'model-A'.*'model-B'") as info:
        Journal.open(path, fingerprint="model-B")
    assert info.value.hint and "new journal path" in info.value.hint


def test_not_a_journal_and_corruption(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    with pytest.raises(JournalError, match="not a graphbisect journal"):
        Journal.open(other)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(
        '{"graphbisect_journal": 1, "fingerprint": null}\n{"key": "1", "sta\n{"key": "2", "state": "running"}\n'
    )
    with pytest.raises(JournalError, match="corrupted at line 2"):
        Journal.open(broken)


def test_a_torn_last_line_is_ignored_and_not_glued_to(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_text(
        '{"graphbisect_journal": 1, "fingerprint": null}\n{"key": "1-2", "outcome": "fail"}\n{"key": "3", "sta'
    )
    with Journal.open(path) as journal:
        assert journal.completed() == {"1-2": TestResult(Outcome.FAIL)}
        journal.begin("4")
    with Journal.open(path) as journal:  # still readable: the new entry went on a line of its own
        assert [key for _, key in journal.killed] == ["4"]


def test_scopes_keep_unit_spaces_apart(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path) as journal:
        ddmin(Evaluator(Recorder({1}), 4, journal=journal, scope="nodes"))
    with Journal.open(path) as journal:
        assert journal.completed("nodes") and not journal.completed("passes")
        passes = Recorder({2})
        ddmin(Evaluator(passes, 4, journal=journal, scope="passes"))
        assert passes.calls, "another scope's outcomes are not reused"


def test_details_are_stored_as_json(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path) as journal:
        journal.finish("1", TestResult(Outcome.UNRESOLVED, False, {"error": "shape"}))
        journal.finish("2", TestResult(Outcome.FAIL, True, object()))
        journal.finish("3", TestResult(Outcome.FAIL, True, Outcome.PASS))
    with Journal.open(path) as journal:
        done = journal.completed()
    assert done["1"] == TestResult(Outcome.UNRESOLVED, False, {"error": "shape"})
    assert str(done["2"].detail).startswith("<object object") and done["3"].detail == "pass"


@pytest.mark.skipif(os.name != "posix", reason="advisory locks are POSIX-only")
def test_two_runs_cannot_share_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path), pytest.raises(JournalError, match="in use by another graphbisect run"):
        Journal.open(path)
