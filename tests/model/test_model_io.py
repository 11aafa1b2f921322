"""Saving models: atomic writes, external data over 2 GiB, and the weights file shared by candidates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from model_builders import chain_model, run, weighted_model

from graphbisect.model import (
    ExternalRef,
    load_model,
    save_proto,
    strip_to_external,
    write_weights_file,
)
from graphbisect.model import io as model_io
from graphbisect.model.io import WeightsPool


def test_save_roundtrips_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    model = load_model(weighted_model(32))
    path = model.save(tmp_path / "out" / "model.onnx")
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx"]
    again = load_model(path)
    assert again.fingerprint == model.fingerprint


def test_save_replaces_an_existing_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"old")
    load_model(chain_model()).save(path)
    assert onnx.load_model(str(path)).graph.node[0].name == "n0"


def test_failed_save_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"old")
    with pytest.raises(ZeroDivisionError), model_io.atomic_path(path) as tmp:
        tmp.write_bytes(b"half")
        raise ZeroDivisionError
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_large_models_are_saved_with_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", 10_000)  # pretend 10 kB is the 2 GiB limit
    model = load_model(weighted_model(64))
    path = model.save(tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").stat().st_size >= 2 * 64 * 64 * 4
    assert path.stat().st_size < 10_000
    assert load_model(path).fingerprint == model.fingerprint
    x = np.ones((1, 64), np.float32)
    np.testing.assert_allclose(run(path, {"x": x})["y"], run(model.proto, {"x": x})["y"], rtol=1e-6)
    # a model whose weights' raw bytes are under the limit but whose whole protobuf is over it: serialized once
    # to be sized, then saved with external data all the same
    raw = sum(len(tensor.raw_data) for tensor in model.proto.graph.initializer)
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", raw + 1)
    assert model.proto.ByteSize() > raw + 1
    path = model.save(tmp_path / "just-over.onnx")
    assert (tmp_path / "just-over.onnx.data").is_file() and path.stat().st_size < raw
    assert load_model(path).fingerprint == model.fingerprint


def test_weights_file_holds_every_initializer_once_aligned(tmp_path: Path) -> None:
    model = load_model(weighted_model(600))  # W1, W2: 1.44 MB each -> 64 KiB aligned
    refs = write_weights_file(model, tmp_path / "weights.bin")
    assert set(refs) == {"W1", "b1", "W2"}  # the 16-byte 'shape' stays inline (runtimes need it there)
    assert set(write_weights_file(model, tmp_path / "all.bin", min_bytes=0)) == {"W1", "b1", "W2", "shape"}
    assert refs["W1"] == ExternalRef("weights.bin", 0, 600 * 600 * 4)
    assert refs["W2"].offset % 65536 == 0 and refs["b1"].offset % 64 == 0
    data = (tmp_path / "weights.bin").read_bytes()
    for tensor in model.proto.graph.initializer[:3]:
        ref = refs[tensor.name]
        stored = np.frombuffer(data[ref.offset : ref.offset + ref.length], onnx.numpy_helper.to_array(tensor).dtype)
        np.testing.assert_array_equal(stored, onnx.numpy_helper.to_array(tensor).reshape(-1))


def test_candidates_share_the_weights_file_and_run_in_ort(tmp_path: Path) -> None:
    model = load_model(weighted_model(256))
    refs = write_weights_file(model, tmp_path / "weights.bin")
    weights_size = (tmp_path / "weights.bin").stat().st_size
    x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
    expected = run(model.proto, {"x": x})["y"]
    sizes = []
    for i in range(3):
        candidate = strip_to_external(model.proto, refs)
        path = save_proto(candidate, tmp_path / f"candidate_{i}.onnx")
        sizes.append(path.stat().st_size)
        np.testing.assert_allclose(run(path, {"x": x})["y"], expected, rtol=1e-5)
    assert max(sizes) < 2048 < weights_size / 100  # a candidate costs its graph, not its weights
    assert (tmp_path / "weights.bin").stat().st_size == weights_size


def test_strip_to_external_copies_no_tensor_data_and_leaves_the_source_alone(tmp_path: Path) -> None:
    model = load_model(weighted_model(64))
    before = model.proto.SerializeToString(deterministic=True)
    refs = write_weights_file(model, tmp_path / "weights.bin")
    stripped = strip_to_external(model.proto, {k: v for k, v in refs.items() if k != "b1"})
    by_name = {t.name: t for t in stripped.graph.initializer}
    assert [t.name for t in stripped.graph.initializer] == [t.name for t in model.proto.graph.initializer]
    assert not by_name["W1"].raw_data and by_name["W1"].data_location == onnx.TensorProto.EXTERNAL
    assert list(by_name["W1"].dims) == [64, 64]
    assert by_name["b1"].raw_data  # not in refs: stays inline
    assert model.proto.SerializeToString(deterministic=True) == before
    assert stripped.graph.node[0].name == model.proto.graph.node[0].name


def test_probe_model_over_the_shared_weights_runs(tmp_path: Path) -> None:
    model = load_model(weighted_model(64))
    refs = write_weights_file(model, tmp_path / "weights.bin")
    probe = model.with_outputs(["h3"], weights=refs)
    path = save_proto(probe, tmp_path / "probe.onnx")
    x = np.ones((1, 64), np.float32)
    values = run(path, {"x": x})
    np.testing.assert_allclose(values["h3"], run(model.with_outputs(["h3"]), {"x": x})["h3"], rtol=1e-6)
    assert path.stat().st_size < 2048


def test_loading_a_candidate_resolves_the_shared_weights(tmp_path: Path) -> None:
    model = load_model(weighted_model(32))
    refs = write_weights_file(model, tmp_path / "weights.bin")
    path = save_proto(strip_to_external(model.proto, refs), tmp_path / "candidate.onnx")
    assert load_model(path).fingerprint == model.fingerprint


def test_a_weights_pool_writes_each_initializer_once_as_candidates_bring_them(tmp_path: Path) -> None:
    """A lowering makes weights as candidates come (a weight's int8 copy): the pool appends what it has not
    seen, a candidate costs its graph, and a name seen again with another shape is refused (one name, one
    value: else a candidate would silently read another tensor's bytes)."""
    model = load_model(weighted_model(256))
    pool = WeightsPool(tmp_path)
    x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
    first = save_proto(pool.strip(model.proto), tmp_path / "a.onnx")
    size = pool.path.stat().st_size
    assert size >= 2 * 256 * 256 * 4 and first.stat().st_size < 2048
    np.testing.assert_array_equal(run(first, {"x": x})["y"], run(model.proto, {"x": x})["y"])

    grown = onnx.ModelProto()
    grown.CopyFrom(model.proto)  # a candidate that brings a new weight: y = (...) @ W3
    w3 = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)
    grown.graph.initializer.append(onnx.numpy_helper.from_array(w3, "W3"))
    grown.graph.node[-1].output[0] = "y0"
    grown.graph.node.append(onnx.helper.make_node("MatMul", ["y0", "W3"], ["y"], name="mm3"))
    second = save_proto(pool.strip(grown), tmp_path / "b.onnx")
    assert pool.path.stat().st_size >= size + 256 * 256 * 4 and second.stat().st_size < 2048
    np.testing.assert_allclose(run(second, {"x": x})["y"], run(grown, {"x": x})["y"], rtol=1e-6)
    grown_size = pool.path.stat().st_size
    again = save_proto(pool.strip(model.proto), tmp_path / "c.onnx")  # nothing new: nothing written
    assert pool.path.stat().st_size == grown_size and again.stat().st_size < 2048

    other = onnx.ModelProto()
    other.CopyFrom(model.proto)
    other.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.ones((256, 128), np.float32), "W1"))
    with pytest.raises(ValueError, match="'W1'"):
        pool.strip(other)
    pool.close()
    assert not pool.path.exists()
