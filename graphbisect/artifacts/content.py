"""What a bundle holds, as one value: the leaf the bundle writer, the report and the repro scripts read.

Its own module so that :mod:`.report` and :mod:`.repro` (which render it) and :mod:`.bundle` (which writes
it, using them) import in one direction: content ← report, repro ← bundle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphbisect.backends.base import BackendSpec
from graphbisect.compare import Tolerance
from graphbisect.oracle.signature import Signature

__all__ = ["BundleContent"]


@dataclass(frozen=True)
class BundleContent:
    """Everything a bundle holds, built by the reduce workflow (see the module docstring for the files).

    ``report`` holds JSON-able facts of the run: ``original_model`` (path, fingerprint, nodes),
    ``final_nodes``, ``kept_nodes``, ``invocations`` (per backend), ``seconds``, ``journey``
    (``[[invocations, size], ...]``), ``one_minimal``, ``stop_reason``, ``strategies``, ``versions``...;
    unknown keys are kept in report.json. ``charts`` maps chart names to SVG text.

    ``control`` is a spec of the same backend that must *not* fail on this model (e.g. the culprit passes
    disabled): ``repro.py`` runs it too and reports it. ``sections`` maps titles to extra markdown sections
    appended to ``report.md`` by the workflow that knows them (e.g. the passes before/after view). ``files``
    maps extra file names to their text (e.g. ``repro_min.py``).
    """

    model: onnx.ModelProto
    inputs: Mapping[str, np.ndarray]
    oracle_outputs: Mapping[str, np.ndarray]
    target_outputs: Mapping[str, np.ndarray]
    oracle: BackendSpec
    target: BackendSpec
    tolerance: Tolerance
    signature: Signature
    target_message: str | None
    report: Mapping[str, Any]
    charts: Mapping[str, str] = field(default_factory=dict)
    control: BackendSpec | None = None
    sections: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
