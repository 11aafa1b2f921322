"""What reaches the terminal: names from a model are data, never control sequences.

Tensor and node names come from files anyone may have written. Printed raw, ``\\x1b]0;...\\x07`` retitles
the terminal, ``\\x1b[2J`` clears it, and U+202E reorders what the user reads. The CLI's stdout and
stderr go through :class:`SafeStream`, which shows every such character escaped (``\\x1b``) and keeps
newlines, tabs and carriage returns (the progress line). Files graphbisect writes keep the exact names.

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
import re
import sys
from collections.abc import Iterator
from typing import TextIO

__all__ = ["OutputClosed", "SafeStream", "escape_controls", "safe_terminal", "shown"]

# C0 controls but \t \n \r, DEL, C1 controls, and the bidirectional overrides/isolates.
_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str) -> str:
    """``text`` with terminal control characters written as ``\\xNN`` / ``\\uNNNN`` escapes."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else
                         f"\\u{ord(m.group()):04x}", text)


# every control character and line or paragraph separator: a name shown on one line stays on it
_NAME_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def shown(name: object) -> str:
    """A name from a model or a file as the CLI prints it in a line or a table: every control character
    escaped, newlines and carriage returns included (the stream keeps those of the CLI's own text, so a node
    named ``"a\\nPASS: outputs match"`` forged a verdict line in the table; issue 24).

    Example:
        >>> shown("relu\\nPASS\\r")
        'relu\\\\nPASS\\\\r'
    """
    text = str(name)
    return _NAME_CONTROLS.sub(lambda m: _NAMED.get(m.group()) or (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                                                  else f"\\u{ord(m.group()):04x}"), text)


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


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
        try:
            self.stream.write(escape_controls(text))
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
