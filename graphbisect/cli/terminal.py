"""What reaches the terminal: names from a model are data, never control sequences.

Tensor and node names come from files anyone may have written. Printed raw, ``\\x1b]0;...\\x07`` retitles
the terminal, ``\\x1b[2J`` clears it, and U+202E reorders what the user reads. The CLI's stdout and
stderr go through :class:`SafeStream`, which shows every such character escaped (``\\x1b``) and keeps
newlines, tabs and carriage returns (the progress line); a name put into a line goes through
:func:`~graphbisect.text.printable.shown`, which escapes those too (:mod:`graphbisect.text.printable`, one rule for
every command and ``repro.py``). Files graphbisect writes keep the exact names. A character the terminal's
encoding cannot show (``×`` under ``PYTHONIOENCODING=ascii``) is written as a ``\\xd7`` escape, not an error.

A reader that goes away (``graphbisect backends | head -1``) makes a write or flush raise
:class:`OutputClosed`, which names the stream, so ``main`` can tell it from a broken pipe to a backend
worker (a bug) and end quietly.

Example:
    >>> escape_controls("a\\x1b[31mb\\x00c\\n")
    'a\\\\x1b[31mb\\\\x00c\\n'
"""

from __future__ import annotations

import contextlib
import errno
import sys
from collections.abc import Iterator
from typing import TextIO

from graphbisect.text.printable import escape_controls, shown

__all__ = ["OutputClosed", "SafeStream", "escape_controls", "safe_terminal", "shown"]


class OutputClosed(BrokenPipeError):
    """The reader of the CLI's stdout or stderr closed its end; ``stream`` is the wrapped stream.

    A ``BrokenPipeError`` still (argparse ignores a failed ``--help`` write this way), but only the CLI's
    own streams raise it, never a pipe to a backend worker.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(errno.EPIPE, f"the reader of {getattr(stream, 'name', 'the output')} closed it")
        self.stream = stream


class SafeStream:
    """A text stream that escapes control characters before writing to the wrapped one."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        safe = escape_controls(text)
        try:
            try:
                self.stream.write(safe)
            except UnicodeEncodeError:  # PYTHONIOENCODING=ascii, a C locale: "×" ended in exit 3 (issue 36)
                encoding = getattr(self.stream, "encoding", None) or "ascii"
                self.stream.write(safe.encode(encoding, "backslashreplace").decode(encoding))
        except BrokenPipeError as exc:
            raise OutputClosed(self.stream) from exc
        return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError as exc:
            raise OutputClosed(self.stream) from exc

    def __getattr__(self, name: str) -> object:  # flush, isatty, fileno, encoding, ...
        return getattr(self.stream, name)


@contextlib.contextmanager
def safe_terminal() -> Iterator[None]:
    """Route ``sys.stdout``/``sys.stderr`` through :class:`SafeStream` for the block."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(out), SafeStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
