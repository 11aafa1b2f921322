"""ONNX Runtime's CUDA execution provider as a real target (issue 23): runs only where onnxruntime-gpu sees a GPU.

Everywhere else the same behaviour is tested through ``tf32ort``, the TF32 stand-in
(tests/workflows/test_failure_identity.py). What was seen on an H100 before the noise floor existed:
``reduce --example`` returned the one TF32 MatMul ``/embed/MatMul`` at 2.1x tolerance, ``passes`` found "no set
of passes" and ``compare`` named that MatMul the first divergence.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import graphbisect as gb
from graphbisect.examples.bundled import example_inputs_path, example_model_path

CUDA = "onnxruntime:providers=CUDAExecutionProvider;CPUExecutionProvider"
EXAMPLE_LN = tuple(f"/blk10/norm/{n}" for n in ("ReduceMean", "Sub", "Pow", "ReduceMean_1", "Add", "Sqrt", "Div",
                                                 "Mul", "Add_1"))


def _cuda() -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu and an NVIDIA GPU (CUDAExecutionProvider not available)")


@pytest.mark.gpu
def test_cuda_ep_reduce_keeps_the_layernorm_above_the_tf32_floor(tmp_path: Path) -> None:
    _cuda()
    inputs = dict(np.load(example_inputs_path()))
    result = gb.reduce(example_model_path(), tmp_path / "bug", target=CUDA, inputs=inputs)
    assert set(EXAMPLE_LN) <= set(result.kept_nodes) and result.verified
    found = gb.compare(example_model_path(), target=CUDA, inputs=inputs)
    assert found.noise_floor is not None and found.noise_floor.spec is not None
    assert found.layerwise is not None and found.layerwise.first_divergence is not None
    assert found.layerwise.first_divergence.node.startswith("/blk10/norm/")


@pytest.mark.gpu
def test_cuda_ep_passes_name_the_layernorm_fusion() -> None:
    _cuda()
    result = gb.passes(example_model_path(), target=CUDA, inputs=dict(np.load(example_inputs_path())))
    assert "LayerNormFusionL1" in result.culprits and result.required == ("LayerNormFusionL1",)
