"""OpenVINO CPU tactics for real (no mocks): record, bit-exact replay, forced kernels change outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
import pytest

pytest.importorskip("openvino")

from graphbisect.backends.openvino import OpenVino
from graphbisect.cli.main import main
from graphbisect.tactics import TacticRecord, save_record
from graphbisect.tactics.openvino import NodeNames, mapping_of, onnx_node_of
from graphbisect.text.printable import plural
from tests.tactics.tactics_builders import save_cnn, save_int64_output

pytestmark = pytest.mark.openvino

X = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)


def _build(model: Path, work: Path, **options: str) -> tuple[np.ndarray, dict]:
    rt = OpenVino({"report_tactics": "1", **options}, str(work))
    rt.load(str(model), None)
    return rt.run({"x": X})["y"], rt.info()


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, TacticRecord]:
    folder = tmp_path_factory.mktemp("cnn")
    model = save_cnn(folder)
    y, info = _build(model, folder)
    return model, y, TacticRecord.from_json(info["tactic_record"])


def test_record_names_onnx_nodes(cnn: tuple[Path, np.ndarray, TacticRecord]) -> None:
    _, _, rec = cnn
    assert {"conv0", "conv1", "conv2", "conv3", "matmul1", "softmax"} <= set(rec.nodes)
    assert rec.as_dict()["softmax"].layer == "y"  # OpenVINO names a graph output's producer after the tensor
    assert "relu0" in rec.as_dict()["conv0"].fused
    assert all(not c.choice.endswith("_f32") for c in rec.choices)


def test_replay_of_own_record_is_bit_exact(cnn: tuple[Path, np.ndarray, TacticRecord], tmp_path: Path) -> None:
    model, y, rec = cnn
    replayed, info = _build(model, tmp_path, tactics=str(save_record(rec, tmp_path / "a.json")))
    assert np.array_equal(replayed, y)
    assert info["tactics_not_applied"] == [] and info["tactics_pinned"] == {}


def test_forced_reference_kernel_is_applied_and_changes_outputs(
    cnn: tuple[Path, np.ndarray, TacticRecord], tmp_path: Path
) -> None:
    model, y, rec = cnn
    forced = rec.with_choices({"conv2": "ref_any"})
    out, info = _build(model, tmp_path, tactics=str(save_record(forced, tmp_path / "b.json")))
    assert TacticRecord.from_json(info["tactic_record"]).choice_of("conv2") == "ref_any"
    assert info["tactics_not_applied"] == []
    assert not np.array_equal(out, y)
    assert np.allclose(out, y, atol=1e-5)  # another kernel, same math


def test_silent_fallback_is_reported(cnn: tuple[Path, np.ndarray, TacticRecord], tmp_path: Path) -> None:
    model, _, rec = cnn
    if rec.choice_of("conv0") == "jit_avx2":
        pytest.skip("this CPU's default conv kernel is jit_avx2")
    forced = rec.with_choices({"conv0": "jit_avx2"})  # 3x3 conv: the plugin falls back on AVX-512 CPUs
    _, info = _build(model, tmp_path, tactics=str(save_record(forced, tmp_path / "c.json")))
    used = TacticRecord.from_json(info["tactic_record"]).choice_of("conv0")
    expected = [] if used == "jit_avx2" else [{"node": "conv0", "requested": "jit_avx2", "used": used}]
    assert info["tactics_not_applied"] == expected


def test_onnx_node_of_handles_prefixes_and_output_tensors() -> None:
    names = NodeNames(frozenset({"/l1/conv/Conv", "softmax"}), {"y": "softmax"})
    assert onnx_node_of("/l1/conv/Conv/WithoutBiases", names) == "/l1/conv/Conv"
    assert onnx_node_of("y/sink_port_0", names) == "softmax"
    assert onnx_node_of("x_abcd_acdb_conv0", names) is None


def test_onnx_node_of_maps_output_renames_to_their_node() -> None:
    """ConvertPrecision's ``<output>.N`` renames map to the node; an ONNX name ending in ``.0`` keeps its meaning."""
    names = NodeNames(frozenset({"add", "x.0"}), {"s": "add", "t.0": "x.0"})
    assert [onnx_node_of(n, names) for n in ("s.0", "s.0.0", "x.0", "t.0", "t.0.0", "Convert_3.0")] == \
        ["add", "add", "x.0", "x.0", "x.0", None]
    assert [mapping_of(n, names)[1] for n in ("s", "s.0", "s.0.0", "t.0.0")] == [0, 1, 2, 1]


