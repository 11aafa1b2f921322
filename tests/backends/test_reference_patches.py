"""onnx.reference as graphbisect runs it: Cast/CastLike to bfloat16 round to nearest even, and the reports say so.

Before: onnx 1.17's reference truncated float → bfloat16, so ``compare --oracle reference`` blamed ONNX Runtime
(which rounds, like OpenVINO, ml_dtypes and onnx 1.19's reference) for 3 of these 4 elements.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import ModelProto, TensorProto, helper

import graphbisect as gb

# 0.48033667, 0.49968487 and 0.81910545 round up to the next bfloat16; 0.47892547 is the same either way
VALUES = np.array([0.48033667, 0.49968487, 0.81910545, 0.47892547], np.float32)


def _model(nodes: list, inputs: list, opset: int = 21) -> ModelProto:  # type: ignore[type-arg]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    return model


def _cast(opset: int = 21, elem_type: int = TensorProto.FLOAT) -> ModelProto:
    return _model([helper.make_node("Cast", ["x"], ["y"], name="to_bf16", to=TensorProto.BFLOAT16)],
                  [helper.make_tensor_value_info("x", elem_type, [4])], opset)


def _cast_like() -> ModelProto:
    return _model([helper.make_node("CastLike", ["x", "like"], ["y"], name="like_bf16")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                   helper.make_tensor_value_info("like", TensorProto.BFLOAT16, [1])])


CASES = [
    ("Cast-21", _cast(), {"x": VALUES}),
    ("Cast-13", _cast(13), {"x": VALUES}),  # Cast_1: no saturate attribute
    ("Cast-double", _cast(21, TensorProto.DOUBLE), {"x": VALUES.astype(np.float64)}),
    ("CastLike", _cast_like(), {"x": VALUES, "like": np.zeros(1, ml_dtypes.bfloat16)}),
]


@pytest.mark.parametrize(("model", "inputs"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reference_oracle_agrees_with_onnxruntime_on_a_cast_to_bfloat16(model: ModelProto, inputs: dict) -> None:  # type: ignore[type-arg]
    result = gb.compare(model, oracle="reference", target="onnxruntime", inputs=inputs, layerwise=False)
    data = result.to_json()
    assert result.passed, data["outcome"]
    expected = VALUES.astype(ml_dtypes.bfloat16)
    assert np.asarray(result.oracle_run.outputs["y"]).view(np.uint16).tolist() == expected.view(np.uint16).tolist()
    patched = data["versions"]["oracle"]["patched"]  # type: ignore[index]
    assert any("bfloat16 round to nearest even" in line for line in patched), patched


def test_the_rounding_is_onnx_helpers_and_ml_dtypes_on_every_kind_of_float32() -> None:
    from graphbisect.backends.reference import bfloat16_bits

    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32),
                           np.array([0x3EF58000, 0x3EF68000, 0x7F7FFFFF, 0x00000001, 0x80000000, 0x7F800000],
                                    np.uint32)])  # ties to even both ways, max finite → inf, subnormal, -0, inf
    x = bits.view(np.float32)
    finite_or_inf = ~np.isnan(x)
    ours = bfloat16_bits(x)
    assert np.array_equal(ours[finite_or_inf], x[finite_or_inf].astype(ml_dtypes.bfloat16).view(np.uint16))
    assert set(ours[~finite_or_inf].tolist()) <= {0x7FC0}
    assert [helper.float32_to_bfloat16(float(v)) for v in x[:200]] == ours[:200].tolist()


def test_repro_min_is_not_written_when_plain_onnx_reference_would_compute_otherwise() -> None:
    """repro_min.py runs onnx.reference without graphbisect's patch: for a bfloat16 cast it would contradict the
    bundle, so it is left out and the report says why."""
    from graphbisect.artifacts.repro_min import render_repro_min
    from graphbisect.backends.base import BackendSpec
    from graphbisect.compare import Tolerance

    script, why = render_repro_min(_cast(), {"x": VALUES}, oracle=BackendSpec.parse("reference"),
                                   target=BackendSpec.parse("onnxruntime"), tolerance=Tolerance(), crash=False,
                                   title="t")
    assert script is None and "to_bf16" in why and "bfloat16" in why
    relu = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    plain, _ = render_repro_min(helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)]), {"x": VALUES},
                                oracle=BackendSpec.parse("reference"), target=BackendSpec.parse("onnxruntime"),
                                tolerance=Tolerance(), crash=False, title="t")
    assert plain is not None
