"""Parallel candidate tests allocate from the main malloc arena, which keeps freed pages (graphbisect.engine.arena)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import textwrap

import pytest

# A fresh interpreter (an arena an earlier thread of the test process left behind would be reused), whose
# parallel Evaluator's threads each allocate 10 MiB; glibc's malloc_stats then lists every arena on stderr.
_PROBE = textwrap.dedent("""
    import ctypes
    from graphbisect.engine import Evaluator, Outcome, TestResult

    def test(keep):
        blocks = [bytearray(16 << 10) for _ in range(640)]  # below the mmap threshold: from the thread's arena
        del blocks
        return TestResult(Outcome.PASS)

    with Evaluator(test, 4, jobs=2) as ev:
        ev.first_fail([frozenset({0}), frozenset({1}), frozenset({2}), frozenset({3})], phase="probe")
    ctypes.CDLL(None).malloc_stats()
""")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's per-thread arenas")
def test_parallel_tests_allocate_from_the_main_arena() -> None:
    """The test threads allocate from arena 0: an arena of their own gives a candidate's pages back to the
    kernel after its run and faults them in again for the next (+20 ms per candidate in precision -j 2)."""
    env = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, env=env)
    arenas = re.findall(r"^Arena (\d+):", out.stderr, flags=re.MULTILINE)
    assert arenas == ["0"], out.stderr
