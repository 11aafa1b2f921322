"""A one-line progress bar on stderr: phase, candidates, invocations, best size, what proving the best set
1-minimal still takes (runs, and time at the pace so far), elapsed time."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

from graphbisect.engine import ProgressEvent

__all__ = ["ProgressLine", "show_backend_progress"]


#: The phases of the pass search (``graphbisect.strategies.passes``): its units are passes, not nodes.
PASS_PHASES = frozenset({"disable-set", "enable-set", "alone"})


class ProgressLine:
    """Redraws one status line (carriage return) on a terminal; prints a line at most every 5 s otherwise."""

    def __init__(self, stream: TextIO | None = None, *, label: str = "reduce", unit: str = "nodes") -> None:
        self.stream = stream or sys.stderr
        self.label = label
        self.unit = unit  # what the best size counts: "nodes" (reduce), "nodes in FP32" (precision)
        self.tty = self.stream.isatty()
        self._last = 0.0
        self._width = 0

    def stage(self, message: str) -> None:
        self._clear()
        print(f"… {message}", file=self.stream, flush=True)

    def __call__(self, event: ProgressEvent) -> None:
        now = time.monotonic()
        if not self.tty and now - self._last < 5.0:
            return
        self._last = now
        best = "-" if event.best_size is None else str(event.best_size)  # none found yet
        size = f"{best}/{event.start_size}" if event.start_size else best
        budget = f"/{event.max_invocations}" if event.max_invocations else ""
        bar = _bar(event.best_size, event.start_size)
        unit = "passes" if event.phase in PASS_PHASES else self.unit
        text = (f"[{self.label}] {bar} best {size} {unit} | candidates {event.tests} | "
                f"invocations {event.invocations}{budget} | {event.phase}{_proof(event)} | "
                f"{event.elapsed_seconds:.1f}s")
        if self.tty:
            pad = max(self._width - len(text), 0)
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def _clear(self) -> None:
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0

    def close(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self._width = 0


def _proof(event: ProgressEvent) -> str:
    """`` | 1-minimal in 9 runs ~15 min``: what the best set's proof still takes, were it the answer; shown
    once a set smaller than the start fails, while that is more than one run and the pace so far is known.

    Example:
        >>> _proof(ProgressEvent("sweep", 40, 38, 2, 323, 12, 3800.0, proof_runs=9, seconds_per_run=100.0))
        ' | 1-minimal in 9 runs ~15 min'
        >>> _proof(ProgressEvent("sweep", 40, 38, 2, 323, 12, 3800.0, proof_runs=9, seconds_per_run=0.6))
        ' | 1-minimal in 9 runs ~5 s'
    """
    runs, pace = event.proof_runs, event.seconds_per_run
    if not runs or runs < 2 or pace is None or not event.best_size or event.best_size == event.start_size:
        return ""  # the start set's proof is no estimate of what is left: shown once a smaller set fails
    return f" | 1-minimal in {runs} runs ~{_duration(runs * pace)}"


def _duration(seconds: float) -> str:
    """``5 s``, ``15 min``, ``2.5 h``: rounded as a remaining time is read."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


class _StageLines(logging.Handler):
    """Prints each record as a stage line (``… message``) on the stderr of the moment (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(f"… {record.getMessage()}", file=sys.stderr, flush=True)
        except BrokenPipeError:  # a closed stderr (OutputClosed): the CLI ends quietly, as for any other line
            raise
        except Exception:  # logging's contract otherwise: a handler does not raise
            self.handleError(record)


def show_backend_progress() -> None:
    """Print the backends' "still running" records (``graphbisect.progress``: a long onnx.reference run's node
    count) as stage lines, at every verbosity; once per process."""
    progress = logging.getLogger("graphbisect.progress")
    if not any(isinstance(handler, _StageLines) for handler in progress.handlers):
        progress.addHandler(_StageLines())
    progress.setLevel(logging.INFO)
    progress.propagate = False


def _bar(best: int | None, start: int | None, width: int = 20) -> str:
    """How much of the model is gone: full bar = reduced to nothing."""
    if not best or not start:
        return "[" + " " * width + "]"
    done = round(width * (1 - best / start))
    return "[" + "#" * done + "." * (width - done) + "]"
