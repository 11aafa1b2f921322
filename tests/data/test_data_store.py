"""The activation store: one packed data file and its index, read-only memory maps, worker output as a store,
torn runs refused, stores of the older per-tensor layout still read."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from graphbisect.backends.worker import InputsReader, InputsWriter, write_outputs
from graphbisect.data import ActivationStore
from graphbisect.data.store import StoredFeeds
from graphbisect.errors import GraphBisectError
from graphbisect.storage.packfile import TornRunError


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


def test_a_fortran_ordered_npy_is_adopted_in_c_order_and_a_structured_one_is_refused(tmp_path: Path) -> None:
    array = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    np.save(tmp_path / "0.npy", array)
    store = ActivationStore.adopt(tmp_path, {"x": "0.npy"})
    np.testing.assert_array_equal(store.get("x"), array)
    np.save(tmp_path / "1.npy", np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]))
    with pytest.raises(GraphBisectError, match="tensor 'y' cannot be stored"):
        store.put("y", np.load(tmp_path / "1.npy"))


def test_files_are_not_named_after_tensors_and_a_run_is_two_files(tmp_path: Path) -> None:
    store = ActivationStore(tmp_path)
    names = ["a/b/../c", "x:0", "n" * 300]
    for index, name in enumerate(names):
        store.put(name, np.full(2, index, np.float32))
    store.put("big", np.ones(1 << 16, np.float32))  # 256 KiB: page-aligned, mapped
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["manifest.json", "values.bin"]
    assert store.names() == [*names, "big"]
    reopened = ActivationStore.open(tmp_path)
    assert [float(reopened.get(name)[0]) for name in names] == [0.0, 1.0, 2.0]
    assert reopened.info("big").offset is not None and reopened.info("big").offset % 4096 == 0
    assert all(reopened.info(name).offset % 64 == 0 for name in names)  # type: ignore[operator]


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
    store.put("t", np.zeros(1 << 15))  # 256 KiB: a view of the map
    old = store.get("t")
    assert isinstance(old, np.memmap)
    store.put("t", np.ones(1 << 15))
    np.testing.assert_array_equal(old, 0)  # the replaced value's bytes are never overwritten
    np.testing.assert_array_equal(store.get("t"), 1)
    assert store.names() == ["t"] and ActivationStore.open(tmp_path).get("t")[0] == 1


def test_a_reopened_store_is_appended_to(tmp_path: Path) -> None:
    with ActivationStore(tmp_path) as store:
        store.put("a", np.arange(3))
    again = ActivationStore(tmp_path)
    again.put("b", np.arange(4))
    reopened = ActivationStore.open(tmp_path)
    assert reopened.names() == ["a", "b"] and reopened.get("a").tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "values.bin"]


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
    with pytest.raises(GraphBisectError, match="cannot read the store manifest"):
        ActivationStore.open(tmp_path)
    (tmp_path / "manifest.json").write_text(
        json.dumps({"version": 1, "tensors": [{"name": "a", "file": "../x.npy", "dtype": "<f4", "shape": []}]})
    )
    with pytest.raises(GraphBisectError, match="outside the store"):
        ActivationStore.open(tmp_path)


def _write_the_per_tensor_layout(folder: Path, outputs: dict[str, np.ndarray]) -> None:
    """What graphbisect wrote before the packed layout: <index>.npy plus manifest.json version 1."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for index, (name, value) in enumerate(outputs.items()):
        np.save(folder / f"{index}.npy", value)
        entries.append({"name": name, "file": f"{index}.npy", "dtype": value.dtype.str, "shape": list(value.shape)})
    (folder / "manifest.json").write_text(json.dumps({"version": 1, "tensors": entries}))


