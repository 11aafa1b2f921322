"""Inputs: every file format round-trips, random inputs respect dtypes/shapes/index ranges, validation."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from data_builders import gather_model, make_model, run, single_input_model, two_input_model
from onnx import TensorProto, helper, numpy_helper

from graphbisect.data import (
    chosen_dims,
    dims_note,
    index_bounds,
    load_inputs,
    parse_shapes,
    random_inputs,
    save_inputs,
    validate_inputs,
)
from graphbisect.errors import InputError
from graphbisect.model import Model

# --- parse_shapes --------------------------------------------------------------------------------------


def test_parse_shapes() -> None:
    assert parse_shapes(["x:1x3x224x224", "y:4", "s:", "input:0:[2,8]", "z: 2 x 5 "]) == {
        "x": (1, 3, 224, 224),
        "y": (4,),
        "s": (),
        "input:0": (2, 8),
        "z": (2, 5),
    }


@pytest.mark.parametrize("spec", ["x", ":1x2", "x:1xax3", "x:1x-2", "x:1x2.5", "x:1xx2"])
def test_parse_shapes_rejects_bad_syntax(spec: str) -> None:
    with pytest.raises(InputError, match="bad shape") as info:
        parse_shapes([spec])
    assert "NAME:DIMxDIM" in (info.value.hint or "")


def test_parse_shapes_rejects_duplicates() -> None:
    with pytest.raises(InputError, match="given twice"):
        parse_shapes(["x:1", "x:2"])


# --- random inputs -------------------------------------------------------------------------------------


def test_random_inputs_respect_dtypes_and_ranges() -> None:
    types = {
        "f": TensorProto.FLOAT,
        "h": TensorProto.FLOAT16,
        "d": TensorProto.DOUBLE,
        "b": TensorProto.BOOL,
        "i": TensorProto.INT32,
        "u": TensorProto.UINT8,
    }
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"], name=f"id_{name}") for name in types]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info(n, t, [4, 50]) for n, t in types.items()],
        [helper.make_tensor_value_info(f"{n}_out", t, [4, 50]) for n, t in types.items()],
    )
    inputs = random_inputs(model, seed=3)
    assert list(inputs) == list(types)
    expected = {"f": np.float32, "h": np.float16, "d": np.float64, "b": np.bool_, "i": np.int32, "u": np.uint8}
    for name, dtype in expected.items():
        assert inputs[name].dtype == dtype and inputs[name].shape == (4, 50)
    for name in "fhd":
        assert inputs[name].min() >= -1 and inputs[name].max() < 1 and inputs[name].std() > 0.3
    assert inputs["b"].any() and not inputs["b"].all()
    assert inputs["i"].min() >= 0 and inputs["i"].max() < 10
    assert inputs["u"].max() > 10
    run(model, inputs)


def test_random_inputs_are_reproducible_and_seeded() -> None:
    model = two_input_model()
    a, b, c = random_inputs(model, seed=1), random_inputs(model, seed=1), random_inputs(model, seed=2)
    np.testing.assert_array_equal(a["x"], b["x"])
    assert not np.array_equal(a["x"], c["x"])
    assert not np.array_equal(a["x"], a["y"])  # each input draws from its own stream


def test_dynamic_dims_batch_is_sized_visibly_and_shapes_override() -> None:
    """A batch dim took 1 silently: a bug needing two rows passed, and nothing said the size was a guess."""
    model = two_input_model()
    drawn = random_inputs(model)
    assert drawn["x"].shape == drawn["y"].shape == (2, 3)  # one decision per symbol
    chosen = chosen_dims(model)
    assert [(d.input, d.axis, d.symbol, d.size, d.shape) for d in chosen] == [("x", 0, "batch", 2, (2, 3)),
                                                                             ("y", 0, "batch", 2, (2, 3))]
    note = dims_note(chosen)
    assert note is not None and "sized by graphbisect" in note and "--shape x:2x3 --shape y:2x3" in note
    given = random_inputs(model, shapes={"x": (5, 3)})
    assert given["x"].shape == (5, 3)
    assert given["y"].shape == (5, 3)  # 'batch' bound by x's given shape
    assert chosen_dims(model, shapes={"x": (5, 3)}) == () and dims_note(()) is None


def _broadcast_model(width: int = 16) -> Model:
    """``x - ReduceMean(x, keepdims=0)`` on x: [N, width]: the subtraction broadcasts only for N in {1, width}."""
    return make_model(
        [helper.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=[-1], keepdims=0),
         helper.make_node("Sub", ["x", "m"], ["y"], name="sub")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
    )


def test_a_dynamic_dim_takes_a_size_the_models_shapes_accept() -> None:
    (dim,) = chosen_dims(_broadcast_model())
    assert dim.size == 16 and "refuse 2 and accept 16" in dim.how
    assert random_inputs(_broadcast_model())["x"].shape == (16, 16)


def test_a_dynamic_dim_takes_a_declared_size_else_stays_one_and_says_why() -> None:
    model = make_model(
        [helper.make_node("Add", ["x", "c"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(np.ones((3, 4), np.float32), "c")])
    (dim,) = chosen_dims(model)
    assert dim.size == 3 and "refuse 2 and accept 3" in dim.how  # the output's declared 3
    bare = make_model(
        [helper.make_node("Add", ["x", "c"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 4])],
        [numpy_helper.from_array(np.ones((3, 4), np.float32), "c")])
    (dim,) = chosen_dims(bare)
    assert dim.size == 1 and dim.how.startswith("1: the model's shapes refuse 2, 4")


def test_undeterminable_dim_asks_for_shape() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])],
    )
    with pytest.raises(InputError, match="dynamic dimension 1 \\(seq\\)") as info:
        random_inputs(model)
    # in each front end's words: the argument for a Python caller, the flag for the command line
    assert "shapes={'x': (?, ?)}" in (info.value.hint or "") and "--shape x:?x?" in (info.value.cli_hint or "")
    assert random_inputs(model, shapes=parse_shapes(["x:2x7"]))["x"].shape == (2, 7)


def test_given_shape_must_fit_static_dims_and_name_an_input() -> None:
    model = single_input_model()
    with pytest.raises(InputError, match="axis 1"):
        random_inputs(model, shapes={"x": (2, 4)})
    with pytest.raises(InputError, match="not a model input") as info:
        random_inputs(model, shapes={"xx": (2, 3)})
    assert "'x'" in (info.value.hint or "")


def test_index_inputs_stay_in_range_and_ort_runs() -> None:
    model = gather_model()
    assert index_bounds(model) == {"ids": 50, "pos": 7, "sel": 5, "hot": 6}
    inputs = random_inputs(model, shapes={"ids": (2, 16)}, seed=0)
    assert inputs["ids"].dtype == np.int64 and inputs["ids"].shape == (2, 16)
    assert inputs["ids"].min() >= 0 and inputs["ids"].max() < 50 and inputs["ids"].max() > 10
    assert inputs["pos"].dtype == np.int32 and inputs["pos"].max() < 7
    assert inputs["sel"].max() < 5 and inputs["hot"].max() < 6
    for seed in range(5):
        outputs = run(model, random_inputs(model, seed=seed))
        assert outputs["emb"].shape == (2, 16, 8)  # its batch dim sized 2 (chosen_dims)


# --- validation ----------------------------------------------------------------------------------------


def test_validate_returns_model_order() -> None:
    model = two_input_model()
    y, x = np.zeros((1, 3), np.float32), np.ones((1, 3), np.float32)
    assert list(validate_inputs(model, {"y": y, "x": x})) == ["x", "y"]


def test_validate_missing_input() -> None:
    with pytest.raises(InputError, match="missing input 'y'"):
        validate_inputs(two_input_model(), {"x": np.zeros((1, 3), np.float32)})


def test_validate_unknown_input_suggests_close_name() -> None:
    arrays = {"x": np.zeros((1, 3), np.float32), "yy": np.zeros((1, 3), np.float32)}
    with pytest.raises(InputError, match="'yy' is not an input") as info:
        validate_inputs(two_input_model(), arrays)
    assert "did you mean 'y'" in (info.value.hint or "")


def test_validate_dtype_is_exact_and_suggests_the_fix() -> None:
    with pytest.raises(InputError, match=r"dtype float64.*expects float32") as info:
        validate_inputs(single_input_model(), {"x": np.zeros((2, 3))})
    assert info.value.hint == "convert it: array.astype(np.float32)"


def test_validate_rank_and_static_dims() -> None:
    model = single_input_model()
    with pytest.raises(InputError, match="rank 1"):
        validate_inputs(model, {"x": np.zeros(6, np.float32)})
    with pytest.raises(InputError, match="size 4 on axis 0"):
        validate_inputs(model, {"x": np.zeros((4, 3), np.float32)})
    assert validate_inputs(two_input_model(), {"x": np.zeros((7, 3), np.float32), "y": np.zeros((7, 3), np.float32)})


# --- file formats --------------------------------------------------------------------------------------


@pytest.fixture
def pair() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((2, 3)).astype(np.float32), "y": rng.standard_normal((2, 3)).astype(np.float32)}


def _assert_same(loaded: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(loaded) == list(expected)
    for name, value in expected.items():
        assert loaded[name].dtype == value.dtype
        np.testing.assert_array_equal(loaded[name], value)


def test_npz_roundtrip_with_save_inputs(tmp_path: Path, pair: dict) -> None:
    path = save_inputs(tmp_path / "inputs.npz", {"y": pair["y"], "x": pair["x"]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs.npz"]
    _assert_same(load_inputs(path, two_input_model()), pair)
    with np.load(path) as archive:  # readable by plain numpy
        np.testing.assert_array_equal(archive["x"], pair["x"])


def test_save_inputs_accepts_any_name(tmp_path: Path) -> None:
    arrays: dict[str, np.ndarray] = {
        "file": np.arange(3),
        "input:0/with/slash": np.ones(2, np.float16),
        "allow_pickle": np.zeros(1),
    }
    path = save_inputs(tmp_path / "odd.npz", arrays)
    with np.load(path) as archive:
        assert set(archive.files) == set(arrays)
        np.testing.assert_array_equal(archive["input:0/with/slash"], arrays["input:0/with/slash"])


def test_positional_npz(tmp_path: Path, pair: dict) -> None:
    np.savez(tmp_path / "pos.npz", pair["x"], pair["y"])
    _assert_same(load_inputs(tmp_path / "pos.npz", two_input_model()), pair)


def test_npy_single_input(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    _assert_same(load_inputs(tmp_path / "x.npy", single_input_model()), {"x": x})


def test_npy_needs_a_single_input_model(tmp_path: Path, pair: dict) -> None:
    np.save(tmp_path / "x.npy", pair["x"])
    with pytest.raises(InputError, match="2 inputs: x, y") as info:
        load_inputs(tmp_path / "x.npy", two_input_model())
    assert "np.savez" in (info.value.hint or "")


def test_pb_single_file(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (tmp_path / "x.pb").write_bytes(onnx.numpy_helper.from_array(x, "whatever").SerializeToString())
    _assert_same(load_inputs(tmp_path / "x.pb", single_input_model()), {"x": x})


def test_pb_folder_by_name_and_position(tmp_path: Path, pair: dict) -> None:
    folder = tmp_path / "test_data_set_0"
    folder.mkdir()
    (folder / "input_0.pb").write_bytes(onnx.numpy_helper.from_array(pair["x"], "").SerializeToString())
    (folder / "input_1.pb").write_bytes(onnx.numpy_helper.from_array(pair["y"], "y").SerializeToString())
    (folder / "output_0.pb").write_bytes(b"ignored")
    _assert_same(load_inputs(folder, two_input_model()), pair)


def test_pb_folder_without_inputs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"input_0\.pb"):
        load_inputs(tmp_path, single_input_model())


def _polygraphy_encode(array: np.ndarray) -> dict:
    """Polygraphy's numpy encoding (polygraphy/json/serde.py): base64 of an .npy file plus a type marker."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return {"array": base64.b64encode(buffer.getvalue()).decode(), "polygraphy_class": "ndarray"}


