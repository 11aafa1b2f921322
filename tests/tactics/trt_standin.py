"""``StandInTensorRT``: a CPU stand-in for the subset of the ``tensorrt`` module that graphbisect.tactics calls.

**This is not TensorRT.** It mimics only the API surface :mod:`graphbisect.tactics.tensorrt` uses —
``BuilderFlag.EDITABLE_TIMING_CACHE/ERROR_ON_TIMING_CACHE_MISS``, ``TimingCacheKey.parse``,
``TimingCacheValue(tacticHash, timingMSec)``, ``ITimingCache.queryKeys/query/update`` and a builder config
with ``set_flag``, ``create_timing_cache``, ``set_timing_cache``, ``builder_optimization_level`` — plus a
toy ``build`` that "chooses" tactics the way the real builder would consult a timing cache: a cached entry
wins, a miss is timed (here: a deterministic pick) unless ERROR_ON_TIMING_CACHE_MISS is set.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

INVALID = 2**64 - 1


class BuilderFlag(enum.Enum):
    EDITABLE_TIMING_CACHE = "editable"
    ERROR_ON_TIMING_CACHE_MISS = "error_on_miss"


@dataclass(frozen=True)
class TimingCacheKey:
    text: str

    @staticmethod
    def parse(text: str) -> TimingCacheKey:
        if not (text.startswith("0x") and len(text) == 34):
            raise ValueError(f"bad key {text}")
        return TimingCacheKey(text.lower())

    def __str__(self) -> str:
        return self.text


@dataclass
class TimingCacheValue:
    tacticHash: int
    timingMSec: float


class ITimingCache:
    def __init__(self, editable: bool) -> None:
        self.entries: dict[TimingCacheKey, TimingCacheValue] = {}
        self.editable = editable

    def queryKeys(self) -> list[TimingCacheKey]:
        return list(self.entries)

    def query(self, key: TimingCacheKey) -> TimingCacheValue:
        return self.entries.get(key, TimingCacheValue(INVALID, -1.0))

    def update(self, key: TimingCacheKey, value: TimingCacheValue) -> bool:
        if not self.editable or value.timingMSec < 0:
            return False
        self.entries[key] = value
        return True


@dataclass
class IBuilderConfig:
    flags: set[BuilderFlag] = field(default_factory=set)
    builder_optimization_level: int = 3
    cache: ITimingCache | None = None

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(flag)

    def create_timing_cache(self, blob: bytes) -> ITimingCache:
        return ITimingCache(BuilderFlag.EDITABLE_TIMING_CACHE in self.flags)

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        self.cache = cache
        return True


class StandInTensorRT:
    """The stand-in module object (pass it where the code expects ``tensorrt``)."""

    BuilderFlag = BuilderFlag
    TimingCacheKey = TimingCacheKey
    TimingCacheValue = TimingCacheValue
    __version__ = "stand-in"

    @staticmethod
    def build(config: IBuilderConfig, layers: dict[str, list[int]]) -> list[str]:
        """Toy build: each layer has a key and candidate tactics; returns a verbose-style log."""
        log: list[str] = []
        for name, tactics in layers.items():
            key = TimingCacheKey("0x" + format(abs(hash(name)) % 16**32, "032x"))
            log.append(f"[V] [TRT] Computing costs for {name}")
            log.append(f"[V] [TRT] Timing cache key {key}")
            assert config.cache is not None and config.builder_optimization_level >= 1
            cached = config.cache.query(key)
            if cached.tacticHash == INVALID:
                if BuilderFlag.ERROR_ON_TIMING_CACHE_MISS in config.flags:
                    raise RuntimeError(f"timing cache miss for {name}")
                config.cache.entries[key] = TimingCacheValue(min(tactics), 0.5)
        return log
