"""Artifacts: the bug-report bundle, its standalone ``repro.py``, reports and charts.

Example:
    >>> from graphbisect.artifacts import load_bundle, write_bundle
    >>> path = write_bundle(content, Path("out/bundle"), zip=True)   # doctest: +SKIP
    >>> load_bundle(path).signature.describe()                      # doctest: +SKIP
    'mismatch (values beyond tolerance), error ~1e3× tolerance'
"""

from __future__ import annotations

from graphbisect.artifacts.bundle import (
    BUNDLE_FORMAT,
    BundleContent,
    BundleError,
    LoadedBundle,
    is_bundle,
    load_bundle,
    write_bundle,
)
from graphbisect.artifacts.charts import ErrorPoint, error_chart_svg, size_journey_svg
from graphbisect.artifacts.environment import collect_environment
from graphbisect.artifacts.repro import crash_key, render_repro, repro_config

__all__ = [
    "BUNDLE_FORMAT",
    "BundleContent",
    "BundleError",
    "ErrorPoint",
    "LoadedBundle",
    "collect_environment",
    "crash_key",
    "error_chart_svg",
    "is_bundle",
    "load_bundle",
    "render_repro",
    "repro_config",
    "size_journey_svg",
    "write_bundle",
]
