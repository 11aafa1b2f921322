"""The trusted checker: each claim of a bundle re-established with plain runs (``graphbisect audit``).

The search (``reduce``, ``passes``, ``precision``, ``triage``) may use every trick — probes that expose
intermediate tensors, outcome caches, priors, descriptions of compiled graphs — and none of it may reach a
claim a user reads. This package checks a bundle's claims the way a proof checker checks a solver: it imports
nothing from the search (``engine``, ``strategies``, ``localize``, ``oracle``, ``compare``, ``workflows``), runs
each model as a user's script would (its own outputs, a worker of its own, no compile cache), compares with its
own rule and builds its own single-node removals. ``tests/checker/test_independence.py`` holds the import rule.

Example:
    >>> from graphbisect.checker import audit_bundle
    >>> result = audit_bundle("bug-report")                                   # doctest: +SKIP
    >>> [(c.id, c.holds) for c in result.claims]                              # doctest: +SKIP
    [('expected_outputs', True), ('failure', True), ('identity', True), ...]
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from graphbisect.artifacts.bundle_read import BundleError, read_bundle, recorded_origin
from graphbisect.backends.registry import require_backend, untrusted_options
from graphbisect.checker.audit import (
    MAX_REMOVALS,
    Audit,
    BundleFiles,
    Claim,
    OutputCheck,
    audit_files,
    normalize_message,
)

__all__ = ["Audit", "Claim", "audit_bundle", "normalize_message"]

#: The bundle's own tactic record, which a recorded ``tactics=`` option may name (see the trust rule).
_OWN_FILES = ("tactics.json",)


def audit_bundle(bundle: str | os.PathLike[str], *, trust: bool = False,
                 progress: Callable[[str], None] | None = None, max_removals: int = MAX_REMOVALS,
                 workdir: Path | None = None, check: OutputCheck | None = None) -> Audit:
    """Check every claim of ``bundle`` (a folder or ``.zip`` written by ``graphbisect reduce``) with plain runs.

    The bundle is data (the trust rule): its recorded oracle and target run only when every option of theirs is
    known to be inert, else only with ``trust``. Raises :class:`~graphbisect.artifacts.bundle_read.BundleError` for a
    bundle that cannot be read, is damaged, or names an untrusted spec without ``trust``. The checker's scratch
    files and workers' folders go in ``workdir`` (default: the system's temporary folder), removed after.
    ``check``: the Python output check of a bundle reduced with ``reduce(check=...)``, which judges its runs.
    """
    with read_bundle(Path(bundle)) as loaded:
        for spec in (loaded.oracle, loaded.target):  # a custom backend this process lacks: how to register it
            require_backend(spec, recorded_origin(loaded.path), str(loaded.source))
        if not trust:
            _check_trust(loaded.path, {"oracle": loaded.oracle, "target": loaded.target})
        files = BundleFiles(loaded.path, loaded.report, loaded.oracle, loaded.target, loaded.inputs,
                            loaded.oracle_outputs, loaded.target_outputs)
        result = audit_files(files, progress=progress, max_removals=max_removals, workdir=workdir,
                             check=check)
    return Audit(str(bundle), result.claims, result.calls, result.seconds)


def _check_trust(folder: Path, specs: dict[str, object]) -> None:
    found = [f"{role} {spec}: {u.describe()}" for role, spec in specs.items()
             for u in untrusted_options(str(spec), own_files=[str(folder / name) for name in _OWN_FILES])]
    if found:
        listed = "".join(f"\n  {line}" for line in found)
        raise BundleError(f"the bundle's recorded specs set options not known to be inert (they may run a program, "
                          f"load a library or write a file), chosen by whoever wrote the bundle:{listed}",
                          hint="read the bundle's report.json; to run them anyway pass --trust (trust=True)")