def test_polygraphy_json(tmp_path: Path, pair: dict) -> None:
    feeds = [{name: _polygraphy_encode(value) for name, value in pair.items()}, {}]
    (tmp_path / "inputs.json").write_text(json.dumps(feeds))
    _assert_same(load_inputs(tmp_path / "inputs.json", two_input_model()), pair)


def test_json_written_by_polygraphy_itself(tmp_path: Path, pair: dict) -> None:
    serde = pytest.importorskip("polygraphy.json")
    serde.save_json([pair], str(tmp_path / "inputs.json"))
    _assert_same(load_inputs(tmp_path / "inputs.json", two_input_model()), pair)


def test_plain_json_lists_take_the_input_dtype(tmp_path: Path) -> None:
    (tmp_path / "inputs.json").write_text(json.dumps({"x": [[1, 2, 3], [4, 5, 6]]}))
    loaded = load_inputs(tmp_path / "inputs.json", single_input_model())
    assert loaded["x"].dtype == np.float32
    np.testing.assert_array_equal(loaded["x"], np.arange(1, 7).reshape(2, 3))


def _identity_model(elem_type: int) -> object:
    vi = helper.make_tensor_value_info
    return make_model([helper.make_node("Identity", ["i"], ["o"], name="id")], [vi("i", elem_type, [3])],
                      [vi("o", elem_type, [3])])


