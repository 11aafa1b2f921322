"""`compare` and `reduce` on ONNX's own node tests (``onnx/backend/test/data/node``): every value type.

The fixed slice below covers every input kind and element type the corpus has (strings, bool, every integer
width with int4/uint4, float16, bfloat16, the four float8 types, sequences, optionals, a model without
inputs) and every outcome class compare can give; ``benchmarks/node_corpus_bench.py`` runs all ~1,300.
Target ONNX Runtime, oracle onnx.reference, inputs the tests' own ``test_data_set_0`` folders of ``.pb``
files, as a user would run ``graphbisect compare MODEL --inputs DIR --oracle reference``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from graphbisect.backends import BackendProcess, BackendSpec
from graphbisect.data import load_inputs
from graphbisect.model import load_model
from graphbisect.oracle.outcome import OutcomeClass
from graphbisect.oracle.signature import EXACT_VALUES
from graphbisect.workflows.compare import OracleFailed, compare_models
from graphbisect.workflows.reduce import ReduceOptions, reduce_model

CORPUS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
ROOT = Path(__file__).resolve().parents[2]

# model → the outcome class compare must give (measured with onnxruntime 1.32 and onnx 1.17; a release that
# fixes one of these bugs changes that row, on purpose).
SLICE = {
    # strings
    "test_ai_onnx_ml_label_encoder_string_int": "pass",
    "test_regex_full_match_basic": "oracle-unsupported",  # the reference needs the re2 package
    "test_string_concat": "pass",
    "test_cast_FLOAT_to_STRING": "divergence",  # ORT and onnx format floats with different digits
    # bool and integers of every width
    "test_and_bcast3v1d": "pass",
    "test_bitshift_left_uint16": "pass",
    "test_bitwise_and_i16_3d": "pass",
    "test_bitshift_right_uint32": "pass",
    "test_bitshift_left_uint64": "pass",
    "test_add_uint8": "pass",
    "test_cast_INT4_to_FLOAT": "pass",
    "test_cast_UINT4_to_FLOAT16": "pass",
    "test_dequantizelinear_int4": "pass",
    "test_quantizelinear_uint4": "pass",
    "test_cast_FLOAT_to_INT4": "divergence",  # ORT wraps -9 to 7; the spec (and onnx.reference) saturate to -8
    # floats numpy lacks, and complex-free float16/double
    "test_cast_BFLOAT16_to_FLOAT": "pass",
    # ORT rounds to nearest even, as graphbisect's reference does (onnx 1.17's own reference and this test's data
    # truncate; onnx 1.19's round): the expected outputs of the .pb files are not what compare uses
    "test_cast_FLOAT_to_BFLOAT16": "pass",
    "test_cast_FLOAT8E4M3FN_to_FLOAT": "pass",
    "test_cast_FLOAT8E4M3FNUZ_to_FLOAT16": "pass",
    "test_cast_FLOAT8E5M2_to_FLOAT": "pass",
    "test_cast_FLOAT8E5M2FNUZ_to_FLOAT16": "pass",
    "test_dequantizelinear_e4m3fn": "pass",
    "test_quantizelinear_e5m2": "pass",
    "test_cast_DOUBLE_to_FLOAT16": "pass",
    # sequences and optionals, as inputs and outputs
    "test_identity_sequence": "pass",
    "test_sequence_insert_at_back": "pass",
    "test_optional_get_element_optional_sequence": "pass",
    "test_optional_has_element_empty_optional_input": "pass",
    "test_identity_opt": "pass",
    "test_if_opt": "divergence",  # onnx 1.17's reference wraps the optional's sequence in another list
    "test_optional_has_element_empty_no_input_optional_input": "pass",  # no inputs at all
    # the other outcome classes
    "test_qlinearmatmul_3D_int8_float32": "divergence",  # ORT CPU gives -128 where the spec gives 117, 120
    "test_training_dropout": "random-op",
    "test_image_decoder_decode_jpeg_rgb": "target-unsupported",
    "test_scatter_with_axis": "oracle-unsupported",  # Scatter (deprecated) has no reference implementation
    "test_strnormalizer_export_monday_casesensintive_upper": "target-crash",
}


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackendProcess, BackendProcess]]:
    """One oracle and one target worker for the whole slice (starting workers per model costs more than the runs)."""
    tmp = tmp_path_factory.mktemp("corpus-workers")
    with BackendProcess(BackendSpec.parse("reference"), workdir=tmp / "oracle") as oracle, \
            BackendProcess(BackendSpec.parse("onnxruntime"), workdir=tmp / "target") as target:
        yield oracle, target


def _compare(name: str, workers: tuple[BackendProcess, BackendProcess], tmp: Path) -> tuple[str, str]:
    folder = CORPUS / name
    model = load_model(folder / "model.onnx")
    inputs = load_inputs(folder / "test_data_set_0", model)
    try:
        result = compare_models(model, oracle="reference", target="onnxruntime", inputs=inputs, workdir=tmp,
                                workers=workers)
    except OracleFailed as exc:
        return exc.outcome.cls.value, exc.outcome.detail
    assert result.passed == (result.outcome.cls is OutcomeClass.PASS)
    return result.outcome.cls.value, result.outcome.detail


def test_the_slice_runs_without_a_traceback_and_classifies_every_result(
        workers: tuple[BackendProcess, BackendProcess], tmp_path: Path) -> None:
    """Every model of the slice is compared layer by layer (4 runs); anything but a classified outcome raises."""
    got = {}
    for index, name in enumerate(SLICE):
        cls, detail = _compare(name, workers, tmp_path / str(index))
        got[name] = cls
        assert cls == "pass" or detail, f"{name}: {cls} without saying why"
    assert got == SLICE


def test_a_target_crashing_on_both_models_is_not_said_to_have_run_the_plain_one(tmp_path: Path) -> None:
    """ORT's StringNormalizer fails at session creation here, on the plain model and on the probe alike."""
    folder = CORPUS / "test_strnormalizer_export_monday_casesensintive_upper"
    model = load_model(folder / "model.onnx")
    result = compare_models(model, oracle="reference", target="onnxruntime",
                            inputs=load_inputs(folder / "test_data_set_0", model), workdir=tmp_path)
    assert not result.target_run.ok and result.outcome.cls is OutcomeClass.TARGET_CRASH
    assert result.layerwise_note is not None
    assert "plain model ran" not in result.layerwise_note
    assert "probe model was not built" in result.layerwise_note  # a build that crashed is not tried again


