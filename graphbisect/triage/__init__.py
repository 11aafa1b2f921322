"""Batch triage: one outcome per model (:mod:`.outcome`) and grouping outcomes into distinct bugs (:mod:`.dedup`)."""

from __future__ import annotations

from graphbisect.triage.dedup import BugGroup, bug_key, group_bugs, pattern_hash
from graphbisect.triage.outcome import ModelOutcome

__all__ = ["BugGroup", "ModelOutcome", "bug_key", "group_bugs", "pattern_hash"]