@pytest.mark.parametrize(("elem_type", "values", "bad"), [
    (TensorProto.INT64, [1.7, 2.0, 3.0], "1.7"),       # truncated to 1
    (TensorProto.INT32, [1, 2, -0.5], "-0.5"),        # truncated to 0
    (TensorProto.BOOL, [1, 0, 2], "2"),               # read as True
    (TensorProto.UINT8, [5, 300, 7], "300"),          # out of range
    (TensorProto.INT8, [5, -129, 7], "-129"),
    (TensorProto.FLOAT16, [0.5, 1e6, 2.0], "1000000.0"),  # became inf
])
def test_plain_json_value_the_input_type_cannot_hold_is_refused_not_altered(
        tmp_path: Path, elem_type: int, values: list, bad: str) -> None:
    # JSON numbers are converted to the input's type; a conversion that changes what the user wrote was
    # silent (1.7 fed as 1, 2 as True, 1e6 as float16 inf with a warning about an Inf the user never wrote) or
    # an "is it a valid .json file?" error for a valid one. The loaded values must be what the file says, or refused.
    (tmp_path / "inputs.json").write_text(json.dumps({"i": values}))
    model = _identity_model(elem_type)
    with pytest.raises(InputError, match=rf"input 'i'.*value {re.escape(bad)} ") as info:
        load_inputs(tmp_path / "inputs.json", model)
    assert "inputs.json" in info.value.message and ".npz" in (info.value.hint or "")


