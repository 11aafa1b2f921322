"""Candidates are valid models whatever onnx's shape inference leaves untyped (issue 35).

A cut point or frontier output that nothing types (``ai.onnx.ml``'s Scaler, ``com.microsoft`` operators) or
types without a shape (an SVMClassifier's labels, a LabelEncoder's strings) was declared by its element type
only, or not at all, and ``onnx.checker`` refused every such candidate ("Field 'shape' of 'type' is required
but missing"), so reduce never ran the removals around them. Now they are declared from the captured values:
element type and rank, dimensions unknown (a sequence by its elements' type), and each candidate is checked,
run and compared here.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from graphbisect.data import ActivationStore
from graphbisect.model import Model, load_model
from graphbisect.strategies.subgraph import SubgraphSpace, check_file
from tests.strategies.untyped_models import inputs, scaler_sequence, scaler_svm, string_chain

MODELS = {"scaler-svm": scaler_svm, "string-chain": string_chain, "sequence": scaler_sequence}


def _values(model: Model, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """Every tensor's value from one ONNX Runtime run of the probe model (as reduce's oracle captures them)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    probe = model.with_outputs(model.intermediate_names())
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {**feeds, **dict(zip(names, session.run(names, feeds), strict=True))}


def _space(model: Model, feeds: dict[str, np.ndarray], values: dict[str, Any], tmp_path: Path, *,
           stored: bool) -> SubgraphSpace:
    if not stored:
        return SubgraphSpace(model, values.__getitem__, tmp_path)
    store = ActivationStore(tmp_path / "activations", autoflush=False)
    for name, value in values.items():
        if name not in feeds:
            store.put(name, value)
    store.flush()
    return SubgraphSpace(model, lambda name: feeds[name] if name in feeds else store.get(name),
                         tmp_path / "candidates", store=store)


def _declared(candidate: Any) -> dict[str, str]:
    graph = candidate.proto.graph
    return {v.name: helper.printable_value_info(v).split("[", 1)[1].rstrip("]") for v in (*graph.input, *graph.output)}


@pytest.mark.parametrize("stored", [False, True], ids=["values", "store"])
@pytest.mark.parametrize("name", MODELS)
def test_every_candidate_passes_the_checker_and_runs(name: str, stored: bool, tmp_path: Path) -> None:
    """Every node subset: ``onnx.checker`` passes it (on file and piecewise), ONNX Runtime runs it on the
    captured values at its cut points and gives the oracle's values; the whole node set is the original."""
    model = load_model(MODELS[name]())
    feeds = inputs()
    values = _values(model, feeds)
    space = _space(model, feeds, values, tmp_path, stored=stored)
    whole = space.materialize(range(space.size))
    assert whole.data == model.proto.SerializeToString()  # the user's declarations as written
    for size in range(1, space.size + 1):
        for keep in map(frozenset, itertools.combinations(range(space.size), size)):
            candidate = space.materialize(keep)
            path = candidate.save(space.workdir / "candidate.onnx", durable=False)
            assert check_file(path) is None, f"{name}: nodes {sorted(keep)}: {_declared(candidate)}"
            assert space.check(candidate, path) is None
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            got = session.run(list(candidate.outputs), {k: candidate.feeds[k] for k in candidate.feeds})
            for output, value in zip(candidate.outputs, got, strict=True):
                if np.asarray(value).dtype.kind in "OUS":  # strings
                    assert np.array_equal(value, values[output])
                else:
                    np.testing.assert_allclose(value, values[output], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stored", [False, True], ids=["values", "store"])
def test_what_inference_leaves_open_is_declared_from_the_captured_value(stored: bool, tmp_path: Path) -> None:
    """Element type and rank, every dimension unknown: a string tensor, an untyped float, a label typed
    without a shape, a sequence; the original's own input and outputs keep their declarations."""
    model = load_model(string_chain())
    assert model.boundary_type("z") is None and model.boundary_type("s") is None  # nothing types a Scaler's output
    assert not model.boundary_type("name").type.tensor_type.HasField("shape")
    feeds = inputs()
    space = _space(model, feeds, _values(model, feeds), tmp_path, stored=stored)
    index = {node.name: i for i, node in enumerate(model.nodes)}
    svm = space.materialize({index["svm"]})
    assert _declared(svm) == {"z": "FLOAT, ?x?", "prob": "FLOAT, Nx3", "lab": "INT64, ?"}
    weight = space.materialize({index["to_weight"], index["mul"]})
    assert _declared(weight) == {"name": "STRING, ?x?", "s": "FLOAT, ?x?", "z": "FLOAT, ?x?"}
    first = space.materialize({index["scaler"]})
    assert _declared(first) == {"x": "FLOAT, Nx3", "s": "FLOAT, ?x?"}

    sequence = load_model(scaler_sequence())
    space = _space(sequence, feeds, _values(sequence, feeds), tmp_path / "sequence", stored=stored)
    concat = space.materialize({2})
    inputs_ = {v.name: v for v in concat.proto.graph.input}
    assert inputs_["seq"].type.sequence_type.elem_type == helper.make_tensor_type_proto(onnx.TensorProto.FLOAT,
                                                                                          [None, None])
    assert _declared(concat)["c"] == "FLOAT, ?x?"
