"""Dynamic dims are sized to exercise the graph, and every verdict that passed on sizes graphbisect chose says so.

Before, a dynamic batch dim silently took 1: `compare dyn.onnx` (input ``[N, 16]``, ONNX Runtime's keepdims=0
LayerNorm fusion) said PASS with "shape 1x16" and no word that N was dynamic or that ``--shape`` exists, while
``--shape x:16x16`` fails. compare, reduce, passes and precision draw inputs through one mechanism
(``graphbisect.data.chosen_dims``), so they all size the dim the same way and all say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import graphbisect as gb
from graphbisect.cli.main import main
from graphbisect.examples.patterns import pattern_model


def _dynamic_batch(proto: onnx.ModelProto, symbol: str = "N") -> onnx.ModelProto:
    """``proto`` with dim 0 of its inputs and outputs made the dynamic ``symbol`` (no value_info kept)."""
    for value in (*proto.graph.input, *proto.graph.output):
        dim = value.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = symbol
    del proto.graph.value_info[:]
    return proto


def _relu() -> onnx.ModelProto:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "dyn",
                              [vi("x", TensorProto.FLOAT, ["batch", 3])], [vi("y", TensorProto.FLOAT, ["batch", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_compare_sizes_n_so_the_layernorm_bug_shows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "dyn.onnx"
    onnx.save(_dynamic_batch(pattern_model("layernorm_keepdims0", width=16)), model)
    report = tmp_path / "r.json"
    assert main(["compare", str(model), "--json", str(report)]) == 1  # PASS at N = 1 before
    err = capsys.readouterr().err
    assert "x: float32 uniform in [-1, 1); dynamic dim 0 (N) sized 16 by graphbisect (--shape to choose), " \
           "shape 16x16" in err
    data = json.loads(report.read_text())
    assert data["input_shapes"] == {"x": [16, 16]}
    (dim,) = data["chosen_dims"]
    assert dim["size"] == 16 and "refuse 2 and accept 16" in dim["how"]  # [16,16] - [N] broadcasts only at 16


def test_every_verdict_that_passed_on_chosen_dims_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "relu.onnx"
    onnx.save(_relu(), model)
    said = "dynamic dims were sized by graphbisect, not by you: x[0] (batch) = 2"
    assert main(["compare", str(model)]) == 0
    out = capsys.readouterr().out
    assert "PASS: outputs match" in out and said in out and "--shape x:2x3" in out
    compared = gb.compare(model)
    assert compared.passed and compared.dims_note is not None and said in compared.dims_note
    reduced = gb.reduce(model, tmp_path / "bug")
    assert not reduced.failed and any(said in note for note in reduced.notes)
    assert json.loads((tmp_path / "bug" / "report.json").read_text())["chosen_dims"][0]["size"] == 2
    passes = gb.passes(model)
    assert not passes.failed and any(said in note for note in passes.notes)
    precision = gb.precision(model)
    assert precision.meets_tolerance and precision.dims_note is not None and said in precision.dims_note
    assert main(["precision", str(model), "--no-prefix"]) == 0
    assert said in capsys.readouterr().out
    # Sizes the user gave are not graphbisect's choice: nothing to say.
    assert gb.compare(model, shapes={"x": (4, 3)}).dims_note is None
