"""`precision --mode int8` says only what ran (issue 35, statement list in case 6), on small models built here.

* a model with a string input: calibration cast every tensor to float32 and the run exited 3; strings (and other
  non-float tensors) are now left as they are and the search runs;
* the ONNX Runtime ``quantize_static`` snippet: it quantized weights per tensor while the search measured them per
  channel; the snippet is run here (real ``onnxruntime.quantization``) and its model must meet the tolerance the
  answer reports, with the weight scales of the model the search verified;
* a bias int32 cannot hold at the calibrated scales (8.3e9 steps) was written wrapped, with only a numpy warning;
  its node now stays float with a note naming it and why, and the formats keep it out of int8 too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.cli.main import main

_OPSET = [helper.make_opsetid("", 17)]


def _save(tmp: Path, nodes: list[onnx.NodeProto], io: tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]],
          weights: dict[str, np.ndarray], feeds: dict[str, np.ndarray], *,
          opset: list[Any] = _OPSET) -> tuple[Path, Path]:
    """``tmp/model.onnx`` (graph ``io`` = (inputs, outputs)) and ``tmp/inputs.npz``."""
    inputs, outputs = io
    graph = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=opset)
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    tmp.mkdir(parents=True, exist_ok=True)
    onnx.save(model, tmp / "model.onnx")
    np.savez(tmp / "inputs.npz", **feeds)  # type: ignore[arg-type]
    return tmp / "model.onnx", tmp / "inputs.npz"


def _precision(model: Path, inputs: Path, tmp: Path, *options: str) -> tuple[int, dict[str, Any], Path]:
    out, report = tmp / "out", tmp / "r.json"
    code = main(["precision", str(model), "--mode", "int8", "--inputs", str(inputs), "--workdir", str(tmp / "work"),
                 "-o", str(out), "--json", str(report), *options])
    return code, json.loads(report.read_text()) if report.exists() else {}, out


def _outputs(path: Path | bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_string_input_is_left_as_it_is_and_int8_lowers_the_float_nodes(tmp_path: Path) -> None:
    """A LabelEncoder reads the string input; the float nodes after it are lowered. Before: exit 3, "could not
    convert string to float: 'a'" from the calibration of the string input."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("LabelEncoder", ["s"], ["code"], domain="ai.onnx.ml", keys_strings=["a", "b", "c"],
                         values_floats=[0.5, 1.5, 2.5], default_float=-1.0, name="encode"),
        helper.make_node("Unsqueeze", ["code", "axis"], ["code2"], name="unsqueeze"),
        helper.make_node("Mul", ["x", "code2"], ["xm"], name="scale"),
        helper.make_node("MatMul", ["xm", "W"], ["y"], name="project"),
    ]
    feeds = {"s": np.array(["a", "c", "b", "zz"]), "x": rng.standard_normal((4, 8)).astype(np.float32)}
    model, inputs = _save(
        tmp_path, nodes,
        ([helper.make_tensor_value_info("s", TensorProto.STRING, [4]),
          helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])]),
        {"W": rng.standard_normal((8, 4)).astype(np.float32), "axis": np.array([1], np.int64)}, feeds,
        opset=[*_OPSET, helper.make_opsetid("ai.onnx.ml", 3)])
    code, data, out = _precision(model, inputs, tmp_path, "--atol", "0.05", "--rtol", "0.05")
    assert code == 0, data
    assert data["units"] == 2 and data["meets_tolerance"] is True  # Mul and MatMul: the encoder is no unit
    mixed = onnx.load(str(out / "mixed_precision.onnx"))
    assert mixed.graph.input[0].type.tensor_type.elem_type == TensorProto.STRING
    assert "s__q" not in {o for n in mixed.graph.node for o in n.output}  # the strings are not quantized
    lowered = [n.op_type for n in mixed.graph.node]
    assert "LabelEncoder" in lowered and lowered.count("QuantizeLinear") >= 1
    got, want = _outputs(out / "mixed_precision.onnx", feeds)[0], _outputs(model, feeds)[0]
    assert np.all(np.abs(got - want) <= 0.05 + 0.05 * np.abs(want))


class _Reader:
    """The calibration inputs, as ``onnxruntime.quantization.CalibrationDataReader`` reads them."""

    def __init__(self, feeds: dict[str, np.ndarray]) -> None:
        self._left = [feeds]

    def get_next(self) -> dict[str, np.ndarray] | None:
        return self._left.pop() if self._left else None


def _weight_scales(path: Path) -> dict[str, np.ndarray]:
    """The scale of every DequantizeLinear whose input is an INT8 initializer (the weights), by initializer name."""
    model = onnx.load(str(path))
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {node.input[0]: values[node.input[1]] for node in model.graph.node
            if node.op_type == "DequantizeLinear" and values.get(node.input[0], np.zeros(0, np.uint8)).dtype == np.int8}


