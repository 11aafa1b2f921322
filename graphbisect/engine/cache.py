"""Outcome cache keyed by the (closed) keep-set, and the stable text form of keep-sets.

A keep-set's key is its sorted indices with runs written as ranges (``"0-3,7,9-12"``): stable across
processes and Python versions (unlike ``hash``), exact, and short for the contiguous sets delta debugging
mostly makes, so the cache and the journal stay small even for models with tens of thousands of nodes.

Example:
    >>> encode_key({0, 1, 2, 3, 7, 9, 10})
    '0-3,7,9-10'
    >>> sorted(decode_key('0-3,7'))
    [0, 1, 2, 3, 7]
    >>> from graphbisect.engine import Outcome, TestResult
    >>> cache = OutcomeCache()
    >>> cache.put(frozenset({1, 2}), TestResult(Outcome.PASS))
    >>> cache.get(frozenset({2, 1})).outcome
    <Outcome.PASS: 'pass'>
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from graphbisect.engine.types import Outcome, TestResult

__all__ = ["OutcomeCache", "decode_key", "encode_key"]

logger = logging.getLogger(__name__)


def encode_key(keep: Iterable[int]) -> str:
    """The canonical text key of a keep-set: sorted, runs of consecutive indices as ``a-b``."""
    items = sorted(set(keep))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


def decode_key(text: str) -> frozenset[int]:
    """Inverse of :func:`encode_key`; raises ``ValueError`` on malformed text."""
    units: set[int] = set()
    for part in filter(None, text.split(",")):
        first, sep, last = part.partition("-")
        units.update(range(int(first), int(last) + 1) if sep else (int(first),))
    return frozenset(units)


class OutcomeCache:
    """Test results by keep-set key. A hit never calls the test.

    Outcomes are cached whatever they are, including UNRESOLVED candidates rejected without invoking the
    backend: the test is deterministic (flakiness is the oracle's problem, handled before the search),
    so asking again could only cost time. Entries loaded from a journal are marked *replayed*.
    """

    def __init__(self) -> None:
        self._results: dict[str, TestResult] = {}
        self._replayed: set[str] = set()

    def __len__(self) -> int:
        return len(self._results)

    def __contains__(self, keep: object) -> bool:
        return isinstance(keep, (str, frozenset)) and self._key(keep) in self._results

    def __iter__(self) -> Iterator[str]:
        return iter(self._results)

    def get(self, keep: frozenset[int] | str) -> TestResult | None:
        """The cached result for a keep-set (or its key), or ``None``."""
        return self._results.get(self._key(keep))

    def put(self, keep: frozenset[int] | str, result: TestResult, *, replayed: bool = False) -> None:
        """Store a result; ``replayed`` marks one that came from an earlier run's journal."""
        key = self._key(keep)
        self._results[key] = result
        if replayed:
            self._replayed.add(key)
        else:
            self._replayed.discard(key)

    def was_replayed(self, keep: frozenset[int] | str) -> bool:
        return self._key(keep) in self._replayed

    def count(self, outcome: Outcome) -> int:
        """How many cached results have ``outcome``."""
        return sum(1 for r in self._results.values() if r.outcome is outcome)

    @staticmethod
    def _key(keep: frozenset[int] | str) -> str:
        return keep if isinstance(keep, str) else encode_key(keep)