@pytest.mark.parametrize(("elem_type", "values"), [
    (TensorProto.INT64, [1, 2.0, -3]), (TensorProto.BOOL, [True, 0, 1]), (TensorProto.UINT8, [0, 255, 7]),
    (TensorProto.FLOAT16, [0.1, -65504.0, 3]), (TensorProto.FLOAT, [1e-50, 0.1, 3]),
    (TensorProto.UINT64, [2**64 - 1, 0, 1]), (TensorProto.INT64, [2**63 - 1, -(2**63), 2**53 + 1]),
])
def test_plain_json_values_the_input_type_holds_load_as_written(tmp_path: Path, elem_type: int, values: list) -> None:
    (tmp_path / "inputs.json").write_text(json.dumps({"i": values}))
    model = _identity_model(elem_type)
    loaded = load_inputs(tmp_path / "inputs.json", model)["i"]
    expected = np.asarray(values, dtype=helper.tensor_dtype_to_np_dtype(elem_type))  # rounding only
    np.testing.assert_array_equal(loaded, expected)
    assert loaded.dtype == expected.dtype
    np.testing.assert_array_equal(run(model, {"i": loaded})["o"], expected)  # and ONNX Runtime takes them


@pytest.mark.parametrize(("content", "match"), [("not json", "not valid JSON"), ("[1, 2]", "list of feed dicts")])
def test_bad_json(tmp_path: Path, content: str, match: str) -> None:
    (tmp_path / "inputs.json").write_text(content)
    with pytest.raises(InputError, match=match):
        load_inputs(tmp_path / "inputs.json", single_input_model())


