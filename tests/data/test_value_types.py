"""Every ONNX value type through every place a value is held: inputs files, .npz, the activation store, the
worker transport, cut-point feeds and repro.py's reader (graphbisect.storage.values, graphbisect.data.protos)."""

from __future__ import annotations

import ast
import base64
import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

from graphbisect.artifacts.repro import render_repro
from graphbisect.backends import BackendProcess, BackendSpec
from graphbisect.backends.worker import InputsReader, InputsWriter
from graphbisect.compare import compare_values
from graphbisect.data import ActivationStore, load_inputs, save_inputs
from graphbisect.data.protos import array_from_tensor, tensor_from_array
from graphbisect.model import load_model
from graphbisect.storage.packfile import PackWriter, StaleDataError
from graphbisect.storage.values import is_native, load_values_npz, save_values_npz
from graphbisect.strategies.subgraph import SubgraphSpace

T = onnx.TensorProto

#: One tensor of every element type onnx 1.17 has (complex too: the corpus has none; INT2/UINT2 need onnx >= 1.20).
TENSORS: dict[str, tuple[int, np.ndarray]] = {
    "f32": (T.FLOAT, np.array([[1.5, -2.0]], np.float32)),
    "f64": (T.DOUBLE, np.array([3.25], np.float64)),
    "f16": (T.FLOAT16, np.array([0.5, 65504], np.float16)),
    "bf16": (T.BFLOAT16, np.array([1.5, -2.0, 3.0e38], ml_dtypes.bfloat16)),
    "e4m3fn": (T.FLOAT8E4M3FN, np.array([0.5, 448, -1.75], ml_dtypes.float8_e4m3fn)),
    "e4m3fnuz": (T.FLOAT8E4M3FNUZ, np.array([0.5, -240], ml_dtypes.float8_e4m3fnuz)),
    "e5m2": (T.FLOAT8E5M2, np.array([0.5, 57344, -3], ml_dtypes.float8_e5m2)),
    "e5m2fnuz": (T.FLOAT8E5M2FNUZ, np.array([0.5, -3], ml_dtypes.float8_e5m2fnuz)),
    "i4": (T.INT4, np.array([[-8, 7, 3]], ml_dtypes.int4)),
    "u4": (T.UINT4, np.array([0, 15, 9], ml_dtypes.uint4)),
    "i8": (T.INT8, np.array([-128, 127], np.int8)),
    "u8": (T.UINT8, np.array([0, 255], np.uint8)),
    "i16": (T.INT16, np.array([-3], np.int16)),
    "u16": (T.UINT16, np.array([65535], np.uint16)),
    "i32": (T.INT32, np.array([-(2**31)], np.int32)),
    "u32": (T.UINT32, np.array([2**32 - 1], np.uint32)),
    "i64": (T.INT64, np.array(7, np.int64)),  # 0-d stays 0-d
    "u64": (T.UINT64, np.array([2**64 - 1], np.uint64)),
    "bool": (T.BOOL, np.array([True, False])),
    "str": (T.STRING, np.array([["a", "bc"], ["", "déjà"]], dtype=object)),
    "c64": (T.COMPLEX64, np.array([1 + 2j], np.complex64)),
}
SEQUENCE = [np.ones((2, 2), np.float32), np.zeros((1, 3), np.float32)]  # items of different shapes


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list) or a is None:
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b)) if a is not None else b is None
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes() if a.dtype != object \
        else a.shape == b.shape and a.tolist() == b.tolist()


def _values() -> dict[str, Any]:
    return {**{name: array for name, (_, array) in TENSORS.items()}, "seq": SEQUENCE, "empty_opt": None,
            "seq_of_bf16": [TENSORS["bf16"][1]]}


def test_npz_round_trip_of_every_type(tmp_path: Path) -> None:
    values = _values()
    save_values_npz(tmp_path / "v.npz", values)
    loaded = load_values_npz(tmp_path / "v.npz")
    assert set(loaded) == set(values)
    for name, value in values.items():
        assert _same(value, loaded[name]), name
    with np.load(tmp_path / "v.npz") as plain:  # plain numpy reads it too: raw bits under the input's name
        assert plain["bf16"].dtype == np.uint16 and plain["f32"].dtype == np.float32


def test_activation_store_round_trip_of_every_type(tmp_path: Path) -> None:
    store = ActivationStore(tmp_path / "store")
    for name, value in _values().items():
        store.put(name, value)
    reopened = ActivationStore.open(tmp_path / "store")
    for name, value in _values().items():
        assert _same(value, reopened[name]), name
    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    entry = next(e for e in manifest["tensors"] if e["name"] == "e5m2")
    assert entry["onnx_type"] == "FLOAT8E5M2" and entry["dtype"] == "|u1"