def test_cli_names_the_qlinearmatmul_divergence(tmp_path: Path) -> None:
    """The CLI, as a user runs it: the verdict's class, the node, and the -128 where the spec has 120."""
    folder = CORPUS / "test_qlinearmatmul_3D_int8_float32"
    proc = subprocess.run(
        [sys.executable, "-m", "graphbisect", "compare", str(folder / "model.onnx"), "--inputs",
         str(folder / "test_data_set_0"), "--oracle", "reference", "--target", "onnxruntime",
         "--json", str(tmp_path / "out.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "FAIL: divergence" in proc.stdout
    assert "first divergence: QLinearMatMul_0 (QLinearMatMul)" in proc.stdout
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["outcome"]["class"] == "divergence"
    assert report["outputs"][0]["target_range"][0] == -128 and report["outputs"][0]["oracle_range"][1] == 120


@pytest.mark.parametrize("name", ["test_sequence_insert_at_back", "test_cast_FLOAT8E5M2_to_FLOAT",
                                  "test_ai_onnx_ml_label_encoder_string_int", "test_cast_INT4_to_FLOAT"])
def test_cli_reads_every_input_kind_from_the_test_data_folder(name: str, tmp_path: Path) -> None:
    """Sequences, float8, strings and int4 from .pb files: the inputs that crashed or were refused before."""
    folder = CORPUS / name
    proc = subprocess.run(
        [sys.executable, "-m", "graphbisect", "compare", str(folder / "model.onnx"), "--inputs",
         str(folder / "test_data_set_0"), "--oracle", "reference", "--json", str(tmp_path / "out.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "out.json").read_text())["outcome"]["class"] == "pass"


def _wrapped_qlinearmatmul() -> onnx.ModelProto:
    """The corpus's QLinearMatMul between value-preserving int8 ops, plus a float side output."""
    original = onnx.load(CORPUS / "test_qlinearmatmul_3D_int8_float32" / "model.onnx")
    graph = original.graph
    names = [i.name for i in graph.input]
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = names
    perm = [0, 2, 1]
    nodes = [
        helper.make_node("Transpose", [a], ["a_t"], name="a_transpose", perm=perm),
        helper.make_node("Transpose", ["a_t"], ["a_tt"], name="a_back", perm=perm),
        helper.make_node("Identity", [b], ["b_id"], name="b_identity"),
        helper.make_node("QLinearMatMul", ["a_tt", a_scale, a_zp, "b_id", b_scale, b_zp, y_scale, y_zp], ["q"],
                         name="the_qlinearmatmul"),
        helper.make_node("Transpose", ["q"], ["q_t"], name="q_transpose", perm=perm),
        helper.make_node("Transpose", ["q_t"], [graph.output[0].name], name="q_back", perm=perm),
        helper.make_node("Mul", [a_scale, b_scale], ["side"], name="side_mul"),
    ]
    side = helper.make_tensor_value_info("side", onnx.TensorProto.FLOAT, None)
    new_graph = helper.make_graph(nodes, "wrapped_qlinearmatmul", list(graph.input), [graph.output[0], side])
    model = helper.make_model(new_graph, opset_imports=list(original.opset_import))
    model.ir_version = original.ir_version
    return model


def test_reduce_finds_the_qlinearmatmul_and_its_bundle_reproduces(tmp_path: Path) -> None:
    folder = CORPUS / "test_qlinearmatmul_3D_int8_float32"
    onnx.save(_wrapped_qlinearmatmul(), tmp_path / "wrapped.onnx")
    model = load_model(tmp_path / "wrapped.onnx")
    inputs = load_inputs(folder / "test_data_set_0", model)
    result = reduce_model(model, tmp_path / "bundle", inputs=inputs,
                          options=ReduceOptions(oracle="reference", target="onnxruntime"))
    assert result.failed and result.verified and result.one_minimal
    assert result.original_nodes == 7
    assert result.kept_nodes == ("the_qlinearmatmul",)
    assert result.signature.kind.value == "mismatch" and result.signature.detail == EXACT_VALUES
    assert result.bundle is not None
    repro = subprocess.run([sys.executable, "-I", str(result.bundle / "repro.py")], capture_output=True, text=True,
                           timeout=300, check=False)
    assert repro.returncode == 1, repro.stdout + repro.stderr
    assert "expected 120, got -128" in repro.stdout


def test_reduce_of_an_int4_output_and_repro_reads_it(tmp_path: Path) -> None:
    """ORT's Cast to INT4 wraps where ONNX saturates: reduced to the Cast (its float input cut and fed from the
    oracle's store), and repro.py (numpy + onnxruntime + ml_dtypes, no graphbisect: ``python -I``) decodes
    the int4 outputs the bundle stores as raw values + ONNX type."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 5])
    q = helper.make_tensor_value_info("q", onnx.TensorProto.INT4, [2, 5])
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["x2"], name="double"),
        helper.make_node("Cast", ["x2"], ["q"], name="to_int4", to=onnx.TensorProto.INT4),
    ]
    two = onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")
    model_proto = helper.make_model(helper.make_graph(nodes, "int4_cast", [x], [q], [two]),
                                    opset_imports=[helper.make_opsetid("", 21)])
    model_proto.ir_version = 10
    onnx.save(model_proto, tmp_path / "cast.onnx")
    model = load_model(tmp_path / "cast.onnx")
    inputs = {"x": np.linspace(-5, 4, 10, dtype=np.float32).reshape(2, 5)}  # doubled: -10 .. 8
    result = reduce_model(model, tmp_path / "bundle", inputs=inputs,
                          options=ReduceOptions(oracle="reference", target="onnxruntime"))
    assert result.failed and result.verified
    assert result.kept_nodes == ("to_int4",)
    assert result.signature.detail == EXACT_VALUES
    assert result.bundle is not None
    with np.load(result.bundle / "oracle_outputs.npz") as stored:
        manifest = json.loads(stored["__values__.json"])
    assert manifest["values"]["q"]["onnx_type"] == "INT4"
    repro = subprocess.run([sys.executable, "-I", str(result.bundle / "repro.py")], capture_output=True, text=True,
                           timeout=300, check=False)
    assert repro.returncode == 1, repro.stdout + repro.stderr
    # -10 saturates to -8 and 8 to 7 in ONNX; ORT wraps them to 6 and -8
    assert "2 of 10 elements" in repro.stdout and "expected 7, got -8" in repro.stdout, repro.stdout
