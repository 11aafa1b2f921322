"""Paddle's hooked tensors aligned with the converted ONNX model's, on real Paddle runs (issue 35, case 6)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from graphbisect.localize.paddle_hooks import align
from graphbisect.model import load_model
from graphbisect.model.paddle import program_ops

pytestmark = pytest.mark.paddle


def _hooked_run(prefix: Path, workdir: Path, tokens: np.ndarray) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """Paddle Inference with output hooks on ``prefix``: (its outputs, ``info()["hooked"]``)."""
    from graphbisect.backends.paddle import PaddleInference

    runtime = PaddleInference({"hooks": "1"}, str(workdir))
    runtime.load(str(prefix), None)
    outputs = runtime.run({"tokens": tokens})
    return outputs, list(runtime.info()["hooked"])


def _onnx_values(path: Path, tensors: list[str], tokens: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime's values of the converted model's main-graph ``tensors`` (exposed as outputs)."""
    from tests.paddle_models import ort_run

    proto = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    typed = {v.name: v for v in [*proto.graph.value_info, *proto.graph.output]}
    del proto.graph.output[:]
    proto.graph.output.extend(typed[name] for name in tensors)
    exposed = path.parent / f"{path.stem}.exposed.onnx"
    onnx.save(proto, str(exposed))
    return ort_run(exposed, {"tokens": tokens})


@pytest.mark.parametrize("steps", [1, 3, None])
def test_ops_of_a_loop_body_align_with_no_tensor_of_the_main_graph(tmp_path: Path, steps: int | None) -> None:
    """A shared embedding called before a ``while`` loop and inside it. Paddle labels ops by their position in
    their own block, so the body's ops reuse the main block's labels (``pd_op.embedding:0``) and run once per
    iteration: a hooked op that ran more than once, or inside the body, stands for no one tensor of the main
    graph. Every alignment must land on a tensor ONNX Runtime computes the same value for, under a key the run
    holds one value for. On main: the body's ``fc`` (one iteration) was aligned with the model's output, and the
    prompt's embedding with the value of the loop's last embedding (three iterations). ``None``: the second call
    is in the taken branch of an ``if`` instead."""
    pytest.importorskip("paddle2onnx")
    from tests.paddle_models import DECODER_INPUT, export_branch_net, export_greedy_decoder

    prefix = export_greedy_decoder(tmp_path / "decoder", steps=steps) if steps is not None \
        else export_branch_net(tmp_path / "branch")
    tokens = np.random.default_rng(0).integers(0, 16, DECODER_INPUT[1]).astype(np.int64)
    outputs, hooked = _hooked_run(prefix, tmp_path / "work", tokens)
    model = load_model(prefix)
    assert model.path is not None
    ops = program_ops(f"{prefix}.json", {name for node in model.nodes for name in node.output if name})
    assert ops is not None
    aligned = align(ops, hooked)
    assert aligned, "the prompt's ops align"
    keys = Counter(str(entry["key"]) for entry in hooked)
    assert [a.key for a in aligned if keys[a.key] != 1] == []
    expected = _onnx_values(model.path, [a.tensor for a in aligned], tokens)
    for a in aligned:
        # paddle2onnx writes a 0-D tensor of the program as [1] (compare reads it so, see workflows.compare)
        assert outputs[a.key].shape == expected[a.tensor].shape or (outputs[a.key].shape, expected[a.tensor].shape) \
            == ((), (1,)), (a, outputs[a.key].shape, expected[a.tensor].shape)
        np.testing.assert_allclose(outputs[a.key], expected[a.tensor], rtol=1e-5, atol=1e-6, err_msg=str(a))
