"""The `graphbisect` command. One table of subcommands drives the parser, the help and the docs.

The CLI is the only layer that prints. Exit codes: 0 = no failure found, 1 = a failure was found (a mismatch, a
crash, a failing artifact), 2 = usage or input error, or the machine's (out of memory or disk, a path that cannot
be written; with a hint how to fix it), 3 = an unexpected internal error (a graphbisect bug: never 1, which a
script would read as "failure found"), 130 = Ctrl-C, 143 = ``SIGTERM`` (129 ``SIGHUP``), in every phase
(docs/security.md, "Signals"), 141 = the reader of stdout (or stderr) went away
(``graphbisect backends | head -1``): the status a shell shows for git and other programs that SIGPIPE ends,
reached quietly, without a message.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from graphbisect._version import __version__
from graphbisect.backends.machine import memory_hint, out_of_memory
from graphbisect.cli.progress import show_backend_progress
from graphbisect.cli.terminal import OutputClosed, safe_terminal
from graphbisect.engine.arena import share_main_arena
from graphbisect.errors import GraphBisectError
from graphbisect.storage.atomic import NotARegularFile

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

EXIT_OK, EXIT_FAILURE_FOUND, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_OUTPUT_CLOSED = 128 + 13  # 128 + SIGPIPE (signal.SIGPIPE does not exist on Windows)


@dataclass(frozen=True)
class Command:
    name: str
    summary: str
    module: str  # module with add_arguments(parser) and run(args) -> int


COMMANDS: tuple[Command, ...] = (
    Command("backends", "list every backend, whether it is available here, its version and capabilities",
            "graphbisect.cli.backends_cmd"),
    Command("compare", "compare target against oracle: verdict, layerwise table, first divergence, root causes",
            "graphbisect.cli.compare_cmd"),
    Command("reduce", "shrink a failing model to a 1-minimal subgraph that fails the same way, as a bug-report bundle",
            "graphbisect.cli.reduce_cmd"),
    Command("passes", "name the optimization passes that cause the failure (minimal sets to disable and to enable), "
            "then optionally reduce the model under them", "graphbisect.cli.passes_cmd"),
    Command("precision", "the fewest nodes that must stay FP32 when the rest runs in fp16, bf16 or int8, with "
            "sensitivity ranking and overrides for TensorRT, ORT, Paddle, OpenVINO", "graphbisect.cli.precision_cmd"),
    Command("verify", "re-run a bundle's target: does its recorded failure still reproduce (exit 1) or is it fixed "
            "(exit 0; 4: fixed on the reduced model only, not shown for the original)?", "graphbisect.cli.verify_cmd"),
    Command("releases", "the first release of the backend package where a bundle's or a model's failure appears "
            "(or is fixed), each release in its own cached environment, judged by the failure's identity",
            "graphbisect.cli.releases_cmd"),
    Command("audit", "re-establish each claim of a bundle (fails, the same way, 1-minimal, flaky, lowest level...) "
            "with plain runs, by a checker that shares no code with the search", "graphbisect.cli.audit_cmd"),
    Command("tactics", "record, replay and diff per-node kernel choices; isolate the choices that make a build "
            "fail, confirmed by replay", "graphbisect.cli.tactics_cmd"),
    Command("triage", "compare, reduce, ablate passes and bundle every model of a folder, then group the failures "
            "into distinct bugs (local worker processes or a Ray cluster)", "graphbisect.cli.triage_cmd"),
)


def _module(command: Command) -> object:
    import importlib

    return importlib.import_module(command.module)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, only that command's arguments (the others are listed, their
    modules not imported: a run of one command does not pay for the imports of the nine others)."""
    parser = argparse.ArgumentParser(
        prog="graphbisect",
        description="Turn 'my model gives wrong results (or crashes) on backend X' into a minimal failing "
        "model artifact. Exit codes: 0 no failure, 1 failure found, 2 usage/input error, 3 internal error.",
    )
    parser.add_argument("--version", action="version", version=f"graphbisect {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for known in COMMANDS:
        p = sub.add_parser(known.name, help=known.summary, description=known.summary)
        if command is None or known.name == command:
            module = _module(known)
            module.add_arguments(p)  # type: ignore[attr-defined]
            p.set_defaults(_run=module.run)  # type: ignore[attr-defined]
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option: the global options take no value),
    or None (none, or not a command: then the whole parser says so)."""
    words = [word for word in argv if not word.startswith("-")]
    return words[0] if words and words[0] in {known.name for known in COMMANDS} else None


def _unwind_on_termination() -> dict[int, Any]:
    """``SIGTERM``/``SIGHUP`` raise ``SystemExit(128 + signal)`` so ``with`` blocks run: temporary work
    folders (an activation store can be hundreds of MB) and backend workers are cleaned up as on Ctrl-C.
    Returns the previous handlers."""

    def terminate(signum: int, _frame: object) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second signal ends the process at once
        raise SystemExit(128 + signum)

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[signum] = signal.signal(signum, terminate)
        except ValueError:  # not the main thread (main() called from a library user's thread)
            break
    return previous


def closed_output(exc: BaseException) -> OutputClosed | None:
    """The :class:`OutputClosed` that ``exc`` is or was raised ``from`` (a search wraps what its progress
    line raised), else ``None``. Not ``__context__``: a bug met while unwinding is still reported."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OutputClosed):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None


