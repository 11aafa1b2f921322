"""Normalization: names, order, SSA, IR version, types, fingerprint, subgraph scopes."""

from __future__ import annotations

import logging
import random

import numpy as np
import onnx
import pytest
from model_builders import chain_model, if_model, make_model, run
from onnx import TensorProto, helper

from graphbisect.errors import ModelError
from graphbisect.model import load_model, normalize_model
from graphbisect.model.normalize import assign_node_names, minimum_ir_version


def _relu_chain_with_names(names: list[str]) -> onnx.ModelProto:
    nodes = []
    for i, name in enumerate(names):
        source = "x" if i == 0 else f"t{i - 1}"
        nodes.append(helper.make_node("Relu", [source], [f"t{i}"], name=name))
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(f"t{len(names) - 1}", TensorProto.FLOAT, [2])],
    )


def test_unique_names_are_kept_and_empty_or_duplicate_names_are_generated() -> None:
    model = load_model(_relu_chain_with_names(["conv", "", "dup", "dup", "Relu_4", ""]))
    assert model.node_names == ("conv", "Relu_1", "Relu_2", "Relu_3", "Relu_4", "Relu_5")
    assert len(set(model.node_names)) == len(model.node_names)


def test_generated_names_avoid_existing_names() -> None:
    model = load_model(_relu_chain_with_names(["Relu_1", ""]))
    assert model.node_names == ("Relu_1", "Relu_1_1")


def test_naming_is_stable_across_loads() -> None:
    proto = _relu_chain_with_names(["", "", "a", "a"])
    assert load_model(proto).node_names == load_model(proto).node_names


def test_assign_node_names_counts_renamed_nodes() -> None:
    graph = _relu_chain_with_names(["a", "", "b"]).graph
    assert assign_node_names(graph) == 1
    assert [n.name for n in graph.node] == ["a", "Relu_1", "b"]


def test_shuffled_graph_is_sorted_topologically_and_runs() -> None:
    proto = chain_model(8)
    nodes = list(proto.graph.node)
    random.Random(3).shuffle(nodes)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    model = load_model(proto)
    assert model.node_names == tuple(f"n{i}" for i in range(8))
    seen = {"x"}
    for node in model.nodes:
        assert all(name in seen for name in node.input)
        seen.update(node.output)
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run(model.proto, {"x": x})["y"], run(chain_model(8), {"x": x})["y"])


def test_sort_is_stable_for_independent_nodes() -> None:
    nodes = [helper.make_node("Relu", ["x"], [f"y{i}"], name=f"r{i}") for i in (3, 1, 2, 0)]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2]) for i in range(4)]
    proto = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], outputs)
    assert load_model(proto).node_names == ("r3", "r1", "r2", "r0")


def test_cycle_is_reported_with_its_nodes() -> None:
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
    ]
    proto = make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(ModelError, match="cycle") as info:
        load_model(proto)
    assert "'first'" in str(info.value) and "'second'" in str(info.value)
    assert info.value.hint


