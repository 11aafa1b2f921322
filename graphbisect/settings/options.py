"""Declared ranges of option values, checked when an options object is built (from Python or the CLI).

An options dataclass declares what each field accepts with :func:`option` and calls :func:`check_fields`
in ``__post_init__``; a function that takes options as keywords calls :func:`check_value` on them. A value
out of range raises :class:`~graphbisect.errors.OptionError` naming the owner, the field, the value and what
is allowed, before anything runs (a negative budget or ``jobs=0`` would otherwise run with a meaningless
limit or fail deep inside a worker). The CLI's argument types (``cli/common.py``) parse text and check it
with the same :class:`Allowed` values, so both front ends accept exactly the same ranges.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Opts:
    ...     jobs: int = option(1, whole(1))
    ...     def __post_init__(self) -> None:
    ...         check_fields(self)
    >>> Opts(jobs=0)
    Traceback (most recent call last):
    ...
    graphbisect.errors.OptionError: Opts jobs=0 is not allowed: it must be a whole number >= 1
      hint: e.g. jobs=1

Standard library only at import time (the API imports it on its first call).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from graphbisect.errors import GraphBisectError, OptionError

__all__ = [
    "EXIT_CODE",
    "INVOCATIONS",
    "JOBS",
    "MAX_SECONDS",
    "SEED",
    "TIMEOUT",
    "Allowed",
    "cap_jobs",
    "check_fields",
    "check_value",
    "one_of",
    "option",
    "parses",
    "pattern",
    "real",
    "seconds",
    "usable_cpus",
    "whole",
]

_METADATA_KEY = "graphbisect.allowed"


@dataclass(frozen=True)
class Allowed:
    """The values an option accepts: ``test(value)`` is True for them, ``describe`` says which in words.

    ``optional``: ``None`` is accepted too and means what ``none_means`` says (no limit, the default).
    ``test`` may raise a :class:`~graphbisect.errors.GraphBisectError` that explains the problem better; its
    hint is kept and it becomes the cause.
    """

    describe: str
    test: Callable[[Any], bool]
    example: str
    optional: bool = False
    none_means: str = "no limit"

    def reason(self, value: Any) -> tuple[str, GraphBisectError | None] | None:
        """``None`` when ``value`` is allowed, else why not and the parser's error that says it (or None)."""
        if value is None and self.optional:
            return None
        try:
            if self.test(value):
                return None
        except GraphBisectError as exc:
            return exc.message, exc
        return "it must be " + self.describe + (" or None" if self.optional else ""), None

    def check(self, owner: str, name: str, value: Any) -> None:
        """Raise :class:`OptionError` unless ``value`` is allowed (``owner``/``name`` go into the message)."""
        found = self.reason(value)
        if found is None:
            return
        why, cause = found
        hint = f"e.g. {name}={self.example}" + (f", or {name}=None ({self.none_means})" if self.optional else "")
        raise OptionError(f"{owner} {name}={value!r} is not allowed: {why}",
                          hint=cause.hint if cause is not None and cause.hint else hint) from cause

    def or_none(self, means: str = "no limit") -> Allowed:
        """The same values, and ``None`` (meaning ``means``)."""
        return dataclasses.replace(self, optional=True, none_means=means)


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def whole(minimum: int, maximum: int | None = None, *, example: int | None = None) -> Allowed:
    """A whole number ``>= minimum`` (and ``<= maximum``)."""
    words = f"a whole number >= {minimum}" if maximum is None else f"a whole number from {minimum} to {maximum}"
    return Allowed(words, lambda v: _integer(v) and v >= minimum and (maximum is None or v <= maximum),
                   str(minimum if example is None else example))


def real(minimum: float = 0.0, *, example: str = "1e-4") -> Allowed:
    """A finite number ``>= minimum`` (an int or a float; not a bool, NaN or infinity).

    Example:
        >>> real().reason(float("nan"))
        ('it must be a finite number >= 0', None)
    """
    return Allowed(f"a finite number >= {minimum:g}", lambda v: _real(v) and v >= minimum, example)


#: The longest duration an option may give (about 115 days): more means "never", which no option means,
#: and the platform's timers overflow (``timeout=1e308`` ended in an internal error, issue 24).
MAX_SECONDS = 1e7


