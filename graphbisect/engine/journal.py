"""A crash-safe journal of test outcomes, so a killed reduction resumes where it died.

The journal is a JSON-lines file. Its first line is a header carrying a *fingerprint* of what is being
reduced (model, inputs, backend specs: the caller decides); every test then appends two lines::

    {"graphbisect_journal": 1, "fingerprint": "sha256:..."}
    {"key": "0-3,7", "state": "running"}                 <- before the test, flushed and fsynced
    {"key": "0-3,7", "outcome": "fail", "invoked": true, "detail": ...}   <- after it

Writing the pessimistic ``running`` line first is Polygraphy's trick: when a segfaulting backend (or
``kill -9``) takes the whole process down, the journal still says which candidate was being tested. On
resume that candidate is recorded as UNRESOLVED ("killed the previous run") and never tried again,
while every finished test pre-populates the cache, so no finished invocation is repeated. A test stopped
by Ctrl-C or by an exception is marked ``aborted`` instead, and is simply retried.

Keys are :func:`~graphbisect.engine.cache.encode_key` strings, optionally under a ``scope`` (one journal
can serve several unit spaces of one run, e.g. graph nodes and optimization passes).

Example:
    >>> import tempfile, pathlib
    >>> from graphbisect.engine import Outcome, TestResult
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.jsonl"
    >>> with Journal.open(path, fingerprint="abc", fsync=False) as j:
    ...     j.begin("0-3")
    ...     j.finish("0-3", TestResult(Outcome.FAIL))
    ...     j.begin("0-1")   # the process "dies" here
    >>> resumed = Journal.open(path, fingerprint="abc", fsync=False)
    >>> resumed.completed()["0-3"].outcome, resumed.completed()["0-1"].detail
    (<Outcome.FAIL: 'fail'>, 'killed the previous run')
    >>> resumed.close()
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from graphbisect.engine.cache import encode_key
from graphbisect.engine.types import Outcome, TestResult
from graphbisect.errors import GraphBisectError

try:  # advisory lock against two runs appending to one journal; POSIX only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["KILLED_DETAIL", "Journal", "JournalError"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
KILLED_DETAIL = "killed the previous run"
_HEADER_TAG = "graphbisect_journal"


class JournalError(GraphBisectError):
    """The journal cannot be used: another run's fingerprint, not a journal, corrupted, or locked."""


