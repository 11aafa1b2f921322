"""A fork server for the bundle fuzzer (``tests/artifacts/test_fuzz_bundles.py``): one Python that has imported
graphbisect once, and forks a fresh process per command.

A damaged bundle is refused within milliseconds of loading it; starting Python and importing graphbisect takes
most of a second. So the fuzzer starts this server once (``fuzz_server.py BYTES``: it caps its address space,
``RLIMIT_AS``, at BYTES before it imports anything, and every command and worker it starts inherits the cap),
and sends it one request per command, a JSON line: ``{"kind": "graphbisect" | "script", "argv": [...], "cwd",
"env", "stdout", "stderr", "timeout"}``. The server forks; the child becomes what ``graphbisect ARGV`` or
``python SCRIPT ARGV`` would be (its own process group, stdin from ``/dev/null``, stdout and stderr to the named
files, the request's environment, working folder and ``sys.argv``), runs it and exits as that program would
(an uncaught exception prints its traceback and exits 1, as Python does; ``atexit`` handlers run). The server
answers a JSON line: ``{"code": exit status (-N for signal N), "maxrss_kb": the child's peak resident memory
(with the workers it waited for), "timed_out", "seconds"}``; a command still running at its timeout is killed
with its process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import runpy
import signal
import sys
import tempfile
import time
import traceback
from typing import Any


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the requested program and exit with its status (never returns)."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # read TMPDIR again
    os.chdir(request["cwd"])
    code: object = 0
    try:
        if request["kind"] == "graphbisect":
            from graphbisect.cli.main import main

            sys.argv = ["graphbisect", *request["argv"]]
            code = main(request["argv"])
        else:
            script, *args = request["argv"]
            sys.argv = [script, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    # Through the interpreter's own exit, as the program would end: atexit handlers run, streams are flushed.
    raise SystemExit(code)


def _wait(pid: int, timeout: float) -> dict[str, Any]:
    start = time.monotonic()
    timed_out = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > timeout:
            timed_out = True
            os.killpg(pid, signal.SIGKILL)
            done, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.005)
    with contextlib.suppress(ProcessLookupError, PermissionError):  # what the command left in its group goes
        os.killpg(pid, signal.SIGKILL)
    return {"code": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss, "timed_out": timed_out,
            "seconds": time.monotonic() - start}


def serve(address_space: int) -> None:
    """Cap the address space at ``address_space`` bytes (before anything is loaded: every command and every
    worker it starts inherits the cap), then read requests from stdin and answer on stdout until stdin closes."""
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    import numpy  # noqa: F401  (what every command imports: paid once)
    import onnx  # noqa: F401

    from graphbisect.cli.main import build_parser

    build_parser()  # imports every command's module: a server started now runs the code of now

    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps(_wait(pid, float(request["timeout"]))), flush=True)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