def test_tensor_without_producer_is_named() -> None:
    proto = make_model(
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(ModelError, match="'ghost'") as info:
        load_model(proto)
    assert "'add'" in str(info.value)


def test_tensor_produced_twice_names_both_nodes() -> None:
    proto = make_model(
        [
            helper.make_node("Relu", ["x"], ["y"], name="one"),
            helper.make_node("Neg", ["x"], ["y"], name="two"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(ModelError, match="produced by two nodes: 'one' and 'two'"):
        load_model(proto)


def test_node_output_shadowing_a_graph_input_is_refused() -> None:
    proto = make_model(
        [helper.make_node("Relu", ["x"], ["x"], name="relu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(ModelError, match="both a graph input and an output of node 'relu'"):
        load_model(proto)


def test_ir_version_is_lowered_to_what_the_opset_needs_and_ort_runs_it() -> None:
    proto = chain_model()
    proto.ir_version = 14  # what onnx 1.23 writes by default; ORT 1.31 refuses it
    model = load_model(proto)
    assert model.ir_version == helper.find_min_ir_version_for(proto.opset_import) == 8
    assert proto.ir_version == 14  # the source is untouched
    x = np.ones((2, 3), np.float32)
    assert run(model.proto, {"x": x})["y"].shape == (2, 3)


def test_ir_version_is_never_raised() -> None:
    proto = chain_model()
    proto.ir_version = 7
    assert load_model(proto).ir_version == 7


def test_ir_version_keeps_room_for_data_types_that_need_it() -> None:
    proto = chain_model()
    proto.opset_import[0].version = 13  # needs IR 7 ...
    int4 = helper.make_tensor("packed", TensorProto.INT4, [2], [1, 2])  # ... but INT4 needs IR 10
    proto.graph.initializer.append(int4)
    proto.ir_version = 13
    assert helper.find_min_ir_version_for(proto.opset_import) == 7
    assert minimum_ir_version(proto) == 10
    assert load_model(proto).ir_version == 10


def test_unsupported_opset_is_refused_with_a_hint() -> None:
    proto = chain_model()
    proto.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    with pytest.raises(ModelError, match="opset") as info:
        load_model(proto)
    assert "upgrade onnx" in (info.value.hint or "")


def test_shapes_and_types_are_inferred() -> None:
    model = load_model(chain_model())
    t2 = model.tensor_type("t2")
    assert t2 is not None and t2.elem_type == TensorProto.FLOAT and t2.shape == (2, 3)
    assert t2.is_static and t2.numpy_dtype == np.float32
    assert model.tensor_type("nonexistent") is None


def test_shape_inference_failure_falls_back_and_logs(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    def broken(*args: object, **kwargs: object) -> onnx.ModelProto:
        raise RuntimeError("inference exploded")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", broken)
    with caplog.at_level(logging.WARNING, logger="graphbisect.model.normalize"):
        model = load_model(chain_model())
        assert model.tensor_type("t2") is None  # types are inferred when first needed
    assert "inference exploded" in caplog.text
    assert model.tensor_type("y") is not None  # declared types are kept


def test_fingerprint_is_deterministic_and_content_sensitive() -> None:
    a, b = load_model(chain_model(4)), load_model(chain_model(4))
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    assert load_model(chain_model(5)).fingerprint != a.fingerprint
    assert a.fingerprint[:16] in repr(a)


def test_normalization_is_idempotent() -> None:
    once = normalize_model(_relu_chain_with_names(["", "a", "a"]))
    twice = normalize_model(once)
    assert once.SerializeToString(deterministic=True) == twice.SerializeToString(deterministic=True)


def test_model_proto_source_is_copied_not_mutated() -> None:
    proto = _relu_chain_with_names(["", ""])
    before = proto.SerializeToString(deterministic=True)
    model = load_model(proto)
    assert proto.SerializeToString(deterministic=True) == before
    assert model.proto is not proto


def test_if_subgraph_outer_scope_read_counts_as_consumer() -> None:
    model = load_model(if_model())
    if_index = model.node_index("if")
    assert model.consumers["outer"] == (if_index,)
    assert if_index in model.consumers["x"]  # the else-branch reads x from the outer scope
    assert model.to_networkx().has_edge(model.node_index("neg"), if_index)
    then_branch = next(a.g for a in model.nodes[if_index].attribute if a.name == "then_branch")
    assert [n.name for n in then_branch.node] == [""]  # subgraph nodes are left alone


def test_if_node_is_sorted_after_the_producer_its_subgraph_reads() -> None:
    proto = if_model()
    nodes = list(proto.graph.node)[::-1]  # If first: only its subgraph depends on 'neg'
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    model = load_model(proto)
    assert model.node_names == ("neg", "if")
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(run(model.proto, {"x": x, "cond": np.array(True)})["y"], [0.0, 2.0])
