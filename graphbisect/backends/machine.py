"""What this machine lets a backend do: memory limits and the file names backend libraries can open.

Two failures look like a backend's and are the machine's (issue 36 item 8): a work folder whose name is not
valid UTF-8 (ONNX Runtime, OpenVINO and IREE take paths as UTF-8 text: ``InferenceSession`` refused the
path with a ``TypeError``) and a process out of memory (under ``ulimit -v 400000`` a library fails to map its
code, to start a thread or to allocate a buffer). Both ended in "the oracle … failed … choose another
oracle". :func:`unusable_path` finds the first, before a worker starts; :func:`out_of_memory` recognizes the
second in a backend's message and :func:`memory_hint` says what to do about it.

Standard library only (imported by the host and by workers).

Example:
    >>> unusable_path("/tmp/bad\\udcff/work") is not None, unusable_path("/tmp/good/work")
    (True, None)
    >>> out_of_memory("crash at load: MemoryError: std::bad_alloc"), out_of_memory("Gather: index out of range")
    (True, False)
"""

from __future__ import annotations

import os
import re

__all__ = ["address_space_limit", "memory_hint", "out_of_memory", "path_text", "unusable_path"]

#: What libraries say when an allocation, a mapping or a thread fails for want of memory: Python's
#: MemoryError, C++'s std::bad_alloc, ONNX Runtime's arena, the dynamic loader ("failed to map segment from
#: shared object"), errno ENOMEM and EAGAIN from a thread start, OpenVINO's and Paddle's own words.
_OUT_OF_MEMORY = re.compile(
    r"MemoryError|bad_alloc|Failed to allocate memory|failed to map segment|Cannot allocate memory|"
    r"can't start new thread|Resource temporarily unavailable|out of memory|ResourceExhausted",
    re.IGNORECASE)


def unusable_path(path: str | os.PathLike[str]) -> str | None:
    """Why backend libraries cannot open files under ``path`` (its name is not valid UTF-8), else None."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return ("its name is not valid UTF-8, and backend libraries (ONNX Runtime, OpenVINO, IREE) take file names "
                "as UTF-8 text")
    return None


def path_text(path: str | os.PathLike[str]) -> str:
    """``path`` as text that any terminal can print: bytes that are not UTF-8 as ``\\xff`` escapes.

    Example:
        >>> path_text("/tmp/bad\\udcff")
        '/tmp/bad\\\\xff'
    """
    return os.fsencode(os.fspath(path)).decode("utf-8", "backslashreplace")


def out_of_memory(message: str) -> bool:
    """Whether a backend's error ``message`` says that memory ran out (an allocation, a library's mapping or a
    thread could not be had), rather than that the model is wrong."""
    return bool(_OUT_OF_MEMORY.search(message))


def address_space_limit() -> int | None:
    """This process's address-space limit in bytes (``ulimit -v``, ``RLIMIT_AS``), None when unlimited."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def memory_hint() -> str:
    """What to do when a backend ran out of memory: raise the address-space limit when one is set (what it
    is), else free memory.

    Example:
        >>> "memory" in memory_hint()
        True
    """
    limit = address_space_limit()
    if limit is not None:
        return (f"the process ran out of memory under its address-space limit of {limit / 2**20:.0f} MiB "
                f"(ulimit -v {limit // 1024}): raise the limit (e.g. ulimit -v unlimited) and run again; "
                "the model and the backend are not at fault unless they need that much")
    return ("the process ran out of memory: close other programs, give smaller inputs or shapes, or run on a "
            "machine with more memory; the model and the backend are not at fault unless they need that much")
