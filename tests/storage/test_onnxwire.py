"""The outputs a model declares, read from its bytes without onnx (a ``command`` target's worker imports none)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from graphbisect.storage.onnxwire import FIELDS, declared_outputs


def test_the_field_numbers_are_onnxs() -> None:
    messages = {"ModelProto": onnx.ModelProto, "GraphProto": onnx.GraphProto, "ValueInfoProto": onnx.ValueInfoProto,
                "TypeProto": onnx.TypeProto, "TypeProto.Tensor": onnx.TypeProto.Tensor,
                "TensorShapeProto": onnx.TensorShapeProto,
                "TensorShapeProto.Dimension": onnx.TensorShapeProto.Dimension}
    for (message, field), number in FIELDS.items():
        assert messages[message].DESCRIPTOR.fields_by_name[field].number == number, (message, field)


def test_outputs_of_every_kind_of_shape(tmp_path: Path) -> None:
    outputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
               helper.make_tensor_value_info("b", TensorProto.INT64, []),
               helper.make_tensor_value_info("c\n\u00e9", TensorProto.FLOAT, None),
               helper.make_tensor_sequence_value_info("d", TensorProto.FLOAT, [2])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Identity", ["x"], [o.name]) for o in outputs]
    big = helper.make_tensor("w", TensorProto.FLOAT, [1 << 16], [0.0] * (1 << 16))  # stepped over, not parsed
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outputs, [big]))
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = -1  # negative: not a size
    onnx.save(model, tmp_path / "m.onnx")
    assert declared_outputs(tmp_path / "m.onnx") == {"a": (None, None), "b": (), "c\n\u00e9": None, "d": None}


def test_what_is_not_a_model_is_a_value_error(tmp_path: Path) -> None:
    for data in (b"", b"\xff\xff\xff", b"\x3a\x10ab"):  # empty, a varint past the end, a field past the end
        (tmp_path / "bad.onnx").write_bytes(data)
        with pytest.raises(ValueError):
            declared_outputs(tmp_path / "bad.onnx")


def test_a_command_worker_imports_no_onnx() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys, graphbisect.backends.command; "
                           "print(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'google')))"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