def _discard_output(stream: object) -> None:
    """Point the closed stream's descriptor at the null device, so the interpreter's final flush of what
    is still buffered does not print "Exception ignored ... BrokenPipeError" (Python's documented recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())  # type: ignore[attr-defined]
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no descriptor (a library user's StringIO): nothing to do
        pass


def main(argv: Sequence[str] | None = None) -> int:
    share_main_arena()  # before any thread leaves an arena behind (graphbisect.engine.arena)
    previous = _unwind_on_termination()
    try:
        with safe_terminal():  # names from a model never reach the terminal as control sequences
            try:
                code = _main(argv)
                sys.stdout.flush()  # a reader gone before the buffered rest shows here, not at exit
                return code
            except BaseException as exc:
                closed = closed_output(exc)
                if closed is None:
                    raise
                _discard_output(closed.stream)
                return EXIT_OUTPUT_CLOSED
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser(chosen_command(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (2, printed by argparse), --help or --version (0)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    show_backend_progress()
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "_run", None)
    if run is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return run(args)
    except KeyboardInterrupt:
        print("graphbisect: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if closed_output(exc) is not None:
            raise  # not an error: main() ends quietly
        return _report(args, exc)


#: Errors of the machine, not of graphbisect (issue 24: a full disk, a read-only folder, a file that is a
#: folder were "internal errors", exit 3): what to do about each.
_ENVIRONMENT = {
    errno.ENOSPC: "free space on that file system, or write elsewhere (-o, --workdir, TMPDIR)",
    errno.EDQUOT: "free space within your quota, or write elsewhere (-o, --workdir, TMPDIR)",
    errno.EFBIG: "write to a file system that takes larger files",
    errno.EROFS: "write to a writable file system",
    errno.EACCES: "check the permissions of that path, or choose another",
    errno.EPERM: "check the permissions of that path, or choose another",
    errno.EISDIR: "name a file, not a folder",
    errno.ENOTDIR: "a part of that path is a file, not a folder: choose another path",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.EMFILE: "raise the limit of open files (ulimit -n)",
    errno.ENFILE: "close other programs' files, or raise the system's limit of open files",
    errno.ENOMEM: "free memory, or run on a machine with more",
    errno.EIO: "the storage failed: check the disk",
}


def environment_error(exc: BaseException) -> tuple[str, str] | None:
    """(message, hint) when ``exc``, or an error it was raised from, is the machine's (out of memory or disk,
    a path that cannot be written), else None: such errors exit 2 with what to do, never 3 ("a graphbisect
    bug")."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        found = _machine_error(current)
        if found is not None:
            return found
        seen.add(id(current))
        current = current.__cause__
    return None


def _machine_error(exc: BaseException) -> tuple[str, str] | None:
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and out_of_memory(str(exc))):
        # RuntimeError: "can't start new thread", under ulimit -v (it was exit 3, "a graphbisect bug")
        return "out of memory" + (f": {exc}" if str(exc) else ""), memory_hint()
    if isinstance(exc, NotARegularFile):
        return str(exc), "name a new or regular file"
    if isinstance(exc, OSError) and exc.errno in _ENVIRONMENT:
        where = " ".join(f"{name}" for name in (exc.filename, exc.filename2) if name)
        return f"{exc.strerror or exc}{': ' + where if where else ''}", _ENVIRONMENT[exc.errno]
    return None


def _report(args: argparse.Namespace, exc: Exception) -> int:
    """Print ``exc`` for the user and return its exit code: 2 with the hint for a GraphBisectError or the
    machine's error (:func:`environment_error`), else 3."""
    environment = environment_error(exc)
    if environment is not None:
        message, hint = environment
        print(f"graphbisect {args.command}: error: {message}", file=sys.stderr)
        print(f"  hint: {hint}", file=sys.stderr)
        if args.verbose:
            traceback.print_exception(exc)
        return EXIT_USAGE
    if isinstance(exc, GraphBisectError):
        print(f"graphbisect {args.command}: error: {exc.message}", file=sys.stderr)
        if exc.cli_hint or exc.hint:  # the hint in flags where the code that raised wrote one (errors.py)
            print(f"  hint: {exc.cli_hint or exc.hint}", file=sys.stderr)
        if args.verbose and exc.__cause__ is not None:
            print(f"  caused by: {type(exc.__cause__).__name__}: {exc.__cause__}", file=sys.stderr)
        return EXIT_USAGE
    if args.verbose:
        traceback.print_exception(exc)
    print(f"graphbisect {args.command}: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
    print("  this is a graphbisect bug: please report it with the command line and the output of -v "
          "(which shows the traceback)", file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