def test_a_store_of_the_per_tensor_layout_is_read_not_added_to(tmp_path: Path) -> None:
    outputs = {"logits": np.arange(10, dtype=np.float32), "mask": np.array([True, False])}
    _write_the_per_tensor_layout(tmp_path, outputs)
    before = sorted(p.name for p in tmp_path.iterdir())
    store = ActivationStore.adopt(tmp_path)
    np.testing.assert_array_equal(store.get("logits"), outputs["logits"])
    assert store.path("mask") == tmp_path / "1.npy"
    with pytest.raises(GraphBisectError, match=r"older graphbisect \(one \.npy file per tensor"):
        store.put("extra", np.zeros(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_adopt_the_real_worker_output(tmp_path: Path) -> None:
    outputs: dict[str, np.ndarray] = {"a/b": np.ones((2, 2), np.float16), "c": np.zeros(3, np.int32),
                                      "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
                                      "strided": np.arange(10, dtype=np.int64)[::3], "big": np.ones((300, 300))}
    write_outputs(outputs, list(outputs), tmp_path)
    store = ActivationStore.adopt(tmp_path)
    for name, value in outputs.items():
        np.testing.assert_array_equal(store.get(name), value)
        assert store.get(name).dtype == value.dtype


def test_adopt_files_by_mapping(tmp_path: Path) -> None:
    np.save(tmp_path / "out_0.npy", np.full((3, 2), 7, np.int64))
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "sub" / "o.npy", np.ones(2))
    store = ActivationStore.adopt(tmp_path, {"x": "out_0.npy", "y": tmp_path / "sub" / "o.npy"})
    assert store.info("x").shape == (3, 2) and store.info("y").file == "values.bin"
    (tmp_path / "out_0.npy").unlink()  # copied into the store's data file
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


# --- torn runs: detected and refused, never misread ------------------------------------------------------------
def _run_folder(folder: Path, scale: float = 1.0) -> Path:
    """A folder as the backend worker writes it: a small tensor, a page-aligned one, a sequence."""
    outputs = {"a": np.arange(5, dtype=np.float32) * scale, "b": np.full(40_000, scale, np.float32),
               "s": [np.ones(3, np.int64), np.zeros(2, np.float16)]}
    write_outputs(outputs, list(outputs), folder)
    return folder


def test_a_truncated_data_file_is_refused_naming_it(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path / "run")
    data = folder / "values.bin"
    os.truncate(data, data.stat().st_size - 100)
    with pytest.raises(TornRunError, match=r"values\.bin is truncated") as caught:
        ActivationStore.open(folder)
    assert caught.value.hint is not None and f"delete {folder}" in caught.value.hint


def test_data_without_its_index_is_a_run_that_did_not_finish(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path / "run")
    (folder / "manifest.json").unlink()
    with pytest.raises(TornRunError, match=r"values\.bin has no index \(manifest\.json\): the run that wrote it "
                                           "did not finish"):
        ActivationStore.open(folder)


def test_an_index_and_data_of_different_runs_are_refused(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path / "run")
    other = _run_folder(tmp_path / "other", scale=2.0)  # same layout, same size, other values
    assert (other / "values.bin").stat().st_size == (folder / "values.bin").stat().st_size
    shutil.copyfile(other / "values.bin", folder / "values.bin")
    with pytest.raises(TornRunError, match="come from different runs"):
        ActivationStore.open(folder)


def test_a_tail_that_never_reached_the_disk_is_refused(tmp_path: Path) -> None:
    """Same size, but the last bytes are zeros (a crash before the data was written back)."""
    folder = _run_folder(tmp_path / "run")
    data = folder / "values.bin"
    with open(data, "r+b") as handle:
        handle.seek(data.stat().st_size - 64)
        handle.write(bytes(64))
    with pytest.raises(TornRunError, match="does not match its index"):
        ActivationStore.open(folder)


def test_an_index_entry_beyond_the_data_is_refused_when_read(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path / "run")
    index = json.loads((folder / "manifest.json").read_text())
    index["tensors"][0]["offset"] = index["size"]
    (folder / "manifest.json").write_text(json.dumps(index))
    store = ActivationStore.open(folder)
    np.testing.assert_array_equal(store.get("b"), 1.0)
    with pytest.raises(TornRunError, match="outside the data"):
        store.get("a")


_KILLED_MID_WRITE = """
import os, signal, sys
from pathlib import Path
import numpy as np
from graphbisect.backends.worker import write_outputs

class Dying(dict):
    def __getitem__(self, name):
        if name == "c":  # the backend died while the outputs were being written
            os.kill(os.getpid(), signal.SIGKILL)
        return dict.__getitem__(self, name)

outputs = Dying(a=np.full(5, 7.0), b=np.full(40_000, 7.0, np.float32), c=np.zeros(1))
write_outputs(outputs, ["a", "b", "c"], Path(sys.argv[1]))
"""


def test_a_run_killed_mid_write_over_an_earlier_one_is_never_read(tmp_path: Path) -> None:
    """The real writer, SIGKILLed halfway through a second run into the same folder: the folder is refused
    (its data is the first run's, the index is gone), not read as the first run's values nor the second's."""
    folder = _run_folder(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", _KILLED_MID_WRITE, str(folder)], env=env, check=False,
                          capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with pytest.raises(TornRunError, match="did not finish"):
        ActivationStore.open(folder)
    assert len(list(folder.iterdir())) == 2  # values.bin and the dead run's temporary file: O(1) to delete
    write_outputs({"a": np.ones(2)}, ["a"], folder)  # the next run into the folder removes the dead one's file
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "values.bin"]
    np.testing.assert_array_equal(ActivationStore.open(folder).get("a"), 1.0)


_WRITING = """
import sys, time
from pathlib import Path
import numpy as np
from graphbisect.storage.packfile import PackWriter

writer = PackWriter(Path(sys.argv[1]))
writer.add(np.arange(10_000, dtype=np.float32))
writer.flush()
print("writing", flush=True)
time.sleep(120)
"""


def test_a_killed_writers_temporary_file_is_removed_and_a_live_ones_never(tmp_path: Path) -> None:
    """Two real processes writing one folder: a run starting beside a live writer leaves its temporary
    file alone; once that writer is SIGKILLed before its first publish, the next run removes it. A file of
    that name that is not ours (no header) stays."""
    folder = tmp_path / "run"
    folder.mkdir()
    foreign = folder / ".values.bin.notours.tmp"
    foreign.write_bytes(b"someone else's bytes")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", _WRITING, str(folder)], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"writing\n"
        (live,) = set(folder.glob(".values.bin.*.tmp")) - {foreign}
        write_outputs({"a": np.ones(2)}, ["a"], folder)  # a run beside the live writer
        assert live.exists() and foreign.exists()
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert live.exists()  # nothing removes it by itself
    write_outputs({"a": np.ones(2)}, ["a"], folder)
    assert not live.exists() and foreign.exists()
    assert sorted(p.name for p in folder.iterdir()) == [foreign.name, "manifest.json", "values.bin"]


def test_every_type_round_trips_through_the_worker_layout_reopened_and_appended(tmp_path: Path) -> None:
    """ml_dtypes, strings, sequences, optionals: written by the worker, reopened, appended to, read back."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = {"bf16": np.array([1.5, -2.0], ml_dtypes.bfloat16), "f8": np.array([0.5, 3.0], ml_dtypes.float8_e4m3fn),
              "i4": np.array([-8, 7, 1], ml_dtypes.int4), "str": np.array(["ab", "ç"], dtype=object),
              "seq": [np.arange(3, dtype=np.float32), np.array([1.0], ml_dtypes.bfloat16)], "none": None}
    first = dict(list(values.items())[:3])
    write_outputs(first, list(first), tmp_path)
    store = ActivationStore(tmp_path)
    for name, value in list(values.items())[3:]:
        store.put(name, value)
    reopened = ActivationStore.open(tmp_path)
    assert reopened.names() == list(values)
    for name in ("bf16", "f8", "i4"):
        got = reopened.get(name)
        assert got.dtype == values[name].dtype and got.tobytes() == values[name].tobytes(), name
    assert reopened.get("str").tolist() == ["ab", "ç"] and reopened.get("none") is None
    seq = reopened.get("seq")
    assert seq[0].tolist() == [0.0, 1.0, 2.0] and seq[1].dtype == ml_dtypes.bfloat16 and float(seq[1][0]) == 1.0


def test_get_many_reads_what_get_reads_of_every_type_read_only(tmp_path: Path) -> None:
    # The target's worker compares thousands of probed tensors with the store through get_many (its views of
    # the map, checked at once); each value must be get's: same bytes, type and shape, read-only, sequences,
    # optionals and types numpy lacks included, in the order asked; an unknown name is refused as get refuses it.
    # (get's decoded string arrays are writable copies; its plain tensors, views or small copies, are read-only.)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3), "big": np.arange(70_000, dtype=np.float32),
              "i64": np.array([3, -1], np.int64), "empty": np.zeros((0, 4), np.float16),
              "bf16": np.array([1.5, -2.0], ml_dtypes.bfloat16), "str": np.array(["ab", "ç"], dtype=object),
              "seq": [np.arange(3, dtype=np.float32)], "none": None}
    write_outputs(values, list(values), tmp_path)
    store = ActivationStore.open(tmp_path)
    order = ["seq", "big", "f32", "none", "bf16", "empty", "str", "i64", "f32"]
    many = store.get_many(order)
    assert len(many) == len(order)
    def held(array: np.ndarray) -> tuple[Any, ...]:  # an object array's bytes are its pointers
        return array.dtype, array.shape, array.tolist() if array.dtype == object else array.tobytes()

    for name, got in zip(order, many, strict=True):
        one = store.get(name)
        if isinstance(one, np.ndarray):
            assert held(got) == held(one), name
            assert got.flags.writeable <= one.flags.writeable, name  # read-only wherever get's is
        elif one is None:
            assert got is None
        else:
            assert [v.tobytes() for v in got] == [v.tobytes() for v in one]
    with pytest.raises(KeyError, match=r"'f33' is not in the activation store .*did you mean 'f32'"):
        store.get_many(["f32", "f33"])


def test_a_closed_store_still_reads_and_a_later_put_opens_it_again(tmp_path: Path) -> None:
    # close() kept the writer's view of the data file, which flushed the closed file before mapping it:
    # "ValueError: flush of closed file" on the first read after close(), which the docstring promises.
    store = ActivationStore(tmp_path / "s")
    x = np.arange(70_000, dtype=np.float32)  # big enough to be mapped from the file
    store.put("x", x)
    store.close()
    np.testing.assert_array_equal(store.get("x"), x)
    store.put("y", x[:3])
    store.close()
    np.testing.assert_array_equal(store.get("y"), x[:3])
    np.testing.assert_array_equal(ActivationStore.open(tmp_path / "s").get("x"), x)


# ------------------------------------------------------------------------------ feeds the worker reads itself
def _handoff(tmp_path: Path, feeds: Any) -> tuple[dict[str, Any], Any]:
    """(the request's inputs entry as it travels, the writer) for ``feeds``."""
    writer = InputsWriter(tmp_path / "handoff")
    return json.loads(json.dumps(writer.write(feeds, pid=1))), writer


def _stored_feeds(tmp_path: Path) -> tuple[ActivationStore, dict[str, Any], StoredFeeds]:
    store = ActivationStore(tmp_path / "acts", autoflush=False)
    values = {"small": np.arange(6, dtype=np.float32).reshape(2, 3), "big": np.arange(1 << 15, dtype=np.float32),
              "ints": np.array([3, 1], np.int64), "seq": [np.ones(2, np.float32)], "bf16": ml_dtypes_bf16()}
    for name, value in values.items():
        store.put(name, value)
    store.flush()
    mine = np.full(2, 7, np.int32)
    feeds = StoredFeeds(["small", "mine", "big", "ints", "seq", "bf16"], {"mine": mine}, store, store.get)
    return store, {**values, "mine": mine}, feeds


def ml_dtypes_bf16() -> Any:
    import ml_dtypes

    return np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)


def test_feeds_named_in_a_store_reach_the_worker_read_by_it_in_order_and_writable(tmp_path: Path) -> None:
    """A candidate's cut tensors that the oracle's store holds go to the worker by name (no value read or
    written by the host): the worker reads them from the store, equal, in the feeds' order, writable and
    its own (a runtime may write into its inputs, never into the store); the rest travel as values."""
    store, values, feeds = _stored_feeds(tmp_path)
    reads: list[str] = []
    feeds = StoredFeeds(feeds.order, feeds.held, store, lambda name: reads.append(name) or store.get(name))
    reader = InputsReader()
    for _ in range(2):  # the second request: the worker has the store open
        sent, writer = _handoff(tmp_path, feeds)
        assert sent["store"]["folder"] == str(store.directory.absolute())
        assert [f for f in sent["feeds"] if isinstance(f, str)] == ["small", "big", "ints", "seq", "bf16"]
        assert sent["tensors"]["names"] == ["mine"] and not sent["new"]
        received = reader.read(sent)
        assert list(received) == feeds.order
        for name, value in received.items():
            expected = values[name]
            got, want = (value[0], expected[0]) if name == "seq" else (value, expected)
            assert got.dtype == want.dtype and np.array_equal(got, want), name
            assert got.flags.writeable and not isinstance(got, np.memmap)
        received["small"][0, 0] = -1  # the worker's copy
        writer.discard()
    assert reads == []  # the host never read a stored value
    assert dict(feeds)["small"][0, 0] == 0 and reads == ["small", "big", "ints", "seq", "bf16"]


@pytest.mark.parametrize("damage", ["torn tail", "replaced", "added to", "deleted"])
def test_a_store_named_by_a_request_is_checked_by_the_worker_never_misread(tmp_path: Path, damage: str) -> None:
    """The worker checks the store exactly as the host does (header, size, tail checksum) and that it is the
    store the host read: a tail that never reached the disk, a store replaced by another run, one added to
    since, or one gone are refused with the store named, never read."""
    store, _, feeds = _stored_feeds(tmp_path)
    sent, _ = _handoff(tmp_path, feeds)
    data = store.directory / "values.bin"
    if damage == "torn tail":
        with open(data, "r+b") as handle:
            handle.seek(data.stat().st_size - 8)
            handle.write(bytes(8))
    elif damage == "replaced":
        shutil.rmtree(store.directory)
        _stored_feeds(tmp_path)  # the same values, another run
    elif damage == "added to":
        store.put("later", np.zeros(3, np.float32))
        store.flush()
    else:
        shutil.rmtree(store.directory)
    with pytest.raises(GraphBisectError, match=str(store.directory)):
        InputsReader().read(sent)


def test_a_store_with_values_not_published_or_of_the_older_layout_is_sent_as_values(tmp_path: Path) -> None:
    """Only a store's published data can be named: with an unpublished put (or a version 1 store) the values
    travel as before."""
    store, values, feeds = _stored_feeds(tmp_path)
    store.put("later", np.zeros(3, np.float32))  # autoflush=False: not in the index yet
    sent, _ = _handoff(tmp_path, feeds)
    assert "store" not in sent and not any(isinstance(f, str) for f in sent["feeds"])
    received = InputsReader().read(sent)
    assert np.array_equal(received["big"], values["big"])


def test_a_released_store_still_reads_what_it_had_read(tmp_path: Path) -> None:
    """``release`` lets go of the mapped pages (a pass over a large capture): a view taken before reads the
    file again, the same values."""
    store = ActivationStore(tmp_path / "acts")
    value = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)
    store.put("big", value)
    store.close()
    view = store.get("big")
    assert isinstance(view, np.memmap) and float(view.sum()) == float(value.sum())
    store.release()
    np.testing.assert_array_equal(view, value)
    np.testing.assert_array_equal(store.get("big"), value)
    assert store.tensor_nbytes("big") == value.nbytes
