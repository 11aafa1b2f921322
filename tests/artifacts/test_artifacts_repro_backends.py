"""repro.py for onnxoptimizer targets, for backends without a section, and with OpenVINO tactic records.

The onnxoptimizer bug is real (onnxoptimizer 0.3.13): ``fuse_pad_into_pool`` folds a zero constant Pad into a
MaxPool's ``pads``, but MaxPool pads with -inf, so a window at the border of an all-negative input returns
0 before the fusion and a negative value after it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from artifacts_builders import IR_VERSION, build_content, run_repro
from onnx import TensorProto, helper, numpy_helper

from graphbisect.artifacts import BundleContent, load_bundle, write_bundle
from graphbisect.artifacts import repro as repro_module
from graphbisect.artifacts.bundle import BUNDLE_FILES
from graphbisect.artifacts.repro import repro_config
from graphbisect.backends import BackendSpec
from graphbisect.cli.main import main

pytest.importorskip("onnxruntime")

PAD_POOL_TARGET = "onnxoptimizer:passes=fuse_pad_into_pool"


def pad_maxpool_model() -> onnx.ModelProto:
    """x[1,2,4,4] → Pad(1 on each spatial side, constant 0) → MaxPool 3x3: the fuse_pad_into_pool bug."""
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant", name="pad"),
             helper.make_node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3], name="pool")]
    pads = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    graph = helper.make_graph(nodes, "pad_maxpool", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [pads])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


@pytest.fixture(scope="module")
def pad_pool_content(tmp_path_factory: pytest.TempPathFactory) -> BundleContent:
    pytest.importorskip("onnxoptimizer")
    x = -1.0 - np.abs(np.random.default_rng(0).standard_normal((1, 2, 4, 4))).astype(np.float32)
    content = build_content(pad_maxpool_model(), {"x": x}, tmp_path_factory.mktemp("padpool"), target=PAD_POOL_TARGET)
    if not content.signature.failed:
        pytest.skip("this onnxoptimizer pads MaxPool correctly")
    assert content.signature.kind.value == "mismatch", content.signature
    return content


def test_onnxoptimizer_reproduces_then_fixed(pad_pool_content: BundleContent, tmp_path: Path) -> None:
    bug = write_bundle(pad_pool_content, tmp_path / "bug")
    proc = run_repro(bug)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    assert 'MISMATCH  "y"' in proc.stdout
    passing = dataclasses.replace(pad_pool_content, target=BackendSpec.parse("onnxoptimizer:passes=eliminate_identity"))
    fixed = run_repro(write_bundle(passing, tmp_path / "fixed"))
    assert fixed.returncode == 0 and "FIXED" in fixed.stdout, fixed.stdout + fixed.stderr


def test_onnxoptimizer_options_are_the_runtimes(pad_pool_content: BundleContent) -> None:
    spec = BackendSpec.parse("onnxoptimizer:disabled=fuse_bn_into_conv,threads=1")
    options = repro_config(dataclasses.replace(pad_pool_content, target=spec))["options"]
    assert options["passes"] is None and options["disabled"] == ["fuse_bn_into_conv"]  # None: the default list
    assert options["onnxruntime"]["graph_optimization_level"] == "ORT_DISABLE_ALL"
    assert options["onnxruntime"]["intra_op_num_threads"] == 1


def test_a_backend_without_a_section_still_gets_its_bundle(mismatch_content: BundleContent, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delitem(repro_module.REPRO_BACKENDS, "onnxruntime")  # stands for a future backend
    with caplog.at_level("WARNING", logger=repro_module.__name__):
        out = write_bundle(mismatch_content, tmp_path / "b")
    # said once: each reader of the section's facts (the script, its config, the report) printed it again
    said = [r.getMessage() for r in caplog.records if "has no section" in r.getMessage()]
    assert len(said) == 1 and "repro.py has no section for backend 'onnxruntime'" in said[0], caplog.text
    assert all((out / name).is_file() for name in BUNDLE_FILES)
    assert json.loads((out / "repro_config.json").read_text())["standalone"] is False
    assert "no standalone script" in (out / "report.md").read_text()
    proc = run_repro(out)
    assert proc.returncode == 2 and f"graphbisect verify {out}" in proc.stderr, proc.stdout + proc.stderr
    assert main(["verify", str(out)]) == 1 and "REPRODUCES" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- OpenVINO tactics
def _cnn(folder: Path) -> Path:
    from tests.tactics.tactics_builders import save_cnn

    return save_cnn(folder)


@pytest.mark.openvino
@pytest.mark.parametrize("fused", [False, True], ids=["as-read", "after-fusions"])
def test_script_pins_like_graphbisect(mismatch_content: BundleContent, tmp_path: Path, fused: bool) -> None:
    """The script's copy of the replay pins the same IR layers with the same attributes as graphbisect's,
    in the model as read and in the fused model (where a Conv + BatchNormalization kernel has its layer)."""
    ov = pytest.importorskip("openvino")
    from openvino._offline_transformations import apply_moc_transformations

    from graphbisect.backends.openvino import _exec_graph, ir_layers
    from graphbisect.tactics.openvino import ir_pins, onnx_names, pin_ir_xml, record_from_exec_graph

    path = _cnn(tmp_path)
    core = ov.Core()
    model = core.read_model(str(path))
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    actual = record_from_exec_graph(_exec_graph(compiled), onnx_names(path), version=None, device=None)
    wanted = actual.with_choices({"conv1": "ref_any", "conv2": "ref_any", "softmax": "ref_any", "ghost": "x"})
    if fused:
        apply_moc_transformations(model, cf=False)
    ov.save_model(model, str(tmp_path / "plain.xml"), compress_to_fp16=False)
    pins, unmapped = ir_pins(wanted, actual, ir_layers(model, onnx_names(path)))
    assert pins and pin_ir_xml(tmp_path / "plain.xml", tmp_path / "lib.xml", pins) == []

    script = _script(dataclasses.replace(mismatch_content, target=BackendSpec.parse("openvino")), tmp_path)
    current = script.build_choices(compiled, *script.onnx_names(path))
    layers = script.ir_layers(model, *script.onnx_names(path))
    assert script.ir_pins(wanted.to_json()["choices"], current, layers) == (pins, unmapped)
    assert script.pin_ir_xml(tmp_path / "plain.xml", tmp_path / "script.xml", pins) == []
    assert (tmp_path / "script.xml").read_bytes() == (tmp_path / "lib.xml").read_bytes()


@pytest.mark.openvino
@pytest.mark.parametrize("op", ["MatMul", "Add"])
def test_script_maps_int64_output_renames_like_graphbisect(mismatch_content: BundleContent, tmp_path: Path,
                                                           op: str) -> None:
    """OpenVINO runs the op writing int64 output ``s`` as ``s.0`` and converts back in ``s.0.0``: the script's
    copy records that kernel for the node (not the Convert's) and pins the op ``s`` as graphbisect does."""
    ov = pytest.importorskip("openvino")

    from graphbisect.backends.openvino import _exec_graph, ir_layers
    from graphbisect.tactics.openvino import ir_pins, onnx_names, record_from_exec_graph
    from tests.tactics.tactics_builders import save_int64_output

    path = save_int64_output(tmp_path, op)
    node = {"MatMul": "mm", "Add": "add"}[op]
    core = ov.Core()
    model = core.read_model(str(path))
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    actual = record_from_exec_graph(_exec_graph(compiled), onnx_names(path), version=None, device=None)
    script = _script(dataclasses.replace(mismatch_content, target=BackendSpec.parse("openvino")), tmp_path)
    current = script.build_choices(compiled, *script.onnx_names(path))
    assert current[node][0] == "s.0"
    assert current == {c.node: (c.layer, c.choice, c.layer_type) for c in actual.choices}
    wanted = actual.with_choices({node: "ref_any" if actual.choice_of(node) != "ref_any" else "jit_gemm"})
    pins, unmapped = ir_pins(wanted, actual, ir_layers(model, onnx_names(path)))
    assert list(pins) == ["s"] and unmapped == []
    assert script.ir_pins(wanted.to_json()["choices"], current,
                          script.ir_layers(model, *script.onnx_names(path))) == (pins, unmapped)


def _script(content: BundleContent, tmp_path: Path):  # type: ignore[no-untyped-def]
    import importlib.util

    path = tmp_path / "repro_ov.py"
    path.write_text(repro_module.render_repro(content))
    spec = importlib.util.spec_from_file_location("repro_ov", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.openvino
def test_tactics_travel_with_the_bundle(tmp_path: Path) -> None:
    """reduce --target openvino:tactics=REC (conv2 → ref_any) vs unpinned OpenVINO, bit-exact: the bundle carries
    the record, repro.py and verify apply it (after REC is gone); without it repro.py says fixed."""
    pytest.importorskip("openvino")
    from graphbisect.model import load_model
    from graphbisect.tactics import load_record, save_record
    from graphbisect.workflows.tactics import record_tactics

    path = _cnn(tmp_path)
    record = record_tactics(load_model(path), "openvino").record
    if record.choice_of("conv2") in (None, "ref_any"):
        pytest.skip("conv2 has no other kernel to pin here")
    rec = save_record(record.with_choices({"conv2": "ref_any"}), tmp_path / "bad.json")
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32))
    out = tmp_path / "bug"
    code = main(["reduce", str(path), "--inputs", str(tmp_path / "in.npz"), "-o", str(out), "--oracle", "openvino",
                 "--target", f"openvino:tactics={rec}", "--atol", "0", "--rtol", "0"])
    if code == 0:
        pytest.skip("ref_any on conv2 gives bit-identical outputs on this CPU")
    assert code == 1
    kept = load_record(out / "tactics.json")
    assert "conv2" in kept.nodes and set(kept.nodes) <= {n.name for n in onnx.load(out / "model.onnx").graph.node}
    rec.unlink()  # the bundle must not need the original record
    proc = run_repro(out)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    with load_bundle(out) as bundle:
        assert bundle.target.options["tactics"] == str(out / "tactics.json")
    assert main(["verify", str(out)]) == 1
    config = json.loads((out / "repro_config.json").read_text())
    config["options"]["tactics"] = None
    (out / "repro_config.json").write_text(json.dumps(config))
    proc = run_repro(out)
    assert proc.returncode == 0 and "FIXED" in proc.stdout, proc.stdout + proc.stderr


