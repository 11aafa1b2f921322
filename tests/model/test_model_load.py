"""Loading: clear errors for bad files, external data checks, the zoo models, the user's file untouched."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from model_builders import LIGHT_MODELS, chain_model, run, weighted_model

from graphbisect.errors import ModelError
from graphbisect.model import Model, load_model


def _save(proto: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: p.stem)
def test_light_zoo_models_load_and_normalize(path: Path) -> None:
    model = load_model(path)
    assert isinstance(model, Model) and model.path == path
    assert len(model.nodes) > 0 and len(set(model.node_names)) == len(model.nodes)
    assert model.opset > 0 and model.input_names and model.output_names
    assert all(name in model.producer for name in model.intermediate_names())
    assert model.to_networkx().number_of_nodes() == len(model.nodes)
    for index, node in enumerate(model.nodes):  # topological: producers come first
        assert all(model.producer.get(name, -1) < index for name in node.input)


def test_light_models_exist() -> None:
    assert len(LIGHT_MODELS) >= 5


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model not found") as info:
        load_model(tmp_path / "nope.onnx")
    assert "expected an ONNX model" in (info.value.hint or "")


def test_folder_is_not_a_model(tmp_path: Path) -> None:
    _save(chain_model(), tmp_path / "inner.onnx")
    with pytest.raises(ModelError, match=r"is a folder.*inner\.onnx"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (b'{"model": "resnet", "layers": [1, 2, 3]}', "JSON"),
        (b"hello, this is a plain text file\nwith two lines\n", "text"),
        (b"", "empty"),
        (bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)), "binary"),
    ],
    ids=["json", "text", "empty", "random"],
)
def test_non_onnx_files_are_refused_with_what_was_expected(tmp_path: Path, content: bytes, kind: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=str(path)) as info:
        load_model(path)
    assert kind in str(info.value)
    assert "expected an ONNX model" in (info.value.hint or "")


def test_json_suffix_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(ModelError, match=r"config\.json"):
        load_model(path)


@pytest.mark.parametrize("fraction", [0.5, 0.9, 0.1])
def test_truncated_protobuf_is_refused(tmp_path: Path, fraction: float) -> None:
    data = weighted_model(64).SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelError, match=r"truncated|corrupt|no graph") as info:
        load_model(path)
    assert "re-export or re-download" in str(info.value)


def test_graph_without_opset_import_is_refused(tmp_path: Path) -> None:
    proto = chain_model()
    del proto.opset_import[:]  # what a cut right after the graph field leaves
    with pytest.raises(ModelError, match="imports no opset"):
        load_model(_save(proto, tmp_path / "m.onnx"))


def test_user_file_is_never_written(tmp_path: Path) -> None:
    proto = chain_model()
    proto.ir_version = 14
    path = _save(proto, tmp_path / "m.onnx")
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    load_model(path).save(tmp_path / "out.onnx")
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx"]


# --- external data ----------------------------------------------------------------------------------------


def _save_external(proto: onnx.ModelProto, folder: Path, location: str = "weights.bin") -> Path:
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # onnx.save_model converts its argument to external data in place
    onnx.save_model(copy, str(path), save_as_external_data=True, location=location, size_threshold=0)
    return path


def _set_location(path: Path, location: str) -> None:
    proto = onnx.load_model(str(path), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    path.write_bytes(proto.SerializeToString())


def test_external_data_is_loaded_and_runs(tmp_path: Path) -> None:
    proto = weighted_model(64)
    path = _save_external(proto, tmp_path / "m")
    model = load_model(path)
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in model.proto.graph.initializer)
    x = np.ones((1, 64), np.float32)
    np.testing.assert_allclose(run(model.proto, {"x": x})["y"], run(proto, {"x": x})["y"], rtol=1e-6)
    assert model.fingerprint == load_model(proto).fingerprint


@pytest.mark.parametrize("location", ["../weights.bin", "sub/../../weights.bin", "/etc/passwd", "C:\\w.bin"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path: Path, location: str) -> None:
    path = _save_external(weighted_model(16), tmp_path / "m")
    (tmp_path / "weights.bin").write_bytes((tmp_path / "m" / "weights.bin").read_bytes())
    _set_location(path, location)
    with pytest.raises(ModelError, match="outside the model's folder") as info:
        load_model(path)
    assert "'W1'" in str(info.value) and repr(location) in str(info.value)


def test_external_data_in_a_subfolder_is_fine(tmp_path: Path) -> None:
    path = _save_external(weighted_model(16), tmp_path / "m", location="data/weights.bin")
    assert load_model(path).proto.graph.initializer[0].HasField("raw_data")


def test_missing_external_data_names_tensor_and_file(tmp_path: Path) -> None:
    path = _save_external(weighted_model(16), tmp_path / "m")
    (tmp_path / "m" / "weights.bin").unlink()
    with pytest.raises(ModelError, match="external data of tensor 'W1' is missing") as info:
        load_model(path)
    assert "weights.bin" in str(info.value)
    assert "next to the model" in (info.value.hint or "")


def test_truncated_external_data_is_refused(tmp_path: Path) -> None:
    path = _save_external(weighted_model(16), tmp_path / "m")
    data_file = tmp_path / "m" / "weights.bin"
    data_file.write_bytes(data_file.read_bytes()[:100])
    with pytest.raises(ModelError, match="too small for tensor"):
        load_model(path)


def test_external_data_load_leaves_user_files_alone(tmp_path: Path) -> None:
    path = _save_external(weighted_model(16), tmp_path / "m")
    files = {p: p.read_bytes() for p in (tmp_path / "m").iterdir()}
    load_model(path)
    assert {p: p.read_bytes() for p in (tmp_path / "m").iterdir()} == files


def test_symlinked_model_folder_layout_is_accepted(tmp_path: Path) -> None:
    """Hugging Face caches store files as symlinks to blobs elsewhere: lexical checks must allow that."""
    path = _save_external(weighted_model(16), tmp_path / "blobs")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    for name in ("model.onnx", "weights.bin"):
        os.symlink(tmp_path / "blobs" / name, snapshot / name)
    assert load_model(snapshot / "model.onnx").fingerprint == load_model(path).fingerprint


@pytest.mark.paddle
def test_paddle_model_is_converted_and_normalized(tmp_path: Path) -> None:
    pytest.importorskip("paddle")
    pytest.importorskip("paddle2onnx")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from paddle_models import export_conv_net

    prefix = export_conv_net(tmp_path / "paddle")
    model = load_model(prefix, cache_dir=tmp_path / "cache")
    assert model.paddle_source is not None and model.paddle_source.parent == prefix.parent
    assert model.path is not None and model.path.is_relative_to(tmp_path / "cache")
    assert len(model.nodes) > 0 and model.ir_version <= 10
    assert load_model(prefix, cache_dir=tmp_path / "cache").fingerprint == model.fingerprint


def test_incomplete_paddle_model_gets_a_paddle_error(tmp_path: Path) -> None:
    (tmp_path / "inference.pdmodel").write_bytes(b"program")
    with pytest.raises(ModelError, match="Paddle") as info:
        load_model(tmp_path / "inference")
    assert info.value.hint
