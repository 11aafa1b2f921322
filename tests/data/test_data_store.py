"""The activation store: one .npy per tensor, a manifest, read-only memory maps, adopting worker output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphbisect.data import ActivationStore
from graphbisect.errors import GraphBisectError


@pytest.mark.parametrize("shape", [(2, 3, 4), (64, 1024)])  # read (96 bytes), memory-mapped (256 KiB)
def test_put_get_returns_read_only_arrays(tmp_path: Path, shape: tuple[int, ...]) -> None:
    store = ActivationStore(tmp_path / "acts")
    value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    store.put("conv1/out:0", value)
    got = store.get("conv1/out:0")
    assert isinstance(got, np.memmap) == (value.nbytes > 64 << 10)
    assert not got.flags.writeable
    np.testing.assert_array_equal(got, value)
    with pytest.raises(ValueError):
        got[0, 0] = 1


@pytest.mark.parametrize("array", [np.asfortranarray(np.arange(12.0).reshape(3, 4)),
                                   np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")])])
def test_files_numpy_wrote_differently_are_read_by_numpy(tmp_path: Path, array: np.ndarray) -> None:
    """Fortran order or a structured dtype in the header: the fast path steps aside for np.load."""
    np.save(tmp_path / "0.npy", array)
    store = ActivationStore.adopt(tmp_path, {"x": "0.npy"})
    np.testing.assert_array_equal(store.get("x"), array)


def test_files_are_not_named_after_tensors(tmp_path: Path) -> None:
    store = ActivationStore(tmp_path)
    names = ["a/b/../c", "x:0", "n" * 300]
    for name in names:
        store.put(name, np.zeros(2))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["manifest.json", "t000000.npy", "t000001.npy", "t000002.npy"]
    assert store.names() == names


def test_reopen_contains_len_nbytes(tmp_path: Path) -> None:
    store = ActivationStore(tmp_path)
    store.put("a", np.ones((10, 10), np.float32))
    store.put("b", np.ones(3, np.int64))
    store.put("empty", np.zeros((0, 4), np.float32))
    store.put("scalar", np.float64(2.5))
    reopened = ActivationStore.open(tmp_path)
    assert "a" in reopened and "zzz" not in reopened and len(reopened) == 4
    assert reopened.nbytes == 400 + 24 + 0 + 8
    assert reopened.get("empty").shape == (0, 4)
    assert reopened["scalar"] == 2.5 and reopened.get("scalar").shape == ()
    assert list(reopened) == ["a", "b", "empty", "scalar"]
    assert reopened.info("b").shape == (3,) and np.dtype(reopened.info("b").dtype) == np.int64


def test_put_replaces_and_keeps_old_maps_valid(tmp_path: Path) -> None:
    store = ActivationStore(tmp_path)
    store.put("t", np.zeros(4))
    old = store.get("t")
    store.put("t", np.ones(4))
    np.testing.assert_array_equal(old, 0)  # the replaced file stays readable through its map
    np.testing.assert_array_equal(store.get("t"), 1)
    assert len(list(tmp_path.glob("*.npy"))) == 1


def test_string_tensors_from_object_arrays(tmp_path: Path) -> None:
    store = ActivationStore(tmp_path)
    store.put("s", np.array(["ab", "c"], dtype=object))
    assert store.get("s").tolist() == ["ab", "c"]


def test_manifest_is_written_atomically_and_only_on_flush_without_autoflush(tmp_path: Path) -> None:
    store = ActivationStore(tmp_path, autoflush=False)
    store.put("a", np.zeros(2))
    assert not (tmp_path / "manifest.json").exists()
    store.flush()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["tensors"][0]["name"] == "a"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_unknown_name_suggests_close_match(tmp_path: Path) -> None:
    store = ActivationStore(tmp_path)
    store.put("conv1_out", np.zeros(1))
    with pytest.raises(KeyError, match="did you mean 'conv1_out'"):
        store.get("conv1_ot")


def test_open_requires_a_manifest(tmp_path: Path) -> None:
    with pytest.raises(GraphBisectError, match=r"manifest\.json is missing"):
        ActivationStore.open(tmp_path)


def test_corrupt_manifest(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{broken")
    with pytest.raises(GraphBisectError, match="cannot read the activation store manifest"):
        ActivationStore.open(tmp_path)
    (tmp_path / "manifest.json").write_text(
        json.dumps({"version": 1, "tensors": [{"name": "a", "file": "../x.npy", "dtype": "<f4", "shape": []}]})
    )
    with pytest.raises(GraphBisectError, match="outside the store"):
        ActivationStore.open(tmp_path)


def _write_like_the_worker(folder: Path, outputs: dict[str, np.ndarray]) -> None:
    """The backend worker's output layout: <index>.npy plus manifest.json (see backends/worker.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for index, (name, value) in enumerate(outputs.items()):
        np.save(folder / f"{index}.npy", value)
        entries.append({"name": name, "file": f"{index}.npy", "dtype": value.dtype.str, "shape": list(value.shape)})
    (folder / "manifest.json").write_text(json.dumps({"version": 1, "tensors": entries}))


