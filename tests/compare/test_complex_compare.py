"""A complex tensor compares per complex element: counts, tolerance (on the modulus, numpy.allclose) and the
index repro.py reports. Before, real and imaginary parts were compared as separate elements: a 4-element
complex64 output with one wrong element read "2 of 8 elements beyond tolerance", at index [3, 1].
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphbisect as gb
from graphbisect.artifacts.repro import render_repro
from graphbisect.backends.base import BackendSpec
from graphbisect.compare import MismatchKind, Tolerance, compare_tensors

ORACLE = np.array([1 + 1j, 2 - 2j, -3 + 0.5j, 4 + 4j], np.complex64)


def test_counts_are_per_complex_element() -> None:
    target = ORACLE.copy()
    target[3] = 4.5 + 4.5j  # one element wrong in both parts
    stats = compare_tensors("y", ORACLE, target)
    assert (stats.kind, stats.numel, stats.mismatches) == (MismatchKind.MISMATCH, 4, 1)
    assert stats.max_abs == pytest.approx(abs(0.5 + 0.5j))  # the modulus of the error


def test_tolerance_is_on_the_modulus_as_numpy_allclose() -> None:
    # |error| = 0.5 in each part: 0.707 in modulus, beyond atol 0.6 though each part is within it.
    target = ORACLE + np.complex64(0.5 + 0.5j)
    stats = compare_tensors("y", ORACLE, target, Tolerance(atol=0.6, rtol=0.0))
    assert stats.mismatches == int(np.count_nonzero(~np.isclose(target, ORACLE, atol=0.6, rtol=0.0))) == 4
    assert compare_tensors("y", ORACLE, target, Tolerance(atol=0.8, rtol=0.0)).passed


@pytest.mark.parametrize("value", [complex(np.nan, 0.0), complex(2.0, np.nan), complex(np.nan, np.nan)],
                         ids=["real", "imag", "both"])
def test_a_nan_in_either_part_is_one_nonfinite_element(value: complex) -> None:
    target = ORACLE.copy()
    target[1] = value
    stats = compare_tensors("y", ORACLE, target)
    assert (stats.kind, stats.target_nonfinite, stats.mismatches) == (MismatchKind.NAN, 1, 1)


def test_a_complex_tensor_against_a_real_one_compares_without_dtype_check() -> None:
    # It raised "operands could not be broadcast" ((3,) against the complex side's (real, imag) pairs, (6,)).
    oracle = np.array([1.0, 2.0, 3.0], np.float32)
    target = np.array([1.0, 2.0 + 0.5j, 3.0], np.complex64)
    stats = compare_tensors("y", oracle, target, Tolerance(atol=0.1, rtol=0.0, check_dtype=False))
    assert (stats.mismatches, stats.numel) == (1, 3)


def test_repro_reports_the_complex_element_and_its_index(tmp_path: Path) -> None:
    content = SimpleNamespace(target=BackendSpec.parse("onnxruntime"))  # the script depends only on the target
    script = tmp_path / "repro.py"
    script.write_text(render_repro(content), encoding="utf-8")  # type: ignore[arg-type]
    ns = runpy.run_path(str(script), run_name="repro")
    target = ORACLE.copy()
    target[3] = 4.5 + 4.5j
    tolerance = {"atol": 1e-4, "rtol": 1e-3, "per_output": {}, "min_cosine": None, "check_dtype": True}
    result = ns["compare"]("y", ORACLE, target, tolerance)
    assert (result["numel"], result["mismatches"], result["worst_index"]) == (4, 1, [3])
    assert result["expected_value"] == [4.0, 4.0] and result["actual_value"] == [4.5, 4.5]
    assert "1 of 4 elements beyond tolerance" in ns["describe"](result)
    assert "expected 4+4j, got 4.5+4.5j" in ns["describe"](result)


def test_a_complex64_model_output_counts_per_element(tmp_path: Path) -> None:
    """A complex64 output end to end: onnx.reference (the only backend here with complex Mul) against a
    program that gets one element's sign of the imaginary part wrong."""
    graph = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"])], "square",
                              [helper.make_tensor_value_info("x", TensorProto.COMPLEX64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.COMPLEX64, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    program = tmp_path / "square.py"
    program.write_text("import sys, numpy as np\n"
                       "with np.load(sys.argv[1]) as data:\n"
                       "    x = data['x']\n"
                       "y = x * x\n"
                       "y[2] = np.conj(y[2])  # the bug\n"
                       "np.savez(sys.argv[2], y=y)\n")
    target = f"command:cmd={sys.executable} {program} {{inputs}} {{outputs}}"
    result = gb.compare(model, oracle="reference", target=target, inputs={"x": ORACLE}, layerwise=False)
    (row,) = result.comparison.outputs
    assert (row.kind, row.numel, row.mismatches) == (MismatchKind.MISMATCH, 4, 1)
