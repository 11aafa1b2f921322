"""Tensors of the types numpy lacks (bfloat16, float8, int4) reach OpenVINO, Paddle and a command's program
with their values, or are refused as unsupported naming the tensor and its type: never silently changed.

Before: OpenVINO read a bfloat16 input's bits as another type (1.5 squared gave 0.0156), a bfloat16
output came back as float16 bits (1.5 read as 1.9375) and an int4 input crashed with a broadcast error,
each reported as a bug of the target.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from onnx import ModelProto, TensorProto, helper

import graphbisect as gb
from graphbisect.backends.base import Phase, RunResult, RunStatus
from graphbisect.oracle.outcome import OutcomeClass, classify_failed_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paddle_models import export_cast_net

VALUES = np.array([1.5, -2.25, 3.0, 0.5, -7.0], np.float32)


def _cast_square(elem_type: int, n: int = 5) -> ModelProto:
    """y = float(x)² for an ``x`` of ``elem_type``: the output shows the input's values."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT), helper.make_node("Mul", ["c", "c"], ["y"])],
        "cast_square", [helper.make_tensor_value_info("x", elem_type, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _cast_to(elem_type: int, n: int = 5) -> ModelProto:
    """y = x cast to ``elem_type``: the output is of a type numpy lacks."""
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=elem_type)], "cast_to",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", elem_type, [n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


TYPED_INPUTS = [
    (TensorProto.BFLOAT16, VALUES.astype(ml_dtypes.bfloat16)),
    (TensorProto.FLOAT8E4M3FN, VALUES.astype(ml_dtypes.float8_e4m3fn)),
    (TensorProto.FLOAT8E5M2, VALUES.astype(ml_dtypes.float8_e5m2)),
    (TensorProto.INT4, np.array([1, -2, 3, 7, -8], ml_dtypes.int4)),
    (TensorProto.UINT4, np.array([1, 2, 3, 15, 0], ml_dtypes.uint4)),  # odd count: the last byte half used
]


@pytest.mark.openvino
@pytest.mark.parametrize(("elem_type", "x"), TYPED_INPUTS, ids=[str(x.dtype) for _, x in TYPED_INPUTS])
def test_openvino_takes_inputs_of_types_numpy_lacks_with_their_values(elem_type: int, x: np.ndarray) -> None:
    pytest.importorskip("openvino")
    result = gb.compare(_cast_square(elem_type), oracle="onnxruntime", target="openvino", inputs={"x": x},
                        layerwise=False)
    assert result.passed, result.to_json()["outcome"]


@pytest.mark.openvino
def test_openvino_returns_a_bfloat16_output_as_bfloat16() -> None:
    pytest.importorskip("openvino")
    result = gb.compare(_cast_to(TensorProto.BFLOAT16), oracle="onnxruntime", target="openvino",
                        inputs={"x": VALUES}, layerwise=False)
    assert result.passed, result.to_json()["outcome"]


@pytest.mark.openvino
def test_openvino_refuses_a_type_it_has_no_tensor_for_as_unsupported() -> None:
    pytest.importorskip("openvino")
    from graphbisect.backends.openvino import _to_ov

    with pytest.raises(NotImplementedError) as info:
        _to_ov("x", VALUES.astype(ml_dtypes.float8_e4m3fnuz))
    message = str(info.value)
    assert "'x'" in message and "FLOAT8E4M3FNUZ" in message
    run = RunResult(RunStatus.CRASH, phase=Phase.RUN, error_type=type(info.value).__name__, message=message)
    assert classify_failed_run(run, "target").cls is OutcomeClass.TARGET_UNSUPPORTED


# --- Paddle Inference (the original Paddle model) -------------------------------------------------------
def _paddle_run(prefix: Path, workdir: Path, x: np.ndarray) -> np.ndarray:
    from graphbisect.backends.paddle import PaddleInference

    runtime = PaddleInference({}, str(workdir))
    runtime.load(str(prefix.parent), None)
    (value,) = runtime.run({"x": x}).values()
    return np.asarray(value)


@pytest.mark.paddle
def test_paddle_takes_a_bfloat16_input_with_its_values(tmp_path: Path) -> None:
    pytest.importorskip("paddle")
    x = VALUES[:4].astype(ml_dtypes.bfloat16)
    got = _paddle_run(export_cast_net(tmp_path, "bfloat16", "float32"), tmp_path, x)
    np.testing.assert_array_equal(got, x.astype(np.float32) ** 2)


