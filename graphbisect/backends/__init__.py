"""Backends: spec strings, the backend table and isolated worker processes.

Example:
    >>> from graphbisect.backends import BackendProcess, resolve
    >>> spec, info = resolve("ort:opt_level=basic")
    >>> str(spec), info.name
    ('onnxruntime:opt_level=basic', 'onnxruntime')

Importing this package needs only numpy: backend libraries are imported inside worker processes.
"""

from __future__ import annotations

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
