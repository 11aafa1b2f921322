"""`compare`, `reduce` and `triage` on a model whose weights are external data (a few MB standing in for > 2 GB).

The weights stay on disk in the user's file (see :mod:`graphbisect.model.external`); the workflows must
find the same bug as on the inline model, write a self-contained bundle, and leave the user's files alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models
from graphbisect.workflows.reduce import ReduceOptions, reduce_model, work_dir_for
from graphbisect.workflows.triage import triage
from tests.model.model_builders import external_chain_model, run


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}


@pytest.mark.parametrize("layerwise", [False, True])
def test_compare_finds_the_bug_with_weights_on_disk(tmp_path: Path, layerwise: bool) -> None:
    path, inline, feeds = external_chain_model(tmp_path / "user")
    before = _snapshot(path.parent)
    model = load_model(path)
    result = compare_models(model, inputs=feeds, workdir=tmp_path / "work", layerwise=layerwise)
    expected = compare_models(load_model(inline), inputs=feeds, layerwise=layerwise)
    assert not result.passed and not expected.passed
    assert result.comparison is not None and expected.comparison is not None
    assert result.comparison.outputs[0].score == expected.comparison.outputs[0].score
    saved = tmp_path / "work" / "model.onnx.data.0"  # the user's weights, linked: no copy
    assert saved.exists() and os.path.samefile(saved, path.parent / "model.onnx.data")
    assert _snapshot(path.parent) == before


def test_reduce_bundles_the_bug_with_its_weights_inline(tmp_path: Path) -> None:
    path, _, feeds = external_chain_model(tmp_path / "user")
    before = _snapshot(path.parent)
    bundle = tmp_path / "bug"
    result = reduce_model(load_model(path), bundle, inputs=feeds, options=ReduceOptions(keep_work=True))
    assert result.failed and result.one_minimal and result.verified
    assert all("norm" in name for name in result.kept_nodes)  # the LayerNorm's core, nothing of the chain
    shared = work_dir_for(bundle) / "candidates" / "weights.bin.0"
    assert os.path.samefile(shared, path.parent / "model.onnx.data")  # candidates read the user's weights
    proto = onnx.load(str(bundle / "model.onnx"))
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in proto.graph.initializer)
    assert sorted(p.name for p in bundle.iterdir() if p.name.endswith((".data", ".bin"))) == []
    with np.load(bundle / "inputs.npz") as data:
        run(bundle / "model.onnx", {k: data[k] for k in data.files})  # self-contained: runs on its own
    repro = subprocess.run([sys.executable, str(bundle / "repro.py")], capture_output=True, text=True, timeout=120,
                           check=False)
    assert repro.returncode == 1, repro.stdout + repro.stderr
    assert _snapshot(path.parent) == before


def test_triage_of_a_folder_with_external_data(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    _, _, feeds = external_chain_model(folder)
    np.savez(folder / "model.npz", **feeds)
    before = _snapshot(folder)
    result = triage(folder, tmp_path / "out", executor="local", jobs=1)
    (outcome,) = result.outcomes
    assert outcome.status == "failed" and outcome.one_minimal, outcome.message
    assert outcome.culprits  # LayerNormFusionL1 / SimplifiedLayerNormFusion
    assert len(result.bugs) == 1
    assert _snapshot(folder) == before


def test_reduce_leaves_no_weight_copies_behind(tmp_path: Path) -> None:
    """Probes and the saved optimized graph (ONNX Runtime writes every weight beside it) are removed with
    their data files: the work folder holds the user's weights once, as links."""
    path, _, feeds = external_chain_model(tmp_path / "user")
    reduce_model(load_model(path), tmp_path / "bug", inputs=feeds, options=ReduceOptions(keep_work=True))
    work = work_dir_for(tmp_path / "bug")
    assert not (work / "baseline-saving").exists()
    leftovers = [p.relative_to(work) for p in work.rglob("*.data*") if not p.name.startswith("model.onnx.data")]
    assert leftovers == []


def test_int8_precision_reads_weights_kept_on_disk(tmp_path: Path) -> None:
    from graphbisect.workflows.precision import find_precision

    path, inline, feeds = external_chain_model(tmp_path / "user")
    before = _snapshot(path.parent)
    # The chain's LayerNorm bug needs ORT's fusions: with them off the FP32 model is right, and the QDQ
    # rewrite (which quantizes each lowered node's weights) is what is tested.
    target = "onnxruntime:opt_level=disable"
    on_disk = find_precision(load_model(path), mode="int8", inputs=feeds, with_prefix=False, target=target)
    in_memory = find_precision(load_model(inline), mode="int8", inputs=feeds, with_prefix=False, target=target)
    assert on_disk.keep_fp32 == in_memory.keep_fp32 and on_disk.meets_tolerance == in_memory.meets_tolerance
    assert _snapshot(path.parent) == before
