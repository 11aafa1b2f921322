"""`precision` end to end on real models and real ONNX Runtime runs.

For each model: the FP32 set found makes the lowered model meet the tolerance (verified in a fresh worker),
every node in it is necessary (re-checked here independently: lowering any one of them breaks the
tolerance), and it is much smaller than Polygraphy's answer — the shortest topological prefix kept in FP32,
bisected with the same evaluator, which is what ``polygraphy debug precision`` does.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.backends import BackendProcess
from graphbisect.cli.main import main
from graphbisect.compare import Tolerance
from graphbisect.examples import transformer_inputs
from graphbisect.examples.precision_models import cnn_inputs, residual_cnn, sensitive_transformer
from graphbisect.model import Model, load_model
from graphbisect.precision import Calibration, Lowering, PrecisionMode
from graphbisect.strategies.precision import PrecisionTester
from graphbisect.workflows.precision import PrecisionResult, find_precision

TOL = Tolerance(atol=0.05, rtol=0.05)
TARGET = "onnxruntime:opt_level=all"


def _lowering(model: Model, mode: PrecisionMode, feeds: dict[str, np.ndarray]) -> Lowering:
    if mode is not PrecisionMode.INT8:
        return Lowering(model, mode)
    import onnxruntime as ort

    probe = model.with_outputs(model.intermediate_names())
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    tensors = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds))) | feeds
    return Lowering(model, mode, Calibration.from_tensors(tensors))


def _check_necessary(model: Model, mode: PrecisionMode, feeds: dict[str, np.ndarray], result: PrecisionResult,
                     tmp: Path) -> None:
    """Independently of the search: the answer meets the tolerance, and dropping any one node breaks it."""
    low = _lowering(model, mode, feeds)
    unit = {name: u for u, name in enumerate(low.names(range(len(low.units))))}
    keep = frozenset(unit[name] for name in result.keep_fp32)
    np.savez(tmp / "inputs.npz", **feeds)
    expected = {name: np.asarray(v) for name, v in zip(
        model.output_names, _oracle(model, feeds))}
    with BackendProcess(TARGET, workdir=tmp / "check") as proc:
        tester = PrecisionTester(low, proc, tmp / "cands", tmp / "inputs.npz", expected=expected, tol=TOL)
        assert tester.measure(keep).meets
        for u in keep:
            assert not tester.measure(keep - {u}).meets, f"{low.names([u])} is not necessary"


def _oracle(model: Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# (model, inputs, mode, how many times smaller than the prefix answer the set must be). INT8 error on the
# transformer is cumulative (no node breaks the tolerance alone): its set is spread over both layers.
CASES = {
    "transformer-fp16": (sensitive_transformer, transformer_inputs, PrecisionMode.FP16, 10),
    "cnn-fp16": (residual_cnn, cnn_inputs, PrecisionMode.FP16, 5),
    "cnn-int8": (residual_cnn, cnn_inputs, PrecisionMode.INT8, 5),
    "transformer-int8": (sensitive_transformer, transformer_inputs, PrecisionMode.INT8, 1.5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_minimal_fp32_set_is_verified_necessary_and_beats_the_prefix(case: str, tmp_path: Path) -> None:
    build, inputs, mode, factor = CASES[case]
    model, feeds = load_model(build()), inputs()
    result = find_precision(model, mode=mode, inputs=feeds, tolerance=TOL, out_dir=tmp_path / "out")
    assert result.meets_tolerance and result.minimal and not result.all_lowered_meets
    assert result.keep_fp32 and result.prefix_keep_fp32 is not None
    assert factor * len(result.keep_fp32) <= len(result.prefix_keep_fp32), (result.keep_fp32, result.prefix_keep_fp32)
    _check_necessary(model, mode, feeds, result, tmp_path)
    assert (tmp_path / "out" / "mixed_precision.onnx").is_file()
    onnx.checker.check_model(str(tmp_path / "out" / "mixed_precision.onnx"))


def test_transformer_fp16_finds_the_layernorm_variance_branch(tmp_path: Path) -> None:
    """The final LayerNorm's variance overflows fp16: exactly Pow, ReduceMean, Add(eps), Sqrt, each alone fatal."""
    result = find_precision(load_model(sensitive_transformer()), mode="fp16", inputs=transformer_inputs(),
                            tolerance=TOL, with_prefix=False)
    assert sorted(name.rsplit("/", 1)[1] for name in result.keep_fp32) == ["Add", "Pow", "ReduceMean_1", "Sqrt"]
    assert all("layer.1/output_norm" in name for name in result.keep_fp32)
    assert set(result.alone) == set(result.keep_fp32)
    n = len(result.units)
    assert result.invocations["search_tests"] < n / 2  # O(k log n), not one run per node


def test_cli_with_sensitivity_writes_json_chart_and_overrides(tmp_path: Path) -> None:
    model_path, inputs_path = tmp_path / "cnn.onnx", tmp_path / "inputs.npz"
    onnx.save(residual_cnn(), model_path)
    np.savez(inputs_path, **cnn_inputs())
    out, report = tmp_path / "out", tmp_path / "r.json"
    code = main(["precision", str(model_path), "--inputs", str(inputs_path), "--mode", "fp16", "--sensitivity",
                 "--atol", "0.05", "--rtol", "0.05", "--json", str(report), "-o", str(out)])
    assert code == 0
    data = json.loads(report.read_text())
    assert data["mode"] == "fp16" and data["meets_tolerance"] is True
    assert data["keep_fp32"] == ["block3/conv1", "block3/relu1", "block3/conv2"]
    top = data["sensitivity"][:3]
    assert {row["node"] for row in top} == set(data["keep_fp32"]) and all(row["breaks_alone"] for row in top)
    assert {"node", "op_type", "score"} <= set(top[0]) and data["invocations"]["target"] > 0
    overrides = json.loads((out / "overrides.json").read_text())
    assert "block3/conv1:fp32" in overrides["trtexec"] and overrides["onnxruntime_nodes_to_exclude"]
    assert (out / "sensitivity.svg").read_text().startswith("<svg")
    assert (out / "mixed_precision_typed.onnx").is_file()


def test_ocr_recognizer_from_the_rapidocr_wheel_needs_no_fp32_node(tmp_path: Path) -> None:
    """PP-OCRv4 rec (860 nodes) shipped in rapidocr-onnxruntime: fp16 everywhere meets 1e-3 abs / 1e-2 rel."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")  # not imported: it needs opencv, we need its models
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime==1.4.4)")
    path = Path(spec.origin).parent / "models" / "ch_PP-OCRv4_rec_infer.onnx"
    feeds = {"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 64)).astype(np.float32)}
    result = find_precision(load_model(path), mode="fp16", inputs=feeds, tolerance=Tolerance(atol=1e-3, rtol=1e-2))
    assert result.all_lowered_meets and result.keep_fp32 == () and result.meets_tolerance
    assert result.invocations["target"] == 2
