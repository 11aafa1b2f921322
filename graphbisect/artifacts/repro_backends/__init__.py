"""One module per backend with a standalone ``repro.py`` section: its script text, its options function and
its :class:`~graphbisect.artifacts.repro_backends._common.ReproBackend` value (``BACKEND``).

A new backend adds one module here and one line to :data:`REPRO_BACKENDS`. The import direction is one-way:
:mod:`graphbisect.artifacts.repro` imports this package, never the reverse.
"""

from __future__ import annotations

from collections.abc import Mapping

from graphbisect.artifacts.repro_backends import (
    command,
    iree,
    onnxoptimizer,
    onnxruntime,
    openvino,
    reference,
    tensorrt,
)
from graphbisect.artifacts.repro_backends._common import TACTICS_FILE, ReproBackend

__all__ = ["REPRO_BACKENDS", "TACTICS_FILE", "ReproBackend"]

#: Backend name -> how ``repro.py`` drives it (the order is the order of the former table).
REPRO_BACKENDS: Mapping[str, ReproBackend] = {
    module.BACKEND.name: module.BACKEND
    for module in (onnxruntime, reference, openvino, onnxoptimizer, tensorrt, command, iree)
}
