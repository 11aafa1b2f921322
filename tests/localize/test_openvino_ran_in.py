""""ran in i8" is said only where OpenVINO computed in i8 (issue 35, case 6).

OpenVINO 2026.4's execution graph reports ``runtimePrecision`` i8 for an int8-weight FullyConnected whether it
quantizes the activations (the CPU default group size 32, on a CPU with VNNI) or decompresses the weights and
computes in f32 (a CPU without VNNI, whatever the group size). The claim was made from the group size alone, so on
an AVX2-only CPU the report said "ran in i8 where the model computes f32" of a kernel that ran in f32. The truth
is measured here on the real backend (:func:`tests.cpu_premises.openvino_dynamic_quantization`: the default
compiled model's outputs against group size 0's), and the claim must follow it on whatever CPU runs the suite.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from graphbisect.backends import BackendProcess
from graphbisect.examples.quantized import int8_weight_model
from graphbisect.localize.compiled import compiled_graph
from graphbisect.localize.layerwise import constant_tensors
from tests.cpu_premises import openvino_dynamic_quantization

pytest.importorskip("openvino")

#: ONNX element types -> the short names compiled graphs use
SHORT = {onnx.TensorProto.FLOAT: "f32", onnx.TensorProto.INT8: "i8", onnx.TensorProto.UINT8: "u8",
         onnx.TensorProto.INT64: "i64", onnx.TensorProto.FLOAT16: "f16"}


def test_ran_in_i8_follows_what_the_cpu_computed(tmp_path: Path) -> None:
    model, inputs = int8_weight_model()
    path = tmp_path / "int8_weights.onnx"
    onnx.save(model, path)
    with BackendProcess("openvino:report_exec=1", workdir=tmp_path / "w") as proc:
        run = proc.run(path, inputs)
    assert run.ok, run.describe()
    graph = compiled_graph(model.graph.node, [o.name for o in model.graph.output], run.info,
                           constants={t.name: t for t in model.graph.initializer})
    assert graph is not None
    inferred = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: SHORT.get(v.type.tensor_type.elem_type)
             for v in [*inferred.input, *inferred.output, *inferred.value_info]}
    types.update({t.name: SHORT.get(t.data_type) for t in inferred.initializer})
    graph = graph.with_model(model.graph.node, types.get,
                             constant_tensors(model.graph.node, given={t.name for t in model.graph.initializer}))
    (fc,) = [node for node in graph.nodes if node.kind == "FullyConnected"]
    measured = openvino_dynamic_quantization()
    if measured.active:
        assert fc.precision_note() == "ran in i8 where the model computes f32", measured
    else:  # f32 both ways: nothing ran in i8, and nothing may say so
        assert fc.precision_note() == "", (fc.precision_note(), measured.reason)
        assert "ran in" not in graph.summary()
