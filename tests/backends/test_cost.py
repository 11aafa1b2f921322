"""Every backend call is counted by kind: runs, and the compiles behind them (graphbisect/backends/cost.py).

On real backends: ONNX Runtime builds one session for two runs of one model; IREE's ``report_passes=1``
compiles once per feature more inside one run, and a command's compile cache serves a repeat compile of the
same model and options.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from graphbisect.backends import resolve
from graphbisect.backends.cost import Cost
from graphbisect.backends.iree import FEATURES
from graphbisect.backends.process import BackendProcess, compile_cache
from graphbisect.examples.iree_bugs import iree_bug_model

iree_installed = pytest.mark.skipif(not resolve("iree", require_available=False)[1].availability().available,
                                    reason="iree-base-compiler is not installed (pip install 'graphbisect[iree]')")


def _model(tmp_path: Path, bug: str = "gridsample") -> tuple[Path, dict]:
    model, inputs, _ = iree_bug_model(bug)
    onnx.save(model, tmp_path / "m.onnx")
    return tmp_path / "m.onnx", inputs


def test_a_session_reused_by_the_next_run_is_one_compile_for_two_runs(tmp_path: Path) -> None:
    path, inputs = _model(tmp_path)
    with BackendProcess("onnxruntime", workdir=tmp_path / "w") as proc:
        first, second = proc.run(path, inputs), proc.run(path, inputs)
        assert (first.compiles, second.compiles) == (1, 0)
        assert proc.cost == Cost(runs=2, compiles=1)


@iree_installed
def test_iree_feature_listing_counts_every_compile_and_the_cache_serves_repeats(tmp_path: Path) -> None:
    path, inputs = _model(tmp_path)
    with compile_cache(tmp_path / "cache"):
        with BackendProcess("iree:report_passes=1", workdir=tmp_path / "listing") as proc:
            listing = proc.run(path, inputs)
        # the model, twice more for the compiler's noise, and once per feature: one run, 17 compiles
        assert listing.ok and listing.compiles == 1 + 2 + len(FEATURES)
        with BackendProcess("iree:disabled=const-eval", workdir=tmp_path / "candidate") as proc:
            candidate = proc.run(path, inputs)  # the listing compiled this very module
        assert candidate.ok and (candidate.compiles, candidate.compile_cache_hits) == (0, 1)
    with BackendProcess("iree:disabled=const-eval", workdir=tmp_path / "uncached") as proc:
        assert proc.run(path, inputs).compiles == 1  # no cache outside the block: compiled again
    with compile_cache(tmp_path / "cache"), BackendProcess("iree:cpu=generic", workdir=tmp_path / "cpu") as proc:
        assert proc.run(path, inputs).compiles == 1  # another target CPU is another key
