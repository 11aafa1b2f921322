"""`graphbisect precision` as a user runs it on a real model (PP-OCR's direction classifier from rapidocr):
a budget keeps the answer, termination leaves no temporary folder, progress is shown, the help and the
JSON state the tolerance that was used."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphbisect.backends import zygote
from graphbisect.workflows.scratch import OWNER_FILE, reclaim_abandoned
from tests.real_models import rapidocr_model

pytestmark = pytest.mark.slow


def _command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "graphbisect", "precision", str(rapidocr_model()), "--shape", "x:1x3x48x192",
            "--atol", "1e-4", "--rtol", "1e-3", *extra]


def _env(tmp: Path) -> dict[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


def test_a_budget_keeps_the_answer_and_says_the_search_stopped(tmp_path: Path) -> None:
    """It used to die with an uncaught BudgetExhausted traceback after the search had stopped cleanly."""
    out = tmp_path / "p.json"
    proc = subprocess.run(_command("--max-invocations", "6", "--json", str(out)), env=_env(tmp_path / "tmp"),
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "internal error" not in proc.stderr and "BudgetExhausted" not in proc.stderr
    assert "[precision]" in proc.stderr  # the progress line, as reduce shows it
    result = json.loads(out.read_text())
    assert result["stop_reason"] == "max_invocations" and result["minimal"] is False
    assert result["tolerance"] == {"atol": 1e-4, "rtol": 1e-3, "min_cosine": None, "per_output": {}}
    assert "NOT proven minimal: the search stopped early (max_invocations)" in proc.stdout
    assert not list((tmp_path / "tmp").glob("graphbisect-*"))


def test_help_states_the_tolerance_precision_uses() -> None:
    proc = subprocess.run([sys.executable, "-m", "graphbisect", "precision", "--help"],
                          capture_output=True, text=True, timeout=60, check=True)
    text = " ".join(proc.stdout.split())
    assert "absolute tolerance (default 0.01)" in text and "relative tolerance (default 0.01)" in text
    assert "default 1e-4" not in text and "default 0.0001" not in text


def _start_and_wait_for_search(tmp: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(_command(), env=_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # the oracle's activation store is written before the search starts
        if "searching" in line:
            return proc
    proc.kill()
    raise AssertionError(f"precision ended before searching (exit {proc.wait()})")


def test_terminated_run_removes_its_temporary_folder(tmp_path: Path) -> None:
    """A SIGTERM'd precision run used to leave the oracle's activation store (~200 MB on PP-OCR rec) behind."""
    tmp = tmp_path / "tmp"
    proc = _start_and_wait_for_search(tmp)
    try:
        assert list(tmp.glob("graphbisect-*")), "the run works in a temporary folder"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert not list(tmp.glob("graphbisect-*"))


def test_a_killed_runs_folder_is_reclaimed(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    proc = _start_and_wait_for_search(tmp)
    proc.kill()  # SIGKILL: nothing can clean up in the process itself
    proc.wait(timeout=60)
    # the run's work folder is left; its worker zygote's goes with the zygote, which sees the run gone
    left = [p for p in tmp.glob("graphbisect-*") if not p.name.startswith(zygote.FOLDER_PREFIX)]
    assert len(left) == 1 and (left[0] / OWNER_FILE).is_file()
    deadline = time.monotonic() + 30
    while list(tmp.glob(f"{zygote.FOLDER_PREFIX}*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(tmp.glob(f"{zygote.FOLDER_PREFIX}*"))
    mine = tmp / "graphbisect-alive-x"
    mine.mkdir()
    (mine / OWNER_FILE).write_text(f"{os.getpid()}\n")  # a live owner: kept
    assert reclaim_abandoned(tmp) == left
    assert not left[0].exists() and mine.is_dir()
