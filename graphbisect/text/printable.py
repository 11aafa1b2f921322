"""Names from files as text: the one escaping every line graphbisect prints and every message it words uses.

Tensor and node names come from models anyone may have written. Printed raw, ``\\x1b]0;...\\x07`` retitles the
terminal, ``\\x1b[2J`` clears it, U+202E reorders what the user reads, and a newline starts a line the name
chose: a graph output named ``"y\\n\\nPASS: outputs match"`` made a forged ``PASS:`` the last line of a failing
``compare`` (issue 36 item 6). Two functions, one rule:

* :func:`escape_controls` — for text that may span lines (the CLI's own output, a backend's log): every control
  character but tab, newline and carriage return is written as an escape. The CLI's streams apply it to
  everything they print (:class:`graphbisect.cli.terminal.SafeStream`).
* :func:`shown` — for a name (or a one-line message holding names) wherever it is put into a line: newlines,
  carriage returns and line separators are escaped too, so a name stays inside its line. Every message that
  embeds a model's name (an outcome's "outputs differ: ...", a first divergence, a checker's evidence) embeds
  ``shown(name)``; the files graphbisect writes for programs (``report.json``, ``repro_config.json``) keep the
  exact names.

And one for the words around them: :func:`plural` agrees a count with its noun ("1 node", "2 nodes"), so no
line says "a model of 1 nodes" or "1 distinct bugs".

This module uses only the standard library: ``repro.py`` embeds its text verbatim (``embedded_source``), so a
bundle's script prints names the same way.

Example:
    >>> escape_controls("a\\x1b[31mb\\x00c\\n")
    'a\\\\x1b[31mb\\\\x00c\\n'
    >>> shown("relu\\nPASS\\r")
    'relu\\\\nPASS\\\\r'
"""

from __future__ import annotations

import re

__all__ = ["escape_controls", "plural", "shown"]

# C0 controls but \t \n \r, DEL, C1 controls, and the bidirectional overrides/isolates.
_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# every control character and line or paragraph separator: a name shown on one line stays on it
_NAME_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def escape_controls(text: str) -> str:
    """``text`` with terminal control characters written as ``\\xNN`` / ``\\uNNNN`` escapes; tabs, newlines and
    carriage returns kept."""
    return _CONTROLS.sub(lambda m: _escape(m.group()), text)


def shown(name: object) -> str:
    """A name from a model or a file as it is put into a line of text: every control character escaped,
    newlines and carriage returns included (a node named ``"a\\nPASS: outputs match"`` forged a verdict line
    in the table, issue 24; an output of that name the verdict line itself, issue 36).

    Example:
        >>> shown("relu\\nPASS\\r")
        'relu\\\\nPASS\\\\r'
    """
    return _NAME_CONTROLS.sub(lambda m: _escape(m.group()), str(name))


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun``, agreed: the noun as given for 1, else ``many`` (default: the noun with ``s``,
    ``es`` after s, x, ch or sh, ``ies`` for a consonant's ``y``).

    Example:
        >>> plural(1, "node"), plural(0, "node"), plural(2, "pass"), plural(3, "entry"), plural(2, "bug", "bugs")
        ('1 node', '0 nodes', '2 passes', '3 entries', '2 bugs')
    """
    if count == 1:
        return f"{count} {noun}"
    if many is None:
        if noun.endswith(("s", "x", "ch", "sh")):
            many = noun + "es"
        elif noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u", ""):
            many = noun[:-1] + "ies"
        else:
            many = noun + "s"
    return f"{count} {many}"