@pytest.mark.paddle
@pytest.mark.parametrize(("dtype", "shown"), [("bfloat16", "BFLOAT16"), ("float8_e4m3fn", "float8_e4m3fn")])
def test_paddle_refuses_an_output_its_copy_to_cpu_misreads(dtype: str, shown: str, tmp_path: Path) -> None:
    # Paddle 3.3.1 returned [1.5, -2.25, 3, 0.5] cast to bfloat16 as float32 [-2.2539, 0.501, 0, 0].
    pytest.importorskip("paddle")
    with pytest.raises(NotImplementedError, match=rf"output 'fetch_name_0' of type {shown} is not supported"):
        _paddle_run(export_cast_net(tmp_path, "float32", dtype), tmp_path, VALUES[:4])


@pytest.mark.paddle
def test_paddle_refuses_int4_which_it_would_read_as_int8(tmp_path: Path) -> None:
    # ml_dtypes holds int4 -2 as the byte 14: Paddle read it as int8 14 (196 instead of 4 squared).
    pytest.importorskip("paddle")
    with pytest.raises(NotImplementedError, match=r"input 'x' of type INT4 is not supported"):
        _paddle_run(export_cast_net(tmp_path, "int8", "float32"), tmp_path, np.array([1, -2, 3, 7], ml_dtypes.int4))


# --- command: a program reading an .npz -------------------------------------------------------------------
NAIVE = """
import sys, numpy as np
model, inputs, outputs = sys.argv[1:4]
with np.load(inputs) as data:  # what most programs do: take the arrays as numbers
    x = data["x"].astype(np.float32)
np.savez(outputs, y=x * x)
"""
TYPED = """
import sys, onnx
from onnx.reference import ReferenceEvaluator
from graphbisect.storage.values import load_values_npz, save_values_npz
model, inputs, outputs = sys.argv[1:4]
proto = onnx.load(model)
results = ReferenceEvaluator(proto).run(None, load_values_npz(inputs))
save_values_npz(outputs, {o.name: r for o, r in zip(proto.graph.output, results)})
"""
SAVEZ = TYPED.replace("save_values_npz(outputs, ", "np.savez(outputs, **").replace("import sys, onnx",
                                                                                  "import sys, onnx, numpy as np")


def _command(tmp_path: Path, program: str, *options: str) -> str:
    script = tmp_path / "program.py"
    script.write_text(program)
    return ",".join([f"command:cmd={sys.executable} {script} {{model}} {{inputs}} {{outputs}}", *options])


@pytest.mark.parametrize("side", ["input", "output"])
def test_command_refuses_a_value_a_numpy_program_would_misread(side: str, tmp_path: Path) -> None:
    if side == "input":  # before: the program got bfloat16 1.5 as the uint16 16320; its square was a divergence
        model, program, x = _cast_square(TensorProto.BFLOAT16), NAIVE, VALUES.astype(ml_dtypes.bfloat16)
        fragments = ("input 'x' of type BFLOAT16", "typed=1")
    else:  # np.savez of an ml_dtypes bfloat16 array stores numpy void ('|V2'): it was a dtype divergence
        model, program, x = _cast_to(TensorProto.BFLOAT16), SAVEZ, VALUES
        fragments = ("output 'y'", "|V2")
    result = gb.compare(model, oracle="onnxruntime", target=_command(tmp_path, program), inputs={"x": x},
                        layerwise=False)
    outcome = result.to_json()["outcome"]
    assert outcome["class"] == "target-unsupported", outcome
    assert all(fragment in outcome["detail"] for fragment in fragments), outcome


def test_command_with_typed_passes_the_values_to_a_program_that_reads_them(tmp_path: Path) -> None:
    x = VALUES.astype(ml_dtypes.bfloat16)
    result = gb.compare(_cast_square(TensorProto.BFLOAT16), oracle="onnxruntime",
                        target=_command(tmp_path, TYPED, "typed=1"), inputs={"x": x}, layerwise=False)
    assert result.passed, result.to_json()["outcome"]


def test_command_repro_writes_inputs_as_graphbisect_does(tmp_path: Path) -> None:
    """repro.py's command section writes a typed .npz for typed=1 and refuses such inputs without it."""
    import runpy

    from graphbisect.artifacts.repro import render_repro
    from graphbisect.backends.base import BackendSpec
    from graphbisect.storage.values import load_values_npz

    content = SimpleNamespace(target=BackendSpec.parse("command:cmd=true"))
    script = tmp_path / "repro.py"
    script.write_text(render_repro(content), encoding="utf-8")  # type: ignore[arg-type]
    ns = runpy.run_path(str(script), run_name="repro")
    x = VALUES.astype(ml_dtypes.bfloat16)
    ns["save_arrays"](str(tmp_path / "typed.npz"), {"x": x}, True)
    read = load_values_npz(tmp_path / "typed.npz")["x"]
    assert read.dtype == x.dtype and read.tobytes() == x.tobytes()
    with pytest.raises(NotImplementedError, match="input 'x' of type bfloat16 is not supported"):
        ns["save_arrays"](str(tmp_path / "plain.npz"), {"x": x})
