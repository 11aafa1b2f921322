"""TensorRT (>= 10.8, 11.x) tactics through the editable timing cache. **Not GPU-verified.**

TensorRT 10.8 deprecated ``IAlgorithmSelector`` (removed in 11.0), which Polygraphy's ``debug build`` and
``inspect diff-tactics`` rely on. Its replacement is the *editable timing cache*:

* **record**: build with ``BuilderFlag.EDITABLE_TIMING_CACHE`` and a fresh cache
  (``config.create_timing_cache(b"")`` + ``config.set_timing_cache(cache, False)``); afterwards every
  ``cache.queryKeys()`` key holds the chosen tactic (``cache.query(key).tacticHash``). Keys are mapped to
  layers from the verbose build log (:func:`keys_to_layers`), so a record's ``node`` is the layer name
  (which TensorRT's ONNX parser derives from the ONNX node name) and ``key`` the timing-cache key;
* **replay**: a fresh editable cache with every recorded ``(key, tactic)`` written by ``cache.update`` and
  ``BuilderFlag.ERROR_ON_TIMING_CACHE_MISS``, so a key the record does not cover fails the build instead
  of being re-timed; the builder's optimization level must be >= 1 for the cache to be consulted. The
  build is then re-recorded and compared (:func:`graphbisect.tactics.diff.unapplied`).

Every function takes the ``tensorrt`` module as an argument (``trt``), so tests drive them with a
stand-in (``tests/tactics/trt_standin.py``) on CPU. The API names follow the TensorRT Python API docs
(``ITimingCache.queryKeys/query/update``, ``TimingCacheKey.parse``, ``TimingCacheValue(tacticHash,
timingMSec)``); they have **not** been run against a real TensorRT here (no GPU), the verbose-log line
format used by :func:`keys_to_layers` is an assumption, and :mod:`graphbisect.backends.tensorrt` does not
call this module yet.

ONNX Runtime's CUDA EP would map the same way (not implemented): ``cudnn_conv_algo_search`` picks a cuDNN
algorithm per Conv (node = the Conv, choice = the algorithm id, replay via a fixed-algo provider option),
and TunableOp results (``tunable_op_enable``; ``get_tuning_results`` / ``set_tuning_results``) are
``(op signature, params) -> kernel id`` entries: key = signature+params, choice = kernel id.

Imports only the standard library.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from graphbisect.errors import BackendError
from graphbisect.tactics.record import TacticChoice, TacticRecord

__all__ = ["INVALID_TACTIC", "apply_record", "configure_record", "configure_replay", "keys_to_layers",
           "record_from_cache"]

logger = logging.getLogger(__name__)

INVALID_TACTIC = 2**64 - 1  # TimingCacheValue.kINVALID_TACTIC_HASH
_KEY = re.compile(r"0x[0-9a-fA-F]{32}")
_LAYER = re.compile(
    r"(?:Computing costs for|Autotuning (?:op|layer)|Timing Runner:|Layer\(\w+\):)\s*:?\s*(?P<name>[^\s,]+)")


def _new_cache(config: Any) -> Any:
    cache = config.create_timing_cache(b"")
    config.set_timing_cache(cache, False)
    return cache


def configure_record(trt: Any, config: Any) -> Any:
    """Make ``config`` record every tactic choice in a fresh editable timing cache; return the cache."""
    config.set_flag(trt.BuilderFlag.EDITABLE_TIMING_CACHE)
    config.builder_optimization_level = max(1, int(getattr(config, "builder_optimization_level", 3)))
    return _new_cache(config)


def configure_replay(trt: Any, config: Any, record: TacticRecord) -> Any:
    """Make ``config`` build with ``record``'s tactics: editable cache filled from it, misses are errors."""
    cache = configure_record(trt, config)
    config.set_flag(trt.BuilderFlag.ERROR_ON_TIMING_CACHE_MISS)
    failed = apply_record(trt, cache, record)
    if failed:
        raise BackendError(f"TensorRT refused {len(failed)} timing-cache entries: {', '.join(failed[:5])}",
                           hint="the record comes from another TensorRT version or GPU; record it again here")
    return cache


def apply_record(trt: Any, cache: Any, record: TacticRecord) -> list[str]:
    """Write ``record``'s (key, tactic) pairs into ``cache``; return the nodes whose update was refused."""
    failed: list[str] = []
    for choice in record.choices:
        if choice.key is None:
            logger.debug("no timing-cache key for %s: not replayable", choice.node)
            continue
        value = trt.TimingCacheValue(int(choice.choice, 16), 1.0)
        if not cache.update(trt.TimingCacheKey.parse(choice.key), value):
            failed.append(choice.node)
    return failed


def keys_to_layers(log_lines: Iterable[str]) -> dict[str, str]:
    """``timing-cache key -> layer name`` from a verbose build log (the last layer named before a key).

    Example:
        >>> keys_to_layers(["Computing costs for conv1", "key 0x" + "ab" * 16 + " tactic 0x5"])
        {'0xabababababababababababababababab': 'conv1'}
    """
    layer: str | None = None
    found: dict[str, str] = {}
    for line in log_lines:
        named = _LAYER.search(line)
        if named:
            layer = named.group("name")
        for key in _KEY.findall(line):
            if layer is not None:
                found.setdefault(key.lower(), layer)
    return found


def record_from_cache(cache: Any, key_layers: Mapping[str, str], *, version: str | None,
                      device: str | None) -> TacticRecord:
    """The tactic record of a build: one choice per timing-cache key with a valid tactic."""
    choices: list[TacticChoice] = []
    for key in cache.queryKeys():
        value = cache.query(key)
        if value.tacticHash == INVALID_TACTIC:
            continue
        text = str(key).lower()
        choices.append(TacticChoice(node=key_layers.get(text, text), choice=f"0x{value.tacticHash:016x}", key=text))
    return TacticRecord("tensorrt", version, device, tuple(choices))
