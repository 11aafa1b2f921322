"""graphbisect: turn "my model gives wrong results on backend X" into a minimal failing model artifact."""

from __future__ import annotations

from graphbisect._version import __version__

__all__ = ["__version__"]