# --- an int64 graph output: OpenVINO computes it in i32 under the names "s.0" (the op) and "s.0.0" (Convert back)
def _int64_build(model: Path, work: Path, **options: str) -> tuple[np.ndarray, dict]:
    rt = OpenVino({"report_tactics": "1", **options}, str(work))
    rt.load(str(model), None)
    a = np.arange(32, dtype=np.int64).reshape(4, 8) * 1000 + 7
    return rt.run({"a": a, "b": np.ones((8, 4), np.int64), "f": np.ones(1, np.float32)})["s"], rt.info()


def test_int64_output_kernel_is_recorded_under_its_node(tmp_path: Path) -> None:
    """The MatMul computing int64 output ``s`` runs as execution node ``s.0`` (and a Convert ``s.0.0`` converts
    it back): its kernel is recorded for ``mm``, the Convert's is not. Before, ``mm`` was missing."""
    _, info = _int64_build(save_int64_output(tmp_path), tmp_path)
    mm = TacticRecord.from_json(info["tactic_record"]).as_dict().get("mm")
    assert mm is not None and mm.layer == "s.0" and mm.layer_type == "MatMul", info["tactic_record"]


def test_int64_output_kernel_replays(tmp_path: Path) -> None:
    """A record asking ``ref_any`` for ``mm`` pins the op ``s`` (``s.0`` as executed) and the build uses it;
    before, ``mm`` was not in the unpinned build's record, so nothing was pinned and nothing reported."""
    model = save_int64_output(tmp_path)
    s, info = _int64_build(model, tmp_path)
    forced = TacticRecord.from_json(info["tactic_record"]).with_choices({"mm": "ref_any"})
    if TacticRecord.from_json(info["tactic_record"]).choice_of("mm") == "ref_any":
        pytest.skip("this CPU's default int MatMul kernel is ref_any")
    replayed, info = _int64_build(model, tmp_path, tactics=str(save_record(forced, tmp_path / "mm.json")))
    assert info["tactics_pinned"] == {"s": "ref_any"} and info["tactics_unmapped"] == []
    record = TacticRecord.from_json(info["tactic_record"])
    assert record.choice_of("mm") == "ref_any" and record.as_dict()["mm"].layer == "s.0"
    assert info["tactics_not_applied"] == [] and np.array_equal(replayed, s)


def test_int64_eltwise_pin_goes_to_its_op_and_a_fallback_is_reported(tmp_path: Path) -> None:
    """The Eltwise ``s.0`` has no IR layer of its name nor of a kind ir_pins knows: the pin goes to the op ``s``
    it was renamed from. OpenVINO ignores a priority on it, which the replay reports as not applied."""
    model = save_int64_output(tmp_path, "Add")
    rt = OpenVino({"report_tactics": "1"}, str(tmp_path))
    rt.load(str(model), None)
    record = TacticRecord.from_json(rt.info()["tactic_record"])
    add = record.as_dict().get("add")
    assert add is not None and add.layer == "s.0" and add.layer_type == "Eltwise", record
    wanted = "ref" if add.choice != "ref" else "jit_avx2"
    rt = OpenVino({"tactics": str(save_record(record.with_choices({"add": wanted}), tmp_path / "a.json"))},
                  str(tmp_path))
    rt.load(str(model), None)
    info = rt.info()
    assert info["tactics_pinned"] == {"s": wanted} and info["tactics_unmapped"] == []
    used = TacticRecord.from_json(info["tactic_record"]).choice_of("add")
    assert info["tactics_not_applied"] == ([] if used == wanted else
                                           [{"node": "add", "requested": wanted, "used": used}])


