"""Kept for imports written before :mod:`graphbisect.atomic` existed; use that module."""

from __future__ import annotations

from graphbisect.atomic import atomic_write_bytes, atomic_write_text

__all__ = ["atomic_write_bytes", "atomic_write_text"]