def test_the_onnxruntime_snippet_quantizes_as_the_search_did_and_meets_the_reported_tolerance(tmp_path: Path) -> None:
    """Weight columns 50x apart: per channel (what the search measured) every lowered node meets the tolerance,
    per tensor (what the snippet said before) the small columns round to a few levels and the model misses it.
    The snippet is run as written, with real onnxruntime.quantization."""
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((8, 4)).astype(np.float32)
    weight[:, 0] = 0.0
    weight[7, 0] = 50.0  # one large column, reading an input that is always 0
    x = rng.standard_normal((16, 8)).astype(np.float32)
    x[:, 7] = 0.0
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="project"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    model, inputs = _save(tmp_path, nodes, ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 8])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 4])]),
                          {"W": weight}, {"x": x})
    code, data, out = _precision(model, inputs, tmp_path, "--atol", "0.05", "--rtol", "0.05")
    assert code == 0 and data["meets_tolerance"] is True, data
    tol = data["tolerance"]
    snippet = json.loads((out / "overrides.json").read_text())["snippets"]["onnxruntime_quantization"]
    assert "per_channel=True" in snippet
    quantized = tmp_path / "snippet_int8.onnx"
    exec(snippet, {"fp32_path": str(model), "int8_path": str(quantized), "reader": _Reader({"x": x})})
    got, want = _outputs(quantized, {"x": x})[0], _outputs(model, {"x": x})[0]
    assert np.all(np.abs(got - want) <= tol["atol"] + tol["rtol"] * np.abs(want)), np.abs(got - want).max()
    # the same quantization: the weight scales of the snippet's model are those of the model the search verified
    searched, snipped = _weight_scales(out / "mixed_precision.onnx"), _weight_scales(quantized)
    assert len(searched) == len(snipped) == 1
    np.testing.assert_allclose(next(iter(snipped.values())), next(iter(searched.values())), rtol=1e-6)


def _overflowing_conv(tmp: Path, *, with_relu: bool) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """A Conv on a tiny input (range 1e-4) with tiny weights (1e-3) and a bias of 0.025: at scale
    x_scale * w_scale ~ 5e-12 the bias is ~4.7e9 steps, beyond int32."""
    rng = np.random.default_rng(2)
    x = (rng.random((1, 2, 6, 6)) * 1e-4).astype(np.float32)
    weights = {"W": (rng.standard_normal((3, 2, 3, 3)) * 1e-3).astype(np.float32),
               "B": np.array([0.025, -0.02, 0.01], np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c" if with_relu else "y"], name="tiny/conv", pads=[1] * 4)]
    if with_relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="tiny/relu"))
    model, inputs = _save(tmp, nodes, ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 6, 6])]),
                          weights, {"x": x})
    return model, inputs, {"x": x}


def test_a_bias_int32_cannot_hold_keeps_its_node_in_float_and_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the bias was cast to int32 wrapped (8e9 -> another number), the Conv a unit of the search, and the
    only sign a numpy RuntimeWarning."""
    model, inputs, feeds = _overflowing_conv(tmp_path, with_relu=True)
    code, data, out = _precision(model, inputs, tmp_path, "--atol", "1e-3", "--rtol", "1e-3")
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert [entry["node"] for entry in data["int8_float_nodes"]] == ["tiny/conv"]
    assert "beyond int32" in data["int8_float_nodes"][0]["why"] and "'B'" not in data["int8_float_nodes"][0]["why"]
    assert data["units"] == 1 and "tiny/conv" not in data["keep_fp32"]  # not searched, so not in the answer
    assert "kept in float by the int8 lowering" in printed and "tiny/conv: its bias B is 4.71e+09 steps" in printed
    assert "no searched node needs FP32" in printed
    mixed = onnx.load(str(out / "mixed_precision.onnx"))
    conv = next(n for n in mixed.graph.node if n.op_type == "Conv")
    assert list(conv.input) == ["x", "W", "B"]  # float, as in the model
    assert not [t.name for t in mixed.graph.initializer if t.data_type == TensorProto.INT32]
    overrides = json.loads((out / "overrides.json").read_text())
    assert "tiny/conv" in overrides["onnxruntime_nodes_to_exclude"] and overrides["int8_float_nodes"] == ["tiny/conv"]
    assert '"tiny/conv"' in overrides["snippets"]["onnxruntime_quantization"]
    got, want = _outputs(out / "mixed_precision.onnx", feeds)[0], _outputs(model, feeds)[0]
    assert np.all(np.abs(got - want) <= 1e-3 + 1e-3 * np.abs(want))


def test_a_model_whose_only_int8_node_cannot_take_its_bias_is_refused_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, inputs, _ = _overflowing_conv(tmp_path, with_relu=False)
    code, _, _ = _precision(model, inputs, tmp_path)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "no node that int8 can lower" in err and "tiny/conv stays float" in err and "beyond int32" in err