def test_worker_inputs_round_trip_of_every_type_writable_and_never_misread(tmp_path: Path) -> None:
    """A run's inputs reach the worker equal, in memory and writable (as from an .npz: a runtime may write
    into its inputs, never into what the worker holds for later runs); an unchanged read-only value is sent
    once, a writable one every time (its owner may change it); an index of an earlier data file is refused,
    not misread."""
    values = {**_values(), "big": np.arange(1 << 15, dtype=np.float32)}  # 128 KiB: mapped when packed
    held = np.arange(6, dtype=np.float32)
    held.setflags(write=False)
    values["held"] = held
    mine = values["mine"] = np.zeros(3, np.float32)  # writable: the same object each run, maybe changed
    writer, reader = InputsWriter(tmp_path), InputsReader()
    for run in range(3):
        sent = json.loads(json.dumps(writer.write(values, pid=1)))  # as the request carries it
        received = reader.read(sent)
        assert list(received) == list(values)
        for name, value in values.items():
            assert _same(value, received[name]), (run, name)
        for value in (received["f32"], received["big"], received["bf16"], received["seq"][0], received["held"]):
            assert value.flags.writeable and not isinstance(value, np.memmap)
        received["held"][0] = -1  # the worker's copy, not the value it holds
        resent = {name for _, name, _, _ in sent["new"]} | set(sent["tensors"]["names"])
        assert ("held" in resent) == (run == 0) and "mine" in resent
    mine[0] = 42  # changed by its owner between runs: reaches the worker changed
    assert reader.read(writer.write(values, pid=1))["mine"][0] == 42
    stale = writer.write(values, pid=1)
    folder = Path(stale["folder"])
    assert [p.name for p in folder.iterdir()] == ["values.bin"]
    (folder / "values.bin").write_bytes(bytes(64))  # rewritten by something else
    with pytest.raises(StaleDataError):
        InputsReader().read(stale)
    writer.discard()
    assert not folder.exists()


def test_small_native_tensors_written_at_once_as_add_writes_each(tmp_path: Path) -> None:
    """``PackWriter.add_small`` (the inputs handoff's write of thousands of new cut tensors) leaves the data
    file byte for byte as ``add`` one at a time, at the same offsets: every native type, empty, 0-d and
    non-contiguous arrays; the types it does not take (extension types, strings) are not native."""
    arrays = [array for _, array in TENSORS.values() if is_native(array.dtype)]
    arrays += [np.zeros((0, 3), np.float32), np.array(7, np.int64), np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::2]]
    assert len(arrays) > 10 and not is_native(np.dtype(ml_dtypes.bfloat16)) and not is_native(np.dtype(object))
    one, many = PackWriter.scratch(tmp_path / "one"), PackWriter.scratch(tmp_path / "many")
    offsets = [one.add(array)["offset"] for array in arrays]
    assert many.add_small(arrays) == offsets and many.size == one.size
    for writer in (one, many):
        writer.close()
    one_bytes, many_bytes = ((tmp_path / side / "values.bin").read_bytes() for side in ("one", "many"))
    assert len(one_bytes) == len(many_bytes) and one_bytes[64:] == many_bytes[64:]  # after the header (a token)


@pytest.mark.parametrize("name", list(TENSORS))
def test_tensor_proto_round_trip(name: str) -> None:
    """TensorProto ↔ array for every type: 4-bit types packed, bfloat16 raw_data read right (onnx 1.17's
    numpy_helper.to_array reads it as zeros)."""
    code, array = TENSORS[name]
    proto = tensor_from_array(array, name)
    assert proto.data_type == code
    assert _same(array, array_from_tensor(proto))
    onnx.checker.check_tensor(proto)