def test_missing_and_unsupported_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_inputs(tmp_path / "nope.npz", single_input_model())
    (tmp_path / "inputs.csv").write_text("1,2,3")
    with pytest.raises(InputError, match="unsupported") as info:
        load_inputs(tmp_path / "inputs.csv", single_input_model())
    assert ".npz" in (info.value.hint or "")


def test_corrupt_npz(tmp_path: Path) -> None:
    (tmp_path / "inputs.npz").write_bytes(b"garbage")
    with pytest.raises(InputError, match="cannot read inputs"):
        load_inputs(tmp_path / "inputs.npz", single_input_model())


def test_loaded_inputs_are_validated(tmp_path: Path) -> None:
    np.savez(tmp_path / "wrong.npz", x=np.zeros((2, 3), np.float64))
    with pytest.raises(InputError, match="dtype float64"):
        load_inputs(tmp_path / "wrong.npz", single_input_model())


def _string_model() -> object:
    """text: string[2] → Identity."""
    return make_model([helper.make_node("Identity", ["text"], ["out"], name="id")],
                      [helper.make_tensor_value_info("text", TensorProto.STRING, [2])],
                      [helper.make_tensor_value_info("out", TensorProto.STRING, [2])])


class _Boom:
    """Unpickling this runs ``exec``: a pickle that must never be loaded."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


def test_an_object_array_of_strings_is_read_without_allowing_other_pickles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26 item 8: ``np.savez(f, text=np.array(["a", "b"], dtype=object))`` (what pandas and tokenizers give)
    was refused with "is it a valid .npz file?" while ``<U`` arrays worked. An object array whose items are all
    ``str`` is read — from ``.npz`` and ``.npy`` — and any other pickle is refused, unexecuted, saying how to save
    the strings."""
    model = _string_model()
    np.savez(tmp_path / "objects.npz", text=np.array(["hello", "déjà"], dtype=object))
    loaded = load_inputs(tmp_path / "objects.npz", model)
    assert loaded["text"].tolist() == ["hello", "déjà"]
    np.save(tmp_path / "objects.npy", np.array(["a", "b"], dtype=object), allow_pickle=True)
    assert load_inputs(tmp_path / "objects.npy", model)["text"].tolist() == ["a", "b"]
    monkeypatch.chdir(tmp_path)
    for bad in (np.array([_Boom(), "b"], dtype=object), np.array([1, "b"], dtype=object)):
        np.savez(tmp_path / "bad.npz", text=bad)
        with pytest.raises(InputError) as refused:
            load_inputs(tmp_path / "bad.npz", model)
        assert "dtype=str" in str(refused.value.hint) and "valid .npz" not in str(refused.value.hint)
        assert "text" in refused.value.message
    assert not (tmp_path / "PWNED").exists()
