"""Weights kept on disk: loading, saving, probes, shared weights and bundles of a model with external data.

What a user with a model beyond 2 GB relies on, at a few MB: the weights are not read into the main process,
everything graphbisect writes still runs (and gives the same values), and the user's files stay as they were.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from graphbisect.errors import ModelError
from graphbisect.model import Model, load_model, save_proto, strip_to_external, write_weights_file
from graphbisect.model.external import LAZY_MIN_BYTES, source_of
from graphbisect.strategies.subgraph import SubgraphSpace
from tests.model.model_builders import external_chain_model, run, weighted_model

BIG = ("w0", "w1")  # 1 MiB each: kept on disk; the others (2-16 KiB) are read at load time


@pytest.fixture
def external(tmp_path: Path) -> tuple[Path, onnx.ModelProto, dict[str, np.ndarray]]:
    return external_chain_model(tmp_path / "user")


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def _by_name(proto: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in proto.graph.initializer}


def _no_links(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)


def test_large_external_weights_stay_on_disk_after_loading(external) -> None:  # type: ignore[no-untyped-def]
    path, inline, _ = external
    model = load_model(path)
    tensors = _by_name(model.proto)
    for name in BIG:
        assert not tensors[name].raw_data and tensors[name].data_location == onnx.TensorProto.EXTERNAL
        source = source_of(tensors[name])
        assert source is not None and os.path.samefile(source.file, path.parent / "model.onnx.data")
    small = [t for name, t in tensors.items() if name not in BIG]
    assert all(t.data_location == onnx.TensorProto.DEFAULT and source_of(t) is None for t in small)
    assert model.external_bytes == 2 * 512 * 512 * 4
    assert model.proto.ByteSize() < LAZY_MIN_BYTES  # the graph, not the 2 MiB of weights
    assert model.fingerprint == load_model(inline).fingerprint  # same model, wherever its weights live


def test_an_in_memory_model_with_relative_external_data_is_refused_by_name(external) -> None:  # type: ignore[no-untyped-def]
    """onnx.load(path, load_external_data=False) keeps references relative to a folder the ModelProto does not
    know: it was accepted with a warning, and then the oracle "failed" (External data path does not exist)
    with a hint to choose another oracle. A loaded model (absolute references) is still accepted."""
    path, _, _ = external
    with pytest.raises(ModelError, match=r"'w0'.*model\.onnx\.data.*relative") as refused:
        load_model(onnx.load(str(path), load_external_data=False))
    assert "pass the model's path" in str(refused.value)
    assert load_model(load_model(path).proto).external_bytes == 2 * 512 * 512 * 4


@pytest.mark.parametrize("copy", ["link", "kernel copy", "read and write"])
def test_saved_model_runs_the_same_and_user_files_are_untouched(
        external, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copy: str) -> None:  # type: ignore[no-untyped-def]
    path, _, feeds = external
    before = _snapshot(path.parent)
    model = load_model(path)
    if copy != "link":
        _no_links(monkeypatch)
    if copy == "read and write":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
        monkeypatch.delattr(os, "sendfile", raising=False)
    saved = model.save(tmp_path / "elsewhere" / "model.onnx")
    files = sorted(p.name for p in saved.parent.iterdir())
    if copy == "link":  # the user's data file, linked: no byte copied
        assert files == ["model.onnx", "model.onnx.data.0"]
        assert os.path.samefile(saved.parent / "model.onnx.data.0", path.parent / "model.onnx.data")
    else:  # only the referenced ranges, aligned
        assert files == ["model.onnx", "model.onnx.data"]
        assert (saved.parent / "model.onnx.data").stat().st_size < 2 * model.external_bytes
    np.testing.assert_array_equal(run(saved, feeds)["y"], run(path, feeds)["y"])
    assert load_model(saved).fingerprint == model.fingerprint
    assert _snapshot(path.parent) == before


def test_probe_saved_in_another_folder_exposes_every_tensor(external, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path, inline, feeds = external
    model = load_model(path)
    names = model.intermediate_names()
    probe = save_proto(model.with_outputs(names), tmp_path / "probe" / "probe.onnx")
    got = run(probe, feeds)
    expected = run(load_model(inline).with_outputs(names), feeds)
    assert set(got) == set(expected) == set(names)
    for name in names:
        np.testing.assert_array_equal(got[name], expected[name])


@pytest.mark.parametrize("link", [True, False])
def test_weights_file_references_the_user_data_without_reading_it(
        external, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link: bool) -> None:  # type: ignore[no-untyped-def]
    path, _, feeds = external
    model = load_model(path)
    if not link:
        _no_links(monkeypatch)
    refs = write_weights_file(model, tmp_path / "weights.bin")
    sources = {name: source_of(_by_name(model.proto)[name]) for name in BIG}
    for name in BIG:
        source = sources[name]
        assert source is not None
        if link:  # the user's file at its own offsets
            assert refs[name].location == "weights.bin.0" and refs[name].offset == source.offset
        else:
            assert refs[name].location == "weights.bin"
        assert refs[name].length == source.length
    assert all(refs[name].location == "weights.bin" for name in ("b0", "down", "up", "b1"))  # 2-16 KiB, in memory
    candidate = save_proto(strip_to_external(model.proto, refs), tmp_path / "candidate.onnx")
    np.testing.assert_array_equal(run(candidate, feeds)["y"], run(path, feeds)["y"])


def _oracle_values(model: Model, feeds: dict[str, np.ndarray], folder: Path) -> dict[str, np.ndarray]:
    probe = save_proto(model.with_outputs(model.intermediate_names()), folder / "probe.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(probe), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {**feeds, **dict(zip(names, session.run(names, feeds), strict=True))}


def test_candidates_reference_weights_bin_and_bundles_carry_only_their_weights(
        external, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path, _, feeds = external
    model = load_model(path)
    values = _oracle_values(model, feeds, tmp_path / "oracle")
    space = SubgraphSpace(model, values.__getitem__, tmp_path / "candidates")
    first = model.producer[model.nodes[0].output[0]]  # MatMul(x, w0): 1 MiB kept on disk
    keep = {first, first + 1}  # MatMul, Add(b0)

    candidate = space.materialize(keep)
    refs = _by_name(candidate.proto)
    assert refs["w0"].data_location == onnx.TensorProto.EXTERNAL and not refs["w0"].raw_data
    saved = save_proto(candidate.proto, space.workdir / "candidate.onnx")
    out = run(saved, dict(candidate.feeds))
    for name in candidate.outputs:
        np.testing.assert_allclose(out[name], values[name], rtol=1e-5, atol=1e-5)

    bundled = space.materialize(keep, inline_weights=True)
    weights = _by_name(bundled.proto)
    assert set(weights) == {"w0", "b0"}  # only what its nodes read
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in weights.values())
    assert len(weights["w0"].raw_data) == 512 * 512 * 4
    out = run(bundled.proto, dict(bundled.feeds))  # one self-contained proto: no file beside it
    for name in bundled.outputs:
        np.testing.assert_allclose(out[name], values[name], rtol=1e-5, atol=1e-5)


def test_a_derived_model_not_saved_with_save_proto_fails_loudly(external, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A reference to the user's file is an absolute path, which ONNX Runtime refuses: never a silent misread."""
    path, _, _ = external
    target = tmp_path / "raw.onnx"
    target.write_bytes(load_model(path).proto.SerializeToString())
    with pytest.raises(Exception, match=r"[Aa]bsolute path"):
        ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])


def test_data_file_truncated_after_loading_is_reported(
        external, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    path, _, _ = external
    model = load_model(path)
    data = path.parent / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    _no_links(monkeypatch)
    with pytest.raises(ModelError, match="ended early"):
        model.save(tmp_path / "copy" / "model.onnx")


def test_inline_models_are_saved_as_before(tmp_path: Path) -> None:
    model = load_model(weighted_model(256))
    assert model.external_bytes == 0 and all(source_of(t) is None for t in model.proto.graph.initializer)
    saved = model.save(tmp_path / "model.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
    assert onnx.load(str(saved)).SerializeToString() == model.proto.SerializeToString()