class Journal:
    """An append-only, fsynced JSON-lines record of test outcomes; open it with :meth:`open`."""

    def __init__(self, path: Path, handle: IO[str], fingerprint: str | None, *, fsync: bool) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self._handle = handle
        self._fsync = fsync
        self._completed: dict[tuple[str, str], TestResult] = {}
        self.killed: tuple[tuple[str, str], ...] = ()  # (scope, key) found running on open

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, fingerprint: str | None = None, fsync: bool = True) -> Journal:
        """Open (creating if needed) a journal and replay what an earlier run recorded in it.

        Raises :class:`JournalError` if the file belongs to a run with another ``fingerprint``, is not a
        journal, is corrupted, or is open in another process. ``fsync=False`` trades crash safety for
        speed (tests, benchmarks).
        """
        path = Path(path)
        try:
            handle = path.open("a+", encoding="utf-8")
        except OSError as exc:
            raise JournalError(f"cannot open journal {path}: {exc}", hint="check the path and permissions") from exc
        try:
            _lock(handle, path)
            journal = cls(path, handle, fingerprint, fsync=fsync)
            journal._replay()
        except BaseException:
            handle.close()
            raise
        return journal

    def completed(self, scope: str = "") -> dict[str, TestResult]:
        """Finished results of ``scope`` by key, including the candidates that killed an earlier run."""
        return {key: result for (s, key), result in self._completed.items() if s == scope}

    def results(self) -> list[TestResult]:
        """Every finished result, of every scope and session (what an account of the whole run sums)."""
        return list(self._completed.values())

    def begin(self, key: str | frozenset[int], *, scope: str = "") -> None:
        """Record, durably, that a test of ``key`` starts now."""
        self._append({**_where(scope, key), "state": "running"})

    def finish(self, key: str | frozenset[int], result: TestResult, *, scope: str = "") -> None:
        """Record the result of a test of ``key``."""
        where = _where(scope, key)
        self._completed[(scope, where["key"])] = result
        entry = {**where, "outcome": result.outcome.value, "invoked": result.invoked}
        if result.detail is not None:
            entry["detail"] = _jsonable(result.detail)
        self._append(entry)

    def abort(self, key: str | frozenset[int], *, scope: str = "") -> None:
        """Record that a test of ``key`` was stopped on purpose (Ctrl-C, an error): retry it on resume."""
        self._append({**_where(scope, key), "state": "aborted"})

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- replay ------------------------------------------------------------------------------------

    def _replay(self) -> None:
        self._drop_torn_tail()
        self._handle.seek(0)
        lines = self._handle.read().splitlines()
        if not lines:
            self._append({_HEADER_TAG: FORMAT_VERSION, "fingerprint": self.fingerprint})
            return
        self._check_header(lines[0])
        pending: dict[tuple[str, str], None] = {}
        for number, entry in self._entries(lines):
            self._apply(entry, pending, number)
        self._seal_killed([where for where in pending if where not in self._completed])

    def _drop_torn_tail(self) -> None:
        """Cut a last line without its newline: the previous run died while writing it.

        Every entry is written with its newline in one call, so such a tail is incomplete; cutting it
        (rather than appending after it) keeps every later line parseable.
        """
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            logger.warning("journal %s: dropping a torn last line (%d bytes)", self.path, len(data) - keep)
            self._handle.truncate(keep)

    def _check_header(self, line: str) -> None:
        try:
            header = json.loads(line)
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or _HEADER_TAG not in header:
            raise JournalError(
                f"{self.path} is not a graphbisect journal (its first line is not a journal header)",
                hint="pass a new journal path, or delete the file if it is a stale leftover",
            )
        if header.get("fingerprint") != self.fingerprint:
            raise JournalError(
                f"journal {self.path} was written by a run with fingerprint {header.get('fingerprint')!r}, "
                f"but this run has fingerprint {self.fingerprint!r}: its outcomes belong to another "
                "model, input set or backend configuration",
                hint="resume with the same model, inputs and backend specs, or start over with a new "
                "journal path (or delete this one)",
            )

    def _entries(self, lines: Sequence[str]) -> Iterator[tuple[int, dict[str, Any]]]:
        last = len(lines)
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                if number == last:  # a line torn by the death of the previous run: expected
                    logger.warning("journal %s: ignoring the torn last line %d", self.path, number)
                    continue
                raise JournalError(
                    f"journal {self.path} is corrupted at line {number}: {exc}",
                    hint="delete the journal to start over (finished tests will be repeated)",
                ) from exc
            yield number, entry

    def _apply(self, entry: dict[str, Any], pending: dict[tuple[str, str], None], number: int) -> None:
        try:
            where = (str(entry.get("scope", "")), str(entry["key"]))
            if "outcome" in entry:
                outcome = Outcome(entry["outcome"])
                self._completed[where] = TestResult(outcome, bool(entry.get("invoked", True)), entry.get("detail"))
                pending.pop(where, None)
            elif entry.get("state") == "running":
                pending[where] = None
            elif entry.get("state") == "aborted":
                pending.pop(where, None)
        except (KeyError, ValueError, TypeError) as exc:
            raise JournalError(
                f"journal {self.path} has an invalid entry at line {number}: {entry!r}",
                hint="it was not written by this version of graphbisect; delete it to start over",
            ) from exc

    def _seal_killed(self, killed: list[tuple[str, str]]) -> None:
        # Record the verdict now, so a third run does not see the same dangling "running" entry.
        for scope, key in killed:
            logger.warning(
                "journal %s: the previous run died while testing %s%s; it is recorded as UNRESOLVED "
                "and will not be tried again",
                self.path,
                f"{scope}:" if scope else "",
                key,
            )
            self.finish(key, TestResult(Outcome.UNRESOLVED, invoked=True, detail=KILLED_DETAIL), scope=scope)
        self.killed = tuple(killed)

    # -- writing -----------------------------------------------------------------------------------

    def _append(self, entry: dict[str, Any]) -> None:
        self._handle.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._handle.flush()
        if self._fsync:
            os.fsync(self._handle.fileno())


def _where(scope: str, key: str | frozenset[int]) -> dict[str, str]:
    text = key if isinstance(key, str) else encode_key(key)
    return {"scope": scope, "key": text} if scope else {"key": text}


def _jsonable(value: Any) -> Any:
    """A JSON-serializable form of ``detail``: dataclasses as dicts, enums as values, else ``repr``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    elif isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _lock(handle: IO[str], path: Path) -> None:
    if fcntl is None:  # pragma: no cover - Windows
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        raise JournalError(
            f"journal {path} is in use by another graphbisect run",
            hint="wait for that run to finish, or give this run its own journal path",
        ) from exc