def _identity_model(path: Path, skip: set[str]) -> Path:
    """One Identity per value (but ``skip``): inputs and outputs of every type."""
    inputs, outputs, nodes = [], [], []
    for name, (code, array) in TENSORS.items():
        if name in skip:
            continue
        inputs.append(helper.make_tensor_value_info(name, code, list(array.shape)))
        outputs.append(helper.make_tensor_value_info(f"{name}_out", code, list(array.shape)))
        nodes.append(helper.make_node("Identity", [name], [f"{name}_out"], name=f"id_{name}"))
    if "seq" not in skip:
        inputs.append(helper.make_tensor_sequence_value_info("seq", T.FLOAT, None))
        outputs.append(helper.make_tensor_sequence_value_info("seq_out", T.FLOAT, None))
        nodes.append(helper.make_node("Identity", ["seq"], ["seq_out"], name="id_seq"))
    model = helper.make_model(helper.make_graph(nodes, "identities", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, path)
    return path


_NO_ORT_IDENTITY = {"c64", "e4m3fnuz", "e5m2fnuz", "i4", "u4"}  # ONNX Runtime 1.32 has no Identity kernel for these
_EXTENSION = {"bf16", "e4m3fn", "e4m3fnuz", "e5m2", "e5m2fnuz", "i4", "u4"}


@pytest.mark.parametrize(("backend", "skip"), [
    ("reference", set()),
    # ORT returns bfloat16/float8 only as OrtValues, whose runs take no strings or sequences: two models
    ("onnxruntime", _NO_ORT_IDENTITY | {"str", "seq"}),
    ("onnxruntime", _NO_ORT_IDENTITY | _EXTENSION),
])
def test_worker_transport_of_every_type(backend: str, skip: set[str], tmp_path: Path) -> None:
    """Inputs go to the worker as one packed data file (its index in the request), outputs come back as one
    packed run (values.bin + manifest): equal to what went in."""
    model = load_model(_identity_model(tmp_path / "ids.onnx", skip))
    values = {name: value for name, value in _values().items() if name in model.input_names}
    feeds = load_inputs(save_inputs(tmp_path / "in.npz", values), model)
    with BackendProcess(BackendSpec.parse(backend), workdir=tmp_path / "w") as proc:
        for output_dir in (None, tmp_path / "kept"):  # read at once, and kept on disk (OutputFiles)
            run = proc.run(model.path, feeds, output_dir=output_dir)
            assert run.ok, run.describe()
            for name, value in values.items():
                assert _same(value, run.outputs[f"{name}_out"]), (backend, name)
                assert compare_values(name, value, run.outputs[f"{name}_out"]).passed


def _single_input_model(tmp_path: Path, code: int, shape: list[int]) -> Any:
    x = helper.make_tensor_value_info("x", code, shape)
    y = helper.make_tensor_value_info("y", code, shape)
    proto = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    onnx.save(proto, tmp_path / f"m{code}.onnx")
    return load_model(tmp_path / f"m{code}.onnx")


@pytest.mark.parametrize("name", ["bf16", "e4m3fn", "e5m2", "i4", "u4", "str", "f16", "c64"])
def test_every_inputs_format_reads_every_type(name: str, tmp_path: Path) -> None:
    """.npz (np.savez of the raw form and graphbisect's own), .npy, .pb file and folder, Polygraphy JSON."""
    code, array = TENSORS[name]
    model = _single_input_model(tmp_path, code, list(array.shape))
    npy = tmp_path / "x.npy"
    # np.save writes ml_dtypes arrays as '<V2'/'|V1' (read back as the model's type), but float8_e5m2 as '<f1',
    # which np.load refuses: such a file holds the raw bits (uint8), which are read as the model's type too
    saved = array.astype(str) if name == "str" else array.view(np.uint8) if name == "e5m2" else array
    np.save(npy, saved, allow_pickle=False)
    folder = tmp_path / "pb"
    folder.mkdir()
    (folder / "input_0.pb").write_bytes(tensor_from_array(array, "x").SerializeToString())
    buffer = io.BytesIO()
    np.save(buffer, saved, allow_pickle=False)
    polygraphy = tmp_path / "x.json"
    polygraphy.write_text(json.dumps([{"x": {"array": base64.b64encode(buffer.getvalue()).decode(),
                                             "polygraphy_class": "ndarray"}}]))
    for source in (save_inputs(tmp_path / "x.npz", {"x": array}), npy, folder / "input_0.pb", folder, polygraphy):
        assert _same(array, load_inputs(source, model)["x"]), source


def test_sequence_and_optional_pb_inputs(tmp_path: Path) -> None:
    """SequenceProto and OptionalProto files (ONNX's test data) were rejected as 'not a valid input file'."""
    seq = helper.make_tensor_sequence_value_info("s", T.FLOAT, None)
    opt_type = helper.make_optional_type_proto(helper.make_tensor_type_proto(T.INT32, [2]))
    opt = helper.make_value_info("o", opt_type)
    out = helper.make_tensor_value_info("has", T.BOOL, [])
    count = helper.make_tensor_value_info("n", T.INT64, [])
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]), helper.make_node("SequenceLength", ["s"], ["n"])]
    proto = helper.make_model(helper.make_graph(nodes, "g", [seq, opt], [out, count]),
                              opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(proto, tmp_path / "m.onnx")
    model = load_model(tmp_path / "m.onnx")
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "input_0.pb").write_bytes(onnx.numpy_helper.from_list(SEQUENCE, "s").SerializeToString())
    empty = onnx.OptionalProto(name="o", elem_type=onnx.OptionalProto.UNDEFINED)
    (folder / "input_1.pb").write_bytes(empty.SerializeToString())
    feeds = load_inputs(folder, model)
    assert _same(SEQUENCE, feeds["s"]) and feeds["o"] is None
    with BackendProcess(BackendSpec.parse("onnxruntime"), workdir=tmp_path / "w") as proc:
        run = proc.run(model.path, feeds)
    assert run.ok, run.describe()
    assert run.outputs["has"].tolist() is False and run.outputs["n"].tolist() == 2