def bf16_and_int4_model() -> onnx.ModelProto:
    """Two outputs: ``b`` = float -> bfloat16 (ONNX Runtime rounds to nearest even, and so does graphbisect's
    ``reference``; onnx 1.17/1.18's plain reference truncates), ``q`` = float -> int4 -> float out of range
    (ONNX Runtime wraps -9 to 7, the spec saturates to -8: a real mismatch of a ``reference`` target)."""
    nodes = [helper.make_node("Cast", ["x"], ["b"], name="to_bf16", to=TensorProto.BFLOAT16),
             helper.make_node("Mul", ["x", "k"], ["m"], name="scale"),
             helper.make_node("Cast", ["m"], ["i"], name="to_int4", to=TensorProto.INT4),
             helper.make_node("Cast", ["i"], ["q"], name="to_float", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bf16_int4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [4]),
                               helper.make_tensor_value_info("q", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(np.array(-18.75, np.float32), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_a_reference_targets_repro_computes_the_bfloat16_casts_graphbisect_computed(tmp_path: Path) -> None:
    # 0.48033667, 0.49968487 and 0.81910545 round up to the next bfloat16 (onnx 1.17 truncates them); x * -18.75
    # puts -9.0 in the int4 cast, which ONNX Runtime wraps and the spec saturates.
    x = np.array([0.48033667, 0.49968487, 0.81910545, 0.48], np.float32)
    content = build_content(bf16_and_int4_model(), {"x": x}, tmp_path / "run", oracle="onnxruntime",
                            target="reference")
    assert content.signature.kind.value == "mismatch", content.signature
    assert np.array_equal(np.asarray(content.oracle_outputs["b"]).view(np.uint16),
                          np.asarray(content.target_outputs["b"]).view(np.uint16))  # graphbisect: b agrees
    done = run_repro(write_bundle(content, tmp_path / "bug"))
    assert done.returncode == 1, done.stdout + done.stderr
    # Before: repro.py ran a plain ReferenceEvaluator, which (on an onnx that truncates) said b mismatches too,
    # contradicting the bundle it reproduces.
    assert 'ok        "b"' in done.stdout, done.stdout
    assert 'MISMATCH  "q"' in done.stdout and "REPRODUCED" in done.stdout
    from graphbisect.backends.reference_casts import rounding_casts

    if rounding_casts()[0]:  # this onnx truncates: the script says it patched the evaluator like graphbisect
        assert "onnx.reference patched as graphbisect runs it: Cast/CastLike to bfloat16" in done.stdout


@pytest.mark.openvino
def test_script_knows_the_nodes_a_kernel_computed_fused_as_graphbisect_does(mismatch_content: BundleContent,
                                                                           tmp_path: Path) -> None:
    """repro.py's "did not apply" note looked only at nodes with a kernel of their own, so a pinned choice
    for a node this build fused into a neighbour (relu0 into conv0) went unmentioned: the script's fused
    hosts are graphbisect's record's ``fused`` lists."""
    ov = pytest.importorskip("openvino")

    from graphbisect.backends.openvino import _exec_graph
    from graphbisect.tactics.openvino import onnx_names, record_from_exec_graph

    path = _cnn(tmp_path)
    compiled = ov.Core().compile_model(ov.Core().read_model(str(path)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    actual = record_from_exec_graph(_exec_graph(compiled), onnx_names(path), version=None, device=None)
    expected = {node: c.node for c in actual.choices for node in c.fused if actual.choice_of(node) is None}
    if not expected:
        pytest.skip("this CPU fuses no node into another's kernel here")
    script = _script(dataclasses.replace(mismatch_content, target=BackendSpec.parse("openvino")), tmp_path)
    hosts = script.fused_hosts(compiled, *script.onnx_names(path))
    assert {node: hosts.get(node) for node in expected} == expected