def test_adopt_a_worker_output_folder_without_copying(tmp_path: Path) -> None:
    outputs = {"logits": np.arange(10, dtype=np.float32), "mask": np.array([True, False])}
    _write_like_the_worker(tmp_path, outputs)
    before = sorted(p.name for p in tmp_path.iterdir())
    store = ActivationStore.adopt(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    np.testing.assert_array_equal(store.get("logits"), outputs["logits"])
    assert store.path("mask") == tmp_path / "1.npy"
    store.put("extra", np.zeros(1))  # new files never collide with the worker's
    assert ActivationStore.open(tmp_path).names() == ["logits", "mask", "extra"]


def test_adopt_the_real_worker_output(tmp_path: Path) -> None:
    worker = pytest.importorskip("graphbisect.backends.worker")
    outputs: dict[str, np.ndarray] = {"a/b": np.ones((2, 2), np.float16), "c": np.zeros(3, np.int32)}
    worker.write_outputs(outputs, list(outputs), tmp_path)
    store = ActivationStore.adopt(tmp_path)
    for name, value in outputs.items():
        np.testing.assert_array_equal(store.get(name), value)
        assert store.get(name).dtype == value.dtype


def test_adopt_files_by_mapping(tmp_path: Path) -> None:
    np.save(tmp_path / "out_0.npy", np.full((3, 2), 7, np.int64))
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "sub" / "o.npy", np.ones(2))
    store = ActivationStore.adopt(tmp_path, {"x": "out_0.npy", "y": tmp_path / "sub" / "o.npy"})
    assert store.info("x").shape == (3, 2) and store.info("y").file == "sub/o.npy"
    assert ActivationStore.open(tmp_path).get("x").sum() == 42


def test_adopt_refuses_files_outside_the_folder(tmp_path: Path) -> None:
    np.save(tmp_path / "outside.npy", np.ones(1))
    with pytest.raises(GraphBisectError, match="outside the store folder"):
        ActivationStore.adopt(tmp_path / "store", {"x": tmp_path / "outside.npy"})
    with pytest.raises(GraphBisectError, match="does not exist"):
        ActivationStore.adopt(tmp_path, {"x": "missing.npy"})


def test_large_tensor_is_not_loaded_by_get(tmp_path: Path) -> None:
    store = ActivationStore(tmp_path)
    big = np.lib.format.open_memmap(tmp_path / "src.npy", mode="w+", dtype=np.float32, shape=(8, 1024, 1024))
    big[-1, -1, -1] = 3.0
    store.put("big", big)  # streamed from one map into the store's file
    got = store.get("big")
    assert isinstance(got, np.memmap) and got.nbytes == 32 * 2**20
    assert got[-1, -1, -1] == 3.0
