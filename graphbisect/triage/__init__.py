"""Batch triage: one outcome per model (:mod:`.outcome`) and grouping outcomes into distinct bugs (:mod:`.dedup`).

Import from those modules: this package imports nothing, so that ``import graphbisect`` stays light and
``graphbisect.triage`` the *function* of the public API is not shadowed by this package.
"""

from __future__ import annotations

__all__: list[str] = []