def test_record_prefers_the_computing_kernel_over_the_convert_back() -> None:
    """Execution graph captured from OpenVINO 2026.4 for an int64 MatMul output (kernels only), in either order:
    ``s.0`` (MatMul, one ``.N`` removed) stands for ``mm``, not ``s.0.0`` (the Convert back, two removed)."""
    from graphbisect.tactics.openvino import record_from_exec_graph

    graph = [{"name": "s.0", "layer_type": "MatMul", "primitive_type": "brgemm_avx512_f32", "original_layers": ["s.0"]},
             {"name": "s.0_f32_i32_cast", "layer_type": "Reorder", "primitive_type": "jit_uni_f32",
              "original_layers": []},
             {"name": "cast", "layer_type": "Convert", "primitive_type": "ref_i32", "original_layers": ["cast"]},
             {"name": "s.0.0", "layer_type": "Convert", "primitive_type": "ref_i32", "original_layers": ["s.0.0"]}]
    names = NodeNames(frozenset({"mm", "cast"}), {"s": "mm", "c": "cast"})
    for order in (graph, graph[::-1]):
        record = record_from_exec_graph(order, names, version=None, device=None)
        assert {c.node: (c.layer, c.choice) for c in record.choices} == \
            {"mm": ("s.0", "brgemm_avx512"), "cast": ("cast", "ref")}


def test_replay_reports_a_choice_for_a_node_this_build_fused_into_another(
    cnn: tuple[Path, np.ndarray, TacticRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record of the model cut after conv0 gives relu0 its own kernel; replayed on the whole model, where
    the plugin fuses relu0 into conv0's kernel, that choice did not take effect and must not read as applied."""
    model, _, whole = cnn
    fused_into = next((c for c in whole.choices if "relu0" in c.fused), None)
    if fused_into is None:
        pytest.skip("this CPU runs relu0 as its own kernel")
    cut = tmp_path / "cut.onnx"
    onnx.utils.extract_model(str(model), str(cut), ["c0"], ["y"])
    part = OpenVino({"report_tactics": "1"}, str(tmp_path))
    part.load(str(cut), None)
    own = TacticRecord.from_json(part.info()["tactic_record"])
    assert own.choice_of("relu0") is not None  # the cut model runs relu0 alone
    record = save_record(own, tmp_path / "cut.json")
    out = tmp_path / "replay.json"
    code = main(["tactics", "replay", str(model), str(record), "--json", str(out)])
    data = json.loads(out.read_text())
    assert code == 1 and data["applied"] is False
    assert {"node": "relu0", "requested": own.choice_of("relu0"),
            "used": f"{fused_into.choice} (fused into {fused_into.node})"} in data["not_applied"]
    assert "every choice took effect" not in capsys.readouterr().out


def test_replay_counts_only_the_choices_this_model_has(
    cnn: tuple[Path, np.ndarray, TacticRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole model's record replayed on a part of it: the choices for nodes the part lacks are skipped,
    and "replayed N choices" counted them as replayed."""
    model, _, whole = cnn
    cut = tmp_path / "cut.onnx"
    onnx.utils.extract_model(str(model), str(cut), ["c0"], ["y"])
    present = {node.name for node in onnx.load(str(cut)).graph.node}
    absent = [c.node for c in whole.choices if c.node not in present]
    assert absent, "the cut model should lack conv0"
    record = save_record(whole, tmp_path / "whole.json")
    main(["tactics", "replay", str(cut), str(record)])
    out = capsys.readouterr().out
    assert f"{plural(len(absent), 'choice')} of the record name nodes this model does not have: not replayed" in out
    assert f"replayed {plural(len(whole.choices) - len(absent), 'choice')}" in out
