"""NaN and Inf that make a comparison meaningless: warnings, never silent passes.

A NaN in the inputs that turns every output into NaN on both backends makes them "agree" (equal
non-finite values match), so the verdict would be PASS with cosine 1 although nothing was compared. Both
facts — non-finite inputs, and outputs that are NaN/Inf everywhere on both sides — are logged as warnings
(once per process and tensor), which every command shows on stderr.

Example:
    >>> import numpy as np
    >>> nonfinite_counts(np.array([1.0, np.nan, np.inf], np.float32))
    (1, 1)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import numpy as np

__all__ = ["nonfinite_counts", "warn_masked_outputs", "warn_nonfinite_inputs"]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
_warned: set[str] = set()  # one warning per message and process: inputs are validated more than once


def nonfinite_counts(array: Any) -> tuple[int, int]:
    """(NaN count, ±Inf count) of a float or complex array, in 1M-element chunks; (0, 0) for other dtypes.
    A sequence (list) counts its items; an empty optional (None) has none."""
    if array is None or isinstance(array, (list, tuple)):
        counts = [nonfinite_counts(item) for item in array or ()]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)
    flat = np.asarray(array).reshape(-1)
    if flat.dtype.kind not in "fc":
        return 0, 0
    nan = inf = 0
    for start in range(0, flat.size, _CHUNK):
        chunk = flat[start:start + _CHUNK]
        if np.isfinite(chunk.sum(dtype=np.float64 if chunk.dtype.kind == "f" else None)):
            continue  # the common case: a finite float64 sum means every value is finite
        nan += int(np.isnan(chunk).sum())
        inf += int(np.isinf(chunk).sum())
    return nan, inf


def warn_nonfinite_inputs(inputs: Mapping[str, Any]) -> list[str]:
    """Warn about every input holding NaN or Inf; returns the warnings."""
    messages = []
    for name, value in inputs.items():
        nan, inf = nonfinite_counts(value)
        if nan or inf:
            size = sum(np.size(v) for v in value) if isinstance(value, (list, tuple)) else np.size(value)
            messages.append(f"input {name!r} holds {nan} NaN and {inf} Inf of {size} values: "
                            "outputs computed from them may be NaN on both backends and compare as equal")
    for message in messages:
        _warn_once(message)
    return messages


class _Compared(Protocol):
    """What :func:`warn_masked_outputs` reads of a compared tensor (a :class:`~graphbisect.compare.TensorStats`)."""

    @property
    def name(self) -> str: ...

    @property
    def numel(self) -> int: ...

    @property
    def masked(self) -> bool: ...


def warn_masked_outputs(stats: Iterable[_Compared]) -> list[str]:
    """Warn about every compared tensor that is NaN/Inf everywhere on both sides; returns the warnings."""
    messages = [f"output {s.name!r} is NaN/Inf in all {s.numel} values on both backends: they agree, but "
                "nothing was compared (check the inputs for NaN/Inf)" for s in stats if s.masked]
    for message in messages:
        _warn_once(message)
    return messages


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)
