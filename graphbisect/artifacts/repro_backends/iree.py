"""The ``iree`` section of ``repro.py``: graphbisect's own IREE pipeline (backends/iree.py), embedded verbatim."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphbisect.artifacts.repro_backends._common import ReproBackend
from graphbisect.backends.inert import ANY, IREE_FLAGS
from graphbisect.backends.iree import IreeOptions, repro_section


def _iree_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The target CPU, iree-compile flags (features already turned into flags), opset and runtime device."""
    return IreeOptions.parse(options).to_json()


BACKEND = ReproBackend("iree", "iree-base-compiler, iree-base-runtime and onnx (the ONNX importer needs it)",
                       "iree-base-compiler", _iree_options, repro_section,
                       {"cpu": ANY, "flags": IREE_FLAGS, "opset": ANY, "device": ANY})
