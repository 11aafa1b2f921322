"""Tactic records: record, diff and replay per-node kernel choices of a backend build.

* :mod:`.record` — :class:`TacticRecord` / :class:`TacticChoice` and their JSON files;
* :mod:`.diff` — :func:`diff_records`, :func:`compose` (the candidate build of a bisection),
  :func:`unapplied` (choices a replay did not honour);
* :mod:`.openvino` — the OpenVINO CPU plugin: execution graph → record, ``primitives_priority`` in the IR;
* :mod:`.tensorrt` — TensorRT ≥ 10.8: editable timing cache → record and replay (GPU only, not GPU-verified).

The isolation search is :mod:`graphbisect.strategies.tactics`, the workflow :mod:`graphbisect.workflows.tactics`.
Only the standard library is imported here: runtimes use these modules inside worker processes.
"""

from __future__ import annotations

from graphbisect.tactics.diff import ChoiceChange, NotApplied, RecordDiff, compose, diff_records, unapplied
from graphbisect.tactics.record import TacticChoice, TacticRecord, load_record, save_record

__all__ = [
    "ChoiceChange",
    "NotApplied",
    "RecordDiff",
    "TacticChoice",
    "TacticRecord",
    "compose",
    "diff_records",
    "load_record",
    "save_record",
    "unapplied",
]
