"""Candidate-testing threads allocate from the process's main malloc arena (glibc), not one arena each.

With ``jobs`` > 1 the :class:`~graphbisect.engine.evaluator.Evaluator` tests candidates in threads. glibc
gives each new thread its own malloc arena; a candidate's buffers (a lowered ~10 MB model: its copy, its
serialization) are freed after its run, that arena hands the pages back to the kernel, and the next
candidate faults them in again. Measured on ``precision --mode int8 -j 2`` on PP-OCRv4 rec (43 candidates,
benchmarks/README.md): 369,000 minor page faults in the main process instead of 38,000 with ``-j 1``, 0.9 s
more kernel time (about 20 ms per candidate), the same user time. The main arena keeps freed memory for the
next allocation, so with one arena (glibc's ``M_ARENA_MAX`` = 1, what ``MALLOC_ARENA_MAX=1`` sets) ``-j 2``
costs what ``-j 1`` costs. The threads hold the GIL while they allocate, so sharing the arena's lock costs
nothing measurable.

The setting is process-wide and applies to threads created afterwards (an arena a finished thread left
behind is still reused), so the CLI sets it first thing; :class:`Evaluator` sets it before it starts its
threads, for library callers. A ``MALLOC_ARENA_MAX`` in the environment is the user's choice and is left
alone; on other C libraries this does nothing.

Example:
    >>> share_main_arena() in (True, False)
    True
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform

__all__ = ["share_main_arena"]

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # glibc's malloc.h
@functools.cache
def share_main_arena() -> bool:
    """Make threads created from now on allocate from the main malloc arena; True when that is in effect
    (glibc, set here or by ``MALLOC_ARENA_MAX``). Sets it once; setting it twice is harmless."""
    return _set_arena_max()


def _set_arena_max() -> bool:
    if os.environ.get("MALLOC_ARENA_MAX"):
        return True
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a static or unusual build: nothing to set
        log.debug("glibc's mallopt is not reachable: threads keep their own malloc arenas")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_ARENA_MAX, 1) == 1
    log.debug("malloc arenas limited to the main one: %s", ok)
    return ok