def seconds(*, zero: bool = False, example: str = "600") -> Allowed:
    """A finite number of seconds ``> 0`` (``>= 0`` with ``zero``), at most :data:`MAX_SECONDS`."""
    return Allowed("a number of seconds " + (">= 0" if zero else "> 0") + f" and <= {MAX_SECONDS:.0e}",
                   lambda v: _real(v) and (v >= 0 if zero else v > 0) and v <= MAX_SECONDS, example)


def one_of(choices: Iterable[str]) -> Allowed:
    """One of the names in ``choices``."""
    names = tuple(choices)
    return Allowed("one of " + ", ".join(names), lambda v: isinstance(v, str) and v in names, names[0])


def parses(parse: Callable[[str], object], describe: str, example: str) -> Allowed:
    """A string that ``parse`` accepts (``parse`` raises a GraphBisectError that says what is wrong)."""

    def test(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        parse(value)
        return True

    return Allowed(describe, test, example)


def _compiles(text: str) -> object:
    try:
        return re.compile(text)
    except re.error as exc:
        raise OptionError(f"{text!r} is not a valid regular expression ({exc})",
                          hint="escape special characters with \\ or re.escape") from exc


#: A Python regular expression that compiles.
pattern = parses(_compiles, "a Python regular expression", "'CUDA error'")


def option(default: Any, allowed: Allowed, **kwargs: Any) -> Any:
    """A dataclass field with ``default`` whose values :func:`check_fields` checks against ``allowed``."""
    return dataclasses.field(default=default, metadata={_METADATA_KEY: allowed}, **kwargs)


def check_fields(instance: Any) -> None:
    """Check every field of the dataclass ``instance`` declared with :func:`option` (call in ``__post_init__``)."""
    owner = type(instance).__name__
    for field in dataclasses.fields(instance):
        allowed = field.metadata.get(_METADATA_KEY)
        if allowed is not None:
            allowed.check(owner, field.name, getattr(instance, field.name))


def check_value(owner: str, name: str, value: Any, allowed: Allowed) -> Any:
    """Check one keyword option of a function (``owner``) against ``allowed``; returns ``value``."""
    allowed.check(owner, name, value)
    return value


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cap_jobs(jobs: int, option: str = "-j") -> tuple[int, str | None]:
    """``jobs`` worker processes on this machine, at most one per usable CPU: (the count, a note when capped).
    More workers than CPUs only share them (``-j 100000`` was accepted and started a worker per candidate).

    Example:
        >>> cap_jobs(1)
        (1, None)
    """
    usable = usable_cpus()
    if jobs <= usable:
        return jobs, None
    cpus = f"{usable} CPU" if usable == 1 else f"{usable} CPUs"
    return usable, f"{option} {jobs} is more workers than the {cpus} this process may use: running {usable}"


def cap_jobs_to_memory(jobs: int, peak: int | None, available: int, option: str = "-j") -> tuple[int, str | None]:
    """``jobs`` workers that each may need ``peak`` bytes (a worker's peak on the whole model: a candidate is a
    part of it), at most as many as ``available`` bytes hold, and at least one: (the count, a note when capped).
    ``peak`` None (not measured) caps nothing.

    Example:
        >>> jobs, note = cap_jobs_to_memory(8, 3 * 2**30, 10 * 2**30)
        >>> jobs, note.split(" (")[0], note.split(": ")[-1]
        (3, '-j 8 workers would need up to 24.0 GiB', 'running 3')
        >>> cap_jobs_to_memory(2, 3 * 2**30, 10 * 2**30)
        (2, None)
    """
    if jobs <= 1 or not peak or jobs * peak <= available:
        return jobs, None
    fits = max(1, available // peak)
    gib = 2.0 ** 30
    return fits, (f"{option} {jobs} workers would need up to {jobs * peak / gib:.1f} GiB (each target worker peaked "
                  f"at {peak / gib:.1f} GiB on the whole model) and {available / gib:.1f} GiB is available: "
                  f"running {fits}")


# --- the ranges the option classes share -------------------------------------------------------------------
#: A run budget: backend invocations (0: stop before the first candidate).
INVOCATIONS = whole(0, example=200).or_none()
#: Seconds one backend invocation may take.
TIMEOUT = seconds().or_none("the default, 600 s")
#: Worker processes.
JOBS = whole(1)
#: A seed of random inputs (numpy's generators take seeds >= 0).
SEED = whole(0)
#: A failing exit status of a program (``--fail-code``).
EXIT_CODE = whole(1, 255)
