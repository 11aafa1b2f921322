"""The cyclic garbage collector, paused while a step makes thousands of objects that live on.

Why: CPython starts a collection every 700 new container objects and, every tenth of those, one of the older
generation, whose cost grows with everything alive. A step that builds a table of a 5,000-node model (the model's
node index, the compiled graph's mapping, a statistic per tensor) makes tens of thousands of objects that all
survive, so the collector runs ~100 times during it and finds nothing: 15-30 % of such a step's time
(``benchmarks/compare_parts_bench.py``). Paused, the objects are looked at once, by the first collection after.

The pause is scoped to the step and counted across threads: the collector runs again once the last paused step
ends, and a collector the caller had disabled stays disabled. Cycles made meanwhile are collected then, so a
pause costs no memory beyond the step.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["gc_paused"]


class _Pauses:
    """The steps inside :func:`gc_paused` now, in every thread, and whether the collector was enabled when the
    first of them began."""

    lock = threading.Lock()
    count = 0
    resume = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run the body with the cyclic garbage collector off (reference counting frees what it frees as always).

    Example:
        >>> import gc
        >>> with gc_paused():
        ...     gc.isenabled()
        False
        >>> gc.isenabled()
        True
    """
    with _Pauses.lock:
        if _Pauses.count == 0:
            _Pauses.resume = gc.isenabled()
            gc.disable()
        _Pauses.count += 1
    try:
        yield
    finally:
        with _Pauses.lock:
            _Pauses.count -= 1
            if _Pauses.count == 0 and _Pauses.resume:
                gc.enable()
