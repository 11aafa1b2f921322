"""Lowering on real runtimes: FP16/BF16 rounding, typed islands, INT8 QDQ that ONNX Runtime runs as int8."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from graphbisect.backends import BackendProcess
from graphbisect.data import random_inputs
from graphbisect.examples.precision_models import cnn_inputs, residual_cnn
from graphbisect.model import load_model
from graphbisect.model.diff import describe_type
from graphbisect.model.io import save_proto
from graphbisect.precision.calibration import Calibration, weight_scales
from graphbisect.precision.casts import round_to
from graphbisect.precision.lowering import Lowering
from graphbisect.precision.modes import PrecisionMode, lowerable_nodes
from tests.declaration_models import WIDTH, declared_rank_layernorm


@pytest.fixture(scope="module")
def cnn() -> object:
    return load_model(residual_cnn())


def _run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp: Path, spec: str) -> tuple[np.ndarray, dict]:
    path = save_proto(proto, tmp / "m.onnx")
    with BackendProcess(spec, workdir=tmp / "w") as proc:
        run = proc.run(path, feeds)
        assert run.ok, run.describe()
        return np.asarray(run.outputs["logits"]), dict(run.info)


def test_round_to_matches_numpy_fp16_and_truncates_bf16_mantissa() -> None:
    x = np.array([70000.0, 1.0001, 3.14159, -2.5e-8], np.float32)
    assert np.isinf(round_to(x, PrecisionMode.FP16)[0])
    bf = round_to(x, PrecisionMode.BF16)
    assert bf[0] == 70144.0 and bf[1] == 1.0 and bf[2] == 3.140625
    assert weight_scales(np.array([[1.0, -2.0]], np.float32), axis=None) == pytest.approx(2 / 127)


def test_units_skip_data_movement_and_int8_skips_unquantizable_ops(cnn: object) -> None:
    fp16 = lowerable_nodes(cnn, PrecisionMode.FP16)  # type: ignore[arg-type]
    int8 = lowerable_nodes(cnn, PrecisionMode.INT8)  # type: ignore[arg-type]
    ops = {cnn.nodes[i].op_type for i in fp16}  # type: ignore[attr-defined]
    assert "Flatten" not in ops and {"Conv", "Relu", "Add", "Gemm"} <= ops
    assert set(int8) <= set(fp16)


@pytest.mark.parametrize("mode", [PrecisionMode.FP16, PrecisionMode.BF16])
def test_cast_lowering_keeps_fp32_exact_and_lowered_rounds(cnn: object, mode: PrecisionMode, tmp_path: Path) -> None:
    feeds = cnn_inputs()
    low = Lowering(cnn, mode)  # type: ignore[arg-type]
    everything = set(range(len(low.units)))
    reference, _ = _run(cnn.proto, feeds, tmp_path / "ref", "onnxruntime:opt_level=disable")  # type: ignore[attr-defined]
    kept, _ = _run(low.lower(everything), feeds, tmp_path / "kept", "onnxruntime:opt_level=all")
    np.testing.assert_allclose(kept, reference, rtol=1e-5, atol=1e-5)
    lowered, _ = _run(low.lower(set()), feeds, tmp_path / "low", "onnxruntime:opt_level=all")
    if mode is PrecisionMode.FP16:
        assert not np.isfinite(lowered).all()  # the outlier channel overflows fp16
    else:
        assert 0 < np.abs(lowered - reference).max() < 1.0  # bf16 has fp32's range: rounding only


def test_typed_fp16_model_is_valid_and_uses_float16_tensors(cnn: object, tmp_path: Path) -> None:
    low = Lowering(cnn, PrecisionMode.FP16, typed=True)  # type: ignore[arg-type]
    proto = low.lower({0, 1})
    onnx.checker.check_model(proto)
    casts = [n for n in proto.graph.node if n.op_type == "Cast"]
    assert casts and any(a.i == onnx.TensorProto.FLOAT16 for n in casts for a in n.attribute)
    _run(proto, cnn_inputs(), tmp_path, "onnxruntime:opt_level=disable")


def test_int8_qdq_runs_on_real_int8_kernels(cnn: object, tmp_path: Path) -> None:
    """ORT fuses the QDQ groups into QLinearConv/QLinearAdd/QGemm at opt_level=extended and above. The Gemm's bias
    is INT32 as ONNX Runtime's quantizer writes it: as a per-tensor INT8 initializer it kept ORT from fusing, so
    the search measured a float Gemm where a quantize_static deployment runs QGemm (issue 35)."""
    feeds = cnn_inputs()
    probe = cnn.with_outputs(cnn.intermediate_names())  # type: ignore[attr-defined]
    import onnxruntime as ort

    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    tensors = dict(zip(names, session.run(None, feeds))) | feeds
    low = Lowering(cnn, PrecisionMode.INT8, Calibration.from_tensors(tensors))  # type: ignore[arg-type]
    keep = {u for u in range(len(low.units)) if low.names([u])[0].startswith("block3/")}
    out, info = _run(low.lower(keep), feeds, tmp_path, "onnxruntime:opt_level=all,save_optimized=1")
    ops = Counter(n.op_type for n in onnx.load(info["optimized_model"]).graph.node)
    assert ops["QLinearConv"] >= 5 and ops["QLinearAdd"] >= 1, ops
    assert ops["QGemm"] == 1 and ops["Gemm"] == 0, ops
    reference = tensors["logits"]
    assert np.abs(out - reference).max() < 0.5 * np.abs(reference).max()


def test_random_inputs_feed_the_cnn(cnn: object) -> None:
    assert random_inputs(cnn, seed=0)["input"].shape == (1, 3, 16, 16)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [PrecisionMode.FP16, PrecisionMode.INT8])
def test_lowered_models_carry_the_users_declarations(mode: PrecisionMode, tmp_path: Path) -> None:
    """A precision candidate declares what a reduce candidate does: the user's value_info of the tensors it
    still computes, exposed tensors by ``Model.boundary_type``. ONNX Runtime's keepdims=0 LayerNorm mis-fusion
    needs ``h``'s declared rank, so the model with every node kept in FP32 must fail exactly as the user's
    model does (it dropped the value_info and computed the unfused, right result)."""
    model = load_model(declared_rank_layernorm())
    feeds = {"x": np.random.default_rng(1).standard_normal((WIDTH, WIDTH)).astype(np.float32)}
    calibration = Calibration.from_tensors({"x": feeds["x"]}) if mode is PrecisionMode.INT8 else None
    low = Lowering(model, mode, calibration)
    everything = set(range(len(low.units)))
    probe = low.lower(everything, expose=["c", "v"])
    assert [(v.name, describe_type(v)) for v in probe.graph.value_info] == [("h", "FLOAT[n,8]")]
    assert {v.name: describe_type(v) for v in probe.graph.output} == {"y": "FLOAT[rank unknown]", "c": "FLOAT[n,8]",
                                                                       "v": "FLOAT[n]"}
    kept = low.lower(everything)  # exposing the Sub output would block the fusion
    spec = "onnxruntime:opt_level=all"
    original = _values(model.proto, feeds, tmp_path / "original", spec)
    assert not np.allclose(original, _values(model.proto, feeds, tmp_path / "oracle", "onnxruntime:opt_level=disable"),
                           atol=1e-4)  # the mis-fusion
    np.testing.assert_array_equal(_values(kept, feeds, tmp_path / "kept", spec), original)


def _values(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp: Path, spec: str) -> np.ndarray:
    path = save_proto(proto, tmp / "m.onnx")
    with BackendProcess(spec, workdir=tmp / "w") as proc:
        run = proc.run(path, feeds)
        assert run.ok, run.describe()
        return np.asarray(run.outputs["y"])


def test_a_weight_two_nodes_quantize_along_different_axes_gets_a_tensor_for_each(tmp_path: Path) -> None:
    """Gemm(transB=1) quantizes its weight per row, MatMul per column: one initializer read by both must give
    two INT8 tensors, each with its own scales, and the MatMul must read its own (not the Gemm's)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8)).astype(np.float32) * np.arange(1, 9, dtype=np.float32)  # scales differ by axis
    nodes = [onnx.helper.make_node("Gemm", ["x", "W"], ["h"], name="gemm", transB=1),
             onnx.helper.make_node("MatMul", ["h", "W"], ["y"], name="matmul")]
    graph = onnx.helper.make_graph(
        nodes, "shared_weight", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])],
        [onnx.numpy_helper.from_array(w, "W")])
    model = load_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]))
    x = rng.standard_normal((1, 8)).astype(np.float32)
    h = x @ w.T
    low = Lowering(model, PrecisionMode.INT8, Calibration.from_tensors({"x": x, "h": h, "y": h @ w}))
    proto = low.lower(keep_fp32=())
    int8 = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer
            if t.data_type == onnx.TensorProto.INT8 and t.name.endswith("__int8")}
    assert len(int8) == 2, sorted(int8)
    dq = {n.output[0]: n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in int8}
    reads = {n.name: next(i for i in n.input if i in dq) for n in proto.graph.node if n.op_type in ("Gemm", "MatMul")}
    axes = {name: next(a.i for a in dq[out].attribute if a.name == "axis") for name, out in reads.items()}
    assert axes == {"gemm": 0, "matmul": 1}
    for name, axis in axes.items():  # each dequantized weight is W on its own per-channel grid
        scales = np.abs(w).max(axis=1 - axis) / 127
        grid = np.round(w / np.expand_dims(scales, 1 - axis)) * np.expand_dims(scales, 1 - axis)
        weight, scale = dq[reads[name]].input[:2]
        stored = onnx.numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == scale))
        np.testing.assert_allclose(int8[weight] * np.expand_dims(stored, 1 - axis), grid, rtol=1e-6, atol=1e-7)


def test_an_int32_bias_beyond_int32_is_refused_never_wrapped() -> None:
    """0.025 at scale 3e-12 is 8.3e9 steps: the cast to int32 wrapped it to another value with a numpy warning
    (issue 35). The lowering keeps such a node float (tests/workflows/test_precision_int8.py); writing one is a bug."""
    from graphbisect.precision.qdq import QdqConstants

    constants = QdqConstants(Calibration({}))
    with pytest.raises(ValueError, match="overflows"):
        constants.bias("b", np.array([0.025], np.float32), np.array([3e-12], np.float32))
    fits = numpy_helper.to_array(constants.bias("b", np.array([0.5], np.float32), np.array([2.0**-30], np.float32))[0])
    assert fits.dtype == np.int32 and fits.tolist() == [2**29]
