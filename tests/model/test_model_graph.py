"""The Model index and probe models (run for real with onnxruntime)."""

from __future__ import annotations

from typing import Any, cast

import networkx as nx
import numpy as np
import onnx
import pytest
from model_builders import LIGHT_DIR, chain_model, make_model, run, session, weighted_model
from onnx import TensorProto, helper

from graphbisect.errors import ModelError
from graphbisect.model import Model, TensorType, load_model


@pytest.fixture(scope="module")
def resnet() -> Model:
    return load_model(LIGHT_DIR / "light_resnet50.onnx")


@pytest.fixture(scope="module")
def resnet_input(resnet: Model) -> dict[str, np.ndarray]:
    ttype = resnet.tensor_type(resnet.input_names[0])
    assert ttype is not None and ttype.is_static
    rng = np.random.default_rng(0)
    shape = tuple(d for d in ttype.shape or () if isinstance(d, int))
    return {resnet.input_names[0]: rng.uniform(-1, 1, shape).astype(ttype.numpy_dtype)}


def test_probe_model_exposes_every_intermediate_in_ort(resnet: Model, resnet_input: dict) -> None:
    names = resnet.intermediate_names()
    probe = resnet.with_outputs(names)
    sess = session(probe)
    exposed = [o.name for o in sess.get_outputs()]
    assert exposed[: len(resnet.output_names)] == list(resnet.output_names)
    assert set(exposed) == set(names) | set(resnet.output_names)
    values = dict(zip(exposed, sess.run(exposed, resnet_input), strict=True))
    plain = run(resnet.proto, resnet_input)
    for name, value in plain.items():
        np.testing.assert_allclose(values[name], value, rtol=1e-4, atol=1e-5)
    # an intermediate from the full probe equals a re-run exposing only that tensor
    for name in (names[3], names[len(names) // 2], names[-5]):
        single = run(resnet.with_outputs([name]), resnet_input)[name]
        np.testing.assert_allclose(values[name], single, rtol=1e-4, atol=1e-5)


def test_probe_model_does_not_touch_the_model(resnet: Model) -> None:
    before = resnet.fingerprint
    probe = resnet.with_outputs(resnet.intermediate_names()[:3])
    assert len(probe.graph.output) == len(resnet.output_names) + 3
    assert len(resnet.proto.graph.output) == len(resnet.output_names)
    assert Model(resnet.proto, normalized=True).fingerprint == before


def test_probe_of_untyped_tensor_runs() -> None:
    proto = chain_model()
    proto.graph.output[0].type.Clear()  # nothing typed: shape inference is the only source
    model = load_model(proto)
    probe = model.with_outputs(["t1"])
    values = run(probe, {"x": np.ones((2, 3), np.float32)})
    assert values["t1"].shape == (2, 3)


def test_probe_declares_an_exposed_tensor_as_the_user_does() -> None:
    """An exposed tensor is declared by ``boundary_type``, as candidates declare it: the user's declaration
    without an inferred shape added to it (an optimizer may act on a declared output shape: ONNX Runtime's
    ReshapeFusion), an undeclared one by its inferred type with symbolic dims."""
    proto = chain_model()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    proto.graph.value_info.append(helper.make_tensor_value_info("t1", TensorProto.FLOAT, None))
    model = load_model(proto)
    assert model.tensor_type("t1") == TensorType(TensorProto.FLOAT, ("n", 3))  # what inference knows
    probe = model.with_outputs(["t1", "t2"])
    assert list(probe.graph.output[1:]) == [model.boundary_type("t1"), model.boundary_type("t2")]
    assert not probe.graph.output[1].type.tensor_type.HasField("shape")
    assert probe.graph.output[2] == helper.make_tensor_value_info("t2", TensorProto.FLOAT, ["n", 3])


def test_probe_rejects_unknown_tensors_with_a_hint() -> None:
    model = load_model(chain_model())
    with pytest.raises(ModelError, match="'t11'") as info:
        model.with_outputs(["t11"])
    assert "did you mean" in (info.value.hint or "")


def test_probe_with_duplicates_and_existing_outputs() -> None:
    model = load_model(chain_model())
    probe = model.with_outputs(["t1", "t1", "y", "x"])
    assert [o.name for o in probe.graph.output] == ["y", "t1", "x"]
    values = run(probe, {"x": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(values["x"], 1.0)


def test_index_producers_consumers_inputs_outputs() -> None:
    model = load_model(weighted_model(8))
    assert model.input_names == ("x",)  # initializers are not inputs
    assert model.output_names == ("y",)
    assert model.initializer_names == frozenset({"W1", "b1", "W2", "shape"})
    assert model.producer["h3"] == model.node_index("relu")
    assert model.consumers["h3"] == (model.node_index("mm2"),)
    assert model.consumers["x"] == (0,)
    assert "x" not in model.producer
    assert model.intermediate_names() == ["h", "h2", "h3", "h4", "y"]
    assert model.tensor_type("W1") == TensorType(TensorProto.FLOAT, (8, 8))


def test_input_listing_initializers_is_excluded() -> None:
    proto = weighted_model(8)
    proto.graph.input.append(helper.make_tensor_value_info("W1", TensorProto.FLOAT, [8, 8]))
    assert load_model(proto).input_names == ("x",)


def test_node_index_unknown_name_suggests_close_matches() -> None:
    model = load_model(weighted_model(8))
    with pytest.raises(ModelError, match="no node named 'rleu'") as info:
        model.node_index("rleu")
    assert "'relu'" in (info.value.hint or "")


def test_to_networkx_is_a_dag_with_tensor_edges() -> None:
    model = load_model(weighted_model(8))
    graph = model.to_networkx()
    assert nx.is_directed_acyclic_graph(graph)
    assert graph.nodes[0]["op_type"] == "MatMul" and graph.nodes[0]["name"] == "mm1"
    assert graph.edges[model.node_index("relu"), model.node_index("mm2")]["tensors"] == ["h3"]
    assert list(nx.topological_sort(graph)) == list(range(len(model.nodes)))


def test_tensor_type_helpers() -> None:
    dynamic = TensorType(TensorProto.FLOAT16, ("batch", 3, None))
    assert dynamic.numpy_dtype == np.float16 and not dynamic.is_static and dynamic.rank == 3
    assert str(dynamic) == "FLOAT16[batchx3x?]"
    assert TensorType(TensorProto.INT64, ()).is_static
    assert not TensorType(TensorProto.INT64, None).is_static


def test_symbolic_dims_are_reported() -> None:
    proto = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = load_model(proto)
    assert model.tensor_type("x") == TensorType(TensorProto.FLOAT, ("batch", 3, None))
    inferred = model.tensor_type("y")
    assert inferred is not None and inferred.shape is not None and inferred.shape[:2] == ("batch", 3)


def test_opset_and_ir_version() -> None:
    model = load_model(chain_model())
    assert (model.opset, model.ir_version) == (17, 8)
    assert model.opset == next(o.version for o in model.proto.opset_import if o.domain == "")


def test_model_index_is_read_only() -> None:
    model = load_model(chain_model())
    assert isinstance(model.producer, type(model.consumers))
    with pytest.raises(TypeError):
        cast(Any, model.producer)["new"] = 1
    assert isinstance(model.nodes, tuple)
    assert isinstance(model.proto, onnx.ModelProto)


def test_input_types_are_the_declarations_and_need_no_inference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking the user's inputs (what `compare` does while its workers start) runs no shape inference: an
    input's type is its declaration, the same type the full index gives once inference has run."""
    from graphbisect.data import validate_inputs
    from graphbisect.examples.bundled import example_inputs_path, example_model_path
    from graphbisect.model import normalize

    inferred = []
    real = normalize.infer_types
    monkeypatch.setattr("graphbisect.model.graph.infer_types", lambda proto: inferred.append(1) or real(proto))
    dynamic = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    for source in (example_model_path(), LIGHT_DIR / "light_resnet50.onnx", dynamic):
        model = load_model(source)
        with np.load(example_inputs_path()) as data:
            feeds = {k: data[k] for k in data.files} if source == example_model_path() else None
        for name in model.input_names:
            ttype = model.tensor_type(name)
            assert ttype is not None and ttype.elem_type
            if feeds is None:
                dims = [d if isinstance(d, int) else 2 for d in ttype.shape or ()]
                feeds = {name: np.zeros(dims, ttype.numpy_dtype)}
        validate_inputs(model, feeds)
        assert not inferred  # nothing inferred yet
        assert all(model.tensor_type(name) == model._types.get(name) for name in model.input_names)
        assert inferred == [1]
        inferred.clear()
