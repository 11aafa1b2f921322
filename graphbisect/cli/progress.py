"""A one-line progress bar on stderr: phase, candidates, invocations, best size, elapsed time."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

from graphbisect.engine import ProgressEvent

__all__ = ["ProgressLine", "show_backend_progress"]


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
        text = (f"[{self.label}] {bar} best {size} {self.unit} | candidates {event.tests} | "
                f"invocations {event.invocations}{budget} | {event.phase} | {event.elapsed_seconds:.1f}s")
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
