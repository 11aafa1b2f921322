"""Issue 36 item 3: a reduction's work folder (``DIR.work``) is graphbisect's own
(:mod:`graphbisect.workflows.workfolder`): never followed through a link, and a file graphbisect did not write
there is never deleted: the run refuses (exit 2) and says what to do.

Each test failed on the code before the fix; real runs and files, no mocks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from graphbisect.cli.main import main
from graphbisect.workflows.reduce import work_dir_for
from graphbisect.workflows.workfolder import ENTRIES, foreign


@pytest.fixture
def stopped(tmp_path: Path) -> Path:
    """The -o folder of a reduction stopped by its budget: its DIR.work holds the resumable state."""
    out = tmp_path / "bug"
    assert main(["reduce", "--example", "-o", str(out), "--max-invocations", "3"]) == 1
    assert (work_dir_for(out) / "run.json").is_file()
    return out


def test_a_stopped_run_leaves_only_entries_graphbisect_names_as_its_own(stopped: Path) -> None:
    """What a new run may remove is a fixed table: a stopped run's every entry must be in it."""
    work = work_dir_for(stopped)
    assert foreign(work) == [] and {p.name for p in work.iterdir()} <= ENTRIES


@pytest.mark.parametrize("resume", [False, True])
def test_the_users_file_in_a_stale_work_folder_is_never_deleted(stopped: Path, resume: bool,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A new run removed everything an earlier run's DIR.work held, the user's NOTES.md with it; a resumed one
    removed the folder when it finished."""
    work = work_dir_for(stopped)
    notes = work / "NOTES.md"
    notes.write_text("mine")
    before = sorted(p.name for p in work.iterdir())
    capsys.readouterr()
    args = ["--resume", str(stopped)] if resume else ["--example", "-o", str(stopped)]
    assert main(["reduce", *args]) == 2
    err = capsys.readouterr().err
    assert f"{work} holds files graphbisect did not write (NOTES.md)" in err
    assert "move those files out of" in err
    assert notes.read_text() == "mine" and sorted(p.name for p in work.iterdir()) == before
    notes.unlink()  # moved away: the run starts afresh (or resumes)
    assert main(["reduce", *args]) == 1


def test_a_linked_work_folder_is_never_followed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through a link bug.work -> elsewhere, a new run deleted elsewhere/thesis.tex and wrote its state into
    elsewhere, a folder never named on the command line."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "thesis.tex").write_text("mine")
    (elsewhere / "run.json").write_text(json.dumps({"fingerprint": "{}"}))  # looks like a stale run's
    out = tmp_path / "bug"
    work_dir_for(out).symlink_to(elsewhere)
    for args in (["--example", "-o", str(out)], ["--resume", str(out)]):
        assert main(["reduce", *args]) == 2
        assert f"the work folder {work_dir_for(out)} is a symbolic link" in capsys.readouterr().err
    assert sorted(p.name for p in elsewhere.iterdir()) == ["run.json", "thesis.tex"]
    assert (elsewhere / "thesis.tex").read_text() == "mine"
    assert not out.exists()


def test_a_dangling_work_folder_link_is_refused_not_an_internal_error(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bug"
    os.symlink(tmp_path / "gone", work_dir_for(out))
    assert main(["reduce", "--example", "-o", str(out)]) == 2  # was 3: FileExistsError
    err = capsys.readouterr().err
    assert "is a symbolic link" in err and "remove the link" in err and "graphbisect bug" not in err
    assert not (tmp_path / "gone").exists()