def test_cut_points_of_typed_and_sequence_values_are_fed_from_the_store(tmp_path: Path) -> None:
    """A subgraph cut at a bfloat16 tensor and at a sequence: fed as typed graph inputs (the sequence with its
    declared type), and the candidate runs on both backends with the oracle's values."""
    x = helper.make_tensor_value_info("x", T.FLOAT, [2])
    y = helper.make_tensor_value_info("y", T.FLOAT, [2])
    z = helper.make_tensor_value_info("z", T.FLOAT, [2])
    nodes = [
        helper.make_node("Cast", ["x"], ["b"], name="to_bf16", to=T.BFLOAT16),
        helper.make_node("Cast", ["b"], ["y"], name="to_float", to=T.FLOAT),
        helper.make_node("SequenceConstruct", ["x", "x"], ["s"], name="make_seq"),
        helper.make_node("SequenceAt", ["s", "zero"], ["z"], name="take"),
    ]
    zero = onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], [y, z], [zero]),
                              opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    onnx.save(proto, tmp_path / "m.onnx")
    model = load_model(tmp_path / "m.onnx")
    store = ActivationStore(tmp_path / "store")
    store.put("x", np.array([1.0, 2.5], np.float32))
    store.put("b", np.array([1.0, 2.5], ml_dtypes.bfloat16))
    store.put("s", [np.array([1.0, 2.5], np.float32)] * 2)
    store.put("y", np.array([1.0, 2.5], np.float32))
    store.put("z", np.array([1.0, 2.5], np.float32))
    space = SubgraphSpace(model, store.get, tmp_path / "cands")
    candidate = space.materialize({1, 3})  # to_float and take: b and s are cut points
    assert set(candidate.feeds) == {"b", "s"}
    assert candidate.proto.graph.input[0].type.tensor_type.elem_type == T.BFLOAT16
    assert candidate.proto.graph.input[1].type.HasField("sequence_type")
    onnx.save(candidate.proto, tmp_path / "cands" / "c.onnx")
    onnx.checker.check_model(str(tmp_path / "cands" / "c.onnx"))
    for backend in ("reference", "onnxruntime"):
        with BackendProcess(BackendSpec.parse(backend), workdir=tmp_path / backend) as proc:
            run = proc.run(tmp_path / "cands" / "c.onnx", candidate.feeds)
        assert run.ok, run.describe()
        assert run.outputs["y"].tolist() == [1.0, 2.5] and run.outputs["z"].tolist() == [1.0, 2.5]


def test_repro_reads_every_type_without_graphbisect(tmp_path: Path) -> None:
    """repro.py's reader, run under ``python -I`` (no graphbisect importable): the .npz encoding needs only
    numpy and ml_dtypes."""
    values = _values()
    save_values_npz(tmp_path / "v.npz", values)
    script = tmp_path / "repro.py"
    content = SimpleNamespace(target=BackendSpec.parse("onnxruntime"))  # the script depends only on the target
    script.write_text(render_repro(content), encoding="utf-8")  # type: ignore[arg-type]
    check = (
        "import runpy, sys, numpy as np, ml_dtypes\n"
        f"ns = runpy.run_path({str(script)!r}, run_name='repro')\n"
        f"values = ns['load_arrays']({str(tmp_path / 'v.npz')!r})\n"
        "out = {k: (None if v is None else [(str(i.dtype), i.shape, i.tolist()) for i in v] if isinstance(v, list)"
        " else (str(v.dtype), v.shape, [str(e) for e in v.ravel().tolist()])) for k, v in values.items()}\n"
        "print(repr(out))\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", check], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    out = ast.literal_eval(proc.stdout.strip())
    for name, value in values.items():
        if value is None:
            assert out[name] is None
        elif isinstance(value, list):
            assert [item[2] for item in out[name]] == [item.tolist() for item in value]
        else:
            assert out[name][0] == str(value.dtype) and out[name][1] == value.shape, name
            assert out[name][2] == [str(e) for e in value.ravel().tolist()], name


def test_bytes_for_a_string_tensor_are_read_as_utf8_and_other_bytes_refused() -> None:
    """``astype(str)`` read bytes as ASCII: a UnicodeDecodeError, "a graphbisect bug" (issue 36, the bundle
    fuzzer, which fed ``|S4`` emoji bytes)."""
    from graphbisect.errors import GraphBisectError
    from graphbisect.storage.values import encode_tensor

    raw, code = encode_tensor(np.array(["é".encode(), b"ab"], dtype="S4"))
    assert code == onnx.TensorProto.STRING and raw.tolist() == ["é", "ab"]
    with pytest.raises(GraphBisectError, match="a string tensor holds bytes that are not UTF-8"):
        encode_tensor(np.array([b"\xff\xfe"], dtype="S4"))
