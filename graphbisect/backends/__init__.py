"""Backends: spec strings, the backend table and isolated worker processes.

Example:
    >>> from graphbisect.backends import BackendProcess, resolve
    >>> spec, info = resolve("ort:opt_level=basic")
    >>> str(spec), info.name
    ('onnxruntime:opt_level=basic', 'onnxruntime')

Importing this package imports only the standard library: each name below is imported from its module on first
use (a backend worker imports :mod:`.worker` alone); backend libraries are imported inside worker processes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphbisect.backends.base import BackendSpec, Capability, Phase, RunResult, RunStatus
    from graphbisect.backends.process import BackendProcess
    from graphbisect.backends.registry import BACKENDS, BackendInfo, get, resolve

__all__ = [
    "BACKENDS",
    "BackendInfo",
    "BackendProcess",
    "BackendSpec",
    "Capability",
    "Phase",
    "RunResult",
    "RunStatus",
    "get",
    "resolve",
]

_HOMES = {
    **dict.fromkeys(("BackendSpec", "Capability", "Phase", "RunResult", "RunStatus"), "graphbisect.backends.base"),
    "BackendProcess": "graphbisect.backends.process",
    **dict.fromkeys(("BACKENDS", "BackendInfo", "get", "resolve"), "graphbisect.backends.registry"),
}


def __getattr__(name: str) -> Any:
    """A name above, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
