"""Workflows report every backend call by kind (graphbisect/backends/cost.py), on real IREE bugs.

``passes --target iree`` lists the fired features by compiling the model once per feature: those compiles are
counted (they were not: "invocations: target 6" hid 30 compiles), and the pass candidates that compile a
module the listing compiled already are served from the command's compile cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.backends import resolve
from graphbisect.backends.iree import FEATURES
from graphbisect.cli.main import main
from graphbisect.examples.iree_bugs import iree_bug_model
from graphbisect.model import load_model
from graphbisect.workflows.passes import PassesOptions, find_culprit_passes

iree_installed = pytest.mark.skipif(not resolve("iree", require_available=False)[1].availability().available,
                                    reason="iree-base-compiler is not installed (pip install 'graphbisect[iree]')")


@iree_installed
def test_iree_passes_counts_the_feature_listing_compiles_and_the_cache_hits() -> None:
    model, inputs, _ = iree_bug_model("f64-output", blocks=1)
    result = find_culprit_passes(load_model(model), inputs=inputs, options=PassesOptions(target="iree"))
    assert result.culprits == ("demote-f64-to-f32",)
    target = result.backend_calls["target"]
    assert target["runs"] == result.invocations["target"]
    # one run lists the fired features: the model, twice more for the compiler's noise, once per feature
    assert target["compiles"] + target["compile_cache_hits"] >= target["runs"] - 1 + 2 + len(FEATURES)
    # candidates disabling one feature compile what the listing compiled: served by the cache
    assert target["compile_cache_hits"] >= 1


@iree_installed
def test_compare_does_not_build_the_probe_after_the_plain_compile_crashed(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    model, inputs, _ = iree_bug_model("maxunpool")
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", **inputs)
    main(["compare", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "in.npz"), "--target", "iree",
          "--json", str(tmp_path / "r.json")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["backend_calls"]["target"] == {"runs": 1, "compiles": 1, "compile_cache_hits": 0}
    assert "probe model was not built" in (report["layerwise_note"] or "")
    assert "invocations: " in capsys.readouterr().out
