"""Issue 36 item 5: an ``.npz`` is held to the model's declared shapes and to caps before it is read.

The rule itself (:func:`graphbisect.storage.npzguard.npz_refusal`) on small forged files: a member's ``.npy`` header
declares a shape larger than the member holds or the model allows, which the readers before the rule
decompressed in full (a 2 MB deflate bomb became 2.1 GB). The readers that use it are tested where they
live: user inputs here, bundles and ``repro.py`` in ``tests/artifacts/test_bundle_limits.py``.
"""

from __future__ import annotations

import re
import struct
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphbisect.data.inputs import load_inputs
from graphbisect.errors import InputError
from graphbisect.model import load_model
from graphbisect.storage.npzguard import MAX_NPZ_MEMBERS, SMALL_BYTES, npz_refusal, zip_member_count
from graphbisect.storage.values import NpzDamaged, NpzRefused, load_values_npz, save_values_npz


def forged_npz(path: Path, name: str, shape: tuple[int, ...], *, dtype: str = "<f4", data: int | None = None) -> Path:
    """An .npz whose member ``name``.npy declares ``shape`` and holds ``data`` bytes of zeros (default: all of
    them, deflated: a decompression bomb in small)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize if data is None else data
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open(f"{name}.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(member, {"descr": dtype, "fortran_order": False, "shape": shape})
        chunk = b"\0" * (1 << 20)
        while nbytes > 0:
            member.write(chunk[:nbytes])
            nbytes -= len(chunk)
    return path


def relu_model(folder: Path, dims: list[int | str]) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, folder / "relu.onnx")
    return folder / "relu.onnx"


def test_a_member_larger_than_the_static_shape_it_names_is_refused(tmp_path: Path) -> None:
    path = forged_npz(tmp_path / "bomb.npz", "x", (4, 1 << 20))
    assert path.stat().st_size < 100_000  # 16 MB of zeros
    assert npz_refusal(path, {"x": (4, 4)}) == ("member 'x.npy' declares float32 (4, 1048576) (16.0 MB), but the "
                                                "model declares 'x' as [4, 4]")
    assert npz_refusal(path, {"x": (4, 1 << 20)}) is None
    assert npz_refusal(path) is None  # no model known: the memory cap alone
    with pytest.raises(NpzRefused, match=r"declares float32 \(4, 1048576\).*refused before decompressing"):
        load_values_npz(path, {"x": (4, 4)})


def test_the_static_dims_of_a_partly_dynamic_shape_refuse_first(tmp_path: Path) -> None:
    """``[n, 4]`` against a member declaring ``(1, 2^22)``: the 4 refuses it (the old check knew only fully static
    shapes and decompressed it, 2.1 GB at 2^29, before the shape check)."""
    path = forged_npz(tmp_path / "bomb.npz", "x", (1, 1 << 22))
    assert npz_refusal(path, {"x": (None, 4)}) == ("member 'x.npy' declares float32 (1, 4194304) (16.0 MB), but the "
                                                   "model declares 'x' as [?, 4]")
    assert npz_refusal(path, {"x": (None, 1 << 22)}) is None
    assert npz_refusal(path, {"x": (None,)}) is not None  # another rank
    assert npz_refusal(path, {"x": None}) is None  # no shape declared: the memory cap


def test_user_inputs_for_a_partly_dynamic_model_are_refused_before_decompressing(tmp_path: Path) -> None:
    model = load_model(relu_model(tmp_path, ["n", 4]))
    bomb = forged_npz(tmp_path / "bomb.npz", "x", (1, 1 << 22))
    with pytest.raises(InputError, match=r"member 'x.npy' declares float32 \(1, 4194304\) .* as \[\?, 4\] "
                                         r"\(refused before decompressing it\)"):
        load_inputs(bomb, model)
    positional = forged_npz(tmp_path / "positional.npz", "arr_0", (1, 1 << 22))  # np.savez(path, array)
    with pytest.raises(InputError, match="refused before decompressing it"):
        load_inputs(positional, model)
    fine = tmp_path / "fine.npz"
    np.savez(fine, x=np.ones((3, 4), np.float32))
    assert load_inputs(fine, model)["x"].shape == (3, 4)


@pytest.mark.parametrize(("at", "value", "said"), [
    (6, 1, "member 'x.npy' is encrypted"),  # the flags of the local and the central header
    (8, 93, "member 'x.npy' is compressed with method 93, which Python's zipfile does not read"),
    (14, 0xDEADBEEF, "member 'x.npy' cannot be read: BadZipFile: Bad CRC-32 for file 'x.npy'")],
    ids=["encrypted", "method-93", "bad-crc"])
def test_a_member_zipfile_cannot_read_is_a_damaged_file(at: int, value: int, said: str, tmp_path: Path) -> None:
    """RuntimeError, NotImplementedError, BadZipFile: each escaped every reader as "a graphbisect bug" (issue 36,
    the bundle fuzzer); user inputs, a bundle's files and a command target's outputs read them here."""
    path = tmp_path / "damaged.npz"
    np.savez(path, x=np.ones((3, 4), np.float32))
    data = bytearray(path.read_bytes())
    size = "<I" if value > 0xFFFF else "<H"
    for signature, offset in ((b"PK\x03\x04", at), (b"PK\x01\x02", at + 2)):
        struct.pack_into(size, data, data.find(signature) + offset, value)
    path.write_bytes(bytes(data))
    with pytest.raises(NpzDamaged, match=re.escape(f"{path}: {said}")):
        load_values_npz(path)
    with pytest.raises(InputError, match=re.escape(said)):
        load_inputs(path, load_model(relu_model(tmp_path, [3, 4])))


def test_small_members_are_left_to_the_readers_own_checks(tmp_path: Path) -> None:
    """A wrong shape under 64 KiB is read (a target's wrong-shape output is compared, a wrong input named by
    the input check), and so is a small member of an unknown name."""
    path = tmp_path / "small.npz"
    np.savez(path, x=np.zeros((1, 5), np.float32), other=np.zeros(SMALL_BYTES // 4, np.float32))
    assert npz_refusal(path, {"x": (1, 4)}) is None
    big = tmp_path / "big.npz"
    np.savez(big, x=np.zeros((1, 4), np.float32), other=np.zeros(SMALL_BYTES // 4 + 1, np.float32))
    assert npz_refusal(big, {"x": (1, 4)}) == ("member 'other.npy' declares float32 (16385,) (64.0 KB), but the "
                                               "model declares no value named 'other' (it declares 'x')")


def test_a_header_declaring_more_than_its_member_holds_is_refused(tmp_path: Path) -> None:
    """numpy allocates what the header declares before it reads: 1 TB for a 1 KB member."""
    path = forged_npz(tmp_path / "liar.npz", "x", (1 << 38,), data=1024)
    assert npz_refusal(path) == ("member 'x.npy' declares float32 (274877906944,) (1.0 TB), but holds only "
                                 "1.1 KB: it is truncated or forged")


def test_the_memory_cap_holds_for_every_member_together(tmp_path: Path) -> None:
    path = tmp_path / "two.npz"
    np.savez(path, a=np.zeros(1000, np.float32), b=np.zeros(1000, np.float32))
    assert npz_refusal(path, cap=8000) is None
    assert npz_refusal(path, cap=7999) == ("its members decompress to 7.8 KB, more than the 7.8 KB of memory "
                                           "available here")


def test_the_members_are_counted_in_the_central_directory(tmp_path: Path) -> None:
    path = tmp_path / "many.npz"
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(50):
            archive.writestr(f"m{index}.npy", b"")
    assert zip_member_count(path, 100) == 50
    assert zip_member_count(path, 10) == 11  # the count stops past the limit
    assert npz_refusal(path, limit=49) == "it holds more than 49 members (an .npz holds one per value)"
    assert npz_refusal(path) is None and MAX_NPZ_MEMBERS >= 50
    prefixed = tmp_path / "prefixed.npz"  # data before the zip (a self-extracting archive): offsets shift
    prefixed.write_bytes(b"#!/bin/sh\n" * 100 + path.read_bytes())
    assert zip_member_count(prefixed, 100) == 50
    (tmp_path / "not.npz").write_bytes(b"\x93NUMPY")
    assert zip_member_count(tmp_path / "not.npz", 10) is None
    assert npz_refusal(tmp_path / "not.npz") is None  # numpy's own error says what it is


def test_values_graphbisect_writes_are_read_as_before(tmp_path: Path) -> None:
    """Sequences, strings and bfloat16 (described in __values__.json) pass the rule with their model's shapes."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = {"s": [np.zeros((200, 100), np.float32), np.ones(3, np.float32)], "t": np.array(["a", "bc"], dtype=object),
              "b": np.zeros((300, 200), ml_dtypes.bfloat16)}
    path = save_values_npz(tmp_path / "v.npz", values)
    read = load_values_npz(path, {"s": None, "t": (2,), "b": (300, 200)})
    assert read["b"].dtype == ml_dtypes.bfloat16 and read["b"].shape == (300, 200) and len(read["s"]) == 2
    with pytest.raises(NpzRefused, match=r"declares uint16 \(300, 200\).* as \[300, 100\]"):
        load_values_npz(path, {"s": None, "t": (2,), "b": (300, 100)})

